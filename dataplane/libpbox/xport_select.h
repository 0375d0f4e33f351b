/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Which data path a worker uses: kernel UDP, or the shared-memory rings
 * (transport/shm/shm.h) when pboxd runs on the same host.
 *
 * The choice: $PBOX_TRANSPORT says "udp", "shm" or "auto" (the default). auto takes shm when
 * pboxd's registration answer offers a socket, the data address pboxd named is one of this host's
 * (a loopback address or an address of a local interface), and no worker-side fault injection is
 * asked for (fault injection is the UDP socket's); otherwise UDP. "shm" forces it: registration
 * fails if it cannot be set up. "udp" never tries it.
 *
 * No state; any thread.
 */
#ifndef PBOX_XPORT_SELECT_H
#define PBOX_XPORT_SELECT_H

#include <stdbool.h>
#include <stddef.h>

enum pbox_xsel_mode {
	PBOX_XSEL_AUTO = 0,
	PBOX_XSEL_UDP,
	PBOX_XSEL_SHM,
};

/* Parse "auto" / "udp" / "shm" (NULL or "": auto). 0 or -EINVAL. */
int pbox_xsel_parse(const char *s, enum pbox_xsel_mode *out);

/* Whether the IPv4 address addr (numeric) is this host's: 127.0.0.0/8 or an address of a
 * local interface (getifaddrs). */
bool pbox_xsel_addr_is_local(const char *addr);

/*
 * Whether to try shared memory: mode as parsed, advertised the socket pboxd offered (NULL
 * if none), data_addr where pboxd's data plane is, fault whether worker-side fault
 * injection is on. why (if not NULL) says why not, for the log.
 */
bool pbox_xsel_want_shm(enum pbox_xsel_mode mode, const char *advertised, const char *data_addr,
			bool fault, char *why, size_t whylen);

#endif /* PBOX_XPORT_SELECT_H */
