/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the AF_XDP transport's frame parser (dataplane/transport/afxdp/frame.h),
 * which reads every frame the XDP filter redirects to a core: untrusted bytes in one or
 * more UMEM buffers.
 *
 * Input: one byte n (1..8 buffers, its value modulo 8 plus 1), then n - 1 cut points (one
 * byte each, offsets into the frame after the first 82 bytes: the longest headers), then the frame.
 *
 * Invariants beyond the sanitizers: the verdict does not depend on where the frame is cut
 * once the headers are in the first buffer (the contiguous frame gives the same); an
 * accepted datagram lies inside the frame, its length is the UDP length less 8, its
 * sender is the frame's source address, port and MAC; and the same datagram built again
 * by pbox_afx_build (a reply to that sender, with roles swapped) parses back to the same
 * bytes with valid checksums.
 */
#include <arpa/inet.h>

#include "fuzz.h"
#include "transport/afxdp/frame.h"

#define MAX_SEGS 8

static const struct pbox_afx_addr g_me = {
	.mac = { 0x02, 0, 0, 0, 0, 1 },
	.ip = 0x0100e80a, /* 10.232.0.1 */
	.port_lo = 7100,
	.nports = 4,
};

static void check_rebuild(const uint8_t *pay, uint32_t len, const struct pbox_afx_rx *r)
{
	static uint8_t f[PBOX_AFX_HDR_LEN + 65536];
	struct pbox_afx_addr sender = { .ip = r->from.ip, .port_lo = 1, .nports = 65534 };
	struct pbox_peer me = { .ip = g_me.ip, .port = htons(r->dport) };
	struct pbox_iov v = { pay, len };
	struct pbox_afx_rx back;

	if (len > 1400 || ntohs(r->from.port) == 0) {
		return; /* the rebuild checks datagrams workers send; ports 1.. */
	}
	memcpy(sender.mac, r->from.mac, 6);
	memcpy(me.mac, g_me.mac, 6);
	pbox_afx_build(f, &sender, ntohs(r->from.port), &me, len, 1, pbox_afx_csum_iov(&v, 1));
	memcpy(f + PBOX_AFX_HDR_LEN, pay, len);
	v.base = f;
	v.len = PBOX_AFX_HDR_LEN + len;
	FUZZ_CHECK(pbox_afx_parse(&v, 1, &g_me, &back) == PBOX_AFX_OK, "rebuilt frame refused");
	FUZZ_CHECK(back.len == len && back.off == PBOX_AFX_HDR_LEN &&
			   memcmp(f + back.off, pay, len) == 0 && back.from.ip == r->from.ip &&
			   back.from.port == r->from.port,
		   "rebuilt frame parses to another datagram");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz z;
	struct pbox_iov seg[MAX_SEGS], whole;
	struct pbox_afx_rx r, r1;
	enum pbox_afx_verdict v, v1;
	uint32_t cuts[MAX_SEGS], nseg;
	const uint8_t *f;
	size_t len;

	fz_init(&z, data, size);
	nseg = fz_u8(&z) % MAX_SEGS + 1;
	for (uint32_t i = 1; i < nseg; i++) {
		cuts[i] = 82 + fz_u8(&z) * 8u;
	}
	f = fz_rest(&z, &len);
	if (len > 65536 + 64) {
		return 0;
	}
	/* Buffers: [0, cut1), [cut1, cut2), ... with cuts sorted and clamped to the frame. */
	{
		uint32_t prev = 0, n = 0;

		for (uint32_t i = 1; i < nseg; i++) {
			uint32_t c = cuts[i] < len ? cuts[i] : (uint32_t)len;

			if (c < prev) {
				c = prev;
			}
			seg[n].base = f + prev;
			seg[n].len = c - prev;
			n++;
			prev = c;
		}
		seg[n].base = f + prev;
		seg[n].len = (uint32_t)len - prev;
		nseg = n + 1;
	}
	whole.base = f;
	whole.len = (uint32_t)len;
	v = pbox_afx_parse(seg, nseg, &g_me, &r);
	v1 = pbox_afx_parse(&whole, 1, &g_me, &r1);
	if (seg[0].len >= 14 + 60 + 8 || nseg == 1) {
		FUZZ_CHECK(v == v1, "verdict %s in %u buffers, %s contiguous",
			   pbox_afx_verdict_name(v), nseg, pbox_afx_verdict_name(v1));
	}
	if (v1 != PBOX_AFX_OK) {
		return 0;
	}
	FUZZ_CHECK((uint64_t)r1.off + r1.len <= len, "datagram [%u, +%u) past a %zu-byte frame",
		   r1.off, r1.len, len);
	FUZZ_CHECK(r1.len + 8 == (uint32_t)(f[r1.off - 4] << 8 | f[r1.off - 3]),
		   "length %u is not the UDP length less 8", r1.len);
	FUZZ_CHECK(memcmp(r1.from.mac, f + 6, 6) == 0 && memcmp(&r1.from.ip, f + 26, 4) == 0 &&
			   memcmp(&r1.from.port, f + r1.off - 8, 2) == 0,
		   "sender is not the frame's source");
	FUZZ_CHECK(r1.dport >= g_me.port_lo && r1.dport < g_me.port_lo + g_me.nports,
		   "port %u accepted", r1.dport);
	check_rebuild(f + r1.off, r1.len, &r1);
	return 0;
}
