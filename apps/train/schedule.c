/* SPDX-License-Identifier: BSD-3-Clause */
/* Seeded per-epoch shuffle and the rank-sharding of each global batch (see schedule.h). */
#include "schedule.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int pbox_sched_init(struct pbox_sched *s, uint32_t nsamples, uint32_t batch, uint32_t workers,
		    uint64_t seed)
{
	memset(s, 0, sizeof(*s));
	if (batch == 0 || workers == 0 || batch < workers || batch > nsamples) {
		return -EINVAL;
	}
	s->perm = malloc((size_t)nsamples * sizeof(*s->perm));
	if (s->perm == NULL) {
		return -ENOMEM;
	}
	s->nsamples = nsamples;
	s->batch = batch;
	s->workers = workers;
	s->steps = nsamples / batch;
	s->seed = seed;
	return 0;
}

void pbox_sched_free(struct pbox_sched *s)
{
	free(s->perm);
	memset(s, 0, sizeof(*s));
}

void pbox_sched_epoch(struct pbox_sched *s, uint32_t epoch)
{
	/* Each epoch's stream is a fresh splitmix sequence, so an epoch's order does not
	 * depend on how many draws earlier epochs made. */
	uint64_t st = s->seed ^ ((uint64_t)(epoch + 1) * 0xd1b54a32d192ed03ull);

	for (uint32_t i = 0; i < s->nsamples; i++) {
		s->perm[i] = i;
	}
	for (uint32_t i = s->nsamples - 1; i > 0; i--) {
		/* Multiply-high maps 64 random bits onto [0, i]; the bias (< 2^-32) does not
		 * matter for a shuffle, and the map is the same on every rank. */
		uint32_t j = (uint32_t)(((unsigned __int128)pbox_rng_next(&st) * (i + 1)) >> 64);
		uint32_t t = s->perm[i];

		s->perm[i] = s->perm[j];
		s->perm[j] = t;
	}
}

void pbox_sched_split(uint32_t total, uint32_t workers, uint32_t rank, uint32_t *start, uint32_t *n)
{
	uint32_t q = total / workers, rem = total % workers;

	*start = rank * q + (rank < rem ? rank : rem);
	*n = q + (rank < rem ? 1 : 0);
}

void pbox_sched_shard(const struct pbox_sched *s, uint32_t step, uint32_t rank,
		      const uint32_t **idx, uint32_t *n)
{
	uint32_t start;

	pbox_sched_split(s->batch, s->workers, rank, &start, n);
	*idx = s->perm + (size_t)step * s->batch + start;
}
