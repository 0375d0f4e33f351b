/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox train`: the Fashion-MNIST trainer from the command line, one rank of a pbox job
 * or the single-process reference (--local). With --json every event is one JSON object
 * per line on stdout (the protocol `pbox demo` reads); otherwise people get a line per
 * epoch.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/args.h"
#include "train/fmnist.h"
#include "train/trainer.h"

struct train_args {
	struct pbox_train_cfg cfg;
	bool local, json;
	const char *optimizer;
	double lr, momentum, wd;
	bool opt_given; /* an optimizer option was given (only --local takes them) */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox train [options]\n"
		"\n"
		"Train a 784-256-128-10 MLP (ReLU, softmax cross-entropy) on Fashion-MNIST with\n"
		"synchronous data-parallel steps. By default this process is one rank of a pbox\n"
		"server-optimizer job: the appliance sums the ranks' gradients and runs the\n"
		"optimizer; or of a broadcast job: every rank keeps the model and runs the\n"
		"job's optimizer on the sums the appliance sends back. With --local one process "
		"computes the gradients of all N ranks and\n"
		"applies the optimizer exactly as pboxd does in deterministic mode, so its final\n"
		"model is bit-identical to a distributed run with deterministic = true.\n"
		"\n"
		"Common options:\n"
		"      --epochs N         epochs (default %u)\n"
		"      --batch B          global batch, split over the ranks (default %u)\n"
		"      --max-steps K      stop after K steps in all (default: all epochs)\n"
		"      --seed S           initial weights and shuffles (default %u)\n"
		"      --data DIR         Fashion-MNIST IDX files (default %s)\n"
		"      --save-model FILE  write the final model (the same on every rank)\n"
		"      --json             JSON events on stdout, one per line\n"
		"  -h, --help             this text\n"
		"\n"
		"One rank of a job:\n"
		"      --server HOST:PORT pboxd control address (default 127.0.0.1:7000)\n"
		"      --job ID           job id (default 1)\n"
		"      --token SECRET     the job's secret (default: environment PBOX_TOKEN)\n"
		"      --rank R           this worker's rank (default 0)\n"
		"      --workers N        check that the job has N workers\n"
		"      --timeout-ms MS    deadline of each pbox operation (default 30000)\n"
		"      --slow-factor F    make this rank a straggler: each step's compute takes\n"
		"                         F times as long (default 1)\n"
		"      --exact-lag        broadcast jobs under ssp(s): compute step t on exactly\n"
		"                         W^(t-s), not on the newest model (bit-reproducible)\n"
		"  Environment: PBOX_FAULT injects faults on this worker's sends (tests).\n"
		"\n"
		"Single-process reference:\n"
		"      --local            train alone, simulating the ranks\n"
		"      --workers N        ranks to simulate (default 3)\n"
		"      --optimizer NAME   %s (default %s)\n"
		"      --lr X             learning rate (default %g)\n"
		"      --momentum X       momentum (default %g)\n"
		"      --wd X             weight decay (default 0)\n"
		"  The optimizer's rescale is 1/batch, as `pbox demo` configures the appliance.\n",
		PBOX_TRAIN_DEFAULT_EPOCHS, PBOX_TRAIN_DEFAULT_BATCH, PBOX_TRAIN_DEFAULT_SEED,
		PBOX_FMNIST_DEFAULT_DIR, pbox_optimizer_names(), PBOX_TRAIN_DEFAULT_OPT,
		PBOX_TRAIN_DEFAULT_LR, PBOX_TRAIN_DEFAULT_MOM);
}

enum {
	OPT_EPOCHS = 256,
	OPT_BATCH,
	OPT_MAX_STEPS,
	OPT_SEED,
	OPT_DATA,
	OPT_SAVE,
	OPT_JSON,
	OPT_SERVER,
	OPT_JOB,
	OPT_TOKEN,
	OPT_RANK,
	OPT_WORKERS,
	OPT_TIMEOUT,
	OPT_LOCAL,
	OPT_OPTIMIZER,
	OPT_LR,
	OPT_MOMENTUM,
	OPT_WD,
	OPT_SLOW,
	OPT_EXACT_LAG,
};

static const struct option g_opts[] = {
	{ "epochs", required_argument, NULL, OPT_EPOCHS },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "max-steps", required_argument, NULL, OPT_MAX_STEPS },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "data", required_argument, NULL, OPT_DATA },
	{ "save-model", required_argument, NULL, OPT_SAVE },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "server", required_argument, NULL, OPT_SERVER },
	{ "job", required_argument, NULL, OPT_JOB },
	{ "token", required_argument, NULL, OPT_TOKEN },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "workers", required_argument, NULL, OPT_WORKERS },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
	{ "local", no_argument, NULL, OPT_LOCAL },
	{ "optimizer", required_argument, NULL, OPT_OPTIMIZER },
	{ "lr", required_argument, NULL, OPT_LR },
	{ "momentum", required_argument, NULL, OPT_MOMENTUM },
	{ "wd", required_argument, NULL, OPT_WD },
	{ "slow-factor", required_argument, NULL, OPT_SLOW },
	{ "exact-lag", no_argument, NULL, OPT_EXACT_LAG },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Returns 0, 1 (help printed: exit 0) or -EINVAL (message printed: exit 64). */
static int parse(int argc, char **argv, struct train_args *a)
{
	struct pbox_train_cfg *c = &a->cfg;
	bool workers_given = false;
	int o, rc = 0;

	memset(a, 0, sizeof(*a));
	c->epochs = PBOX_TRAIN_DEFAULT_EPOCHS;
	c->batch = PBOX_TRAIN_DEFAULT_BATCH;
	c->seed = PBOX_TRAIN_DEFAULT_SEED;
	c->client.job = 1;
	c->client.token = getenv("PBOX_TOKEN");
	a->optimizer = PBOX_TRAIN_DEFAULT_OPT;
	a->lr = PBOX_TRAIN_DEFAULT_LR;
	a->momentum = PBOX_TRAIN_DEFAULT_MOM;
	optind = 1;
	while (rc == 0 && (o = getopt_long(argc, argv, "h", g_opts, NULL)) != -1) {
		switch (o) {
		case OPT_EPOCHS:
			rc = pbox_arg_u32("pbox train", "--epochs", optarg, 1, 100000, &c->epochs);
			break;
		case OPT_BATCH:
			rc = pbox_arg_u32("pbox train", "--batch", optarg, 1, 1u << 24, &c->batch);
			break;
		case OPT_MAX_STEPS:
			rc = pbox_arg_u64("pbox train", "--max-steps", optarg, 1, UINT32_MAX,
					  &c->max_steps);
			break;
		case OPT_SEED:
			rc = pbox_arg_u64("pbox train", "--seed", optarg, 0, UINT64_MAX, &c->seed);
			break;
		case OPT_DATA:
			c->data_dir = optarg;
			break;
		case OPT_SAVE:
			c->save_model = optarg;
			break;
		case OPT_JSON:
			a->json = true;
			break;
		case OPT_SERVER:
			c->client.server = optarg;
			break;
		case OPT_JOB:
			rc = pbox_arg_u32("pbox train", "--job", optarg, 0, UINT32_MAX,
					  &c->client.job);
			break;
		case OPT_TOKEN:
			c->client.token = optarg;
			break;
		case OPT_RANK:
			rc = pbox_arg_u32("pbox train", "--rank", optarg, 0, 1023, &c->client.rank);
			break;
		case OPT_WORKERS:
			rc = pbox_arg_u32("pbox train", "--workers", optarg, 1, 1024, &c->workers);
			workers_given = true;
			break;
		case OPT_TIMEOUT:
			rc = pbox_arg_u32("pbox train", "--timeout-ms", optarg, 1, 3600000,
					  &c->client.timeout_ms);
			break;
		case OPT_LOCAL:
			a->local = true;
			break;
		case OPT_OPTIMIZER:
			a->optimizer = optarg;
			a->opt_given = true;
			break;
		case OPT_LR:
			rc = pbox_arg_double("pbox train", "--lr", optarg, 0, 1e6, &a->lr);
			a->opt_given = true;
			break;
		case OPT_MOMENTUM:
			rc = pbox_arg_double("pbox train", "--momentum", optarg, 0, 1,
					     &a->momentum);
			a->opt_given = true;
			break;
		case OPT_WD:
			rc = pbox_arg_double("pbox train", "--wd", optarg, 0, 1e3, &a->wd);
			a->opt_given = true;
			break;
		case OPT_SLOW:
			rc = pbox_arg_double("pbox train", "--slow-factor", optarg, 1, 1000,
					     &c->slow_factor);
			break;
		case OPT_EXACT_LAG:
			c->exact_lag = true;
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			fprintf(stderr, "Try 'pbox train --help'.\n");
			return -EINVAL;
		}
	}
	if (rc != 0) {
		return rc;
	}
	if (optind < argc) {
		fprintf(stderr, "pbox train: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (a->local) {
		c->opt = pbox_optimizer_find(a->optimizer);
		if (c->opt == NULL) {
			fprintf(stderr, "pbox train: --optimizer %s: unknown; choose one of %s\n",
				a->optimizer, pbox_optimizer_names());
			return -EINVAL;
		}
		if (!workers_given) {
			c->workers = 3;
		}
		pbox_train_opt_params(a->lr, a->momentum, a->wd, c->batch, &c->opt_params);
	} else {
		if (a->opt_given) {
			fprintf(stderr,
				"pbox train: --optimizer, --lr, --momentum and --wd are for "
				"--local; a job's optimizer is set in pboxd's job "
				"configuration\n");
			return -EINVAL;
		}
		if (c->client.token == NULL) {
			fprintf(stderr,
				"pbox train: no job token: pass --token or set PBOX_TOKEN\n");
			return -EINVAL;
		}
	}
	return 0;
}

static double pct(uint64_t num, uint64_t den)
{
	return den ? 100.0 * (double)num / (double)den : 0.0;
}

static void emit_json(json_t *o)
{
	char *s = json_dumps(o, JSON_COMPACT);

	if (s != NULL) {
		fputs(s, stdout);
		fputc('\n', stdout);
		fflush(stdout);
		free(s);
	}
	json_decref(o);
}

static json_t *net_json(const struct pbox_client_stats *n)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "tx_bytes", (json_int_t)n->tx_bytes,
			 "rx_bytes", (json_int_t)n->rx_bytes, "tx_pkts", (json_int_t)n->tx_pkts,
			 "rx_pkts", (json_int_t)n->rx_pkts, "retransmits",
			 (json_int_t)n->retransmits, "probes", (json_int_t)n->probes, "dropped",
			 (json_int_t)n->dropped);
}

static json_t *stats_json(const struct pbox_mlp_stats *s)
{
	return json_pack("{s:f, s:I, s:I}", "loss", s->loss, "correct", (json_int_t)s->correct,
			 "samples", (json_int_t)s->samples);
}

static void event_json(const struct pbox_train_event *ev)
{
	static const char *const kinds[] = { "ready", "step", "epoch", "done" };
	json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I}", "ev", kinds[ev->kind],
			      "rank", (json_int_t)ev->rank, "workers", (json_int_t)ev->workers,
			      "epoch", (json_int_t)ev->epoch, "epochs", (json_int_t)ev->epochs,
			      "step", (json_int_t)ev->step, "steps", (json_int_t)ev->steps,
			      "total_steps", (json_int_t)ev->total_steps);

	switch (ev->kind) {
	case PBOX_TRAIN_EV_READY:
		json_object_set_new(o, "batch", json_integer(ev->batch));
		json_object_set_new(o, "shard", json_integer(ev->shard));
		json_object_set_new(o, "params", json_integer((json_int_t)ev->nparams));
		json_object_set_new(o, "keys", json_integer(ev->nkeys));
		json_object_set_new(o, "setup_s", json_real(ev->setup_s));
		if (ev->transport[0] != '\0') {
			json_object_set_new(o, "transport", json_string(ev->transport));
			json_object_set_new(o, "registered", json_boolean(ev->grad_registered));
		}
		break;
	case PBOX_TRAIN_EV_STEP:
		json_object_set_new(o, "net", net_json(&ev->net));
		break;
	case PBOX_TRAIN_EV_EPOCH:
		json_object_set_new(o, "train", stats_json(&ev->train));
		json_object_set_new(o, "test", stats_json(&ev->test));
		json_object_set_new(o, "train_s", json_real(ev->train_s));
		json_object_set_new(o, "eval_s", json_real(ev->eval_s));
		json_object_set_new(o, "net", net_json(&ev->net));
		break;
	case PBOX_TRAIN_EV_DONE:
		json_object_set_new(o, "train_s", json_real(ev->train_s));
		json_object_set_new(o, "model_crc", json_integer(ev->model_crc));
		json_object_set_new(o, "net", net_json(&ev->net));
		break;
	}
	emit_json(o);
}

static void event_text(const struct pbox_train_event *ev, bool local)
{
	char who[32], tx[32], rx[32];

	if (local) {
		snprintf(who, sizeof(who), "local x%u", ev->workers);
	} else {
		snprintf(who, sizeof(who), "rank %u/%u", ev->rank, ev->workers);
	}
	switch (ev->kind) {
	case PBOX_TRAIN_EV_READY:
		printf("%s: ready in %.1f s: %zu parameters in %u keys, %u of %u samples per step, "
		       "%u steps per epoch\n",
		       who, ev->setup_s, ev->nparams, ev->nkeys, ev->shard, ev->batch, ev->steps);
		break;
	case PBOX_TRAIN_EV_STEP:
		break;
	case PBOX_TRAIN_EV_EPOCH:
		printf("%s: epoch %u/%u: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% "
		       "(%llu samples) | %.1f s, %.0f samples/s\n",
		       who, ev->epoch, ev->epochs,
		       ev->train.samples ? ev->train.loss / (double)ev->train.samples : 0.0,
		       pct(ev->train.correct, ev->train.samples),
		       ev->test.samples ? ev->test.loss / (double)ev->test.samples : 0.0,
		       pct(ev->test.correct, ev->test.samples),
		       (unsigned long long)ev->test.samples, ev->train_s,
		       ev->train_s > 0 ? (double)ev->train.samples / ev->train_s : 0.0);
		fflush(stdout);
		break;
	case PBOX_TRAIN_EV_DONE:
		printf("%s: done: %llu steps in %.1f s", who, (unsigned long long)ev->total_steps,
		       ev->train_s);
		if (!local) {
			printf("; sent %s, received %s, %llu retransmits",
			       pbox_cli_bytes((double)ev->net.tx_bytes, tx, sizeof(tx)),
			       pbox_cli_bytes((double)ev->net.rx_bytes, rx, sizeof(rx)),
			       (unsigned long long)ev->net.retransmits);
		}
		printf("\n");
		break;
	}
}

static void on_event(const struct pbox_train_event *ev, void *arg)
{
	const struct train_args *a = arg;

	if (a->json) {
		event_json(ev);
	} else {
		event_text(ev, a->local);
	}
}

int pbox_cmd_train(int argc, char **argv)
{
	struct train_args a;
	char err[1024] = "";
	int rc;

	rc = parse(argc, argv, &a);
	if (rc != 0) {
		return rc > 0 ? 0 : 64;
	}
	if (a.local) {
		rc = pbox_train_local(&a.cfg, on_event, &a, err, sizeof(err));
	} else {
		rc = pbox_train_rank(&a.cfg, on_event, &a, err, sizeof(err));
	}
	if (rc < 0) {
		fprintf(stderr, "pbox train: %s\n", err[0] ? err : strerror(-rc));
		if (a.json) {
			emit_json(json_pack("{s:s, s:i, s:s, s:i}", "ev", "error", "rank",
					    (json_int_t)a.cfg.client.rank, "error",
					    err[0] ? err : strerror(-rc), "errno", -rc));
		}
		return 1;
	}
	if (a.cfg.save_model != NULL && !a.json) {
		printf("model saved to %s\n", a.cfg.save_model);
	}
	return 0;
}
