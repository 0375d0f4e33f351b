/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Transmit: the engine's struct pbox_tx_ops over DPDK.
 *
 * A reply is a header mbuf (Ethernet, IPv4, UDP, the 64-byte pbox header) chained to an
 * external-buffer mbuf whose data is the payload in chunk memory: nothing is copied. The
 * external buffer's shared info lives in that mbuf's private area with the reply's
 * reference number; its free callback (run by whoever frees the mbuf: the PMD on TX
 * completion, a net_ring consumer, the flush that gives up on it) marks the reference
 * released. reclaim(upto) waits until every reference up to `upto` is marked, polling TX
 * completions meanwhile, RCU-offline with the job table it uses pinned (dpdk.h).
 * Retired job states wait in the core's retire ring for their references to be released
 * (pbox_dpdk_retire_poll, from the loop's completion timer). Devices without multi-segment
 * TX (and devices that read by DMA:
 * chunk memory is not mapped for them) get one mbuf with the payload copied, which takes
 * no reference: the chunk memory is free again when send returns.
 *
 * Frames are buffered per port and handed to the device in bursts: when a burst is full,
 * and from the lcore loop when its input ran dry or the TSC drain timer expired.
 */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_udp.h>
#include <urcu-qsbr.h>

#include "common/log.h"
#include "dpdk_impl.h"

static void mark_released(struct dpdk_core *c, uint64_t ref)
{
	uint64_t b = ref & (c->ref_window - 1);

	__atomic_fetch_or(&c->rel_bits[b / 64], UINT64_C(1) << (b % 64), __ATOMIC_RELEASE);
}

/* Runs on whichever thread frees the payload mbuf. */
static void ext_free_cb(void *addr, void *opaque)
{
	struct dpdk_tx_ref *r = opaque;

	(void)addr;
	mark_released(r->core, r->ref);
}

/* Move `released` over every consecutive released reference. */
static uint64_t advance(struct dpdk_core *c)
{
	uint64_t next = c->released + 1;

	while (next <= c->tx_refs) {
		uint64_t b = next & (c->ref_window - 1);
		uint64_t *w = &c->rel_bits[b / 64], bit = UINT64_C(1) << (b % 64);

		if (!(__atomic_load_n(w, __ATOMIC_ACQUIRE) & bit)) {
			break;
		}
		__atomic_fetch_and(w, ~bit, __ATOMIC_RELAXED);
		next++;
	}
	if (next - 1 != c->released) {
		__atomic_store_n(&c->released, next - 1, __ATOMIC_RELEASE);
	}
	return c->released;
}

static void flush_port(struct dpdk_core *c, uint16_t pi)
{
	struct dpdk_txbuf *b = &c->txb[pi];
	uint16_t id = c->d->ports[pi].id, sent = 0;

	for (unsigned tries = 0; sent < b->n && tries <= PBOX_DPDK_TX_RETRY; tries++) {
		uint16_t n = rte_eth_tx_burst(id, (uint16_t)c->idx, b->m + sent, b->n - sent);

		if (n == 0) {
			/* Full ring: let the device return what it has completed. */
			rte_eth_tx_done_cleanup(id, (uint16_t)c->idx, 0);
		}
		sent += n;
	}
	DPDK_STAT_ADD(c, tx_frames, sent);
	if (pbox_unlikely(sent < b->n)) {
		/* Reliability is above us: the worker retransmits and gets the reply again. */
		DPDK_STAT_ADD(c, tx_dropped, b->n - sent);
		rte_pktmbuf_free_bulk(b->m + sent, b->n - sent);
	}
	b->n = 0;
}

void pbox_dpdk_tx_flush(struct dpdk_core *c)
{
	for (uint16_t pi = 0; pi < c->d->nports; pi++) {
		if (c->txb[pi].n != 0) {
			flush_port(c, pi);
		}
	}
	c->last_flush = rte_rdtsc();
}

void pbox_dpdk_tx_frame(struct dpdk_core *c, uint16_t pi, struct rte_mbuf *m)
{
	struct dpdk_txbuf *b = &c->txb[pi];

	b->m[b->n++] = m;
	if (b->n >= c->d->cfg.burst) {
		flush_port(c, pi);
	}
}

uint64_t pbox_dpdk_tx_complete(struct dpdk_core *c)
{
	if (advance(c) == c->tx_refs) {
		return c->released;
	}
	for (uint16_t pi = 0; pi < c->d->nports; pi++) {
		if (c->d->ports[pi].zero_copy) {
			rte_eth_tx_done_cleanup(c->d->ports[pi].id, (uint16_t)c->idx, 0);
		}
	}
	return advance(c);
}

static uint64_t wait_released(struct dpdk_core *c, uint64_t upto)
{
	uint64_t t0;

	if (advance(c) >= upto) {
		return c->released;
	}
	/* The payloads may still be in our own TX buffers. */
	pbox_dpdk_tx_flush(c);
	DPDK_STAT_ADD(c, reclaim_waits, 1);
	if (pbox_dpdk_tx_complete(c) >= upto) {
		return c->released;
	}
	/* The device may take long (or never answer: a stalled link). The engine is in the
	 * middle of a datagram and cannot go back to the loop, so the core keeps the job
	 * table it uses alive by a reference instead of by staying RCU-online, and goes
	 * offline: grace periods, and every other job's table changes, go on meanwhile. The
	 * table is unpinned at the end of the loop iteration (pbox_dpdk_unpin). */
	if (c->pinned != c->cur_tab) {
		pbox_dpdk_unpin(c); /* an earlier burst's table: no longer in use */
		c->pinned = (struct pbox_jobtab *)(uintptr_t)c->cur_tab;
		pbox_jobtab_get(c->pinned);
	}
	rcu_thread_offline();
	t0 = rte_rdtsc();
	while (pbox_dpdk_tx_complete(c) < upto) {
		if (__atomic_load_n(&c->d->stop, __ATOMIC_ACQUIRE)) {
			break; /* shutting down: nothing is sent any more */
		}
		if (!c->reclaim_warned && rte_rdtsc() - t0 > c->d->tsc_hz) {
			c->reclaim_warned = true;
			PBOX_LOG_WARN(
				TRANSPORT,
				"core %u: waiting over 1 s for the device to release reply %llu "
				"(released up to %llu): is the TX path stalled?",
				c->idx, (unsigned long long)upto, (unsigned long long)c->released);
		}
		rte_pause();
	}
	rcu_thread_online();
	return c->released;
}

void pbox_dpdk_retire_poll(struct dpdk_core *c, uint64_t now)
{
	for (;;) {
		struct pbox_job_state *st;

		if (c->retire_head.st == NULL) {
			if (c->retire == NULL ||
			    rte_ring_sc_dequeue_elem(c->retire, &c->retire_head,
						     sizeof(c->retire_head)) != 0) {
				return;
			}
			c->retire_since = now;
			c->retire_warned = false;
			DPDK_STAT_ADD(c, retire_waits, 1);
		}
		if (advance(c) < c->retire_head.upto) {
			if (!c->retire_warned && now - c->retire_since > c->d->tsc_hz) {
				c->retire_warned = true;
				DPDK_STAT_ADD(c, retire_stalled, 1);
				PBOX_LOG_WARN(
					TRANSPORT,
					"core %u: a retired job state still waits for replies up "
					"to %llu (released up to %llu) after 1 s: its memory stays "
					"mapped until the device lets go; is the TX path stalled?",
					c->idx, (unsigned long long)c->retire_head.upto,
					(unsigned long long)c->released);
			}
			return;
		}
		st = c->retire_head.st;
		c->retire_head.st = NULL;
		pbox_job_state_put(st);
	}
}

static void build_headers(struct dpdk_core *c, const struct dpdk_port *p, struct rte_mbuf *h,
			  const struct pbox_peer *to, uint32_t len)
{
	struct rte_ether_hdr *eth = rte_pktmbuf_mtod(h, struct rte_ether_hdr *);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);

	memcpy(&eth->dst_addr, to->mac, RTE_ETHER_ADDR_LEN);
	rte_ether_addr_copy(&p->mac, &eth->src_addr);
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->type_of_service = 0;
	ip->total_length =
		rte_cpu_to_be_16((uint16_t)(PBOX_DPDK_L3_LEN + 8 + PBOX_WIRE_HDR_LEN + len));
	ip->packet_id = rte_cpu_to_be_16(c->ip_id++);
	ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->hdr_checksum = 0;
	ip->src_addr = p->addr;
	ip->dst_addr = to->ip;
	udp->src_port = rte_cpu_to_be_16((uint16_t)(c->d->cfg.base_port + c->idx));
	udp->dst_port = to->port;
	udp->dgram_len = rte_cpu_to_be_16((uint16_t)(8 + PBOX_WIRE_HDR_LEN + len));
	/* No UDP checksum (legal over IPv4): computing one would read the whole payload,
	 * which is what zero copy avoids; the Ethernet FCS covers it on the wire. */
	udp->dgram_cksum = 0;
	if (p->tx_ip_cksum) {
		h->l2_len = PBOX_DPDK_L2_LEN;
		h->l3_len = PBOX_DPDK_L3_LEN;
		h->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM;
	} else {
		ip->hdr_checksum = rte_ipv4_cksum(ip);
	}
}

static int tx_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		   const void *payload, uint32_t len)
{
	struct dpdk_core *c = ctx;
	struct pbox_dpdk *d = c->d;
	const struct dpdk_port *p;
	struct rte_mbuf *h, *e = NULL;
	uint8_t *pb;

	if (pbox_unlikely(to->ifport >= d->nports)) {
		return -EINVAL;
	}
	p = &d->ports[to->ifport];
	if (len != 0 && p->zero_copy &&
	    pbox_unlikely(c->tx_refs - c->released >= c->ref_window - 1)) {
		/* Every reference slot in use: wait for the oldest half. */
		wait_released(c, c->tx_refs - c->ref_window / 2);
	}
	h = rte_pktmbuf_alloc(p->hdr_pool);
	if (pbox_unlikely(h == NULL)) {
		DPDK_STAT_ADD(c, tx_nombuf, 1);
		return -ENOBUFS;
	}
	if (len != 0 && p->zero_copy) {
		e = rte_pktmbuf_alloc(p->ext_pool);
		if (pbox_unlikely(e == NULL)) {
			rte_pktmbuf_free(h);
			DPDK_STAT_ADD(c, tx_nombuf, 1);
			return -ENOBUFS;
		}
	}
	build_headers(c, p, h, to, len);
	pb = rte_pktmbuf_mtod_offset(h, uint8_t *, PBOX_DPDK_HDRS);
	memcpy(pb, hdr, PBOX_WIRE_HDR_LEN);
	h->data_len = PBOX_DPDK_HDRS + PBOX_WIRE_HDR_LEN;
	h->pkt_len = h->data_len;
	if (e != NULL) {
		struct dpdk_tx_ref *r = rte_mbuf_to_priv(e);

		/* Only a payload attached by reference needs one: a copied payload no longer
		 * references chunk memory once this returns. */
		__atomic_store_n(&c->tx_refs, c->tx_refs + 1, __ATOMIC_RELAXED);
		r->core = c;
		r->ref = c->tx_refs;
		r->shinfo.free_cb = ext_free_cb;
		r->shinfo.fcb_opaque = r;
		rte_mbuf_ext_refcnt_set(&r->shinfo, 1);
		/* Virtual devices read by virtual address; the IOVA is not used. */
		rte_pktmbuf_attach_extbuf(e, (void *)(uintptr_t)payload,
					  (rte_iova_t)(uintptr_t)payload, (uint16_t)len,
					  &r->shinfo);
		e->data_len = (uint16_t)len;
		e->pkt_len = len;
		h->next = e;
		h->nb_segs = 2;
		h->pkt_len += len;
		DPDK_STAT_ADD(c, tx_zero_copy, 1);
	} else if (len != 0) {
		memcpy(pb + PBOX_WIRE_HDR_LEN, payload, len);
		h->data_len = (uint16_t)(h->data_len + len);
		h->pkt_len += len;
		DPDK_STAT_ADD(c, tx_copied, 1);
	}
	pbox_dpdk_tx_frame(c, to->ifport, h);
	return 0;
}

/* The engine calls this after every receive burst. Handing the frames to the device is
 * the lcore loop's decision (when its input ran dry, or on the drain timer), so a burst
 * of replies goes out in one tx_burst under load. */
static void tx_flush(void *ctx)
{
	(void)ctx;
}

/* Only zero-copy replies are numbered: reclaim(queued()) then waits for the zero-copy
 * replies sent so far, which covers every one that may still reference chunk memory. */
static uint64_t tx_queued(void *ctx)
{
	const struct dpdk_core *c = ctx;

	return c->tx_refs;
}

static uint64_t tx_reclaim(void *ctx, uint64_t upto)
{
	return wait_released(ctx, upto);
}

const struct pbox_tx_ops pbox_dpdk_tx_ops = {
	.send = tx_send,
	.flush = tx_flush,
	.queued = tx_queued,
	.reclaim = tx_reclaim,
};
