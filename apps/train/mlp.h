/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A multilayer perceptron for classification: fully connected layers with ReLU between
 * them and softmax cross-entropy on the last, matrix products through CBLAS (OpenBLAS).
 *
 * Parameters live in one flat float vector (struct pbox_mlp_layout says where): per layer
 * l a weight tensor W_l of dims[l] x dims[l-1] (row-major, out x in) and a bias b_l of
 * dims[l], each tensor starting on a 64-byte boundary (the gaps are zero and stay zero).
 * pbox trains each tensor as one key.
 *
 * Reproducibility: every result is a fixed sequence of float operations for given inputs
 * and batch size (sums over samples in sample order; CBLAS single-threaded, see
 * pbox_mlp_blas_single_thread()), so a gradient computed twice, in any process on the same
 * machine, is bit-identical. The gradient is the SUM over the batch, not the mean: the
 * appliance adds the ranks' sums and rescales by 1 / global batch.
 *
 * Thread safety: a struct pbox_mlp holds the scratch space of one batch; use one per
 * thread. Parameter vectors are only read by grad / eval.
 */
#ifndef PBOX_TRAIN_MLP_H
#define PBOX_TRAIN_MLP_H

#include <stddef.h>
#include <stdint.h>

#define PBOX_MLP_MAX_LAYERS 8

struct pbox_mlp_layout {
	unsigned nlayers;
	unsigned dims[PBOX_MLP_MAX_LAYERS + 1]; /* dims[0]: inputs; dims[nlayers]: classes */
	unsigned ntensors;                      /* 2 * nlayers: W_1, b_1, W_2, b_2, ... */
	size_t off[2 * PBOX_MLP_MAX_LAYERS];    /* float offset of each tensor */
	size_t nelem[2 * PBOX_MLP_MAX_LAYERS];
	size_t nparams; /* length of the flat vector, gaps included */
};

/* Totals of a batch: summed per-sample loss, correct predictions, samples. */
struct pbox_mlp_stats {
	double loss;
	uint64_t correct;
	uint64_t samples;
};

struct pbox_mlp;

/*
 * A network with nlayers layers of sizes dims[0] -> dims[1] -> ... -> dims[nlayers], with
 * scratch space for batches of up to max_batch samples. Returns NULL after logging why
 * (bad sizes: 1 <= nlayers <= PBOX_MLP_MAX_LAYERS, every dim >= 1; or no memory).
 */
struct pbox_mlp *pbox_mlp_create(const unsigned *dims, unsigned nlayers, unsigned max_batch);
void pbox_mlp_destroy(struct pbox_mlp *m);

const struct pbox_mlp_layout *pbox_mlp_layout(const struct pbox_mlp *m);

/* A zeroed, 64-byte aligned vector of nparams floats (free with free()), or NULL. */
float *pbox_mlp_alloc_params(const struct pbox_mlp *m);

/* He-uniform weights (bound sqrt(6 / fan_in)) from seed, zero biases. */
void pbox_mlp_init_params(const struct pbox_mlp *m, float *w, uint64_t seed);

/*
 * Gradient of the summed loss of samples x[0..n-1] (n x dims[0], row-major) with labels
 * y into g (nparams, overwritten; zero when n == 0), and the batch totals into st.
 * Returns 0, or -EINVAL if n > max_batch or a label is >= dims[nlayers].
 */
int pbox_mlp_grad(struct pbox_mlp *m, const float *w, const float *x, const uint8_t *y, unsigned n,
		  float *g, struct pbox_mlp_stats *st);

/* Loss and accuracy of any number of samples (evaluated max_batch at a time); totals are
 * added to st. Returns 0 or -EINVAL (a label out of range). */
int pbox_mlp_eval(struct pbox_mlp *m, const float *w, const float *x, const uint8_t *y, size_t n,
		  struct pbox_mlp_stats *st);

/* Make OpenBLAS run on the calling thread only: its threaded reductions can change the
 * summation order between runs. Call once before any grad / eval. */
void pbox_mlp_blas_single_thread(void);

#endif /* PBOX_TRAIN_MLP_H */
