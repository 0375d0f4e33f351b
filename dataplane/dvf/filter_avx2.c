/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF kernels for AVX2 (built with -mavx2 -mpopcnt). AVX2 has no compress instruction:
 * compaction permutes the sent lanes of 8 to the front with a table indexed by the lane
 * mask, then stores the whole vector at the current count (the lanes past it are
 * overwritten by the next store or lie past the count). AVX2 has no scatter either, so
 * the scatter-add is the scalar loop.
 */
#include <immintrin.h>

#include "dvf_isa.h"

/* g_perm[m]: the positions of the set bits of m, lowest first, 3 bits each (compaction);
 * g_expand[m]: for each lane j, the rank of bit j among the set bits of m (expansion). */
static uint32_t g_perm[256], g_expand[256];

__attribute__((constructor)) static void perm_init(void)
{
	for (unsigned m = 0; m < 256; m++) {
		uint32_t p = 0;
		unsigned k = 0;

		for (unsigned b = 0; b < 8; b++) {
			if (m & (1u << b)) {
				p |= b << (3 * k++);
			}
		}
		g_perm[m] = p;
		p = 0;
		k = 0;
		for (unsigned b = 0; b < 8; b++) {
			if (m & (1u << b)) {
				p |= k++ << (3 * b);
			}
		}
		g_expand[m] = p;
	}
}

static inline __m256i unpack3(uint32_t p)
{
	const __m256i shifts = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);

	return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)p), shifts),
				_mm256_set1_epi32(7));
}

static inline __m256i perm_of(unsigned m)
{
	return unpack3(g_perm[m]);
}

static size_t filter_avx2(float *resid, const float *g, size_t n, float thr, float *out)
{
	const __m256 vthr = _mm256_set1_ps(thr);
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	size_t i = 0, cnt = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 u = _mm256_add_ps(_mm256_loadu_ps(resid + i), _mm256_loadu_ps(g + i));
		__m256 keep = _mm256_cmp_ps(_mm256_and_ps(u, absmask), vthr, _CMP_LE_OQ);

		_mm256_storeu_ps(resid + i, _mm256_and_ps(u, keep));
		_mm256_storeu_ps(out + i, _mm256_andnot_ps(keep, u));
		cnt += (size_t)__builtin_popcount(~(unsigned)_mm256_movemask_ps(keep) & 0xffu);
	}
	return cnt + pbox_dvf_filter_tail(resid, g, i, n, thr, out);
}

static size_t compact_avx2(const float *in, size_t n, float *vals, uint32_t *idx, uint8_t *bitmap)
{
	const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
	const __m256i zero = _mm256_setzero_si256();
	size_t i = 0, cnt = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i b = _mm256_loadu_si256((const void *)(in + i));
		__m256i z = _mm256_cmpeq_epi32(_mm256_and_si256(b, absmask), zero);
		unsigned m = ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(z)) & 0xffu;
		__m256i p;

		bitmap[i / 8] = (uint8_t)m;
		if (m == 0) {
			continue;
		}
		p = perm_of(m);
		_mm256_storeu_si256((void *)(vals + cnt), _mm256_permutevar8x32_epi32(b, p));
		_mm256_storeu_si256((void *)(idx + cnt),
				    _mm256_add_epi32(p, _mm256_set1_epi32((int)i)));
		cnt += (size_t)__builtin_popcount(m);
	}
	return pbox_dvf_compact_tail(in, i, n, vals, idx, bitmap, cnt);
}

static void scatter_add_avx2(float *acc, const float *vals, const uint32_t *idx, size_t cnt)
{
	pbox_dvf_scatter_tail(acc, vals, idx, 0, cnt);
}

/* 8 elements at a time: the next popcount(m) values (vmaskmovps: nothing read past
 * them) permuted to the lanes of m, added and blended into those lanes only. */
static void bitmap_add_avx2(float *acc, const float *vals, const uint8_t *bitmap, size_t n)
{
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
	size_t i = 0, c = 0;

	for (; i + 8 <= n; i += 8) {
		unsigned m = bitmap[i / 8];
		int pop = __builtin_popcount(m);
		__m256i ld, in;
		__m256 v, a;

		if (m == 0) {
			continue;
		}
		ld = _mm256_cmpgt_epi32(_mm256_set1_epi32(pop), lane);
		in = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bit), bit);
		v = _mm256_permutevar8x32_ps(_mm256_maskload_ps(vals + c, ld),
					     unpack3(g_expand[m]));
		a = _mm256_loadu_ps(acc + i);
		_mm256_storeu_ps(acc + i,
				 _mm256_blendv_ps(a, _mm256_add_ps(a, v), _mm256_castsi256_ps(in)));
		c += (size_t)pop;
	}
	pbox_dvf_bitmap_tail(acc, vals, bitmap, i, n, c);
}

const struct pbox_dvf_kernels pbox_dvf_table_avx2 = {
	.isa = "avx2",
	.filter = filter_avx2,
	.compact = compact_avx2,
	.scatter_add = scatter_add_avx2,
	.bitmap_add = bitmap_add_avx2,
	.add = NULL, /* set from dataplane/kernels by dvf.c */
};
