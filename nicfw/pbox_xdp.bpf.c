/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox's XDP filter and steering program (see pbox_xdp_abi.h for its maps).
 *
 * For every frame: Ethernet, up to two VLAN tags (802.1Q / 802.1ad), IPv4 (any ihl), UDP.
 * A UDP datagram to one of pbox's data ports (port_lo .. port_lo + nports - 1, to data_addr
 * unless that is 0) is checked like pbox_wire_validate() checks it for the appliance, as far
 * as the checks need no job geometry: header present (truncated), magic, version, type,
 * job admitted, direction and sender rank, session cookie. A failing datagram is dropped
 * here and counted under the same enum pbox_drop_reason as the engine would count it. When
 * a datagram fails several checks the reason is the first failing check of this order,
 * which may differ from the engine's first (the engine checks hdr_len, length, flags,
 * reserved and encoding before the job): both would drop it.
 *
 * A datagram that passes is redirected to the AF_XDP socket of the core that owns its
 * chunk (its byte in pbox_chunks, then slot core * PBOX_XDP_MAX_RXQ + RX queue of pbox_xsks), or
 * passed to the kernel when there is no such socket (the kernel-UDP transport then
 * receives it, and the engine makes the checks that need the job's geometry). Everything
 * else passes untouched: ARP, IPv6, TCP, other ports, IPv4 fragments (reassembled by the
 * kernel; only a first fragment's pbox header is checked) and frames too short to be UDP.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include <pbox/wire.h>

#include "pbox_xdp_abi.h"

_Static_assert(PBOX_DROP_COUNT <= PBOX_XDP_DROP_SLOTS, "drop counters of pbox_xdp_stats");

/* Load-time knobs (set by the loader before load). */
const volatile __u16 port_lo = 7100; /* first data port (host order) */
const volatile __u16 nports = 1;     /* data ports: port_lo .. port_lo + nports - 1 */
const volatile __u32 data_addr = 0;  /* IPv4 destination (network order); 0: any */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PBOX_XDP_DEFAULT_JOBS);
	__type(key, __u32);
	__type(value, struct pbox_xdp_job);
} pbox_jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PBOX_XDP_DEFAULT_RANKS);
	__type(key, struct pbox_xdp_rank_key);
	__type(value, __u64);
} pbox_cookies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PBOX_XDP_DEFAULT_CHUNKS / 8);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} pbox_chunks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, PBOX_XDP_XSK_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} pbox_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pbox_xdp_stats);
} pbox_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pbox_xdp_owner);
} pbox_owner SEC(".maps");

struct vlan_tag {
	__be16 tci;
	__be16 proto;
};

/* The part of the pbox header (include/pbox/wire.h) the checks read: magic .. chunk, the
 * fields before iter. */
#define PBOX_HDR_HEAD_LEN offsetof(struct pbox_wire_hdr, iter)

static __always_inline int drop(struct pbox_xdp_stats *st, __u32 reason)
{
	if (reason < PBOX_XDP_DROP_SLOTS) {
		st->drop[reason]++;
	}
	return XDP_DROP;
}

/* Checks of a datagram to a data port whose pbox header starts at hdr_off; fragment: a
 * first IPv4 fragment (checked, never redirected). */
static __always_inline int check_pbox(struct xdp_md *ctx, struct pbox_xdp_stats *st, __u32 hdr_off,
				      __u32 udp_len, int fragment)
{
	struct pbox_xdp_rank_key rk;
	struct pbox_wire_hdr h;
	struct pbox_xdp_job *job;
	__u64 *cookie, *owners;
	__u32 chunk, idx, core, slot, rxq;
	long act;

	/* The datagram must hold the 64-byte header, and the frame the whole datagram (a
	 * frame cut short is truncated, whatever its UDP length says). A first fragment
	 * holds only part of the datagram: its header must be in it. */
	if (udp_len < sizeof(struct udphdr) + PBOX_WIRE_HDR_LEN ||
	    bpf_xdp_get_buff_len(ctx) <
		    hdr_off + (fragment ? PBOX_WIRE_HDR_LEN : udp_len - sizeof(struct udphdr))) {
		return drop(st, PBOX_DROP_TRUNCATED);
	}
	/* Through the helper: the header may straddle fragments of a multi-buffer frame. */
	if (bpf_xdp_load_bytes(ctx, hdr_off, &h, PBOX_HDR_HEAD_LEN) != 0) {
		return drop(st, PBOX_DROP_TRUNCATED);
	}
	if (h.magic != bpf_htonl(PBOX_WIRE_MAGIC)) {
		return drop(st, PBOX_DROP_BAD_MAGIC);
	}
	if (h.version != PBOX_WIRE_VERSION) {
		return drop(st, PBOX_DROP_BAD_VERSION);
	}
	if (h.type == 0 || h.type > PBOX_MSG_TYPE_MAX) {
		return drop(st, PBOX_DROP_BAD_TYPE);
	}
	job = bpf_map_lookup_elem(&pbox_jobs, &(__u32){ bpf_ntohl(h.job) });
	if (job == NULL) {
		return drop(st, PBOX_DROP_UNKNOWN_JOB);
	}
	/* The appliance takes PUSH, PULL and INIT from a rank of the job. */
	if ((h.type != PBOX_MSG_PUSH && h.type != PBOX_MSG_PULL && h.type != PBOX_MSG_INIT) ||
	    bpf_ntohl(h.sender) >= job->nworkers) {
		return drop(st, PBOX_DROP_BAD_SENDER);
	}
	rk.job = bpf_ntohl(h.job);
	rk.rank = bpf_ntohl(h.sender);
	cookie = bpf_map_lookup_elem(&pbox_cookies, &rk);
	if (cookie == NULL || *cookie == 0 || *cookie != bpf_be64_to_cpu(h.cookie)) {
		return drop(st, PBOX_DROP_BAD_COOKIE);
	}
	if (fragment) {
		st->pass_fragment++;
		return XDP_PASS;
	}
	chunk = bpf_ntohl(h.chunk);
	idx = job->chunk_base + chunk;
	owners = chunk < job->nchunks ? bpf_map_lookup_elem(&pbox_chunks, &(__u32){ idx / 8 })
				      : NULL;
	core = owners != NULL ? (__u32)(*owners >> (idx % 8 * 8)) & 0xff : PBOX_XDP_MAX_CORES;
	if (core >= PBOX_XDP_MAX_CORES) {
		st->pass_no_owner++;
		return XDP_PASS;
	}
	rxq = ctx->rx_queue_index;
	if (rxq >= PBOX_XDP_MAX_RXQ) {
		st->pass_queue++;
		return XDP_PASS;
	}
	slot = pbox_xdp_xsk_slot(core, rxq);
	/* An empty slot: no socket for that core on this queue; the kernel takes it. */
	act = bpf_redirect_map(&pbox_xsks, slot, XDP_PASS);
	if (act == XDP_REDIRECT) {
		st->core_redirect[core]++;
	} else {
		st->core_pass[core]++;
	}
	return (int)act;
}

SEC("xdp.frags")
int pbox_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct pbox_xdp_stats *st;
	struct ethhdr *eth = data;
	struct udphdr *udp;
	struct iphdr *ip;
	__u32 key = 0, l3_off, ihl, dport;
	__u16 proto;
	int fragment;

	st = bpf_map_lookup_elem(&pbox_stats, &key);
	if (st == NULL) {
		return XDP_PASS; /* cannot happen: a one-entry array */
	}
	st->rx++;
	if ((void *)(eth + 1) > end) {
		goto other;
	}
	proto = eth->h_proto;
	l3_off = sizeof(*eth);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		struct vlan_tag *v = data + l3_off;

		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD)) {
			break;
		}
		if ((void *)(v + 1) > end) {
			goto other;
		}
		proto = v->proto;
		l3_off += sizeof(*v);
	}
	if (proto != bpf_htons(ETH_P_IP)) {
		goto other;
	}
	ip = data + l3_off;
	if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl < 5 ||
	    ip->protocol != IPPROTO_UDP) {
		goto other;
	}
	if (data_addr != 0 && ip->daddr != data_addr) {
		goto other;
	}
	/* A later fragment carries no UDP header: its port is unknown. */
	if (ip->frag_off & bpf_htons(0x1fff)) {
		st->pass_fragment++;
		return XDP_PASS;
	}
	fragment = (ip->frag_off & bpf_htons(0x2000)) != 0;
	ihl = ip->ihl * 4;
	udp = (void *)ip + ihl;
	if ((void *)(udp + 1) > end) {
		goto other;
	}
	dport = bpf_ntohs(udp->dest);
	if (dport < port_lo || dport - port_lo >= nports) {
		goto other;
	}
	return check_pbox(ctx, st, l3_off + ihl + sizeof(*udp), bpf_ntohs(udp->len), fragment);
other:
	st->pass_other++;
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
