/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's plan of a job (issue 11 §4-5): its broadcast tree (ctrlplane/tree/tree.h)
 * and its DVF thresholds, published in the "plan" slot of job_create (common/jobspec.h)
 * and reported by job_list.
 *
 * Configuration (ctrld.h's file; every member optional):
 *   plan = {
 *     degree = 5; depth = 3;        # T and H (PF's evaluation: 5 and 3)
 *     alpha = 0.1;                  # leaf penalty (PF gives none)
 *     exact_max_workers = 16;       # GLPK for jobs up to this many workers
 *     time_limit = 200;             # ms for GLPK (then its best tree, with the gap);
 *                                   # plans are computed on pbox-ctrld's main loop, so
 *                                   # this is also how long one plan may hold it up
 *     min_rate = "50mbit";          # a link is sufficient above this (PF's example)
 *     hysteresis = 0.1;             # sufficient from min_rate*(1+h), insufficient below
 *                                   # min_rate*(1-h); in between a link keeps its state
 *     delta_low = 0.001; delta_up = 0.01;  # DVF numerators (delta_low <= delta_up)
 *     hosts = ( { name = "w1"; addr = "10.0.0.2:55001"; edge = 0; agg = 0; } );
 *   };
 * hosts place machines in PF's three-tier topology (edge and aggregation switch numbers)
 * and name the probe responder (addr, as in bandwidth pairs' `to`) of each; a managed
 * pboxd is a host by its own name. A job created with "placement": ["w1", "w2", ...] (a
 * host name per rank, ctrld's job_create only) gets costs from them:
 *   appliance -> worker: 1e9 / (measured bandwidth in bit/s) when the bandwidth matrix has
 *     an estimate for (that pboxd, the worker host's addr) — 1.0 for 1 Gbit/s, the scale of
 *     PF's tier costs — else the tier cost of the two hosts;
 *   worker -> worker: the tier cost (the matrix measures paths from pboxds only);
 *   unplaced ranks or hosts: 1.0 (different aggregation switches).
 * The estimate used is the middle of SLoPS's [r_min, r_max]. With the ranks' own probe
 * agents (libpbox, bandwidth.jobs; bw.h) a rank's address is its responder's, measured
 * in both directions (pboxd -> rank and rank -> pboxd: its link is the lower of the two),
 * and worker -> worker edges cost 1e9 / (the measured i -> j bandwidth, else the lower of
 * i's upload and j's download, the access links that bound a path through one switch).
 *
 * PHub (papers/phub.md §6): every plan carries "phub": {"recommend": "single" or
 * "hierarchical", "racks", "workers_per_rack", "core_bps", "appliance_bps", "worker_bps",
 * "worker_bps_measured", "flat_s_per_bit", "hierarchical_s_per_bit", "reason"}: racks are
 * the placement's edge switches, core/appliance/worker rates come from
 *   plan = { phub = { core_rate = "40gbit"; appliance_rate = "100gbit";
 *                     worker_rate = "10gbit"; }; }   (the defaults)
 * and the slowest measured rank link replaces worker_rate. A job is held by one pboxd:
 * "hierarchical" is a recommendation to split it per rack, not acted upon.
 *
 * Thresholds: each rank's link is "sufficient", "insufficient" (measured, with the
 * hysteresis above) or "unknown" (no estimate). A worker pushes with delta_low unless its
 * link is insufficient (it pushes to this one appliance only); the appliance broadcasts
 * with delta_low unless some rank's link is insufficient (PF: every overlay link must be
 * sufficient; a worker's path from the appliance stands for its access link — the
 * worker-to-worker overlay links are not probed). Unknown counts as sufficient: with no
 * bandwidth configured every job runs with delta_low, as without a control plane.
 *
 * Recomputation (ctrld_plan_compute with the previous plan): link states keep their
 * hysteresis, and the previous tree is kept unless the new one is cheaper by more than
 * PLAN_TREE_MIN_GAIN under the current costs (no flapping on probe noise); "revision"
 * counts the plans that changed something.
 *
 * A job with more workers than degree and depth allow (T + T^2 + ... + T^H) gets no plan
 * (the cause is in its note).
 *
 * Threading: no shared state. Errors: -EINVAL with err (bad configuration or placement),
 * -ENOSPC (the workers do not fit degree and depth), -ENOMEM.
 */
#ifndef PBOX_CTRLD_PLAN_H
#define PBOX_CTRLD_PLAN_H

#include <stdint.h>

#include <jansson.h>
#include <libconfig.h>

#include "common/confkit.h"

#define CTRLD_PLAN_MAX_HOSTS 4096u
#define PLAN_TREE_MIN_GAIN   0.05

struct ctrld_plan_host {
	char name[64];
	char addr[80]; /* "" : none */
	uint32_t edge, agg;
};

struct ctrld_plan_cfg {
	uint32_t degree, depth, exact_max_workers, time_limit_ms;
	double alpha, min_rate_bps, hysteresis, delta_low, delta_up;
	double phub_core_bps, phub_appliance_bps, phub_worker_bps; /* PHub's rule (below) */
	struct ctrld_plan_host *hosts;                             /* owned */
	uint32_t nhosts;
};

/* Defaults (no plan group). */
void ctrld_plan_defaults(struct ctrld_plan_cfg *pc);
/* The plan = { ... } group g into pc (defaults first). 0 or -EINVAL (ck's error). */
int ctrld_plan_load(struct pbox_confkit *ck, struct ctrld_plan_cfg *pc, const config_setting_t *g);
void ctrld_plan_free(struct ctrld_plan_cfg *pc);

/* placement: NULL, or an array of host names, one per rank. 0 or -EINVAL with err. */
int ctrld_plan_check_placement(const struct ctrld_plan_cfg *pc, const json_t *placement,
			       uint32_t workers, char *err, size_t errlen);

/*
 * The plan {"tree": {...}, "thresholds": {...}} of a job of `workers` ranks held by the
 * pboxd named root, with placement (NULL or checked), bw (ctrld_bw_list's answer or NULL)
 * agents (the pboxd's job_list entry of the job or NULL: its ranks' probe responders in
 * "agents" and its own in "probe"; bw.h) and prev (the job's previous computed plan or
 * NULL). *out: a new reference, which is
 * prev itself (with a reference taken) when nothing changed. 0, -ENOSPC, -EINVAL, -ENOMEM
 * with err.
 */
int ctrld_plan_compute(const struct ctrld_plan_cfg *pc, const char *root, uint32_t workers,
		       const json_t *placement, const json_t *bw, const json_t *agents,
		       json_t *prev, json_t **out, char *err, size_t errlen);

#endif /* PBOX_CTRLD_PLAN_H */
