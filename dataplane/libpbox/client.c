/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's public API (pbox/pbox.h): admission over the control channel, the progress
 * thread that drives the worker node, and blocking / asynchronous operations on keys.
 *
 * Threads: API calls run on the caller's threads; the node, the UDP socket and the
 * control socket (after registration) belong to the progress thread. They meet in
 * g->lock, which guards the submission list and op states only (never held while
 * touching the network), and the eventfd that wakes the progress thread.
 */
#include <pbox/pbox.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/ctlproto.h"
#include "common/jobdesc.h"
#include "common/log.h"
#include "dvf/dvf_job.h"
#include "dvf_push.h"
#include "common/tsbmsg.h"
#include "engine/job.h" /* PBOX_MAX_CREDITS, the appliance's bound */
#include "node.h"
#include "transport/shm/shm.h"
#include "probe.h"
#include "transport/udp/udp.h"
#include "update.h"
#include "xport_select.h"

#ifndef PBOX_VERSION_STRING
#define PBOX_VERSION_STRING "0.0.0"
#endif

enum cop_state {
	COP_FREE = 0,
	COP_SUBMITTED, /* handed to the progress thread */
	COP_DONE,      /* completed, status not yet collected by a wait */
};

struct cop {
	struct pbox_op op;
	enum cop_state state;
	uint32_t version; /* label of the last result received on this key */
	pbox_done_fn cb;
	void *cb_arg;
	struct cop *next; /* submission list */
	bool waited;      /* a thread waits for it (wait_locked): its completion signals */
};

struct pbox_client {
	struct pbox_client_opts opts;
	char server_host[256];
	uint16_t server_port;
	char token[256];
	char local_addr[64]; /* copies of opts' strings: the caller's may not outlive connect */
	char fault[256];
	char transport[8];  /* the data path chosen at registration ("": not yet) */
	char shm_name[108]; /* pboxd's shared-memory socket ("": not offered) */
	char probe_spec[80];
	struct pbox_wprobe *probe;    /* the SLoPS agent (libpbox/probe.h); NULL: off */
	struct pbox_plan plan;        /* the control plane's plan for this rank, under lock */
	int64_t plan_rev;             /* plan.revision (atomic reads) */
	struct pbox_ratelog plan_log; /* plan change lines (progress thread) */
	int ctl_fd;
	struct pbox_linebuf ctl_in;
	struct pbox_job_info info;
	char data_addr[64];
	uint64_t cookie;
	/* synchronisation contract from the register reply */
	uint32_t staleness;
	uint32_t credits;
	bool plain, folds_late;
	bool crc;                /* stamp fragments with CRC32C version words */
	bool sampled_words;      /* else: sampled version words (node.h) */
	uint64_t rx_placed;      /* snapshot (under lock) of the node's rx_placed */
	struct pbox_dvf_job dvf; /* the job's DVF settings (enabled: pushes are filtered) */
	uint32_t heartbeat_ms;
	uint32_t resume_version;     /* from the register reply: a restored checkpoint's version */
	struct pbox_tsb_key tsb_key; /* TSB: the session key from the register reply */
	bool tsb;
	uint64_t next_ping_ns;
	/* after registration */
	struct pbox_jobdesc desc;
	struct pbox_peer *cores;
	struct pbox_udp *udp;
	struct pbox_shm_client *shm; /* the data path when not NULL (udp stays open) */
	struct mem_block *mem;       /* pbox_mem_alloc's blocks, under lock */
	struct pbox_node *node;
	struct cop *ops; /* per key index */
	pthread_t thread;
	bool thread_started;
	int wake_fd;
	bool stop; /* set by pbox_close, read by the progress thread (atomics) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct cop *sub_head, *sub_tail;
	struct pbox_client_stats stats; /* snapshot, under lock */
	/* broadcast jobs: the optimizer every worker runs (from the hello reply) */
	const struct pbox_optimizer_ops *bc_opt;
	struct pbox_opt_params bc_params;
	int fail_err; /* set once the job / connection failed */
	char fail_msg[256];
	bool node_failed; /* progress thread: fail_err applied to the node */
};

/* A block of pbox_mem_alloc: registered with pboxd (shared: the shm client maps it) or
 * plain anonymous memory. */
struct mem_block {
	void *p;
	size_t bytes;
	bool shared;
	struct mem_block *next;
};

static __thread char g_errmsg[512];

int pbox_client_error(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(g_errmsg, sizeof(g_errmsg), fmt, ap);
	va_end(ap);
	return err;
}

const char *pbox_last_error(void)
{
	return g_errmsg;
}

const char *pbox_version(void)
{
	return PBOX_VERSION_STRING;
}

static int fail(int err, const char *fmt, ...) PBOX_PRINTF(2, 3);

static int fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(g_errmsg, sizeof(g_errmsg), fmt, ap);
	va_end(ap);
	return err;
}

/* ---- control channel ---------------------------------------------------------------- */

static int split_hostport(const char *s, char *host, size_t hlen, uint16_t *port)
{
	const char *colon = strrchr(s, ':');
	char *end;
	unsigned long p;

	if (colon == NULL || colon == s || (size_t)(colon - s) >= hlen) {
		return -EINVAL;
	}
	p = strtoul(colon + 1, &end, 10);
	if (*end != '\0' || p == 0 || p > 65535) {
		return -EINVAL;
	}
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	*port = (uint16_t)p;
	return 0;
}

static int ctl_connect(struct pbox_client *c)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	char port[8];
	int fd, rc, one = 1;
	struct pollfd p;
	socklen_t el = sizeof(rc);

	snprintf(port, sizeof(port), "%u", c->server_port);
	if (getaddrinfo(c->server_host, port, &hints, &res) != 0) {
		return fail(-EINVAL, "cannot resolve pboxd address '%s'", c->server_host);
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		freeaddrinfo(res);
		return fail(-errno, "socket: %s", strerror(errno));
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	rc = connect(fd, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	if (rc != 0 && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		return fail(rc, "cannot reach pboxd at %s:%u: %s (is pboxd running?)",
			    c->server_host, c->server_port, strerror(-rc));
	}
	p.fd = fd;
	p.events = POLLOUT;
	if (poll(&p, 1, (int)c->opts.timeout_ms) != 1) {
		close(fd);
		return fail(-ETIMEDOUT, "cannot reach pboxd at %s:%u: no answer within %u ms",
			    c->server_host, c->server_port, c->opts.timeout_ms);
	}
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &rc, &el);
	if (rc != 0) {
		close(fd);
		return fail(-rc, "cannot reach pboxd at %s:%u: %s (is pboxd running?)",
			    c->server_host, c->server_port, strerror(rc));
	}
	c->ctl_fd = fd;
	return 0;
}

/* Send req and wait for the response object (events arriving first are handled). */
static int ctl_call(struct pbox_client *c, json_t *req, json_t **resp)
{
	char op[32];
	int rc = pbox_ctl_send(c->ctl_fd, req, (int)c->opts.timeout_ms);
	uint64_t deadline = pbox_clock_ns(NULL) + (uint64_t)c->opts.timeout_ms * 1000000ull;

	/* The name outlives the request object, for the messages below. */
	snprintf(op, sizeof(op), "%s", json_string_value(json_object_get(req, "op")));
	json_decref(req);
	if (rc < 0) {
		return fail(rc, "%s: cannot send to pboxd: %s", op, strerror(-rc));
	}
	for (;;) {
		char *line;
		long n;

		while ((line = pbox_linebuf_next(&c->ctl_in)) != NULL) {
			json_error_t jerr;
			json_t *o = json_loads(line, 0, &jerr);

			if (o == NULL || !json_is_object(o)) {
				json_decref(o);
				return fail(-EPROTO, "%s: pboxd sent a malformed reply: %s", op,
					    jerr.text);
			}
			if (json_object_get(o, "event") != NULL) {
				json_decref(o); /* no events matter before registration */
				continue;
			}
			if (!json_is_true(json_object_get(o, "ok"))) {
				int err = (int)json_integer_value(json_object_get(o, "errno"));
				const char *msg = json_string_value(json_object_get(o, "error"));

				rc = fail(err > 0 ? -err : -EPROTO, "%s", msg ? msg : "refused");
				json_decref(o);
				return rc;
			}
			*resp = o;
			return 0;
		}
		{
			uint64_t t = pbox_clock_ns(NULL);
			struct pollfd p = { .fd = c->ctl_fd, .events = POLLIN };

			if (t >= deadline ||
			    poll(&p, 1, (int)((deadline - t) / 1000000 + 1)) == 0) {
				return fail(-ETIMEDOUT, "%s: pboxd did not answer within %u ms", op,
					    c->opts.timeout_ms);
			}
		}
		n = pbox_linebuf_fill(&c->ctl_in, c->ctl_fd);
		if (n == 0) {
			return fail(-ECONNRESET, "%s: pboxd closed the connection", op);
		}
		if (n < 0 && n != -EAGAIN) {
			return fail((int)n, "%s: reading from pboxd: %s", op, strerror((int)-n));
		}
	}
}

int pbox_connect(const struct pbox_client_opts *o, struct pbox_client **out)
{
	struct pbox_client *c;
	json_t *resp = NULL;
	const char *mode;
	int rc;

	*out = NULL;
	if (o == NULL || o->token == NULL) {
		return fail(-EINVAL, "pbox_connect: options with a job token are required");
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		return fail(-ENOMEM, "out of memory");
	}
	c->opts = *o;
	c->ctl_fd = -1;
	c->wake_fd = -1;
	pthread_mutex_init(&c->lock, NULL);
	{
		/* pbox_wait's deadlines are CLOCK_MONOTONIC (abs_deadline): so is the condition
		 * variable's clock, or every finite wait would time out at once. */
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&c->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	pbox_linebuf_init(&c->ctl_in);
	if (c->opts.timeout_ms == 0) {
		c->opts.timeout_ms = 30000;
	}
	snprintf(c->token, sizeof(c->token), "%s", o->token);
	c->opts.token = c->token;
	if (o->local_addr != NULL) {
		snprintf(c->local_addr, sizeof(c->local_addr), "%s", o->local_addr);
		c->opts.local_addr = c->local_addr;
	}
	if (o->fault != NULL) {
		snprintf(c->fault, sizeof(c->fault), "%s", o->fault);
		c->opts.fault = c->fault;
	}
	if (o->probe != NULL) {
		snprintf(c->probe_spec, sizeof(c->probe_spec), "%s", o->probe);
		c->opts.probe = c->probe_spec;
	}
	if (split_hostport(o->server ? o->server : "127.0.0.1:7000", c->server_host,
			   sizeof(c->server_host), &c->server_port) != 0) {
		rc = fail(-EINVAL, "server address '%s': expected host:port", o->server);
		goto err;
	}
	rc = ctl_connect(c);
	if (rc < 0) {
		goto err;
	}
	rc = ctl_call(c,
		      json_pack("{s:s, s:i, s:i, s:s, s:i}", "op", "hello", "job",
				(json_int_t)o->job, "rank", (json_int_t)o->rank, "token", o->token,
				"version", PBOX_CTL_PROTO_VERSION),
		      &resp);
	if (rc < 0) {
		goto err;
	}
	mode = json_string_value(json_object_get(resp, "mode"));
	c->info.job = o->job;
	c->info.rank = o->rank;
	c->info.workers = (uint32_t)json_integer_value(json_object_get(resp, "workers"));
	c->info.mode = mode && strcmp(mode, "server-optimizer") == 0 ? PBOX_JOB_SERVER_OPTIMIZER
		       : mode && strcmp(mode, "broadcast") == 0      ? PBOX_JOB_BROADCAST
								     : PBOX_JOB_AGGREGATE;
	if (c->info.mode == PBOX_JOB_BROADCAST) {
		char why[160];

		rc = pbox_update_parse_optimizer(json_object_get(resp, "optimizer"), &c->bc_opt,
						 &c->bc_params, why, sizeof(why));
		if (rc < 0) {
			json_decref(resp);
			rc = fail(rc, "job %u: hello: %s", o->job, why);
			goto err;
		}
		snprintf(c->info.optimizer, sizeof(c->info.optimizer), "%s", c->bc_opt->name);
	}
	c->info.mean = json_string_value(json_object_get(resp, "reduce")) != NULL &&
		       strcmp(json_string_value(json_object_get(resp, "reduce")), "mean") == 0;
	json_decref(resp);
	*out = c;
	return 0;
err:
	pbox_close(c);
	return rc;
}

/* ---- progress thread ---------------------------------------------------------------- */

static void snapshot_stats(struct pbox_client *c)
{
	const struct pbox_node_stats *s = pbox_node_stats(c->node);
	uint64_t dropped = 0;

	for (int r = 0; r < PBOX_DROP_COUNT; r++) {
		dropped += s->drops[r];
	}
	c->stats.tx_bytes = s->tx_bytes;
	c->stats.rx_bytes = s->rx_bytes;
	c->stats.tx_pkts = s->tx_pkts;
	c->stats.rx_pkts = s->rx_pkts;
	c->stats.retransmits = s->retransmits;
	c->stats.probes = s->probes;
	c->stats.dropped = dropped;
	c->stats.foreign = s->foreign;
	c->rx_placed = s->rx_placed;
	c->stats.ops_done = s->ops_done;
	c->stats.ops_failed = s->ops_failed;
	c->stats.shm_torn = s->torn_frags; /* only shm results are read split (node.h) */
	if (c->shm != NULL) {
		const struct pbox_shm_client_stats *m = pbox_shm_client_stats(c->shm);

		c->stats.shm_rx_desc = m->rx_desc;
		c->stats.shm_stale = m->stale;
		c->stats.shm_bad_desc = m->bad_desc;
		c->stats.shm_tx_full = m->tx_full;
		c->stats.shm_tx_waits = m->tx_waits;
	}
}

static bool ctl_read_events(struct pbox_client *c);

/* Node completion callback, on the progress thread. */
static void op_done(struct pbox_op *op, void *arg)
{
	struct pbox_client *c = arg;
	struct cop *cp = pbox_container_of(op, struct cop, op);
	pbox_done_fn cb;
	void *cb_arg;

	/* Refused because the job was aborted: the reason travels on the control channel
	 * (sent before the refusals); pick it up so the error says why. Once a failure is
	 * recorded there is nothing more to learn (fail_err is written on this thread only). */
	if (op->status == -ECONNABORTED && c->fail_err == 0 && c->ctl_fd >= 0) {
		ctl_read_events(c);
	}
	pthread_mutex_lock(&c->lock);
	if (op->status == -ECONNABORTED && c->fail_err == -ECONNABORTED) {
		snprintf(op->errmsg, sizeof(op->errmsg), "%s", c->fail_msg);
	}
	cp->state = COP_DONE;
	if (op->status == 0 && op->label != UINT32_MAX) {
		cp->version = op->label;
	}
	cb = cp->cb;
	cb_arg = cp->cb_arg;
	snapshot_stats(c);
	if (cp->waited) {
		/* Only a completion someone waits for wakes the waiters: a broadcast per
		 * operation woke pbox_wait_all's thread once per key (a futex wake-up and
		 * a context switch each, on the CPUs the transfer needs). */
		cp->waited = false;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	if (cb != NULL) {
		/* Inside the callback pbox_last_error() tells why the operation failed. */
		if (op->status < 0) {
			snprintf(g_errmsg, sizeof(g_errmsg), "%s", op->errmsg);
		}
		cb(c->desc.keys[op->key].id, op->status, cb_arg);
	}
}

/* Record the first failure of the session; the progress loop applies it to the node. */
static void record_failure(struct pbox_client *c, int err, const char *msg)
{
	pthread_mutex_lock(&c->lock);
	if (c->fail_err == 0) {
		c->fail_err = err;
		snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
		PBOX_LOG_ERR(CLIENT, "%s", msg);
	}
	pthread_mutex_unlock(&c->lock);
}

/* The DVF push filter's delta_low / delta_up switch follows the plan's push_up (called
 * with c->lock held, whenever the plan or the node changes). */
static void dvf_plan(struct pbox_client *c)
{
	struct pbox_dvf_push *p = c->node != NULL ? pbox_node_dvf(c->node) : NULL;

	if (p != NULL) {
		pbox_dvf_push_set_plan(p, c->plan.revision == 0 ? PBOX_DVF_PLAN_NONE
					  : c->plan.push_up     ? PBOX_DVF_PLAN_UP
								: PBOX_DVF_PLAN_LOW);
	}
}

/* A rank plan from pboxd (register answer or plan event): decode strictly, publish, log
 * what changed. A malformed one is logged and ignored (the previous plan stays). */
static void plan_event(struct pbox_client *c, const json_t *j)
{
	struct pbox_plan *np = malloc(sizeof(*np));
	char err[192], ch[96] = "";
	uint64_t sup;
	int64_t old;

	if (np == NULL) {
		return;
	}
	if (pbox_ctl_plan_decode(j, np, err, sizeof(err)) != 0) {
		PBOX_LOG_WARN(CLIENT, "job %u rank %u: ignoring a malformed plan from pboxd: %s",
			      c->info.job, c->info.rank, err);
		free(np);
		return;
	}
	pthread_mutex_lock(&c->lock);
	old = c->plan.revision;
	if (np->revision > old) {
		c->plan = *np;
		__atomic_store_n(&c->plan_rev, np->revision, __ATOMIC_RELEASE);
		dvf_plan(c);
	}
	pthread_mutex_unlock(&c->lock);
	if (np->revision <= old) {
		free(np);
		return;
	}
	/* A control plane that changes plans very often is not logged each time. */
	if (!pbox_ratelog_ok(&c->plan_log, pbox_clock_ns(NULL) / 1000000, &sup)) {
		free(np);
		return;
	}
	for (uint32_t i = 0, off = 0; i < np->nchildren && off + 12 < sizeof(ch); i++) {
		off += (uint32_t)snprintf(ch + off, sizeof(ch) - off, "%s%u", i ? "," : "",
					  np->children[i]);
	}
	PBOX_LOG_INFO(CLIENT,
		      "job %u rank %u: plan revision %lld: push delta %g (%s; link %s, %.1f "
		      "Mbit/s), broadcast delta %g (%s), parent %d, depth %u, children [%s]%s%s%s",
		      c->info.job, c->info.rank, (long long)np->revision, np->delta,
		      np->push_up ? "delta_up" : "delta_low",
		      np->link == PBOX_PLAN_LINK_SUFFICIENT     ? "sufficient"
		      : np->link == PBOX_PLAN_LINK_INSUFFICIENT ? "insufficient"
								: "unknown",
		      np->link_bps / 1e6, np->broadcast_delta,
		      np->broadcast_up ? "delta_up" : "delta_low", np->parent, np->depth, ch,
		      np->phub[0] ? ", phub " : "", np->phub,
		      sup ? " (earlier plan changes not logged)" : "");
	free(np);
}

/* Send a control line from the progress thread (small: waits at most 1 s for room). */
static void ctl_answer(struct pbox_client *c, json_t *ans)
{
	int rc;

	if (ans == NULL || c->ctl_fd < 0) {
		json_decref(ans);
		return;
	}
	rc = pbox_ctl_send(c->ctl_fd, ans, 1000);
	if (rc != 0) {
		PBOX_LOG_WARN(CLIENT, "job %u rank %u: cannot answer a probe request: %s",
			      c->info.job, c->info.rank, strerror(-rc));
	}
	json_decref(ans);
}

/* pbox-ctrld asks (through pboxd) for a probe from this worker. */
static void probe_event(struct pbox_client *c, const json_t *o)
{
	json_int_t id = json_integer_value(json_object_get(o, "id"));

	if (c->probe != NULL) {
		ctl_answer(c, pbox_wprobe_start(c->probe, o));
	} else if (id >= 1 && id <= (1LL << 53)) {
		ctl_answer(c, json_pack("{s:s, s:I, s:i, s:s}", "op", "probe_result", "id", id,
					"errno", EOPNOTSUPP, "error",
					"the worker's probe agent is off (PBOX_PROBE=off)"));
	}
}

int pbox_plan_get(struct pbox_client *c, struct pbox_plan *out)
{
	if (c == NULL || out == NULL) {
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	*out = c->plan;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int64_t pbox_plan_revision(const struct pbox_client *c)
{
	return c != NULL ? __atomic_load_n(&c->plan_rev, __ATOMIC_ACQUIRE) : 0;
}

/* TSB: pboxd told this rank its place in the broadcast tree (progress thread). */
static void tsb_event(struct pbox_client *c, const json_t *o)
{
	struct pbox_tsb_pos pos;
	char err[160];

	if (!c->tsb ||
	    pbox_tsb_pos_decode(o, c->info.workers, c->info.rank, &pos, err, sizeof(err)) != 0) {
		PBOX_LOG_WARN(CLIENT, "job %u rank %u: tree position ignored: %s", c->info.job,
			      c->info.rank, c->tsb ? err : "the job has no broadcast tree");
		return;
	}
	pbox_node_tsb_position(c->node, &pos);
	PBOX_LOG_INFO(CLIENT, "job %u rank %u: broadcast tree: parent %d, %u children", c->info.job,
		      c->info.rank, pos.parent == PBOX_TSB_ROOT ? -1 : (int)pos.parent,
		      pos.nchildren);
}

/* Read control events (abort) and notice a closed control connection, without blocking.
 * Returns true if a failure is now recorded. */
static bool ctl_read_events(struct pbox_client *c)
{
	long n = pbox_linebuf_fill(&c->ctl_in, c->ctl_fd);
	char *line, msg[320];

	while ((line = pbox_linebuf_next(&c->ctl_in)) != NULL) {
		json_t *o = json_loads(line, 0, NULL);
		const char *ev = json_string_value(json_object_get(o, "event"));

		if (ev != NULL && strcmp(ev, "abort") == 0) {
			const char *why = json_string_value(json_object_get(o, "reason"));

			snprintf(msg, sizeof(msg), "job %u aborted by the appliance: %s",
				 c->info.job, why ? why : "no reason given");
			record_failure(c, -ECONNABORTED, msg);
		} else if (ev != NULL && strcmp(ev, "removed") == 0) {
			const char *why = json_string_value(json_object_get(o, "reason"));

			snprintf(msg, sizeof(msg), "the appliance removed rank %u from job %u: %s",
				 c->info.rank, c->info.job, why ? why : "no reason given");
			record_failure(c, -ETIMEDOUT, msg);
		} else if (ev != NULL && strcmp(ev, "plan") == 0) {
			plan_event(c, json_object_get(o, "plan"));
		} else if (ev != NULL && strcmp(ev, "probe") == 0) {
			probe_event(c, o);
		} else if (ev != NULL && strcmp(ev, "tsb") == 0) {
			tsb_event(c, o);
		}
		json_decref(o);
	}
	if (n == 0 || (n < 0 && n != -EAGAIN)) {
		snprintf(msg, sizeof(msg),
			 "pboxd at %s:%u closed the control connection (appliance stopped?)",
			 c->server_host, c->server_port);
		record_failure(c, -ECONNRESET, msg);
		close(c->ctl_fd);
		c->ctl_fd = -1;
	}
	return c->fail_err != 0;
}

/* On the progress thread: fail the node, once, when the session has failed. */
static void apply_failure(struct pbox_client *c)
{
	if (c->fail_err != 0 && !c->node_failed) {
		c->node_failed = true;
		pbox_node_fail(c->node, c->fail_err, c->fail_msg);
	}
}

/* On the progress thread: events, then fail the node if the session failed. */
static void ctl_events(struct pbox_client *c)
{
	ctl_read_events(c);
	if (c->probe != NULL) {
		ctl_answer(c, pbox_wprobe_poll(c->probe));
	}
	apply_failure(c);
}

static void drain_submissions(struct pbox_client *c)
{
	struct cop *list;

	pthread_mutex_lock(&c->lock);
	list = c->sub_head;
	c->sub_head = c->sub_tail = NULL;
	pthread_mutex_unlock(&c->lock);
	while (list != NULL) {
		struct cop *next = list->next;
		int rc;

		list->next = NULL;
		rc = pbox_node_submit(c->node, &list->op);
		if (rc != 0) {
			list->op.status = rc;
			op_done(&list->op, c);
		}
		list = next;
	}
}

/* Tell pboxd this worker is alive (its liveness check declares silent workers dead). */
static void heartbeat(struct pbox_client *c)
{
	uint64_t t;

	if (c->heartbeat_ms == 0 || c->ctl_fd < 0) {
		return;
	}
	t = pbox_clock_ns(NULL);
	if (t >= c->next_ping_ns) {
		static const char ping[] = "{\"op\":\"ping\"}\n";

		c->next_ping_ns = t + (uint64_t)c->heartbeat_ms * 1000000ull;
		/* Non-blocking and tiny: if the socket is full, the next ping will do. */
		if (send(c->ctl_fd, ping, sizeof(ping) - 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
		    errno != EAGAIN) {
			ctl_events(c);
		}
	}
}

/* pboxd closed the shared-memory connection: if it went away (its control connection
 * closes too, a moment later), say that; otherwise it ended only this connection. */
static void shm_ended(struct pbox_client *c)
{
	if (c->ctl_fd >= 0) {
		struct pollfd p = { .fd = c->ctl_fd, .events = POLLIN };

		(void)poll(&p, 1, 200);
		ctl_events(c);
	}
	record_failure(c, -ECONNRESET,
		       "pboxd ended the shared-memory connection (see pboxd's log: shm)");
}

/* Results from the shared-memory rings, read in place by the node; their room goes back
 * after the burst. Returns the count. */
static unsigned shm_rx(struct pbox_client *c, struct pbox_rx_pkt *pkts)
{
	unsigned n = pbox_shm_client_rx(c->shm, pkts, PBOX_UDP_MAX_BURST);

	for (unsigned i = 0; i < n; i++) {
		const struct pbox_shm_split *sp = pbox_shm_client_split(c->shm, i);

		if (sp != NULL) { /* a result read in place in pboxd's results' arena */
			pbox_node_rx_split(c->node, pkts[i].data, sp->payload, sp->len, sp->gen,
					   sp->want, &pkts[i].from);
		} else {
			pbox_node_rx(c->node, pkts[i].data, pkts[i].len, &pkts[i].from);
		}
	}
	pbox_shm_client_rx_done(c->shm);
	return n;
}

/* One receive of up to max datagrams from the UDP socket into the node, with results
 * received into the callers' buffers where the node expects them (node.h). */
static unsigned udp_rx_once(struct pbox_client *c, struct pbox_rx_pkt *pkts, unsigned max,
			    struct pbox_node_place *place, struct pbox_udp_place *uplace,
			    int16_t *placed, bool no_place)
{
	unsigned np = 0, n;

	if (!no_place) {
		np = pbox_node_rx_places(c->node, place,
					 PBOX_MIN(PBOX_MIN(max, PBOX_UDP_DEFAULT_BURST),
						  pbox_node_rx_place_want(c->node)));
	}
	for (unsigned i = 0; i < np; i++) {
		uplace[i].dst = place[i].dst;
		uplace[i].len = place[i].len;
	}
	n = pbox_udp_rx_placed(c->udp, pkts, max, uplace, np, placed, 0);
	pbox_node_rx_burst(c->node, pkts, n, place, np, placed);
	return n;
}

/*
 * The socket sees long runs of results from one appliance core, and which core's run is
 * at the head is what placement cannot guess: take one datagram first, then the rest
 * placed after it (one more recvmmsg per burst).
 */
static unsigned udp_rx(struct pbox_client *c, struct pbox_rx_pkt *pkts,
		       struct pbox_node_place *place, struct pbox_udp_place *uplace,
		       int16_t *placed, bool no_place)
{
	unsigned n = udp_rx_once(c, pkts, no_place ? PBOX_UDP_MAX_BURST : 1, place, uplace, placed,
				 no_place);

	if (n == 0 || no_place) {
		return n;
	}
	return n + udp_rx_once(c, pkts, PBOX_UDP_MAX_BURST, place, uplace, placed, false);
}

/* Kernel pacing (transport/udp/kpace.h): the socket's departure times follow the
 * congestion controller's pacing rate, in wire bytes (each fragment also carries the pbox
 * header and IP/UDP/Ethernet headers), so the kernel spaces what the node releases in
 * bursts (after the thread was descheduled, resends) at the rate the window allows. */
static void set_kpace_rate(struct pbox_client *c)
{
	uint32_t frag;
	uint64_t r = pbox_node_pace_rate(c->node, &frag);

	if (frag != 0) {
		r += r * (PBOX_WIRE_HDR_LEN + PBOX_KPACE_L2_OVERHEAD) / frag;
	}
	pbox_udp_set_pace_rate(c->udp, r);
}

static void *progress_main(void *arg)
{
	struct pbox_client *c = arg;
	/* Room for a whole burst of GRO messages' datagrams per call. */
	struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];
	/* Results received straight into the callers' buffers (node.h, udp.h). */
	struct pbox_node_place place[PBOX_UDP_MAX_BURST];
	struct pbox_udp_place uplace[PBOX_UDP_MAX_BURST];
	int16_t placed[PBOX_UDP_MAX_BURST];
	/* Opt-in (PBOX_RX_PLACE=1): on loopback with 2 appliance cores it saved no CPU
	 * measurably (perf/README.md section 4: the runs of the two cores interleave in the
	 * one socket, so about a third of the results land in place). */
	bool no_place =
		getenv("PBOX_RX_PLACE") == NULL || strcmp(getenv("PBOX_RX_PLACE"), "1") != 0;
	uint64_t next_ctl_check = 0;

	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		unsigned n;
		uint64_t next, t;

		/* Submissions first: the places offered below must stay dead until the
		 * burst is handled, and nothing but the node's own receive changes them. */
		drain_submissions(c);
		n = udp_rx(c, pkts, place, uplace, placed, no_place);
		if (c->shm != NULL) {
			n += shm_rx(c, pkts);
		}
		if (pbox_node_stats(c->node)->foreign != c->stats.foreign) {
			/* Dropped strays complete no operation: publish their count now. */
			pthread_mutex_lock(&c->lock);
			snapshot_stats(c);
			pthread_mutex_unlock(&c->lock);
		}
		apply_failure(c);
		heartbeat(c);
		pbox_node_timers(c->node);
		if (c->shm == NULL && pbox_udp_kpace(c->udp)) {
			set_kpace_rate(c);
		}
		pbox_node_flush(c->node);
		if (n != 0 || c->opts.busy_poll) {
			/* Busy: still look at the control channel every 10 ms for events. */
			t = pbox_clock_ns(NULL);
			if (c->ctl_fd >= 0 && t >= next_ctl_check) {
				ctl_events(c);
				next_ctl_check = t + 10000000ull;
			}
			continue;
		}
		/* Idle: sleep until a datagram, a submission, a control event or a timer. */
		next = pbox_node_next_timer(c->node);
		{
			struct pollfd p[5] = {
				{ .fd = pbox_udp_fd(c->udp), .events = POLLIN },
				{ .fd = c->wake_fd, .events = POLLIN },
				{ .fd = c->ctl_fd, .events = POLLIN },
				{ .fd = c->shm ? pbox_shm_client_wake_fd(c->shm) : -1,
				  .events = POLLIN },
				/* No POLLIN: registrations read their answers there
				 * (pbox_mem_alloc); pboxd's close is POLLHUP. */
				{ .fd = c->shm ? pbox_shm_client_sock_fd(c->shm) : -1,
				  .events = 0 },
			};
			int ms = next == UINT64_MAX ? 200 : (int)PBOX_MIN(next / 1000000 + 1, 200);

			if (c->heartbeat_ms != 0) {
				ms = (int)PBOX_MIN((uint32_t)ms, c->heartbeat_ms);
			}

			if (c->shm != NULL && !pbox_shm_client_sleep_prepare(c->shm)) {
				continue; /* a result arrived meanwhile */
			}
			if (poll(p, 5, ms) > 0) {
				if (p[1].revents & POLLIN) {
					uint64_t v;

					if (read(c->wake_fd, &v, sizeof(v)) < 0) {
						/* nothing: the eventfd is only a doorbell */
					}
					if (c->probe != NULL && c->ctl_fd >= 0) {
						ctl_answer(c, pbox_wprobe_poll(c->probe));
					}
				}
				if (c->ctl_fd >= 0 &&
				    (p[2].revents & (POLLIN | POLLHUP | POLLERR))) {
					ctl_events(c);
				}
				if (p[4].revents & (POLLHUP | POLLERR)) {
					shm_ended(c);
				}
			}
			if (c->shm != NULL) {
				pbox_shm_client_sleep_end(c->shm);
			}
		}
	}
	/* Operations still in flight, and those submitted but not yet picked up, fail, so
	 * that every callback has run when pbox_close returns. Refuse new submissions first
	 * (start() checks fail_err under the lock), or one made from a callback below would
	 * be left in the list after the last drain. */
	pthread_mutex_lock(&c->lock);
	if (c->fail_err == 0) {
		c->fail_err = -ECANCELED;
		snprintf(c->fail_msg, sizeof(c->fail_msg), "the client was closed");
	}
	pthread_mutex_unlock(&c->lock);
	pbox_node_fail(c->node, -ECANCELED, "the client was closed");
	drain_submissions(c);
	return NULL;
}

/* ---- registration ------------------------------------------------------------------- */

/* PBOX_VERSION_WORDS=crc: full CRC32C version words even where the appliance does not
 * verify them (a resend then notices any changed byte, not only a sampled one). */
static bool vwords_full(void)
{
	const char *v = getenv("PBOX_VERSION_WORDS");

	return v != NULL && strcmp(v, "crc") == 0;
}

static int parse_register(struct pbox_client *c, json_t *resp, const struct pbox_keyspec *ks,
			  uint32_t nkeys)
{
	json_t *ports = json_object_get(resp, "ports"), *map = json_object_get(resp, "core_map");
	const char *cookie = json_string_value(json_object_get(resp, "cookie"));
	const char *addr = json_string_value(json_object_get(resp, "data_addr"));
	uint32_t chunk_bytes = (uint32_t)json_integer_value(json_object_get(resp, "chunk_bytes"));
	uint32_t frag_bytes = (uint32_t)json_integer_value(json_object_get(resp, "frag_bytes"));
	uint32_t *core_map = NULL;
	size_t ncores = json_array_size(ports), i;
	char err[256];
	int rc;

	if (cookie == NULL || addr == NULL || ncores == 0 || ncores > PBOX_MAX_CORES ||
	    !json_is_array(map)) {
		return fail(-EPROTO, "register: pboxd's answer lacks the session parameters");
	}
	snprintf(c->data_addr, sizeof(c->data_addr), "%s", addr);
	snprintf(c->shm_name, sizeof(c->shm_name), "%s",
		 json_string_value(json_object_get(resp, "shm")) ?: "");
	core_map = calloc(json_array_size(map) + 1, sizeof(*core_map));
	c->cores = calloc(ncores, sizeof(*c->cores));
	if (core_map == NULL || c->cores == NULL) {
		free(core_map);
		return fail(-ENOMEM, "out of memory");
	}
	for (i = 0; i < json_array_size(map); i++) {
		core_map[i] = (uint32_t)json_integer_value(json_array_get(map, i));
	}
	for (i = 0; i < ncores; i++) {
		json_int_t p = json_integer_value(json_array_get(ports, i));

		if (p <= 0 || p > 65535 ||
		    pbox_peer_from_str(&c->cores[i], addr, (uint16_t)p) != 0) {
			free(core_map);
			return fail(-EPROTO, "register: bad data endpoint %s:%lld", addr,
				    (long long)p);
		}
	}
	rc = pbox_jobdesc_build(&c->desc, ks, nkeys, c->info.workers, (uint32_t)ncores, chunk_bytes,
				frag_bytes, core_map, err, sizeof(err));
	if (rc == 0 && c->desc.nchunks != json_array_size(map)) {
		pbox_jobdesc_free(&c->desc);
		snprintf(err, sizeof(err), "chunk map has %zu entries for %u chunks",
			 json_array_size(map), c->desc.nchunks);
		rc = -EPROTO;
	}
	free(core_map);
	if (rc < 0) {
		return fail(rc, "register: %s", err);
	}
	c->info.cores = (uint32_t)ncores;
	c->info.chunk_bytes = chunk_bytes;
	c->info.frag_bytes = frag_bytes;
	c->info.nchunks = c->desc.nchunks;
	c->info.total_bytes = c->desc.total_bytes;
	c->cookie = strtoull(cookie, NULL, 16);
	if (c->cookie == 0) {
		return fail(-EPROTO, "register: pboxd sent an invalid session cookie '%s'", cookie);
	}
	{
		json_int_t st = json_integer_value(json_object_get(resp, "staleness"));
		const char *flow = json_string_value(json_object_get(resp, "flow"));
		json_t *cr = json_object_get(resp, "credits");
		json_int_t credits = json_integer_value(cr);

		/* The slot table and the node's lanes are sized by it: a value we would have
		 * to guess at is a protocol error, not a default. */
		if (!json_is_integer(cr) || credits < 1 || credits > PBOX_MAX_CREDITS) {
			return fail(-EPROTO,
				    "register: pboxd sent no valid 'credits' (unacknowledged "
				    "contributions per chunk, 1..%u); is it the same version as "
				    "libpbox %s?",
				    PBOX_MAX_CREDITS, PBOX_VERSION_STRING);
		}
		c->staleness = st < 0 ? UINT32_MAX : (uint32_t)st;
		c->credits = (uint32_t)credits;
		c->plain = flow != NULL && strcmp(flow, "plain") == 0;
		/* Version words (node.h). Full CRC32C words where they add something: the
		 * appliance verifies them (the job says "crc"), or PBOX_VERSION_WORDS=crc
		 * asks for them. Otherwise, in NOTIFY-ACK flow, sampled words kept by the
		 * node let a resend notice a buffer changed under it without a pass over
		 * every payload byte (UDP's own checksum covers the wire). A plain
		 * push resends from the node's own copy, which cannot change. */
		c->crc = json_is_true(json_object_get(resp, "crc")) || vwords_full();
		c->sampled_words = !c->plain && !c->crc;
		c->folds_late = json_is_true(json_object_get(resp, "folds_late"));
		memset(&c->dvf, 0, sizeof(c->dvf));
		if (json_object_get(resp, "dvf") != NULL &&
		    pbox_dvf_job_from_json(json_object_get(resp, "dvf"), &c->dvf, err,
					   sizeof(err)) != 0) {
			return fail(-EPROTO, "register: pboxd sent bad DVF settings: %s", err);
		}
		c->heartbeat_ms =
			(uint32_t)json_integer_value(json_object_get(resp, "heartbeat_ms"));
		c->resume_version =
			(uint32_t)json_integer_value(json_object_get(resp, "resume_version"));
		snprintf(c->info.sync, sizeof(c->info.sync), "%s",
			 json_string_value(json_object_get(resp, "sync"))
				 ? json_string_value(json_object_get(resp, "sync"))
				 : "bsp");
		c->info.staleness = c->staleness;
		c->info.credits = c->credits;
	}
	/* TSB: the job's results come down a broadcast tree (common/tsbmsg.h). */
	if (json_object_get(resp, "tsb_key") != NULL) {
		if (pbox_tsb_key_parse(json_string_value(json_object_get(resp, "tsb_key")),
				       &c->tsb_key) != 0) {
			return fail(-EPROTO, "register: the appliance sent a malformed tsb_key");
		}
		c->tsb = true;
	}
	return 0;
}

/* Shared memory or UDP (xport_select.h); sets c->shm and info.transport. */
static int choose_transport(struct pbox_client *c, bool fault)
{
	const char *want = getenv("PBOX_TRANSPORT");
	enum pbox_xsel_mode mode;
	char why[160];

	if (pbox_xsel_parse(want, &mode) != 0) {
		return fail(-EINVAL, "transport '%s': expected udp, shm or auto", want);
	}
	if (pbox_xsel_want_shm(mode, c->shm_name, c->data_addr, fault, why, sizeof(why))) {
		c->shm = pbox_shm_client_open(c->shm_name, c->info.job, c->info.rank, c->cookie,
					      c->cores, c->info.cores, why, sizeof(why));
	}
	if (c->shm == NULL && mode == PBOX_XSEL_SHM) {
		return fail(-EPROTONOSUPPORT, "register: shared memory was asked for: %s", why);
	}
	snprintf(c->transport, sizeof(c->transport), "%s", c->shm ? "shm" : "udp");
	PBOX_LOG_DEBUG(TRANSPORT, "job %u rank %u: data path %s%s%s", c->info.job, c->info.rank,
		       c->transport, c->shm ? "" : ": ", c->shm ? "" : why);
	return 0;
}

/* The probe agent on the address pboxd sees this worker at (opts.local_addr, else the
 * control connection's local address). */
static int start_probe_agent(struct pbox_client *c)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	char addr[INET_ADDRSTRLEN] = "";

	if (c->opts.local_addr != NULL) {
		snprintf(addr, sizeof(addr), "%s", c->opts.local_addr);
	} else if (getsockname(c->ctl_fd, (struct sockaddr *)&sin, &len) == 0 &&
		   sin.sin_family == AF_INET) {
		inet_ntop(AF_INET, &sin.sin_addr, addr, sizeof(addr));
	}
	return pbox_wprobe_create(c->opts.probe, addr, c->wake_fd, &c->probe);
}

int pbox_register(struct pbox_client *c, const struct pbox_key_info *keys, uint32_t nkeys)
{
	struct pbox_keyspec *ks;
	struct pbox_udp_cfg ucfg = { 0 };
	struct pbox_node_cfg ncfg = { 0 };
	json_t *arr, *resp = NULL;
	const char *fault;
	char err[256];
	int rc;

	if (c == NULL || keys == NULL || nkeys == 0) {
		return fail(-EINVAL, "register: no keys given");
	}
	if (c->node != NULL) {
		return fail(-EALREADY, "register: keys are already registered");
	}
	ks = calloc(nkeys, sizeof(*ks));
	arr = json_array();
	if (ks == NULL || arr == NULL) {
		free(ks);
		json_decref(arr);
		return fail(-ENOMEM, "out of memory");
	}
	for (uint32_t i = 0; i < nkeys; i++) {
		ks[i].id = keys[i].id;
		ks[i].nelem = keys[i].nelem;
		json_array_append_new(arr, json_pack("[I, I]", (json_int_t)keys[i].id,
						     (json_int_t)keys[i].nelem));
	}
	if (c->wake_fd < 0) { /* a register refused earlier may have made both */
		c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	}
	rc = c->wake_fd < 0 ? -errno : c->probe == NULL ? start_probe_agent(c) : 0;
	if (rc < 0) {
		json_decref(arr);
		rc = fail(rc,
			  "register: cannot start the probe agent (PBOX_PROBE=off turns it "
			  "off): %s",
			  strerror(-rc));
		goto out;
	}
	rc = ctl_call(c,
		      c->probe != NULL ? json_pack("{s:s, s:o, s:s}", "op", "register", "keys", arr,
						   "probe", pbox_wprobe_addr(c->probe))
				       : json_pack("{s:s, s:o}", "op", "register", "keys", arr),
		      &resp);
	if (rc < 0) {
		goto out;
	}
	rc = parse_register(c, resp, ks, nkeys);
	if (rc < 0) {
		goto out;
	}
	if (json_object_get(resp, "plan") != NULL) {
		plan_event(c, json_object_get(resp, "plan"));
	}
	fault = c->opts.fault ? c->opts.fault : getenv("PBOX_FAULT");
	if (pbox_fault_parse(fault, &ucfg.fault, err, sizeof(err)) != 0) {
		rc = fail(-EINVAL, "PBOX_FAULT: %s", err);
		goto out;
	}
	ucfg.addr = c->opts.local_addr;
	ucfg.kpace = pbox_kpace_env_on(); /* rate: set_kpace_rate() */
	ucfg.kpace_peer = c->data_addr;   /* whose route says which qdisc to check */
	c->udp = pbox_udp_open(&ucfg);
	/* One operation slot per unacknowledged contribution the job allows per chunk. */
	c->ops = calloc((size_t)nkeys * c->credits, sizeof(*c->ops));
	if (c->udp == NULL || c->ops == NULL) {
		rc = fail(-ENOMEM, "register: cannot set up the data socket (see log)");
		goto out;
	}
	ncfg.desc = &c->desc;
	ncfg.job = c->info.job;
	ncfg.rank = c->info.rank;
	ncfg.cookie = c->cookie;
	ncfg.server_opt = c->info.mode == PBOX_JOB_SERVER_OPTIMIZER;
	ncfg.cores = c->cores;
	rc = choose_transport(c,
			      ucfg.fault.drop > 0 || ucfg.fault.dup > 0 || ucfg.fault.reorder > 0);
	if (rc < 0) {
		goto out;
	}
	if (c->shm == NULL && pbox_udp_kpace(c->udp)) {
		char info[320];

		PBOX_LOG_INFO(TRANSPORT, "job %u rank %u: udp port %u: %s", c->info.job,
			      c->info.rank, pbox_udp_port(c->udp),
			      pbox_udp_info_str(c->udp, info, sizeof(info)));
	}
	ncfg.tx = c->shm != NULL ? &pbox_shm_client_tx_ops : &pbox_udp_tx_ops;
	ncfg.tx_ctx = c->shm != NULL ? (void *)c->shm : (void *)c->udp;
	ncfg.rto_ms = c->opts.rto_ms;
	if (c->shm != NULL) {
		/* Rings lose nothing unless one is full (counted on both sides): a timeout
		 * there means a descheduled peer on a busy host, not a loss; a low floor would
		 * only resend what is about to be read. */
		ncfg.rto_min_ms = PBOX_SHM_RTO_MIN_MS;
		ncfg.pto_min_ms = PBOX_SHM_RTO_MIN_MS;
		ncfg.rto_ms = PBOX_MAX(ncfg.rto_ms, (uint32_t)PBOX_SHM_RTO_MIN_MS);
	}
	ncfg.timeout_ms = c->opts.timeout_ms;
	ncfg.max_inflight = c->opts.max_inflight;
	ncfg.window_bytes = c->opts.window_bytes;
	ncfg.staleness = c->staleness;
	ncfg.accept_newer = c->folds_late && c->info.mode != PBOX_JOB_SERVER_OPTIMIZER;
	ncfg.result_lag = c->info.mode == PBOX_JOB_BROADCAST ? c->staleness : 0;
	ncfg.credits = c->credits;
	ncfg.plain = c->plain;
	ncfg.crc = c->crc;
	ncfg.sampled_words = c->sampled_words;
	ncfg.dvf = &c->dvf;
	ncfg.done = op_done;
	ncfg.done_arg = c;
	c->node = pbox_node_create(&ncfg);
	if (c->node != NULL && c->tsb && pbox_node_tsb_key(c->node, &c->tsb_key) != 0) {
		pbox_node_destroy(c->node);
		c->node = NULL;
	}
	if (c->node == NULL) {
		rc = fail(-ENOMEM, "register: out of memory for the worker node");
		goto out;
	}
	pthread_mutex_lock(&c->lock);
	dvf_plan(c); /* a plan that came with the register answer */
	pthread_mutex_unlock(&c->lock);
	fcntl(c->ctl_fd, F_SETFL, fcntl(c->ctl_fd, F_GETFL) | O_NONBLOCK);
	rc = pthread_create(&c->thread, NULL, progress_main, c);
	if (rc != 0) {
		/* No thread would ever complete an operation: accept none. */
		pbox_node_destroy(c->node);
		c->node = NULL;
		rc = fail(-rc, "register: cannot start the progress thread: %s", strerror(rc));
		goto out;
	}
	c->thread_started = true;
	rc = 0;
out:
	json_decref(resp);
	free(ks);
	return rc;
}

/* ---- operations --------------------------------------------------------------------- */

static int start(struct pbox_client *c, enum pbox_op_kind kind, uint32_t key_id, uint32_t iter,
		 const float *src, float *dst, pbox_done_fn cb, void *arg)
{
	int64_t k;
	struct cop *cp;
	bool ring;

	if (c == NULL || c->node == NULL) {
		return fail(-ENOTCONN, "no keys registered yet (call pbox_register first)");
	}
	k = pbox_jobdesc_find_key(&c->desc, key_id);
	if (k < 0) {
		return fail(-ENOENT, "key %u was not registered", key_id);
	}
	if ((src == NULL && kind != PBOX_OP_PULL) ||
	    (dst == NULL && (kind == PBOX_OP_PULL || kind == PBOX_OP_PUSH_PULL))) {
		return fail(-EINVAL, "key %u: NULL buffer", key_id);
	}
	pthread_mutex_lock(&c->lock);
	if (c->fail_err != 0) {
		int e = c->fail_err;

		fail(e, "%s", c->fail_msg);
		pthread_mutex_unlock(&c->lock);
		return e;
	}
	cp = NULL;
	for (uint32_t l = 0; l < c->credits; l++) {
		if (c->ops[k * c->credits + l].state != COP_SUBMITTED) {
			cp = &c->ops[k * c->credits + l];
			break;
		}
	}
	if (cp == NULL) {
		pthread_mutex_unlock(&c->lock);
		return fail(-EBUSY,
			    "key %u already has %u operation(s) in flight (the job allows %u "
			    "unacknowledged contribution(s) per chunk); wait for one first",
			    key_id, c->credits, c->credits);
	}
	memset(&cp->op, 0, sizeof(cp->op));
	cp->op.kind = kind;
	cp->op.key = (uint32_t)k;
	cp->op.iter = iter;
	cp->op.src = src;
	cp->op.dst = dst;
	cp->cb = cb;
	cp->cb_arg = arg;
	cp->state = COP_SUBMITTED;
	cp->next = NULL;
	cp->waited = false;
	/* The doorbell only for the first of a batch: the progress thread takes the whole
	 * list at once (drain_submissions), so one ring covers everything appended before
	 * it does. */
	ring = c->sub_head == NULL;
	if (c->sub_tail) {
		c->sub_tail->next = cp;
	} else {
		c->sub_head = cp;
	}
	c->sub_tail = cp;
	pthread_mutex_unlock(&c->lock);
	if (ring) {
		uint64_t one = 1;

		if (write(c->wake_fd, &one, sizeof(one)) < 0) {
			/* the eventfd cannot overflow with increments of 1; ignore */
		}
	}
	return 0;
}

static int abs_deadline(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
	return 0;
}

/* Wait for cp under c->lock (held). Returns the op status or -ETIMEDOUT. */
static int wait_locked(struct pbox_client *c, struct cop *cp, const struct timespec *until)
{
	while (cp->state == COP_SUBMITTED) {
		int rc;

		cp->waited = true; /* op_done signals its completion */
		rc = until ? pthread_cond_timedwait(&c->cond, &c->lock, until)
			   : pthread_cond_wait(&c->cond, &c->lock);

		if (rc == ETIMEDOUT && cp->state == COP_SUBMITTED) {
			return fail(-ETIMEDOUT,
				    "waiting for key %u (iteration %u): timed out; the operation "
				    "is still in flight",
				    c->desc.keys[cp->op.key].id, cp->op.iter);
		}
	}
	if (cp->state == COP_DONE) {
		cp->state = COP_FREE;
		if (cp->op.status < 0) {
			return fail(cp->op.status, "%s", cp->op.errmsg);
		}
		return cp->op.status;
	}
	return 0;
}

/* Wait for every operation slot of key index k (lock held); first error wins. */
static int wait_key_locked(struct pbox_client *c, uint32_t k, const struct timespec *until)
{
	int first = 0;
	char msg[sizeof(g_errmsg)] = "";

	for (uint32_t l = 0; l < c->credits; l++) {
		int rc = wait_locked(c, &c->ops[k * c->credits + l], until);

		if (rc < 0 && first == 0) {
			first = rc;
			snprintf(msg, sizeof(msg), "%s", g_errmsg);
		}
	}
	if (first < 0) {
		snprintf(g_errmsg, sizeof(g_errmsg), "%s", msg);
	}
	return first;
}

int pbox_wait(struct pbox_client *c, uint32_t key_id, int timeout_ms)
{
	struct timespec until;
	int64_t k;
	int rc;

	if (c == NULL || c->node == NULL) {
		return fail(-ENOTCONN, "no keys registered yet");
	}
	k = pbox_jobdesc_find_key(&c->desc, key_id);
	if (k < 0) {
		return fail(-ENOENT, "key %u was not registered", key_id);
	}
	if (timeout_ms >= 0) {
		abs_deadline(&until, timeout_ms);
	}
	pthread_mutex_lock(&c->lock);
	rc = wait_key_locked(c, (uint32_t)k, timeout_ms >= 0 ? &until : NULL);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int pbox_wait_all(struct pbox_client *c, int timeout_ms)
{
	struct timespec until;
	int first = 0;
	char msg[sizeof(g_errmsg)] = "";

	if (c == NULL || c->node == NULL) {
		return fail(-ENOTCONN, "no keys registered yet");
	}
	if (timeout_ms >= 0) {
		abs_deadline(&until, timeout_ms);
	}
	pthread_mutex_lock(&c->lock);
	/* Last key first: operations complete about in the order they were started, so
	 * waiting for the last one first wakes this thread about once, not once per key.
	 * The error reported is still the one of the lowest key that failed. */
	for (uint32_t k = c->desc.nkeys; k-- > 0;) {
		int rc = wait_key_locked(c, k, timeout_ms >= 0 ? &until : NULL);

		if (rc < 0) {
			first = rc;
			snprintf(msg, sizeof(msg), "%s", g_errmsg);
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (first < 0) {
		snprintf(g_errmsg, sizeof(g_errmsg), "%s", msg);
	}
	return first;
}

static int sync_op(struct pbox_client *c, enum pbox_op_kind kind, uint32_t key, uint32_t iter,
		   const float *src, float *dst)
{
	int rc = start(c, kind, key, iter, src, dst, NULL, NULL);

	return rc < 0 ? rc : pbox_wait(c, key, -1);
}

int pbox_init(struct pbox_client *c, uint32_t key, const float *values)
{
	return sync_op(c, PBOX_OP_INIT, key, 0, values, NULL);
}

int pbox_push(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad)
{
	return sync_op(c, PBOX_OP_PUSH, key, iter, grad, NULL);
}

int pbox_pull(struct pbox_client *c, uint32_t key, uint32_t iter, float *out)
{
	return sync_op(c, PBOX_OP_PULL, key, iter, NULL, out);
}

int pbox_push_pull(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
		   float *out)
{
	return sync_op(c, PBOX_OP_PUSH_PULL, key, iter, grad, out);
}

int pbox_init_async(struct pbox_client *c, uint32_t key, const float *values, pbox_done_fn cb,
		    void *arg)
{
	return start(c, PBOX_OP_INIT, key, 0, values, NULL, cb, arg);
}

int pbox_push_async(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
		    pbox_done_fn cb, void *arg)
{
	return start(c, PBOX_OP_PUSH, key, iter, grad, NULL, cb, arg);
}

int pbox_pull_async(struct pbox_client *c, uint32_t key, uint32_t iter, float *out, pbox_done_fn cb,
		    void *arg)
{
	return start(c, PBOX_OP_PULL, key, iter, NULL, out, cb, arg);
}

int pbox_push_pull_async(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
			 float *out, pbox_done_fn cb, void *arg)
{
	return start(c, PBOX_OP_PUSH_PULL, key, iter, grad, out, cb, arg);
}

int pbox_client_update_cfg(const struct pbox_client *c, const struct pbox_optimizer_ops **opt,
			   struct pbox_opt_params *params, const struct pbox_jobdesc **desc)
{
	if (c == NULL || c->node == NULL) {
		return fail(-ENOTCONN, "no keys registered yet (call pbox_register first)");
	}
	if (c->info.mode != PBOX_JOB_BROADCAST || c->bc_opt == NULL) {
		return fail(-EINVAL, "job %u is not a broadcast job (mode = \"broadcast\")",
			    c->info.job);
	}
	*opt = c->bc_opt;
	*params = c->bc_params;
	*desc = &c->desc;
	return 0;
}

uint32_t pbox_resume_version(const struct pbox_client *c)
{
	return c != NULL ? c->resume_version : 0;
}

int64_t pbox_result_version(struct pbox_client *c, uint32_t key_id)
{
	int64_t k, v;

	if (c == NULL || c->node == NULL) {
		return fail(-ENOTCONN, "no keys registered yet");
	}
	k = pbox_jobdesc_find_key(&c->desc, key_id);
	if (k < 0) {
		return fail(-ENOENT, "key %u was not registered", key_id);
	}
	pthread_mutex_lock(&c->lock);
	v = 0;
	for (uint32_t l = 0; l < c->credits; l++) {
		v = PBOX_MAX(v, (int64_t)c->ops[k * c->credits + l].version);
	}
	pthread_mutex_unlock(&c->lock);
	return v;
}

int pbox_mem_alloc(struct pbox_client *c, size_t bytes, void **out)
{
	const char *env = getenv("PBOX_SHM_REGISTER");
	struct mem_block *b;
	char why[256] = "";
	int rc = -1;

	if (c == NULL || out == NULL || bytes == 0) {
		return fail(-EINVAL, "pbox_mem_alloc: NULL argument or 0 bytes");
	}
	if (c->node == NULL) {
		return fail(-ENOTCONN, "pbox_mem_alloc: call pbox_register first");
	}
	b = calloc(1, sizeof(*b));
	if (b == NULL) {
		return fail(-ENOMEM, "pbox_mem_alloc: out of memory");
	}
	if (c->shm != NULL && (env == NULL || strcmp(env, "0") != 0)) {
		rc = pbox_shm_client_mem_reg(c->shm, bytes, &b->p, why, sizeof(why));
		if (rc != 0) {
			PBOX_LOG_INFO(CLIENT,
				      "job %u rank %u: %s; using plain memory (pushes from it are "
				      "copied)",
				      c->info.job, c->info.rank, why);
		}
	}
	b->shared = rc == 0;
	b->bytes = bytes;
	if (!b->shared) {
		b->p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			    0);
		if (b->p == MAP_FAILED) {
			rc = -errno;
			free(b);
			return fail(rc, "pbox_mem_alloc: cannot map %zu bytes: %s", bytes,
				    strerror(-rc));
		}
	}
	pthread_mutex_lock(&c->lock);
	b->next = c->mem;
	c->mem = b;
	pthread_mutex_unlock(&c->lock);
	*out = b->p;
	return 0;
}

/* Unlink p's block from c->mem (under lock); NULL if p is none. */
static struct mem_block *mem_take(struct pbox_client *c, const void *p)
{
	struct mem_block **pp, *b = NULL;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->mem; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->p == p) {
			b = *pp;
			*pp = b->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return b;
}

int pbox_mem_free(struct pbox_client *c, void *p)
{
	struct mem_block *b;

	if (c == NULL || p == NULL) {
		return 0;
	}
	b = mem_take(c, p);
	if (b == NULL) {
		return fail(-EINVAL, "pbox_mem_free: %p is not a block of pbox_mem_alloc", p);
	}
	if (b->shared) {
		(void)pbox_shm_client_mem_unreg(c->shm, p);
	} else {
		munmap(p, b->bytes);
	}
	free(b);
	return 0;
}

int pbox_mem_detach(struct pbox_client *c, void *p)
{
	struct mem_block *b = c != NULL && p != NULL ? mem_take(c, p) : NULL;

	if (b == NULL) {
		return fail(-EINVAL, "pbox_mem_detach: %p is not a block of pbox_mem_alloc", p);
	}
	if (b->shared) {
		(void)pbox_shm_client_mem_detach(c->shm, p);
	}
	free(b);
	return 0;
}

bool pbox_mem_registered(struct pbox_client *c, const void *p)
{
	bool shared = false;

	if (c == NULL) {
		return false;
	}
	pthread_mutex_lock(&c->lock);
	for (const struct mem_block *b = c->mem; b != NULL; b = b->next) {
		if ((const uint8_t *)p >= (const uint8_t *)b->p &&
		    (const uint8_t *)p < (const uint8_t *)b->p + b->bytes) {
			shared = b->shared;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return shared;
}

const char *pbox_transport(const struct pbox_client *c)
{
	return c != NULL ? c->transport : "";
}

int pbox_job_info(const struct pbox_client *c, struct pbox_job_info *info)
{
	if (c == NULL || info == NULL) {
		return fail(-EINVAL, "pbox_job_info: NULL argument");
	}
	*info = c->info;
	return 0;
}

uint64_t pbox_client_rx_placed(struct pbox_client *c)
{
	uint64_t v;

	if (c == NULL || c->node == NULL) {
		return 0;
	}
	pthread_mutex_lock(&c->lock);
	v = c->rx_placed;
	pthread_mutex_unlock(&c->lock);
	return v;
}

size_t pbox_struct_size(const char *name)
{
	static const struct {
		const char *name;
		size_t size;
	} sizes[] = {
		{ "pbox_client_opts", sizeof(struct pbox_client_opts) },
		{ "pbox_key_info", sizeof(struct pbox_key_info) },
		{ "pbox_job_info", sizeof(struct pbox_job_info) },
		{ "pbox_client_stats", sizeof(struct pbox_client_stats) },
		{ "pbox_plan", sizeof(struct pbox_plan) },
	};

	for (size_t i = 0; name != NULL && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		if (strcmp(name, sizes[i].name) == 0) {
			return sizes[i].size;
		}
	}
	return 0;
}

void pbox_client_stats(struct pbox_client *c, struct pbox_client_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (c == NULL || c->node == NULL) {
		return;
	}
	pthread_mutex_lock(&c->lock);
	*st = c->stats;
	pthread_mutex_unlock(&c->lock);
}

void pbox_close(struct pbox_client *c)
{
	if (c == NULL) {
		return;
	}
	if (c->thread_started && pthread_equal(pthread_self(), c->thread)) {
		/* A completion callback cannot close its own client: the progress thread
		 * would have to join itself. */
		PBOX_LOG_ERR(CLIENT, "pbox_close called from a completion callback of the same "
				     "client; close it from another thread");
		return;
	}
	if (c->thread_started) {
		uint64_t one = 1;

		__atomic_store_n(&c->stop, true, __ATOMIC_RELEASE);
		if (write(c->wake_fd, &one, sizeof(one)) < 0) {
			/* the thread also wakes on its poll timeout */
		}
		pthread_join(c->thread, NULL);
	}
	if (c->ctl_fd >= 0) {
		json_t *bye = json_pack("{s:s}", "op", "leave");

		/* Best effort: a clean goodbye tells pboxd this is not a failure. */
		fcntl(c->ctl_fd, F_SETFL, fcntl(c->ctl_fd, F_GETFL) & ~O_NONBLOCK);
		pbox_ctl_send(c->ctl_fd, bye, 1000);
		json_decref(bye);
		shutdown(c->ctl_fd, SHUT_WR);
		{
			/* Wait briefly for pboxd's acknowledgement so the leave is processed
			 * before the connection drops. */
			struct pollfd p = { .fd = c->ctl_fd, .events = POLLIN };

			poll(&p, 1, 1000);
		}
		close(c->ctl_fd);
	}
	pbox_wprobe_destroy(c->probe); /* before the doorbell it rings goes */
	if (c->wake_fd >= 0) {
		close(c->wake_fd);
	}
	pbox_node_destroy(c->node);
	while (c->mem != NULL) { /* the shm client unmaps the shared ones */
		struct mem_block *b = c->mem;

		c->mem = b->next;
		if (!b->shared) {
			munmap(b->p, b->bytes);
		}
		free(b);
	}
	pbox_shm_client_close(c->shm);
	pbox_udp_close(c->udp);
	pbox_jobdesc_free(&c->desc);
	pbox_linebuf_free(&c->ctl_in);
	free(c->cores);
	free(c->ops);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}
