/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernel bodies, written once and instantiated per ISA: kern_<isa>.c defines
 *   KFN(name)      the mangled function name (e.g. name##_avx2)
 *   VW             floats per vector
 *   vf             a GCC vector type of VW floats
 *   VSQRT(x)       lane-wise IEEE square root
 *   VMINS(x, s)    lane-wise (s < x ? s : x) against scalar s (minps(s, x) semantics)
 *   VMAXS(x, s)    lane-wise (s > x ? s : x) against scalar s (maxps(s, x) semantics)
 *   VIMAX(a, b)    optional: lane-wise signed max of two vi (int32) vectors
 * (a NaN x is returned as it is, so clipping never turns NaN into a number)
 * and then includes this file, which defines KFN(table), a struct pbox_kernels.
 *
 * Each kernel runs the same element macro on vectors and then on the scalar tail, so the
 * vector lanes and the tail (and the scalar ISA, where VW == 1) compute every element with
 * one and the same sequence of operations: the exactness contract of kernels.h.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

static inline vf KFN(vld)(const float *p)
{
	vf v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void KFN(vst)(float *p, vf v)
{
	memcpy(p, &v, sizeof(v));
}

#define VLD(p)      KFN(vld)(p)
#define VST(p, x)   KFN(vst)(p, x)
#define SLD(p)      (*(p))
#define SST(p, x)   (*(p) = (x))
#define SSQRT(x)    sqrtf(x)
#define SMINS(x, s) ((s) < (x) ? (s) : (x))
#define SMAXS(x, s) ((s) > (x) ? (s) : (x))

/* g = sum of the sources at element i, left to right. */
#define K_SUM(LD, g, i)                                  \
	do {                                             \
		(g) = LD(src[0] + (i));                  \
		for (unsigned k_ = 1; k_ < nsrc; k_++) { \
			(g) = (g) + LD(src[k_] + (i));   \
		}                                        \
	} while (0)

/* Gradient pre-processing shared by every optimizer: rescale, then optional clipping. */
#define K_PRE(MINS, MAXS, g)                                \
	do {                                                \
		(g) = (g)*rescale;                          \
		if (clip > 0) {                             \
			(g) = MINS(MAXS((g), nclip), clip); \
		}                                           \
	} while (0)

/* Run ELEM over n elements: vector body, then scalar tail with the same macro. */
#define K_LOOP(ELEM)                                                    \
	do {                                                            \
		size_t i_ = 0;                                          \
		for (; i_ + VW <= n; i_ += VW) {                        \
			ELEM(vf, VLD, VST, VSQRT, VMINS, VMAXS, i_);    \
		}                                                       \
		for (; i_ < n; i_++) {                                  \
			ELEM(float, SLD, SST, SSQRT, SMINS, SMAXS, i_); \
		}                                                       \
	} while (0)

#define K_SCALARS(p)                                                                        \
	const float lr = (p)->lr, mu = (p)->momentum, wd = (p)->wd, rescale = (p)->rescale; \
	const float clip = (p)->clip, nclip = -(p)->clip;                                   \
	(void)lr;                                                                           \
	(void)mu;                                                                           \
	(void)wd

static void KFN(add)(float *acc, const float *g, size_t n)
{
	size_t i = 0;

	for (; i + VW <= n; i += VW) {
		VST(acc + i, VLD(acc + i) + VLD(g + i));
	}
	for (; i < n; i++) {
		acc[i] = acc[i] + g[i];
	}
}

#if VW > 1
typedef int32_t vi __attribute__((vector_size(VW * 4)));
#endif

#define K_EXP 0x7f800000 /* exponent bits: all ones for NaN and +-Inf */

/* Elements of g that are NaN or +-Inf, counted in integer lanes: no floating-point
 * compare, so no FP exceptions and no dependence on the FP mode. */
static size_t KFN(nonfinite_count)(const float *g, size_t n)
{
	size_t i = 0, cnt = 0;
#if VW > 1
	vi acc = { 0 };

	for (; i + VW <= n; i += VW) {
		vi v;

		memcpy(&v, g + i, sizeof(v));
		acc -= (v & K_EXP) == K_EXP; /* true lanes are -1 */
	}
	for (unsigned k = 0; k < VW; k++) {
		cnt += (uint32_t)acc[k];
	}
#endif
	for (; i < n; i++) {
		uint32_t b;

		memcpy(&b, g + i, sizeof(b));
		cnt += (b & K_EXP) == K_EXP;
	}
	return cnt;
}

/* The same, with a cheaper first pass where the ISA has a lane-wise signed max (VIMAX):
 * the largest exponent field of the fragment (two operations per vector) is all ones
 * only if some element is non-finite; then, rarely, the exact count. */
static size_t KFN(nonfinite)(const float *g, size_t n)
{
#ifdef VIMAX
	size_t i = 0, cnt = 0;
	vi mx = { 0 };
	int hit = 0;

	for (; i + VW <= n; i += VW) {
		vi v;

		memcpy(&v, g + i, sizeof(v));
		mx = VIMAX(mx, v & K_EXP);
	}
	for (unsigned k = 0; k < VW; k++) {
		hit |= mx[k] == K_EXP;
	}
	if (hit) {
		return KFN(nonfinite_count)(g, n);
	}
	for (; i < n; i++) {
		uint32_t b;

		memcpy(&b, g + i, sizeof(b));
		cnt += (b & K_EXP) == K_EXP;
	}
	return cnt;
#else
	return KFN(nonfinite_count)(g, n);
#endif
}

/*
 * Fused kernels of the engine's ingest (engine.c, push_data): the non-finite count of
 * the payload g taken in the same pass that moves it, so a fragment is read once. The
 * count is the one nonfinite() returns, in integer lanes (exact on every ISA); the float
 * results are those of a plain copy and of add(): bit-identical across ISAs.
 */

/* dst[i] = g[i]; returns the number of NaN / Inf elements of g. */
static size_t KFN(copy_nonfinite)(float *dst, const float *g, size_t n)
{
	size_t i = 0, cnt = 0;
#if VW > 1
	vi c = { 0 };

	for (; i + VW <= n; i += VW) {
		vi v;

		memcpy(&v, g + i, sizeof(v));
		memcpy(dst + i, &v, sizeof(v));
		c -= (v & K_EXP) == K_EXP;
	}
	for (unsigned k = 0; k < VW; k++) {
		cnt += (uint32_t)c[k];
	}
#endif
	for (; i < n; i++) {
		uint32_t b;

		memcpy(&b, g + i, sizeof(b));
		memcpy(dst + i, &b, sizeof(b));
		cnt += (b & K_EXP) == K_EXP;
	}
	return cnt;
}

/* acc[i] += g[i] (the IEEE additions of add()); returns the number of NaN / Inf elements
 * of g. Counting while adding: for non_finite = "propagate", where nothing is refused. */
static size_t KFN(add_nonfinite)(float *acc, const float *g, size_t n)
{
	size_t i = 0, cnt = 0;
#if VW > 1
	vi c = { 0 };

	for (; i + VW <= n; i += VW) {
		vi v;

		memcpy(&v, g + i, sizeof(v));
		VST(acc + i, VLD(acc + i) + (vf)v);
		c -= (v & K_EXP) == K_EXP;
	}
	for (unsigned k = 0; k < VW; k++) {
		cnt += (uint32_t)c[k];
	}
#endif
	for (; i < n; i++) {
		uint32_t b;
		float x;

		memcpy(&b, g + i, sizeof(b));
		memcpy(&x, &b, sizeof(x));
		acc[i] = acc[i] + x;
		cnt += (b & K_EXP) == K_EXP;
	}
	return cnt;
}

/*
 * For non_finite = "reject": acc[i] += g[i] only if no element of g is NaN / Inf; returns
 * that count (0: added). An addition already made cannot be undone bit-exactly (acc + g
 * rounds), so every element of g must be checked before the first one is added: checking
 * and adding block by block would, on a hit in block k, leave blocks 0..k-1 added. Hence
 * the whole of g is checked first (the cheap max pass of nonfinite()), then added; for
 * the engine's fragments (at most a datagram, <= 9 KB) g is then L1-resident, so the
 * second read costs L1 loads only, never memory traffic.
 */
static size_t KFN(add_finite)(float *acc, const float *g, size_t n)
{
	size_t cnt = KFN(nonfinite)(g, n);

	if (cnt == 0) {
		KFN(add)(acc, g, n);
	}
	return cnt;
}

/*
 * out[i] = (acc[i] + g[i]) / div, the division skipped when div == 1: element for element
 * what reduce(out, {acc, g}, 2, n, div) computes (the same IEEE addition, then the same
 * division); returns the number of NaN / Inf elements of g, counted in the same pass. out
 * is acc (in place: the final arrival of an aggregate fragment under non_finite =
 * "propagate", where nothing is refused, so nothing to undo) or overlaps neither acc nor g
 * (pbox-bench-reject measures it for "reject": the sum written beside the accumulator).
 */
static size_t KFN(sum2_nonfinite)(float *out, const float *acc, const float *g, size_t n, float div)
{
	size_t i = 0, cnt = 0;
#if VW > 1
	vi c = { 0 };

	if (div == 1.0f) {
		for (; i + VW <= n; i += VW) {
			vi v;

			memcpy(&v, g + i, sizeof(v));
			VST(out + i, VLD(acc + i) + (vf)v);
			c -= (v & K_EXP) == K_EXP;
		}
	} else {
		for (; i + VW <= n; i += VW) {
			vi v;
			vf s;

			memcpy(&v, g + i, sizeof(v));
			s = VLD(acc + i) + (vf)v;
			VST(out + i, s / div);
			c -= (v & K_EXP) == K_EXP;
		}
	}
	for (unsigned k = 0; k < VW; k++) {
		cnt += (uint32_t)c[k];
	}
#endif
	for (; i < n; i++) {
		uint32_t b;
		float x, s;

		memcpy(&b, g + i, sizeof(b));
		memcpy(&x, &b, sizeof(x));
		s = acc[i] + x;
		out[i] = div == 1.0f ? s : s / div;
		cnt += (b & K_EXP) == K_EXP;
	}
	return cnt;
}

#define REDUCE_ELEM(T, LD, ST, SQ, MINS, MAXS, i) \
	do {                                      \
		T s_;                             \
		K_SUM(LD, s_, i);                 \
		if (div != 1.0f) {                \
			s_ = s_ / div;            \
		}                                 \
		ST(out + (i), s_);                \
	} while (0)

/* Sources above which reduce goes source-major (see below). */
#define K_REDUCE_WIDE 4
/* Elements per block of the source-major reduce: 4 KB, resident in L1. */
#define K_REDUCE_BLOCK 1024

static void KFN(reduce)(float *out, const float *const *src, unsigned nsrc, size_t n, float div)
{
	float blk[K_REDUCE_BLOCK];

	if (nsrc <= K_REDUCE_WIDE) {
		K_LOOP(REDUCE_ELEM);
		return;
	}
	/*
	 * Many sources (deterministic mode: one per worker, up to 1,024): element-major order
	 * would touch every source's page for every vector (a TLB and cache miss each, for
	 * sources that are far apart). Source-major over L1-sized blocks reads each source
	 * sequentially instead. Each element still gets ((src[0] + src[1]) + src[2]) + ...
	 * and then / div: the same IEEE operations in the same order, bit-identical.
	 */
	for (size_t b = 0; b < n; b += K_REDUCE_BLOCK) {
		size_t m = n - b < K_REDUCE_BLOCK ? n - b : K_REDUCE_BLOCK;

		memcpy(blk, src[0] + b, m * sizeof(float));
		for (unsigned k = 1; k < nsrc; k++) {
			KFN(add)(blk, src[k] + b, m);
		}
		if (div != 1.0f) {
			size_t i = 0;

			for (; i + VW <= m; i += VW) {
				VST(blk + i, VLD(blk + i) / div);
			}
			for (; i < m; i++) {
				blk[i] = blk[i] / div;
			}
		}
		memcpy(out + b, blk, m * sizeof(float)); /* out may alias src[0]: read above */
	}
}

#define SGD_ELEM(T, LD, ST, SQ, MINS, MAXS, i) \
	do {                                   \
		T g_, w_;                      \
		K_SUM(LD, g_, i);              \
		K_PRE(MINS, MAXS, g_);         \
		w_ = LD(w_in + (i));           \
		w_ = w_ - lr * (g_ + wd * w_); \
		ST(w + (i), w_);               \
	} while (0)

static void KFN(sgd)(float *w, const float *w_in, float *m, float *v, const float *const *src,
		     unsigned nsrc, size_t n, const struct pbox_opt_params *p,
		     const struct pbox_opt_step *st)
{
	K_SCALARS(p);
	(void)m;
	(void)v;
	(void)st;
	K_LOOP(SGD_ELEM);
}

#define MOM_ELEM(T, LD, ST, SQ, MINS, MAXS, i)      \
	do {                                        \
		T g_, w_, m_;                       \
		K_SUM(LD, g_, i);                   \
		K_PRE(MINS, MAXS, g_);              \
		w_ = LD(w_in + (i));                \
		m_ = LD(m + (i));                   \
		m_ = mu * m_ - lr * (g_ + wd * w_); \
		w_ = w_ + m_;                       \
		ST(m + (i), m_);                    \
		ST(w + (i), w_);                    \
	} while (0)

static void KFN(momentum)(float *w, const float *w_in, float *m, float *v, const float *const *src,
			  unsigned nsrc, size_t n, const struct pbox_opt_params *p,
			  const struct pbox_opt_step *st)
{
	K_SCALARS(p);
	(void)v;
	(void)st;
	K_LOOP(MOM_ELEM);
}

#define NAG_ELEM(T, LD, ST, SQ, MINS, MAXS, i) \
	do {                                   \
		T g_, w_, m_;                  \
		K_SUM(LD, g_, i);              \
		K_PRE(MINS, MAXS, g_);         \
		w_ = LD(w_in + (i));           \
		m_ = LD(m + (i));              \
		m_ = m_ * mu;                  \
		g_ = g_ + wd * w_;             \
		m_ = m_ + g_;                  \
		g_ = g_ + mu * m_;             \
		w_ = w_ - lr * g_;             \
		ST(m + (i), m_);               \
		ST(w + (i), w_);               \
	} while (0)

static void KFN(nag)(float *w, const float *w_in, float *m, float *v, const float *const *src,
		     unsigned nsrc, size_t n, const struct pbox_opt_params *p,
		     const struct pbox_opt_step *st)
{
	K_SCALARS(p);
	(void)v;
	(void)st;
	K_LOOP(NAG_ELEM);
}

/* Shared Adam tail: moments and the update of w_ (which adamw has already decayed). */
#define ADAM_CORE(T, LD, ST, SQ, i)                                     \
	do {                                                            \
		m_ = LD(m + (i));                                       \
		v_ = LD(v + (i));                                       \
		m_ = b1 * m_ + omb1 * g_;                               \
		v_ = b2 * v_ + omb2 * (g_ * g_);                        \
		w_ = w_ - step_size * (m_ / (SQ(v_) / bc2_sqrt + eps)); \
		ST(m + (i), m_);                                        \
		ST(v + (i), v_);                                        \
		ST(w + (i), w_);                                        \
	} while (0)

#define ADAM_ELEM(T, LD, ST, SQ, MINS, MAXS, i) \
	do {                                    \
		T g_, w_, m_, v_;               \
		K_SUM(LD, g_, i);               \
		K_PRE(MINS, MAXS, g_);          \
		w_ = LD(w_in + (i));            \
		g_ = g_ + wd * w_;              \
		ADAM_CORE(T, LD, ST, SQ, i);    \
	} while (0)

#define ADAMW_ELEM(T, LD, ST, SQ, MINS, MAXS, i) \
	do {                                     \
		T g_, w_, m_, v_;                \
		K_SUM(LD, g_, i);                \
		K_PRE(MINS, MAXS, g_);           \
		w_ = LD(w_in + (i));             \
		w_ = w_ * decay;                 \
		ADAM_CORE(T, LD, ST, SQ, i);     \
	} while (0)

#define ADAM_SCALARS(p, st)                                                                      \
	K_SCALARS(p);                                                                            \
	const float b1 = (p)->beta1, b2 = (p)->beta2, eps = (p)->eps;                            \
	const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;                                          \
	const float step_size = (st)->step_size, bc2_sqrt = (st)->bc2_sqrt, decay = (st)->decay; \
	(void)decay

static void KFN(adam)(float *w, const float *w_in, float *m, float *v, const float *const *src,
		      unsigned nsrc, size_t n, const struct pbox_opt_params *p,
		      const struct pbox_opt_step *st)
{
	ADAM_SCALARS(p, st);
	K_LOOP(ADAM_ELEM);
}

static void KFN(adamw)(float *w, const float *w_in, float *m, float *v, const float *const *src,
		       unsigned nsrc, size_t n, const struct pbox_opt_params *p,
		       const struct pbox_opt_step *st)
{
	ADAM_SCALARS(p, st);
	K_LOOP(ADAMW_ELEM);
}

const struct pbox_kernels KFN(table) = {
	.isa = KERN_ISA_NAME,
	.add = KFN(add),
	.nonfinite = KFN(nonfinite),
	.copy_nonfinite = KFN(copy_nonfinite),
	.add_nonfinite = KFN(add_nonfinite),
	.add_finite = KFN(add_finite),
	.sum2_nonfinite = KFN(sum2_nonfinite),
	.reduce = KFN(reduce),
	.sgd = KFN(sgd),
	.momentum = KFN(momentum),
	.nag = KFN(nag),
	.adam = KFN(adam),
	.adamw = KFN(adamw),
};
