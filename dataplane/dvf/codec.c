/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The compressors behind DVF blocks, one ops table each (see dvf.h): stored ("none"),
 * LZ4 (one level: LZ4_compress_fast with acceleration 1; LZ4 HC is slower than zstd and
 * not offered), zstd (levels 1..3), snappy, and ISA-L igzip (raw deflate, levels 0..3).
 *
 * Every decompressor writes at most `expect` bytes (lz4: expect + 1, see dvf_isa.h) and
 * tells a stream that decodes to more (a bomb) from a corrupt one and from a short one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <isa-l/igzip_lib.h>
#include <lz4.h>
#include <snappy-c.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "common/log.h"
#include "dvf_isa.h"

struct pbox_dvf_codec_ctx {
	void *lz4_state;
	ZSTD_CCtx *zc;
	ZSTD_DCtx *zd;
	struct isal_zstream gz;
	uint8_t *gz_level_buf;
	uint32_t gz_level_buf_len;
	struct inflate_state gi;
	uint8_t *stage; /* snappy's worst case, for outputs smaller than that */
	size_t stage_len;
};

/* ---- none --------------------------------------------------------------------------- */

static size_t none_bound(size_t len)
{
	return len;
}

static int none_compress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			 size_t cap, int level, size_t *out_len)
{
	(void)c;
	(void)level;
	if (len > cap) {
		return -ENOSPC;
	}
	memcpy(dst, src, len);
	*out_len = len;
	return 0;
}

static int none_decompress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			   size_t expect)
{
	(void)c;
	if (len > expect) {
		return PBOX_DVF_CODEC_BOMB;
	}
	if (len < expect) {
		return PBOX_DVF_CODEC_SHORT;
	}
	memcpy(dst, src, len);
	return 0;
}

/* ---- lz4 ---------------------------------------------------------------------------- */

static size_t lz4_bound(size_t len)
{
	return len > LZ4_MAX_INPUT_SIZE ? 0 : (size_t)LZ4_compressBound((int)len);
}

static int lz4_compress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			size_t cap, int level, size_t *out_len)
{
	int r;

	(void)level;
	if (len > LZ4_MAX_INPUT_SIZE) {
		return -EIO;
	}
	if (cap > INT32_MAX) {
		cap = INT32_MAX;
	}
	r = LZ4_compress_fast_extState(c->lz4_state, src, dst, (int)len, (int)cap, 1);
	if (r <= 0) {
		return -ENOSPC; /* LZ4 fails only when dst is too small */
	}
	*out_len = (size_t)r;
	return 0;
}

static int lz4_decompress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			  size_t expect)
{
	int r;

	(void)c;
	if (len > INT32_MAX || expect >= INT32_MAX) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	/* One byte more than expected, so that a stream longer than expect stops at
	 * expect + 1 (a bomb) instead of failing like a corrupt one. */
	r = LZ4_decompress_safe_partial(src, dst, (int)len, (int)expect + 1, (int)expect + 1);
	if (r < 0) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	if ((size_t)r > expect) {
		return PBOX_DVF_CODEC_BOMB;
	}
	if ((size_t)r < expect) {
		return PBOX_DVF_CODEC_SHORT;
	}
	/* partial decoding may stop early without reading the whole input: a full decode
	 * of exactly expect bytes also checks the rest of the stream. */
	r = LZ4_decompress_safe(src, dst, (int)len, (int)expect);
	return r == (int)expect ? 0 : PBOX_DVF_CODEC_CORRUPT;
}

/* ---- zstd --------------------------------------------------------------------------- */

static size_t zstd_bound(size_t len)
{
	return ZSTD_compressBound(len);
}

static int zstd_compress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			 size_t cap, int level, size_t *out_len)
{
	size_t r = ZSTD_compressCCtx(c->zc, dst, cap, src, len, level);

	if (ZSTD_isError(r)) {
		return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -ENOSPC : -EIO;
	}
	*out_len = r;
	return 0;
}

static int zstd_decompress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			   size_t expect)
{
	unsigned long long want = ZSTD_getFrameContentSize(src, len);
	size_t r;

	if (want == ZSTD_CONTENTSIZE_ERROR) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	if (want != ZSTD_CONTENTSIZE_UNKNOWN && want > expect) {
		return PBOX_DVF_CODEC_BOMB;
	}
	r = ZSTD_decompressDCtx(c->zd, dst, expect, src, len);
	if (ZSTD_isError(r)) {
		return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? PBOX_DVF_CODEC_BOMB
									   : PBOX_DVF_CODEC_CORRUPT;
	}
	return r == expect ? 0 : PBOX_DVF_CODEC_SHORT;
}

/* ---- snappy ------------------------------------------------------------------------- */

static size_t snappy_bound(size_t len)
{
	return snappy_max_compressed_length(len);
}

static int snappy_compress_(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			    size_t cap, int level, size_t *out_len)
{
	size_t bound = snappy_max_compressed_length(len), r = bound;

	(void)level;
	/* snappy needs room for the worst case: below that, compress into the staging
	 * buffer and copy what fits. */
	if (cap >= bound) {
		if (snappy_compress(src, len, dst, &r) != SNAPPY_OK) {
			return -EIO;
		}
	} else {
		if (bound > c->stage_len ||
		    snappy_compress(src, len, (char *)c->stage, &r) != SNAPPY_OK) {
			return -EIO;
		}
		if (r > cap) {
			return -ENOSPC;
		}
		memcpy(dst, c->stage, r);
	}
	*out_len = r;
	return 0;
}

static int snappy_decompress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			     size_t expect)
{
	size_t want, r = expect;

	(void)c;
	if (snappy_uncompressed_length(src, len, &want) != SNAPPY_OK) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	if (want > expect) {
		return PBOX_DVF_CODEC_BOMB;
	}
	if (want < expect) {
		return PBOX_DVF_CODEC_SHORT;
	}
	if (snappy_uncompress(src, len, dst, &r) != SNAPPY_OK || r != expect) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	return 0;
}

/* ---- ISA-L igzip (raw deflate) ------------------------------------------------------ */

/* Level buffer sizes: the library's defaults per level. */
static const uint32_t g_gz_level_buf[ISAL_DEF_MAX_LEVEL + 1] = {
	ISAL_DEF_LVL0_DEFAULT,
	ISAL_DEF_LVL1_DEFAULT,
	ISAL_DEF_LVL2_DEFAULT,
	ISAL_DEF_LVL3_DEFAULT,
};

static size_t igzip_bound(size_t len)
{
	/* Stored deflate blocks: 5 bytes per 64 KB block, plus the final block's header and
	 * slack for the Huffman tables igzip writes before deciding. */
	return len + 5 * (len / 65535 + 1) + 1024;
}

static int igzip_compress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			  size_t cap, int level, size_t *out_len)
{
	struct isal_zstream *z = &c->gz;
	int r;

	if (len > UINT32_MAX || level < 0 || level > ISAL_DEF_MAX_LEVEL) {
		return -EIO;
	}
	if (cap > UINT32_MAX) {
		cap = UINT32_MAX;
	}
	isal_deflate_stateless_init(z);
	z->level = (uint32_t)level;
	z->level_buf = c->gz_level_buf;
	z->level_buf_size = g_gz_level_buf[level];
	z->next_in = (uint8_t *)(uintptr_t)src;
	z->avail_in = (uint32_t)len;
	z->next_out = dst;
	z->avail_out = (uint32_t)cap;
	z->end_of_stream = 1;
	z->flush = NO_FLUSH;
	z->gzip_flag = IGZIP_DEFLATE;
	r = isal_deflate_stateless(z);
	if (r == STATELESS_OVERFLOW) {
		return -ENOSPC;
	}
	if (r != COMP_OK) {
		return -EIO;
	}
	*out_len = z->total_out;
	return 0;
}

static int igzip_decompress(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			    size_t expect)
{
	struct inflate_state *st = &c->gi;
	uint8_t extra;
	int r;

	if (len > UINT32_MAX || expect > UINT32_MAX) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	isal_inflate_init(st);
	st->crc_flag = ISAL_DEFLATE;
	st->next_in = (uint8_t *)(uintptr_t)src;
	st->avail_in = (uint32_t)len;
	st->next_out = dst;
	st->avail_out = (uint32_t)expect;
	r = isal_inflate(st);
	if (r < 0) {
		return PBOX_DVF_CODEC_CORRUPT;
	}
	if (st->block_state != ISAL_BLOCK_FINISH) {
		if (st->avail_out != 0) {
			return st->avail_in == 0 ? PBOX_DVF_CODEC_SHORT : PBOX_DVF_CODEC_CORRUPT;
		}
		/* The output is full and the stream goes on: one more byte tells a bomb
		 * (more output) from a stream that merely ends late. */
		st->next_out = &extra;
		st->avail_out = 1;
		r = isal_inflate(st);
		if (r >= 0 && st->avail_out == 0) {
			return PBOX_DVF_CODEC_BOMB;
		}
		if (r < 0 || st->block_state != ISAL_BLOCK_FINISH) {
			return PBOX_DVF_CODEC_CORRUPT;
		}
	}
	if (st->avail_in != 0) {
		return PBOX_DVF_CODEC_CORRUPT; /* trailing bytes after the final block */
	}
	return st->total_out == expect ? 0 : PBOX_DVF_CODEC_SHORT;
}

/* ---- tables ------------------------------------------------------------------------- */

static const struct pbox_dvf_codec_ops g_codecs[PBOX_DVF_CODEC_COUNT] = {
	[PBOX_DVF_CODEC_NONE] = {
		.name = "none",
		.id = PBOX_DVF_CODEC_NONE,
		.level_min = 0,
		.level_max = 0,
		.level_default = 0,
		.bound = none_bound,
		.compress = none_compress,
		.decompress = none_decompress,
	},
	[PBOX_DVF_CODEC_LZ4] = {
		.name = "lz4",
		.id = PBOX_DVF_CODEC_LZ4,
		.level_min = 1,
		.level_max = 1,
		.level_default = 1,
		.bound = lz4_bound,
		.compress = lz4_compress,
		.decompress = lz4_decompress,
	},
	[PBOX_DVF_CODEC_ZSTD] = {
		.name = "zstd",
		.id = PBOX_DVF_CODEC_ZSTD,
		.level_min = 1,
		.level_max = 3,
		.level_default = 1,
		.bound = zstd_bound,
		.compress = zstd_compress,
		.decompress = zstd_decompress,
	},
	[PBOX_DVF_CODEC_SNAPPY] = {
		.name = "snappy",
		.id = PBOX_DVF_CODEC_SNAPPY,
		.level_min = 0,
		.level_max = 0,
		.level_default = 0,
		.bound = snappy_bound,
		.compress = snappy_compress_,
		.decompress = snappy_decompress,
	},
	[PBOX_DVF_CODEC_IGZIP] = {
		.name = "igzip",
		.id = PBOX_DVF_CODEC_IGZIP,
		.level_min = 0,
		.level_max = ISAL_DEF_MAX_LEVEL,
		.level_default = 1,
		.bound = igzip_bound,
		.compress = igzip_compress,
		.decompress = igzip_decompress,
	},
};

const struct pbox_dvf_codec_ops *pbox_dvf_codec_by_id(unsigned id)
{
	return id < PBOX_DVF_CODEC_COUNT ? &g_codecs[id] : NULL;
}

const struct pbox_dvf_codec_ops *pbox_dvf_codec_find(const char *name)
{
	for (unsigned i = 0; i < PBOX_DVF_CODEC_COUNT; i++) {
		if (strcmp(g_codecs[i].name, name) == 0) {
			return &g_codecs[i];
		}
	}
	return NULL;
}

const char *pbox_dvf_codec_names(void)
{
	return "none, lz4, zstd (zstd:1..3), snappy, igzip (igzip:0..3)";
}

int pbox_dvf_codec_parse(const char *spec, const struct pbox_dvf_codec_ops **ops, int *level)
{
	const char *colon = strchr(spec, ':');
	char name[16];
	size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
	const struct pbox_dvf_codec_ops *o;
	long lv;

	if (len == 0 || len >= sizeof(name)) {
		return -EINVAL;
	}
	memcpy(name, spec, len);
	name[len] = '\0';
	o = pbox_dvf_codec_find(name);
	if (o == NULL) {
		return -EINVAL;
	}
	lv = o->level_default;
	if (colon != NULL) {
		char *end;

		errno = 0;
		lv = strtol(colon + 1, &end, 10);
		if (errno != 0 || end == colon + 1 || *end != '\0' || lv < o->level_min ||
		    lv > o->level_max) {
			return -EINVAL;
		}
	}
	*ops = o;
	*level = (int)lv;
	return 0;
}

struct pbox_dvf_codec_ctx *pbox_dvf_codec_ctx_new(size_t max_raw)
{
	struct pbox_dvf_codec_ctx *c = calloc(1, sizeof(*c));
	uint32_t lb = 0;

	if (c == NULL) {
		PBOX_LOG_ERR(KERNELS, "dvf codec context: out of memory");
		return NULL;
	}
	for (unsigned i = 0; i <= ISAL_DEF_MAX_LEVEL; i++) {
		lb = g_gz_level_buf[i] > lb ? g_gz_level_buf[i] : lb;
	}
	c->lz4_state = malloc((size_t)LZ4_sizeofState());
	c->zc = ZSTD_createCCtx();
	c->zd = ZSTD_createDCtx();
	c->gz_level_buf = malloc(lb);
	c->gz_level_buf_len = lb;
	c->stage_len = snappy_max_compressed_length(max_raw);
	c->stage = malloc(c->stage_len);
	if (c->lz4_state == NULL || c->zc == NULL || c->zd == NULL || c->gz_level_buf == NULL ||
	    c->stage == NULL) {
		PBOX_LOG_ERR(KERNELS, "dvf codec context: cannot make the lz4/zstd/igzip state "
				      "(out of memory)");
		pbox_dvf_codec_ctx_free(c);
		return NULL;
	}
	return c;
}

void pbox_dvf_codec_ctx_free(struct pbox_dvf_codec_ctx *c)
{
	if (c == NULL) {
		return;
	}
	free(c->lz4_state);
	ZSTD_freeCCtx(c->zc);
	ZSTD_freeDCtx(c->zd);
	free(c->gz_level_buf);
	free(c->stage);
	free(c);
}
