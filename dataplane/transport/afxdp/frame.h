/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Ethernet / IPv4 / UDP framing of the AF_XDP transport: parsing received frames (untrusted
 * bytes, possibly in several UMEM buffers) down to the pbox datagram, and building reply
 * headers from a per-core template, with the Internet checksums (RFC 1071) both need.
 * Pure functions on caller memory: no allocation, no state, any thread.
 *
 * Neighbours: replies go to the Ethernet source of the worker's datagrams (the engine
 * pins a rank's MAC with its address on its first datagram, struct pbox_peer.mac), so no
 * ARP or neighbour-table lookup is made on the data path; the kernel answers ARP for the
 * interface's address (the XDP filter passes ARP).
 */
#ifndef PBOX_AFXDP_FRAME_H
#define PBOX_AFXDP_FRAME_H

#include <stdint.h>

#include "common/xport.h"

#define PBOX_AFX_HDR_LEN 42u /* Ethernet 14 + IPv4 20 + UDP 8, as built */

/* This end: where datagrams must be addressed and replies come from. Network order but
 * port_lo / nports (host order). */
struct pbox_afx_addr {
	uint8_t mac[6];
	uint16_t nports;
	uint32_t ip;
	uint16_t port_lo;
	uint16_t pad;
};

enum pbox_afx_verdict {
	PBOX_AFX_OK = 0,
	PBOX_AFX_NOT_OURS,     /* not IPv4 / UDP to ip:port_lo..+nports (VLAN, ARP, ...) */
	PBOX_AFX_FRAGMENT,     /* an IPv4 fragment: never reassembled here */
	PBOX_AFX_TRUNCATED,    /* headers or lengths beyond the frame */
	PBOX_AFX_BAD_IP_CSUM,  /* IPv4 header checksum */
	PBOX_AFX_BAD_UDP_CSUM, /* UDP checksum (0 = none, and a sender's unfinished offload,
				* accepted) */
	PBOX_AFX_VERDICTS,
};

/* A parsed datagram: the pbox bytes are len bytes from offset off of the frame. */
struct pbox_afx_rx {
	uint32_t off;
	uint32_t len;
	uint16_t dport; /* host order */
	uint16_t pad;
	struct pbox_peer from; /* ip, port, mac of the sender; ifport 0 */
};

/*
 * Parse the frame in seg[0..nseg) (its buffers in order; the Ethernet, IPv4 and UDP
 * headers must lie in seg[0], as every driver puts them). Checks both checksums. Returns a
 * verdict; *out is filled only for PBOX_AFX_OK.
 */
enum pbox_afx_verdict pbox_afx_parse(const struct pbox_iov *seg, unsigned nseg,
				     const struct pbox_afx_addr *me, struct pbox_afx_rx *out);

/* "ok", "not_ours", ... */
const char *pbox_afx_verdict_name(enum pbox_afx_verdict v);

/*
 * One's complement sum of seg[0..nseg) as one byte string, folded to 16 bits, in the byte
 * order of the data (add it to a header field as is). Start with sum 0.
 */
uint16_t pbox_afx_csum_iov(const struct pbox_iov *seg, unsigned nseg);

/*
 * Write the 42-byte Ethernet / IPv4 / UDP header of a datagram of udp_payload bytes from
 * me (source port sport, host order) to `to` at f: DF set, TTL 64, IP id ip_id, the IPv4
 * checksum, and the UDP checksum from payload_sum (pbox_afx_csum_iov of the payload).
 * udp_payload <= 65507.
 */
void pbox_afx_build(uint8_t *f, const struct pbox_afx_addr *me, uint16_t sport,
		    const struct pbox_peer *to, uint32_t udp_payload, uint16_t ip_id,
		    uint16_t payload_sum);

#endif /* PBOX_AFXDP_FRAME_H */
