/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The ABI between nicfw/pbox_xdp.bpf.c and user space (nicfw/loader.c, pboxd, tests): map
 * keys and values, counter layout, limits. Included by BPF code and by C11 user code, so it
 * uses only __u8..__u64 with explicit padding.
 *
 * Maps of the program (pinned by the loader under /sys/fs/bpf/pbox/<ifname>/):
 *
 *   pbox_jobs     HASH   __u32 job id            -> struct pbox_xdp_job
 *   pbox_cookies  HASH   struct pbox_xdp_rank_key -> __u64 session cookie (never 0)
 *   pbox_chunks   ARRAY  __u32 i -> __u64: the owner cores (one byte each) of chunk slots
 *                 8i .. 8i+7; job j's chunk c is slot j.chunk_base + c (c < j.nchunks).
 *                 Memory-mapped by the loader, which writes a job's owners with one copy.
 *   pbox_xsks     XSKMAP pbox_xdp_xsk_slot(core, rx queue) -> AF_XDP socket
 *   pbox_stats    PERCPU_ARRAY [0] -> struct pbox_xdp_stats
 *   pbox_owner    ARRAY  [0] -> struct pbox_xdp_owner: the process that attached it (not
 *                 read by the program; bound to it so that a later loader finds it)
 *
 * Writers: pboxd's control thread only (through the loader), so every update is ordered
 * against admissions: a job's cookies and chunk owners are written before the job entry
 * that makes them reachable, and deleted (or their slots reused) after it. A program run
 * that read a job entry just before the job went away may still read a reused slot: one
 * datagram of an ending session steered to another core, which drops it (misdirected).
 * The program only reads the first four maps and increments its own CPU's counters.
 *
 * XSK slots: an AF_XDP socket only receives frames of the (device, RX queue) it is bound
 * to, so a core that must see every datagram of its chunks whatever queue the NIC chose
 * binds one socket per RX queue (sharing its UMEM) and registers each in slot
 * core * PBOX_XDP_MAX_RXQ + queue. A slot left empty means "no socket": the program then
 * passes the datagram to the kernel (today's UDP transport).
 */
#ifndef PBOX_XDP_ABI_H
#define PBOX_XDP_ABI_H

#include <linux/types.h>

/* Owner cores the program can steer to (pboxd's PBOX_MAX_CORES; checked in the loader). */
#define PBOX_XDP_MAX_CORES 64
/* RX queues per device the program can steer from; frames of higher queues are passed. */
#define PBOX_XDP_MAX_RXQ   64
#define PBOX_XDP_XSK_SLOTS (PBOX_XDP_MAX_CORES * PBOX_XDP_MAX_RXQ)
/* Drop counters, indexed by enum pbox_drop_reason (include/pbox/wire.h). */
#define PBOX_XDP_DROP_SLOTS 32

/* Default capacities (the loader may set others before load). */
#define PBOX_XDP_DEFAULT_JOBS   1024
#define PBOX_XDP_DEFAULT_RANKS  65536
#define PBOX_XDP_DEFAULT_CHUNKS (1u << 20)

static inline __u32 pbox_xdp_xsk_slot(__u32 core, __u32 rxq)
{
	return core * PBOX_XDP_MAX_RXQ + rxq;
}

struct pbox_xdp_job {
	__u32 nworkers;   /* ranks 0..nworkers-1 */
	__u32 nchunks;    /* chunks with an owner in pbox_chunks (0: none loaded) */
	__u32 chunk_base; /* the first chunk's slot in pbox_chunks */
	__u32 flags;      /* reserved, 0 */
};

struct pbox_xdp_rank_key {
	__u32 job;
	__u32 rank;
};

/* Who attached the program: a later loader replaces it only when that process is gone. */
struct pbox_xdp_owner {
	__u32 pid;
	__u32 pad;
	__u64 start_time; /* the process's start, /proc/<pid>/stat field 22 (clock ticks) */
};

/*
 * Per-CPU counters; user space sums the CPUs. Every frame the program sees is counted
 * once under rx and once under exactly one verdict: pass_other, pass_fragment,
 * pass_no_owner, pass_queue, drop[r], core_redirect[c] or core_pass[c].
 */
struct pbox_xdp_stats {
	__u64 rx;            /* frames seen */
	__u64 pass_other;    /* not pbox (other ethertype, protocol, port or address) */
	__u64 pass_fragment; /* IPv4 fragments: the kernel reassembles them */
	__u64 pass_no_owner; /* valid; chunk without an owner in pbox_chunks: to the kernel */
	__u64 pass_queue;    /* valid; RX queue >= PBOX_XDP_MAX_RXQ: to the kernel */
	__u64 drop[PBOX_XDP_DROP_SLOTS];
	__u64 core_redirect[PBOX_XDP_MAX_CORES]; /* valid, to the owner core's XSK */
	__u64 core_pass[PBOX_XDP_MAX_CORES];     /* valid, owner has no XSK: to the kernel */
};

#endif /* PBOX_XDP_ABI_H */
