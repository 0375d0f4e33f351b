/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF on the wire (issue 12 §2): libpbox's push filter, the engine's block aggregation and
 * the appliance's filtered results, on the simulated appliance (virtual clock).
 *  - wire forms: PBOX_ENC_DVF is accepted only where it may be, every bad length, offset
 *    and job counted under its reason; malformed blocks are dropped as bad_block with
 *    the decoder's reason counted, before anything is aggregated;
 *  - properties over many iterations through the engine: ||R||_inf <= delta_t for every
 *    worker's and the appliance's residual after every filter, every worker receives the
 *    identical result, and the worker residuals + the appliance residual + everything
 *    received == everything generated, exactly (gradients on a grid where float sums are
 *    exact);
 *  - sparse contributions aggregate bit-identically to the same values sent dense, and
 *    under loss and duplication (resends are the same bytes: the residual is applied
 *    once) the results are bit-identical to the loss-free run;
 *  - a non-finite value inside a block is refused like a dense one (EDOM);
 *  - server-optimizer jobs: pushes filtered, models sent dense; broadcast-update jobs:
 *    the broadcasts filtered like aggregates;
 *  - DVF with a TSB tree: the filtered blocks go down the tree, results bit-identical to
 *    the star's, with and without loss on the hops.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dvf/dvf_job.h"
#include "libpbox/dvf_push.h"
#include "simjob.h"

#define MS    1000000ull
#define NELEM 2500u
#define ITERS 40u

static const struct pbox_keyspec g_keys[] = { { 5, NELEM }, { 9, 10 } };

static uint64_t g_rng;

static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

/* k * 2^-20, |k| < 2^11: every residual, sum and result of these tests is a multiple of
 * 2^-20 well below 2^3, so exact in float, and their totals exact in double. */
static float grid(void)
{
	return ldexpf((float)((int32_t)(rnd() % 4095) - 2047), -20);
}

static struct pbox_dvf_job dvf_cfg(const char *codec, enum pbox_dvf_link link)
{
	struct pbox_dvf_job j;

	pbox_dvf_job_default(&j);
	j.params.delta_low = 0.004f;
	j.params.delta_up = 0.006f;
	j.link = link;
	assert_int_equal(pbox_dvf_codec_parse(codec, &j.enc.codec, &j.enc.level), 0);
	return j;
}

static struct sim_job_cfg base_cfg(uint32_t nranks, const struct pbox_dvf_job *dvf)
{
	struct sim_job_cfg c = simjob_cfg(nranks, g_keys, 2, 5000);

	c.deterministic = true;
	c.dvf = dvf;
	return c;
}

static uint32_t bits(float f)
{
	uint32_t b;

	memcpy(&b, &f, sizeof(b));
	return b;
}

/* ---- wire forms and malformed blocks ----------------------------------------------- */

static void test_wire_forms(void **state)
{
	struct pbox_dvf_job dvf = dvf_cfg("none", PBOX_DVF_LINK_SUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(2, &dvf);
	uint8_t buf[PBOX_WIRE_HDR_LEN + 2048] = { 0 };
	const struct pbox_wire_job *wj;
	struct pbox_msg m = { 0 }, out;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	m.type = PBOX_MSG_PUSH;
	m.encoding = PBOX_ENC_DVF;
	m.job = 42;
	m.sender = 1;
	m.cookie = s.cookies[1];
	m.chunk = 0;
	m.chunk_len = 4096;
	m.frag_off = 1024;
	m.frag_len = 100;
#define CHECK(want)                                                                          \
	do {                                                                                 \
		pbox_wire_encode(&m, (struct pbox_wire_hdr *)buf);                           \
		assert_int_equal(pbox_wire_validate(buf, PBOX_WIRE_HDR_LEN + m.frag_len,     \
						    PBOX_ROLE_APPLIANCE, pbox_jobtab_lookup, \
						    s.tab, &out, &wj),                       \
				 (want));                                                    \
	} while (0)
	CHECK(PBOX_DROP_NONE);
	m.frag_len = PBOX_WIRE_DVF_MIN_LEN;
	CHECK(PBOX_DROP_NONE);
	m.frag_len = 1024; /* as long as the dense fragment: allowed (never produced) */
	CHECK(PBOX_DROP_NONE);
	m.frag_len = PBOX_WIRE_DVF_MIN_LEN - 1; /* shorter than a block header */
	CHECK(PBOX_DROP_BAD_FRAGMENT);
	m.frag_len = 1025; /* longer than the fragment it stands for */
	CHECK(PBOX_DROP_BAD_ALIGNMENT);
	m.frag_len = 100;
	m.frag_off = 1026; /* not float-aligned */
	CHECK(PBOX_DROP_BAD_FRAGMENT);
	m.frag_off = 1028; /* off the fragment grid */
	CHECK(PBOX_DROP_BAD_ALIGNMENT);
	m.frag_off = 4000; /* past the chunk with its length */
	CHECK(PBOX_DROP_BAD_FRAGMENT);
	m.frag_off = 3072; /* the last fragment: 1024 bytes */
	CHECK(PBOX_DROP_NONE);
	m.type = PBOX_MSG_INIT; /* never a block */
	CHECK(PBOX_DROP_BAD_ENCODING);
	m.type = PBOX_MSG_PUSH;
	m.encoding = PBOX_ENC_MAX + 1;
	CHECK(PBOX_DROP_BAD_ENCODING);
	m.encoding = PBOX_ENC_DVF;
	/* A job without DVF refuses blocks. */
	s.job.wire.accepts_dvf = false;
	CHECK(PBOX_DROP_BAD_ENCODING);
	s.job.wire.accepts_dvf = true;
	/* Dense payloads keep their exact-length rule. */
	m.encoding = PBOX_ENC_F32;
	m.frag_len = 1020;
	CHECK(PBOX_DROP_BAD_ALIGNMENT);
	m.frag_len = 1022;
	CHECK(PBOX_DROP_BAD_FRAGMENT);
#undef CHECK
	assert_string_equal(pbox_drop_reason_name(PBOX_DROP_BAD_BLOCK), "bad_block");
	sim_fini(&s);
}

/* A valid block of fragment 0 (256 elements, half of them sent) with codec `codec`. */
static uint32_t make_block(const char *codec, uint8_t *out)
{
	struct pbox_dvf_scratch *sc = pbox_dvf_scratch_new(256);
	struct pbox_dvf_enc_cfg cfg;
	struct pbox_dvf_enc_info info;
	float resid[256] = { 0 }, g[256];

	pbox_dvf_enc_cfg_default(&cfg);
	assert_int_equal(pbox_dvf_codec_parse(codec, &cfg.codec, &cfg.level), 0);
	cfg.idx_mode = PBOX_DVF_IDX_VARINT;
	for (int i = 0; i < 256; i++) {
		g[i] = i % 10 == 0 ? 1.0f + (float)i : 0.0f; /* sparsity 0.9 */
	}
	assert_int_equal(pbox_dvf_encode(sc, &cfg, pbox_dvf_kernels_get(), resid, g, 256, 0.5f, out,
					 1023, &info),
			 0);
	pbox_dvf_scratch_free(sc);
	return info.wire_len;
}

static void push_block(struct sim *s, uint32_t rank, const uint8_t *blk, uint32_t len)
{
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.encoding = PBOX_ENC_DVF,
		.flags = PBOX_F_LAST,
		.chunk = 0,
		.iter = 0,
		.frag_off = 0,
		.frag_len = len,
	};

	sim_send_msg(s, rank, &m, blk);
}

static void test_bad_blocks(void **state)
{
	struct pbox_dvf_job dvf = dvf_cfg("none", PBOX_DVF_LINK_SUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(2, &dvf);
	uint8_t good[1024], bad[1024], snap[1024];
	uint32_t len, slen;
	uint64_t rej = 0;
	struct sim s;

	(void)state;
	cfg.no_nodes = true;
	assert_int_equal(sim_init(&s, &cfg), 0);
	len = make_block("none", good);
	slen = make_block("snappy", snap);
	assert_true(len < 1024 && slen < len);

	/* Each malformed form: dropped before anything counts it, its reason counted. */
	memcpy(bad, good, len);
	bad[0] = 9; /* version */
	push_block(&s, 0, bad, len);
	assert_int_equal(SIM_STAT(&s, dvf_rejects[PBOX_DVF_REJ_VERSION]), 1);
	memcpy(bad, good, len);
	bad[4] = 0xff; /* n = 255: another fragment's size */
	bad[5] = 0;
	push_block(&s, 0, bad, len);
	assert_int_equal(SIM_STAT(&s, dvf_rejects[PBOX_DVF_REJ_CAPACITY]), 1);
	memcpy(bad, good, len);
	bad[4] = 0xff; /* n = 511: more than the fragment holds */
	push_block(&s, 0, bad, len);
	assert_int_equal(SIM_STAT(&s, dvf_rejects[PBOX_DVF_REJ_CAPACITY]), 2);
	push_block(&s, 0, good, len - 1); /* comp_len says one byte more */
	assert_int_equal(SIM_STAT(&s, dvf_rejects[PBOX_DVF_REJ_LENGTH]), 1);
	memcpy(bad, good, len);
	bad[len - 1] = 0; /* the last gap 0: a duplicate index */
	push_block(&s, 0, bad, len);
	assert_int_equal(SIM_STAT(&s, dvf_rejects[PBOX_DVF_REJ_IDX_DUP]), 1);
	memcpy(bad, good, len);
	bad[len - 1] = 0x7f; /* the last index past n */
	push_block(&s, 0, bad, len);
	assert_int_equal(SIM_STAT(&s, dvf_rejects[PBOX_DVF_REJ_IDX_RANGE]), 1);
	memcpy(bad, snap, slen);
	for (uint32_t i = PBOX_DVF_HDR_LEN; i < slen; i++) {
		bad[i] ^= 0x5a; /* a compressed stream that is not snappy's */
	}
	push_block(&s, 0, bad, slen);
	for (int r = 1; r < PBOX_DVF_REJ_COUNT_REASONS; r++) {
		rej += SIM_STAT(&s, dvf_rejects[r]);
	}
	assert_int_equal(rej, 7);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_BLOCK]), 7);
	assert_int_equal(SIM_STAT(&s, agg_frags), 0);
	assert_int_equal(SIM_STAT(&s, dvf_blocks), 0);
	assert_int_equal(SIM_STAT(&s, acks), 0); /* never answered */

	/* The good ones are aggregated (snappy's too). */
	push_block(&s, 0, good, len);
	push_block(&s, 1, snap, slen);
	assert_int_equal(SIM_STAT(&s, dvf_blocks), 2);
	assert_int_equal(SIM_STAT(&s, agg_frags), 2);
	sim_fini(&s);
}

/* ---- training through the engine --------------------------------------------------- */

struct run {
	struct pbox_op op[4];
	float g[4][NELEM];
	float out[4][NELEM];
	float res[ITERS][NELEM]; /* rank 0's result of each iteration */
	double gen[NELEM];       /* every rank's every gradient, summed */
	double recv[NELEM];      /* every result, summed */
	uint64_t tx_bytes;
};

/* TSB: when set, train() sends the results down this tree (4 ranks, T = 2, H = 3), counts
 * the result fragments ranks relayed by encoding, and applies chaos only if seeded. */
static const uint32_t *g_tree;
static const struct pbox_tsb_key g_tree_key = { { 7,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
						  11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
						  22, 23, 24, 25, 26, 27, 28, 29, 30, 31 } };
static uint64_t g_relayed[PBOX_ENC_MAX + 1];

static enum sim_verdict tree_watch(struct sim *s, enum sim_dir dir, uint32_t ep,
				   const struct pbox_msg *m, void *arg)
{
	struct simjob_chaos *x = arg;

	if (dir == SIM_TO_WORKER && m->type == PBOX_MSG_DATA &&
	    (s->filter_from & SIM_FROM_RANK) != 0 && m->encoding <= PBOX_ENC_MAX) {
		g_relayed[m->encoding]++;
	}
	return x->x != 0 ? simjob_chaos(s, dir, ep, m, arg) : SIM_PASS;
}

static float linf_chunks(const struct pbox_dvf_push *p, const struct pbox_jobdesc *d)
{
	float m = 0;

	for (uint32_t c = 0; c < d->keys[0].nchunks; c++) {
		const float *r = pbox_dvf_push_resid(p, c);

		for (uint32_t i = 0; i < d->chunks[c].bytes / 4; i++) {
			m = fmaxf(m, fabsf(r[i]));
		}
	}
	return m;
}

/* The appliance's residuals of key 0, summed into acc (and their largest magnitude). */
static float appliance_resid(struct sim *s, double *acc)
{
	float m = 0;

	for (uint32_t k = 0; k < s->ncores; k++) {
		const struct pbox_core_job *cj = &s->job.state->core[k];

		for (uint32_t i = 0; i < cj->nchunks; i++) {
			const struct pbox_chunk_state *cs = &cj->chunks[i];
			const struct pbox_chunk_desc *cd = &s->desc.chunks[cs->id];

			if (cd->key != 0) {
				continue;
			}
			for (uint32_t e = 0; e < cd->bytes / 4; e++) {
				if (acc != NULL) {
					acc[cd->elem_off + e] += cs->resid[e];
				}
				m = fmaxf(m, fabsf(cs->resid[e]));
			}
		}
	}
	return m;
}

/* Train ITERS push-pulls of key 0 from nranks ranks; check the invariants after each. */
static void train(const struct sim_job_cfg *cfg, struct run *R, uint64_t chaos_seed)
{
	uint32_t n = cfg->nranks;
	struct simjob_chaos x = { .x = chaos_seed, .one_in = 10 };
	struct sim s;

	memset(R, 0, sizeof(*R));
	g_rng = 0x9e3779b97f4a7c15ull;
	assert_int_equal(sim_init(&s, cfg), 0);
	if (g_tree != NULL) {
		assert_int_equal(sim_set_tree(&s, g_tree, &g_tree_key), 0);
		s.filter = tree_watch;
		s.filter_arg = &x;
	} else if (chaos_seed != 0) {
		s.filter = simjob_chaos;
		s.filter_arg = &x;
	}
	for (uint32_t t = 0; t < ITERS; t++) {
		s.ncompleted = 0;
		for (uint32_t r = 0; r < n; r++) {
			for (uint32_t i = 0; i < NELEM; i++) {
				/* a few large values, many small ones */
				R->g[r][i] = rnd() % 8 == 0 ? 4 * grid() : grid();
				R->gen[i] += R->g[r][i];
			}
			assert_int_equal(
				simjob_push_pull(&s, r, &R->op[r], 0, t, R->g[r], R->out[r]), 0);
		}
		assert_true(simjob_run_until(&s, n, 5 * MS, 2000));
		for (uint32_t r = 0; r < n; r++) {
			const struct pbox_dvf_push *p = pbox_node_dvf(s.node[r]);

			assert_int_equal(R->op[r].status, 0);
			/* Every worker gets the identical result. */
			assert_memory_equal(R->out[r], R->out[0], sizeof(R->out[0]));
			/* ||R_worker||_inf <= delta_t after every filter. */
			assert_true(linf_chunks(p, &s.desc) <= pbox_dvf_push_threshold(p, t));
		}
		/* ||R_appliance||_inf <= delta_t of the iteration it filtered. */
		assert_true(appliance_resid(&s, NULL) <=
			    pbox_dvf_threshold(&cfg->dvf->params, cfg->dvf->link, t));
		memcpy(R->res[t], R->out[0], sizeof(R->out[0]));
		for (uint32_t i = 0; i < NELEM; i++) {
			R->recv[i] += R->out[0][i];
		}
	}
	/* No update lost: worker residuals + appliance residual + everything received ==
	 * everything generated, element by element, exactly. */
	appliance_resid(&s, R->recv);
	for (uint32_t r = 0; r < n; r++) {
		const struct pbox_dvf_push *p = pbox_node_dvf(s.node[r]);

		for (uint32_t c = 0; c < s.desc.keys[0].nchunks; c++) {
			const float *res = pbox_dvf_push_resid(p, c);

			for (uint32_t i = 0; i < s.desc.chunks[c].bytes / 4; i++) {
				R->recv[s.desc.chunks[c].elem_off + i] += res[i];
			}
		}
	}
	for (uint32_t i = 0; i < NELEM; i++) {
		if (R->recv[i] != R->gen[i]) {
			fail_msg("element %u: residuals + received %.17g != generated %.17g", i,
				 R->recv[i], R->gen[i]);
		}
	}
	for (uint32_t r = 0; r < n; r++) {
		R->tx_bytes += pbox_node_stats(s.node[r])->tx_bytes;
	}
	R->tx_bytes += SIM_STAT(&s, tx_bytes);
	if (cfg->dvf->enc.sparse_permille < 1000) {
		/* Blocks went both ways. */
		assert_true(pbox_dvf_push_stats(pbox_node_dvf(s.node[0]))->blocks > 0);
		assert_true(pbox_dvf_push_stats(pbox_node_dvf(s.node[0]))->results > 0);
		assert_true(SIM_STAT(&s, dvf_blocks) > 0);
		assert_true(SIM_STAT(&s, dvf_out_bytes) < SIM_STAT(&s, dvf_out_dense));
	}
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_BLOCK]), 0);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_CHECKSUM]), 0);
	sim_fini(&s);
}

static void test_invariants(void **state)
{
	static struct run R;
	struct pbox_dvf_job dvf = dvf_cfg("snappy", PBOX_DVF_LINK_SUFFICIENT);
	struct pbox_dvf_job up = dvf_cfg("none", PBOX_DVF_LINK_INSUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(3, &dvf);

	(void)state;
	cfg.verify_crc = true; /* the version words cover the blocks' bytes */
	train(&cfg, &R, 0);
	/* delta_up, no codec, arrival order: the same invariants */
	cfg = base_cfg(2, &up);
	cfg.deterministic = false;
	train(&cfg, &R, 0);
	/* broadcast-update (PF's UCC, BSP): the broadcasts are filtered alike */
	cfg = base_cfg(3, &dvf);
	cfg.mode = PBOX_MODE_BROADCAST;
	train(&cfg, &R, 0);
}

/* Sparse blocks and the same filtered values sent dense aggregate bit-identically; loss
 * and duplication change nothing (a resend is the same bytes). */
static void test_sparse_dense_lossy(void **state)
{
	static struct run A, B, C;
	struct pbox_dvf_job dvf = dvf_cfg("lz4", PBOX_DVF_LINK_SUFFICIENT);
	struct pbox_dvf_job dense = dvf;
	struct sim_job_cfg cfg = base_cfg(3, &dvf);

	(void)state;
	dense.enc.sparse_permille = 1000; /* never sparse */
	dense.enc.dense_bitmap = false;   /* nor bitmap: every fragment goes dense */
	train(&cfg, &A, 0);
	cfg.dvf = &dense;
	train(&cfg, &B, 0);
	assert_memory_equal(A.res, B.res, sizeof(A.res));
	assert_true(A.tx_bytes < B.tx_bytes);
	cfg.dvf = &dvf;
	train(&cfg, &C, 12345);
	assert_memory_equal(A.res, C.res, sizeof(A.res));
	/* something happened: not all results are zero */
	{
		uint32_t nz = 0;

		for (uint32_t i = 0; i < NELEM; i++) {
			nz += bits(A.res[ITERS - 1][i]) != 0;
		}
		assert_true(nz > 0);
	}
}

/* DVF and TSB together: the appliance sends each filtered result fragment (the same block
 * the star reply sends) down the tree, relays forward it unchanged; every worker gets
 * results bit-identical to the star DVF run, with and without loss on the hops (repairs,
 * from the parent or the appliance, resend the same bytes: the residual is applied once),
 * and train()'s invariants (no update lost, ||R||_inf <= delta_t) hold. */
static void test_tree_dvf(void **state)
{
	static struct run A, B, C;
	/* rank 0 fed by the appliance, relays to 1 and 2; 1 relays to 3 */
	static const uint32_t tree[4] = { PBOX_TSB_ROOT, 0, 0, 1 };
	struct pbox_dvf_job dvf = dvf_cfg("lz4", PBOX_DVF_LINK_SUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(4, &dvf);

	(void)state;
	train(&cfg, &A, 0);
	g_tree = tree;
	memset(g_relayed, 0, sizeof(g_relayed));
	train(&cfg, &B, 0);
	assert_memory_equal(A.res, B.res, sizeof(A.res));
	/* the tree carried the blocks: 3 ranks each got every result fragment relayed */
	assert_true(g_relayed[PBOX_ENC_DVF] > 0);
	/* key 0: 10000 bytes in chunks of 4096: 4 + 4 + 2 fragments */
	assert_int_equal(g_relayed[PBOX_ENC_DVF] + g_relayed[PBOX_ENC_F32], 3 * ITERS * 10);
	train(&cfg, &C, 777);
	assert_memory_equal(A.res, C.res, sizeof(A.res));
	/* broadcast-update (UCC) broadcasts down the tree alike */
	cfg.mode = PBOX_MODE_BROADCAST;
	g_tree = NULL;
	train(&cfg, &A, 0);
	g_tree = tree;
	train(&cfg, &C, 4242);
	assert_memory_equal(A.res, C.res, sizeof(A.res));
	g_tree = NULL;
}

/* A NaN in a filtered push is always sent (never <= delta) and refused by the appliance
 * under non_finite = "reject": the operation fails with EDOM. */
static void test_nonfinite_block(void **state)
{
	struct pbox_dvf_job dvf = dvf_cfg("snappy", PBOX_DVF_LINK_SUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(1, &dvf);
	static float g[NELEM], out[NELEM];
	struct pbox_op op = {
		.kind = PBOX_OP_PUSH_PULL, .key = 0, .iter = 0, .src = g, .dst = out
	};
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	g[7] = NAN;
	assert_int_equal(pbox_node_submit(s.node[0], &op), 0);
	pbox_node_flush(s.node[0]);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(op.status, -EDOM);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 1);
	assert_true(SIM_STAT(&s, dvf_blocks) >= 1);
	sim_fini(&s);
}

/* The delta_low / delta_up switch: the job's link until a plan says (push_up). */
static void test_plan_switch(void **state)
{
	struct pbox_dvf_job dvf = dvf_cfg("none", PBOX_DVF_LINK_INSUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(1, &dvf);
	struct pbox_dvf_push *p;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	p = pbox_node_dvf(s.node[0]);
	assert_int_equal(pbox_dvf_push_link(p), PBOX_DVF_LINK_INSUFFICIENT); /* the job's */
	assert_true(pbox_dvf_push_threshold(p, 3) == dvf.params.delta_up / 2.0f);
	pbox_dvf_push_set_plan(p, PBOX_DVF_PLAN_LOW);
	assert_int_equal(pbox_dvf_push_link(p), PBOX_DVF_LINK_SUFFICIENT);
	assert_true(pbox_dvf_push_threshold(p, 3) == dvf.params.delta_low / 2.0f);
	pbox_dvf_push_set_plan(p, PBOX_DVF_PLAN_UP);
	assert_true(pbox_dvf_push_threshold(p, 0) == dvf.params.delta_up);
	pbox_dvf_push_set_plan(p, PBOX_DVF_PLAN_NONE);
	assert_int_equal(pbox_dvf_push_link(p), PBOX_DVF_LINK_INSUFFICIENT);
	sim_fini(&s);
}

/* Server-optimizer jobs: pushes are filtered blocks, models come back dense. */
static void test_server_opt(void **state)
{
	struct pbox_dvf_job dvf = dvf_cfg("snappy", PBOX_DVF_LINK_SUFFICIENT);
	struct sim_job_cfg cfg = base_cfg(2, &dvf);
	static float w0[NELEM], g[2][NELEM], out[2][NELEM];
	struct sim s;

	(void)state;
	cfg.mode = PBOX_MODE_SERVER_OPT;
	cfg.optimizer = "sgd";
	cfg.opt.lr = 1.0f;
	cfg.opt.rescale = 1.0f;
	assert_int_equal(sim_init(&s, &cfg), 0);
	{
		struct pbox_op init = { .kind = PBOX_OP_INIT, .key = 0, .src = w0 };
		struct pbox_op init1 = { .kind = PBOX_OP_INIT, .key = 1, .src = w0 };

		assert_int_equal(pbox_node_submit(s.node[0], &init), 0);
		assert_int_equal(pbox_node_submit(s.node[0], &init1), 0);
		pbox_node_flush(s.node[0]);
		sim_pump(&s, 0);
		assert_int_equal(init.status, 0);
	}
	g_rng = 99;
	for (uint32_t t = 0; t < 5; t++) {
		struct pbox_op op[2];

		s.ncompleted = 0;
		for (uint32_t r = 0; r < 2; r++) {
			for (uint32_t i = 0; i < NELEM; i++) {
				g[r][i] = grid();
			}
			op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
						  .key = 0,
						  .iter = t,
						  .src = g[r],
						  .dst = out[r] };
			assert_int_equal(pbox_node_submit(s.node[r], &op[r]), 0);
			pbox_node_flush(s.node[r]);
		}
		sim_pump(&s, 0);
		assert_int_equal(op[0].status, 0);
		assert_int_equal(op[1].status, 0);
		assert_memory_equal(out[0], out[1], sizeof(out[0]));
	}
	assert_true(SIM_STAT(&s, dvf_blocks) > 0);
	assert_int_equal(SIM_STAT(&s, dvf_out_frags), 0); /* models are not filtered */
	assert_int_equal(pbox_dvf_push_stats(pbox_node_dvf(s.node[0]))->results, 0);
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wire_forms),  cmocka_unit_test(test_bad_blocks),
		cmocka_unit_test(test_invariants),  cmocka_unit_test(test_sparse_dense_lossy),
		cmocka_unit_test(test_tree_dvf),    cmocka_unit_test(test_nonfinite_block),
		cmocka_unit_test(test_plan_switch), cmocka_unit_test(test_server_opt),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
