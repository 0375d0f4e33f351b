/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Per-destination result pacing of one appliance core: a struct pbox_tx_ops that sits
 * between the chunk engine and the transport, so the results (and the ACKs behind them)
 * a core sends to a worker leave at that worker's rate instead of as one burst per chunk
 * that overflows the switch or tbf port in front of the worker.
 *
 * Rate: learned from the worker itself, with no wire change: the rate at which this core
 * receives the worker's datagrams (contributions, PULLs), which the worker's own
 * congestion window and pacing (libpbox/node.h) hold at what its path absorbs. A result
 * is as large as the contribution it answers, so sending it at the rate the contribution
 * arrived takes as long on the downlink as the push took on the uplink. Samples are taken
 * over trains of arrivals (a gap longer than idle_us ends a train, the opening burst of a
 * train is not counted: it arrived before the train's clock started), each sample_us
 * long; the rate is the largest of the last PBOX_PACE_SAMPLES samples (a windowed max,
 * as BBR's bandwidth filter), so it follows a worker that slows down within that many
 * samples and is not lowered by the worker's idle time. Until the first sample a
 * destination is not paced (the behaviour without a pacer).
 *
 * Sending: a token bucket per destination, depth max(burst_bytes, rate x burst_us), in
 * wire bytes (pbox header + payload, the unit the rate is measured in). A datagram to a
 * destination with tokens and nothing queued goes to the transport at once; otherwise it
 * is queued (header copied, payload referenced) in that destination's FIFO, and
 * pbox_pace_poll() (called from flush and from the core loop on every turn) releases what
 * is due. Destinations are served in turn, each by its own bucket: a fast worker never
 * waits behind a slow one. The loop stays poll-mode: pbox_pace_poll() says when the next
 * departure is due and the transport's idle wait is bounded by it.
 *
 * What pacing must not do is delay: the workers time their window and RTO on the results
 * (the first result fragment is a push-pull's ACK), so a queue of seconds in the pacer
 * shrinks their windows, fires their timers and brings PULLs whose answers are duplicates
 * (measured in netlab: 4.8x the link bound instead of 1.5x; one run with a 25 ms cap
 * still had 1.3 k switch drops per exchange). So the pacer smooths bursts
 * and no more: a backlog that would wait longer than max_delay_us drains at backlog /
 * max_delay_us (the rate is a floor of the spacing, not a cap of the throughput), and
 * datagrams without a payload or with one below PBOX_PACE_SMALL bytes (ACKs, NACKs) are
 * never queued (they still use tokens).
 *
 * Memory the engine lends: queued() counts payload datagrams accepted; reclaim(upto)
 * first releases (unpaced) every queued datagram numbered below upto, then reclaims the
 * transport. The engine double-buffers results, so this happens only when it is about to
 * overwrite a result that is still being paced out.
 *
 * pboxd's kernel-UDP transport uses it only with PBOX_PACE=1 in its environment: measured
 * in netlab it does not help on a quiet machine and hurts when the CPUs are contended
 * (perf/netlab/README.md, "Result pacing in the appliance").
 *
 * Threading: one pacer per core, used only on that core's thread. Counters in
 * struct pbox_pace_stats may be read relaxed from any thread.
 */
#ifndef PBOX_CORE_PACE_H
#define PBOX_CORE_PACE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/xport.h"

#define PBOX_PACE_SAMPLES 4u
#define PBOX_PACE_SMALL   256u

struct pbox_pace_cfg {
	const struct pbox_tx_ops *inner; /* the transport */
	void *inner_ctx;
	uint64_t (*now_ns)(void *arg); /* clock; NULL: CLOCK_MONOTONIC */
	void *now_arg;
	uint32_t max_dst;      /* destinations tracked (0: 1024); more go unpaced */
	uint32_t max_queued;   /* datagrams queued at once (0: 16384); beyond, the oldest
				  goes unpaced */
	uint32_t gain_pct;     /* send rate = gain x learned rate (0: 100) */
	uint64_t min_rate_Bps; /* floor of the learned rate (0: 1 MB/s) */
	uint32_t burst_bytes;  /* least bucket depth (0: 2 x 9 KB) */
	uint32_t burst_us;     /* bucket depth in time at the rate (0: 250 us) */
	uint32_t sample_us;    /* length of one rate sample (0: 50000: a 64 KB
				  tbf burst adds 10% to one at 100 Mbit/s) */
	uint32_t max_delay_us; /* most time a datagram waits: a longer backlog leaves
				  faster (0: 60000) */
	uint32_t idle_us;      /* arrival gap that ends a train (0: 20000;
				  above a starved core's scheduling gaps) */
};

struct pbox_pace_stats {
	uint64_t sent_direct; /* datagrams passed to the transport at once */
	uint64_t sent_paced;  /* datagrams that waited in the pacer */
	uint64_t forced;      /* released unpaced: reclaim, queue full, table full */
	uint64_t samples;     /* rate samples taken */
	uint64_t max_backlog; /* most datagrams queued at once */
};

struct pbox_pace;

/* Create a pacer in front of cfg->inner. NULL after logging why (out of memory). */
struct pbox_pace *pbox_pace_create(const struct pbox_pace_cfg *cfg);
/* Sends what is queued (unpaced) and frees the pacer. */
void pbox_pace_destroy(struct pbox_pace *p);

/* The ops to give the engine (ctx: the pacer). */
extern const struct pbox_tx_ops pbox_pace_tx_ops;

/* A datagram of len bytes (pbox header included) arrived from peer: feeds its rate. */
void pbox_pace_rx(struct pbox_pace *p, const struct pbox_peer *from, uint32_t len);

/* Release what is due and flush the transport if anything left. Returns nanoseconds until
 * the next departure is due (0: something is due now; UINT64_MAX: nothing queued). */
uint64_t pbox_pace_poll(struct pbox_pace *p);

/* Datagrams queued now. */
uint32_t pbox_pace_backlog(const struct pbox_pace *p);

/* The learned send rate towards peer in bytes/s (gain applied; 0: not paced yet). */
uint64_t pbox_pace_rate(const struct pbox_pace *p, const struct pbox_peer *peer);

const struct pbox_pace_stats *pbox_pace_stats(const struct pbox_pace *p);

/* Any thread (relaxed reads, for stats): the learned rates of up to max destinations, in
 * bytes/s (0: not learned yet), into out. Returns how many were written. */
uint32_t pbox_pace_rates(const struct pbox_pace *p, uint64_t *out, uint32_t max);

#endif /* PBOX_CORE_PACE_H */
