/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF: Parameter Flow's dynamic value-bounded filter (PF §3.3, ../shared/design/papers/pf.md
 * §4) with its block encodings and compressors, for both sides of a broadcast-update job:
 * a worker filters each update it pushes, the appliance filters each aggregate it
 * broadcasts, and the receivers add what arrives into an accumulator.
 *
 * Filter (PF Eq 6, 10, 11), per element of a block, with the caller's residual R:
 *     U = R + g                       (one IEEE single-precision add, in this order)
 *     |U| <= thr: R = U, nothing sent (the boundary |U| == thr is KEPT in R: PF Eq 10)
 *     otherwise:  R = +0, U is sent
 *     thr = delta_t = delta_sel / sqrt(t + 1), delta_sel = delta_low on a sufficient link,
 *     delta_up otherwise (PF uses sqrt(t) with t from 1; our clocks start at 0).
 * So ||R||_inf <= thr after every filter, and R_new + sent == U element by element,
 * exactly (one of the two is zero): no update is ever lost, only delayed. A NaN or an
 * infinity is never <= thr (an infinite thr is refused), so non-finite values are always
 * sent and never poison the residual; the receiver's non-finite check sees them. thr = 0
 * keeps only zeros.
 *
 * Block (wire form, little-endian, every field checked by pbox_dvf_decode):
 *     struct pbox_dvf_hdr (24 bytes), then comp_len bytes: the payload compressed by the
 *     codec (or stored as is by codec "none"). The payload (raw_len bytes) is `count`
 *     float32 values (bit for bit, NaN payloads included), then idx_len bytes of
 *     element indexes or of a bitmap:
 *       DENSE          count == n, every element of the block (unsent ones are 0);
 *       SPARSE_VARINT  count sent values; indexes as LEB128 varints of the gaps: the
 *                      first index, then idx[k] - idx[k-1] (>= 1: a 0 is a duplicate);
 *       SPARSE_BITPACK count sent values; absolute indexes, idx_bits bits each (the
 *                      width of n - 1, at least 1), packed LSB first, zero padding bits;
 *       BITMAP         count sent values; a presence bitmap of n bits (ceil(n / 8) bytes,
 *                      bit i of byte i / 8 LSB first, zero padding) with count bits set.
 *     The encoder picks sparse when the sparsity 1 - count / n is above the configured
 *     ratio (PF: 0.8, strict) and the sparse payload is smaller than the dense one;
 *     otherwise BITMAP (unless the job asks for PF's plain dense array) when smaller than
 *     DENSE: PF's dense array keeps the dropped zeros, which only a (slow) compressor
 *     removes, while a bitmap costs n / 8 bytes at the filter's speed (perf/dvf/README.md).
 *     The payload is stored uncompressed (codec "none") when the codec does not shrink it.
 *     So raw_len <= 4 n always: a decoder never produces more than 4 n bytes for a block
 *     of n elements, whatever the compressed stream says (decompression bombs are cut at
 *     raw_len and rejected).
 *
 * ISA: the filter, the compaction, the sparse scatter-add and the bitmap add exist for
 * AVX-512 (compress / expand in registers), AVX2 (permutation tables) and plain C,
 * chosen once like the add kernels (dataplane/kernels: PBOX_KERNEL_ISA is honoured). All
 * give bit-identical results: every element gets the same single add and the same
 * ordered compare (|U| <= thr is false for NaN on every path). (One exception shared with
 * the add kernels: when R and g are both NaN, which payload survives the add may depend
 * on the operand order the compiler picked for the scalar path.)
 *
 * Threading and ownership: everything here is pure except the scratch, which holds the
 * codec contexts and the staging buffers of one thread (one per data-plane core); the
 * residual, gradient, accumulator and wire buffers belong to the caller. No function here
 * calls malloc except pbox_dvf_scratch_new; the codec libraries may (zstd sizes a
 * context's workspace on its first use, snappy allocates its hash table per compression).
 */
#ifndef PBOX_DVF_H
#define PBOX_DVF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "DVF blocks carry float32 values in host order: little-endian hosts only"
#endif

/* ---- threshold ---------------------------------------------------------------------- */

/* A link's state as the control plane (or the job's config) reports it (PF §3.3.3). */
enum pbox_dvf_link {
	PBOX_DVF_LINK_SUFFICIENT = 0, /* every destination's bandwidth is above the minimum */
	PBOX_DVF_LINK_INSUFFICIENT,   /* some link is not: drop more (delta_up) */
};

struct pbox_dvf_params {
	float delta_low; /* threshold numerator on sufficient links */
	float delta_up;  /* on insufficient links; delta_low <= delta_up */
};

/* 0, or -EINVAL if a delta is negative, NaN or infinite, or delta_low > delta_up. */
int pbox_dvf_params_check(const struct pbox_dvf_params *p);

/* delta_t = delta_sel / sqrt(t + 1) for the clock t (0 for the first exchange), computed
 * in double and rounded once to float: the same on every node. */
float pbox_dvf_threshold(const struct pbox_dvf_params *p, enum pbox_dvf_link link, uint64_t t);

/* ---- vector kernels ----------------------------------------------------------------- */

struct pbox_dvf_kernels {
	const char *isa; /* "avx512", "avx2", "scalar" */
	/* The filter over n elements: resid[i] and out[i] from U = resid[i] + g[i] as in the
	 * file comment (out[i] = U if sent, +0 if kept). Returns the number sent. out may not
	 * alias resid or g; g may alias neither. */
	size_t (*filter)(float *resid, const float *g, size_t n, float thr, float *out);
	/* Compaction of a filtered block: the elements of in[0..n) whose bits are not +-0,
	 * i.e. exactly the sent ones, go to vals[] with their index in idx[], in order, and
	 * their presence bits to bitmap[0..ceil(n / 8)) (padding bits 0). Returns their
	 * count. vals and idx must have room for n elements each (the vector paths store
	 * whole vectors past the count, never past n). */
	size_t (*compact)(const float *in, size_t n, float *vals, uint32_t *idx, uint8_t *bitmap);
	/* acc[idx[k]] = acc[idx[k]] + vals[k] for k < cnt. idx must be strictly increasing
	 * (pbox_dvf_decode guarantees it) and below 2^31. */
	void (*scatter_add)(float *acc, const float *vals, const uint32_t *idx, size_t cnt);
	/* The same for a presence bitmap of n bits: for each set bit i, in order,
	 * acc[i] = acc[i] + the next value (elements without a bit are not touched, so a
	 * -0 accumulator stays -0). vals holds popcount(bitmap) values and is never read
	 * past them. */
	void (*bitmap_add)(float *acc, const float *vals, const uint8_t *bitmap, size_t n);
	/* acc[i] = acc[i] + vals[i] for i < n (the add kernel of dataplane/kernels). */
	void (*add)(float *acc, const float *vals, size_t n);
};

/* The kernels of the ISA the add kernels use (pbox_kernels_get(), so PBOX_KERNEL_ISA
 * applies; sse2 maps to scalar). Resolved once; never NULL. */
const struct pbox_dvf_kernels *pbox_dvf_kernels_get(void);
/* By name ("avx512", "avx2", "scalar"), or NULL if unknown or unsupported by this CPU. */
const struct pbox_dvf_kernels *pbox_dvf_kernels_by_isa(const char *isa);
/* All supported, widest first; returns the count (<= 3). */
unsigned pbox_dvf_kernels_supported(const struct pbox_dvf_kernels **out, unsigned max);

/* ---- compressors -------------------------------------------------------------------- */

/* Codec ids as carried in the block header. */
enum pbox_dvf_codec_id {
	PBOX_DVF_CODEC_NONE = 0,
	PBOX_DVF_CODEC_LZ4 = 1,
	PBOX_DVF_CODEC_ZSTD = 2,
	PBOX_DVF_CODEC_SNAPPY = 3,
	PBOX_DVF_CODEC_IGZIP = 4, /* ISA-L raw deflate */
	PBOX_DVF_CODEC_COUNT,
};

struct pbox_dvf_codec_ctx; /* per-thread codec state; lives in a pbox_dvf_scratch */

/* Decompression results beyond 0, shared by every codec. */
#define PBOX_DVF_CODEC_CORRUPT (-1) /* the stream is not valid for the codec */
#define PBOX_DVF_CODEC_BOMB    (-2) /* it decodes to more than the expected length */
#define PBOX_DVF_CODEC_SHORT   (-3) /* it decodes to less than the expected length */

struct pbox_dvf_codec_ops {
	const char *name; /* "none", "lz4", "zstd", "snappy", "igzip" */
	enum pbox_dvf_codec_id id;
	int level_min, level_max, level_default;
	/* Worst-case compressed size of len bytes. */
	size_t (*bound)(size_t len);
	/* Compress src[0..len) into dst (cap bytes) at level: 0 and *out_len, -ENOSPC if the
	 * result does not fit in cap (the encoder uses that to store instead), -EIO if the
	 * library failed. */
	int (*compress)(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			size_t cap, int level, size_t *out_len);
	/* Decompress src[0..len) into dst, which has room for exactly expect bytes: 0 if the
	 * stream decodes to exactly expect bytes, else PBOX_DVF_CODEC_CORRUPT, _BOMB or
	 * _SHORT. Never writes more than expect bytes (plus one for lz4, which the scratch
	 * provides: see pbox_dvf_scratch_new), whatever the input. */
	int (*decompress)(struct pbox_dvf_codec_ctx *c, const void *src, size_t len, void *dst,
			  size_t expect);
};

/* By name: "none", "lz4", "zstd", "snappy", "igzip"; NULL if unknown. */
const struct pbox_dvf_codec_ops *pbox_dvf_codec_find(const char *name);
/* By header id; NULL if unknown. */
const struct pbox_dvf_codec_ops *pbox_dvf_codec_by_id(unsigned id);
/* "NAME" or "NAME:LEVEL" (e.g. "zstd:2"): 0 with *ops and *level (the codec's default
 * if none is given), -EINVAL if the name is unknown or the level out of the codec's
 * range. */
int pbox_dvf_codec_parse(const char *spec, const struct pbox_dvf_codec_ops **ops, int *level);
/* Comma-separated names, for messages and --help. */
const char *pbox_dvf_codec_names(void);

/* ---- blocks ------------------------------------------------------------------------- */

#define PBOX_DVF_VERSION 1
#define PBOX_DVF_HDR_LEN 24
/* Largest block, in elements (indexes stay below 2^31 for the vector scatter). */
#define PBOX_DVF_MAX_BLOCK (1u << 24)

enum pbox_dvf_encoding {
	PBOX_DVF_ENC_DENSE = 1,
	PBOX_DVF_ENC_SPARSE_VARINT = 2,
	PBOX_DVF_ENC_SPARSE_BITPACK = 3,
	PBOX_DVF_ENC_BITMAP = 4,
};

/* The block header on the wire (little-endian). */
struct pbox_dvf_hdr {
	uint8_t version;   /* PBOX_DVF_VERSION */
	uint8_t encoding;  /* enum pbox_dvf_encoding */
	uint8_t codec;     /* enum pbox_dvf_codec_id of the payload */
	uint8_t idx_bits;  /* SPARSE_BITPACK: width of n - 1 (>= 1); 0 otherwise */
	uint32_t n;        /* elements in the block */
	uint32_t count;    /* values in the payload: n (dense) or the sent ones (sparse) */
	uint32_t idx_len;  /* bytes of indexes after the values (0 for dense) */
	uint32_t raw_len;  /* payload bytes before compression: 4 * count + idx_len */
	uint32_t comp_len; /* bytes after the header; == raw_len for codec none */
};
_Static_assert(sizeof(struct pbox_dvf_hdr) == PBOX_DVF_HDR_LEN, "DVF block header size");

/* Index coding of sparse blocks. */
enum pbox_dvf_idx_mode {
	PBOX_DVF_IDX_AUTO = 0, /* the smaller of the two */
	PBOX_DVF_IDX_VARINT,
	PBOX_DVF_IDX_BITPACK,
};

/* Encoder settings (a job's, fixed for its life). */
struct pbox_dvf_enc_cfg {
	const struct pbox_dvf_codec_ops *codec; /* NULL: none */
	int level;                              /* within the codec's range */
	/* Sparse when (n - count) * 1000 > sparse_permille * n: 800 is PF's "sparsity
	 * higher than 0.8". 500..1000; 1000 never picks sparse. */
	uint32_t sparse_permille;
	enum pbox_dvf_idx_mode idx_mode;
	/* Not sparse: values + presence bitmap (BITMAP) when smaller than PF's plain dense
	 * array (false: always the plain array, as PF). */
	bool dense_bitmap;
};

/* Defaults: the codec chosen by the benchmark (perf/dvf/README.md) at its default
 * level; sparse above 0.8 (PF); indexes AUTO; bitmap for the rest. */
void pbox_dvf_enc_cfg_default(struct pbox_dvf_enc_cfg *cfg);
/* 0, or -EINVAL (level out of range, sparse_permille outside 500..1000, bad idx_mode). */
int pbox_dvf_enc_cfg_check(const struct pbox_dvf_enc_cfg *cfg);

/* A job's DVF settings, as its definition gives them (the `dvf` group of a job: see
 * dataplane/pboxd/config.h) and as the appliance tells its workers at registration.
 * Immutable once the job is admitted. */
struct pbox_dvf_job {
	bool enabled;
	struct pbox_dvf_params params;
	/* The link state the job's definition gives; used until the control plane's plan
	 * says otherwise (see pbox_dvf_push_link in libpbox, pbox_enc_result_link in the
	 * engine). */
	enum pbox_dvf_link link;
	struct pbox_dvf_enc_cfg enc;
};

/* What the encoder did with one block. */
struct pbox_dvf_enc_info {
	uint32_t sent;     /* elements sent (not kept in the residual) */
	uint8_t encoding;  /* enum pbox_dvf_encoding */
	uint8_t codec;     /* enum pbox_dvf_codec_id actually used */
	uint32_t raw_len;  /* payload bytes before compression */
	uint32_t wire_len; /* bytes written: header + compressed payload */
};

/* Per-thread staging buffers and codec contexts for blocks of up to cap elements. */
struct pbox_dvf_scratch;

/* For blocks of 1..PBOX_DVF_MAX_BLOCK elements; NULL after logging why (bad cap, no
 * memory, a codec library failed to make its context). Not for the hot path: make one
 * per core at start-up. */
struct pbox_dvf_scratch *pbox_dvf_scratch_new(uint32_t cap);
void pbox_dvf_scratch_free(struct pbox_dvf_scratch *s);
uint32_t pbox_dvf_scratch_cap(const struct pbox_dvf_scratch *s);
/* The scratch's codec contexts, for calling a codec's ops directly (benchmarks, tests). */
struct pbox_dvf_codec_ctx *pbox_dvf_scratch_codec(struct pbox_dvf_scratch *s);

/* Bytes an encoded block of n elements can take, whatever the codec: the header and 4 n
 * (the encoder stores a payload that a codec does not shrink). */
size_t pbox_dvf_block_bound(uint32_t n);

/*
 * Filter one block (g[0..n), residual resid[0..n) updated in place, threshold thr from
 * pbox_dvf_threshold) and encode what is sent into out[0..out_cap), the caller's buffer
 * (a wire fragment's payload). On 0, *info says what was written (info->wire_len bytes).
 * Errors: -EINVAL (n == 0 or n > the scratch's cap, thr negative, infinite or NaN, bad
 * cfg),
 * -ENOSPC (out_cap too small for this block; pbox_dvf_block_bound never is), -EIO (the
 * codec library failed). On an error nothing is sent and nothing is lost: the residual
 * then holds all of U = R + g (a -0 residual may come back as +0), so the next call sends
 * it.
 */
int pbox_dvf_encode(struct pbox_dvf_scratch *s, const struct pbox_dvf_enc_cfg *cfg,
		    const struct pbox_dvf_kernels *k, float *resid, const float *g, uint32_t n,
		    float thr, void *out, size_t out_cap, struct pbox_dvf_enc_info *info);

/*
 * One wire fragment (pbox/wire.h PBOX_ENC_DVF): filter g[0..n) with the residual as
 * pbox_dvf_encode does and write into out (room for 4 n bytes) either a DVF block smaller
 * than the dense fragment (returns its length, *dense false) or, when no block would be
 * smaller, the filtered values themselves, dense (returns 4 n, *dense true: the
 * fragment goes as PBOX_ENC_F32; unsent elements are +0). The residual is updated exactly
 * once either way, so R + what is sent == R_before + g. A codec failure is logged and
 * handled like a block that does not fit. Returns -EINVAL only for bad arguments
 * (as pbox_dvf_encode), with nothing changed. info as pbox_dvf_encode's (wire_len 4 n,
 * encoding 0 when dense).
 */
int pbox_dvf_encode_frag(struct pbox_dvf_scratch *s, const struct pbox_dvf_enc_cfg *cfg,
			 const struct pbox_dvf_kernels *k, float *resid, const float *g, uint32_t n,
			 float thr, void *out, bool *dense, struct pbox_dvf_enc_info *info);

/* Why a block was rejected (counted per reason by the receiver). */
enum pbox_dvf_reject {
	PBOX_DVF_OK = 0,
	PBOX_DVF_REJ_TRUNCATED, /* shorter than the header */
	PBOX_DVF_REJ_VERSION,   /* unknown version */
	PBOX_DVF_REJ_ENCODING,  /* unknown encoding */
	PBOX_DVF_REJ_CODEC,     /* unknown codec */
	PBOX_DVF_REJ_HEADER,    /* idx_bits wrong for the encoding and n */
	PBOX_DVF_REJ_CAPACITY,  /* n == 0 or n above the receiver's capacity */
	PBOX_DVF_REJ_COUNT,     /* count > n, or a dense count != n */
	PBOX_DVF_REJ_LENGTH,    /* comp_len, raw_len or idx_len disagree (or > 4 n) */
	PBOX_DVF_REJ_CORRUPT,   /* the codec rejects the stream */
	PBOX_DVF_REJ_BOMB,      /* the stream decodes to more than raw_len */
	PBOX_DVF_REJ_SHORT,     /* the stream decodes to less than raw_len */
	PBOX_DVF_REJ_VARINT,    /* overlong, non-minimal or cut varint */
	PBOX_DVF_REJ_IDX_RANGE, /* an index >= n */
	PBOX_DVF_REJ_IDX_ORDER, /* an index below the previous one */
	PBOX_DVF_REJ_IDX_DUP,   /* an index equal to the previous one */
	PBOX_DVF_REJ_PADDING,   /* non-zero padding bits after packed indexes */
	PBOX_DVF_REJ_COUNT_REASONS,
};

/* A short name of a reason ("truncated", "bomb", ...), for counters and logs. */
const char *pbox_dvf_reject_name(enum pbox_dvf_reject why);

/* A decoded block: valid until the next call with the same scratch and while the input
 * buffer lives (vals and bitmap point into the input when the block is stored
 * uncompressed, into the scratch otherwise; idx always into the scratch). */
struct pbox_dvf_view {
	uint8_t encoding;
	uint32_t n;
	uint32_t count;
	const float *vals;
	const uint32_t *idx;   /* sparse: count strictly increasing indexes < n; else NULL */
	const uint8_t *bitmap; /* BITMAP: ceil(n / 8) bytes with count bits set; else NULL */
};

/*
 * Validate and decode the block buf[0..len) for an accumulator of cap_n elements
 * (cap_n <= the scratch's cap). 0 with *v; or -EBADMSG with *why set (never
 * PBOX_DVF_OK), nothing else touched. -EINVAL if cap_n exceeds the scratch.
 */
int pbox_dvf_decode(struct pbox_dvf_scratch *s, const void *buf, size_t len, uint32_t cap_n,
		    struct pbox_dvf_view *v, enum pbox_dvf_reject *why);

/* acc[0..v->n) += the block: the add kernel for dense, scatter-add for sparse, the
 * bitmap add for BITMAP (the message is never densified). */
void pbox_dvf_view_add(const struct pbox_dvf_kernels *k, const struct pbox_dvf_view *v, float *acc);

/* Decode and add in one call: pbox_dvf_decode, then pbox_dvf_view_add into acc[0..cap_n).
 * Same returns as pbox_dvf_decode; acc is untouched on an error. */
int pbox_dvf_block_add(struct pbox_dvf_scratch *s, const struct pbox_dvf_kernels *k,
		       const void *buf, size_t len, float *acc, uint32_t cap_n,
		       enum pbox_dvf_reject *why);

#endif /* PBOX_DVF_H */
