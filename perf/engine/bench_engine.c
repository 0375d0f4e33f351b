/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-engine: the chunk engine alone, fed pre-built datagrams in a loop on one
 * thread (no transport, no kernel; replies are counted and dropped), beside the add kernel
 * on the same machine in the same run. Reports segments/s and GB/s of gradient aggregated
 * for 1, 4 and 8 KB segments and 2..8 workers, and the ratio to the in-cache add
 * bandwidth (counted as gradient bytes added per second, the same measure).
 *
 * Where the payloads live: "warm", one iteration's datagrams (workers x 256 KB) re-sent
 * every round, so they stay in L2/LLC; "cold", as many copies of them as span twice the
 * last-level cache (sysfs), cycled through, so every payload comes from DRAM as a NIC's
 * would once the LLC has turned over. Both are measured in the same run.
 *
 * Besides wall-clock GB/s (best of five), GB per CPU-second of the thread (best of five):
 * on a shared machine the wall clock also counts time the scheduler gave to others.
 *
 *   --sizes 1024,4096,8192   segment (fragment) payload bytes, up to 32768 (one fragment
 *                            per chunk: shm and loopback at MTU 65535)
 *   --workers 2,4,8          workers
 *   --non-finite reject      the job's policy (reject, the default, or propagate)
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/xport.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "llc.h"
#include "null_tx.h"

static double thread_cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static enum pbox_non_finite g_non_finite = PBOX_NON_FINITE_REJECT;

/* GB/s of gradient added by the add kernel on an in-cache pair of frag-sized buffers. */
static double add_gbs(uint32_t frag)
{
	const struct pbox_kernels *k = pbox_kernels_get();
	uint32_t n = frag / 4;
	float *a = aligned_alloc(64, frag), *b = aligned_alloc(64, frag);
	double best = 0;

	for (uint32_t i = 0; i < n; i++) {
		a[i] = 1.0f;
		b[i] = 1e-9f;
	}
	for (int rep = 0; rep < 5; rep++) {
		uint64_t iters = 200000000ull / frag;
		double t0 = pbox_mono_s(), dt;

		for (uint64_t i = 0; i < iters; i++) {
			k->add(a, b, n);
			__asm__ volatile("" ::: "memory");
		}
		dt = pbox_mono_s() - t0;
		if ((double)iters * frag / dt / 1e9 > best) {
			best = (double)iters * frag / dt / 1e9;
		}
	}
	free(a);
	free(b);
	return best;
}

/* GB/s of the add kernel on the engine's own working set: each of nw workers' segments of
 * an 8-chunk (256 KB) model added into its chunk's accumulator, from a pool of packets as
 * large as the engine's (nw x 256 KB): the arithmetic the engine cannot avoid. */
static double add_ws_gbs(uint32_t nw, uint32_t frag)
{
	const struct pbox_kernels *k = pbox_kernels_get();
	size_t model = 8 * 32768, npk = nw * model / frag;
	float *acc = aligned_alloc(64, model);
	uint8_t *pool = aligned_alloc(64, npk * (frag + 64));
	double best = 0;

	memset(acc, 0, model);
	memset(pool, 0, npk * (frag + 64));
	for (int rep = 0; rep < 5; rep++) {
		uint64_t rounds = 400000000ull / (npk * frag) + 1;
		double t0 = pbox_mono_s(), dt;

		for (uint64_t r = 0; r < rounds; r++) {
			for (size_t i = 0; i < npk; i++) {
				size_t seg =
					i / nw; /* workers' copies of a segment arrive together */

				k->add(acc + seg * frag / 4 % (model / 4),
				       (const float *)(pool + i * (frag + 64) + 64), frag / 4);
			}
			__asm__ volatile("" ::: "memory");
		}
		dt = pbox_mono_s() - t0;
		if ((double)rounds * npk * frag / dt / 1e9 > best) {
			best = (double)rounds * npk * frag / dt / 1e9;
		}
	}
	free(acc);
	free(pool);
	return best;
}

/* Segments per second through pbox_engine_rx for an aggregate job, the datagrams cycled
 * through nsets copies of one iteration's. */
static double engine_segs(uint32_t nw, uint32_t frag, uint32_t nsets, double *gbs, double *gb_cpu)
{
	struct pbox_keyspec key = { 1, 32768 / 4 * 8 }; /* 8 chunks of 32 KB */
	struct pbox_jobdesc d;
	struct pbox_job job = { 0 };
	struct pbox_jobtab *tab;
	struct pbox_core_stats st = { 0 };
	struct pbox_engine e = { .core = 0, .tx = &pbox_bench_null_tx, .stats = &st };
	uint64_t cookies[64], live = nw == 64 ? ~0ull : (1ull << nw) - 1;
	uint8_t **pkts;
	uint32_t npk = 0, nfr = 32768 / frag, t = 0, per_set;
	char err[128];
	double best = 0, best_cpu = 0;

	e.kern = pbox_kernels_get();
	if (pbox_jobdesc_build(&d, &key, 1, nw, 1, 32768, frag, NULL, err, sizeof(err)) != 0) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	for (uint32_t r = 0; r < nw; r++) {
		cookies[r] = 100 + r;
	}
	job.wire.id = 1;
	job.wire.desc = &d;
	job.wire.cookies = cookies;
	job.mode = PBOX_MODE_AGGREGATE;
	job.reduce = PBOX_REDUCE_SUM;
	job.non_finite = g_non_finite;
	job.window = 2;
	job.sync = pbox_sync_ops(PBOX_SYNC_BSP);
	job.credits = 1;
	job.live = &live;
	job.nlive = nw;
	job.generation = 1;
	job.state = pbox_job_state_create(&job);
	tab = calloc(1, sizeof(*tab) + sizeof(tab->jobs[0]));
	tab->njobs = 1;
	tab->jobs[0] = &job;
	/* One iteration's datagrams: every worker, every fragment of every chunk, in the
	 * order they would arrive from workers pushing concurrently. */
	pkts = calloc((size_t)nw * d.nchunks * nfr * nsets, sizeof(*pkts));
	for (uint32_t set = 0; set < nsets; set++) {
		for (uint32_t c = 0; c < d.nchunks; c++) {
			for (uint32_t f = 0; f < nfr; f++) {
				for (uint32_t r = 0; r < nw; r++) {
					struct pbox_msg m = {
						.type = PBOX_MSG_PUSH,
						.encoding = PBOX_ENC_F32,
						.job = 1,
						.sender = r,
						.cookie = cookies[r],
						.chunk = c,
						.frag_off = f * frag,
						.frag_len = frag,
						.chunk_len = 32768,
					};
					uint8_t *p = aligned_alloc(64, PBOX_WIRE_HDR_LEN + frag);

					pbox_wire_encode(&m, (struct pbox_wire_hdr *)p);
					for (uint32_t i = 0; i < frag / 4; i++) {
						((float *)(p + PBOX_WIRE_HDR_LEN))[i] =
							1e-6f * (float)(i + r);
					}
					pkts[npk++] = p;
				}
			}
		}
	}
	per_set = npk / nsets;
	for (int rep = 0; rep < 5; rep++) {
		uint32_t iters = (uint32_t)(400000000ull / ((uint64_t)per_set * frag)) + 1;
		double t0 = pbox_mono_s(), c0 = thread_cpu_s(), dt, dc;
		struct pbox_peer from = { .ip = htonl(0x7f000001), .port = htons(9) };

		for (uint32_t it = 0; it < iters; it++) {
			uint8_t **set = pkts + (size_t)(t % nsets) * per_set;

			for (uint32_t i = 0; i < per_set; i++) {
				/* the iteration field changes every round */
				((struct pbox_wire_hdr *)set[i])->iter = htonl(t);
			}
			for (uint32_t i = 0; i < per_set; i++) {
				/* As a receive loop does: the next header is fetched while this
				 * datagram is handled. */
				if (i + 1 < per_set) {
					__builtin_prefetch(set[i + 1]);
				}
				pbox_engine_rx(&e, tab, set[i], PBOX_WIRE_HDR_LEN + frag, &from);
			}
			t++;
		}
		dt = pbox_mono_s() - t0;
		dc = thread_cpu_s() - c0;
		if ((double)iters * per_set / dt > best) {
			best = (double)iters * per_set / dt;
		}
		if ((double)iters * per_set / dc > best_cpu) {
			best_cpu = (double)iters * per_set / dc;
		}
	}
	for (int r = 1; r < PBOX_DROP_COUNT; r++) {
		if (st.drops[r] != 0) {
			fprintf(stderr, "engine dropped %llu datagrams (%s)\n",
				(unsigned long long)st.drops[r], pbox_drop_reason_name(r));
			exit(1);
		}
	}
	if (st.iterations != (uint64_t)t * d.nchunks) {
		fprintf(stderr, "engine completed %llu chunk iterations, expected %llu\n",
			(unsigned long long)st.iterations, (unsigned long long)t * d.nchunks);
		exit(1);
	}
	*gbs = best * frag / 1e9;
	*gb_cpu = best_cpu * frag / 1e9;
	for (uint32_t i = 0; i < npk; i++) {
		free(pkts[i]);
	}
	free(pkts);
	free(tab);
	pbox_job_state_free(job.state);
	pbox_jobdesc_free(&d);
	return best;
}

static unsigned parse_list(const char *arg, uint32_t *out, unsigned max)
{
	unsigned n = 0;
	char *end;

	while (*arg != '\0' && n < max) {
		unsigned long v = strtoul(arg, &end, 10);

		if (end == arg || v == 0 || v > 1u << 20) {
			return 0;
		}
		out[n++] = (uint32_t)v;
		arg = *end == ',' ? end + 1 : end;
		if (*end != ',' && *end != '\0') {
			return 0;
		}
	}
	return n;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = { { "sizes", 1, NULL, 's' },
					      { "workers", 1, NULL, 'w' },
					      { "non-finite", 1, NULL, 'n' },
					      { "help", 0, NULL, 'h' },
					      { NULL, 0, NULL, 0 } };
	uint32_t sizes[8] = { 1024, 4096, 8192 }, workers[8] = { 2, 4, 8 };
	unsigned nsizes = 3, nworkers = 3;
	uint64_t llc = pbox_bench_llc_bytes();
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 's' && (nsizes = parse_list(optarg, sizes, 8)) != 0) {
			continue;
		}
		if (c == 'w' && (nworkers = parse_list(optarg, workers, 8)) != 0) {
			continue;
		}
		if (c == 'n' &&
		    (strcmp(optarg, "reject") == 0 || strcmp(optarg, "propagate") == 0)) {
			g_non_finite = optarg[0] == 'r' ? PBOX_NON_FINITE_REJECT
							: PBOX_NON_FINITE_PROPAGATE;
			continue;
		}
		fprintf(c == 'h' ? stdout : stderr,
			"Usage: pbox-bench-engine [--sizes 1024,4096,8192] "
			"[--workers 2,4,8 (2..64)] [--non-finite reject|propagate]\n"
			"sizes: multiples of 4 dividing 32768 (the chunk)\n");
		return c == 'h' ? 0 : 2;
	}
	for (unsigned i = 0; i < nsizes; i++) {
		if (sizes[i] % 4 != 0 || 32768 % sizes[i] != 0) {
			fprintf(stderr, "--sizes: %u does not divide the 32 KB chunk\n", sizes[i]);
			return 2;
		}
	}
	for (unsigned i = 0; i < nworkers; i++) {
		if (workers[i] < 2 || workers[i] > 64) {
			fprintf(stderr, "--workers: %u not in 2..64\n", workers[i]);
			return 2;
		}
	}
	if (llc == 0) {
		llc = 64ull << 20; /* unknown: assume a large one */
	}
	printf("LLC %llu KB (sysfs). warm: one iteration's datagrams re-sent (cache-resident); "
	       "cold: cycled through >= 2 x LLC of copies (from DRAM). non_finite = %s.\n\n",
	       (unsigned long long)(llc >> 10),
	       g_non_finite == PBOX_NON_FINITE_REJECT ? "reject" : "propagate");
	printf("| segment | add in cache GB/s | workers | add on the engine's working set GB/s | "
	       "segments/s warm | GB/s warm | vs in-cache add | vs working-set add | "
	       "GB/s cold | cold vs in-cache add | GB/CPU-s warm | GB/CPU-s cold |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (unsigned si = 0; si < nsizes; si++) {
		uint32_t frag = sizes[si];
		double add = add_gbs(frag);

		for (unsigned wi = 0; wi < nworkers; wi++) {
			uint32_t nw = workers[wi];
			uint64_t set_bytes = (uint64_t)nw * 8 * 32768;
			uint32_t cold_sets = (uint32_t)((2 * llc + set_bytes - 1) / set_bytes);
			double gbs, cpu, cold, cold_cpu, sps = engine_segs(nw, frag, 1, &gbs, &cpu),
							 ws = add_ws_gbs(nw, frag);

			engine_segs(nw, frag, cold_sets, &cold, &cold_cpu);
			printf("| %u KB | %.1f | %u | %.1f | %.0f | %.2f | %.2f | %.2f | %.2f | "
			       "%.2f | %.2f | %.2f |\n",
			       frag / 1024, add, nw, ws, sps, gbs, gbs / add, gbs / ws, cold,
			       cold / add, cpu, cold_cpu);
			fflush(stdout);
		}
	}
	return 0;
}
