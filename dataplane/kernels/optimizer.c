/* SPDX-License-Identifier: BSD-3-Clause */
/* The optimizer ops table: per-step scalars and the kernel of each optimizer. */
#include <math.h>
#include <string.h>

#include "../common/compiler.h"
#include "kernels.h"

static void prepare_none(const struct pbox_opt_params *p, uint64_t t, struct pbox_opt_step *st)
{
	(void)p;
	(void)t;
	memset(st, 0, sizeof(*st));
}

/* Bias corrections in double, rounded once to float, as PyTorch computes them. */
static void prepare_adam(const struct pbox_opt_params *p, uint64_t t, struct pbox_opt_step *st)
{
	double bc1 = 1.0 - pow((double)p->beta1, (double)t);
	double bc2 = 1.0 - pow((double)p->beta2, (double)t);

	st->step_size = (float)((double)p->lr / bc1);
	st->bc2_sqrt = (float)sqrt(bc2);
	st->decay = 1.0f - p->lr * p->wd;
}

static pbox_kern_step_fn k_sgd(const struct pbox_kernels *k)
{
	return k->sgd;
}
static pbox_kern_step_fn k_momentum(const struct pbox_kernels *k)
{
	return k->momentum;
}
static pbox_kern_step_fn k_nag(const struct pbox_kernels *k)
{
	return k->nag;
}
static pbox_kern_step_fn k_adam(const struct pbox_kernels *k)
{
	return k->adam;
}
static pbox_kern_step_fn k_adamw(const struct pbox_kernels *k)
{
	return k->adamw;
}

static const struct pbox_optimizer_ops g_optimizers[] = {
	{ .name = "sgd", .nstate = 0, .prepare = prepare_none, .kernel = k_sgd },
	{ .name = "momentum", .nstate = 1, .prepare = prepare_none, .kernel = k_momentum },
	{ .name = "nag", .nstate = 1, .prepare = prepare_none, .kernel = k_nag },
	{ .name = "adam", .nstate = 2, .prepare = prepare_adam, .kernel = k_adam },
	{ .name = "adamw", .nstate = 2, .prepare = prepare_adam, .kernel = k_adamw },
};

const struct pbox_optimizer_ops *pbox_optimizer_find(const char *name)
{
	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(g_optimizers); i++) {
		if (strcmp(g_optimizers[i].name, name) == 0) {
			return &g_optimizers[i];
		}
	}
	return NULL;
}

const char *pbox_optimizer_names(void)
{
	return "sgd, momentum, nag, adam, adamw";
}

void pbox_opt_params_default(struct pbox_opt_params *p)
{
	*p = (struct pbox_opt_params){
		.lr = 0.01f,
		.momentum = 0.9f,
		.wd = 0.0f,
		.rescale = 1.0f,
		.clip = 0.0f,
		.beta1 = 0.9f,
		.beta2 = 0.999f,
		.eps = 1e-8f,
	};
}

void pbox_optimizer_step(const struct pbox_optimizer_ops *ops, const struct pbox_kernels *k,
			 float *w, float *m, float *v, const float *const *src, unsigned nsrc,
			 size_t n, const struct pbox_opt_params *p, uint64_t t)
{
	struct pbox_opt_step st;

	ops->prepare(p, t, &st);
	ops->kernel(k)(w, w, m, v, src, nsrc, n, p, &st);
}
