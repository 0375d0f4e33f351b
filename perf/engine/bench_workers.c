/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-workers: how the chunk engine's cost per fragment grows with the number of
 * workers (2 .. 1,024, pboxd's limit), and what the non-finite check costs.
 *
 * Workers table: one aggregate job (BSP, sum, push-pull: every contribution asks for the
 * result), one 32 KB chunk of 1 KB fragments, one core, pre-built datagrams fed to
 * pbox_engine_rx in arrival order (fragment-major, every worker's copy of a fragment
 * together), replies built and dropped by a null transport. ns per fragment = time /
 * datagrams received, so everything an iteration does (opening the slot, the final reduce,
 * the n x 32 result datagrams) is charged to the n x 32 pushes that caused it. Best of 5
 * runs of at least 2^20 datagrams; "sum" adds as fragments arrive, "deterministic" stages
 * every worker's copy and sums in rank order.
 *
 * Non-finite table: the add kernel alone against the scan + add the engine now does for
 * each fragment (kernels.h nonfinite), per ISA, on in-cache fragment-sized buffers; and the
 * engine itself (8 workers) with its real kernel table against the same table whose scan
 * returns 0 and whose fused ingest kernels (copy / add with the count) only copy / add
 * (no check at all), side by side in one run.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/bitmap.h"
#include "common/clock.h"
#include "common/xport.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "null_tx.h"

#define CHUNK 32768u

/* A job with nw workers and one iteration's datagrams, fed to the engine on demand. */
struct bjob {
	struct pbox_jobdesc d;
	struct pbox_job job;
	struct pbox_jobtab *tab;
	struct pbox_core_stats st;
	struct pbox_engine e;
	uint64_t *cookies;
	uint64_t live[PBOX_MAX_WORKERS / 64];
	struct pbox_peer *from;
	uint8_t **pkts;
	uint32_t nw, frag, npk, t;
};

static void bjob_init(struct bjob *b, uint32_t nw, uint32_t frag, bool det)
{
	struct pbox_keyspec key = { 1, CHUNK / 4 };
	uint32_t nfr = CHUNK / frag;
	char err[128];

	memset(b, 0, sizeof(*b));
	b->nw = nw;
	b->frag = frag;
	b->e = (struct pbox_engine){ .core = 0, .tx = &pbox_bench_null_tx, .stats = &b->st };
	b->cookies = calloc(nw, sizeof(*b->cookies));
	b->from = calloc(nw, sizeof(*b->from));
	if (pbox_jobdesc_build(&b->d, &key, 1, nw, 1, CHUNK, frag, NULL, err, sizeof(err)) != 0) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	for (uint32_t r = 0; r < nw; r++) {
		b->cookies[r] = 100 + r;
		pbox_bit_set(b->live, r);
		b->from[r].ip = htonl(0x0a000000u + r);
		b->from[r].port = htons(7000);
	}
	b->job.wire.id = 1;
	b->job.wire.desc = &b->d;
	b->job.wire.cookies = b->cookies;
	b->job.mode = PBOX_MODE_AGGREGATE;
	b->job.reduce = PBOX_REDUCE_SUM;
	b->job.deterministic = det;
	b->job.window = 2;
	b->job.sync = pbox_sync_ops(PBOX_SYNC_BSP);
	b->job.credits = 1;
	b->job.live = b->live;
	b->job.nlive = nw;
	b->job.generation = 1;
	b->job.state = pbox_job_state_create(&b->job);
	if (b->job.state == NULL) {
		exit(1);
	}
	b->tab = calloc(1, sizeof(*b->tab) + sizeof(b->tab->jobs[0]));
	b->tab->njobs = 1;
	b->tab->jobs[0] = &b->job;
	b->pkts = calloc((size_t)nw * nfr, sizeof(*b->pkts));
	for (uint32_t f = 0; f < nfr; f++) {
		for (uint32_t r = 0; r < nw; r++) {
			struct pbox_msg m = {
				.type = PBOX_MSG_PUSH,
				.encoding = PBOX_ENC_F32,
				.flags = PBOX_F_WANT_REPLY,
				.job = 1,
				.sender = r,
				.cookie = b->cookies[r],
				.chunk = 0,
				.frag_off = f * frag,
				.frag_len = frag,
				.chunk_len = CHUNK,
			};
			uint8_t *p = aligned_alloc(64, PBOX_WIRE_HDR_LEN + frag);

			pbox_wire_encode(&m, (struct pbox_wire_hdr *)p);
			for (uint32_t i = 0; i < frag / 4; i++) {
				((float *)(p + PBOX_WIRE_HDR_LEN))[i] = 1e-6f * (float)(i + r);
			}
			b->pkts[b->npk++] = p;
		}
	}
}

/* ns per datagram of whole iterations, at least `min` datagrams, with kernel table k. */
static double bjob_run(struct bjob *b, const struct pbox_kernels *k, uint32_t min)
{
	uint32_t iters = min / b->npk + 1;
	double t0 = pbox_mono_s();

	b->e.kern = k;
	for (uint32_t it = 0; it < iters; it++) {
		for (uint32_t i = 0; i < b->npk; i++) {
			((struct pbox_wire_hdr *)b->pkts[i])->iter = htonl(b->t);
		}
		for (uint32_t i = 0; i < b->npk; i++) {
			if (i + 1 < b->npk) {
				__builtin_prefetch(b->pkts[i + 1]);
			}
			pbox_engine_rx(&b->e, b->tab, b->pkts[i], PBOX_WIRE_HDR_LEN + b->frag,
				       &b->from[i % b->nw]);
		}
		b->t++;
	}
	return (pbox_mono_s() - t0) * 1e9 / ((double)iters * b->npk);
}

static void bjob_fini(struct bjob *b)
{
	for (int r = 1; r < PBOX_DROP_COUNT; r++) {
		if (b->st.drops[r] != 0) {
			fprintf(stderr, "engine dropped %llu datagrams (%s)\n",
				(unsigned long long)b->st.drops[r], pbox_drop_reason_name(r));
			exit(1);
		}
	}
	if (b->st.iterations != b->t) {
		fprintf(stderr, "engine completed %llu iterations, expected %u\n",
			(unsigned long long)b->st.iterations, b->t);
		exit(1);
	}
	for (uint32_t i = 0; i < b->npk; i++) {
		free(b->pkts[i]);
	}
	free(b->pkts);
	free(b->tab);
	free(b->from);
	free(b->cookies);
	pbox_job_state_free(b->job.state);
	pbox_jobdesc_free(&b->d);
}

/* In-cache fragment buffers for the kernel comparison. */
struct kbuf {
	float *a, *b;
	uint32_t n;
};

/* ns per call of add (scan = false) or scan + add (scan = true), one sample of ~10 ms. */
static double kernel_ns(const struct pbox_kernels *k, const struct kbuf *kb, bool scan)
{
	const float *g = kb->b + 1; /* payloads follow a 64-byte header: not 64-byte aligned */
	uint64_t iters = 2500000ull / kb->n;
	size_t found = 0;
	double t0 = pbox_mono_s();

	for (uint64_t i = 0; i < iters; i++) {
		if (scan) {
			found += k->nonfinite(g, kb->n);
		}
		k->add(kb->a, g, kb->n);
		__asm__ volatile("" ::: "memory");
	}
	if (found != 0) {
		fprintf(stderr, "scan found %zu non-finite values in finite data\n", found);
		exit(1);
	}
	return (pbox_mono_s() - t0) * 1e9 / (double)iters;
}

#define REPS 31

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median of n values (sorts them). */
static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

static size_t no_scan(const float *g, size_t n)
{
	(void)g;
	(void)n;
	return 0;
}

/* The fused ingest kernels without their check: the plain copy / add, counting nothing. */
static const struct pbox_kernels *g_plain;

static size_t no_scan_copy(float *dst, const float *g, size_t n)
{
	memcpy(dst, g, n * sizeof(float));
	return 0;
}

static size_t no_scan_add(float *acc, const float *g, size_t n)
{
	g_plain->add(acc, g, n);
	return 0;
}

static size_t no_scan_sum2(float *out, const float *acc, const float *g, size_t n, float div)
{
	const float *src[2] = { acc, g };

	g_plain->reduce(out, src, 2, n, div);
	return 0;
}

int main(int argc, char **argv)
{
	uint32_t workers[16] = { 2, 8, 64, 256, 1024 };
	unsigned nworkers = 5;
	const struct pbox_kernels *isas[4], *k = pbox_kernels_get();
	unsigned nisa = pbox_kernels_supported(isas, 4);
	struct pbox_kernels no_scan_kernels = *k;

	if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		printf("usage: pbox-bench-workers [WORKERS...]\n"
		       "The engine's cost per fragment against the number of workers (2..%u);\n"
		       "with WORKERS, that table only, for those counts.\n",
		       (unsigned)PBOX_MAX_WORKERS);
		return 0;
	}
	if (argc > 1) {
		/* pbox-bench-workers N...: the workers table only, for these counts */
		nworkers = 0;
		for (int i = 1; i < argc && nworkers < PBOX_ARRAY_SIZE(workers); i++) {
			if (pbox_arg_u32("pbox-bench-workers", "WORKERS", argv[i], 2,
					 PBOX_MAX_WORKERS, &workers[nworkers]) != 0) {
				fprintf(stderr, "usage: pbox-bench-workers [WORKERS...]\n");
				return 2;
			}
			nworkers++;
		}
	}

	printf("Engine cost per fragment vs workers (1 KB fragments, one 32 KB chunk, push-pull, "
	       "%s kernels; best of 5 runs of >= 2^20 datagrams)\n\n",
	       k->isa);
	printf("| workers | sum: ns/fragment | deterministic: ns/fragment |\n|---|---|---|\n");
	for (unsigned i = 0; i < nworkers; i++) {
		struct bjob s, d;
		double bs = 1e30, bd = 1e30;

		bjob_init(&s, workers[i], 1024, false);
		bjob_init(&d, workers[i], 1024, true);
		for (int rep = 0; rep < 5; rep++) {
			bs = PBOX_MIN(bs, bjob_run(&s, k, 1u << 20));
			bd = PBOX_MIN(bd, bjob_run(&d, k, 1u << 20));
		}
		bjob_fini(&s);
		bjob_fini(&d);
		printf("| %u | %.1f | %.1f |\n", workers[i], bs, bd);
		fflush(stdout);
	}

	if (argc > 1) {
		return 0;
	}
	printf("\nNon-finite check: add kernel alone vs scan + add on in-cache fragments (ns per "
	       "fragment; best of %d alternating pairs)\n\n",
	       REPS);
	printf("| ISA | fragment | add | scan + add | ratio of the bests | median ratio of pairs "
	       "|\n|---|---|---|---|---|---|\n");
	for (unsigned i = 0; i < nisa; i++) {
		for (uint32_t frag = 1024; frag <= 8192; frag *= 8) {
			struct kbuf kb = { aligned_alloc(64, frag), aligned_alloc(64, frag + 64),
					   frag / 4 };
			double a = 1e30, b = 1e30;

			for (uint32_t j = 0; j < kb.n; j++) {
				kb.a[j] = 1.0f;
				kb.b[j + 1] = 1e-9f;
			}
			double ratio[REPS];

			for (int rep = 0; rep < REPS; rep++) {
				double x = kernel_ns(isas[i], &kb, false);
				double y = kernel_ns(isas[i], &kb, true);

				a = PBOX_MIN(a, x);
				b = PBOX_MIN(b, y);
				ratio[rep] = y / x;
			}
			free(kb.a);
			free(kb.b);
			printf("| %s | %u B | %.1f | %.1f | %.2f | %.2f |\n", isas[i]->isa, frag, a,
			       b, b / a, median(ratio, REPS));
			fflush(stdout);
		}
	}

	g_plain = k;
	no_scan_kernels.nonfinite = no_scan;
	no_scan_kernels.copy_nonfinite = no_scan_copy;
	no_scan_kernels.add_nonfinite = no_scan_add;
	no_scan_kernels.add_finite = no_scan_add;
	no_scan_kernels.sum2_nonfinite = no_scan_sum2;
	printf("\nNon-finite check in the engine: 8 workers, sum, %s kernels (ns per fragment; "
	       "best of %d alternating pairs)\n\n",
	       k->isa, REPS);
	printf("| fragment | without scan | with scan | ratio of the bests | median ratio of "
	       "pairs |\n|---|---|---|---|---|\n");
	for (uint32_t frag = 1024; frag <= 8192; frag *= 8) {
		struct bjob b;
		double without = 1e30, with = 1e30;

		bjob_init(&b, 8, frag, false);
		double ratio[REPS];

		for (int rep = 0; rep < REPS; rep++) {
			double x = bjob_run(&b, &no_scan_kernels, 1u << 17);
			double y = bjob_run(&b, k, 1u << 17);

			without = PBOX_MIN(without, x);
			with = PBOX_MIN(with, y);
			ratio[rep] = y / x;
		}
		bjob_fini(&b);
		printf("| %u B | %.1f | %.1f | %.2f | %.2f |\n", frag, without, with,
		       with / without, median(ratio, REPS));
		fflush(stdout);
	}
	return 0;
}
