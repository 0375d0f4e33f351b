/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * "HOST:PORT" strings, split once for every program that takes one (pboxd's control and
 * metrics listeners, libpbox's and the pbox command's pboxd address, pbox-ctrld's pboxds,
 * the probe agents, the broadcast tree's peers): the same strictness everywhere, each
 * caller adding its own checks of the host (numeric, resolvable) and its own message.
 *
 * Thread safety: no state.
 */
#ifndef PBOX_HOSTPORT_H
#define PBOX_HOSTPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Split s at its last ':' into host (NUL-terminated, hlen bytes with the NUL) and *port
 * (host byte order). The port is decimal digits only (no sign, no blanks, no trailing
 * text) with a value in [min_port, 65535]; the host is not empty unless empty_host. Does
 * not look the host up. Returns 0, or -EINVAL (no ':', a bad port, an empty host where
 * not allowed, a host of hlen bytes or more) with host and *port unchanged.
 */
int pbox_hostport_split(const char *s, bool empty_host, uint16_t min_port, char *host, size_t hlen,
			uint16_t *port);

#endif /* PBOX_HOSTPORT_H */
