/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The data-plane lcores: per-core state, the poll loop, start / stop / quiesce.
 *
 * Every lcore runs the core loop (core/loop.h) with the hooks below: rx drains its inbox
 * (frames other cores received for it) and an RX burst from its queue on every port into
 * the engine; the loop observes job-table changes; tx flushes TX when the input ran dry or
 * on the TSC drain timer, polls TX completions while replies are outstanding and releases
 * retired job states; the loop then runs the RCU quiescent state and busy / idle cycle
 * accounting. Without busy_poll an lcore idle for idle_us sleeps idle_sleep_us at a time,
 * RCU-offline (shared CPUs, tests).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <urcu-qsbr.h>

#include "common/log.h"
#include "core/loop.h"
#include "dpdk_impl.h"
#include "kernels/kernels.h"

const char *const pbox_dpdk_stat_names[] = {
	"rx_frames",     "rx_wire_bytes",  "steered_in",   "steered_out", "steer_full",
	"arp_replies",   "arp_ignored",    "ignored_l2",   "ignored_l3",  "bad_ip",
	"ip_fragments",  "bad_udp",        "truncated",    "tx_frames",   "tx_dropped",
	"tx_nombuf",     "tx_copied",      "tx_zero_copy", "tx_shared",   "tx_not_dma",
	"reclaim_waits", "reclaim_cycles", "retire_waits", "retire_full", "retire_stalled",
};
_Static_assert(sizeof(pbox_dpdk_stat_names) / sizeof(pbox_dpdk_stat_names[0]) == PBOX_DPDK_NSTATS,
	       "one name per counter");

static bool tx_pending(const struct dpdk_core *c)
{
	for (uint16_t pi = 0; pi < c->d->nports; pi++) {
		if (c->txb[pi].n != 0) {
			return true;
		}
	}
	return false;
}

static uint16_t port_index(const struct pbox_dpdk *d, uint16_t id)
{
	for (uint16_t i = 0; i < d->nports; i++) {
		if (d->ports[i].id == id) {
			return i;
		}
	}
	return 0;
}

/* ---- the lcore's hooks in the core loop (core/loop.h) --------------------------------- */

/* Drain the inbox (frames other cores received for this one), then an RX burst from this
 * core's queue on every port, through the engine. */
static enum pbox_poll_rc dpdk_rx(void *xc, struct pbox_loop *l)
{
	struct dpdk_core *c = xc;
	struct pbox_dpdk *d = c->d;
	struct rte_mbuf *pkts[PBOX_DPDK_MAX_BURST];
	uint16_t burst = (uint16_t)d->cfg.burst, q = (uint16_t)c->idx;
	const struct pbox_jobtab *tab;
	unsigned got = 0;

	c->full = false;
	if (c->inbox != NULL) {
		unsigned n = rte_ring_sc_dequeue_burst(c->inbox, (void **)pkts, burst, NULL);

		if (n != 0) {
			tab = pbox_loop_table(l);
			c->cur_tab = tab;
			for (unsigned i = 0; i < n; i++) {
				pbox_dpdk_rx_frame(c, tab, pkts[i], port_index(d, pkts[i]->port),
						   true);
			}
			got += n;
		}
	}
	for (uint16_t pi = 0; pi < d->nports; pi++) {
		uint16_t n = rte_eth_rx_burst(d->ports[pi].id, q, pkts, burst);

		if (n == 0) {
			continue;
		}
		/* Read the table after the receive: a worker admitted by a table published
		 * before its datagram was sent is always seen. */
		tab = pbox_loop_table(l);
		c->cur_tab = tab;
		for (uint16_t i = 0; i < n; i++) {
			/* The next frame's headers and payload start come in while this one is
			 * processed, and the mbuf after it. */
			if (i + 1 < n) {
				pbox_dpdk_rx_prefetch(pkts[i + 1]);
			}
			if (i + 2 < n) {
				rte_prefetch0(pkts[i + 2]);
			}
			pbox_dpdk_rx_frame(c, tab, pkts[i], pi, false);
		}
		got += n;
		c->full |= n == burst;
	}
	if (got == 0) {
		/* The table the loop observes next: replies it queues may wait for the
		 * device, which pins the table in use. */
		c->cur_tab = pbox_loop_table(l);
		return PBOX_POLL_IDLE;
	}
	return PBOX_POLL_BUSY;
}

/* After the table was observed: transmit, completions, retirements. */
static void dpdk_tx(void *xc, struct pbox_loop *l, enum pbox_poll_rc rx_rc)
{
	struct dpdk_core *c = xc;
	struct pbox_dpdk *d = c->d;
	uint64_t t1;

	(void)l;
	(void)rx_rc;
	/* Payloads shared by this iteration's replies are not shared on: the next
	 * iteration's sends may follow a rewrite of their memory. */
	pbox_dpdk_tx_fan_drop(c);
	t1 = rte_rdtsc();
	/* TX: at once when the input ran dry (latency), else on the drain timer (bursts
	 * under load). */
	if (tx_pending(c) && (!c->full || t1 - c->last_flush >= d->drain_tsc)) {
		pbox_dpdk_tx_flush(c);
	}
	/* Timer: replies the device has not released yet. */
	if (c->tx_refs != c->released && t1 - c->last_complete >= d->drain_tsc) {
		pbox_dpdk_tx_complete(c);
		c->last_complete = t1;
	}
	/* Retired job states this core's replies kept: released from here. */
	if (c->retire_head.st != NULL || !rte_ring_empty(c->retire)) {
		pbox_dpdk_retire_poll(c, t1);
	}
}

/* No job table is in use past this point. */
static void dpdk_end(void *xc)
{
	struct dpdk_core *c = xc;

	pbox_dpdk_unpin(c);
	c->cur_tab = NULL;
}

static void dpdk_fini(void *xc)
{
	struct dpdk_core *c = xc;

	pbox_dpdk_tx_flush(c);
	pbox_dpdk_tx_release(c);
	pbox_dpdk_unpin(c);
}

/* Idle without busy_poll: the loop sleeps idle_sleep_us at a time (no wait hook). */
static const struct pbox_loop_ops dpdk_loop_ops = {
	.rx = dpdk_rx,
	.tx = dpdk_tx,
	.end = dpdk_end,
	.fini = dpdk_fini,
};

static int lcore_main(void *arg)
{
	struct dpdk_core *c = arg;

	c->last_flush = rte_rdtsc();
	c->last_complete = c->last_flush;
	pbox_loop_run(&c->loop);
	return 0;
}

static void free_cores(struct pbox_dpdk *d)
{
	if (d->cores == NULL) {
		return;
	}
	for (uint32_t k = 0; k < d->cfg.ncores; k++) {
		struct dpdk_core *c = &d->cores[k];

		rte_ring_free(c->inbox);
		rte_ring_free(c->retire);
		rte_free(c->rel_bits);
		pbox_engine_fini(&c->engine);
	}
	rte_free(d->cores);
	d->cores = NULL;
}

/* Frames still parked in the inboxes go back to their pools before the pools go. */
static void drain_inboxes(struct pbox_dpdk *d)
{
	void *m;

	for (uint32_t k = 0; d->cores != NULL && k < d->cfg.ncores; k++) {
		while (d->cores[k].inbox != NULL && rte_ring_dequeue(d->cores[k].inbox, &m) == 0) {
			rte_pktmbuf_free(m);
		}
	}
}

static int cores_setup(struct pbox_dpdk *d, struct pbox_core_stats *const *stats)
{
	uint64_t window = 1024, outstanding = 0;
	unsigned lcore, k = 0;

	for (uint16_t i = 0; i < d->nports; i++) {
		if (d->ports[i].ext_pool != NULL) {
			outstanding += d->ports[i].ext_pool->size;
		}
		outstanding += (uint64_t)d->cfg.burst * 2;
	}
	/* Twice the references that can be outstanding at once (each holds a payload mbuf
	 * or sits in a TX buffer), so a reference's bit is clear before it is reused. */
	while (window < 2 * outstanding) {
		window *= 2;
	}
	d->cores =
		rte_zmalloc("pbox_cores", sizeof(*d->cores) * d->cfg.ncores, RTE_CACHE_LINE_SIZE);
	if (d->cores == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "dpdk: out of memory for %u cores", d->cfg.ncores);
		return -ENOMEM;
	}
	RTE_LCORE_FOREACH_WORKER(lcore)
	{
		struct dpdk_core *c = &d->cores[k];
		int socket = (int)rte_lcore_to_socket_id(lcore);

		c->d = d;
		c->idx = k;
		c->lcore = lcore;
		c->ref_window = window;
		/* Two bitmaps of window bits: released by other threads, by the lcore. */
		c->rel_bits =
			rte_zmalloc_socket("pbox_rel", window / 4, RTE_CACHE_LINE_SIZE, socket);
		c->rel_local = c->rel_bits != NULL ? c->rel_bits + window / 64 : NULL;
		if (c->rel_bits == NULL) {
			PBOX_LOG_ERR(TRANSPORT, "core %u: out of memory for reply tracking", k);
			return -ENOMEM;
		}
		{
			char name[RTE_RING_NAMESIZE];

			snprintf(name, sizeof(name), "pbox_retire_%u", k);
			c->retire = rte_ring_create_elem(name, sizeof(struct dpdk_retire),
							 PBOX_DPDK_RETIRE, socket, RING_F_SC_DEQ);
			if (c->retire == NULL) {
				PBOX_LOG_ERR(TRANSPORT,
					     "core %u: cannot create its retire ring: %s", k,
					     rte_strerror(rte_errno));
				return -ENOMEM;
			}
		}
		if (d->cfg.ncores > 1) {
			char name[RTE_RING_NAMESIZE];

			snprintf(name, sizeof(name), "pbox_inbox_%u", k);
			c->inbox = rte_ring_create(name, PBOX_DPDK_INBOX, socket, RING_F_SC_DEQ);
			if (c->inbox == NULL) {
				PBOX_LOG_ERR(TRANSPORT, "core %u: cannot create its inbox ring: %s",
					     k, rte_strerror(rte_errno));
				return -ENOMEM;
			}
		}
		c->engine.core = k;
		c->engine.kern = pbox_kernels_get();
		c->engine.tx = &pbox_dpdk_tx_ops;
		c->engine.tx_ctx = c;
		c->engine.stats = stats[k];
		c->engine.released = 0;
		c->loop = (struct pbox_loop){
			.ops = &dpdk_loop_ops,
			.xc = c,
			.engine = &c->engine,
			.tab = d->tab,
			.busy_poll = d->cfg.busy_poll,
			.idle_tsc = d->idle_tsc,
			.idle_sleep_us = d->cfg.idle_sleep_us,
		};
		k++;
	}
	return 0;
}

struct pbox_dpdk *pbox_dpdk_open(const struct pbox_dpdk_cfg *cfg, struct pbox_jobtab *const *tab,
				 struct pbox_core_stats *const *stats)
{
	unsigned workers = rte_lcore_count() - 1;
	struct pbox_dpdk *d;

	if (cfg->ncores == 0 || cfg->ncores > PBOX_MAX_CORES || cfg->burst == 0 ||
	    cfg->burst > PBOX_DPDK_MAX_BURST || cfg->naddrs == 0 ||
	    cfg->naddrs > PBOX_DPDK_MAX_PORTS) {
		PBOX_LOG_ERR(TRANSPORT,
			     "dpdk: bad configuration (%u cores, burst %u, %u addresses)",
			     cfg->ncores, cfg->burst, cfg->naddrs);
		return NULL;
	}
	if (workers != cfg->ncores) {
		PBOX_LOG_ERR(TRANSPORT,
			     "dpdk: the EAL has %u worker lcore%s but %u data-plane core%s are "
			     "configured: give one worker lcore per core (the first lcore runs the "
			     "control thread)",
			     workers, workers == 1 ? "" : "s", cfg->ncores,
			     cfg->ncores == 1 ? "" : "s");
		return NULL;
	}
	d = rte_zmalloc("pbox_dpdk", sizeof(*d), RTE_CACHE_LINE_SIZE);
	if (d == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "dpdk: out of memory");
		return NULL;
	}
	d->cfg = *cfg;
	d->tab = tab;
	d->tsc_hz = rte_get_tsc_hz();
	d->drain_tsc = d->tsc_hz / 1000000 * cfg->tx_drain_us;
	d->idle_tsc = d->tsc_hz / 1000000 * cfg->idle_us;
	if (pbox_dpdk_ports_open(d) != 0 || cores_setup(d, stats) != 0) {
		pbox_dpdk_close(d);
		return NULL;
	}
	return d;
}

int pbox_dpdk_launch(struct pbox_dpdk *d)
{
	for (uint32_t k = 0; k < d->cfg.ncores; k++) {
		int rc = rte_eal_remote_launch(lcore_main, &d->cores[k], d->cores[k].lcore);

		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT, "core %u: cannot launch on lcore %u: %s", k,
				     d->cores[k].lcore, strerror(-rc));
			pbox_dpdk_stop(d);
			return rc;
		}
		d->launched = true;
	}
	return 0;
}

void pbox_dpdk_retire(struct pbox_dpdk *d, struct pbox_job_state *st)
{
	for (uint32_t k = 0; k < d->cfg.ncores; k++) {
		struct dpdk_core *c = &d->cores[k];
		/* No core can reach st: every reply from its memory is numbered <= tx_refs now
		 * (the grace period that made it unreachable ordered the cores' stores). */
		struct dpdk_retire r = {
			.st = st,
			.upto = __atomic_load_n(&c->tx_refs, __ATOMIC_ACQUIRE),
		};

		if (__atomic_load_n(&c->released, __ATOMIC_ACQUIRE) >= r.upto) {
			continue;
		}
		pbox_job_state_get(st);
		if (rte_ring_mp_enqueue_elem(c->retire, &r, sizeof(r)) != 0) {
			/* Only when the core stopped completing: a leak, not a use after free. */
			__atomic_fetch_add(&c->st.retire_full, 1, __ATOMIC_RELAXED);
			PBOX_LOG_ERR(TRANSPORT,
				     "core %u: %u retired job states already wait for its replies: "
				     "this one stays mapped for good (is the TX path stalled?)",
				     k, PBOX_DPDK_RETIRE);
		}
	}
}

/* After the ports closed (every mbuf freed): drop what the retire rings still hold. */
static void retire_drain(struct pbox_dpdk *d)
{
	for (uint32_t k = 0; d->cores != NULL && k < d->cfg.ncores; k++) {
		struct dpdk_core *c = &d->cores[k];

		pbox_dpdk_retire_poll(c, rte_rdtsc());
		if (c->retire_head.st != NULL) {
			PBOX_LOG_ERR(TRANSPORT,
				     "core %u: %u retired job state(s) still referenced by replies "
				     "after the ports closed: left mapped",
				     k, 1 + (c->retire != NULL ? rte_ring_count(c->retire) : 0));
		}
	}
}

void pbox_dpdk_stop(struct pbox_dpdk *d)
{
	__atomic_store_n(&d->stop, true, __ATOMIC_RELEASE);
	for (uint32_t k = 0; d->cores != NULL && k < d->cfg.ncores; k++) {
		pbox_loop_stop(&d->cores[k].loop);
	}
	rte_eal_mp_wait_lcore();
	d->launched = false;
}

void pbox_dpdk_close(struct pbox_dpdk *d)
{
	if (d == NULL) {
		return;
	}
	if (d->launched) {
		pbox_dpdk_stop(d);
	}
	drain_inboxes(d);
	for (uint32_t k = 0; d->cores != NULL && k < d->cfg.ncores; k++) {
		pbox_dpdk_tx_release(&d->cores[k]); /* stopped lcores already did */
	}
	/* Closing a port frees what its TX rings still hold: the free callbacks still
	 * need the cores' reference bitmaps, so the cores go last. */
	pbox_dpdk_ports_close(d);
	retire_drain(d);
	free_cores(d);
	rte_free(d);
}

const struct pbox_dpdk_stats *pbox_dpdk_core_stats(const struct pbox_dpdk *d, uint32_t core)
{
	return &d->cores[core].st;
}

uint16_t pbox_dpdk_nports(const struct pbox_dpdk *d)
{
	return d->nports;
}

uint16_t pbox_dpdk_port_id(const struct pbox_dpdk *d, uint16_t i)
{
	return d->ports[i].id;
}

enum pbox_dpdk_steer_method pbox_dpdk_steer_method(const struct pbox_dpdk *d, uint16_t i)
{
	return d->ports[i].steer;
}

bool pbox_dpdk_port_zero_copy(const struct pbox_dpdk *d, uint16_t i)
{
	return d->ports[i].zero_copy;
}

bool pbox_dpdk_port_dma(const struct pbox_dpdk *d, uint16_t i)
{
	return d->ports[i].dma;
}
