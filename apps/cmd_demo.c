/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox demo`: the whole product on one machine. Writes a pboxd configuration with one
 * server-optimizer (or, --mode broadcast, broadcast) job into a fresh temporary directory, starts
 * pboxd on free loopback ports, starts N `pbox train` workers (this same executable) as the job's
 * ranks, and follows their JSON event streams: a progress bar per epoch, the loss and accuracy of
 * each epoch summed over all ranks, the bytes on the wire, and at the end the final test
 * accuracy and the throughput.
 *
 * Children run in their own process group (so a terminal's Ctrl-C reaches only the demo,
 * which then stops them in order) with a parent-death signal (so they cannot outlive a
 * demo that is killed). Every way out - success, a failed worker, pboxd dying, bad
 * options, SIGINT/SIGTERM/SIGHUP/SIGQUIT - goes through demo_stop(), which stops and
 * reaps every child this process started and removes the temporary directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "common/args.h"
#include "common/clock.h"
#include "common/compiler.h"
#include "common/ctlproto.h"
#include "train/fmnist.h"
#include "train/schedule.h"
#include "dvf/dvf_job.h"
#include "train/trainer.h"
#include "engine/sync.h"
#include "transport/fault.h"

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

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox demo [options]\n"
		"\n"
		"Train Fashion-MNIST end to end on this machine: start pboxd (with a generated\n"
		"configuration on free loopback ports) and N worker processes that train a\n"
		"784-256-128-10 MLP through it, the optimizer running on the appliance (with\n"
		"--mode broadcast: on every worker). Shows a progress bar per epoch, train loss\n"
		"and accuracy over all ranks, test accuracy, bytes on the wire, and at the end\n"
		"the final test accuracy and the throughput.\n"
		"\n"
		"Options:\n"
		"      --workers N        worker processes (default %u)\n"
		"      --epochs N         epochs (default %u)\n"
		"      --batch B          global batch, split over the workers (default %u)\n"
		"      --max-steps K      stop after K steps in all (default: all epochs)\n"
		"      --lr X             learning rate (default %g)\n"
		"      --momentum X       momentum (default %g)\n"
		"      --wd X             weight decay (default 0)\n"
		"      --optimizer NAME   %s (default %s)\n"
		"      --mode MODE        server-optimizer (default: the appliance runs the\n"
		"                         optimizer) or broadcast (every worker keeps the model\n"
		"                         and runs it on the aggregates: Parameter Flow's UCC;\n"
		"                         --sync bsp or ssp)\n"
		"      --exact-lag        broadcast under ssp(s): every step on exactly the model\n"
		"                         s aggregates old (bit-reproducible; default: newest)\n"
		"      --deterministic    sum gradients in rank order: bit-reproducible (default)\n"
		"      --no-deterministic sum gradients in arrival order\n"
		"      --sync MODEL       bsp (default), ssp, asp, pssp, pssp-dyn, "
		"drop-stragglers\n"
		"      --staleness S      ssp / pssp bound (default 2)\n"
		"      --probability C    pssp pause probability (default 0.5)\n"
		"      --alpha A          pssp-dyn scale (default 1)\n"
		"      --quorum Q         drop-stragglers: ranks that complete a step\n"
		"                         (default: workers - 1)\n"
		"      --release WHEN     held pulls: lazy (default) or eager\n"
		"      --on-worker-loss A abort or continue (default: abort for bsp)\n"
		"      --slow-rank R      make rank R a straggler ...\n"
		"      --slow-factor F    ... whose compute takes F times as long (default 2)\n"
		"      --cores N          pboxd data-plane cores (default %u)\n"
		"      --mtu N            path MTU given to pboxd (default %u, loopback)\n"
		"      --seed S           initial weights and shuffles (default %u)\n"
		"      --fault SPEC       inject faults on every send, in pboxd (--fault) and in\n"
		"                         the workers (PBOX_FAULT): drop=P,dup=P,reorder=P,seed=N\n"
		"      --save-model FILE  write the final model (format: see `pbox train`)\n"
		"      --data DIR         Fashion-MNIST IDX files (default %s)\n"
		"      --json             print a JSON summary on stdout (progress goes to "
		"stderr)\n"
		"      --keep-logs        keep the temporary directory with the configuration and\n"
		"                         the logs of pboxd and of every worker\n"
		"      --dvf              filter pushes (and, with --mode broadcast, broadcasts)\n"
		"                         with Parameter Flow's DVF: sparse blocks, compressed\n"
		"      --dvf-low X, --dvf-up X, --dvf-codec NAME\n"
		"                         its thresholds (default %g, %g) and codec (default\n"
		"                         snappy; none, lz4, zstd[:1-3], igzip[:0-3])\n"
		"      --kill-appliance-at STEP\n"
		"                         checkpoint every second; once the workers are past STEP\n"
		"                         and a checkpoint exists, kill -9 pboxd, restart it and\n"
		"                         the workers, which resume from the restored version\n"
		"  -h, --help             this text\n"
		"\n"
		"pboxd is the build tree's (../dataplane/pboxd from this program) if there is\n"
		"one, else the one in PATH; the environment variable PBOX_PBOXD names another.\n"
		"\n"
		"Exit status: 0 done, 1 a worker or pboxd failed, 64 bad options, 130 "
		"interrupted.\n",
		DEMO_DEFAULT_WORKERS, PBOX_TRAIN_DEFAULT_EPOCHS, PBOX_TRAIN_DEFAULT_BATCH,
		PBOX_TRAIN_DEFAULT_LR, PBOX_TRAIN_DEFAULT_MOM, pbox_optimizer_names(),
		PBOX_TRAIN_DEFAULT_OPT, DEMO_DEFAULT_CORES, DEMO_DEFAULT_MTU,
		PBOX_TRAIN_DEFAULT_SEED, PBOX_FMNIST_DEFAULT_DIR, (double)PBOX_DVF_DEFAULT_LOW,
		(double)PBOX_DVF_DEFAULT_UP);
}

enum {
	OPT_WORKERS = 256,
	OPT_EPOCHS,
	OPT_BATCH,
	OPT_MAX_STEPS,
	OPT_LR,
	OPT_MOMENTUM,
	OPT_WD,
	OPT_OPTIMIZER,
	OPT_DET,
	OPT_NO_DET,
	OPT_CORES,
	OPT_MTU,
	OPT_SEED,
	OPT_FAULT,
	OPT_SAVE,
	OPT_DATA,
	OPT_JSON,
	OPT_KEEP,
	OPT_SYNC,
	OPT_STALENESS,
	OPT_PROB,
	OPT_ALPHA,
	OPT_QUORUM,
	OPT_RELEASE,
	OPT_ON_LOSS,
	OPT_SLOW_RANK,
	OPT_SLOW_FACTOR,
	OPT_DVF,
	OPT_DVF_LOW,
	OPT_DVF_UP,
	OPT_DVF_CODEC,
	OPT_KILL_AT,
	OPT_MODE,
	OPT_EXACT_LAG,
};

static const struct option g_opts[] = {
	{ "workers", required_argument, NULL, OPT_WORKERS },
	{ "epochs", required_argument, NULL, OPT_EPOCHS },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "max-steps", required_argument, NULL, OPT_MAX_STEPS },
	{ "lr", required_argument, NULL, OPT_LR },
	{ "momentum", required_argument, NULL, OPT_MOMENTUM },
	{ "wd", required_argument, NULL, OPT_WD },
	{ "optimizer", required_argument, NULL, OPT_OPTIMIZER },
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "exact-lag", no_argument, NULL, OPT_EXACT_LAG },
	{ "deterministic", no_argument, NULL, OPT_DET },
	{ "no-deterministic", no_argument, NULL, OPT_NO_DET },
	{ "cores", required_argument, NULL, OPT_CORES },
	{ "mtu", required_argument, NULL, OPT_MTU },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "fault", required_argument, NULL, OPT_FAULT },
	{ "save-model", required_argument, NULL, OPT_SAVE },
	{ "data", required_argument, NULL, OPT_DATA },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "keep-logs", no_argument, NULL, OPT_KEEP },
	{ "kill-appliance-at", required_argument, NULL, OPT_KILL_AT },
	{ "sync", required_argument, NULL, OPT_SYNC },
	{ "staleness", required_argument, NULL, OPT_STALENESS },
	{ "probability", required_argument, NULL, OPT_PROB },
	{ "alpha", required_argument, NULL, OPT_ALPHA },
	{ "quorum", required_argument, NULL, OPT_QUORUM },
	{ "release", required_argument, NULL, OPT_RELEASE },
	{ "on-worker-loss", required_argument, NULL, OPT_ON_LOSS },
	{ "slow-rank", required_argument, NULL, OPT_SLOW_RANK },
	{ "slow-factor", required_argument, NULL, OPT_SLOW_FACTOR },
	{ "dvf", no_argument, NULL, OPT_DVF },
	{ "dvf-low", required_argument, NULL, OPT_DVF_LOW },
	{ "dvf-up", required_argument, NULL, OPT_DVF_UP },
	{ "dvf-codec", required_argument, NULL, OPT_DVF_CODEC },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Returns 0, 1 (help printed) or -EINVAL (message printed). */
static int parse(int argc, char **argv, struct demo_opts *o)
{
	int c, rc = 0;

	*o = (struct demo_opts){
		.workers = DEMO_DEFAULT_WORKERS,
		.epochs = PBOX_TRAIN_DEFAULT_EPOCHS,
		.batch = PBOX_TRAIN_DEFAULT_BATCH,
		.cores = DEMO_DEFAULT_CORES,
		.mtu = DEMO_DEFAULT_MTU,
		.seed = PBOX_TRAIN_DEFAULT_SEED,
		.lr = PBOX_TRAIN_DEFAULT_LR,
		.momentum = PBOX_TRAIN_DEFAULT_MOM,
		.optimizer = PBOX_TRAIN_DEFAULT_OPT,
		.mode = "server-optimizer",
		.deterministic = true,
		.sync = "bsp",
		.release = "lazy",
		.staleness = 2,
		.probability = 0.5,
		.alpha = 1.0,
		.slow_rank = UINT32_MAX,
		.slow_factor = 2.0,
		.dvf_low = PBOX_DVF_DEFAULT_LOW,
		.dvf_up = PBOX_DVF_DEFAULT_UP,
		.dvf_codec = "snappy",
	};
	optind = 1;
	while (rc == 0 && (c = getopt_long(argc, argv, "h", g_opts, NULL)) != -1) {
		switch (c) {
		case OPT_WORKERS:
			rc = pbox_arg_u32("pbox demo", "--workers", optarg, 1, 64, &o->workers);
			break;
		case OPT_EPOCHS:
			rc = pbox_arg_u32("pbox demo", "--epochs", optarg, 1, 1000, &o->epochs);
			break;
		case OPT_BATCH:
			rc = pbox_arg_u32("pbox demo", "--batch", optarg, 1, 60000, &o->batch);
			break;
		case OPT_MAX_STEPS:
			rc = pbox_arg_u64("pbox demo", "--max-steps", optarg, 1, UINT32_MAX,
					  &o->max_steps);
			break;
		case OPT_LR:
			rc = pbox_arg_double("pbox demo", "--lr", optarg, 0, 1e6, &o->lr);
			break;
		case OPT_MOMENTUM:
			rc = pbox_arg_double("pbox demo", "--momentum", optarg, 0, 1, &o->momentum);
			break;
		case OPT_WD:
			rc = pbox_arg_double("pbox demo", "--wd", optarg, 0, 1e3, &o->wd);
			break;
		case OPT_OPTIMIZER:
			o->optimizer = optarg;
			break;
		case OPT_MODE:
			o->mode = optarg;
			break;
		case OPT_EXACT_LAG:
			o->exact_lag = true;
			break;
		case OPT_DET:
			o->deterministic = true;
			o->det_given = true;
			break;
		case OPT_NO_DET:
			o->deterministic = false;
			o->det_given = true;
			break;
		case OPT_CORES:
			rc = pbox_arg_u32("pbox demo", "--cores", optarg, 1, 64, &o->cores);
			break;
		case OPT_MTU:
			rc = pbox_arg_u32("pbox demo", "--mtu", optarg, 576, 65535, &o->mtu);
			break;
		case OPT_SEED:
			rc = pbox_arg_u64("pbox demo", "--seed", optarg, 0, UINT64_MAX, &o->seed);
			break;
		case OPT_FAULT:
			o->fault = optarg;
			break;
		case OPT_SAVE:
			o->save_model = optarg;
			break;
		case OPT_DATA:
			o->data_dir = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_KEEP:
			o->keep_logs = true;
			break;
		case OPT_KILL_AT:
			rc = pbox_arg_u64("pbox demo", "--kill-appliance-at", optarg, 1, UINT32_MAX,
					  &o->kill_at);
			break;
		case OPT_SYNC:
			o->sync = optarg;
			break;
		case OPT_STALENESS:
			rc = pbox_arg_u32("pbox demo", "--staleness", optarg, 0, 62, &o->staleness);
			break;
		case OPT_PROB:
			rc = pbox_arg_double("pbox demo", "--probability", optarg, 0, 1,
					     &o->probability);
			break;
		case OPT_ALPHA:
			rc = pbox_arg_double("pbox demo", "--alpha", optarg, 0, 2, &o->alpha);
			break;
		case OPT_QUORUM:
			rc = pbox_arg_u32("pbox demo", "--quorum", optarg, 1, 64, &o->quorum);
			break;
		case OPT_RELEASE:
			o->release = optarg;
			break;
		case OPT_ON_LOSS:
			o->on_loss = optarg;
			break;
		case OPT_SLOW_RANK:
			rc = pbox_arg_u32("pbox demo", "--slow-rank", optarg, 0, 63, &o->slow_rank);
			break;
		case OPT_DVF:
			o->dvf = true;
			break;
		case OPT_DVF_LOW:
			rc = pbox_arg_double("pbox demo", "--dvf-low", optarg, 0, 1e30,
					     &o->dvf_low);
			o->dvf = true;
			break;
		case OPT_DVF_UP:
			rc = pbox_arg_double("pbox demo", "--dvf-up", optarg, 0, 1e30, &o->dvf_up);
			o->dvf = true;
			break;
		case OPT_DVF_CODEC:
			o->dvf_codec = optarg;
			o->dvf = true;
			break;
		case OPT_SLOW_FACTOR:
			rc = pbox_arg_double("pbox demo", "--slow-factor", optarg, 1, 1000,
					     &o->slow_factor);
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			fprintf(stderr, "Try 'pbox demo --help'.\n");
			return -EINVAL;
		}
	}
	if (rc != 0) {
		return rc;
	}
	if (optind < argc) {
		fprintf(stderr, "pbox demo: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (pbox_sync_parse(o->sync) < 0) {
		fprintf(stderr,
			"pbox demo: --sync %s: unknown; choose bsp, ssp, asp, pssp, pssp-dyn or "
			"drop-stragglers\n",
			o->sync);
		return -EINVAL;
	}
	if (strcmp(o->mode, "server-optimizer") != 0 && strcmp(o->mode, "broadcast") != 0) {
		fprintf(stderr, "pbox demo: --mode %s: choose server-optimizer or broadcast\n",
			o->mode);
		return -EINVAL;
	}
	if (strcmp(o->mode, "broadcast") == 0 && (pbox_sync_parse(o->sync) != PBOX_SYNC_BSP &&
						  pbox_sync_parse(o->sync) != PBOX_SYNC_SSP)) {
		fprintf(stderr,
			"pbox demo: --mode broadcast runs under --sync bsp or ssp, not %s\n",
			o->sync);
		return -EINVAL;
	}
	if (o->exact_lag && strcmp(o->mode, "broadcast") != 0) {
		fprintf(stderr, "pbox demo: --exact-lag is for --mode broadcast\n");
		return -EINVAL;
	}
	if (strcmp(o->mode, "broadcast") == 0 &&
	    (strcmp(o->release, "lazy") != 0 || o->kill_at != 0)) {
		fprintf(stderr, "pbox demo: --mode broadcast takes neither --release nor "
				"--kill-appliance-at (the appliance keeps no model)\n");
		return -EINVAL;
	}
	if (strcmp(o->release, "lazy") != 0 && strcmp(o->release, "eager") != 0) {
		fprintf(stderr, "pbox demo: --release %s: choose lazy or eager\n", o->release);
		return -EINVAL;
	}
	if (o->on_loss != NULL && strcmp(o->on_loss, "abort") != 0 &&
	    strcmp(o->on_loss, "continue") != 0) {
		fprintf(stderr, "pbox demo: --on-worker-loss %s: choose abort or continue\n",
			o->on_loss);
		return -EINVAL;
	}
	if (o->slow_rank != UINT32_MAX && o->slow_rank >= o->workers) {
		fprintf(stderr, "pbox demo: --slow-rank %u: there are %u workers\n", o->slow_rank,
			o->workers);
		return -EINVAL;
	}
	if (o->quorum == 0) {
		o->quorum = o->workers > 1 ? o->workers - 1 : 1;
	}
	if (o->quorum > o->workers) {
		fprintf(stderr, "pbox demo: --quorum %u: there are %u workers\n", o->quorum,
			o->workers);
		return -EINVAL;
	}
	if (pbox_sync_ops((enum pbox_sync_model)pbox_sync_parse(o->sync))->folds_late) {
		/* Late contributions are added in arrival order. */
		if (o->det_given && o->deterministic) {
			fprintf(stderr, "pbox demo: --sync %s cannot be deterministic\n", o->sync);
			return -EINVAL;
		}
		o->deterministic = false;
	}
	if (pbox_optimizer_find(o->optimizer) == NULL) {
		fprintf(stderr, "pbox demo: --optimizer %s: unknown; choose one of %s\n",
			o->optimizer, pbox_optimizer_names());
		return -EINVAL;
	}
	if (o->batch < o->workers) {
		fprintf(stderr,
			"pbox demo: --batch %u: every one of the %u workers needs a sample "
			"per step; use a batch of at least %u\n",
			o->batch, o->workers, o->workers);
		return -EINVAL;
	}
	if (o->fault != NULL) {
		struct pbox_fault_cfg fc;
		char err[256];

		if (pbox_fault_parse(o->fault, &fc, err, sizeof(err)) != 0 ||
		    pbox_fault_check(&fc, err, sizeof(err)) != 0) {
			fprintf(stderr, "pbox demo: --fault %s: %s\n", o->fault, err);
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- children ---------------------------------------------------------------------- */

static bool is_exec(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* pboxd: $PBOX_PBOXD, else the build tree's (../dataplane/pboxd from this program, in
 * build/apps/), else PATH. */
static int find_pboxd(struct demo *d)
{
	const char *env = getenv("PBOX_PBOXD"), *path = getenv("PATH");
	char dir[PATH_MAX], *slash;

	if (env != NULL && *env != '\0') {
		if (!is_exec(env)) {
			fprintf(stderr, "pbox demo: PBOX_PBOXD=%s: not an executable file\n", env);
			return -ENOENT;
		}
		snprintf(d->pboxd_path, sizeof(d->pboxd_path), "%s", env);
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s", d->self_path);
	slash = strrchr(dir, '/');
	if (slash != NULL) {
		*slash = '\0';
		snprintf(d->pboxd_path, sizeof(d->pboxd_path), "%s/../dataplane/pboxd", dir);
		if (is_exec(d->pboxd_path)) {
			return 0;
		}
	}
	while (path != NULL && *path != '\0') {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);

		if (n > 0 && n < sizeof(dir)) {
			snprintf(d->pboxd_path, sizeof(d->pboxd_path), "%.*s/pboxd", (int)n, path);
			if (is_exec(d->pboxd_path)) {
				return 0;
			}
		}
		path = end ? end + 1 : NULL;
	}
	fprintf(stderr,
		"pbox demo: pboxd not found: not at ../dataplane/pboxd from %s (a build tree) "
		"nor in PATH; set PBOX_PBOXD to its path\n",
		d->self_path);
	return -ENOENT;
}

/*
 * A TCP port and a run of ncores consecutive UDP ports, all free on 127.0.0.1 right now.
 * Another process can still take them before pboxd binds; start_pboxd() retries then.
 */
static int pick_ports(struct demo *d)
{
	for (int attempt = 0; attempt < 200; attempt++) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t al = sizeof(a);
		int fds[70], nfd = 0;
		bool ok = true;
		uint16_t base;

		fds[nfd] = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (fds[nfd] < 0 || bind(fds[nfd], (struct sockaddr *)&a, sizeof(a)) != 0 ||
		    getsockname(fds[nfd], (struct sockaddr *)&a, &al) != 0) {
			if (fds[nfd] >= 0) {
				close(fds[nfd]);
			}
			return -errno;
		}
		base = ntohs(a.sin_port);
		close(fds[nfd]);
		if ((uint32_t)base + d->o.cores >= 65000) {
			continue;
		}
		for (uint32_t k = 0; ok && k < d->o.cores; k++) {
			a.sin_port = htons((uint16_t)(base + k));
			fds[nfd] = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
			ok = fds[nfd] >= 0 && bind(fds[nfd], (struct sockaddr *)&a, sizeof(a)) == 0;
			nfd += fds[nfd] >= 0;
		}
		if (ok) {
			a.sin_port = 0;
			al = sizeof(a);
			fds[nfd] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			ok = fds[nfd] >= 0 &&
			     bind(fds[nfd], (struct sockaddr *)&a, sizeof(a)) == 0 &&
			     getsockname(fds[nfd], (struct sockaddr *)&a, &al) == 0;
			nfd += fds[nfd] >= 0;
		}
		for (int i = 0; i < nfd; i++) {
			close(fds[i]);
		}
		if (ok) {
			d->base_port = base;
			d->tcp_port = ntohs(a.sin_port);
			snprintf(d->control, sizeof(d->control), "127.0.0.1:%u", d->tcp_port);
			return 0;
		}
	}
	return -EADDRINUSE;
}

/* fork + exec with the demo's signals unblocked, its own process group, stdout to out_fd
 * (or the log), stderr to the log file, and extra environment (NAME=VALUE, may be NULL). */
static pid_t spawn(struct demo *d, const char *const argv[], int out_fd, const char *logpath,
		   const char *const *env, int deathsig)
{
	int log = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	pid_t pid;

	if (log < 0) {
		fprintf(stderr, "pbox demo: %s: cannot create: %s\n", logpath, strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "pbox demo: fork: %s\n", strerror(errno));
		close(log);
		return -1;
	}
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDONLY);

		sigprocmask(SIG_SETMASK, &d->oldmask, NULL);
		signal(SIGPIPE, SIG_DFL); /* ignored dispositions survive exec */
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, deathsig);
		if (getppid() != d->self) {
			_exit(127); /* the demo died before the death signal was armed */
		}
		if (devnull >= 0) {
			dup2(devnull, STDIN_FILENO);
		}
		dup2(out_fd >= 0 ? out_fd : log, STDOUT_FILENO);
		dup2(log, STDERR_FILENO);
		for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
			putenv((char *)env[i]);
		}
		execv(argv[0], (char *const *)argv);
		dprintf(STDERR_FILENO, "pbox demo: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(log);
	return pid;
}

static int write_config(struct demo *d)
{
	struct pbox_opt_params p;
	char dvf[256] = "";
	const char *det = d->o.deterministic ? "true" : "false";
	/* It holds the job's token: readable by this user only. */
	int fd = open(d->conf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;

	if (f == NULL) {
		int err = errno;

		fprintf(stderr, "pbox demo: %s: cannot create: %s\n", d->conf, strerror(err));
		if (fd >= 0) {
			close(fd);
		}
		return -err;
	}
	/* The same float parameters as `pbox train --local` uses, printed so that pboxd's
	 * double parse and float rounding give back exactly these floats. */
	pbox_train_opt_params(d->o.lr, d->o.momentum, d->o.wd, d->o.batch, &p);
	if (d->o.dvf) {
		snprintf(dvf, sizeof(dvf), "  dvf = { low = %.9g; up = %.9g; codec = \"%s\"; };\n",
			 d->o.dvf_low, d->o.dvf_up, d->o.dvf_codec);
	}
	fprintf(f,
		"# SPDX-License-Identifier: BSD-3-Clause\n"
		"# Generated by pbox demo.\n"
		"appliance = {\n"
		"  transport = \"udp\";\n"
		"  data_address = \"127.0.0.1\";\n"
		"  base_port = %u;\n"
		"  control = \"%s\";\n"
		"  cores = %u;\n"
		"  mtu = %u;\n"
		"  drain_timeout = 2;\n"
		"  deterministic = %s;\n"
		"  admin_token = \"%s\";\n"
		"%s%s%s"
		"};\n"
		"jobs = ( {\n"
		"  id = %u;\n"
		"  token = \"%s\";\n"
		"  workers = %u;\n"
		"  mode = \"%s\";\n"
		"  reduce = \"sum\";\n"
		"  deterministic = %s;\n"
		"  optimizer = { name = \"%s\"; lr = %.17g; momentum = %.17g; wd = %.17g;\n"
		"                rescale = %.17g; clip = %.17g; beta1 = %.17g; beta2 = %.17g;\n"
		"                eps = %.17g; };\n"
		"  sync = { model = \"%s\"; staleness = %u; probability = %.17g; alpha = %.17g;\n"
		"           quorum = %u; release = \"%s\"; seed = %u; };\n"
		"%s%s%s%s"
		"} );\n",
		d->base_port, d->control, d->o.cores, d->o.mtu, det, d->token,
		d->o.kill_at ? "  checkpoint_interval = 1;\n  checkpoint_dir = \"" : "",
		d->o.kill_at ? d->ckpt_dir : "", d->o.kill_at ? "\";\n" : "", DEMO_JOB_ID, d->token,
		d->o.workers, d->o.mode, det, d->o.optimizer, (double)p.lr, (double)p.momentum,
		(double)p.wd, (double)p.rescale, (double)p.clip, (double)p.beta1, (double)p.beta2,
		(double)p.eps, d->o.sync, d->o.staleness, d->o.probability, d->o.alpha, d->o.quorum,
		d->o.release, (unsigned)(d->o.seed & 0xffffffffu),
		d->o.on_loss ? "  on_worker_loss = \"" : "", d->o.on_loss ? d->o.on_loss : "",
		d->o.on_loss ? "\";\n" : "", dvf);
	if (fclose(f) != 0) {
		fprintf(stderr, "pbox demo: %s: write failed: %s\n", d->conf, strerror(errno));
		return -EIO;
	}
	return 0;
}

/* Print the last lines of a log, indented, to the demo's error output. */
static void show_tail(const char *what, const char *path)
{
	char buf[8192];
	FILE *f = fopen(path, "r");
	size_t n;
	long size;
	char *p, *start;
	int lines = 0;

	if (f == NULL) {
		return;
	}
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	while (n > 0 && buf[n - 1] == '\n') {
		buf[--n] = '\0';
	}
	if (n == 0) {
		return;
	}
	start = buf;
	for (p = buf + n; p > buf; p--) {
		if (p[-1] == '\n' && ++lines == DEMO_LOG_TAIL) {
			start = p;
			break;
		}
	}
	fprintf(stderr, "---- last lines of %s (%s) ----\n%s\n", what, path, start);
}

/* Reap every child that has exited and record its status. */
static void reap(struct demo *d)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);

		if (pid <= 0) {
			return;
		}
		if (pid == d->pboxd) {
			d->pboxd = 0;
			d->pboxd_status = st;
			d->pboxd_reaped = true;
			continue;
		}
		for (uint32_t r = 0; r < d->o.workers; r++) {
			if (d->w[r].pid == pid) {
				d->w[r].pid = 0;
				d->w[r].status = st;
				d->w[r].reaped = true;
			}
		}
	}
}

static void describe_status(int st, char *buf, size_t len)
{
	if (WIFEXITED(st)) {
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	} else if (WIFSIGNALED(st)) {
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st),
			 strsignal(WTERMSIG(st)));
	} else {
		snprintf(buf, len, "stopped (status 0x%x)", st);
	}
}

/* Stop every child still running (SIGTERM, then SIGKILL after a grace period), reap all,
 * and remove the temporary directory unless asked to keep it. */
static void demo_stop(struct demo *d)
{
	double deadline = pbox_mono_s() + DEMO_STOP_TIMEOUT_S;
	bool any;

	for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
		if (d->w[r].pid > 0) {
			kill(d->w[r].pid, SIGTERM);
		}
	}
	if (d->pboxd > 0) {
		kill(d->pboxd, SIGTERM);
	}
	for (;;) {
		reap(d);
		any = d->pboxd > 0;
		for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
			any |= d->w[r].pid > 0;
		}
		if (!any) {
			break;
		}
		if (pbox_mono_s() > deadline) {
			for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
				if (d->w[r].pid > 0) {
					kill(d->w[r].pid, SIGKILL);
				}
			}
			if (d->pboxd > 0) {
				fprintf(stderr,
					"pbox demo: pboxd did not stop within %.0f s of SIGTERM; "
					"killing it\n",
					DEMO_STOP_TIMEOUT_S);
				kill(d->pboxd, SIGKILL);
			}
			deadline = pbox_mono_s() + 60;
		}
		usleep(10000);
	}
	for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
		if (d->w[r].out_fd >= 0) {
			close(d->w[r].out_fd);
			d->w[r].out_fd = -1;
		}
		pbox_linebuf_free(&d->w[r].lb);
	}
	if (d->dir[0] != '\0') {
		if (d->o.keep_logs) {
			fprintf(stderr, "pbox demo: configuration and logs kept in %s\n", d->dir);
		} else {
			char path[PATH_MAX + 32];

			unlink(d->conf);
			unlink(d->pboxd_log);
			unlink(d->killed_log);
			unlink(d->ckpt_file);
			/* A write the kill interrupted; a file the restart did not accept. */
			snprintf(path, sizeof(path), "%s/.job-%u.ckpt.tmp", d->ckpt_dir,
				 DEMO_JOB_ID);
			unlink(path);
			snprintf(path, sizeof(path), "%s.rejected", d->ckpt_file);
			unlink(path);
			rmdir(d->ckpt_dir);
			for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
				unlink(d->w[r].log);
			}
			snprintf(path, sizeof(path), "%s", d->dir);
			if (rmdir(path) != 0) {
				fprintf(stderr, "pbox demo: cannot remove %s: %s\n", path,
					strerror(errno));
			}
		}
		d->dir[0] = '\0';
	}
}

/* Wait for a fatal signal for up to ms; returns true if one arrived (and records it). */
static bool wait_signal(struct demo *d, int ms)
{
	struct pollfd p = { .fd = d->sigfd, .events = POLLIN };
	struct signalfd_siginfo si;

	if (poll(&p, 1, ms) <= 0) {
		return false;
	}
	while (read(d->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo != SIGCHLD) {
			d->interrupted = true;
		}
	}
	return d->interrupted;
}

static bool control_answers(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (fd < 0) {
		return false;
	}
	ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* Start pboxd and wait until its control port answers. 0, -EINTR or -EIO (reported). */
static int start_pboxd(struct demo *d)
{
	for (int attempt = 1; attempt <= DEMO_START_ATTEMPTS; attempt++) {
		const char *argv[6] = { d->pboxd_path, "-c", d->conf, NULL, NULL, NULL };
		double deadline;
		int rc;

		rc = pick_ports(d);
		if (rc < 0) {
			fprintf(stderr, "pbox demo: no free loopback ports: %s\n", strerror(-rc));
			return -EIO;
		}
		rc = write_config(d);
		if (rc < 0) {
			return -EIO;
		}
		if (d->o.fault != NULL) {
			argv[3] = "--fault";
			argv[4] = d->o.fault;
		}
		d->pboxd = spawn(d, argv, -1, d->pboxd_log, NULL, SIGTERM);
		if (d->pboxd < 0) {
			d->pboxd = 0;
			return -EIO;
		}
		d->pboxd_reaped = false;
		deadline = pbox_mono_s() + DEMO_START_TIMEOUT_S;
		while (!control_answers(d->tcp_port)) {
			if (wait_signal(d, 50)) {
				return -EINTR;
			}
			reap(d);
			if (d->pboxd_reaped) {
				break;
			}
			if (pbox_mono_s() > deadline) {
				fprintf(stderr,
					"pbox demo: pboxd did not open its control port %s within "
					"%.0f "
					"s\n",
					d->control, DEMO_START_TIMEOUT_S);
				show_tail("the pboxd log", d->pboxd_log);
				return -EIO;
			}
		}
		if (!d->pboxd_reaped) {
			return 0;
		}
		/* 69 (EX_UNAVAILABLE): a port was taken between our check and its bind. */
		if (WIFEXITED(d->pboxd_status) && WEXITSTATUS(d->pboxd_status) == 69 &&
		    attempt < DEMO_START_ATTEMPTS) {
			continue;
		}
		{
			char how[128];

			describe_status(d->pboxd_status, how, sizeof(how));
			fprintf(stderr, "pbox demo: pboxd (%s) %s at start\n", d->pboxd_path, how);
			show_tail("the pboxd log", d->pboxd_log);
		}
		return -EIO;
	}
	return -EIO;
}

static int start_workers(struct demo *d)
{
	char fault_env[512], token_env[64];
	const char *env[4] = { "OPENBLAS_NUM_THREADS=1", token_env, NULL, NULL };

	/* The token goes in the environment, which only this user can read
	 * (/proc/<pid>/environ), not on the command line, which everyone can. */
	snprintf(token_env, sizeof(token_env), "PBOX_TOKEN=%s", d->token);
	if (d->o.fault != NULL) {
		snprintf(fault_env, sizeof(fault_env), "PBOX_FAULT=%s", d->o.fault);
		env[2] = fault_env;
	}
	for (uint32_t r = 0; r < d->o.workers; r++) {
		struct worker *w = &d->w[r];
		char rank[16], workers[16], epochs[16], batch[16], seed[32], job[16], steps[32];
		char slow[32];
		const char *argv[40];
		int n = 0, pipefd[2];

		snprintf(rank, sizeof(rank), "%u", r);
		snprintf(workers, sizeof(workers), "%u", d->o.workers);
		snprintf(epochs, sizeof(epochs), "%u", d->o.epochs);
		snprintf(batch, sizeof(batch), "%u", d->o.batch);
		snprintf(seed, sizeof(seed), "%llu", (unsigned long long)d->o.seed);
		snprintf(job, sizeof(job), "%u", DEMO_JOB_ID);
		snprintf(steps, sizeof(steps), "%llu", (unsigned long long)d->o.max_steps);
		argv[n++] = d->self_path;
		argv[n++] = "train";
		argv[n++] = "--json";
		argv[n++] = "--server";
		argv[n++] = d->control;
		argv[n++] = "--job";
		argv[n++] = job;
		argv[n++] = "--rank";
		argv[n++] = rank;
		argv[n++] = "--workers";
		argv[n++] = workers;
		argv[n++] = "--epochs";
		argv[n++] = epochs;
		argv[n++] = "--batch";
		argv[n++] = batch;
		argv[n++] = "--seed";
		argv[n++] = seed;
		if (d->o.max_steps != 0) {
			argv[n++] = "--max-steps";
			argv[n++] = steps;
		}
		if (d->o.data_dir != NULL) {
			argv[n++] = "--data";
			argv[n++] = d->o.data_dir;
		}
		if (r == 0 && d->o.save_model != NULL) {
			argv[n++] = "--save-model";
			argv[n++] = d->o.save_model;
		}
		if (r == d->o.slow_rank) {
			snprintf(slow, sizeof(slow), "%g", d->o.slow_factor);
			argv[n++] = "--slow-factor";
			argv[n++] = slow;
		}
		if (d->o.exact_lag) {
			argv[n++] = "--exact-lag";
		}
		argv[n] = NULL;
		if (pipe2(pipefd, O_CLOEXEC) != 0) {
			fprintf(stderr, "pbox demo: pipe: %s\n", strerror(errno));
			return -EIO;
		}
		w->pid = spawn(d, argv, pipefd[1], w->log, env, SIGKILL);
		close(pipefd[1]);
		if (w->pid < 0) {
			w->pid = 0;
			close(pipefd[0]);
			return -EIO;
		}
		w->out_fd = pipefd[0];
		fcntl(w->out_fd, F_SETFL, O_NONBLOCK);
	}
	return 0;
}

/* ---- progress and results ------------------------------------------------------------ */

static double ratio(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : 0.0;
}

static double pct(uint64_t num, uint64_t den)
{
	return 100.0 * ratio(num, den);
}

static uint64_t min_steps(const struct demo *d)
{
	uint64_t m = UINT64_MAX;

	for (uint32_t r = 0; r < d->o.workers; r++) {
		m = PBOX_MIN(m, d->w[r].total_steps);
	}
	return m;
}

static uint64_t wire_bytes(const struct demo *d, uint64_t *tx, uint64_t *rx)
{
	uint64_t t = 0, x = 0;

	for (uint32_t r = 0; r < d->o.workers; r++) {
		t += d->w[r].net.tx_bytes;
		x += d->w[r].net.rx_bytes;
	}
	if (tx != NULL) {
		*tx = t;
		*rx = x;
	}
	return t + x;
}

static uint64_t planned_steps(const struct demo *d)
{
	uint64_t all = (uint64_t)d->steps_per_epoch * d->o.epochs;

	return d->o.max_steps != 0 ? PBOX_MIN(all, d->o.max_steps) : all;
}

static void clear_bar(struct demo *d)
{
	if (d->tty) {
		fprintf(d->out, "\r\033[K");
	}
}

static void show_progress(struct demo *d, bool force)
{
	uint64_t done = min_steps(d), spe = d->steps_per_epoch;
	double now = pbox_mono_s(), rate;
	uint32_t epoch, step;
	bool testing;
	char wire[32];

	if (d->nready < d->o.workers || spe == 0 || done >= planned_steps(d) ||
	    (!force && now - d->last_plain < (d->tty ? DEMO_BAR_EVERY_S : DEMO_PLAIN_EVERY_S))) {
		return;
	}
	d->last_plain = now;
	epoch = (uint32_t)(done / spe) + 1;
	step = (uint32_t)(done % spe);
	/* All ranks finished an epoch's steps and are testing: show that epoch as full
	 * until its summary arrives. */
	testing = step == 0 && epoch > 1 && d->ep[epoch - 2].reports < d->o.workers;
	if (testing) {
		epoch--;
		step = (uint32_t)spe;
	}
	rate = now > d->t_ready ? (double)done * d->o.batch / (now - d->t_ready) : 0;
	pbox_cli_bytes((double)wire_bytes(d, NULL, NULL), wire, sizeof(wire));
	if (d->tty) {
		int fill = (int)((double)step * DEMO_BAR_WIDTH / (double)spe);

		fprintf(d->out,
			"\r\033[Kepoch %u/%u [%.*s%*s] %3.0f%% %u/%u steps, %.0f samples/s, %s on "
			"the wire%s",
			epoch, d->o.epochs, fill, "##############################################",
			DEMO_BAR_WIDTH - fill, "", pct(step, spe), step, d->steps_per_epoch, rate,
			wire, testing ? ", testing" : "");
	} else {
		fprintf(d->out,
			"epoch %u/%u: %u/%u steps (%.0f%%), %.0f samples/s, %s on the wire%s\n",
			epoch, d->o.epochs, step, d->steps_per_epoch, pct(step, spe), rate, wire,
			testing ? ", testing" : "");
	}
	fflush(d->out);
}

static void show_epoch(struct demo *d, uint32_t e)
{
	const struct epoch_sum *s = &d->ep[e];
	char wire[32];

	clear_bar(d);
	fprintf(d->out,
		"epoch %u/%u: train loss %.4f acc %.2f%% | test acc %.2f%% | %s on the wire | "
		"%.1f s, %.0f samples/s\n",
		e + 1, d->o.epochs, s->train.samples ? s->train.loss / (double)s->train.samples : 0,
		pct(s->train.correct, s->train.samples), pct(s->test.correct, s->test.samples),
		pbox_cli_bytes((double)s->wire_bytes, wire, sizeof(wire)), s->train_s,
		s->train_s > 0 ? (double)s->train.samples / s->train_s : 0.0);
	fflush(d->out);
}

static double jreal(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);

	return json_is_number(v) ? json_number_value(v) : 0.0;
}

static void read_net(const json_t *o, struct pbox_client_stats *n)
{
	const json_t *net = json_object_get(o, "net");

	n->tx_bytes = pbox_cli_json_u64(net, "tx_bytes");
	n->rx_bytes = pbox_cli_json_u64(net, "rx_bytes");
	n->tx_pkts = pbox_cli_json_u64(net, "tx_pkts");
	n->rx_pkts = pbox_cli_json_u64(net, "rx_pkts");
	n->retransmits = pbox_cli_json_u64(net, "retransmits");
	n->probes = pbox_cli_json_u64(net, "probes");
	n->dropped = pbox_cli_json_u64(net, "dropped");
}

static void read_stats(const json_t *o, const char *k, struct pbox_mlp_stats *acc)
{
	const json_t *s = json_object_get(o, k);

	acc->loss += jreal(s, "loss");
	acc->correct += pbox_cli_json_u64(s, "correct");
	acc->samples += pbox_cli_json_u64(s, "samples");
}

static void show_ready(struct demo *d)
{
	uint32_t start, most, least;
	char per[32];

	/* Rank 0 gets the largest shard of the batch, the last rank the smallest. */
	pbox_sched_split(d->o.batch, d->o.workers, 0, &start, &most);
	pbox_sched_split(d->o.batch, d->o.workers, d->o.workers - 1, &start, &least);
	if (least != most) {
		snprintf(per, sizeof(per), "%u-%u", least, most);
	} else {
		snprintf(per, sizeof(per), "%u", most);
	}
	fprintf(d->out,
		"all %u workers ready after %.1f s: %u steps per epoch of %u samples (%s per "
		"worker)\n",
		d->o.workers, d->t_ready - d->t_start, d->steps_per_epoch, d->o.batch, per);
	if (d->transport[0] != '\0') {
		fprintf(d->out, "transport: %s\n", d->transport);
	}
	if (strstr(d->transport, "shm") != NULL) {
		fprintf(d->out,
			"gradients pushed from registered memory (not copied): %u of %u "
			"workers\n",
			d->nregistered, d->o.workers);
	}
	if (d->killed) {
		fprintf(d->out,
			"resuming at step %llu: the version pboxd restored from its checkpoint "
			"(%llu steps redone)\n",
			(unsigned long long)d->resumed_at,
			(unsigned long long)(d->killed_at - PBOX_MIN(d->killed_at, d->resumed_at)));
	}
	fflush(d->out);
}

/* A worker's data path (its ready event): the run's, or "shm+udp" once they differ. */
static void note_transport(struct demo *d, const char *t)
{
	if (t == NULL || strlen(t) > 3) {
		return;
	}
	if (d->transport[0] == '\0') {
		snprintf(d->transport, sizeof(d->transport), "%s", t);
	} else if (strcmp(d->transport, t) != 0) {
		snprintf(d->transport, sizeof(d->transport), "shm+udp");
	}
}

/* One event line from worker w. */
static void on_line(struct demo *d, struct worker *w, const char *line)
{
	json_t *o = json_loads(line, 0, NULL);
	const char *ev;

	if (o == NULL) {
		return; /* not an event; the workers print only events on stdout */
	}
	ev = json_string_value(json_object_get(o, "ev"));
	if (ev == NULL) {
		json_decref(o);
		return;
	}
	if (strcmp(ev, "ready") == 0) {
		if (!w->ready) {
			w->ready = true;
			d->steps_per_epoch = (uint32_t)pbox_cli_json_u64(o, "steps");
			/* The step a restarted rank resumes at (0 on a fresh start). */
			d->resumed_at = pbox_cli_json_u64(o, "total_steps");
			note_transport(d, json_string_value(json_object_get(o, "transport")));
			if (json_is_true(json_object_get(o, "registered"))) {
				d->nregistered++;
			}
			if (++d->nready == d->o.workers) {
				d->t_ready = pbox_mono_s();
				d->last_plain = d->t_ready;
				show_ready(d);
			}
		}
	} else if (strcmp(ev, "step") == 0) {
		w->total_steps = pbox_cli_json_u64(o, "total_steps");
		read_net(o, &w->net);
	} else if (strcmp(ev, "epoch") == 0) {
		uint32_t e = (uint32_t)pbox_cli_json_u64(o, "epoch");

		w->total_steps = pbox_cli_json_u64(o, "total_steps");
		read_net(o, &w->net);
		/* After a restart, an epoch already reported by every rank may end again. */
		if (e >= 1 && e <= d->o.epochs && d->ep[e - 1].reports < d->o.workers) {
			struct epoch_sum *s = &d->ep[e - 1];

			read_stats(o, "train", &s->train);
			read_stats(o, "test", &s->test);
			s->train_s = PBOX_MAX(s->train_s, jreal(o, "train_s"));
			s->eval_s = PBOX_MAX(s->eval_s, jreal(o, "eval_s"));
			s->steps = PBOX_MAX(s->steps, (uint32_t)pbox_cli_json_u64(o, "step"));
			if (++s->reports == d->o.workers) {
				s->wire_bytes = wire_bytes(d, NULL, NULL);
				show_epoch(d, e - 1);
			}
		}
	} else if (strcmp(ev, "done") == 0) {
		read_net(o, &w->net);
		w->train_s = jreal(o, "train_s");
		w->model_crc = (uint32_t)pbox_cli_json_u64(o, "model_crc");
		if (!w->done) {
			w->done = true;
			if (++d->ndone == d->o.workers) {
				d->t_done = pbox_mono_s();
			}
		}
	} else if (strcmp(ev, "error") == 0) {
		const char *msg = json_string_value(json_object_get(o, "error"));

		snprintf(w->error, sizeof(w->error), "%s", msg ? msg : "unknown error");
	}
	json_decref(o);
}

/* Read what worker w wrote; returns false once its stream has ended. */
static bool drain(struct demo *d, struct worker *w)
{
	long n;
	char *line;

	if (w->out_fd < 0) {
		return false;
	}
	do {
		n = pbox_linebuf_fill(&w->lb, w->out_fd);
		while ((line = pbox_linebuf_next(&w->lb)) != NULL) {
			on_line(d, w, line);
		}
	} while (n > 0);
	if (n == -EAGAIN) {
		return true;
	}
	close(w->out_fd);
	w->out_fd = -1;
	return false;
}

static void report_worker_failure(struct demo *d, struct worker *w)
{
	char how[128];

	if (w->reaped) {
		describe_status(w->status, how, sizeof(how));
	} else {
		snprintf(how, sizeof(how), "closed its output without finishing");
	}
	clear_bar(d);
	fflush(d->out);
	fprintf(stderr, "pbox demo: rank %u failed: %s%s%s\n", w->rank, how,
		w->error[0] ? ": " : "", w->error);
	if (w->error[0] == '\0') {
		char what[32];

		snprintf(what, sizeof(what), "rank %u's log", w->rank);
		show_tail(what, w->log);
	}
}

static int start_pboxd(struct demo *d);
static int start_workers(struct demo *d);

/*
 * --kill-appliance-at: kill -9 pboxd (its state survives only in the checkpoint file), stop
 * the workers (their operations would only time out), then start pboxd again with the same
 * configuration and the workers again: they register, get the restored version in the
 * reply and resume from it (see the README's resume contract).
 */
static int kill_and_restart(struct demo *d)
{
	double deadline = pbox_mono_s() + DEMO_STOP_TIMEOUT_S;
	bool any = true;

	d->killed = true;
	d->killed_at = min_steps(d);
	kill(d->pboxd, SIGKILL);
	for (uint32_t r = 0; r < d->o.workers; r++) {
		if (d->w[r].pid > 0) {
			kill(d->w[r].pid, SIGKILL);
		}
	}
	while (any && pbox_mono_s() < deadline) {
		usleep(10000);
		reap(d);
		any = d->pboxd > 0;
		for (uint32_t r = 0; r < d->o.workers; r++) {
			any |= d->w[r].pid > 0;
		}
	}
	if (any) {
		fprintf(stderr, "pbox demo: killed processes did not exit\n");
		return -EIO;
	}
	rename(d->pboxd_log, d->killed_log);
	for (uint32_t r = 0; r < d->o.workers; r++) {
		struct worker *w = &d->w[r];

		if (w->out_fd >= 0) {
			close(w->out_fd);
			w->out_fd = -1;
		}
		pbox_linebuf_free(&w->lb);
		pbox_linebuf_init(&w->lb);
		w->reaped = w->ready = w->done = false;
		w->status = 0;
		w->error[0] = '\0';
	}
	d->nready = d->ndone = 0;
	clear_bar(d);
	fprintf(d->out,
		"pbox demo: killed pboxd (SIGKILL) at step %llu; restarting it and the workers, "
		"which resume from its last checkpoint\n",
		(unsigned long long)d->killed_at);
	fflush(d->out);
	return start_pboxd(d) == 0 && start_workers(d) == 0 ? 0 : -EIO;
}

/*
 * Follow the run until every worker is done (0), one fails or pboxd dies (-EIO,
 * reported), or a signal asks to stop (-EINTR).
 */
static int follow(struct demo *d)
{
	struct pollfd *p = calloc(d->o.workers + 1, sizeof(*p));
	int rc = 0;

	if (p == NULL) {
		return -ENOMEM;
	}
	for (;;) {
		nfds_t np = 0;
		bool all_ok = true;

		p[np++] = (struct pollfd){ .fd = d->sigfd, .events = POLLIN };
		for (uint32_t r = 0; r < d->o.workers; r++) {
			if (d->w[r].out_fd >= 0) {
				p[np++] = (struct pollfd){ .fd = d->w[r].out_fd, .events = POLLIN };
			}
		}
		if (poll(p, np, d->tty ? 200 : 500) < 0 && errno != EINTR) {
			rc = -errno;
			break;
		}
		if (wait_signal(d, 0)) {
			rc = -EINTR;
			break;
		}
		for (uint32_t r = 0; r < d->o.workers; r++) {
			drain(d, &d->w[r]);
		}
		if (d->o.kill_at != 0 && !d->killed && d->nready == d->o.workers &&
		    min_steps(d) >= d->o.kill_at && access(d->ckpt_file, F_OK) == 0) {
			rc = kill_and_restart(d);
			if (rc != 0) {
				break;
			}
			continue;
		}
		reap(d);
		for (uint32_t r = 0; r < d->o.workers && rc == 0; r++) {
			struct worker *w = &d->w[r];

			if (w->reaped) {
				drain(d, w); /* its last events */
			}
			if ((w->reaped &&
			     (!WIFEXITED(w->status) || WEXITSTATUS(w->status) != 0 || !w->done)) ||
			    (w->out_fd < 0 && !w->done)) {
				if (w->out_fd >= 0 || !w->reaped) {
					/* wait briefly for the exit status to name the cause */
					for (int i = 0; i < 50 && !w->reaped; i++) {
						usleep(10000);
						reap(d);
					}
					drain(d, w);
				}
				report_worker_failure(d, w);
				rc = -EIO;
			}
			all_ok &= w->reaped && w->done;
		}
		if (rc != 0) {
			break;
		}
		if (d->pboxd_reaped) {
			char how[128];

			describe_status(d->pboxd_status, how, sizeof(how));
			clear_bar(d);
			fprintf(stderr, "pbox demo: pboxd %s while the workers were training\n",
				how);
			show_tail("the pboxd log", d->pboxd_log);
			rc = -EIO;
			break;
		}
		if (all_ok) {
			break;
		}
		show_progress(d, false);
	}
	free(p);
	return rc;
}

static void fetch_appliance_stats(struct demo *d)
{
	/* The demo's pboxd takes the job token as its admin token too (both are this user's). */
	json_t *req = json_pack("{s:s, s:s}", "op", "stats", "admin_token", d->token),
	       *reply = NULL;
	char err[256];

	if (pbox_cli_ctl_request(d->control, req, &reply, 5000, err, sizeof(err)) == 0) {
		const json_t *jobs = json_object_get(reply, "jobs"), *job;
		size_t i;

		d->appliance = json_incref(json_object_get(reply, "totals"));
		/* The synchronisation model pboxd ran the job under, as it reports it: shows
		 * that --sync reached the appliance. */
		json_array_foreach(jobs, i, job)
		{
			if (d->appliance != NULL && pbox_cli_json_u64(job, "id") == DEMO_JOB_ID) {
				json_object_set(d->appliance, "sync", json_object_get(job, "sync"));
			}
		}
		json_decref(reply);
	} else {
		fprintf(stderr, "pbox demo: could not read pboxd's counters: %s\n", err);
	}
	json_decref(req);
}

/* Stop pboxd after a good run; it must exit cleanly. */
static int stop_pboxd(struct demo *d)
{
	double deadline = pbox_mono_s() + DEMO_STOP_TIMEOUT_S;
	char how[128];

	if (d->pboxd > 0) {
		kill(d->pboxd, SIGTERM);
	}
	while (d->pboxd > 0 && pbox_mono_s() < deadline) {
		usleep(10000);
		reap(d);
	}
	if (d->pboxd > 0) {
		return -ETIMEDOUT; /* demo_stop() kills it and says so */
	}
	if (WIFEXITED(d->pboxd_status) && WEXITSTATUS(d->pboxd_status) == 0) {
		return 0;
	}
	describe_status(d->pboxd_status, how, sizeof(how));
	fprintf(stderr, "pbox demo: pboxd %s when stopped\n", how);
	show_tail("the pboxd log", d->pboxd_log);
	return -EIO;
}

struct totals {
	uint64_t steps, samples, tx, rx, retransmits, probes;
	double train_s;
	struct pbox_mlp_stats test;
	uint32_t last_epoch;
};

static void summarize(const struct demo *d, struct totals *t)
{
	memset(t, 0, sizeof(*t));
	t->steps = min_steps(d);
	t->samples = t->steps * d->o.batch;
	for (uint32_t e = 0; e < d->o.epochs; e++) {
		if (d->ep[e].reports == d->o.workers) {
			t->train_s += d->ep[e].train_s;
			t->test = d->ep[e].test;
			t->last_epoch = e + 1;
		}
	}
	wire_bytes(d, &t->tx, &t->rx);
	for (uint32_t r = 0; r < d->o.workers; r++) {
		t->retransmits += d->w[r].net.retransmits;
		t->probes += d->w[r].net.probes;
	}
}

static bool broadcast(const struct demo *d)
{
	return strcmp(d->o.mode, "broadcast") == 0;
}

/* Whether every rank finished with the same model (its done event's CRC32C). */
static bool replicas_identical(const struct demo *d)
{
	for (uint32_t r = 1; r < d->o.workers; r++) {
		if (d->w[r].model_crc != d->w[0].model_crc) {
			return false;
		}
	}
	return true;
}

/* What DVF did, from pboxd's counters: push payloads received (blocks and dense
 * fragments) and results sent, against the dense bytes they stand for. */
static void print_dvf(struct demo *d)
{
	const json_t *v = json_object_get(d->appliance, "dvf");
	uint64_t ib = pbox_cli_json_u64(v, "in_bytes"), id = pbox_cli_json_u64(v, "in_dense");
	uint64_t iv = pbox_cli_json_u64(v, "in_vals");
	uint64_t ob = pbox_cli_json_u64(v, "out_bytes"), od = pbox_cli_json_u64(v, "out_dense");
	uint64_t ov = pbox_cli_json_u64(v, "out_vals");
	char a[32], b[32], c[32], e[32];

	if (id == 0) {
		return;
	}
	fprintf(d->out, "dvf: pushes %s for %s dense (%.2fx smaller, %.1f%% of the values sent)",
		pbox_cli_bytes((double)ib, a, sizeof(a)), pbox_cli_bytes((double)id, b, sizeof(b)),
		ib ? (double)id / (double)ib : 0.0, 400.0 * (double)iv / (double)id);
	if (od != 0) {
		fprintf(d->out, "; broadcasts %s for %s (%.2fx, %.1f%%)",
			pbox_cli_bytes((double)ob, c, sizeof(c)),
			pbox_cli_bytes((double)od, e, sizeof(e)),
			ob ? (double)od / (double)ob : 0.0, 400.0 * (double)ov / (double)od);
	}
	fprintf(d->out, "\n");
}

static void print_summary(struct demo *d)
{
	struct totals t;
	char tx[32], rx[32];

	summarize(d, &t);
	clear_bar(d);
	fprintf(d->out, "final test accuracy: %.2f%% (%llu of %llu test images)\n",
		pct(t.test.correct, t.test.samples), (unsigned long long)t.test.correct,
		(unsigned long long)t.test.samples);
	fprintf(d->out,
		"throughput: %.0f samples/s (%llu samples in %llu steps, %.1f s of training; %.1f "
		"s "
		"in all)\n",
		t.train_s > 0 ? (double)t.samples / t.train_s : 0.0, (unsigned long long)t.samples,
		(unsigned long long)t.steps, t.train_s, d->t_done - d->t_start);
	fprintf(d->out, "on the wire: %s sent and %s received by %u worker%s, %llu retransmits\n",
		pbox_cli_bytes((double)t.tx, tx, sizeof(tx)),
		pbox_cli_bytes((double)t.rx, rx, sizeof(rx)), d->o.workers,
		d->o.workers == 1 ? "" : "s", (unsigned long long)t.retransmits);
	if (d->appliance != NULL) {
		fprintf(d->out,
			"pboxd: %llu chunk iterations on %u core%s, %llu duplicates and %llu "
			"retransmissions received, %llu replies re-sent, %llu dropped\n",
			(unsigned long long)pbox_cli_json_u64(d->appliance, "iterations"),
			d->o.cores, d->o.cores == 1 ? "" : "s",
			(unsigned long long)pbox_cli_json_u64(d->appliance, "dups"),
			(unsigned long long)pbox_cli_json_u64(d->appliance, "rx_retransmits"),
			(unsigned long long)pbox_cli_json_u64(d->appliance, "replies_resent"),
			(unsigned long long)pbox_cli_json_u64(d->appliance, "dropped"));
	}
	if (d->o.dvf && d->appliance != NULL) {
		print_dvf(d);
	}
	if (broadcast(d)) {
		fprintf(d->out, "broadcast: all %u ranks hold the same model (crc32c %08x)\n",
			d->o.workers, d->w[0].model_crc);
	}
	if (d->o.save_model != NULL) {
		fprintf(d->out, "model saved to %s\n", d->o.save_model);
	}
	fflush(d->out);
}

static void print_json(struct demo *d, int rc, const char *error)
{
	json_t *o = json_object(), *eps = json_array();
	struct totals t;

	json_object_set_new(o, "ok", json_boolean(rc == 0));
	if (d->killed) {
		json_object_set_new(o, "appliance_killed_at",
				    json_integer((json_int_t)d->killed_at));
		json_object_set_new(o, "resumed_at", json_integer((json_int_t)d->resumed_at));
	}
	if (rc != 0) {
		json_object_set_new(o, "error", json_string(error));
	}
	if (d->w != NULL && d->ep != NULL) {
		summarize(d, &t);
		for (uint32_t e = 0; e < d->o.epochs; e++) {
			const struct epoch_sum *s = &d->ep[e];

			if (s->reports != d->o.workers) {
				continue;
			}
			json_array_append_new(
				eps,
				json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:I}",
					  "epoch", (json_int_t)e + 1, "steps", (json_int_t)s->steps,
					  "train_loss",
					  s->train.samples
						  ? s->train.loss / (double)s->train.samples
						  : 0.0,
					  "train_acc", ratio(s->train.correct, s->train.samples),
					  "test_loss",
					  s->test.samples ? s->test.loss / (double)s->test.samples
							  : 0.0,
					  "test_acc", ratio(s->test.correct, s->test.samples),
					  "test_correct", (json_int_t)s->test.correct,
					  "test_samples", (json_int_t)s->test.samples, "train_s",
					  s->train_s, "eval_s", s->eval_s, "wire_bytes",
					  (json_int_t)s->wire_bytes));
		}
		json_object_set_new(o, "epochs", eps);
		eps = NULL;
		json_object_set_new(o, "final_test_acc",
				    json_real(ratio(t.test.correct, t.test.samples)));
		json_object_set_new(o, "test_correct", json_integer((json_int_t)t.test.correct));
		json_object_set_new(o, "test_samples", json_integer((json_int_t)t.test.samples));
		json_object_set_new(o, "steps", json_integer((json_int_t)t.steps));
		json_object_set_new(o, "samples", json_integer((json_int_t)t.samples));
		json_object_set_new(o, "train_s", json_real(t.train_s));
		json_object_set_new(o, "samples_per_s",
				    json_real(t.train_s > 0 ? (double)t.samples / t.train_s : 0));
		json_object_set_new(o, "elapsed_s", json_real(pbox_mono_s() - d->t_start));
		json_object_set_new(o, "tx_bytes", json_integer((json_int_t)t.tx));
		json_object_set_new(o, "rx_bytes", json_integer((json_int_t)t.rx));
		json_object_set_new(o, "wire_bytes", json_integer((json_int_t)(t.tx + t.rx)));
		json_object_set_new(o, "retransmits", json_integer((json_int_t)t.retransmits));
		json_object_set_new(o, "probes", json_integer((json_int_t)t.probes));
	}
	json_decref(eps);
	json_object_set_new(o, "workers", json_integer(d->o.workers));
	json_object_set_new(o, "batch", json_integer(d->o.batch));
	json_object_set_new(o, "optimizer", json_string(d->o.optimizer));
	json_object_set_new(o, "mode", json_string(d->o.mode));
	json_object_set_new(o, "dvf",
			    d->o.dvf ? json_pack("{s:f, s:f, s:s}", "low", d->o.dvf_low, "up",
						 d->o.dvf_up, "codec", d->o.dvf_codec)
				     : json_null());
	{
		json_t *crcs = json_array();

		for (uint32_t r = 0; r < d->o.workers; r++) {
			json_array_append_new(crcs, json_integer(d->w[r].model_crc));
		}
		json_object_set_new(o, "model_crcs", crcs);
		json_object_set_new(o, "replicas_identical", json_boolean(replicas_identical(d)));
	}
	json_object_set_new(o, "lr", json_real(d->o.lr));
	json_object_set_new(o, "deterministic", json_boolean(d->o.deterministic));
	json_object_set_new(o, "sync", json_string(d->o.sync));
	json_object_set_new(o, "release", json_string(d->o.release));
	json_object_set_new(o, "staleness", json_integer(d->o.staleness));
	json_object_set_new(o, "exact_lag", json_boolean(d->o.exact_lag));
	json_object_set_new(o, "slow_rank",
			    d->o.slow_rank == UINT32_MAX ? json_null()
							 : json_integer(d->o.slow_rank));
	json_object_set_new(o, "slow_factor", json_real(d->o.slow_factor));
	json_object_set_new(o, "cores", json_integer(d->o.cores));
	json_object_set_new(o, "fault", d->o.fault ? json_string(d->o.fault) : json_null());
	json_object_set_new(o, "model",
			    d->o.save_model ? json_string(d->o.save_model) : json_null());
	if (d->appliance != NULL) {
		json_object_set(o, "appliance", d->appliance);
	}
	json_dumpf(o, stdout, JSON_INDENT(2));
	printf("\n");
	fflush(stdout);
	json_decref(o);
}

/* ---- the command --------------------------------------------------------------------- */

static int setup(struct demo *d)
{
	const char *tmpdir;
	uint8_t rnd[16];
	ssize_t n;

	n = readlink("/proc/self/exe", d->self_path, sizeof(d->self_path) - 1);
	if (n <= 0) {
		fprintf(stderr, "pbox demo: cannot find this program's path: %s\n",
			strerror(errno));
		return -EIO;
	}
	d->self_path[n] = '\0';
	if (find_pboxd(d) != 0) {
		return -ENOENT;
	}
	/* A fresh secret per run, so nobody else on the machine can join the job: pboxd reads
	 * it from a 0600 file in a 0700 directory, the workers from their environment. */
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		fprintf(stderr, "pbox demo: getrandom: %s\n", strerror(errno));
		return -EIO;
	}
	for (size_t i = 0; i < sizeof(rnd); i++) {
		snprintf(d->token + 2 * i, 3, "%02x", rnd[i]);
	}
	tmpdir = getenv("TMPDIR");
	/* mkdtemp(3) replaces the six X of the template with a unique name. */
	snprintf(d->dir, sizeof(d->dir), "%s/pbox-demo-XXXXXX",
		 tmpdir != NULL && *tmpdir != '\0' ? tmpdir : "/tmp");
	if (mkdtemp(d->dir) == NULL) {
		fprintf(stderr, "pbox demo: cannot create a temporary directory %s: %s\n", d->dir,
			strerror(errno));
		d->dir[0] = '\0';
		return -EIO;
	}
	snprintf(d->conf, sizeof(d->conf), "%s/pboxd.conf", d->dir);
	snprintf(d->pboxd_log, sizeof(d->pboxd_log), "%s/pboxd.log", d->dir);
	snprintf(d->ckpt_dir, sizeof(d->ckpt_dir), "%s/checkpoints", d->dir);
	snprintf(d->ckpt_file, sizeof(d->ckpt_file), "%s/job-%u.ckpt", d->ckpt_dir, DEMO_JOB_ID);
	snprintf(d->killed_log, sizeof(d->killed_log), "%s/pboxd-killed.log", d->dir);
	d->w = calloc(d->o.workers, sizeof(*d->w));
	d->ep = calloc(d->o.epochs, sizeof(*d->ep));
	if (d->w == NULL || d->ep == NULL) {
		fprintf(stderr, "pbox demo: no memory\n");
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < d->o.workers; r++) {
		d->w[r].rank = r;
		d->w[r].out_fd = -1;
		pbox_linebuf_init(&d->w[r].lb);
		snprintf(d->w[r].log, sizeof(d->w[r].log), "%s/worker-%u.log", d->dir, r);
	}
	return 0;
}

int pbox_cmd_demo(int argc, char **argv)
{
	struct demo d;
	sigset_t mask;
	int rc;

	memset(&d, 0, sizeof(d));
	d.sigfd = -1;
	d.t_start = pbox_mono_s();
	rc = parse(argc, argv, &d.o);
	if (rc != 0) {
		return rc > 0 ? 0 : 64;
	}
	d.out = d.o.json ? stderr : stdout;
	/* A closed output (pbox demo | head) must not kill the demo before it has stopped
	 * its children; writes just fail. */
	signal(SIGPIPE, SIG_IGN);
	d.tty = isatty(fileno(d.out));
	d.self = getpid();
	/* Signals become events on a descriptor, so the loop can stop the children in order
	 * whatever it is doing; children get the original mask back. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGQUIT);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, &d.oldmask);
	d.sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d.sigfd < 0) {
		fprintf(stderr, "pbox demo: signalfd: %s\n", strerror(errno));
		return 1;
	}
	rc = setup(&d);
	if (rc == 0) {
		char mom[48] = "";

		if (strcmp(d.o.optimizer, "momentum") == 0 || strcmp(d.o.optimizer, "nag") == 0) {
			snprintf(mom, sizeof(mom), " momentum %g", d.o.momentum);
		}
		fprintf(d.out,
			"pbox demo: %s%u worker%s, %u epoch%s, global batch %u, %s lr %g%s, "
			"%sdeterministic, pboxd on %u core%s%s%s\n",
			broadcast(&d) ? "broadcast job, " : "", d.o.workers,
			d.o.workers == 1 ? "" : "s", d.o.epochs, d.o.epochs == 1 ? "" : "s",
			d.o.batch, d.o.optimizer, d.o.lr, mom, d.o.deterministic ? "" : "not ",
			d.o.cores, d.o.cores == 1 ? "" : "s", d.o.fault ? ", faults " : "",
			d.o.fault ? d.o.fault : "");
		fflush(d.out);
		rc = start_pboxd(&d);
	}
	if (rc == 0) {
		rc = start_workers(&d);
	}
	if (rc == 0) {
		rc = follow(&d);
	}
	if (rc == 0 && broadcast(&d) && !replicas_identical(&d)) {
		/* Every rank applies the same aggregates in the same order: a difference is a
		 * defect, not noise. */
		fprintf(stderr, "pbox demo: broadcast job: the ranks' final models differ:");
		for (uint32_t r = 0; r < d.o.workers; r++) {
			fprintf(stderr, " rank %u crc32c %08x", r, d.w[r].model_crc);
		}
		fprintf(stderr, "\n");
		rc = -EPROTO;
	}
	if (rc == 0 && d.o.kill_at != 0 && !d.killed) {
		fprintf(stderr,
			"pbox demo: --kill-appliance-at %llu: the training ended before the "
			"workers "
			"were past that step with a checkpoint written; pboxd was not killed\n",
			(unsigned long long)d.o.kill_at);
	}
	if (rc == 0) {
		fetch_appliance_stats(&d);
		rc = stop_pboxd(&d);
	}
	if (rc == -EINTR || d.interrupted) {
		clear_bar(&d);
		fprintf(stderr, "pbox demo: interrupted; stopping pboxd and the workers\n");
		rc = -EINTR;
	}
	demo_stop(&d);
	if (rc == 0) {
		print_summary(&d);
	}
	if (d.o.json) {
		print_json(&d, rc, rc == -EINTR ? "interrupted" : "failed; see the messages above");
	}
	json_decref(d.appliance);
	free(d.w);
	free(d.ep);
	close(d.sigfd);
	return rc == 0 ? 0 : (rc == -EINTR ? 130 : 1);
}
