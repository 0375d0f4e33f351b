/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Jobs as the data plane sees them: an immutable, RCU-published table of admitted jobs,
 * each pointing at mutable per-core chunk state.
 *
 * Ownership and threading:
 *  - struct pbox_jobtab and struct pbox_job are immutable once published. The control
 *    thread builds a new table for every change (a worker joins, a job aborts, a job ends),
 *    publishes it with one pointer exchange (rcu_assign_pointer) and frees the old one
 *    after a grace period. Data-plane cores read the table under urcu-qsbr.
 *  - struct pbox_job_state (and everything below it) is allocated by the control thread
 *    when a job session starts and freed by it after a grace period once no published
 *    table refers to it. Between those points, core k is the only writer (and reader) of
 *    state->core[k]: no locks, no atomics on the hot path.
 */
#ifndef PBOX_JOB_H
#define PBOX_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/compiler.h"
#include "common/jobdesc.h"
#include "common/wire_check.h"
#include "common/xport.h"
#include "kernels/kernels.h"
#include "sync.h"

enum pbox_job_mode {
	/* Return the sum or mean of the gradients; workers run their own optimizer. */
	PBOX_MODE_AGGREGATE = 0,
	/* PHub: the appliance keeps the model, runs the optimizer fused with the last add,
	 * and answers with the new model chunk (fused push-pull). Rank 0 sends the initial
	 * model with INIT. */
	PBOX_MODE_SERVER_OPT = 1,
};

enum pbox_reduce_op {
	PBOX_REDUCE_SUM = 0,
	PBOX_REDUCE_MEAN = 1, /* sum / nworkers */
};

/* What a gradient fragment (or a fragment of rank 0's initial model) holding NaN or +-Inf
 * does (per job). */
enum pbox_non_finite {
	/* Refused before it touches the sum: dropped, counted (drops[non_finite],
	 * nonfinite), and answered with PBOX_MSG_ERROR(EDOM) so the worker's operation
	 * fails with the cause instead of the iteration stalling silently. */
	PBOX_NON_FINITE_REJECT = 0,
	/* Aggregated as IEEE arithmetic says (NaN stays NaN through clipping); counted. */
	PBOX_NON_FINITE_PROPAGATE = 1,
};

enum pbox_job_run_state {
	PBOX_JOB_RUNNING = 0,
	PBOX_JOB_ABORTED = 1, /* requests are answered with PBOX_MSG_ERROR(abort_errno) */
};

/* Iterations in flight per chunk. BSP needs 2: the result of iteration t is kept (so a
 * lost reply can be re-sent) while iteration t + 1 accumulates; models that let workers
 * run ahead need more (pbox_sync_ops.min_window). */
#define PBOX_DEFAULT_WINDOW 2u
#define PBOX_MAX_WINDOW     64u
/* Unacknowledged contributions a worker may have per chunk (NOTIFY-ACK credits). */
#define PBOX_DEFAULT_CREDITS 1u
#define PBOX_MAX_CREDITS     PBOX_MAX_WINDOW

/* One in-flight iteration of one chunk. */
struct pbox_slot {
	uint32_t iter;
	uint32_t ndone;  /* ranks whose contribution is complete */
	uint32_t nfinal; /* fragments finalised (optimizer run / result written) */
	uint32_t quorum; /* contributions each fragment needed when counted last */
	bool open;
	float *acc;       /* running sum; for aggregate jobs, the result once final */
	uint64_t acc_ref; /* transport reference number of the last reply sent from acc */
	float **stage;    /* deterministic mode: per-rank copies, summed in rank order */
	uint64_t *bits;   /* nworkers rows of frag bitmap words: fragments received */
	uint16_t *wcnt;   /* per rank: fragments received */
	uint16_t *need;   /* per fragment: contributions still needed; FRAG_FINAL once final */
	uint16_t *fcnt;   /* per fragment: contributions summed into acc (mean divisor) */
	uint64_t *done;   /* bitmap over ranks: contribution complete */
};

#define PBOX_FRAG_FINAL UINT16_MAX

/* Everything one core keeps for one owned chunk. */
struct pbox_chunk_state {
	uint32_t id;      /* chunk id in the job */
	uint32_t version; /* completed iterations */
	bool initialized; /* server-optimizer: model received; aggregate: always true */
	uint32_t init_nrecv;
	uint64_t *init_bits;
	/* Server-optimizer only: version v of the model lives in model[v & 1], so replies can
	 * keep referencing version v (zero-copy transports) while v + 1 is computed. */
	float *model[2];
	uint64_t model_ref[2]; /* transport reference of the last reply from each */
	float *s0;             /* optimizer state, nstate >= 1 */
	float *s1;             /* optimizer state, nstate == 2 */
	uint32_t *pull_want;   /* per rank: wanted version/iteration of a held pull, or NONE */
	uint32_t nheld;
	uint64_t *blocked; /* bitmap over ranks: a push was refused, window full */
	/* Drop-stragglers: each rank's latest contribution to an iteration already complete
	 * (folded into a later one), so its retransmissions are recognised. */
	uint32_t *late_iter;
	uint16_t *late_cnt;
	uint64_t *late_bits;    /* nworkers rows of frag bitmap words */
	struct pbox_slot *slot; /* window entries */
};

#define PBOX_PULL_NONE UINT32_MAX

/*
 * Iterations of a chunk are numbered by uint32 and never wrap: pushes of iteration
 * PBOX_ITER_LIMIT or later (and requests for a later version) are refused with
 * PBOX_MSG_ERROR(EOVERFLOW), so a chunk's version stays <= PBOX_ITER_LIMIT. That keeps
 * version + window, iteration + 1 and slot indices (iter % window, also for windows that
 * are not powers of two) free of wraparound, and UINT32_MAX free for the sentinels
 * (PBOX_PULL_NONE, late_iter). 2^32 - 128 steps: 1.4 years at 100 steps/s.
 */
#define PBOX_ITER_LIMIT (UINT32_MAX - 2u * PBOX_MAX_WINDOW)

/* One core's share of a job. Written only by that core. */
struct pbox_core_job {
	uint64_t seen_generation; /* membership generation last reconciled by the core */
	uint64_t *seen_live;      /* live ranks at that generation */
	uint32_t nchunks;
	struct pbox_chunk_state *chunks; /* indexed by chunk_desc.local */
	/* Per rank: where replies go, pinned by the rank's first valid datagram to this core;
	 * peer_cookie is the cookie it was pinned under (0: not pinned). A new cookie (the
	 * rank registered again) lets the next datagram pin a new address. */
	struct pbox_peer *peers;
	uint64_t *peer_cookie;
	void *arena;
	size_t arena_bytes;
	uint64_t nonfinite; /* NaN / Inf gradient values received (read by stats, relaxed) */
} PBOX_CACHE_ALIGNED;

struct pbox_job_state {
	uint32_t ncores;
	struct pbox_core_job core[];
};

struct pbox_job {
	struct pbox_wire_job wire; /* id, desc, cookies, accepts_init: what validation needs */
	enum pbox_job_mode mode;
	enum pbox_reduce_op reduce;
	enum pbox_job_run_state run;
	int abort_errno;
	bool deterministic;
	uint32_t window;
	const struct pbox_sync_ops *sync;
	struct pbox_sync_cfg sync_cfg;
	uint32_t credits; /* NOTIFY-ACK: unacknowledged contributions per rank and chunk */
	bool verify_crc;  /* check the CRC32C version word of flagged fragments */
	enum pbox_non_finite non_finite;
	const uint64_t *live; /* bitmap over ranks counted as members */
	uint32_t nlive;
	uint64_t generation; /* changes whenever live changes */
	const struct pbox_optimizer_ops *opt;
	struct pbox_opt_params opt_params;
	struct pbox_job_state *state;
};

/* The published table: jobs sorted by id. */
struct pbox_jobtab {
	uint64_t generation;
	uint32_t njobs;
	const struct pbox_job *jobs[];
};

/* Binary search; NULL if the table has no session for that id. */
const struct pbox_job *pbox_jobtab_find(const struct pbox_jobtab *tab, uint32_t id);

/* Validation lookup over a table (pbox_wire_lookup_fn); arg is the table. */
const struct pbox_wire_job *pbox_jobtab_lookup(void *arg, uint32_t id);

/*
 * Allocate the per-core state of a job session: for each core, one arena holding every
 * owned chunk's model, optimizer state, window slots and bitmaps. Server-optimizer
 * chunks start uninitialised; aggregate chunks ready. Returns NULL after logging why
 * (out of memory names the job and the size).
 */
struct pbox_job_state *pbox_job_state_create(const struct pbox_job *job);
void pbox_job_state_free(struct pbox_job_state *st);

/* Bytes the state of a job would take on each core (for admission checks and logs). */
size_t pbox_job_state_core_bytes(const struct pbox_job *job, uint32_t core);

#endif /* PBOX_JOB_H */
