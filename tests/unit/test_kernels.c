/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernels: every ISA this CPU supports against the scalar reference, bit for bit (the
 * exactness contract of kernels.h), over odd lengths, unaligned pointers and 1..8 sources;
 * and the scalar reference against the optimizer formulas written out by hand.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "common/compiler.h"
#include "kernels/kernels.h"

#define MAXN   1100
#define MAXSRC 8

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return ((float)(g_rng >> 40) / (float)(1 << 24)) * 4.0f - 2.0f;
}

struct bufs {
	float src[MAXSRC][MAXN + 16];
	float w[MAXN + 16], m[MAXN + 16], v[MAXN + 16];
};

static struct bufs g_in, g_ref, g_got;

static void fill(struct bufs *b)
{
	for (int s = 0; s < MAXSRC; s++) {
		for (int i = 0; i < MAXN + 16; i++) {
			b->src[s][i] = frand();
		}
	}
	for (int i = 0; i < MAXN + 16; i++) {
		b->w[i] = frand();
		b->m[i] = frand() * 0.1f;
		b->v[i] = fabsf(frand()) * 0.01f;
	}
}

static const struct pbox_kernels *g_scalar;

static int setup(void **state)
{
	(void)state;
	g_scalar = pbox_kernels_by_isa("scalar");
	return g_scalar == NULL;
}

/* Run one kernel variant on a copy of g_in at offset off with n elements and nsrc sources. */
static void run(const struct pbox_kernels *k, const char *what, struct bufs *out, size_t off,
		size_t n, unsigned nsrc, const struct pbox_opt_params *p, uint64_t t)
{
	const float *src[MAXSRC];

	memcpy(out, &g_in, sizeof(*out));
	for (unsigned s = 0; s < nsrc; s++) {
		src[s] = out->src[s] + off;
	}
	if (strcmp(what, "add") == 0) {
		k->add(out->w + off, src[0], n);
	} else if (strcmp(what, "reduce") == 0) {
		k->reduce(out->w + off, src, nsrc, n, 1.0f);
	} else if (strcmp(what, "mean") == 0) {
		k->reduce(out->w + off, src, nsrc, n, (float)nsrc);
	} else if (strcmp(what, "reduce_alias") == 0) {
		/* out aliases src[0], as the engine's accumulator does */
		k->reduce(out->src[0] + off, src, nsrc, n, 3.0f);
	} else {
		pbox_optimizer_step(pbox_optimizer_find(what), k, out->w + off, out->m + off,
				    out->v + off, src, nsrc, n, p, t);
	}
}

static void test_isa_exact(void **state)
{
	static const char *const what[] = { "add",      "reduce", "mean", "reduce_alias", "sgd",
					    "momentum", "nag",    "adam", "adamw" };
	const struct pbox_kernels *isas[4];
	unsigned nisa = pbox_kernels_supported(isas, 4);
	struct pbox_opt_params p;
	unsigned checks = 0;

	(void)state;
	assert_true(nisa >= 2); /* at least sse2 and scalar on x86-64 */
	pbox_opt_params_default(&p);
	p.lr = 0.05f;
	p.wd = 1e-4f;
	p.rescale = 1.0f / 3;
	for (int clip = 0; clip < 2; clip++) {
		p.clip = clip ? 0.5f : 0.0f;
		for (unsigned w = 0; w < PBOX_ARRAY_SIZE(what); w++) {
			for (size_t n = 0; n < 80; n += 1 + n / 8) {
				for (size_t off = 0; off < 5; off += 3) {
					for (unsigned nsrc = 1; nsrc <= MAXSRC; nsrc += 3) {
						fill(&g_in);
						run(g_scalar, what[w], &g_ref, off, n, nsrc, &p, 7);
						for (unsigned i = 0; i < nisa; i++) {
							run(isas[i], what[w], &g_got, off, n, nsrc,
							    &p, 7);
							if (memcmp(&g_ref, &g_got, sizeof(g_ref)) !=
							    0) {
								fail_msg("%s: %s n=%zu off=%zu "
									 "nsrc=%u "
									 "clip=%d differs from "
									 "scalar",
									 isas[i]->isa, what[w], n,
									 off, nsrc, clip);
							}
							checks++;
						}
					}
				}
			}
		}
	}
	/* And one long run per kernel. */
	for (unsigned w = 0; w < PBOX_ARRAY_SIZE(what); w++) {
		fill(&g_in);
		run(g_scalar, what[w], &g_ref, 1, MAXN, 4, &p, 1);
		for (unsigned i = 0; i < nisa; i++) {
			run(isas[i], what[w], &g_got, 1, MAXN, 4, &p, 1);
			assert_memory_equal(&g_ref, &g_got, sizeof(g_ref));
		}
	}
	print_message("%u comparisons over %u ISAs (widest: %s)\n", checks, nisa, isas[0]->isa);
}

/* The scalar reference against the formulas of kernels.h, spelled out. */
static void test_reference_formulas(void **state)
{
	struct pbox_opt_params p;
	float g0 = 0.75f, g1 = -0.25f, w = 1.5f, m = 0.125f, v = 0.0625f;
	const float *src[2] = { &g0, &g1 };
	float ww, mm, vv, g;

	(void)state;
	pbox_opt_params_default(&p);
	p.lr = 0.1f;
	p.momentum = 0.9f;
	p.wd = 0.01f;
	p.rescale = 0.5f;

	ww = w;
	pbox_optimizer_step(pbox_optimizer_find("sgd"), g_scalar, &ww, NULL, NULL, src, 2, 1, &p,
			    1);
	g = (g0 + g1) * 0.5f;
	assert_true(ww == w - p.lr * (g + p.wd * w));

	ww = w;
	mm = m;
	pbox_optimizer_step(pbox_optimizer_find("momentum"), g_scalar, &ww, &mm, NULL, src, 2, 1,
			    &p, 1);
	{
		float m1 = p.momentum * m - p.lr * (g + p.wd * w);

		assert_true(mm == m1);
		assert_true(ww == w + m1);
	}

	ww = w;
	mm = m;
	pbox_optimizer_step(pbox_optimizer_find("nag"), g_scalar, &ww, &mm, NULL, src, 2, 1, &p, 1);
	{
		float m1 = m * p.momentum, g2 = g + p.wd * w;

		m1 = m1 + g2;
		g2 = g2 + p.momentum * m1;
		assert_true(mm == m1);
		assert_true(ww == w - p.lr * g2);
	}

	ww = w;
	mm = m;
	vv = v;
	pbox_optimizer_step(pbox_optimizer_find("adam"), g_scalar, &ww, &mm, &vv, src, 2, 1, &p, 3);
	{
		float g2 = g + p.wd * w;
		float m1 = p.beta1 * m + (1.0f - p.beta1) * g2;
		float v1 = p.beta2 * v + (1.0f - p.beta2) * (g2 * g2);
		float ss = (float)(0.1 / (1.0 - pow(0.9f, 3)));
		float bc2 = (float)sqrt(1.0 - pow(0.999f, 3));

		assert_true(mm == m1);
		assert_true(vv == v1);
		assert_true(ww == w - ss * (m1 / (sqrtf(v1) / bc2 + p.eps)));
	}

	/* Clipping bounds the rescaled gradient. */
	p.clip = 0.1f;
	ww = w;
	pbox_optimizer_step(pbox_optimizer_find("sgd"), g_scalar, &ww, NULL, NULL, src, 2, 1, &p,
			    1);
	assert_true(ww == w - p.lr * (0.1f + p.wd * w));
}

static void test_deterministic_order(void **state)
{
	/* reduce sums left to right: (1e8 + 1) + -1e8 == 0 in float, while 1e8 + (1 + -1e8)
	 * == 0 too, but (1e8 + -1e8) + 1 == 1: order is observable and must be rank order. */
	float a = 1e8f, b = 1.0f, c = -1e8f, out;
	const float *s1[3] = { &a, &b, &c }, *s2[3] = { &a, &c, &b };

	(void)state;
	g_scalar->reduce(&out, s1, 3, 1, 1.0f);
	assert_true(out == 0.0f);
	g_scalar->reduce(&out, s2, 3, 1, 1.0f);
	assert_true(out == 1.0f);
}

static void test_lookup(void **state)
{
	(void)state;
	assert_null(pbox_optimizer_find("lamb"));
	assert_int_equal(pbox_optimizer_find("adam")->nstate, 2);
	assert_int_equal(pbox_optimizer_find("sgd")->nstate, 0);
	assert_null(pbox_kernels_by_isa("neon"));
	assert_non_null(pbox_kernels_get());
}

static float from_bits(uint32_t b)
{
	float f;

	memcpy(&f, &b, sizeof(f));
	return f;
}

/* NaN (quiet, signalling, negative, with payload) and both infinities. */
static const uint32_t g_nonfinite[] = { 0x7fc00000u, 0xffc00000u, 0x7f800001u,
					0x7fc0beefu, 0x7f800000u, 0xff800000u };

/* Values that look extreme but are finite: never counted. */
static const uint32_t g_finite_edge[] = { 0x7f7fffffu /* FLT_MAX */, 0xff7fffffu, 0x00000001u,
					  0x80000000u /* -0 */,      0x00800000u, 0x7effffffu };

/* The scan finds a non-finite value at every position of every length, on every ISA, and
 * nothing else. */
static void test_nonfinite_scan(void **state)
{
	const struct pbox_kernels *isas[4];
	unsigned nisa = pbox_kernels_supported(isas, 4);
	static float buf[MAXN + 16];
	unsigned checks = 0;

	(void)state;
	for (unsigned i = 0; i < nisa; i++) {
		const struct pbox_kernels *k = isas[i];

		for (size_t n = 0; n <= 70; n++) {
			for (size_t off = 0; off < 4; off++) {
				float *g = buf + off;

				for (size_t j = 0; j < MAXN + 16; j++) {
					buf[j] = frand();
				}
				for (size_t j = 0; j < n; j++) {
					if (j % 5 == 0) {
						g[j] = from_bits(g_finite_edge[j / 5 % 6]);
					}
				}
				/* Outside [0, n) does not count. */
				if (off > 0) {
					g[-1] = from_bits(g_nonfinite[0]);
				}
				g[n] = from_bits(g_nonfinite[4]);
				assert_int_equal(k->nonfinite(g, n), 0);
				for (size_t p = 0; p < n; p++) {
					for (unsigned v = 0; v < PBOX_ARRAY_SIZE(g_nonfinite);
					     v++) {
						size_t q = (p + n / 2) % n;
						float keep = g[p], keep_q = g[q];

						g[p] = from_bits(g_nonfinite[v]);
						if (k->nonfinite(g, n) != 1) {
							fail_msg("%s: value %08x at %zu of %zu "
								 "(off %zu) "
								 "not found",
								 k->isa, g_nonfinite[v], p, n, off);
						}
						g[q] = from_bits(g_nonfinite[5]);
						assert_int_equal(k->nonfinite(g, n),
								 p == q ? 1 : 2);
						g[q] = keep_q;
						g[p] = keep;
						checks += 2;
					}
				}
			}
		}
		/* A long fragment full of them. */
		for (size_t j = 0; j < MAXN; j++) {
			buf[j] = j % 3 == 0 ? from_bits(g_nonfinite[j % 6]) : frand();
		}
		assert_int_equal(k->nonfinite(buf, MAXN), (MAXN + 2) / 3);
	}
	print_message("%u scans over %u ISAs\n", checks, nisa);
}

static size_t count_nonfinite_ref(const float *g, size_t n)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++) {
		c += !isfinite(g[i]);
	}
	return c;
}

/* One check of the fused ingest kernels of k on g[0..n) against the reference count and
 * the scalar add; dst / acc are offset by doff from g's alignment. */
static void check_fused(const struct pbox_kernels *k, const float *g, size_t n, size_t doff)
{
	static float dst[MAXN + 16], acc0[MAXN + 16], acc[MAXN + 16], ref[MAXN + 16];
	size_t want = count_nonfinite_ref(g, n), got;
	float *d = dst + doff, *a = acc + doff, *r = ref + doff;

	/* copy: bits of g in [0, n), nothing written outside */
	for (size_t j = 0; j < MAXN + 16; j++) {
		dst[j] = from_bits(0x5a5a5a5au);
		acc0[j] = frand();
	}
	got = k->copy_nonfinite(d, g, n);
	if (got != want) {
		fail_msg("%s copy_nonfinite: %zu of %zu counted, want %zu", k->isa, got, n, want);
	}
	assert_memory_equal(d, g, n * sizeof(float));
	for (size_t j = 0; j < MAXN + 16; j++) {
		if (j < doff || j >= doff + n) {
			assert_int_equal(memcmp(&dst[j], &(float){ from_bits(0x5a5a5a5au) }, 4), 0);
		}
	}
	/* add, counting: the scalar add's bits, same count */
	memcpy(acc, acc0, sizeof(acc));
	memcpy(ref, acc0, sizeof(ref));
	g_scalar->add(r, g, n);
	got = k->add_nonfinite(a, g, n);
	if (got != want) {
		fail_msg("%s add_nonfinite: %zu of %zu counted, want %zu", k->isa, got, n, want);
	}
	assert_memory_equal(acc, ref, sizeof(acc));
	/* add if finite: the scalar add's bits, or acc untouched, bit for bit */
	memcpy(acc, acc0, sizeof(acc));
	got = k->add_finite(a, g, n);
	if (got != want) {
		fail_msg("%s add_finite: %zu of %zu counted, want %zu", k->isa, got, n, want);
	}
	assert_memory_equal(acc, want == 0 ? ref : acc0, sizeof(acc));
	/* final sum / mean, counting: the scalar reduce(acc, {acc, g}, 2, n, div)'s bits */
	for (unsigned v = 0; v < 3; v++) {
		static const float divs[] = { 1.0f, 3.0f, 7.0f };
		const float *src[2] = { r, g };

		memcpy(acc, acc0, sizeof(acc));
		memcpy(ref, acc0, sizeof(ref));
		g_scalar->reduce(r, src, 2, n, divs[v]);
		got = k->sum2_nonfinite(a, a, g, n, divs[v]);
		if (got != want) {
			fail_msg("%s sum2_nonfinite / %g: %zu of %zu counted, want %zu", k->isa,
				 (double)divs[v], got, n, want);
		}
		assert_memory_equal(acc, ref, sizeof(acc));
		/* the same written beside acc: acc untouched, out the same bits, nothing
		 * written outside [0, n) */
		memcpy(acc, acc0, sizeof(acc));
		for (size_t j = 0; j < MAXN + 16; j++) {
			dst[j] = from_bits(0x5a5a5a5au);
		}
		got = k->sum2_nonfinite(d, a, g, n, divs[v]);
		if (got != want) {
			fail_msg("%s sum2_nonfinite beside / %g: %zu of %zu counted, want %zu",
				 k->isa, (double)divs[v], got, n, want);
		}
		assert_memory_equal(acc, acc0, sizeof(acc));
		assert_memory_equal(d, r, n * sizeof(float));
		for (size_t j = 0; j < MAXN + 16; j++) {
			if (j < doff || j >= doff + n) {
				assert_int_equal(
					memcmp(&dst[j], &(float){ from_bits(0x5a5a5a5au) }, 4), 0);
			}
		}
	}
}

/* The fused ingest kernels (copy + count, add + count, add only if finite, final sum or
 * mean + count) count exactly what nonfinite() counts and move exactly the bits of copy /
 * add / reduce, with one or two
 * non-finite values at every position of every length (all vector bodies and tails of
 * every ISA), at vector and 512-element boundaries of a long fragment, on every ISA with
 * unaligned pointers. */
static void test_fused_ingest(void **state)
{
	const struct pbox_kernels *isas[4];
	unsigned nisa = pbox_kernels_supported(isas, 4);
	static float buf[MAXN + 16];
	static const size_t longpos[] = { 0, 1, 7, 8, 15, 16, 511, 512, 513, 1023, 1024, MAXN - 1 };
	unsigned checks = 0;

	(void)state;
	for (unsigned i = 0; i < nisa; i++) {
		const struct pbox_kernels *k = isas[i];

		for (size_t n = 0; n <= 70; n++) {
			size_t off = n % 4, doff = (n / 4) % 3;
			float *g = buf + off;

			for (size_t j = 0; j < MAXN + 16; j++) {
				buf[j] = frand();
			}
			for (size_t j = 0; j < n; j += 5) {
				g[j] = from_bits(g_finite_edge[j / 5 % 6]);
			}
			if (off > 0) {
				g[-1] = from_bits(g_nonfinite[0]); /* outside: never counted */
			}
			g[n] = from_bits(g_nonfinite[4]);
			check_fused(k, g, n, doff);
			for (size_t p = 0; p < n; p++) {
				for (unsigned v = 0; v < PBOX_ARRAY_SIZE(g_nonfinite); v++) {
					size_t q = (p * 7 + 3) % n;
					float keep = g[p], keep_q = g[q];

					g[p] = from_bits(g_nonfinite[v]);
					check_fused(k, g, n, doff);
					g[q] = from_bits(g_nonfinite[(v + 1) % 6]);
					check_fused(k, g, n, doff);
					g[q] = keep_q;
					g[p] = keep;
					checks += 2;
				}
			}
		}
		for (size_t j = 0; j < MAXN + 16; j++) {
			buf[j] = frand();
		}
		check_fused(k, buf + 1, MAXN, 0);
		for (size_t x = 0; x < PBOX_ARRAY_SIZE(longpos); x++) {
			float keep = buf[1 + longpos[x]];

			buf[1 + longpos[x]] = from_bits(g_nonfinite[x % 6]);
			check_fused(k, buf + 1, MAXN, 2);
			buf[1 + longpos[x]] = keep;
			checks++;
		}
		/* Many at once: the lane counters sum exactly. */
		for (size_t j = 0; j < MAXN; j++) {
			buf[j] = j % 3 == 0 ? from_bits(g_nonfinite[j % 6]) : frand();
		}
		check_fused(k, buf, MAXN, 1);
	}
	print_message("%u fused checks over %u ISAs\n", checks, nisa);
}

/* Non-finite gradients propagate as IEEE says through every kernel on every ISA; with
 * clipping on, a NaN stays NaN (it used to become -clip) and an infinity is clipped. */
static void test_nonfinite_propagate(void **state)
{
	static const char *const what[] = { "add",      "reduce", "mean", "sgd",
					    "momentum", "nag",    "adam", "adamw" };
	const struct pbox_kernels *isas[4];
	unsigned nisa = pbox_kernels_supported(isas, 4);
	struct pbox_opt_params p;

	(void)state;
	pbox_opt_params_default(&p);
	p.lr = 0.05f;
	p.rescale = 0.5f;
	for (int clip = 0; clip < 2; clip++) {
		p.clip = clip ? 0.25f : 0.0f;
		for (unsigned w = 0; w < PBOX_ARRAY_SIZE(what); w++) {
			for (size_t n = 1; n <= 40; n += 1 + n / 4) {
				for (size_t pos = 0; pos < n; pos++) {
					for (unsigned v = 0; v < PBOX_ARRAY_SIZE(g_nonfinite);
					     v++) {
						uint32_t bits = g_nonfinite[v];
						bool nan = (bits & 0x007fffffu) != 0;
						unsigned src =
							w == 0 ? 0 : pos % 3; /* add reads src[0]
										 only */

						fill(&g_in);
						g_in.src[src][1 + pos] = from_bits(bits);
						run(g_scalar, what[w], &g_ref, 1, n, 3, &p, 2);
						if (nan || clip == 0 || w < 3) {
							/* w[pos] is NaN or infinite */
							assert_false(isfinite(g_ref.w[1 + pos]));
						} else {
							/* an infinity clipped to +-clip */
							if (!isfinite(g_ref.w[1 + pos])) {
								fail_msg("%s clip %08x at %zu: %g",
									 what[w], bits, pos,
									 (double)g_ref.w[1 + pos]);
							}
						}
						if (nan) {
							assert_true(isnan(g_ref.w[1 + pos]));
						}
						for (unsigned i = 0; i < nisa; i++) {
							run(isas[i], what[w], &g_got, 1, n, 3, &p,
							    2);
							for (size_t j = 0; j < MAXN + 16; j++) {
								float a = g_ref.w[j],
								      b = g_got.w[j];

								if (isnan(a) ? !isnan(b)
									     : memcmp(&a, &b, 4) !=
										       0) {
									fail_msg("%s: %s clip=%d "
										 "n=%zu "
										 "%08x at %zu: "
										 "w[%zu] "
										 "%g vs scalar %g",
										 isas[i]->isa,
										 what[w], clip, n,
										 bits, pos, j,
										 (double)b,
										 (double)a);
								}
							}
						}
					}
				}
			}
		}
	}
}

/* Reduce over many sources (source-major blocks above four sources) gives, on every ISA,
 * exactly the left-to-right sum of the formula, across block boundaries, in place too. */
static void test_reduce_many_sources(void **state)
{
	static const size_t lens[] = { 1, 17, 1023, 1024, 1025, 1100 };
	const struct pbox_kernels *isas[4];
	unsigned nisa = pbox_kernels_supported(isas, 4);
	static float want[MAXN + 16];

	(void)state;
	for (unsigned i = 0; i < nisa; i++) {
		for (unsigned nsrc = 1; nsrc <= MAXSRC; nsrc++) {
			for (unsigned l = 0; l < PBOX_ARRAY_SIZE(lens); l++) {
				for (int d = 0; d < 2; d++) {
					const float *src[MAXSRC];
					float div = d ? 3.0f : 1.0f;
					size_t n = lens[l];

					fill(&g_in);
					for (size_t e = 0; e < n; e++) {
						float sum = g_in.src[0][e + 1];

						for (unsigned k = 1; k < nsrc; k++) {
							sum = sum + g_in.src[k][e + 1];
						}
						want[e] = d ? sum / div : sum;
					}
					for (unsigned k = 0; k < nsrc; k++) {
						src[k] = g_in.src[k] + 1;
					}
					isas[i]->reduce(g_in.w + 1, src, nsrc, n, div);
					assert_memory_equal(g_in.w + 1, want, n * sizeof(float));
					/* out aliasing src[0] */
					isas[i]->reduce(g_in.src[0] + 1, src, nsrc, n, div);
					assert_memory_equal(g_in.src[0] + 1, want,
							    n * sizeof(float));
				}
			}
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_isa_exact),
		cmocka_unit_test(test_reference_formulas),
		cmocka_unit_test(test_deterministic_order),
		cmocka_unit_test(test_lookup),
		cmocka_unit_test(test_nonfinite_scan),
		cmocka_unit_test(test_nonfinite_propagate),
		cmocka_unit_test(test_fused_ingest),
		cmocka_unit_test(test_reduce_many_sources),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
