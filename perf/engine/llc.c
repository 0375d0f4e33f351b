/* SPDX-License-Identifier: BSD-3-Clause */
/* The last-level cache size from sysfs (see llc.h). */
#include "llc.h"

#include <stdio.h>

/* One sysfs value of cache index i ("level" or "size"); 0 if unreadable. */
static uint64_t cache_attr(unsigned i, const char *what, int *found)
{
	char path[96], unit = 0;
	unsigned long long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%u/%s", i, what);
	f = fopen(path, "r");
	*found = f != NULL;
	if (f == NULL) {
		return 0;
	}
	if (fscanf(f, "%llu%c", &v, &unit) < 1) {
		v = 0;
	}
	fclose(f);
	return v * (unit == 'K' ? 1024ull : unit == 'M' ? 1048576ull : 1ull);
}

uint64_t pbox_bench_llc_bytes(void)
{
	uint64_t best = 0, best_level = 0;

	for (unsigned i = 0; i < 16; i++) {
		int found;
		uint64_t level = cache_attr(i, "level", &found), size;

		if (!found) {
			break;
		}
		size = cache_attr(i, "size", &found);
		if (level > best_level || (level == best_level && size > best)) {
			best_level = level;
			best = size;
		}
	}
	return best;
}
