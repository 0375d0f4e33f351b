/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's bandwidth matrix: the available bandwidth of the configured probe pairs
 * (ctrld.h, bandwidth = { ... }), measured by SLoPS (ctrlplane/probe/). For a pair
 * (from, to) pbox-ctrld asks the managed pboxd `from` (a probe agent: its probe = { ... }
 * group) to probe the responder at `to` (another pboxd's probe port, or `pbox-probe
 * --listen` on a worker host) with {"op":"probe"} over its admin control channel, and
 * keeps the answer: [r_min, r_max], the grey region, the flags, when it was measured and
 * how long it took, or why the last probe failed (the last good estimate is kept).
 *
 * Probes run on the matrix's own thread, one at a time over all pairs (probes of paths
 * that share a link would load it for each other), so the control API and the job
 * publication never wait for one: a pair is probed when it is due (every interval
 * seconds; 0: only on demand) or when asked (ctrld_bw_probe), on-demand requests first.
 *
 * With `jobs = true` the matrix also holds the pairs each job's tree needs (issue 11),
 * from its pboxd's job_list entry (pboxd/sessions.h: the ranks' probe responders in
 * "agents", the pboxd's own in "probe") and its plan: for every rank with a responder,
 * pboxd -> rank (the broadcast from the appliance), rank -> pboxd (the push), and parent
 * -> rank along the tree when the parent is a worker (once the tree was built on every
 * rank's measured link, so that the first, unmeasured trees do not cost probes). A worker's probe
 * is asked of its pboxd with {"op":"probe","via":{"job","rank"},...}, which forwards it over the
 * rank's control channel (libpbox/probe.h); its "from" in the matrix is the worker's responder
 * address. New pairs are probed first; pairs no job needs any more are dropped. A job
 * whose progress (its pboxd's version_max) falls below half its recent best has its pairs
 * probed again (at most every CTRLD_BW_SLOW_GAP_S), and a pair whose estimate falls below
 * CTRLD_BW_DROP of its last one has the job's pairs sharing a worker with it probed next
 * (they likely cross the same slower link). Every probe, a job's or not, runs one
 * at a time at the configured cap and budget, which each agent checks against its own
 * limits.
 *
 * Threading: ctrld_bw_list and ctrld_bw_probe may be called from any thread (a mutex
 * guards the matrix); start, stop and the jobs' sweep from the main thread. Errors:
 * -errno with err.
 */
#ifndef PBOX_CTRLD_BW_H
#define PBOX_CTRLD_BW_H

#include <jansson.h>
#include <stdint.h>

#include "ctrld.h"

struct ctrld_bw;

/* The matrix of cfg's pairs and its thread (cfg must outlive it). *out is NULL when no
 * pairs are configured (not an error). Returns 0 or -errno (logged). */
int ctrld_bw_start(const struct ctrld_config *cfg, struct ctrld_bw **out);
/* Stops the thread and frees b; a probe that runs on is waited for 3 s at most, then b
 * is left to the thread (for a process that exits next). NULL: nothing. */
void ctrld_bw_stop(struct ctrld_bw *b);

/* {"ok":true, "interval_s":..., "cap_bps":..., "budget_ms":..., "pairs":[{"from","to",
 * "state": "pending"|"probing"|"ok"|"failed", "probes", "failures", "estimate": {the
 * result message of probe_msg.h} (absent before the first success), "age_s",
 * "last_error", "queued"}]} (new reference; with b NULL: no pairs). */
json_t *ctrld_bw_list(struct ctrld_bw *b);

/* Probe pair (from, to) as soon as the probe running now (if any) ends. *done_at: the
 * pair's "probes" count once that probe has ended (a client waits for it). Returns 0,
 * -ENOENT (no such pair; err lists how to configure one). */
int ctrld_bw_probe(struct ctrld_bw *b, const char *from, const char *to, uint64_t *done_at,
		   char *err, size_t errlen);

/* One sweep over the jobs (each reconcile): begin, ctrld_bw_job for every job placed on a
 * pboxd that lists it (w: that pboxd's index; entry: its job_list entry; plan: the job's
 * plan or NULL), end (pairs of jobs not named are dropped). No-ops unless jobs = true
 * (and with b NULL). */
void ctrld_bw_jobs_begin(struct ctrld_bw *b);
void ctrld_bw_job(struct ctrld_bw *b, uint32_t w, uint32_t job, const json_t *entry,
		  const json_t *plan);
void ctrld_bw_jobs_end(struct ctrld_bw *b);

#endif /* PBOX_CTRLD_BW_H */
