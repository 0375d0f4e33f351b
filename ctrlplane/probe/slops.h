/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SLoPS (Self-Loading Periodic Streams, Jain and Dovrolis, IEEE/ACM ToN 11(4), 2003) as
 * pathload defines it: the estimator, without sockets or clocks.
 *
 * A sender emits periodic streams of K packets at rate R; the receiver stamps each
 * arrival. When R exceeds the available bandwidth A of the path, a queue builds and the
 * one-way delays (OWD) of the stream increase; when R < A they show no trend. Only the
 * trend matters, so the two clocks need not be synchronised (an offset cancels). Three
 * steps, one function each:
 *
 *   1. pbox_slops_stream_analyze(): the OWD series of one stream -> PCT and PDT
 *      (pathload's pairwise comparison and pairwise difference tests on the medians of
 *      floor(sqrt(n)) groups), its loss and how far the sender fell behind its schedule;
 *   2. pbox_slops_stream_verdict(): one stream -> INCREASING / NOTREND / GREY (each test
 *      has a +-10% unclear band around its threshold), or unusable (lossy, disturbed,
 *      too short);
 *   3. pbox_slops_fleet_verdict(): a fleet of streams -> INCREASING / NOTREND when 60% of
 *      the usable streams agree, GREY otherwise; too many lossy streams mean R > A.
 *
 * The rate search (struct pbox_slops_search) is pathload's binary search with a grey
 * region, except that its resolution is relative to the rate (a fraction of the upper
 * bound) instead of pathload's min(0.05 ADR, 12 Mbit/s): an absolute cap makes fast
 * links take many more fleets than slow ones for the same relative accuracy.
 *
 * Rates are in bits per second of IP datagrams (payload + 28 bytes of IPv4 and UDP
 * headers), as pathload counts them.
 *
 * Thread safety: every function is pure or works on the caller's struct only; a search
 * belongs to one thread at a time.
 */
#ifndef PBOX_SLOPS_H
#define PBOX_SLOPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* pathload 1.3.2's published constants (pathload_gbls.h, pathload_rcv.h). */
#define PBOX_SLOPS_FLEET_STREAMS  12   /* NUM_STREAM */
#define PBOX_SLOPS_STREAM_LEN     100  /* STREAM_LEN, packets */
#define PBOX_SLOPS_MAX_STREAM_LEN 400  /* MAX_STREAM_LEN */
#define PBOX_SLOPS_MIN_STREAM_LEN 36   /* MIN_STREAM_LEN: fewer packets received: unusable */
#define PBOX_SLOPS_PCT_THRESHOLD  0.55 /* PCT_THRESHOLD */
#define PBOX_SLOPS_PDT_THRESHOLD  0.4  /* PDT_THRESHOLD */
#define PBOX_SLOPS_UNCLEAR        0.1  /* +-10% band around each threshold: grey */
#define PBOX_SLOPS_AGREEMENT      0.6  /* AGGREGATE_THRESHOLD: fleet verdict */
#define PBOX_SLOPS_HIGH_LOSS      0.15 /* HIGH_LOSS_RATE: stream is lossy above this */
#define PBOX_SLOPS_MAX_LOSSY      0.5  /* MAX_LOSSY_STREAM_FRACTION: fleet means R > A */
/* Ours: a stream whose sender fell behind its schedule by more than this fraction of the
 * stream's nominal duration (preempted, or too slow for R) did not load the path at R:
 * it is discarded, as pathload discards streams disturbed by context switches. */
#define PBOX_SLOPS_MAX_DISTURBED 0.1
/* Ours: streams last at most this long; below the rate where MTU-sized packets would
 * exceed it, packets shrink (pathload's MIN_PKT_SZ 200 bytes at the least). Long streams
 * cost time; short ones let a token bucket (tc tbf's burst, a cloud NIC's credit) absorb
 * the stream's excess: the estimate is biased up by about burst * 8 / duration. */
#define PBOX_SLOPS_MAX_STREAM_NS 40000000
#define PBOX_SLOPS_MIN_PACKET    200
/* Ours: the default relative resolution of the rate search. */
#define PBOX_SLOPS_RESOLUTION 0.05

enum pbox_slops_verdict {
	PBOX_SLOPS_NOTREND = 0, /* R below the available bandwidth */
	PBOX_SLOPS_INCREASING,  /* R above it */
	PBOX_SLOPS_GREY,        /* unclear: R within the variation of the available bandwidth */
	PBOX_SLOPS_LOSSY,       /* stream: more than PBOX_SLOPS_HIGH_LOSS of it lost */
	PBOX_SLOPS_DISTURBED,   /* stream: the sender did not keep R; fleet: too few usable */
	PBOX_SLOPS_SHORT,       /* stream: fewer than the minimum packets received */
};

/* The IP datagram size (bytes, IPv4 + UDP headers included) of a stream of `count`
 * packets at rate bps: max_bytes unless the stream would last longer than
 * PBOX_SLOPS_MAX_STREAM_NS, never below PBOX_SLOPS_MIN_PACKET. Sets *period_ns, rounded up
 * so the stream never exceeds bps. bps > 0. Pure. */
uint32_t pbox_slops_packet_bytes(double bps, uint32_t max_bytes, uint32_t count,
				 int64_t *period_ns);

/* "notrend", "increasing", ... for logs and JSON; never NULL. */
const char *pbox_slops_verdict_name(enum pbox_slops_verdict v);

/* What a receiver learnt from one stream (computed where the packets arrived, sent back
 * to the sender in a probe report). */
struct pbox_slops_stream_stats {
	uint32_t count;         /* packets the stream had */
	uint32_t received;      /* distinct sequence numbers received */
	int64_t send_excess_ns; /* sender's lag behind its schedule, first to last received */
	int64_t duration_ns;    /* nominal: (count - 1) * period */
	int64_t rx_span_ns;     /* first to last arrival */
	double pct;             /* pairwise comparison test, 0..1; negative: not computed */
	double pdt;             /* pairwise difference test, -1..1 */
};

/*
 * Analyse one stream. send_ns[i] and recv_ns[i] are packet i's sender and receiver
 * timestamps (any two clocks), valid where got[i] is nonzero; count <= MAX_STREAM_LEN.
 * period_ns is the nominal spacing. Fills out; pct is -1 when fewer than 10 packets
 * arrived (no trend can be computed).
 * Returns 0, or -EINVAL (count 0 or above PBOX_SLOPS_MAX_STREAM_LEN, period <= 0 or so
 * large that a stream's duration would not fit 63 bits).
 */
int pbox_slops_stream_analyze(const int64_t *send_ns, const int64_t *recv_ns, const uint8_t *got,
			      uint32_t count, int64_t period_ns,
			      struct pbox_slops_stream_stats *out);

/* PCT and PDT of a delay series x[0..n) as pathload computes them: medians of groups of
 * floor(sqrt(n)) values, then the fraction of increases and the net change over the total
 * change of those medians. Sets *pct = -1 (and *pdt = 0) when n < 10. Pure. */
void pbox_slops_trend(const int64_t *x, size_t n, double *pct, double *pdt);

/* One stream's verdict from its statistics (pathload's thresholds, see above). */
enum pbox_slops_verdict pbox_slops_stream_verdict(const struct pbox_slops_stream_stats *st);

/* A fleet's verdict from its n streams' verdicts: INCREASING when more than
 * PBOX_SLOPS_MAX_LOSSY of them were lossy; DISTURBED when fewer than half are usable
 * (I/N/G); else INCREASING or NOTREND when at least PBOX_SLOPS_AGREEMENT of the usable
 * ones say so, GREY otherwise. n == 0 gives DISTURBED. */
enum pbox_slops_verdict pbox_slops_fleet_verdict(const enum pbox_slops_verdict *v, size_t n);

/* Whether the verdict of a fleet of `total` streams is already certain after the first
 * `done` (v[0..done)): whatever the remaining streams say, the verdict is *out. Lets the
 * prober stop a fleet early (e.g. 8 of 12 INCREASING). total <= MAX_FLEET_STREAMS. */
#define PBOX_SLOPS_MAX_FLEET_STREAMS 64
bool pbox_slops_fleet_decided(const enum pbox_slops_verdict *v, size_t done, size_t total,
			      enum pbox_slops_verdict *out);

/* Result flags. */
#define PBOX_SLOPS_F_CONVERGED 0x1 /* the range is within the resolution */
#define PBOX_SLOPS_F_AT_CAP    0x2 /* never saw R > A up to the cap: A >= r_min */
#define PBOX_SLOPS_F_AT_MIN    0x4 /* R > A even at the minimum rate: A <= r_max */
/* The sender could not pace above r_max: r_max is its limit, not a bound on A. */
#define PBOX_SLOPS_F_SENDER_LIMITED 0x8
#define PBOX_SLOPS_F_BUDGET         0x10 /* stopped by the time budget or fleet limit */

/* The binary search over R. Plain data: the caller owns it. */
struct pbox_slops_search {
	double min_bps, cap_bps; /* the search never leaves [min, cap] */
	double resolution;       /* relative: stop when the bracket is below res * hi */
	double lo, hi;           /* A in [lo, hi] as far as the fleets said */
	double grey_lo, grey_hi; /* rates that gave GREY; grey_lo > grey_hi: none */
	double next;             /* the rate to probe next (0 until a hint or the first step) */
	unsigned fleets;
	unsigned flags;
	bool lo_seen, hi_seen; /* a fleet said NOTREND at lo / INCREASING at hi */
	bool hint;             /* started from a hint: halve until a NOTREND */
	unsigned up_steps;     /* NOTREND fleets above the hint before any INCREASING */
};

/* Start a search in [min_bps, cap_bps] (0 < min < cap) with relative resolution res
 * (0 < res < 1). Returns 0 or -EINVAL. */
int pbox_slops_search_init(struct pbox_slops_search *s, double min_bps, double cap_bps, double res);

/* Probe `bps` first (e.g. the dispersion rate of a train: an upper estimate of A). It is
 * clamped into [min, cap]. Only before the first update. Until a fleet says NOTREND, the
 * search then halves its upper bound instead of bisecting from the minimum; if the hint
 * itself says NOTREND, it steps up by 2 x resolution, then doubles, until an INCREASING,
 * instead of bisecting up to the cap. */
void pbox_slops_search_hint(struct pbox_slops_search *s, double bps);

/* The next rate to probe, or false when the search has converged. */
bool pbox_slops_search_next(const struct pbox_slops_search *s, double *bps);

/* Record the fleet verdict at rate bps (the rate next() gave). DISTURBED means the sender
 * could not hold bps: the search continues below it and the result says so. */
void pbox_slops_search_update(struct pbox_slops_search *s, double bps,
			      enum pbox_slops_verdict fleet);

/* The range [r_min, r_max] and grey region (grey_min > grey_max: none). */
struct pbox_slops_range {
	double r_min, r_max;
	double grey_min, grey_max;
	unsigned fleets;
	unsigned flags;
};
void pbox_slops_search_result(const struct pbox_slops_search *s, struct pbox_slops_range *out);

#endif /* PBOX_SLOPS_H */
