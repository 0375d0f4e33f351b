/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernel-UDP transport: one socket, recvmmsg / sendmmsg bursts, UDP GSO on send and UDP
 * GRO on receive where the kernel has them, optional seeded fault injection on the send
 * side. The embedded default transport of pboxd (one instance per data-plane core, bound
 * to base_port + core) and the transport of libpbox.
 *
 * Receive: pbox_udp_rx_burst() fills up to `max` datagrams into buffers owned by the
 * instance; their data stays valid until the next rx call. No copy beyond the kernel's.
 * With GRO the kernel may hand over several datagrams of one sender in one buffer (a
 * `UDP_GRO` control message gives their size); the transport splits them, so callers
 * always see single pbox datagrams. Datagrams a call has no room for are returned by the
 * next call. pbox_udp_rx_wait() blocks for the first datagram, then drains.
 *
 * Send: the tx op queues (header copied, payload referenced); a full queue, flush() and
 * reclaim() send it with sendmmsg. With GSO, consecutive queued datagrams to the same
 * peer with the same size (the last of a run may be shorter) go out as one message of up
 * to 64 KB with a `UDP_SEGMENT` control message: the kernel cuts it into datagrams, so
 * MTU-1500 traffic costs about one message per 64 KB, not one per datagram. If the
 * kernel refuses GSO at run time (no UDP_SEGMENT, a socket or route it cannot segment
 * for) the transport logs it once and sends one datagram per message from then on.
 * The environment variables PBOX_UDP_GSO=0 and PBOX_UDP_GRO=0 turn either off for every
 * instance of the process (pboxd and libpbox alike), for comparisons and diagnosis.
 * When the socket buffer is full a flush waits for room briefly, then drops what is left
 * (reliability is above). Datagrams go out with DF set: one larger than the path MTU
 * fails with a logged error naming the size, never silently fragments.
 *
 * Thread safety: one thread per instance; pbox_udp_wake() and reading pbox_udp_stats()
 * (relaxed, counters may be a burst behind) are the exceptions.
 */
#ifndef PBOX_UDP_H
#define PBOX_UDP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/xport.h"
#include "transport/fault.h"
#include "transport/udp/kpace.h"

#define PBOX_UDP_DEFAULT_BURST 32u
#define PBOX_UDP_MAX_BURST     256u
/* Largest datagram the receive buffers take: the pbox header plus the largest payload. */
#define PBOX_UDP_MAX_DGRAM (PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD)
/* Largest UDP payload over IPv4 (65535 - 20 - 8): the bound of one GSO message, and the
 * receive buffer size with GRO (a coalesced buffer never exceeds one IP packet's limit). */
#define PBOX_UDP_MAX_MSG 65507u
/* Datagrams per GSO message: the kernel's UDP_MAX_SEGMENTS (64 before Linux 6.9). */
#define PBOX_UDP_GSO_MAX_SEGS 64u
/* Socket buffer asked for when the configuration gives none (the kernel doubles it for
 * its own bookkeeping): a few windows of several workers, so a burst does not overflow. */
#define PBOX_UDP_DEFAULT_SOCK_BUF (32 << 20)

struct pbox_udp_cfg {
	const char *addr; /* local IPv4 address to bind ("0.0.0.0" / NULL: any) */
	uint16_t port;    /* 0: ephemeral */
	unsigned burst;   /* datagrams per recvmmsg / sendmmsg (0: default) */
	int sock_buf;     /* SO_RCVBUF / SO_SNDBUF bytes (0: PBOX_UDP_DEFAULT_SOCK_BUF) */
	bool no_gso;      /* never use UDP_SEGMENT (the fallback path, for tests / old kernels) */
	bool no_gro;      /* never enable UDP_GRO */
	struct pbox_fault_cfg fault;
	/* Kernel pacing (kpace.h): departure times on every message (SO_TXTIME), honoured
	 * where the egress interface has the fq qdisc. pboxd and libpbox turn it on with
	 * PBOX_KPACE=1 in their environment (pbox_kpace_env_on). */
	bool kpace;
	bool kpace_per_dst;      /* one timeline per destination (else one per socket) */
	uint64_t kpace_rate_Bps; /* first rate (0: none until pbox_udp_set_pace_rate) */
	uint64_t kpace_lead_ns;  /* most a message is held (0: PBOX_KPACE_DEFAULT_LEAD_NS) */
	const char *kpace_peer;  /* bound to any address: the main peer, whose route says
				    which interface's qdisc to check (NULL: every interface) */
};

struct pbox_udp_stats {
	uint64_t rx_pkts; /* datagrams delivered (after GRO splitting) */
	uint64_t rx_bytes;
	uint64_t rx_truncated;
	uint64_t rx_calls;    /* recvmmsg calls, empty ones included: rx_pkts / rx_calls is
			       * the datagrams per call */
	uint64_t rx_empty;    /* recvmmsg calls that returned nothing */
	uint64_t rx_msgs;     /* messages the kernel returned (a GRO message holds several) */
	uint64_t rx_gro_msgs; /* of which coalesced by GRO */
	uint64_t rx_placed;   /* datagrams whose payload went straight to an offered place */
	uint64_t rx_unplaced; /* offered places that got another datagram (copied back out) */
	uint64_t tx_pkts;
	uint64_t tx_bytes;
	uint64_t tx_dropped;  /* could not be sent (socket full, errors) */
	uint64_t tx_waits;    /* times a flush had to wait for socket room */
	uint64_t tx_calls;    /* sendmmsg calls */
	uint64_t tx_msgs;     /* messages handed to the kernel (a GSO message holds several) */
	uint64_t tx_gso_msgs; /* of which GSO messages */
};

/* What the socket got from the kernel, for logs and stats. */
struct pbox_udp_info {
	int rcvbuf; /* effective SO_RCVBUF (as getsockopt reports it: twice the payload room) */
	int sndbuf;
	bool gso;           /* UDP_SEGMENT in use (false after a run-time fallback) */
	bool gro;           /* UDP_GRO enabled */
	bool kpace;         /* departure times are set (SO_TXTIME accepted) */
	int kpace_egress;   /* with kpace: 1 fq on the egress, 0 none (ignored), < 0 unknown */
	int txtime_clockid; /* getsockopt(SO_TXTIME)'s clock (-1: unreadable); CLOCK_MONOTONIC
			     * with kpace */
};

struct pbox_udp;

/* Open and bind. Returns NULL after logging why (address in use, bad address...). */
struct pbox_udp *pbox_udp_open(const struct pbox_udp_cfg *cfg);
void pbox_udp_close(struct pbox_udp *u);

int pbox_udp_fd(const struct pbox_udp *u);
/* Bound port (host order), useful after binding port 0. */
uint16_t pbox_udp_port(const struct pbox_udp *u);

/* Receive up to max datagrams without blocking; returns the count. With GRO one kernel
 * message may hold many datagrams: give room for PBOX_UDP_MAX_BURST or more to take a
 * whole burst per call. */
unsigned pbox_udp_rx_burst(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max);

/* Like pbox_udp_rx_burst(), but block up to timeout_ms (> 0) for the first datagram (one
 * recvmmsg with MSG_WAITFORONE: no separate poll). Returns 0 on timeout, on a signal, or
 * at once forever after pbox_udp_wake(). */
unsigned pbox_udp_rx_wait(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max,
			  int timeout_ms);

/* Whether the next rx call may return datagrams at once: some of the last message(s) are
 * not handed out yet, or the last recvmmsg filled every slot it offered. False means the
 * socket was drained by the last call: a caller about to poll() the socket anyway can
 * skip a receive that would most likely come back empty (one system call fewer per
 * wake-up); poll() still sees whatever arrived meanwhile. */
bool pbox_udp_rx_more(const struct pbox_udp *u);

/*
 * Receive placement: the payload of a datagram received straight into the memory it is
 * meant for (libpbox: a result fragment into the caller's buffer), no copy after the
 * kernel's. place[i] (i < nplace) is where the caller expects the payload (the bytes after
 * the 64-byte pbox header) of the i-th message of this call, and how long it is; the
 * message is received as header -> the slot's own buffer, payload -> place[i].dst, the
 * rest (if longer) -> the slot's buffer after room for place[i].len bytes.
 *
 * On return placed[k] says, for each datagram k < the count returned, which place holds
 * its payload (>= 0), or -1: pkts[k].data is then the whole datagram, contiguous, as
 * with pbox_udp_rx_burst (the bytes that went to a place were copied back). A datagram
 * is left placed only if it is a single datagram of exactly PBOX_WIRE_HDR_LEN +
 * place.len bytes; its pkts[k].data is then the header, followed by place.len bytes of
 * room the caller may copy the payload into if it decides against the place (the
 * buffer is the transport's, valid until the next rx call). The transport does not look
 * at headers: whether a placed datagram is the one expected is the caller's to check.
 *
 * Every offered place's bytes may have been overwritten by whatever datagram arrived in
 * its slot, whether or not it is returned as placed: offer only memory whose contents are
 * dead until a datagram validly fills it. Places are not offered to messages GRO could
 * coalesce (two datagrams of the place's size fit into one message): the transport then
 * ignores them (a coalesced message would need a copy back, and GRO's saving is larger).
 * Datagrams returned by a later call (no room in pkts) are never placed. timeout_ms > 0
 * blocks for the first datagram as pbox_udp_rx_wait(), 0 does not block. nplace is at
 * most the burst size (larger is cut).
 */
struct pbox_udp_place {
	void *dst;
	uint32_t len;
};

unsigned pbox_udp_rx_placed(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max,
			    const struct pbox_udp_place *place, unsigned nplace, int16_t *placed,
			    int timeout_ms);

/* Any thread: make every pbox_udp_rx_wait(), now and later, return 0 at once (shuts the
 * socket's receive side down: only for stopping). */
void pbox_udp_wake(struct pbox_udp *u);

/* Block up to timeout_ms (-1: forever) until a datagram is readable or wake_fd (if >= 0)
 * is readable. Returns > 0 if the socket is readable, 0 on timeout or wake, or -errno. */
int pbox_udp_wait(struct pbox_udp *u, int timeout_ms, int wake_fd);

/* struct pbox_tx_ops for this transport; ctx is the struct pbox_udp. */
extern const struct pbox_tx_ops pbox_udp_tx_ops;

const struct pbox_udp_stats *pbox_udp_stats(const struct pbox_udp *u);
void pbox_udp_info(const struct pbox_udp *u, struct pbox_udp_info *out);
/* "rcvbuf 64 MiB, sndbuf 64 MiB, gso on, gro on, kernel pacing off" (or whether the
 * departure times are honoured, and why), into buf. */
const char *pbox_udp_info_str(const struct pbox_udp *u, char *buf, unsigned len);
const struct pbox_fault *pbox_udp_fault(const struct pbox_udp *u);

/* Kernel pacing (kpace.h): the rate of the departure times from now on, in wire bytes/s
 * (0: none). Ignored unless kernel pacing is on. Owner's thread. */
void pbox_udp_set_pace_rate(struct pbox_udp *u, uint64_t rate_Bps);
bool pbox_udp_kpace(const struct pbox_udp *u);
const struct pbox_kpace_stats *pbox_udp_kpace_stats(const struct pbox_udp *u);

/* Resolve "a.b.c.d" (or a host name) and port into a peer; 0 or -EINVAL. */
int pbox_peer_from_str(struct pbox_peer *p, const char *host, uint16_t port);
/* "a.b.c.d:port" of a peer, into buf. */
const char *pbox_peer_str(const struct pbox_peer *p, char *buf, unsigned len);

#endif /* PBOX_UDP_H */
