/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The appliance's side of TSB (tree-based streaming broadcast, common/tsb.h): a job whose
 * results are broadcasts (BSP: every live rank receives the same result of a chunk's
 * iteration) sends each result fragment once to the ranks the appliance feeds (the
 * tree's top, plus the children of ranks that left or stalled), flagged PBOX_F_TREE with
 * the session's broadcast cookie and the fragment's MAC; relays forward it unchanged.
 * Repairs stay direct: a rank that asks for a result again (a PULL, a retransmitted
 * push-pull) gets the missing fragments from the appliance as before (selective resend).
 *
 * Re-parenting: a rank that left the session (the job's live bitmap) is skipped and the
 * appliance adopts its children (pbox_tsb_feeder): relays forward only to the children
 * pboxd told them about, so a grandparent cannot take them over without a new position. A relay
 * that stalls (alive, but its children get nothing of the results it should forward and
 * ask the appliance for them) is bypassed by the core that sees that happen in
 * PBOX_TSB_STALL_PULLS different iterations in a row: from then on that core feeds the
 * relay's children itself. A child's request that shows it got part of a result through
 * the tree (a selective PULL) proves the relay forwards, and restarts the count, so loss on
 * a hop, or a relay late under CPU load, is repaired without dismantling the tree.
 *
 * Ownership and threading: struct pbox_tsb is created by the control thread for a
 * session and referenced by the published job (job->tsb); its tree and key are immutable.
 * core[k] is written only by data-plane core k. It is freed after the grace period that
 * retires the last table referencing it.
 */
#ifndef PBOX_ENGINE_BCAST_H
#define PBOX_ENGINE_BCAST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/compiler.h"
#include "common/tsb.h"
#include "common/xport.h"

/* Repair requests for broadcast results from a relay's children, seen by one core, after
 * which that core feeds the children itself. */
#define PBOX_TSB_STALL_PULLS 8u

struct pbox_tsb_core {
	uint64_t *bypass; /* ranks whose children this core feeds (stalled relays) */
	uint32_t *misses; /* per rank as a relay: iterations in a row its children got nothing */
	uint32_t *miss_label; /* the result label last counted in misses */
	uint64_t sent;        /* broadcast fragments sent (read by stats, relaxed) */
	uint64_t repairs;     /* repair requests for broadcast results */
	uint64_t bypasses;
} PBOX_CACHE_ALIGNED;

struct pbox_tsb {
	struct pbox_tsb_key key;
	uint64_t cookie; /* pbox_tsb_cookie(key) */
	uint32_t nworkers;
	uint32_t ncores;
	uint32_t *parent; /* nworkers entries */
	struct pbox_tsb_core *core;
};

/* Create for a session of nworkers ranks on ncores cores (parent copied). NULL after
 * logging why (out of memory). Control thread. */
struct pbox_tsb *pbox_tsb_create(const uint32_t *parent, uint32_t nworkers, uint32_t ncores,
				 const struct pbox_tsb_key *key);
void pbox_tsb_free(struct pbox_tsb *t);

struct pbox_core_stats;

/*
 * Send one result fragment (header template m: type DATA, iter, frag_off, frag_len,
 * arg0 set; job, chunk, chunk_len too) to every live rank the appliance feeds on core
 * `core`. peers: the core's pinned address per rank. Returns the datagrams sent.
 */
uint32_t pbox_tsb_send_frag(struct pbox_tsb *t, uint32_t core, const uint64_t *live,
			    const struct pbox_peer *peers, const struct pbox_tx_ops *tx,
			    void *tx_ctx, struct pbox_msg *m, const void *payload,
			    struct pbox_core_stats *st);

/* Rank w asked core `core` for the result `label` that went down the tree; got_some: the
 * request says it holds part of it. Counts against (or clears) the relay feeding w, and
 * bypasses that relay after PBOX_TSB_STALL_PULLS iterations in a row. */
void pbox_tsb_note_repair(struct pbox_tsb *t, uint32_t core, const uint64_t *live, uint32_t w,
			  uint32_t label, bool got_some);

#endif /* PBOX_ENGINE_BCAST_H */
