/* SPDX-License-Identifier: BSD-3-Clause */
/* DVF thresholds and the run-time choice of the DVF kernel table (see dvf.h). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "dvf_isa.h"
#include "kernels/kernels.h"

int pbox_dvf_params_check(const struct pbox_dvf_params *p)
{
	if (!isfinite(p->delta_low) || !isfinite(p->delta_up) || p->delta_low < 0.0f ||
	    p->delta_low > p->delta_up) {
		return -EINVAL;
	}
	return 0;
}

float pbox_dvf_threshold(const struct pbox_dvf_params *p, enum pbox_dvf_link link, uint64_t t)
{
	double sel = link == PBOX_DVF_LINK_SUFFICIENT ? p->delta_low : p->delta_up;

	return (float)(sel / sqrt((double)t + 1.0));
}

/* The const per-ISA tables completed with the add kernel of the same ISA (sse2's for
 * scalar's if the scalar add is not supported: it always is). */
static struct pbox_dvf_kernels g_tables[3];
static unsigned g_ntables;
static const struct pbox_dvf_kernels *g_chosen;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool isa_supported(const struct pbox_dvf_kernels *k)
{
	__builtin_cpu_init();
	if (k == &pbox_dvf_table_avx512) {
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt");
	}
	if (k == &pbox_dvf_table_avx2) {
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
	}
	return true;
}

static void init(void)
{
	static const struct pbox_dvf_kernels *const all[] = {
		&pbox_dvf_table_avx512,
		&pbox_dvf_table_avx2,
		&pbox_dvf_table_scalar,
	};
	const char *want = pbox_kernels_get()->isa;

	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(all); i++) {
		const struct pbox_kernels *add = pbox_kernels_by_isa(all[i]->isa);

		if (!isa_supported(all[i]) || add == NULL) {
			continue;
		}
		g_tables[g_ntables] = *all[i];
		g_tables[g_ntables].add = add->add;
		g_ntables++;
	}
	/* The add kernels' choice (PBOX_KERNEL_ISA included), or the widest below it. */
	for (unsigned i = 0; i < g_ntables && g_chosen == NULL; i++) {
		if (strcmp(g_tables[i].isa, want) == 0) {
			g_chosen = &g_tables[i];
		}
	}
	if (g_chosen == NULL) {
		g_chosen = &g_tables[g_ntables - 1]; /* scalar: always there */
		if (strcmp(want, "sse2") != 0) {
			PBOX_LOG_WARN(KERNELS, "dvf: no %s kernels; using %s", want, g_chosen->isa);
		}
	}
}

const struct pbox_dvf_kernels *pbox_dvf_kernels_get(void)
{
	pthread_once(&g_once, init);
	return g_chosen;
}

const struct pbox_dvf_kernels *pbox_dvf_kernels_by_isa(const char *isa)
{
	pthread_once(&g_once, init);
	for (unsigned i = 0; i < g_ntables; i++) {
		if (strcmp(g_tables[i].isa, isa) == 0) {
			return &g_tables[i];
		}
	}
	return NULL;
}

unsigned pbox_dvf_kernels_supported(const struct pbox_dvf_kernels **out, unsigned max)
{
	unsigned n = 0;

	pthread_once(&g_once, init);
	for (unsigned i = 0; i < g_ntables && n < max; i++) {
		out[n++] = &g_tables[i];
	}
	return n;
}
