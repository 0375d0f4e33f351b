/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A bounded, human-readable list of ascending integers: "0-11,14,20-31 (+5 more)". At most
 * `max` ranges are written; the values of the ranges past it are counted in the "(+N
 * more)" suffix, so the text of a list of millions of chunk ids stays short
 * (pbox status: waiting chunks, missing ranks).
 *
 * Thread safety: a list belongs to one thread.
 */
#ifndef PBOX_RANGES_H
#define PBOX_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pbox_ranges {
	char *buf;
	size_t len, cap;
	uint32_t max, nranges;
	uint64_t omitted; /* values in ranges past max */
	bool have;        /* lo..hi is open */
	uint32_t lo, hi;
};

/* An empty list writing at most max (>= 1) ranges. 0 or -ENOMEM. */
int pbox_ranges_init(struct pbox_ranges *r, uint32_t max);
void pbox_ranges_free(struct pbox_ranges *r);

/* Add v, greater than every value added before (a smaller or equal one is ignored). */
void pbox_ranges_add(struct pbox_ranges *r, uint32_t v);

/* The text (owned by r; valid until the next add or free). "" for an empty list. */
const char *pbox_ranges_str(struct pbox_ranges *r);

#endif /* PBOX_RANGES_H */
