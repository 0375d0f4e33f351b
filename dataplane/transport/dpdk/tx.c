/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Transmit: the engine's struct pbox_tx_ops over DPDK.
 *
 * A reply is a header mbuf (Ethernet, IPv4, UDP, the 64-byte pbox header) chained to an
 * external-buffer mbuf whose data is the payload in chunk memory: nothing is copied. The
 * external buffer's shared info lives in that mbuf's private area with its reference
 * number; its free callback (run by whoever frees the mbuf last: the PMD on TX
 * completion, a net_ring consumer, the flush that gives up on it) marks the reference
 * released.
 *
 * Per reply the work is kept to one header: the engine sends a chunk's result to every
 * worker from the same memory, so a payload mbuf attached in this loop iteration is
 * chained again behind the next worker's header (refcount + 1) instead of attaching a
 * new one (struct dpdk_fan); the Ethernet / IPv4 / UDP header comes from a prebuilt
 * template per (peer, port) with the IPv4 checksum finished from the template's sum; and
 * header and payload mbufs come from per-core stashes refilled a burst at a time. reclaim(upto)
 * waits until every reference up to `upto` is marked, polling TX completions meanwhile, RCU-offline
 * with the job table it uses pinned (dpdk.h). Retired job states wait in the core's retire ring for
 * their references to be released (pbox_dpdk_retire_poll, from the loop's completion timer).
 * Devices without multi-segment TX get one mbuf with the payload copied, which takes no
 * reference: the chunk memory is free again when send returns. Devices that read by DMA
 * (PCI NICs) are sent payloads by reference with their IOVA when chunk memory is DPDK
 * memory (pbox_dpdk_arena_ops); a payload elsewhere (or, in physical-address mode, split
 * across pages that are not contiguous) is copied into one frame (tx_not_dma).
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

/* Runs on whichever thread frees the payload mbuf: the lcore itself (a NIC's TX
 * completion, a flush giving up) marks its own bitmap with plain stores; any other
 * thread (a net_ring consumer, the control thread closing the ports) the shared one. */
static void ext_free_cb(void *addr, void *opaque)
{
	struct dpdk_tx_ref *r = opaque;
	struct dpdk_core *c = r->core;
	uint64_t b = r->ref & (c->ref_window - 1), bit = UINT64_C(1) << (b % 64);

	(void)addr;
	if (rte_lcore_id() == c->lcore) {
		c->rel_local[b / 64] |= bit;
	} else {
		__atomic_fetch_or(&c->rel_bits[b / 64], bit, __ATOMIC_RELEASE);
	}
}

/* Move `released` over every consecutive released reference. The lcore only (or the
 * control thread once the lcore stopped). */
static uint64_t advance(struct dpdk_core *c)
{
	uint64_t next = c->released + 1;

	while (next <= c->tx_refs) {
		uint64_t b = next & (c->ref_window - 1), i = b / 64;
		uint64_t bit = UINT64_C(1) << (b % 64);

		if (c->rel_local[i] & bit) {
			c->rel_local[i] &= ~bit;
		} else if (__atomic_load_n(&c->rel_bits[i], __ATOMIC_ACQUIRE) & bit) {
			__atomic_fetch_and(&c->rel_bits[i], ~bit, __ATOMIC_RELAXED);
		} else {
			break;
		}
		next++;
	}
	if (next - 1 != c->released) {
		__atomic_store_n(&c->released, next - 1, __ATOMIC_RELEASE);
	}
	return c->released;
}

void pbox_dpdk_tx_fan_drop(struct dpdk_core *c)
{
	struct rte_mbuf *m[PBOX_DPDK_FAN];

	for (unsigned i = 0; i < c->fan_nlive; i++) {
		struct dpdk_fan *f = &c->fan[c->fan_live[i]];

		m[i] = f->e;
		f->e = NULL;
		f->payload = NULL;
	}
	if (c->fan_nlive != 0) {
		rte_pktmbuf_free_bulk(m, c->fan_nlive);
		c->fan_nlive = 0;
	}
}

void pbox_dpdk_tx_release(struct dpdk_core *c)
{
	pbox_dpdk_tx_fan_drop(c);
	for (unsigned pi = 0; pi < PBOX_DPDK_MAX_PORTS; pi++) {
		if (c->hdr_stash[pi].n != 0) {
			rte_pktmbuf_free_bulk(c->hdr_stash[pi].m, c->hdr_stash[pi].n);
			c->hdr_stash[pi].n = 0;
		}
		if (c->ext_stash[pi].n != 0) {
			rte_pktmbuf_free_bulk(c->ext_stash[pi].m, c->ext_stash[pi].n);
			c->ext_stash[pi].n = 0;
		}
	}
}

/* One mbuf of mp, from a stash refilled a burst at a time (one pool access per burst, not
 * per reply); one at a time when the pool is too low for a burst. NULL: pool empty. */
static struct rte_mbuf *stash_get(struct dpdk_stash *s, struct rte_mempool *mp, unsigned burst)
{
	if (pbox_unlikely(s->n == 0)) {
		if (rte_pktmbuf_alloc_bulk(mp, s->m, burst) != 0) {
			return rte_pktmbuf_alloc(mp);
		}
		s->n = (uint16_t)burst;
	}
	return s->m[--s->n];
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

	/* Our own references on shared payloads would keep them from being released. */
	pbox_dpdk_tx_fan_drop(c);
	if (advance(c) >= upto) {
		return c->released;
	}
	/* The payloads may still be in our own TX buffers. */
	t0 = rte_rdtsc();
	pbox_dpdk_tx_flush(c);
	DPDK_STAT_ADD(c, reclaim_waits, 1);
	if (pbox_dpdk_tx_complete(c) >= upto) {
		DPDK_STAT_ADD(c, reclaim_cycles, rte_rdtsc() - t0);
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
	DPDK_STAT_ADD(c, reclaim_cycles, rte_rdtsc() - t0);
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

/* A 32-bit one's complement sum folded to 16 bits. */
static uint16_t fold16(uint32_t sum)
{
	sum = (sum >> 16) + (sum & 0xffff);
	return (uint16_t)((sum >> 16) + (sum & 0xffff));
}

static uint32_t tmpl_hash(const struct pbox_peer *to)
{
	uint64_t k = ((uint64_t)to->ip << 32) ^ ((uint64_t)to->port << 16) ^ to->ifport;

	return (uint32_t)((k * UINT64_C(0x9e3779b97f4a7c15)) >> 32) & (PBOX_DPDK_TMPL - 1);
}

/* The prebuilt header for replies to `to` from port p (built on first use, or when the
 * slot held another peer). */
static const struct dpdk_hdr_tmpl *tmpl_get(struct dpdk_core *c, const struct dpdk_port *p,
					    const struct pbox_peer *to)
{
	struct dpdk_hdr_tmpl *t = &c->tmpl[tmpl_hash(to)];
	struct pbox_peer key = *to;
	struct rte_ether_hdr *eth;
	struct rte_ipv4_hdr *ip;
	struct rte_udp_hdr *udp;

	key.pad = 0;
	if (pbox_likely(t->valid && memcmp(&t->to, &key, sizeof(key)) == 0)) {
		return t;
	}
	memset(t->hdr, 0, sizeof(t->hdr));
	eth = (struct rte_ether_hdr *)t->hdr;
	ip = (struct rte_ipv4_hdr *)(eth + 1);
	udp = (struct rte_udp_hdr *)(ip + 1);
	memcpy(&eth->dst_addr, to->mac, RTE_ETHER_ADDR_LEN);
	rte_ether_addr_copy(&p->mac, &eth->src_addr);
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->src_addr = p->addr;
	ip->dst_addr = to->ip;
	udp->src_port = rte_cpu_to_be_16((uint16_t)(c->d->cfg.base_port + c->idx));
	udp->dst_port = to->port;
	/* No UDP checksum (legal over IPv4): computing one would read the whole payload,
	 * which is what zero copy avoids; the Ethernet FCS covers it on the wire. */
	udp->dgram_cksum = 0;
	t->csum = rte_raw_cksum(ip, PBOX_DPDK_L3_LEN);
	t->to = key;
	t->valid = true;
	return t;
}

/* The reply's Ethernet / IPv4 / UDP header into h, for len bytes of payload. */
static void put_headers(struct dpdk_core *c, const struct dpdk_port *p, struct rte_mbuf *h,
			const struct pbox_peer *to, uint32_t len)
{
	const struct dpdk_hdr_tmpl *t = tmpl_get(c, p, to);
	uint8_t *f = rte_pktmbuf_mtod(h, uint8_t *);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(f + PBOX_DPDK_L2_LEN);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	uint16_t tot = rte_cpu_to_be_16((uint16_t)(PBOX_DPDK_L3_LEN + 8 + PBOX_WIRE_HDR_LEN + len));
	uint16_t id = rte_cpu_to_be_16(c->ip_id++);

	memcpy(f, t->hdr, PBOX_DPDK_HDRS);
	ip->total_length = tot;
	ip->packet_id = id;
	udp->dgram_len = rte_cpu_to_be_16((uint16_t)(8 + PBOX_WIRE_HDR_LEN + len));
	if (p->tx_ip_cksum) {
		h->l2_len = PBOX_DPDK_L2_LEN;
		h->l3_len = PBOX_DPDK_L3_LEN;
		h->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM;
	} else {
		/* The template's sum plus the two fields that change (rte_ipv4_cksum's
		 * result, without reading the header again). */
		ip->hdr_checksum = (uint16_t)~fold16(t->csum + tot + id);
	}
}

static uint32_t fan_hash(const void *payload)
{
	return (uint32_t)(((uint64_t)(uintptr_t)payload * UINT64_C(0x9e3779b97f4a7c15)) >> 58) &
	       (PBOX_DPDK_FAN - 1);
}

/* The IOVA of len bytes at payload for a device that reads by DMA: DPDK memory only
 * (the chunk arenas of pbox_dpdk_arena_ops), contiguous in IOVA space. RTE_BAD_IOVA:
 * the device cannot read it in one piece. */
static rte_iova_t payload_iova(const void *payload, uint32_t len)
{
	const struct rte_memseg *ms = rte_mem_virt2memseg(payload, NULL);
	const uint8_t *first = payload, *last = first + len - 1;
	rte_iova_t iova;

	if (ms == NULL) {
		return RTE_BAD_IOVA;
	}
	if (rte_eal_iova_mode() == RTE_IOVA_VA) {
		return (rte_iova_t)(uintptr_t)payload;
	}
	if (ms->iova == RTE_BAD_IOVA) {
		return RTE_BAD_IOVA;
	}
	iova = ms->iova + (rte_iova_t)(first - (const uint8_t *)ms->addr);
	/* Physical addresses: a payload across a page boundary must not be split. */
	if (last >= (const uint8_t *)ms->addr + ms->len &&
	    rte_mem_virt2iova(last) != iova + len - 1) {
		return RTE_BAD_IOVA;
	}
	return iova;
}

/* The payload mbuf for len bytes at payload on port pi: the one already attached for
 * another worker in this loop iteration (one more reference on it), else a new
 * external-buffer mbuf with the next reference number, remembered for the next workers.
 * NULL: pool empty, or (*not_dma set) a DMA device cannot read that memory. */
static struct rte_mbuf *payload_mbuf(struct dpdk_core *c, uint16_t pi, const void *payload,
				     uint32_t len, bool *not_dma)
{
	const struct dpdk_port *p = &c->d->ports[pi];
	uint32_t slot = fan_hash(payload);
	struct dpdk_fan *f = &c->fan[slot];
	/* Virtual devices read by virtual address; the IOVA is not used. */
	rte_iova_t iova = (rte_iova_t)(uintptr_t)payload;
	struct dpdk_tx_ref *r;
	struct rte_mbuf *e;

	if (f->payload == payload && f->len == len && f->port == pi) {
		rte_mbuf_refcnt_update(f->e, 1);
		DPDK_STAT_ADD(c, tx_shared, 1);
		return f->e;
	}
	if (p->dma) {
		iova = payload_iova(payload, len);
		if (pbox_unlikely(iova == RTE_BAD_IOVA)) {
			*not_dma = true;
			return NULL;
		}
	}
	e = stash_get(&c->ext_stash[pi], p->ext_pool, c->d->cfg.burst);
	if (pbox_unlikely(e == NULL)) {
		return NULL;
	}
	r = rte_mbuf_to_priv(e);
	__atomic_store_n(&c->tx_refs, c->tx_refs + 1, __ATOMIC_RELAXED);
	r->core = c;
	r->ref = c->tx_refs;
	r->shinfo.free_cb = ext_free_cb;
	r->shinfo.fcb_opaque = r;
	rte_mbuf_ext_refcnt_set(&r->shinfo, 1);
	rte_pktmbuf_attach_extbuf(e, (void *)(uintptr_t)payload, iova, (uint16_t)len, &r->shinfo);
	e->data_len = (uint16_t)len;
	e->pkt_len = len;
	/* Remember it, with a reference of the entry's own (the slot's previous payload,
	 * if any, is let go: a collision only costs a new attach). */
	if (f->e != NULL) {
		rte_pktmbuf_free(f->e);
	} else {
		c->fan_live[c->fan_nlive++] = (uint8_t)slot;
	}
	rte_mbuf_refcnt_update(e, 1);
	f->e = e;
	f->payload = payload;
	f->len = len;
	f->port = pi;
	return e;
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
	if (len != 0 && p->zero_copy) {
		bool not_dma = false;

		/* Only a payload attached by reference needs a reference number: a copied
		 * payload no longer references chunk memory once this returns. */
		e = payload_mbuf(c, to->ifport, payload, len, &not_dma);
		if (pbox_unlikely(e == NULL)) {
			if (!not_dma) {
				DPDK_STAT_ADD(c, tx_nombuf, 1);
				return -ENOBUFS;
			}
			/* Memory the device cannot read: one whole frame, copied. */
			DPDK_STAT_ADD(c, tx_not_dma, 1);
			h = rte_pktmbuf_alloc(p->copy_pool);
			goto built;
		}
	}
	h = stash_get(&c->hdr_stash[to->ifport], p->hdr_pool, d->cfg.burst);
built:
	if (pbox_unlikely(h == NULL)) {
		if (e != NULL) {
			rte_pktmbuf_free(e);
		}
		DPDK_STAT_ADD(c, tx_nombuf, 1);
		return -ENOBUFS;
	}
	put_headers(c, p, h, to, len);
	pb = rte_pktmbuf_mtod_offset(h, uint8_t *, PBOX_DPDK_HDRS);
	memcpy(pb, hdr, PBOX_WIRE_HDR_LEN);
	h->data_len = PBOX_DPDK_HDRS + PBOX_WIRE_HDR_LEN;
	h->pkt_len = h->data_len;
	if (e != NULL) {
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
	/* The engine is about to rewrite memory: no payload of it may be shared on. */
	pbox_dpdk_tx_fan_drop(ctx);
	return wait_released(ctx, upto);
}

const struct pbox_tx_ops pbox_dpdk_tx_ops = {
	.send = tx_send,
	.flush = tx_flush,
	.queued = tx_queued,
	.reclaim = tx_reclaim,
};
