/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the DVF block decoder (dataplane/dvf: pbox_dvf_decode and the add into an
 * accumulator), which takes blocks from the network (pushes from any worker, broadcasts
 * relayed by other workers).
 *
 * Input grammar, first byte (mode & 1):
 *  - 0, raw: u16 capacity (1..4096 elements), then the rest is one block, decoded into an
 *    accumulator of exactly that many floats (a heap buffer of that size, so a sanitizer
 *    sees any write outside it) with every ISA's kernels;
 *  - 1, structured: codec spec, index mode and bitmap choice (mode % 3, mode / 3 & 1),
 *    sparse threshold, n, a threshold exponent,
 *    then n float bit patterns (NaN and infinities included): the harness filters and
 *    encodes them with every ISA (the blocks and residuals must be identical, and decode
 *    back to what the filter sent, bit for bit), then applies up to 8 byte mutations
 *    (position, xor) to the block and decodes it again.
 *
 * Invariants beyond the sanitizers: an accepted block has 1 <= n <= capacity, count <= n,
 * count == n for dense, indexes strictly increasing and below n; a rejection names a
 * reason and leaves the accumulator untouched; every ISA adds a block to the same bits.
 */
#include <errno.h>
#include <math.h>

#include "common/log.h"
#include "dvf/dvf.h"
#include "fuzz.h"
#include "harness.h"

#define MAXN 4096

static struct pbox_dvf_scratch *g_s;
static const struct pbox_dvf_kernels *g_k[3];
static unsigned g_nk;

static void once(void)
{
	if (g_s == NULL) {
		pbox_log_set_sink(pbox_test_log_silent, NULL);
		g_s = pbox_dvf_scratch_new(MAXN);
		FUZZ_CHECK(g_s != NULL, "no scratch");
		g_nk = pbox_dvf_kernels_supported(g_k, 3);
	}
}

/* Decode buf with every ISA; check the invariants; returns whether it was accepted. */
static bool decode_all(const uint8_t *buf, size_t len, uint32_t cap)
{
	float *acc0 = calloc(cap, sizeof(float)), *acc = malloc(cap * sizeof(float));
	bool ok = false;

	FUZZ_CHECK(acc0 != NULL && acc != NULL, "no memory");
	for (unsigned a = 0; a < g_nk; a++) {
		enum pbox_dvf_reject why = PBOX_DVF_OK;
		struct pbox_dvf_view v;
		int r;

		for (uint32_t i = 0; i < cap; i++) {
			acc[i] = (float)i;
		}
		r = pbox_dvf_decode(g_s, buf, len, cap, &v, &why);
		if (a == 0 && getenv("PBOX_FUZZ_VERBOSE") != NULL) {
			fprintf(stderr, "fuzz_dvf: %zu-byte block, capacity %u: %s\n", len, cap,
				r == 0 ? "accepted" : pbox_dvf_reject_name(why));
		}
		if (r != 0) {
			FUZZ_CHECK(r == -EBADMSG && why != PBOX_DVF_OK &&
					   why < PBOX_DVF_REJ_COUNT_REASONS,
				   "decode returned %d, reason %d", r, (int)why);
			FUZZ_CHECK(a == 0 || !ok, "ISA %s rejects what another accepted",
				   g_k[a]->isa);
			continue;
		}
		FUZZ_CHECK(v.n >= 1 && v.n <= cap && v.count <= v.n, "n %u count %u cap %u", v.n,
			   v.count, cap);
		if (v.bitmap != NULL) {
			uint32_t bits = 0;

			for (uint32_t i = 0; i < v.n; i++) {
				bits += (v.bitmap[i / 8] >> (i % 8)) & 1;
			}
			FUZZ_CHECK(v.encoding == PBOX_DVF_ENC_BITMAP && v.idx == NULL &&
					   bits == v.count &&
					   (v.n % 8 == 0 || v.bitmap[v.n / 8] >> (v.n % 8) == 0),
				   "bitmap block: %u bits, count %u of %u", bits, v.count, v.n);
		} else if (v.idx == NULL) {
			FUZZ_CHECK(v.encoding == PBOX_DVF_ENC_DENSE && v.count == v.n,
				   "dense block with count %u of %u", v.count, v.n);
		} else {
			for (uint32_t c = 0; c < v.count; c++) {
				FUZZ_CHECK(v.idx[c] < v.n && (c == 0 || v.idx[c] > v.idx[c - 1]),
					   "index %u = %u after %u (n %u)", c, v.idx[c],
					   c ? v.idx[c - 1] : 0, v.n);
			}
		}
		pbox_dvf_view_add(g_k[a], &v, acc);
		if (a == 0) {
			memcpy(acc0, acc, cap * sizeof(float));
			ok = true;
		} else {
			FUZZ_CHECK(memcmp(acc0, acc, cap * sizeof(float)) == 0,
				   "ISA %s adds differently from %s", g_k[a]->isa, g_k[0]->isa);
		}
	}
	free(acc0);
	free(acc);
	return ok;
}

static void structured(struct fz *f)
{
	static const char *const specs[] = { "none",   "lz4",     "zstd:1",  "zstd:3",
					     "snappy", "igzip:0", "igzip:1", "igzip:3" };
	struct pbox_dvf_enc_cfg cfg;
	struct pbox_dvf_enc_info info[3];
	uint8_t *wire[3];
	float *g, *r[3], *sent;
	uint32_t n, nmut;
	uint8_t mode;
	float thr;

	pbox_dvf_enc_cfg_default(&cfg);
	FUZZ_CHECK(pbox_dvf_codec_parse(specs[fz_below(f, 8)], &cfg.codec, &cfg.level) == 0,
		   "spec");
	mode = fz_u8(f);
	cfg.idx_mode = (enum pbox_dvf_idx_mode)(mode % 3);
	cfg.dense_bitmap = (mode / 3) & 1;
	cfg.sparse_permille = 500 + fz_below(f, 501);
	n = 1 + fz_below(f, MAXN);
	thr = ldexpf(1.0f, (int)fz_below(f, 64) - 40);
	g = malloc(n * sizeof(float));
	sent = calloc(n, sizeof(float));
	FUZZ_CHECK(g != NULL && sent != NULL, "no memory");
	for (uint32_t i = 0; i < n; i++) {
		uint32_t b = fz_u32(f);

		memcpy(&g[i], &b, sizeof(b));
	}
	for (unsigned a = 0; a < g_nk; a++) {
		wire[a] = malloc(pbox_dvf_block_bound(n));
		r[a] = calloc(n, sizeof(float));
		FUZZ_CHECK(wire[a] != NULL && r[a] != NULL, "no memory");
		FUZZ_CHECK(pbox_dvf_encode(g_s, &cfg, g_k[a], r[a], g, n, thr, wire[a],
					   pbox_dvf_block_bound(n), &info[a]) == 0,
			   "encode with %s failed", g_k[a]->isa);
		if (a > 0) {
			FUZZ_CHECK(info[a].wire_len == info[0].wire_len &&
					   memcmp(wire[a], wire[0], info[0].wire_len) == 0 &&
					   memcmp(r[a], r[0], n * sizeof(float)) == 0,
				   "ISA %s encodes differently from %s", g_k[a]->isa, g_k[0]->isa);
		}
	}
	/* Round trip: what arrives is what the filter sent (U where the residual is +0 and
	 * |U| > thr), bit for bit. */
	{
		struct pbox_dvf_view v;
		enum pbox_dvf_reject why;

		FUZZ_CHECK(pbox_dvf_decode(g_s, wire[0], info[0].wire_len, n, &v, &why) == 0,
			   "own block rejected: %s", pbox_dvf_reject_name(why));
		FUZZ_CHECK(v.count == (v.encoding == PBOX_DVF_ENC_DENSE ? n : info[0].sent),
			   "count %u sent %u", v.count, info[0].sent);
		for (uint32_t i = 0, c = 0; i < n; i++) {
			if (v.idx != NULL) {
				if (c < v.count && v.idx[c] == i) {
					sent[i] = v.vals[c++];
				}
			} else if (v.bitmap == NULL || ((v.bitmap[i / 8] >> (i % 8)) & 1)) {
				sent[i] = v.vals[c++];
			}
		}
		for (uint32_t i = 0; i < n; i++) {
			float u = 0.0f + g[i];
			uint32_t bs, bu, br;
			bool was_sent = !(fabsf(u) <= thr);

			memcpy(&bs, &sent[i], 4);
			memcpy(&bu, &u, 4);
			memcpy(&br, &r[0][i], 4);
			FUZZ_CHECK(was_sent ? bs == bu && br == 0 : bs == 0 && br == bu,
				   "element %u: g %08x sent %08x resid %08x", i, bu, bs, br);
		}
	}
	decode_all(wire[0], info[0].wire_len, n);
	nmut = fz_below(f, 9);
	for (uint32_t m = 0; m < nmut; m++) {
		uint32_t pos = fz_u16(f) % info[0].wire_len;

		wire[0][pos] ^= fz_u8(f);
	}
	if (nmut > 0) {
		decode_all(wire[0], info[0].wire_len, n);
	}
	for (unsigned a = 0; a < g_nk; a++) {
		free(wire[a]);
		free(r[a]);
	}
	free(g);
	free(sent);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f;

	once();
	fz_init(&f, data, size);
	if ((fz_u8(&f) & 1) == 0) {
		uint32_t cap = 1 + fz_u16(&f) % MAXN;
		size_t len;
		const uint8_t *rest = fz_rest(&f, &len);
		uint8_t *buf = malloc(len ? len : 1);

		FUZZ_CHECK(buf != NULL, "no memory");
		memcpy(buf, rest, len);
		decode_all(buf, len, cap);
		free(buf);
	} else {
		structured(&f);
	}
	return 0;
}
