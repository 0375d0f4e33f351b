/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The SLoPS estimator (ctrlplane/probe/slops.h) on synthetic delay series, no network:
 *  - trend tests: an increasing delay series is INCREASING, a flat noisy one NOTREND, a
 *    clock offset or wrap-around between the two clocks changes nothing;
 *  - stream verdicts: lossy, disturbed (sender behind schedule) and short streams are
 *    unusable; the fleet verdict needs 60% agreement, and a mostly lossy fleet is R > A;
 *  - the rate search converges on a simulated token-bucket link (the model of tc tbf:
 *    rate A, bucket B, queue limit, receive jitter) to within its relative resolution,
 *    from 20 Mbit/s to 900 Mbit/s, and reports a grey region when A fluctuates.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "slops.h"

static uint64_t g_rng = 88172645463325252ull;

static double urand(void) /* [0, 1) */
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (double)(g_rng >> 11) / 9007199254740992.0;
}

struct link_model {
	double avail_bps; /* rate of the bottleneck left to the probe */
	double bucket;    /* tbf burst, bytes */
	double limit;     /* queue limit, bytes (beyond: dropped) */
	double jitter_ns; /* receive-time noise, uniform [0, jitter) */
	double fluct;     /* per-stream fluctuation of A: A * (1 + fluct * u), u in [-1, 1] */
};

/* One stream of count packets of `bytes` at rate bps through the model: fills the
 * timestamps the receiver would have seen. Sender clock: 0-based; receiver clock: offset
 * by `offset` (unsynchronised clocks). */
static void simulate_stream(const struct link_model *m, double bps, uint32_t count, double bytes,
			    int64_t offset, int64_t *send, int64_t *recv, uint8_t *got,
			    int64_t *period_ns)
{
	double a = m->avail_bps * (1 + m->fluct * (2 * urand() - 1));
	double tokens = m->bucket, prev = 0;
	uint32_t i;

	pbox_slops_packet_bytes(bps, 1500, count, period_ns);
	for (i = 0; i < count; i++) {
		double t = i * (double)*period_ns, t0 = t > prev ? t : prev, dep;

		tokens += (t0 - prev) * a / 8e9;
		tokens = tokens > m->bucket ? m->bucket : tokens;
		if (tokens >= bytes) {
			dep = t0;
			tokens -= bytes;
		} else {
			dep = t0 + (bytes - tokens) * 8e9 / a;
			tokens = 0;
		}
		send[i] = (int64_t)t;
		if ((dep - t) * a / 8e9 > m->limit) {
			got[i] = 0; /* tail drop: the packet never takes the link */
			continue;
		}
		prev = dep;
		got[i] = 1;
		recv[i] = offset + (int64_t)(dep + 50000 + m->jitter_ns * urand());
	}
}

static enum pbox_slops_verdict simulate_fleet(const struct link_model *m, double bps)
{
	enum pbox_slops_verdict v[PBOX_SLOPS_FLEET_STREAMS];
	int64_t send[PBOX_SLOPS_STREAM_LEN], recv[PBOX_SLOPS_STREAM_LEN], period;
	uint8_t got[PBOX_SLOPS_STREAM_LEN];
	struct pbox_slops_stream_stats st;
	/* The agent's packet choice. */
	double bytes = pbox_slops_packet_bytes(bps, 1500, PBOX_SLOPS_STREAM_LEN, &period);
	int k;

	for (k = 0; k < PBOX_SLOPS_FLEET_STREAMS; k++) {
		simulate_stream(m, bps, PBOX_SLOPS_STREAM_LEN, bytes, 123456789, send, recv, got,
				&period);
		assert_int_equal(pbox_slops_stream_analyze(send, recv, got, PBOX_SLOPS_STREAM_LEN,
							   period, &st),
				 0);
		v[k] = pbox_slops_stream_verdict(&st);
	}
	return pbox_slops_fleet_verdict(v, PBOX_SLOPS_FLEET_STREAMS);
}

static void run_search(const struct link_model *m, double res, double hint,
		       struct pbox_slops_range *r)
{
	struct pbox_slops_search s;
	double bps;

	assert_int_equal(pbox_slops_search_init(&s, 1e6, 1e9, res), 0);
	pbox_slops_search_hint(&s, hint);
	while (pbox_slops_search_next(&s, &bps)) {
		assert_true(bps >= s.lo && bps <= s.hi);
		pbox_slops_search_update(&s, bps, simulate_fleet(m, bps));
		assert_true(s.fleets < 40);
	}
	pbox_slops_search_result(&s, r);
}

static void test_trend_increasing(void **state)
{
	int64_t x[100];
	double pct, pdt;
	int i;

	(void)state;
	for (i = 0; i < 100; i++) {
		x[i] = 1000 * i + (int64_t)(3000 * urand()); /* +1 us per packet, 3 us noise */
	}
	pbox_slops_trend(x, 100, &pct, &pdt);
	assert_true(pct > 0.9);
	assert_true(pdt > 0.9);
	pbox_slops_trend(x, 9, &pct, &pdt);
	assert_true(pct < 0); /* too short to say */
}

static void test_stream_flat_and_offsets(void **state)
{
	int64_t send[100], recv[100];
	uint8_t got[100];
	struct pbox_slops_stream_stats a, b;
	enum pbox_slops_verdict v[50];
	int flat = 0, wrong = 0, i, k;

	(void)state;
	for (k = 0; k < 50; k++) {
		for (i = 0; i < 100; i++) {
			send[i] = 100000 * i;
			recv[i] = send[i] + 40000 + (int64_t)(20000 * urand());
			got[i] = 1;
		}
		assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 100000, &a), 0);
		v[k] = pbox_slops_stream_verdict(&a);
		flat += v[k] == PBOX_SLOPS_NOTREND;
		wrong += v[k] == PBOX_SLOPS_INCREASING;
		/* Another receiver clock, and one that wraps around mid-stream. */
		for (i = 0; i < 100; i++) {
			recv[i] = (int64_t)((uint64_t)recv[i] + INT64_MAX - 5000000);
		}
		assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 100000, &b), 0);
		assert_true(a.pct == b.pct && a.pdt == b.pdt && a.rx_span_ns == b.rx_span_ns);
	}
	/* Noise gives a PCT near 0.5, inside the unclear band; PDT decides most streams. A
	 * single stream can look increasing by chance: the fleet's 60% rule absorbs that. */
	assert_true(flat >= 40);
	assert_true(wrong <= 3);
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_NOTREND);
	assert_int_equal(pbox_slops_fleet_verdict(v + 12, 12), PBOX_SLOPS_NOTREND);
	assert_int_equal(a.received, 100);
	assert_int_equal(a.duration_ns, 99 * 100000);
	assert_true(a.send_excess_ns == 0);
}

static void test_stream_unusable(void **state)
{
	int64_t send[100], recv[100];
	uint8_t got[100];
	struct pbox_slops_stream_stats st;
	int i;

	(void)state;
	for (i = 0; i < 100; i++) {
		send[i] = 50000 * i;
		recv[i] = send[i] + 3000 * i; /* increasing */
		got[i] = 1;
	}
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 50000, &st), 0);
	assert_int_equal(pbox_slops_stream_verdict(&st), PBOX_SLOPS_INCREASING);
	/* 15 lost: still usable; 16: lossy. */
	for (i = 0; i < 15; i++) {
		got[3 + 6 * i] = 0;
	}
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 50000, &st), 0);
	assert_int_equal(pbox_slops_stream_verdict(&st), PBOX_SLOPS_INCREASING);
	got[99] = 0;
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 50000, &st), 0);
	assert_int_equal(pbox_slops_stream_verdict(&st), PBOX_SLOPS_LOSSY);
	/* The sender stalled 600 us (12% of the 4.95 ms stream) half way: disturbed. */
	memset(got, 1, sizeof(got));
	for (i = 50; i < 100; i++) {
		send[i] += 600000;
		recv[i] += 600000;
	}
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 50000, &st), 0);
	assert_int_equal(st.send_excess_ns, 600000);
	assert_int_equal(pbox_slops_stream_verdict(&st), PBOX_SLOPS_DISTURBED);
	/* A stream of 20 packets needs all 20. */
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 20, 50000, &st), 0);
	assert_int_equal(pbox_slops_stream_verdict(&st), PBOX_SLOPS_INCREASING);
	got[5] = 0;
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 20, 50000, &st), 0);
	assert_int_equal(pbox_slops_stream_verdict(&st), PBOX_SLOPS_SHORT);
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 0, 50000, &st), -EINVAL);
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 401, 50000, &st), -EINVAL);
	assert_int_equal(pbox_slops_stream_analyze(send, recv, got, 100, 0, &st), -EINVAL);
}

static void test_fleet_agreement(void **state)
{
	enum pbox_slops_verdict v[12];
	int i;

	(void)state;
	for (i = 0; i < 12; i++) {
		v[i] = i < 7 ? PBOX_SLOPS_INCREASING : PBOX_SLOPS_NOTREND;
	}
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_GREY); /* 58% */
	v[7] = PBOX_SLOPS_INCREASING;
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_INCREASING); /* 67% */
	/* Unusable streams do not count: 3 of 5 usable say NOTREND. */
	for (i = 0; i < 12; i++) {
		v[i] = i < 7 ? PBOX_SLOPS_DISTURBED : i < 10 ? PBOX_SLOPS_NOTREND : PBOX_SLOPS_GREY;
	}
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_DISTURBED); /* 5 < 6 */
	v[0] = PBOX_SLOPS_GREY;
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_GREY); /* 3 of 6 */
	v[1] = PBOX_SLOPS_NOTREND;
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_GREY); /* 4 of 7: 57% */
	v[2] = PBOX_SLOPS_NOTREND;
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_NOTREND); /* 5 of 8 */
	for (i = 0; i < 12; i++) {
		v[i] = i < 7 ? PBOX_SLOPS_LOSSY : PBOX_SLOPS_NOTREND;
	}
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_INCREASING);
	v[0] = PBOX_SLOPS_NOTREND; /* 6 lossy of 12: not more than half; 6 usable agree */
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_NOTREND);
	v[0] = PBOX_SLOPS_SHORT; /* 5 usable of 12 */
	assert_int_equal(pbox_slops_fleet_verdict(v, 12), PBOX_SLOPS_DISTURBED);
	assert_int_equal(pbox_slops_fleet_verdict(v, 0), PBOX_SLOPS_DISTURBED);
}

static void test_fleet_decided_early(void **state)
{
	enum pbox_slops_verdict v[12], d;
	int i;

	(void)state;
	for (i = 0; i < 12; i++) {
		v[i] = PBOX_SLOPS_INCREASING;
	}
	/* 7 of 12 increasing: 4 NOTREND and a GREY could still make it 58%. */
	assert_false(pbox_slops_fleet_decided(v, 7, 12, &d));
	assert_true(pbox_slops_fleet_decided(v, 8, 12, &d));
	assert_int_equal(d, PBOX_SLOPS_INCREASING);
	v[0] = PBOX_SLOPS_NOTREND; /* 7 of 8 increasing */
	assert_false(pbox_slops_fleet_decided(v, 8, 12, &d));
	assert_true(pbox_slops_fleet_decided(v, 9, 12, &d));
	assert_int_equal(d, PBOX_SLOPS_INCREASING);
	/* 7 lossy of 12 is R > A whatever follows. */
	for (i = 0; i < 7; i++) {
		v[i] = PBOX_SLOPS_LOSSY;
	}
	assert_true(pbox_slops_fleet_decided(v, 7, 12, &d));
	assert_int_equal(d, PBOX_SLOPS_INCREASING);
	/* Exhaustive check of the claim on short fleets: decided means every completion
	 * gives that verdict. 6 kinds, fleets of 5 with 2 remaining. */
	for (i = 0; i < 6 * 6 * 6; i++) {
		enum pbox_slops_verdict w[5];
		int a, b;

		w[0] = (enum pbox_slops_verdict)(i % 6);
		w[1] = (enum pbox_slops_verdict)(i / 6 % 6);
		w[2] = (enum pbox_slops_verdict)(i / 36);
		if (!pbox_slops_fleet_decided(w, 3, 5, &d)) {
			continue;
		}
		for (a = 0; a < 6; a++) {
			for (b = 0; b < 6; b++) {
				w[3] = (enum pbox_slops_verdict)a;
				w[4] = (enum pbox_slops_verdict)b;
				assert_int_equal(pbox_slops_fleet_verdict(w, 5), d);
			}
		}
	}
	assert_false(pbox_slops_fleet_decided(v, 3, 65, &d));
}

/* Converged on A: A inside [r_min, r_max] and the midpoint within the resolution, both
 * up to the token bucket's bias (a stream's excess up to the burst never queues: the
 * estimate can be high by burst * 8 / stream duration). */
static void check_converged(double avail, double bucket, const struct pbox_slops_range *r,
			    double res)
{
	double mid = (r->r_min + r->r_max) / 2;
	int64_t period;
	uint32_t bytes = pbox_slops_packet_bytes(avail, 1500, PBOX_SLOPS_STREAM_LEN, &period);
	double bias = bucket * 8e9 / (double)(period * (PBOX_SLOPS_STREAM_LEN - 1));

	(void)bytes;

	print_message("A %.0f Mbit/s: [%.2f, %.2f] grey [%.2f, %.2f] in %u fleets, flags %#x\n",
		      avail / 1e6, r->r_min / 1e6, r->r_max / 1e6, r->grey_min / 1e6,
		      r->grey_max / 1e6, r->fleets, r->flags);
	assert_true(r->flags & PBOX_SLOPS_F_CONVERGED);
	assert_true(r->r_min <= avail + bias && avail <= r->r_max);
	assert_true(fabs(mid - avail) <= res * avail + bias);
}

static void test_search_converges(void **state)
{
	static const double rates[] = { 20e6, 50e6, 100e6, 200e6, 500e6, 900e6 };
	struct link_model m = { .jitter_ns = 5000 };
	struct pbox_slops_range r;
	unsigned plain = 0, above = 0, below = 0;
	size_t i;

	(void)state;
	/* The link model's noise comes from a fixed-seed generator: the fleet counts are
	 * the same on every run; the bounds leave room for grey fleets. */
	for (i = 0; i < sizeof(rates) / sizeof(rates[0]); i++) {
		m.avail_bps = rates[i];
		m.bucket = 3028; /* two 1514-byte frames: the benchmark's tbf burst */
		m.limit = rates[i] / 8 * 0.01;
		run_search(&m, PBOX_SLOPS_RESOLUTION, 0, &r);
		check_converged(rates[i], m.bucket, &r, PBOX_SLOPS_RESOLUTION);
		assert_true(r.fleets <= 14);
		assert_false(r.flags & (PBOX_SLOPS_F_AT_CAP | PBOX_SLOPS_F_AT_MIN));
		plain += r.fleets;
		/* From a dispersion hint 10% above A (the agent's first step). */
		run_search(&m, PBOX_SLOPS_RESOLUTION, rates[i] * 1.1, &r);
		check_converged(rates[i], m.bucket, &r, PBOX_SLOPS_RESOLUTION);
		assert_true(r.fleets <= 10);
		above += r.fleets;
		/* A hint 2% below A (a token bucket's bias, a sender at its limit): the
		 * search steps up instead of bisecting to the cap. */
		run_search(&m, PBOX_SLOPS_RESOLUTION, rates[i] * 0.98, &r);
		check_converged(rates[i], m.bucket, &r, PBOX_SLOPS_RESOLUTION);
		assert_true(r.fleets <= 6);
		below += r.fleets;
		/* A hint far above A (heavy cross traffic) still converges. */
		run_search(&m, PBOX_SLOPS_RESOLUTION, rates[i] * 8, &r);
		check_converged(rates[i], m.bucket, &r, PBOX_SLOPS_RESOLUTION);
	}
	print_message("fleets over 6 rates: %u without a hint, %u from 1.1 A, %u from 0.98 A\n",
		      plain, above, below);
	assert_true(above < plain && below < above);
}

static void test_search_grey_region(void **state)
{
	struct link_model m = {
		.avail_bps = 100e6, .bucket = 3028, .limit = 125000, .jitter_ns = 5000, .fluct = 0.1
	};
	struct pbox_slops_range r;
	unsigned fleets[2] = { 0, 0 };
	int grey = 0, k, h;

	(void)state;
	/* Without a hint, and from a hint right at A (where fleets come out grey). */
	for (h = 0; h < 2; h++) {
		for (k = 0; k < 5; k++) {
			run_search(&m, PBOX_SLOPS_RESOLUTION, h ? 100e6 : 0, &r);
			print_message("A 100 +-10%%, hint %s: [%.2f, %.2f] grey [%.2f, %.2f] in %u "
				      "fleets\n",
				      h ? "100" : "none", r.r_min / 1e6, r.r_max / 1e6,
				      r.grey_min / 1e6, r.grey_max / 1e6, r.fleets);
			assert_true(r.flags & PBOX_SLOPS_F_CONVERGED);
			/* The range covers the band A moves in, at worst within it. */
			assert_true(r.r_min <= 110e6 && r.r_max >= 90e6);
			assert_true(r.r_min >= 80e6 && r.r_max <= 120e6);
			grey += r.grey_min <= r.grey_max;
			fleets[h] += r.fleets;
		}
	}
	assert_true(grey >= 1);
	assert_true(fleets[1] < fleets[0]);
}

static void test_search_edges(void **state)
{
	struct pbox_slops_search s;
	struct pbox_slops_range r;
	double bps, prev = 0;

	(void)state;
	assert_int_equal(pbox_slops_search_init(&s, 0, 1e9, 0.05), -EINVAL);
	assert_int_equal(pbox_slops_search_init(&s, 1e6, 1e6, 0.05), -EINVAL);
	assert_int_equal(pbox_slops_search_init(&s, 1e6, 1e9, 1), -EINVAL);
	/* Never INCREASING: converges on the cap and says so. */
	assert_int_equal(pbox_slops_search_init(&s, 1e6, 1e9, 0.05), 0);
	while (pbox_slops_search_next(&s, &bps)) {
		assert_true(bps > prev && bps <= 1e9);
		prev = bps;
		pbox_slops_search_update(&s, bps, PBOX_SLOPS_NOTREND);
	}
	pbox_slops_search_result(&s, &r);
	assert_true(r.flags & PBOX_SLOPS_F_AT_CAP);
	assert_true(r.r_min >= 0.95e9 && r.r_max == 1e9);
	/* Always INCREASING: converges on the minimum. */
	assert_int_equal(pbox_slops_search_init(&s, 1e6, 1e9, 0.05), 0);
	while (pbox_slops_search_next(&s, &bps)) {
		pbox_slops_search_update(&s, bps, PBOX_SLOPS_INCREASING);
	}
	pbox_slops_search_result(&s, &r);
	assert_true(r.flags & PBOX_SLOPS_F_AT_MIN);
	assert_true(r.r_min == 1e6 && r.r_max <= 1.06e6);
	/* A hint is probed first; a sender that cannot exceed 300 Mbit/s while A = 600:
	 * the result is [~300, 300] flagged sender-limited, not a false A. */
	assert_int_equal(pbox_slops_search_init(&s, 1e6, 1e9, 0.05), 0);
	pbox_slops_search_hint(&s, 5e9);
	assert_true(pbox_slops_search_next(&s, &bps) && bps == 1e9);
	while (pbox_slops_search_next(&s, &bps)) {
		pbox_slops_search_update(&s, bps,
					 bps > 300e6 ? PBOX_SLOPS_DISTURBED : PBOX_SLOPS_NOTREND);
	}
	pbox_slops_search_result(&s, &r);
	assert_true(r.flags & PBOX_SLOPS_F_SENDER_LIMITED);
	assert_false(r.flags & PBOX_SLOPS_F_AT_CAP);
	assert_true(r.r_max > 300e6 && r.r_max < 330e6 && r.r_min <= 300e6);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_trend_increasing),
		cmocka_unit_test(test_stream_flat_and_offsets),
		cmocka_unit_test(test_stream_unusable),
		cmocka_unit_test(test_fleet_agreement),
		cmocka_unit_test(test_fleet_decided_early),
		cmocka_unit_test(test_search_converges),
		cmocka_unit_test(test_search_grey_region),
		cmocka_unit_test(test_search_edges),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
