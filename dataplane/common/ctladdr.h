/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Per source address bookkeeping of a control-channel server (pboxd, pbox-ctrld): how many
 * connections (and unauthenticated ones) each IPv4 address holds, and a token bucket of
 * failed authentications (wrong tokens, unknown jobs) per address: `burst` failures, then
 * `per_minute`. Entries are created on first use and forgotten by pbox_ctladdr_gc once an
 * address has no connection and a full bucket.
 *
 * Threading: one thread (the server's loop); no locks.
 */
#ifndef PBOX_CTLADDR_H
#define PBOX_CTLADDR_H

#include <stdbool.h>
#include <stdint.h>

#define PBOX_CTLADDR_BUCKETS 1024u

struct pbox_ctladdr {
	uint32_t ip; /* network order */
	uint32_t nconns;
	uint32_t nunauth;
	double tokens; /* failed authentications still allowed */
	uint64_t refill_ms;
	struct pbox_ctladdr *next; /* hash chain */
};

struct pbox_ctladdr_table {
	struct pbox_ctladdr *b[PBOX_CTLADDR_BUCKETS];
	uint32_t burst;
	uint32_t per_minute;
};

/* An empty table with the failure bucket's size and refill rate. */
void pbox_ctladdr_init(struct pbox_ctladdr_table *t, uint32_t burst, uint32_t per_minute);
/* Every entry freed. */
void pbox_ctladdr_free(struct pbox_ctladdr_table *t);
/* The entry of ip (created with a full bucket), or NULL (out of memory). now_ms: any
 * monotonic milliseconds, the same clock for every call. */
struct pbox_ctladdr *pbox_ctladdr_get(struct pbox_ctladdr_table *t, uint32_t ip, uint64_t now_ms);
/* a's bucket allows another authentication attempt (refilled to now first). */
bool pbox_ctladdr_auth_allowed(const struct pbox_ctladdr_table *t, struct pbox_ctladdr *a,
			       uint64_t now_ms);
/* One failed authentication from a. */
void pbox_ctladdr_auth_failed(struct pbox_ctladdr *a);
/* Forget addresses without connections whose bucket is full again. */
void pbox_ctladdr_gc(struct pbox_ctladdr_table *t, uint64_t now_ms);

#endif /* PBOX_CTLADDR_H */
