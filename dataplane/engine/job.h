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
 *    when a job session starts and is reference counted (pbox_job_state_get/put): the
 *    session holds one reference, every published table that lists the state holds one
 *    (dropped after the grace period that retires the table), and a zero-copy transport
 *    holds one per core whose replies may still point into the arenas (dropped from its
 *    completion path). Whoever drops the last reference releases it. Between creation
 *    and release, core k is the only writer (and reader) of state->core[k]: no locks, no
 *    atomics on the hot path.
 *  - A table built by pboxd is reference counted too (pbox_jobtab_get/put), so a core that
 *    must wait for its transport can pin the table it is using and go RCU-offline.
 */
#ifndef PBOX_JOB_H
#define PBOX_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/compiler.h"
#include "common/jobdesc.h"
#include "common/wire_check.h"
#include "common/xport.h"
#include "dvf/dvf.h"
#include "kernels/kernels.h"
#include "sync.h"

enum pbox_job_mode {
	/* Return the sum or mean of the gradients; workers run their own optimizer. */
	PBOX_MODE_AGGREGATE = 0,
	/* PHub: the appliance keeps the model, runs the optimizer fused with the last add,
	 * and answers with the new model chunk (fused push-pull). Rank 0 sends the initial
	 * model with INIT. */
	PBOX_MODE_SERVER_OPT = 1,
	/* Parameter Flow's update-centric communication (UCC, PF Eq 4/5): every worker keeps
	 * the full model and runs the job's optimizer itself; the appliance sums (or
	 * averages) the updates U_i^t pushed for iteration t and sends the aggregate U^t to
	 * every worker, which all apply the same aggregates in the same order. Chunks are
	 * laid out as for aggregate jobs. Under SSP with staleness s a push-pull of
	 * iteration t is answered with U^(t - s) (engine.h). */
	PBOX_MODE_BROADCAST = 2,
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
#define PBOX_DEFAULT_WINDOW 2u /* at most PBOX_MAX_WINDOW (pbox/wire.h) */
/* Unacknowledged contributions a worker may have per chunk (NOTIFY-ACK credits; at most
 * PBOX_MAX_CREDITS, pbox/wire.h). */
#define PBOX_DEFAULT_CREDITS 1u

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
	/* Jobs whose results are filtered (engine/encoding.h): the result as sent, fragment
	 * f at its byte offset, enc_len[f] bytes (< the dense length: a DVF block; equal: the
	 * filtered values, dense). NULL otherwise. */
	uint8_t *enc;
	uint16_t *enc_len;
	/* acc's generation word in a results' arena (struct pbox_res_line); NULL: none. */
	uint64_t *acc_gen;
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
	float *resid;      /* jobs whose results are filtered: the appliance's DVF residual */
	/* Drop-stragglers: each rank's latest contribution to an iteration already complete
	 * (folded into a later one), so its retransmissions are recognised. */
	uint32_t *late_iter;
	uint16_t *late_cnt;
	uint64_t *late_bits;    /* nworkers rows of frag bitmap words */
	struct pbox_slot *slot; /* window entries */
	/* model[v]'s generation word in a results' arena (struct pbox_res_line); NULL: none. */
	uint64_t *model_gen[2];
	/* Checkpoint capture (server-optimizer jobs with job->checkpoint): a copy of the model
	 * and optimizer state of one version, [model | s0 | s1], taken by the owning core at
	 * the moment the chunk reaches version snap_want (pbox_chunk_snap), when the model of
	 * that version and the optimizer state after it are both complete and consistent.
	 * snap_want is written by the checkpointer and read by the core; snap_have (the
	 * version in snap, PBOX_SNAP_NONE before the first capture) is written by the core
	 * with release order after the copy, and read by the checkpointer with acquire order
	 * before it reads snap. NULL without checkpointing. */
	float *snap;
	uint32_t snap_want;
	uint32_t snap_have;
};

#define PBOX_SNAP_NONE UINT32_MAX

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
	/* Per rank: where this core's replies go (with the MAC and ifport of L2 transports),
	 * learned from the rank's first datagram on this core that matches the rank's shared
	 * pin (pbox_job_state.pins); peer_cookie is the cookie it was learned under (0: none
	 * yet). */
	struct pbox_peer *peers;
	uint64_t *peer_cookie;
	void *arena;
	size_t arena_bytes;
	/* The results' arena (struct pbox_result_ops; NULL: results are in `arena`) and the
	 * allocator's handle for it (pboxd's shared-memory transport: a sealed memfd). */
	void *res_arena;
	size_t res_bytes;
	int res_handle;
	uint64_t nonfinite; /* NaN / Inf gradient values received (read by stats, relaxed) */
} PBOX_CACHE_ALIGNED;

/*
 * A rank's source address, shared by every core of the job: the first valid datagram
 * under a cookie, on whichever core, pins it; a datagram with that cookie from any other
 * address is refused on every core. cookie is the cookie pinned (0: none); addr is
 * PBOX_PIN_SET | (cookie & 0x7fff) << 48 | ip << 16 | port. Written only by data-plane
 * cores: cookie with a compare-and-swap, then addr by the core whose swap won (release);
 * read with acquire loads. A datagram is accepted only if cookie equals its cookie and
 * addr equals its own word, so a stale addr of the previous cookie does not match (its
 * 15-bit tag differs but with probability 2^-15, and then only between the two stores).
 */
struct pbox_rank_pin {
	uint64_t cookie;
	uint64_t addr;
};

#define PBOX_PIN_SET (1ull << 63)

struct pbox_job_state;
struct pbox_tsb;

/* What happens when a state's last reference is dropped (runs on that thread). */
typedef void pbox_job_state_release_fn(struct pbox_job_state *st, void *arg);

/*
 * Where the per-core arenas of job states come from. Default (none installed): anonymous
 * mmap, populated. A transport whose device reads replies by DMA (DPDK on a PCI NIC)
 * installs its own, so chunk memory is memory the device can address. alloc returns
 * `bytes` zeroed bytes aligned to 4096 for core `core`, or NULL after logging why; free
 * releases them. Called by whichever thread creates a state / drops its last reference.
 */
struct pbox_arena_ops {
	void *(*alloc)(void *ctx, size_t bytes, uint32_t core);
	void (*free)(void *ctx, void *p, size_t bytes);
	void *ctx;
};

/* Arenas of states created from now on come from ops (NULL: mmap again); a state is
 * freed with the ops it was created with, which must outlive it. Control thread, before
 * the sessions that should use them start. */
void pbox_job_set_arena_ops(const struct pbox_arena_ops *ops);

/*
 * Where the buffers results are sent from (window slots' accumulators and encoded
 * results, a server-optimizer chunk's two model versions) are carved, apart from the
 * rest of the state, when installed: one arena per (job, core), so a transport can show
 * a job's results, and nothing else of pboxd's, to that job's workers (the shared-memory
 * transport maps them read-only into its workers). Not used while arena ops are
 * installed (those arenas hold the results). alloc: `bytes` zeroed bytes, page aligned,
 * into *p, and a handle (*handle >= 0) the allocator's owner can look up; 0 or -errno
 * after logging why. free gets both back. The ops must outlive every state created with
 * them. Called by whichever thread creates a state / drops its last reference.
 */
struct pbox_result_ops {
	int (*alloc)(void *ctx, size_t bytes, uint32_t job, uint32_t core, void **p, int *handle);
	void (*free)(void *ctx, void *p, size_t bytes, int handle);
	void *ctx;
};

/*
 * In a results' arena every result buffer starts one line after a struct pbox_res_line:
 * a magic (which says so) and the buffer's generation, which the owning core bumps
 * (pbox_res_gen_bump) before it rewrites the buffer for another iteration / version. A
 * reader in another process that saw gen before reading the buffer and still sees it
 * after (an acquire fence in between) read bytes the core did not rewrite meanwhile: a
 * seqlock whose writer is the engine.
 */
#define PBOX_RES_MAGIC 0x50424f5852455331ull /* "PBOXRES1" */
struct pbox_res_line {
	uint64_t magic;
	uint64_t gen; /* atomic (__atomic builtins): written by the owning core only */
	uint8_t pad[PBOX_CACHE_LINE - 16];
};

/* Before rewriting a result buffer: bump its generation (NULL: none), then a release
 * fence so the stores to the buffer that follow are not seen before it. Owning core. */
static inline void pbox_res_gen_bump(uint64_t *gen)
{
	if (gen != NULL) {
		__atomic_store_n(gen, *gen + 1, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_RELEASE);
	}
}

/* Result arenas of states created from now on come from ops (NULL: none). Control
 * thread, before the sessions that should use them start. */
void pbox_job_set_result_ops(const struct pbox_result_ops *ops);

struct pbox_job_state {
	uint32_t ncores;
	uint32_t refs;   /* atomic: see pbox_job_state_get / put */
	uint32_t tables; /* atomic: published tables listing this state (their owner counts) */
	bool owns_desc;  /* desc below was adopted (pbox_job_state_adopt_desc) */
	/* NULL: pbox_job_state_free on the thread that drops the last reference. */
	pbox_job_state_release_fn *release;
	void *release_arg;
	struct pbox_job_state *release_next;      /* free for the releaser's own lists */
	struct pbox_jobdesc desc;                 /* valid when owns_desc */
	const struct pbox_arena_ops *arena_ops;   /* NULL: the arenas are mmapped */
	const struct pbox_result_ops *result_ops; /* NULL: results are in the arenas */
	/* Per rank (nworkers), carved in core 0's arena (so counted by the budget); see
	 * struct pbox_rank_pin for who writes it. */
	struct pbox_rank_pin *pins;
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
	bool checkpoint; /* server-optimizer: chunks carry snapshot buffers (pbox_chunk_snap) */
	struct pbox_dvf_job dvf; /* DVF: pushes may be blocks; aggregates are filtered */
	struct pbox_job_state *state;
	struct pbox_tsb *tsb; /* results go down a broadcast tree (engine/bcast.h); NULL: star */
};

struct pbox_jobtab;

/* What happens when a table's last reference is dropped (runs on that thread). */
typedef void pbox_jobtab_release_fn(struct pbox_jobtab *tab, void *arg);

/* The published table: jobs sorted by id. */
struct pbox_jobtab {
	uint64_t generation;
	uint32_t njobs;
	uint32_t refs; /* atomic: see pbox_jobtab_get / put */
	/* NULL: the table is not reference counted (its creator frees it once no core can
	 * see it, e.g. after stopping the cores); get / put do nothing. */
	pbox_jobtab_release_fn *release;
	void *release_arg;
	const struct pbox_job *jobs[];
};

/* Binary search; NULL if the table has no session for that id. */
const struct pbox_job *pbox_jobtab_find(const struct pbox_jobtab *tab, uint32_t id);

/* Validation lookup over a table (pbox_wire_lookup_fn); arg is the table. */
const struct pbox_wire_job *pbox_jobtab_lookup(void *arg, uint32_t id);

/*
 * Take / drop a reference on a reference-counted table (release != NULL; otherwise both
 * do nothing). get: the caller must already hold a reference or be inside an RCU read
 * side that reached the table. put: the last one runs tab->release. Any thread.
 */
void pbox_jobtab_get(struct pbox_jobtab *tab);
void pbox_jobtab_put(struct pbox_jobtab *tab);

/*
 * The least window (iterations in flight per chunk) a job needs: the sync model's minimum
 * (pbox_sync_ops.min_window), one more than its credits, and for broadcast jobs
 * 2s + 1 + credits with s the worker staleness, so the aggregate of an iteration is kept
 * until the slowest worker has received it (engine.h). Pure.
 */
uint32_t pbox_job_min_window(enum pbox_job_mode mode, const struct pbox_sync_ops *sync,
			     const struct pbox_sync_cfg *sc, uint32_t credits);

/* Free a table whose job entries were each allocated with malloc (pboxd's tables), and
 * the entries. Drops nothing: the caller handles the states they point at. NULL is a
 * no-op. */
void pbox_jobtab_free(struct pbox_jobtab *tab);

/*
 * Allocate the per-core state of a job session: for each core, one arena holding every
 * owned chunk's model, optimizer state, window slots and bitmaps. Server-optimizer
 * chunks start uninitialised; aggregate chunks ready. The state starts with one reference
 * (the caller's). Returns NULL after logging why (out of memory names the job and the
 * size), errno the cause (ENOMEM, EMFILE, ...). Results' arenas (pbox_job_set_result_ops)
 * that cannot be had for want of file descriptors (EMFILE / ENFILE) are not a failure: the
 * state keeps its results in its own arena instead (logged).
 */
struct pbox_job_state *pbox_job_state_create(const struct pbox_job *job);

/* Unmap the arenas and free the state now, whatever its references (and the adopted job
 * description). For owners that know no one else can reach it; everyone else uses put.
 * NULL is a no-op. May take long for large arenas (munmap): not for data-plane cores. */
void pbox_job_state_free(struct pbox_job_state *st);

/* Take a reference (the caller already holds one, or reached st through a table it may
 * read). Any thread. */
void pbox_job_state_get(struct pbox_job_state *st);

/* Drop a reference; the last one runs st->release (or pbox_job_state_free when NULL) on
 * the calling thread. Any thread. NULL is a no-op. */
void pbox_job_state_put(struct pbox_job_state *st);

/*
 * Move the job description *d into the state (a shallow copy: *d keeps pointing at the
 * same arrays and stays usable while the caller holds its reference, but must no longer
 * be freed by it): the description lives exactly as long as the state, so tables that
 * cores may still read never point at a freed one. Returns the state's copy.
 */
const struct pbox_jobdesc *pbox_job_state_adopt_desc(struct pbox_job_state *st,
						     const struct pbox_jobdesc *d);

/* Bytes the state of a job would take on each core (for admission checks and logs);
 * SIZE_MAX if it does not fit a size_t. */
size_t pbox_job_state_core_bytes(const struct pbox_job *job, uint32_t core);

/*
 * Bytes pbox_job_state_create(job) would allocate in all: every core's arena (what is
 * mmapped and populated) plus the per-core table. Exact (the same layout code sizes and
 * carves), computed without allocating, in O(chunks) with one layout per distinct chunk
 * size; saturates at UINT64_MAX. Needs job->wire.desc and the job's parameters (mode,
 * opt, window, deterministic, sync), not its state.
 */
uint64_t pbox_job_state_bytes(const struct pbox_job *job);

/*
 * A lower bound of pbox_job_state_bytes from the keys alone, before a jobdesc (itself
 * O(chunks) of memory) is built: the chunks' own layouts, without the per-core headers
 * and page rounding. O(keys). keys must have passed pbox_jobdesc_count_chunks;
 * job->wire.desc is not read. Saturates at UINT64_MAX.
 */
uint64_t pbox_job_state_bytes_min(const struct pbox_job *job, const struct pbox_keyspec *keys,
				  uint32_t nkeys, uint32_t nworkers, uint32_t chunk_bytes,
				  uint32_t frag_bytes);

/* Out of line part of pbox_chunk_snap: copy and publish (owning core). */
void pbox_chunk_snap_copy(const struct pbox_job *job, const struct pbox_chunk_desc *cd,
			  struct pbox_chunk_state *cs);

/*
 * Called by the owning core right after the chunk's version was incremented (and before
 * any fragment of the next iteration is finalised): if the checkpointer asked for this
 * version, copy model[version & 1] and the optimizer state into cs->snap. Costs one load
 * otherwise.
 */
static inline void pbox_chunk_snap(const struct pbox_job *job, const struct pbox_chunk_desc *cd,
				   struct pbox_chunk_state *cs)
{
	if (cs->snap != NULL && __atomic_load_n(&cs->snap_want, __ATOMIC_ACQUIRE) == cs->version) {
		pbox_chunk_snap_copy(job, cd, cs);
	}
}

#endif /* PBOX_JOB_H */
