/* SPDX-License-Identifier: BSD-3-Clause */
/* Bounded lists of ascending integers as ranges (ranges.h). */
#include "ranges.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ",4294967295-4294967295" is 22 bytes; the suffix " (+18446744073709551615 more)" 30. */
#define RANGE_BYTES  24u
#define SUFFIX_BYTES 48u

int pbox_ranges_init(struct pbox_ranges *r, uint32_t max)
{
	memset(r, 0, sizeof(*r));
	r->max = max ? max : 1;
	r->cap = (size_t)r->max * RANGE_BYTES + SUFFIX_BYTES;
	r->buf = malloc(r->cap);
	if (r->buf == NULL) {
		return -ENOMEM;
	}
	r->buf[0] = '\0';
	return 0;
}

void pbox_ranges_free(struct pbox_ranges *r)
{
	free(r->buf);
	r->buf = NULL;
}

static void flush(struct pbox_ranges *r)
{
	if (!r->have) {
		return;
	}
	if (r->nranges < r->max) {
		int n = r->lo == r->hi ? snprintf(r->buf + r->len, r->cap - r->len, "%s%u",
						  r->len ? "," : "", r->lo)
				       : snprintf(r->buf + r->len, r->cap - r->len, "%s%u-%u",
						  r->len ? "," : "", r->lo, r->hi);

		r->len += (size_t)n;
		r->nranges++;
	} else {
		r->omitted += (uint64_t)r->hi - r->lo + 1;
	}
	r->have = false;
}

void pbox_ranges_add(struct pbox_ranges *r, uint32_t v)
{
	if (r->have && v <= r->hi) {
		return;
	}
	if (r->have && v == r->hi + 1) {
		r->hi = v;
		return;
	}
	flush(r);
	r->have = true;
	r->lo = r->hi = v;
}

const char *pbox_ranges_str(struct pbox_ranges *r)
{
	flush(r);
	r->buf[r->len] = '\0';
	if (r->omitted != 0) {
		snprintf(r->buf + r->len, r->cap - r->len, " (+%" PRIu64 " more)", r->omitted);
	}
	return r->buf;
}
