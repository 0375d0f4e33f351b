/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The single validation entry point of every pbox receiver (appliance cores, DPDK lcores,
 * libpbox nodes): header decode (pbox_wire_decode) plus every field checked against the
 * admitted job the datagram names.
 *
 * Thread safety: pure functions over caller-owned data.
 */
#ifndef PBOX_WIRE_CHECK_H
#define PBOX_WIRE_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "jobdesc.h"

enum pbox_role {
	PBOX_ROLE_APPLIANCE, /* accepts PUSH, PULL, INIT from admitted workers */
	PBOX_ROLE_WORKER,    /* accepts DATA, ACK, ERROR from the appliance */
};

/* What a receiver knows about one admitted job. */
struct pbox_wire_job {
	uint32_t id;
	const struct pbox_jobdesc *desc;
	/* APPLIANCE: the session cookie of each rank (0: rank not admitted).
	 * WORKER: cookies[0] is this worker's own session cookie. */
	const uint64_t *cookies;
	/* Whether INIT is accepted (server-optimizer jobs, from rank 0 only). */
	bool accepts_init;
	/* Whether PBOX_ENC_DVF payloads are accepted (APPLIANCE: in PUSH, jobs with a dvf
	 * group; WORKER: in DATA, when the job's results are filtered). */
	bool accepts_dvf;
};

/* Look up an admitted job by namespace id; NULL if none. */
typedef const struct pbox_wire_job *(*pbox_wire_lookup_fn)(void *arg, uint32_t job);

/*
 * Check a decoded message against its job for a receiver in role: direction and sender
 * rank, cookie, chunk id and chunk_len, fragment on the job's fragment grid with the exact
 * length that fragment must have (a PBOX_ENC_DVF block: only if the job accepts them, and
 * no longer than that length; its contents are the block decoder's), INIT rules, and a PBOX_F_SACK
 * bitmap on the grid with no bit past the chunk's last fragment. Returns PBOX_DROP_NONE or the
 * reason.
 */
enum pbox_drop_reason pbox_wire_check(const struct pbox_msg *m, const struct pbox_wire_job *job,
				      enum pbox_role role);

/*
 * Decode buf (len bytes), find the job with lookup, and check. On PBOX_DROP_NONE, *m is
 * the message and *jobp its job; otherwise the datagram must be dropped (and counted).
 */
enum pbox_drop_reason pbox_wire_validate(const void *buf, size_t len, enum pbox_role role,
					 pbox_wire_lookup_fn lookup, void *lookup_arg,
					 struct pbox_msg *m, const struct pbox_wire_job **jobp);

/*
 * Describe which of nfrags fragments a receiver holds (bits: one bit per fragment) as a
 * PBOX_F_SACK bitmap: *base is the first fragment not held (every one before it is),
 * *map has bit i set if fragment *base + i is held (i < PBOX_SACK_BITS, within nfrags).
 * All held: *base = nfrags, *map = 0.
 */
void pbox_sack_build(const uint64_t *bits, uint32_t nfrags, uint32_t *base, uint64_t *map);

/* Whether fragment f is held according to a SACK bitmap (base, map) as above. */
static inline bool pbox_sack_has(uint32_t base, uint64_t map, uint32_t f)
{
	return f < base || (f - base < PBOX_SACK_BITS && ((map >> (f - base)) & 1u));
}

#endif /* PBOX_WIRE_CHECK_H */
