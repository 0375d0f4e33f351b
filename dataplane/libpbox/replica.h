/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's replica of a broadcast-update job's model (Parameter Flow's UCC, job mode
 * "broadcast"): the model buffers (the caller's), the optimizer state and a receive
 * buffer per key, and the two counters of PF's blocking rule.
 *
 *   clock   iterations this worker has pushed (the next one is `clock`);
 *   version aggregates applied: the model is W^version = F(...F(W^0, U^0)..., U^(version-1)).
 *
 * Applying aggregate U^v to a key runs the job's optimizer with the appliance's kernels
 * (kernels.h: the same fused step, prepared for step v + 1, with U^v as its one source),
 * so a replica computes, bit for bit, what a server-optimizer job's appliance computes
 * from the same summed gradient, and every replica that applies the same aggregates in
 * the same order holds the same model. The caller applies aggregates in order of v and
 * once each (pbox_replica_apply checks the order).
 *
 * Threading: one thread at a time. Ownership: the model buffers stay the caller's; the
 * replica owns the state and receive buffers.
 */
#ifndef PBOX_REPLICA_H
#define PBOX_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

struct pbox_replica_key {
	float *model; /* nelem floats, the caller's */
	float *agg;   /* receive buffer of one aggregate, nelem floats */
	float *s0;    /* optimizer state (nstate >= 1), zero at version 0 */
	float *s1;    /* (nstate == 2) */
	size_t nelem;
};

struct pbox_replica {
	const struct pbox_optimizer_ops *opt;
	struct pbox_opt_params params;
	const struct pbox_kernels *kern;
	uint32_t lag; /* s: a push of iteration t is answered with U^(t - s) */
	uint32_t clock;
	uint32_t version;
	uint32_t nkeys;
	struct pbox_replica_key *keys;
};

/*
 * Set up r for nkeys keys: models[k] holds nelem[k] floats (W^0, the same on every
 * worker). opt / params: the job's optimizer; lag: the job's staleness (0 under BSP).
 * Returns 0, or -ENOMEM / -EINVAL with err naming the cause. kern NULL: pbox_kernels_get().
 */
int pbox_replica_init(struct pbox_replica *r, const struct pbox_optimizer_ops *opt,
		      const struct pbox_opt_params *params, const struct pbox_kernels *kern,
		      uint32_t lag, uint32_t nkeys, float *const *models, const uint64_t *nelem,
		      char *err, size_t errlen);

/* Free what init allocated (not the models). Safe on a zeroed or failed replica. */
void pbox_replica_fini(struct pbox_replica *r);

/* The aggregate a push of the current clock asks for (clock - lag), or UINT32_MAX when it
 * asks for none: clock < lag, or a catch-up (pbox_replica_apply of later aggregates) has
 * already applied it. */
uint32_t pbox_replica_push_wants(const struct pbox_replica *r);

/* Apply aggregate U^v, received into every key's agg buffer: v must be r->version
 * (-EINVAL otherwise, nothing changed). Advances version. */
int pbox_replica_apply(struct pbox_replica *r, uint32_t v);

/* Apply U^v to key k only (for callers that receive keys at different times); the caller
 * advances r->version once every key has it. */
void pbox_replica_apply_key(struct pbox_replica *r, uint32_t k, uint32_t v);

/* The same with U^v of key k in agg (nelem floats) instead of the key's own buffer. */
void pbox_replica_apply_from(struct pbox_replica *r, uint32_t k, uint32_t v, const float *agg);

#endif /* PBOX_REPLICA_H */
