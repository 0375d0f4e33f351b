/* SPDX-License-Identifier: BSD-3-Clause */
/* MLP forward / backward with CBLAS; deterministic sums (see mlp.h). */
#include "mlp.h"

#include <sched.h> /* cpu_set_t, which OpenBLAS's cblas.h uses without including it */

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "schedule.h"

/* 64 bytes: a cache line, and the widest vector load OpenBLAS uses. */
#define MLP_ALIGN_FLOATS 16

struct pbox_mlp {
	struct pbox_mlp_layout lay;
	unsigned max_batch;
	unsigned max_dim; /* widest layer output */
	/* act[l]: layer l's output for the batch (n x dims[l]), l = 1..nlayers: post-ReLU for
	 * hidden layers, softmax probabilities for the last. act[0] is the caller's input. */
	float *act[PBOX_MLP_MAX_LAYERS + 1];
	float *delta[2]; /* dLoss/dz of the current and the previous layer (ping-pong) */
};

static float *alloc_floats(size_t n)
{
	size_t bytes = PBOX_ALIGN_UP((n ? n : 1) * sizeof(float), 64);
	float *p = aligned_alloc(64, bytes);

	if (p != NULL) {
		memset(p, 0, bytes);
	}
	return p;
}

struct pbox_mlp *pbox_mlp_create(const unsigned *dims, unsigned nlayers, unsigned max_batch)
{
	struct pbox_mlp *m;
	size_t off = 0;

	if (nlayers < 1 || nlayers > PBOX_MLP_MAX_LAYERS || max_batch == 0) {
		PBOX_LOG_ERR(MAIN, "mlp: %u layers, batch %u: expected 1..%u layers and batch >= 1",
			     nlayers, max_batch, PBOX_MLP_MAX_LAYERS);
		return NULL;
	}
	for (unsigned l = 0; l <= nlayers; l++) {
		if (dims[l] == 0 || dims[l] > (1u << 20)) {
			PBOX_LOG_ERR(MAIN, "mlp: layer size %u of %u: expected 1..%u", l, dims[l],
				     1u << 20);
			return NULL;
		}
	}
	m = calloc(1, sizeof(*m));
	if (m == NULL) {
		PBOX_LOG_ERR(MAIN, "mlp: no memory");
		return NULL;
	}
	m->lay.nlayers = nlayers;
	m->lay.ntensors = 2 * nlayers;
	memcpy(m->lay.dims, dims, (nlayers + 1) * sizeof(*dims));
	for (unsigned l = 1; l <= nlayers; l++) {
		size_t nw = (size_t)dims[l] * dims[l - 1], nb = dims[l];

		m->lay.off[2 * (l - 1)] = off;
		m->lay.nelem[2 * (l - 1)] = nw;
		off = PBOX_ALIGN_UP(off + nw, MLP_ALIGN_FLOATS);
		m->lay.off[2 * (l - 1) + 1] = off;
		m->lay.nelem[2 * (l - 1) + 1] = nb;
		off = PBOX_ALIGN_UP(off + nb, MLP_ALIGN_FLOATS);
		m->max_dim = PBOX_MAX(m->max_dim, dims[l]);
	}
	m->max_dim = PBOX_MAX(m->max_dim, dims[0]);
	m->lay.nparams = off;
	m->max_batch = max_batch;
	for (unsigned l = 1; l <= nlayers; l++) {
		m->act[l] = alloc_floats((size_t)max_batch * dims[l]);
		if (m->act[l] == NULL) {
			goto nomem;
		}
	}
	for (int i = 0; i < 2; i++) {
		m->delta[i] = alloc_floats((size_t)max_batch * m->max_dim);
		if (m->delta[i] == NULL) {
			goto nomem;
		}
	}
	return m;
nomem:
	PBOX_LOG_ERR(MAIN, "mlp: no memory for the scratch space of batch %u", max_batch);
	pbox_mlp_destroy(m);
	return NULL;
}

void pbox_mlp_destroy(struct pbox_mlp *m)
{
	if (m == NULL) {
		return;
	}
	for (unsigned l = 1; l <= m->lay.nlayers; l++) {
		free(m->act[l]);
	}
	free(m->delta[0]);
	free(m->delta[1]);
	free(m);
}

const struct pbox_mlp_layout *pbox_mlp_layout(const struct pbox_mlp *m)
{
	return &m->lay;
}

float *pbox_mlp_alloc_params(const struct pbox_mlp *m)
{
	return alloc_floats(m->lay.nparams);
}

void pbox_mlp_init_params(const struct pbox_mlp *m, float *w, uint64_t seed)
{
	uint64_t st = seed;

	memset(w, 0, m->lay.nparams * sizeof(float));
	for (unsigned l = 1; l <= m->lay.nlayers; l++) {
		float *wl = w + m->lay.off[2 * (l - 1)];
		size_t nw = m->lay.nelem[2 * (l - 1)];
		float bound = sqrtf(6.0f / (float)m->lay.dims[l - 1]);

		for (size_t i = 0; i < nw; i++) {
			wl[i] = (2.0f * pbox_rng_unit(&st) - 1.0f) * bound;
		}
	}
}

void pbox_mlp_blas_single_thread(void)
{
	openblas_set_num_threads(1);
}

/* Forward pass of n samples: fills act[1..nlayers] (probabilities last). */
static void forward(struct pbox_mlp *m, const float *w, const float *x, unsigned n)
{
	const struct pbox_mlp_layout *L = &m->lay;
	const float *in = x;

	for (unsigned l = 1; l <= L->nlayers; l++) {
		const float *W = w + L->off[2 * (l - 1)], *b = w + L->off[2 * (l - 1) + 1];
		unsigned din = L->dims[l - 1], dout = L->dims[l];
		float *z = m->act[l];

		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)dout, (int)din,
			    1.0f, in, (int)din, W, (int)din, 0.0f, z, (int)dout);
		for (unsigned i = 0; i < n; i++) {
			float *zi = z + (size_t)i * dout;

			for (unsigned j = 0; j < dout; j++) {
				float v = zi[j] + b[j];

				zi[j] = (l < L->nlayers && v < 0.0f) ? 0.0f : v;
			}
		}
		in = z;
	}
	/* Softmax of the logits, row by row, shifted by the row maximum for range. */
	for (unsigned i = 0; i < n; i++) {
		unsigned k = L->dims[L->nlayers];
		float *zi = m->act[L->nlayers] + (size_t)i * k;
		float mx = zi[0], sum = 0.0f;

		for (unsigned j = 1; j < k; j++) {
			mx = zi[j] > mx ? zi[j] : mx;
		}
		for (unsigned j = 0; j < k; j++) {
			zi[j] = expf(zi[j] - mx);
			sum += zi[j];
		}
		for (unsigned j = 0; j < k; j++) {
			zi[j] /= sum;
		}
	}
}

/* Add batch totals from the probabilities; -EINVAL on a label out of range. */
static int score(const struct pbox_mlp *m, const uint8_t *y, unsigned n, struct pbox_mlp_stats *st)
{
	unsigned k = m->lay.dims[m->lay.nlayers];

	for (unsigned i = 0; i < n; i++) {
		const float *p = m->act[m->lay.nlayers] + (size_t)i * k;
		unsigned best = 0;

		if (y[i] >= k) {
			return -EINVAL;
		}
		for (unsigned j = 1; j < k; j++) {
			best = p[j] > p[best] ? j : best;
		}
		st->correct += best == y[i];
		/* A probability that underflowed to 0 would make the loss infinite; clamp it
		 * to the smallest normal float as frameworks do with log_softmax. */
		st->loss -= log((double)(p[y[i]] > 1.17549435e-38f ? p[y[i]] : 1.17549435e-38f));
	}
	st->samples += n;
	return 0;
}

int pbox_mlp_grad(struct pbox_mlp *m, const float *w, const float *x, const uint8_t *y, unsigned n,
		  float *g, struct pbox_mlp_stats *st)
{
	const struct pbox_mlp_layout *L = &m->lay;
	unsigned k = L->dims[L->nlayers];
	float *d = m->delta[0], *dprev = m->delta[1], *swap;
	int rc;

	memset(st, 0, sizeof(*st));
	memset(g, 0, L->nparams * sizeof(float));
	if (n > m->max_batch) {
		return -EINVAL;
	}
	if (n == 0) {
		return 0;
	}
	forward(m, w, x, n);
	rc = score(m, y, n, st);
	if (rc < 0) {
		return rc;
	}
	/* dLoss/dlogits of softmax cross-entropy: p - onehot(y). */
	for (unsigned i = 0; i < n; i++) {
		const float *p = m->act[L->nlayers] + (size_t)i * k;

		memcpy(d + (size_t)i * k, p, k * sizeof(float));
		d[(size_t)i * k + y[i]] -= 1.0f;
	}
	for (unsigned l = L->nlayers; l >= 1; l--) {
		const float *W = w + L->off[2 * (l - 1)];
		const float *in = l > 1 ? m->act[l - 1] : x;
		float *gW = g + L->off[2 * (l - 1)], *gb = g + L->off[2 * (l - 1) + 1];
		unsigned din = L->dims[l - 1], dout = L->dims[l];

		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)dout, (int)din, (int)n,
			    1.0f, d, (int)dout, in, (int)din, 0.0f, gW, (int)din);
		for (unsigned i = 0; i < n; i++) {
			const float *di = d + (size_t)i * dout;

			for (unsigned j = 0; j < dout; j++) {
				gb[j] += di[j];
			}
		}
		if (l == 1) {
			break;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)din, (int)dout,
			    1.0f, d, (int)dout, W, (int)din, 0.0f, dprev, (int)din);
		/* ReLU: no gradient where the unit was off (its stored output is 0). */
		for (size_t i = 0; i < (size_t)n * din; i++) {
			dprev[i] = in[i] > 0.0f ? dprev[i] : 0.0f;
		}
		swap = d;
		d = dprev;
		dprev = swap;
	}
	return 0;
}

int pbox_mlp_eval(struct pbox_mlp *m, const float *w, const float *x, const uint8_t *y, size_t n,
		  struct pbox_mlp_stats *st)
{
	size_t din = m->lay.dims[0];

	for (size_t i = 0; i < n; i += m->max_batch) {
		unsigned b = (unsigned)PBOX_MIN(n - i, (size_t)m->max_batch);
		int rc;

		forward(m, w, x + i * din, b);
		rc = score(m, y + i, b, st);
		if (rc < 0) {
			return rc;
		}
	}
	return 0;
}
