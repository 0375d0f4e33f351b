/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Vector kernels of the chunk engine: aggregation (add, rank-ordered reduce) and the fused
 * optimizer steps (SGD, momentum, Nesterov, Adam, AdamW), each built for AVX-512, AVX2,
 * SSE2 and plain C, chosen once at start-up by CPU features.
 *
 * Exactness contract: every kernel computes each element with the same sequence of IEEE
 * single-precision operations on every ISA (no FMA contraction, no reassociation), so all
 * paths give bit-identical results to the scalar one. Sums over several sources are taken
 * left to right: ((src[0] + src[1]) + src[2]) + ... which is what makes deterministic mode
 * (sources in rank order) bit-reproducible.
 *
 * Optimizer definitions (g is the summed gradient):
 *   all:      g = g * rescale; if clip > 0: g = min(max(g, -clip), clip)
 *             (a NaN g stays NaN: clipping never turns it into -clip)
 *   sgd:      w = w - lr * (g + wd * w)                                  (MXNet sgd)
 *   momentum: m = momentum * m - lr * (g + wd * w); w = w + m            (MXNet sgd_mom)
 *   nag:      m = m * momentum; g = g + wd * w; m = m + g;
 *             g = g + momentum * m; w = w - lr * g                        (MXNet NAG, as PHub)
 *   adam:     g = g + wd * w; m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g;
 *             w = w - step_size * (m / (sqrt(v) / bc2_sqrt + eps))        (PyTorch Adam)
 *   adamw:    w = w * (1 - lr * wd); then adam without the wd term        (PyTorch AdamW)
 * with step_size = lr / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t) for step t >= 1.
 *
 * Arguments: the step reads the model from w_in and writes the new model to w (w_in == w
 * updates in place; the appliance double-buffers so that replies can still reference the
 * previous version); m, v are the optimizer state, updated in place (n elements each);
 * src[0..nsrc-1] the gradient sources, nsrc >= 1; out of reduce may alias src[0]. No
 * pointer needs any alignment. Thread safety: kernels are pure; the table is immutable.
 */
#ifndef PBOX_KERNELS_H
#define PBOX_KERNELS_H

#include <stddef.h>
#include <stdint.h>

struct pbox_opt_params {
	float lr;
	float momentum;
	float wd;
	float rescale;
	float clip; /* 0: no clipping */
	float beta1;
	float beta2;
	float eps;
};

/* Scalars that depend on the step number; filled by pbox_optimizer_ops.prepare(). */
struct pbox_opt_step {
	float step_size;
	float bc2_sqrt;
	float decay; /* adamw: 1 - lr * wd */
};

typedef void (*pbox_kern_step_fn)(float *w, const float *w_in, float *m, float *v,
				  const float *const *src, unsigned nsrc, size_t n,
				  const struct pbox_opt_params *p, const struct pbox_opt_step *st);

struct pbox_kernels {
	const char *isa; /* "avx512", "avx2", "sse2", "scalar" */
	/* acc[i] += g[i] */
	void (*add)(float *acc, const float *g, size_t n);
	/* Number of elements of g that are NaN or +-Inf; n < 2^31. Integer lanes, exact on
	 * every ISA. The engine runs it on the fragments it does not check in the pass that
	 * copies or adds them (the fused kernels below). */
	size_t (*nonfinite)(const float *g, size_t n);
	/* Fused ingest kernels (n < 2^31), each returning nonfinite(g, n) exactly, taken in
	 * the pass that moves the data:
	 *   copy_nonfinite: dst[i] = g[i] (a bit copy; dst and g must not overlap);
	 *   add_nonfinite:  acc[i] += g[i], as add();
	 *   add_finite:     acc[i] += g[i] as add() only if the count is 0, else acc is
	 *                   left untouched (every element is checked before any is added). */
	size_t (*copy_nonfinite)(float *dst, const float *g, size_t n);
	size_t (*add_nonfinite)(float *acc, const float *g, size_t n);
	size_t (*add_finite)(float *acc, const float *g, size_t n);
	/*   sum2_nonfinite: out[i] = (acc[i] + g[i]) / div, what reduce(out, {acc, g}, 2, n,
	 *                   div) computes, bit for bit (the division skipped when div == 1);
	 *                   out is acc, or overlaps neither acc nor g. */
	size_t (*sum2_nonfinite)(float *out, const float *acc, const float *g, size_t n, float div);
	/* out[i] = (src[0][i] + ... + src[nsrc-1][i]) / div; the division is skipped when
	 * div == 1 (x / 1 == x exactly). out may alias src[0]. */
	void (*reduce)(float *out, const float *const *src, unsigned nsrc, size_t n, float div);
	pbox_kern_step_fn sgd;
	pbox_kern_step_fn momentum;
	pbox_kern_step_fn nag;
	pbox_kern_step_fn adam;
	pbox_kern_step_fn adamw;
};

/*
 * The kernels for this CPU: the widest supported ISA, or the one named by the
 * environment variable PBOX_KERNEL_ISA (logged and ignored if unknown or unsupported).
 * Resolved once; never NULL.
 */
const struct pbox_kernels *pbox_kernels_get(void);

/* The kernels of a named ISA, or NULL if unknown or not supported by this CPU. */
const struct pbox_kernels *pbox_kernels_by_isa(const char *isa);

/* All kernel tables this CPU supports, widest first; returns the count (<= 4). */
unsigned pbox_kernels_supported(const struct pbox_kernels **out, unsigned max);

/* Optimizers as an ops table, chosen once per job by name. */
struct pbox_optimizer_ops {
	const char *name;
	unsigned nstate; /* state vectors per element: 0 (sgd), 1 (momentum, nag), 2 (adam*) */
	/* Fill st for step t (t >= 1 counts completed steps including this one). */
	void (*prepare)(const struct pbox_opt_params *p, uint64_t t, struct pbox_opt_step *st);
	/* The kernel of this optimizer in table k. */
	pbox_kern_step_fn (*kernel)(const struct pbox_kernels *k);
};

/* Lookup by name: "sgd", "momentum", "nag", "adam", "adamw"; NULL if unknown. */
const struct pbox_optimizer_ops *pbox_optimizer_find(const char *name);
/* Comma-separated names, for error messages and --help. */
const char *pbox_optimizer_names(void);
/* Defaults: lr 0.01, momentum 0.9, wd 0, rescale 1, clip 0, beta1 0.9, beta2 0.999,
 * eps 1e-8. */
void pbox_opt_params_default(struct pbox_opt_params *p);

/* Convenience: one full optimizer step, in place, over n elements with table k. */
void pbox_optimizer_step(const struct pbox_optimizer_ops *ops, const struct pbox_kernels *k,
			 float *w, float *m, float *v, const float *const *src, unsigned nsrc,
			 size_t n, const struct pbox_opt_params *p, uint64_t t);

#endif /* PBOX_KERNELS_H */
