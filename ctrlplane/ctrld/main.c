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
 * spinning. Requests to a pboxd are made from the one loop and block it for at most
 * request_timeout each, except probes: the bandwidth matrix (bw.h, ops bw_list and
 * bw_probe) asks for them from its own thread.
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
#include "common/ctlclient.h"
#include "common/ctlproto.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/notify.h"
#include "assign.h"
#include "bw.h"
#include "ctrld.h"
#include "state.h"

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
	bool from_config;
	int where; /* index of the pboxd holding it; -1: not placed */
	char note[512];
	/* Its chunks on the cores of pboxds[assign_for] (assign.h), published with it; NULL:
	 * pboxd assigns them (no fixed key set, or cores not known). */
	json_t *assignment;
	int assign_for;
	struct ctrld_core_load load; /* per-core totals of assignment, or pboxd's placement */
	bool load_from_pboxd;        /* load is what pboxd placed (no assignment; at register) */
};

struct pending_rm {
	uint32_t id;
	int where;
};

struct conn {
	int fd;
	struct pbox_ctladdr *addr; /* NULL: the Unix socket */
	bool local, admin, dead;
	bool more;   /* complete requests are buffered beyond this turn's share */
	bool unauth; /* counted in nunauth (TCP, the admin token not proved, not evicted) */
	unsigned bad;
	uint64_t accepted_ms;
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

/* One request to pboxd p: 0 with *reply, or -errno (unreachable: p is marked down). */
static int pboxd_request(struct ctrld *d, struct ctrld_pboxd *p, const json_t *req, json_t **reply)
{
	char err[320];
	int rc = pbox_ctl_request(p->control, p->admin_token, req, reply,
				  (int)d->cfg.request_timeout_ms, err, sizeof(err));

	if (rc != 0) {
		if (p->up || strcmp(p->last_error, err) != 0) {
			PBOX_LOG_WARN(ADMIN, "pboxd %s: %s", p->name, err);
		}
		p->up = false;
		snprintf(p->last_error, sizeof(p->last_error), "%s", err);
		return rc;
	}
	if (!p->up) {
		PBOX_LOG_INFO(ADMIN, "pboxd %s (%s) is reachable", p->name, p->control);
	}
	p->up = true;
	p->last_error[0] = '\0';
	return 0;
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

/* Ask pboxd w for its cores when they are not known yet. */
static void ensure_cores(struct ctrld *d, uint32_t w)
{
	json_t *req, *reply = NULL;

	/* A pboxd that did not answer its last request is asked only by the publication
	 * itself (not twice per attempt); the reconcile loop learns its cores when it is up. */
	if (d->cfg.pboxds[w].cores.known || !d->cfg.pboxds[w].up) {
		return;
	}
	req = pbox_jobmsg_list(NULL);
	if (req != NULL && pboxd_request(d, &d->cfg.pboxds[w], req, &reply) == 0) {
		learn_cores(d, w, reply);
	}
	json_decref(req);
	json_decref(reply);
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

	ensure_cores(d, w);
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

		if (j->from_config) {
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
				j->placement, bw, j->plan, &np, err, sizeof(err));
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

/* Publish job j to pboxd w. 0, or -errno with why (the pboxd's refusal or the failure). */
static int publish_to(struct ctrld *d, struct cjob *j, uint32_t w, char *why, size_t len)
{
	struct ctrld_pboxd *p = &d->cfg.pboxds[w];
	json_t *req, *reply = NULL;
	int rc;

	compute_plan(d, j, w, NULL);
	rc = assign_for(d, j, w, why, len);
	if (rc != 0) {
		return rc;
	}
	req = pbox_jobmsg_create_plan(j->desc, j->plan, NULL);
	if (req != NULL && j->assignment != NULL &&
	    json_object_set(req, "assignment", j->assignment) != 0) {
		json_decref(req);
		req = NULL;
	}
	if (req == NULL) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	rc = pboxd_request(d, p, req, &reply);
	json_decref(req);
	if (rc != 0) {
		snprintf(why, len, "pboxd %s: unreachable (%s)", p->name, p->last_error);
		return rc;
	}
	if (!json_is_true(json_object_get(reply, "ok"))) {
		rc = -(int)json_integer_value(json_object_get(reply, "errno"));
		snprintf(why, len, "pboxd %s: %s", p->name,
			 json_string_value(json_object_get(reply, "error")) ?: "refused");
		json_decref(reply);
		return rc ? rc : -EIO;
	}
	json_decref(reply);
	j->plan_sent = j->plan != NULL ? pbox_jobspec_plan_revision(j->plan) : -1;
	return 0;
}

/* Send job j's current plan to its pboxd (job_plan) when the pboxd has not acknowledged
 * this revision yet; a failure is noted and retried on the next reconcile. */
static void send_plan(struct ctrld *d, struct cjob *j)
{
	struct ctrld_pboxd *p;
	json_t *req, *reply = NULL;
	int64_t rev;
	int rc;

	if (j->where < 0 || j->plan == NULL) {
		return;
	}
	rev = pbox_jobspec_plan_revision(j->plan);
	if (rev <= j->plan_sent) {
		return;
	}
	p = &d->cfg.pboxds[j->where];
	req = pbox_jobmsg_plan(j->id, j->plan, NULL);
	if (req == NULL) {
		return;
	}
	rc = pboxd_request(d, p, req, &reply);
	json_decref(req);
	if (rc != 0 || !json_is_true(json_object_get(reply, "ok"))) {
		d->n.plan_failures++;
		snprintf(j->note, sizeof(j->note), "plan revision %lld not sent to pboxd %s: %s",
			 (long long)rev, p->name,
			 rc != 0 ? p->last_error
				 : json_string_value(json_object_get(reply, "error")) ?: "refused");
		PBOX_LOG_WARN(ADMIN, "job %u: %s (retried)", j->id, j->note);
		json_decref(reply);
		return;
	}
	/* Applied, or the pboxd holds this revision or a newer one already. */
	j->plan_sent = rev;
	d->n.plans_sent++;
	if (!json_is_true(json_object_get(reply, "applied"))) {
		PBOX_LOG_INFO(ADMIN, "job %u: pboxd %s: %s", j->id, p->name,
			      json_string_value(json_object_get(reply, "reason")) ?: "not applied");
	} else {
		PBOX_LOG_INFO(ADMIN, "job %u: plan revision %lld sent to pboxd %s", j->id,
			      (long long)rev, p->name);
	}
	json_decref(reply);
}

/* Admission: offer j to the pboxds, fewest jobs first, until one holds it. 0, or -errno
 * with every pboxd's reason in why (-EINVAL at once: the definition is bad anywhere). */
static int place(struct ctrld *d, struct cjob *j, char *why, size_t len)
{
	bool tried[CTRLD_MAX_PBOXDS] = { false };
	size_t off = 0;
	int last = -EHOSTUNREACH;
	bool any_reachable = false;

	why[0] = '\0';
	for (uint32_t round = 0; round < d->cfg.npboxds; round++) {
		char one[400];
		int best = -1, rc;

		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			if (!tried[w] &&
			    (best < 0 || d->cfg.pboxds[w].njobs < d->cfg.pboxds[best].njobs)) {
				best = (int)w;
			}
		}
		tried[best] = true;
		rc = publish_to(d, j, (uint32_t)best, one, sizeof(one));
		if (rc == 0) {
			j->where = best;
			d->cfg.pboxds[best].njobs++;
			j->note[0] = '\0';
			PBOX_LOG_INFO(ADMIN, "job %u: published to pboxd %s (%s)", j->id,
				      d->cfg.pboxds[best].name, d->cfg.pboxds[best].control);
			return 0;
		}
		if (rc == -EINVAL) {
			snprintf(why, len, "%s", one);
			return rc;
		}
		if (rc != -ECONNREFUSED && rc != -ETIMEDOUT && rc != -ECONNRESET && rc != -ENOENT &&
		    rc != -EHOSTUNREACH) {
			any_reachable = true;
			last = rc;
		}
		off += (size_t)snprintf(why + off, off < len ? len - off : 0, "%s%s",
					off ? "; " : "", one);
		if (off >= len) {
			off = len;
		}
	}
	return any_reachable ? (last == -EEXIST ? -EEXIST : -ENOSPC) : -EHOSTUNREACH;
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
}

static int add_job(struct ctrld *d, json_t *desc, const json_t *plan, const json_t *placement,
		   const struct job_origin *o, char *why, size_t len)
{
	bool from_config = o->from_config;
	struct cjob *j;
	uint32_t id;
	int rc;

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
	rc = place(d, j, why, len);
	if (rc == 0) {
		d->njobs++;
		return 0;
	}
	/* A static job, or one restored from the state file (never dropped: the file is
	 * rewritten next), waits for a pboxd that can hold it (reconcile retries). */
	if ((from_config && rc != -EINVAL) || o->restored) {
		snprintf(j->note, sizeof(j->note), "%s", why);
		PBOX_LOG_WARN(ADMIN, "job %u: not placed yet: %s", id, why);
		d->njobs++;
		return 0;
	}
	free_job(j);
	return rc;
}

static int remove_job(struct ctrld *d, uint32_t id, char *why, size_t len)
{
	struct cjob *j = find_job(d, id);

	if (j == NULL) {
		snprintf(why, len, "job %u does not exist", id);
		return -ENOENT;
	}
	if (j->where >= 0) {
		struct ctrld_pboxd *p = &d->cfg.pboxds[j->where];
		json_t *req = pbox_jobmsg_rm(id, NULL), *reply = NULL;

		if (req != NULL && pboxd_request(d, p, req, &reply) == 0) {
			PBOX_LOG_INFO(ADMIN, "job %u: removed from pboxd %s%s", id, p->name,
				      json_is_true(json_object_get(reply, "ok"))
					      ? ""
					      : " (it did not hold it any more)");
		} else if (d->nrms < MAX_JOBS) {
			/* Retried by the reconcile loop once the pboxd answers. */
			d->rms[d->nrms++] = (struct pending_rm){ .id = id, .where = j->where };
			PBOX_LOG_WARN(ADMIN, "job %u: pboxd %s unreachable; its removal is retried",
				      id, p->name);
		}
		json_decref(req);
		json_decref(reply);
		p->njobs--;
	}
	free_job(j);
	*j = d->jobs[--d->njobs];
	return 0;
}

/* Every pboxd: what should be there and is not is published again (a restarted pboxd),
 * removals that could not be sent are retried, jobs not placed are offered again. */
static void reconcile(struct ctrld *d)
{
	char why[1024];

	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		struct ctrld_pboxd *p = &d->cfg.pboxds[w];
		json_t *req = pbox_jobmsg_list(NULL), *reply = NULL, *there, *o;
		size_t k;

		if (req == NULL || pboxd_request(d, p, req, &reply) != 0) {
			json_decref(req);
			continue;
		}
		json_decref(req);
		learn_cores(d, w, reply);
		there = json_object_get(reply, "jobs");
		for (uint32_t r = 0; r < d->nrms;) {
			json_t *rm, *rr = NULL;

			if (d->rms[r].where != (int)w) {
				r++;
				continue;
			}
			rm = pbox_jobmsg_rm(d->rms[r].id, NULL);
			if (rm != NULL && pboxd_request(d, p, rm, &rr) == 0) {
				PBOX_LOG_INFO(ADMIN, "job %u: removal delivered to pboxd %s",
					      d->rms[r].id, p->name);
				d->rms[r] = d->rms[--d->nrms];
				d->state_dirty = true;
			} else {
				r++;
			}
			json_decref(rm);
			json_decref(rr);
		}
		for (uint32_t i = 0; i < d->njobs; i++) {
			struct cjob *j = &d->jobs[i];
			bool found = false;

			if (j->where != (int)w) {
				continue;
			}
			json_array_foreach(there, k, o)
			{
				if (json_integer_value(json_object_get(o, "id")) ==
				    (json_int_t)j->id) {
					found = true;
					learn_pboxd_load(j, o);
				}
			}
			if (found) {
				continue;
			}
			if (publish_to(d, j, w, why, sizeof(why)) == 0) {
				d->n.republished++;
				PBOX_LOG_INFO(
					ADMIN,
					"job %u: published again to pboxd %s (it did not hold "
					"it: restarted?)",
					j->id, p->name);
			} else {
				d->n.publish_failures++;
				snprintf(j->note, sizeof(j->note), "%s", why);
				PBOX_LOG_WARN(ADMIN, "job %u: publishing again failed: %s", j->id,
					      why);
			}
		}
		json_decref(reply);
	}
	for (uint32_t i = 0; i < d->njobs; i++) {
		if (d->jobs[i].where < 0) {
			if (place(d, &d->jobs[i], why, sizeof(why)) != 0) {
				snprintf(d->jobs[i].note, sizeof(d->jobs[i].note), "%s", why);
			} else {
				d->state_dirty |= !d->jobs[i].from_config;
			}
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
				if (d->jobs[i].where >= 0) {
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
	rc = pbox_jobmsg_decode(req, &m, err, sizeof(err));
	if (rc == -ENOENT) {
		c->bad++;
		return pbox_ctl_error(EINVAL,
				      "unknown op '%s' (auth, job_create, job_rm, job_list, "
				      "bw_list, bw_probe)",
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
		rc = remove_job(d, m.id, err, sizeof(err));
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
			     &(struct job_origin){ .where = -1 }, err, sizeof(err));
		if (rc != 0) {
			uint32_t id = 0;

			(void)pbox_jobspec_id(m.job, &id);
			d->n.create_refused++;
			CLIENT_WARN(d, "job_create of job %u refused: %s", id, err);
			return pbox_ctl_error(-rc, "%s", err);
		}
		d->n.created++;
		resp = json_pack("{s:b, s:I, s:s}", "ok", 1, "id",
				 (json_int_t)d->jobs[d->njobs - 1].id, "pboxd",
				 d->cfg.pboxds[d->jobs[d->njobs - 1].where].name);
		if (save_state(d) != 0) {
			json_object_set_new(resp, "warning",
					    json_string("published, but not written to the state "
							"file (retried; see pbox-ctrld's log)"));
		}
		return resp;
	}
	return pbox_ctl_error(EINVAL, "not a job operation");
}

static void serve(struct ctrld *d, struct conn *c)
{
	long n = pbox_linebuf_fill(&c->in, c->fd);
	unsigned served = 0;
	char *line;

	while (!c->dead && served++ < REQS_PER_TURN && (line = pbox_linebuf_next(&c->in)) != NULL) {
		json_error_t jerr;
		json_t *req = json_loads(line, 0, &jerr), *resp;

		if (!json_is_object(req)) {
			c->bad++;
			resp = pbox_ctl_error(EINVAL, "not a JSON object: %s",
					      req ? "wrong type" : jerr.text);
		} else {
			resp = handle(d, c, req);
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
	} else if ((n == 0 && !pbox_linebuf_has_line(&c->in)) || (n < 0 && n != -EAGAIN)) {
		/* At EOF the requests still buffered are answered first. */
		c->dead = true;
	}
	/* What is left waits for the next turn (the loop does not sleep meanwhile). */
	c->more = !c->dead && pbox_linebuf_has_line(&c->in);
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

	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		json_t *req = pbox_jobmsg_list(NULL), *reply = NULL;

		if (req != NULL && pboxd_request(d, &d->cfg.pboxds[w], req, &reply) == 0) {
			learn_cores(d, w, reply);
			held[w] = json_incref(json_object_get(reply, "jobs"));
		}
		json_decref(req);
		json_decref(reply);
	}
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
			    why, sizeof(why)) != 0) {
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
			    &jo, why, sizeof(why)) != 0) {
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
	struct pollfd *pfd = calloc(d->cfg.max_connections + 2, sizeof(*pfd));

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
		uint32_t n = 0, first;
		uint64_t now = now_ms(), wake = d->next_reconcile_ms;
		bool paused = now < d->listen_paused_ms;
		int wait;

		/* Paused listeners (out of descriptors) are not watched: poll ignores fd -1. */
		pfd[n++] = (struct pollfd){ .fd = paused ? -1 : d->lfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = paused ? -1 : d->ufd, .events = POLLIN };
		first = n;
		for (uint32_t i = 0; i < d->nconns; i++) {
			const struct conn *c = d->conns[i];

			pfd[n++] = (struct pollfd){
				.fd = c->fd,
				.events = (short)(POLLIN | (c->out_len ? POLLOUT : 0)),
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
		wait = now >= wake ? 0 : (int)(wake - now);
		if (poll(pfd, n, wait) < 0 && errno != EINTR) {
			PBOX_LOG_ERR(MAIN, "poll: %s", strerror(errno));
			break;
		}
		for (uint32_t i = first; i < n; i++) {
			struct conn *c = d->conns[i - first];

			if (c->more || (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
				serve(d, c);
			} else if (pfd[i].revents & POLLOUT) {
				conn_flush(c);
			}
		}
		reap(d);
		if (pfd[0].revents & POLLIN) {
			accept_some(d, d->lfd, false);
		}
		if (d->ufd >= 0 && (pfd[1].revents & POLLIN)) {
			accept_some(d, d->ufd, true);
		}
		reap(d); /* the connections evicted to make room */
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
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = CTRLD_DEFAULT_CONFIG;
	struct ctrld d = { .lfd = -1, .ufd = -1, .reserve_fd = -1 };
	struct sigaction sa = { .sa_handler = on_signal };
	bool check = false;
	char err[1024];
	int opt, rc;

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
	if (ctrld_bw_start(&d.cfg, &d.bw) != 0) {
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
