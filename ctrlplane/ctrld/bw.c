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
/* Slowdown re-probes (ctrld_bw_job): a job whose iterations/s over at least
 * CTRLD_BW_SLOW_WINDOW_S fall below CTRLD_BW_SLOW_FRACTION of its best recent rate has its
 * pairs probed again, at most every CTRLD_BW_SLOW_GAP_S; the best rate decays by
 * CTRLD_BW_BEST_DECAY per measurement. */
#define CTRLD_BW_SLOW_WINDOW_S 1.0
#define CTRLD_BW_SLOW_FRACTION 0.5
#define CTRLD_BW_SLOW_GAP_S    15
#define CTRLD_BW_BEST_DECAY    0.95
/* A job's pair whose new estimate is below this fraction of its last one makes the
 * job's pairs sharing an endpoint with it urgent (probed before anything else). */
#define CTRLD_BW_DROP 0.7

enum pair_state { PAIR_PENDING, PAIR_PROBING, PAIR_OK, PAIR_FAILED };

static const char *const g_state_names[] = { "pending", "probing", "ok", "failed" };

/* A pair: configured (bandwidth.pairs / all_to), or a job's (ctrld_bw_job: pboxd ->
 * worker, worker -> pboxd and worker -> worker along the job's tree; a worker's probes
 * are asked for through its pboxd, "via" the job and rank). */
struct pair {
	char from[80]; /* the pboxd's name, or the probing worker's responder address */
	char to[80];
	uint32_t from_idx; /* the pboxd asked */
	bool via;          /* a worker probes: via_job / via_rank on that pboxd */
	uint32_t via_job, via_rank;
	bool dynamic;   /* a job's pair */
	bool to_worker; /* `to` is a worker's responder (else the appliance's) */
	uint32_t job;
	bool mark; /* named in the current sweep (ctrld_bw_jobs_begin .. end) */
	bool dead; /* dropped while its probe runs: freed when it ends */
	enum pair_state state;
	bool queued;         /* asked for on demand */
	bool urgent;         /* a pair of the same job sharing an endpoint lost bandwidth */
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
	struct pair **pairs; /* owned; static ones first */
	uint32_t npairs, cap;
	struct job_rate *rates; /* progress of the jobs with pairs (slowdown re-probes) */
	uint32_t nrates;
};

/* A job's progress (its pboxd's version_max) as the sweeps see it. */
struct job_rate {
	uint32_t job;
	int64_t last_ns;
	int64_t last_version;
	double best;        /* iterations/s: the fastest recent rate (decays) */
	int64_t reprobe_ns; /* last slowdown re-probe */
	bool mark;
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

/* A new zeroed pair at the end of b->pairs (lock held, or before the thread runs). */
static struct pair *add_pair(struct ctrld_bw *b)
{
	struct pair *p;

	if (b->npairs == b->cap) {
		uint32_t ncap = b->cap ? b->cap * 2 : 16;
		struct pair **np = realloc(b->pairs, ncap * sizeof(*np));

		if (np == NULL) {
			return NULL;
		}
		b->pairs = np;
		b->cap = ncap;
	}
	p = calloc(1, sizeof(*p));
	if (p != NULL) {
		b->pairs[b->npairs++] = p;
	}
	return p;
}

static void free_pairs(struct ctrld_bw *b)
{
	for (uint32_t i = 0; i < b->npairs; i++) {
		free(b->pairs[i]);
	}
	free(b->pairs);
	free(b->rates);
	b->pairs = NULL;
	b->npairs = b->cap = 0;
}

static double mid_bps(const struct pbox_probe_result *r)
{
	return (r->r_min_bps + r->r_max_bps) / 2;
}

/* p and q have a worker endpoint in common (every job pair has the appliance at one end
 * or none: sharing it says nothing). */
static bool shares_worker(const struct pair *p, const struct pair *q)
{
	const char *pe[2] = { p->via ? p->from : NULL, p->to_worker ? p->to : NULL };
	const char *qe[2] = { q->via ? q->from : NULL, q->to_worker ? q->to : NULL };

	for (unsigned i = 0; i < 2; i++) {
		for (unsigned k = 0; k < 2; k++) {
			if (pe[i] != NULL && qe[k] != NULL && strcmp(pe[i], qe[k]) == 0) {
				return true;
			}
		}
	}
	return false;
}

/* p's estimate fell: the job's pairs that share a worker with p likely cross the same
 * slower link; probe them next. Lock held. */
static void urge_neighbours(struct ctrld_bw *b, const struct pair *p)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < b->npairs; i++) {
		struct pair *q = b->pairs[i];

		if (q != p && q->dynamic && q->job == p->job && shares_worker(p, q)) {
			q->urgent = true;
			n++;
		}
	}
	PBOX_LOG_INFO(ADMIN,
		      "bandwidth %s -> %s fell below %.0f%% of its last estimate: probing the %u "
		      "pair(s) of job %u that share a worker with it first",
		      p->from, p->to, CTRLD_BW_DROP * 100, n, p->job);
}

/* One probe of pair p (the lock not held): fills *res or err. */
static int probe_pair(struct ctrld_bw *b, const struct pair *pc, struct pbox_probe_result *res,
		      char *err, size_t errlen)
{
	const struct ctrld_bw_cfg *bc = &b->cfg->bw;
	const struct ctrld_pboxd *p = &b->cfg->pboxds[pc->from_idx];
	json_t *req, *reply = NULL;
	char cerr[320];
	int rc;

	req = json_pack("{s:s, s:{s:s, s:f, s:I}}", "op", "probe", "request", "peer", pc->to,
			"cap_bps", bc->cap_bps, "budget_ms", (json_int_t)bc->budget_s * 1000);
	if (req != NULL && pc->via) {
		json_object_set_new(req, "via",
				    json_pack("{s:I, s:I}", "job", (json_int_t)pc->via_job, "rank",
					      (json_int_t)pc->via_rank));
	}
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
		snprintf(err, errlen, "pboxd %s%s: %s", p->name, pc->via ? " (via a worker)" : "",
			 cerr);
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
		struct pair *p = b->pairs[i];

		if (p->urgent) {
			return p;
		}
		if (p->queued && (best == NULL || !best->queued)) {
			best = p;
			continue;
		}
		if (best != NULL && best->queued) {
			continue;
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
		struct pair *p = next_pair(b, now, &wake), copy;
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
		p->queued = p->urgent = false;
		p->state = PAIR_PROBING;
		copy = *p; /* p may be dropped (ctrld_bw_jobs_end) while the lock is not held */
		pthread_mutex_unlock(&b->mu);
		memset(&res, 0, sizeof(res));
		err[0] = '\0';
		rc = probe_pair(b, &copy, &res, err, sizeof(err));
		pthread_mutex_lock(&b->mu);
		if (p->dead) {
			free(p);
			continue;
		}
		p->probes++;
		if (rc == 0) {
			if (p->dynamic && p->have &&
			    mid_bps(&res) < CTRLD_BW_DROP * mid_bps(&p->res)) {
				urge_neighbours(b, p);
			}
			p->res = res;
			p->have = true;
			p->state = PAIR_OK;
			p->last_error[0] = '\0';
			PBOX_LOG_INFO(ADMIN, "bandwidth %s -> %s: %.1f..%.1f Mbit/s (%.1f s)",
				      p->from, p->to, res.r_min_bps / 1e6, res.r_max_bps / 1e6,
				      (double)res.duration_ns / 1e9);
		} else {
			p->failures++;
			p->state = PAIR_FAILED;
			snprintf(p->last_error, sizeof(p->last_error), "%s", err);
			PBOX_LOG_WARN(ADMIN, "bandwidth %s -> %s: probe failed: %s", p->from, p->to,
				      err);
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
	if (cfg->bw.npairs == 0 && !cfg->bw.jobs) {
		return 0;
	}
	b = calloc(1, sizeof(*b));
	if (b == NULL) {
		PBOX_LOG_ERR(ADMIN, "bandwidth matrix: out of memory");
		return -ENOMEM;
	}
	b->cfg = cfg;
	for (uint32_t i = 0; i < cfg->bw.npairs; i++) {
		struct pair *p = add_pair(b);

		if (p == NULL) {
			free_pairs(b);
			free(b);
			PBOX_LOG_ERR(ADMIN, "bandwidth matrix: out of memory");
			return -ENOMEM;
		}
		snprintf(p->from, sizeof(p->from), "%s", cfg->bw.pairs[i].from);
		snprintf(p->to, sizeof(p->to), "%s", cfg->bw.pairs[i].to);
		p->from_idx = cfg->bw.pairs[i].from_idx;
		p->next_due_ns = cfg->bw.interval_s ? 0 : INT64_MAX;
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
		free_pairs(b);
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
	free_pairs(b);
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
		const struct pair *p = b->pairs[i];
		json_t *e =
			json_pack("{s:s, s:s, s:s, s:I, s:I, s:b}", "from", p->from, "to", p->to,
				  "state", g_state_names[p->state], "probes", (json_int_t)p->probes,
				  "failures", (json_int_t)p->failures, "queued", p->queued);

		if (e == NULL) {
			continue;
		}
		if (p->have) {
			json_object_set_new(e, "estimate",
					    pbox_probe_result_to_json(&p->res, p->to));
			json_object_set_new(e, "age_s",
					    json_real((double)(now - p->res.timestamp_ns) / 1e9));
		}
		if (p->last_error[0] != '\0') {
			json_object_set_new(e, "last_error", json_string(p->last_error));
		}
		if (p->dynamic) {
			json_object_set_new(e, "job", json_integer(p->job));
			if (p->via) {
				json_object_set_new(e, "via_rank", json_integer(p->via_rank));
			}
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
			struct pair *p = b->pairs[i];

			if (strcmp(p->from, from) == 0 && strcmp(p->to, to) == 0) {
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

/* ---- the jobs' pairs ------------------------------------------------------------------ */

void ctrld_bw_jobs_begin(struct ctrld_bw *b)
{
	if (b == NULL) {
		return;
	}
	pthread_mutex_lock(&b->mu);
	for (uint32_t i = 0; i < b->npairs; i++) {
		b->pairs[i]->mark = false;
	}
	for (uint32_t i = 0; i < b->nrates; i++) {
		b->rates[i].mark = false;
	}
	pthread_mutex_unlock(&b->mu);
}

/* Job pair (from -> to) asked of pboxd w (via rank `via`, -1: the pboxd itself). Lock
 * held. */
static void want(struct ctrld_bw *b, uint32_t w, uint32_t job, const char *from, const char *to,
		 int64_t via, bool to_worker)
{
	struct pair *p;

	if (from == NULL || to == NULL || strcmp(from, to) == 0) {
		return;
	}
	for (uint32_t i = 0; i < b->npairs; i++) {
		p = b->pairs[i];
		if (p->dynamic && p->job == job && p->from_idx == w && p->via == (via >= 0) &&
		    (via < 0 || p->via_rank == (uint32_t)via) && strcmp(p->from, from) == 0 &&
		    strcmp(p->to, to) == 0) {
			p->mark = true;
			return;
		}
	}
	p = add_pair(b);
	if (p == NULL) {
		PBOX_LOG_WARN(ADMIN, "bandwidth matrix: out of memory for job %u's pair %s -> %s",
			      job, from, to);
		return;
	}
	snprintf(p->from, sizeof(p->from), "%s", from);
	snprintf(p->to, sizeof(p->to), "%s", to);
	p->from_idx = w;
	p->via = via >= 0;
	p->via_job = job;
	p->via_rank = via >= 0 ? (uint32_t)via : 0;
	p->dynamic = true;
	p->to_worker = to_worker;
	p->job = job;
	p->mark = true;
	p->next_due_ns = 0; /* a new pair is probed as soon as the probes before it end */
	PBOX_LOG_INFO(ADMIN, "bandwidth matrix: job %u needs %s -> %s%s", job, from, to,
		      via >= 0 ? " (asked of that worker through its pboxd)" : "");
}

/* The job's progress (entry's version_max while its session is active): a rate below
 * half the best recent one queues the job's pairs again, at most every
 * CTRLD_BW_SLOW_GAP_S. Lock held. */
static void watch_progress(struct ctrld_bw *b, uint32_t job, const json_t *entry)
{
	const char *st = json_string_value(json_object_get(entry, "state"));
	json_int_t v = json_integer_value(json_object_get(entry, "version_max"));
	int64_t now = mono_ns();
	struct job_rate *r = NULL;
	double rate, dt;

	for (uint32_t i = 0; i < b->nrates && r == NULL; i++) {
		r = b->rates[i].job == job ? &b->rates[i] : NULL;
	}
	if (r == NULL) {
		struct job_rate *nr = realloc(b->rates, (b->nrates + 1) * sizeof(*nr));

		if (nr == NULL) {
			return;
		}
		b->rates = nr;
		r = &b->rates[b->nrates++];
		memset(r, 0, sizeof(*r));
		r->job = job;
	}
	r->mark = true;
	if (st == NULL || strcmp(st, "active") != 0 || v < r->last_version || r->last_ns == 0) {
		r->last_ns = now;
		r->last_version = v;
		r->best = st != NULL && strcmp(st, "active") == 0 ? r->best : 0;
		return;
	}
	dt = (double)(now - r->last_ns) / 1e9;
	if (dt < CTRLD_BW_SLOW_WINDOW_S) {
		return;
	}
	rate = (double)(v - r->last_version) / dt;
	r->last_ns = now;
	r->last_version = v;
	if (r->best > 0 && rate < r->best * CTRLD_BW_SLOW_FRACTION &&
	    now - r->reprobe_ns >= (int64_t)CTRLD_BW_SLOW_GAP_S * 1000000000LL) {
		uint32_t n = 0;

		for (uint32_t i = 0; i < b->npairs; i++) {
			if (b->pairs[i]->dynamic && b->pairs[i]->job == job) {
				b->pairs[i]->queued = true;
				n++;
			}
		}
		r->reprobe_ns = now;
		PBOX_LOG_INFO(ADMIN,
			      "job %u: progress slowed to %.1f iterations/s (best recently %.1f): "
			      "probing its %u pair(s) again",
			      job, rate, r->best, n);
		pthread_cond_signal(&b->cv);
	}
	/* The best rate decays, so a job that settles at a lower speed stops re-probing. */
	r->best = rate > r->best * CTRLD_BW_BEST_DECAY ? rate : r->best * CTRLD_BW_BEST_DECAY;
}

void ctrld_bw_job(struct ctrld_bw *b, uint32_t w, uint32_t job, const json_t *entry,
		  const json_t *plan)
{
	const json_t *agents = json_object_get(entry, "agents"), *a;
	const json_t *parent = json_object_get(json_object_get(plan, "tree"), "parent");
	const char *app = json_string_value(json_object_get(entry, "probe"));
	/* Worker -> worker edges only of a tree built on every rank's measured link: the
	 * first trees (uniform costs) are replaced as soon as those arrive. */
	const char *costs =
		json_string_value(json_object_get(json_object_get(plan, "tree"), "costs"));
	bool tree_measured = costs != NULL && strcmp(costs, "measured+tiers") == 0;
	const char *name;
	size_t i, n = json_array_size(parent);
	const char **addr;

	if (b == NULL || !b->cfg->bw.jobs || w >= b->cfg->npboxds || !json_is_array(agents)) {
		return;
	}
	name = b->cfg->pboxds[w].name;
	n = n > 0 ? n : json_array_size(agents);
	addr = calloc(n + 1, sizeof(*addr));
	if (addr == NULL) {
		return;
	}
	json_array_foreach(agents, i, a)
	{
		json_int_t r = json_integer_value(json_object_get(a, "rank"));

		if (r >= 0 && (size_t)r < n) {
			addr[r] = json_string_value(json_object_get(a, "probe"));
		}
	}
	pthread_mutex_lock(&b->mu);
	for (size_t r = 0; r < n; r++) {
		json_int_t par = json_integer_value(json_array_get(parent, r));

		if (addr[r] == NULL) {
			continue;
		}
		/* Broadcast direction along the tree (the appliance when no tree yet), and the
		 * push direction to the appliance. */
		if (tree_measured && json_is_integer(json_array_get(parent, r)) && par >= 0 &&
		    (size_t)par < n && addr[par] != NULL) {
			want(b, w, job, addr[par], addr[r], par, true);
		}
		want(b, w, job, name, addr[r], -1, true);
		want(b, w, job, addr[r], app, (int64_t)r, false);
	}
	watch_progress(b, job, entry);
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	free(addr);
}

void ctrld_bw_jobs_end(struct ctrld_bw *b)
{
	uint32_t k = 0;

	if (b == NULL) {
		return;
	}
	pthread_mutex_lock(&b->mu);
	for (uint32_t i = 0; i < b->npairs; i++) {
		struct pair *p = b->pairs[i];

		if (!p->dynamic || p->mark) {
			b->pairs[k++] = p;
			continue;
		}
		PBOX_LOG_INFO(ADMIN, "bandwidth matrix: job %u no longer needs %s -> %s", p->job,
			      p->from, p->to);
		if (p->state == PAIR_PROBING) {
			p->dead = true; /* its probe is running: freed by the thread */
		} else {
			free(p);
		}
	}
	b->npairs = k;
	k = 0;
	for (uint32_t i = 0; i < b->nrates; i++) {
		if (b->rates[i].mark) {
			b->rates[k++] = b->rates[i];
		}
	}
	b->nrates = k;
	pthread_mutex_unlock(&b->mu);
}
