/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's operations views: the answer of {"op":"status"} (common/statusmsg.h) and
 * the text of its /metrics endpoint (common/metrics.h).
 *
 * status: pbox-ctrld's own jobs (job_list: where each is published, its plan), its pboxds,
 * its bandwidth matrix (each estimate with its age), and, per job, what the job's pboxd
 * says about it (pboxd's status: ranks, waiting chunks and the ranks they lack) as the
 * job's "status" member, or "status_error" when that pboxd could not be asked (it is down:
 * not asked at all; or it refused). One request per pboxd holding a wanted job: main.c
 * asks them all at once without blocking its loop (pboxd_conn.h) and calls ctrld_status
 * with their gathered answers when the last has come (or failed after the request
 * timeout).
 *
 * metrics: pbox_ctrld_* series: jobs by state, pboxds up and their job counts, the control
 * counters, the bandwidth matrix (r_min / r_max, age, probes, failures, state per pair)
 * and the plans (revision per job, jobs with and without a plan).
 *
 * Threading: pbox-ctrld's main thread.
 */
#ifndef PBOX_CTRLD_STATUS_H
#define PBOX_CTRLD_STATUS_H

#include <jansson.h>
#include <stdint.h>

#include "common/prom.h"
#include "common/statusmsg.h"
#include "ctrld.h"

/* Ask pboxd number idx of the configuration: 0 with *reply, or -errno. */
typedef int (*ctrld_ask_fn)(void *arg, uint32_t idx, const json_t *req, json_t **reply);

/*
 * The status answer (new reference) from list (pbox-ctrld's job_list answer, taken: its
 * jobs and pboxds are reused) and bw (ctrld_bw_list's answer, taken; NULL: none). m
 * selects the job and the bounds passed on to the pboxds. -ENOENT in *err (and NULL) when
 * m->job is not one of pbox-ctrld's jobs.
 */
json_t *ctrld_status(const struct ctrld_config *cfg, json_t *list, json_t *bw,
		     const struct pbox_statusmsg *m, ctrld_ask_fn ask, void *arg, int *err);

/* The metrics text from the same two answers (not taken). */
void ctrld_metrics_render(const json_t *list, const json_t *bw, struct pbox_prom *p);

#endif /* PBOX_CTRLD_STATUS_H */
