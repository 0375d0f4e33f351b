/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The data schedule of synchronous data-parallel training, identical on every rank and in
 * the single-process reference: each epoch the training set is shuffled by a PRNG seeded
 * from (seed, epoch); global batch s is the permutation's s-th run of B samples (a last
 * partial batch is dropped, so every step has exactly B samples and the appliance's fixed
 * rescale 1/B is right); rank r trains on the r-th contiguous slice of it. When B is not a
 * multiple of the worker count N, the first B mod N ranks take one sample more.
 *
 * Thread safety: a struct pbox_sched belongs to one thread.
 */
#ifndef PBOX_TRAIN_SCHEDULE_H
#define PBOX_TRAIN_SCHEDULE_H

#include <stdint.h>

struct pbox_sched {
	uint32_t nsamples; /* training set size */
	uint32_t batch;    /* global batch B */
	uint32_t workers;  /* N */
	uint32_t steps;    /* steps per epoch: nsamples / B */
	uint64_t seed;
	uint32_t *perm; /* the current epoch's order */
};

/* splitmix64: the one PRNG of the trainer (weights and shuffles). */
static inline uint64_t pbox_rng_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A uniform float in [0, 1) with 24 random bits (exact in binary32). */
static inline float pbox_rng_unit(uint64_t *state)
{
	return (float)(pbox_rng_next(state) >> 40) * (1.0f / 16777216.0f);
}

/*
 * Prepare a schedule. Returns 0, -EINVAL (batch 0, workers 0, batch < workers: a rank
 * would have no sample, or batch > nsamples) or -ENOMEM.
 */
int pbox_sched_init(struct pbox_sched *s, uint32_t nsamples, uint32_t batch, uint32_t workers,
		    uint64_t seed);
void pbox_sched_free(struct pbox_sched *s);

/* Shuffle for epoch (0-based); the order depends only on (seed, epoch, nsamples). */
void pbox_sched_epoch(struct pbox_sched *s, uint32_t epoch);

/* Rank r's samples of step (0-based) of the current epoch: *idx points into perm, *n is
 * the slice length. */
void pbox_sched_shard(const struct pbox_sched *s, uint32_t step, uint32_t rank,
		      const uint32_t **idx, uint32_t *n);

/* Rank r's contiguous slice [*start, *start + *n) of a set of total items, split as the
 * batch is (used for the test set). */
void pbox_sched_split(uint32_t total, uint32_t workers, uint32_t rank, uint32_t *start,
		      uint32_t *n);

#endif /* PBOX_TRAIN_SCHEDULE_H */
