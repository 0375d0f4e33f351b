/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-dpdk-tx: the cost of building replies on the DPDK data plane, per reply, on
 * one thread: what the engine's send_result does when a chunk completes (every fragment
 * of the result to every worker, the same payload memory for all), through the real
 * transmit ops of dataplane/transport/dpdk over a net_ring port, then the TX flush, the frames
 * taken off the ring and freed (as a NIC's completion would), and the release accounting.
 *
 * One thread does everything and its CPU time is measured (CLOCK_THREAD_CPUTIME_ID), so
 * the figure does not depend on how two threads are scheduled on a shared machine: it
 * isolates the reply path that the engine benchmark (bench_dpdk_engine) measures only
 * together with the feed and the engine.
 *
 *   --seg 8192          fragment bytes
 *   --workers 2,4,8     workers the result goes to
 *   --chunk 32768       chunk bytes (fragments per chunk = chunk / seg)
 *   --seconds 1         per configuration
 *   --reps 5            repetitions per configuration (best and median printed)
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include "common/log.h"
#include "common/numlist.h"
#include "transport/dpdk/dpdk_impl.h"
#include "frame.h"

#define RING_SZ  65536
#define MAX_REPS 32

static double thread_cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Take every frame off the TX ring and free it, as a NIC completing them would. */
static unsigned drain(struct rte_ring *tx)
{
	void *m[64];
	unsigned n, total = 0;

	while ((n = rte_ring_sc_dequeue_burst(tx, m, 64, NULL)) != 0) {
		rte_pktmbuf_free_bulk((struct rte_mbuf **)m, n);
		total += n;
	}
	return total;
}

/* ns of this thread's CPU per reply, for nw workers and nfrag fragments of seg bytes. */
static int measure(struct pbox_dpdk *d, struct rte_ring *tx, const uint8_t *result, unsigned seg,
		   unsigned nfrag, unsigned nw, double seconds, double *ns)
{
	struct dpdk_core *c = &d->cores[0];
	struct pbox_peer peers[64];
	struct pbox_wire_hdr h;
	struct pbox_msg m = {
		.type = PBOX_MSG_DATA,
		.encoding = PBOX_ENC_F32,
		.job = 42,
		.sender = PBOX_SENDER_APPLIANCE,
		.frag_len = seg,
		.chunk_len = seg * nfrag,
	};
	uint64_t replies = 0, got = 0;
	double t0, cpu0, el;

	for (unsigned r = 0; r < nw; r++) {
		memset(&peers[r], 0, sizeof(peers[r]));
		frame_worker_addr(r, peers[r].mac, &peers[r].ip, &peers[r].port);
	}
	pbox_wire_encode(&m, &h);
	cpu0 = thread_cpu_s();
	t0 = cpu0;
	do {
		for (unsigned i = 0; i < 64; i++) {
			/* One chunk result to every worker, fragment by fragment, rank by
			 * rank (the engine's send_result order). */
			for (unsigned r = 0; r < nw; r++) {
				for (unsigned f = 0; f < nfrag; f++) {
					if (pbox_dpdk_tx_ops.send(c, &peers[r], &h,
								  result + (size_t)f * seg,
								  seg) != 0) {
						fprintf(stderr, "bench: a reply was not built\n");
						return -ENOBUFS;
					}
				}
			}
			replies += (uint64_t)nw * nfrag;
#ifdef PBOX_DPDK_FAN
			pbox_dpdk_tx_fan_drop(c); /* the end of the lcore's loop iteration */
#endif
			pbox_dpdk_tx_flush(c);
			got += drain(tx);
			pbox_dpdk_tx_complete(c);
		}
		el = thread_cpu_s() - t0;
	} while (el < seconds);
	if (got != replies || c->released != c->tx_refs) {
		fprintf(stderr, "bench: %llu of %llu replies came out, %llu of %llu released\n",
			(unsigned long long)got, (unsigned long long)replies,
			(unsigned long long)c->released, (unsigned long long)c->tx_refs);
		return -EPROTO;
	}
	*ns = (thread_cpu_s() - cpu0) * 1e9 / (double)replies;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "seg", 1, NULL, 's' },     { "workers", 1, NULL, 'w' }, { "chunk", 1, NULL, 'c' },
		{ "seconds", 1, NULL, 't' }, { "reps", 1, NULL, 'r' },    { "help", 0, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static char a_pci[] = "--no-pci", a_lc[] = "--lcores", a_lcv[] = "0@0,1@1",
		    a_nh[] = "--no-huge", a_m[] = "-m", a_mv[] = "512", a_ns[] = "--no-shconf",
		    a_log[] = "--log-level", a_logv[] = "lib.eal:error";
	char *eal[] = { argv[0], a_pci, a_lc, a_lcv, a_nh, a_m, a_mv, a_ns, a_log, a_logv, NULL };
	unsigned seg = 8192, chunk = 32768, reps = 5, workers[8] = { 2, 4, 8 }, nworkers = 3;
	double seconds = 1;
	struct pbox_dpdk_cfg cfg = {
		.ncores = 1,
		.base_port = 7100,
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
	struct pbox_jobtab *tab = NULL;
	struct rte_ring *rx, *tx;
	struct pbox_dpdk *d;
	uint8_t *result;
	int o;

	while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		uint64_t v[8];
		int n;

		switch (o) {
		case 's':
			seg = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'w':
			n = pbox_parse_u64_list(optarg, v, 8, 1, 64);
			if (n <= 0) {
				fprintf(stderr, "--workers %s: 1..8 counts of 1..64\n", optarg);
				return 64;
			}
			for (int i = 0; i < n; i++) {
				workers[i] = (unsigned)v[i];
			}
			nworkers = (unsigned)n;
			break;
		case 'c':
			chunk = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 't':
			seconds = strtod(optarg, NULL);
			break;
		case 'r':
			reps = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'h':
			printf("Usage: pbox-bench-dpdk-tx [--seg 8192] [--workers 2,4,8] "
			       "[--chunk 32768] [--seconds 1] [--reps 5]\n");
			return 0;
		default:
			return 64;
		}
	}
	if (seg < 64 || seg > 8192 || chunk < seg || chunk % seg != 0 || seconds <= 0 ||
	    reps == 0 || reps > MAX_REPS) {
		fprintf(stderr, "--seg 64..8192 dividing --chunk, --seconds > 0, --reps 1..%d\n",
			MAX_REPS);
		return 64;
	}
	if (rte_eal_init((int)(sizeof(eal) / sizeof(eal[0])) - 1, eal) < 0) {
		fprintf(stderr, "pbox-bench-dpdk-tx: EAL initialisation failed\n");
		return 69;
	}
	pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_WARN);
	memset(&st, 0, sizeof(st));
	if (frame_ring_port("tx", 0, 1, RING_SZ, &rx, &tx) < 0) {
		fprintf(stderr, "pbox-bench-dpdk-tx: cannot create the ring port\n");
		return 69;
	}
	cfg.addrs[0] = htonl(FRAME_APP_IP);
	d = pbox_dpdk_open(&cfg, &tab, &stp);
	result = aligned_alloc(64, chunk);
	if (d == NULL || result == NULL) {
		return 69;
	}
	memset(result, 0x3c, chunk);
	printf("# pbox DPDK reply path, one thread, CPU time per reply: %u-byte fragments, %u per "
	       "chunk, net_ring, zero-copy\n",
	       seg, chunk / seg);
	printf("%-8s %12s %14s\n", "workers", "best ns", "median ns");
	for (unsigned wi = 0; wi < nworkers; wi++) {
		double ns[MAX_REPS];

		for (unsigned r = 0; r < reps; r++) {
			if (measure(d, tx, result, seg, chunk / seg, workers[wi], seconds,
				    &ns[r]) != 0) {
				return 1;
			}
		}
		qsort(ns, reps, sizeof(ns[0]), cmp_double);
		printf("%-8u %12.1f %14.1f\n", workers[wi], ns[0], ns[reps / 2]);
		fflush(stdout);
	}
	pbox_dpdk_close(d);
	drain(tx);
	rte_ring_free(rx);
	rte_ring_free(tx);
	free(result);
	rte_eal_cleanup();
	return 0;
}
