/* SPDX-License-Identifier: BSD-3-Clause */
/* AF_XDP transport framing and checksums (see frame.h). */
#include "transport/afxdp/frame.h"

#include <arpa/inet.h>
#include <string.h>

#define ETH_LEN     14u
#define ETHTYPE_IP4 0x0800u

/* Add 16-bit words of p (native order) into a 64-bit accumulator; an odd last byte is
 * the high-order byte of a zero-padded word in network order. */
static uint64_t sum_bytes(const uint8_t *p, size_t len, uint64_t acc)
{
	while (len >= 8) {
		uint64_t w;
		uint32_t lo, hi;

		memcpy(&w, p, 8);
		lo = (uint32_t)w;
		hi = (uint32_t)(w >> 32);
		acc += (uint64_t)lo + hi;
		p += 8;
		len -= 8;
	}
	while (len >= 2) {
		uint16_t w;

		memcpy(&w, p, 2);
		acc += w;
		p += 2;
		len -= 2;
	}
	if (len != 0) {
		uint8_t b[2] = { p[0], 0 };
		uint16_t w;

		memcpy(&w, b, 2);
		acc += w;
	}
	return acc;
}

static uint16_t fold(uint64_t acc)
{
	while (acc >> 16) {
		acc = (acc & 0xffff) + (acc >> 16);
	}
	return (uint16_t)acc;
}

static uint16_t bswap16(uint16_t v)
{
	return (uint16_t)(v << 8 | v >> 8);
}

uint16_t pbox_afx_csum_iov(const struct pbox_iov *seg, unsigned nseg)
{
	uint64_t acc = 0;
	uint64_t done = 0;

	for (unsigned i = 0; i < nseg; i++) {
		uint16_t part = fold(sum_bytes(seg[i].base, seg[i].len, 0));

		/* A piece starting at an odd offset has its bytes in the other half-words. */
		acc += (done & 1) ? bswap16(part) : part;
		done += seg[i].len;
	}
	return fold(acc);
}

/* The pseudo-header's sum (RFC 768): addresses, protocol, UDP length. */
static uint64_t pseudo_sum(uint32_t src, uint32_t dst, uint16_t ulen_be)
{
	uint16_t proto = htons(17);

	return sum_bytes((const uint8_t *)&src, 4, 0) + sum_bytes((const uint8_t *)&dst, 4, 0) +
	       proto + ulen_be;
}

enum pbox_afx_verdict pbox_afx_parse(const struct pbox_iov *seg, unsigned nseg,
				     const struct pbox_afx_addr *me, struct pbox_afx_rx *out)
{
	const uint8_t *f;
	uint64_t flen = 0;
	uint32_t ihl, tot, ulen, off;
	uint16_t type, frag, dport, ucs, ulen_be;
	uint32_t src, dst;

	if (nseg == 0) {
		return PBOX_AFX_TRUNCATED;
	}
	for (unsigned i = 0; i < nseg; i++) {
		flen += seg[i].len;
	}
	f = seg[0].base;
	if (seg[0].len < ETH_LEN + 20) {
		return seg[0].len >= ETH_LEN && f[12] == 0x08 && f[13] == 0x00 ? PBOX_AFX_TRUNCATED
									       : PBOX_AFX_NOT_OURS;
	}
	type = (uint16_t)(f[12] << 8 | f[13]);
	if (type != ETHTYPE_IP4) {
		return PBOX_AFX_NOT_OURS;
	}
	if ((f[ETH_LEN] >> 4) != 4 || f[ETH_LEN + 9] != 17) {
		return PBOX_AFX_NOT_OURS;
	}
	memcpy(&dst, f + ETH_LEN + 16, 4);
	if (dst != me->ip) {
		return PBOX_AFX_NOT_OURS;
	}
	ihl = (uint32_t)(f[ETH_LEN] & 0xf) * 4;
	if (ihl < 20) {
		return PBOX_AFX_NOT_OURS;
	}
	if (seg[0].len < ETH_LEN + ihl + 8) {
		return PBOX_AFX_TRUNCATED;
	}
	tot = (uint32_t)(f[ETH_LEN + 2] << 8 | f[ETH_LEN + 3]);
	if (tot < ihl + 8 || ETH_LEN + (uint64_t)tot > flen) {
		return PBOX_AFX_TRUNCATED;
	}
	frag = (uint16_t)(f[ETH_LEN + 6] << 8 | f[ETH_LEN + 7]);
	if (frag & 0x3fff) { /* more fragments, or an offset */
		return PBOX_AFX_FRAGMENT;
	}
	if (fold(sum_bytes(f + ETH_LEN, ihl, 0)) != 0xffff) {
		return PBOX_AFX_BAD_IP_CSUM;
	}
	off = ETH_LEN + ihl;
	dport = (uint16_t)(f[off + 2] << 8 | f[off + 3]);
	if (dport < me->port_lo || dport - me->port_lo >= me->nports) {
		return PBOX_AFX_NOT_OURS;
	}
	ulen = (uint32_t)(f[off + 4] << 8 | f[off + 5]);
	if (ulen < 8 || ulen > tot - ihl) {
		return PBOX_AFX_TRUNCATED;
	}
	memcpy(&src, f + ETH_LEN + 12, 4);
	memcpy(&ucs, f + off + 6, 2);
	memcpy(&ulen_be, f + off + 4, 2);
	if (ucs != 0) {
		uint64_t ps = pseudo_sum(src, dst, ulen_be);
		struct pbox_iov part[64 + 1];
		unsigned n = 0;
		uint64_t skip = off, want = ulen;

		/* A sender that left its checksum to an offload that never ran (a veth peer:
		 * the kernel hands XDP such frames unfinished) leaves the pseudo-header sum
		 * in the field: nothing to verify (a corrupted frame passes this 1 in 65536). */
		if (ucs != fold(ps)) {
			for (unsigned i = 0; i < nseg && want != 0 && n < 65; i++) {
				uint64_t take;

				if (skip >= seg[i].len) {
					skip -= seg[i].len;
					continue;
				}
				take = seg[i].len - skip;
				if (take > want) {
					take = want;
				}
				part[n].base = (const uint8_t *)seg[i].base + skip;
				part[n].len = (uint32_t)take;
				n++;
				want -= take;
				skip = 0;
			}
			if (want != 0) {
				return PBOX_AFX_TRUNCATED;
			}
			if (fold(ps + pbox_afx_csum_iov(part, n)) != 0xffff) {
				return PBOX_AFX_BAD_UDP_CSUM;
			}
		}
	}
	memset(out, 0, sizeof(*out));
	out->off = off + 8;
	out->len = ulen - 8;
	out->dport = dport;
	out->from.ip = src;
	memcpy(&out->from.port, f + off, 2);
	memcpy(out->from.mac, f + 6, 6);
	return PBOX_AFX_OK;
}

const char *pbox_afx_verdict_name(enum pbox_afx_verdict v)
{
	static const char *const names[PBOX_AFX_VERDICTS] = {
		[PBOX_AFX_OK] = "ok",
		[PBOX_AFX_NOT_OURS] = "not_ours",
		[PBOX_AFX_FRAGMENT] = "fragment",
		[PBOX_AFX_TRUNCATED] = "truncated",
		[PBOX_AFX_BAD_IP_CSUM] = "bad_ip_checksum",
		[PBOX_AFX_BAD_UDP_CSUM] = "bad_udp_checksum",
	};

	return (unsigned)v < PBOX_AFX_VERDICTS ? names[v] : "?";
}

void pbox_afx_build(uint8_t *f, const struct pbox_afx_addr *me, uint16_t sport,
		    const struct pbox_peer *to, uint32_t udp_payload, uint16_t ip_id,
		    uint16_t payload_sum)
{
	uint8_t *ip = f + ETH_LEN, *udp = ip + 20;
	uint16_t tot = htons((uint16_t)(20 + 8 + udp_payload));
	uint16_t ulen = htons((uint16_t)(8 + udp_payload));
	uint16_t v, id = htons(ip_id), sp = htons(sport);
	uint64_t acc;

	memcpy(f, to->mac, 6);
	memcpy(f + 6, me->mac, 6);
	f[12] = 0x08;
	f[13] = 0x00;
	ip[0] = 0x45;
	ip[1] = 0;
	memcpy(ip + 2, &tot, 2);
	memcpy(ip + 4, &id, 2);
	ip[6] = 0x40; /* DF: pbox never relies on IP fragmentation */
	ip[7] = 0;
	ip[8] = 64;
	ip[9] = 17;
	ip[10] = ip[11] = 0;
	memcpy(ip + 12, &me->ip, 4);
	memcpy(ip + 16, &to->ip, 4);
	v = (uint16_t)~fold(sum_bytes(ip, 20, 0));
	memcpy(ip + 10, &v, 2);
	memcpy(udp, &sp, 2);
	memcpy(udp + 2, &to->port, 2);
	memcpy(udp + 4, &ulen, 2);
	udp[6] = udp[7] = 0;
	acc = pseudo_sum(me->ip, to->ip, ulen) + sum_bytes(udp, 8, 0) + payload_sum;
	v = (uint16_t)~fold(acc);
	if (v == 0) {
		v = 0xffff; /* 0 would mean "no checksum" (RFC 768) */
	}
	memcpy(udp + 6, &v, 2);
}
