/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-kernels: memory bandwidth of the appliance's aggregation kernels against
 * memcpy, for every ISA this CPU supports, at an in-cache and a DRAM-resident size.
 *
 * What is measured, per buffer size S (each buffer is S bytes, n = S / 4 floats):
 *   memcpy   glibc memcpy(acc, g, S)                       bytes counted: 2 n 4
 *   add      k->add(acc, g, n): acc += g                   bytes counted: 3 n 4
 *   nag2     k->nag(w, w, m, src = {acc, g}, nsrc = 2): the appliance's last add fused
 *            with the Nesterov step, in place: read acc, g, w, m, write w, m   6 n 4
 *   nag2-db  the same, but reading the model from w and writing it to a second buffer w2,
 *            as the appliance's double-buffered model does: read acc, g, w, m, write w2, m
 *                                                          bytes counted: 6 n 4
 * and, to explain memcpy's figure, two copies with the same accounting as memcpy:
 *   copy-nt  SSE2 loads + non-temporal (streaming) stores: no read-for-ownership of acc
 *   copy-t   SSE2 loads + ordinary stores: every line of acc is read before it is written
 * Bytes counted are the bytes the operation itself reads and writes; the hardware may move
 * more (a cached store to a line not in cache first reads it), which is exactly what makes
 * ordinary-store copies slower than streaming ones.
 *
 * Method: all buffers of both sizes are written before any timing (no page faults in the
 * timed region); every repetition runs every operation of both sizes once, starting at a
 * different operation each time, so that noise from other processes (the machine is
 * shared) falls on all of them alike; each timed sample repeats the call until it lasts
 * at least --min-ms; the best and the median of the repetitions are reported, and the
 * target ratios also as the median of per-repetition ratios. Targets (printed at the end, for the
 * ISA the appliance uses and for the others): DRAM-resident add >= 0.8 x memcpy; in-cache add >= 4
 * x DRAM add; and, beside the first, DRAM add against copy-t, a plain copy with ordinary
 * stores (glibc's memcpy streams above a size it derives from the cache sizes, so on some
 * machines it is the faster non-temporal copy, on others not).
 */
#include <emmintrin.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/args.h"
#include "common/clock.h"
#include "kernels/kernels.h"

#define PROG      "pbox-bench-kernels"
#define MAX_ISAS  4
#define MAX_OPS   (3 + 3 * MAX_ISAS) /* per buffer size */
#define MAX_REPS  1000
#define MAX_BYTES (1ull << 36) /* per buffer: 64 GiB */

enum op_kind {
	OP_MEMCPY,
	OP_COPY_NT,
	OP_COPY_T,
	OP_ADD,
	OP_NAG,
	OP_NAG_DB,
};

struct bufs {
	size_t n;
	float *acc, *g, *w, *w2, *m;
};

struct op {
	enum op_kind kind;
	const struct pbox_kernels *k; /* kernel ops only */
	char name[32];
	double bytes_per_elem; /* bytes counted per float element */
	struct bufs *b;        /* the buffers it runs on */
	unsigned calls;        /* calls per timed sample */
	double gbps[MAX_REPS]; /* one sample per repetition */
	double best, median;
};

struct opts {
	size_t small_bytes;
	size_t large_bytes;
	unsigned reps;
	double min_ms;
	int cpu;
	const char *only_isa;
};

/* Volatile so the compiler calls glibc's memcpy (whose strategy depends on the size at
 * run time) instead of inlining a copy of its own. */
static void *(*volatile g_memcpy)(void *, const void *, size_t) = memcpy;

static struct pbox_opt_params g_nag_params;
static struct pbox_opt_step g_nag_step;

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-bench-kernels [options]\n"
		"\n"
		"Bandwidth of the appliance kernels (add: acc += g; nag2: the Nesterov step fused\n"
		"with the last add, two gradient sources) against memcpy on the same buffers, for\n"
		"every ISA this CPU supports, at an in-cache and a DRAM-resident buffer size.\n"
		"\n"
		"Options:\n"
		"  --small BYTES   in-cache buffer size (default 32768; suffixes K, M, G)\n"
		"  --large BYTES   DRAM-resident buffer size (default 256M); 5 buffers of this\n"
		"                  size are allocated\n"
		"  --reps N        repetitions of every operation (default 9, at most %d)\n"
		"  --min-ms MS     shortest timed sample; calls are repeated to reach it\n"
		"                  (default 20)\n"
		"  --cpu N         pin the benchmark to CPU N (default: not pinned)\n"
		"  --isa NAME      measure only this ISA (avx512, avx2, sse2, scalar)\n"
		"  -h, --help      this text\n"
		"\n"
		"Exit status: 0 after a complete run (targets met or not); 1 on bad arguments,\n"
		"a failed allocation, or buffers left holding subnormal or non-finite values.\n",
		MAX_REPS);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "small", required_argument, NULL, 's' },
		{ "large", required_argument, NULL, 'l' },
		{ "reps", required_argument, NULL, 'r' },
		{ "min-ms", required_argument, NULL, 'm' },
		{ "cpu", required_argument, NULL, 'c' },
		{ "isa", required_argument, NULL, 'i' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	o->small_bytes = 32u << 10;
	o->large_bytes = 256u << 20;
	o->reps = 9;
	o->min_ms = 20.0;
	o->cpu = -1;
	o->only_isa = NULL;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
		case 'l': {
			const char *opt = c == 's' ? "--small" : "--large";
			size_t *dst = c == 's' ? &o->small_bytes : &o->large_bytes;
			uint64_t v;

			if (pbox_arg_size(PROG, opt, optarg, 64, MAX_BYTES, &v) != 0) {
				return -EINVAL;
			}
			if (v % 64 != 0) {
				fprintf(stderr, "%s: %s %s: expected a multiple of 64 bytes\n",
					PROG, opt, optarg);
				return -EINVAL;
			}
			*dst = (size_t)v;
			break;
		}
		case 'r':
			if (pbox_arg_u32(PROG, "--reps", optarg, 1, MAX_REPS, &o->reps) != 0) {
				return -EINVAL;
			}
			break;
		case 'm':
			if (pbox_arg_double(PROG, "--min-ms", optarg, 0.001, 60000, &o->min_ms) !=
			    0) {
				return -EINVAL;
			}
			break;
		case 'c': {
			uint32_t cpu;

			if (pbox_arg_u32(PROG, "--cpu", optarg, 0, CPU_SETSIZE - 1, &cpu) != 0) {
				return -EINVAL;
			}
			o->cpu = (int)cpu;
			break;
		}
		case 'i':
			o->only_isa = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pbox-bench-kernels: unexpected argument '%s' (see --help)\n",
			argv[optind]);
		return -EINVAL;
	}
	return 0;
}

static float *alloc_floats(size_t n)
{
	void *p = NULL;

	/* Page-aligned: every buffer starts at the same offset within a page and a cache
	 * line, so no operation is favoured by its placement. */
	if (posix_memalign(&p, 4096, n * sizeof(float)) != 0) {
		return NULL;
	}
	return p;
}

static void free_bufs(struct bufs *b)
{
	free(b->acc);
	free(b->g);
	free(b->w);
	free(b->w2);
	free(b->m);
	memset(b, 0, sizeof(*b));
}

/*
 * Values keep every operation on normal floats for any number of calls (subnormal inputs
 * would take microcode assists and measure something else): g is small and positive, so
 * acc grows slowly; the NAG step with weight decay drives w towards a finite fixed point
 * and m towards a finite limit.
 */
static int alloc_bufs(struct bufs *b, size_t bytes)
{
	memset(b, 0, sizeof(*b));
	b->n = bytes / sizeof(float);
	b->acc = alloc_floats(b->n);
	b->g = alloc_floats(b->n);
	b->w = alloc_floats(b->n);
	b->w2 = alloc_floats(b->n);
	b->m = alloc_floats(b->n);
	if (b->acc == NULL || b->g == NULL || b->w == NULL || b->w2 == NULL || b->m == NULL) {
		free_bufs(b);
		return -ENOMEM;
	}
	for (size_t i = 0; i < b->n; i++) {
		b->acc[i] = 1.0f;
		b->g[i] = 1e-3f * (float)(1 + i % 7);
		b->w[i] = 0.5f;
		b->w2[i] = 0.5f;
		b->m[i] = 0.25f;
	}
	return 0;
}

static void copy_sse2(float *dst, const float *src, size_t n, bool nt)
{
	size_t i = 0;

	if (nt) {
		for (; i + 4 <= n; i += 4) {
			_mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
		}
		/* Streaming stores are weakly ordered; fence so the next operation sees a
		 * consistent buffer, as any real user of them must. */
		_mm_sfence();
	} else {
		for (; i + 4 <= n; i += 4) {
			_mm_store_ps(dst + i, _mm_loadu_ps(src + i));
		}
	}
	for (; i < n; i++) {
		dst[i] = src[i];
	}
}

static void run_op(const struct op *op, struct bufs *b)
{
	const float *src[2] = { b->acc, b->g };

	switch (op->kind) {
	case OP_MEMCPY:
		g_memcpy(b->acc, b->g, b->n * sizeof(float));
		break;
	case OP_COPY_NT:
		copy_sse2(b->acc, b->g, b->n, true);
		break;
	case OP_COPY_T:
		copy_sse2(b->acc, b->g, b->n, false);
		break;
	case OP_ADD:
		op->k->add(b->acc, b->g, b->n);
		break;
	case OP_NAG:
		op->k->nag(b->w, b->w, b->m, NULL, src, 2, b->n, &g_nag_params, &g_nag_step);
		break;
	case OP_NAG_DB:
		op->k->nag(b->w2, b->w, b->m, NULL, src, 2, b->n, &g_nag_params, &g_nag_step);
		break;
	}
}

/* Calls per timed sample so that a sample lasts at least min_ms. */
static unsigned calibrate(const struct op *op, struct bufs *b, double min_ms)
{
	unsigned calls = 1;

	for (;;) {
		double t0 = pbox_mono_s(), dt;

		for (unsigned c = 0; c < calls; c++) {
			run_op(op, b);
		}
		dt = pbox_mono_s() - t0;
		if (dt * 1e3 >= min_ms || calls >= (1u << 30)) {
			return calls;
		}
		/* Aim 20 % past the target so a slightly faster rerun still reaches it. */
		calls = dt <= 0 ? calls * 16
				: (unsigned)fmin(calls * 16.0, calls * min_ms * 1.2e-3 / dt + 1);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void summarize(struct op *op, unsigned reps)
{
	double s[MAX_REPS];

	memcpy(s, op->gbps, reps * sizeof(double));
	qsort(s, reps, sizeof(double), cmp_double);
	op->best = s[reps - 1];
	op->median = reps % 2 ? s[reps / 2] : 0.5 * (s[reps / 2 - 1] + s[reps / 2]);
}

/* Any subnormal or non-finite value left in a buffer means the timings mixed in slow
 * paths; say so rather than report them as bandwidth. */
static bool values_sane(const struct bufs *b)
{
	const float *arr[] = { b->acc, b->g, b->w, b->w2, b->m };
	const char *names[] = { "acc", "g", "w", "w2", "m" };

	for (unsigned a = 0; a < 5; a++) {
		for (size_t i = 0; i < b->n; i++) {
			int c = fpclassify(arr[a][i]);

			if (c != FP_NORMAL && c != FP_ZERO) {
				fprintf(stderr,
					"pbox-bench-kernels: buffer %s[%zu] = %g is not a normal "
					"float: the timings include slow-path arithmetic\n",
					names[a], i, (double)arr[a][i]);
				return false;
			}
		}
	}
	return true;
}

static void fmt_size(char *buf, size_t len, size_t bytes)
{
	if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
		snprintf(buf, len, "%zu MB", bytes >> 20);
	} else if (bytes >= 1024 && bytes % 1024 == 0) {
		snprintf(buf, len, "%zu KB", bytes >> 10);
	} else {
		snprintf(buf, len, "%zu B", bytes);
	}
}

/* Median over the repetitions of a's sample divided by b's: both were taken in the same
 * repetition, close in time, so slow phases of the machine cancel. */
static double paired_ratio(const struct op *a, const struct op *b, unsigned reps)
{
	double r[MAX_REPS];

	for (unsigned i = 0; i < reps; i++) {
		r[i] = a->gbps[i] / b->gbps[i];
	}
	qsort(r, reps, sizeof(double), cmp_double);
	return reps % 2 ? r[reps / 2] : 0.5 * (r[reps / 2 - 1] + r[reps / 2]);
}

/*
 * Measure all ops (of both sizes) together: calibrate each, then every repetition runs
 * each op once, starting at a different op each time.
 */
static void measure(struct op *ops, unsigned nops, const struct opts *o)
{
	for (unsigned i = 0; i < nops; i++) {
		ops[i].calls = calibrate(&ops[i], ops[i].b, o->min_ms);
	}
	for (unsigned r = 0; r < o->reps; r++) {
		unsigned first = r * nops / o->reps;

		for (unsigned j = 0; j < nops; j++) {
			struct op *op = &ops[(first + j) % nops];
			double ts = pbox_mono_s(), dt;

			for (unsigned c = 0; c < op->calls; c++) {
				run_op(op, op->b);
			}
			dt = pbox_mono_s() - ts;
			op->gbps[r] = op->bytes_per_elem * (double)op->b->n * op->calls / dt / 1e9;
		}
	}
	for (unsigned i = 0; i < nops; i++) {
		summarize(&ops[i], o->reps);
	}
}

static void print_size(const struct op *ops, unsigned nops, const struct bufs *b)
{
	char sz[32];

	fmt_size(sz, sizeof(sz), b->n * sizeof(float));
	printf("\nbuffers of %s (n = %zu floats)\n", sz, b->n);
	printf("  %-16s %10s %12s %13s %10s\n", "operation", "calls/rep", "best GB/s",
	       "median GB/s", "/ memcpy");
	for (unsigned i = 0; i < nops; i++) {
		printf("  %-16s %10u %12.2f %13.2f %10.2f\n", ops[i].name, ops[i].calls,
		       ops[i].best, ops[i].median, ops[i].best / ops[0].best);
	}
}

static unsigned build_ops(struct op *ops, const struct pbox_kernels *const *isas, unsigned nisa,
			  struct bufs *b)
{
	unsigned n = 0;

	ops[n++] = (struct op){ .kind = OP_MEMCPY, .name = "memcpy", .bytes_per_elem = 8 };
	ops[n++] = (struct op){ .kind = OP_COPY_NT, .name = "copy-nt (sse2)", .bytes_per_elem = 8 };
	ops[n++] = (struct op){ .kind = OP_COPY_T, .name = "copy-t (sse2)", .bytes_per_elem = 8 };
	for (unsigned i = 0; i < nisa; i++) {
		struct op *a = &ops[n++], *g = &ops[n++], *d = &ops[n++];

		*a = (struct op){ .kind = OP_ADD, .k = isas[i], .bytes_per_elem = 12 };
		*g = (struct op){ .kind = OP_NAG, .k = isas[i], .bytes_per_elem = 24 };
		*d = (struct op){ .kind = OP_NAG_DB, .k = isas[i], .bytes_per_elem = 24 };
		snprintf(a->name, sizeof(a->name), "add %s", isas[i]->isa);
		snprintf(g->name, sizeof(g->name), "nag2 %s", isas[i]->isa);
		snprintf(d->name, sizeof(d->name), "nag2-db %s", isas[i]->isa);
	}
	for (unsigned i = 0; i < n; i++) {
		ops[i].b = b;
	}
	return n;
}

static void print_targets(const struct op *small, const struct op *large, unsigned nops,
			  const struct pbox_kernels *appliance, const struct opts *o)
{
	char ssz[32], lsz[32];
	unsigned plain = 0;

	while (large[plain].kind != OP_COPY_T) {
		plain++; /* build_ops always adds it */
	}
	fmt_size(ssz, sizeof(ssz), o->small_bytes);
	fmt_size(lsz, sizeof(lsz), o->large_bytes);
	printf("\ntargets: ratio of the best values [median of the per-repetition ratios]\n");
	for (unsigned i = 0; i < nops; i++) {
		double dram, cache;

		if (large[i].kind != OP_ADD) {
			continue;
		}
		dram = large[i].best / large[0].best;
		cache = small[i].best / large[i].best;
		printf("  %-7s %6s add / %6s memcpy = %5.2f [%5.2f]  target >= 0.8: %s%s\n",
		       large[i].k->isa, lsz, lsz, dram, paired_ratio(&large[i], &large[0], o->reps),
		       dram >= 0.8 ? "met" : "MISSED",
		       large[i].k == appliance ? "  (appliance ISA)" : "");
		printf("  %-7s %6s add / %6s add    = %5.2f [%5.2f]  target >= 4:   %s\n",
		       large[i].k->isa, ssz, lsz, cache,
		       paired_ratio(&small[i], &large[i], o->reps),
		       cache >= 4.0 ? "met" : "MISSED");
		/* The same DRAM ratio against a plain copy (ordinary stores, whatever glibc's
		 * memcpy picks on this machine): the honest reference for a copy that cannot
		 * stream. */
		printf("  %-7s %6s add / %6s copy-t = %5.2f [%5.2f]  (plain, non-streaming "
		       "copy)\n",
		       large[i].k->isa, lsz, lsz, large[i].best / large[plain].best,
		       paired_ratio(&large[i], &large[plain], o->reps));
	}
}

int main(int argc, char **argv)
{
	const struct pbox_kernels *isas[MAX_ISAS];
	const struct pbox_kernels *appliance = pbox_kernels_get();
	static struct op ops[2 * MAX_OPS];
	const struct pbox_optimizer_ops *nag = pbox_optimizer_find("nag");
	struct bufs small_b, large_b;
	struct opts o;
	unsigned nisa, nops;
	double t0, load[3];
	int status = 1;

	if (parse_args(argc, argv, &o) != 0) {
		return 1;
	}
	if (nag == NULL) {
		fprintf(stderr, "pbox-bench-kernels: the kernel library has no 'nag' optimizer\n");
		return 1;
	}
	/* Refuse what cannot fit rather than be killed while filling the buffers. */
	if ((double)o.large_bytes * 5 >
	    (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) * 0.8) {
		fprintf(stderr,
			"pbox-bench-kernels: --large %zu: 5 buffers of that size need more than "
			"80%% of this machine's memory\n",
			o.large_bytes);
		return 1;
	}
	nisa = pbox_kernels_supported(isas, MAX_ISAS);
	if (o.only_isa != NULL) {
		const struct pbox_kernels *k = pbox_kernels_by_isa(o.only_isa);

		if (k == NULL) {
			fprintf(stderr,
				"pbox-bench-kernels: --isa '%s': unknown or not supported by this "
				"CPU\n",
				o.only_isa);
			return 1;
		}
		isas[0] = k;
		nisa = 1;
	}
	if (o.cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(o.cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) != 0) {
			fprintf(stderr,
				"pbox-bench-kernels: --cpu %d: cannot run there: %s (%ld CPUs "
				"online)\n",
				o.cpu, strerror(errno), sysconf(_SC_NPROCESSORS_ONLN));
			return 1;
		}
	}
	pbox_opt_params_default(&g_nag_params);
	g_nag_params.lr = 0.01f;
	g_nag_params.momentum = 0.9f;
	g_nag_params.wd = 1e-4f;
	nag->prepare(&g_nag_params, 1, &g_nag_step);

	if (alloc_bufs(&small_b, o.small_bytes) != 0 || alloc_bufs(&large_b, o.large_bytes) != 0) {
		fprintf(stderr, "pbox-bench-kernels: cannot allocate 5 buffers of %zu bytes\n",
			small_b.n == 0 ? o.small_bytes : o.large_bytes);
		free_bufs(&small_b);
		return 1;
	}
	printf("pbox-bench-kernels: %ld online CPUs; ISAs:", sysconf(_SC_NPROCESSORS_ONLN));
	for (unsigned i = 0; i < nisa; i++) {
		printf(" %s", isas[i]->isa);
	}
	printf(" (the appliance uses %s)\n", appliance->isa);
	if (getloadavg(load, 3) == 3) {
		printf("load average %.2f %.2f %.2f (other processes share the CPUs and memory)\n",
		       load[0], load[1], load[2]);
	}
	printf("bytes counted: memcpy and copies 2n*4, add 3n*4, nag2 / nag2-db 6n*4; %u "
	       "repetitions of both sizes, interleaved\n",
	       o.reps);
	fflush(stdout);

	t0 = pbox_mono_s();
	nops = build_ops(ops, isas, nisa, &small_b);
	build_ops(ops + nops, isas, nisa, &large_b);
	measure(ops, 2 * nops, &o);
	print_size(ops, nops, &small_b);
	print_size(ops + nops, nops, &large_b);
	print_targets(ops, ops + nops, nops, appliance, &o);
	printf("\nmeasured in %.1f s", pbox_mono_s() - t0);
	if (getloadavg(load, 1) == 1) {
		printf("; load average %.2f at the end", load[0]);
	}
	printf("\n");
	if (values_sane(&small_b) && values_sane(&large_b)) {
		status = 0;
	}
	free_bufs(&small_b);
	free_bufs(&large_b);
	return status;
}
