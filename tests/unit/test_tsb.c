/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TSB (tree-based streaming broadcast) on the simulated appliance: trees and their checks,
 * the broadcast MAC, the appliance's fan-out to the tree's top only, relays forwarding
 * every fragment unchanged, bit-identical results against the star, forged and misrouted
 * fragments refused and counted, a lossy hop repaired, a relay that left or stalls routed
 * around.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "simjob.h"

#define MS     1000000ull
#define NELEM  2500
#define NRANKS 6
#define R_     PBOX_TSB_ROOT

static const struct pbox_keyspec g_keys[] = { { 5, NELEM } };
/* T = 2, H = 3: the appliance feeds 0 and 1; 0 relays to 2 and 3, 1 to 4 and 5. */
static const uint32_t g_tree[NRANKS] = { R_, R_, 0, 0, 1, 1 };
static const struct pbox_tsb_key g_key = { { 1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
					     12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
					     23, 24, 25, 26, 27, 28, 29, 30, 31, 32 } };

static struct sim_job_cfg base_cfg(void)
{
	return simjob_cfg(NRANKS, g_keys, 1, 5000);
}

struct ranks {
	struct pbox_op op[NRANKS];
	float g[NRANKS][NELEM];
	float out[NRANKS][NELEM];
};

static float grad(uint32_t r, uint32_t i, uint32_t t)
{
	return (float)((r * 7 + i * 13 + t * 3) % 1000) * 0.001f - 0.3f;
}

/* One push-pull of iteration t by every rank in `who` (bitmask); runs the clock until all
 * complete (or 3 virtual seconds). */
static void run_iter(struct sim *s, struct ranks *R, uint32_t t, uint32_t who)
{
	uint32_t n = 0;

	s->ncompleted = 0;
	for (uint32_t r = 0; r < NRANKS; r++) {
		if (!(who & (1u << r))) {
			continue;
		}
		for (uint32_t i = 0; i < NELEM; i++) {
			R->g[r][i] = grad(r, i, t);
		}
		assert_int_equal(simjob_push_pull(s, r, &R->op[r], 0, t, R->g[r], R->out[r]), 0);
		n++;
	}
	assert_true(simjob_run_until(s, n, MS, 3000));
	for (uint32_t r = 0; r < NRANKS; r++) {
		if (who & (1u << r)) {
			assert_int_equal(R->op[r].status, 0);
		}
	}
}

static void check_sum(const struct ranks *R, uint32_t who, uint32_t t)
{
	for (uint32_t r = 0; r < NRANKS; r++) {
		if (!(who & (1u << r))) {
			continue;
		}
		for (uint32_t i = 0; i < NELEM; i++) {
			float want = 0;

			for (uint32_t q = 0; q < NRANKS; q++) {
				if (who & (1u << q)) {
					want += grad(q, i, t);
				}
			}
			assert_true(R->out[r][i] == want);
		}
	}
}

/* Counts result fragments by who sent them, and drops some (a filter). */
struct watch {
	uint64_t from_core[NRANKS]; /* DATA from the appliance, per receiving rank */
	uint64_t from_rank[NRANKS]; /* DATA relayed by a rank, per receiving rank */
	uint32_t drop_to;           /* drop relayed DATA arriving at this rank ... */
	uint32_t drop_left;         /* ... this many times */
	bool drop_tail;             /* ... only fragments after a chunk's first */
	uint32_t stall_from;        /* drop everything this rank relays (UINT32_MAX: none) */
	uint64_t dropped;
};

static enum sim_verdict watch_fn(struct sim *s, enum sim_dir dir, uint32_t ep,
				 const struct pbox_msg *m, void *arg)
{
	struct watch *w = arg;
	bool relayed = (s->filter_from & SIM_FROM_RANK) != 0;

	if (dir != SIM_TO_WORKER || m->type != PBOX_MSG_DATA) {
		return SIM_PASS;
	}
	if (relayed && (s->filter_from & ~SIM_FROM_RANK) == w->stall_from) {
		w->dropped++;
		return SIM_DROP;
	}
	if (relayed && ep == w->drop_to && w->drop_left > 0 &&
	    (!w->drop_tail || m->frag_off != 0)) {
		w->drop_left--;
		w->dropped++;
		return SIM_DROP;
	}
	if (relayed) {
		w->from_rank[ep]++;
	} else {
		w->from_core[ep]++;
	}
	return SIM_PASS;
}

static void test_tree_build_check(void **state)
{
	uint32_t p[16];
	char err[200];

	(void)state;
	assert_int_equal(pbox_tsb_tree_build(NRANKS, 2, 3, p), 0);
	assert_memory_equal(p, g_tree, sizeof(g_tree));
	assert_int_equal(pbox_tsb_tree_check(NRANKS, p, 2, 3, err, sizeof(err)), 0);
	assert_int_equal(pbox_tsb_tree_build(14, 2, 3, p), 0); /* 2 + 4 + 8 */
	assert_int_equal(pbox_tsb_tree_check(14, p, 2, 3, err, sizeof(err)), 0);
	assert_int_equal(pbox_tsb_tree_build(15, 2, 3, p), -E2BIG);
	assert_int_equal(pbox_tsb_tree_build(3, 0, 3, p), -EINVAL);
	/* a chain of 4 is 4 deep */
	{
		uint32_t chain[4] = { R_, 0, 1, 2 };

		assert_int_equal(pbox_tsb_tree_check(4, chain, 2, 3, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "deeper"));
		assert_int_equal(pbox_tsb_tree_check(4, chain, 2, 4, err, sizeof(err)), 0);
	}
	/* a cycle never reaches the appliance */
	{
		uint32_t cyc[3] = { R_, 2, 1 };

		assert_int_equal(pbox_tsb_tree_check(3, cyc, 2, 16, err, sizeof(err)), -EINVAL);
	}
	/* degree: three children of the appliance, or of a rank */
	{
		uint32_t wide[4] = { R_, R_, R_, 0 };
		uint32_t wide2[4] = { R_, 0, 0, 0 };

		assert_int_equal(pbox_tsb_tree_check(4, wide, 2, 3, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "appliance has 3"));
		assert_int_equal(pbox_tsb_tree_check(4, wide2, 2, 3, err, sizeof(err)), -EINVAL);
	}
	/* a parent that is no rank */
	{
		uint32_t bad[2] = { R_, 7 };

		assert_int_equal(pbox_tsb_tree_check(2, bad, 2, 3, err, sizeof(err)), -EINVAL);
	}
	/* feeders: a rank whose parent left or is bypassed is fed by the appliance */
	{
		uint64_t live = 0x3f & ~(1ull << 1), bypass = 1ull << 0;

		assert_int_equal(pbox_tsb_feeder(g_tree, 4, NULL, NULL), 1);
		assert_int_equal(pbox_tsb_feeder(g_tree, 4, &live, NULL), R_);
		assert_int_equal(pbox_tsb_feeder(g_tree, 2, &live, &bypass), R_);
		assert_int_equal(pbox_tsb_feeder(g_tree, 0, &live, &bypass), R_);
	}
}

static void test_mac(void **state)
{
	uint8_t pkt[PBOX_WIRE_HDR_LEN + 64];
	struct pbox_msg m = {
		.type = PBOX_MSG_DATA,
		.encoding = PBOX_ENC_F32,
		.flags = PBOX_F_TREE,
		.job = 42,
		.sender = PBOX_SENDER_APPLIANCE,
		.chunk_len = 64,
		.frag_len = 64,
	};
	struct pbox_tsb_key other = g_key;
	struct pbox_msg d;
	char hex[2 * PBOX_TSB_KEY_BYTES + 1];
	struct pbox_tsb_key back;

	(void)state;
	for (int i = 0; i < 64; i++) {
		pkt[PBOX_WIRE_HDR_LEN + i] = (uint8_t)i;
	}
	m.cookie = pbox_tsb_cookie(&g_key);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	m.sack = pbox_tsb_mac(&g_key, (struct pbox_wire_hdr *)pkt, pkt + PBOX_WIRE_HDR_LEN, 64);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	assert_int_equal(pbox_wire_decode(pkt, sizeof(pkt), &d), PBOX_DROP_NONE);
	assert_true(d.sack == m.sack && d.sack != 0);
	assert_true(pbox_tsb_verify(&g_key, pkt, sizeof(pkt)));
	other.b[0] ^= 1;
	assert_false(pbox_tsb_verify(&other, pkt, sizeof(pkt)));
	/* any flipped bit, header (before the tag) or payload, breaks it */
	for (size_t i = 0; i < sizeof(pkt); i++) {
		if (i >= 56 && i < PBOX_WIRE_HDR_LEN) {
			continue;
		}
		pkt[i] ^= 0x10;
		assert_false(pbox_tsb_verify(&g_key, pkt, sizeof(pkt)));
		pkt[i] ^= 0x10;
	}
	/* the tag word is not a free field: a DATA without PBOX_F_TREE must keep it zero */
	m.flags = 0;
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	assert_int_equal(pbox_wire_decode(pkt, sizeof(pkt), &d), PBOX_DROP_NONE);
	memcpy(pkt + 56, "\1\2\3\4\5\6\7\10", 8);
	assert_int_equal(pbox_wire_decode(pkt, sizeof(pkt), &d), PBOX_DROP_BAD_RESERVED);
	/* hex round trip; malformed keys refused */
	pbox_tsb_key_hex(&g_key, hex);
	assert_int_equal(pbox_tsb_key_parse(hex, &back), 0);
	assert_memory_equal(&back, &g_key, sizeof(back));
	hex[5] = 'g';
	assert_int_equal(pbox_tsb_key_parse(hex, &back), -EINVAL);
	assert_int_equal(pbox_tsb_key_parse("abcd", &back), -EINVAL);
	assert_int_equal(pbox_tsb_key_parse(NULL, &back), -EINVAL);
}

static uint32_t nfrags_total(const struct sim *s)
{
	uint32_t n = 0;

	for (uint32_t c = 0; c < s->desc.nchunks; c++) {
		n += s->desc.chunks[c].nfrags;
	}
	return n;
}

/* The appliance sends each result fragment to ranks 0 and 1 only; they forward it. */
static void test_fanout_forward(void **state)
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	struct watch w = { .drop_to = UINT32_MAX, .stall_from = UINT32_MAX };
	struct sim s;
	uint32_t nf;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	nf = nfrags_total(&s);
	s.filter = watch_fn;
	s.filter_arg = &w;
	for (uint32_t t = 0; t < 4; t++) {
		run_iter(&s, &R, t, 0x3f);
		check_sum(&R, 0x3f, t);
	}
	for (uint32_t r = 0; r < NRANKS; r++) {
		const struct pbox_node_stats *ns = pbox_node_stats(s.node[r]);
		uint32_t nch = r < 2 ? 2 : 0;

		/* every fragment once, from the right place; no repair was needed */
		assert_int_equal(ns->tsb_rx, 4 * nf);
		assert_int_equal(ns->tsb_fwd, 4 * nf * nch);
		assert_int_equal(ns->tsb_bad_mac, 0);
		assert_int_equal(ns->tsb_not_parent, 0);
		assert_int_equal(ns->probes, 0);
		assert_int_equal(w.from_core[r], r < 2 ? 4 * nf : 0);
		assert_int_equal(w.from_rank[r], r < 2 ? 0 : 4 * nf);
	}
	assert_int_equal(s.job.tsb->core[0].sent + s.job.tsb->core[1].sent, 4 * nf * 2);
	sim_fini(&s);
}

/* Server-optimizer, deterministic: the tree gives every rank the model the star gives,
 * bit for bit. */
static void run_model(bool tree, float out[NRANKS][NELEM])
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	static float w0[NELEM];
	struct pbox_op init = { .kind = PBOX_OP_INIT, .key = 0, .src = w0 };
	struct sim s;

	cfg.mode = PBOX_MODE_SERVER_OPT;
	cfg.deterministic = true;
	cfg.optimizer = "nag";
	cfg.opt.lr = 0.05f;
	cfg.opt.momentum = 0.9f;
	assert_int_equal(sim_init(&s, &cfg), 0);
	if (tree) {
		assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	}
	for (uint32_t i = 0; i < NELEM; i++) {
		w0[i] = (float)i * 1e-3f;
	}
	s.ncompleted = 0;
	assert_int_equal(pbox_node_submit(s.node[0], &init), 0);
	pbox_node_flush(s.node[0]);
	sim_pump(&s, 0);
	assert_int_equal(init.status, 0);
	for (uint32_t t = 0; t < 5; t++) {
		run_iter(&s, &R, t, 0x3f);
		for (uint32_t r = 0; r < NRANKS; r++) {
			assert_int_equal(R.op[r].label, t + 1);
		}
	}
	memcpy(out, R.out, sizeof(R.out));
	if (tree) {
		assert_true(pbox_node_stats(s.node[5])->tsb_rx > 0);
	}
	sim_fini(&s);
}

static void test_identical_to_star(void **state)
{
	static float star[NRANKS][NELEM], tree[NRANKS][NELEM];

	(void)state;
	run_model(false, star);
	run_model(true, tree);
	for (uint32_t r = 0; r < NRANKS; r++) {
		assert_memory_equal(tree[r], star[0], sizeof(star[0]));
		assert_memory_equal(star[r], star[0], sizeof(star[0]));
	}
}

/* A broadcast fragment with a wrong MAC, or from a rank that is not the parent, is
 * refused and counted, and never forwarded or consumed. */
static void test_forged_refused(void **state)
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	uint8_t pkt[PBOX_WIRE_HDR_LEN + 1024];
	struct pbox_msg m = {
		.type = PBOX_MSG_DATA,
		.encoding = PBOX_ENC_F32,
		.flags = PBOX_F_TREE,
		.job = 42,
		.sender = PBOX_SENDER_APPLIANCE,
		.chunk = 0,
		.iter = 0,
		.frag_off = 0,
		.frag_len = 1024,
		.chunk_len = 4096,
		.arg0 = NRANKS,
	};
	struct pbox_tsb_key wrong = g_key;
	struct pbox_peer parent = sim_rank_addr(0), stranger = sim_rank_addr(4);
	const struct pbox_node_stats *ns;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	ns = pbox_node_stats(s.node[2]);
	memset(pkt + PBOX_WIRE_HDR_LEN, 0x41, 1024);
	m.cookie = pbox_tsb_cookie(&g_key);
	wrong.b[31] ^= 0x80;
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	m.sack = pbox_tsb_mac(&wrong, (struct pbox_wire_hdr *)pkt, pkt + PBOX_WIRE_HDR_LEN, 1024);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	pbox_node_rx(s.node[2], pkt, sizeof(pkt), &parent);
	assert_int_equal(ns->tsb_bad_mac, 1);
	/* the right MAC, from a rank that is not rank 2's parent */
	m.sack = pbox_tsb_mac(&g_key, (struct pbox_wire_hdr *)pkt, pkt + PBOX_WIRE_HDR_LEN, 1024);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	pbox_node_rx(s.node[2], pkt, sizeof(pkt), &stranger);
	assert_int_equal(ns->tsb_not_parent, 1);
	/* the broadcast cookie is checked like any cookie */
	m.cookie ^= 1;
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	pbox_node_rx(s.node[2], pkt, sizeof(pkt), &parent);
	assert_int_equal(ns->drops[PBOX_DROP_BAD_COOKIE], 1);
	assert_int_equal(ns->tsb_rx, 0);
	assert_int_equal(ns->tsb_fwd, 0);
	/* a forged fragment planted before the real result does not end up in it: iteration
	 * 0's result, forged with the wrong key, then the real run */
	m.cookie = pbox_tsb_cookie(&g_key);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	m.sack = pbox_tsb_mac(&wrong, (struct pbox_wire_hdr *)pkt, pkt + PBOX_WIRE_HDR_LEN, 1024);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	run_iter(&s, &R, 0, 0x3f);
	pbox_node_rx(s.node[3], pkt, sizeof(pkt), &parent);
	assert_int_equal(pbox_node_stats(s.node[3])->tsb_bad_mac, 1);
	check_sum(&R, 0x3f, 0);
	/* the same fragment with the right MAC is accepted (and is a duplicate now) */
	m.sack = pbox_tsb_mac(&g_key, (struct pbox_wire_hdr *)pkt, pkt + PBOX_WIRE_HDR_LEN, 1024);
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	pbox_node_rx(s.node[3], pkt, sizeof(pkt), &parent);
	assert_int_equal(pbox_node_stats(s.node[3])->tsb_rx, nfrags_total(&s) + 1);
	sim_fini(&s);
}

/* Fragments lost on the hop 1 -> 4: rank 4 asks its parent, which re-sends them from its
 * repair cache; the appliance sends nothing again. */
static void test_lossy_hop_repaired(void **state)
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	struct watch w = {
		.drop_to = 4, .drop_left = 5, .drop_tail = true, .stall_from = UINT32_MAX
	};
	struct sim s;
	uint32_t nf;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	nf = nfrags_total(&s);
	s.filter = watch_fn;
	s.filter_arg = &w;
	for (uint32_t t = 0; t < 3; t++) {
		run_iter(&s, &R, t, 0x3f);
		check_sum(&R, 0x3f, t);
	}
	assert_int_equal(w.dropped, 5);
	assert_true(pbox_node_stats(s.node[4])->tsb_parent_pulls > 0);
	assert_int_equal(pbox_node_stats(s.node[1])->tsb_served, 5);
	assert_int_equal(w.from_rank[4], 3 * nf); /* every fragment once, 5 of them repaired */
	assert_int_equal(pbox_node_stats(s.node[4])->probes,
			 pbox_node_stats(s.node[4])->tsb_parent_pulls);
	assert_int_equal(w.from_core[4], 0);
	assert_int_equal(SIM_STAT(&s, replies_resent), 0);
	/* partial losses are not taken for a stalled relay */
	assert_int_equal(s.job.tsb->core[0].bypasses + s.job.tsb->core[1].bypasses, 0);
	sim_fini(&s);
}

/* The parent cannot repair (its repair answers are lost too): the child's next request
 * goes to the appliance, which re-sends the rest directly. */
static void test_repair_falls_back(void **state)
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	struct watch w = {
		.drop_to = 4, .drop_left = 12, .drop_tail = true, .stall_from = UINT32_MAX
	};
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	s.filter = watch_fn;
	s.filter_arg = &w;
	/* the first iteration's fragments 2.. of chunk 0 to rank 4 and their repairs go */
	run_iter(&s, &R, 0, 0x3f);
	check_sum(&R, 0x3f, 0);
	assert_true(pbox_node_stats(s.node[4])->tsb_parent_pulls > 0);
	assert_true(w.from_core[4] > 0);
	assert_true(SIM_STAT(&s, replies_resent) > 0);
	sim_fini(&s);
}

/* Relay 1 leaves between iterations: the appliance adopts 4 and 5. */
static void test_relay_left(void **state)
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	struct watch w = { .drop_to = UINT32_MAX, .stall_from = UINT32_MAX };
	const uint32_t rest = 0x3f & ~(1u << 1);
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	s.filter = watch_fn;
	s.filter_arg = &w;
	run_iter(&s, &R, 0, 0x3f);
	check_sum(&R, 0x3f, 0);
	sim_remove_rank(&s, 1);
	memset(&w, 0, sizeof(w));
	w.drop_to = UINT32_MAX;
	w.stall_from = UINT32_MAX;
	for (uint32_t t = 1; t < 4; t++) {
		run_iter(&s, &R, t, rest);
		check_sum(&R, rest, t);
	}
	assert_int_equal(w.from_core[4], 3 * nfrags_total(&s));
	assert_int_equal(w.from_core[5], 3 * nfrags_total(&s));
	assert_int_equal(w.from_rank[2], 3 * nfrags_total(&s)); /* 0 still relays */
	assert_int_equal(pbox_node_stats(s.node[4])->probes, 0);
	assert_int_equal(pbox_node_stats(s.node[4])->tsb_not_parent, 0);
	sim_fini(&s);
}

/* Relay 1 stays in the job but forwards nothing: its children time out and pull from
 * the appliance, and each core bypasses it after PBOX_TSB_STALL_PULLS such requests;
 * later iterations need no repair. */
static void test_relay_stalls(void **state)
{
	struct sim_job_cfg cfg = base_cfg();
	static struct ranks R;
	struct watch w = { .drop_to = UINT32_MAX, .stall_from = 1 };
	struct sim s;
	uint32_t t = 0;
	uint64_t probes;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_tree(&s, g_tree, &g_key), 0);
	s.filter = watch_fn;
	s.filter_arg = &w;
	for (; t < 12 && s.job.tsb->core[0].bypasses + s.job.tsb->core[1].bypasses < 2; t++) {
		run_iter(&s, &R, t, 0x3f);
		check_sum(&R, 0x3f, t);
	}
	assert_int_equal(s.job.tsb->core[0].bypasses, 1);
	assert_int_equal(s.job.tsb->core[1].bypasses, 1);
	assert_true(pbox_tsb_feeder(g_tree, 4, NULL, s.job.tsb->core[0].bypass) == R_);
	probes = pbox_node_stats(s.node[4])->probes + pbox_node_stats(s.node[5])->probes;
	for (uint32_t k = 0; k < 3; k++, t++) {
		run_iter(&s, &R, t, 0x3f);
		check_sum(&R, 0x3f, t);
	}
	assert_int_equal(pbox_node_stats(s.node[4])->probes + pbox_node_stats(s.node[5])->probes,
			 probes);
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tree_build_check),  cmocka_unit_test(test_mac),
		cmocka_unit_test(test_fanout_forward),    cmocka_unit_test(test_identical_to_star),
		cmocka_unit_test(test_forged_refused),    cmocka_unit_test(test_lossy_hop_repaired),
		cmocka_unit_test(test_repair_falls_back), cmocka_unit_test(test_relay_left),
		cmocka_unit_test(test_relay_stalls),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
