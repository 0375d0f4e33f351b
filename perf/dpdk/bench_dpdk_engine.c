/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-dpdk-engine: throughput of one DPDK data-plane lcore with an in-process packet
 * feed (net_ring, no kernel), next to the add kernel's bandwidth measured in the same run.
 *
 * The lcore under test runs the real loop of dataplane/transport/dpdk (RX burst, L2/L3 parsing, the
 * engine aggregating straight from the mbufs, zero-copy replies, TX burst) pinned to one
 * CPU; the feeder runs on the EAL main lcore on another CPU. The feeder's frames are built
 * once (three sets, one per iteration in flight plus one being refilled) and re-sent with
 * their reference count raised, so the feed costs a ring enqueue per frame, not a copy.
 * Every frame is a fused push-pull (WANT_REPLY): the lcore also sends the result to every
 * worker, and the feeder consumes and frees those replies (releasing their payload).
 *
 * Reported per configuration: gradient segments aggregated per second and GB/s of gradient
 * payload, over wall time and per busy second of the lcore (its capacity, should the feed
 * be the limit), and the ratio of the latter to the in-cache add bandwidth (kernels' add
 * of one segment into an accumulator, both in L1/L2).
 *
 *   --sizes 1024,4096,8192   segment (fragment) payload bytes
 *   --workers 2,4,8          workers
 *   --chunk 32768            chunk bytes (--sweep: a list, for the chunk-size sweep)
 *   --model 262144           model bytes
 *   --seconds 2              measurement time per configuration
 *   --cold                   cycle the feed through at least twice the LLC (sysfs), so
 *                            payloads are not cache-resident when they arrive
 *   --non-finite reject      the job's policy: reject (the default) or propagate
 *
 * GB/cpu-s is the capacity per second the lcore's thread actually ran (/proc schedstat)
 * times its busy share less its waits for the feeder to free replies (reclaim_cycles; a
 * NIC completes them by itself): on a shared machine, the busy TSC time also counts the
 * time other processes had the CPU. ratio_cpu is that over the in-cache add. eng_GB/s is the engine
 * alone on the same frames and job state (pbox_engine_rx on each frame's datagram in
 * place, null transmitter, per CPU-second of the main thread), measured just before the
 * lcore runs: the ceiling of the packet path; eng_ratio that over the in-cache add.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_udp.h>
#include <urcu-qsbr.h>

#include "common/log.h"
#include "common/numlist.h"
#include "transport/dpdk/dpdk.h"
#include "frame.h"
#include "kernels/kernels.h"
#include "llc.h"
#include "null_tx.h"
#include "sim.h"

#define BASE_PORT 7100
#define RING_SZ   65536
#define NSETS     3 /* the fewest: two iterations in flight, one being re-labelled */
#define MAX_SETS  4096

struct conf {
	unsigned sizes[8], nsizes;
	unsigned workers[8], nworkers;
	unsigned chunks[16], nchunks;
	unsigned model;
	double seconds;
	bool cold;
};

static unsigned g_seq;
static enum pbox_non_finite g_non_finite = PBOX_NON_FINITE_REJECT;

static int parse_list(const char *s, unsigned *out, unsigned max, unsigned lo, unsigned hi)
{
	uint64_t v[16];
	int n = pbox_parse_u64_list(s, v, max < 16 ? max : 16, lo, hi);

	for (int i = 0; i < n; i++)
		out[i] = (unsigned)v[i];
	return n;
}

struct result {
	double seg_s, gbs, seg_busy_s, gbs_busy, busy, gbs_cpu;
	uint64_t feed_bytes; /* gradient payload bytes the feed cycles through */
	double engine_gbs;   /* the engine alone on the same frames, GB per CPU-second */
	uint64_t reclaim_waits;
};

/* Nanoseconds the data-plane lcore's thread has run on a CPU (/proc schedstat: excludes
 * the time other processes had its CPU, which the TSC-based busy time includes). 0 if it
 * cannot be read. */
static uint64_t lcore_oncpu_ns(void)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *de;
	uint64_t ns = 0;

	while (dir != NULL && (de = readdir(dir)) != NULL) {
		char path[300], comm[64] = "";
		FILE *f;

		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
		f = fopen(path, "r");
		if (f == NULL) {
			continue;
		}
		if (fgets(comm, sizeof(comm), f) == NULL) {
			comm[0] = 0;
		}
		fclose(f);
		if (strncmp(comm, "rte-worker-", 11) != 0) {
			continue;
		}
		snprintf(path, sizeof(path), "/proc/self/task/%s/schedstat", de->d_name);
		f = fopen(path, "r");
		if (f != NULL) {
			unsigned long long v;

			if (fscanf(f, "%llu", &v) == 1) {
				ns = v;
			}
			fclose(f);
		}
		break;
	}
	if (dir != NULL) {
		closedir(dir);
	}
	return ns;
}

/* Consume (free) the replies, as a NIC completing them would. */
static void drain(struct rte_ring *tx)
{
	void *m[64];
	unsigned n;

	while ((n = rte_ring_sc_dequeue_burst(tx, m, 64, NULL)) != 0) {
		rte_pktmbuf_free_bulk((struct rte_mbuf **)m, n);
	}
}

static double thread_cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * The engine alone on the feed's frames, on this thread, before the lcore runs: the
 * same job state, frames, payload placement and iteration pattern, with no packet I/O
 * (each frame's pbox datagram handed to pbox_engine_rx in place, replies to a null
 * transmitter). The ceiling the DPDK path adds its cost to. Runs iterations 0.. for
 * `seconds` after a warm-up; *gbs: the gradient GB aggregated per second this thread was
 * on a CPU.
 */
static void engine_alone(const struct pbox_jobtab *tab, struct rte_mbuf **frames, uint32_t per_iter,
			 uint32_t nsets, double seconds, double *gbs)
{
	struct pbox_core_stats est;
	struct pbox_engine e = { .core = 0, .tx = &pbox_bench_null_tx, .stats = &est };
	uint32_t warm = PBOX_MAX(20u, nsets), t;
	uint64_t t0 = 0, bytes0 = 0;
	double cpu0 = 0;

	memset(&est, 0, sizeof(est));
	e.kern = pbox_kernels_get();
	for (t = 0;; t++) {
		struct rte_mbuf **set = frames + (size_t)(t % nsets) * per_iter;

		if (t == warm) {
			t0 = rte_rdtsc();
			cpu0 = thread_cpu_s();
			bytes0 = est.agg_bytes;
		}
		if (t > warm && (double)(rte_rdtsc() - t0) / (double)rte_get_tsc_hz() >= seconds) {
			break;
		}
		for (uint32_t i = 0; i < per_iter; i++) {
			const uint8_t *f = rte_pktmbuf_mtod(set[i], const uint8_t *);
			const struct rte_ipv4_hdr *ip = (const struct rte_ipv4_hdr *)(f + 14);
			const struct rte_udp_hdr *udp = (const struct rte_udp_hdr *)(ip + 1);
			struct pbox_wire_hdr *h =
				rte_pktmbuf_mtod_offset(set[i], struct pbox_wire_hdr *, FRAME_HDRS);
			/* The source as the DPDK receive path reports it (the engine pins it). */
			struct pbox_peer from = { .ip = ip->src_addr, .port = udp->src_port };

			memcpy(from.mac, f + 6, sizeof(from.mac));
			h->iter = htonl(t);
			if (i + 1 < per_iter) {
				rte_prefetch0(rte_pktmbuf_mtod(set[i + 1], void *));
			}
			pbox_engine_rx(&e, tab, h, set[i]->data_len - FRAME_HDRS, &from);
		}
	}
	for (unsigned k = 1; k < PBOX_DROP_COUNT; k++) {
		if (est.drops[k] != 0) {
			fprintf(stderr, "bench: the engine alone dropped %llu datagrams (%s)\n",
				(unsigned long long)est.drops[k],
				pbox_drop_reason_name((enum pbox_drop_reason)k));
		}
	}
	*gbs = (double)(est.agg_bytes - bytes0) / (thread_cpu_s() - cpu0) / 1e9;
}

static int run_one(unsigned seg, unsigned nw, unsigned chunk, unsigned model, double seconds,
		   bool cold, struct result *res)
{
	struct pbox_keyspec key = { 1, model / 4 };
	struct sim_job_cfg jc = {
		.nranks = nw,
		.ncores = 1,
		.keys = &key,
		.nkeys = 1,
		.chunk_bytes = chunk,
		.frag_bytes = seg,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
		.non_finite = g_non_finite,
	};
	struct pbox_dpdk_cfg cfg = {
		.ncores = 1,
		.base_port = BASE_PORT,
		.naddrs = 1,
		.mtu = 9000,
		.burst = 32,
		.rx_desc = 1024,
		.tx_desc = 4096,
		.mbuf_bytes = 2048,
		.tx_drain_us = 20,
		.busy_poll = true,
		.steering = PBOX_DPDK_STEER_AUTO,
		.zero_copy = true,
	};
	struct pbox_core_stats st;
	struct pbox_core_stats *stp = &st;
	struct rte_ring *rx, *tx;
	struct pbox_jobtab *tab;
	struct pbox_dpdk *d;
	struct sim s;
	struct rte_mbuf **frames;
	uint32_t nframes = 0, per_iter, nfrags_total = 0, nsets = NSETS, t_lcore, warm;
	uint64_t t0, t1, busy0, idle0, frags0, bytes0, cpu0 = 0, wait0_cycles = 0;
	uint8_t *buf = malloc(16384);
	float *g = malloc(16384);
	struct rte_mempool *pool;
	char name[64];
	int id, rc = 0;

	memset(&st, 0, sizeof(st));
	if (sim_init(&s, &jc) != 0) {
		return -EINVAL;
	}
	for (uint32_t c = 0; c < s.desc.nchunks; c++) {
		nfrags_total += s.desc.chunks[c].nfrags;
	}
	per_iter = nfrags_total * nw;
	{
		uint64_t set_bytes = (uint64_t)per_iter * (seg + 128 + RTE_PKTMBUF_HEADROOM);
		uint64_t llc = pbox_bench_llc_bytes() != 0 ? pbox_bench_llc_bytes() : (64ull << 20);

		if (cold) {
			/* Not cache-resident: enough sets that the frames span twice the LLC,
			 * so each frame's payload has left the cache before it is sent again. */
			nsets = (uint32_t)PBOX_MAX((2 * llc + set_bytes - 1) / set_bytes, NSETS);
		} else {
			/* Cache-resident: at most a quarter of the LLC, at most 16 sets. */
			nsets = (uint32_t)PBOX_MAX(PBOX_MIN(llc / 4 / set_bytes, 16), NSETS);
		}
		nsets = PBOX_MIN(nsets, MAX_SETS);
	}
	res->feed_bytes = (uint64_t)nsets * per_iter * seg;
	/* The feed: nsets frames per (worker, fragment), each one segment. */
	snprintf(name, sizeof(name), "feed%u", g_seq);
	pool = rte_pktmbuf_pool_create(name, per_iter * nsets + 64, 0, 0,
				       (uint16_t)(RTE_PKTMBUF_HEADROOM + 128 + seg),
				       (int)rte_socket_id());
	if (pool == NULL) {
		fprintf(stderr, "bench: no memory for %u feed frames\n", per_iter * nsets);
		return -ENOMEM;
	}
	id = frame_ring_port("b", g_seq++, 1, RING_SZ, &rx, &tx);
	if (id < 0 || per_iter * NSETS > RING_SZ / 2) {
		fprintf(stderr,
			"bench: cannot set up the ring port (or %u frames per iteration is "
			"too many)\n",
			per_iter);
		return -ENOMEM;
	}
	cfg.addrs[0] = htonl(FRAME_APP_IP);
	rcu_assign_pointer(tab, s.tab);
	d = pbox_dpdk_open(&cfg, &tab, &stp);
	if (d == NULL) {
		return -ENODEV;
	}
	/* nsets sets of frames, fragment-major (all workers' copies of a fragment in a row,
	 * as they arrive from synchronised workers). */
	frames = calloc((size_t)per_iter * nsets, sizeof(*frames));
	for (uint32_t set = 0; set < nsets; set++) {
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			const struct pbox_chunk_desc *cd = &s.desc.chunks[c];

			for (uint32_t f = 0; f < cd->nfrags; f++) {
				for (uint32_t r = 0; r < nw; r++) {
					struct pbox_msg m = {
						.type = PBOX_MSG_PUSH,
						.encoding = PBOX_ENC_F32,
						.flags = PBOX_F_WANT_REPLY,
						.job = 42,
						.sender = r,
						.cookie = s.cookies[r],
						.chunk = c,
						.iter = set,
						.frag_off = f * seg,
						.frag_len = pbox_frag_len(&s.desc, cd->bytes, f),
						.chunk_len = cd->bytes,
					};
					struct rte_mbuf *mb = rte_pktmbuf_alloc(pool);
					uint32_t len;

					for (uint32_t i = 0; i < m.frag_len / 4; i++) {
						g[i] = (float)((r + i + f) % 7);
					}
					len = frame_build(buf, r, BASE_PORT, &m, g);
					if (mb == NULL || len > rte_pktmbuf_tailroom(mb)) {
						fprintf(stderr, "bench: feed pool too small\n");
						return -ENOMEM;
					}
					memcpy(rte_pktmbuf_mtod(mb, void *), buf, len);
					mb->data_len = (uint16_t)len;
					mb->pkt_len = len;
					frames[nframes++] = mb;
				}
			}
		}
	}
	/* The engine alone first, on a job state of its own (the transports number their
	 * reply references differently, and the state records them): the same job, cookies
	 * and frames. */
	{
		struct sim s2;

		if (sim_init(&s2, &jc) != 0) {
			return -EINVAL;
		}
		engine_alone(s2.tab, frames, per_iter, nsets, seconds, &res->engine_gbs);
		sim_fini(&s2);
	}
	t_lcore = 0;
	rc = pbox_dpdk_launch(d);
	if (rc != 0) {
		fprintf(stderr, "bench: cannot launch the data-plane lcore: %s\n", strerror(-rc));
		pbox_dpdk_close(d);
		return rc;
	}
	t0 = rte_rdtsc();
	busy0 = idle0 = frags0 = bytes0 = 0;
	warm = t_lcore + PBOX_MAX(20u, nsets);
	for (uint32_t t = t_lcore;; t++) {
		struct rte_mbuf **set = frames + (size_t)(t % nsets) * per_iter;
		uint32_t sent = 0;

		/* Iteration t - nsets + 1 must be complete (every chunk's) before t is sent:
		 * its frames (set t % nsets) are rewritten now. The lcore handles frames in
		 * order, so up to nsets - 1 iterations may be queued ahead of it (the engine's
		 * window only needs t - 2 complete when t's frames are handled): it does not
		 * wait for this thread unless this thread is off its CPU for that long. */
		uint64_t wait0 = rte_rdtsc();

		while (t >= t_lcore + nsets - 1 &&
		       pbox_stat_read(&st.iterations) <
			       (uint64_t)(t - (nsets - 1) + 1 - t_lcore) * s.desc.nchunks) {
			drain(tx);
			if (rte_rdtsc() - wait0 > 10 * rte_get_tsc_hz()) {
				fprintf(stderr, "bench: iteration %u did not complete in 10 s\n",
					t - nsets + 1);
				return -ETIMEDOUT;
			}
		}
		if (t == warm) { /* warm-up done: every set sent once */
			t0 = rte_rdtsc();
			busy0 = pbox_stat_read(&st.busy_cycles);
			idle0 = pbox_stat_read(&st.idle_cycles);
			frags0 = pbox_stat_read(&st.agg_frags);
			bytes0 = pbox_stat_read(&st.agg_bytes);
			cpu0 = lcore_oncpu_ns();
			wait0_cycles = pbox_stat_read(&pbox_dpdk_core_stats(d, 0)->reclaim_cycles);
		}
		if (t > warm && (double)(rte_rdtsc() - t0) / (double)rte_get_tsc_hz() >= seconds) {
			break;
		}
		for (uint32_t i = 0; i < per_iter; i++) {
			struct pbox_wire_hdr *h =
				rte_pktmbuf_mtod_offset(set[i], struct pbox_wire_hdr *, 42);

			h->iter = htonl(t);
			rte_mbuf_refcnt_update(set[i], 1);
		}
		while (sent < per_iter) {
			sent += rte_ring_sp_enqueue_burst(rx, (void **)(set + sent),
							  PBOX_MIN(per_iter - sent, 256u), NULL);
			drain(tx);
		}
	}
	t1 = rte_rdtsc();
	{
		double el = (double)(t1 - t0) / (double)rte_get_tsc_hz();
		uint64_t busy = pbox_stat_read(&st.busy_cycles) - busy0;
		uint64_t idle = pbox_stat_read(&st.idle_cycles) - idle0;
		double busy_s = (double)busy / (double)rte_get_tsc_hz();
		uint64_t frags = pbox_stat_read(&st.agg_frags) - frags0;
		uint64_t bytes = pbox_stat_read(&st.agg_bytes) - bytes0;

		res->seg_s = (double)frags / el;
		res->gbs = (double)bytes / el / 1e9;
		res->seg_busy_s = busy_s > 0 ? (double)frags / busy_s : 0;
		res->gbs_busy = busy_s > 0 ? (double)bytes / busy_s / 1e9 : 0;
		res->busy = busy + idle > 0 ? 100.0 * (double)busy / (double)(busy + idle) : 0;
		{
			/* On-CPU time of the lcore, its busy share of it less its waits for
			 * this thread to free replies (a NIC completes them by itself): the
			 * capacity with the time other processes had its CPU, or this
			 * thread's, taken out. */
			uint64_t waited = PBOX_MIN(
				pbox_stat_read(&pbox_dpdk_core_stats(d, 0)->reclaim_cycles) -
					wait0_cycles,
				busy);
			double cpu_s =
				(double)(lcore_oncpu_ns() - cpu0) / 1e9 *
				(busy + idle > 0 ? (double)(busy - waited) / (double)(busy + idle)
						 : 0);

			res->gbs_cpu = cpu_s > 0 ? (double)bytes / cpu_s / 1e9 : 0;
		}
		for (unsigned k = 0; k < PBOX_DROP_COUNT; k++) {
			if (k != PBOX_DROP_NONE && st.drops[k] != 0) {
				fprintf(stderr, "bench: %llu drops (%s): the run is not valid\n",
					(unsigned long long)st.drops[k],
					pbox_drop_reason_name((enum pbox_drop_reason)k));
				rc = -EPROTO;
			}
		}
	}
	{
		const struct pbox_dpdk_stats *ds = pbox_dpdk_core_stats(d, 0);

		res->reclaim_waits = pbox_stat_read(&ds->reclaim_waits);
	}
	if (pbox_stat_read(&st.tx_errors) != 0) {
		fprintf(stderr,
			"bench: %llu replies could not be built (pool empty): the feed "
			"consumed them too slowly\n",
			(unsigned long long)pbox_stat_read(&st.tx_errors));
	}
	pbox_dpdk_stop(d);
	drain(tx);
	pbox_dpdk_close(d);
	for (uint32_t i = 0; i < nframes; i++) {
		rte_pktmbuf_free(frames[i]); /* the frames' own reference */
	}
	{
		void *m = NULL;

		while (rte_ring_dequeue(rx, &m) == 0) {
			rte_pktmbuf_free(m);
		}
	}
	rte_ring_free(rx);
	rte_ring_free(tx);
	rte_mempool_free(pool);
	free(frames);
	free(buf);
	free(g);
	sim_fini(&s);
	return rc;
}

/* GB/s of gradient through kern->add on one seg-byte segment into an accumulator, both
 * in cache. */
static double add_bandwidth(unsigned seg)
{
	const struct pbox_kernels *k = pbox_kernels_get();
	float *acc = aligned_alloc(64, seg), *g = aligned_alloc(64, seg);
	size_t n = seg / 4, reps = (size_t)(1u << 30) / seg;
	uint64_t t0, t1;

	for (size_t i = 0; i < n; i++) {
		acc[i] = 0;
		g[i] = (float)(i % 7);
	}
	double best = 0;

	k->add(acc, g, n); /* warm */
	/* Best of five: a single pass is at the mercy of whatever else the CPU runs. */
	for (int rep = 0; rep < 5; rep++) {
		double gbs;

		t0 = rte_rdtsc();
		for (size_t r = 0; r < reps / 5; r++) {
			k->add(acc, g, n);
			__asm__ volatile("" : : "r"(acc) : "memory"); /* keep every pass */
		}
		t1 = rte_rdtsc();
		gbs = (double)(reps / 5) * seg / ((double)(t1 - t0) / (double)rte_get_tsc_hz()) /
		      1e9;
		best = gbs > best ? gbs : best;
	}
	free(acc);
	free(g);
	return best;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-bench-dpdk-engine [--sizes 1024,4096,8192] [--workers 2,4,8]\n"
		"         [--chunk BYTES | --sweep 8192,32768,...] [--model BYTES] [--seconds S]\n"
		"         [--cold] [--non-finite reject|propagate] [-- EAL arguments]\n"
		"Throughput of one DPDK data-plane lcore fed in-process (net_ring) beside the\n"
		"add kernel's in-cache bandwidth. Needs 2 CPUs; uses hugepages if free, else\n"
		"--no-huge.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "sizes", 1, NULL, 's' }, { "workers", 1, NULL, 'w' },
		{ "chunk", 1, NULL, 'c' }, { "sweep", 1, NULL, 'S' },
		{ "model", 1, NULL, 'm' }, { "seconds", 1, NULL, 't' },
		{ "cold", 0, NULL, 'C' },  { "non-finite", 1, NULL, 'n' },
		{ "help", 0, NULL, 'h' },  { NULL, 0, NULL, 0 },
	};
	struct conf cf = { .sizes = { 1024, 4096, 8192 },
			   .nsizes = 3,
			   .workers = { 2, 4, 8 },
			   .nworkers = 3,
			   .chunks = { 32768 },
			   .nchunks = 1,
			   .model = 262144,
			   .seconds = 2 };
	char *eal[32] = { argv[0] };
	int neal = 1, o, n;
	FILE *hp = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
	unsigned long free_hp = 0;

	while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (o) {
		case 's':
			n = parse_list(optarg, cf.sizes, 8, 64, 8192);
			for (int i = 0; i < n; i++)
				if (cf.sizes[i] % 64 != 0)
					n = -1;
			if (n <= 0) {
				fprintf(stderr, "--sizes %s: 1..8 multiples of 64 up to 8192\n",
					optarg);
				return 64;
			}
			cf.nsizes = (unsigned)n;
			break;
		case 'w':
			n = parse_list(optarg, cf.workers, 8, 1, SIM_MAX_RANKS);
			if (n <= 0) {
				fprintf(stderr, "--workers %s: 1..8 counts of 1..%d\n", optarg,
					SIM_MAX_RANKS);
				return 64;
			}
			cf.nworkers = (unsigned)n;
			break;
		case 'c':
		case 'S':
			n = parse_list(optarg, cf.chunks, 16, 64, 64u << 20);
			if (n <= 0) {
				fprintf(stderr, "--%s %s: chunk sizes in bytes\n",
					o == 'c' ? "chunk" : "sweep", optarg);
				return 64;
			}
			cf.nchunks = (unsigned)n;
			break;
		case 'm':
			cf.model = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 't':
			cf.seconds = strtod(optarg, NULL);
			break;
		case 'C':
			cf.cold = true;
			break;
		case 'n':
			if (strcmp(optarg, "reject") != 0 && strcmp(optarg, "propagate") != 0) {
				fprintf(stderr, "--non-finite %s: reject or propagate\n", optarg);
				return 64;
			}
			g_non_finite = optarg[0] == 'r' ? PBOX_NON_FINITE_REJECT
							: PBOX_NON_FINITE_PROPAGATE;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (cf.model < 4096 || cf.model % 64 != 0 || cf.seconds <= 0) {
		fprintf(stderr, "--model must be a multiple of 64 >= 4096 and --seconds > 0\n");
		return 64;
	}
	if (hp != NULL) {
		if (fscanf(hp, "%lu", &free_hp) != 1) {
			free_hp = 0;
		}
		fclose(hp);
	}
	if (optind < argc) {
		for (int i = optind; i < argc && neal < 31; i++) {
			eal[neal++] = argv[i];
		}
	} else {
		static char a_pci[] = "--no-pci", a_lc[] = "--lcores", a_lcv[] = "0@0,1@1",
			    a_mem[] = "--in-memory", a_nh[] = "--no-huge", a_m[] = "-m",
			    a_mv[] = "1024", a_ns[] = "--no-shconf", a_log[] = "--log-level",
			    a_logv[] = "lib.eal:error";

		eal[neal++] = a_pci;
		eal[neal++] = a_lc;
		eal[neal++] = a_lcv;
		eal[neal++] = a_log;
		eal[neal++] = a_logv;
		if (free_hp >= 256) {
			eal[neal++] = a_mem;
		} else {
			eal[neal++] = a_nh;
			eal[neal++] = a_m;
			eal[neal++] = a_mv;
			eal[neal++] = a_ns;
		}
	}
	eal[neal] = NULL;
	if (rte_eal_init(neal, eal) < 0) {
		fprintf(stderr, "pbox-bench-dpdk-engine: EAL initialisation failed\n");
		return 69;
	}
	pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_WARN);
	rcu_register_thread();
	printf("# pbox DPDK engine throughput, 1 lcore, in-process net_ring feed, kernels %s,\n"
	       "# %s memory, model %u B, %.1f s per point\n",
	       pbox_kernels_get()->isa, free_hp >= 256 ? "hugepage" : "4 KB-page", cf.model,
	       cf.seconds);
	printf("# feed payload: %s (LLC %llu KB); non_finite = %s\n",
	       cf.cold ? "cycled through at least 2 x LLC: not cache-resident"
		       : "at most a quarter of the LLC: cache-resident",
	       (unsigned long long)(pbox_bench_llc_bytes() >> 10),
	       g_non_finite == PBOX_NON_FINITE_REJECT ? "reject" : "propagate");
	printf("%-6s %-7s %-8s %12s %9s %14s %10s %7s %10s %11s %9s %9s %8s %9s %10s %9s\n",
	       "seg_B", "workers", "chunk_B", "seg/s", "GB/s", "seg/busy-s", "GB/busy-s", "busy%",
	       "GB/cpu-s", "add_GB/s", "ratio", "ratio_cpu", "waits", "feed_MB", "eng_GB/s",
	       "eng_ratio");
	for (unsigned ci = 0; ci < cf.nchunks; ci++) {
		for (unsigned si = 0; si < cf.nsizes; si++) {
			double add = add_bandwidth(cf.sizes[si]);

			for (unsigned wi = 0; wi < cf.nworkers; wi++) {
				struct result r;
				unsigned ch = cf.chunks[ci];

				if (cf.sizes[si] > ch) {
					continue;
				}
				if (run_one(cf.sizes[si], cf.workers[wi], ch, cf.model, cf.seconds,
					    cf.cold, &r) != 0) {
					fprintf(stderr, "run seg %u workers %u chunk %u failed\n",
						cf.sizes[si], cf.workers[wi], ch);
					return 1;
				}
				printf("%-6u %-7u %-8u %12.0f %9.2f %14.0f %10.2f %7.1f %10.2f "
				       "%11.2f %9.2f %9.2f %8llu %9.1f %10.2f %9.2f\n",
				       cf.sizes[si], cf.workers[wi], ch, r.seg_s, r.gbs,
				       r.seg_busy_s, r.gbs_busy, r.busy, r.gbs_cpu, add,
				       r.gbs_busy / add, r.gbs_cpu / add,
				       (unsigned long long)r.reclaim_waits,
				       (double)r.feed_bytes / 1048576.0, r.engine_gbs,
				       r.engine_gbs / add);
				fflush(stdout);
			}
		}
	}
	rcu_unregister_thread();
	rte_eal_cleanup();
	return 0;
}
