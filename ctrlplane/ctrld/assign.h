/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's assignment of a job's chunks to a pboxd's data-plane cores.
 *
 * pbox-ctrld learns each managed pboxd's cores from its job_list answer ("appliance": the
 * chunk size and, per data-plane core, its CPU, NUMA node and UDP port; pboxd/control.c)
 * and places every job that has a fixed key set (the job description's keys) before
 * publishing it: the key set is cut into chunks exactly as pboxd cuts it (common/jobdesc.h:
 * chunk_bytes / 4 elements per chunk, the last chunk of a key shorter), and the chunks go by
 * LPT on bytes, starting from the bytes the pboxd's cores already hold from the jobs
 * placed there before: largest chunk first (ties: lower chunk id), each to the core with
 * the fewest bytes (ties: lower core index). The same jobs in the same order give the same
 * maps on every run, and a job's chunks fill the cores other jobs left emptiest. The map
 * is published with the job (job_create's "assignment", common/jobspec.h) and pboxd uses
 * it after checking it against its cores (pboxd_job_cfg_set_assignment).
 *
 * A job without a fixed key set is not placed here: its chunks exist only once its first
 * rank registers them, and pboxd assigns them then (its own LPT). Nor is a key set of more
 * than CTRLD_ASSIGN_MAX_CHUNKS chunks: the map is one JSON integer per chunk in the
 * job_create line, which pboxd bounds (max_register_keys x 32 bytes, 3.2 MB by default),
 * and costs pbox-ctrld tens of bytes per chunk; pboxd assigns those too.
 *
 * Thread safety: no shared state; every call works on its arguments only.
 */
#ifndef PBOX_CTRLD_ASSIGN_H
#define PBOX_CTRLD_ASSIGN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/jobdesc.h"

/* Largest key set (in chunks) pbox-ctrld assigns itself: 2 GiB at 32 KiB chunks, a map of
 * at most ~200 KB in the job_create request. */
#define CTRLD_ASSIGN_MAX_CHUNKS 65536u

/* A pboxd's data-plane cores as its job_list reports them. */
struct ctrld_cores {
	bool known; /* false: the pboxd did not say (not reached yet, or an older pboxd) */
	uint32_t ncores;
	uint32_t chunk_bytes;
	int32_t cpu[PBOX_MAX_CORES];  /* -1: not pinned */
	int32_t numa[PBOX_MAX_CORES]; /* -1: not known */
	int32_t port[PBOX_MAX_CORES]; /* UDP port of the core; -1: not known */
};

/* Per-core totals of one job's assignment (the placement summary). */
struct ctrld_core_load {
	uint64_t bytes[PBOX_MAX_CORES];
	uint32_t chunks[PBOX_MAX_CORES];
};

/*
 * Read the "appliance" object of a pboxd's job_list answer into c. Returns 0, or -EINVAL
 * with err (missing or out-of-range ncores / chunk_bytes, a cores list that does not
 * match ncores); c->known is set only on success.
 */
int ctrld_cores_from_json(const json_t *appliance, struct ctrld_cores *c, char *err, size_t errlen);

/*
 * Assign the chunks of job description desc (validated already, ctrld_job_validate) to
 * c's cores. base[k] holds the bytes core k already carries from other jobs; the job's own
 * per-core totals are written to *mine (not added to base). Returns 0 with *out = a new
 * {"chunk_bytes": C, "map": [core of each chunk]}; 1 when desc has no fixed key set or one
 * of more than CTRLD_ASSIGN_MAX_CHUNKS chunks (pboxd assigns; *out NULL); -EINVAL with err (c not
 * known, a key set that cannot be cut, e.g. more than PBOX_MAX_CHUNKS chunks) or -ENOMEM.
 */
int ctrld_assign(const struct ctrld_cores *c, const json_t *desc, const uint64_t *base,
		 json_t **out, struct ctrld_core_load *mine, char *err, size_t errlen);

/*
 * The per-core totals of an existing assignment (e.g. one reloaded from the state file)
 * for desc's key set: 0, or -EINVAL with err when the assignment does not fit desc (another
 * chunk count, a core index of ncores or more).
 */
int ctrld_assign_load(const json_t *assignment, const json_t *desc, uint32_t ncores,
		      struct ctrld_core_load *load, char *err, size_t errlen);

#endif /* PBOX_CTRLD_ASSIGN_H */
