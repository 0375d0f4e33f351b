/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Receive: Ethernet / ARP / IPv4 / UDP on our own, then the pbox datagram to the engine
 * straight from the mbuf data (each segment in place: no staging copy).
 *
 * Every frame is either answered (ARP for our address), handed to the engine (a pbox UDP
 * port of this core), handed to its owner core (a pbox UDP port of another core), or
 * dropped and counted under one reason. Header bytes are bounds-checked against the
 * frame before use; a header split across segments is read through a local copy.
 */
#include <netinet/in.h>
#include <string.h>

#include <rte_arp.h>
#include <rte_ip.h>
#include <rte_udp.h>

#include "dpdk_impl.h"

/* Largest header stack we look at: Ethernet, IPv4 with 40 bytes of options, UDP. */
#define MAX_HDRS (PBOX_DPDK_L2_LEN + 60u + 8u)

static void arp_input(struct dpdk_core *c, struct rte_mbuf *m, uint16_t pi)
{
	const struct dpdk_port *p = &c->d->ports[pi];
	struct rte_ether_hdr *eth;
	struct rte_arp_hdr *a;

	if (m->pkt_len < PBOX_DPDK_L2_LEN + sizeof(*a)) {
		DPDK_STAT_ADD(c, truncated, 1);
		rte_pktmbuf_free(m);
		return;
	}
	eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
	a = (struct rte_arp_hdr *)(eth + 1);
	if (m->data_len < PBOX_DPDK_L2_LEN + sizeof(*a) ||
	    a->arp_hardware != rte_cpu_to_be_16(RTE_ARP_HRD_ETHER) ||
	    a->arp_protocol != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) ||
	    a->arp_hlen != RTE_ETHER_ADDR_LEN || a->arp_plen != 4 ||
	    a->arp_opcode != rte_cpu_to_be_16(RTE_ARP_OP_REQUEST) ||
	    a->arp_data.arp_tip != p->addr) {
		DPDK_STAT_ADD(c, arp_ignored, 1);
		rte_pktmbuf_free(m);
		return;
	}
	/* Answer in place (examples/l2fwd style): the request becomes the reply. */
	rte_ether_addr_copy(&a->arp_data.arp_sha, &eth->dst_addr);
	rte_ether_addr_copy(&p->mac, &eth->src_addr);
	a->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REPLY);
	a->arp_data.arp_tha = a->arp_data.arp_sha;
	a->arp_data.arp_tip = a->arp_data.arp_sip;
	a->arp_data.arp_sha = p->mac;
	a->arp_data.arp_sip = p->addr;
	if (m->nb_segs != 1) {
		/* Keep just the reply in the first segment. */
		rte_pktmbuf_free(m->next);
		m->next = NULL;
		m->nb_segs = 1;
		m->pkt_len = m->data_len;
	}
	m->ol_flags = 0;
	DPDK_STAT_ADD(c, arp_replies, 1);
	pbox_dpdk_tx_frame(c, pi, m);
}

/* The IPv4 header checksum: the device's verdict when it gave one, else computed. */
static bool ip_cksum_ok(const struct dpdk_port *p, const struct rte_mbuf *m,
			const struct rte_ipv4_hdr *ip, unsigned ihl)
{
	uint64_t f = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;

	if (p->rx_ip_cksum && f == RTE_MBUF_F_RX_IP_CKSUM_GOOD) {
		return true;
	}
	if (p->rx_ip_cksum && f == RTE_MBUF_F_RX_IP_CKSUM_BAD) {
		return false;
	}
	return rte_raw_cksum(ip, ihl) == 0xffff;
}

/* A 32-bit one's complement sum folded to 16 bits. */
static uint32_t fold(uint32_t sum)
{
	sum = (sum >> 16) + (sum & 0xffff);
	return (sum >> 16) + (sum & 0xffff);
}

/* One's complement sum of len bytes at offset off of m, over every segment, in the byte
 * order of rte_raw_cksum. DPDK 22.11's rte_raw_cksum_mbuf truncates the sum of a segment
 * that starts at an odd offset of the range before byte-swapping it, losing its carries. */
static uint16_t cksum_mbuf(const struct rte_mbuf *m, uint32_t off, uint32_t len)
{
	uint32_t sum = 0, done = 0;

	for (const struct rte_mbuf *s = m; s != NULL && done < len; s = s->next) {
		uint32_t take;
		uint16_t part;

		if (off >= s->data_len) {
			off -= s->data_len;
			continue;
		}
		take = PBOX_MIN(s->data_len - off, len - done);
		part = rte_raw_cksum(rte_pktmbuf_mtod_offset(s, const void *, off), take);
		sum += (done & 1) ? rte_bswap16(part) : part;
		done += take;
		off = 0;
	}
	return (uint16_t)fold(sum);
}

/*
 * The UDP checksum of the ulen-byte datagram at offset off of m: the device's verdict
 * when it gave one, else computed over every segment (the payload is read once more, as
 * the log at start-up says). A zero checksum means the sender computed none (IPv4). The
 * caller has checked that the datagram lies within m.
 */
static bool udp_cksum_ok(const struct dpdk_port *p, const struct rte_mbuf *m,
			 const struct rte_ipv4_hdr *ip, const struct rte_udp_hdr *udp, uint32_t off,
			 uint32_t ulen)
{
	uint64_t f = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
	uint16_t proto = rte_cpu_to_be_16(IPPROTO_UDP);
	uint32_t sum;

	if (p->rx_udp_cksum &&
	    (f == RTE_MBUF_F_RX_L4_CKSUM_GOOD || f == RTE_MBUF_F_RX_L4_CKSUM_NONE)) {
		return true;
	}
	if (p->rx_udp_cksum && f == RTE_MBUF_F_RX_L4_CKSUM_BAD) {
		return false;
	}
	if (udp->dgram_cksum == 0) {
		return true;
	}
	/* Pseudo-header: addresses, protocol, UDP length (RFC 768). */
	sum = fold(rte_raw_cksum(&ip->src_addr, 2 * sizeof(ip->src_addr)) + proto + udp->dgram_len);
	/* A sender that left the checksum to its NIC offload but never went through a NIC
	 * (a veth: the kernel hands AF_XDP such frames unfinished) leaves just the
	 * pseudo-header sum in the field: nothing to verify. A corrupted frame passes this
	 * only if its checksum field holds exactly that sum (1 in 65536). */
	if (udp->dgram_cksum == (uint16_t)sum) {
		return true;
	}
	return fold(sum + cksum_mbuf(m, off, ulen)) == 0xffff;
}

void pbox_dpdk_rx_prefetch(const struct rte_mbuf *m)
{
	const uint8_t *p = rte_pktmbuf_mtod(m, const uint8_t *);
	uint32_t n = PBOX_MIN((uint32_t)m->data_len, PBOX_DPDK_PREFETCH);

	/* The headers and the start of the payload: the hardware prefetcher follows the
	 * engine's sequential pass over the rest (prefetching all of an 8 KB payload stalls
	 * on the fill buffers and measured slower). */
	for (uint32_t off = 0; off < n; off += RTE_CACHE_LINE_SIZE) {
		rte_prefetch0(p + off);
	}
}

/* Hand m to core owner through its inbox; the owner parses it again. */
static void handoff(struct dpdk_core *c, struct rte_mbuf *m, uint32_t owner)
{
	struct dpdk_core *o = &c->d->cores[owner];

	if (pbox_unlikely(rte_ring_mp_enqueue(o->inbox, m) != 0)) {
		DPDK_STAT_ADD(c, steer_full, 1);
		rte_pktmbuf_free(m);
		return;
	}
	DPDK_STAT_ADD(c, steered_out, 1);
}

/* The pbox datagram of len bytes at offset off of m, to the engine: in place. */
static void to_engine(struct dpdk_core *c, const struct pbox_jobtab *tab, struct rte_mbuf *m,
		      uint32_t off, uint32_t len, const struct pbox_peer *from)
{
	struct pbox_iov iov[PBOX_ENGINE_MAX_SEGS];
	unsigned n = 0;
	uint32_t rem = len;

	if (pbox_likely(off + len <= m->data_len)) {
		pbox_engine_rx(&c->engine, tab, rte_pktmbuf_mtod_offset(m, const uint8_t *, off),
			       len, from);
		return;
	}
	for (const struct rte_mbuf *s = m; s != NULL && rem != 0; s = s->next) {
		uint32_t take;

		if (off >= s->data_len) {
			off -= s->data_len;
			continue;
		}
		if (n == PBOX_ENGINE_MAX_SEGS) {
			n++; /* more pieces than the engine takes: it counts the drop */
			break;
		}
		take = PBOX_MIN(s->data_len - off, rem);
		iov[n].base = rte_pktmbuf_mtod_offset(s, const uint8_t *, off);
		iov[n].len = take;
		n++;
		rem -= take;
		off = 0;
	}
	pbox_engine_rx_iov(&c->engine, tab, iov, n, from);
}

void pbox_dpdk_rx_frame(struct dpdk_core *c, const struct pbox_jobtab *tab, struct rte_mbuf *m,
			uint16_t pi, bool steered)
{
	const struct pbox_dpdk *d = c->d;
	const struct dpdk_port *p = &d->ports[pi];
	uint8_t copy[MAX_HDRS];
	const uint8_t *f;
	const struct rte_ether_hdr *eth;
	const struct rte_ipv4_hdr *ip;
	const struct rte_udp_hdr *udp;
	uint32_t plen = m->pkt_len, look = PBOX_MIN(plen, MAX_HDRS), ihl, tot, ulen, owner;
	struct pbox_peer from;

	if (!steered) {
		DPDK_STAT_ADD(c, rx_frames, 1);
		DPDK_STAT_ADD(c, rx_wire_bytes, plen);
	}
	if (pbox_unlikely(plen < PBOX_DPDK_L2_LEN)) {
		DPDK_STAT_ADD(c, truncated, 1);
		goto drop;
	}
	f = rte_pktmbuf_read(m, 0, look, copy);
	eth = (const struct rte_ether_hdr *)f;
	if (eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4)) {
		if (eth->ether_type == rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP)) {
			arp_input(c, m, pi);
			return;
		}
		DPDK_STAT_ADD(c, ignored_l2, 1);
		goto drop;
	}
	if (pbox_unlikely(plen < PBOX_DPDK_L2_LEN + PBOX_DPDK_L3_LEN)) {
		DPDK_STAT_ADD(c, truncated, 1);
		goto drop;
	}
	ip = (const struct rte_ipv4_hdr *)(f + PBOX_DPDK_L2_LEN);
	ihl = rte_ipv4_hdr_len(ip);
	tot = rte_be_to_cpu_16(ip->total_length);
	if (pbox_unlikely((ip->version_ihl >> 4) != 4 || ihl < PBOX_DPDK_L3_LEN)) {
		DPDK_STAT_ADD(c, bad_ip, 1);
		goto drop;
	}
	if (pbox_unlikely(PBOX_DPDK_L2_LEN + ihl > look || tot < ihl ||
			  PBOX_DPDK_L2_LEN + tot > plen)) {
		DPDK_STAT_ADD(c, truncated, 1);
		goto drop;
	}
	if (pbox_unlikely(!ip_cksum_ok(p, m, ip, ihl))) {
		DPDK_STAT_ADD(c, bad_ip, 1);
		goto drop;
	}
	if (ip->dst_addr != p->addr || ip->next_proto_id != IPPROTO_UDP) {
		DPDK_STAT_ADD(c, ignored_l3, 1);
		goto drop;
	}
	if (pbox_unlikely(ip->fragment_offset &
			  rte_cpu_to_be_16(RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK))) {
		DPDK_STAT_ADD(c, ip_fragments, 1);
		goto drop;
	}
	if (pbox_unlikely(tot < ihl + 8 || PBOX_DPDK_L2_LEN + ihl + 8 > look)) {
		DPDK_STAT_ADD(c, truncated, 1);
		goto drop;
	}
	udp = (const struct rte_udp_hdr *)(f + PBOX_DPDK_L2_LEN + ihl);
	owner = (uint32_t)rte_be_to_cpu_16(udp->dst_port) - d->cfg.base_port;
	if (owner >= d->cfg.ncores) {
		DPDK_STAT_ADD(c, ignored_l3, 1);
		goto drop;
	}
	ulen = rte_be_to_cpu_16(udp->dgram_len);
	if (pbox_unlikely(ulen < 8 || ulen > tot - ihl)) {
		DPDK_STAT_ADD(c, bad_udp, 1);
		goto drop;
	}
	if (owner != c->idx) {
		m->port = p->id; /* not every PMD sets it; the owner maps it back */
		handoff(c, m, owner);
		return;
	}
	/* On the owner only: a handed-off frame is not summed twice. */
	if (pbox_unlikely(!udp_cksum_ok(p, m, ip, udp, PBOX_DPDK_L2_LEN + ihl, ulen))) {
		DPDK_STAT_ADD(c, bad_udp, 1);
		goto drop;
	}
	if (steered) {
		DPDK_STAT_ADD(c, steered_in, 1);
	}
	from.ip = ip->src_addr;
	from.port = udp->src_port;
	memcpy(from.mac, &eth->src_addr, sizeof(from.mac));
	from.ifport = pi;
	from.pad = 0;
	to_engine(c, tab, m, PBOX_DPDK_L2_LEN + ihl + 8, ulen - 8, &from);
drop:
	rte_pktmbuf_free(m);
}
