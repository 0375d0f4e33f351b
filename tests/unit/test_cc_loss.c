/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's congestion control and loss recovery under random loss, on the simulated
 * appliance's links (sim_set_links: a rate, a drop-tail queue and a delay per direction,
 * virtual clock): every datagram in both directions is dropped with probability p, as
 * netlab's XDP loss injector does on every link. Issue 10 asks 1% loss to cost at most
 * 1.3x the loss-free exchange time and the curve to stay within 2x at 1%.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim.h"

#define MS    1000000ull
#define ELEMS (1u << 21) /* 8 MiB per rank: 256 chunks of 32 KB */
#define RANKS 2u

static const struct pbox_keyspec g_key[] = { { 3, ELEMS } };
static float g_src[RANKS][ELEMS], g_dst[RANKS][ELEMS];

struct rand_loss {
	uint64_t state;
	double p;
	uint64_t seen, dropped;
};

static enum sim_verdict drop_random(struct sim *s, enum sim_dir dir, uint32_t ep,
				    const struct pbox_msg *m, void *arg)
{
	struct rand_loss *l = arg;

	(void)s;
	(void)dir;
	(void)ep;
	(void)m;
	/* xorshift64*: reproducible per seed */
	l->state ^= l->state >> 12;
	l->state ^= l->state << 25;
	l->state ^= l->state >> 27;
	l->seen++;
	if ((double)((l->state * 2685821657736338717ull) >> 11) / 9007199254740992.0 < l->p) {
		l->dropped++;
		return SIM_DROP;
	}
	return SIM_PASS;
}

static struct sim_job_cfg cfg_of(void)
{
	struct sim_job_cfg c = {
		.nranks = RANKS,
		.ncores = 1,
		.keys = g_key,
		.nkeys = 1,
		.chunk_bytes = 32768,
		.frag_bytes = 1408,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.rto_ms = 50,
		.timeout_ms = 120000,
	};
	return c;
}

/* One push-pull by every rank, run to completion; checks the sums, returns seconds. */
static double round_once(struct sim *s, uint32_t iter)
{
	static struct pbox_op op[RANKS];
	uint64_t t0 = s->now_ns;

	for (uint32_t r = 0; r < RANKS; r++) {
		for (uint32_t i = 0; i < ELEMS; i++) {
			g_src[r][i] = (float)((i + r + iter) & 1023);
		}
		op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
					  .key = 0,
					  .iter = iter,
					  .src = g_src[r],
					  .dst = g_dst[r] };
		assert_int_equal(pbox_node_submit(s->node[r], &op[r]), 0);
		pbox_node_flush(s->node[r]);
	}
	assert_true(sim_run(s, s->now_ns + 120000 * MS));
	for (uint32_t r = 0; r < RANKS; r++) {
		assert_int_equal(op[r].status, 0);
		for (uint32_t i = 0; i < ELEMS; i += 101) {
			float want = 0;

			for (uint32_t q = 0; q < RANKS; q++) {
				want += (float)((i + q + iter) & 1023);
			}
			assert_true(g_dst[r][i] == want);
		}
	}
	return (double)(s->now_ns - t0) / 1e9;
}

/* Median-free: the mean of `rounds` exchanges after one warm-up, at loss p. */
static double run_at(double p, uint64_t seed, const struct sim_link_cfg *l, uint32_t rounds)
{
	struct sim_job_cfg cfg = cfg_of();
	struct rand_loss loss = { .state = seed * 0x9e3779b97f4a7c15ull + 1, .p = p };
	struct sim s;
	double sum = 0;

	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, l, l), 0);
	s.filter = drop_random;
	s.filter_arg = &loss;
	round_once(&s, 0);
	for (uint32_t t = 1; t <= rounds; t++) {
		sum += round_once(&s, t);
	}
	const struct pbox_node_stats *st = pbox_node_stats(s.node[0]);
	print_message("loss %.3f: %.3f s per exchange (%.4f dropped), rank 0: cwnd %llu srtt %llu "
		      "us rto %llu us, %llu loss events, %llu nacks, %llu retransmits, %llu "
		      "probes, %llu timer waits, queue drops up %llu down %llu; spurious: %llu "
		      "resends %llu probes, probe floor %llu us\n",
		      p, sum / rounds, loss.seen ? (double)loss.dropped / loss.seen : 0.0,
		      (unsigned long long)st->cwnd, (unsigned long long)st->srtt_us,
		      (unsigned long long)st->rto_us, (unsigned long long)st->loss_events,
		      (unsigned long long)st->nacks, (unsigned long long)st->retransmits,
		      (unsigned long long)st->probes, (unsigned long long)st->timer_waits,
		      (unsigned long long)s.link_drops[SIM_TO_APPLIANCE],
		      (unsigned long long)s.link_drops[SIM_TO_WORKER],
		      (unsigned long long)st->spurious_retx,
		      (unsigned long long)st->spurious_probes,
		      (unsigned long long)st->pto_floor_us);
	sim_fini(&s);
	return sum / rounds;
}

/*
 * Two ranks on links of rate_Bps, 0.1 ms each way, a 10 ms drop-tail port (netlab's
 * switch port), 8 MiB per rank, chunks of 32 KB in 1408-byte fragments (MTU 1500): the
 * exchange time at 0.1%, 1% and 5% random loss on every datagram, both directions, as a
 * multiple of the loss-free time: 1% within 1.3x (issue 10), 5% within max5.
 *
 * Before (libpbox until this test): at 1 Gbit/s 1% cost 1.40x and 5% 7.1x. A random loss
 * shrank the window by a fifth (Veno) at most once per 10 ms, pinning it near one chunk,
 * below the path's bandwidth-delay product; and every lost last fragment of a send round
 * or lost result fragment stalled its chunk for the 10 ms RTO floor where the RTT is
 * 0.5 ms. Now a loss shrinks the window by the queue the RTT shows (at most half), and the
 * first timeout of a round is a tail-loss probe after max(2 SRTT, 2 ms): 1.1-1.2x and 2.7x.
 */
static void loss_curve(uint64_t rate_Bps, double max5)
{
	struct sim_link_cfg l = { .rate_Bps = rate_Bps,
				  .delay_ns = MS / 10,
				  .queue_bytes = rate_Bps / 100 };
	double t0, t1, t5;

	print_message("%.0f Mbit/s links\n", rate_Bps * 8 / 1e6);
	t0 = run_at(0.0, 1, &l, 2);
	(void)run_at(0.001, 2, &l, 2);
	t1 = run_at(0.01, 3, &l, 2);
	t5 = run_at(0.05, 4, &l, 2);
	print_message("1%%: %.2fx, 5%%: %.2fx the loss-free time\n", t1 / t0, t5 / t0);
	assert_true(t1 <= 1.3 * t0);
	assert_true(t5 <= max5 * t0);
}

static void test_random_loss_100mbit(void **state)
{
	(void)state;
	loss_curve(12500000, 2.0);
}

static void test_random_loss_1gbit(void **state)
{
	(void)state;
	loss_curve(125000000, 4.0);
}

/*
 * Many small keys (a network's biases and norms: one fragment each) at 5% random loss on
 * 1 Gbit/s links: a rank whose contribution was acknowledged waits for the result; when
 * that single-fragment result is lost, the probe that recovers it must come after about
 * the wait measured for the other results, not after four initial RTOs (200 ms: before,
 * an exchange of this test took 97 ms on average; now 22 ms).
 */
#define SMALL_KEYS 64u
static struct pbox_keyspec g_small[SMALL_KEYS];
static float g_ssrc[RANKS][SMALL_KEYS][256], g_sdst[RANKS][SMALL_KEYS][256];

static void test_small_keys_lost_results(void **state)
{
	struct sim_job_cfg cfg = cfg_of();
	struct sim_link_cfg l = { .rate_Bps = 125000000,
				  .delay_ns = MS / 10,
				  .queue_bytes = 1250000 };
	struct rand_loss loss = { .state = 77, .p = 0.05 };
	static struct pbox_op op[RANKS][SMALL_KEYS];
	struct sim s;
	uint64_t t0;
	double secs;

	(void)state;
	for (uint32_t k = 0; k < SMALL_KEYS; k++) {
		g_small[k] = (struct pbox_keyspec){ 100 + k, 256 };
	}
	cfg.keys = g_small;
	cfg.nkeys = SMALL_KEYS;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	s.filter = drop_random;
	s.filter_arg = &loss;
	t0 = s.now_ns;
	for (uint32_t it = 0; it < 20; it++) {
		if (it == 1) {
			t0 = s.now_ns; /* after the first exchange: the RTT is measured */
		}
		for (uint32_t r = 0; r < RANKS; r++) {
			for (uint32_t k = 0; k < SMALL_KEYS; k++) {
				for (uint32_t e = 0; e < 256; e++) {
					g_ssrc[r][k][e] = (float)(r + k + e + it);
				}
				op[r][k] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
							     .key = k,
							     .iter = it,
							     .src = g_ssrc[r][k],
							     .dst = g_sdst[r][k] };
				assert_int_equal(pbox_node_submit(s.node[r], &op[r][k]), 0);
			}
			pbox_node_flush(s.node[r]);
		}
		assert_true(sim_run(&s, s.now_ns + 60000 * MS));
		for (uint32_t r = 0; r < RANKS; r++) {
			for (uint32_t k = 0; k < SMALL_KEYS; k++) {
				assert_int_equal(op[r][k].status, 0);
				assert_true(g_sdst[r][k][255] == (float)(2 * (k + 255 + it) + 1));
			}
		}
	}
	secs = (double)(s.now_ns - t0) / 1e9 / 19;
	print_message("small keys, 5%% loss: %.2f ms per exchange, %llu probes (rank 0)\n",
		      secs * 1e3, (unsigned long long)pbox_node_stats(s.node[0])->probes);
	assert_true(secs < 0.05);
	sim_fini(&s);
}

/*
 * A large key and small ones (a network's weights and its biases) on 1 Gbit/s links at 5%
 * random loss: a one-fragment chunk is acknowledged in a fraction of a 32 KB chunk's RTT,
 * so the minimum RTT is a small key's and every large chunk's RTT sits above it. That
 * difference is no queue: the window must not be halved on each random loss for it.
 * Before, it was (cwnd pinned at one chunk, 32 KB); now it stays above four chunks.
 */
static void test_mixed_keys_window(void **state)
{
	static struct pbox_keyspec keys[1 + 32];
	static float msrc[RANKS][32][256], mdst[RANKS][32][256];
	static struct pbox_op op[RANKS][1 + 32];
	struct sim_job_cfg cfg = cfg_of();
	struct sim_link_cfg l = { .rate_Bps = 125000000,
				  .delay_ns = MS / 10,
				  .queue_bytes = 1250000 };
	struct rand_loss loss = { .state = 5, .p = 0.05 };
	uint64_t cwnd_sum = 0, samples = 0;
	struct sim s;

	(void)state;
	keys[0] = g_key[0];
	for (uint32_t k = 1; k <= 32; k++) {
		keys[k] = (struct pbox_keyspec){ 200 + k, 256 };
	}
	cfg.keys = keys;
	cfg.nkeys = 33;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	s.filter = drop_random;
	s.filter_arg = &loss;
	for (uint32_t it = 0; it < 4; it++) {
		for (uint32_t r = 0; r < RANKS; r++) {
			for (uint32_t k = 0; k <= 32; k++) {
				op[r][k] = (struct pbox_op){
					.kind = PBOX_OP_PUSH_PULL,
					.key = k,
					.iter = it,
					.src = k == 0 ? g_src[r] : msrc[r][k - 1],
					.dst = k == 0 ? g_dst[r] : mdst[r][k - 1],
				};
			}
			for (uint32_t k = 1; k <= 33; k++) {
				/* small keys first: theirs are the first RTT samples */
				assert_int_equal(pbox_node_submit(s.node[r], &op[r][k % 33]), 0);
			}
			pbox_node_flush(s.node[r]);
		}
		while (!sim_run(&s, s.now_ns + 5 * MS)) {
			if (it > 0) {
				cwnd_sum += pbox_node_stats(s.node[0])->cwnd;
				samples++;
			}
		}
		for (uint32_t r = 0; r < RANKS; r++) {
			for (uint32_t k = 0; k <= 32; k++) {
				assert_int_equal(op[r][k].status, 0);
			}
		}
	}
	print_message("mixed keys, 5%% loss: mean cwnd %.0f B over %llu samples\n",
		      samples ? (double)cwnd_sum / samples : 0.0, (unsigned long long)samples);
	assert_true(samples > 0);
	assert_true(cwnd_sum / samples >= 4 * 32768);
	sim_fini(&s);
}

/* Probes and resends rank 0 sends in an exchange that follows fast ones, when its peer
 * (rank 1) submits late_ms late (a worker descheduled on a busy host), nothing lost. */
static uint64_t resent_in_stall(uint32_t rto_min_ms, uint32_t pto_min_ms, uint64_t late_ms)
{
	struct sim_job_cfg cfg = cfg_of();
	struct sim_link_cfg l = { .rate_Bps = 1250000000ull,
				  .delay_ns = MS / 10,
				  .queue_bytes = 1250000000ull / 100 };
	static struct pbox_op op[RANKS];
	const struct pbox_node_stats *st;
	uint64_t before, resent;
	struct sim s;

	cfg.rto_ms = 100;
	cfg.rto_min_ms = rto_min_ms;
	cfg.pto_min_ms = pto_min_ms;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	for (uint32_t t = 0; t < 3; t++) {
		round_once(&s, t);
	}
	st = pbox_node_stats(s.node[0]);
	before = st->retransmits + st->probes;
	for (uint32_t r = 0; r < RANKS; r++) {
		for (uint32_t i = 0; i < ELEMS; i++) {
			g_src[r][i] = (float)((i + r + 3) & 1023);
		}
		op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
					  .key = 0,
					  .iter = 3,
					  .src = g_src[r],
					  .dst = g_dst[r] };
	}
	assert_int_equal(pbox_node_submit(s.node[0], &op[0]), 0);
	pbox_node_flush(s.node[0]);
	assert_false(sim_run(&s, s.now_ns + late_ms * MS)); /* rank 1 is late: not done */
	assert_int_equal(pbox_node_submit(s.node[1], &op[1]), 0);
	pbox_node_flush(s.node[1]);
	assert_true(sim_run(&s, s.now_ns + 120000 * MS));
	assert_int_equal(op[0].status, 0);
	assert_int_equal(op[1].status, 0);
	assert_true(g_dst[0][7] == (float)((7 + 3) & 1023) + (float)((7 + 1 + 3) & 1023));
	st = pbox_node_stats(s.node[0]);
	resent = st->retransmits + st->probes - before;
	print_message("rto_min %u ms, pto_min %u ms: rank 0 sent %llu probes / resends while "
		      "its peer was %llu ms late\n",
		      rto_min_ms, pto_min_ms, (unsigned long long)resent,
		      (unsigned long long)late_ms);
	sim_fini(&s);
	return resent;
}

/*
 * Result probes while a peer is late: a waiting chunk probes only once results for chunks
 * acknowledged after it have come (overtaken: its own was lost) or, while its core sends
 * no results at all, one chunk per core, at the probe interval and then doubling (node.c
 * timers). Before, every waiting chunk probed after the measured wait and the tail-loss
 * probe's 2 ms floor, doubling: rank 0 sent 825 probes while its peer was 50 ms late (256
 * chunks waiting), now 4; 1335 while it was 200 ms late (R6 of the review), now 6. A
 * shared-memory worker also sets its probe floor to its RTO floor (100 ms): 0.
 */
static void test_stall_probe_floor(void **state)
{
	(void)state;
	assert_true(resent_in_stall(10, 0, 50) <= 10);      /* UDP defaults */
	assert_true(resent_in_stall(100, 0, 50) <= 10);     /* RTO floor 100 ms */
	assert_int_equal(resent_in_stall(100, 100, 50), 0); /* shm */
	assert_true(resent_in_stall(10, 0, 200) <= 16);     /* R6: a 200 ms stall */
}

/*
 * Two appliance cores, loopback-like links (10 Gbit/s, 10 us, 32 KB datagrams), nothing
 * lost, and core 1's thread descheduled for stall_ms of every period_ms (a 2-CPU host
 * running two workers and two pboxd cores: CFS slices of a few ms). Counts what rank 0
 * and rank 1 sent again over 4 exchanges after a warm-up: every resend and probe is
 * spurious here.
 */
struct stall_run {
	uint64_t tx, resent, spurious, undone, floor_us;
};

static struct stall_run run_core_stall(uint32_t ncores, uint32_t core, uint64_t stall_ms,
				       uint64_t period_ms)
{
	struct sim_job_cfg cfg = cfg_of();
	struct sim_link_cfg l = { .rate_Bps = 1250000000ull,
				  .delay_ns = MS / 100,
				  .queue_bytes = 64ull << 20 };
	struct stall_run out = { 0 };
	uint64_t tx0[RANKS], rs0[RANKS];
	struct sim s;

	cfg.ncores = ncores;
	cfg.frag_bytes = 32768;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	s.stall_ns[core] = stall_ms * MS;
	s.stall_period_ns[core] = period_ms * MS;
	round_once(&s, 0);
	for (uint32_t r = 0; r < RANKS; r++) {
		const struct pbox_node_stats *st = pbox_node_stats(s.node[r]);

		tx0[r] = st->tx_pkts;
		rs0[r] = st->retransmits + st->probes;
	}
	for (uint32_t t = 1; t <= 4; t++) {
		round_once(&s, t);
	}
	for (uint32_t r = 0; r < RANKS; r++) {
		const struct pbox_node_stats *st = pbox_node_stats(s.node[r]);

		out.tx += st->tx_pkts - tx0[r];
		out.resent += st->retransmits + st->probes - rs0[r];
		out.spurious += st->spurious_retx + st->spurious_probes;
		out.undone += st->loss_undone;
		out.floor_us = PBOX_MAX(out.floor_us, st->pto_floor_us);
	}
	print_message("%u core(s), core %u stalled %llu of every %llu ms: %llu datagrams, %llu "
		      "resent or probes; spurious seen %llu, windows given back %llu, probe "
		      "floor %llu us\n",
		      ncores, core, (unsigned long long)stall_ms, (unsigned long long)period_ms,
		      (unsigned long long)out.tx, (unsigned long long)out.resent,
		      (unsigned long long)out.spurious, (unsigned long long)out.undone,
		      (unsigned long long)out.floor_us);
	sim_fini(&s);
	return out;
}

/*
 * One core's acknowledgements say nothing about another core's queue: with two cores and
 * core 1 descheduled 4 ms of every 10, core 0 acknowledged chunks sent after core 1's
 * waiting ones, and the timers took core 1's chunks for lost (RACK across cores): before,
 * 352 of 2400 datagrams were resends or probes. Now timers compare only with the same
 * core's acknowledgements, and a quiet core gets one probe at a time: 5 of 2053.
 */
static void test_core_stall_no_resends(void **state)
{
	struct stall_run r;

	(void)state;
	r = run_core_stall(2, 1, 4, 10);
	assert_true(r.resent * 100 < r.tx);
}

/*
 * The whole appliance (one core) descheduled 15 ms of every 50, more than the 10 ms RTO
 * floor: the first timeouts are spurious (the ACK echoes the original datagram's seq, as
 * Eifel's timestamp does), the window they took is given back and the tail-loss probe's
 * floor rises to the delay seen, so the later stalls cost no resends, and while the core is
 * quiet only one chunk probes (F-RTO). Before: 176 resends of 2224 datagrams (every chunk
 * in flight at each stall); now 4.
 */
static void test_appliance_stall_adapts(void **state)
{
	struct stall_run r;

	(void)state;
	r = run_core_stall(1, 0, 15, 50);
	assert_true(r.spurious > 0);
	assert_true(r.undone > 0);
	assert_true(r.floor_us >= 15000);
	assert_true(r.resent * 100 < r.tx);
}

/*
 * The probe floor a stall raised comes down again: the appliance (one core) stalls 15 ms
 * of every 50 for five exchanges, lifting the floor to 20 ms; then the stalls end and 2 %
 * of the datagrams are lost for six exchanges. In a push-pull job the result answers the
 * contribution and cannot say whether a timer was right, so before, nothing lowered the
 * floor again: it stayed at 20 ms (up to rto_max / 4 after a longer hiccup) for the job's
 * life, and every lost single-datagram chunk waited that long. Now it decays by a quarter
 * every 100 ms without a new spurious timeout (and at every NACK).
 */
static void test_floor_decays_after_stall(void **state)
{
	struct sim_job_cfg cfg = cfg_of();
	struct sim_link_cfg l = { .rate_Bps = 1250000000ull,
				  .delay_ns = MS / 100,
				  .queue_bytes = 64ull << 20 };
	struct rand_loss loss = { .state = 0x9e3779b97f4a7c15ull, .p = 0.02 };
	uint64_t raised = 0, after = 0;
	double secs = 0;
	struct sim s;

	(void)state;
	cfg.frag_bytes = 32768;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	s.stall_ns[0] = 15 * MS;
	s.stall_period_ns[0] = 50 * MS;
	for (uint32_t t = 0; t < 5; t++) {
		round_once(&s, t);
	}
	for (uint32_t r = 0; r < RANKS; r++) {
		raised = PBOX_MAX(raised, pbox_node_stats(s.node[r])->pto_floor_us);
	}
	s.stall_ns[0] = 0;
	s.filter = drop_random;
	s.filter_arg = &loss;
	for (uint32_t t = 5; t < 11; t++) {
		secs += round_once(&s, t);
	}
	for (uint32_t r = 0; r < RANKS; r++) {
		after = PBOX_MAX(after, pbox_node_stats(s.node[r])->pto_floor_us);
	}
	print_message("probe floor after the stalls %llu us, after 6 exchanges at 2%% loss %llu "
		      "us (%.1f ms per exchange; %llu nacks, %llu resends, %llu probes, %llu "
		      "dropped)\n",
		      (unsigned long long)raised, (unsigned long long)after, secs / 6 * 1e3,
		      (unsigned long long)pbox_node_stats(s.node[0])->nacks,
		      (unsigned long long)pbox_node_stats(s.node[0])->retransmits,
		      (unsigned long long)pbox_node_stats(s.node[0])->probes,
		      (unsigned long long)loss.dropped);
	assert_true(raised >= 15000);
	assert_true(after * 2 < raised);
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_loss_100mbit),
		cmocka_unit_test(test_random_loss_1gbit),
		cmocka_unit_test(test_small_keys_lost_results),
		cmocka_unit_test(test_mixed_keys_window),
		cmocka_unit_test(test_stall_probe_floor),
		cmocka_unit_test(test_core_stall_no_resends),
		cmocka_unit_test(test_appliance_stall_adapts),
		cmocka_unit_test(test_floor_decays_after_stall),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
