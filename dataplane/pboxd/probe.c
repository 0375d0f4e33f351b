/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's probe agent: see probe.h. */
#include "probe.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "agent.h"
#include "common/log.h"
#include "probe_msg.h"

struct pboxd_probe {
	struct pbox_probe_limits lim;
	bool realtime;
	/* responder */
	struct pbox_probe_responder *resp;
	int rfd;
	pthread_t rthread;
	bool rthread_started;
	volatile sig_atomic_t stop;
	/* the one probe at a time */
	int efd;
	pthread_t pthread;
	bool running;  /* a probe thread exists (until polled and joined) */
	void *owner;   /* its waiter (NULL: forgotten) */
	char peer[80]; /* as requested */
	struct pbox_probe_request req;
	struct pbox_probe_result res;
	int rc;
	/* counters (control thread) */
	uint64_t started, done, failed, refused_busy, refused_limits, refused_bad;
	uint64_t answers_dropped;
};

static void *responder_main(void *arg)
{
	struct pboxd_probe *p = arg;
	int rc = pbox_probe_responder_serve(p->resp, p->rfd, &p->stop);

	if (rc != 0) {
		PBOX_LOG_ERR(ADMIN, "probe responder stopped: %s", strerror(-rc));
	}
	return NULL;
}

int pboxd_probe_create(const struct pboxd_config *cfg, struct pboxd_probe **out)
{
	const struct pboxd_probe_cfg *pc = &cfg->probe;
	struct pboxd_probe *p;
	struct sockaddr_storage ss;
	socklen_t len;
	char where[96];
	int rc;

	*out = NULL;
	if (!pc->enabled) {
		return 0;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL) {
		return -ENOMEM;
	}
	p->rfd = p->efd = -1;
	p->lim.max_cap_bps = pc->max_rate_bps;
	p->realtime = pc->realtime;
	p->lim.max_budget_ns = (int64_t)pc->max_budget_s * 1000000000LL;
	snprintf(where, sizeof(where), "%s:%u", pc->address[0] ? pc->address : "",
		 (unsigned)pc->port);
	rc = pbox_probe_parse_numeric_addr(where, pc->port, &ss, &len);
	if (rc != 0) {
		PBOX_LOG_ERR(ADMIN, "probe.address '%s': not a numeric address", pc->address);
		goto fail;
	}
	p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (p->efd < 0) {
		rc = -errno;
		PBOX_LOG_ERR(ADMIN, "probe agent: eventfd: %s", strerror(errno));
		goto fail;
	}
	p->resp = pbox_probe_responder_create(NULL);
	if (p->resp == NULL) {
		rc = -ENOMEM;
		goto fail;
	}
	p->rfd = pbox_probe_listen((struct sockaddr *)&ss, len);
	if (p->rfd < 0) {
		rc = p->rfd;
		p->rfd = -1;
		PBOX_LOG_ERR(ADMIN, "probe responder: cannot listen on %s: %s", where,
			     strerror(-rc));
		goto fail;
	}
	rc = pthread_create(&p->rthread, NULL, responder_main, p);
	if (rc != 0) {
		rc = -rc;
		PBOX_LOG_ERR(ADMIN, "probe responder thread: %s", strerror(-rc));
		goto fail;
	}
	p->rthread_started = true;
	PBOX_LOG_INFO(ADMIN, "probe agent: responder on UDP %s; probes up to %.0f Mbit/s, %u s",
		      where, pc->max_rate_bps / 1e6, pc->max_budget_s);
	*out = p;
	return 0;
fail:
	pboxd_probe_destroy(p);
	return rc;
}

void pboxd_probe_destroy(struct pboxd_probe *p)
{
	if (p == NULL) {
		return;
	}
	p->stop = 1;
	if (p->rthread_started) {
		pthread_join(p->rthread, NULL);
	}
	if (p->running) {
		pthread_join(p->pthread, NULL);
	}
	if (p->rfd >= 0) {
		close(p->rfd);
	}
	if (p->efd >= 0) {
		close(p->efd);
	}
	pbox_probe_responder_destroy(p->resp);
	free(p);
}

static void *probe_main(void *arg)
{
	struct pboxd_probe *p = arg;
	uint64_t one = 1;

	p->rc = pbox_probe_run(&p->req, &p->res);
	if (write(p->efd, &one, sizeof(one)) != sizeof(one)) {
		PBOX_LOG_ERR(ADMIN, "probe of %s: cannot signal its end: %s", p->peer,
			     strerror(errno));
	}
	return NULL;
}

int pboxd_probe_start(struct pboxd_probe *p, const json_t *j, void *owner, char *err, size_t errlen)
{
	struct pbox_probe_request req;
	const char *peer;
	int rc;

	if (p == NULL) {
		snprintf(err, errlen,
			 "probe: this pboxd is not a probe agent (no probe = { ... } "
			 "group in its configuration)");
		return -ENOTSUP;
	}
	if (!json_is_object(j)) {
		p->refused_bad++;
		snprintf(err, errlen, "probe: \"request\" must be an object");
		return -EINVAL;
	}
	rc = pbox_probe_request_from_json(j, &p->lim, &req, err, errlen);
	if (rc == -EPERM) {
		p->refused_limits++;
		snprintf(err, errlen,
			 "probe: cap or budget above this agent's limits (%.0f bit/s, %lld ms)",
			 p->lim.max_cap_bps, (long long)(p->lim.max_budget_ns / 1000000));
		return rc;
	}
	if (rc != 0) {
		p->refused_bad++;
		return rc;
	}
	if (p->running) {
		p->refused_busy++;
		snprintf(err, errlen, "probe: a probe of %s is running; one at a time", p->peer);
		return -EBUSY;
	}
	peer = json_string_value(json_object_get(j, "peer"));
	snprintf(p->peer, sizeof(p->peer), "%s", peer ? peer : "?");
	p->req = req;
	p->req.realtime = p->realtime;
	memset(&p->res, 0, sizeof(p->res));
	p->owner = owner;
	rc = pthread_create(&p->pthread, NULL, probe_main, p);
	if (rc != 0) {
		snprintf(err, errlen, "probe: cannot start its thread: %s", strerror(rc));
		PBOX_LOG_ERR(ADMIN, "probe of %s: thread: %s", p->peer, strerror(rc));
		return -rc;
	}
	p->running = true;
	p->started++;
	PBOX_LOG_INFO(ADMIN, "probe of %s started (cap %.0f Mbit/s, budget %lld ms)", p->peer,
		      req.cap_bps / 1e6, (long long)(req.budget_ns / 1000000));
	return 0;
}

int pboxd_probe_fd(const struct pboxd_probe *p)
{
	return p ? p->efd : -1;
}

json_t *pboxd_probe_poll(struct pboxd_probe *p, void **owner)
{
	uint64_t v;
	json_t *ans;

	*owner = NULL;
	if (p == NULL || !p->running || read(p->efd, &v, sizeof(v)) != sizeof(v)) {
		return NULL;
	}
	pthread_join(p->pthread, NULL);
	p->running = false;
	if (p->rc == 0) {
		json_t *r = pbox_probe_result_to_json(&p->res, p->peer);

		p->done++;
		PBOX_LOG_INFO(ADMIN, "probe of %s: %.1f..%.1f Mbit/s in %.1f s", p->peer,
			      p->res.r_min_bps / 1e6, p->res.r_max_bps / 1e6,
			      (double)p->res.duration_ns / 1e9);
		ans = r ? json_pack("{s:b, s:o}", "ok", 1, "result", r) : NULL;
	} else {
		p->failed++;
		ans = json_pack("{s:b, s:i, s:s+}", "ok", 0, "errno", -p->rc, "error",
				"probe failed: ", strerror(-p->rc));
	}
	if (p->owner == NULL) {
		p->answers_dropped++;
	}
	*owner = p->owner;
	p->owner = NULL;
	return ans;
}

void pboxd_probe_forget(struct pboxd_probe *p, const void *owner)
{
	if (p != NULL && p->running && p->owner == owner) {
		p->owner = NULL;
	}
}

json_t *pboxd_probe_stats(const struct pboxd_probe *p)
{
	/* The responder's own counters belong to its thread (agent.h): not read here. */
	if (p == NULL) {
		return NULL;
	}
	return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "running", p->running,
			 "probes_run", (json_int_t)p->started, "probes_done", (json_int_t)p->done,
			 "probes_failed", (json_int_t)p->failed, "refused_busy",
			 (json_int_t)p->refused_busy, "refused_limits",
			 (json_int_t)p->refused_limits, "refused_bad", (json_int_t)p->refused_bad,
			 "answers_dropped", (json_int_t)p->answers_dropped);
}
