/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF blocks: filter + encode (sparse or dense, then a codec) and the strict decoder with
 * the add into an accumulator (see dvf.h for the format and the contract).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "dvf_isa.h"

struct pbox_dvf_scratch {
	uint32_t cap;
	float *dense;    /* cap: the filtered block (unsent elements +0) */
	float *vals;     /* cap: sent or decoded values */
	uint32_t *idx;   /* cap: their indexes */
	uint8_t *raw;    /* 4 cap + 1: the payload before compression / after decompression */
	uint8_t *bitmap; /* ceil(cap / 8): the presence bits of the filtered block */
	struct pbox_dvf_codec_ctx *codec;
};

static void *alloc64(size_t len)
{
	void *p = NULL;

	return posix_memalign(&p, 64, PBOX_ALIGN_UP(len, 64)) == 0 ? p : NULL;
}

struct pbox_dvf_scratch *pbox_dvf_scratch_new(uint32_t cap)
{
	struct pbox_dvf_scratch *s;

	if (cap == 0 || cap > PBOX_DVF_MAX_BLOCK) {
		PBOX_LOG_ERR(KERNELS, "dvf scratch: block capacity %u outside 1..%u", cap,
			     PBOX_DVF_MAX_BLOCK);
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL) {
		PBOX_LOG_ERR(KERNELS, "dvf scratch of %u elements: out of memory", cap);
		return NULL;
	}
	s->cap = cap;
	s->dense = alloc64((size_t)cap * sizeof(float));
	s->vals = alloc64((size_t)cap * sizeof(float));
	s->idx = alloc64((size_t)cap * sizeof(uint32_t));
	s->raw = alloc64((size_t)cap * 4 + 1);
	s->bitmap = alloc64((size_t)cap / 8 + 1);
	if (s->dense == NULL || s->vals == NULL || s->idx == NULL || s->raw == NULL ||
	    s->bitmap == NULL) {
		PBOX_LOG_ERR(KERNELS, "dvf scratch of %u elements: out of memory", cap);
		pbox_dvf_scratch_free(s);
		return NULL;
	}
	s->codec = pbox_dvf_codec_ctx_new((size_t)cap * 4);
	if (s->codec == NULL) {
		pbox_dvf_scratch_free(s);
		return NULL;
	}
	return s;
}

void pbox_dvf_scratch_free(struct pbox_dvf_scratch *s)
{
	if (s == NULL) {
		return;
	}
	free(s->dense);
	free(s->vals);
	free(s->idx);
	free(s->raw);
	free(s->bitmap);
	pbox_dvf_codec_ctx_free(s->codec);
	free(s);
}

uint32_t pbox_dvf_scratch_cap(const struct pbox_dvf_scratch *s)
{
	return s->cap;
}

struct pbox_dvf_codec_ctx *pbox_dvf_scratch_codec(struct pbox_dvf_scratch *s)
{
	return s->codec;
}

size_t pbox_dvf_block_bound(uint32_t n)
{
	return PBOX_DVF_HDR_LEN + (size_t)n * 4;
}

/* ---- settings ----------------------------------------------------------------------- */

void pbox_dvf_enc_cfg_default(struct pbox_dvf_enc_cfg *cfg)
{
	/* snappy: of the codecs of perf/dvf/README.md, on the demo's and ResNet-50's
	 * gradients, the fastest to encode and decode the values + bitmap blocks of
	 * sparsity 0.5-0.8 (lz4 was 1-2.5x slower for the same ratio; zstd:1 gains 10-15 %
	 * ratio at a quarter of the speed) and as fast as lz4 on sparse blocks. */
	cfg->codec = pbox_dvf_codec_find("snappy");
	cfg->level = cfg->codec->level_default;
	cfg->sparse_permille = 800;
	cfg->idx_mode = PBOX_DVF_IDX_AUTO;
	cfg->dense_bitmap = true;
}

int pbox_dvf_enc_cfg_check(const struct pbox_dvf_enc_cfg *cfg)
{
	if (cfg->codec != NULL &&
	    (pbox_dvf_codec_by_id(cfg->codec->id) != cfg->codec ||
	     cfg->level < cfg->codec->level_min || cfg->level > cfg->codec->level_max)) {
		return -EINVAL;
	}
	if (cfg->sparse_permille < 500 || cfg->sparse_permille > 1000) {
		return -EINVAL;
	}
	if (cfg->idx_mode != PBOX_DVF_IDX_AUTO && cfg->idx_mode != PBOX_DVF_IDX_VARINT &&
	    cfg->idx_mode != PBOX_DVF_IDX_BITPACK) {
		return -EINVAL;
	}
	return 0;
}

/* ---- index codings ------------------------------------------------------------------ */

/* Bits of an index below n (n >= 1): the width of n - 1, at least 1. */
static unsigned idx_width(uint32_t n)
{
	return n <= 2 ? 1 : 32 - (unsigned)__builtin_clz(n - 1);
}

static size_t bitpack_len(size_t cnt, unsigned w)
{
	return (cnt * w + 7) / 8;
}

static size_t bitpack_put(uint8_t *p, const uint32_t *idx, size_t cnt, unsigned w)
{
	uint64_t acc = 0;
	unsigned bits = 0;
	size_t o = 0;

	for (size_t k = 0; k < cnt; k++) {
		acc |= (uint64_t)idx[k] << bits;
		bits += w;
		while (bits >= 8) {
			p[o++] = (uint8_t)acc;
			acc >>= 8;
			bits -= 8;
		}
	}
	if (bits > 0) {
		p[o++] = (uint8_t)acc;
	}
	return o;
}

/* Varints of the gaps; stops (returning limit + 1) once more than limit bytes are
 * written, so that AUTO gives up on it early. At most 4 bytes a gap (n <= 2^24), so a
 * sparse block (count < n / 2: sparse_permille >= 500) has values + indexes below 4 n
 * bytes, inside the scratch. */
static size_t varint_put(uint8_t *p, const uint32_t *idx, size_t cnt, size_t limit)
{
	uint32_t prev = 0;
	size_t o = 0;

	for (size_t k = 0; k < cnt; k++) {
		uint32_t v = idx[k] - prev;

		if (o > limit) {
			return limit + 1;
		}
		prev = idx[k];
		while (v >= 0x80) {
			p[o++] = (uint8_t)(v | 0x80);
			v >>= 7;
		}
		p[o++] = (uint8_t)v;
	}
	return o;
}

/* Strict parsers: each index is checked against n and the previous one. */
static enum pbox_dvf_reject check_idx(uint32_t i, uint32_t prev, size_t k, uint32_t n)
{
	if (i >= n) {
		return PBOX_DVF_REJ_IDX_RANGE;
	}
	if (k > 0 && i == prev) {
		return PBOX_DVF_REJ_IDX_DUP;
	}
	if (k > 0 && i < prev) {
		return PBOX_DVF_REJ_IDX_ORDER;
	}
	return PBOX_DVF_OK;
}

static enum pbox_dvf_reject bitpack_get(const uint8_t *p, size_t len, uint32_t *idx, size_t cnt,
					unsigned w, uint32_t n)
{
	const uint64_t mask = w == 32 ? 0xffffffffull : (1ull << w) - 1;
	uint64_t acc = 0;
	unsigned bits = 0;
	size_t o = 0;

	for (size_t k = 0; k < cnt; k++) {
		enum pbox_dvf_reject r;
		uint32_t i;

		while (bits < w) {
			acc |= (uint64_t)p[o++] << bits; /* len == bitpack_len: never past it */
			bits += 8;
		}
		i = (uint32_t)(acc & mask);
		acc >>= w;
		bits -= w;
		r = check_idx(i, k > 0 ? idx[k - 1] : 0, k, n);
		if (r != PBOX_DVF_OK) {
			return r;
		}
		idx[k] = i;
	}
	if (o != len || acc != 0) {
		return o != len ? PBOX_DVF_REJ_LENGTH : PBOX_DVF_REJ_PADDING;
	}
	return PBOX_DVF_OK;
}

static enum pbox_dvf_reject varint_get(const uint8_t *p, size_t len, uint32_t *idx, size_t cnt,
				       uint32_t n)
{
	uint64_t pos = 0;
	size_t o = 0;

	for (size_t k = 0; k < cnt; k++) {
		uint32_t v = 0;
		unsigned shift = 0;
		uint8_t b;

		do {
			if (o == len || shift == 35) {
				return PBOX_DVF_REJ_VARINT; /* cut, or longer than 5 bytes */
			}
			b = p[o++];
			if (shift == 28 && (b & 0xf0) != 0) {
				return PBOX_DVF_REJ_VARINT; /* above 2^32 - 1 */
			}
			v |= (uint32_t)(b & 0x7f) << shift;
			shift += 7;
		} while (b & 0x80);
		if (b == 0 && shift > 7) {
			return PBOX_DVF_REJ_VARINT; /* non-minimal: a trailing zero group */
		}
		if (k > 0 && v == 0) {
			return PBOX_DVF_REJ_IDX_DUP;
		}
		pos = k > 0 ? pos + v : v;
		if (pos >= n) {
			return PBOX_DVF_REJ_IDX_RANGE;
		}
		idx[k] = (uint32_t)pos;
	}
	return o == len ? PBOX_DVF_OK : PBOX_DVF_REJ_LENGTH;
}

/* A presence bitmap of n bits (ceil(n / 8) bytes) with exactly cnt bits set. */
static enum pbox_dvf_reject bitmap_check(const uint8_t *p, uint32_t n, uint32_t cnt)
{
	const size_t nb = ((size_t)n + 7) / 8;
	size_t k = 0;

	if (n % 8 != 0 && (p[nb - 1] >> (n % 8)) != 0) {
		return PBOX_DVF_REJ_PADDING;
	}
	for (size_t o = 0; o < nb; o += 8) {
		uint64_t w = 0;

		memcpy(&w, p + o, nb - o < 8 ? nb - o : 8);
		k += (size_t)__builtin_popcountll(w);
	}
	return k == cnt ? PBOX_DVF_OK : PBOX_DVF_REJ_COUNT;
}

/* ---- encode ------------------------------------------------------------------------- */

static void put_hdr(void *out, const struct pbox_dvf_hdr *h)
{
	memcpy(out, h, sizeof(*h)); /* little-endian host (dvf.h) */
}

int pbox_dvf_encode(struct pbox_dvf_scratch *s, const struct pbox_dvf_enc_cfg *cfg,
		    const struct pbox_dvf_kernels *k, float *resid, const float *g, uint32_t n,
		    float thr, void *out, size_t out_cap, struct pbox_dvf_enc_info *info)
{
	const struct pbox_dvf_codec_ops *codec = cfg->codec;
	struct pbox_dvf_hdr h = { .version = PBOX_DVF_VERSION };
	uint8_t *dst = (uint8_t *)out + PBOX_DVF_HDR_LEN;
	const uint8_t *raw;
	size_t cnt, raw_len, dcap, clen = 0;
	bool sparse;
	int r;

	/* An infinite threshold would keep infinities in the residual: refused like NaN. */
	if (n == 0 || n > s->cap || !(thr >= 0.0f && thr < INFINITY) ||
	    pbox_dvf_enc_cfg_check(cfg) != 0) {
		return -EINVAL;
	}
	cnt = k->filter(resid, g, n, thr, s->dense);
	sparse = (uint64_t)(n - cnt) * 1000 > (uint64_t)cfg->sparse_permille * n;
	if (sparse) {
		unsigned w = idx_width(n);
		size_t bp = bitpack_len(cnt, w), il;
		uint8_t *ip = s->raw + cnt * 4;

		k->compact(s->dense, n, s->vals, s->idx, s->bitmap);
		if (cfg->idx_mode == PBOX_DVF_IDX_BITPACK ||
		    (cfg->idx_mode == PBOX_DVF_IDX_AUTO && bp <= cnt)) {
			il = bitpack_put(ip, s->idx, cnt, w);
			h.encoding = PBOX_DVF_ENC_SPARSE_BITPACK;
		} else {
			size_t limit = cfg->idx_mode == PBOX_DVF_IDX_AUTO ? bp : 5 * cnt;

			il = varint_put(ip, s->idx, cnt, limit);
			h.encoding = PBOX_DVF_ENC_SPARSE_VARINT;
			if (il > limit) {
				il = bitpack_put(ip, s->idx, cnt, w);
				h.encoding = PBOX_DVF_ENC_SPARSE_BITPACK;
			}
		}
		if (h.encoding == PBOX_DVF_ENC_SPARSE_BITPACK) {
			h.idx_bits = (uint8_t)w;
		}
		raw_len = cnt * 4 + il;
		if (raw_len < (size_t)n * 4) {
			memcpy(s->raw, s->vals, cnt * 4);
			h.count = (uint32_t)cnt;
			h.idx_len = (uint32_t)il;
		} else {
			sparse = false; /* no smaller than dense: send dense */
		}
	}
	if (!sparse && cfg->dense_bitmap && cnt * 4 + (n + 7) / 8 < (size_t)n * 4) {
		/* values + presence bitmap: the zeros of PF's dense array cost a bit each */
		size_t bl = (n + 7) / 8;

		k->compact(s->dense, n, s->vals, s->idx, s->bitmap);
		memcpy(s->raw, s->vals, cnt * 4);
		memcpy(s->raw + cnt * 4, s->bitmap, bl);
		h.encoding = PBOX_DVF_ENC_BITMAP;
		h.count = (uint32_t)cnt;
		h.idx_len = (uint32_t)bl;
		raw_len = cnt * 4 + bl;
		sparse = true; /* a payload in s->raw */
	}
	if (sparse) {
		raw = s->raw;
	} else {
		raw = (const uint8_t *)s->dense;
		raw_len = (size_t)n * 4;
		h.encoding = PBOX_DVF_ENC_DENSE;
		h.idx_bits = 0;
		h.count = n;
		h.idx_len = 0;
	}
	if (out_cap < PBOX_DVF_HDR_LEN) {
		r = -ENOSPC;
		goto restore;
	}
	dcap = out_cap - PBOX_DVF_HDR_LEN;
	h.codec = PBOX_DVF_CODEC_NONE;
	if (codec != NULL && codec->id != PBOX_DVF_CODEC_NONE) {
		/* Worth it only if smaller than storing. */
		size_t cap = dcap < raw_len - 1 ? dcap : raw_len - 1;

		r = raw_len > 1
			    ? codec->compress(s->codec, raw, raw_len, dst, cap, cfg->level, &clen)
			    : -ENOSPC;
		if (r == 0) {
			h.codec = (uint8_t)codec->id;
		} else if (r != -ENOSPC) {
			PBOX_LOG_ERR(KERNELS, "dvf block of %u elements: %s failed", n,
				     codec->name);
			goto restore;
		}
	}
	if (h.codec == PBOX_DVF_CODEC_NONE) {
		if (raw_len > dcap) {
			r = -ENOSPC;
			goto restore;
		}
		memcpy(dst, raw, raw_len);
		clen = raw_len;
	}
	h.n = n;
	h.raw_len = (uint32_t)raw_len;
	h.comp_len = (uint32_t)clen;
	put_hdr(out, &h);
	info->sent = (uint32_t)cnt;
	info->encoding = h.encoding;
	info->codec = h.codec;
	info->raw_len = h.raw_len;
	info->wire_len = (uint32_t)(PBOX_DVF_HDR_LEN + clen);
	return 0;

restore:
	/* Nothing goes out: give the sent values back to the residual (their residual is
	 * +0, so resid + out == U exactly; a kept -0 becomes +0). */
	k->add(resid, s->dense, n);
	return r;
}

/* ---- decode ------------------------------------------------------------------------- */

static const char *const g_reject_names[PBOX_DVF_REJ_COUNT_REASONS] = {
	[PBOX_DVF_OK] = "ok",
	[PBOX_DVF_REJ_TRUNCATED] = "truncated",
	[PBOX_DVF_REJ_VERSION] = "version",
	[PBOX_DVF_REJ_ENCODING] = "encoding",
	[PBOX_DVF_REJ_CODEC] = "codec",
	[PBOX_DVF_REJ_HEADER] = "header",
	[PBOX_DVF_REJ_CAPACITY] = "capacity",
	[PBOX_DVF_REJ_COUNT] = "count",
	[PBOX_DVF_REJ_LENGTH] = "length",
	[PBOX_DVF_REJ_CORRUPT] = "corrupt",
	[PBOX_DVF_REJ_BOMB] = "bomb",
	[PBOX_DVF_REJ_SHORT] = "short",
	[PBOX_DVF_REJ_VARINT] = "varint",
	[PBOX_DVF_REJ_IDX_RANGE] = "index-range",
	[PBOX_DVF_REJ_IDX_ORDER] = "index-order",
	[PBOX_DVF_REJ_IDX_DUP] = "index-duplicate",
	[PBOX_DVF_REJ_PADDING] = "padding",
};

/* Zeros to filter a residual against (the dense fallback of pbox_dvf_encode_frag). */
#define ZEROS 4096u
static const float g_zeros[ZEROS];

int pbox_dvf_encode_frag(struct pbox_dvf_scratch *s, const struct pbox_dvf_enc_cfg *cfg,
			 const struct pbox_dvf_kernels *k, float *resid, const float *g, uint32_t n,
			 float thr, void *out, bool *dense, struct pbox_dvf_enc_info *info)
{
	size_t sent = 0;
	int r;

	if (n == 0) {
		return -EINVAL;
	}
	r = pbox_dvf_encode(s, cfg, k, resid, g, n, thr, out, (size_t)n * 4 - 1, info);
	if (r == 0) {
		*dense = false;
		return (int)info->wire_len;
	}
	if (r == -EINVAL) {
		return r;
	}
	/* No block smaller than the dense fragment (or the codec failed): the residual holds
	 * all of U = R + g again; filter it against zeros (U + 0 == U) into out. */
	for (uint32_t i = 0; i < n; i += ZEROS) {
		uint32_t m = n - i < ZEROS ? n - i : ZEROS;

		sent += k->filter(resid + i, g_zeros, m, thr, (float *)out + i);
	}
	*dense = true;
	info->sent = (uint32_t)sent;
	info->encoding = 0;
	info->codec = PBOX_DVF_CODEC_NONE;
	info->raw_len = n * 4;
	info->wire_len = n * 4;
	return (int)(n * 4);
}

const char *pbox_dvf_reject_name(enum pbox_dvf_reject why)
{
	return (unsigned)why < PBOX_DVF_REJ_COUNT_REASONS ? g_reject_names[why] : "unknown";
}

/* The header checks, in order; the payload's are in pbox_dvf_decode. */
static enum pbox_dvf_reject check_hdr(const struct pbox_dvf_hdr *h, size_t len, uint32_t cap_n)
{
	uint64_t want_raw = (uint64_t)h->count * 4 + h->idx_len;

	if (h->version != PBOX_DVF_VERSION) {
		return PBOX_DVF_REJ_VERSION;
	}
	if (h->encoding < PBOX_DVF_ENC_DENSE || h->encoding > PBOX_DVF_ENC_BITMAP) {
		return PBOX_DVF_REJ_ENCODING;
	}
	if (pbox_dvf_codec_by_id(h->codec) == NULL) {
		return PBOX_DVF_REJ_CODEC;
	}
	if (h->n == 0 || h->n > cap_n) {
		return PBOX_DVF_REJ_CAPACITY;
	}
	if (h->idx_bits != (h->encoding == PBOX_DVF_ENC_SPARSE_BITPACK ? idx_width(h->n) : 0)) {
		return PBOX_DVF_REJ_HEADER;
	}
	if (h->count > h->n || (h->encoding == PBOX_DVF_ENC_DENSE && h->count != h->n)) {
		return PBOX_DVF_REJ_COUNT;
	}
	if (h->comp_len != len - PBOX_DVF_HDR_LEN || h->raw_len != want_raw ||
	    h->raw_len > (uint64_t)h->n * 4 ||
	    (h->codec == PBOX_DVF_CODEC_NONE && h->comp_len != h->raw_len)) {
		return PBOX_DVF_REJ_LENGTH;
	}
	switch (h->encoding) {
	case PBOX_DVF_ENC_DENSE:
		return h->idx_len == 0 ? PBOX_DVF_OK : PBOX_DVF_REJ_LENGTH;
	case PBOX_DVF_ENC_SPARSE_BITPACK:
		return h->idx_len == bitpack_len(h->count, h->idx_bits) ? PBOX_DVF_OK
									: PBOX_DVF_REJ_LENGTH;
	case PBOX_DVF_ENC_BITMAP:
		return h->idx_len == ((uint64_t)h->n + 7) / 8 ? PBOX_DVF_OK : PBOX_DVF_REJ_LENGTH;
	default: /* varint: 1..5 bytes per index */
		return h->idx_len >= h->count && h->idx_len <= (uint64_t)h->count * 5
			       ? PBOX_DVF_OK
			       : PBOX_DVF_REJ_LENGTH;
	}
}

int pbox_dvf_decode(struct pbox_dvf_scratch *s, const void *buf, size_t len, uint32_t cap_n,
		    struct pbox_dvf_view *v, enum pbox_dvf_reject *why)
{
	const uint8_t *raw = (const uint8_t *)buf + PBOX_DVF_HDR_LEN;
	struct pbox_dvf_hdr h;
	enum pbox_dvf_reject r;

	if (cap_n > s->cap) {
		return -EINVAL;
	}
	if (len < PBOX_DVF_HDR_LEN) {
		r = PBOX_DVF_REJ_TRUNCATED;
		goto reject;
	}
	memcpy(&h, buf, sizeof(h));
	r = check_hdr(&h, len, cap_n);
	if (r != PBOX_DVF_OK) {
		goto reject;
	}
	if (h.codec != PBOX_DVF_CODEC_NONE) {
		const struct pbox_dvf_codec_ops *c = pbox_dvf_codec_by_id(h.codec);

		switch (c->decompress(s->codec, raw, h.comp_len, s->raw, h.raw_len)) {
		case 0:
			break;
		case PBOX_DVF_CODEC_BOMB:
			r = PBOX_DVF_REJ_BOMB;
			goto reject;
		case PBOX_DVF_CODEC_SHORT:
			r = PBOX_DVF_REJ_SHORT;
			goto reject;
		default:
			r = PBOX_DVF_REJ_CORRUPT;
			goto reject;
		}
		raw = s->raw;
	}
	if (h.encoding == PBOX_DVF_ENC_SPARSE_BITPACK) {
		r = bitpack_get(raw + (size_t)h.count * 4, h.idx_len, s->idx, h.count, h.idx_bits,
				h.n);
	} else if (h.encoding == PBOX_DVF_ENC_SPARSE_VARINT) {
		r = varint_get(raw + (size_t)h.count * 4, h.idx_len, s->idx, h.count, h.n);
	} else if (h.encoding == PBOX_DVF_ENC_BITMAP) {
		r = bitmap_check(raw + (size_t)h.count * 4, h.n, h.count);
	}
	if (r != PBOX_DVF_OK) {
		goto reject;
	}
	v->encoding = h.encoding;
	v->n = h.n;
	v->count = h.count;
	v->idx = h.encoding == PBOX_DVF_ENC_SPARSE_VARINT ||
				 h.encoding == PBOX_DVF_ENC_SPARSE_BITPACK
			 ? s->idx
			 : NULL;
	v->bitmap = h.encoding == PBOX_DVF_ENC_BITMAP ? raw + (size_t)h.count * 4 : NULL;
	if (((uintptr_t)raw & (sizeof(float) - 1)) == 0) {
		v->vals = (const float *)(const void *)raw;
	} else {
		memcpy(s->vals, raw, (size_t)h.count * 4);
		v->vals = s->vals;
	}
	return 0;

reject:
	*why = r;
	return -EBADMSG;
}

void pbox_dvf_view_add(const struct pbox_dvf_kernels *k, const struct pbox_dvf_view *v, float *acc)
{
	if (v->idx != NULL) {
		k->scatter_add(acc, v->vals, v->idx, v->count);
	} else if (v->bitmap != NULL) {
		k->bitmap_add(acc, v->vals, v->bitmap, v->n);
	} else {
		k->add(acc, v->vals, v->n);
	}
}

int pbox_dvf_block_add(struct pbox_dvf_scratch *s, const struct pbox_dvf_kernels *k,
		       const void *buf, size_t len, float *acc, uint32_t cap_n,
		       enum pbox_dvf_reject *why)
{
	struct pbox_dvf_view v;
	int r = pbox_dvf_decode(s, buf, len, cap_n, &v, why);

	if (r == 0) {
		pbox_dvf_view_add(k, &v, acc);
	}
	return r;
}
