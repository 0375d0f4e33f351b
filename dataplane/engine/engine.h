/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The per-core chunk engine: validates each arriving datagram, adds gradient fragments
 * into the owning chunk's accumulator as they arrive (tall aggregation), runs the
 * optimizer on each fragment fused with its last add once all contributions for the
 * iteration are in, and queues replies (results, ACKs, errors) on the core's transport.
 *
 * The engine does not know where bytes come from: a transport hands it one datagram at a
 * time (pbox_engine_rx) and takes outgoing datagrams through struct pbox_tx_ops.
 *
 * Protocol rules it implements (BSP), per chunk, with t the iteration of a PUSH:
 *  - t < version: a retransmission for a completed iteration: the result (or ACK) is sent
 *    again once per retransmission round (on the chunk's last fragment); nothing is added.
 *  - version <= t < version + window: aggregated into slot t % window. A fragment already
 *    received from that rank for t is a duplicate and is ignored (fragment bitmaps).
 *  - t >= version + window: dropped (future_iter).
 *  - t >= PBOX_ITER_LIMIT (job.h; about 2^32): refused with PBOX_MSG_ERROR(EOVERFLOW),
 *    as is a pull for a version past it (iter_limit): iteration numbers never wrap.
 *  A chunk's iterations complete in order: iteration t is finalised only when t ==
 *  version, so the optimizer always sees the iterations of a chunk one after another.
 *  When a rank's contribution is complete it gets an ACK unless the reply it asked for
 *  went out at the same moment. Held pulls are answered when their version is reached.
 *
 * Modes (job.h) differ in what a push-pull of iteration t asks for and what answers it
 * (engine.c's struct pbox_mode_ops): server-optimizer, model version t + 1; aggregate, the
 * sum / mean of iteration t; broadcast (Parameter Flow's UCC), the aggregate U^(t - s),
 * where s is the job's staleness (0 under BSP; a push of t < s asks for nothing and is
 * only acknowledged); a PULL of u asks for U^u, held until iteration u is complete.
 * Broadcast jobs run under BSP or SSP only, and SSP keeps per-iteration sums, as the
 * engine's SSP always does: U^u is the sum of every live worker's iteration-u update,
 * complete only when all of them are in, never a mix of timestamps (PF's Eq 5 folds fast
 * workers' updates of u + 1 .. u + s into U^u; this does not, so a run is
 * bit-reproducible in deterministic mode and no update is applied early or twice). Every
 * worker receives every U^u, in order of u: the same stream, so the same model. libpbox
 * (pbox_update_*) gets them either from lagged push-pulls (BSP, and SSP with an exact
 * lag: the worker computing iteration t holds W^(t - s), PF's blocking rule at its bound)
 * or, under SSP by default, from plain pushes and a chain of PULLs of U^v, U^(v+1), ...
 * (it blocks only while clock - version > s). A worker at most s iterations ahead of the
 * slowest, with `credits` operations per key, needs U^u kept until the slowest has it:
 * broadcast jobs need window >= 2s + 1 + credits (pbox_job_min_window, enforced by pboxd).
 *
 * Payloads are dense floats or, for jobs with DVF, DVF blocks: engine/encoding.h says how
 * blocks are validated, aggregated (deterministic mode included) and how the results of
 * such jobs are filtered.
 *
 * Addresses: a rank's first valid datagram to a core under its current cookie pins the
 * address replies go to; datagrams with that cookie from anywhere else are dropped
 * (bad_source) and never answered, so a valid cookie cannot aim replies at a victim.
 * Moving takes a new registration (pboxd draws a new cookie). The control connection's
 * address is not used: the data network may differ from the control network.
 *
 * Threading: one struct pbox_engine per data-plane core, used only by that core. The
 * job table is read under RCU (the caller holds the read side / is between quiescent
 * states); per-core job state is written only by the owning core.
 */
#ifndef PBOX_ENGINE_H
#define PBOX_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "job.h"

/* Per-core counters. Written by the owning core only (PBOX_STAT_ADD), read by any thread
 * with pbox_stat_read(); each value is individually consistent. */
struct pbox_core_stats {
	uint64_t rx_pkts;
	uint64_t rx_bytes;
	uint64_t tx_pkts;
	uint64_t tx_bytes;
	uint64_t tx_errors;      /* datagrams the transport could not send */
	uint64_t agg_frags;      /* gradient fragments aggregated */
	uint64_t agg_bytes;      /* gradient payload bytes aggregated */
	uint64_t iterations;     /* chunk iterations completed (= optimizer steps per chunk) */
	uint64_t dups;           /* duplicate fragments ignored */
	uint64_t rx_retransmits; /* datagrams marked as retransmissions */
	uint64_t replies_resent; /* results sent again after a lost reply */
	uint64_t pulls_held;     /* pulls that had to wait */
	uint64_t acks;           /* ACKs sent, NACKs included */
	uint64_t nacks;          /* NACKs (PBOX_F_SACK): a send round ended incomplete */
	uint64_t errors_sent;
	uint64_t folded_frags;       /* straggler fragments added to a later iteration */
	uint64_t late_contribs;      /* straggler contributions completed (all folded) */
	uint64_t membership_changes; /* reconciliations after ranks left */
	uint64_t nonfinite;          /* NaN / Inf gradient values received (either policy) */
	uint64_t dvf_blocks;         /* DVF blocks received and decoded (engine/encoding.h) */
	uint64_t dvf_rejects[PBOX_DVF_REJ_COUNT_REASONS]; /* why blocks were refused */
	uint64_t dvf_in_bytes;  /* PUSH payload bytes of jobs with DVF (blocks or dense) */
	uint64_t dvf_in_dense;  /* the bytes they stand for, dense */
	uint64_t dvf_in_vals;   /* values they carry (a dense fragment: all) */
	uint64_t dvf_out_frags; /* result fragments filtered (jobs with DVF) */
	uint64_t dvf_out_bytes; /* their bytes as sent */
	uint64_t dvf_out_dense; /* their bytes dense */
	uint64_t dvf_out_vals;  /* values they carry (the rest stays in the residual) */
	uint64_t drops[PBOX_DROP_COUNT];
	uint64_t busy_cycles; /* TSC cycles of loop iterations that did work */
	uint64_t idle_cycles; /* TSC cycles of empty polls (and idle sleeps) */
	uint64_t polls;
} PBOX_CACHE_ALIGNED;

#define PBOX_STAT_ADD(s, field, v) __atomic_store_n(&(s)->field, (s)->field + (v), __ATOMIC_RELAXED)

static inline uint64_t pbox_stat_read(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

struct pbox_engine {
	uint32_t core; /* this core's index in the job chunk maps */
	const struct pbox_kernels *kern;
	const struct pbox_tx_ops *tx;
	void *tx_ctx;
	struct pbox_core_stats *stats;
	uint64_t released; /* payload datagrams the transport has released (see reclaim) */
	/* The job table last passed to pbox_engine_observe_table, and its generation (a new
	 * table may be allocated where a freed one was). */
	const struct pbox_jobtab *seen_tab;
	uint64_t seen_tab_generation;
	/* Decoders' and encoders' scratch (engine/encoding.h): created on the first DVF
	 * payload, freed by pbox_engine_fini. Zero-initialise it with the rest. */
	struct pbox_enc_core *enc;
};

/* Free what the engine allocated for itself (the encodings' scratch); the engine may be
 * used again afterwards (it allocates anew). */
void pbox_engine_fini(struct pbox_engine *e);

/*
 * Handle one datagram of len bytes received from peer `from`, against job table tab
 * (may be NULL: everything is then an unknown job). The datagram is only read, and only
 * during the call. Never fails: what cannot be used is dropped and counted.
 */
void pbox_engine_rx(struct pbox_engine *e, const struct pbox_jobtab *tab, const void *pkt,
		    size_t len, const struct pbox_peer *from);

/*
 * The same for a datagram in nseg pieces (seg[0] starts at the pbox header; total bytes
 * = sum of the lengths). Payload bytes are read from the pieces in place, whatever their
 * boundaries (a float split across two pieces is reassembled); the result is bit-identical
 * to pbox_engine_rx on the same bytes. nseg <= PBOX_ENGINE_MAX_SEGS.
 */
#define PBOX_ENGINE_MAX_SEGS 64
void pbox_engine_rx_iov(struct pbox_engine *e, const struct pbox_jobtab *tab,
			const struct pbox_iov *seg, unsigned nseg, const struct pbox_peer *from);

/* The job table changed (call when a core sees a new table): chunks of jobs whose
 * membership changed stop waiting for departed ranks and answer what they can. */
void pbox_engine_job_changed(struct pbox_engine *e, const struct pbox_jobtab *tab);

/*
 * Call once per poll-loop iteration with the job table the core reads now (may be NULL):
 * when it is not the table seen last time, runs pbox_engine_job_changed and flushes what
 * that queued, so departed ranks are reconciled without waiting for a datagram. Costs a
 * comparison when the table did not change.
 */
void pbox_engine_observe_table(struct pbox_engine *e, const struct pbox_jobtab *tab);

/* Flush queued replies (call at the end of every receive burst). */
void pbox_engine_flush(struct pbox_engine *e);

#endif /* PBOX_ENGINE_H */
