/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF kernels for AVX-512F (built with -mavx512f -mpopcnt). Compaction uses vcompressps /
 * vpcompressd into a register and then a full 16-lane store at the current count: the
 * memory form of compress is microcoded and slow on some cores (AMD Zen 4), the register
 * form is not. The scatter-add gathers 16 accumulator elements, adds and scatters them
 * back, which is exact because the decoder guarantees distinct indexes; the bitmap add
 * expands the values into the lanes of the mask (vexpandps) and adds there only.
 */
#include <immintrin.h>

#include "dvf_isa.h"

static size_t filter_avx512(float *resid, const float *g, size_t n, float thr, float *out)
{
	const __m512 vthr = _mm512_set1_ps(thr);
	const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
	size_t i = 0, cnt = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 u = _mm512_add_ps(_mm512_loadu_ps(resid + i), _mm512_loadu_ps(g + i));
		__m512 a = _mm512_castsi512_ps(_mm512_and_epi32(_mm512_castps_si512(u), absmask));
		__mmask16 keep = _mm512_cmp_ps_mask(a, vthr, _CMP_LE_OQ);

		_mm512_storeu_ps(resid + i, _mm512_maskz_mov_ps(keep, u));
		_mm512_storeu_ps(out + i, _mm512_maskz_mov_ps((__mmask16)~keep, u));
		cnt += (size_t)__builtin_popcount((uint16_t)~keep);
	}
	return cnt + pbox_dvf_filter_tail(resid, g, i, n, thr, out);
}

static size_t compact_avx512(const float *in, size_t n, float *vals, uint32_t *idx, uint8_t *bitmap)
{
	const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
	const __m512i step = _mm512_set1_epi32(16);
	__m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	size_t i = 0, cnt = 0;

	for (; i + 16 <= n; i += 16, vi = _mm512_add_epi32(vi, step)) {
		__m512i b = _mm512_loadu_si512(in + i);
		__mmask16 m = _mm512_test_epi32_mask(b, absmask);

		bitmap[i / 8] = (uint8_t)m;
		bitmap[i / 8 + 1] = (uint8_t)(m >> 8);
		if (m == 0) {
			continue;
		}
		_mm512_storeu_si512(vals + cnt, _mm512_maskz_compress_epi32(m, b));
		_mm512_storeu_si512(idx + cnt, _mm512_maskz_compress_epi32(m, vi));
		cnt += (size_t)__builtin_popcount(m);
	}
	return pbox_dvf_compact_tail(in, i, n, vals, idx, bitmap, cnt);
}

static void scatter_add_avx512(float *acc, const float *vals, const uint32_t *idx, size_t cnt)
{
	size_t k = 0;

	for (; k + 16 <= cnt; k += 16) {
		__m512i vi = _mm512_loadu_si512(idx + k);
		__m512 a = _mm512_i32gather_ps(vi, acc, 4);

		a = _mm512_add_ps(a, _mm512_loadu_ps(vals + k));
		_mm512_i32scatter_ps(acc, vi, a, 4);
	}
	pbox_dvf_scatter_tail(acc, vals, idx, k, cnt);
}

/* 16 elements at a time: the next popcount(m) values (a masked load: nothing read past
 * them) spread to the lanes of m by vexpandps, added in those lanes only. */
static void bitmap_add_avx512(float *acc, const float *vals, const uint8_t *bitmap, size_t n)
{
	size_t i = 0, c = 0;

	for (; i + 16 <= n; i += 16) {
		__mmask16 m = (__mmask16)(bitmap[i / 8] | bitmap[i / 8 + 1] << 8);
		unsigned pop = (unsigned)__builtin_popcount(m);
		__m512 v, a;

		if (m == 0) {
			continue;
		}
		v = _mm512_maskz_loadu_ps((__mmask16)((1u << pop) - 1), vals + c);
		v = _mm512_maskz_expand_ps(m, v);
		a = _mm512_loadu_ps(acc + i);
		_mm512_storeu_ps(acc + i, _mm512_mask_add_ps(a, m, a, v));
		c += pop;
	}
	pbox_dvf_bitmap_tail(acc, vals, bitmap, i, n, c);
}

const struct pbox_dvf_kernels pbox_dvf_table_avx512 = {
	.isa = "avx512",
	.filter = filter_avx512,
	.compact = compact_avx512,
	.scatter_add = scatter_add_avx512,
	.bitmap_add = bitmap_add_avx512,
	.add = NULL, /* set from dataplane/kernels by dvf.c */
};
