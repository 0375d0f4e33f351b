/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox demo`'s options: the usage text, and the command line parsed and checked into a
 * struct demo_opts (defaults, ranges, combinations the demo refuses).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/args.h"
#include "demo.h"
#include "dvf/dvf_job.h"
#include "engine/sync.h"
#include "kernels/kernels.h"
#include "train/fmnist.h"
#include "train/trainer.h"
#include "transport/fault.h"

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
int demo_parse(int argc, char **argv, struct demo_opts *o)
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
