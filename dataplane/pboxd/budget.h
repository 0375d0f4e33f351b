/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Memory budgets of job sessions: the chunk state a session maps (model copies, optimizer
 * state, window slots, per-rank staging in deterministic mode) is sized before anything is
 * allocated, and the session is refused if it exceeds its job's memory_budget, or if the
 * sum of the running sessions' states plus the new one exceeds the appliance's
 * memory_budget. The refusal message gives the numbers: needed, budget, in use.
 *
 * Two checks, both before allocation:
 *  1. pboxd_budget_precheck, from the registered keys alone (64-bit chunk count, and a
 *     lower bound of the state's bytes): a hostile key set is refused before even its
 *     O(chunks) geometry is built;
 *  2. pboxd_budget_charge, with the exact size from the built geometry
 *     (pbox_job_state_bytes), which is also what is charged until the session ends.
 *
 * The appliance's default ("auto", memory_budget = 0 in the configuration) is half of the
 * machine's memory outside the hugepage pool (MemTotal - Hugetlb of /proc/meminfo, or the
 * memory limit of pboxd's cgroup if lower, as in a container): chunk
 * state is anonymous memory populated at once and never swapped out in practice, so it
 * must leave room for the kernel (socket buffers, page cache), pboxd's own metadata and
 * whatever else the machine runs (`pbox demo` and single-box setups run the workers next
 * to the appliance); hugepages are excluded because they are reserved for DPDK mbufs and
 * cannot hold chunk state.
 *
 * Threading: control thread only.
 */
#ifndef PBOXD_BUDGET_H
#define PBOXD_BUDGET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "engine/job.h"

struct pboxd_budget {
	uint64_t limit;  /* the appliance's budget in bytes */
	uint64_t in_use; /* charged by running sessions */
	uint32_t njobs;  /* running sessions charged */
};

/* The "auto" budget of this machine (see above); never 0. */
uint64_t pboxd_budget_machine_default(void);

/* configured: the appliance's memory_budget (0: pboxd_budget_machine_default()). */
void pboxd_budget_init(struct pboxd_budget *b, uint64_t configured);

/*
 * Before the geometry of a new session of job cfg is built: count its chunks in 64 bits
 * (-E2BIG above PBOX_MAX_CHUNKS) and refuse (-ENOSPC) when a lower bound of its state
 * already exceeds a budget. params: the job's engine parameters (mode, opt, window,
 * deterministic, sync). err gets the reason, prefixed with nothing (the caller names the
 * job). Returns 0, -EINVAL (bad key), -E2BIG or -ENOSPC.
 */
int pboxd_budget_precheck(const struct pboxd_budget *b, const struct pboxd_job_cfg *cfg,
			  const struct pbox_job *params, const struct pbox_keyspec *keys,
			  uint32_t nkeys, uint32_t chunk_bytes, uint32_t frag_bytes, char *err,
			  size_t errlen);

/*
 * Charge need bytes (pbox_job_state_bytes of the new session) to the budget, or refuse
 * with -ENOSPC and the numbers in err. Release with pboxd_budget_release when the state
 * is freed.
 */
int pboxd_budget_charge(struct pboxd_budget *b, const struct pboxd_job_cfg *cfg, uint64_t need,
			char *err, size_t errlen);
void pboxd_budget_release(struct pboxd_budget *b, uint64_t bytes);

/*
 * The chunk state of job c: exact when its key set is configured (*nchunks: its chunks),
 * else the bytes of one full chunk (*nchunks = 0). Returns 0, or -EINVAL / -E2BIG /
 * -ENOMEM from the geometry with err.
 */
int pboxd_budget_job_need(const struct pboxd_config *cfg, const struct pboxd_job_cfg *c,
			  uint64_t *need, uint32_t *nchunks, char *err, size_t errlen);

/*
 * Admission of a job definition (at run time, before it is added): refused when its state
 * (pboxd_budget_job_need) can never fit its own or the appliance's whole budget, the same
 * rule as pboxd_budget_report. Returns 0, -ENOSPC or the geometry's error, with err.
 */
int pboxd_budget_admit(const struct pboxd_budget *b, const struct pboxd_config *cfg,
		       const struct pboxd_job_cfg *c, char *err, size_t errlen);

/* "1.50 GiB (1610612736 bytes)"-style rendering into buf; returns buf. */
const char *pboxd_budget_fmt(uint64_t bytes, char *buf, size_t len);

/*
 * pboxd --check-config: for every job, its worst-case chunk state when its key set is
 * configured (exact, from the geometry), else the bytes per full chunk; checked against
 * the job's and the appliance's budgets. Printed to out. Returns 0, or -ENOSPC when a
 * configured key set can never fit (its line says which budget), -E2BIG / -EINVAL for a
 * key set the geometry refuses.
 */
int pboxd_budget_report(const struct pboxd_config *cfg, FILE *out);

#endif /* PBOXD_BUDGET_H */
