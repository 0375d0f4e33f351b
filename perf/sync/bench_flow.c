/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-flow: one worker of the flow-control benchmark. It streams pushes of
 * consecutive iterations over a set of keys as fast as the job's flow control lets it
 * (pbox_push_async; when every credit of a key is taken it waits for that key), with no
 * compute, and reports contributions per second. Run N of them against an aggregate job
 * configured with flow = { mode = "notify-ack"; credits = k } or { mode = "plain" }.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pbox/pbox.h>

#include "common/args.h"
#include "common/clock.h"

#define PROG      "pbox-bench-flow"
#define MAX_KEYS  64
#define MAX_NELEM (1ull << 28) /* float32 elements per key: 1 GiB */

/* Completions arrive on libpbox's progress thread; the producer sleeps on this until a
 * credit frees up. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static uint64_t g_done;
static int g_err;

static void on_done(uint32_t key, int status, void *arg)
{
	(void)key;
	(void)arg;
	pthread_mutex_lock(&g_lock);
	g_done++;
	if (status < 0 && g_err == 0) {
		g_err = status;
	}
	pthread_cond_signal(&g_cond);
	pthread_mutex_unlock(&g_lock);
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-bench-flow --server H:P --job J --token T --rank R --keys N1,N2,...\n"
		"                       [--iters K]\n"
		"Streams pushes of K iterations over the keys (float32 element counts) as fast\n"
		"as the job's flow control allows and prints one JSON line of results.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "server", 1, NULL, 's' }, { "job", 1, NULL, 'j' },  { "token", 1, NULL, 't' },
		{ "rank", 1, NULL, 'r' },   { "keys", 1, NULL, 'k' }, { "iters", 1, NULL, 'i' },
		{ "help", 0, NULL, 'h' },   { NULL, 0, NULL, 0 },
	};
	struct pbox_client_opts o = { .server = "127.0.0.1:7000", .job = 1 };
	struct pbox_key_info keys[MAX_KEYS];
	struct pbox_client *c = NULL;
	struct pbox_job_info info;
	struct pbox_client_stats st;
	uint32_t nkeys = 0, iters = 200, nbufs;
	float **buf;
	double t0, t1, bytes = 0;
	int opt, rc = 0;

	while (rc == 0 && (opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (opt) {
		case 's':
			o.server = optarg;
			break;
		case 'j':
			rc = pbox_arg_u32(PROG, "--job", optarg, 0, UINT32_MAX, &o.job);
			break;
		case 't':
			o.token = optarg;
			break;
		case 'r':
			rc = pbox_arg_u32(PROG, "--rank", optarg, 0, UINT32_MAX, &o.rank);
			break;
		case 'i':
			rc = pbox_arg_u32(PROG, "--iters", optarg, 1, UINT32_MAX, &iters);
			break;
		case 'k': {
			uint64_t nelem[MAX_KEYS];
			int n = pbox_parse_u64_list(optarg, nelem, MAX_KEYS, 1, MAX_NELEM);

			if (n < 0) {
				fprintf(stderr,
					"%s: --keys %s: expected 1 to %d comma-separated element "
					"counts between 1 and %llu\n",
					PROG, optarg, MAX_KEYS, MAX_NELEM);
				return 64;
			}
			for (nkeys = 0; nkeys < (uint32_t)n; nkeys++) {
				keys[nkeys].id = nkeys;
				keys[nkeys].nelem = nelem[nkeys];
			}
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (rc != 0) {
		return 64;
	}
	if (o.token == NULL || nkeys == 0) {
		usage(stderr);
		return 64;
	}
	if ((rc = pbox_connect(&o, &c)) < 0 || (rc = pbox_register(c, keys, nkeys)) < 0) {
		fprintf(stderr, "pbox-bench-flow rank %u: %s\n", o.rank, pbox_last_error());
		pbox_close(c);
		return 1;
	}
	pbox_job_info(c, &info);
	/* Each push in flight owns its buffer until it completes (NOTIFY-ACK is zero copy):
	 * one more buffer per key than the credits, used round-robin. */
	nbufs = info.credits + 1;
	buf = calloc((size_t)nkeys * nbufs, sizeof(*buf));
	for (uint32_t i = 0; i < nkeys * nbufs; i++) {
		buf[i] = calloc(keys[i / nbufs].nelem, sizeof(float));
		for (uint64_t e = 0; e < keys[i / nbufs].nelem; e++) {
			buf[i][e] = (float)(e % 7);
		}
	}
	t0 = pbox_mono_s();
	for (uint32_t t = 0; t < iters; t++) {
		for (uint32_t k = 0; k < nkeys; k++) {
			float *b = buf[k * nbufs + t % nbufs];

			for (;;) {
				uint64_t seen;

				pthread_mutex_lock(&g_lock);
				seen = g_done;
				pthread_mutex_unlock(&g_lock);
				rc = pbox_push_async(c, k, t, b, on_done, NULL);
				if (rc != -EBUSY) {
					break;
				}
				/* Every credit of the key is in flight: sleep until something
				 * completes, then try again. */
				pthread_mutex_lock(&g_lock);
				while (g_done == seen && g_err == 0) {
					pthread_cond_wait(&g_cond, &g_lock);
				}
				rc = g_err;
				pthread_mutex_unlock(&g_lock);
				if (rc < 0) {
					break;
				}
			}
			if (rc < 0) {
				fprintf(stderr, "pbox-bench-flow rank %u: %s\n", o.rank,
					pbox_last_error());
				pbox_close(c);
				return 1;
			}
			bytes += (double)keys[k].nelem * 4;
		}
	}
	rc = pbox_wait_all(c, -1);
	t1 = pbox_mono_s();
	if (rc < 0) {
		fprintf(stderr, "pbox-bench-flow rank %u: %s\n", o.rank, pbox_last_error());
		pbox_close(c);
		return 1;
	}
	pbox_client_stats(c, &st);
	printf("{\"rank\": %u, \"iters\": %u, \"seconds\": %.6f, \"pushes_per_s\": %.1f, "
	       "\"gbytes_per_s\": %.4f, \"retransmits\": %llu, \"credits\": %u}\n",
	       o.rank, iters, t1 - t0, (double)iters * nkeys / (t1 - t0), bytes / (t1 - t0) / 1e9,
	       (unsigned long long)st.retransmits, info.credits);
	pbox_close(c);
	for (uint32_t i = 0; i < nkeys * nbufs; i++) {
		free(buf[i]);
	}
	free(buf);
	return 0;
}
