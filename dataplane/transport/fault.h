/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Seeded fault injection for the datagram transports: drop, duplicate and reorder
 * outgoing datagrams with given probabilities. netem is not available everywhere pbox is
 * tested, so the transports carry their own; it is off unless configured, and a run with
 * the same seed and the same sequence of sends makes the same decisions.
 *
 * Spec syntax (config files, PBOX_FAULT, --fault): comma-separated key=value with keys
 * drop, dup, reorder (probabilities in [0, 1]) and seed (integer), e.g.
 * "drop=0.02,dup=0.02,reorder=0.05,seed=7".
 *
 * Thread safety: a struct pbox_fault belongs to one transport instance (one thread).
 */
#ifndef PBOX_FAULT_H
#define PBOX_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pbox_fault_cfg {
	double drop;
	double dup;
	double reorder;
	uint64_t seed;
};

enum pbox_fault_action {
	PBOX_FAULT_PASS = 0,
	PBOX_FAULT_DROP,
	PBOX_FAULT_DUP,
	PBOX_FAULT_REORDER, /* hold this datagram and send it after a later one */
};

struct pbox_fault {
	struct pbox_fault_cfg cfg;
	uint64_t state;
	uint64_t dropped;
	uint64_t duplicated;
	uint64_t reordered;
};

/* Parse spec into cfg. Returns 0, or -EINVAL with a message naming the bad item. */
int pbox_fault_parse(const char *spec, struct pbox_fault_cfg *cfg, char *err, size_t errlen);

/* Validate probabilities; returns 0 or -EINVAL with a message. */
int pbox_fault_check(const struct pbox_fault_cfg *cfg, char *err, size_t errlen);

void pbox_fault_init(struct pbox_fault *f, const struct pbox_fault_cfg *cfg);

static inline bool pbox_fault_enabled(const struct pbox_fault *f)
{
	return f->cfg.drop > 0 || f->cfg.dup > 0 || f->cfg.reorder > 0;
}

/* Decide what happens to the next outgoing datagram (and count it). */
enum pbox_fault_action pbox_fault_next(struct pbox_fault *f);

#endif /* PBOX_FAULT_H */
