/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Broadcast-update jobs on the worker (pbox_update_* in pbox/pbox.h): a replica
 * (replica.h) driven by the client's operations. Aggregates are applied on the calling
 * thread, so the progress thread never runs the optimizer.
 *
 * BSP, and SSP with an exact lag: an iteration pushes every key's update with the pull
 * of the aggregate the blocking rule needs folded in (a push-pull of iteration t asks the
 * appliance for U^(t - s), engine.h), waits for all keys, and applies that aggregate.
 *
 * Opportunistic SSP: every key runs a chain of pulls in one lane while pushes use the
 * other. A pull of U^v is held by the appliance until iteration v is complete; its
 * completion callback (progress thread) at once starts the pull of U^(v+1) if the rank
 * has pushed iteration v + 1, into the next buffer of a ring of s + 2, so each aggregate
 * is received within a round trip of its completion whatever the caller is doing. A step
 * pushes, applies every aggregate that has arrived on all keys, in order, and waits only
 * while clock - version > s.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replica.h"
#include "update.h"

/* One key's pull chain (opportunistic SSP); fields under pbox_update.mu. */
struct chain {
	struct pbox_update *u;
	uint32_t idx;  /* key index in the replica */
	float *ring;   /* nring aggregates of the key */
	uint32_t next; /* the next aggregate to pull */
	uint32_t got;  /* aggregates received: U^0 .. U^(got-1) */
	bool inflight; /* a pull of U^(next-1) is in flight */
};

struct pbox_update {
	struct pbox_client *c;
	struct pbox_replica rep;
	uint32_t *ids; /* key ids, in the caller's order (the replica's key indices) */
	bool exact;    /* lagged push-pulls (BSP, PBOX_UPDATE_EXACT_LAG, credits = 1) */
	/* Opportunistic SSP */
	struct chain *ch;
	uint32_t nring;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t pushes_out; /* keys whose push is in flight */
	uint32_t limit;      /* pull only aggregates below this: the clock (under mu) */
	uint32_t applied;    /* the replica's version, for the callbacks (under mu) */
	int err;             /* first failure of an operation (0: none) */
	char errmsg[512];
};

int pbox_update_parse_optimizer(const json_t *o, const struct pbox_optimizer_ops **opt,
				struct pbox_opt_params *params, char *why, size_t whylen)
{
	static const char *const names[] = { "lr",   "momentum", "wd",    "rescale",
					     "clip", "beta1",    "beta2", "eps" };
	float *fields[] = { &params->lr,   &params->momentum, &params->wd,    &params->rescale,
			    &params->clip, &params->beta1,    &params->beta2, &params->eps };
	const char *name = json_string_value(json_object_get(o, "name"));

	if (!json_is_object(o) || name == NULL) {
		snprintf(why, whylen, "a broadcast job needs 'optimizer' with a 'name'");
		return -EPROTO;
	}
	*opt = pbox_optimizer_find(name);
	if (*opt == NULL) {
		snprintf(why, whylen, "unknown optimizer '%s' (this libpbox has %s)", name,
			 pbox_optimizer_names());
		return -EPROTO;
	}
	pbox_opt_params_default(params);
	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(names); i++) {
		const json_t *v = json_object_get(o, names[i]);
		double d = json_number_value(v);

		if (!json_is_number(v) || !isfinite(d) || fabs(d) > 3.0e38) {
			snprintf(why, whylen, "optimizer '%s': '%s' missing or not a finite float",
				 name, names[i]);
			return -EPROTO;
		}
		*fields[i] = (float)d; /* a float sent as double rounds back exactly */
	}
	return 0;
}

int pbox_update_open(struct pbox_client *c, const struct pbox_key_info *keys, uint32_t nkeys,
		     float *const *models, uint32_t flags, struct pbox_update **out)
{
	const struct pbox_optimizer_ops *opt;
	const struct pbox_jobdesc *d;
	struct pbox_opt_params params;
	struct pbox_job_info info;
	struct pbox_update *u;
	uint64_t *nelem;
	char err[256];
	int rc;

	*out = NULL;
	if (flags & ~PBOX_UPDATE_EXACT_LAG) {
		return pbox_client_error(-EINVAL, "update: unknown flags 0x%x", flags);
	}
	rc = pbox_client_update_cfg(c, &opt, &params, &d);
	if (rc < 0) {
		return rc;
	}
	if (keys == NULL || models == NULL || nkeys != d->nkeys) {
		return pbox_client_error(-EINVAL,
					 "update: give the %u registered keys and a model buffer "
					 "for each (got %u)",
					 d->nkeys, keys != NULL ? nkeys : 0);
	}
	for (uint32_t i = 0; i < nkeys; i++) {
		int64_t k = pbox_jobdesc_find_key(d, keys[i].id);

		if (k < 0 || d->keys[k].nelem != keys[i].nelem) {
			return pbox_client_error(-EINVAL,
						 "update: key %u (%llu elements) is not a "
						 "registered key of that size",
						 keys[i].id, (unsigned long long)keys[i].nelem);
		}
	}
	pbox_job_info(c, &info);
	if (info.staleness == UINT32_MAX) {
		return pbox_client_error(-EINVAL, "update: job %u has no staleness bound (sync %s)",
					 info.job, info.sync);
	}
	u = calloc(1, sizeof(*u));
	nelem = calloc(nkeys, sizeof(*nelem));
	if (u == NULL || nelem == NULL || (u->ids = calloc(nkeys, sizeof(*u->ids))) == NULL ||
	    (u->ch = calloc(nkeys, sizeof(*u->ch))) == NULL) {
		free(nelem);
		if (u != NULL) {
			free(u->ids);
		}
		free(u);
		return pbox_client_error(-ENOMEM, "update: out of memory");
	}
	for (uint32_t i = 0; i < nkeys; i++) {
		u->ids[i] = keys[i].id;
		nelem[i] = keys[i].nelem;
	}
	u->c = c;
	u->exact = info.staleness == 0 || info.credits < 2 || (flags & PBOX_UPDATE_EXACT_LAG);
	u->nring = u->exact ? 0 : info.staleness + 2;
	pthread_mutex_init(&u->mu, NULL);
	pthread_cond_init(&u->cv, NULL);
	rc = pbox_replica_init(&u->rep, opt, &params, NULL, info.staleness, nkeys, models, nelem,
			       err, sizeof(err));
	for (uint32_t i = 0; rc == 0 && i < nkeys && !u->exact; i++) {
		size_t bytes = PBOX_ALIGN_UP((size_t)u->nring * nelem[i] * sizeof(float), 64);

		u->ch[i] = (struct chain){ .u = u, .idx = i, .ring = aligned_alloc(64, bytes) };
		if (u->ch[i].ring == NULL) {
			snprintf(err, sizeof(err), "out of memory for %u aggregates of key %u",
				 u->nring, keys[i].id);
			rc = -ENOMEM;
		}
	}
	free(nelem);
	if (rc < 0) {
		pbox_update_close(u);
		return pbox_client_error(rc, "update: %s", err);
	}
	*out = u;
	return 0;
}

/* Wait for what was started; the first error (rc, or an operation's) wins. */
static int finish(struct pbox_update *u, int rc)
{
	char msg[512];
	int w;

	snprintf(msg, sizeof(msg), "%s", pbox_last_error());
	w = pbox_wait_all(u->c, -1);
	if (rc < 0) {
		return pbox_client_error(rc, "%s", msg);
	}
	return w;
}

/* BSP / exact lag: the push-pull of t brings U^(t - s). */
static int exact_step(struct pbox_update *u, const float *const *updates)
{
	struct pbox_replica *r = &u->rep;
	uint32_t want = pbox_replica_push_wants(r);
	int rc = 0;

	for (uint32_t i = 0; i < r->nkeys && rc == 0; i++) {
		rc = want == UINT32_MAX
			     ? pbox_push_async(u->c, u->ids[i], r->clock, updates[i], NULL, NULL)
			     : pbox_push_pull_async(u->c, u->ids[i], r->clock, updates[i],
						    r->keys[i].agg, NULL, NULL);
	}
	rc = finish(u, rc);
	if (rc < 0) {
		return rc;
	}
	r->clock++;
	return want == UINT32_MAX ? 0 : pbox_replica_apply(r, want);
}

static int exact_sync(struct pbox_update *u)
{
	struct pbox_replica *r = &u->rep;

	while (r->version < r->clock) {
		int rc = 0;

		for (uint32_t i = 0; i < r->nkeys && rc == 0; i++) {
			rc = pbox_pull_async(u->c, u->ids[i], r->version, r->keys[i].agg, NULL,
					     NULL);
		}
		rc = finish(u, rc);
		if (rc < 0) {
			return rc;
		}
		pbox_replica_apply(r, r->version);
	}
	return 0;
}

/* ---- opportunistic SSP ----------------------------------------------------------------- */

static float *ring_slot(const struct pbox_update *u, const struct chain *k, uint32_t v)
{
	return k->ring + (size_t)(v % u->nring) * u->rep.keys[k->idx].nelem;
}

static void pull_done(uint32_t key, int status, void *arg);

/* Record the first failure (mu held). */
static void note_error(struct pbox_update *u, int err)
{
	if (u->err == 0) {
		u->err = err;
		snprintf(u->errmsg, sizeof(u->errmsg), "%s", pbox_last_error());
	}
}

/* Start the key's next pull if there is one to make and room for it (mu held). Runs on
 * the caller's thread and on the progress thread (from pull_done). */
static void chain_kick(struct pbox_update *u, struct chain *k)
{
	int rc;

	if (k->inflight || u->err != 0 || k->next >= u->limit || k->next - u->applied >= u->nring) {
		return;
	}
	rc = pbox_pull_async(u->c, u->ids[k->idx], k->next, ring_slot(u, k, k->next), pull_done, k);
	if (rc < 0) {
		note_error(u, rc);
		pthread_cond_broadcast(&u->cv);
		return;
	}
	k->inflight = true;
	k->next++;
}

/* Progress thread: U^(next-1) of a key arrived (or its pull failed). */
static void pull_done(uint32_t key, int status, void *arg)
{
	struct chain *k = arg;
	struct pbox_update *u = k->u;

	(void)key;
	pthread_mutex_lock(&u->mu);
	k->inflight = false;
	if (status < 0) {
		note_error(u, status);
	} else {
		k->got++;
		chain_kick(u, k);
	}
	pthread_cond_broadcast(&u->cv);
	pthread_mutex_unlock(&u->mu);
}

static void push_done(uint32_t key, int status, void *arg)
{
	struct pbox_update *u = arg;

	(void)key;
	pthread_mutex_lock(&u->mu);
	if (status < 0) {
		note_error(u, status);
	}
	u->pushes_out--;
	pthread_cond_broadcast(&u->cv);
	pthread_mutex_unlock(&u->mu);
}

/* Aggregates every key has received (mu held). */
static uint32_t all_got(const struct pbox_update *u)
{
	uint32_t g = UINT32_MAX;

	for (uint32_t i = 0; i < u->rep.nkeys; i++) {
		g = PBOX_MIN(g, u->ch[i].got);
	}
	return g;
}

/*
 * Apply every aggregate all keys have, in order; with block, first wait until there is
 * at least one more than applied. Returns 0 or the first failure.
 */
static int apply_arrived(struct pbox_update *u, bool block)
{
	struct pbox_replica *r = &u->rep;
	uint32_t upto;
	int rc;

	pthread_mutex_lock(&u->mu);
	while (block && u->err == 0 && all_got(u) <= r->version) {
		pthread_cond_wait(&u->cv, &u->mu);
	}
	upto = all_got(u);
	pthread_mutex_unlock(&u->mu);
	/* The slots of [version, upto) are not written meanwhile: pulls in flight are for
	 * later aggregates, at most nring - 1 ahead of the version. */
	for (; r->version < upto; r->version++) {
		for (uint32_t i = 0; i < r->nkeys; i++) {
			pbox_replica_apply_from(r, i, r->version,
						ring_slot(u, &u->ch[i], r->version));
		}
	}
	pthread_mutex_lock(&u->mu);
	u->applied = r->version;
	for (uint32_t i = 0; i < r->nkeys; i++) {
		chain_kick(u, &u->ch[i]); /* room in the ring again */
	}
	rc = u->err != 0 ? pbox_client_error(u->err, "%s", u->errmsg) : 0;
	pthread_mutex_unlock(&u->mu);
	return rc;
}

static int ssp_step(struct pbox_update *u, const float *const *updates)
{
	struct pbox_replica *r = &u->rep;
	int rc;

	pthread_mutex_lock(&u->mu);
	u->pushes_out = r->nkeys;
	for (uint32_t i = 0; i < r->nkeys; i++) {
		rc = pbox_push_async(u->c, u->ids[i], r->clock, updates[i], push_done, u);
		if (rc < 0) {
			u->pushes_out -= r->nkeys - i; /* never started */
			note_error(u, rc);
			break;
		}
	}
	/* NOTIFY-ACK: the updates are the caller's again once acknowledged. */
	while (u->pushes_out != 0) {
		pthread_cond_wait(&u->cv, &u->mu);
	}
	if (u->err == 0) {
		/* Only now may the chain ask for the aggregate of this iteration: a pull the
		 * appliance holds stays in the node's send window until answered, so one that
		 * waited for this rank's own queued push could deadlock it. */
		r->clock++;
		u->limit = r->clock;
		for (uint32_t i = 0; i < r->nkeys; i++) {
			chain_kick(u, &u->ch[i]);
		}
	}
	pthread_mutex_unlock(&u->mu);
	/* Apply what has arrived; wait only while the blocking rule says so. */
	rc = apply_arrived(u, false);
	while (rc == 0 && r->clock - r->version > r->lag) {
		rc = apply_arrived(u, true);
	}
	return rc;
}

static int ssp_sync(struct pbox_update *u)
{
	int rc = 0;

	while (rc == 0 && u->rep.version < u->rep.clock) {
		rc = apply_arrived(u, true);
	}
	return rc;
}

int pbox_update_step(struct pbox_update *u, const float *const *updates)
{
	return u->exact ? exact_step(u, updates) : ssp_step(u, updates);
}

int pbox_update_sync(struct pbox_update *u)
{
	return u->exact ? exact_sync(u) : ssp_sync(u);
}

uint32_t pbox_update_clock(const struct pbox_update *u)
{
	return u->rep.clock;
}

uint32_t pbox_update_version(const struct pbox_update *u)
{
	return u->rep.version;
}

void pbox_update_close(struct pbox_update *u)
{
	if (u == NULL) {
		return;
	}
	/* Callbacks of operations in flight point into u. */
	pthread_mutex_lock(&u->mu);
	for (uint32_t i = 0; u->ch != NULL && i < u->rep.nkeys; i++) {
		while (u->ch[i].inflight) {
			pthread_cond_wait(&u->cv, &u->mu);
		}
	}
	pthread_mutex_unlock(&u->mu);
	pthread_mutex_destroy(&u->mu);
	pthread_cond_destroy(&u->cv);
	for (uint32_t i = 0; u->ch != NULL && i < u->rep.nkeys; i++) {
		free(u->ch[i].ring);
	}
	pbox_replica_fini(&u->rep);
	free(u->ch);
	free(u->ids);
	free(u);
}
