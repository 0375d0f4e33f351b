/* SPDX-License-Identifier: BSD-3-Clause */
/* Synchronisation models as an ops table (see sync.h). */
#include "sync.h"

#include <math.h>
#include <string.h>

#include "common/compiler.h"

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The PSSP draw for (seed, job, rank, progress): uniform in [0, 1). */
static double draw(uint64_t seed, uint32_t job, uint32_t rank, uint32_t progress)
{
	uint64_t h =
		mix(seed ^ mix(((uint64_t)job << 32) | rank) ^ mix(0x5055ull << 32 | progress));

	return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

bool pbox_sync_pssp_pause(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t p,
			  uint32_t v)
{
	double k = (double)p - (double)v, prob;

	if (k < (double)c->staleness) { /* also p < v: k < 0 */
		return false;
	}
	if (c->model == PBOX_SYNC_PSSP_DYN) {
		prob = c->alpha / (1.0 + exp((double)c->staleness - k));
	} else {
		prob = c->probability;
	}
	return draw(c->seed, job, rank, p) < prob;
}

/* want = p + 1, so "k = p - v < s" is "want <= v + s". */
static bool ready_bsp(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t want,
		      uint32_t v)
{
	(void)c;
	(void)job;
	(void)rank;
	return want <= v;
}

static bool ready_ssp(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t want,
		      uint32_t v)
{
	(void)job;
	(void)rank;
	return (uint64_t)want <= (uint64_t)v + c->staleness;
}

static bool ready_asp(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t want,
		      uint32_t v)
{
	(void)c;
	(void)job;
	(void)rank;
	(void)want;
	(void)v;
	return true;
}

static bool ready_pssp(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t want,
		       uint32_t v)
{
	if ((uint64_t)want <= (uint64_t)v + c->staleness) { /* also want == 0 */
		return true;
	}
	return !pbox_sync_pssp_pause(c, job, rank, want - 1, v);
}

static uint32_t quorum_all(const struct pbox_sync_cfg *c, uint32_t nlive)
{
	(void)c;
	return nlive;
}

static uint32_t quorum_drop(const struct pbox_sync_cfg *c, uint32_t nlive)
{
	return PBOX_MIN(c->quorum, nlive);
}

/* ASP: the first contribution to arrive completes an iteration and every later one is
 * added to the next: each push takes effect at the next optimizer step (FluentPS applies
 * pushes on arrival), so the model moves at the pace of the fastest worker. */
static uint32_t quorum_one(const struct pbox_sync_cfg *c, uint32_t nlive)
{
	(void)c;
	return PBOX_MIN(1u, nlive);
}

static uint32_t stale_zero(const struct pbox_sync_cfg *c)
{
	(void)c;
	return 0;
}

static uint32_t stale_s(const struct pbox_sync_cfg *c)
{
	return c->staleness;
}

static uint32_t stale_unbounded(const struct pbox_sync_cfg *c)
{
	(void)c;
	return UINT32_MAX;
}

/* BSP keeps the completed iteration (for lost replies) and the one accumulating; a worker
 * allowed s iterations ahead adds s more. */
static uint32_t window_bsp(const struct pbox_sync_cfg *c)
{
	(void)c;
	return 2;
}

static uint32_t window_s(const struct pbox_sync_cfg *c)
{
	return c->staleness + 2;
}

static uint32_t window_drop(const struct pbox_sync_cfg *c)
{
	(void)c;
	/* late contributions fold into the iteration after the current one, and a worker
	 * given version v pushes v next */
	return 4;
}

static const struct pbox_sync_ops g_ops[] = {
	[PBOX_SYNC_BSP] = { .name = "bsp",
			    .ready = ready_bsp,
			    .quorum = quorum_all,
			    .folds_late = false,
			    .worker_staleness = stale_zero,
			    .min_window = window_bsp },
	[PBOX_SYNC_SSP] = { .name = "ssp",
			    .ready = ready_ssp,
			    .quorum = quorum_all,
			    .folds_late = false,
			    .worker_staleness = stale_s,
			    .min_window = window_s },
	[PBOX_SYNC_ASP] = { .name = "asp",
			    .ready = ready_asp,
			    .quorum = quorum_one,
			    .folds_late = true,
			    .worker_staleness = stale_unbounded,
			    .min_window = window_drop },
	[PBOX_SYNC_PSSP] = { .name = "pssp",
			     .ready = ready_pssp,
			     .quorum = quorum_all,
			     .folds_late = false,
			     .worker_staleness = stale_unbounded,
			     .min_window = window_s },
	[PBOX_SYNC_PSSP_DYN] = { .name = "pssp-dyn",
				 .ready = ready_pssp,
				 .quorum = quorum_all,
				 .folds_late = false,
				 .worker_staleness = stale_unbounded,
				 .min_window = window_s },
	[PBOX_SYNC_DROP_STRAGGLERS] = { .name = "drop-stragglers",
					.ready = ready_bsp,
					.quorum = quorum_drop,
					.folds_late = true,
					.worker_staleness = stale_zero,
					.min_window = window_drop },
};

void pbox_sync_cfg_defaults(struct pbox_sync_cfg *c, uint32_t workers)
{
	*c = (struct pbox_sync_cfg){
		.model = PBOX_SYNC_BSP,
		.staleness = 2,
		.probability = 0.5,
		.alpha = 1.0,
		.quorum = workers,
		.seed = 1,
	};
}

const struct pbox_sync_ops *pbox_sync_ops(enum pbox_sync_model m)
{
	return (unsigned)m < PBOX_ARRAY_SIZE(g_ops) ? &g_ops[m] : NULL;
}

int pbox_sync_parse(const char *name)
{
	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(g_ops); i++) {
		if (strcmp(g_ops[i].name, name) == 0) {
			return (int)i;
		}
	}
	return -1;
}

const char *pbox_sync_name(enum pbox_sync_model m)
{
	return (unsigned)m < PBOX_ARRAY_SIZE(g_ops) ? g_ops[m].name : "unknown";
}
