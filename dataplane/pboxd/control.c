/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's control listener: JSON lines over TCP and a Unix socket, on epoll (see control.h). */
#include "control.h"
#include "probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/ctladdr.h"
#include "common/ctlproto.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/statusmsg.h"
#include "fdbudget.h"
#include "jobstatus.h"

#define MAX_BAD_REQUESTS 8
/* A hello is small: the token is at most 255 bytes (6 each when JSON-escaped). */
#define UNAUTH_LINE_BYTES 4096u
/* Descriptors kept for everything but the holders of fdbudget.h (cores' sockets, timers,
 * logs, the descriptor kept to shed a connection). */
#define FD_RESERVE PBOXD_FD_RESERVE
/* Events taken per epoll_wait and connections accepted per listener event: bounded turns,
 * so that established connections are served between bursts of new ones. */
#define MAX_EVENTS       256
#define ACCEPTS_PER_TURN 64
#define SWEEP_MS         100u
#define LISTEN_PAUSE_MS  200u
#define EVICT_READ_TRIES 8
/* Request lines answered per connection per turn; the rest wait for the next turn (a
 * client that pipelines thousands of requests does not hold the loop). */
#define LINES_PER_TURN 32
/* Kernel send buffer of a control connection: answers are small, and a fixed size keeps
 * the memory a client that does not read can pin (the kernel would grow it to MBs); the
 * rest waits in the bounded output queue. */
#define CONN_SNDBUF (256 * 1024)

enum src_kind {
	SRC_TCP_LISTEN = 1,
	SRC_UNIX_LISTEN,
	SRC_TIMER,
	SRC_SESSIONS,
	SRC_PROBE,
	SRC_BACKLOG,
	SRC_CONN,
};

/* What an epoll event's data.ptr points to. */
struct src {
	enum src_kind kind;
};

struct conn {
	struct pboxd_member_ref ref; /* the sessions module's view (callbacks container_of) */
	struct src src;
	struct pboxd_control *ctl;
	int fd;
	struct pbox_ctladdr *addr; /* NULL: the Unix socket */
	bool local;                /* over the Unix socket: an operator, admin */
	bool authed;               /* admitted (valid hello) or local */
	bool admin;                /* proved the admin token (or local) */
	bool dead;                 /* closed; freed at the end of the pass */
	bool want_out;             /* EPOLLOUT registered */
	bool in_backlog;           /* has complete lines left for the next turn */
	bool probe_pending;        /* waits for the answer of the probe it started */
	uint64_t accepted_ms;
	unsigned bad;
	struct pbox_linebuf in;
	char *out; /* queued answer bytes [out_off, out_len) */
	size_t out_len, out_off, out_cap;
	struct conn *prev, *next;   /* every live connection */
	struct conn *uprev, *unext; /* unauthenticated, oldest first */
	struct conn *dnext;         /* dead, to free */
	struct conn *bnext;         /* backlog */
};

/* Counters of the control channel (the "control" object of the stats). */
struct ctl_counters {
	uint64_t accepted;
	uint64_t refused_max_connections;
	uint64_t refused_per_address;
	uint64_t evicted_unauth; /* closed unauthenticated to make room for a newer one */
	uint64_t unauth_timeouts;
	uint64_t lines_too_long;
	uint64_t malformed_closed;
	uint64_t slow_readers_closed;
	uint64_t wrong_token;
	uint64_t unknown_job;
	uint64_t wrong_admin_token;
	uint64_t auth_rate_limited;
	uint64_t stats_refused;
	uint64_t admin_refused; /* job administration without the admin token */
	uint64_t jobs_created;
	uint64_t jobs_removed;
	uint64_t job_create_refused; /* bad definition, duplicate, over budget */
	uint64_t plans_swapped;      /* job_plan applied */
	uint64_t job_plan_stale;     /* job_plan not newer than the held plan */
	uint64_t job_plan_refused;   /* malformed, unknown job, no memory */
	uint64_t job_rm_refused;     /* no such job */
	uint64_t probe_refused;      /* probe requests refused (any cause, admin included) */
	uint64_t accept_no_fds;      /* EMFILE / ENFILE */
	uint64_t refused_fd_budget;  /* no descriptor left in pboxd's budget (fdbudget.h) */
	uint64_t accept_errors;
	uint64_t listener_pauses;
	uint64_t peak_connections;
};

struct pboxd_control {
	const struct pboxd_config *cfg;
	const struct pboxd_control_limits *lim;
	struct pboxd_sessions *sessions;
	pboxd_stats_fn stats;
	void *stats_arg;
	int epfd;
	int lfd, ufd, tfd; /* TCP listener, Unix listener (-1: none), sweep timer */
	int reserve_fd;    /* /dev/null, given up to shed a connection on EMFILE */
	int kfd;           /* eventfd: readable while the backlog is not empty */
	struct src lsrc, usrc, tsrc, ssrc, ksrc, psrc;
	struct pboxd_probe *probe; /* NULL: not a probe agent */
	uint16_t port;
	bool accepting;
	bool paused; /* listeners out of the epoll set until pause_until_ms */
	uint64_t pause_until_ms;
	uint64_t last_gc_ms;
	uint32_t max_conns;
	size_t authed_line_bytes;
	struct conn *conns;
	struct conn *unauth_head, *unauth_tail;
	struct conn *dead;
	struct conn *backlog; /* connections with lines left, for the next turn */
	uint32_t nconns, nunauth;
	struct pbox_ctladdr_table addrs; /* per source address */
	struct ctl_counters n;
	/* One log limit per kind of refusal. */
	struct pbox_ratelog log_conn, log_auth, log_proto, log_accept, log_job;
};

static uint64_t now_ms(void)
{
	return pboxd_now_ms();
}

static void unauth_unlink(struct pboxd_control *ctl, struct conn *c)
{
	if (c->authed) {
		return;
	}
	if (c->uprev != NULL) {
		c->uprev->unext = c->unext;
	} else {
		ctl->unauth_head = c->unext;
	}
	if (c->unext != NULL) {
		c->unext->uprev = c->uprev;
	} else {
		ctl->unauth_tail = c->uprev;
	}
	c->uprev = c->unext = NULL;
	ctl->nunauth--;
	if (c->addr != NULL) {
		c->addr->nunauth--;
	}
}

static void set_authed(struct pboxd_control *ctl, struct conn *c)
{
	unauth_unlink(ctl, c);
	c->authed = true;
	pbox_linebuf_set_max(&c->in, ctl->authed_line_bytes);
}

static void update_events(struct pboxd_control *ctl, struct conn *c, bool want_out)
{
	struct epoll_event ev = { .events = EPOLLIN | (want_out ? EPOLLOUT : 0u),
				  .data.ptr = &c->src };

	if (c->want_out == want_out || c->dead) {
		return;
	}
	if (epoll_ctl(ctl->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) {
		c->want_out = want_out;
	}
}

/* Write what is queued; returns 0, or a negative errno when the peer is gone. */
static int flush_out(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n > 0) {
			c->out_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			return 0;
		}
		return n < 0 ? -errno : -EIO;
	}
	c->out_off = c->out_len = 0;
	return 0;
}

/* Close c now (for the counts and the epoll set); freed at the end of the pass, when the
 * sessions module hears of it. Makes one last attempt to send what is queued. */
static void conn_kill(struct pboxd_control *ctl, struct conn *c)
{
	if (c->dead) {
		return;
	}
	flush_out(c);
	unauth_unlink(ctl, c);
	if (c->probe_pending) {
		pboxd_probe_forget(ctl->probe, c);
	}
	epoll_ctl(ctl->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	c->dead = true;
	if (c->addr != NULL) {
		c->addr->nconns--;
	}
	ctl->nconns--;
	if (c->prev != NULL) {
		c->prev->next = c->next;
	} else {
		ctl->conns = c->next;
	}
	if (c->next != NULL) {
		c->next->prev = c->prev;
	}
	c->dnext = ctl->dead;
	ctl->dead = c;
}

/* Free the connections killed during this pass. */
static void reap(struct pboxd_control *ctl)
{
	while (ctl->dead != NULL) {
		struct conn *c = ctl->dead;

		ctl->dead = c->dnext;
		if (c->in_backlog) {
			struct conn **pp = &ctl->backlog;

			while (*pp != c) {
				pp = &(*pp)->bnext;
			}
			*pp = c->bnext;
		}
		/* May send events to other connections (a session aborted): they are alive. */
		pboxd_sessions_disconnect(ctl->sessions, &c->ref);
		close(c->fd);
		pboxd_fd_give(PBOXD_FD_CONTROL, 1);
		pbox_linebuf_free(&c->in);
		free(c->out);
		free(c);
	}
}

/* Queue obj's line on c (sending what the socket takes at once). A client whose queue
 * would exceed max_output_bytes does not read its answers: it is closed. One answer is
 * always taken into an empty queue, however large. */
static void queue_obj(struct pboxd_control *ctl, struct conn *c, const json_t *obj)
{
	size_t len, pending = c->out_len - c->out_off;
	char *s;
	uint64_t sup;

	if (c->dead) {
		return;
	}
	if (pending > 0 && pending > ctl->lim->max_output_bytes) {
		goto slow;
	}
	s = pbox_ctl_encode(obj, &len);
	if (s == NULL) {
		PBOX_LOG_ERR(ADMIN, "%s: out of memory encoding an answer; closing", c->ref.peer);
		conn_kill(ctl, c);
		return;
	}
	if (pending > 0 && pending + len > ctl->lim->max_output_bytes) {
		free(s);
		goto slow;
	}
	if (c->out_off > 0) {
		memmove(c->out, c->out + c->out_off, pending);
		c->out_len = pending;
		c->out_off = 0;
	}
	if (c->out_len + len > c->out_cap) {
		size_t ncap = PBOX_MAX(c->out_len + len, c->out_cap * 2);
		char *nb = realloc(c->out, ncap);

		if (nb == NULL) {
			free(s);
			PBOX_LOG_ERR(ADMIN, "%s: out of memory queueing an answer; closing",
				     c->ref.peer);
			conn_kill(ctl, c);
			return;
		}
		c->out = nb;
		c->out_cap = ncap;
	}
	memcpy(c->out + c->out_len, s, len);
	c->out_len += len;
	free(s);
	if (flush_out(c) != 0) {
		conn_kill(ctl, c);
		return;
	}
	update_events(ctl, c, c->out_len > c->out_off);
	return;
slow:
	ctl->n.slow_readers_closed++;
	if (pbox_ratelog_ok(&ctl->log_proto, now_ms(), &sup)) {
		PBOX_LOG_WARN(ADMIN,
			      "%s: does not read its answers (%zu bytes queued, limit %u); "
			      "closing%s",
			      c->ref.peer, pending, ctl->lim->max_output_bytes,
			      sup ? " (similar messages left out)" : "");
	}
	conn_kill(ctl, c);
}

static void send_event(struct pboxd_member_ref *ref, json_t *obj)
{
	struct conn *c = pbox_container_of(ref, struct conn, ref);

	queue_obj(c->ctl, c, obj);
}

static void kick(struct pboxd_member_ref *ref)
{
	struct conn *c = pbox_container_of(ref, struct conn, ref);

	conn_kill(c->ctl, c);
}

/* Log a refusal: peer and cause, at most PBOX_RATELOG_BURST lines per window of rl. */
static void refuse_log(struct pbox_ratelog *rl, const char *peer, const char *what)
{
	uint64_t sup;

	if (pbox_ratelog_ok(rl, now_ms(), &sup)) {
		PBOX_LOG_WARN(ADMIN, "%s: %s%s", peer, what,
			      sup ? " (similar messages left out)" : "");
	}
}

/* ---- requests ---- */

/* The failed-admission bucket of c's address allows another attempt (the Unix socket's
 * operators are not limited). */
static bool auth_allowed(struct pboxd_control *ctl, struct conn *c)
{
	if (c->addr == NULL) {
		return true;
	}
	return pbox_ctladdr_auth_allowed(&ctl->addrs, c->addr, now_ms());
}

static void auth_failed(struct conn *c)
{
	if (c->addr != NULL) {
		pbox_ctladdr_auth_failed(c->addr);
	}
}

static json_t *rate_limited(struct pboxd_control *ctl, struct conn *c)
{
	char what[96];

	ctl->n.auth_rate_limited++;
	c->bad++;
	snprintf(what, sizeof(what), "refused: too many failed admissions from this address");
	refuse_log(&ctl->log_auth, c->ref.peer, what);
	return pbox_ctl_error(EAGAIN,
			      "too many failed admissions from this address (at most %u a "
			      "minute); try again later",
			      ctl->lim->auth_failures_per_minute);
}

static json_t *do_hello(struct pboxd_control *ctl, struct conn *c, const json_t *req)
{
	json_t *resp;
	int err;
	char what[160];

	if (!auth_allowed(ctl, c)) {
		return rate_limited(ctl, c);
	}
	resp = pboxd_sessions_hello(ctl->sessions, &c->ref, req);
	if (c->ref.joined) {
		set_authed(ctl, c);
		return resp;
	}
	err = (int)json_integer_value(json_object_get(resp, "errno"));
	if (err == EACCES || err == ENOENT) {
		auth_failed(c);
		if (err == EACCES) {
			ctl->n.wrong_token++;
			snprintf(what, sizeof(what), "refused: wrong token for job %lld",
				 (long long)json_integer_value(json_object_get(req, "job")));
		} else {
			ctl->n.unknown_job++;
			snprintf(what, sizeof(what), "refused: job %lld is not configured",
				 (long long)json_integer_value(json_object_get(req, "job")));
		}
		refuse_log(&ctl->log_auth, c->ref.peer, what);
	}
	return resp;
}

static json_t *do_stats(struct pboxd_control *ctl, struct conn *c, const json_t *req)
{
	const json_t *tok = json_object_get(req, "admin_token");
	json_t *resp;

	if (c->local) {
		goto all;
	}
	if (tok != NULL) {
		if (!auth_allowed(ctl, c)) {
			return rate_limited(ctl, c);
		}
		if (json_is_string(tok) && ctl->cfg->admin_token[0] != '\0' &&
		    pbox_ctl_token_equal(json_string_value(tok), ctl->cfg->admin_token)) {
			/* An operator: may keep the connection (a monitor polling stats). */
			set_authed(ctl, c);
			goto all;
		}
		auth_failed(c);
		ctl->n.wrong_admin_token++;
		c->bad++;
		refuse_log(&ctl->log_auth, c->ref.peer, "refused: wrong admin token");
		return pbox_ctl_error(EACCES, "stats: wrong admin token");
	}
	if (c->ref.joined) {
		return ctl->stats(ctl->stats_arg, false, c->ref.job);
	}
	ctl->n.stats_refused++;
	c->bad++;
	refuse_log(&ctl->log_auth, c->ref.peer, "refused: stats without authentication");
	return pbox_ctl_error(EACCES,
			      "stats needs the appliance's admin token (\"admin_token\"), its "
			      "local control socket, or a hello as a member of a job");
all:
	resp = ctl->stats(ctl->stats_arg, true, 0);
	if (resp != NULL) {
		json_object_set_new(resp, "control", pboxd_control_stats(ctl));
	}
	return resp;
}

/* The request may administer jobs: over the Unix socket, on a connection that proved the
 * admin token, or with the right admin_token in it (counted, logged and rate-limited
 * otherwise). NULL when allowed, else the refusal. */
static json_t *admin_check(struct pboxd_control *ctl, struct conn *c, const char *op,
			   const char *token)
{
	char what[128];

	if (c->local || c->admin) {
		return NULL;
	}
	if (token != NULL) {
		if (!auth_allowed(ctl, c)) {
			return rate_limited(ctl, c);
		}
		if (ctl->cfg->admin_token[0] != '\0' &&
		    pbox_ctl_token_equal(token, ctl->cfg->admin_token)) {
			c->admin = true;
			set_authed(ctl, c);
			return NULL;
		}
		auth_failed(c);
		ctl->n.wrong_admin_token++;
		c->bad++;
		snprintf(what, sizeof(what), "%s refused: wrong admin token", op);
		refuse_log(&ctl->log_auth, c->ref.peer, what);
		return pbox_ctl_error(EACCES, "%s: wrong admin token", op);
	}
	ctl->n.admin_refused++;
	c->bad++;
	snprintf(what, sizeof(what), "%s refused: no admin token", op);
	refuse_log(&ctl->log_auth, c->ref.peer, what);
	return pbox_ctl_error(EACCES,
			      "%s needs the appliance's admin token (\"admin_token\") or its local "
			      "control socket",
			      op);
}

/* NUMA node of a CPU (from sysfs), or -1 (not pinned, or not known). */
static int cpu_numa_node(int cpu)
{
	char path[64];

	if (cpu < 0) {
		return -1;
	}
	for (int n = 0; n < 64; n++) {
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/node%d", cpu, n);
		if (access(path, F_OK) == 0) {
			return n;
		}
	}
	return -1;
}

/* What a control plane needs to assign chunks to this appliance's cores (job_list's
 * "appliance"): the chunk size and each data-plane core's CPU, NUMA node and UDP port
 * (-1: not pinned / not known). */
static json_t *appliance_json(const struct pboxd_config *cfg)
{
	json_t *cores = json_array();

	for (uint32_t k = 0; k < cfg->ncores; k++) {
		json_array_append_new(cores,
				      json_pack("{s:i, s:i, s:i, s:i}", "core", (int)k, "cpu",
						cfg->cpus[k], "numa", cpu_numa_node(cfg->cpus[k]),
						"port", (int)cfg->base_port + (int)k));
	}
	return json_pack("{s:i, s:I, s:o}", "ncores", (int)cfg->ncores, "chunk_bytes",
			 (json_int_t)cfg->chunk_bytes, "cores", cores);
}

/* job_create / job_rm / job_list (common/jobspec.h). */
static json_t *do_job(struct pboxd_control *ctl, struct conn *c, const struct pbox_jobmsg *m,
		      const char *op)
{
	json_t *resp = admin_check(ctl, c, op, m->admin_token);
	struct pboxd_job_cfg *jc;
	char err[512], what[640], why[160];
	uint32_t id = 0;
	int rc;

	if (resp != NULL) {
		if (m->op == PBOX_JOBMSG_PLAN) {
			ctl->n.job_plan_refused++;
		}
		return resp;
	}
	switch (m->op) {
	case PBOX_JOBMSG_PLAN: {
		int64_t held = 0;

		rc = pboxd_sessions_job_plan(ctl->sessions, m->id, m->plan, &held, err,
					     sizeof(err));
		if (rc < 0) {
			ctl->n.job_plan_refused++;
			snprintf(what, sizeof(what), "job_plan refused: %s", err);
			refuse_log(&ctl->log_job, c->ref.peer, what);
			return pbox_ctl_error(-rc, "%s", err);
		}
		if (rc > 0) {
			ctl->n.job_plan_stale++;
			snprintf(what, sizeof(what), "job_plan ignored: %s", err);
			refuse_log(&ctl->log_job, c->ref.peer, what);
			return json_pack("{s:b, s:I, s:b, s:I, s:s}", "ok", 1, "id",
					 (json_int_t)m->id, "applied", 0, "revision",
					 (json_int_t)held, "reason", err);
		}
		ctl->n.plans_swapped++;
		return json_pack("{s:b, s:I, s:b, s:I}", "ok", 1, "id", (json_int_t)m->id,
				 "applied", 1, "revision", (json_int_t)held);
	}
	case PBOX_JOBMSG_LIST:
		return json_pack("{s:b, s:o, s:o}", "ok", 1, "jobs",
				 pboxd_sessions_job_list(ctl->sessions), "appliance",
				 appliance_json(ctl->cfg));
	case PBOX_JOBMSG_RM:
		snprintf(why, sizeof(why), "job_rm from %s", c->ref.peer);
		rc = pboxd_sessions_job_remove(ctl->sessions, m->id, why, err, sizeof(err));
		if (rc != 0) {
			ctl->n.job_rm_refused++;
			snprintf(what, sizeof(what), "job_rm refused: %s", err);
			refuse_log(&ctl->log_job, c->ref.peer, what);
			return pbox_ctl_error(-rc, "%s", err);
		}
		ctl->n.jobs_removed++;
		return json_pack("{s:b, s:I}", "ok", 1, "id", (json_int_t)m->id);
	case PBOX_JOBMSG_CREATE:
		(void)pbox_jobspec_id(m->job, &id);
		jc = calloc(1, sizeof(*jc));
		if (jc == NULL) {
			return pbox_ctl_error(ENOMEM, "out of memory");
		}
		rc = pboxd_job_cfg_from_json(ctl->cfg, m->job, jc, err, sizeof(err));
		if (rc == 0 && m->assignment != NULL) {
			rc = pboxd_job_cfg_set_assignment(ctl->cfg, jc, m->assignment, err,
							  sizeof(err));
			if (rc != 0) {
				pboxd_job_cfg_free(jc);
			}
		}
		if (rc == 0) {
			id = jc->id;
			rc = pboxd_sessions_job_add(ctl->sessions, jc, m->plan, err, sizeof(err));
			if (rc != 0) {
				pboxd_job_cfg_free(jc);
			}
		}
		if (rc != 0) {
			free(jc);
			ctl->n.job_create_refused++;
			snprintf(what, sizeof(what), "job_create of job %u refused: %s", id, err);
			refuse_log(&ctl->log_job, c->ref.peer, what);
			return pbox_ctl_error(-rc, "%s", err);
		}
		ctl->n.jobs_created++;
		return json_pack("{s:b, s:I}", "ok", 1, "id", (json_int_t)id);
	}
	return pbox_ctl_error(EINVAL, "%s: not a job operation", op);
}

/* {"op":"status",...} (common/statusmsg.h; jobstatus.h): admin only. */
static json_t *do_status(struct pboxd_control *ctl, struct conn *c, const json_t *req)
{
	struct pbox_statusmsg m;
	struct pboxd_status_limits lim;
	char err[160];
	json_t *resp;
	int rc = pbox_statusmsg_decode(req, &m, err, sizeof(err)), e;

	if (rc != 0) {
		c->bad++;
		return pbox_ctl_error(-rc, "%s", err);
	}
	resp = admin_check(ctl, c, "status", m.admin_token);
	if (resp != NULL) {
		return resp;
	}
	lim = (struct pboxd_status_limits){ m.max_groups, m.max_ranges, m.max_ranks };
	resp = pboxd_jobstatus(ctl->sessions, m.job, &lim, pboxd_now_ms(), &e);
	if (resp == NULL) {
		return e == ENOENT ? pbox_ctl_error(ENOENT, "status: job %lld does not exist",
						    (long long)m.job)
				   : pbox_ctl_error(e, "status: %s", strerror(e));
	}
	return resp;
}

/* {"op":"probe","request":{...}}: admin only; answered when the probe ends (NULL). */
static json_t *do_probe(struct pboxd_control *ctl, struct conn *c, const json_t *req)
{
	char err[256];
	json_t *resp = admin_check(ctl, c, "probe",
				   json_string_value(json_object_get(req, "admin_token")));
	int rc;

	if (resp != NULL) {
		ctl->n.probe_refused++;
		return resp;
	}
	if (json_object_get(req, "via") != NULL) { /* by a worker: answered when it ends */
		rc = pboxd_sessions_probe_via(ctl->sessions, req, &c->ref, err, sizeof(err));
		if (rc != 0) {
			ctl->n.probe_refused++;
			refuse_log(&ctl->log_job, c->ref.peer, err);
			return pbox_ctl_error(-rc, "%s", err);
		}
		return NULL;
	}
	rc = pboxd_probe_start(ctl->probe, json_object_get(req, "request"), c, err, sizeof(err));
	if (rc != 0) {
		ctl->n.probe_refused++;
		refuse_log(&ctl->log_job, c->ref.peer, err);
		return pbox_ctl_error(-rc, "%s", err);
	}
	c->probe_pending = true;
	return NULL;
}

/* A probe ended: answer the connection that asked, if it is still there. */
static void probe_done(struct pboxd_control *ctl)
{
	void *owner;
	json_t *ans = pboxd_probe_poll(ctl->probe, &owner);
	struct conn *c = owner;

	if (c != NULL) {
		c->probe_pending = false;
		if (ans == NULL) {
			ans = pbox_ctl_error(ENOMEM, "probe: out of memory encoding its result");
		}
		if (ans != NULL) {
			queue_obj(ctl, c, ans);
		}
	}
	json_decref(ans);
}

static void handle_line(struct pboxd_control *ctl, struct conn *c, const char *line)
{
	struct pbox_jobmsg jm;
	char jerrbuf[256];
	int jrc;
	json_error_t jerr;
	json_t *req = json_loads(line, 0, &jerr), *resp;
	const char *op;

	if (req == NULL || !json_is_object(req)) {
		resp = pbox_ctl_error(EINVAL, "not a JSON object: %s",
				      req ? "wrong type" : jerr.text);
		c->bad++;
		goto out;
	}
	op = json_string_value(json_object_get(req, "op"));
	if (op != NULL && strcmp(op, "ping") == 0) {
		/* Heartbeat (last_seen_ms was stamped when its bytes were read): no answer, so
		 * it never interleaves with request/response. */
		json_decref(req);
		return;
	}
	if (c->ref.pending) {
		resp = pbox_ctl_error(EBUSY, "a register is in progress on this connection; "
					     "wait for its answer");
		c->bad++;
	} else if (c->probe_pending) {
		resp = pbox_ctl_error(EBUSY, "a probe is in progress on this connection; wait for "
					     "its answer");
	} else if (op == NULL) {
		resp = pbox_ctl_error(EINVAL, "request without an \"op\"");
		c->bad++;
	} else if (strcmp(op, "hello") == 0) {
		resp = do_hello(ctl, c, req);
	} else if (strcmp(op, "register") == 0) {
		resp = pboxd_sessions_register(ctl->sessions, &c->ref, req);
	} else if (strcmp(op, "leave") == 0) {
		resp = pboxd_sessions_leave(ctl->sessions, &c->ref);
	} else if (strcmp(op, "stats") == 0) {
		resp = do_stats(ctl, c, req);
	} else if (strcmp(op, "probe") == 0) {
		resp = do_probe(ctl, c, req);
	} else if (strcmp(op, "status") == 0) {
		resp = do_status(ctl, c, req);
	} else if (strcmp(op, "probe_result") == 0) {
		resp = pboxd_sessions_probe_result(ctl->sessions, &c->ref, req);
	} else if (strcmp(op, "auth") == 0) {
		const json_t *tok = json_object_get(req, "admin_token");

		resp = admin_check(ctl, c, op, json_string_value(tok));
		if (resp == NULL) {
			resp = json_pack("{s:b}", "ok", 1);
		}
	} else if ((jrc = pbox_jobmsg_decode(req, &jm, jerrbuf, sizeof(jerrbuf))) != -ENOENT) {
		if (jrc != 0) {
			resp = pbox_ctl_error(-jrc, "%s", jerrbuf);
			c->bad++;
			if (strcmp(op, "job_plan") == 0) {
				char what[640];

				ctl->n.job_plan_refused++;
				snprintf(what, sizeof(what), "job_plan refused: %s", jerrbuf);
				refuse_log(&ctl->log_job, c->ref.peer, what);
			}
		} else {
			resp = do_job(ctl, c, &jm, op);
		}
	} else {
		resp = pbox_ctl_error(EINVAL,
				      "unknown op '%s' (hello, register, leave, ping, stats, auth, "
				      "job_create, job_rm, job_list, job_plan, probe, status)",
				      op);
		c->bad++;
	}
out:
	if (resp != NULL) { /* NULL: a register answered when its session has started */
		queue_obj(ctl, c, resp);
		json_decref(resp);
	}
	json_decref(req);
	if (c->bad >= MAX_BAD_REQUESTS && !c->dead) {
		char what[96];

		ctl->n.malformed_closed++;
		snprintf(what, sizeof(what), "%u malformed requests; closing", c->bad);
		refuse_log(&ctl->log_proto, c->ref.peer, what);
		conn_kill(ctl, c);
	}
}

/* Read what c has sent and answer its complete lines. */
static void serve(struct pboxd_control *ctl, struct conn *c)
{
	long n = pbox_linebuf_fill(&c->in, c->fd);
	char *line;
	int k = 0;

	if (n > 0) {
		/* Liveness counts from the last byte read, whatever the line is. */
		c->ref.last_seen_ms = now_ms();
	}
	while (!c->dead && k++ < LINES_PER_TURN && (line = pbox_linebuf_next(&c->in)) != NULL) {
		handle_line(ctl, c, line);
	}
	if (!c->dead && !c->in_backlog && pbox_linebuf_has_line(&c->in)) {
		uint64_t one = 1;

		c->in_backlog = true;
		c->bnext = ctl->backlog;
		ctl->backlog = c;
		if (write(ctl->kfd, &one, sizeof(one)) < 0 && errno != EAGAIN) {
			PBOX_LOG_ERR(ADMIN, "control backlog eventfd: %s", strerror(errno));
		}
	}
	if (c->dead || n > 0 || n == -EAGAIN) {
		return;
	}
	if (n == -E2BIG) {
		size_t max = c->authed ? ctl->authed_line_bytes : UNAUTH_LINE_BYTES;
		json_t *e = pbox_ctl_error(
			E2BIG,
			c->authed ? "request line longer than %zu bytes (a register of up to %u "
				    "keys; the appliance's control_limits.max_register_keys)"
				  : "request line longer than %zu bytes before a hello (%u keys "
				    "need a hello first)",
			max, ctl->lim->max_register_keys);
		char what[96];

		ctl->n.lines_too_long++;
		snprintf(what, sizeof(what), "request line longer than %zu bytes; closing", max);
		refuse_log(&ctl->log_proto, c->ref.peer, what);
		queue_obj(ctl, c, e);
		json_decref(e);
	}
	conn_kill(ctl, c); /* EOF or error */
}

/* ---- accepting ---- */

/* Close the oldest unauthenticated connection (of address a, or any when a is NULL) to
 * make room for a new one. What it has sent is read first: a client whose hello is
 * already waiting is admitted instead of closed. */
static void evict_oldest(struct pboxd_control *ctl, const struct pbox_ctladdr *a)
{
	for (int tries = 0; tries < EVICT_READ_TRIES; tries++) {
		struct conn *c = ctl->unauth_head;

		while (c != NULL && a != NULL && c->addr != a) {
			c = c->unext;
		}
		if (c == NULL) {
			return;
		}
		serve(ctl, c);
		if (c->dead) {
			return; /* it closed, or was closed: room made */
		}
		if (c->authed) {
			continue; /* admitted: no longer counted; look at the next oldest */
		}
		{
			ctl->n.evicted_unauth++;
			refuse_log(&ctl->log_conn, c->ref.peer,
				   a ? "closed: oldest unauthenticated connection of its address "
				       "(a newer one arrived at control_limits."
				       "max_unauth_per_address)"
				     : "closed: oldest unauthenticated connection (a newer one "
				       "arrived at control_limits.max_unauth)");
			conn_kill(ctl, c);
			return;
		}
	}
}

static void pause_listeners(struct pboxd_control *ctl)
{
	if (ctl->paused) {
		return;
	}
	epoll_ctl(ctl->epfd, EPOLL_CTL_DEL, ctl->lfd, NULL);
	if (ctl->ufd >= 0) {
		epoll_ctl(ctl->epfd, EPOLL_CTL_DEL, ctl->ufd, NULL);
	}
	ctl->paused = true;
	ctl->pause_until_ms = now_ms() + LISTEN_PAUSE_MS;
	ctl->n.listener_pauses++;
}

static void watch_listeners(struct pboxd_control *ctl)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &ctl->lsrc };

	epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, ctl->lfd, &ev);
	if (ctl->ufd >= 0) {
		ev.data.ptr = &ctl->usrc;
		epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, ctl->ufd, &ev);
	}
}

/* accept() failed with EMFILE / ENFILE: shed the connection waiting in the backlog with
 * the reserved descriptor (its client sees the connection closed instead of a hang), and
 * stop watching the listeners briefly, so the loop never spins on them. */
static void out_of_fds(struct pboxd_control *ctl, int lfd, int err)
{
	char what[128];

	ctl->n.accept_no_fds++;
	if (ctl->reserve_fd >= 0) {
		close(ctl->reserve_fd);
		ctl->reserve_fd = -1;
		close(accept4(lfd, NULL, NULL, SOCK_CLOEXEC));
		ctl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	snprintf(what, sizeof(what),
		 "accept: %s (%u connections open); shedding and pausing the listener %u ms",
		 strerror(err), ctl->nconns, LISTEN_PAUSE_MS);
	refuse_log(&ctl->log_accept, "control", what);
	pause_listeners(ctl);
}

static struct conn *conn_new(struct pboxd_control *ctl, int fd, struct pbox_ctladdr *a)
{
	struct conn *c = calloc(1, sizeof(*c));
	struct epoll_event ev = { .events = EPOLLIN };

	if (c == NULL) {
		return NULL;
	}
	c->src.kind = SRC_CONN;
	c->ctl = ctl;
	c->fd = fd;
	c->addr = a;
	c->accepted_ms = now_ms();
	c->ref.send_event = send_event;
	c->ref.kick = kick;
	c->ref.last_seen_ms = c->accepted_ms;
	pbox_linebuf_init(&c->in);
	pbox_linebuf_set_max(&c->in, UNAUTH_LINE_BYTES);
	ev.data.ptr = &c->src;
	if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		PBOX_LOG_ERR(ADMIN, "epoll_ctl: %s", strerror(errno));
		free(c);
		return NULL;
	}
	c->next = ctl->conns;
	if (ctl->conns != NULL) {
		ctl->conns->prev = c;
	}
	ctl->conns = c;
	ctl->nconns++;
	ctl->n.accepted++;
	ctl->n.peak_connections = PBOX_MAX(ctl->n.peak_connections, ctl->nconns);
	if (a != NULL) {
		a->nconns++;
		a->nunauth++;
		ctl->nunauth++;
		c->uprev = ctl->unauth_tail;
		if (ctl->unauth_tail != NULL) {
			ctl->unauth_tail->unext = c;
		} else {
			ctl->unauth_head = c;
		}
		ctl->unauth_tail = c;
	} else {
		/* The Unix socket: its file mode is the authentication. */
		c->local = true;
		c->authed = true;
		pbox_linebuf_set_max(&c->in, ctl->authed_line_bytes);
	}
	return c;
}

static void accept_some(struct pboxd_control *ctl, bool unix_socket)
{
	int lfd = unix_socket ? ctl->ufd : ctl->lfd;

	for (int k = 0; k < ACCEPTS_PER_TURN && ctl->accepting && !ctl->paused; k++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(lfd, unix_socket ? NULL : (struct sockaddr *)&sa,
				 unix_socket ? NULL : &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct pbox_ctladdr *a = NULL;
		struct conn *c;
		char peer[64], ip[INET_ADDRSTRLEN];
		int one = 1;

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				out_of_fds(ctl, lfd, errno);
			} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
				   errno != ECONNABORTED) {
				char what[96];

				ctl->n.accept_errors++;
				snprintf(what, sizeof(what), "accept: %s", strerror(errno));
				refuse_log(&ctl->log_accept, "control", what);
			}
			return;
		}
		if (unix_socket) {
			snprintf(peer, sizeof(peer), "local (%s)", ctl->cfg->control_socket);
		} else {
			inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
			snprintf(peer, sizeof(peer), "%s:%u", ip, ntohs(sa.sin_port));
		}
		if (ctl->nconns >= ctl->max_conns) {
			char what[128];

			ctl->n.refused_max_connections++;
			snprintf(what, sizeof(what),
				 "refused: %u connections open (control_limits.max_connections)",
				 ctl->nconns);
			refuse_log(&ctl->log_conn, peer, what);
			close(fd);
			continue;
		}
		if (!unix_socket) {
			a = pbox_ctladdr_get(&ctl->addrs, sa.sin_addr.s_addr, now_ms());
			if (a == NULL) {
				close(fd);
				continue;
			}
			if (a->nconns >= ctl->lim->max_per_address) {
				char what[128];

				ctl->n.refused_per_address++;
				snprintf(what, sizeof(what),
					 "refused: %u connections from this address "
					 "(control_limits.max_per_address)",
					 a->nconns);
				refuse_log(&ctl->log_conn, peer, what);
				close(fd);
				continue;
			}
			if (a->nunauth >= ctl->lim->max_unauth_per_address) {
				evict_oldest(ctl, a);
			}
			if (ctl->nunauth >= ctl->lim->max_unauth) {
				evict_oldest(ctl, NULL);
			}
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		}
		{
			int sndbuf = CONN_SNDBUF;

			setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		}
		if (pboxd_fd_take(PBOXD_FD_CONTROL, 1) != 0) {
			char what[256], why[160];

			ctl->n.refused_fd_budget++;
			snprintf(what, sizeof(what),
				 "refused: no descriptor left in pboxd's budget (%s)",
				 pboxd_fd_explain(why, sizeof(why)));
			refuse_log(&ctl->log_conn, peer, what);
			close(fd);
			continue;
		}
		c = conn_new(ctl, fd, a);
		if (c == NULL) {
			close(fd);
			pboxd_fd_give(PBOXD_FD_CONTROL, 1);
			continue;
		}
		snprintf(c->ref.peer, sizeof(c->ref.peer), "%s", peer);
	}
}

/* ---- timers ---- */

static void sweep(struct pboxd_control *ctl)
{
	uint64_t now = now_ms(), ticks, limit = (uint64_t)ctl->lim->unauth_timeout * 1000;

	if (read(ctl->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN) {
		PBOX_LOG_ERR(ADMIN, "control timer: %s", strerror(errno));
	}
	while (ctl->unauth_head != NULL && now - ctl->unauth_head->accepted_ms >= limit) {
		struct conn *c = ctl->unauth_head;
		char what[128];

		serve(ctl, c); /* a hello that arrived late still counts */
		if (c->dead || c->authed) {
			continue;
		}
		ctl->n.unauth_timeouts++;
		snprintf(what, sizeof(what),
			 "closed: no valid hello within %u s (control_limits.unauth_timeout)",
			 ctl->lim->unauth_timeout);
		refuse_log(&ctl->log_conn, c->ref.peer, what);
		conn_kill(ctl, c);
	}
	if (ctl->paused && now >= ctl->pause_until_ms) {
		ctl->paused = false;
		if (ctl->accepting) {
			watch_listeners(ctl);
		}
	}
	if (now - ctl->last_gc_ms >= 10000) {
		ctl->last_gc_ms = now;
		pbox_ctladdr_gc(&ctl->addrs, now);
	}
}

/* ---- the listener ---- */

static int open_tcp(struct pboxd_control *ctl)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons(ctl->cfg->control_port) };
	socklen_t sl = sizeof(sa);
	int one = 1;

	if (inet_pton(AF_INET, ctl->cfg->control_host, &sa.sin_addr) != 1) {
		PBOX_LOG_ERR(ADMIN, "control address '%s' is not an IPv4 address",
			     ctl->cfg->control_host);
		return -EINVAL;
	}
	ctl->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ctl->lfd < 0) {
		PBOX_LOG_ERR(ADMIN, "socket: %s", strerror(errno));
		return -errno;
	}
	setsockopt(ctl->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(ctl->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    listen(ctl->lfd, 1024) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(ADMIN, "cannot listen on %s:%u: %s", ctl->cfg->control_host,
			     ctl->cfg->control_port, strerror(errno));
		return rc;
	}
	getsockname(ctl->lfd, (struct sockaddr *)&sa, &sl);
	ctl->port = ntohs(sa.sin_port);
	PBOX_LOG_INFO(ADMIN, "control channel on tcp %s:%u", ctl->cfg->control_host, ctl->port);
	return 0;
}

static int open_unix(struct pboxd_control *ctl)
{
	struct sockaddr_un su = { .sun_family = AF_UNIX };
	const char *path = ctl->cfg->control_socket;
	mode_t old;
	int rc;

	if (strlen(path) >= sizeof(su.sun_path)) {
		PBOX_LOG_ERR(ADMIN, "control socket path '%s' is too long", path);
		return -ENAMETOOLONG;
	}
	memcpy(su.sun_path, path, strlen(path) + 1);
	ctl->ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ctl->ufd < 0) {
		PBOX_LOG_ERR(ADMIN, "socket: %s", strerror(errno));
		return -errno;
	}
	/* A stale socket from an earlier run; anything else at that path is kept. */
	{
		struct stat st;

		if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
			unlink(path);
		}
	}
	/* Owner only: whoever can connect gets every job's stats. */
	old = umask(0177);
	rc = bind(ctl->ufd, (struct sockaddr *)&su, sizeof(su));
	umask(old);
	if (rc != 0 || listen(ctl->ufd, 64) != 0) {
		rc = -errno;
		PBOX_LOG_ERR(ADMIN, "cannot listen on the control socket %s: %s", path,
			     strerror(errno));
		close(ctl->ufd);
		ctl->ufd = -1;
		return rc;
	}
	PBOX_LOG_INFO(ADMIN, "control socket %s (owner only: full stats without a token)", path);
	return 0;
}

/* max_connections, lowered so that accepted connections fit the open-file limit at
 * start. The limit may drop later, and shm connections and results' memfds take from the
 * same descriptors: each accept also takes one from pboxd's budget (fdbudget.h). */
static uint32_t fit_fd_limit(uint32_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
		return want;
	}
	if (rl.rlim_cur <= FD_RESERVE + 16) {
		return 16;
	}
	if (rl.rlim_cur - FD_RESERVE < want) {
		PBOX_LOG_WARN(ADMIN,
			      "control_limits.max_connections %u lowered to %llu: the open-file "
			      "limit is %llu (raise it with ulimit -n / LimitNOFILE)",
			      want, (unsigned long long)(rl.rlim_cur - FD_RESERVE),
			      (unsigned long long)rl.rlim_cur);
		return (uint32_t)(rl.rlim_cur - FD_RESERVE);
	}
	return want;
}

struct pboxd_control *pboxd_control_open(const struct pboxd_config *cfg,
					 struct pboxd_sessions *sessions, pboxd_stats_fn stats,
					 void *stats_arg)
{
	struct pboxd_control *ctl = calloc(1, sizeof(*ctl));
	struct epoll_event ev = { .events = EPOLLIN };
	struct itimerspec it = { { 0, SWEEP_MS * 1000000L }, { 0, SWEEP_MS * 1000000L } };

	if (ctl == NULL) {
		PBOX_LOG_ERR(ADMIN, "out of memory for the control channel");
		return NULL;
	}
	ctl->cfg = cfg;
	ctl->lim = &cfg->limits;
	pbox_ctladdr_init(&ctl->addrs, cfg->limits.auth_failures_burst,
			  cfg->limits.auth_failures_per_minute);
	ctl->sessions = sessions;
	ctl->stats = stats;
	ctl->stats_arg = stats_arg;
	ctl->accepting = true;
	ctl->lfd = ctl->ufd = ctl->tfd = ctl->reserve_fd = ctl->kfd = -1;
	ctl->lsrc.kind = SRC_TCP_LISTEN;
	ctl->usrc.kind = SRC_UNIX_LISTEN;
	ctl->tsrc.kind = SRC_TIMER;
	ctl->ssrc.kind = SRC_SESSIONS;
	ctl->ksrc.kind = SRC_BACKLOG;
	ctl->authed_line_bytes = pbox_ctl_register_line_bytes(cfg->limits.max_register_keys);
	ctl->max_conns = fit_fd_limit(cfg->limits.max_connections);
	{
		char why[160];
		uint32_t own = pboxd_fd_open_now();

		PBOX_LOG_INFO(ADMIN,
			      "descriptor budget: %s (control connections 1 each, shm "
			      "connections 2, results' memfds 1 per session and core); %u open "
			      "now",
			      pboxd_fd_explain(why, sizeof(why)), own);
		if (own > PBOXD_FD_RESERVE / 2) {
			PBOX_LOG_WARN(ADMIN,
				      "pboxd's own %u descriptors take more than half of the %u "
				      "reserved: connections may meet EMFILE (shed) before the "
				      "budget refuses them",
				      own, PBOXD_FD_RESERVE);
		}
	}
	ctl->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ctl->epfd < 0) {
		PBOX_LOG_ERR(ADMIN, "epoll_create1: %s", strerror(errno));
		free(ctl);
		return NULL;
	}
	if (open_tcp(ctl) != 0 || (cfg->control_socket[0] != '\0' && open_unix(ctl) != 0)) {
		goto fail;
	}
	ctl->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (ctl->tfd < 0 || timerfd_settime(ctl->tfd, 0, &it, NULL) != 0) {
		PBOX_LOG_ERR(ADMIN, "control timer: %s", strerror(errno));
		goto fail;
	}
	ctl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ctl->kfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ctl->kfd < 0) {
		PBOX_LOG_ERR(ADMIN, "control backlog eventfd: %s", strerror(errno));
		goto fail;
	}
	ev.data.ptr = &ctl->ksrc;
	if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, ctl->kfd, &ev) != 0) {
		goto fail_epoll;
	}
	ev.data.ptr = &ctl->tsrc;
	if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, ctl->tfd, &ev) != 0) {
		goto fail_epoll;
	}
	ev.data.ptr = &ctl->ssrc;
	if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, pboxd_sessions_fd(sessions), &ev) != 0) {
		goto fail_epoll;
	}
	watch_listeners(ctl);
	PBOX_LOG_INFO(ADMIN,
		      "control limits: %u connections (%u per address), %u unauthenticated "
		      "(%u per address, %u s to say hello), request lines <= %zu bytes (%u "
		      "keys), %u bytes of queued answers; stats: %s%s%s",
		      ctl->max_conns, ctl->lim->max_per_address, ctl->lim->max_unauth,
		      ctl->lim->max_unauth_per_address, ctl->lim->unauth_timeout,
		      ctl->authed_line_bytes, ctl->lim->max_register_keys,
		      ctl->lim->max_output_bytes, cfg->admin_token[0] ? "admin token, " : "",
		      cfg->control_socket[0] ? "control socket, " : "", "own job for members");
	return ctl;
fail_epoll:
	PBOX_LOG_ERR(ADMIN, "epoll_ctl: %s", strerror(errno));
fail:
	pboxd_control_close(ctl);
	return NULL;
}

int pboxd_control_set_probe(struct pboxd_control *ctl, struct pboxd_probe *probe)
{
	struct epoll_event ev = { .events = EPOLLIN };

	ctl->probe = probe;
	if (probe == NULL) {
		return 0;
	}
	ctl->psrc.kind = SRC_PROBE;
	ev.data.ptr = &ctl->psrc;
	if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, pboxd_probe_fd(probe), &ev) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(ADMIN, "control: cannot watch the probe agent: %s", strerror(-rc));
		ctl->probe = NULL;
		return rc;
	}
	return 0;
}

uint16_t pboxd_control_port(const struct pboxd_control *c)
{
	return c->port;
}

uint32_t pboxd_control_max_connections(const struct pboxd_control *c)
{
	return c->max_conns;
}

int pboxd_control_fd(const struct pboxd_control *c)
{
	return c->epfd;
}

void pboxd_control_stop_accepting(struct pboxd_control *ctl)
{
	if (!ctl->accepting) {
		return;
	}
	ctl->accepting = false;
	if (!ctl->paused) {
		epoll_ctl(ctl->epfd, EPOLL_CTL_DEL, ctl->lfd, NULL);
		if (ctl->ufd >= 0) {
			epoll_ctl(ctl->epfd, EPOLL_CTL_DEL, ctl->ufd, NULL);
		}
	}
}

void pboxd_control_close(struct pboxd_control *ctl)
{
	if (ctl == NULL) {
		return;
	}
	while (ctl->conns != NULL) {
		conn_kill(ctl, ctl->conns);
	}
	reap(ctl);
	pbox_ctladdr_free(&ctl->addrs);
	if (ctl->lfd >= 0) {
		close(ctl->lfd);
	}
	if (ctl->ufd >= 0) {
		close(ctl->ufd);
		unlink(ctl->cfg->control_socket);
	}
	if (ctl->tfd >= 0) {
		close(ctl->tfd);
	}
	if (ctl->reserve_fd >= 0) {
		close(ctl->reserve_fd);
	}
	if (ctl->kfd >= 0) {
		close(ctl->kfd);
	}
	close(ctl->epfd);
	free(ctl);
}

/* ---- the loop ---- */

/* One more turn for each connection that had lines left. Those still left over go to
 * the next turn (serve re-queues them and signals kfd). */
static void serve_backlog(struct pboxd_control *ctl)
{
	struct conn *list = ctl->backlog;
	uint64_t v;

	if (read(ctl->kfd, &v, sizeof(v)) < 0 && errno != EAGAIN) {
		PBOX_LOG_ERR(ADMIN, "control backlog eventfd: %s", strerror(errno));
	}
	ctl->backlog = NULL;
	while (list != NULL) {
		struct conn *c = list;

		list = c->bnext;
		c->in_backlog = false;
		if (!c->dead) {
			serve(ctl, c);
		}
	}
}

void pboxd_control_handle(struct pboxd_control *ctl)
{
	struct epoll_event evs[MAX_EVENTS];
	int n = epoll_wait(ctl->epfd, evs, MAX_EVENTS, 0);

	for (int i = 0; i < n; i++) {
		struct src *s = evs[i].data.ptr;
		struct conn *c;

		switch (s->kind) {
		case SRC_TCP_LISTEN:
		case SRC_UNIX_LISTEN:
			accept_some(ctl, s->kind == SRC_UNIX_LISTEN);
			break;
		case SRC_TIMER:
			sweep(ctl);
			break;
		case SRC_SESSIONS:
			pboxd_sessions_poll(ctl->sessions);
			break;
		case SRC_PROBE:
			probe_done(ctl);
			break;
		case SRC_BACKLOG:
			serve_backlog(ctl);
			break;
		case SRC_CONN:
			c = pbox_container_of(s, struct conn, src);
			if (c->dead) {
				break; /* killed earlier in this pass */
			}
			if (evs[i].events & EPOLLOUT) {
				if (flush_out(c) != 0) {
					conn_kill(ctl, c);
					break;
				}
				update_events(ctl, c, c->out_len > c->out_off);
			}
			if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
				serve(ctl, c);
			}
			break;
		}
	}
	reap(ctl);
}

void pboxd_control_tick(struct pboxd_control *ctl)
{
	/* Heartbeats already in the members' sockets count before anyone is judged. */
	/* A connection killed on the way stays allocated (and its next pointer valid) until
	 * reap(). */
	for (struct conn *c = ctl->conns, *next; c != NULL; c = next) {
		next = c->next;
		if (c->ref.joined && !c->dead) {
			serve(ctl, c);
		}
	}
	reap(ctl);
	pboxd_sessions_tick(ctl->sessions, now_ms());
	reap(ctl);
}

json_t *pboxd_control_stats(const struct pboxd_control *ctl)
{
	const struct ctl_counters *n = &ctl->n;
	json_t *o = json_object();

#define PUT(name) json_object_set_new(o, #name, json_integer((json_int_t)n->name))
	PUT(accepted);
	PUT(refused_max_connections);
	PUT(refused_per_address);
	PUT(evicted_unauth);
	PUT(unauth_timeouts);
	PUT(lines_too_long);
	PUT(malformed_closed);
	PUT(slow_readers_closed);
	PUT(wrong_token);
	PUT(unknown_job);
	PUT(wrong_admin_token);
	PUT(auth_rate_limited);
	PUT(stats_refused);
	PUT(admin_refused);
	PUT(probe_refused);
	PUT(jobs_created);
	PUT(jobs_removed);
	PUT(job_create_refused);
	PUT(plans_swapped);
	PUT(job_plan_stale);
	PUT(job_plan_refused);
	PUT(job_rm_refused);
	PUT(accept_no_fds);
	PUT(refused_fd_budget);
	PUT(accept_errors);
	PUT(listener_pauses);
	PUT(peak_connections);
#undef PUT
	json_object_set_new(o, "connections", json_integer(ctl->nconns));
	json_object_set_new(o, "unauthenticated", json_integer(ctl->nunauth));
	json_object_set_new(o, "max_connections", json_integer(ctl->max_conns));
	json_object_set_new(o, "fds", pboxd_fd_stats());
	return o;
}
