/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld: jobs, admission and publication to the managed pboxds (see ctrld.h).
 *
 * The control API (newline JSON, common/ctlproto.h) speaks the job messages of
 * common/jobspec.h, so `pbox job create|list|rm` works against pbox-ctrld as against a
 * pboxd. Every request needs the admin token (proved once per connection with
 * {"op":"auth"} or given in the request) unless it comes over the Unix control socket.
 *
 * Client limits (those of pboxd's control channel): at most max_connections (fitted to
 * the open-file limit, raised to its hard limit at start) and max_per_address from one
 * address; at most max_unauth connections that have not proved the admin token (a new
 * one closes the oldest, after serving what it sent), each closed after unauth_timeout;
 * wrong admin tokens limited per address (common/ctladdr.h, pboxd's bucket); a request
 * line of at most 4 KiB before authentication (32 MiB after); at most 8 malformed or
 * refused requests per connection; answers queued up to max_output_bytes per connection
 * (a client that does not read is closed); at most REQS_PER_TURN requests of one connection and
 * ACCEPTS_PER_TURN new connections per turn of the loop, so no client's burst holds the
 * others. accept() out of descriptors (EMFILE/ENFILE) sheds the waiting connection with a
 * reserved descriptor and stops watching the listeners for LISTEN_PAUSE_MS instead of
 * spinning.
 *
 * Requests to the pboxds never block the loop (pboxd_conn.h: one persistent connection
 * and a bounded queue per pboxd, each request answered or failed within request_timeout
 * of being queued). A client request that needs a pboxd (job_create, job_rm, status) is
 * answered when that completes, its connection's later requests waiting behind it, while
 * the other clients are served; a reconcile round is a job_list to every pboxd at once,
 * each pboxd's answer handled as it comes. Probes are asked by the bandwidth matrix (bw.h,
 * ops bw_list and bw_probe) from its own thread.
 *
 * Threading: the main loop; the bandwidth matrix's thread (bw.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/ctladdr.h"
#include "common/ctlproto.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/notify.h"
#include "assign.h"
#include "bw.h"
#include "ctrld.h"
#include "pboxd_conn.h"
#include "state.h"
#include "status.h"

#ifndef PBOX_VERSION_STRING
#define PBOX_VERSION_STRING "0.0.0"
#endif

#define UNAUTH_LINE_BYTES 4096u
#define AUTHED_LINE_BYTES (32u << 20)
/* Requests served from one connection per turn of the loop, connections accepted per
 * turn: one client's burst cannot hold the loop while others wait. */
#define REQS_PER_TURN    16u
#define ACCEPTS_PER_TURN 16u
/* Descriptors kept for everything but client connections (pboxd requests, the state file,
 * logs, the prober): max_connections is lowered to fit the open-file limit minus this. */
#define FD_RESERVE 64u
/* Kernel send buffer of a client connection (pboxd's CONN_SNDBUF): a fixed size bounds
 * what a client that does not read pins in the kernel (it would grow to MBs); the rest
 * waits in the bounded output queue (max_output_bytes). */
#define CONN_SNDBUF (256 * 1024)
/* How long the listeners are not watched after accept() ran out of descriptors. */
#define LISTEN_PAUSE_MS 200u
#define MAX_BAD         8u
#define MAX_JOBS        4096u

struct cjob {
	uint32_t id;
	json_t *desc;
	json_t *plan;      /* tree / thresholds (common/jobspec.h), passed on; NULL: none */
	bool plan_given;   /* the client's plan: kept as given, not computed (plan.h) */
	int64_t plan_sent; /* plan revision its pboxd acknowledged (-1: none yet) */
	json_t *placement; /* host name per rank (plan.h) or NULL */
	json_t *agents;    /* its pboxd's job_list entry (probe agents; bw.h) or NULL */
	bool from_config;
	int where; /* index of the pboxd holding it; -1: not placed */
	char note[512];
	/* Its chunks on the cores of pboxds[assign_for] (assign.h), published with it; NULL:
	 * pboxd assigns them (no fixed key set, or cores not known). */
	json_t *assignment;
	int assign_for;
	struct ctrld_core_load load; /* per-core totals of assignment, or pboxd's placement */
	bool load_from_pboxd;        /* load is what pboxd placed (no assignment; at register) */
	uint64_t gen;                /* tells this job from a later one with its id */
	bool busy;                   /* a placement or publication of it is in flight */
	bool creating;               /* a client's job_create not answered yet (not saved) */
	int64_t plan_inflight;       /* plan revision being sent (-1: none) */
};

struct pending_rm {
	uint32_t id;
	int where;
	bool inflight; /* its job_rm is queued or in flight */
};

struct conn {
	int fd;
	struct pbox_ctladdr *addr; /* NULL: the Unix socket */
	bool local, admin, dead;
	bool more;   /* complete requests are buffered beyond this turn's share */
	bool unauth; /* counted in nunauth (TCP, the admin token not proved, not evicted) */
	unsigned bad;
	uint64_t accepted_ms;
	/* A request of this connection waits for a pboxd (its answer is sent when that
	 * completes; later requests wait): the operation's pointer to it, cleared when the
	 * connection is closed first. */
	struct conn **waiter;
	struct pbox_linebuf in;
	char *out;
	size_t out_len, out_off;
};

struct ctrld {
	struct ctrld_config cfg;
	int lfd, ufd;
	uint16_t port;
	struct conn **conns;
	uint32_t nconns;
	struct cjob *jobs;
	uint32_t njobs;
	struct pending_rm *rms;
	uint32_t nrms;
	uint64_t next_reconcile_ms;
	struct pbox_ratelog log_client;  /* refusals and closes caused by clients */
	struct pbox_ctladdr_table addrs; /* connections and failed tokens per address */
	struct ctrld_bw *bw;             /* the bandwidth matrix (NULL: no pairs) */
	int64_t bw_sig;                  /* probes counted in it when plans were computed */
	json_t *state_jobs;              /* the state file's jobs at start (state.h) */
	json_t *state_rms;               /* and its removals not delivered yet */
	bool state_dirty;                /* the state file lags behind: retried */
	int reserve_fd;                  /* /dev/null, given up to shed a connection on EMFILE */
	uint64_t listen_paused_ms;       /* listeners not watched until then (out of descriptors) */
	uint32_t nunauth;                /* TCP connections that have not proved the admin token */
	struct pbox_metrics *metrics;    /* NULL: no /metrics endpoint */
	struct ctrld_pconn *pc[CTRLD_MAX_PBOXDS]; /* requests to each pboxd (pboxd_conn.h) */
	uint32_t round_left;                      /* job_lists of the reconcile round in flight */
	uint64_t next_gen;
	struct {
		uint64_t created, removed, create_refused, rm_refused, admin_refused,
			wrong_admin_token, republished, publish_failures, auth_rate_limited,
			plans_sent, plan_failures;
		/* the listener's limits */
		uint64_t refused_max_connections, refused_per_address, evicted_unauth,
			unauth_timeouts, line_too_long, not_reading, accept_no_fds, listener_pauses;
	} n;
};

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A warning caused by a client: rate-limited so that clients cannot flood the log. */
#define CLIENT_WARN(d, fmt, ...)                                                   \
	do {                                                                       \
		uint64_t sup_;                                                     \
		if (pbox_ratelog_ok(&(d)->log_client, now_ms(), &sup_)) {          \
			PBOX_LOG_WARN(ADMIN, fmt "%s", __VA_ARGS__,                \
				      sup_ ? " (similar messages left out)" : ""); \
		}                                                                  \
	} while (0)

static struct cjob *find_job(struct ctrld *d, uint32_t id)
{
	for (uint32_t i = 0; i < d->njobs; i++) {
		if (d->jobs[i].id == id) {
			return &d->jobs[i];
		}
	}
	return NULL;
}

/* The answer of a request to pboxd w: rc 0 with reply (borrowed), or -errno (p marked
 * down, its last_error says why). */
typedef void (*ask_cb)(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg);

struct ask_ctx {
	struct ctrld *d;
	uint32_t w;
	ask_cb cb;
	void *arg;
};

static void ask_done(void *arg, int rc, json_t *reply, const char *err)
{
	struct ask_ctx *x = arg;
	struct ctrld_pboxd *p = &x->d->cfg.pboxds[x->w];

	if (rc != 0 && rc != -ECANCELED) {
		if (p->up || strcmp(p->last_error, err) != 0) {
			PBOX_LOG_WARN(ADMIN, "pboxd %s: %s", p->name, err);
		}
		p->up = false;
		snprintf(p->last_error, sizeof(p->last_error), "%s", err);
	} else if (rc == 0) {
		if (!p->up) {
			PBOX_LOG_INFO(ADMIN, "pboxd %s (%s) is reachable", p->name, p->control);
		}
		p->up = true;
		p->last_error[0] = '\0';
	}
	x->cb(x->d, x->w, rc, reply, x->arg);
	free(x);
}

/* Queue req (not taken; NULL: fails as out of memory) to pboxd w; cb is called from the
 * loop when it is answered or failed (never from here). */
static void ask(struct ctrld *d, uint32_t w, const json_t *req, ask_cb cb, void *arg)
{
	struct ask_ctx *x = calloc(1, sizeof(*x));

	if (x == NULL) {
		PBOX_LOG_ERR(ADMIN, "pboxd %s: out of memory queueing a request",
			     d->cfg.pboxds[w].name);
		abort(); /* cb must run once: see pboxd_conn.h */
	}
	*x = (struct ask_ctx){ .d = d, .w = w, .cb = cb, .arg = arg };
	ctrld_pconn_submit(d->pc[w], req, ask_done, x);
}

/* The answer of a waiting client request (taken), sent now; its connection's next requests
 * are served from the next turn. c NULL: the client went away. */
static void conn_send(struct ctrld *d, struct conn *c, const json_t *obj);
static void conn_flush(struct conn *c);

static void answer(struct ctrld *d, struct conn *c, json_t *resp)
{
	if (c != NULL) {
		c->waiter = NULL;
		conn_send(d, c, resp);
		c->more = true;
		conn_flush(c);
	}
	json_decref(resp);
}

/* The job with id that is still the one of generation gen, or NULL. */
static struct cjob *job_gen(struct ctrld *d, uint32_t id, uint64_t gen)
{
	struct cjob *j = find_job(d, id);

	return j != NULL && j->gen == gen ? j : NULL;
}

/* Learn pboxd w's data-plane cores from its job_list reply (assign.h). */
static void learn_cores(struct ctrld *d, uint32_t w, const json_t *reply)
{
	struct ctrld_pboxd *p = &d->cfg.pboxds[w];
	struct ctrld_cores c;
	char err[256];

	if (ctrld_cores_from_json(json_object_get(reply, "appliance"), &c, err, sizeof(err)) != 0) {
		if (p->cores.known) {
			PBOX_LOG_WARN(ADMIN, "pboxd %s: its cores are not known any more: %s",
				      p->name, err);
		}
		p->cores.known = false;
		return;
	}
	if (!p->cores.known || p->cores.ncores != c.ncores ||
	    p->cores.chunk_bytes != c.chunk_bytes) {
		PBOX_LOG_INFO(ADMIN, "pboxd %s: %u data-plane core%s, chunks of %u bytes", p->name,
			      c.ncores, c.ncores == 1 ? "" : "s", c.chunk_bytes);
	}
	p->cores = c;
}

/* A job pbox-ctrld did not assign (no fixed key set): the bytes per core pboxd placed when
 * its key set was registered (job_list's "core_bytes"), counted in the balance. */
static void learn_pboxd_load(struct cjob *j, const json_t *held)
{
	const json_t *cb = json_object_get(held, "core_bytes"), *v;
	size_t k;

	if (j->assignment != NULL) {
		return;
	}
	memset(&j->load, 0, sizeof(j->load));
	j->load_from_pboxd = json_is_array(cb) && json_array_size(cb) <= PBOX_MAX_CORES;
	if (!j->load_from_pboxd) {
		return;
	}
	json_array_foreach(cb, k, v)
	{
		j->load.bytes[k] = json_is_integer(v) && json_integer_value(v) > 0
					   ? (uint64_t)json_integer_value(v)
					   : 0;
	}
}

/* Bytes on each core of pboxd w from the chunks placed there (by pbox-ctrld, or by pboxd
 * for jobs without a fixed key set once their key set is known), but skip's. */
static void core_loads(const struct ctrld *d, uint32_t w, const struct cjob *skip, uint64_t *bytes)
{
	memset(bytes, 0, PBOX_MAX_CORES * sizeof(*bytes));
	for (uint32_t i = 0; i < d->njobs; i++) {
		const struct cjob *j = &d->jobs[i];

		if (j == skip || !((j->assignment != NULL && j->assign_for == (int)w) ||
				   (j->load_from_pboxd && j->where == (int)w))) {
			continue;
		}
		for (uint32_t k = 0; k < PBOX_MAX_CORES; k++) {
			bytes[k] += j->load.bytes[k];
		}
	}
}

/* Job j's assignment for pboxd w: kept when made for w's current cores, else made again
 * (balanced against the bytes the other jobs there hold). 0, or -errno with why (a key set
 * that cannot be cut: the job is refused). Cores not known: none (pboxd assigns). */
static int assign_for(struct ctrld *d, struct cjob *j, uint32_t w, char *why, size_t len)
{
	const struct ctrld_cores *c = &d->cfg.pboxds[w].cores;
	uint64_t base[PBOX_MAX_CORES];
	json_t *a = NULL;
	char err[512];
	int rc;

	if (j->assignment != NULL && j->assign_for == (int)w && c->known &&
	    json_integer_value(json_object_get(j->assignment, "chunk_bytes")) ==
		    (json_int_t)c->chunk_bytes &&
	    ctrld_assign_load(j->assignment, j->desc, c->ncores, &j->load, err, sizeof(err)) == 0) {
		return 0;
	}
	json_decref(j->assignment);
	j->assignment = NULL;
	j->assign_for = -1;
	j->load_from_pboxd = false;
	memset(&j->load, 0, sizeof(j->load));
	d->state_dirty |= !j->from_config;
	if (!c->known) {
		return 0;
	}
	core_loads(d, w, j, base);
	rc = ctrld_assign(c, j->desc, base, &a, &j->load, err, sizeof(err));
	if (rc < 0) {
		snprintf(why, len, "job %u: no core assignment on pboxd %s: %s", j->id,
			 d->cfg.pboxds[w].name, err);
		return rc;
	}
	if (rc == 0) {
		j->assignment = a;
		j->assign_for = (int)w;
	}
	return 0;
}

/* Write the runtime jobs to the state file (state.h), if there is one. 0 or -errno
 * (logged; d->state_dirty stays set and the next reconcile retries). */
static int save_state(struct ctrld *d)
{
	json_t *arr, *rms;
	char err[768];
	int rc = 0;

	if (d->cfg.state_file[0] == '\0') {
		d->state_dirty = false;
		return 0;
	}
	arr = json_array();
	for (uint32_t i = 0; arr != NULL && i < d->njobs; i++) {
		const struct cjob *j = &d->jobs[i];
		json_t *e;

		if (j->from_config || j->creating) {
			continue;
		}
		e = json_pack("{s:O}", "job", j->desc);
		if (e == NULL) {
			json_decref(arr);
			arr = NULL;
			break;
		}
		if (j->plan_given && j->plan != NULL) {
			json_object_set(e, "plan", j->plan);
		}
		if (j->placement != NULL) {
			json_object_set(e, "placement", j->placement);
		}
		if (j->where >= 0) {
			json_object_set_new(e, "pboxd", json_string(d->cfg.pboxds[j->where].name));
		}
		if (j->assignment != NULL) {
			json_object_set(e, "assignment", j->assignment);
		}
		json_array_append_new(arr, e);
	}
	rms = json_array();
	for (uint32_t r = 0; rms != NULL && r < d->nrms; r++) {
		json_array_append_new(rms, json_pack("{s:I, s:s}", "id", (json_int_t)d->rms[r].id,
						     "pboxd", d->cfg.pboxds[d->rms[r].where].name));
	}
	if (arr == NULL || rms == NULL) {
		rc = -ENOMEM;
		snprintf(err, sizeof(err), "state file %s: out of memory", d->cfg.state_file);
	} else {
		rc = ctrld_state_save(d->cfg.state_file, arr, rms, err, sizeof(err));
	}
	json_decref(arr);
	json_decref(rms);
	if (rc != 0) {
		if (!d->state_dirty) {
			PBOX_LOG_ERR(ADMIN, "%s (retried)", err);
		}
		d->state_dirty = true;
		return rc;
	}
	d->state_dirty = false;
	return 0;
}

/* Sum of the matrix's probe counts: changes when any pair has a new result. */
static int64_t bw_signature(const json_t *bw)
{
	int64_t sig = 0;
	size_t i;
	const json_t *p;

	json_array_foreach(json_object_get(bw, "pairs"), i, p)
	{
		sig += json_integer_value(json_object_get(p, "probes")) +
		       json_integer_value(json_object_get(p, "failures"));
	}
	return sig;
}

/* (Re)compute job j's plan for pboxd w (plan.h); a client-given plan is left alone. On
 * failure the previous plan stays and the cause is logged and noted. */
static void compute_plan(struct ctrld *d, struct cjob *j, uint32_t w, const json_t *bw)
{
	json_t *np = NULL, *own = NULL;
	char err[512];
	int rc;

	if (j->plan_given) {
		return;
	}
	if (bw == NULL) {
		bw = own = ctrld_bw_list(d->bw);
	}
	rc = ctrld_plan_compute(&d->cfg.plan, d->cfg.pboxds[w].name,
				(uint32_t)json_integer_value(json_object_get(j->desc, "workers")),
				j->placement, bw, j->agents, j->plan, &np, err, sizeof(err));
	json_decref(own);
	if (rc != 0) {
		snprintf(j->note, sizeof(j->note), "plan: %s", err);
		PBOX_LOG_WARN(ADMIN, "job %u: no plan: %s", j->id, err);
		return;
	}
	if (np != j->plan) {
		json_t *t = json_object_get(np, "tree");

		PBOX_LOG_INFO(
			ADMIN, "job %u: plan revision %lld (tree %s, objective %.3f; broadcast %s)",
			j->id, (long long)json_integer_value(json_object_get(t, "revision")),
			json_string_value(json_object_get(t, "method")) ?: "?",
			json_number_value(json_object_get(t, "objective")),
			json_string_value(json_object_get(
				json_object_get(json_object_get(np, "thresholds"), "broadcast"),
				"select"))
				?: "?");
	}
	json_decref(j->plan);
	j->plan = np;
}

/* Where a job goes when it is added: placed by admission (where < 0), or at pboxd where
 * (adopt: that pboxd holds it already, as after a restart of pbox-ctrld; else published
 * there by the next reconcile), with the assignment it had (NULL: made anew). */
struct job_origin {
	bool from_config;
	bool restored; /* from the state file: kept unplaced rather than refused */
	int where;
	bool adopt;
	const json_t *assignment;
};

static void free_job(struct cjob *j)
{
	json_decref(j->desc);
	json_decref(j->plan);
	json_decref(j->placement);
	json_decref(j->assignment);
	json_decref(j->agents);
}

/* A publication of job (id, gen) to pboxd w (job_create with its plan and core map); then
 * is called with 0, or -errno and why (the pboxd's refusal or the failure; -ECANCELED: the
 * job was removed meanwhile). */
struct pub {
	uint32_t id;
	uint64_t gen;
	uint32_t w;
	void (*then)(struct ctrld *d, struct pub *pb, int rc);
	void *arg;
	char why[400];
};

static void pub_created(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	struct pub *pb = arg;
	struct ctrld_pboxd *p = &d->cfg.pboxds[w];
	struct cjob *j;

	if (rc != 0) {
		snprintf(pb->why, sizeof(pb->why), "pboxd %s: unreachable (%s)", p->name,
			 p->last_error[0] ? p->last_error : strerror(-rc));
		pb->then(d, pb, rc);
		return;
	}
	if (!json_is_true(json_object_get(reply, "ok"))) {
		rc = -(int)json_integer_value(json_object_get(reply, "errno"));
		snprintf(pb->why, sizeof(pb->why), "pboxd %s: %s", p->name,
			 json_string_value(json_object_get(reply, "error")) ?: "refused");
		pb->then(d, pb, rc ? rc : -EIO);
		return;
	}
	j = job_gen(d, pb->id, pb->gen);
	if (j == NULL) {
		/* Removed while it was being published: the pboxd holds it now. */
		if (d->nrms < MAX_JOBS) {
			d->rms[d->nrms++] = (struct pending_rm){ .id = pb->id, .where = (int)w };
			d->state_dirty = true;
		}
		snprintf(pb->why, sizeof(pb->why), "job %u was removed while it was published",
			 pb->id);
		pb->then(d, pb, -ECANCELED);
		return;
	}
	j->plan_sent = j->plan != NULL ? pbox_jobspec_plan_revision(j->plan) : -1;
	pb->then(d, pb, 0);
}

static void pub_send(struct ctrld *d, struct pub *pb)
{
	struct cjob *j = job_gen(d, pb->id, pb->gen);
	json_t *req;
	int rc;

	if (j == NULL) {
		snprintf(pb->why, sizeof(pb->why), "job %u was removed while it was published",
			 pb->id);
		pb->then(d, pb, -ECANCELED);
		return;
	}
	rc = assign_for(d, j, pb->w, pb->why, sizeof(pb->why));
	if (rc != 0) {
		pb->then(d, pb, rc);
		return;
	}
	req = pbox_jobmsg_create_plan(j->desc, j->plan, NULL);
	if (req != NULL && j->assignment != NULL &&
	    json_object_set(req, "assignment", j->assignment) != 0) {
		json_decref(req);
		req = NULL;
	}
	ask(d, pb->w, req, pub_created, pb);
	json_decref(req);
}

static void pub_listed(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	struct pub *pb = arg;

	if (rc != 0) {
		/* Not a second request (and wait) for a pboxd that did not answer this one. */
		snprintf(pb->why, sizeof(pb->why), "pboxd %s: unreachable (%s)",
			 d->cfg.pboxds[w].name,
			 d->cfg.pboxds[w].last_error[0] ? d->cfg.pboxds[w].last_error
							: strerror(-rc));
		pb->then(d, pb, rc);
		return;
	}
	learn_cores(d, w, reply);
	pub_send(d, pb);
}

/* Start publishing job j to pboxd w: its plan made for w, its cores learned first when they
 * are not known (a job_list), then the job_create. pb is filled here (id, gen, w). */
static void publish_start(struct ctrld *d, struct cjob *j, uint32_t w, struct pub *pb)
{
	pb->id = j->id;
	pb->gen = j->gen;
	pb->w = w;
	pb->why[0] = '\0';
	compute_plan(d, j, w, NULL);
	if (!d->cfg.pboxds[w].cores.known && d->cfg.pboxds[w].up) {
		json_t *req = pbox_jobmsg_list(NULL);

		ask(d, w, req, pub_listed, pb);
		json_decref(req);
		return;
	}
	pub_send(d, pb);
}

/* Send job j's current plan to its pboxd (job_plan) when the pboxd has not acknowledged
 * this revision yet and it is not on its way; a failure is noted and retried on the next
 * reconcile. */
struct plan_send {
	uint32_t id;
	uint64_t gen;
	int64_t rev;
};

static void plan_sent(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	struct plan_send *ps = arg;
	struct ctrld_pboxd *p = &d->cfg.pboxds[w];
	struct cjob *j = job_gen(d, ps->id, ps->gen);

	if (j != NULL && j->plan_inflight == ps->rev) {
		j->plan_inflight = -1;
	}
	if (j == NULL || j->where != (int)w) {
		free(ps);
		return;
	}
	if (rc != 0 || !json_is_true(json_object_get(reply, "ok"))) {
		d->n.plan_failures++;
		snprintf(j->note, sizeof(j->note), "plan revision %lld not sent to pboxd %s: %s",
			 (long long)ps->rev, p->name,
			 rc != 0 ? p->last_error
				 : json_string_value(json_object_get(reply, "error")) ?: "refused");
		PBOX_LOG_WARN(ADMIN, "job %u: %s (retried)", j->id, j->note);
		free(ps);
		return;
	}
	/* Applied, or the pboxd holds this revision or a newer one already. */
	j->plan_sent = PBOX_MAX(j->plan_sent, ps->rev);
	d->n.plans_sent++;
	if (!json_is_true(json_object_get(reply, "applied"))) {
		PBOX_LOG_INFO(ADMIN, "job %u: pboxd %s: %s", j->id, p->name,
			      json_string_value(json_object_get(reply, "reason")) ?: "not applied");
	} else {
		PBOX_LOG_INFO(ADMIN, "job %u: plan revision %lld sent to pboxd %s", j->id,
			      (long long)ps->rev, p->name);
	}
	free(ps);
}

static void send_plan(struct ctrld *d, struct cjob *j)
{
	struct plan_send *ps;
	json_t *req;
	int64_t rev;

	if (j->where < 0 || j->plan == NULL || j->busy) {
		return;
	}
	rev = pbox_jobspec_plan_revision(j->plan);
	if (rev <= j->plan_sent || rev <= j->plan_inflight) {
		return;
	}
	ps = malloc(sizeof(*ps));
	if (ps == NULL) {
		return;
	}
	*ps = (struct plan_send){ .id = j->id, .gen = j->gen, .rev = rev };
	j->plan_inflight = rev;
	req = pbox_jobmsg_plan(j->id, j->plan, NULL);
	ask(d, (uint32_t)j->where, req, plan_sent, ps);
	json_decref(req);
}

/* Admission of job (id, gen): offered to the pboxds, reachable ones first, then fewest
 * jobs first, one after the other until one holds it. The client that created it (c; NULL: none, or
 * gone) is answered at the end; a client's job that no pboxd holds is dropped, a configured or
 * restored one waits for the next reconcile. */
struct placing {
	struct pub pb;
	bool tried[CTRLD_MAX_PBOXDS];
	int cur;
	char why[1024];
	size_t off;
	int last;
	bool any_reachable;
	bool log_failure; /* a configured / restored job's first placement */
	struct conn *c;
};

static void place_next(struct ctrld *d, struct placing *pl);

static void place_finish(struct ctrld *d, struct placing *pl, int rc)
{
	struct cjob *j = job_gen(d, pl->pb.id, pl->pb.gen);
	json_t *resp = NULL;

	if (j != NULL) {
		j->busy = false;
	}
	if (rc == 0 && j != NULL) {
		bool client = j->creating;

		j->creating = false;
		d->state_dirty |= !j->from_config;
		if (client) {
			d->n.created++;
			resp = json_pack("{s:b, s:I, s:s}", "ok", 1, "id", (json_int_t)j->id,
					 "pboxd", d->cfg.pboxds[j->where].name);
			if (save_state(d) != 0) {
				json_object_set_new(resp, "warning",
						    json_string("published, but not written to the "
								"state file (retried; see "
								"pbox-ctrld's log)"));
			}
		}
	} else if (j != NULL && j->creating) {
		/* A client's job no pboxd holds: refused, with every pboxd's reason. */
		d->n.create_refused++;
		CLIENT_WARN(d, "job_create of job %u refused: %s", j->id, pl->why);
		resp = pbox_ctl_error(-rc, "%s", pl->why);
		free_job(j);
		*j = d->jobs[--d->njobs];
	} else if (j != NULL) {
		snprintf(j->note, sizeof(j->note), "%s", pl->why);
		if (pl->log_failure) {
			PBOX_LOG_WARN(ADMIN, "job %u: not placed yet: %s", j->id, pl->why);
		}
	} else if (pl->c != NULL) {
		d->n.create_refused++;
		resp = pbox_ctl_error(ECANCELED, "job %u was removed while it was being placed",
				      pl->pb.id);
	}
	if (pl->c != NULL && resp != NULL) {
		answer(d, pl->c, resp);
	} else {
		if (pl->c != NULL) {
			pl->c->waiter = NULL;
			pl->c->more = true;
		}
		json_decref(resp);
	}
	free(pl);
}

static void place_published(struct ctrld *d, struct pub *pb, int rc)
{
	struct placing *pl = (struct placing *)pb;
	uint32_t w = (uint32_t)pl->cur;

	if (rc == 0) {
		struct cjob *j = job_gen(d, pb->id, pb->gen);

		j->where = (int)w;
		d->cfg.pboxds[w].njobs++;
		j->note[0] = '\0';
		PBOX_LOG_INFO(ADMIN, "job %u: published to pboxd %s (%s)", j->id,
			      d->cfg.pboxds[w].name, d->cfg.pboxds[w].control);
		place_finish(d, pl, 0);
		return;
	}
	if (rc == -EINVAL || rc == -ECANCELED) {
		snprintf(pl->why, sizeof(pl->why), "%s", pb->why);
		place_finish(d, pl, rc);
		return;
	}
	if (rc != -ECONNREFUSED && rc != -ETIMEDOUT && rc != -ECONNRESET && rc != -ENOENT &&
	    rc != -EHOSTUNREACH && rc != -ENOBUFS) {
		pl->any_reachable = true;
		pl->last = rc;
	}
	pl->off += (size_t)snprintf(pl->why + pl->off,
				    pl->off < sizeof(pl->why) ? sizeof(pl->why) - pl->off : 0,
				    "%s%s", pl->off ? "; " : "", pb->why);
	if (pl->off >= sizeof(pl->why)) {
		pl->off = sizeof(pl->why);
	}
	place_next(d, pl);
}

static void place_next(struct ctrld *d, struct placing *pl)
{
	struct cjob *j = job_gen(d, pl->pb.id, pl->pb.gen);
	int best = -1;

	if (j == NULL) {
		place_finish(d, pl, -ECANCELED);
		return;
	}
	/* Reachable pboxds first (one that did not answer its last request is tried last),
	 * then the fewest jobs. */
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		const struct ctrld_pboxd *p = &d->cfg.pboxds[w];

		if (!pl->tried[w] &&
		    (best < 0 || (p->up && !d->cfg.pboxds[best].up) ||
		     (p->up == d->cfg.pboxds[best].up && p->njobs < d->cfg.pboxds[best].njobs))) {
			best = (int)w;
		}
	}
	if (best < 0) {
		place_finish(d, pl,
			     pl->any_reachable ? (pl->last == -EEXIST ? -EEXIST : -ENOSPC)
					       : -EHOSTUNREACH);
		return;
	}
	pl->tried[best] = true;
	pl->cur = best;
	publish_start(d, j, (uint32_t)best, &pl->pb);
}

/* Start the admission of job j (not placed, not busy); c: the client to answer. */
static void place(struct ctrld *d, struct cjob *j, struct conn *c, bool log_failure)
{
	struct placing *pl = calloc(1, sizeof(*pl));

	if (pl == NULL) {
		snprintf(j->note, sizeof(j->note), "not placed: out of memory");
		if (c != NULL) {
			answer(d, c, pbox_ctl_error(ENOMEM, "job %u: out of memory", j->id));
		}
		return;
	}
	pl->pb.then = place_published;
	pl->pb.id = j->id;
	pl->pb.gen = j->gen;
	pl->last = -EHOSTUNREACH;
	pl->log_failure = log_failure;
	pl->c = c;
	if (c != NULL) {
		c->waiter = &pl->c;
	}
	j->busy = true;
	place_next(d, pl);
}

/* Add a job: 0 (added: adopted, or to be published by the next reconcile), 1 (its admission
 * runs: c, the client that created it, is answered when it ends; a configured or restored
 * job stays when no pboxd takes it), or -errno with why (refused at once). */
static int add_job(struct ctrld *d, json_t *desc, const json_t *plan, const json_t *placement,
		   const struct job_origin *o, struct conn *c, char *why, size_t len)
{
	bool from_config = o->from_config;
	struct cjob *j;
	uint32_t id;

	if (pbox_jobspec_id(desc, &id) != 0 || ctrld_job_validate(desc, why, len) != 0) {
		if (why[0] == '\0') {
			snprintf(why, len, "job description: job.id: missing or out of range");
		}
		return -EINVAL;
	}
	if (ctrld_plan_check_placement(
		    &d->cfg.plan, placement,
		    (uint32_t)json_integer_value(json_object_get(desc, "workers")), why,
		    len) != 0) {
		return -EINVAL;
	}
	if (find_job(d, id) != NULL) {
		snprintf(why, len, "job %u exists already (remove it first)", id);
		return -EEXIST;
	}
	if (d->njobs >= MAX_JOBS) {
		snprintf(why, len, "job %u: pbox-ctrld holds %u jobs, the most it manages", id,
			 MAX_JOBS);
		return -ENOSPC;
	}
	j = &d->jobs[d->njobs];
	memset(j, 0, sizeof(*j));
	j->id = id;
	j->desc = json_incref(desc);
	j->plan = plan != NULL ? json_deep_copy(plan) : NULL;
	j->plan_given = plan != NULL;
	j->plan_sent = -1;
	j->placement = placement != NULL ? json_deep_copy(placement) : NULL;
	j->from_config = from_config;
	j->where = -1;
	j->assign_for = -1;
	j->gen = ++d->next_gen;
	j->plan_inflight = -1;
	if (o->where >= 0) {
		char err[256];

		j->where = o->where;
		d->cfg.pboxds[o->where].njobs++;
		d->njobs++;
		if (o->assignment != NULL) {
			j->assignment = json_deep_copy(o->assignment);
			j->assign_for = o->where;
			if (ctrld_assign_load(j->assignment, j->desc, PBOX_MAX_CORES, &j->load, err,
					      sizeof(err)) != 0) {
				PBOX_LOG_WARN(ADMIN,
					      "job %u: its stored assignment: %s (made again)", id,
					      err);
				json_decref(j->assignment);
				j->assignment = NULL;
				j->assign_for = -1;
			}
		}
		if (o->adopt) {
			/* The pboxd holds it: its map is the one sent then. A config job's is
			 * made again for the summary, the same as then (config jobs come first,
			 * in file order, so the loads before it are the same). */
			if (j->assignment == NULL) {
				(void)assign_for(d, j, (uint32_t)o->where, why, len);
			}
			PBOX_LOG_INFO(ADMIN, "job %u: held by pboxd %s already", id,
				      d->cfg.pboxds[o->where].name);
		} else {
			snprintf(j->note, sizeof(j->note), "to be published again to pboxd %s",
				 d->cfg.pboxds[o->where].name);
		}
		why[0] = '\0';
		return 0;
	}
	d->njobs++;
	j->creating = !from_config && !o->restored;
	place(d, j, c, true);
	return 1;
}

/* A job_rm to pboxd w for a removal of d->rms (delivered: dropped from it; not: retried
 * by the reconcile loop once the pboxd answers). c: the client to answer (NULL: none). */
struct rm_op {
	uint32_t id;
	bool retry; /* sent again by the reconcile loop */
	struct conn *c;
};

static void rm_done(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	struct rm_op *op = arg;
	struct ctrld_pboxd *p = &d->cfg.pboxds[w];
	json_t *resp;

	for (uint32_t r = 0; r < d->nrms; r++) {
		if (d->rms[r].id != op->id || d->rms[r].where != (int)w || !d->rms[r].inflight) {
			continue;
		}
		if (rc == 0) {
			PBOX_LOG_INFO(ADMIN, "job %u: %s pboxd %s%s", op->id,
				      op->retry ? "removal delivered to" : "removed from", p->name,
				      json_is_true(json_object_get(reply, "ok"))
					      ? ""
					      : " (it did not hold it any more)");
			d->rms[r] = d->rms[--d->nrms];
			d->state_dirty = true;
		} else {
			d->rms[r].inflight = false;
			PBOX_LOG_WARN(ADMIN, "job %u: pboxd %s unreachable; its removal is retried",
				      op->id, p->name);
		}
		break;
	}
	if (op->c != NULL) {
		resp = json_pack("{s:b, s:I}", "ok", 1, "id", (json_int_t)op->id);
		if (rc != 0) {
			json_object_set_new(resp, "warning",
					    json_sprintf("pboxd %s: %s (the removal is retried)",
							 p->name, p->last_error));
		}
		if (save_state(d) != 0) {
			json_object_set_new(resp, "warning",
					    json_string("removed, but the state file still has it "
							"(retried; see pbox-ctrld's log)"));
		}
		answer(d, op->c, resp);
	}
	free(op);
}

/* Send the removal d->rms[r]. c: the client to answer when it is done. */
static void send_rm(struct ctrld *d, uint32_t id, int where, bool retry, struct conn *c)
{
	struct rm_op *op = calloc(1, sizeof(*op));
	json_t *req;

	if (op == NULL) {
		return;
	}
	op->id = id;
	op->retry = retry;
	op->c = c;
	if (c != NULL) {
		c->waiter = &op->c;
	}
	req = pbox_jobmsg_rm(op->id, NULL);
	ask(d, (uint32_t)where, req, rm_done, op);
	json_decref(req);
}

/* Remove job id: 0 (answered here), 1 (the client c is answered when its pboxd has been
 * told), or -errno with why. The removal stays in d->rms (and the state file) until its
 * pboxd confirmed it. */
static int remove_job(struct ctrld *d, uint32_t id, struct conn *c, char *why, size_t len)
{
	struct cjob *j = find_job(d, id);
	int rc = 0;

	if (j == NULL) {
		snprintf(why, len, "job %u does not exist", id);
		return -ENOENT;
	}
	if (j->where >= 0) {
		d->cfg.pboxds[j->where].njobs--;
		if (d->nrms < MAX_JOBS) {
			/* kept (not retried) while in flight */
			d->rms[d->nrms++] = (struct pending_rm){ .id = id,
								 .where = j->where,
								 .inflight = true };
			d->state_dirty = true;
		}
		/* With the removals' table full it is sent all the same, not kept. */
		send_rm(d, id, j->where, false, c);
		rc = c != NULL ? 1 : 0;
	}
	/* Being placed or published: that ends when it completes (a pboxd that accepted it
	 * meanwhile gets a removal; its creator is told). */
	free_job(j);
	*j = d->jobs[--d->njobs];
	return rc;
}

/* The probe agents of job j on pboxd w (its job_list entry o): the matrix's pairs for
 * the job (bw.h), and a new plan when they changed. */
static void job_agents(struct ctrld *d, struct cjob *j, uint32_t w, json_t *o)
{
	if (j->agents == NULL ||
	    !json_equal(json_object_get(j->agents, "agents"), json_object_get(o, "agents")) ||
	    !json_equal(json_object_get(j->agents, "probe"), json_object_get(o, "probe"))) {
		json_decref(j->agents);
		j->agents = json_incref(o);
		compute_plan(d, j, w, NULL);
	} else {
		json_decref(j->agents);
		j->agents = json_incref(o); /* its progress (version_max) for the matrix */
	}
	ctrld_bw_job(d->bw, w, j->id, j->agents, j->plan);
}

static void republished(struct ctrld *d, struct pub *pb, int rc)
{
	struct cjob *j = job_gen(d, pb->id, pb->gen);

	if (j != NULL) {
		j->busy = false;
	}
	if (rc == 0) {
		d->n.republished++;
		PBOX_LOG_INFO(ADMIN,
			      "job %u: published again to pboxd %s (it did not hold it: "
			      "restarted?)",
			      pb->id, d->cfg.pboxds[pb->w].name);
	} else if (j != NULL) {
		d->n.publish_failures++;
		snprintf(j->note, sizeof(j->note), "%s", pb->why);
		PBOX_LOG_WARN(ADMIN, "job %u: publishing again failed: %s", j->id, pb->why);
	}
	free(pb);
}

static void reconcile_end(struct ctrld *d);

/* Pboxd w's job list in a reconcile round: removals not delivered are sent again, its jobs
 * that it does not hold are published again (a restarted pboxd). */
static void reconcile_listed(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	json_t *there, *o;
	size_t k;

	(void)arg;
	if (rc == 0) {
		learn_cores(d, w, reply);
		there = json_object_get(reply, "jobs");
		for (uint32_t r = 0; r < d->nrms; r++) {
			if (d->rms[r].where == (int)w && !d->rms[r].inflight) {
				d->rms[r].inflight = true;
				send_rm(d, d->rms[r].id, (int)w, true, NULL);
			}
		}
		for (uint32_t i = 0; i < d->njobs; i++) {
			struct cjob *j = &d->jobs[i];
			bool found = false;
			struct pub *pb;

			if (j->where != (int)w || j->busy) {
				continue;
			}
			json_array_foreach(there, k, o)
			{
				if (!found && json_integer_value(json_object_get(o, "id")) ==
						      (json_int_t)j->id) {
					found = true;
					learn_pboxd_load(j, o);
					job_agents(d, j, w, o);
				}
			}
			if (found || (pb = calloc(1, sizeof(*pb))) == NULL) {
				continue;
			}
			pb->then = republished;
			j->busy = true;
			publish_start(d, j, w, pb);
		}
	}
	if (--d->round_left == 0) {
		reconcile_end(d);
	}
}

/* A reconcile round: every pboxd's job list asked at once (handled as each answers); the
 * round ends when all have answered or failed. A round does not start while the last one
 * runs. */
static void reconcile(struct ctrld *d)
{
	if (d->round_left > 0) {
		return;
	}
	ctrld_bw_jobs_begin(d->bw);
	d->round_left = d->cfg.npboxds;
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		json_t *req = pbox_jobmsg_list(NULL);

		ask(d, w, req, reconcile_listed, NULL);
		json_decref(req);
	}
	if (d->cfg.npboxds == 0) {
		reconcile_end(d);
	}
}

/* The end of a round: jobs not placed are offered again, the state file is written, plans
 * are recomputed on new probe results and sent. */
static void reconcile_end(struct ctrld *d)
{
	ctrld_bw_jobs_end(d->bw);
	for (uint32_t i = 0; i < d->njobs; i++) {
		if (d->jobs[i].where < 0 && !d->jobs[i].busy) {
			place(d, &d->jobs[i], NULL, false);
		}
	}
	if (d->state_dirty) {
		(void)save_state(d);
	}
	/* New probe results: recompute the plans (plan.h keeps trees and link states unless
	 * the change is material). The pboxd got the plan with the job; pbox-ctrld's
	 * job_list reports the current one. */
	if (d->bw != NULL) {
		json_t *bw = ctrld_bw_list(d->bw);
		int64_t sig = bw_signature(bw);

		if (sig != d->bw_sig) {
			d->bw_sig = sig;
			for (uint32_t i = 0; i < d->njobs; i++) {
				if (d->jobs[i].where >= 0 && !d->jobs[i].busy) {
					compute_plan(d, &d->jobs[i], (uint32_t)d->jobs[i].where,
						     bw);
				}
			}
		}
		json_decref(bw);
	}
	/* The pboxds get every new plan (job_plan, swapped in with RCU there); a failed send
	 * is retried here on the next reconcile. */
	for (uint32_t i = 0; i < d->njobs; i++) {
		send_plan(d, &d->jobs[i]);
	}
}

/* Placement summary of job j: who assigned its chunks and, when pbox-ctrld did, the
 * chunks and bytes per core of its pboxd. */
static json_t *assignment_summary(const struct ctrld *d, const struct cjob *j)
{
	json_t *chunks, *bytes;
	uint32_t n;

	if (j->assignment == NULL || j->assign_for < 0) {
		json_t *o = json_pack("{s:s}", "by", "pboxd");

		if (j->load_from_pboxd && j->where >= 0) {
			bytes = json_array();
			for (uint32_t k = 0; k < d->cfg.pboxds[j->where].cores.ncores; k++) {
				json_array_append_new(bytes,
						      json_integer((json_int_t)j->load.bytes[k]));
			}
			json_object_set_new(o, "bytes", bytes);
		}
		return o;
	}
	n = d->cfg.pboxds[j->assign_for].cores.known ? d->cfg.pboxds[j->assign_for].cores.ncores
						     : PBOX_MAX_CORES;
	chunks = json_array();
	bytes = json_array();
	for (uint32_t k = 0; k < n; k++) {
		json_array_append_new(chunks, json_integer(j->load.chunks[k]));
		json_array_append_new(bytes, json_integer((json_int_t)j->load.bytes[k]));
	}
	return json_pack("{s:s, s:s, s:o, s:o}", "by", "pbox-ctrld", "pboxd",
			 d->cfg.pboxds[j->assign_for].name, "chunks", chunks, "bytes", bytes);
}

static json_t *job_list(struct ctrld *d)
{
	json_t *arr = json_array(), *ps = json_array(), *res, *ctl;

	for (uint32_t i = 0; i < d->njobs; i++) {
		const struct cjob *j = &d->jobs[i];
		const json_t *mode = json_object_get(j->desc, "mode");
		const json_t *sync = json_object_get(json_object_get(j->desc, "sync"), "model");
		json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:O, s:s}", "id", (json_int_t)j->id,
				      "origin", j->from_config ? "config" : "runtime", "state",
				      j->where >= 0 ? "published" : "unplaced", "mode",
				      json_is_string(mode) ? json_string_value(mode) : "aggregate",
				      "workers", json_object_get(j->desc, "workers"), "sync",
				      json_is_string(sync) ? json_string_value(sync) : "bsp");

		if (j->where >= 0) {
			json_object_set_new(o, "pboxd", json_string(d->cfg.pboxds[j->where].name));
			json_object_set_new(o, "control",
					    json_string(d->cfg.pboxds[j->where].control));
		}
		if (j->note[0] != '\0') {
			json_object_set_new(o, "note", json_string(j->note));
		}
		if (j->busy) {
			/* its admission or publication waits for a pboxd's answer */
			json_object_set_new(o, "in_flight", json_true());
		}
		if (j->plan != NULL) {
			json_object_set(o, "plan", j->plan);
		}
		json_object_set_new(o, "assignment", assignment_summary(d, j));
		json_array_append_new(arr, o);
	}
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		const struct ctrld_pboxd *p = &d->cfg.pboxds[w];

		json_t *po = json_pack("{s:s, s:s, s:b, s:i, s:s}", "name", p->name, "control",
				       p->control, "up", p->up, "jobs", (json_int_t)p->njobs,
				       "last_error", p->last_error);

		if (p->cores.known) {
			uint64_t bytes[PBOX_MAX_CORES];
			json_t *cs = json_array();

			core_loads(d, w, NULL, bytes);
			for (uint32_t k = 0; k < p->cores.ncores; k++) {
				json_array_append_new(
					cs, json_pack("{s:i, s:i, s:i, s:i, s:I}", "core", (int)k,
						      "cpu", p->cores.cpu[k], "numa",
						      p->cores.numa[k], "port", p->cores.port[k],
						      "assigned_bytes", (json_int_t)bytes[k]));
			}
			json_object_set_new(po, "chunk_bytes", json_integer(p->cores.chunk_bytes));
			json_object_set_new(po, "cores", cs);
		}
		json_array_append_new(ps, po);
	}
	res = json_pack(
		"{s:b, s:o, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}}",
		"ok", 1, "jobs", arr, "pboxds", ps, "control", "jobs_created",
		(json_int_t)d->n.created, "jobs_removed", (json_int_t)d->n.removed,
		"job_create_refused", (json_int_t)d->n.create_refused, "job_rm_refused",
		(json_int_t)d->n.rm_refused, "admin_refused", (json_int_t)d->n.admin_refused,
		"wrong_admin_token", (json_int_t)d->n.wrong_admin_token, "auth_rate_limited",
		(json_int_t)d->n.auth_rate_limited, "republished", (json_int_t)d->n.republished,
		"publish_failures", (json_int_t)d->n.publish_failures, "plans_sent",
		(json_int_t)d->n.plans_sent, "plan_failures", (json_int_t)d->n.plan_failures,
		"connections", (json_int_t)d->nconns);
	ctl = json_object_get(res, "control");
	json_object_set_new(ctl, "unauthenticated", json_integer(d->nunauth));
	json_object_set_new(ctl, "max_connections", json_integer(d->cfg.max_connections));
#define PUT(x) json_object_set_new(ctl, #x, json_integer((json_int_t)d->n.x))
	PUT(refused_max_connections);
	PUT(refused_per_address);
	PUT(evicted_unauth);
	PUT(unauth_timeouts);
	PUT(line_too_long);
	PUT(not_reading);
	PUT(accept_no_fds);
	PUT(listener_pauses);
#undef PUT
	return res;
}

/* ---- the control API ---- */

static void conn_send(struct ctrld *d, struct conn *c, const json_t *obj)
{
	size_t len;
	char *s = pbox_ctl_encode(obj, &len);
	char *n;

	if (s == NULL || c->out_len - c->out_off + len > d->cfg.max_output_bytes) {
		free(s);
		CLIENT_WARN(d, "control connection %d: does not read its answers; closing", c->fd);
		d->n.not_reading += s != NULL;
		c->dead = true;
		return;
	}
	n = realloc(c->out, c->out_len + len);
	if (n == NULL) {
		free(s);
		c->dead = true;
		return;
	}
	c->out = n;
	memcpy(c->out + c->out_len, s, len);
	c->out_len += len;
	free(s);
}

static void conn_flush(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (w < 0) {
			if (errno != EAGAIN && errno != EINTR) {
				c->dead = true;
			}
			return;
		}
		c->out_off += (size_t)w;
	}
	c->out_off = c->out_len = 0;
}

/* c no longer counts as an unauthenticated connection (authenticated, evicted, closed). */
static void unauth_release(struct ctrld *d, struct conn *c)
{
	if (c->unauth) {
		c->unauth = false;
		d->nunauth--;
	}
}

static json_t *admin_check(struct ctrld *d, struct conn *c, const char *op, const char *token)
{
	if (c->local || c->admin) {
		return NULL;
	}
	if (token != NULL && c->addr != NULL &&
	    !pbox_ctladdr_auth_allowed(&d->addrs, c->addr, now_ms())) {
		c->bad++;
		d->n.auth_rate_limited++;
		CLIENT_WARN(d,
			    "control connection %d: %s refused: too many wrong admin tokens "
			    "from its address",
			    c->fd, op);
		return pbox_ctl_error(EAGAIN,
				      "%s: too many wrong admin tokens from this address (at most "
				      "%u a minute); try again later",
				      op, d->cfg.auth_failures_per_minute);
	}
	if (token != NULL && d->cfg.admin_token[0] != '\0' &&
	    pbox_ctl_token_equal(token, d->cfg.admin_token)) {
		c->admin = true;
		unauth_release(d, c);
		pbox_linebuf_set_max(&c->in, AUTHED_LINE_BYTES);
		return NULL;
	}
	c->bad++;
	if (token != NULL) {
		d->n.wrong_admin_token++;
		if (c->addr != NULL) {
			pbox_ctladdr_auth_failed(c->addr);
		}
		CLIENT_WARN(d, "control connection %d: %s refused: wrong admin token", c->fd, op);
		return pbox_ctl_error(EACCES, "%s: wrong admin token", op);
	}
	d->n.admin_refused++;
	CLIENT_WARN(d, "control connection %d: %s refused: no admin token", c->fd, op);
	return pbox_ctl_error(EACCES,
			      "%s needs pbox-ctrld's admin token (\"admin_token\") or its local "
			      "control socket",
			      op);
}

/* bw_list, and bw_probe {"from": PBOXD, "to": "ADDR:PORT"}: queue a probe (answered at
 * once with "done_at": the pair's "probes" count once it has run; the matrix shows its
 * result then). */
static json_t *handle_bw(struct ctrld *d, struct conn *c, const json_t *req, const char *op)
{
	const char *from = json_string_value(json_object_get(req, "from"));
	const char *to = json_string_value(json_object_get(req, "to"));
	char err[512];
	uint64_t done_at = 0;
	json_t *resp =
		admin_check(d, c, op, json_string_value(json_object_get(req, "admin_token")));
	int rc;

	if (resp != NULL) {
		return resp;
	}
	if (strcmp(op, "bw_list") == 0) {
		return ctrld_bw_list(d->bw);
	}
	if (from == NULL || to == NULL) {
		c->bad++;
		return pbox_ctl_error(EINVAL, "bw_probe needs \"from\" (a pboxd) and \"to\" (an "
					      "address) strings");
	}
	rc = ctrld_bw_probe(d->bw, from, to, &done_at, err, sizeof(err));
	if (rc != 0) {
		CLIENT_WARN(d, "bw_probe refused: %s", err);
		return pbox_ctl_error(-rc, "%s", err);
	}
	return json_pack("{s:b, s:b, s:I}", "ok", 1, "queued", 1, "done_at", (json_int_t)done_at);
}

/* A status request: the pboxds holding the wanted jobs are asked at once; the answer is
 * made (status.h) when all have answered or failed. */
struct status_op {
	json_t *req; /* the client's request (m points into it) */
	struct pbox_statusmsg m;
	struct conn *c;
	uint32_t left;
	bool asked[CTRLD_MAX_PBOXDS];
	int rc[CTRLD_MAX_PBOXDS];
	json_t *reply[CTRLD_MAX_PBOXDS];
};

/* status.c's ask: the answer gathered for pboxd idx. */
static int gathered(void *arg, uint32_t idx, const json_t *req, json_t **reply)
{
	struct status_op *op = arg;

	(void)req;
	if (!op->asked[idx]) {
		return -EAGAIN;
	}
	*reply = json_incref(op->reply[idx]);
	return op->rc[idx];
}

static json_t *status_answer(struct ctrld *d, struct status_op *op)
{
	json_t *resp;
	int e;

	resp = ctrld_status(&d->cfg, job_list(d), d->bw ? ctrld_bw_list(d->bw) : NULL, &op->m,
			    gathered, op, &e);
	if (resp == NULL) {
		return e == ENOENT ? pbox_ctl_error(ENOENT, "status: job %lld does not exist",
						    (long long)op->m.job)
				   : pbox_ctl_error(e, "status: %s", strerror(e));
	}
	return resp;
}

static void status_free(struct status_op *op)
{
	for (uint32_t w = 0; w < CTRLD_MAX_PBOXDS; w++) {
		json_decref(op->reply[w]);
	}
	json_decref(op->req);
	free(op);
}

static void status_got(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	struct status_op *op = arg;

	op->rc[w] = rc;
	op->reply[w] = rc == 0 ? json_incref(reply) : NULL;
	if (--op->left > 0) {
		return;
	}
	if (op->c != NULL) {
		answer(d, op->c, status_answer(d, op));
	}
	status_free(op);
}

/* {"op":"status",...} (common/statusmsg.h, status.h): admin only. NULL: c is answered when
 * the pboxds asked have answered. */
static json_t *handle_status(struct ctrld *d, struct conn *c, const json_t *req)
{
	struct status_op *op;
	char err[160];
	json_t *resp;

	op = calloc(1, sizeof(*op));
	if (op == NULL) {
		return pbox_ctl_error(ENOMEM, "status: out of memory");
	}
	op->req = json_incref((json_t *)req);
	if (pbox_statusmsg_decode(op->req, &op->m, err, sizeof(err)) != 0) {
		c->bad++;
		status_free(op);
		return pbox_ctl_error(EINVAL, "%s", err);
	}
	resp = admin_check(d, c, "status", op->m.admin_token);
	if (resp != NULL) {
		status_free(op);
		return resp;
	}
	for (uint32_t i = 0; i < d->njobs; i++) {
		const struct cjob *j = &d->jobs[i];

		if (j->where >= 0 && (op->m.job < 0 || (int64_t)j->id == op->m.job)) {
			op->asked[j->where] = true;
		}
	}
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		op->left += op->asked[w];
	}
	if (op->left == 0) {
		resp = status_answer(d, op);
		status_free(op);
		return resp;
	}
	{
		struct pbox_statusmsg pm = op->m;
		json_t *preq;

		pm.admin_token = NULL; /* the pboxd's own token is added by its connection */
		preq = pbox_statusmsg_encode(&pm);
		op->c = c;
		c->waiter = &op->c;
		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			if (op->asked[w]) {
				ask(d, w, preq, status_got, op);
			}
		}
		json_decref(preq);
	}
	return NULL;
}

/* /metrics (common/metrics.h), on this thread. */
static void render_metrics(void *arg, struct pbox_prom *p)
{
	struct ctrld *d = arg;
	json_t *list = job_list(d), *bw = d->bw ? ctrld_bw_list(d->bw) : NULL;

	ctrld_metrics_render(list, bw, p);
	json_decref(list);
	json_decref(bw);
}

static json_t *handle(struct ctrld *d, struct conn *c, const json_t *req)
{
	const char *op = json_string_value(json_object_get(req, "op"));
	struct pbox_jobmsg m;
	char err[1024];
	json_t *resp;
	int rc;

	if (op != NULL && strcmp(op, "auth") == 0) {
		resp = admin_check(d, c, op,
				   json_string_value(json_object_get(req, "admin_token")));
		return resp ? resp : json_pack("{s:b}", "ok", 1);
	}
	if (op != NULL && (strcmp(op, "bw_list") == 0 || strcmp(op, "bw_probe") == 0)) {
		return handle_bw(d, c, req, op);
	}
	if (op != NULL && strcmp(op, "status") == 0) {
		return handle_status(d, c, req);
	}
	rc = pbox_jobmsg_decode(req, &m, err, sizeof(err));
	if (rc == -ENOENT) {
		c->bad++;
		return pbox_ctl_error(EINVAL,
				      "unknown op '%s' (auth, job_create, job_rm, job_list, "
				      "bw_list, bw_probe, status)",
				      op ? op : "");
	}
	if (rc != 0) {
		c->bad++;
		return pbox_ctl_error(-rc, "%s", err);
	}
	resp = admin_check(d, c, op, m.admin_token);
	if (resp != NULL) {
		return resp;
	}
	err[0] = '\0';
	switch (m.op) {
	case PBOX_JOBMSG_LIST:
		return job_list(d);
	case PBOX_JOBMSG_PLAN:
		CLIENT_WARN(d, "job_plan for job %u refused: pbox-ctrld computes the plans", m.id);
		return pbox_ctl_error(
			EOPNOTSUPP, "job_plan is pboxd's operation: pbox-ctrld computes the plans "
				    "(give one with job_create)");
	case PBOX_JOBMSG_RM:
		rc = remove_job(d, m.id, c, err, sizeof(err));
		if (rc == 1) {
			(void)save_state(d); /* with the removal until its pboxd confirms it */
			return NULL;         /* answered when its pboxd has been told */
		}
		if (rc != 0) {
			d->n.rm_refused++;
			CLIENT_WARN(d, "job_rm refused: %s", err);
			return pbox_ctl_error(-rc, "%s", err);
		}
		d->n.removed++;
		resp = json_pack("{s:b, s:I}", "ok", 1, "id", (json_int_t)m.id);
		if (save_state(d) != 0) {
			json_object_set_new(resp, "warning",
					    json_string("removed, but the state file still has it "
							"(retried; see pbox-ctrld's log)"));
		}
		return resp;
	case PBOX_JOBMSG_CREATE:
		if (m.assignment != NULL) {
			d->n.create_refused++;
			CLIENT_WARN(d, "job_create refused: %s", "an assignment from the client");
			return pbox_ctl_error(EINVAL,
					      "job_create: \"assignment\" is not taken here: "
					      "pbox-ctrld assigns the chunks to its pboxds' cores "
					      "itself");
		}
		rc = add_job(d, (json_t *)m.job, m.plan, json_object_get(req, "placement"),
			     &(struct job_origin){ .where = -1 }, c, err, sizeof(err));
		if (rc < 0) {
			uint32_t id = 0;

			(void)pbox_jobspec_id(m.job, &id);
			d->n.create_refused++;
			CLIENT_WARN(d, "job_create of job %u refused: %s", id, err);
			return pbox_ctl_error(-rc, "%s", err);
		}
		return NULL; /* answered when its admission ends */
	}
	return pbox_ctl_error(EINVAL, "not a job operation");
}

static void serve(struct ctrld *d, struct conn *c)
{
	long n = pbox_linebuf_fill(&c->in, c->fd);
	unsigned served = 0;
	char *line;

	while (!c->dead && c->waiter == NULL && served++ < REQS_PER_TURN &&
	       (line = pbox_linebuf_next(&c->in)) != NULL) {
		json_error_t jerr;
		json_t *req = json_loads(line, 0, &jerr), *resp;

		if (!json_is_object(req)) {
			c->bad++;
			resp = pbox_ctl_error(EINVAL, "not a JSON object: %s",
					      req ? "wrong type" : jerr.text);
		} else {
			resp = handle(d, c, req);
		}
		if (resp == NULL) {
			json_decref(req); /* answered when its pboxd request completes */
			break;
		}
		conn_send(d, c, resp);
		json_decref(resp);
		json_decref(req);
		if (c->bad >= MAX_BAD) {
			CLIENT_WARN(d, "control connection %d: %u bad requests; closing", c->fd,
				    c->bad);
			c->dead = true;
		}
	}
	if (n == -E2BIG) {
		json_t *e = pbox_ctl_error(E2BIG,
					   "request line too long (%u bytes before the "
					   "admin token is proved)",
					   UNAUTH_LINE_BYTES);

		CLIENT_WARN(d, "control connection %d: request line too long; closing", c->fd);
		d->n.line_too_long++;
		conn_send(d, c, e);
		json_decref(e);
		c->dead = true;
	} else if (c->waiter == NULL &&
		   ((n == 0 && !pbox_linebuf_has_line(&c->in)) || (n < 0 && n != -EAGAIN))) {
		/* At EOF the requests still buffered are answered first. */
		c->dead = true;
	}
	/* What is left waits for the next turn (the loop does not sleep meanwhile). */
	c->more = !c->dead && c->waiter == NULL && pbox_linebuf_has_line(&c->in);
	conn_flush(c);
}

static int listen_tcp(struct ctrld *d)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(d->cfg.listen_port) };
	socklen_t sl = sizeof(sa);
	int one = 1;

	if (inet_pton(AF_INET, d->cfg.listen_host, &sa.sin_addr) != 1) {
		PBOX_LOG_ERR(MAIN, "listen %s: not an IPv4 address", d->cfg.listen_host);
		return -EINVAL;
	}
	d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->lfd < 0 || setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(d->lfd, 128) != 0 ||
	    getsockname(d->lfd, (struct sockaddr *)&sa, &sl) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(MAIN, "listen %s:%u: %s", d->cfg.listen_host, d->cfg.listen_port,
			     strerror(errno));
		return rc;
	}
	d->port = ntohs(sa.sin_port);
	return 0;
}

static int listen_unix(struct ctrld *d)
{
	struct sockaddr_un su = { .sun_family = AF_UNIX };

	snprintf(su.sun_path, sizeof(su.sun_path), "%s", d->cfg.control_socket);
	unlink(su.sun_path);
	d->ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->ufd < 0 || bind(d->ufd, (struct sockaddr *)&su, sizeof(su)) != 0 ||
	    listen(d->ufd, 16) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(MAIN, "control_socket %s: %s", su.sun_path, strerror(errno));
		return rc;
	}
	return 0;
}

/* Close the oldest connection that has not proved the admin token (of address a, or of
 * any when a is NULL), after serving what it sent already: a client that sent its token
 * with its first line is authenticated by that, not evicted. */
static void evict_oldest(struct ctrld *d, const struct pbox_ctladdr *a)
{
	for (;;) {
		struct conn *old = NULL;

		for (uint32_t i = 0; i < d->nconns; i++) {
			struct conn *c = d->conns[i];

			if (!c->dead && !c->local && !c->admin && (a == NULL || c->addr == a) &&
			    (old == NULL || c->accepted_ms < old->accepted_ms)) {
				old = c;
			}
		}
		if (old == NULL) {
			return;
		}
		serve(d, old);
		if (old->admin || old->dead) {
			continue; /* it proved the token, or closed: look again */
		}
		d->n.evicted_unauth++;
		CLIENT_WARN(d,
			    "control connection %d: closed without the admin token to make room "
			    "(max_unauth %u)",
			    old->fd, d->cfg.max_unauth);
		old->dead = true;
		unauth_release(d, old);
		return;
	}
}

/* accept() failed with EMFILE / ENFILE: shed the connection waiting in the backlog with
 * the reserved descriptor (its client sees a close instead of a hang) and stop watching
 * the listeners for LISTEN_PAUSE_MS, so the loop does not spin on them. */
static void out_of_fds(struct ctrld *d, int lfd, int err)
{
	d->n.accept_no_fds++;
	d->n.listener_pauses++;
	if (d->reserve_fd >= 0) {
		close(d->reserve_fd);
		d->reserve_fd = -1;
		close(accept4(lfd, NULL, NULL, SOCK_CLOEXEC));
		d->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	CLIENT_WARN(d,
		    "control: accept: %s (%u connections open); shedding and pausing the "
		    "listener %u ms",
		    strerror(err), d->nconns, LISTEN_PAUSE_MS);
	d->listen_paused_ms = now_ms() + LISTEN_PAUSE_MS;
}

static void accept_some(struct ctrld *d, int lfd, bool local)
{
	for (uint32_t k = 0; k < ACCEPTS_PER_TURN && now_ms() >= d->listen_paused_ms; k++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(lfd, local ? NULL : (struct sockaddr *)&sa, local ? NULL : &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct pbox_ctladdr *a = NULL;
		char ip[INET_ADDRSTRLEN] = "local";
		struct conn *c;

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				out_of_fds(d, lfd, errno);
			}
			return;
		}
		if (!local) {
			inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
			a = pbox_ctladdr_get(&d->addrs, sa.sin_addr.s_addr, now_ms());
			if (a == NULL || a->nconns >= d->cfg.max_per_address) {
				d->n.refused_per_address++;
				CLIENT_WARN(d,
					    "control: %s holds %u connections, the most per "
					    "address; refusing one",
					    ip, a ? a->nconns : 0);
				close(fd);
				continue;
			}
			if (d->nunauth >= d->cfg.max_unauth) {
				evict_oldest(d, NULL);
			}
		}
		if (d->nconns >= d->cfg.max_connections) {
			d->n.refused_max_connections++;
			CLIENT_WARN(
				d,
				"control: %u connections, the most allowed; refusing one from %s",
				d->nconns, ip);
			close(fd);
			continue;
		}
		{
			int sndbuf = CONN_SNDBUF;

			setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		}
		c = calloc(1, sizeof(*c));
		if (c == NULL) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->addr = a;
		if (a != NULL) {
			a->nconns++;
			c->unauth = true;
			d->nunauth++;
		}
		c->local = local;
		c->accepted_ms = now_ms();
		pbox_linebuf_init(&c->in);
		pbox_linebuf_set_max(&c->in, local ? AUTHED_LINE_BYTES : UNAUTH_LINE_BYTES);
		d->conns[d->nconns++] = c;
	}
}

static void reap(struct ctrld *d)
{
	uint64_t now = now_ms();

	for (uint32_t i = 0; i < d->nconns;) {
		struct conn *c = d->conns[i];

		if (!c->dead && !c->local && !c->admin &&
		    now - c->accepted_ms > d->cfg.unauth_timeout_ms) {
			CLIENT_WARN(d,
				    "control connection %d: no admin token within %u ms; closing",
				    c->fd, d->cfg.unauth_timeout_ms);
			d->n.unauth_timeouts++;
			c->dead = true;
		}
		if (!c->dead) {
			i++;
			continue;
		}
		conn_flush(c);
		/* Read what is left (bounded) so the close is a FIN, not a reset that could
		 * discard the last answer (the refusal) before the client read it. */
		for (int k = 0; k < 64; k++) {
			char sink[4096];

			if (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0) {
				break;
			}
		}
		close(c->fd);
		if (c->addr != NULL) {
			c->addr->nconns--;
		}
		unauth_release(d, c);
		if (c->waiter != NULL) {
			*c->waiter = NULL; /* its answer has nowhere to go */
		}
		pbox_linebuf_free(&c->in);
		free(c->out);
		free(c);
		d->conns[i] = d->conns[--d->nconns];
	}
}

/* The index of the pboxd whose job list (held[w]) has job id, or -1. */
static int holder(json_t *const *held, uint32_t n, uint32_t id)
{
	for (uint32_t w = 0; w < n; w++) {
		size_t k;
		json_t *o;

		json_array_foreach(held[w], k, o)
		{
			if (json_integer_value(json_object_get(o, "id")) == (json_int_t)id) {
				return (int)w;
			}
		}
	}
	return -1;
}

/* Turn the pboxd connections alone until none has a request left (at start: before the
 * clients are served). */
static void drain(struct ctrld *d)
{
	struct pollfd pfd[CTRLD_MAX_PBOXDS];

	while (!g_stop) {
		uint64_t wake = UINT64_MAX, now;
		bool any = false;

		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			any |= ctrld_pconn_pending(d->pc[w]) > 0;
			ctrld_pconn_pollfd(d->pc[w], &pfd[w], &wake);
		}
		if (!any) {
			return;
		}
		now = now_ms();
		if (poll(pfd, d->cfg.npboxds, wake <= now ? 0 : (int)PBOX_MIN(wake - now, 1000)) <
			    0 &&
		    errno != EINTR) {
			PBOX_LOG_ERR(MAIN, "poll: %s", strerror(errno));
			return;
		}
		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			ctrld_pconn_process(d->pc[w], pfd[w].revents);
		}
	}
}

static void restore_listed(struct ctrld *d, uint32_t w, int rc, json_t *reply, void *arg)
{
	json_t **held = arg;

	if (rc == 0) {
		learn_cores(d, w, reply);
		held[w] = json_incref(json_object_get(reply, "jobs"));
	}
}

/* At start: the configuration file's jobs, then the state file's runtime jobs in their
 * order. A job that a pboxd holds already (pbox-ctrld restarted, the pboxd did not) is
 * adopted there, not published again; a runtime job goes back to its pboxd (published
 * by the first reconcile if that pboxd lost it); the rest are placed by admission.
 * Returns 0, or -EINVAL when a job of the state file is refused (logged: pbox-ctrld does
 * not start rather than drop it from the file). */
static int restore_jobs(struct ctrld *d)
{
	json_t *held[CTRLD_MAX_PBOXDS] = { NULL };
	char why[1024];
	int rc = 0;
	size_t k;
	json_t *o;

	/* Every pboxd's job list, asked at once. */
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		json_t *req = pbox_jobmsg_list(NULL);

		ask(d, w, req, restore_listed, held);
		json_decref(req);
	}
	drain(d);
	json_array_foreach(d->cfg.jobs, k, o)
	{
		uint32_t id = 0;
		int h;

		(void)pbox_jobspec_id(o, &id);
		h = holder(held, d->cfg.npboxds, id);
		why[0] = '\0';
		if (add_job(d, o, NULL, NULL,
			    &(struct job_origin){
				    .from_config = true, .where = h, .adopt = h >= 0 },
			    NULL, why, sizeof(why)) < 0) {
			PBOX_LOG_ERR(ADMIN, "configured job refused: %s", why);
		}
	}
	json_array_foreach(d->state_rms, k, o)
	{
		const char *name = json_string_value(json_object_get(o, "pboxd"));
		uint32_t id = (uint32_t)json_integer_value(json_object_get(o, "id"));
		int w = -1;

		for (uint32_t i = 0; i < d->cfg.npboxds; i++) {
			if (strcmp(d->cfg.pboxds[i].name, name) == 0) {
				w = (int)i;
			}
		}
		if (w < 0 || d->nrms >= MAX_JOBS) {
			PBOX_LOG_WARN(ADMIN, "job %u: its removal from pboxd %s is dropped (%s)",
				      id, name,
				      w < 0 ? "not managed any more" : "too many removals");
			continue;
		}
		d->rms[d->nrms++] = (struct pending_rm){ .id = id, .where = w };
		PBOX_LOG_INFO(ADMIN, "job %u: its removal from pboxd %s is retried", id, name);
	}
	json_array_foreach(d->state_jobs, k, o)
	{
		const char *name = json_string_value(json_object_get(o, "pboxd"));
		json_t *desc = json_object_get(o, "job");
		struct job_origin jo = { .restored = true, .where = -1 };
		uint32_t id = 0;
		int w = -1, h;

		for (uint32_t i = 0; name != NULL && i < d->cfg.npboxds; i++) {
			if (strcmp(d->cfg.pboxds[i].name, name) == 0) {
				w = (int)i;
			}
		}
		(void)pbox_jobspec_id(desc, &id);
		h = holder(held, d->cfg.npboxds, id);
		if (h >= 0) {
			jo.where = h;
			jo.adopt = true;
			jo.assignment = h == w ? json_object_get(o, "assignment") : NULL;
		} else if (w >= 0) {
			jo.where = w;
			jo.assignment = json_object_get(o, "assignment");
		} else if (name != NULL) {
			PBOX_LOG_WARN(ADMIN,
				      "job %u: its pboxd %s is not managed any more: placed "
				      "again",
				      id, name);
		}
		why[0] = '\0';
		if (add_job(d, desc, json_object_get(o, "plan"), json_object_get(o, "placement"),
			    &jo, NULL, why, sizeof(why)) < 0) {
			PBOX_LOG_ERR(ADMIN,
				     "state file %s: job %u refused: %s (not started: fix the "
				     "configuration or remove the job from the file)",
				     d->cfg.state_file, id, why);
			rc = -EINVAL;
			break;
		} else {
			PBOX_LOG_INFO(ADMIN, "job %u restored from the state file", id);
		}
	}
	drain(d); /* the admissions started here end before the clients are served */
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		json_decref(held[w]);
	}
	if (rc == 0) {
		(void)save_state(d);
	}
	return rc;
}

static int run(struct ctrld *d)
{
	struct pollfd *pfd = calloc(d->cfg.max_connections + 3 + d->cfg.npboxds, sizeof(*pfd));

	if (pfd == NULL) {
		return -ENOMEM;
	}
	if (restore_jobs(d) != 0) {
		free(pfd);
		return -EINVAL;
	}
	/* Listening, and the configured jobs published or queued: tell systemd (Type=notify). */
	{
		uint32_t published = 0;

		for (uint32_t i = 0; i < d->njobs; i++) {
			published += d->jobs[i].where >= 0;
		}
		pbox_notifyf("READY=1\nSTATUS=%u pboxd%s, %u job%s (%u published)", d->cfg.npboxds,
			     d->cfg.npboxds == 1 ? "" : "s", d->njobs, d->njobs == 1 ? "" : "s",
			     published);
	}
	d->next_reconcile_ms = now_ms() + d->cfg.reconcile_ms;
	while (!g_stop) {
		uint32_t n = 0, first, pfirst;
		uint64_t now = now_ms(), wake = d->next_reconcile_ms;
		bool paused = now < d->listen_paused_ms;
		int wait;

		/* Paused listeners (out of descriptors) are not watched: poll ignores fd -1. */
		pfd[n++] = (struct pollfd){ .fd = paused ? -1 : d->lfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = paused ? -1 : d->ufd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = d->metrics ? pbox_metrics_fd(d->metrics) : -1,
					    .events = POLLIN };
		first = n;
		for (uint32_t i = 0; i < d->nconns; i++) {
			const struct conn *c = d->conns[i];

			/* A connection waiting for a pboxd is not read (nor watched, unless it
			 * has answers to write) until it is answered. */
			pfd[n++] = (struct pollfd){
				.fd = c->waiter != NULL && c->out_len == 0 ? -1 : c->fd,
				.events = (short)((c->waiter != NULL ? 0 : POLLIN) |
						  (c->out_len ? POLLOUT : 0)),
			};
			if (c->more) {
				wake = now;
			}
			if (c->unauth) {
				wake = PBOX_MIN(wake,
						c->accepted_ms + d->cfg.unauth_timeout_ms + 1);
			}
		}
		if (paused) {
			wake = PBOX_MIN(wake, d->listen_paused_ms);
		}
		pfirst = n;
		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			ctrld_pconn_pollfd(d->pc[w], &pfd[n++], &wake);
		}
		wait = now >= wake ? 0 : (int)(wake - now);
		if (poll(pfd, n, wait) < 0 && errno != EINTR) {
			PBOX_LOG_ERR(MAIN, "poll: %s", strerror(errno));
			break;
		}
		for (uint32_t i = first; i < n; i++) {
			struct conn *c = d->conns[i - first];

			if (i >= pfirst) {
				break;
			}
			if (c->waiter != NULL) {
				if (pfd[i].revents & (POLLOUT | POLLHUP | POLLERR)) {
					conn_flush(c);
				}
			} else if (c->more || (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
				serve(d, c);
			} else if (pfd[i].revents & POLLOUT) {
				conn_flush(c);
			}
		}
		/* The pboxds' answers: their clients are answered, rounds go on. */
		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			ctrld_pconn_process(d->pc[w], pfd[pfirst + w].revents);
		}
		reap(d);
		if (pfd[0].revents & POLLIN) {
			accept_some(d, d->lfd, false);
		}
		if (d->ufd >= 0 && (pfd[1].revents & POLLIN)) {
			accept_some(d, d->ufd, true);
		}
		reap(d); /* the connections evicted to make room */
		if (pfd[2].revents & POLLIN) {
			pbox_metrics_serve(d->metrics, render_metrics, d);
		}
		if (now_ms() >= d->next_reconcile_ms) {
			pbox_ctladdr_gc(&d->addrs, now_ms());
			reconcile(d);
			d->next_reconcile_ms = now_ms() + d->cfg.reconcile_ms;
		}
	}
	pbox_notify("STOPPING=1");
	free(pfd);
	return 0;
}

/* Raise the open-file limit to its hard limit and lower max_connections (and max_unauth
 * with it) to what fits below it with FD_RESERVE descriptors to spare, as pboxd does. */
static void fit_to_fd_limit(struct ctrld_config *cfg)
{
	struct rlimit rl;
	uint64_t room;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
		return;
	}
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
		(void)getrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur == RLIM_INFINITY) {
		return;
	}
	room = rl.rlim_cur > FD_RESERVE + 16 ? rl.rlim_cur - FD_RESERVE : 16;
	if (room < cfg->max_connections) {
		PBOX_LOG_WARN(MAIN,
			      "max_connections %u lowered to %llu: the open-file limit is %llu "
			      "(raise it with ulimit -n / LimitNOFILE)",
			      cfg->max_connections, (unsigned long long)room,
			      (unsigned long long)rl.rlim_cur);
		cfg->max_connections = (uint32_t)room;
	}
	cfg->max_unauth = PBOX_MIN(cfg->max_unauth, cfg->max_connections);
}

/* The state file's runtime jobs (state.h) into d->state_jobs: 0, or -errno with err (a
 * file that is not valid, or a job that is also one of the configuration file's). */
static int load_state(struct ctrld *d, char *err, size_t errlen)
{
	size_t k, i;
	json_t *o, *c;
	int rc;

	if (d->cfg.state_file[0] == '\0') {
		d->state_jobs = json_array();
		d->state_rms = json_array();
		return d->state_jobs != NULL && d->state_rms != NULL ? 0 : -ENOMEM;
	}
	rc = ctrld_state_load(d->cfg.state_file, &d->state_jobs, &d->state_rms, err, errlen);
	if (rc == -ENOENT) {
		PBOX_LOG_INFO(MAIN, "state file %s: none yet (no runtime jobs to restore)",
			      d->cfg.state_file);
		return 0;
	}
	if (rc != 0) {
		return rc;
	}
	json_array_foreach(d->state_jobs, k, o)
	{
		uint32_t id = 0;

		(void)pbox_jobspec_id(json_object_get(o, "job"), &id);
		json_array_foreach(d->cfg.jobs, i, c)
		{
			uint32_t other = 0;

			(void)pbox_jobspec_id(c, &other);
			if (other == id) {
				snprintf(err, errlen,
					 "state file %s: jobs[%zu]: job %u is also a job of %s "
					 "(remove one of them)",
					 d->cfg.state_file, k, id, d->cfg.path);
				json_decref(d->state_jobs);
				json_decref(d->state_rms);
				d->state_jobs = d->state_rms = NULL;
				return -EINVAL;
			}
		}
	}
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-ctrld [-c FILE] [--check-config] [-V] [-h]\n"
		"\n"
		"The pbox control plane: holds the jobs (its configuration file's and those\n"
		"created with `pbox job create --control ADDR`), admits each onto one of the\n"
		"pboxds it manages and publishes it there over the pboxd's admin control channel,\n"
		"publishing again whenever a pboxd lost its jobs (restarted). With a bandwidth\n"
		"group it keeps the bandwidth matrix of its probe pairs (`pbox bw`). Runs in the\n"
		"foreground; SIGTERM / SIGINT stop it (the published jobs stay on the pboxds).\n"
		"\n"
		"  -c, --config FILE   configuration (default %s)\n"
		"      --log-format F  text (default) or json: one JSON object per log line\n"
		"      --check-config  validate the configuration (static jobs with pboxd's job\n"
		"                      validation) and exit\n"
		"  -V, --version       version\n"
		"  -h, --help          this text\n",
		CTRLD_DEFAULT_CONFIG);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "log-format", required_argument, NULL, 'L' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = CTRLD_DEFAULT_CONFIG;
	struct ctrld d = { .lfd = -1, .ufd = -1, .reserve_fd = -1 };
	struct sigaction sa = { .sa_handler = on_signal };
	bool check = false;
	char err[1024];
	int opt, rc, log_format = -1;

	pbox_log_init_from_env();
	pbox_log_set_ident("pbox-ctrld");
	while ((opt = getopt_long(argc, argv, "c:Vh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			path = optarg;
			break;
		case 'C':
			check = true;
			break;
		case 'L':
			log_format = pbox_log_parse_format(optarg);
			if (log_format < 0) {
				fprintf(stderr,
					"pbox-ctrld: --log-format %s: expected text or json\n",
					optarg);
				return 64;
			}
			break;
		case 'V':
			printf("pbox-ctrld %s\n", PBOX_VERSION_STRING);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "pbox-ctrld: unexpected argument '%s'\n", argv[optind]);
		return 64;
	}
	rc = ctrld_config_load(&d.cfg, path, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "pbox-ctrld: %s\n", err);
		return 78; /* EX_CONFIG */
	}
	if (load_state(&d, err, sizeof(err)) != 0) {
		fprintf(stderr, "pbox-ctrld: %s\n", err);
		ctrld_config_free(&d.cfg);
		return 78; /* EX_CONFIG */
	}
	if (log_format >= 0 || d.cfg.log_format >= 0) {
		pbox_log_set_format(
			(enum pbox_log_format)(log_format >= 0 ? log_format : d.cfg.log_format));
	}
	if (check) {
		printf("%s: ok: %u pboxd(s), %zu static job(s)", path, d.cfg.npboxds,
		       json_array_size(d.cfg.jobs));
		if (d.cfg.state_file[0] != '\0') {
			printf(", %zu runtime job(s) in %s", json_array_size(d.state_jobs),
			       d.cfg.state_file);
		}
		printf("\n");
		json_decref(d.state_jobs);
		json_decref(d.state_rms);
		ctrld_config_free(&d.cfg);
		return 0;
	}
	pbox_ctladdr_init(&d.addrs, d.cfg.auth_failures_burst, d.cfg.auth_failures_per_minute);
	fit_to_fd_limit(&d.cfg);
	d.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	d.conns = calloc(d.cfg.max_connections, sizeof(*d.conns));
	d.jobs = calloc(MAX_JOBS, sizeof(*d.jobs));
	d.rms = calloc(MAX_JOBS, sizeof(*d.rms));
	if (d.conns == NULL || d.jobs == NULL || d.rms == NULL || listen_tcp(&d) != 0 ||
	    (d.cfg.control_socket[0] != '\0' && listen_unix(&d) != 0)) {
		rc = 69; /* EX_UNAVAILABLE */
		goto out;
	}
	for (uint32_t w = 0; w < d.cfg.npboxds; w++) {
		d.pc[w] = ctrld_pconn_new(d.cfg.pboxds[w].control, d.cfg.pboxds[w].admin_token,
					  d.cfg.request_timeout_ms);
		if (d.pc[w] == NULL) {
			PBOX_LOG_ERR(MAIN, "pboxd %s: out of memory", d.cfg.pboxds[w].name);
			rc = 69; /* EX_UNAVAILABLE */
			goto out;
		}
	}
	if (ctrld_bw_start(&d.cfg, &d.bw) != 0) {
		rc = 69; /* EX_UNAVAILABLE */
		goto out;
	}
	if (d.cfg.metrics.enabled &&
	    (d.metrics = pbox_metrics_start(&d.cfg.metrics, "pbox-ctrld")) == NULL) {
		rc = 69; /* EX_UNAVAILABLE */
		goto out;
	}
	PBOX_LOG_INFO(MAIN, "pbox-ctrld %s: control API on %s:%u%s%s, managing %u pboxd(s)",
		      PBOX_VERSION_STRING, d.cfg.listen_host, d.port,
		      d.cfg.control_socket[0] ? " and " : "", d.cfg.control_socket, d.cfg.npboxds);
	rc = run(&d);
	rc = rc == 0 ? 0 : rc == -EINVAL ? 78 /* EX_CONFIG */ : 1;
	PBOX_LOG_INFO(MAIN, "stopping (the published jobs stay on their pboxds)");
out:
	/* Requests still queued to the pboxds end (-ECANCELED; their clients are told); what
	 * their completions queue meanwhile ends too. */
	for (bool again = true; again;) {
		again = false;
		for (uint32_t w = 0; w < d.cfg.npboxds; w++) {
			if (d.pc[w] != NULL && ctrld_pconn_pending(d.pc[w]) > 0) {
				ctrld_pconn_cancel(d.pc[w]);
				again = true;
			}
		}
	}
	for (uint32_t w = 0; w < d.cfg.npboxds; w++) {
		ctrld_pconn_free(d.pc[w]);
	}
	pbox_metrics_stop(d.metrics);
	ctrld_bw_stop(d.bw);
	for (uint32_t i = 0; i < d.nconns; i++) {
		d.conns[i]->dead = true;
	}
	reap(&d);
	for (uint32_t i = 0; i < d.njobs; i++) {
		free_job(&d.jobs[i]);
	}
	json_decref(d.state_jobs);
	json_decref(d.state_rms);
	if (d.lfd >= 0) {
		close(d.lfd);
	}
	if (d.reserve_fd >= 0) {
		close(d.reserve_fd);
	}
	if (d.ufd >= 0) {
		close(d.ufd);
		unlink(d.cfg.control_socket);
	}
	pbox_ctladdr_free(&d.addrs);
	free(d.conns);
	free(d.jobs);
	free(d.rms);
	ctrld_config_free(&d.cfg);
	return rc;
}
