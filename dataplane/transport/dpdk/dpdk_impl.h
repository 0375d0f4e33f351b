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

#include "core/loop.h"
#include "dpdk.h"

/* Frame layout in front of the pbox header: Ethernet, IPv4 without options, UDP. */
#define PBOX_DPDK_L2_LEN   14u
#define PBOX_DPDK_L3_LEN   20u
#define PBOX_DPDK_HDRS     (PBOX_DPDK_L2_LEN + PBOX_DPDK_L3_LEN + 8u)
#define PBOX_DPDK_INBOX    1024u /* software hand-off ring per core */
#define PBOX_DPDK_CACHE    128u  /* per-lcore mempool cache */
#define PBOX_DPDK_TX_RETRY 4u    /* tx_burst retries before unsent mbufs are freed */
#define PBOX_DPDK_RETIRE   1024u /* job states waiting for one core's replies (ring) */
#define PBOX_DPDK_FAN      64u   /* reply payloads shared by workers, per core (2^k) */
#define PBOX_DPDK_TMPL     64u   /* prebuilt reply headers, per core (2^k) */
#define PBOX_DPDK_PREFETCH 512u  /* bytes of the next frame prefetched */

struct dpdk_port {
	uint16_t id; /* DPDK port id */
	int socket;
	char name[64];
	struct rte_ether_addr mac;
	uint32_t addr;                /* our IPv4 address on this port, network order */
	struct rte_mempool *rx_pool;  /* RX frames (and ARP replies, which reuse them) */
	struct rte_mempool *hdr_pool; /* reply headers (whole frames in copy mode) */
	struct rte_mempool *ext_pool; /* zero-copy payload segments: no data room */
	/* Whole frames for payloads a DMA device cannot read (outside DPDK memory). */
	struct rte_mempool *copy_pool;
	uint16_t nb_rxd, nb_txd;
	bool zero_copy;    /* payload chained by reference */
	bool dma;          /* the device reads by DMA: payloads need a real IOVA */
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

/*
 * A reply payload attached once (one external-buffer mbuf, one reference number) and
 * chained behind the header of every worker that is sent the same bytes: the engine
 * sends a chunk's result to each worker from the same memory. The entry holds one mbuf
 * reference of its own; entries are dropped (pbox_dpdk_tx_fan_drop) at the end of each
 * loop iteration and before any wait for releases, so a payload is only shared while the
 * engine cannot have rewritten its memory (it reclaims before rewriting).
 */
struct dpdk_fan {
	const void *payload;
	struct rte_mbuf *e;
	uint32_t len;
	uint16_t port;
};

/*
 * The Ethernet / IPv4 / UDP header of replies to one peer from one port, prebuilt: only
 * the lengths, the IP id and the IPv4 checksum change per reply. csum is the one's
 * complement sum of the IPv4 header with those three fields zero.
 */
struct dpdk_hdr_tmpl {
	uint8_t hdr[PBOX_DPDK_HDRS] __attribute__((aligned(8))); /* as in an mbuf */
	struct pbox_peer to; /* key: address, port, MAC, our port (pad zero) */
	uint32_t csum;
	bool valid;
};

/* Mbufs allocated in bulk, handed out one at a time (per core and pool). */
struct dpdk_stash {
	uint16_t n;
	struct rte_mbuf *m[PBOX_DPDK_MAX_BURST];
};

struct dpdk_txbuf {
	uint16_t n;
	struct rte_mbuf *m[PBOX_DPDK_MAX_BURST];
};

struct dpdk_core {
	struct pbox_dpdk_stats st; /* first: its own cache lines */
	struct pbox_engine engine;
	struct pbox_loop loop; /* the core loop running this core's hooks (lcore.c) */
	struct pbox_dpdk *d;
	uint32_t idx;
	unsigned lcore;
	struct rte_ring *inbox; /* frames other cores received for this one (MP/SC) */
	struct dpdk_txbuf txb[PBOX_DPDK_MAX_PORTS];
	uint64_t last_flush;    /* TSC of the last TX flush */
	uint64_t last_complete; /* TSC of the last TX completion poll */
	bool full;              /* this iteration's rx filled a whole burst on a port */
	uint16_t ip_id;
	/* Zero-copy reply payload references (the engine's pbox_tx_ops numbering): tx_refs
	 * handed out, every ref <= released known released. rel_bits marks released refs
	 * above that, over a window of ref_window (a power of two larger than the refs that
	 * can be outstanding): rel_local those the lcore itself released (TX completion on
	 * a NIC: plain stores, no atomic read-modify-write), rel_bits those other threads
	 * released (a net_ring consumer; atomic). tx_refs and released are stored
	 * atomically (the lcore is their only writer) for pbox_dpdk_retire on any thread. */
	uint64_t tx_refs;
	uint64_t released;
	uint64_t *rel_bits;
	uint64_t *rel_local;
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
	/* Transmit state of tx.c: shared payloads (fan_live lists the used entries), header
	 * templates, bulk-allocated header and payload mbufs per port. */
	unsigned fan_nlive;
	uint8_t fan_live[PBOX_DPDK_FAN];
	struct dpdk_fan fan[PBOX_DPDK_FAN];
	struct dpdk_hdr_tmpl tmpl[PBOX_DPDK_TMPL];
	struct dpdk_stash hdr_stash[PBOX_DPDK_MAX_PORTS];
	struct dpdk_stash ext_stash[PBOX_DPDK_MAX_PORTS];
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
/* Drop the shared-payload entries (their own mbuf references). The lcore, any time. */
void pbox_dpdk_tx_fan_drop(struct dpdk_core *c);
/* Give back every mbuf the core holds for transmit (shared payloads, bulk-allocated
 * mbufs): the lcore when it stops, or the control thread after (before the pools go). */
void pbox_dpdk_tx_release(struct dpdk_core *c);
/* Prefetch the first PBOX_DPDK_PREFETCH bytes of frame m (its first segment) into the
 * cache: they arrive while the current frame is processed. */
void pbox_dpdk_rx_prefetch(const struct rte_mbuf *m);
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
