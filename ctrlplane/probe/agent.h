/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The probe agent: both ends of a SLoPS measurement over UDP (protocol: probe_wire.h).
 *
 * Responder: answers probes on its own UDP port (PBOX_PROBE_PORT by default). It assumes
 * hostile clients: a bounded session table (max_sessions, at most max_per_addr per source
 * address, idle sessions expire), a rate limit on new sessions, one stream per session of
 * at most PBOX_SLOPS_MAX_STREAM_LEN packets, every field validated by the decoder. A
 * session is opened by HELLO and named by a random 64-bit token returned only to the
 * HELLO's source address; DATA, REPORT_REQ and BYE must carry the token and come from
 * that address. It is never a reflector or amplifier: every reply is at most as long as
 * the request that triggered it (HELLO and REPORT_REQ are padded to the longest reply),
 * so an unauthenticated or spoofed peer never gets more bytes than it sent; DATA gets no
 * reply at all. The responder never sends probe traffic. What it does not stop: a flood
 * of HELLOs from many (spoofed) addresses can keep the session table full, refusing
 * real probes (a denial of service, not an amplification); until sessions are tied to a
 * credential pbox-ctrld issues, expose the port to the cluster's addresses only.
 * The packet logic (pbox_probe_responder_input) is separate from the socket loop
 * (pbox_probe_responder_serve) so tests and the fuzz harness drive it without sockets.
 *
 * Prober: pbox_probe_run() measures the available bandwidth towards one responder, the
 * call a controller makes for a pair: request = peer, rate cap, time budget (and the
 * resolution, packet and fleet sizes); result = [r_min, r_max], grey region, the
 * dispersion rate of the first train, flags, a timestamp and the duration. It first
 * sends one stream at the cap and takes the receive dispersion rate as the search's
 * starting point (an upper estimate of the available bandwidth), then fleets of periodic
 * streams while the rate search (slops.h) needs them. Pacing is in user space: a
 * clock_nanosleep to within PBOX_PROBE_SPIN_NS of each departure, then a busy-wait on
 * CLOCK_MONOTONIC (read through the vDSO from the TSC). Rate limit: every stream's rate is
 * at most the cap, packet i of a stream never leaves before start + i * period (a sender
 * that falls behind shifts its schedule instead of catching up), streams are followed by
 * an idle gap at least as long as the stream, and no stream starts that would not end
 * within the time budget. The fleet's mean rate is therefore at most half the cap.
 *
 * Scheduling is the caller's: two probes whose paths share a link at the same time
 * load it for each other and each sees less available bandwidth, so a controller runs
 * probes of overlapping paths one after the other.
 *
 * Threading: a responder belongs to one thread (its serve loop); any number of probes
 * may run at once in different threads, each with its own socket. pbox_probe_run()
 * blocks for up to the budget plus the report timeouts of the last stream (3 tries of
 * reply_timeout_ns when reports are lost), busy-waits one core while a
 * stream is sent, and sets the calling thread's timer slack to 1 ns (and with
 * req->realtime its policy to SCHED_FIFO) for its duration, restoring both after.
 */
#ifndef PBOX_PROBE_AGENT_H
#define PBOX_PROBE_AGENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "slops.h"

#define PBOX_PROBE_SPIN_NS 1000000 /* busy-wait the last 1 ms before a departure */
/* A fleet the sender could not pace (too few undisturbed streams) is sent again up to
 * this many times in all before the search takes the rate as the sender's limit. */
#define PBOX_PROBE_DISTURBED_TRIES 3
/* The idle gap after a stream: as long as the stream, and at least this. */
#define PBOX_PROBE_MIN_GAP_NS 10000000

/* ---- responder ---- */

struct pbox_probe_responder_conf {
	unsigned max_sessions; /* default 64 */
	unsigned max_per_addr; /* sessions per source address; default 4 */
	int64_t idle_ns;       /* a session without traffic expires; default 5 s */
	unsigned hello_per_s;  /* new sessions per second, all peers together; default 100 */
};

struct pbox_probe_responder_stats {
	uint64_t rx_packets, rx_bytes, tx_packets, tx_bytes;
	uint64_t sessions_opened, sessions_expired, sessions_closed;
	/* drops, one counter per reason */
	uint64_t drop_not_ours;   /* no magic/version: not a probe datagram */
	uint64_t drop_malformed;  /* ours but invalid (decoder) */
	uint64_t drop_bad_token;  /* unknown token, or the token from another address */
	uint64_t drop_full;       /* HELLO while the table or the address's share is full */
	uint64_t drop_rate;       /* HELLO over the new-session rate */
	uint64_t drop_stream;     /* DATA of an old stream, or inconsistent with its stream */
	uint64_t drop_duplicate;  /* DATA seq already received */
	uint64_t drop_unexpected; /* a message only a responder sends (ACK, REPORT) */
};

struct pbox_probe_responder;

/* A responder with conf (NULL or zero fields: the defaults). Returns NULL after logging
 * why (memory, or a getrandom failure). */
struct pbox_probe_responder *
pbox_probe_responder_create(const struct pbox_probe_responder_conf *conf);
void pbox_probe_responder_destroy(struct pbox_probe_responder *r);

/*
 * One datagram of len bytes from `from` (fromlen bytes). now_ns: CLOCK_MONOTONIC (session
 * expiry, rate limit); rx_ns: its arrival time on any clock consistent within a stream
 * (the kernel's receive timestamp). Writes the reply, if any, into reply (cap >=
 * PBOX_PROBE_REQ_BYTES) and returns its length (0: no reply); a reply is never longer
 * than len.
 */
size_t pbox_probe_responder_input(struct pbox_probe_responder *r, const struct sockaddr *from,
				  socklen_t fromlen, const void *pkt, size_t len, int64_t now_ns,
				  int64_t rx_ns, void *reply, size_t cap);

void pbox_probe_responder_get_stats(const struct pbox_probe_responder *r,
				    struct pbox_probe_responder_stats *out);
/* Sessions open now (expired ones not yet reclaimed are not counted). */
unsigned pbox_probe_responder_sessions(const struct pbox_probe_responder *r, int64_t now_ns);

/* Serve the UDP socket fd (bound; SO_TIMESTAMPNS is enabled here) until *stop becomes
 * nonzero (checked at least every 200 ms). Returns 0, -ENOMEM (its 288 KB of receive
 * buffers), or -errno of a failed poll/recv. */
int pbox_probe_responder_serve(struct pbox_probe_responder *r, int fd,
			       const volatile sig_atomic_t *stop);

/* ---- addresses ---- */

/* "host", "host:port", "[v6]:port" or ":port" (any address) into ss; the port defaults
 * to def_port. Returns 0, or -EINVAL (syntax) / -EHOSTUNREACH (name not resolved). */
int pbox_probe_parse_addr(const char *s, uint16_t def_port, struct sockaddr_storage *ss,
			  socklen_t *len);

/* The same for an address only (no name lookup: never blocks on DNS), for addresses
 * that come from the network (a controller's probe request). */
int pbox_probe_parse_numeric_addr(const char *s, uint16_t def_port, struct sockaddr_storage *ss,
				  socklen_t *len);

/* A UDP socket bound to addr for a responder. Returns the fd or -errno (logged). */
int pbox_probe_listen(const struct sockaddr *addr, socklen_t len);

/* ---- prober ---- */

struct pbox_probe_request {
	struct sockaddr_storage peer; /* the responder */
	socklen_t peer_len;
	double cap_bps;           /* never send faster than this (IP bytes), > min_bps */
	double min_bps;           /* lowest rate probed; default 1 Mbit/s */
	int64_t budget_ns;        /* no stream starts that would end after this */
	double resolution;        /* relative; default PBOX_SLOPS_RESOLUTION */
	uint32_t max_datagram;    /* IP datagram bytes (the path MTU); default 1500 */
	uint32_t streams;         /* per fleet; default PBOX_SLOPS_FLEET_STREAMS */
	uint32_t stream_len;      /* packets per stream; default PBOX_SLOPS_STREAM_LEN */
	int64_t reply_timeout_ns; /* HELLO and REPORT; default 300 ms */
	/* Pace from a SCHED_FIFO thread (priority 10) for the duration of the probe, so a
	 * busy machine preempts streams less (needs CAP_SYS_NICE; without it: a warning).
	 * Streams last at most PBOX_SLOPS_MAX_STREAM_NS and are followed by a sleep. */
	bool realtime;
	/* Called after each fleet (may be NULL): its rate, verdict and stream verdicts. */
	void (*on_fleet)(void *arg, double bps, enum pbox_slops_verdict fleet,
			 const enum pbox_slops_verdict *streams, unsigned n);
	void *arg;
};

struct pbox_probe_result {
	double r_min_bps, r_max_bps;       /* the available bandwidth is in this range */
	double grey_min_bps, grey_max_bps; /* grey region; min > max: none */
	double adr_bps;                    /* dispersion rate of the first stream (0: none) */
	unsigned flags;                    /* PBOX_SLOPS_F_* */
	unsigned fleets, streams;          /* fleets decided, streams sent (with the first) */
	uint64_t bytes_sent;               /* probe datagrams, IP bytes */
	double max_stream_bps;             /* the fastest stream's nominal rate (<= cap) */
	int64_t timestamp_ns;              /* CLOCK_REALTIME when the estimate was made */
	int64_t duration_ns;               /* how long it took */
};

/* Fill the defaults above; the caller sets peer, cap_bps and budget_ns. */
void pbox_probe_request_defaults(struct pbox_probe_request *req);

/*
 * Probe req->peer. Returns 0 with *res filled (when the budget ran out first, flags has
 * PBOX_SLOPS_F_BUDGET and the range is what the fleets so far established), or
 * -EINVAL (request out of range), -ETIMEDOUT (no HELLO_ACK, or the responder stopped
 * reporting), -ECONNREFUSED (nothing listens there), -errno of a socket call. Logs why.
 */
int pbox_probe_run(const struct pbox_probe_request *req, struct pbox_probe_result *res);

#endif /* PBOX_PROBE_AGENT_H */
