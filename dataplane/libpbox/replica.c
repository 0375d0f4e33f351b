/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's replica of a broadcast-update job's model (see replica.h). */
#include "replica.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"

static float *zalloc_floats(size_t n)
{
	size_t bytes = PBOX_ALIGN_UP(PBOX_MAX(n, 1u) * sizeof(float), 64);
	float *p = aligned_alloc(64, bytes);

	if (p != NULL) {
		memset(p, 0, bytes);
	}
	return p;
}

int pbox_replica_init(struct pbox_replica *r, const struct pbox_optimizer_ops *opt,
		      const struct pbox_opt_params *params, const struct pbox_kernels *kern,
		      uint32_t lag, uint32_t nkeys, float *const *models, const uint64_t *nelem,
		      char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	if (opt == NULL || params == NULL || nkeys == 0 || models == NULL || nelem == NULL) {
		snprintf(err, errlen, "replica: no optimizer, no keys or no model buffers");
		return -EINVAL;
	}
	r->opt = opt;
	r->params = *params;
	r->kern = kern != NULL ? kern : pbox_kernels_get();
	r->lag = lag;
	r->keys = calloc(nkeys, sizeof(*r->keys));
	if (r->keys == NULL) {
		snprintf(err, errlen, "replica: out of memory for %u keys", nkeys);
		return -ENOMEM;
	}
	r->nkeys = nkeys;
	for (uint32_t k = 0; k < nkeys; k++) {
		struct pbox_replica_key *rk = &r->keys[k];

		if (models[k] == NULL) {
			snprintf(err, errlen, "replica: key index %u has no model buffer", k);
			pbox_replica_fini(r);
			return -EINVAL;
		}
		rk->model = models[k];
		rk->nelem = nelem[k];
		rk->agg = zalloc_floats(rk->nelem);
		rk->s0 = opt->nstate >= 1 ? zalloc_floats(rk->nelem) : NULL;
		rk->s1 = opt->nstate >= 2 ? zalloc_floats(rk->nelem) : NULL;
		if (rk->agg == NULL || (opt->nstate >= 1 && rk->s0 == NULL) ||
		    (opt->nstate >= 2 && rk->s1 == NULL)) {
			snprintf(err, errlen,
				 "replica: out of memory for key index %u (%zu floats, %u state "
				 "vectors)",
				 k, rk->nelem, opt->nstate);
			pbox_replica_fini(r);
			return -ENOMEM;
		}
	}
	return 0;
}

void pbox_replica_fini(struct pbox_replica *r)
{
	for (uint32_t k = 0; r->keys != NULL && k < r->nkeys; k++) {
		free(r->keys[k].agg);
		free(r->keys[k].s0);
		free(r->keys[k].s1);
	}
	free(r->keys);
	r->keys = NULL;
	r->nkeys = 0;
}

uint32_t pbox_replica_push_wants(const struct pbox_replica *r)
{
	if (r->clock < r->lag || r->clock - r->lag < r->version) {
		return UINT32_MAX;
	}
	return r->clock - r->lag;
}

void pbox_replica_apply_key(struct pbox_replica *r, uint32_t k, uint32_t v)
{
	pbox_replica_apply_from(r, k, v, r->keys[k].agg);
}

void pbox_replica_apply_from(struct pbox_replica *r, uint32_t k, uint32_t v, const float *agg)
{
	struct pbox_replica_key *rk = &r->keys[k];
	const float *src[1] = { agg };
	struct pbox_opt_step st;

	/* The appliance's step for version v -> v + 1 (engine.c finalize_opt). */
	r->opt->prepare(&r->params, (uint64_t)v + 1, &st);
	r->opt->kernel(r->kern)(rk->model, rk->model, rk->s0, rk->s1, src, 1, rk->nelem, &r->params,
				&st);
}

int pbox_replica_apply(struct pbox_replica *r, uint32_t v)
{
	if (v != r->version) {
		return -EINVAL;
	}
	for (uint32_t k = 0; k < r->nkeys; k++) {
		pbox_replica_apply_key(r, k, v);
	}
	r->version++;
	return 0;
}
