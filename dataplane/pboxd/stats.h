/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd counters: per core packets, bytes, aggregations, drops by reason, retransmits,
 * busy / idle cycles, and the data plane's lifetime counters (job tables and job states
 * freed, publishes refused for want of memory; the DPDK transport's retire_waits /
 * retire_stalled are in its own "transport" section); as JSON (the stats request, `pbox stats`) and
 * as a text table (SIGUSR1, the stats interval, exit).
 *
 * Threading: control thread; reads the cores' counters with relaxed atomic loads.
 */
#ifndef PBOXD_STATS_H
#define PBOXD_STATS_H

#include <jansson.h>
#include <stdio.h>

#include "dataplane.h"
#include "sessions.h"

/* {"ok":true,"cores":[...],"totals":{...},"jobs":[...],
 *  "lifetime":{"tables_freed":n,"states_freed":n,"publish_nomem":n}} (new reference). */
json_t *pboxd_stats_json(const struct pboxd_dp *dp, const struct pboxd_sessions *s);

/* Human-readable table of every core plus totals. */
void pboxd_stats_print(FILE *f, const struct pboxd_dp *dp);

#endif /* PBOXD_STATS_H */
