/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's control channel to pboxd: connect, request / response, and the events pboxd
 * sends a registered worker (plans, probes, the broadcast tree, aborts); heartbeats.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_int.h"
#include "common/log.h"
#include "dvf_push.h"

int pbox_client_ctl_connect(struct pbox_client *c)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	char port[8];
	int fd, rc, one = 1;
	struct pollfd p;
	socklen_t el = sizeof(rc);

	snprintf(port, sizeof(port), "%u", c->server_port);
	if (getaddrinfo(c->server_host, port, &hints, &res) != 0) {
		return pbox_client_error(-EINVAL, "cannot resolve pboxd address '%s'",
					 c->server_host);
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		freeaddrinfo(res);
		return pbox_client_error(-errno, "socket: %s", strerror(errno));
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	rc = connect(fd, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	if (rc != 0 && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		return pbox_client_error(rc, "cannot reach pboxd at %s:%u: %s (is pboxd running?)",
					 c->server_host, c->server_port, strerror(-rc));
	}
	p.fd = fd;
	p.events = POLLOUT;
	if (poll(&p, 1, (int)c->opts.timeout_ms) != 1) {
		close(fd);
		return pbox_client_error(-ETIMEDOUT,
					 "cannot reach pboxd at %s:%u: no answer within %u ms",
					 c->server_host, c->server_port, c->opts.timeout_ms);
	}
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &rc, &el);
	if (rc != 0) {
		close(fd);
		return pbox_client_error(-rc, "cannot reach pboxd at %s:%u: %s (is pboxd running?)",
					 c->server_host, c->server_port, strerror(rc));
	}
	c->ctl_fd = fd;
	return 0;
}

/* Send req and wait for the response object (events arriving first are handled). */
int pbox_client_ctl_call(struct pbox_client *c, json_t *req, json_t **resp)
{
	char op[32];
	int rc = pbox_ctl_send(c->ctl_fd, req, (int)c->opts.timeout_ms);
	uint64_t deadline = pbox_clock_ns(NULL) + (uint64_t)c->opts.timeout_ms * 1000000ull;

	/* The name outlives the request object, for the messages below. */
	snprintf(op, sizeof(op), "%s", json_string_value(json_object_get(req, "op")));
	json_decref(req);
	if (rc < 0) {
		return pbox_client_error(rc, "%s: cannot send to pboxd: %s", op, strerror(-rc));
	}
	for (;;) {
		char *line;
		long n;

		while ((line = pbox_linebuf_next(&c->ctl_in)) != NULL) {
			json_error_t jerr;
			json_t *o = json_loads(line, 0, &jerr);

			if (o == NULL || !json_is_object(o)) {
				json_decref(o);
				return pbox_client_error(-EPROTO,
							 "%s: pboxd sent a malformed reply: %s", op,
							 jerr.text);
			}
			if (json_object_get(o, "event") != NULL) {
				json_decref(o); /* no events matter before registration */
				continue;
			}
			if (!json_is_true(json_object_get(o, "ok"))) {
				int err = (int)json_integer_value(json_object_get(o, "errno"));
				const char *msg = json_string_value(json_object_get(o, "error"));

				rc = pbox_client_error(err > 0 ? -err : -EPROTO, "%s",
						       msg ? msg : "refused");
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
				return pbox_client_error(-ETIMEDOUT,
							 "%s: pboxd did not answer within %u ms",
							 op, c->opts.timeout_ms);
			}
		}
		n = pbox_linebuf_fill(&c->ctl_in, c->ctl_fd);
		if (n == 0) {
			return pbox_client_error(-ECONNRESET, "%s: pboxd closed the connection",
						 op);
		}
		if (n < 0 && n != -EAGAIN) {
			return pbox_client_error((int)n, "%s: reading from pboxd: %s", op,
						 strerror((int)-n));
		}
	}
}

/* The DVF push filter's delta_low / delta_up switch follows the plan's push_up (called
 * with c->lock held, whenever the plan or the node changes). */
void pbox_client_dvf_plan(struct pbox_client *c)
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
void pbox_client_plan_event(struct pbox_client *c, const json_t *j)
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
		pbox_client_dvf_plan(c);
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
void pbox_client_ctl_answer(struct pbox_client *c, json_t *ans)
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
		pbox_client_ctl_answer(c, pbox_wprobe_start(c->probe, o));
	} else if (id >= 1 && id <= (1LL << 53)) {
		pbox_client_ctl_answer(
			c, json_pack("{s:s, s:I, s:i, s:s}", "op", "probe_result", "id", id,
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
bool pbox_client_ctl_read_events(struct pbox_client *c)
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
			pbox_client_record_failure(c, -ECONNABORTED, msg);
		} else if (ev != NULL && strcmp(ev, "removed") == 0) {
			const char *why = json_string_value(json_object_get(o, "reason"));

			snprintf(msg, sizeof(msg), "the appliance removed rank %u from job %u: %s",
				 c->info.rank, c->info.job, why ? why : "no reason given");
			pbox_client_record_failure(c, -ETIMEDOUT, msg);
		} else if (ev != NULL && strcmp(ev, "plan") == 0) {
			pbox_client_plan_event(c, json_object_get(o, "plan"));
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
		pbox_client_record_failure(c, -ECONNRESET, msg);
		close(c->ctl_fd);
		c->ctl_fd = -1;
	}
	return c->fail_err != 0;
}

/* Tell pboxd this worker is alive (its liveness check declares silent workers dead). */
void pbox_client_heartbeat(struct pbox_client *c)
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
			pbox_client_ctl_events(c);
		}
	}
}
