/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TSB (Parameter Flow's tree-based streaming broadcast, pf.md §3.4.2): the parts the
 * appliance and the workers share.
 *
 *  - The tree of a job: parent[r] is rank r's parent, a rank or PBOX_TSB_ROOT (the
 *    appliance). Built deterministically from a degree T and a depth H (a complete T-ary
 *    tree filled breadth-first in rank order), or given explicitly (a job's `tree.parent`,
 *    pbox-ctrld's plan) and checked (rooted, acyclic, every rank reached, degree <= T,
 *    depth <= H).
 *  - The per-session key (32 random bytes from pboxd, given to each rank at registration
 *    over the control channel) and the MAC of a broadcast fragment: keyed BLAKE2b
 *    (libsodium crypto_generichash) over the 56 header bytes before the tag and the
 *    payload, truncated to 64 bits and carried in the header's sack word (PBOX_F_TREE).
 *    The appliance computes it once per fragment; relays forward the datagram unchanged
 *    and every receiver verifies it. Every worker of the job holds the key: the MAC keeps
 *    out whoever is not a member of the session, not a member that lies.
 *  - The broadcast cookie: the cookie field of a broadcast fragment is the same for every
 *    receiver (relays do not rewrite it), derived from the key.
 *
 * Thread safety: pure functions over caller-owned data (pbox_tsb_key_new reads getrandom).
 */
#ifndef PBOX_TSB_H
#define PBOX_TSB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "xport.h"

#define PBOX_TSB_KEY_BYTES  32
#define PBOX_TSB_ROOT       UINT32_MAX /* parent of a rank the appliance feeds */
#define PBOX_TSB_MAX_DEGREE 64u
#define PBOX_TSB_MAX_DEPTH  16u

struct pbox_tsb_key {
	uint8_t b[PBOX_TSB_KEY_BYTES];
};

/* Draw a fresh key. 0 or -EIO. */
int pbox_tsb_key_new(struct pbox_tsb_key *k);

/* Hex form (64 lowercase digits + NUL) and back. parse: 0 or -EINVAL (not 64 hex digits). */
void pbox_tsb_key_hex(const struct pbox_tsb_key *k, char out[2 * PBOX_TSB_KEY_BYTES + 1]);
int pbox_tsb_key_parse(const char *hex, struct pbox_tsb_key *k);

/* The MAC of the datagram hdr + payload (len bytes): over hdr's first 56 bytes and the
 * payload. Never 0 (0 is mapped to 1, so a zero tag is always a forgery). */
uint64_t pbox_tsb_mac(const struct pbox_tsb_key *k, const struct pbox_wire_hdr *hdr,
		      const void *payload, uint32_t len);

/* Whether the datagram pkt (len >= 64 bytes, header + payload) carries its MAC. Constant
 * time in the tag comparison. */
bool pbox_tsb_verify(const struct pbox_tsb_key *k, const void *pkt, uint32_t len);

/* The session's broadcast cookie (never 0). */
uint64_t pbox_tsb_cookie(const struct pbox_tsb_key *k);

/*
 * The deterministic tree of n ranks with degree T and depth H: ranks fill the tree
 * breadth-first (the appliance's children are ranks 0..T-1, rank i's children are
 * T + i*T .. T + i*T + T-1). Returns 0, -EINVAL (T or H out of 1..PBOX_TSB_MAX_*) or
 * -E2BIG (n > T + T^2 + ... + T^H).
 */
int pbox_tsb_tree_build(uint32_t n, uint32_t degree, uint32_t depth, uint32_t *parent);

/*
 * Check an explicit tree: every parent a rank < n or PBOX_TSB_ROOT, no cycle, at most
 * degree children per node (the appliance included), no rank deeper than depth (the
 * appliance's children are at depth 1). 0 or -EINVAL with err saying why.
 */
int pbox_tsb_tree_check(uint32_t n, const uint32_t *parent, uint32_t degree, uint32_t depth,
			char *err, size_t errlen);

/*
 * Who feeds rank r now: its parent if that is live and not bypassed, else the appliance
 * (PBOX_TSB_ROOT): relays forward only to the children they were told about, so the
 * orphans of a rank that left or stalled are adopted by the appliance, not by a
 * grandparent. live: bitmap of ranks in the session (NULL: all); bypass: ranks whose
 * children the appliance feeds itself (a stalled relay; NULL: none).
 */
uint32_t pbox_tsb_feeder(const uint32_t *parent, uint32_t r, const uint64_t *live,
			 const uint64_t *bypass);

/* A worker's place in the tree, as pboxd tells it (pbox_tsb_pos_decode, common/tsbmsg.h). */
struct pbox_tsb_pos {
	uint64_t revision;
	uint32_t parent;              /* a rank or PBOX_TSB_ROOT */
	struct pbox_peer parent_addr; /* zero when parent is PBOX_TSB_ROOT */
	uint32_t nchildren;
	uint32_t child[PBOX_TSB_MAX_DEGREE];
	struct pbox_peer child_addr[PBOX_TSB_MAX_DEGREE];
};

#endif /* PBOX_TSB_H */
