/* SPDX-License-Identifier: BSD-3-Clause */
/* DVF kernels in plain C: the reference the vector tables must match bit for bit. Built
 * with -fno-tree-vectorize so that it stays the one-element-at-a-time reference. */
#include "dvf_isa.h"

static size_t filter_scalar(float *resid, const float *g, size_t n, float thr, float *out)
{
	return pbox_dvf_filter_tail(resid, g, 0, n, thr, out);
}

static size_t compact_scalar(const float *in, size_t n, float *vals, uint32_t *idx, uint8_t *bitmap)
{
	return pbox_dvf_compact_tail(in, 0, n, vals, idx, bitmap, 0);
}

static void scatter_add_scalar(float *acc, const float *vals, const uint32_t *idx, size_t cnt)
{
	pbox_dvf_scatter_tail(acc, vals, idx, 0, cnt);
}

static void bitmap_add_scalar(float *acc, const float *vals, const uint8_t *bitmap, size_t n)
{
	pbox_dvf_bitmap_tail(acc, vals, bitmap, 0, n, 0);
}

const struct pbox_dvf_kernels pbox_dvf_table_scalar = {
	.isa = "scalar",
	.filter = filter_scalar,
	.compact = compact_scalar,
	.scatter_add = scatter_add_scalar,
	.bitmap_add = bitmap_add_scalar,
	.add = NULL, /* set from dataplane/kernels by dvf.c */
};
