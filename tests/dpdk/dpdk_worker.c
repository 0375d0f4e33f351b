/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-dpdk-worker: an ordinary libpbox worker (kernel UDP) for the DPDK namespace tests
 * and the end-to-end benchmark. Two modes:
 *
 *   --hash   push-pull pseudo-random (non-integer) gradients for --iters iterations and
 *            print a 64-bit FNV-1a hash of every result received, in order. Against a
 *            deterministic job (sums in rank order) the hash is a function of the job
 *            alone, so the same run through two transports must print the same hash.
 *   --bench  push-pull the same gradients as fast as possible for --seconds and print
 *            the exchanges per second (comm-only: no computation between exchanges).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/numlist.h"

#include <pbox/pbox.h>

struct opts {
	const char *server, *token;
	uint32_t job, rank, iters, nkeys;
	uint64_t nelem[16];
	bool server_opt, hash, bench;
	double seconds;
	uint32_t timeout_ms;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-dpdk-worker --server H:P --job J --token T --rank R --keys N1,N2..\n"
		"         (--hash --iters K [--server-opt] | --bench --seconds S)\n"
		"         [--timeout-ms MS]\n"
		"--hash prints a hash of every result; --bench prints exchanges per second.\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "server", 1, NULL, 's' },     { "job", 1, NULL, 'j' },
		{ "token", 1, NULL, 't' },      { "rank", 1, NULL, 'r' },
		{ "keys", 1, NULL, 'k' },       { "iters", 1, NULL, 'i' },
		{ "server-opt", 0, NULL, 'S' }, { "hash", 0, NULL, 'H' },
		{ "bench", 0, NULL, 'B' },      { "seconds", 1, NULL, 'x' },
		{ "timeout-ms", 1, NULL, 'T' }, { "help", 0, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->iters = 10;
	o->seconds = 5;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		char *end;
		int n;

		switch (c) {
		case 's':
			o->server = optarg;
			break;
		case 't':
			o->token = optarg;
			break;
		case 'j':
			o->job = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'r':
			o->rank = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'i':
			o->iters = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'T':
			o->timeout_ms = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'x':
			o->seconds = strtod(optarg, &end);
			if (*end != '\0' || o->seconds <= 0) {
				fprintf(stderr,
					"pbox-dpdk-worker: --seconds %s: expected a positive "
					"number\n",
					optarg);
				return -1;
			}
			break;
		case 'S':
			o->server_opt = true;
			break;
		case 'H':
			o->hash = true;
			break;
		case 'B':
			o->bench = true;
			break;
		case 'k':
			n = pbox_parse_u64_list(optarg, o->nelem, 16, 1, UINT32_MAX);
			if (n < 0) {
				fprintf(stderr,
					"pbox-dpdk-worker: --keys %s: expected 1..16 positive "
					"element counts\n",
					optarg);
				return -1;
			}
			o->nkeys = (uint32_t)n;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (o->server == NULL || o->token == NULL || o->nkeys == 0 || o->hash == o->bench) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Reproducible non-integer gradients: their sum depends on the order of addition. */
static float grad(uint32_t r, uint32_t t, uint32_t k, uint64_t i)
{
	uint64_t h = (r + 1) * 0x9e3779b97f4a7c15ull ^ (t + 1) * 0xc2b2ae3d27d4eb4full ^
		     (k + 1) * 0x165667b19e3779f9ull ^ i * 0xd6e8feb86659fd93ull;

	h ^= h >> 31;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 29;
	return (float)((double)(h >> 11) / (double)(1ull << 53) * 2.0 - 1.0) * 0.01f;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h = (h ^ b[i]) * 0x100000001b3ull;
	}
	return h;
}

int main(int argc, char **argv)
{
	struct pbox_client_opts co = { 0 };
	struct pbox_client *c = NULL;
	struct pbox_key_info keys[16];
	float *g[16], *out[16];
	uint64_t h = 0xcbf29ce484222325ull, n = 0;
	struct opts o;
	double t0, el;
	int rc;

	if (parse(argc, argv, &o) != 0) {
		return 2;
	}
	co.server = o.server;
	co.job = o.job;
	co.token = o.token;
	co.rank = o.rank;
	co.timeout_ms = o.timeout_ms;
	rc = pbox_connect(&co, &c);
	if (rc < 0) {
		fprintf(stderr, "rank %u: connect: %s\n", o.rank, pbox_last_error());
		return 1;
	}
	for (uint32_t k = 0; k < o.nkeys; k++) {
		keys[k].id = 500 + k;
		keys[k].nelem = o.nelem[k];
		g[k] = calloc(o.nelem[k], sizeof(float));
		out[k] = calloc(o.nelem[k], sizeof(float));
		if (g[k] == NULL || out[k] == NULL) {
			fprintf(stderr, "rank %u: out of memory\n", o.rank);
			return 1;
		}
		for (uint64_t i = 0; i < o.nelem[k]; i++) {
			out[k][i] = grad(1000, 0, k, i); /* the initial model */
		}
	}
	rc = pbox_register(c, keys, o.nkeys);
	for (uint32_t k = 0; rc == 0 && o.server_opt && k < o.nkeys; k++) {
		if (o.rank == 0) {
			rc = pbox_init(c, keys[k].id, out[k]);
		}
		if (rc == 0) {
			rc = pbox_pull(c, keys[k].id, 0, out[k]);
		}
	}
	if (rc < 0) {
		fprintf(stderr, "rank %u: set-up: %s\n", o.rank, pbox_last_error());
		pbox_close(c);
		return 1;
	}
	t0 = pbox_mono_s();
	for (uint32_t t = 0; o.bench || t < o.iters; t++) {
		for (uint32_t k = 0; k < o.nkeys; k++) {
			for (uint64_t i = 0; i < o.nelem[k] && (t == 0 || o.hash); i++) {
				g[k][i] = grad(o.rank, t, k, i);
			}
			rc = pbox_push_pull_async(c, keys[k].id, t, g[k], out[k], NULL, NULL);
			if (rc < 0) {
				break;
			}
		}
		if (rc == 0) {
			rc = pbox_wait_all(c, -1);
		}
		if (rc < 0) {
			fprintf(stderr, "rank %u: iteration %u: %s\n", o.rank, t,
				pbox_last_error());
			pbox_close(c);
			return 1;
		}
		n++;
		for (uint32_t k = 0; k < o.nkeys && o.hash; k++) {
			h = fnv1a(h, out[k], o.nelem[k] * sizeof(float));
		}
		if (o.bench && pbox_mono_s() - t0 >= o.seconds) {
			break;
		}
	}
	el = pbox_mono_s() - t0;
	if (o.hash) {
		printf("rank %u: hash %016" PRIx64 " after %u iterations\n", o.rank, h, o.iters);
	} else {
		printf("rank %u: %" PRIu64 " exchanges in %.3f s: %.1f exchanges/s\n", o.rank, n,
		       el, (double)n / el);
	}
	pbox_close(c);
	return 0;
}
