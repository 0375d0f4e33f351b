/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared by the fuzz harnesses (tests/fuzz/fuzz_*.c): the libFuzzer entry point and a
 * reader that turns the fuzzer's bytes into structured choices.
 *
 * Every harness is one LLVMFuzzerTestOneInput. It is linked either with libFuzzer
 * (-fsanitize=fuzzer: the fuzz build, clang only) or with driver.c, a main that feeds it
 * each file of a corpus once (the replay tests of the normal gcc and ASan builds).
 *
 * The reader never fails: once the input is exhausted every read returns zeros, so a
 * harness is a total function of its input (the same bytes always do the same thing,
 * which makes every crash reproducible from its input file alone).
 *
 * Thread safety: single-threaded, like libFuzzer's callbacks.
 */
#ifndef PBOX_FUZZ_H
#define PBOX_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The libFuzzer entry point every harness defines. Returns 0 (libFuzzer reserves other
 * values). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A harness's own invariant failed: report and abort, which the fuzzer (and the replay
 * driver) count as a crash. */
#define FUZZ_CHECK(cond, ...)                                                                \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, \
				#cond);                                                      \
			fprintf(stderr, __VA_ARGS__);                                        \
			fputc('\n', stderr);                                                 \
			abort();                                                             \
		}                                                                            \
	} while (0)

struct fz {
	const uint8_t *p;
	size_t n;
};

static inline void fz_init(struct fz *f, const uint8_t *data, size_t size)
{
	f->p = data;
	f->n = size;
}

static inline bool fz_empty(const struct fz *f)
{
	return f->n == 0;
}

static inline uint8_t fz_u8(struct fz *f)
{
	if (f->n == 0) {
		return 0;
	}
	f->n--;
	return *f->p++;
}

static inline uint16_t fz_u16(struct fz *f)
{
	uint16_t lo = fz_u8(f);

	return (uint16_t)(lo | (uint16_t)(fz_u8(f) << 8));
}

static inline uint32_t fz_u32(struct fz *f)
{
	uint32_t lo = fz_u16(f);

	return lo | ((uint32_t)fz_u16(f) << 16);
}

static inline uint64_t fz_u64(struct fz *f)
{
	uint64_t lo = fz_u32(f);

	return lo | ((uint64_t)fz_u32(f) << 32);
}

static inline bool fz_bool(struct fz *f)
{
	return (fz_u8(f) & 1) != 0;
}

/* A value in [0, n) (n > 0) from one byte: small ranges stay cheap to mutate. */
static inline uint32_t fz_below(struct fz *f, uint32_t n)
{
	return n <= 256 ? fz_u8(f) % n : fz_u32(f) % n;
}

/* Copy up to len bytes into dst; the rest of dst is left as it is. Returns bytes copied. */
static inline size_t fz_bytes(struct fz *f, void *dst, size_t len)
{
	size_t k = len < f->n ? len : f->n;

	memcpy(dst, f->p, k);
	f->p += k;
	f->n -= k;
	return k;
}

/* Overwrite 1..4 bytes of buf[0, len) (len > 0), where and with what the input says. */
static inline void fz_scribble(struct fz *f, uint8_t *buf, uint32_t len)
{
	for (unsigned k = 1 + fz_below(f, 4); k > 0; k--) {
		/* Two statements: the order of the reads must not depend on the compiler (a
		 * crash found by clang must replay under gcc). */
		uint32_t at = fz_below(f, len);

		buf[at] = fz_u8(f);
	}
}

/* Everything left, as a view (len may be 0). */
static inline const uint8_t *fz_rest(struct fz *f, size_t *len)
{
	const uint8_t *p = f->p;

	*len = f->n;
	f->p += f->n;
	f->n = 0;
	return p;
}

#endif /* PBOX_FUZZ_H */
