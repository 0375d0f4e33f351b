/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld's bandwidth matrix: see bw.h. */
#include "bw.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/ctlclient.h"
#include "common/log.h"
#include "probe_msg.h"

/* How long stopping waits for a running probe. */
#define CTRLD_BW_STOP_WAIT_S 3

enum pair_state { PAIR_PENDING, PAIR_PROBING, PAIR_OK, PAIR_FAILED };

static const char *const g_state_names[] = { "pending", "probing", "ok", "failed" };

struct pair {
	const struct ctrld_bw_pair *cfg;
	enum pair_state state;
	bool queued;         /* asked for on demand */
	int64_t next_due_ns; /* CLOCK_MONOTONIC; INT64_MAX: on demand only */
	bool have;           /* res is a good estimate */
	struct pbox_probe_result res;
	uint64_t probes, failures;
	char last_error[256];
};

struct ctrld_bw {
	const struct ctrld_config *cfg;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* on CLOCK_MONOTONIC */
	pthread_t thread;
	bool stop;
	struct pair *pairs;
	uint32_t npairs;
};

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t real_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One probe of pair p (the lock not held): fills *res or err. */
static int probe_pair(struct ctrld_bw *b, const struct ctrld_bw_pair *pc,
		      struct pbox_probe_result *res, char *err, size_t errlen)
{
	const struct ctrld_bw_cfg *bc = &b->cfg->bw;
	const struct ctrld_pboxd *p = &b->cfg->pboxds[pc->from_idx];
	json_t *req, *reply = NULL;
	char cerr[320];
	int rc;

	req = json_pack("{s:s, s:{s:s, s:f, s:I}}", "op", "probe", "request", "peer", pc->to,
			"cap_bps", bc->cap_bps, "budget_ms", (json_int_t)bc->budget_s * 1000);
	if (req == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* The probe lasts up to its budget, plus the agent's report timeouts. */
	rc = pbox_ctl_request(p->control, p->admin_token, req, &reply,
			      (int)(bc->budget_s * 1000 + b->cfg->request_timeout_ms + 2000), cerr,
			      sizeof(cerr));
	json_decref(req);
	if (rc != 0) {
		snprintf(err, errlen, "pboxd %s: %s", p->name, cerr);
		return rc;
	}
	if (!json_is_true(json_object_get(reply, "ok"))) {
		const char *e = json_string_value(json_object_get(reply, "error"));

		rc = -(int)json_integer_value(json_object_get(reply, "errno"));
		snprintf(err, errlen, "pboxd %s: %s", p->name, e ? e : "refused");
		json_decref(reply);
		return rc < 0 ? rc : -EIO;
	}
	rc = pbox_probe_result_from_json(json_object_get(reply, "result"), res, cerr, sizeof(cerr));
	if (rc != 0) {
		snprintf(err, errlen, "pboxd %s: a malformed result: %s", p->name, cerr);
	}
	json_decref(reply);
	return rc;
}

/* The pair to probe now (queued first, then the most overdue), or NULL with *wake_ns the
 * next due time (INT64_MAX: none). Lock held. */
static struct pair *next_pair(struct ctrld_bw *b, int64_t now, int64_t *wake_ns)
{
	struct pair *best = NULL;

	*wake_ns = INT64_MAX;
	for (uint32_t i = 0; i < b->npairs; i++) {
		struct pair *p = &b->pairs[i];

		if (p->queued) {
			return p;
		}
		if (p->next_due_ns <= now && (best == NULL || p->next_due_ns < best->next_due_ns)) {
			best = p;
		}
		if (p->next_due_ns < *wake_ns) {
			*wake_ns = p->next_due_ns;
		}
	}
	return best;
}

static void *bw_main(void *arg)
{
	struct ctrld_bw *b = arg;
	const struct ctrld_bw_cfg *bc = &b->cfg->bw;

	pthread_mutex_lock(&b->mu);
	while (!b->stop) {
		int64_t wake, now = mono_ns();
		struct pair *p = next_pair(b, now, &wake);
		struct pbox_probe_result res;
		char err[512];
		int rc;

		if (p == NULL) {
			if (wake == INT64_MAX) {
				pthread_cond_wait(&b->cv, &b->mu);
			} else {
				struct timespec ts = { .tv_sec = wake / 1000000000LL,
						       .tv_nsec = wake % 1000000000LL };

				pthread_cond_timedwait(&b->cv, &b->mu, &ts);
			}
			continue;
		}
		p->queued = false;
		p->state = PAIR_PROBING;
		pthread_mutex_unlock(&b->mu);
		memset(&res, 0, sizeof(res));
		err[0] = '\0';
		rc = probe_pair(b, p->cfg, &res, err, sizeof(err));
		pthread_mutex_lock(&b->mu);
		p->probes++;
		if (rc == 0) {
			p->res = res;
			p->have = true;
			p->state = PAIR_OK;
			p->last_error[0] = '\0';
			PBOX_LOG_INFO(ADMIN, "bandwidth %s -> %s: %.1f..%.1f Mbit/s (%.1f s)",
				      p->cfg->from, p->cfg->to, res.r_min_bps / 1e6,
				      res.r_max_bps / 1e6, (double)res.duration_ns / 1e9);
		} else {
			p->failures++;
			p->state = PAIR_FAILED;
			snprintf(p->last_error, sizeof(p->last_error), "%s", err);
			PBOX_LOG_WARN(ADMIN, "bandwidth %s -> %s: probe failed: %s", p->cfg->from,
				      p->cfg->to, err);
		}
		p->next_due_ns = bc->interval_s ? mono_ns() + (int64_t)bc->interval_s * 1000000000LL
						: INT64_MAX;
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

int ctrld_bw_start(const struct ctrld_config *cfg, struct ctrld_bw **out)
{
	struct ctrld_bw *b;
	pthread_condattr_t ca;
	sigset_t all, old;
	int rc;

	*out = NULL;
	if (cfg->bw.npairs == 0) {
		return 0;
	}
	b = calloc(1, sizeof(*b));
	if (b == NULL || (b->pairs = calloc(cfg->bw.npairs, sizeof(*b->pairs))) == NULL) {
		free(b);
		PBOX_LOG_ERR(ADMIN, "bandwidth matrix: out of memory");
		return -ENOMEM;
	}
	b->cfg = cfg;
	b->npairs = cfg->bw.npairs;
	for (uint32_t i = 0; i < b->npairs; i++) {
		b->pairs[i].cfg = &cfg->bw.pairs[i];
		b->pairs[i].next_due_ns = cfg->bw.interval_s ? 0 : INT64_MAX;
	}
	pthread_mutex_init(&b->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->cv, &ca);
	pthread_condattr_destroy(&ca);
	/* Signals stay with the main thread (its poll loop sees them). */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = pthread_create(&b->thread, NULL, bw_main, b);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		PBOX_LOG_ERR(ADMIN, "bandwidth matrix: thread: %s", strerror(rc));
		pthread_cond_destroy(&b->cv);
		pthread_mutex_destroy(&b->mu);
		free(b->pairs);
		free(b);
		return -rc;
	}
	if (cfg->bw.interval_s) {
		PBOX_LOG_INFO(ADMIN,
			      "bandwidth matrix: %u pair(s), cap %.0f Mbit/s, budget %u s, "
			      "re-probed every %u s",
			      b->npairs, cfg->bw.cap_bps / 1e6, cfg->bw.budget_s,
			      cfg->bw.interval_s);
	} else {
		PBOX_LOG_INFO(ADMIN,
			      "bandwidth matrix: %u pair(s), cap %.0f Mbit/s, budget %u s, probed "
			      "on demand only",
			      b->npairs, cfg->bw.cap_bps / 1e6, cfg->bw.budget_s);
	}
	*out = b;
	return 0;
}

void ctrld_bw_stop(struct ctrld_bw *b)
{
	struct timespec ts;

	if (b == NULL) {
		return;
	}
	pthread_mutex_lock(&b->mu);
	b->stop = true;
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += CTRLD_BW_STOP_WAIT_S;
	if (pthread_timedjoin_np(b->thread, NULL, &ts) != 0) {
		/* A probe still runs (up to its budget): the process is exiting, and the
		 * thread still uses b, so it is left to the exit. */
		PBOX_LOG_WARN(ADMIN,
			      "bandwidth matrix: a probe still runs after %d s; not waiting "
			      "for it",
			      CTRLD_BW_STOP_WAIT_S);
		return;
	}
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	free(b->pairs);
	free(b);
}

json_t *ctrld_bw_list(struct ctrld_bw *b)
{
	json_t *arr = json_array(), *o;
	int64_t now = real_ns();

	if (b == NULL) {
		return json_pack("{s:b, s:o}", "ok", 1, "pairs", arr);
	}
	pthread_mutex_lock(&b->mu);
	for (uint32_t i = 0; i < b->npairs; i++) {
		const struct pair *p = &b->pairs[i];
		json_t *e = json_pack("{s:s, s:s, s:s, s:I, s:I, s:b}", "from", p->cfg->from, "to",
				      p->cfg->to, "state", g_state_names[p->state], "probes",
				      (json_int_t)p->probes, "failures", (json_int_t)p->failures,
				      "queued", p->queued);

		if (e == NULL) {
			continue;
		}
		if (p->have) {
			json_object_set_new(e, "estimate",
					    pbox_probe_result_to_json(&p->res, p->cfg->to));
			json_object_set_new(e, "age_s",
					    json_real((double)(now - p->res.timestamp_ns) / 1e9));
		}
		if (p->last_error[0] != '\0') {
			json_object_set_new(e, "last_error", json_string(p->last_error));
		}
		json_array_append_new(arr, e);
	}
	o = json_pack("{s:b, s:I, s:f, s:I, s:o}", "ok", 1, "interval_s",
		      (json_int_t)b->cfg->bw.interval_s, "cap_bps", b->cfg->bw.cap_bps, "budget_ms",
		      (json_int_t)b->cfg->bw.budget_s * 1000, "pairs", arr);
	pthread_mutex_unlock(&b->mu);
	return o;
}

int ctrld_bw_probe(struct ctrld_bw *b, const char *from, const char *to, uint64_t *done_at,
		   char *err, size_t errlen)
{
	if (b != NULL) {
		pthread_mutex_lock(&b->mu);
		for (uint32_t i = 0; i < b->npairs; i++) {
			struct pair *p = &b->pairs[i];

			if (strcmp(p->cfg->from, from) == 0 && strcmp(p->cfg->to, to) == 0) {
				p->queued = true;
				/* The probe running now (if any) counts first. */
				*done_at = p->probes + (p->state == PAIR_PROBING ? 2 : 1);
				pthread_cond_signal(&b->cv);
				pthread_mutex_unlock(&b->mu);
				return 0;
			}
		}
		pthread_mutex_unlock(&b->mu);
	}
	snprintf(err, errlen,
		 "no probe pair %s -> %s (pairs are configured in pbox-ctrld's bandwidth = { "
		 "pairs = ( { from = PBOXD; to = \"ADDR:PORT\"; } ); } group)",
		 from, to);
	return -ENOENT;
}
