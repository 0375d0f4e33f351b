/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's TSB relay (common/tsb.h, pf.md §3.4.2): what a node knows of the job's
 * broadcast tree (the session key, its parent and its children) and the handling of a
 * broadcast fragment (PBOX_F_TREE) before the node consumes its own copy:
 *   1. the header is validated as every datagram is (pbox_wire_validate), against the
 *      session's broadcast cookie instead of the rank's own;
 *   2. it must come from the parent's data address or from the appliance core that owns
 *      the chunk (checked by the node, which knows the cores);
 *   3. its MAC must verify under the session key;
 *   4. it is forwarded unchanged (the same bytes, no decode, no re-encode) to every child
 *      before the node reads it: fragments are independent, so a relay never waits for a
 *      whole chunk or message.
 * Failures are counted (node stats: tsb_not_parent, tsb_bad_mac, drops by reason).
 * Loss below a relay is repaired by the child itself: it asks the appliance for what is
 * missing (the node's selective result PULL), and the appliance bypasses a relay whose
 * children keep asking (engine/bcast.h).
 *
 * Threading: owned by its node, used on the node's thread only.
 */
#ifndef PBOX_RELAY_H
#define PBOX_RELAY_H

#include <stdbool.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "common/jobdesc.h"
#include "common/tsb.h"
#include "common/wire_check.h"
#include "common/xport.h"

struct pbox_relay {
	struct pbox_tsb_key key;
	uint64_t cookie; /* the session's broadcast cookie */
	struct pbox_wire_job wire;
	struct pbox_tsb_pos pos;
	bool positioned; /* pos is set (before: fragments only from the appliance) */
};

/* Set up for job `job` (desc) with the session key. */
void pbox_relay_init(struct pbox_relay *r, uint32_t job, const struct pbox_jobdesc *desc,
		     const struct pbox_tsb_key *key);

/* Whether the datagram is a broadcast fragment (DATA flagged PBOX_F_TREE): a peek at two
 * header fields; nothing is validated yet. */
bool pbox_relay_is_tree(const void *pkt, uint32_t len);

/* Step 1: validate. PBOX_DROP_NONE and *m, or the reason. */
enum pbox_drop_reason pbox_relay_check(const struct pbox_relay *r, const void *pkt, uint32_t len,
				       struct pbox_msg *m);

/* Step 2's half: whether from is the parent's data address. */
bool pbox_relay_from_parent(const struct pbox_relay *r, const struct pbox_peer *from);

/* Step 3. */
bool pbox_relay_verify(const struct pbox_relay *r, const void *pkt, uint32_t len);

/* Step 4: queue the datagram unchanged to every child; returns the number queued. The
 * payload is referenced by the transport until its next flush (the caller's receive
 * buffer must live until then, as libpbox's progress loop guarantees). */
uint32_t pbox_relay_forward(const struct pbox_relay *r, const void *pkt, uint32_t len,
			    const struct pbox_tx_ops *tx, void *tx_ctx);

#endif /* PBOX_RELAY_H */
