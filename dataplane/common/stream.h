/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A copy with non-temporal stores, for data written into a buffer far larger than the
 * caches that is read only later (a result fragment into the caller's gradient-sized
 * buffer): an ordinary copy first reads every destination line it is about to overwrite
 * (the cache's read-for-ownership), streaming stores do not. The destination is aligned
 * to 16 bytes with an ordinary copy of the head; the tail under 64 bytes is copied
 * ordinarily too. The caller issues _mm_sfence() before another thread may read the bytes
 * (one fence after a batch of copies is enough). Used by libpbox's result copy and by
 * pbox-shm-bound, so that the bound streams exactly as libpbox does.
 *
 * Thread safety: none needed (pure function of its arguments).
 */
#ifndef PBOX_COMMON_STREAM_H
#define PBOX_COMMON_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

static inline void pbox_copy_stream(void *dst, const void *src, size_t len)
{
#ifndef __SSE2__
	memcpy(dst, src, len); /* no streaming stores on this target */
#else
	uint8_t *to = dst;
	const uint8_t *from = src;
	size_t head = (size_t)(-(uintptr_t)to & 15u);

	head = head < len ? head : len;
	memcpy(to, from, head);
	to += head;
	from += head;
	len -= head;
	for (; len >= 64; len -= 64, to += 64, from += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)from);
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(from + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(from + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(const void *)(from + 48));

		_mm_stream_si128((__m128i *)(void *)to, a);
		_mm_stream_si128((__m128i *)(void *)(to + 16), b);
		_mm_stream_si128((__m128i *)(void *)(to + 32), c);
		_mm_stream_si128((__m128i *)(void *)(to + 48), d);
	}
	memcpy(to, from, len);
#endif
}

#endif /* PBOX_COMMON_STREAM_H */
