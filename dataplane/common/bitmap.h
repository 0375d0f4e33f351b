/* SPDX-License-Identifier: BSD-3-Clause */
/* Fixed-size bitmaps over uint64_t words (fragments received, ranks done). Header only. */
#ifndef PBOX_BITMAP_H
#define PBOX_BITMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline size_t pbox_bitmap_words(size_t nbits)
{
	return (nbits + 63) / 64;
}

static inline bool pbox_bit_test(const uint64_t *b, uint32_t i)
{
	return (b[i / 64] >> (i % 64)) & 1;
}

static inline void pbox_bit_set(uint64_t *b, uint32_t i)
{
	b[i / 64] |= UINT64_C(1) << (i % 64);
}

static inline void pbox_bit_clear(uint64_t *b, uint32_t i)
{
	b[i / 64] &= ~(UINT64_C(1) << (i % 64));
}

static inline void pbox_bitmap_zero(uint64_t *b, size_t nbits)
{
	memset(b, 0, pbox_bitmap_words(nbits) * sizeof(uint64_t));
}

/* Index of the first set bit at or after i, or nbits if none. */
static inline uint32_t pbox_bit_next(const uint64_t *b, uint32_t i, uint32_t nbits)
{
	while (i < nbits) {
		uint64_t w = b[i / 64] >> (i % 64);

		if (w != 0) {
			i += (uint32_t)__builtin_ctzll(w);
			return i < nbits ? i : nbits;
		}
		i = (i / 64 + 1) * 64;
	}
	return nbits;
}

#define PBOX_BIT_FOREACH(i, b, nbits)                             \
	for ((i) = pbox_bit_next((b), 0, (nbits)); (i) < (nbits); \
	     (i) = pbox_bit_next((b), (i) + 1, (nbits)))

#endif /* PBOX_BITMAP_H */
