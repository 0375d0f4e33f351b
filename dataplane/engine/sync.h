/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Synchronisation models (FluentPS) as one ops table per job, evaluated independently on
 * every chunk by its owner core: a pull condition (may a worker that wants model version
 * `want` get the current version V now?) and an advance condition (how many contributions
 * complete an iteration). A pull that fails its condition is held back: lazily until its
 * own iteration is complete (V >= want, the default), or eagerly until the next advance
 * (FluentPS's soft barrier).
 *
 * In FluentPS's terms a worker with progress p (the iteration it just pushed) wants
 * version p + 1, and k = p - V is how far it is ahead of the chunk:
 *   bsp              ready iff k < 0                              (V >= want)
 *   ssp(s)           ready iff k < s
 *   asp              always ready; an iteration completes with its first contribution and
 *                    every later one is added to the next: each push takes effect at the
 *                    next optimizer step, as in FluentPS, where pushes apply on arrival
 *   pssp(s, c)       ready iff k < s, or else with probability 1 - c
 *   pssp-dyn(s, a)   ready iff k < s, or else with probability 1 - a / (1 + e^(s - k))
 *   drop-stragglers  ready iff k < 0; an iteration completes after `quorum` contributions;
 *                    later ones are added to the next iteration, never lost
 *
 * The models that let an iteration complete before every worker contributed (asp,
 * drop-stragglers) add late contributions, in arrival order, to a later iteration; a
 * worker should then tag its next push with the version it was given if that is newer
 * than its own count (libpbox's pbox_result_version), so it does not lag forever. The
 * others (bsp, ssp, pssp) complete iteration t with every live worker's iteration-t
 * gradient (FluentPS's option (b): bit-reproducible in deterministic mode) and only gate
 * the pulls.
 *
 * Broadcast-update jobs (job.h, PBOX_MODE_BROADCAST) accept bsp and ssp only: the
 * appliance completes iteration t with every live worker's iteration-t update and the
 * staleness s becomes a lag, a push-pull of t receiving the aggregate of t - s (engine.h).
 *
 * The random draw of PSSP is a function of (seed, job, rank, p) only, never of the chunk or
 * the core, so a worker is paused for iteration p on every chunk or on none (FluentPS's
 * independent per-shard draws would pause it almost surely; see papers/fluentps.md).
 *
 * Thread safety: configurations are immutable once published; functions are pure.
 */
#ifndef PBOX_SYNC_H
#define PBOX_SYNC_H

#include <stdbool.h>
#include <stdint.h>

enum pbox_sync_model {
	PBOX_SYNC_BSP = 0,
	PBOX_SYNC_SSP,
	PBOX_SYNC_ASP,
	PBOX_SYNC_PSSP,
	PBOX_SYNC_PSSP_DYN,
	PBOX_SYNC_DROP_STRAGGLERS,
};

struct pbox_sync_cfg {
	enum pbox_sync_model model;
	uint32_t staleness; /* s: ssp, pssp, pssp-dyn */
	double probability; /* c: pssp */
	double alpha;       /* a: pssp-dyn */
	uint32_t quorum;    /* drop-stragglers: contributions that complete an iteration */
	bool eager;         /* release held pulls at the next advance (soft barrier) */
	uint64_t seed;      /* pssp draws */
};

struct pbox_sync_ops {
	const char *name;
	/* May a pull wanting version `want` (progress want - 1) be answered at version v? */
	bool (*ready)(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t want,
		      uint32_t v);
	/* Contributions that complete an iteration when nlive workers are members. */
	uint32_t (*quorum)(const struct pbox_sync_cfg *c, uint32_t nlive);
	/* Contributions arriving after their iteration's fragment completed are added to the
	 * next iteration (drop-stragglers); otherwise every live rank completes each one. */
	bool folds_late;
	/* Largest staleness a worker must accept (UINT32_MAX: unbounded): the worker-side
	 * check that the appliance never answers with too old a model. */
	uint32_t (*worker_staleness)(const struct pbox_sync_cfg *c);
	/* Iterations a chunk must keep in flight for this model (>= 2). */
	uint32_t (*min_window)(const struct pbox_sync_cfg *c);
};

/* The ops of a model. */
const struct pbox_sync_ops *pbox_sync_ops(enum pbox_sync_model m);

/* "bsp", "ssp", "asp", "pssp", "pssp-dyn", "drop-stragglers" <-> model; -1 if unknown. */
int pbox_sync_parse(const char *name);
const char *pbox_sync_name(enum pbox_sync_model m);

/* BSP, and the documented defaults of every parameter (s = 2, c = 0.5, a = 1, quorum all
 * workers, lazy release, seed 1), for pboxd's configuration and pbox demo. */
void pbox_sync_cfg_defaults(struct pbox_sync_cfg *c, uint32_t workers);

/* Whether a worker with progress p at chunk version v is paused (PSSP models only). */
bool pbox_sync_pssp_pause(const struct pbox_sync_cfg *c, uint32_t job, uint32_t rank, uint32_t p,
			  uint32_t v);

#endif /* PBOX_SYNC_H */
