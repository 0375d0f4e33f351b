/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Broadcast-update jobs on the worker (pbox_update_* in pbox/pbox.h): a replica
 * (replica.h) driven by the client's operations. An iteration pushes every key's update
 * with the pull of the aggregate the blocking rule needs folded in (a push-pull of
 * iteration t asks the appliance for U^(t - s), engine.h), waits for all keys, and
 * applies that aggregate on the calling thread, so the progress thread never runs the
 * optimizer.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replica.h"
#include "update.h"

struct pbox_update {
	struct pbox_client *c;
	struct pbox_replica rep;
	uint32_t *ids; /* key ids, in the caller's order (the replica's key indices) */
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
		     float *const *models, struct pbox_update **out)
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
	if (u == NULL || nelem == NULL || (u->ids = calloc(nkeys, sizeof(*u->ids))) == NULL) {
		free(nelem);
		free(u);
		return pbox_client_error(-ENOMEM, "update: out of memory");
	}
	for (uint32_t i = 0; i < nkeys; i++) {
		u->ids[i] = keys[i].id;
		nelem[i] = keys[i].nelem;
	}
	u->c = c;
	rc = pbox_replica_init(&u->rep, opt, &params, NULL, info.staleness, nkeys, models, nelem,
			       err, sizeof(err));
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

int pbox_update_step(struct pbox_update *u, const float *const *updates)
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

int pbox_update_sync(struct pbox_update *u)
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
	pbox_replica_fini(&u->rep);
	free(u->ids);
	free(u);
}
