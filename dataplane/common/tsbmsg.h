/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TSB's control-channel messages (pboxd -> worker; common/ctlproto.h frames them):
 *
 *   register's answer carries "tsb_key":"<64 hex digits>" when the job broadcasts down a
 *   tree (the session key, common/tsb.h), and once every rank's data address is known
 *   pboxd tells each rank its place:
 *     {"event":"tsb","revision":R,"parent":P,"parent_addr":"a.b.c.d:port",
 *      "children":[[rank,"a.b.c.d:port"],...]}
 *   P is a rank, or -1 (the appliance; then no parent_addr). The addresses are the data
 *   addresses the appliance pinned for those ranks (engine.h).
 *
 * Thread safety: pure functions.
 */
#ifndef PBOX_TSBMSG_H
#define PBOX_TSBMSG_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "tsb.h"

/* {"event":"tsb",...} for pos (NULL: out of memory). */
json_t *pbox_tsb_pos_encode(const struct pbox_tsb_pos *pos);

/*
 * Decode the event (untrusted: whoever is at the other end of the control channel) for
 * rank `self` of a job of `workers` ranks, strictly: only the members above, each with
 * its type; revision >= 1; parent -1 or a rank other than self, with parent_addr exactly
 * when it is a rank; at most PBOX_TSB_MAX_DEGREE children, distinct ranks, none self nor
 * the parent; every address a dotted IPv4 address and a port 1..65535. 0, or -EINVAL with
 * err naming the member.
 */
int pbox_tsb_pos_decode(const json_t *j, uint32_t workers, uint32_t self, struct pbox_tsb_pos *pos,
			char *err, size_t errlen);

/* "a.b.c.d:port" <-> peer (network byte order). parse: 0 or -EINVAL. */
int pbox_tsb_addr_parse(const char *s, struct pbox_peer *p);
void pbox_tsb_addr_fmt(const struct pbox_peer *p, char *out, size_t len);

#endif /* PBOX_TSBMSG_H */
