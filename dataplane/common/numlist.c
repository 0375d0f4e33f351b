/* SPDX-License-Identifier: BSD-3-Clause */
#include "numlist.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

int pbox_parse_u64_list(const char *s, uint64_t *out, unsigned max, uint64_t lo, uint64_t hi)
{
	unsigned n = 0;

	for (;;) {
		char *end;
		unsigned long long v;

		/* strtoull accepts leading blanks and a sign; an item must start with a digit. */
		if (!isdigit((unsigned char)*s) || n == max)
			return -EINVAL;
		errno = 0;
		v = strtoull(s, &end, 10);
		if (errno != 0 || v < lo || v > hi)
			return -EINVAL;
		out[n++] = v;
		if (*end == '\0')
			return (int)n;
		if (*end != ',')
			return -EINVAL;
		s = end + 1;
	}
}
