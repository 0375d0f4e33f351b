/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-shm-bound: the memory bound of an exchange through shared memory on this host, the
 * shared-memory transport's counterpart of pbox-udp-echo-bound. --workers gradients of
 * --bytes each lie in memory (as pbox_mem_alloc buffers do: nothing is copied to push
 * them); an exchange sums them into one result buffer (the appliance's: it keeps the
 * result) and copies the result into every worker's result buffer (the caller's buffer a
 * push-pull fills). That is the least memory work any parameter-server exchange with
 * pbox's API does: each gradient read once, the result written once, and once into each
 * worker's buffer. It is done here with no protocol, rings, descriptors or waiting: --threads
 * threads (pboxd's cores and the workers share this host's CPUs, so the CPUs are the
 * threads' bound too) each take every --threads-th chunk of --chunk bytes, sum the
 * gradients' chunk in one pass with pbox's own reduce kernel (the widest ISA here) and
 * copy the result chunk, still in cache, into each worker's buffer with non-temporal
 * stores (as libpbox's result copy does). The threads meet at a
 * barrier at each exchange's end. No exchange through pboxd can be faster.
 *
 * Buffers are touched before the first exchange (no page faults timed); with the default
 * sizes they are far larger than the last-level cache, as the ResNet-50 gradient is.
 *
 * Output: one line, or with --json one JSON object {"iter_seconds": [...], "median_s",
 * "cpu_s" (the process's CPU seconds over the timed exchanges), "isa", ...}.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "common/args.h"
#include "common/clock.h"
#include "common/stream.h"
#include "kernels/kernels.h"

#define PROG        "pbox-shm-bound"
#define MAX_WORKERS 64
#define MAX_THREADS 16
#define MAX_ITERS   1000

struct opts {
	uint64_t bytes, chunk;
	uint32_t workers, threads, iters, warmup;
	bool json;
};

struct shared {
	const struct opts *o;
	const struct pbox_kernels *k;
	float *grad[MAX_WORKERS];
	float *res[MAX_WORKERS];
	float *sum;
	pthread_barrier_t bar;
	double *iter_s;
};

struct thread_arg {
	struct shared *s;
	uint32_t id;
};

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* A buffer of n bytes, every page touched (so no exchange pays for a fault). */
static float *buffer(uint64_t n, float fill)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	float *f;

	if (p == MAP_FAILED) {
		fprintf(stderr, PROG ": cannot map %llu bytes: %s\n", (unsigned long long)n,
			strerror(errno));
		exit(1);
	}
	f = p;
	for (uint64_t i = 0; i < n / sizeof(float); i++) {
		f[i] = fill + (float)(i & 63);
	}
	return f;
}

/* One exchange's share of thread a: its chunks summed and delivered. */
static void exchange(struct shared *s, uint32_t id)
{
	const struct opts *o = s->o;
	uint64_t nchunks = (o->bytes + o->chunk - 1) / o->chunk;
	const float *src[MAX_WORKERS];

	for (uint64_t c = id; c < nchunks; c += o->threads) {
		uint64_t off = c * o->chunk / sizeof(float);
		uint64_t len =
			o->bytes - c * o->chunk < o->chunk ? o->bytes - c * o->chunk : o->chunk;
		size_t n = (size_t)(len / sizeof(float));

		for (uint32_t w = 0; w < o->workers; w++) {
			src[w] = s->grad[w] + off;
		}
		s->k->reduce(s->sum + off, src, o->workers, n, 1.0f);
		for (uint32_t w = 0; w < o->workers; w++) {
			pbox_copy_stream(s->res[w] + off, s->sum + off, len);
		}
	}
	_mm_sfence();
}

static void *run(void *arg)
{
	struct thread_arg *a = arg;
	struct shared *s = a->s;
	const struct opts *o = s->o;

	for (uint32_t it = 0; it < o->warmup + o->iters; it++) {
		double t0 = 0;

		pthread_barrier_wait(&s->bar);
		if (a->id == 0) {
			t0 = pbox_mono_s();
		}
		exchange(s, a->id);
		pthread_barrier_wait(&s->bar);
		if (a->id == 0 && it >= o->warmup) {
			s->iter_s[it - o->warmup] = pbox_mono_s() - t0;
		}
	}
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [--bytes N] [--workers N] [--threads N] [--chunk N] [--iters N]\n"
		"                      [--warmup N] [--json]\n"
		"The memory bound of an exchange through shared memory: --workers gradients of\n"
		"--bytes each summed into a result buffer and copied into every worker's buffer,\n"
		"by --threads threads in --chunk pieces, with pbox's reduce kernel.\n"
		"  --bytes N    gradient bytes per worker (K/M/G suffixes; default the ResNet-50\n"
		"               gradient, 102228128)\n"
		"  --workers N  workers (default 2)\n"
		"  --threads N  threads (default 2: pboxd's cores and the workers share the CPUs)\n"
		"  --chunk N    bytes per piece (default 32K, pbox's chunk)\n"
		"  --iters N    timed exchanges (default 20); --warmup N untimed first (default "
		"2)\n"
		"  --json       one JSON object instead of a line\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "bytes", required_argument, NULL, 'b' },
		{ "workers", required_argument, NULL, 'w' },
		{ "threads", required_argument, NULL, 't' },
		{ "chunk", required_argument, NULL, 'c' },
		{ "iters", required_argument, NULL, 'i' },
		{ "warmup", required_argument, NULL, 'u' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .bytes = 102228128,
			  .chunk = 32768,
			  .workers = 2,
			  .threads = 2,
			  .iters = 20,
			  .warmup = 2 };
	struct shared s = { .o = &o };
	struct thread_arg ta[MAX_THREADS];
	pthread_t th[MAX_THREADS];
	double *sorted, c0, c1;
	int c, bad = 0;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'b':
			bad = pbox_arg_size(PROG, "--bytes", optarg, 4, 1ull << 36, &o.bytes);
			break;
		case 'w':
			bad = pbox_arg_u32(PROG, "--workers", optarg, 1, MAX_WORKERS, &o.workers);
			break;
		case 't':
			bad = pbox_arg_u32(PROG, "--threads", optarg, 1, MAX_THREADS, &o.threads);
			break;
		case 'c':
			bad = pbox_arg_size(PROG, "--chunk", optarg, 64, 1ull << 30, &o.chunk);
			break;
		case 'i':
			bad = pbox_arg_u32(PROG, "--iters", optarg, 1, MAX_ITERS, &o.iters);
			break;
		case 'u':
			bad = pbox_arg_u32(PROG, "--warmup", optarg, 0, MAX_ITERS, &o.warmup);
			break;
		case 'j':
			o.json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
		if (bad) {
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (o.bytes % sizeof(float) != 0 || o.chunk % sizeof(float) != 0) {
		fprintf(stderr, PROG ": --bytes and --chunk must be multiples of 4 (float32)\n");
		return 2;
	}
	s.k = pbox_kernels_get();
	for (uint32_t w = 0; w < o.workers; w++) {
		s.grad[w] = buffer(o.bytes, (float)w);
		s.res[w] = buffer(o.bytes, 0.0f);
	}
	s.sum = buffer(o.bytes, 0.0f);
	s.iter_s = calloc(o.iters, sizeof(double));
	sorted = calloc(o.iters, sizeof(double));
	if (s.iter_s == NULL || sorted == NULL ||
	    pthread_barrier_init(&s.bar, NULL, o.threads) != 0) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	c0 = cpu_s();
	for (uint32_t t = 0; t < o.threads; t++) {
		ta[t] = (struct thread_arg){ .s = &s, .id = t };
		if (pthread_create(&th[t], NULL, run, &ta[t]) != 0) {
			fprintf(stderr, PROG ": cannot start thread %u\n", t);
			return 1;
		}
	}
	for (uint32_t t = 0; t < o.threads; t++) {
		pthread_join(th[t], NULL);
	}
	c1 = cpu_s();
	/* every worker's buffer holds the sum (a check that the work was done) */
	for (uint32_t w = 0; w < o.workers; w++) {
		float want = 0;

		for (uint32_t v = 0; v < o.workers; v++) {
			want += (float)v + 5.0f;
		}
		if (s.res[w][5] != want) {
			fprintf(stderr, PROG ": worker %u's result is %g, not %g\n", w,
				(double)s.res[w][5], (double)want);
			return 1;
		}
	}
	memcpy(sorted, s.iter_s, o.iters * sizeof(double));
	qsort(sorted, o.iters, sizeof(double), cmp_double);
	if (o.json) {
		printf("{\"bytes\": %llu, \"workers\": %u, \"threads\": %u, \"chunk\": %llu, "
		       "\"isa\": \"%s\", \"median_s\": %.6f, \"cpu_s\": %.4f, \"iter_seconds\": [",
		       (unsigned long long)o.bytes, o.workers, o.threads,
		       (unsigned long long)o.chunk, s.k->isa, sorted[o.iters / 2],
		       (c1 - c0) * o.iters / (o.iters + o.warmup));
		for (uint32_t i = 0; i < o.iters; i++) {
			printf("%s%.6f", i ? ", " : "", s.iter_s[i]);
		}
		printf("]}\n");
	} else {
		printf(PROG ": %u workers x %llu bytes, %u threads, %s: median %.4f s per exchange "
			    "(min %.4f, max %.4f), %.2f GB/s of gradients summed\n",
		       o.workers, (unsigned long long)o.bytes, o.threads, s.k->isa,
		       sorted[o.iters / 2], sorted[0], sorted[o.iters - 1],
		       (double)o.bytes * o.workers / sorted[o.iters / 2] / 1e9);
	}
	pthread_barrier_destroy(&s.bar);
	free(s.iter_s);
	free(sorted);
	return 0;
}
