/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-ISA DVF kernel tables defined by filter_<isa>.c; only dvf.c uses them. */
#ifndef PBOX_DVF_ISA_H
#define PBOX_DVF_ISA_H

#include <stdint.h>
#include <string.h>

#include "dvf.h"

extern const struct pbox_dvf_kernels pbox_dvf_table_avx512;
extern const struct pbox_dvf_kernels pbox_dvf_table_avx2;
extern const struct pbox_dvf_kernels pbox_dvf_table_scalar;

/* Codec contexts for one thread (codec.c), for payloads of up to max_raw bytes: NULL
 * after logging why. The lz4 decompressor may write expect + 1 bytes (to tell a bomb from
 * a corrupt stream): every dst passed to decompress has one spare byte. */
struct pbox_dvf_codec_ctx *pbox_dvf_codec_ctx_new(size_t max_raw);
void pbox_dvf_codec_ctx_free(struct pbox_dvf_codec_ctx *c);

/* The scalar bodies, shared by every table for the tails (the vector paths run them on
 * the last n % width elements, so a block gets the same operations wherever it is cut). */
static inline size_t pbox_dvf_filter_tail(float *resid, const float *g, size_t i, size_t n,
					  float thr, float *out)
{
	size_t cnt = 0;

	for (; i < n; i++) {
		float u = resid[i] + g[i];
		float a = __builtin_fabsf(u);

		if (a <= thr) {
			resid[i] = u;
			out[i] = 0.0f;
		} else {
			resid[i] = 0.0f;
			out[i] = u;
			cnt++;
		}
	}
	return cnt;
}

/* From element i (a multiple of 8) on; the bitmap bytes from i / 8 are written whole. */
static inline size_t pbox_dvf_compact_tail(const float *in, size_t i, size_t n, float *vals,
					   uint32_t *idx, uint8_t *bitmap, size_t cnt)
{
	memset(bitmap + i / 8, 0, (n + 7) / 8 - i / 8);
	for (; i < n; i++) {
		uint32_t b;

		memcpy(&b, in + i, sizeof(b));
		if ((b & 0x7fffffffu) != 0) {
			vals[cnt] = in[i];
			idx[cnt] = (uint32_t)i;
			bitmap[i / 8] |= (uint8_t)(1u << (i % 8));
			cnt++;
		}
	}
	return cnt;
}

static inline void pbox_dvf_scatter_tail(float *acc, const float *vals, const uint32_t *idx,
					 size_t k, size_t cnt)
{
	for (; k < cnt; k++) {
		acc[idx[k]] = acc[idx[k]] + vals[k];
	}
}

/* From element i (a multiple of 8), with c values used before it. */
static inline void pbox_dvf_bitmap_tail(float *acc, const float *vals, const uint8_t *bitmap,
					size_t i, size_t n, size_t c)
{
	for (; i < n; i++) {
		if ((bitmap[i / 8] >> (i % 8)) & 1) {
			acc[i] = acc[i] + vals[c++];
		}
	}
}

#endif /* PBOX_DVF_ISA_H */
