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

/* A piece of a datagram that arrived in several buffers (multi-segment mbufs). */
struct pbox_iov {
	const void *base;
	uint32_t len;
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
	 * bytes of payload (len may be 0, payload then NULL). The transport may keep
	 * referencing the payload after the call: the caller must not change that memory
	 * before reclaim() has released the datagram (see queued/reclaim). Returns 0, or a
	 * negative errno if the datagram was dropped.
	 */
	int (*send)(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		    const void *payload, uint32_t len);
	/* Hand everything queued to the device / kernel. */
	void (*flush)(void *ctx);
	/* Datagrams with a payload queued so far (monotonic): a reference number for the
	 * memory those payloads point at. */
	uint64_t (*queued)(void *ctx);
	/* Return once the first `upto` payload datagrams no longer reference caller memory
	 * (kernel UDP: after a flush, since sendmmsg copies; zero-copy NIC transports: when
	 * the NIC has completed them). Returns how many are known released (>= upto). */
	uint64_t (*reclaim)(void *ctx, uint64_t upto);
};

#endif /* PBOX_XPORT_H */
