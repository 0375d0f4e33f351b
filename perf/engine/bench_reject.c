/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-reject: what an exact single pass could save non_finite = "reject" (the
 * default), measured with the engine's own kernel tables, every candidate beside today's
 * route in the same run.
 *
 * Under "reject" a fragment holding NaN / Inf must leave the accumulator bit-identical
 * (engine.c, push_data), and an IEEE addition cannot be undone, so the engine checks a
 * payload before it writes anything: the final arrival of a fragment is scanned
 * (nonfinite) and then summed (reduce: acc = acc + g, the payload read a second time, from
 * cache); so is the first datagram of a slot (scanned, then copied). "propagate" refuses
 * nothing and does either in one pass. The exact one-pass alternatives need the new values
 * (or the old ones) written somewhere else until the check has passed. Candidates, per
 * fragment, ns of thread CPU time:
 *
 * final arrival (acc = acc + g):
 *   check+sum    nonfinite(g), then reduce(acc, {acc, g}): today's "reject"
 *   stage+copy   sum2_nonfinite(stage, acc, g) into a core-local stage, then memcpy to acc
 *   beside       sum2_nonfinite(alt, acc, g): the sum written to a second accumulator
 *                (two buffers per slot; the copy back is never made)
 *   save+sum     memcpy(save, acc), then sum2_nonfinite(acc, acc, g) in place (an undo
 *                copy, restored on a refusal)
 *   in place     sum2_nonfinite(acc, acc, g): "propagate", not exact under "reject" (the
 *                bound)
 * first datagram of a slot (acc = g):
 *   check+copy   nonfinite(g), then memcpy: today's "reject"
 *   stage+copy   copy_nonfinite(stage, g), then memcpy to acc
 *   in place     copy_nonfinite(acc, g): "propagate" (the bound)
 * middle arrival (acc += g, more to come):
 *   check+add    add_finite(acc, g): scan, then add
 *   save+add     memcpy(save, acc), then add_nonfinite(acc, g) (restored on a refusal)
 *   in place     add_nonfinite(acc, g): "propagate" (the bound)
 *
 * Payloads: "warm", a 1 MB pool (L2/LLC-resident, as in pbox-bench-engine's warm column);
 * "cold", a pool of twice the LLC (from DRAM). Accumulators: 256 KB, cycled (a chunk
 * arena's working set). Payloads at offset 64 in a 64-byte-aligned slot (a datagram's
 * payload after its header); the stage and the second accumulator are offset by 1088
 * bytes from the accumulator's 4 KB alignment (same-offset buffers alias in the load/store
 * unit and cost up to 40 % more). Each cell is the median of `reps` interleaved
 * repetitions, each the best of 3 timed loops.
 *
 *   --sizes 8192,32768    fragment bytes
 *   --reps 7              interleaved repetitions
 *   --isa avx512          one kernel table (default: every one this CPU supports)
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "llc.h"

#define ACC_BYTES (256u << 10)
#define WARM_POOL (1u << 20)
#define NVAR      11
#define MAX_REPS  31

enum var {
	CHECK_SUM,
	STAGE_SUM,
	BESIDE,
	SAVE_SUM,
	INPLACE_SUM,
	CHECK_COPY,
	STAGE_COPY,
	INPLACE_COPY,
	CHECK_ADD,
	SAVE_ADD,
	INPLACE_ADD
};

static const char *const g_var_name[NVAR] = {
	"final: check+sum (today)",
	"final: stage+copy",
	"final: beside (2nd acc)",
	"final: save+sum (undo)",
	"final: in place (propagate)",
	"first: check+copy (today)",
	"first: stage+copy",
	"first: in place (propagate)",
	"middle: check+add (today)",
	"middle: save+add (undo)",
	"middle: in place (propagate)",
};

struct pool {
	uint8_t *base; /* npk slots of frag + 64 bytes; payload at +64 */
	size_t npk;
	uint32_t frag;
	float *acc, *alt, *stage, *save;
	void *mem[4];
};

static double thread_cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static float *offset_buf(size_t bytes, void **mem)
{
	*mem = aligned_alloc(4096, bytes + 8192);
	if (*mem == NULL) {
		perror("aligned_alloc");
		exit(1);
	}
	memset(*mem, 0, bytes + 8192);
	return (float *)(void *)((uint8_t *)*mem + 1088);
}

static void pool_init(struct pool *p, uint32_t frag, size_t bytes)
{
	size_t slot = (size_t)frag + 64;

	p->frag = frag;
	p->npk = bytes / slot + 1;
	p->base = aligned_alloc(64, p->npk * slot);
	if (p->base == NULL) {
		perror("aligned_alloc");
		exit(1);
	}
	for (size_t i = 0; i < p->npk; i++) {
		float *g = (float *)(void *)(p->base + i * slot + 64);

		for (uint32_t j = 0; j < frag / 4; j++) {
			g[j] = 1e-6f * (float)((j + i) % 977);
		}
	}
	p->acc = aligned_alloc(4096, ACC_BYTES);
	p->mem[0] = p->acc;
	for (uint32_t j = 0; j < ACC_BYTES / 4; j++) {
		p->acc[j] = 1.0f;
	}
	p->alt = offset_buf(ACC_BYTES, &p->mem[1]);
	p->stage = offset_buf(frag, &p->mem[2]);
	p->save = offset_buf(frag, &p->mem[3]);
}

static void pool_free(struct pool *p)
{
	free(p->base);
	for (int i = 0; i < 4; i++) {
		free(p->mem[i]);
	}
}

/* ns per fragment of variant v over the pool (best of 3 loops of ~64 MB each). */
static double run(const struct pbox_kernels *k, struct pool *p, enum var v)
{
	uint32_t n = p->frag / 4, nacc = ACC_BYTES / p->frag;
	size_t iters = (64u << 20) / p->frag, slot = (size_t)p->frag + 64, hits = 0;
	double best = 1e30;

	for (int rep = 0; rep < 3; rep++) {
		double t0 = thread_cpu_s(), dt;

		for (size_t it = 0; it < iters; it++) {
			const float *g =
				(const float *)(const void *)(p->base + (it % p->npk) * slot + 64);
			float *a = p->acc + (it % nacc) * n;
			const float *src[2] = { a, g };
			size_t c = 0;

			switch (v) {
			case CHECK_SUM:
				c = k->nonfinite(g, n);
				if (c == 0) {
					k->reduce(a, src, 2, n, 1.0f);
				}
				break;
			case STAGE_SUM:
				c = k->sum2_nonfinite(p->stage, a, g, n, 1.0f);
				if (c == 0) {
					memcpy(a, p->stage, p->frag);
				}
				break;
			case BESIDE:
				c = k->sum2_nonfinite(p->alt + (it % nacc) * n, a, g, n, 1.0f);
				break;
			case SAVE_SUM:
				memcpy(p->save, a, p->frag);
				c = k->sum2_nonfinite(a, a, g, n, 1.0f);
				if (c != 0) {
					memcpy(a, p->save, p->frag);
				}
				break;
			case INPLACE_SUM:
				c = k->sum2_nonfinite(a, a, g, n, 1.0f);
				break;
			case CHECK_COPY:
				c = k->nonfinite(g, n);
				if (c == 0) {
					memcpy(a, g, p->frag);
				}
				break;
			case STAGE_COPY:
				c = k->copy_nonfinite(p->stage, g, n);
				if (c == 0) {
					memcpy(a, p->stage, p->frag);
				}
				break;
			case INPLACE_COPY:
				c = k->copy_nonfinite(a, g, n);
				break;
			case CHECK_ADD:
				c = k->add_finite(a, g, n);
				break;
			case SAVE_ADD:
				memcpy(p->save, a, p->frag);
				c = k->add_nonfinite(a, g, n);
				if (c != 0) {
					memcpy(a, p->save, p->frag);
				}
				break;
			case INPLACE_ADD:
				c = k->add_nonfinite(a, g, n);
				break;
			}
			hits += c;
			__asm__ volatile("" ::: "memory");
		}
		dt = thread_cpu_s() - t0;
		if (dt / (double)iters * 1e9 < best) {
			best = dt / (double)iters * 1e9;
		}
	}
	if (hits != 0) {
		fprintf(stderr, "finite payloads counted %zu non-finite\n", hits);
		exit(1);
	}
	/* keep the accumulators from growing to Inf over many runs */
	for (uint32_t j = 0; j < ACC_BYTES / 4; j++) {
		p->acc[j] = 1.0f;
	}
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static unsigned parse_sizes(const char *arg, uint32_t *out, unsigned max)
{
	unsigned n = 0;
	char *end;

	while (*arg != '\0' && n < max) {
		unsigned long v = strtoul(arg, &end, 10);

		if (end == arg || v == 0 || v % 64 != 0 || v > 65536) {
			return 0;
		}
		out[n++] = (uint32_t)v;
		if (*end != ',' && *end != '\0') {
			return 0;
		}
		arg = *end == ',' ? end + 1 : end;
	}
	return n;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = { { "sizes", 1, NULL, 's' },
					      { "reps", 1, NULL, 'r' },
					      { "isa", 1, NULL, 'i' },
					      { "help", 0, NULL, 'h' },
					      { NULL, 0, NULL, 0 } };
	const struct pbox_kernels *isas[4];
	uint32_t sizes[8] = { 8192, 32768 };
	unsigned nsizes = 2, reps = 7, nisa = pbox_kernels_supported(isas, 4);
	uint64_t llc = pbox_bench_llc_bytes();
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 's' && (nsizes = parse_sizes(optarg, sizes, 8)) != 0) {
			continue;
		}
		if (c == 'r' && atoi(optarg) >= 1 && atoi(optarg) <= MAX_REPS) {
			reps = (unsigned)atoi(optarg);
			continue;
		}
		if (c == 'i' && (isas[0] = pbox_kernels_by_isa(optarg)) != NULL) {
			nisa = 1;
			continue;
		}
		fprintf(c == 'h' ? stdout : stderr,
			"Usage: pbox-bench-reject [--sizes 8192,32768 (multiples of 64, "
			"<= 65536)] [--reps 7 (1..31)] [--isa avx512|avx2|sse2|scalar]\n");
		return c == 'h' ? 0 : 2;
	}
	if (llc == 0) {
		llc = 64ull << 20;
	}
	printf("ns of thread CPU time per fragment, median of %u interleaved repetitions "
	       "(each the best of 3 loops); warm: payloads from a 1 MB pool, cold: from %llu "
	       "MB (2 x LLC); accumulators 256 KB.\n\n",
	       reps, (unsigned long long)(2 * llc >> 20));
	printf("| ISA | fragment | payloads | variant | ns | vs today's "
	       "|\n|---|---|---|---|---|---|\n");
	for (unsigned i = 0; i < nisa; i++) {
		for (unsigned si = 0; si < nsizes; si++) {
			for (int cold = 0; cold < 2; cold++) {
				struct pool p;
				double ns[NVAR][MAX_REPS], med[NVAR];

				pool_init(&p, sizes[si], cold ? 2 * llc : WARM_POOL);
				for (unsigned r = 0; r < reps; r++) {
					for (unsigned v = 0; v < NVAR; v++) {
						ns[v][r] = run(isas[i], &p, (enum var)v);
					}
				}
				for (unsigned v = 0; v < NVAR; v++) {
					qsort(ns[v], reps, sizeof(double), cmp_double);
					med[v] = ns[v][reps / 2];
				}
				for (unsigned v = 0; v < NVAR; v++) {
					double base = med[v < CHECK_COPY  ? CHECK_SUM
							  : v < CHECK_ADD ? CHECK_COPY
									  : CHECK_ADD];

					printf("| %s | %u KB | %s | %s | %.0f | %.2f |\n",
					       isas[i]->isa, sizes[si] / 1024,
					       cold ? "cold" : "warm", g_var_name[v], med[v],
					       med[v] / base);
				}
				fflush(stdout);
				pool_free(&p);
			}
		}
	}
	return 0;
}
