/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The contract between datagram transports (kernel UDP, DPDK, in-memory test loops) and
 * their users (the appliance's chunk engine, libpbox's worker node): peers, received
 * datagrams, and the send/flush ops.
 *
 * Threading: a transport instance is used by one thread; so are these structures.
 */
#ifndef PBOX_XPORT_H
#define PBOX_XPORT_H

#include <stdint.h>

#include <pbox/wire.h>

/* An IPv4/UDP endpoint (plus next-hop MAC for L2 transports). Network byte order. */
struct pbox_peer {
	uint32_t ip;
	uint16_t port;
	uint8_t mac[6]; /* L2 transports only */
	uint16_t ifport;
	uint16_t pad;
};

/* One received datagram: the pbox header onwards. data stays valid until the next receive
 * call on the same transport instance. */
struct pbox_rx_pkt {
	const uint8_t *data;
	uint32_t len;
	struct pbox_peer from;
};

/* Outgoing datagrams. */
struct pbox_tx_ops {
	/*
	 * Queue one datagram to peer: the 64-byte header (copied before return) and len
	 * bytes of payload (len may be 0, payload then NULL). The transport may keep the
	 * payload pointer until flush(): the caller must not change that memory before it
	 * calls flush(). Returns 0, or a negative errno if the datagram was dropped.
	 */
	int (*send)(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		    const void *payload, uint32_t len);
	/* Hand everything queued to the device / kernel. */
	void (*flush)(void *ctx);
};

#endif /* PBOX_XPORT_H */
