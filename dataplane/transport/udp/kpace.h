/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernel pacing of the kernel-UDP transport: every outgoing message carries its departure
 * time (SO_TXTIME / SCM_TXTIME, CLOCK_MONOTONIC, the "earliest departure time" model), and
 * the fq qdisc on the egress interface holds each packet until then. The spacing is done by
 * the kernel's timer, not by the sending thread, so a sender that was descheduled and then
 * hands over a backlog at once still puts it on the wire at the rate, instead of as a burst
 * that overflows the next rate limiter's queue (a switch port, a tbf).
 *
 * Why departure times and not SO_MAX_PACING_RATE: (1) on a UDP socket the kernel can only
 * lower the pacing rate it applies (sk_setsockopt: sk_pacing_rate = min(it, the new
 * maximum); only TCP recomputes it), so a rate that follows a congestion window that grows
 * again cannot be set that way; (2) fq keys locally generated traffic by socket, so one
 * pboxd socket serving many workers would get one rate for all of them, while departure
 * times can be kept per destination (fq orders a flow's packets by their time).
 *
 * The timeline: a message of `bytes` to a destination leaves at t = max(now, next), and
 * next becomes t + bytes / rate. A timeline that runs more than the lead ahead of now is
 * pulled back to now + lead, the lead being max_lead_ns or, at a rate so low that one
 * message takes longer, two messages' time: pacing bounds the spacing, it never holds a
 * backlog longer than that (a sender producing faster than the rate is not throttled beyond it; its
 * own congestion control sees the added delay). Timelines are one per socket (per_dst
 * false: the sender's own link is the bottleneck for all its peers: a worker) or one per
 * destination (per_dst true: each peer's link is: the appliance's results to its workers).
 *
 * Without fq on the egress interface the departure times are ignored by the kernel and
 * nothing is paced: loopback (noqueue), tbf, pfifo_fast. etf is not a pacer for this: it
 * drops what is not stamped on its own clock (CLOCK_TAI). pbox_kpace_egress()
 * looks at the qdiscs (rtnetlink) so the owner can say whether pacing is in effect.
 *
 * Threading: a struct pbox_kpace is used by one thread (the transport instance's);
 * pbox_kpace_egress() is reentrant.
 */
#ifndef PBOX_UDP_KPACE_H
#define PBOX_UDP_KPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes a datagram costs on an Ethernet link besides its UDP payload: IPv4 20, UDP 8,
 * Ethernet 14 (what a tbf counts on a veth). */
#define PBOX_KPACE_L2_OVERHEAD 42u
/* Default most time a message is held: well under the RTO floors (libpbox: 10 ms RTO,
 * 2 ms probe), a few of the path's RTTs in netlab. */
#define PBOX_KPACE_DEFAULT_LEAD_NS 5000000ull
/* Destinations with their own timeline (per_dst); more share the socket's. */
#define PBOX_KPACE_MAX_DST 1024u

struct pbox_kpace_stats {
	uint64_t stamped;     /* messages given a departure time */
	uint64_t delayed;     /* of which later than the time of sending */
	uint64_t capped;      /* of which pulled back to the most lead */
	uint64_t shared;      /* per_dst: messages on the shared timeline (table full) */
	uint64_t lead_max_ns; /* most a timeline was ahead of a sending (before the cap):
			       * the largest backlog above the rate, in time at the rate */
};

struct pbox_kpace_dst {
	uint32_t ip;   /* network order */
	uint16_t port; /* network order */
	bool used;
	uint64_t next_ns;
};

struct pbox_kpace {
	uint64_t rate_Bps;    /* 0: no departure times (the kernel sends at once) */
	uint64_t max_lead_ns; /* 0: PBOX_KPACE_DEFAULT_LEAD_NS */
	bool per_dst;
	uint64_t next_ns;           /* the socket's timeline */
	struct pbox_kpace_dst *dst; /* per_dst: PBOX_KPACE_MAX_DST entries, owned */
	struct pbox_kpace_stats stats;
};

/* Set up k (rate 0: not pacing until pbox_kpace_set_rate). Returns 0 or -ENOMEM. */
int pbox_kpace_init(struct pbox_kpace *k, bool per_dst, uint64_t rate_Bps, uint64_t max_lead_ns);
void pbox_kpace_fini(struct pbox_kpace *k);

static inline void pbox_kpace_set_rate(struct pbox_kpace *k, uint64_t rate_Bps)
{
	k->rate_Bps = rate_Bps;
}

/* The departure time (CLOCK_MONOTONIC ns, >= now) of a message of `bytes` wire bytes to
 * ip:port (network order) handed to the kernel at `now`, advancing the timeline; 0 when
 * no rate is set (send without a time). */
uint64_t pbox_kpace_stamp(struct pbox_kpace *k, uint32_t ip, uint16_t port, uint64_t bytes,
			  uint64_t now);

/* Whether the kernel would apply departure times on the interfaces that carry traffic from
 * local IPv4 address local_ip (network order; 0: every interface that is up and not a
 * loopback): 1 if each has an fq qdisc (anywhere in its tree, e.g. fq under a tbf), 0 if
 * not (why: which interface has which root qdisc, that traffic stays on loopback, or that
 * an etf qdisc is there: etf drops CLOCK_MONOTONIC times, so it counts as not pacing),
 * -errno if the qdiscs cannot be read (why says so). */
int pbox_kpace_egress(uint32_t local_ip, char *why, size_t len);

/* The local IPv4 address (network order) the routing table picks for traffic to peer_ip
 * (network order), into *local. Returns 0 or -errno (no route...). */
int pbox_kpace_route_src(uint32_t peer_ip, uint32_t *local);

/* Whether the environment asks for kernel pacing: PBOX_KPACE=1 (pboxd and libpbox read
 * it; off by default). */
bool pbox_kpace_env_on(void);

/* Parse a rate "1000000000", "1g", "200m", "500k" (bit/s, decimal suffixes) into bytes/s.
 * Returns 0 or -EINVAL. */
int pbox_kpace_parse_rate(const char *s, uint64_t *Bps);

#endif /* PBOX_UDP_KPACE_H */
