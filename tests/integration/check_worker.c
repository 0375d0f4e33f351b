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

#include "common/args.h"
#include "common/jobdesc.h"
#include "kernels/kernels.h"

#define PROG              "pbox-check-worker"
#define PBOX_MAX_KEYS_ARG 256

struct opts {
	const char *server;
	const char *token;
	uint32_t job, rank, workers, iters;
	uint64_t nkeys, nelem[PBOX_MAX_KEYS_ARG];
	bool server_opt, mean, expect_fail, async;
	int stall_iter; /* this rank stops responding (sleeps) at this iteration */
	int exit_iter;  /* this rank exits abruptly at this iteration */
	unsigned sleep_ms;
	const char *stop_file; /* holds T: end after iteration T (all ranks read the same) */
	float lr;
	const char *opt;
	uint32_t timeout_ms;
	bool shm_mem;  /* gradients and results in pbox_mem_alloc's memory, registered */
	bool in_place; /* push-pull with out == grad */
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
	       "         [--exit-at T] [--stall-at T] [--stop-file F] [--sleep-ms MS]\n"
	       "         [--shm-mem] [--in-place]\n"
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
		{ "stop-file", 1, NULL, 'Q' }, { "sleep-ms", 1, NULL, 'P' },
		{ "shm-mem", 0, NULL, 'M' },   { "in-place", 0, NULL, 'I' },
		{ "help", 0, NULL, 'h' },      { NULL, 0, NULL, 0 },
	};
	uint32_t at;
	double lr;
	int c, n, rc = 0;

	memset(o, 0, sizeof(*o));
	o->server = "127.0.0.1:7000";
	o->iters = 5;
	o->mean = true;
	o->lr = 0.5f;
	o->opt = "sgd";
	o->stall_iter = -1;
	o->exit_iter = -1;
	while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			o->server = optarg;
			break;
		case 'j':
			rc = pbox_arg_u32(PROG, "--job", optarg, 0, UINT32_MAX, &o->job);
			break;
		case 't':
			o->token = optarg;
			break;
		case 'r':
			rc = pbox_arg_u32(PROG, "--rank", optarg, 0, PBOX_MAX_WORKERS - 1,
					  &o->rank);
			break;
		case 'n':
			rc = pbox_arg_u32(PROG, "--workers", optarg, 1, PBOX_MAX_WORKERS,
					  &o->workers);
			break;
		case 'k':
			n = pbox_parse_u64_list(optarg, o->nelem, PBOX_MAX_KEYS_ARG, 1, UINT32_MAX);
			if (n < 0) {
				fprintf(stderr,
					"%s: --keys %s: expected 1..%d positive element counts\n",
					PROG, optarg, PBOX_MAX_KEYS_ARG);
				rc = -EINVAL;
			}
			o->nkeys = n < 0 ? 0 : (uint64_t)n;
			break;
		case 'i':
			rc = pbox_arg_u32(PROG, "--iters", optarg, 1, UINT32_MAX, &o->iters);
			break;
		case 'S':
			o->server_opt = true;
			break;
		case 'U':
			o->mean = false;
			break;
		case 'l':
			rc = pbox_arg_double(PROG, "--lr", optarg, 0, 1e6, &lr);
			o->lr = (float)lr;
			break;
		case 'O':
			o->opt = optarg;
			break;
		case 'T':
			rc = pbox_arg_u32(PROG, "--timeout-ms", optarg, 0, 3600000, &o->timeout_ms);
			break;
		case 'A':
			o->async = true;
			break;
		case 'F':
			o->expect_fail = true;
			break;
		case 'X':
			rc = pbox_arg_u32(PROG, "--exit-at", optarg, 0, INT32_MAX, &at);
			o->exit_iter = (int)at;
			break;
		case 'Z':
			rc = pbox_arg_u32(PROG, "--stall-at", optarg, 0, INT32_MAX, &at);
			o->stall_iter = (int)at;
			break;
		case 'Q':
			o->stop_file = optarg;
			break;
		case 'P':
			rc = pbox_arg_u32(PROG, "--sleep-ms", optarg, 0, 60000, &o->sleep_ms);
			break;
		case 'M':
			o->shm_mem = true;
			break;
		case 'I':
			o->in_place = true;
			break;
		case 'h':
			usage();
			exit(0);
		default:
			usage();
			return -1;
		}
	}
	if (rc != 0) {
		return -1;
	}
	if (o->token == NULL || o->workers == 0 || o->nkeys == 0) {
		usage();
		return -1;
	}
	return 0;
}

/* Everything main() allocates; finish() frees it all. */
struct bufs {
	uint64_t nkeys;
	uint32_t nranks;
	struct pbox_key_info *keys;
	float **g, **out, **model, **mom, **vel; /* per key */
	float **gall;  /* per rank: its gradient of the key being checked */
	float *want;   /* the expected result of that key */
	bool mem;      /* g (and out unless in place) are pbox_mem_alloc's */
	bool in_place; /* out[k] == g[k] */
};

static int finish(struct bufs *b, struct pbox_client *c, int status)
{
	for (uint64_t k = 0; k < b->nkeys; k++) {
		if (b->in_place) {
			b->out[k] = NULL;
		}
		if (b->mem) {
			pbox_mem_free(c, b->g[k]);
			pbox_mem_free(c, b->out[k]);
			b->g[k] = b->out[k] = NULL;
		}
	}
	pbox_close(c);
	for (uint64_t k = 0; k < b->nkeys; k++) {
		free(b->g[k]);
		free(b->out[k]);
		free(b->model[k]);
		free(b->mom[k]);
		free(b->vel[k]);
	}
	for (uint32_t r = 0; b->gall != NULL && r < b->nranks; r++) {
		free(b->gall[r]);
	}
	free(b->keys);
	free(b->g);
	free(b->out);
	free(b->model);
	free(b->mom);
	free(b->vel);
	free(b->gall);
	free(b->want);
	return status;
}

/* The keys, their buffers (the model at its initial value) and room for the expected
 * results. 0 or -ENOMEM; what was allocated is in b either way. */
static int alloc_bufs(const struct opts *o, struct bufs *b)
{
	uint64_t most = 0;

	b->keys = calloc(o->nkeys, sizeof(*b->keys));
	b->g = calloc(o->nkeys, sizeof(*b->g));
	b->out = calloc(o->nkeys, sizeof(*b->out));
	b->model = calloc(o->nkeys, sizeof(*b->model));
	b->mom = calloc(o->nkeys, sizeof(*b->mom));
	b->vel = calloc(o->nkeys, sizeof(*b->vel));
	b->gall = calloc(o->workers, sizeof(*b->gall));
	if (b->keys == NULL || b->g == NULL || b->out == NULL || b->model == NULL ||
	    b->mom == NULL || b->vel == NULL || b->gall == NULL) {
		return -ENOMEM;
	}
	for (uint64_t k = 0; k < o->nkeys; k++) {
		uint64_t n = o->nelem[k];

		b->nkeys = k + 1;
		b->keys[k].id = (uint32_t)(100 + k);
		b->keys[k].nelem = n;
		b->g[k] = calloc(n, sizeof(float));
		b->out[k] = calloc(n, sizeof(float));
		b->model[k] = calloc(n, sizeof(float));
		b->mom[k] = calloc(n, sizeof(float));
		b->vel[k] = calloc(n, sizeof(float));
		if (b->g[k] == NULL || b->out[k] == NULL || b->model[k] == NULL ||
		    b->mom[k] == NULL || b->vel[k] == NULL) {
			return -ENOMEM;
		}
		for (uint64_t i = 0; i < n; i++) {
			b->model[k][i] = init_val(k, i);
		}
		most = n > most ? n : most;
	}
	b->nranks = o->workers;
	for (uint32_t r = 0; r < o->workers; r++) {
		b->gall[r] = calloc(most, sizeof(float));
		if (b->gall[r] == NULL) {
			return -ENOMEM;
		}
	}
	b->want = calloc(most, sizeof(float));
	return b->want == NULL ? -ENOMEM : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct bufs B = { 0 };
	struct pbox_client_opts co = { 0 };
	struct pbox_client *c = NULL;
	const struct pbox_kernels *kern = pbox_kernels_get();
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
	if (alloc_bufs(&o, &B) != 0) {
		fprintf(stderr, "rank %u: out of memory for %llu keys\n", o.rank,
			(unsigned long long)o.nkeys);
		return finish(&B, NULL, 2);
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
		return finish(&B, NULL, o.expect_fail ? 0 : 1);
	}
	rc = pbox_register(c, B.keys, (uint32_t)o.nkeys);
	if (rc < 0) {
		fprintf(stderr, "rank %u: register: %s (%d)\n", o.rank, pbox_last_error(), rc);
		return finish(&B, c, o.expect_fail ? 0 : 1);
	}
	/* --shm-mem: the gradients (and results) in memory shared with pboxd, which reads
	 * the pushes there; --in-place: the results overwrite the gradients. */
	for (uint64_t k = 0; k < o.nkeys && (o.shm_mem || o.in_place); k++) {
		size_t bytes = o.nelem[k] * sizeof(float);

		if (o.shm_mem) {
			free(B.g[k]);
			free(B.out[k]);
			B.g[k] = B.out[k] = NULL;
			B.mem = true;
			rc = pbox_mem_alloc(c, bytes, (void **)&B.g[k]);
			if (rc == 0 && !o.in_place) {
				rc = pbox_mem_alloc(c, bytes, (void **)&B.out[k]);
			}
			if (rc < 0) {
				goto opfail;
			}
			if (!pbox_mem_registered(c, B.g[k]) ||
			    (!o.in_place && !pbox_mem_registered(c, B.out[k]))) {
				fprintf(stderr,
					"rank %u: key %u's buffers are not shared with pboxd "
					"(transport %s)\n",
					o.rank, B.keys[k].id, pbox_transport(c));
				return finish(&B, c, 1);
			}
		}
		if (o.in_place) {
			free(B.out[k]);
			B.out[k] = B.g[k];
			B.in_place = true;
		}
	}
	if (o.server_opt) {
		for (uint64_t k = 0; k < o.nkeys && o.rank == 0; k++) {
			rc = pbox_init(c, B.keys[k].id, B.model[k]);
			if (rc < 0) {
				goto opfail;
			}
		}
		for (uint64_t k = 0; k < o.nkeys; k++) {
			rc = pbox_pull(c, B.keys[k].id, 0, B.out[k]);
			if (rc < 0) {
				goto opfail;
			}
			if (memcmp(B.out[k], B.model[k], o.nelem[k] * sizeof(float)) != 0) {
				fprintf(stderr, "rank %u: initial model of key %u differs\n",
					o.rank, B.keys[k].id);
				return finish(&B, c, 1);
			}
		}
	}
	for (uint32_t t = 0; t < o.iters; t++) {
		if (o.stop_file != NULL && t % 8 == 0) {
			/* A test ends a long run: every rank stops after the same iteration T
			 * (it writes a T that no rank has reached yet). */
			FILE *f = fopen(o.stop_file, "r");
			unsigned long stop;

			if (f != NULL && fscanf(f, "%lu", &stop) == 1 && stop < o.iters) {
				o.iters = stop > t ? (uint32_t)stop : t + 1;
			}
			if (f != NULL) {
				fclose(f);
			}
		}
		if (o.sleep_ms > 0 && t > 0) { /* "compute" time: a lighter load on the links */
			usleep(o.sleep_ms * 1000u);
		}
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
				B.g[k][i] = grad(o.rank, t, k, i);
			}
			if (o.async) {
				rc = pbox_push_pull_async(c, B.keys[k].id, t, B.g[k], B.out[k],
							  NULL, NULL);
			} else {
				rc = pbox_push_pull(c, B.keys[k].id, t, B.g[k], B.out[k]);
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
			for (uint32_t r = 0; r < o.workers; r++) {
				for (uint64_t i = 0; i < o.nelem[k]; i++) {
					B.gall[r][i] = grad(r, t, k, i);
				}
			}
			if (o.server_opt) {
				pbox_optimizer_step(opt, kern, B.model[k], B.mom[k], B.vel[k],
						    (const float *const *)B.gall, o.workers,
						    o.nelem[k], &p, t + 1);
				memcpy(B.want, B.model[k], o.nelem[k] * sizeof(float));
			} else {
				kern->reduce(B.want, (const float *const *)B.gall, o.workers,
					     o.nelem[k], o.mean ? (float)o.workers : 1.0f);
			}
			for (uint64_t i = 0; i < o.nelem[k]; i++) {
				if (memcmp(&B.want[i], &B.out[k][i], sizeof(float)) != 0) {
					fprintf(stderr,
						"rank %u: MISMATCH key %u iteration %u element "
						"%llu: got %.9g want %.9g\n",
						o.rank, B.keys[k].id, t, (unsigned long long)i,
						B.out[k][i], B.want[i]);
					return finish(&B, c, 1);
				}
			}
		}
	}
	{
		struct pbox_client_stats st;

		pbox_client_stats(c, &st);
		printf("rank %u: OK %u iterations x %llu keys; tx %llu B rx %llu B, %llu "
		       "retransmits, %llu probes, %llu dropped, %llu foreign\n",
		       o.rank, o.iters, (unsigned long long)o.nkeys,
		       (unsigned long long)st.tx_bytes, (unsigned long long)st.rx_bytes,
		       (unsigned long long)st.retransmits, (unsigned long long)st.probes,
		       (unsigned long long)st.dropped, (unsigned long long)st.foreign);
	}
	return finish(&B, c, o.expect_fail ? 1 : 0);
opfail:
	fprintf(stderr, "rank %u: operation failed: %s (%d)\n", o.rank, pbox_last_error(), rc);
	return finish(&B, c, o.expect_fail ? 0 : 1);
}
