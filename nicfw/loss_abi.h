/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The ABI of nicfw/loss.bpf.c, the test-only link loss injector: its counters.
 *
 *   loss_counters  ARRAY [0] -> struct pbox_loss_counters (shared by all CPUs: seq is the
 *                  frame's index in the link's decision sequence, taken atomically)
 */
#ifndef PBOX_LOSS_ABI_H
#define PBOX_LOSS_ABI_H

#include <linux/types.h>

struct pbox_loss_counters {
	__u64 seq;     /* frames decided so far (the next frame's index) */
	__u64 dropped; /* frames dropped */
};

/*
 * The decision of frame number seq under seed: dropped when the result is below the
 * threshold (probability * 2^32). splitmix64's finaliser: consecutive indexes give
 * independent-looking 64-bit values, and the same (seed, seq) always gives the same one.
 */
static inline __u32 pbox_loss_draw(__u64 seed, __u64 seq)
{
	__u64 z = seed + (seq + 1) * 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (__u32)(z >> 32);
}

#endif /* PBOX_LOSS_ABI_H */
