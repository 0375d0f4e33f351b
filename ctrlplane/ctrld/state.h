/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's state file: the runtime jobs (those created with job_create, not the
 * configuration file's), so that a restarted pbox-ctrld loses none.
 *
 * Format (JSON, one object):
 *   {"format": "pbox-ctrld-state", "version": 1,
 *    "jobs": [ {"job": {...description...},       # as job_create got it (with its token)
 *               "plan": {...},                     # optional: a plan the client gave
 *               "placement": [...],                # optional: host per rank (plan.h)
 *               "pboxd": "a",                      # optional: the pboxd holding it
 *               "assignment": {...}}, ... ],       # optional: its chunk -> core map
 *    "removals": [ {"id": 5, "pboxd": "a"}, ... ]}  # removed, not yet delivered there
 * jobs in the order they were created; removals whose pboxd was unreachable, retried by
 * the reconcile loop until it answers (so a restart does not leave the job there). Written
 * atomically after every change (a temporary file in the same directory, mode 0600 because it holds
 * the jobs' tokens, written, fsync'd, renamed over the file, the directory fsync'd): a crash leaves
 * the old file or the new one, never a mix.
 *
 * Loading is strict: a file that is not exactly this (unknown or missing members, another
 * format or version, a job that pboxd's job validation refuses, a plan or assignment of
 * the wrong shape, two jobs with one id) is refused with the file, the member and the
 * cause, and pbox-ctrld does not start: its jobs are never dropped silently. A missing file
 * is an empty state (first start).
 *
 * Thread safety: no shared state; pbox-ctrld calls these from its main loop.
 */
#ifndef PBOX_CTRLD_STATE_H
#define PBOX_CTRLD_STATE_H

#include <stddef.h>

#include <jansson.h>

#define CTRLD_STATE_FORMAT  "pbox-ctrld-state"
#define CTRLD_STATE_VERSION 1

/*
 * Read and validate path. Returns 0 with *jobs and *removals = new arrays of the entries
 * above (validated), -ENOENT when the file does not exist (both empty arrays), or
 * -EINVAL / -EIO / -ENOMEM with "state file PATH: jobs[2].job: ..." in err (both NULL).
 */
int ctrld_state_load(const char *path, json_t **jobs, json_t **removals, char *err, size_t errlen);

/*
 * Write jobs and removals (arrays of entries as above) to path atomically (see above).
 * Returns 0 or -errno with the file and the failed step in err; on failure the old file is
 * untouched.
 */
int ctrld_state_save(const char *path, const json_t *jobs, const json_t *removals, char *err,
		     size_t errlen);

#endif /* PBOX_CTRLD_STATE_H */
