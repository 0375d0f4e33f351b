/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-check-worker: a worker for integration tests. Each rank pushes gradients that are
 * a known function of (rank, iteration, key, element), with small integer values so any
 * summation order is exact, and checks every result it gets back against the value
 * computed locally with the same kernels the appliance uses:
 *   aggregate jobs:        result == sum (or mean) of all ranks' gradients;
 *   server-optimizer jobs: result == the model after the same optimizer steps.
 * Exit status 0 only if every result matched; a mismatch prints the first bad element.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pbox/pbox.h>

#include "common/numlist.h"
#include "kernels/kernels.h"

#define PBOX_MAX_KEYS_ARG 256

struct opts {
	const char *server;
	const char *token;
	uint32_t job, rank, workers, iters;
	uint64_t nkeys, *nelem;
	bool server_opt, mean, expect_fail, async;
	int stall_iter; /* this rank stops responding (sleeps) at this iteration */
	int exit_iter;  /* this rank exits abruptly at this iteration */
	unsigned sleep_ms;
	float lr;
	const char *opt;
	uint32_t timeout_ms;
};

static float grad(uint32_t r, uint32_t t, uint64_t k, uint64_t i)
{
	return (float)((int)((r + 1) * 3 + t * 5 + k * 7 + i % 13) % 32 - 16);
}

static float init_val(uint64_t k, uint64_t i)
{
	return (float)((int)(k * 11 + i % 17) % 8) * 0.5f;
}

static void usage(void)
{
	printf("Usage: pbox-check-worker --server H:P --job J --token T --rank R --workers N\n"
	       "         --keys N1,N2,... [--iters K] [--server-opt] [--sum] [--lr X]\n"
	       "         [--optimizer NAME] [--timeout-ms MS] [--async] [--expect-fail]\n"
	       "         [--exit-at T] [--stall-at T]\n"
	       "Pushes known gradients and checks every result exactly.\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "server", 1, NULL, 's' },    { "job", 1, NULL, 'j' },
		{ "token", 1, NULL, 't' },     { "rank", 1, NULL, 'r' },
		{ "workers", 1, NULL, 'n' },   { "keys", 1, NULL, 'k' },
		{ "iters", 1, NULL, 'i' },     { "server-opt", 0, NULL, 'S' },
		{ "sum", 0, NULL, 'U' },       { "lr", 1, NULL, 'l' },
		{ "optimizer", 1, NULL, 'O' }, { "timeout-ms", 1, NULL, 'T' },
		{ "async", 0, NULL, 'A' },     { "expect-fail", 0, NULL, 'F' },
		{ "exit-at", 1, NULL, 'X' },   { "stall-at", 1, NULL, 'Z' },
		{ "help", 0, NULL, 'h' },      { NULL, 0, NULL, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->server = "127.0.0.1:7000";
	o->iters = 5;
	o->mean = true;
	o->lr = 0.5f;
	o->opt = "sgd";
	o->stall_iter = -1;
	o->exit_iter = -1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			o->server = optarg;
			break;
		case 'j':
			o->job = (uint32_t)atoi(optarg);
			break;
		case 't':
			o->token = optarg;
			break;
		case 'r':
			o->rank = (uint32_t)atoi(optarg);
			break;
		case 'n':
			o->workers = (uint32_t)atoi(optarg);
			break;
		case 'k': {
			int n;

			free(o->nelem);
			o->nelem = calloc(PBOX_MAX_KEYS_ARG, sizeof(*o->nelem));
			n = pbox_parse_u64_list(optarg, o->nelem, PBOX_MAX_KEYS_ARG, 1, UINT32_MAX);
			if (n < 0) {
				fprintf(stderr,
					"pbox-check-worker: --keys %s: expected 1..%d positive "
					"element "
					"counts\n",
					optarg, PBOX_MAX_KEYS_ARG);
				return -1;
			}
			o->nkeys = (uint64_t)n;
			break;
		}
		case 'i':
			o->iters = (uint32_t)atoi(optarg);
			break;
		case 'S':
			o->server_opt = true;
			break;
		case 'U':
			o->mean = false;
			break;
		case 'l':
			o->lr = strtof(optarg, NULL);
			break;
		case 'O':
			o->opt = optarg;
			break;
		case 'T':
			o->timeout_ms = (uint32_t)atoi(optarg);
			break;
		case 'A':
			o->async = true;
			break;
		case 'F':
			o->expect_fail = true;
			break;
		case 'X':
			o->exit_iter = atoi(optarg);
			break;
		case 'Z':
			o->stall_iter = atoi(optarg);
			break;
		case 'h':
			usage();
			exit(0);
		default:
			usage();
			return -1;
		}
	}
	if (o->token == NULL || o->workers == 0 || o->nkeys == 0) {
		usage();
		return -1;
	}
	return 0;
}

struct bufs {
	struct pbox_key_info *keys;
	float **g, **out, **model, **mom, **vel, **gall;
	uint64_t nkeys;
};

static int finish(struct opts *o, struct bufs *b, struct pbox_client *c, int status)
{
	pbox_close(c);
	for (uint64_t k = 0; k < b->nkeys; k++) {
		free(b->g[k]);
		free(b->out[k]);
		free(b->model[k]);
		free(b->mom[k]);
		free(b->vel[k]);
	}
	free(b->keys);
	free(b->g);
	free(b->out);
	free(b->model);
	free(b->mom);
	free(b->vel);
	free(b->gall);
	free(o->nelem);
	return status;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct bufs B = { 0 };
	struct pbox_client_opts co = { 0 };
	struct pbox_client *c = NULL;
	struct pbox_key_info *keys;
	float **g, **out, **model, **mom, **vel, **gall;
	const struct pbox_optimizer_ops *opt;
	struct pbox_opt_params p;
	int rc;

	if (parse(argc, argv, &o) != 0) {
		return 2;
	}
	opt = pbox_optimizer_find(o.opt);
	if (opt == NULL) {
		fprintf(stderr, "unknown optimizer %s\n", o.opt);
		return 2;
	}
	pbox_opt_params_default(&p);
	p.lr = o.lr;
	co.server = o.server;
	co.job = o.job;
	co.token = o.token;
	co.rank = o.rank;
	co.timeout_ms = o.timeout_ms;
	rc = pbox_connect(&co, &c);
	if (rc < 0) {
		fprintf(stderr, "rank %u: connect: %s (%d)\n", o.rank, pbox_last_error(), rc);
		return finish(&o, &B, NULL, o.expect_fail ? 0 : 1);
	}
	B.nkeys = o.nkeys;
	B.keys = keys = calloc(o.nkeys, sizeof(*keys));
	B.g = g = calloc(o.nkeys, sizeof(*g));
	B.out = out = calloc(o.nkeys, sizeof(*out));
	B.model = model = calloc(o.nkeys, sizeof(*model));
	B.mom = mom = calloc(o.nkeys, sizeof(*mom));
	B.vel = vel = calloc(o.nkeys, sizeof(*vel));
	B.gall = gall = calloc(o.workers, sizeof(*gall));
	for (uint64_t k = 0; k < o.nkeys; k++) {
		keys[k].id = (uint32_t)(100 + k);
		keys[k].nelem = o.nelem[k];
		g[k] = calloc(o.nelem[k], sizeof(float));
		out[k] = calloc(o.nelem[k], sizeof(float));
		model[k] = calloc(o.nelem[k], sizeof(float));
		mom[k] = calloc(o.nelem[k], sizeof(float));
		vel[k] = calloc(o.nelem[k], sizeof(float));
		for (uint64_t i = 0; i < o.nelem[k]; i++) {
			model[k][i] = init_val(k, i);
		}
	}
	rc = pbox_register(c, keys, (uint32_t)o.nkeys);
	if (rc < 0) {
		fprintf(stderr, "rank %u: register: %s (%d)\n", o.rank, pbox_last_error(), rc);
		return finish(&o, &B, c, o.expect_fail ? 0 : 1);
	}
	if (o.server_opt) {
		for (uint64_t k = 0; k < o.nkeys && o.rank == 0; k++) {
			rc = pbox_init(c, keys[k].id, model[k]);
			if (rc < 0) {
				goto opfail;
			}
		}
		for (uint64_t k = 0; k < o.nkeys; k++) {
			rc = pbox_pull(c, keys[k].id, 0, out[k]);
			if (rc < 0) {
				goto opfail;
			}
			if (memcmp(out[k], model[k], o.nelem[k] * sizeof(float)) != 0) {
				fprintf(stderr, "rank %u: initial model of key %u differs\n",
					o.rank, keys[k].id);
				return finish(&o, &B, c, 1);
			}
		}
	}
	for (uint32_t t = 0; t < o.iters; t++) {
		if ((int)t == o.exit_iter) {
			fprintf(stderr, "rank %u: exiting abruptly at iteration %u\n", o.rank, t);
			_exit(3);
		}
		if ((int)t == o.stall_iter) {
			fprintf(stderr, "rank %u: stalling at iteration %u\n", o.rank, t);
			sleep(3600);
		}
		for (uint64_t k = 0; k < o.nkeys; k++) {
			for (uint64_t i = 0; i < o.nelem[k]; i++) {
				g[k][i] = grad(o.rank, t, k, i);
			}
			if (o.async) {
				rc = pbox_push_pull_async(c, keys[k].id, t, g[k], out[k], NULL,
							  NULL);
			} else {
				rc = pbox_push_pull(c, keys[k].id, t, g[k], out[k]);
			}
			if (rc < 0) {
				goto opfail;
			}
		}
		if (o.async) {
			rc = pbox_wait_all(c, -1);
			if (rc < 0) {
				goto opfail;
			}
		}
		/* The expected result, computed with the appliance's kernels. */
		for (uint64_t k = 0; k < o.nkeys; k++) {
			const struct pbox_kernels *kern = pbox_kernels_get();
			float *want = calloc(o.nelem[k], sizeof(float));

			for (uint32_t r = 0; r < o.workers; r++) {
				gall[r] = calloc(o.nelem[k], sizeof(float));
				for (uint64_t i = 0; i < o.nelem[k]; i++) {
					gall[r][i] = grad(r, t, k, i);
				}
			}
			if (o.server_opt) {
				pbox_optimizer_step(opt, kern, model[k], mom[k], vel[k],
						    (const float *const *)gall, o.workers,
						    o.nelem[k], &p, t + 1);
				memcpy(want, model[k], o.nelem[k] * sizeof(float));
			} else {
				kern->reduce(want, (const float *const *)gall, o.workers,
					     o.nelem[k], o.mean ? (float)o.workers : 1.0f);
			}
			for (uint64_t i = 0; i < o.nelem[k]; i++) {
				if (memcmp(&want[i], &out[k][i], sizeof(float)) != 0) {
					fprintf(stderr,
						"rank %u: MISMATCH key %u iteration %u element "
						"%llu: got "
						"%.9g want %.9g\n",
						o.rank, keys[k].id, t, (unsigned long long)i,
						out[k][i], want[i]);
					return finish(&o, &B, c, 1);
				}
			}
			for (uint32_t r = 0; r < o.workers; r++) {
				free(gall[r]);
			}
			free(want);
		}
	}
	{
		struct pbox_client_stats st;

		pbox_client_stats(c, &st);
		printf("rank %u: OK %u iterations x %llu keys; tx %llu B rx %llu B, %llu "
		       "retransmits, %llu probes, %llu dropped\n",
		       o.rank, o.iters, (unsigned long long)o.nkeys,
		       (unsigned long long)st.tx_bytes, (unsigned long long)st.rx_bytes,
		       (unsigned long long)st.retransmits, (unsigned long long)st.probes,
		       (unsigned long long)st.dropped);
	}
	return finish(&o, &B, c, o.expect_fail ? 1 : 0);
opfail:
	fprintf(stderr, "rank %u: operation failed: %s (%d)\n", o.rank, pbox_last_error(), rc);
	return finish(&o, &B, c, o.expect_fail ? 0 : 1);
}
