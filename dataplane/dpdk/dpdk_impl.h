/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internals of the DPDK data plane shared by its files (see dpdk.h for the contract).
 *
 * Ownership: struct pbox_dpdk and its ports are written by the control thread before
 * launch and after stop only; lcores read them. struct dpdk_core k is written by lcore k
 * only, except rel_bits (set by whichever thread frees an external-buffer mbuf: the
 * device's TX completion on lcore k, or the consumer of a net_ring) and its retire ring
 * (filled by pbox_dpdk_retire on any thread). The counters, tx_refs and released are read
 * by other threads with atomic loads.
 */
#ifndef PBOX_DPDK_IMPL_H
#define PBOX_DPDK_IMPL_H

#include <rte_ether.h>
#include <rte_flow.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "dpdk.h"

/* Frame layout in front of the pbox header: Ethernet, IPv4 without options, UDP. */
#define PBOX_DPDK_L2_LEN   14u
#define PBOX_DPDK_L3_LEN   20u
#define PBOX_DPDK_HDRS     (PBOX_DPDK_L2_LEN + PBOX_DPDK_L3_LEN + 8u)
#define PBOX_DPDK_INBOX    1024u /* software hand-off ring per core */
#define PBOX_DPDK_CACHE    128u  /* per-lcore mempool cache */
#define PBOX_DPDK_TX_RETRY 4u    /* tx_burst retries before unsent mbufs are freed */
#define PBOX_DPDK_RETIRE   1024u /* job states waiting for one core's replies (ring) */

struct dpdk_port {
	uint16_t id; /* DPDK port id */
	int socket;
	char name[64];
	struct rte_ether_addr mac;
	uint32_t addr;                /* our IPv4 address on this port, network order */
	struct rte_mempool *rx_pool;  /* RX frames (and ARP replies, which reuse them) */
	struct rte_mempool *hdr_pool; /* reply headers (whole frames in copy mode) */
	struct rte_mempool *ext_pool; /* zero-copy payload segments: no data room */
	uint16_t nb_rxd, nb_txd;
	bool zero_copy;    /* payload chained by reference */
	bool tx_ip_cksum;  /* the device fills the IPv4 header checksum */
	bool rx_ip_cksum;  /* the device flags IPv4 header checksums on receive */
	bool rx_udp_cksum; /* the device flags UDP checksums on receive */
	enum pbox_dpdk_steer_method steer;
	uint32_t nflows;
	struct rte_flow *flows[PBOX_MAX_CORES];
	bool started;
};

/* The private area of an external-buffer mbuf: its shared info and which reply it is. */
struct dpdk_tx_ref {
	struct rte_mbuf_ext_shared_info shinfo;
	struct dpdk_core *core;
	uint64_t ref;
};

/* A job state waiting for core's replies up to number `upto` to be released. */
struct dpdk_retire {
	struct pbox_job_state *st;
	uint64_t upto;
};

struct dpdk_txbuf {
	uint16_t n;
	struct rte_mbuf *m[PBOX_DPDK_MAX_BURST];
};

struct dpdk_core {
	struct pbox_dpdk_stats st; /* first: its own cache lines */
	struct pbox_engine engine;
	struct pbox_dpdk *d;
	uint32_t idx;
	unsigned lcore;
	struct rte_ring *inbox; /* frames other cores received for this one (MP/SC) */
	struct dpdk_txbuf txb[PBOX_DPDK_MAX_PORTS];
	uint64_t last_flush; /* TSC of the last TX flush */
	uint16_t ip_id;
	/* Zero-copy reply payload references (the engine's pbox_tx_ops numbering): tx_refs
	 * handed out, every ref <= released known released. rel_bits marks released refs
	 * above that, over a window of ref_window (a power of two larger than the refs that
	 * can be outstanding). tx_refs and released are stored atomically (the lcore is
	 * their only writer) for pbox_dpdk_retire on any thread. */
	uint64_t tx_refs;
	uint64_t released;
	uint64_t *rel_bits;
	uint64_t ref_window;
	bool reclaim_warned;
	/* The job table the datagram being handled was looked up in, and the one pinned
	 * (pbox_jobtab_get) by a wait for the device this loop iteration, if any. */
	const struct pbox_jobtab *cur_tab;
	struct pbox_jobtab *pinned;
	/* Job states waiting for this core's replies (MP/SC ring of struct dpdk_retire), the
	 * oldest taken out, and when it was. */
	struct rte_ring *retire;
	struct dpdk_retire retire_head;
	uint64_t retire_since;
	bool retire_warned;
} PBOX_CACHE_ALIGNED;

struct pbox_dpdk {
	struct pbox_dpdk_cfg cfg;
	struct pbox_jobtab *const *tab;
	uint16_t nports;
	struct dpdk_port ports[PBOX_DPDK_MAX_PORTS];
	struct dpdk_core *cores;
	uint64_t tsc_hz;
	uint64_t drain_tsc; /* cfg.tx_drain_us in TSC cycles */
	uint64_t idle_tsc;  /* cfg.idle_us in TSC cycles */
	bool stop;
	bool launched;
};

/* port.c */
int pbox_dpdk_ports_open(struct pbox_dpdk *d);
void pbox_dpdk_ports_close(struct pbox_dpdk *d);

/* tx.c: the engine's struct pbox_tx_ops over DPDK; ctx is the struct dpdk_core. */
extern const struct pbox_tx_ops pbox_dpdk_tx_ops;
/* Queue a ready frame on port p (ARP replies); the mbuf is the queue's from now on. */
void pbox_dpdk_tx_frame(struct dpdk_core *c, uint16_t p, struct rte_mbuf *m);
/* Hand every queued frame to the devices. */
void pbox_dpdk_tx_flush(struct dpdk_core *c);
/* Poll TX completions and advance c->released; returns it. */
uint64_t pbox_dpdk_tx_complete(struct dpdk_core *c);
/* Drop the references of retired job states whose replies this core has released (the
 * lcore, or the control thread once the lcores stopped). now: TSC. */
void pbox_dpdk_retire_poll(struct dpdk_core *c, uint64_t now);
/* End of a loop iteration: drop the table a device wait pinned. */
static inline void pbox_dpdk_unpin(struct dpdk_core *c)
{
	if (c->pinned != NULL) {
		struct pbox_jobtab *t = c->pinned;

		c->pinned = NULL;
		pbox_jobtab_put(t);
	}
}

/* rx.c: one received frame (the core frees it or passes it on). */
void pbox_dpdk_rx_frame(struct dpdk_core *c, const struct pbox_jobtab *tab, struct rte_mbuf *m,
			uint16_t p, bool steered);

#define DPDK_STAT_ADD(c, field, v) PBOX_STAT_ADD(&(c)->st, field, v)

#endif /* PBOX_DPDK_IMPL_H */
