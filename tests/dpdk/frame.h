/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the in-process DPDK tests and benchmarks play on the wire side of a net_ring port:
 * the appliance's address, the workers' addresses, Ethernet/IPv4/UDP/pbox frames as a
 * worker would send them, and the ring port itself. Single-threaded (the EAL main lcore).
 */
#ifndef PBOX_TEST_DPDK_FRAME_H
#define PBOX_TEST_DPDK_FRAME_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rte_eth_ring.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_ring.h>
#include <rte_udp.h>

#include <pbox/wire.h>

#define FRAME_APP_IP RTE_IPV4(10, 0, 0, 1) /* the appliance (host order) */
#define FRAME_HDRS   (14u + 20u + 8u)      /* Ethernet, IPv4 without options, UDP */

/* Rank's MAC, IPv4 address and UDP port (network order). */
static inline void frame_worker_addr(uint32_t rank, uint8_t mac[6], uint32_t *ip, uint16_t *port)
{
	static const uint8_t base[6] = { 0x02, 0x00, 0x5e, 0x10, 0x00, 0x00 };

	memcpy(mac, base, 6);
	mac[5] = (uint8_t)(rank + 1);
	*ip = htonl(RTE_IPV4(10, 0, 0, 10 + rank));
	*port = htons((uint16_t)(40000 + rank));
}

/* An Ethernet/IPv4/UDP/pbox frame from rank to UDP port dport of the appliance, with m's
 * header and m->frag_len bytes of payload, into buf; returns its length. No UDP checksum
 * (zero), as pbox's own replies. */
static inline uint32_t frame_build(uint8_t *buf, uint32_t rank, uint16_t dport,
				   const struct pbox_msg *m, const void *payload)
{
	static const uint8_t app_mac[6] = { 0x02, 0, 0, 0, 0, 0x01 };
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)buf;
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	struct pbox_wire_hdr *h = (struct pbox_wire_hdr *)(udp + 1);
	uint32_t ipaddr, len = m->frag_len;
	uint16_t sport;

	frame_worker_addr(rank, eth->src_addr.addr_bytes, &ipaddr, &sport);
	memcpy(eth->dst_addr.addr_bytes, app_mac, 6);
	eth->ether_type = htons(RTE_ETHER_TYPE_IPV4);
	memset(ip, 0, sizeof(*ip));
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->total_length = htons((uint16_t)(20 + 8 + PBOX_WIRE_HDR_LEN + len));
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->src_addr = ipaddr;
	ip->dst_addr = htonl(FRAME_APP_IP);
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	udp->src_port = sport;
	udp->dst_port = htons(dport);
	udp->dgram_len = htons((uint16_t)(8 + PBOX_WIRE_HDR_LEN + len));
	udp->dgram_cksum = 0;
	pbox_wire_encode(m, h);
	if (len != 0) {
		memcpy(h + 1, payload, len);
	}
	return FRAME_HDRS + PBOX_WIRE_HDR_LEN + len;
}

/*
 * A net_ring port of nq queue pairs named after prefix and seq: rx[q] is what we produce
 * and the port's RX queue q consumes, tx[q] what its TX queue q produces. Returns the port
 * id, or -1 (rings freed) if a ring or the port could not be made.
 */
static inline int frame_ring_port(const char *prefix, unsigned seq, unsigned nq, unsigned ring_sz,
				  struct rte_ring **rx, struct rte_ring **tx)
{
	char name[RTE_RING_NAMESIZE];
	int id = -1;
	unsigned q;

	for (q = 0; q < nq; q++) {
		snprintf(name, sizeof(name), "%s%u_rx%u", prefix, seq, q);
		rx[q] = rte_ring_create(name, ring_sz, SOCKET_ID_ANY,
					RING_F_SP_ENQ | RING_F_SC_DEQ);
		snprintf(name, sizeof(name), "%s%u_tx%u", prefix, seq, q);
		tx[q] = rte_ring_create(name, ring_sz, SOCKET_ID_ANY,
					RING_F_SP_ENQ | RING_F_SC_DEQ);
		if (rx[q] == NULL || tx[q] == NULL) {
			q++;
			goto fail;
		}
	}
	snprintf(name, sizeof(name), "net_ring_%s%u", prefix, seq);
	id = rte_eth_from_rings(name, rx, nq, tx, nq, (unsigned)rte_socket_id());
	if (id >= 0) {
		return id;
	}
fail:
	while (q-- > 0) {
		rte_ring_free(rx[q]);
		rte_ring_free(tx[q]);
		rx[q] = tx[q] = NULL;
	}
	return -1;
}

#endif /* PBOX_TEST_DPDK_FRAME_H */
