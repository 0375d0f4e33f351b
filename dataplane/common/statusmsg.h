/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The status request of pboxd's and pbox-ctrld's control channels (`pbox status`):
 *
 *   {"op":"status", "job":N?, "max_groups":G?, "max_ranges":R?, "max_ranks":K?,
 *    "admin_token":"..."?}
 *     -> {"ok":true,"daemon":"pboxd"|"pbox-ctrld","jobs":[...], ...}
 *
 * job: only that job (absent or null: every job). The other members bound the answer:
 * max_groups distinct (iteration, missing ranks) groups of waiting chunks per job,
 * max_ranges ranges in each list of chunks or ranks ("0-11,14 (+5 more)"), max_ranks ranks
 * listed per job. Operators only (admin token or the local Unix socket).
 *
 * Thread safety: no state.
 */
#ifndef PBOX_STATUSMSG_H
#define PBOX_STATUSMSG_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define PBOX_STATUS_GROUPS_DEFAULT 8u
#define PBOX_STATUS_GROUPS_MAX     64u
#define PBOX_STATUS_RANGES_DEFAULT 16u
#define PBOX_STATUS_RANGES_MAX     256u
#define PBOX_STATUS_RANKS_DEFAULT  64u
#define PBOX_STATUS_RANKS_MAX      1024u

struct pbox_statusmsg {
	int64_t job; /* -1: every job */
	uint32_t max_groups;
	uint32_t max_ranges;
	uint32_t max_ranks;
	const char *admin_token; /* NULL: none; points into the request */
};

/* Decode req (an untrusted object; its "op" is not checked). Absent members take their
 * defaults. 0, or -EINVAL with err naming the member. */
int pbox_statusmsg_decode(const json_t *req, struct pbox_statusmsg *m, char *err, size_t errlen);

/* The request for m (admin_token included when set): a new object, NULL without memory. */
json_t *pbox_statusmsg_encode(const struct pbox_statusmsg *m);

/* m with every default and job -1. */
void pbox_statusmsg_defaults(struct pbox_statusmsg *m);

#endif /* PBOX_STATUSMSG_H */
