/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's side of TSB (common/tsb.h, engine/bcast.h): a job's `tree` setting, the tree of
 * a session (pbox-ctrld's plan when it holds one that fits, else the job's own), and the
 * positions told to the ranks.
 *
 *   tree = { degree = 2;   # T: children per node, the appliance included (1..64)
 *            depth = 3;    # H: ranks below the appliance on the longest path (1..16)
 *            parent = [ -1, -1, 0, 0, 1, 1 ]; };  # optional: rank r's parent (-1: the
 *                                                 # appliance); default: breadth-first
 *
 * A job with `tree` broadcasts its results down the tree (sync model bsp only: the one
 * model whose results are the same broadcast for every rank). Thread safety: control
 * thread.
 */
#ifndef PBOXD_TSBD_H
#define PBOXD_TSBD_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <libconfig.h>

#include "common/confkit.h"
#include "common/tsb.h"

struct pboxd_job_cfg;

/* Load job group g's `tree` (absent: no tree). 0 or -EINVAL (message in c). */
int pboxd_tsb_load(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_job_cfg *j);

/*
 * The session's tree for job cfg j into parent[j->workers]: the tree of plan (pbox-ctrld's
 * {"tree":{"parent":[...],"degree":T,"depth":H}}, may be NULL) when it has one for this many
 * ranks that passes its own degree and depth, else the job's. Returns 1 (from the plan),
 * 0 (the job's), or -EINVAL (the job has no tree).
 */
int pboxd_tsb_session_tree(const struct pboxd_job_cfg *j, const json_t *plan, uint32_t *parent);

/* Rank r's position in tree parent[n] with the given data addresses (addr[rank]). */
void pboxd_tsb_position(const uint32_t *parent, uint32_t n, uint32_t r,
			const struct pbox_peer *addr, uint64_t revision, struct pbox_tsb_pos *pos);

#endif /* PBOXD_TSBD_H */
