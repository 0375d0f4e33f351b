/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Test-only link loss injector (perf/netlab, tests): attached to a veth's XDP hook, it
 * drops each received frame with a fixed probability, decided by a seeded hash of the
 * frame's index on that link (pbox_loss_draw), so a run with the same seed and the same
 * frame sequence drops the same frames. It never duplicates, reorders or modifies a frame.
 * Not for production interfaces.
 */
#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>

#include "loss_abi.h"

/* Load-time knobs: drop when pbox_loss_draw(seed, seq) < threshold (probability * 2^32;
 * 0: never, 2^32 - 1: almost always). */
const volatile __u32 threshold = 0;
const volatile __u64 seed = 1;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pbox_loss_counters);
} loss_counters SEC(".maps");

SEC("xdp.frags")
int pbox_loss(struct xdp_md *ctx)
{
	struct pbox_loss_counters *c;
	__u32 key = 0;
	__u64 seq;

	(void)ctx;
	c = bpf_map_lookup_elem(&loss_counters, &key);
	if (c == NULL) {
		return XDP_PASS;
	}
	seq = __sync_fetch_and_add(&c->seq, 1);
	if (pbox_loss_draw(seed, seq) < threshold) {
		__sync_fetch_and_add(&c->dropped, 1);
		return XDP_DROP;
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
