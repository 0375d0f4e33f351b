/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF (dataplane/dvf): the filter's invariants over many random iterations on every ISA
 * (||R||_inf <= delta_t; R + everything received == everything generated, exactly, on
 * gradients whose sums are exact in floating point; the boundary |U| == delta_t kept),
 * bit-exact round trips of every encoding at the sparsities around the 0.8 switch with
 * every codec, the vector kernels against the scalar ones bit for bit, and the decoder's
 * rejection of each malformed form with its own reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <errno.h>

#include <cmocka.h>

#include <lz4.h>
#include <snappy-c.h>
#include <zstd.h>

#include "common/compiler.h"
#include "dvf/dvf.h"

#define CAP 4096

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

static uint32_t below(uint32_t n)
{
	return (uint32_t)(rnd() % n);
}

/* A value k * 2^-20, |k| < 2^11. Scaled by 2^-s (s <= 12), every value, residual and
 * sent value of the invariant test is a multiple of 2^-32 below 2^-8 in magnitude: exact
 * in float (24 bits), and every sum of them exact in double. */
static float grid(void)
{
	return ldexpf((float)((int32_t)below(4095) - 2047), -20);
}

static uint32_t bits_of(float f)
{
	uint32_t b;

	memcpy(&b, &f, sizeof(b));
	return b;
}

static float of_bits(uint32_t b)
{
	float f;

	memcpy(&f, &b, sizeof(f));
	return f;
}

/* The block of a view as a dense vector (zeros where nothing was sent), by plain loops
 * independent of the kernels. */
static void view_dense(const struct pbox_dvf_view *v, float *out)
{
	uint32_t c = 0;

	memset(out, 0, v->n * sizeof(float));
	for (uint32_t i = 0; i < v->n; i++) {
		if (v->idx != NULL) {
			if (c < v->count && v->idx[c] == i) {
				out[i] = v->vals[c++];
			}
		} else if (v->bitmap != NULL) {
			if ((v->bitmap[i / 8] >> (i % 8)) & 1) {
				out[i] = v->vals[c++];
			}
		} else {
			out[i] = v->vals[c++];
		}
	}
	assert_int_equal(c, v->count);
}

static const struct pbox_dvf_kernels *g_isas[3];
static unsigned g_nisas;
static const struct pbox_dvf_kernels *g_scalar;
static struct pbox_dvf_scratch *g_s;

static int setup(void **state)
{
	(void)state;
	g_nisas = pbox_dvf_kernels_supported(g_isas, 3);
	g_scalar = pbox_dvf_kernels_by_isa("scalar");
	g_s = pbox_dvf_scratch_new(CAP);
	printf("dvf kernels:");
	for (unsigned i = 0; i < g_nisas; i++) {
		printf(" %s", g_isas[i]->isa);
	}
	printf("\n");
	return g_scalar == NULL || g_s == NULL;
}

static int teardown(void **state)
{
	(void)state;
	pbox_dvf_scratch_free(g_s);
	return 0;
}

static void cfg_of(struct pbox_dvf_enc_cfg *cfg, const char *spec, enum pbox_dvf_idx_mode m)
{
	pbox_dvf_enc_cfg_default(cfg);
	assert_int_equal(pbox_dvf_codec_parse(spec, &cfg->codec, &cfg->level), 0);
	cfg->idx_mode = m;
}

static const char *const g_specs[] = { "none",   "lz4",     "zstd:1",  "zstd:2", "zstd:3",
				       "snappy", "igzip:0", "igzip:1", "igzip:3" };

/* ---- threshold ---------------------------------------------------------------------- */

static void test_threshold(void **state)
{
	struct pbox_dvf_params p = { .delta_low = 0.002f, .delta_up = 0.005f };
	struct pbox_dvf_params bad[] = {
		{ -0.1f, 1.0f },
		{ 1.0f, 0.5f },
		{ NAN, 1.0f },
		{ 0.0f, INFINITY },
	};

	(void)state;
	assert_int_equal(pbox_dvf_params_check(&p), 0);
	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(bad); i++) {
		assert_int_equal(pbox_dvf_params_check(&bad[i]), -EINVAL);
	}
	/* t = 0 is the first exchange: delta_sel itself (PF's delta / sqrt(t) from t = 1). */
	assert_true(pbox_dvf_threshold(&p, PBOX_DVF_LINK_SUFFICIENT, 0) == 0.002f);
	assert_true(pbox_dvf_threshold(&p, PBOX_DVF_LINK_INSUFFICIENT, 0) == 0.005f);
	assert_true(pbox_dvf_threshold(&p, PBOX_DVF_LINK_SUFFICIENT, 3) == 0.001f);
	assert_true(pbox_dvf_threshold(&p, PBOX_DVF_LINK_INSUFFICIENT, 99) ==
		    (float)((double)0.005f / 10.0));
	/* decreasing in t */
	for (uint64_t t = 0; t < 1000; t++) {
		assert_true(pbox_dvf_threshold(&p, PBOX_DVF_LINK_SUFFICIENT, t + 1) <
			    pbox_dvf_threshold(&p, PBOX_DVF_LINK_SUFFICIENT, t));
	}
}

/* ---- the filter's invariants through the whole pipeline ----------------------------- */

static float g_resid[CAP], g_grad[CAP], g_prev[CAP];
static double g_gen[CAP], g_recv[CAP];
static uint8_t g_wire[PBOX_DVF_HDR_LEN + 4 * CAP];

/*
 * One sender over many clocks with random gradients, link states, block lengths and
 * codecs: every block goes through encode -> wire -> decode, and what the receiver gets
 * is summed in double. Checked after every block: ||R||_inf <= delta_t; per element the
 * sent value and the new residual partition U = R + g exactly (one of them is 0); and
 * at the end, sum of g == R + sum received, exactly (the grid keeps every sum exact).
 */
static void run_invariants(const struct pbox_dvf_kernels *k)
{
	struct pbox_dvf_params p = { .delta_low = ldexpf(1, -14), .delta_up = ldexpf(1, -12) };
	const uint32_t n = 1000 + below(3000);
	unsigned sparse_blocks = 0, dense_blocks = 0;

	memset(g_resid, 0, sizeof(g_resid));
	memset(g_gen, 0, sizeof(g_gen));
	memset(g_recv, 0, sizeof(g_recv));
	for (uint64_t t = 0; t < 300; t++) {
		enum pbox_dvf_link link =
			below(2) ? PBOX_DVF_LINK_SUFFICIENT : PBOX_DVF_LINK_INSUFFICIENT;
		float thr = pbox_dvf_threshold(&p, link, t);
		struct pbox_dvf_enc_cfg cfg;
		struct pbox_dvf_enc_info info;
		struct pbox_dvf_view v;
		enum pbox_dvf_reject why = PBOX_DVF_OK;
		/* Gradients of varying scale, so that sparsity wanders across 0.8. */
		int scale = (int)below(13);

		cfg_of(&cfg, g_specs[below(PBOX_ARRAY_SIZE(g_specs))], below(3));
		cfg.dense_bitmap = below(2);
		for (uint32_t i = 0; i < n; i++) {
			g_grad[i] = ldexpf(grid(), -scale);
			g_gen[i] += g_grad[i];
		}
		memcpy(g_prev, g_resid, sizeof(g_prev));
		assert_int_equal(pbox_dvf_encode(g_s, &cfg, k, g_resid, g_grad, n, thr, g_wire,
						 sizeof(g_wire), &info),
				 0);
		assert_true(info.wire_len <= pbox_dvf_block_bound(n));
		assert_int_equal(pbox_dvf_decode(g_s, g_wire, info.wire_len, n, &v, &why), 0);
		assert_int_equal(v.n, n);
		info.encoding == PBOX_DVF_ENC_DENSE ? dense_blocks++ : sparse_blocks++;
		{
			float got[CAP];
			uint32_t sent = 0;

			view_dense(&v, got);
			for (uint32_t i = 0; i < n; i++) {
				float u = g_prev[i] + g_grad[i];

				assert_true(fabsf(g_resid[i]) <= thr);
				if (got[i] != 0.0f) {
					sent++;
					assert_true(fabsf(u) > thr);
					assert_int_equal(bits_of(got[i]), bits_of(u));
					assert_int_equal(bits_of(g_resid[i]), 0);
				} else {
					assert_true(fabsf(u) <= thr);
					assert_int_equal(bits_of(g_resid[i]), bits_of(u));
				}
				g_recv[i] += got[i];
			}
			assert_int_equal(sent, info.sent);
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		assert_true(g_gen[i] == (double)g_resid[i] + g_recv[i]);
	}
	/* Both encodings were exercised (the scales make sure of it). */
	assert_true(sparse_blocks > 0 && dense_blocks > 0);
}

static void test_invariants(void **state)
{
	(void)state;
	for (unsigned i = 0; i < g_nisas; i++) {
		run_invariants(g_isas[i]);
	}
}

/* The receiver side: blocks added into an accumulator (scatter-add for sparse, the add
 * kernel for dense) equal the dense sum of the sent vectors, bit for bit. */
static void test_accumulate(void **state)
{
	static float acc[CAP], want[CAP], dense[CAP];
	const uint32_t n = 3001;

	(void)state;
	for (unsigned a = 0; a < g_nisas; a++) {
		const struct pbox_dvf_kernels *k = g_isas[a];

		memset(acc, 0, sizeof(acc));
		memset(want, 0, sizeof(want));
		for (unsigned it = 0; it < 40; it++) {
			struct pbox_dvf_enc_cfg cfg;
			struct pbox_dvf_enc_info info;
			enum pbox_dvf_reject why;
			float thr = ldexpf(1, -(int)(10 + below(8)));

			cfg_of(&cfg, g_specs[it % PBOX_ARRAY_SIZE(g_specs)], it % 3);
			cfg.dense_bitmap = it % 2;
			memset(g_resid, 0, sizeof(g_resid));
			for (uint32_t i = 0; i < n; i++) {
				g_grad[i] = grid();
			}
			memcpy(g_prev, g_resid, sizeof(g_prev));
			assert_int_equal(pbox_dvf_encode(g_s, &cfg, k, g_resid, g_grad, n, thr,
							 g_wire, sizeof(g_wire), &info),
					 0);
			for (uint32_t i = 0; i < n; i++) {
				dense[i] = g_resid[i] == 0.0f && fabsf(g_grad[i]) > thr ? g_grad[i]
											: 0.0f;
				want[i] = want[i] + dense[i];
			}
			assert_int_equal(
				pbox_dvf_block_add(g_s, k, g_wire, info.wire_len, acc, n, &why), 0);
		}
		assert_memory_equal(acc, want, n * sizeof(float));
	}
}

static void test_boundary(void **state)
{
	const float thr = 0.25f;
	const float below_thr = nextafterf(thr, 0.0f), above = nextafterf(thr, 1.0f);
	const float in[] = { thr,  -thr,  below_thr, -below_thr, above,     -above,
			     0.0f, -0.0f, NAN,       INFINITY,   -INFINITY, of_bits(0x7fc01234) };
	const bool sent[] = { false, false, false, false, true, true,
			      false, false, true,  true,  true, true };
	float out[16], resid[16];

	(void)state;
	for (unsigned a = 0; a < g_nisas; a++) {
		/* 3 copies: some elements in the vector body, some in the tail */
		float g[48], r[48], o[48];
		size_t cnt;

		for (unsigned c = 0; c < 4; c++) {
			memcpy(g + c * 12, in, sizeof(in));
		}
		memset(r, 0, sizeof(r));
		cnt = g_isas[a]->filter(r, g, 48, thr, o);
		assert_int_equal(cnt, 4 * 6);
		for (unsigned i = 0; i < 48; i++) {
			if (sent[i % 12]) {
				assert_int_equal(bits_of(o[i]), bits_of(in[i % 12]));
				assert_int_equal(bits_of(r[i]), 0);
			} else {
				/* kept: U = +0 + g (so a -0 g is a +0 residual) */
				assert_int_equal(bits_of(r[i]), bits_of(0.0f + in[i % 12]));
				assert_int_equal(bits_of(o[i]), 0);
			}
		}
	}
	/* thr = 0 keeps only zeros */
	memset(resid, 0, sizeof(resid));
	assert_int_equal(g_scalar->filter(resid, in, 12, 0.0f, out), 10);
	/* encode refuses a NaN or negative threshold, without touching the residual */
	{
		struct pbox_dvf_enc_cfg cfg;
		struct pbox_dvf_enc_info info;

		pbox_dvf_enc_cfg_default(&cfg);
		resid[0] = 1.0f;
		assert_int_equal(pbox_dvf_encode(g_s, &cfg, g_scalar, resid, in, 12, NAN, g_wire,
						 sizeof(g_wire), &info),
				 -EINVAL);
		assert_int_equal(pbox_dvf_encode(g_s, &cfg, g_scalar, resid, in, 12, -1.0f, g_wire,
						 sizeof(g_wire), &info),
				 -EINVAL);
		/* +inf would keep an infinite U in the residual for ever */
		assert_int_equal(pbox_dvf_encode(g_s, &cfg, g_scalar, resid, in, 12, INFINITY,
						 g_wire, sizeof(g_wire), &info),
				 -EINVAL);
		assert_true(resid[0] == 1.0f);
	}
}

/* ---- round trips -------------------------------------------------------------------- */

/* g with exactly `sent` elements above thr = 1 (some of them NaN, +-Inf, NaN payloads),
 * at random positions; the rest below it. */
static void make_block(float *g, uint32_t n, uint32_t sent)
{
	uint32_t *pos = malloc(n * sizeof(*pos));

	for (uint32_t i = 0; i < n; i++) {
		pos[i] = i;
		g[i] = ldexpf(grid(), 5) * 0.5f; /* |g| < 1 */
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t j = i + below(n - i), t = pos[i];

		pos[i] = pos[j];
		pos[j] = t;
	}
	for (uint32_t i = 0; i < sent; i++) {
		float v;

		switch (below(16)) {
		case 0:
			v = of_bits(0x7fc00000u | below(1u << 22)); /* quiet NaN, payload */
			break;
		case 1:
			v = below(2) ? INFINITY : -INFINITY;
			break;
		default:
			v = (below(2) ? 1.0f : -1.0f) * (1.0f + (float)below(1u << 20));
		}
		g[pos[i]] = v;
	}
	free(pos);
}

/* want_enc: DENSE for the dense regime (BITMAP when m's bitmap bit says so and it is
 * smaller), 2 for sparse (varint or bitpack as m says). */
static void roundtrip(const char *spec, unsigned m, uint32_t n, uint32_t sent, int want_enc)
{
	static float g[CAP], r[CAP], filtered[CAP], got[CAP];
	struct pbox_dvf_enc_cfg cfg;
	struct pbox_dvf_enc_info info;
	struct pbox_dvf_view v;
	enum pbox_dvf_reject why = PBOX_DVF_OK;

	cfg_of(&cfg, spec, m & 3);
	cfg.dense_bitmap = (m & 4) != 0;
	make_block(g, n, sent);
	memset(r, 0, sizeof(r));
	/* what the filter sends, from the scalar reference */
	g_scalar->filter(r, g, n, 1.0f, filtered);
	memset(r, 0, sizeof(r));
	assert_int_equal(pbox_dvf_encode(g_s, &cfg, pbox_dvf_kernels_get(), r, g, n, 1.0f, g_wire,
					 sizeof(g_wire), &info),
			 0);
	assert_int_equal(info.sent, sent);
	if (want_enc == PBOX_DVF_ENC_DENSE) {
		bool bm = cfg.dense_bitmap && sent * 4 + (n + 7) / 8 < n * 4;

		assert_int_equal(info.encoding, bm ? PBOX_DVF_ENC_BITMAP : PBOX_DVF_ENC_DENSE);
	} else {
		assert_true(info.encoding == PBOX_DVF_ENC_SPARSE_VARINT ||
			    info.encoding == PBOX_DVF_ENC_SPARSE_BITPACK);
		if ((m & 3) == PBOX_DVF_IDX_VARINT) {
			assert_int_equal(info.encoding, PBOX_DVF_ENC_SPARSE_VARINT);
		} else if ((m & 3) == PBOX_DVF_IDX_BITPACK) {
			assert_int_equal(info.encoding, PBOX_DVF_ENC_SPARSE_BITPACK);
		}
	}
	assert_int_equal(pbox_dvf_decode(g_s, g_wire, info.wire_len, n, &v, &why), 0);
	view_dense(&v, got);
	assert_memory_equal(got, filtered, n * sizeof(float));
	/* the same block fed through block_add onto zeros gives the same (NaN bits too:
	 * 0 + x keeps x's payload) */
	memset(got, 0, sizeof(got));
	assert_int_equal(pbox_dvf_block_add(g_s, pbox_dvf_kernels_get(), g_wire, info.wire_len, got,
					    n, &why),
			 0);
	for (uint32_t i = 0; i < n; i++) {
		if (!isnan(filtered[i])) {
			assert_int_equal(bits_of(got[i]), bits_of(filtered[i]));
		} else {
			assert_true(isnan(got[i]));
		}
	}
}

static void test_roundtrip(void **state)
{
	const uint32_t ns[] = { 1, 2, 7, 16, 1000, 1001, 4096 };

	(void)state;
	for (unsigned c = 0; c < PBOX_ARRAY_SIZE(g_specs); c++) {
		for (unsigned m = 0; m < 7; m++) {
			if ((m & 3) == 3) {
				continue;
			}
			for (unsigned j = 0; j < PBOX_ARRAY_SIZE(ns); j++) {
				uint32_t n = ns[j];

				roundtrip(g_specs[c], m, n, n, PBOX_DVF_ENC_DENSE); /* sparsity 0 */
				roundtrip(g_specs[c], m, n, n / 2,
					  n - n / 2 > 4 * (n / 2) ? 2 : PBOX_DVF_ENC_DENSE);
				roundtrip(g_specs[c], m, n, 0, 2); /* sparsity 1 */
				if (n % 5 == 0) {
					/* exactly 0.8: dense (PF: sparse only above 0.8) */
					roundtrip(g_specs[c], m, n, n / 5, PBOX_DVF_ENC_DENSE);
					/* just above: sparse */
					roundtrip(g_specs[c], m, n, n / 5 - 1, 2);
				}
				if (n >= 100) {
					roundtrip(g_specs[c], m, n, n / 100, 2); /* 0.99 */
				}
			}
		}
	}
}

/* Index codings at their limits: every element sent in a sparse block (permille 500 and
 * sparse never chosen above that, so via a big block with few elements), indexes at n - 1,
 * long gaps needing 3-byte varints. */
static void test_index_codings(void **state)
{
	static float g[CAP], r[CAP];
	struct pbox_dvf_enc_cfg cfg;
	struct pbox_dvf_enc_info info;
	struct pbox_dvf_view v;
	enum pbox_dvf_reject why;

	(void)state;
	for (unsigned m = 1; m < 3; m++) {
		cfg_of(&cfg, "none", m);
		memset(g, 0, sizeof(g));
		memset(r, 0, sizeof(r));
		g[0] = 2.0f;
		g[CAP - 1] = -3.0f;
		g[CAP / 2] = 5.0f;
		assert_int_equal(pbox_dvf_encode(g_s, &cfg, g_scalar, r, g, CAP, 1.0f, g_wire,
						 sizeof(g_wire), &info),
				 0);
		assert_int_equal(info.encoding,
				 m == 1 ? PBOX_DVF_ENC_SPARSE_VARINT : PBOX_DVF_ENC_SPARSE_BITPACK);
		/* 3 values + (1 + 2 + 2 varint bytes | 3 x 12 bits) */
		assert_int_equal(info.raw_len, 12 + (m == 1 ? 5 : 5));
		assert_int_equal(pbox_dvf_decode(g_s, g_wire, info.wire_len, CAP, &v, &why), 0);
		assert_int_equal(v.count, 3);
		assert_int_equal(v.idx[0], 0);
		assert_int_equal(v.idx[1], CAP / 2);
		assert_int_equal(v.idx[2], CAP - 1);
	}
}

/* ---- ISA variants ------------------------------------------------------------------- */

static void test_isa_identical(void **state)
{
	static float g[CAP + 32], r0[CAP + 32], r1[CAP + 32], o0[CAP + 32], o1[CAP + 32];
	static float v0[CAP + 32], v1[CAP + 32], a0[CAP + 32], a1[CAP + 32];
	static uint32_t i0[CAP + 32], i1[CAP + 32];
	static uint8_t b0[CAP / 8 + 8], b1[CAP / 8 + 8];

	(void)state;
	for (unsigned it = 0; it < 200; it++) {
		size_t n = below(CAP), off = below(16), c0, c1;
		float thr = ldexpf(1, -(int)below(12));

		for (size_t i = 0; i < n + off; i++) {
			uint32_t sp = below(64);

			g[i] = sp == 0   ? NAN
			       : sp == 1 ? -INFINITY
			       : sp == 2 ? -0.0f
					 : grid() * 1024;
			r0[i] = sp == 3 ? thr : sp == 4 ? -thr : grid() * 256;
			a0[i] = sp == 5 ? -0.0f : grid(); /* a -0 accumulator stays -0 */
		}
		for (unsigned a = 0; a < g_nisas; a++) {
			memcpy(r1, r0, sizeof(r1));
			memcpy(a1, a0, sizeof(a1));
			c1 = g_isas[a]->filter(r1 + off, g + off, n, thr, o1 + off);
			if (a == 0) {
				/* reference: scalar */
				static float rs[CAP + 32];

				memcpy(rs, r0, sizeof(rs));
				c0 = g_scalar->filter(rs + off, g + off, n, thr, o0 + off);
				memcpy(v0, rs, sizeof(v0)); /* keep the scalar residual in v0 */
			}
			assert_int_equal(c1, c0);
			assert_memory_equal(r1 + off, v0 + off, n * sizeof(float));
			assert_memory_equal(o1 + off, o0 + off, n * sizeof(float));
			/* compaction, and scatter-add of the compacted values */
			memset(b1, 0xa5, sizeof(b1));
			c1 = g_isas[a]->compact(o1 + off, n, v1, i1, b1);
			{
				static float vs[CAP + 32];
				size_t cs = g_scalar->compact(o0 + off, n, vs, i0, b0);
				static float as[CAP + 32];

				assert_int_equal(c1, c0);
				assert_int_equal(cs, c0);
				assert_memory_equal(v1, vs, c1 * sizeof(float));
				assert_memory_equal(i1, i0, c1 * sizeof(uint32_t));
				assert_memory_equal(b1, b0, (n + 7) / 8);
				for (size_t i = 0; i < n; i++) {
					bool bit = (b0[i / 8] >> (i % 8)) & 1;

					assert_int_equal(bit, bits_of(o0[off + i]) != 0);
				}
				if (n % 8 != 0) {
					assert_int_equal(b0[n / 8] >> (n % 8), 0);
				}
				memcpy(as, a0, sizeof(as));
				g_scalar->scatter_add(as + off, vs, i0, cs);
				g_isas[a]->scatter_add(a1 + off, v1, i1, c1);
				assert_memory_equal(a1, as, sizeof(as));
				/* the bitmap add: the same sums, and never a read past the values
				 * (they end at the end of a heap buffer of exactly cs floats) */
				{
					float *tight = malloc((cs ? cs : 1) * sizeof(float));

					memcpy(tight, vs, cs * sizeof(float));
					memcpy(a1, a0, sizeof(a1));
					g_isas[a]->bitmap_add(a1 + off, tight, b1, n);
					assert_memory_equal(a1, as, sizeof(as));
					free(tight);
				}
			}
		}
	}
}

/* ---- the decoder's rejections ------------------------------------------------------- */

static uint8_t g_blk[PBOX_DVF_HDR_LEN + 8 * CAP + 64];

/* A block by hand: header fields, then payload bytes (codec none). Returns its length. */
static size_t mk(uint8_t enc, uint8_t codec, uint8_t bits, uint32_t n, uint32_t count,
		 uint32_t idx_len, const void *payload, size_t plen)
{
	struct pbox_dvf_hdr h = {
		.version = PBOX_DVF_VERSION,
		.encoding = enc,
		.codec = codec,
		.idx_bits = bits,
		.n = n,
		.count = count,
		.idx_len = idx_len,
		.raw_len = count * 4 + idx_len,
		.comp_len = (uint32_t)plen,
	};

	memcpy(g_blk, &h, sizeof(h));
	memcpy(g_blk + sizeof(h), payload, plen);
	return sizeof(h) + plen;
}

static void hdr_set(size_t off, uint32_t v, size_t width)
{
	memcpy(g_blk + off, &v, width); /* little-endian */
}

static void expect_reject(size_t len, uint32_t cap_n, enum pbox_dvf_reject want)
{
	static float acc[CAP], orig[CAP];
	enum pbox_dvf_reject why = PBOX_DVF_OK;

	for (uint32_t i = 0; i < CAP; i++) {
		orig[i] = acc[i] = (float)i;
	}
	assert_int_equal(pbox_dvf_block_add(g_s, g_scalar, g_blk, len, acc, cap_n, &why), -EBADMSG);
	if (why != want) {
		fail_msg("rejected as %s, expected %s", pbox_dvf_reject_name(why),
			 pbox_dvf_reject_name(want));
	}
	assert_memory_equal(acc, orig, sizeof(acc));
}

static void expect_ok(size_t len, uint32_t cap_n)
{
	static float acc[CAP];
	enum pbox_dvf_reject why = PBOX_DVF_OK;

	if (pbox_dvf_block_add(g_s, g_scalar, g_blk, len, acc, cap_n, &why) != 0) {
		fail_msg("valid block rejected as %s", pbox_dvf_reject_name(why));
	}
}

static void test_reject_header(void **state)
{
	/* sparse varint block, n 100, 3 values at 5, 6, 99 */
	uint8_t pv[12 + 3] = { 0 };
	float vals[3] = { 1.5f, -2.0f, 3.0f };
	size_t len;

	(void)state;
	memcpy(pv, vals, 12);
	pv[12] = 5;
	pv[13] = 1;
	pv[14] = 93;
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 3, pv, sizeof(pv));
	expect_ok(len, 100);
	expect_reject(0, 100, PBOX_DVF_REJ_TRUNCATED);
	expect_reject(PBOX_DVF_HDR_LEN - 1, 100, PBOX_DVF_REJ_TRUNCATED);
	/* the payload cut: comp_len says more than there is */
	expect_reject(len - 1, 100, PBOX_DVF_REJ_LENGTH);
	/* one byte too many */
	expect_reject(len + 1, 100, PBOX_DVF_REJ_LENGTH);

	g_blk[0] = 2;
	expect_reject(len, 100, PBOX_DVF_REJ_VERSION);
	g_blk[0] = PBOX_DVF_VERSION;
	g_blk[1] = 0;
	expect_reject(len, 100, PBOX_DVF_REJ_ENCODING);
	g_blk[1] = 5;
	expect_reject(len, 100, PBOX_DVF_REJ_ENCODING);
	g_blk[1] = PBOX_DVF_ENC_SPARSE_VARINT;
	g_blk[2] = PBOX_DVF_CODEC_COUNT;
	expect_reject(len, 100, PBOX_DVF_REJ_CODEC);
	g_blk[2] = 0;
	g_blk[3] = 7; /* idx_bits on a varint block */
	expect_reject(len, 100, PBOX_DVF_REJ_HEADER);
	g_blk[3] = 0;
	/* n over the receiver's capacity, and n == 0 */
	expect_reject(len, 99, PBOX_DVF_REJ_CAPACITY);
	hdr_set(4, 0, 4);
	expect_reject(len, 100, PBOX_DVF_REJ_CAPACITY);
	hdr_set(4, 100, 4);
	/* count above n (and the lengths consistent with it) */
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 2, 3, 3, pv, sizeof(pv));
	expect_reject(len, 100, PBOX_DVF_REJ_COUNT);
	/* lengths lying: raw_len, idx_len, comp_len each off by one */
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 3, pv, sizeof(pv));
	hdr_set(16, 16, 4);
	expect_reject(len, 100, PBOX_DVF_REJ_LENGTH);
	hdr_set(16, 15, 4);
	hdr_set(12, 4, 4);
	expect_reject(len, 100, PBOX_DVF_REJ_LENGTH);
	hdr_set(12, 3, 4);
	hdr_set(20, 14, 4);
	expect_reject(len, 100, PBOX_DVF_REJ_LENGTH);
	hdr_set(20, 15, 4);
	expect_ok(len, 100);
	/* idx_len that no count of varints can have (< count): lengths consistent */
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 2, pv, 14);
	expect_reject(len, 100, PBOX_DVF_REJ_LENGTH);
	/* dense: count must be n; idx_len must be 0 */
	{
		float d[4] = { 1, 2, 3, 4 };

		len = mk(PBOX_DVF_ENC_DENSE, 0, 0, 4, 4, 0, d, 16);
		expect_ok(len, 4);
		len = mk(PBOX_DVF_ENC_DENSE, 0, 0, 4, 3, 0, d, 12);
		expect_reject(len, 4, PBOX_DVF_REJ_COUNT);
		len = mk(PBOX_DVF_ENC_DENSE, 0, 0, 3, 3, 4, d, 16);
		expect_reject(len, 4, PBOX_DVF_REJ_LENGTH);
		/* a sparse block whose payload is larger than dense could be */
		len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 1, 1, 1, pv, 5);
		expect_reject(len, 4, PBOX_DVF_REJ_LENGTH);
	}
}

static void test_reject_indexes(void **state)
{
	float vals[3] = { 1.5f, -2.0f, 3.0f };
	uint8_t p[12 + 16];
	size_t len;

	(void)state;
	memcpy(p, vals, 12);
	/* varint: duplicate (gap 0) */
	memcpy(p + 12, (uint8_t[]){ 5, 0, 1 }, 3);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 3, p, 15);
	expect_reject(len, 100, PBOX_DVF_REJ_IDX_DUP);
	/* varint: out of range (5 + 1 + 94 = 100) */
	memcpy(p + 12, (uint8_t[]){ 5, 1, 94 }, 3);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 3, p, 15);
	expect_reject(len, 100, PBOX_DVF_REJ_IDX_RANGE);
	/* varint: a huge gap that would wrap 32 bits back into range */
	memcpy(p + 12, (uint8_t[]){ 5, 0xff, 0xff, 0xff, 0xff, 0x0f, 1 }, 7);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 7, p, 19);
	expect_reject(len, 100, PBOX_DVF_REJ_IDX_RANGE);
	/* varint: overlong (value above 2^32 - 1 in the 5th byte), non-minimal, cut */
	memcpy(p + 12, (uint8_t[]){ 5, 0xff, 0xff, 0xff, 0xff, 0x1f, 1 }, 7);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 7, p, 19);
	expect_reject(len, 100, PBOX_DVF_REJ_VARINT);
	memcpy(p + 12, (uint8_t[]){ 5, 0x81, 0x00, 1 }, 4);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 4, p, 16);
	expect_reject(len, 100, PBOX_DVF_REJ_VARINT);
	memcpy(p + 12, (uint8_t[]){ 5, 1, 0x81 }, 3);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 3, p, 15);
	expect_reject(len, 100, PBOX_DVF_REJ_VARINT);
	/* varint: a trailing byte after the last index (idx_len lies) */
	memcpy(p + 12, (uint8_t[]){ 5, 1, 1, 1 }, 4);
	len = mk(PBOX_DVF_ENC_SPARSE_VARINT, 0, 0, 100, 3, 4, p, 16);
	expect_reject(len, 100, PBOX_DVF_REJ_LENGTH);
	/* bitpack, n 100 -> 7 bits: 3 indexes in 21 bits = 3 bytes */
	{
		const struct {
			uint32_t a, b, c;
			enum pbox_dvf_reject why;
		} cases[] = {
			{ 5, 6, 99, PBOX_DVF_OK },
			{ 5, 5, 99, PBOX_DVF_REJ_IDX_DUP },
			{ 5, 4, 99, PBOX_DVF_REJ_IDX_ORDER },
			{ 5, 6, 100, PBOX_DVF_REJ_IDX_RANGE },
			{ 127, 6, 7, PBOX_DVF_REJ_IDX_RANGE },
		};

		for (unsigned i = 0; i < PBOX_ARRAY_SIZE(cases); i++) {
			uint32_t bits = cases[i].a | cases[i].b << 7 | cases[i].c << 14;

			memcpy(p + 12, &bits, 3);
			len = mk(PBOX_DVF_ENC_SPARSE_BITPACK, 0, 7, 100, 3, 3, p, 15);
			if (cases[i].why == PBOX_DVF_OK) {
				expect_ok(len, 100);
				/* padding bits (bits 21..23) must be zero */
				bits |= 1u << 22;
				memcpy(p + 12, &bits, 3);
				len = mk(PBOX_DVF_ENC_SPARSE_BITPACK, 0, 7, 100, 3, 3, p, 15);
				expect_reject(len, 100, PBOX_DVF_REJ_PADDING);
				/* a width other than n's */
				len = mk(PBOX_DVF_ENC_SPARSE_BITPACK, 0, 8, 100, 3, 3, p, 15);
				expect_reject(len, 100, PBOX_DVF_REJ_HEADER);
				/* idx_len not ceil(3 * 7 / 8) */
				len = mk(PBOX_DVF_ENC_SPARSE_BITPACK, 0, 7, 100, 3, 4, p, 16);
				expect_reject(len, 100, PBOX_DVF_REJ_LENGTH);
			} else {
				expect_reject(len, 100, cases[i].why);
			}
		}
	}
	/* bitmap, n 20 -> 3 bytes; 3 values at 1, 5, 19 */
	{
		const struct {
			uint8_t b0, b1, b2;
			uint32_t idx_len;
			uint8_t bits;
			enum pbox_dvf_reject why;
		} cases[] = {
			{ 0x22, 0x00, 0x08, 3, 0, PBOX_DVF_OK },
			{ 0x22, 0x04, 0x08, 3, 0, PBOX_DVF_REJ_COUNT },   /* 4 bits set */
			{ 0x02, 0x00, 0x08, 3, 0, PBOX_DVF_REJ_COUNT },   /* 2 bits set */
			{ 0x22, 0x00, 0x18, 3, 0, PBOX_DVF_REJ_PADDING }, /* bit 20 */
			{ 0x22, 0x00, 0x08, 2, 0, PBOX_DVF_REJ_LENGTH },
			{ 0x22, 0x00, 0x08, 3, 5, PBOX_DVF_REJ_HEADER },
		};

		for (unsigned i = 0; i < PBOX_ARRAY_SIZE(cases); i++) {
			p[12] = cases[i].b0;
			p[13] = cases[i].b1;
			p[14] = cases[i].b2;
			len = mk(PBOX_DVF_ENC_BITMAP, 0, cases[i].bits, 20, 3, cases[i].idx_len, p,
				 12 + cases[i].idx_len);
			if (cases[i].why == PBOX_DVF_OK) {
				static float acc[CAP];
				enum pbox_dvf_reject why;

				memset(acc, 0, sizeof(acc));
				assert_int_equal(pbox_dvf_block_add(g_s, g_scalar, g_blk, len, acc,
								    20, &why),
						 0);
				assert_true(acc[1] == 1.5f && acc[5] == -2.0f && acc[19] == 3.0f &&
					    acc[0] == 0.0f && acc[6] == 0.0f);
			} else {
				expect_reject(len, 20, cases[i].why);
			}
		}
	}
}

/* Compressed payloads that lie: more output than raw_len (bombs), less, garbage. */
static void test_reject_codecs(void **state)
{
	static uint8_t big[4 * CAP + 4096], cbuf[8 * CAP + 8192];
	const uint32_t n = 1000;

	(void)state;
	memset(big, 0, sizeof(big));
	for (unsigned c = 1; c < PBOX_DVF_CODEC_COUNT; c++) {
		const struct pbox_dvf_codec_ops *ops = pbox_dvf_codec_by_id(c);
		struct pbox_dvf_scratch *s2 = pbox_dvf_scratch_new(2 * CAP);
		const size_t sizes[] = { 4 * n, 4 * n + 1, 4 * n + 4096, 4 * n - 4 };
		const enum pbox_dvf_reject want[] = { PBOX_DVF_OK, PBOX_DVF_REJ_BOMB,
						      PBOX_DVF_REJ_BOMB, PBOX_DVF_REJ_SHORT };

		assert_non_null(s2);
		for (unsigned j = 0; j < PBOX_ARRAY_SIZE(sizes); j++) {
			size_t clen = 0, len;

			/* compressed with a second scratch's context, big enough for a bomb */
			assert_int_equal(ops->compress(pbox_dvf_scratch_codec(s2), big, sizes[j],
						       cbuf, sizeof(cbuf), ops->level_default,
						       &clen),
					 0);
			len = mk(PBOX_DVF_ENC_DENSE, (uint8_t)c, 0, n, n, 0, cbuf, clen);
			if (want[j] == PBOX_DVF_OK) {
				expect_ok(len, n);
			} else {
				expect_reject(len, n, want[j]);
			}
		}
		/* garbage */
		for (unsigned j = 0; j < 64; j++) {
			size_t len;

			cbuf[j] = (uint8_t)(0xa5 ^ (j * 37));
			len = mk(PBOX_DVF_ENC_DENSE, (uint8_t)c, 0, n, n, 0, cbuf, j + 1);
			{
				enum pbox_dvf_reject why = PBOX_DVF_OK;
				static float acc[CAP];

				assert_int_equal(
					pbox_dvf_block_add(g_s, g_scalar, g_blk, len, acc, n, &why),
					-EBADMSG);
				assert_true(why == PBOX_DVF_REJ_CORRUPT ||
					    why == PBOX_DVF_REJ_SHORT || why == PBOX_DVF_REJ_BOMB);
			}
		}
		pbox_dvf_scratch_free(s2);
	}
	/* a claimed raw_len above 4 n is refused before any decompression */
	{
		size_t len =
			mk(PBOX_DVF_ENC_SPARSE_VARINT, PBOX_DVF_CODEC_LZ4, 0, 10, 10, 41, cbuf, 10);

		expect_reject(len, 10, PBOX_DVF_REJ_LENGTH);
	}
}

/* ---- codecs, settings, errors -------------------------------------------------------- */

static void test_codecs(void **state)
{
	const struct pbox_dvf_codec_ops *ops;
	int level;

	(void)state;
	assert_int_equal(pbox_dvf_codec_parse("zstd:3", &ops, &level), 0);
	assert_string_equal(ops->name, "zstd");
	assert_int_equal(level, 3);
	assert_int_equal(pbox_dvf_codec_parse("snappy", &ops, &level), 0);
	assert_int_equal(ops->id, PBOX_DVF_CODEC_SNAPPY);
	assert_int_equal(pbox_dvf_codec_parse("zstd:4", &ops, &level), -EINVAL);
	assert_int_equal(pbox_dvf_codec_parse("zstd:", &ops, &level), -EINVAL);
	assert_int_equal(pbox_dvf_codec_parse("zstd:1x", &ops, &level), -EINVAL);
	assert_int_equal(pbox_dvf_codec_parse("gzip", &ops, &level), -EINVAL);
	assert_int_equal(pbox_dvf_codec_parse("", &ops, &level), -EINVAL);
	for (unsigned c = 0; c < PBOX_DVF_CODEC_COUNT; c++) {
		assert_ptr_equal(pbox_dvf_codec_find(pbox_dvf_codec_by_id(c)->name),
				 pbox_dvf_codec_by_id(c));
	}
	assert_null(pbox_dvf_codec_by_id(PBOX_DVF_CODEC_COUNT));
	{
		struct pbox_dvf_enc_cfg cfg;

		pbox_dvf_enc_cfg_default(&cfg);
		assert_int_equal(pbox_dvf_enc_cfg_check(&cfg), 0);
		assert_int_equal(cfg.sparse_permille, 800);
		assert_string_equal(cfg.codec->name, "snappy"); /* perf/dvf/README.md */
		assert_true(cfg.dense_bitmap);
		cfg.sparse_permille = 499;
		assert_int_equal(pbox_dvf_enc_cfg_check(&cfg), -EINVAL);
		cfg.sparse_permille = 800;
		cfg.codec = pbox_dvf_codec_find("zstd");
		cfg.level = 4;
		assert_int_equal(pbox_dvf_enc_cfg_check(&cfg), -EINVAL);
	}
}

/* Incompressible data is stored (codec none in the header), compressible data is not;
 * an out buffer too small fails with -ENOSPC and gives everything back to the residual. */
static void test_store_and_enospc(void **state)
{
	static float g[CAP], r[CAP], u[CAP];
	struct pbox_dvf_enc_cfg cfg;
	struct pbox_dvf_enc_info info;
	const uint32_t n = 2000;

	(void)state;
	cfg_of(&cfg, "lz4", PBOX_DVF_IDX_AUTO);
	for (uint32_t i = 0; i < n; i++) {
		g[i] = of_bits((uint32_t)rnd() & 0x3fffffffu); /* noise: incompressible */
	}
	memset(r, 0, sizeof(r));
	assert_int_equal(
		pbox_dvf_encode(g_s, &cfg, g_scalar, r, g, n, 0.0f, g_wire, sizeof(g_wire), &info),
		0);
	assert_int_equal(info.codec, PBOX_DVF_CODEC_NONE);
	assert_int_equal(info.wire_len, pbox_dvf_block_bound(n));
	for (uint32_t i = 0; i < n; i++) {
		g[i] = (float)(i % 4);
	}
	assert_int_equal(
		pbox_dvf_encode(g_s, &cfg, g_scalar, r, g, n, 0.0f, g_wire, sizeof(g_wire), &info),
		0);
	assert_int_equal(info.codec, PBOX_DVF_CODEC_LZ4);
	assert_true(info.wire_len < 4 * n / 4);
	/* -ENOSPC: residual gets U back */
	for (uint32_t i = 0; i < n; i++) {
		g[i] = grid() * 1024;
		r[i] = grid();
		u[i] = r[i] + g[i];
	}
	for (unsigned a = 0; a < g_nisas; a++) {
		static float rr[CAP];

		memcpy(rr, r, sizeof(rr));
		cfg_of(&cfg, "none", PBOX_DVF_IDX_AUTO);
		assert_int_equal(pbox_dvf_encode(g_s, &cfg, g_isas[a], rr, g, n, ldexpf(1, -12),
						 g_wire, 100, &info),
				 -ENOSPC);
		for (uint32_t i = 0; i < n; i++) {
			assert_true(rr[i] == u[i]);
		}
	}
	/* n over the scratch's capacity */
	assert_int_equal(pbox_dvf_encode(g_s, &cfg, g_scalar, r, g, CAP + 1, 0.0f, g_wire,
					 sizeof(g_wire), &info),
			 -EINVAL);
	{
		struct pbox_dvf_view v;
		enum pbox_dvf_reject why;

		assert_int_equal(pbox_dvf_decode(g_s, g_wire, 10, CAP + 1, &v, &why), -EINVAL);
	}
	assert_string_equal(pbox_dvf_reject_name(PBOX_DVF_REJ_BOMB), "bomb");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threshold),      cmocka_unit_test(test_invariants),
		cmocka_unit_test(test_accumulate),     cmocka_unit_test(test_boundary),
		cmocka_unit_test(test_roundtrip),      cmocka_unit_test(test_index_codings),
		cmocka_unit_test(test_isa_identical),  cmocka_unit_test(test_reject_header),
		cmocka_unit_test(test_reject_indexes), cmocka_unit_test(test_reject_codecs),
		cmocka_unit_test(test_codecs),         cmocka_unit_test(test_store_and_enospc),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
