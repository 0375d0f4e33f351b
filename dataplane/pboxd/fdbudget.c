/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's file-descriptor budget (see fdbudget.h). */
#include "fdbudget.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/resource.h>

static uint64_t g_total; /* descriptors held by every class */
static uint64_t g_held[PBOXD_FD_CLASSES];
static uint64_t g_refused[PBOXD_FD_CLASSES];

static const char *const g_names[PBOXD_FD_CLASSES] = { "control", "shm", "metrics", "results" };

uint64_t pboxd_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
		return UINT64_MAX;
	}
	return (uint64_t)rl.rlim_cur;
}

uint32_t pboxd_fd_open_now(void)
{
	DIR *d = opendir("/proc/self/fd");
	uint32_t n = 0;

	if (d == NULL) {
		return 0;
	}
	while (readdir(d) != NULL) {
		n++;
	}
	closedir(d);
	return n > 3 ? n - 3 : 0; /* ".", ".." and the directory's own descriptor */
}

int pboxd_fd_take(enum pboxd_fd_class k, uint32_t n)
{
	uint64_t lim = pboxd_fd_limit();
	uint64_t need = (uint64_t)n + (k == PBOXD_FD_RESULTS ? PBOXD_FD_CONN_HEADROOM : 0);
	uint64_t cur = __atomic_load_n(&g_total, __ATOMIC_RELAXED);

	do {
		if (lim != UINT64_MAX &&
		    (lim <= PBOXD_FD_RESERVE || cur + need > lim - PBOXD_FD_RESERVE)) {
			__atomic_fetch_add(&g_refused[k], 1, __ATOMIC_RELAXED);
			return -EMFILE;
		}
	} while (!__atomic_compare_exchange_n(&g_total, &cur, cur + n, false, __ATOMIC_RELAXED,
					      __ATOMIC_RELAXED));
	__atomic_fetch_add(&g_held[k], n, __ATOMIC_RELAXED);
	return 0;
}

void pboxd_fd_give(enum pboxd_fd_class k, uint32_t n)
{
	__atomic_fetch_sub(&g_held[k], n, __ATOMIC_RELAXED);
	__atomic_fetch_sub(&g_total, n, __ATOMIC_RELAXED);
}

/* Free descriptors of the budget now (UINT64_MAX: no limit). */
static uint64_t budget_free(uint64_t lim)
{
	uint64_t total = __atomic_load_n(&g_total, __ATOMIC_RELAXED);

	if (lim == UINT64_MAX) {
		return UINT64_MAX;
	}
	return lim > PBOXD_FD_RESERVE + total ? lim - PBOXD_FD_RESERVE - total : 0;
}

const char *pboxd_fd_explain(char *buf, size_t len)
{
	uint64_t lim = pboxd_fd_limit();

	if (lim == UINT64_MAX) {
		snprintf(buf, len, "no open-file limit");
		return buf;
	}
	snprintf(buf, len,
		 "open-file limit %" PRIu64 ": %u reserved, control %" PRIu64 ", shm %" PRIu64
		 ", metrics %" PRIu64 ", results %" PRIu64 " held, %" PRIu64 " free",
		 lim, PBOXD_FD_RESERVE,
		 __atomic_load_n(&g_held[PBOXD_FD_CONTROL], __ATOMIC_RELAXED),
		 __atomic_load_n(&g_held[PBOXD_FD_SHM], __ATOMIC_RELAXED),
		 __atomic_load_n(&g_held[PBOXD_FD_METRICS], __ATOMIC_RELAXED),
		 __atomic_load_n(&g_held[PBOXD_FD_RESULTS], __ATOMIC_RELAXED), budget_free(lim));
	return buf;
}

json_t *pboxd_fd_stats(void)
{
	uint64_t lim = pboxd_fd_limit();
	json_t *o = json_object(), *held = json_object(), *refused = json_object();

	for (int k = 0; k < PBOXD_FD_CLASSES; k++) {
		json_object_set_new(
			held, g_names[k],
			json_integer((json_int_t)__atomic_load_n(&g_held[k], __ATOMIC_RELAXED)));
		json_object_set_new(
			refused, g_names[k],
			json_integer((json_int_t)__atomic_load_n(&g_refused[k], __ATOMIC_RELAXED)));
	}
	json_object_set_new(o, "limit", json_integer(lim == UINT64_MAX ? -1 : (json_int_t)lim));
	json_object_set_new(o, "reserve", json_integer(PBOXD_FD_RESERVE));
	json_object_set_new(o, "headroom", json_integer(PBOXD_FD_CONN_HEADROOM));
	json_object_set_new(o, "free",
			    json_integer(lim == UINT64_MAX ? -1 : (json_int_t)budget_free(lim)));
	json_object_set_new(o, "held", held);
	json_object_set_new(o, "refused", refused);
	return o;
}
