/* SPDX-License-Identifier: BSD-3-Clause */
/* Runtime choice of the kernel table by CPU features (see kernels.h). */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "kern_isa.h"

static bool isa_supported(const struct pbox_kernels *k)
{
	__builtin_cpu_init();
	if (k == &pbox_kern_table_avx512) {
		return __builtin_cpu_supports("avx512f");
	}
	if (k == &pbox_kern_table_avx2) {
		return __builtin_cpu_supports("avx2");
	}
	return true; /* sse2 is the x86-64 baseline; scalar runs anywhere */
}

static const struct pbox_kernels *const g_all[] = {
	&pbox_kern_table_avx512,
	&pbox_kern_table_avx2,
	&pbox_kern_table_sse2,
	&pbox_kern_table_scalar,
};

static const struct pbox_kernels *g_chosen;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const struct pbox_kernels *pbox_kernels_by_isa(const char *isa)
{
	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(g_all); i++) {
		if (strcmp(g_all[i]->isa, isa) == 0) {
			return isa_supported(g_all[i]) ? g_all[i] : NULL;
		}
	}
	return NULL;
}

unsigned pbox_kernels_supported(const struct pbox_kernels **out, unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(g_all) && n < max; i++) {
		if (isa_supported(g_all[i])) {
			out[n++] = g_all[i];
		}
	}
	return n;
}

static void choose(void)
{
	const char *want = getenv("PBOX_KERNEL_ISA");

	if (want != NULL && *want != '\0') {
		g_chosen = pbox_kernels_by_isa(want);
		if (g_chosen == NULL) {
			PBOX_LOG_WARN(KERNELS,
				      "PBOX_KERNEL_ISA=%s: unknown or not supported by this CPU "
				      "(avx512, avx2, sse2, scalar); using the widest supported",
				      want);
		}
	}
	if (g_chosen == NULL) {
		pbox_kernels_supported(&g_chosen, 1);
	}
}

const struct pbox_kernels *pbox_kernels_get(void)
{
	pthread_once(&g_once, choose);
	return g_chosen;
}
