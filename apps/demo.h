/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox demo`'s private declarations: the state of one run and the functions its files
 * share. The files, one purpose each:
 *
 *   cmd_demo.c       the command: the run's setup and the order of its steps
 *   demo_opts.c      options: usage text, parsing and checks
 *   demo_config.c    the pboxd configuration the demo generates (free ports, the file)
 *   demo_proc.c      process supervision: pboxd and the workers started, waited for,
 *                    restarted (--kill-appliance-at), stopped and reaped; signals
 *   demo_events.c    the workers' JSON event streams, read into struct worker / epoch_sum
 *   demo_progress.c  what is shown while training: start line, progress, epoch lines
 *   demo_report.c    the final report: pboxd's counters, the summary, --json
 *
 * Threading and ownership: single-threaded. One struct demo, on pbox_cmd_demo()'s stack,
 * holds the whole run, and every function here runs on the demo's one thread with it; no
 * function keeps state of its own. The struct owns: the children it started (d->pboxd and
 * d->w[r].pid, 0 once reaped; only demo_proc.c reaps, records their wait status and stops
 * them), the read ends of the workers' stdout pipes (w->out_fd, -1 once closed; read by
 * demo_drain()), the temporary directory and its files (removed by demo_stop() unless
 * --keep-logs), d->w and d->ep (allocated by the setup in cmd_demo.c, freed by
 * pbox_cmd_demo()) and d->appliance (a JSON reference, dropped by pbox_cmd_demo()). Fatal
 * signals and SIGCHLD are blocked and read from d->sigfd; children get d->oldmask back.
 * The strings of d->o point into argv.
 */
#ifndef PBOX_APPS_DEMO_H
#define PBOX_APPS_DEMO_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <jansson.h>
#include <pbox/pbox.h>

#include "common/ctlproto.h"
#include "train/mlp.h"

#define DEMO_JOB_ID          1
#define DEMO_DEFAULT_WORKERS 3
#define DEMO_DEFAULT_CORES   1
#define DEMO_DEFAULT_MTU     65535 /* loopback: one datagram per fragment of a chunk */
#define DEMO_START_TIMEOUT_S 20.0  /* pboxd must open its control port within this */
#define DEMO_STOP_TIMEOUT_S  5.0   /* children get this long after SIGTERM, then SIGKILL */
#define DEMO_START_ATTEMPTS  3     /* fresh ports if pboxd lost a race for them */
#define DEMO_PLAIN_EVERY_S   2.0   /* progress lines when the output is not a terminal */
#define DEMO_BAR_EVERY_S     0.1   /* progress bar redraws on a terminal */
#define DEMO_BAR_WIDTH       30
#define DEMO_LOG_TAIL        8 /* lines of a failed child's log to show */

struct demo_opts {
	uint32_t workers, epochs, batch, cores, mtu;
	uint64_t seed, max_steps;
	double lr, momentum, wd;
	const char *optimizer;
	const char *mode; /* "server-optimizer" or "broadcast" */
	bool exact_lag;   /* broadcast: the workers' --exact-lag */
	bool deterministic, det_given, json, keep_logs;
	const char *fault, *save_model, *data_dir;
	/* synchronisation (see pboxd.conf's sync group) */
	const char *sync, *release, *on_loss;
	uint32_t staleness, quorum, slow_rank;
	double probability, alpha, slow_factor;
	uint64_t kill_at; /* --kill-appliance-at: SIGKILL pboxd at this step, restart (0: no) */
	/* --dvf: the job's dvf group (Parameter Flow's filter on pushes and broadcasts) */
	bool dvf;
	double dvf_low, dvf_up;
	const char *dvf_codec;
};

struct worker {
	uint32_t rank;
	pid_t pid; /* 0: not running (never started or reaped) */
	int out_fd;
	struct pbox_linebuf lb;
	char log[PATH_MAX];
	int status; /* wait status once reaped */
	bool reaped, ready, done;
	uint64_t total_steps;
	double train_s;
	struct pbox_client_stats net;
	uint32_t model_crc; /* CRC32C of its final model (done event) */
	char error[1024];   /* from its error event */
};

struct epoch_sum {
	uint32_t reports;
	uint32_t steps;
	struct pbox_mlp_stats train, test;
	double train_s, eval_s; /* slowest rank */
	uint64_t wire_bytes;
};

struct demo {
	struct demo_opts o;
	char dir[PATH_MAX];
	char conf[PATH_MAX + 16];
	char pboxd_log[PATH_MAX + 16];
	char pboxd_path[PATH_MAX];
	char self_path[PATH_MAX];
	char control[64];
	char token[33];
	uint16_t tcp_port, base_port;
	char transport[16];   /* the workers' data path: "shm", "udp", or "shm+udp" if mixed */
	uint32_t nregistered; /* workers pushing from registered memory (ready events) */
	pid_t pboxd;
	int pboxd_status;
	bool pboxd_reaped;
	pid_t self;
	sigset_t oldmask;
	int sigfd;
	struct worker *w;
	struct epoch_sum *ep;
	uint32_t steps_per_epoch;
	FILE *out; /* human output: stdout, or stderr with --json */
	bool tty;
	double t_start, t_ready, t_done, last_plain;
	uint32_t nready, ndone;
	bool interrupted;
	json_t *appliance; /* pboxd counters at the end */
	/* --kill-appliance-at */
	char ckpt_dir[PATH_MAX + 16];
	char ckpt_file[PATH_MAX + 32];
	char killed_log[PATH_MAX + 32]; /* the killed pboxd's log */
	bool killed;
	uint64_t killed_at;  /* the slowest rank's step when pboxd was killed */
	uint64_t resumed_at; /* the step the restarted workers resumed at (restored version) */
};

/* demo_opts.c: parse argv into o. Returns 0, 1 (help printed) or -EINVAL (message
 * printed). */
int demo_parse(int argc, char **argv, struct demo_opts *o);

/* demo_config.c */
/* A TCP port and a run of cores consecutive UDP ports free on 127.0.0.1 now, into
 * d->tcp_port, d->base_port and d->control. 0 or -errno. */
int demo_pick_ports(struct demo *d);
/* Write d->conf (mode 0600: it holds the token). 0 or a negative errno (reported). */
int demo_write_config(struct demo *d);

/* demo_proc.c */
/* Find pboxd into d->pboxd_path. 0 or -ENOENT (reported). */
int demo_find_pboxd(struct demo *d);
/* Start pboxd and wait until its control port answers. 0, -EINTR or -EIO (reported). */
int demo_start_pboxd(struct demo *d);
/* Start the d->o.workers ranks. 0 or -EIO (reported). */
int demo_start_workers(struct demo *d);
/* Follow the run until every worker is done (0), one fails or pboxd dies (-EIO,
 * reported), or a signal asks to stop (-EINTR). */
int demo_follow(struct demo *d);
/* Stop pboxd after a good run: 0 if it exits cleanly, else -ETIMEDOUT or -EIO. */
int demo_stop_pboxd(struct demo *d);
/* Stop and reap every child still running and remove the temporary directory (unless
 * --keep-logs). Every way out of the demo goes through it. */
void demo_stop(struct demo *d);

/* demo_events.c: read what worker w wrote and take its events; returns false once its
 * stream has ended. */
bool demo_drain(struct demo *d, struct worker *w);

/* demo_progress.c */
/* The steps every rank has done (the slowest rank's total). */
uint64_t demo_min_steps(const struct demo *d);
/* Bytes sent plus received by all workers so far; the two parts into *tx and *rx when tx
 * is not NULL. */
uint64_t demo_wire_bytes(const struct demo *d, uint64_t *tx, uint64_t *rx);
/* Erase the progress bar (a terminal only) before other output. */
void demo_clear_bar(struct demo *d);
/* Redraw the progress bar or print a progress line, at most at its rate unless force. */
void demo_show_progress(struct demo *d, bool force);
/* The line of epoch e (0-based), once every rank reported it. */
void demo_show_epoch(struct demo *d, uint32_t e);
/* The line printed once every worker is ready. */
void demo_show_ready(struct demo *d);

/* demo_report.c */
/* pboxd's counters into d->appliance (a failure is reported, d->appliance stays NULL). */
void demo_fetch_appliance_stats(struct demo *d);
/* Whether every rank finished with the same model (its done event's CRC32C). */
bool demo_replicas_identical(const struct demo *d);
/* The summary of a good run, on d->out. */
void demo_print_summary(struct demo *d);
/* The --json summary on stdout; rc is the run's result, error its message if rc != 0. */
void demo_print_json(struct demo *d, int rc, const char *error);

static inline double demo_ratio(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : 0.0;
}

static inline double demo_pct(uint64_t num, uint64_t den)
{
	return 100.0 * demo_ratio(num, den);
}

static inline bool demo_is_broadcast(const struct demo *d)
{
	return strcmp(d->o.mode, "broadcast") == 0;
}

#endif
