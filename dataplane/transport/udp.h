/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernel-UDP transport: one non-blocking socket, recvmmsg / sendmmsg bursts, optional
 * seeded fault injection on the send side. The embedded default transport of pboxd (one
 * instance per data-plane core, bound to base_port + core) and the transport of libpbox.
 *
 * Receive: pbox_udp_rx_burst() fills up to `burst` datagrams into buffers owned by the
 * instance; their data stays valid until the next rx call. No copy beyond the kernel's.
 * Send: pbox_udp_send() queues (header copied, payload referenced) and sends a full
 * batch with one sendmmsg; pbox_udp_flush() sends the rest. When the socket buffer is
 * full the flush waits for room briefly, then drops what is left (reliability is above).
 * Datagrams go out with DF set: one larger than the path MTU fails with a logged error
 * naming the size, never silently fragments.
 *
 * Thread safety: one thread per instance.
 */
#ifndef PBOX_UDP_H
#define PBOX_UDP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/xport.h"
#include "fault.h"

#define PBOX_UDP_DEFAULT_BURST 32u
#define PBOX_UDP_MAX_BURST     256u
/* Largest datagram the receive buffers take: the pbox header plus the largest payload. */
#define PBOX_UDP_MAX_DGRAM (PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD)

struct pbox_udp_cfg {
	const char *addr; /* local IPv4 address to bind ("0.0.0.0" / NULL: any) */
	uint16_t port;    /* 0: ephemeral */
	unsigned burst;   /* datagrams per recvmmsg / sendmmsg (0: default) */
	int sock_buf;     /* SO_RCVBUF / SO_SNDBUF bytes (0: 8 MiB) */
	struct pbox_fault_cfg fault;
};

struct pbox_udp_stats {
	uint64_t rx_pkts;
	uint64_t rx_bytes;
	uint64_t rx_truncated;
	uint64_t tx_pkts;
	uint64_t tx_bytes;
	uint64_t tx_dropped; /* could not be sent (socket full, errors) */
	uint64_t tx_waits;   /* times a flush had to wait for socket room */
};

struct pbox_udp;

/* Open and bind. Returns NULL after logging why (address in use, bad address...). */
struct pbox_udp *pbox_udp_open(const struct pbox_udp_cfg *cfg);
void pbox_udp_close(struct pbox_udp *u);

int pbox_udp_fd(const struct pbox_udp *u);
/* Bound port (host order), useful after binding port 0. */
uint16_t pbox_udp_port(const struct pbox_udp *u);

/* Receive up to max (<= burst) datagrams without blocking; returns the count. */
unsigned pbox_udp_rx_burst(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max);

/* Block up to timeout_ms (-1: forever) until a datagram is readable or wake_fd (if >= 0)
 * is readable. Returns > 0 if the socket is readable, 0 on timeout or wake, or -errno. */
int pbox_udp_wait(struct pbox_udp *u, int timeout_ms, int wake_fd);

/* struct pbox_tx_ops for this transport; ctx is the struct pbox_udp. */
extern const struct pbox_tx_ops pbox_udp_tx_ops;

const struct pbox_udp_stats *pbox_udp_stats(const struct pbox_udp *u);
const struct pbox_fault *pbox_udp_fault(const struct pbox_udp *u);

/* Resolve "a.b.c.d" (or a host name) and port into a peer; 0 or -EINVAL. */
int pbox_peer_from_str(struct pbox_peer *p, const char *host, uint16_t port);
/* "a.b.c.d:port" of a peer, into buf. */
const char *pbox_peer_str(const struct pbox_peer *p, char *buf, unsigned len);

#endif /* PBOX_UDP_H */
