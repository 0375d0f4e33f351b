/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld: the control plane's daemon. It owns the jobs (its configuration file's and
 * those created at run time), admits each onto one of the pboxds it manages and publishes
 * it there over that pboxd's admin control channel (common/jobspec.h messages), and keeps
 * publishing: every reconcile interval it lists each pboxd's jobs and re-creates what is
 * missing (a restarted pboxd gets its jobs back) and retries removals that could not reach
 * their pboxd.
 *
 * Admission: a job definition is validated here with pboxd's own job validation (so
 * --check-config catches bad static jobs), then offered to the managed pboxds, those that
 * answered their last request first, then fewest assigned jobs first; each pboxd applies its
 * admission (workers, modes, memory budgets: the geometry and budgets of its own hardware) and the
 * first to accept holds the job. A job that no reachable pboxd accepts is refused, with every
 * pboxd's reason. A job with a fixed key set is published with pbox-ctrld's assignment of its
 * chunks to that pboxd's cores (assign.h), which the pboxd checks and uses.
 *
 * Persistence: with state_file, the runtime jobs (and removals not yet delivered) are
 * written after every change and restored at start (state.h); jobs a pboxd still holds
 * are adopted, not published again.
 *
 * Configuration (libconfig):
 *   ctrld = {
 *     listen = "127.0.0.1:7300";      # JSON control API (TCP)
 *     control_socket = "";            # Unix socket for operators (admin without token)
 *     admin_token = "";               # job administration over TCP needs it
 *     reconcile_interval = 1000;      # ms between publication checks
 *     request_timeout = 5000;         # ms a request to a pboxd may take, queued
 *                                     # included (pboxd_conn.h)
 *     max_connections = 256;
 *     max_per_address = 64;           # connections from one source address
 *     auth_failures_burst = 10;       # wrong admin tokens per address, then
 *     auth_failures_per_minute = 60;  # this many a minute
 *     max_unauth = 64;                # connections without the admin token yet: a new
 *                                     # one closes the oldest of them
 *     unauth_timeout = 10000;         # ms to prove the admin token
 *     max_output_bytes = 16777216;    # unread answers per connection: then it is closed
 *     state_file = "";                # runtime jobs survive a restart (state.h); "": not
 *                                     # kept (e.g. "/var/lib/pbox/pbox-ctrld.state")
 *   };
 *   pboxds = ( { name = "a"; control = "127.0.0.1:7000"; admin_token = "..."; } );
 *              # control may be a pboxd's Unix control socket (then no token)
 *   jobs = ( { id = 1; token = "s3cret"; workers = 2; ... } );  # pboxd's job syntax
 *   bandwidth = {                     # the bandwidth matrix (bw.h); absent: none
 *     interval = 300;                 # s between probes of a pair (0: on demand only)
 *     cap = "1gbit";                  # rate cap of each probe (<= the agents' max_rate)
 *     budget = 10;                    # s per probe (<= the agents' max_budget_s)
 *     pairs = ( { from = "a"; to = "10.0.0.2:55001"; } );  # pboxd `from` probes the
 *                                     # responder at `to` (numeric address[:port])
 *     all_to = [ "10.0.0.3:55001" ];  # every managed pboxd probes each of these
 *     jobs = true;                    # and the paths of each job's tree (bw.h)
 *   };
 *   plan = { degree = 5; depth = 3; ... };  # broadcast trees and DVF thresholds (plan.h)
 *   metrics = { listen = "127.0.0.1:9541"; };  # Prometheus GET /metrics (absent: off)
 * and in the ctrld group: log_format = "text";  # or "json" (common/log.h)
 *
 * Threading: one thread, a poll loop (main.c) that never waits for a pboxd (its requests
 * are state machines of that loop, pboxd_conn.h), and the bandwidth matrix's prober thread
 * (bw.h), which only reads the configuration.
 */
#ifndef PBOX_CTRLD_H
#define PBOX_CTRLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "assign.h"
#include "common/metrics.h"
#include "plan.h"

#define CTRLD_DEFAULT_CONFIG "/etc/pbox/pbox-ctrld.conf"
#define CTRLD_MAX_PBOXDS     64u

struct ctrld_pboxd {
	char name[64];
	char control[256]; /* host:port or a Unix socket path */
	char admin_token[256];
	/* state */
	bool up;
	uint32_t njobs;           /* jobs assigned here */
	struct ctrld_cores cores; /* its data-plane cores, from its job_list (assign.h) */
	char last_error[256];
};

#define CTRLD_BW_MAX_PAIRS 1024u

/* One probe pair of the bandwidth matrix: pboxds[from_idx] probes the responder at to. */
struct ctrld_bw_pair {
	char from[64]; /* the pboxd's name */
	uint32_t from_idx;
	char to[80]; /* numeric address[:port], as configured */
};

struct ctrld_bw_cfg {
	uint32_t interval_s; /* 0: on demand only */
	double cap_bps;
	uint32_t budget_s;
	struct ctrld_bw_pair *pairs; /* owned */
	uint32_t npairs;
	bool jobs; /* also probe the pairs each job's tree needs (bw.h) */
};

struct ctrld_config {
	char path[512];
	char listen_host[64];
	uint16_t listen_port;
	char control_socket[108];
	char admin_token[256];
	uint32_t reconcile_ms;
	uint32_t request_timeout_ms;
	uint32_t max_connections;
	uint32_t max_per_address;
	uint32_t auth_failures_burst;
	uint32_t auth_failures_per_minute;
	uint32_t max_unauth;        /* connections that have not proved the admin token */
	uint32_t unauth_timeout_ms; /* to prove it */
	uint32_t max_output_bytes;  /* unread answers queued per connection */
	char state_file[512];       /* runtime jobs (state.h); "": kept in memory only */
	struct ctrld_pboxd pboxds[CTRLD_MAX_PBOXDS];
	uint32_t npboxds;
	json_t *jobs; /* array of job descriptions from the file (owned) */
	struct ctrld_bw_cfg bw;
	struct ctrld_plan_cfg plan;      /* trees and thresholds (plan.h) */
	int log_format;                  /* enum pbox_log_format; -1: not set (environment) */
	struct pbox_metrics_cfg metrics; /* top-level `metrics` group (common/metrics.h) */
};

/* Read and validate path (every static job through pboxd's job validation). Returns 0,
 * or -EINVAL / -ENOENT with "file:line: setting: what" in err. Free with
 * ctrld_config_free. */
int ctrld_config_load(struct ctrld_config *cfg, const char *path, char *err, size_t errlen);
void ctrld_config_free(struct ctrld_config *cfg);

/* Validate a job description as pboxd would (with pboxd's defaults). 0 or -EINVAL with
 * err. */
int ctrld_job_validate(const json_t *desc, char *err, size_t errlen);

#endif /* PBOX_CTRLD_H */
