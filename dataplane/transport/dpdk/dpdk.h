/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The DPDK data plane: the chunk engine on poll-mode lcores, with Ethernet/IPv4/UDP done
 * here (ARP for the appliance's addresses, replies to each worker's MAC/IP/port), so plain
 * kernel-UDP workers on an ordinary network reach it.
 *
 * Shape (DPDK examples/l3fwd): data-plane core k runs on the k-th EAL worker lcore and owns
 * RX queue k and TX queue k of every port. A chunk's owner core is the only one that
 * processes its packets: workers address core k at UDP port base_port + k, the device
 * steers that port to queue k (rte_flow), and whatever the device could not steer (RSS,
 * or no steering at all) is handed to the owner through its software inbox ring, so the
 * rule holds on every device. The method in force is logged per port at start-up.
 *
 * Zero copy both ways: gradient payload is aggregated straight from the mbuf data (every
 * segment of multi-segment mbufs, in place); replies are a header mbuf chained to an
 * external-buffer mbuf that points into the chunk's result, released through the extbuf
 * free callback once the device (or, for net_ring, the consumer) lets go. A result sent
 * to several workers is attached once: every worker's header is chained to the same
 * payload mbuf (its reference count raised), so the cost per extra worker is one header.
 * Devices that cannot send multi-segment mbufs get the payload copied into one buffer
 * (logged).
 *
 * Lifetime of chunk memory: a zero-copy reply keeps the job state it points into alive.
 * When no published table lists a job state any more, pbox_dpdk_retire gives each core
 * whose replies issued so far are not all released one reference on it; the core drops it
 * from its completion path (the loop's TX-completion timer) once they are. Nothing is
 * released because a wait timed out: a core whose replies are never released keeps the
 * state (logged after 1 s, counted in retire_stalled).
 *
 * A core that must wait for the device in the middle of a datagram (the engine is about
 * to overwrite chunk memory a reply still references) pins the job table it is using and
 * goes RCU-offline while it polls TX completions, so grace periods, and with them every
 * other job's table changes, go on; it unpins at the end of that loop iteration.
 *
 * Threading: pbox_dpdk_eal_init, _open, _launch, _stop and _close are called by one
 * control thread, in that order; pbox_dpdk_retire by any thread between _open and _close.
 * Each lcore writes only its own struct (counters, queues, TX state); counters are read
 * by any thread with relaxed atomic loads. The job table is read by the lcores under
 * liburcu-qsbr (each lcore registers itself).
 */
#ifndef PBOX_DPDK_H
#define PBOX_DPDK_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/compiler.h"
#include "engine/engine.h"

#define PBOX_DPDK_MAX_PORTS 8u
#define PBOX_DPDK_MAX_BURST 64u

enum pbox_dpdk_steering {
	PBOX_DPDK_STEER_AUTO = 0, /* rte_flow if the device takes the rules, else RSS / none */
	PBOX_DPDK_STEER_FLOW,     /* rte_flow or fail */
	PBOX_DPDK_STEER_RSS,      /* RSS spreading plus software hand-off */
	PBOX_DPDK_STEER_SOFTWARE, /* no device steering: software hand-off only */
};

/* What a port ended up steering with (logged, and in the stats). */
enum pbox_dpdk_steer_method {
	PBOX_DPDK_METHOD_SINGLE = 0, /* one data-plane core: nothing to steer */
	PBOX_DPDK_METHOD_FLOW,       /* rte_flow rules: UDP port base_port + k -> queue k */
	PBOX_DPDK_METHOD_RSS,        /* RSS; misses handed to the owner in software */
	PBOX_DPDK_METHOD_SOFTWARE,   /* all arrive anywhere; handed to the owner */
};

struct pbox_dpdk_cfg {
	uint32_t ncores;    /* data-plane cores = EAL worker lcores */
	uint16_t base_port; /* host order: core k's UDP port is base_port + k */
	/* IPv4 addresses (network order): one per port, or one for every port. */
	uint32_t addrs[PBOX_DPDK_MAX_PORTS];
	unsigned naddrs;
	uint32_t mtu;     /* IP MTU of the ports */
	unsigned burst;   /* RX / TX burst (<= PBOX_DPDK_MAX_BURST) */
	unsigned rx_desc; /* requested descriptors per queue (adjusted by the device) */
	unsigned tx_desc;
	unsigned mbuf_bytes;  /* data room of RX mbufs (frames larger need RX scatter) */
	unsigned tx_drain_us; /* longest a queued reply waits for a fuller TX burst */
	bool busy_poll;       /* never sleep; else sleep idle_sleep_us after idle_us idle */
	unsigned idle_us;
	unsigned idle_sleep_us;
	enum pbox_dpdk_steering steering;
	bool zero_copy; /* replies reference chunk memory (when the device can) */
	/* Chunk memory comes from pbox_dpdk_arena_ops (installed with
	 * pbox_job_set_arena_ops): devices that read by DMA (PCI NICs) send replies
	 * zero-copy too, with the payload's IOVA; payloads outside DPDK memory are copied. */
	bool dma_arenas;
	/* Tests: treat every port as a DMA device (net_ring then takes the IOVA path). */
	bool force_dma;
};

/* Per-core transport counters (the engine's, including the per-reason drops, are in
 * struct pbox_core_stats). Written by the owning lcore only. */
struct pbox_dpdk_stats {
	uint64_t rx_frames;      /* frames taken from this core's RX queues */
	uint64_t rx_wire_bytes;  /* their bytes on the wire (without CRC) */
	uint64_t steered_in;     /* pbox datagrams other cores handed to this one */
	uint64_t steered_out;    /* pbox datagrams this core handed to their owner */
	uint64_t steer_full;     /* hand-offs dropped: the owner's inbox was full */
	uint64_t arp_replies;    /* ARP requests for our address answered */
	uint64_t arp_ignored;    /* other ARP (replies, requests for other hosts) */
	uint64_t ignored_l2;     /* not IPv4 / ARP (IPv6, LLDP, VLAN-tagged...) */
	uint64_t ignored_l3;     /* IPv4 not for us, not UDP, or to a non-pbox UDP port */
	uint64_t bad_ip;         /* malformed IPv4: version, length, header checksum */
	uint64_t ip_fragments;   /* fragmented IPv4 (pbox never fragments: dropped) */
	uint64_t bad_udp;        /* UDP length or checksum wrong */
	uint64_t truncated;      /* frames shorter than their Ethernet/IP/UDP headers */
	uint64_t tx_frames;      /* frames the device accepted */
	uint64_t tx_dropped;     /* frames the device would not take (freed) */
	uint64_t tx_nombuf;      /* replies not built: mbuf pool empty */
	uint64_t tx_copied;      /* reply payloads copied (device without multi-segment TX) */
	uint64_t tx_zero_copy;   /* reply payloads sent by reference (external buffers) */
	uint64_t tx_shared;      /* of those, a payload already attached for another worker */
	uint64_t tx_not_dma;     /* payloads copied: outside DPDK memory on a DMA device */
	uint64_t reclaim_waits;  /* times the engine had to wait for the NIC to release */
	uint64_t reclaim_cycles; /* TSC cycles spent in those waits */
	uint64_t retire_waits;   /* job states kept until this core's replies were released */
	uint64_t retire_full;    /* job states leaked: retire queue full (any thread, atomic) */
	/* Last: PBOX_DPDK_NSTATS counts the fields up to this one. */
	uint64_t retire_stalled; /* of retire_waits, still unreleased after 1 s (logged) */
} PBOX_CACHE_ALIGNED;

struct pbox_dpdk;

/*
 * Initialise the EAL with argv (argv[0] is the program name; the rest are EAL options,
 * passed through). Checks first what would make the EAL fail obscurely: no free
 * hugepages, no hugetlbfs mount (unless --no-huge / --in-memory). Returns 0, -EINVAL
 * (bad EAL arguments), -ENOMEM (no hugepages) or another negative errno, after logging
 * why. May be called once per process.
 */
int pbox_dpdk_eal_init(int argc, char **argv);

/* Whether argv (EAL options) already chooses the lcores (-l, -c, --lcores). */
bool pbox_dpdk_eal_has_cores(int argc, char *const *argv);

/*
 * The EAL "--lcores" value for ncores data-plane cores, into buf (len bytes): lcore 0 (the
 * control thread) and data-plane lcore k + 1 may run on any CPU of allowed, except that
 * lcore k + 1 runs on cpus[k] when cpus[k] >= 0 (pinned). The lcores that may run
 * anywhere form one group, and CPU sets are written as ranges, so the length grows with
 * the runs of CPUs, not their number: e.g. "(0-1,3)@(0-63),2@5". Returns 0, -EINVAL
 * (allowed is empty) or -E2BIG (buf too small).
 */
int pbox_dpdk_lcores_arg(const cpu_set_t *allowed, const int *cpus, uint32_t ncores, char *buf,
			 size_t len);

/* Release what the EAL holds (after pbox_dpdk_close). */
void pbox_dpdk_eal_cleanup(void);

/*
 * Configure and start every available port: capability negotiation (offloads and RSS
 * masked by what the device supports, each reduction logged), descriptor counts adjusted
 * with the device, mempools on the port's NUMA socket (pbox_dpdk_pool_size), one RX and
 * one TX queue per core, steering. tab points at the RCU-published job table the lcores
 * read; stats[k] receives core k's engine counters. Returns NULL after logging why (no
 * ports, too few queues, MTU beyond the device, steering = flow on a device without it,
 * too few worker lcores...).
 */
struct pbox_dpdk *pbox_dpdk_open(const struct pbox_dpdk_cfg *cfg, struct pbox_jobtab *const *tab,
				 struct pbox_core_stats *const *stats);

/* Start the data-plane loop on every worker lcore. 0 or a negative errno. */
int pbox_dpdk_launch(struct pbox_dpdk *d);

/*
 * st is no longer reachable by any lcore (the last table listing it was dropped after a
 * grace period, or stopped lcores): keep it alive until every zero-copy reply the cores
 * have issued so far is released, then drop those references from the cores' completion
 * path (pbox_job_state_put, so the last one runs st->release there). Returns at once.
 * Any thread, between _open and _close (a caller that retires from call_rcu callbacks
 * runs rcu_barrier() after _stop and before _close). If a core's retire queue is full (a
 * core whose device stopped completing), its reference is kept forever: logged, counted
 * in retire_full. _close drops the references whose replies its port close released.
 */
void pbox_dpdk_retire(struct pbox_dpdk *d, struct pbox_job_state *st);

/*
 * Fill *ops with an arena allocator (pbox_job_set_arena_ops) that puts chunk memory in
 * DPDK memory on NUMA socket `socket` (hugepages, unless the EAL runs --no-huge; another
 * socket if that one has no room, logged), so that devices that read by DMA can send
 * replies from it. Arenas are freed with rte_free by whoever drops a state's last
 * reference. Valid between pbox_dpdk_eal_init and pbox_dpdk_eal_cleanup: every state
 * created with it must be freed before the EAL goes.
 */
void pbox_dpdk_arena_ops(struct pbox_arena_ops *ops, int socket);

/* Stop the lcores and wait for them. */
void pbox_dpdk_stop(struct pbox_dpdk *d);

/* Stop and close the ports, free pools and rings. d may be NULL. */
void pbox_dpdk_close(struct pbox_dpdk *d);

/* Counters of core k (read with pbox_stat_read on each field). */
const struct pbox_dpdk_stats *pbox_dpdk_core_stats(const struct pbox_dpdk *d, uint32_t core);

uint16_t pbox_dpdk_nports(const struct pbox_dpdk *d);
/* DPDK port id of our port i. */
uint16_t pbox_dpdk_port_id(const struct pbox_dpdk *d, uint16_t i);
enum pbox_dpdk_steer_method pbox_dpdk_steer_method(const struct pbox_dpdk *d, uint16_t i);
const char *pbox_dpdk_steer_name(enum pbox_dpdk_steer_method m);
/* Whether replies on port i are zero-copy. */
bool pbox_dpdk_port_zero_copy(const struct pbox_dpdk *d, uint16_t i);
/* Whether port i's device reads replies by DMA (needs chunk memory in DPDK memory to send
 * them zero-copy: cfg.dma_arenas). */
bool pbox_dpdk_port_dma(const struct pbox_dpdk *d, uint16_t i);

/* Names of the struct pbox_dpdk_stats fields, in order (for JSON and text output). The
 * count ends at the last field: the struct's size also counts its cache-line padding. */
extern const char *const pbox_dpdk_stat_names[];
#define PBOX_DPDK_NSTATS (offsetof(struct pbox_dpdk_stats, retire_stalled) / sizeof(uint64_t) + 1)

/*
 * Mbufs a pool must hold so that no queue starves (l3fwd's sizing, spelled out), for nq
 * queues of desc descriptors each, bursts of burst, parked (mbufs that may wait outside
 * the device: software hand-off rings, TX buffers) and per-lcore caches of cache:
 *     nq * (desc + 2 * burst + cache) + parked
 * rounded up to 2^k - 1 (the most efficient size of a ring-backed mempool), at least 1023.
 */
unsigned pbox_dpdk_pool_size(unsigned nq, unsigned desc, unsigned burst, unsigned cache,
			     unsigned parked);

#endif /* PBOX_DPDK_H */
