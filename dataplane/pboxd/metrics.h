/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's Prometheus metrics (common/metrics.h serves them): the counters `pbox stats`
 * shows, from the same stats object, so the two always agree:
 *   pboxd_core_<counter>_total{core="k"}      every per-core counter of the stats' cores
 *   pboxd_core_drops_total{core,reason}       drops by reason (include/pbox/wire.h)
 *   pboxd_core_busy_ratio{core}               busy share of the core's cycles
 *   pboxd_job_<value>{job="id"}               workers, connected, registered, live,
 *                                             version_min/max, chunks, bytes, state_bytes,
 *                                             pulls_waiting, waiting_chunks, changing_chunks,
 *                                             scanned_chunks, progress_age_seconds
 *                                             (jobstatus.h)
 *   pboxd_job_state{job,state}                1 for the job's state
 *   pboxd_control_<counter>_total, pboxd_lifetime_<counter>_total, pboxd_probe_<..>_total
 *
 * Threading: runs on the control thread (pbox_metrics_serve from the main loop): it reads
 * the cores only through the counters they publish (relaxed loads, as the stats request).
 */
#ifndef PBOXD_METRICS_H
#define PBOXD_METRICS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/prom.h"
#include "sessions.h"

struct pboxd_metrics_src {
	/* The full stats object (what `pbox stats` gets; new reference). */
	json_t *(*stats)(void *arg);
	void *stats_arg;
	struct pboxd_sessions *sessions;
};

/* pbox_metrics_render_fn: arg is a struct pboxd_metrics_src. */
void pboxd_metrics_render(void *arg, struct pbox_prom *p);

#endif /* PBOXD_METRICS_H */
