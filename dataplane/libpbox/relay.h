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
 *
 * Repair: a relay keeps the fragments it forwarded (as received, MAC included) in a
 * direct-mapped cache indexed by (chunk, fragment). A child that got part of a result
 * down the tree and misses the rest after a retransmission timeout asks its parent first
 * (a selective PULL carrying the broadcast cookie); the parent sends what it holds of that
 * result from the cache, unchanged. The child's next request goes to the appliance (the
 * fallback: its selective result resend), as does a first request for a result of which
 * nothing came (the parent may have stalled; the appliance bypasses a relay whose children
 * keep asking, engine/bcast.h). A parent answers only its own children, at their tree
 * addresses, and only with authenticated fragments it received.
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

/* Default size of a relay's repair cache. */
#define PBOX_RELAY_CACHE_BYTES (16u << 20)

struct pbox_relay_slot {
	uint32_t chunk, frag, label;
	uint32_t len; /* datagram bytes; 0: empty */
};

struct pbox_relay {
	struct pbox_tsb_key key;
	uint64_t cookie; /* the session's broadcast cookie */
	struct pbox_wire_job wire;
	struct pbox_wire_job pull_wire; /* children's PULLs: every rank's cookie is `cookie` */
	uint64_t *cookies;
	struct pbox_tsb_pos pos;
	bool positioned; /* pos is set (before: fragments only from the appliance) */
	/* repair cache (allocated once the relay has children) */
	uint8_t *cache;
	struct pbox_relay_slot *slot;
	uint32_t nslots, slot_bytes, per_chunk;
	size_t cache_bytes;
};

/* Set up for job `job` (desc) with the session key; cache_bytes: repair cache size
 * (0: PBOX_RELAY_CACHE_BYTES). 0 or -ENOMEM. */
int pbox_relay_init(struct pbox_relay *r, uint32_t job, const struct pbox_jobdesc *desc,
		    const struct pbox_tsb_key *key, size_t cache_bytes);
void pbox_relay_fini(struct pbox_relay *r);

/* Take the position pos (copied); allocates the repair cache if it has children. 0 or
 * -ENOMEM (then it relays without a cache). */
int pbox_relay_set_position(struct pbox_relay *r, const struct pbox_tsb_pos *pos);

/* Keep an accepted fragment (m: its decoded header) for children's repairs. */
void pbox_relay_keep(struct pbox_relay *r, const void *pkt, uint32_t len, const struct pbox_msg *m);

/* Whether this rank has a parent rank to ask for repairs (else: the appliance). */
bool pbox_relay_has_parent(const struct pbox_relay *r);

/* Send a PULL (m: type, flags, iter, SACK fields, chunk, chunk_len, seq, sender set) to
 * the parent with the broadcast cookie. 0 or the transport's error. */
int pbox_relay_ask_parent(const struct pbox_relay *r, struct pbox_msg *m,
			  const struct pbox_tx_ops *tx, void *tx_ctx);

/*
 * A PULL from a child (pkt, len, from): validated (header, the broadcast cookie, the
 * sender a child of ours at its tree address); then every fragment of the result it
 * asks for that it does not hold and the cache has is sent to it unchanged. Returns the
 * fragments sent, or -1 if the request was refused (*why: the reason; PBOX_DROP_NONE with
 * -1: not from a child).
 */
int pbox_relay_serve(const struct pbox_relay *r, const void *pkt, uint32_t len,
		     const struct pbox_peer *from, const struct pbox_tx_ops *tx, void *tx_ctx,
		     enum pbox_drop_reason *why);

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
