/* SPDX-License-Identifier: BSD-3-Clause */
/* libpbox's probe agent: see probe.h. */
#include "probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "common/ctlproto.h"
#include "common/hostport.h"
#include "common/log.h"
#include "probe_msg.h"

#define WPROBE_DEFAULT_RATE_BPS 1e9
#define WPROBE_DEFAULT_BUDGET_S 10

/* One probe, owned by its thread once the agent is destroyed while it runs. */
struct wjob {
	struct pbox_wprobe *w; /* NULL: abandoned (the thread frees the job) */
	uint64_t id;
	char peer[80];
	struct pbox_probe_request req;
	struct pbox_probe_result res;
	int rc;
	bool done;
	pthread_t thread;
};

struct pbox_wprobe {
	struct pbox_probe_limits lim;
	bool realtime; /* PBOX_PROBE_REALTIME=1 */
	char addr[80];
	int wake_fd;
	struct pbox_probe_responder *resp;
	int rfd;
	pthread_t rthread;
	bool rthread_started;
	volatile sig_atomic_t stop;
	struct wjob *job; /* the one probe (NULL: none), under g_mu */
};

/* Guards every agent's job and the jobs' w and done: a probe thread that outlives its
 * agent must find out under a lock that outlives the agent too. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void *responder_main(void *arg)
{
	struct pbox_wprobe *w = arg;
	int rc = pbox_probe_responder_serve(w->resp, w->rfd, &w->stop);

	if (rc != 0) {
		PBOX_LOG_ERR(CLIENT, "probe agent %s: responder stopped: %s", w->addr,
			     strerror(-rc));
	}
	return NULL;
}

/* "200mbit", "1gbit", "5e8" (bit/s) into *bps (1 Mbit/s .. 1 Tbit/s). */
static int parse_rate(const char *s, double *bps)
{
	char *end;
	double v = strtod(s, &end), mul = 1;

	if (end == s || !isfinite(v)) {
		return -EINVAL;
	}
	if (*end == 'k' || *end == 'K') {
		mul = 1e3, end++;
	} else if (*end == 'm' || *end == 'M') {
		mul = 1e6, end++;
	} else if (*end == 'g' || *end == 'G') {
		mul = 1e9, end++;
	}
	if (strcmp(end, "bit") != 0 && *end != '\0') {
		return -EINVAL;
	}
	v *= mul;
	if (v < 1e6 || v > 1e12) {
		return -EINVAL;
	}
	*bps = v;
	return 0;
}

static int limits_from_env(struct pbox_probe_limits *lim)
{
	const char *r = getenv("PBOX_PROBE_MAX_RATE"), *b = getenv("PBOX_PROBE_MAX_BUDGET_S");
	char *end;

	lim->max_cap_bps = WPROBE_DEFAULT_RATE_BPS;
	lim->max_budget_ns = (int64_t)WPROBE_DEFAULT_BUDGET_S * 1000000000LL;
	if (r != NULL && parse_rate(r, &lim->max_cap_bps) != 0) {
		PBOX_LOG_ERR(CLIENT,
			     "PBOX_PROBE_MAX_RATE '%s': expected a rate from 1mbit to "
			     "1000gbit (e.g. \"200mbit\")",
			     r);
		return -EINVAL;
	}
	if (b != NULL) {
		long v = strtol(b, &end, 10);

		if (end == b || *end != '\0' || v < 1 || v > 60) {
			PBOX_LOG_ERR(CLIENT, "PBOX_PROBE_MAX_BUDGET_S '%s': expected 1..60", b);
			return -EINVAL;
		}
		lim->max_budget_ns = v * 1000000000LL;
	}
	return 0;
}

/* "[ADDR]:PORT" (ADDR empty or 0.0.0.0: def_addr when given; PORT 0: any) into *sin. */
static int parse_spec(const char *spec, const char *def_addr, struct sockaddr_in *sin)
{
	char host[INET_ADDRSTRLEN];
	uint16_t port;

	memset(sin, 0, sizeof(*sin));
	sin->sin_family = AF_INET;
	if (pbox_hostport_split(spec, true, 0, host, sizeof(host), &port) != 0) {
		return -EINVAL;
	}
	sin->sin_port = htons(port);
	if (host[0] != '\0' && inet_pton(AF_INET, host, &sin->sin_addr) != 1) {
		return -EINVAL;
	}
	if (sin->sin_addr.s_addr == htonl(INADDR_ANY) && def_addr != NULL && def_addr[0] != '\0' &&
	    inet_pton(AF_INET, def_addr, &sin->sin_addr) != 1) {
		return -EINVAL;
	}
	return 0;
}

int pbox_wprobe_create(const char *spec, const char *def_addr, int wake_fd,
		       struct pbox_wprobe **out)
{
	struct pbox_wprobe *w;
	struct sockaddr_storage ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
	socklen_t len = sizeof(ss);
	char host[INET_ADDRSTRLEN];
	int rc;

	*out = NULL;
	if (spec == NULL) {
		spec = getenv("PBOX_PROBE");
	}
	if (spec != NULL && strcmp(spec, "off") == 0) {
		return 0;
	}
	w = calloc(1, sizeof(*w));
	if (w == NULL) {
		return -ENOMEM;
	}
	w->rfd = -1;
	w->wake_fd = wake_fd;
	w->realtime = getenv("PBOX_PROBE_REALTIME") != NULL &&
		      strcmp(getenv("PBOX_PROBE_REALTIME"), "1") == 0;
	rc = limits_from_env(&w->lim);
	if (rc != 0) {
		goto fail;
	}
	rc = parse_spec(spec != NULL ? spec : ":0", def_addr, sin);
	if (rc != 0) {
		PBOX_LOG_ERR(CLIENT,
			     "probe agent '%s': expected off or a numeric IPv4 ADDR:PORT "
			     "(ADDR and PORT may be empty or 0: %s, any free port)",
			     spec, def_addr && def_addr[0] ? def_addr : "any address");
		goto fail;
	}
	len = sizeof(*sin);
	w->resp = pbox_probe_responder_create(NULL);
	if (w->resp == NULL) {
		rc = -ENOMEM;
		goto fail;
	}
	w->rfd = pbox_probe_listen((struct sockaddr *)&ss, len);
	if (w->rfd < 0) {
		rc = w->rfd;
		w->rfd = -1;
		goto fail;
	}
	len = sizeof(ss);
	if (getsockname(w->rfd, (struct sockaddr *)&ss, &len) != 0) {
		rc = -errno;
		goto fail;
	}
	inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
	snprintf(w->addr, sizeof(w->addr), "%s:%u", host, (unsigned)ntohs(sin->sin_port));
	rc = pthread_create(&w->rthread, NULL, responder_main, w);
	if (rc != 0) {
		rc = -rc;
		PBOX_LOG_ERR(CLIENT, "probe agent: responder thread: %s", strerror(-rc));
		goto fail;
	}
	w->rthread_started = true;
	PBOX_LOG_DEBUG(CLIENT, "probe agent: responder on UDP %s; probes up to %.0f Mbit/s, %lld s",
		       w->addr, w->lim.max_cap_bps / 1e6,
		       (long long)(w->lim.max_budget_ns / 1000000000LL));
	*out = w;
	return 0;
fail:
	pbox_wprobe_destroy(w);
	return rc;
}

const char *pbox_wprobe_addr(const struct pbox_wprobe *w)
{
	return w->addr;
}

static json_t *refusal(uint64_t id, int err, const char *msg)
{
	return json_pack("{s:s, s:I, s:i, s:s}", "op", "probe_result", "id", (json_int_t)id,
			 "errno", err, "error", msg);
}

static void *probe_main(void *arg)
{
	struct wjob *j = arg;
	int rc = pbox_probe_run(&j->req, &j->res);
	struct pbox_wprobe *w;
	uint64_t one = 1;

	/* The agent may be gone (pbox_close during the probe): then the job is ours. */
	pthread_mutex_lock(&g_mu);
	w = j->w;
	if (w == NULL) {
		pthread_mutex_unlock(&g_mu);
		free(j);
		return NULL;
	}
	j->rc = rc;
	j->done = true;
	if (write(w->wake_fd, &one, sizeof(one)) < 0) {
		/* the progress thread also polls on its timer */
	}
	pthread_mutex_unlock(&g_mu);
	return NULL;
}

json_t *pbox_wprobe_start(struct pbox_wprobe *w, const json_t *event)
{
	const json_t *rq;
	uint64_t id;
	char err[256];
	struct wjob *j;
	int rc;

	if (pbox_ctl_probe_event_decode(event, &id, &rq, err, sizeof(err)) != 0) {
		json_int_t v = json_integer_value(json_object_get(event, "id"));

		PBOX_LOG_WARN(CLIENT, "probe agent %s: a malformed probe event: %s", w->addr, err);
		return v >= 1 && v <= (1LL << 53) ? refusal((uint64_t)v, EINVAL, err) : NULL;
	}
	j = calloc(1, sizeof(*j));
	if (j == NULL) {
		return refusal(id, ENOMEM, "probe agent: out of memory");
	}
	rc = pbox_probe_request_from_json(rq, &w->lim, &j->req, err, sizeof(err));
	if (rc != 0) {
		PBOX_LOG_WARN(CLIENT, "probe agent %s: probe %llu refused: %s", w->addr,
			      (unsigned long long)id, err);
		free(j);
		return refusal(id, -rc, err);
	}
	/* SCHED_FIFO pacing (CAP_SYS_NICE) when the worker's owner allows it: a training
	 * process keeps its cores busy, and a preempted stream is discarded. */
	j->req.realtime = w->realtime;
	snprintf(j->peer, sizeof(j->peer), "%s",
		 json_string_value(json_object_get(rq, "peer")) ?: "");
	j->id = id;
	j->w = w;
	pthread_mutex_lock(&g_mu);
	if (w->job != NULL) {
		pthread_mutex_unlock(&g_mu);
		free(j);
		return refusal(id, EBUSY, "probe agent: a probe is running (one at a time)");
	}
	rc = pthread_create(&j->thread, NULL, probe_main, j);
	if (rc != 0) {
		pthread_mutex_unlock(&g_mu);
		free(j);
		return refusal(id, rc, "probe agent: cannot start the probe thread");
	}
	w->job = j;
	pthread_mutex_unlock(&g_mu);
	PBOX_LOG_INFO(CLIENT, "probe agent %s: probe %llu towards %s (cap %.0f Mbit/s)", w->addr,
		      (unsigned long long)id, j->peer, j->req.cap_bps / 1e6);
	return NULL;
}

json_t *pbox_wprobe_poll(struct pbox_wprobe *w)
{
	struct wjob *j;
	json_t *ans;

	pthread_mutex_lock(&g_mu);
	j = w->job;
	if (j == NULL || !j->done) {
		pthread_mutex_unlock(&g_mu);
		return NULL;
	}
	w->job = NULL;
	pthread_mutex_unlock(&g_mu);
	pthread_join(j->thread, NULL);
	if (j->rc == 0) {
		ans = json_pack("{s:s, s:I, s:o}", "op", "probe_result", "id", (json_int_t)j->id,
				"result", pbox_probe_result_to_json(&j->res, j->peer));
		PBOX_LOG_INFO(CLIENT, "probe agent %s: probe %llu towards %s: %.1f..%.1f Mbit/s",
			      w->addr, (unsigned long long)j->id, j->peer, j->res.r_min_bps / 1e6,
			      j->res.r_max_bps / 1e6);
	} else {
		char msg[160];

		snprintf(msg, sizeof(msg), "probe towards %s failed: %s", j->peer,
			 strerror(-j->rc));
		ans = refusal(j->id, -j->rc, msg);
		PBOX_LOG_WARN(CLIENT, "probe agent %s: %s", w->addr, msg);
	}
	free(j);
	return ans;
}

/* The responder checks its stop flag every 200 ms, or when a datagram arrives: send it
 * one (not a probe message: dropped as not ours) so that pbox_close does not wait. */
static void wake_responder(const struct pbox_wprobe *w)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	int fd;

	if (getsockname(w->rfd, (struct sockaddr *)&sin, &len) != 0) {
		return;
	}
	if (sin.sin_addr.s_addr == htonl(INADDR_ANY)) {
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	}
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0) {
		if (sendto(fd, "x", 1, MSG_DONTWAIT, (struct sockaddr *)&sin, len) < 0) {
			/* it stops on its poll timeout */
		}
		close(fd);
	}
}

void pbox_wprobe_destroy(struct pbox_wprobe *w)
{
	if (w == NULL) {
		return;
	}
	w->stop = 1;
	if (w->rthread_started) {
		wake_responder(w);
		pthread_join(w->rthread, NULL);
	}
	pthread_mutex_lock(&g_mu);
	if (w->job != NULL) {
		if (w->job->done) {
			pthread_join(w->job->thread, NULL);
			free(w->job);
		} else {
			/* Running: it ends within its budget and frees itself. */
			pthread_detach(w->job->thread);
			w->job->w = NULL;
		}
		w->job = NULL;
	}
	pthread_mutex_unlock(&g_mu);
	if (w->rfd >= 0) {
		close(w->rfd);
	}
	pbox_probe_responder_destroy(w->resp);
	free(w);
}
