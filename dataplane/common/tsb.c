/* SPDX-License-Identifier: BSD-3-Clause */
/* TSB: trees, the session key, the broadcast MAC (see tsb.h). */
#include "tsb.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <sodium.h>

#include "bitmap.h"

_Static_assert(offsetof(struct pbox_wire_hdr, sack) == 56, "the tag is the last header word");

int pbox_tsb_key_new(struct pbox_tsb_key *k)
{
	size_t got = 0;

	while (got < sizeof(k->b)) {
		ssize_t r = getrandom(k->b + got, sizeof(k->b) - got, 0);

		if (r < 0) {
			if (errno == EINTR) {
				continue;
			}
			return -EIO;
		}
		got += (size_t)r;
	}
	return 0;
}

void pbox_tsb_key_hex(const struct pbox_tsb_key *k, char out[2 * PBOX_TSB_KEY_BYTES + 1])
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < PBOX_TSB_KEY_BYTES; i++) {
		out[2 * i] = digits[k->b[i] >> 4];
		out[2 * i + 1] = digits[k->b[i] & 15];
	}
	out[2 * PBOX_TSB_KEY_BYTES] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9') {
		return c - '0';
	}
	if (c >= 'a' && c <= 'f') {
		return c - 'a' + 10;
	}
	if (c >= 'A' && c <= 'F') {
		return c - 'A' + 10;
	}
	return -1;
}

int pbox_tsb_key_parse(const char *hex, struct pbox_tsb_key *k)
{
	if (hex == NULL || strlen(hex) != 2 * PBOX_TSB_KEY_BYTES) {
		return -EINVAL;
	}
	for (size_t i = 0; i < PBOX_TSB_KEY_BYTES; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			return -EINVAL;
		}
		k->b[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

uint64_t pbox_tsb_mac(const struct pbox_tsb_key *k, const struct pbox_wire_hdr *hdr,
		      const void *payload, uint32_t len)
{
	crypto_generichash_state st;
	uint8_t out[crypto_generichash_BYTES_MIN];
	uint64_t tag;

	crypto_generichash_init(&st, k->b, sizeof(k->b), sizeof(out));
	crypto_generichash_update(&st, (const uint8_t *)hdr, offsetof(struct pbox_wire_hdr, sack));
	if (len != 0) {
		crypto_generichash_update(&st, payload, len);
	}
	crypto_generichash_final(&st, out, sizeof(out));
	memcpy(&tag, out, sizeof(tag));
	return tag != 0 ? tag : 1;
}

bool pbox_tsb_verify(const struct pbox_tsb_key *k, const void *pkt, uint32_t len)
{
	const struct pbox_wire_hdr *h = pkt;
	uint64_t want, got;

	if (len < PBOX_WIRE_HDR_LEN) {
		return false;
	}
	want = htobe64(pbox_tsb_mac(k, h, (const uint8_t *)pkt + PBOX_WIRE_HDR_LEN,
				    len - PBOX_WIRE_HDR_LEN));
	memcpy(&got, (const uint8_t *)pkt + offsetof(struct pbox_wire_hdr, sack), sizeof(got));
	return sodium_memcmp(&want, &got, sizeof(want)) == 0;
}

uint64_t pbox_tsb_cookie(const struct pbox_tsb_key *k)
{
	static const char label[] = "pbox tsb broadcast cookie";
	uint8_t out[crypto_generichash_BYTES_MIN];
	uint64_t c;

	crypto_generichash(out, sizeof(out), (const uint8_t *)label, sizeof(label) - 1, k->b,
			   sizeof(k->b));
	memcpy(&c, out, sizeof(c));
	return c != 0 ? c : 1;
}

int pbox_tsb_tree_build(uint32_t n, uint32_t degree, uint32_t depth, uint32_t *parent)
{
	uint64_t cap = 0, level = 1;

	if (degree == 0 || degree > PBOX_TSB_MAX_DEGREE || depth == 0 ||
	    depth > PBOX_TSB_MAX_DEPTH) {
		return -EINVAL;
	}
	for (uint32_t d = 0; d < depth && cap < n; d++) {
		level *= degree;
		cap += level;
	}
	if (cap < n) {
		return -E2BIG;
	}
	for (uint32_t r = 0; r < n; r++) {
		parent[r] = r < degree ? PBOX_TSB_ROOT : (r - degree) / degree;
	}
	return 0;
}

int pbox_tsb_tree_check(uint32_t n, const uint32_t *parent, uint32_t degree, uint32_t depth,
			char *err, size_t errlen)
{
	uint32_t nroot = 0;

	if (degree == 0 || degree > PBOX_TSB_MAX_DEGREE || depth == 0 ||
	    depth > PBOX_TSB_MAX_DEPTH) {
		snprintf(err, errlen, "degree must be 1..%u and depth 1..%u", PBOX_TSB_MAX_DEGREE,
			 PBOX_TSB_MAX_DEPTH);
		return -EINVAL;
	}
	for (uint32_t r = 0; r < n; r++) {
		uint32_t nch = 0, d = 1, p = parent[r];

		if (p != PBOX_TSB_ROOT && p >= n) {
			snprintf(err, errlen, "rank %u: parent %u is not a rank (0..%u) nor -1", r,
				 p, n - 1);
			return -EINVAL;
		}
		nroot += p == PBOX_TSB_ROOT;
		for (uint32_t c = 0; c < n; c++) {
			nch += parent[c] == r;
		}
		if (nch > degree) {
			snprintf(err, errlen, "rank %u has %u children (degree %u)", r, nch,
				 degree);
			return -EINVAL;
		}
		/* Walk up: more than depth steps means too deep or a cycle. */
		while (p != PBOX_TSB_ROOT) {
			if (++d > depth) {
				snprintf(err, errlen,
					 "rank %u is deeper than %u below the appliance (or on a "
					 "cycle)",
					 r, depth);
				return -EINVAL;
			}
			p = parent[p];
		}
	}
	if (nroot > degree) {
		snprintf(err, errlen, "the appliance has %u children (degree %u)", nroot, degree);
		return -EINVAL;
	}
	return 0;
}

uint32_t pbox_tsb_feeder(const uint32_t *parent, uint32_t r, const uint64_t *live,
			 const uint64_t *bypass)
{
	uint32_t p = parent[r];

	if (p == PBOX_TSB_ROOT || (live != NULL && !pbox_bit_test(live, p)) ||
	    (bypass != NULL && pbox_bit_test(bypass, p))) {
		return PBOX_TSB_ROOT;
	}
	return p;
}
