/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd configuration: read with libconfig, validated with precise errors
 * ("pboxd.conf:12: jobs[0].workers: must be between 1 and 1024 (got 0)").
 *
 *   appliance = {
 *     transport = "udp";              # data-plane transport
 *     data_address = "127.0.0.1";     # where workers send datagrams
 *     base_port = 7100;               # core k listens on base_port + k
 *     control = "127.0.0.1:7000";     # admission / stats (TCP)
 *     cores = 2;                      # data-plane threads (unpinned), or
 *     cpus = [0, 1];                  # one pinned thread per listed CPU
 *     chunk_bytes = 32768;            # key chunk size
 *     mtu = 1500;                     # path MTU: sets the fragment size
 *     busy_poll = false;              # spin when idle instead of sleeping
 *     idle_us = 200;                  # DPDK: spin this long before sleeping (UDP blocks)
 *     burst = 32;                     # datagrams per receive / send call
 *     deterministic = false;          # default of jobs: sum in rank order
 *     stats_interval = 0;             # seconds between counter dumps (0: off)
 *     drain_timeout = 10;             # seconds to let sessions finish on SIGTERM
 *     worker_timeout = 10;            # seconds without a heartbeat: a worker is gone
 *     fault = "";                     # fault injection on sends (tests)
 *     admin_token = "";               # lets a stats request see every job ("": none)
 *     control_socket = "";            # Unix socket for operators (admin without a token),
 *                                     # e.g. "/run/pbox/pboxd.sock" ("": none)
 *     control_limits = {              # the control channel under hostile clients
 *       max_connections = 4096;       # all connections (also bounded by RLIMIT_NOFILE)
 *       max_per_address = 1024;       # from one source address
 *       max_unauth = 256;             # not yet admitted (no valid hello): a new one closes
 *       max_unauth_per_address = 32;  # the oldest (of its address when that is full)
 *       unauth_timeout = 5;           # seconds to say a valid hello
 *       max_register_keys = 100000;   # bounds request lines (32 bytes per key)
 *       max_output_bytes = 1048576;   # queued answers of a client that does not read
 *       auth_failures_burst = 10;     # wrong tokens / unknown jobs per address, then
 *       auth_failures_per_minute = 60; # this many a minute
 *     };
 *     memory_budget = "auto";         # bytes of chunk state for all jobs together:
 *                                     # "auto" (half of RAM outside hugepages), a byte
 *                                     # count, or "512M" / "4G" / "1T" (powers of 1024)
 *     checkpoint_dir = "";            # server-optimizer jobs' state is saved here
 *                                     # ("": no checkpoints) and restored on restart
 *     checkpoint_interval = 60;       # seconds between checkpoints (0: only at shutdown)
 *     log_format = "text";            # or "json": one JSON object per log line (log.h)
 *     dpdk = {                        # transport = "dpdk" (kernel bypass) only
 *       eal = [ "--vdev", "net_af_xdp0,iface=eth1" ];  # EAL arguments (pboxd adds
 *                                     # --lcores from cores/cpus unless given here)
 *       addresses = [ "10.0.0.1" ];   # IPv4 per DPDK port (or one for all);
 *                                     # default: data_address, which must be listed
 *       rx_desc = 1024; tx_desc = 1024; # per queue, adjusted by the device
 *       mbuf_bytes = 2048;            # RX mbuf data room; larger frames need scatter
 *       tx_drain_us = 20;             # longest a reply waits for a fuller TX burst
 *       idle_sleep_us = 50;           # sleep per idle poll without busy_poll
 *       steering = "auto";            # "auto", "flow", "rss" or "software"
 *       zero_copy = true;             # replies reference chunk memory
 *     };
 *     afxdp = { interface = "eth1"; ... };  # transport = "afxdp": see
 *                                     # transport/afxdp/conf.h (the filter below goes
 *                                     # on this interface unless xdp.interface is set)
 *     xdp = {                         # nicfw/ XDP filter in front of the data ports
 *       interface = "eth1";           # attach to this interface ("": no filter)
 *       mode = "auto";                # "native", "generic", or "auto" (native, else
 *                                     # generic, logged)
 *       pin_root = "/sys/fs/bpf/pbox"; # maps pinned under <pin_root>/<interface>/
 *                                     # ("": not pinned)
 *       max_chunks = 1048576;         # chunk-owner entries over all jobs
 *     };
 *     shm = { enabled = true; socket = ""; ring_kb = 0; max_conns = 64; };
 *                                     # shared-memory rings for workers on this host
 *                                     # (transport/shm/shm_config.h)
 *     probe = {                       # SLoPS probe agent for pbox-ctrld (absent: off)
 *       port = 55001;                 # UDP port of the responder
 *       address = "";                 # numeric address it binds ("": any)
 *       max_rate = "1gbit";           # highest rate cap a controller may ask for
 *       max_budget_s = 10;            # longest probe a controller may ask for
 *       realtime = false;             # pace streams from a SCHED_FIFO thread (needs
 *                                     # CAP_SYS_NICE; steadier on a busy host)
 *     };
 *   };
 *   metrics = { listen = "127.0.0.1:9540"; };  # Prometheus GET /metrics (common/metrics.h;
 *                                     # absent: off)
 *   jobs = ( { id = 1; token = "s3cret"; workers = 3;
 *              mode = "server-optimizer";          # or "aggregate"
 *              reduce = "mean";                     # aggregate: "sum" or "mean"
 *              optimizer = { name = "nag"; lr = 0.1; momentum = 0.9; wd = 1e-4;
 *                            rescale = 1.0; clip = 0.0; beta1 = 0.9; beta2 = 0.999;
 *                            eps = 1e-8; };
 *              deterministic = true;
 *              keys = ( [0, 784000], [1, 1000] );   # optional fixed key set
 *              sync = { model = "ssp";   # bsp ssp asp pssp pssp-dyn drop-stragglers
 *                       staleness = 2;   # s (ssp, pssp, pssp-dyn)
 *                       probability = 0.5; alpha = 1.0;  # pssp c, pssp-dyn a
 *                       quorum = 2;      # drop-stragglers: N_t of the workers
 *                       release = "lazy";  # held pulls: lazy (default) or eager
 *                       seed = 1; };
 *              flow = { mode = "notify-ack"; credits = 1; verify = false; };  # or "plain"
 *              on_worker_loss = "continue";  # or "abort" (default for bsp)
 *              memory_budget = "4G";    # this job's chunk state at most (default: only
 *                                       # the appliance's budget applies)
 *              non_finite = "reject";  # NaN/Inf gradients: "reject" or "propagate"
 *              dvf = { low = 2.0; up = 8.0; codec = "snappy"; };  # Parameter Flow's
 *                                       # filter on pushes and aggregates (dvf/dvf_job.h)
 *              tree = { degree = 2; depth = 3; };  # TSB broadcast (pboxd/tsbd.h)
 *            } );
 *
 * Thread safety: built and read by the control thread; immutable after load.
 */
#ifndef PBOXD_CONFIG_H
#define PBOXD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libconfig.h>

#include "common/jobdesc.h"
#include "common/metrics.h"
#include "engine/job.h"
#include "kernels/kernels.h"
#include "transport/afxdp/conf.h"
#include "transport/dpdk/conf.h"
#include "transport/fault.h"
#include "transport/shm/shm_config.h"

#define PBOXD_DEFAULT_CONFIG "/etc/pbox/pboxd.conf"

struct pboxd_job_cfg {
	uint32_t id;
	char token[256];
	uint32_t workers;
	enum pbox_job_mode mode;
	enum pbox_reduce_op reduce;
	bool deterministic;
	uint32_t window;
	const struct pbox_optimizer_ops *opt;
	struct pbox_opt_params opt_params;
	struct pbox_keyspec *keys; /* NULL: the first registering rank defines them */
	uint32_t nkeys;
	const struct pbox_sync_ops *sync;
	struct pbox_sync_cfg sync_cfg;
	bool plain_flow;  /* pushes complete when sent, no credit limit (baseline) */
	uint32_t credits; /* NOTIFY-ACK credits (plain: the window) */
	bool verify_crc;
	bool abort_on_loss;     /* a worker lost without a goodbye aborts the session */
	uint64_t memory_budget; /* bytes of chunk state; 0: only the appliance's budget */
	bool checkpoint;        /* server-optimizer with a checkpoint_dir: checkpointed */
	enum pbox_non_finite non_finite;
	/* The control plane's chunk -> core map for the fixed key set (checked by
	 * pboxd_job_cfg_set_assignment; owned); NULL: pboxd's own LPT at register. */
	uint32_t *core_map;
	uint32_t ncore_map;
	struct pbox_dvf_job dvf; /* enabled: the job has a dvf group */
	/* tree = { ... } (pboxd/tsbd.h): results go down a broadcast tree (TSB) */
	bool tree;
	uint32_t tree_degree, tree_depth;
	uint32_t *tree_parent; /* workers entries (PBOX_TSB_ROOT: the appliance); owned */
};

/* The appliance's xdp = { ... } group (see the example above). */
struct pboxd_xdp_cfg {
	char interface[16]; /* "": no XDP filter */
	char mode[8];       /* auto, native, generic */
	char pin_root[256];
	uint32_t max_chunks;
};

/* The appliance's probe = { ... } group (see the example above). */
struct pboxd_probe_cfg {
	bool enabled; /* the group is present */
	char address[64];
	uint16_t port;
	double max_rate_bps;
	uint32_t max_budget_s;
	bool realtime;
};

/* The appliance's control_limits = { ... } group (see the example above). */
struct pboxd_control_limits {
	uint32_t max_connections;
	uint32_t max_per_address;
	uint32_t max_unauth;
	uint32_t max_unauth_per_address;
	uint32_t unauth_timeout; /* seconds */
	uint32_t max_register_keys;
	uint32_t max_output_bytes;
	uint32_t auth_failures_burst;
	uint32_t auth_failures_per_minute;
};

struct pboxd_config {
	char path[512];
	char transport[16];
	char data_addr[64];
	uint16_t base_port;
	char control_host[64];
	uint16_t control_port;
	uint32_t ncores;
	int cpus[PBOX_MAX_CORES]; /* -1: not pinned */
	uint32_t chunk_bytes;
	uint32_t mtu;
	bool busy_poll;
	uint32_t idle_us;
	uint32_t burst;
	bool deterministic;
	uint32_t stats_interval;
	uint32_t drain_timeout;
	uint32_t worker_timeout;      /* seconds; 0: no heartbeat checks */
	uint64_t memory_budget;       /* bytes of chunk state of all sessions; 0: "auto" */
	char checkpoint_dir[512];     /* "": checkpoints off */
	uint32_t checkpoint_interval; /* seconds; 0: only at shutdown */
	struct pbox_fault_cfg fault;
	char admin_token[256];    /* "": stats of every job only over control_socket */
	char control_socket[108]; /* "": none */
	struct pboxd_control_limits limits;
	struct pboxd_dpdk_cfg dpdk;
	struct pboxd_xdp_cfg xdp;
	struct pbox_afxdp_cfg afxdp;
	struct pboxd_probe_cfg probe;
	struct pboxd_shm_cfg shm;        /* transport/shm/shm_config.h */
	int log_format;                  /* enum pbox_log_format; -1: not set (environment) */
	struct pbox_metrics_cfg metrics; /* top-level `metrics` group (common/metrics.h) */
	struct pboxd_job_cfg *jobs;
	uint32_t njobs;
};

/*
 * Load and validate one job group g (the settings of a configuration file's job, see
 * above) into j, exactly as pboxd_config_load does for each entry of jobs (cfg gives the
 * appliance's defaults: deterministic, checkpoint_dir). origin names where g came from in
 * errors ("pboxd.conf", "job description"). Returns 0, or -EINVAL with err; on error j
 * owns nothing. Release with pboxd_job_cfg_free.
 */
int pboxd_config_load_job(const struct pboxd_config *cfg, const config_setting_t *g,
			  const char *origin, struct pboxd_job_cfg *j, char *err, size_t errlen);

/*
 * A job from a JSON job description (common/jobspec.h): converted to the libconfig group
 * a configuration file would hold and loaded by pboxd_config_load_job, so runtime jobs
 * and config-file jobs are validated by the same code. Returns 0, or -EINVAL / -ENOMEM
 * with err ("job description: job.workers: must be between 1 and 1024 (got 0)").
 */
int pboxd_job_cfg_from_json(const struct pboxd_config *cfg, const json_t *desc,
			    struct pboxd_job_cfg *j, char *err, size_t errlen);

/*
 * Give job j (loaded already, with a fixed key set) the control plane's assignment of its
 * chunks to the data-plane cores, a={"chunk_bytes": C, "map": [...]} (shape checked by
 * pbox_jobmsg_decode). Checked strictly against this appliance: C must be cfg's chunk_bytes,
 * the map must have one entry per chunk of j's key set and every entry must be one of
 * cfg's ncores data-plane cores. Returns 0 (j->core_map set, owned by j), or -EINVAL
 * with err naming the job and the cause (no fixed key set, another chunk size, a chunk
 * count that differs, a core that does not exist), or -ENOMEM.
 */
int pboxd_job_cfg_set_assignment(const struct pboxd_config *cfg, struct pboxd_job_cfg *j,
				 const json_t *a, char *err, size_t errlen);

/* Free what j owns (its key set, its core map); j may be reused. */
void pboxd_job_cfg_free(struct pboxd_job_cfg *j);

/* Defaults for everything (no jobs). */
void pboxd_config_defaults(struct pboxd_config *cfg);

/*
 * Read and validate path into cfg (which holds the defaults / earlier values). Returns 0,
 * or -EINVAL / -ENOENT with the error ("file:line: setting: what is wrong") in err.
 */
int pboxd_config_load(struct pboxd_config *cfg, const char *path, char *err, size_t errlen);

/* Append EAL arguments from the command line (not copied: they must outlive cfg).
 * 0 or -E2BIG with err. */
int pboxd_config_add_eal_args(struct pboxd_config *cfg, int argc, char **argv, char *err,
			      size_t errlen);

/* Checks across settings (after command-line overrides). 0 or -EINVAL with err. */
int pboxd_config_check(const struct pboxd_config *cfg, char *err, size_t errlen);

void pboxd_config_free(struct pboxd_config *cfg);

/* A rate: "100mbit", "1.5gbit", "500m", "800k" (bit/s; k/m/g with or without "bit", any
 * case) into *out; false unless it is one from 2 Mbit/s to 1000 Gbit/s. */
bool pboxd_parse_rate(const char *s, double *out);

/*
 * Parse a byte size: a decimal count with an optional suffix K, M, G or T (powers of 1024,
 * optionally followed by "B" or "iB"), e.g. "4G", "512MiB", "1048576". Returns 0 or
 * -EINVAL (not a size, zero, or more than 2^63 bytes).
 */
int pboxd_parse_bytes(const char *s, uint64_t *out);

/* Parse "0,1,4-6" into cpus (at most max); returns the count or -EINVAL. */
int pboxd_parse_cpulist(const char *s, int *cpus, unsigned max);

#endif /* PBOXD_CONFIG_H */
