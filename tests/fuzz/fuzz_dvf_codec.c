/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the decompressors behind DVF blocks (dataplane/dvf/codec.c: none, lz4,
 * zstd, snappy, igzip), each called directly with untrusted streams.
 *
 * Input grammar: codec id (byte % 5), mode byte, u32 expected length (below 256 KB),
 * then the rest:
 *  - mode & 1 == 0, raw: the rest is a compressed stream, decompressed into a heap
 *    buffer of exactly expect + 1 bytes (the one spare byte the lz4 path may use);
 *  - mode & 1 == 1, round trip: the rest (if not empty) is compressed at a level chosen by
 *    the mode byte, decompressed with its true length (must give it back), with one byte
 *    less (must be a bomb) and one more (must be short); then byte mutations chosen by
 *    the following input are applied to the stream and it is decompressed again.
 *
 * Invariants beyond the sanitizers: the result is 0 or one of the codec results of dvf.h;
 * the round trip is exact; the bounds are reported as bomb and short.
 */
#include <errno.h>

#include "common/log.h"
#include "dvf/dvf.h"
#include "fuzz.h"
#include "harness.h"

#define MAXLEN (256u * 1024)

static struct pbox_dvf_scratch *g_s;

static int decompress(const struct pbox_dvf_codec_ops *ops, const uint8_t *src, size_t len,
		      size_t expect, uint8_t *out)
{
	uint8_t *dst = malloc(expect + 1);
	int r;

	FUZZ_CHECK(dst != NULL, "no memory");
	r = ops->decompress(pbox_dvf_scratch_codec(g_s), src, len, dst, expect);
	if (getenv("PBOX_FUZZ_VERBOSE") != NULL) {
		fprintf(stderr, "fuzz_dvf_codec: %s, %zu bytes into %zu: %d\n", ops->name, len,
			expect, r);
	}
	FUZZ_CHECK(r == 0 || r == PBOX_DVF_CODEC_CORRUPT || r == PBOX_DVF_CODEC_BOMB ||
			   r == PBOX_DVF_CODEC_SHORT,
		   "%s decompress returned %d", ops->name, r);
	if (r == 0 && out != NULL) {
		memcpy(out, dst, expect);
	}
	free(dst);
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct pbox_dvf_codec_ops *ops;
	struct fz f;
	uint8_t mode;
	uint32_t expect;
	const uint8_t *rest;
	size_t len;

	if (g_s == NULL) {
		pbox_log_set_sink(pbox_test_log_silent, NULL);
		g_s = pbox_dvf_scratch_new(MAXLEN / 4 + 1);
		FUZZ_CHECK(g_s != NULL, "no scratch");
	}
	fz_init(&f, data, size);
	ops = pbox_dvf_codec_by_id(fz_u8(&f) % PBOX_DVF_CODEC_COUNT);
	mode = fz_u8(&f);
	expect = fz_u32(&f) % MAXLEN;
	if ((mode & 1) == 0) {
		uint8_t *buf;

		rest = fz_rest(&f, &len);
		buf = malloc(len ? len : 1);
		FUZZ_CHECK(buf != NULL, "no memory");
		memcpy(buf, rest, len);
		decompress(ops, buf, len, expect, NULL);
		free(buf);
		return 0;
	}
	/* round trip of at most expect bytes of the input, then mutations */
	{
		int span = ops->level_max - ops->level_min + 1;
		int level = ops->level_min + (mode >> 1) % span;
		size_t n = f.n < expect ? f.n : expect, cap, clen = 0;
		uint8_t *src, *comp, *back;
		uint32_t nmut;

		if (n == 0) {
			return 0;
		}
		src = malloc(n);
		back = malloc(n);
		cap = ops->bound(n);
		comp = malloc(cap);
		FUZZ_CHECK(src != NULL && back != NULL && comp != NULL, "no memory");
		fz_bytes(&f, src, n);
		FUZZ_CHECK(ops->compress(pbox_dvf_scratch_codec(g_s), src, n, comp, cap, level,
					 &clen) == 0,
			   "%s compress of %zu bytes failed", ops->name, n);
		FUZZ_CHECK(decompress(ops, comp, clen, n, back) == 0 && memcmp(src, back, n) == 0,
			   "%s round trip of %zu bytes", ops->name, n);
		FUZZ_CHECK(decompress(ops, comp, clen, n - 1, NULL) == PBOX_DVF_CODEC_BOMB,
			   "%s: %zu bytes into %zu not a bomb", ops->name, n, n - 1);
		FUZZ_CHECK(decompress(ops, comp, clen, n + 1, NULL) == PBOX_DVF_CODEC_SHORT,
			   "%s: %zu bytes into %zu not short", ops->name, n, n + 1);
		nmut = fz_below(&f, 9);
		for (uint32_t m = 0; m < nmut; m++) {
			comp[fz_u32(&f) % clen] ^= fz_u8(&f);
		}
		if (nmut > 0) {
			decompress(ops, comp, clen, n, NULL);
		}
		free(src);
		free(back);
		free(comp);
	}
	return 0;
}
