/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The DPDK data plane in one process, over net_ring: two data-plane lcores run the real
 * poll loop (dataplane/transport/dpdk) on a ring port; this thread (the EAL main lcore) is the
 * traffic generator and the workers. It writes complete Ethernet/IPv4/UDP/pbox frames into
 * the port's RX rings and reads the replies from its TX rings, so it sees exactly what a
 * NIC would carry.
 *
 * Checked: exact aggregation results for 1..8 workers (sum and mean, deterministic and
 * not), with duplicates, reordering and frames delivered to the wrong core's queue (the
 * software hand-off must bring them to the owner); multi-segment frames with floats split
 * across segments; server-optimizer results; replies addressed to each worker's MAC / IP /
 * port from the owner core's port, built zero-copy from chunk memory, and that memory
 * kept intact while the NIC (here: the ring consumer) holds it, even after the job's
 * session ended, and released (unmapped) only once the last reply is freed; a core waiting
 * for the NIC lets grace periods complete; ARP; and every kind of malformed frame counted
 * under its reason and ignored.
 *
 * The lifetime tests (test_lifetime_*) also run in the unit suite, so under ASan: the
 * first argument, if any, is a cmocka test filter.
 *
 * The job tables come from the engine's unit-test harness (tests/unit/sim.h, no_nodes).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <rte_arp.h>
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

#include "transport/dpdk/dpdk.h"
#include "frame.h"
#include "kernels/kernels.h"
#include "sim.h"

#define NCORES    2
#define BASE_PORT 7100
#define APP_IP    FRAME_APP_IP
#define RING_SZ   8192
#define MAX_FRAME 16384

static struct rte_mempool *g_pool;
/* test_lifetime_dma_arenas: the port is treated as a DMA device (cfg.force_dma); replies
 * are then copied unless chunk memory is DPDK memory (g_expect_copy). */
static bool g_dma, g_expect_copy;
static unsigned g_port_seq;
static struct app *g_open; /* closed by the teardown if a failed assertion skipped it */

/* One test appliance: a ring port with NCORES queue pairs and the data plane on it. */
struct app {
	struct rte_ring *rx[NCORES]; /* we produce, the appliance's RX queue q consumes */
	struct rte_ring *tx[NCORES]; /* the appliance's TX queue q produces, we consume */
	uint16_t port;
	struct pbox_dpdk *d;
	struct pbox_jobtab *tab;
	struct pbox_core_stats stats[NCORES];
	struct sim s;
};

static void app_open(struct app *a, const struct sim_job_cfg *jc)
{
	struct pbox_dpdk_cfg cfg = {
		.ncores = NCORES,
		.base_port = BASE_PORT,
		.naddrs = 1,
		.mtu = 9000,
		.burst = 32,
		.rx_desc = 256,
		.tx_desc = 256,
		.mbuf_bytes = 2048,
		.tx_drain_us = 20,
		.busy_poll = false,
		.idle_us = 100,
		.idle_sleep_us = 20,
		.steering = PBOX_DPDK_STEER_AUTO,
		.zero_copy = true,
		.dma_arenas = g_dma,
		.force_dma = g_dma,
	};
	struct pbox_core_stats *st[NCORES];
	int id;

	memset(a, 0, sizeof(*a));
	assert_int_equal(sim_init(&a->s, jc), 0);
	for (unsigned q = 0; q < NCORES; q++) {
		st[q] = &a->stats[q];
	}
	id = frame_ring_port("t", g_port_seq++, NCORES, RING_SZ, a->rx, a->tx);
	assert_true(id >= 0);
	a->port = (uint16_t)id;
	cfg.addrs[0] = htonl(APP_IP);
	/* The frames are 1 KB fragments, except in the multi-segment test. */
	rcu_assign_pointer(a->tab, a->s.tab);
	a->d = pbox_dpdk_open(&cfg, &a->tab, st);
	assert_non_null(a->d);
	g_open = a;
	assert_int_equal(pbox_dpdk_launch(a->d), 0);
}

static void app_close(struct app *a)
{
	g_open = NULL;
	pbox_dpdk_stop(a->d);
	/* Replies left in the TX rings reference the cores (their release bitmaps) and the
	 * ports' pools: free them while those exist. */
	for (unsigned q = 0; q < NCORES; q++) {
		void *m;

		while (rte_ring_dequeue(a->tx[q], &m) == 0) {
			rte_pktmbuf_free(m);
		}
		while (rte_ring_dequeue(a->rx[q], &m) == 0) {
			rte_pktmbuf_free(m);
		}
	}
	pbox_dpdk_close(a->d);
	for (unsigned q = 0; q < NCORES; q++) {
		rte_ring_free(a->rx[q]);
		rte_ring_free(a->tx[q]);
	}
	sim_fini(&a->s);
}

/* Sum of a struct pbox_dpdk_stats counter over the cores. */
#define DSTAT(a, f)                                                                 \
	({                                                                          \
		uint64_t t_ = 0;                                                    \
		for (uint32_t k_ = 0; k_ < NCORES; k_++) {                          \
			t_ += pbox_stat_read(&pbox_dpdk_core_stats((a)->d, k_)->f); \
		}                                                                   \
		t_;                                                                 \
	})

static uint64_t estat_drop(const struct app *a, enum pbox_drop_reason r)
{
	uint64_t t = 0;

	for (uint32_t k = 0; k < NCORES; k++) {
		t += pbox_stat_read(&a->stats[k].drops[r]);
	}
	return t;
}

/* ---- frames ---- */

/* An mbuf chain holding buf, cut at the given offsets (ascending, 0-terminated). */
static struct rte_mbuf *to_mbuf(const uint8_t *buf, uint32_t len, const uint32_t *cuts)
{
	struct rte_mbuf *head = NULL, *prev = NULL;
	uint32_t off = 0;

	while (off < len) {
		uint32_t end = len;
		struct rte_mbuf *m = rte_pktmbuf_alloc(g_pool);

		for (const uint32_t *c = cuts; c != NULL && *c != 0; c++) {
			if (*c > off && *c < end) {
				end = *c;
			}
		}
		assert_non_null(m);
		assert_true(end - off <= rte_pktmbuf_tailroom(m));
		memcpy(rte_pktmbuf_mtod(m, uint8_t *), buf + off, end - off);
		m->data_len = (uint16_t)(end - off);
		if (head == NULL) {
			head = m;
			head->pkt_len = 0;
		} else {
			prev->next = m;
			head->nb_segs++;
		}
		head->pkt_len += m->data_len;
		prev = m;
		off = end;
	}
	return head;
}

static void inject(struct app *a, unsigned q, struct rte_mbuf *m)
{
	assert_int_equal(rte_ring_sp_enqueue(a->rx[q], m), 0);
}

static void inject_buf(struct app *a, unsigned q, const uint8_t *buf, uint32_t len)
{
	inject(a, q, to_mbuf(buf, len, NULL));
}

/* A reply as the test sees it. */
struct reply {
	uint8_t dst_mac[6];
	uint32_t dst_ip;
	uint16_t src_port, dst_port;
	bool zero_copy;
	const void *ext_addr;
	rte_iova_t ext_iova;
	struct pbox_msg m;
	uint32_t len;
	uint8_t payload[MAX_FRAME];
};

/* Linearise and parse one reply; returns false for frames that are not pbox replies. */
static bool parse_reply(const struct rte_mbuf *m, struct reply *r)
{
	static uint8_t flat[MAX_FRAME];
	const struct rte_ether_hdr *eth = (const struct rte_ether_hdr *)flat;
	const struct rte_ipv4_hdr *ip = (const struct rte_ipv4_hdr *)(eth + 1);
	const struct rte_udp_hdr *udp = (const struct rte_udp_hdr *)(ip + 1);
	uint32_t len = 0;

	for (const struct rte_mbuf *s = m; s != NULL; s = s->next) {
		assert_true(len + s->data_len <= sizeof(flat));
		memcpy(flat + len, rte_pktmbuf_mtod(s, const void *), s->data_len);
		len += s->data_len;
	}
	assert_int_equal(len, m->pkt_len);
	if (eth->ether_type != htons(RTE_ETHER_TYPE_IPV4)) {
		return false;
	}
	memcpy(r->dst_mac, eth->dst_addr.addr_bytes, 6);
	assert_int_equal(rte_raw_cksum(ip, 20), 0xffff); /* a valid IPv4 header checksum */
	assert_int_equal(ip->src_addr, htonl(APP_IP));
	assert_int_equal(ntohs(ip->total_length), len - 14);
	assert_int_equal(ntohs(udp->dgram_len), len - 34);
	r->dst_ip = ip->dst_addr;
	r->src_port = ntohs(udp->src_port);
	r->dst_port = udp->dst_port;
	r->zero_copy = m->nb_segs == 2 && RTE_MBUF_HAS_EXTBUF(m->next);
	r->ext_addr = r->zero_copy ? rte_pktmbuf_mtod(m->next, const void *) : NULL;
	r->ext_iova = r->zero_copy ? rte_pktmbuf_iova(m->next) : RTE_BAD_IOVA;
	assert_int_equal(pbox_wire_decode(flat + 42, len - 42, &r->m), PBOX_DROP_NONE);
	r->len = r->m.frag_len;
	if (r->len != 0) {
		memcpy(r->payload, flat + 42 + 64, r->len);
	}
	return true;
}

/* Take the next reply from any TX ring (waiting up to timeout_ms); NULL on timeout. The
 * caller frees it (which is what releases its payload reference). */
static struct rte_mbuf *next_reply(struct app *a, unsigned timeout_ms)
{
	uint64_t end = rte_rdtsc() + rte_get_tsc_hz() / 1000 * timeout_ms;

	do {
		for (unsigned q = 0; q < NCORES; q++) {
			void *m;

			if (rte_ring_sc_dequeue(a->tx[q], &m) == 0) {
				return m;
			}
		}
		rte_pause();
	} while (rte_rdtsc() < end);
	return NULL;
}

/* ---- gradients and expectations ---- */

static float grad(uint32_t r, uint32_t t, uint32_t chunk, uint32_t i, bool exact)
{
	uint32_t h = (r * 2654435761u) ^ (t * 40503u) ^ (chunk * 977u) ^ (i * 2246822519u);

	h ^= h >> 13;
	h *= 0x5bd1e995u;
	h ^= h >> 15;
	if (exact) {
		return (float)((int)(h % 64) -
			       32); /* small integers: any summation order is exact */
	}
	return ((float)(h % 2000001) - 1000000.0f) * 1.2345678e-6f;
}

/* Expected chunk result of iteration t (aggregate jobs): reduce in rank order. */
static void expect_aggregate(const struct sim *s, uint32_t chunk, uint32_t t, bool exact, bool mean,
			     float *out)
{
	const struct pbox_chunk_desc *cd = &s->desc.chunks[chunk];
	uint32_t n = cd->bytes / 4;
	float *src[SIM_MAX_RANKS];

	for (uint32_t r = 0; r < s->nranks; r++) {
		src[r] = malloc(cd->bytes);
		for (uint32_t i = 0; i < n; i++) {
			src[r][i] = grad(r, t, chunk, i, exact);
		}
	}
	pbox_kernels_get()->reduce(out, (const float *const *)src, s->nranks, n,
				   mean ? (float)s->nranks : 1.0f);
	for (uint32_t r = 0; r < s->nranks; r++) {
		free(src[r]);
	}
}

/* Every (rank, chunk, fragment) PUSH of iteration t as frames, shuffled, with some sent
 * twice and some put on the other core's queue. cuts: split every frame (multi-seg). */
static void push_iteration(struct app *a, uint32_t t, bool exact, uint32_t seed, bool multiseg)
{
	const struct sim *s = &a->s;
	uint32_t total = 0, n = 0;
	struct rte_mbuf **frames;
	uint8_t *buf = malloc(MAX_FRAME);
	float *g = malloc(MAX_FRAME);

	for (uint32_t c = 0; c < s->desc.nchunks; c++) {
		total += s->desc.chunks[c].nfrags * s->nranks;
	}
	frames = calloc(total * 2, sizeof(*frames));
	for (uint32_t r = 0; r < s->nranks; r++) {
		for (uint32_t c = 0; c < s->desc.nchunks; c++) {
			const struct pbox_chunk_desc *cd = &s->desc.chunks[c];

			for (uint32_t f = 0; f < cd->nfrags; f++) {
				struct pbox_msg m = {
					.type = PBOX_MSG_PUSH,
					.encoding = PBOX_ENC_F32,
					.flags = PBOX_F_WANT_REPLY,
					.job = 42,
					.sender = r,
					.cookie = s->cookies[r],
					.chunk = c,
					.iter = t,
					.frag_off = f * s->desc.frag_bytes,
					.frag_len = pbox_frag_len(&s->desc, cd->bytes, f),
					.chunk_len = cd->bytes,
					.seq = t * 100000 + c,
				};
				uint32_t len, i0 = m.frag_off / 4;
				/* split inside the pbox header, and inside a float (3 bytes in) */
				uint32_t cuts[] = { 14 + 20 + 8 + 30, 14 + 20 + 8 + 64 + 7,
						    14 + 20 + 8 + 64 + 515, 0 };

				for (uint32_t i = 0; i < m.frag_len / 4; i++) {
					g[i] = grad(r, t, c, i0 + i, exact);
				}
				len = frame_build(buf, r, (uint16_t)(BASE_PORT + cd->core), &m, g);
				frames[n++] = to_mbuf(buf, len, multiseg ? cuts : NULL);
			}
		}
	}
	/* Duplicates: every 7th frame again, as a retransmission would be. */
	for (uint32_t i = 0, m = n; i < m; i += 7) {
		frames[n++] = rte_pktmbuf_copy(frames[i], g_pool, 0, UINT32_MAX);
	}
	/* Reorder: Fisher-Yates with a fixed seed. */
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j;
		struct rte_mbuf *x;

		seed = seed * 1103515245u + 12345u;
		j = (seed >> 8) % (i + 1);
		x = frames[i];
		frames[i] = frames[j];
		frames[j] = x;
	}
	/* Queue choice ignores the owner: the ring has no steering, the hand-off must. */
	for (uint32_t i = 0; i < n; i++) {
		inject(a, i % NCORES, frames[i]);
	}
	free(frames);
	free(buf);
	free(g);
}

/* Collect the DATA replies of iteration t for every rank and chunk and compare them with
 * want(chunk) bit for bit. Also checks the addressing and zero-copy of every reply. */
static void collect_iteration(struct app *a, uint32_t t, float **want)
{
	const struct sim *s = &a->s;
	uint32_t need = 0, got = 0;
	uint8_t **seen = calloc(s->nranks * s->desc.nchunks, sizeof(*seen));
	struct reply *r = malloc(sizeof(*r));

	for (uint32_t c = 0; c < s->desc.nchunks; c++) {
		need += s->desc.chunks[c].nfrags * s->nranks;
	}
	for (uint32_t i = 0; i < s->nranks * s->desc.nchunks; i++) {
		seen[i] = calloc(64, 1);
	}
	while (got < need) {
		struct rte_mbuf *m = next_reply(a, 5000);
		uint8_t mac[6];
		uint32_t ip, f, rank;
		uint16_t port;
		const struct pbox_chunk_desc *cd;

		if (m == NULL) {
			fail_msg("iteration %u: %u of %u reply fragments after 5 s", t, got, need);
		}
		if (!parse_reply(m, r) || r->m.type != PBOX_MSG_DATA || r->m.iter != t) {
			rte_pktmbuf_free(m);
			continue; /* ACKs, ARP replies, answers to duplicates of older rounds */
		}
		assert_int_equal(r->m.sender, PBOX_SENDER_APPLIANCE);
		for (rank = 0; rank < s->nranks && s->cookies[rank] != r->m.cookie; rank++) {
		}
		assert_true(rank < s->nranks);
		frame_worker_addr(rank, mac, &ip, &port);
		assert_memory_equal(r->dst_mac, mac, 6);
		assert_int_equal(r->dst_ip, ip);
		assert_int_equal(r->dst_port, port);
		cd = &s->desc.chunks[r->m.chunk];
		/* From the owner core's own port, and zero-copy out of its chunk memory. */
		assert_int_equal(r->src_port, BASE_PORT + cd->core);
		assert_true(r->zero_copy == !g_expect_copy);
		if (g_dma && !g_expect_copy) {
			/* What the device would read: the payload's own IOVA. */
			assert_true(r->ext_iova != RTE_BAD_IOVA);
			assert_true(r->ext_iova == rte_mem_virt2iova(r->ext_addr));
		}
		if (r->zero_copy) {
			const struct pbox_core_job *cj = &s->job.state->core[cd->core];
			const uint8_t *base = cj->arena;

			assert_true((const uint8_t *)r->ext_addr >= base &&
				    (const uint8_t *)r->ext_addr + r->len <=
					    base + cj->arena_bytes);
		}
		f = r->m.frag_off / s->desc.frag_bytes;
		if (memcmp(r->payload, (const uint8_t *)want[r->m.chunk] + r->m.frag_off, r->len) !=
		    0) {
			fail_msg("iteration %u rank %u chunk %u fragment %u: result differs", t,
				 rank, r->m.chunk, f);
		}
		if (!seen[rank * s->desc.nchunks + r->m.chunk][f]) {
			seen[rank * s->desc.nchunks + r->m.chunk][f] = 1;
			got++;
		}
		rte_pktmbuf_free(m);
	}
	for (uint32_t i = 0; i < s->nranks * s->desc.nchunks; i++) {
		free(seen[i]);
	}
	free(seen);
	free(r);
}

static void drain_replies(struct app *a, unsigned ms)
{
	struct rte_mbuf *m;

	while ((m = next_reply(a, ms)) != NULL) {
		rte_pktmbuf_free(m);
	}
}

/* ---- RCU and job-state lifetime probes ---- */

/* A grace period requested by another thread (synchronize_rcu) while this one is
 * RCU-offline: whether it completes shows that no lcore holds it up. */
struct gp_probe {
	pthread_t thread;
	bool done;
};

static void *gp_probe_main(void *arg)
{
	struct gp_probe *p = arg;

	synchronize_rcu();
	__atomic_store_n(&p->done, true, __ATOMIC_RELEASE);
	return NULL;
}

static void gp_probe_start(struct gp_probe *p)
{
	p->done = false;
	rcu_thread_offline(); /* this thread must not hold it up itself */
	assert_int_equal(pthread_create(&p->thread, NULL, gp_probe_main, p), 0);
}

/* Whether the grace period completed within ms. */
static bool gp_probe_wait(struct gp_probe *p, unsigned ms)
{
	for (unsigned i = 0; i < ms && !__atomic_load_n(&p->done, __ATOMIC_ACQUIRE); i++) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
	return __atomic_load_n(&p->done, __ATOMIC_ACQUIRE);
}

static void gp_probe_join(struct gp_probe *p)
{
	pthread_join(p->thread, NULL);
	rcu_thread_online();
}

/* Job states released (their arenas unmapped) by count_release. */
static uint32_t g_state_releases;

/* Job tables released by count_tab_release (the harness frees them). */
static uint32_t g_tab_releases;

static void count_tab_release(struct pbox_jobtab *tab, void *arg)
{
	(void)tab;
	(void)arg;
	__atomic_fetch_add(&g_tab_releases, 1, __ATOMIC_RELEASE);
}

static void count_release(struct pbox_job_state *st, void *arg)
{
	(void)arg;
	pbox_job_state_free(st);
	__atomic_fetch_add(&g_state_releases, 1, __ATOMIC_RELEASE);
}

/* Sleep ms RCU-offline (the lcores go on). */
static void sleep_offline(unsigned ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

	rcu_thread_offline();
	nanosleep(&ts, NULL);
	rcu_thread_online();
}

/* ---- tests ---- */

static const struct pbox_keyspec g_keys[] = { { 100, 1000 }, { 101, 9000 }, { 102, 3 } };

/* Once the lcores stopped and every reply was consumed: every header and payload mbuf of
 * the port is back in its pool (no reference left on a shared payload, none kept in a
 * stash), so every payload's release callback ran. */
static void assert_tx_pools_idle(struct app *a)
{
	static const char *const what[] = { "hdr", "ext" };

	pbox_dpdk_stop(a->d);
	drain_replies(a, 0);
	for (unsigned i = 0; i < 2; i++) {
		char name[RTE_MEMPOOL_NAMESIZE];
		struct rte_mempool *mp;

		snprintf(name, sizeof(name), "pbox_%s_%u", what[i], a->port);
		mp = rte_mempool_lookup(name);
		assert_non_null(mp);
		if (rte_mempool_in_use_count(mp) != 0) {
			fail_msg("pool %s: %u mbufs still in use after the replies were freed",
				 name, rte_mempool_in_use_count(mp));
		}
	}
}

static void run_aggregate(uint32_t nranks, bool deterministic, bool mean, bool multiseg)
{
	struct sim_job_cfg jc = {
		.nranks = nranks,
		.ncores = NCORES,
		.keys = g_keys,
		.nkeys = 3,
		.chunk_bytes = 8192,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = mean ? PBOX_REDUCE_MEAN : PBOX_REDUCE_SUM,
		.deterministic = deterministic,
		.no_nodes = true,
	};
	struct app *a = calloc(1, sizeof(*a));
	float **want;
	uint64_t frags = 0, per_core[NCORES] = { 0 };

	app_open(a, &jc);
	want = calloc(a->s.desc.nchunks, sizeof(*want));
	for (uint32_t c = 0; c < a->s.desc.nchunks; c++) {
		want[c] = malloc(a->s.desc.chunks[c].bytes);
		per_core[a->s.desc.chunks[c].core] += a->s.desc.chunks[c].nfrags * nranks;
	}
	for (uint32_t t = 0; t < 3; t++) {
		/* Exact integers unless sums are in rank order, where any float must match. */
		bool exact = !deterministic;

		for (uint32_t c = 0; c < a->s.desc.nchunks; c++) {
			expect_aggregate(&a->s, c, t, exact, mean, want[c]);
		}
		push_iteration(a, t, exact, 1234 + t * 77 + nranks, multiseg);
		collect_iteration(a, t, want);
		frags += per_core[0] + per_core[1];
	}
	drain_replies(a, 50);
	/* Every fragment aggregated exactly once, each on its owner core. */
	for (uint32_t k = 0; k < NCORES; k++) {
		assert_int_equal(pbox_stat_read(&a->stats[k].agg_frags), per_core[k] * 3);
	}
	assert_true(pbox_stat_read(&a->stats[0].dups) + pbox_stat_read(&a->stats[1].dups) > 0);
	assert_true(DSTAT(a, steered_in) > 0);
	assert_int_equal(DSTAT(a, steered_in), DSTAT(a, steered_out));
	assert_int_equal(DSTAT(a, steer_full), 0);
	assert_int_equal(DSTAT(a, tx_dropped) + DSTAT(a, tx_nombuf), 0);
	if (g_expect_copy) {
		/* A DMA device and chunk memory outside DPDK memory: every result copied. */
		assert_true(DSTAT(a, tx_not_dma) >= frags);
		assert_int_equal(DSTAT(a, tx_zero_copy), 0);
		assert_tx_pools_idle(a);
		goto out;
	}
	assert_int_equal(DSTAT(a, tx_copied), 0);
	assert_int_equal(DSTAT(a, tx_not_dma), 0);
	assert_true(DSTAT(a, tx_zero_copy) >= frags);
	/* Every rank's result comes from the same chunk memory: attached once and chained
	 * behind each rank's header (collect_iteration saw the right bytes at every rank). */
	if (nranks > 1) {
		assert_true(DSTAT(a, tx_shared) > 0);
		assert_true(DSTAT(a, tx_shared) < DSTAT(a, tx_zero_copy));
	} else {
		assert_int_equal(DSTAT(a, tx_shared), 0);
	}
	for (int r = 1; r < PBOX_DROP_COUNT; r++) {
		if (r != PBOX_DROP_STALE_ITER) {
			assert_int_equal(estat_drop(a, (enum pbox_drop_reason)r), 0);
		}
	}
	assert_tx_pools_idle(a);
out:
	for (uint32_t c = 0; c < a->s.desc.nchunks; c++) {
		free(want[c]);
	}
	free(want);
	app_close(a);
	free(a);
}

/* Arena allocator of the DMA test: pbox_dpdk_arena_ops, counted. */
struct counted_arenas {
	struct pbox_arena_ops real;
	int live;
	bool in_dpdk_memory;
};

static void *counted_alloc(void *ctx, size_t bytes, uint32_t core)
{
	struct counted_arenas *ca = ctx;
	void *p = ca->real.alloc(ca->real.ctx, bytes, core);

	if (p != NULL) {
		ca->live++;
		ca->in_dpdk_memory &= rte_mem_virt2memseg(p, NULL) != NULL;
	}
	return p;
}

static void counted_free(void *ctx, void *p, size_t bytes)
{
	struct counted_arenas *ca = ctx;

	ca->live--;
	ca->real.free(ca->real.ctx, p, bytes);
}

/*
 * Chunk arenas in DPDK memory for devices that read by DMA (net_ring told to behave as
 * one): replies are zero-copy with the payload's IOVA, shared between the workers, every
 * mbuf comes back, and every arena is freed when the job state goes. Arenas outside DPDK
 * memory on such a device: every result is copied instead.
 */
static void test_lifetime_dma_arenas(void **state)
{
	/* Static: a failed assertion leaves states for the teardown to free with them. */
	static struct counted_arenas ca;
	static struct pbox_arena_ops ops = { counted_alloc, counted_free, &ca };

	(void)state;
	ca.live = 0;
	ca.in_dpdk_memory = true;
	pbox_dpdk_arena_ops(&ca.real, (int)rte_socket_id());
	pbox_job_set_arena_ops(&ops);
	g_dma = true;
	run_aggregate(4, false, false, false);
	pbox_job_set_arena_ops(NULL);
	assert_true(ca.in_dpdk_memory);
	assert_int_equal(ca.live, 0); /* the states' arenas went with them */

	g_expect_copy = true;
	run_aggregate(2, false, false, false);
	g_dma = g_expect_copy = false;
}

static void test_aggregate_1_to_8(void **state)
{
	(void)state;
	for (uint32_t n = 1; n <= 8; n++) {
		run_aggregate(n, n % 2 == 0, n % 3 == 0, false);
	}
}

static void test_multiseg(void **state)
{
	(void)state;
	run_aggregate(3, true, false, true);
	run_aggregate(4, false, true, true);
}

/* Server-optimizer (SGD): INIT from rank 0, then push-pull; the replies of version 1
 * are held (like a NIC that has not completed them) while versions 2 and 3 are computed:
 * version 3 overwrites version 1's buffer, so the core must wait until they are freed. */
static void test_lifetime_server_opt_reclaim(void **state)
{
	static const struct pbox_keyspec keys[] = { { 7, 4096 } };
	struct sim_job_cfg jc = {
		.nranks = 2,
		.ncores = NCORES,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_SERVER_OPT,
		.optimizer = "sgd",
		.no_nodes = true,
	};
	struct app *a = calloc(1, sizeof(*a));
	const struct pbox_optimizer_ops *opt = pbox_optimizer_find("sgd");
	struct rte_mbuf *held[64];
	unsigned nheld = 0;
	uint8_t *buf = malloc(MAX_FRAME);
	float **want, *model, *v1, *g[2];
	struct reply *r = malloc(sizeof(*r));
	uint32_t nchunks, nfrags = 0;
	struct pbox_jobtab *tab2;
	struct pbox_job job2;

	(void)state;
	pbox_opt_params_default(&jc.opt);
	jc.opt.lr = 0.25f;
	app_open(a, &jc);
	/* The harness's table, reference counted as pboxd's are (one reference: published);
	 * and its successor, the same job in a new generation. */
	__atomic_store_n(&g_tab_releases, 0, __ATOMIC_RELAXED);
	a->s.tab->refs = 1;
	a->s.tab->release = count_tab_release;
	job2 = a->s.job;
	job2.generation++;
	tab2 = calloc(1, sizeof(*tab2) + sizeof(tab2->jobs[0]));
	assert_non_null(tab2);
	tab2->generation = a->s.tab->generation + 1;
	tab2->njobs = 1;
	tab2->jobs[0] = &job2;
	nchunks = a->s.desc.nchunks;
	model = malloc(4096 * 4);
	v1 = malloc(4096 * 4);
	g[0] = malloc(4096 * 4);
	g[1] = malloc(4096 * 4);
	want = calloc(nchunks, sizeof(*want));
	for (uint32_t i = 0; i < 4096; i++) {
		model[i] = (float)(i % 17) * 0.5f;
	}
	/* INIT every fragment of every chunk from rank 0. */
	for (uint32_t c = 0; c < nchunks; c++) {
		const struct pbox_chunk_desc *cd = &a->s.desc.chunks[c];

		want[c] = malloc(cd->bytes);
		nfrags += cd->nfrags;
		for (uint32_t f = 0; f < cd->nfrags; f++) {
			struct pbox_msg m = {
				.type = PBOX_MSG_INIT,
				.encoding = PBOX_ENC_F32,
				.job = 42,
				.sender = 0,
				.cookie = a->s.cookies[0],
				.chunk = c,
				.frag_off = f * 1024,
				.frag_len = pbox_frag_len(&a->s.desc, cd->bytes, f),
				.chunk_len = cd->bytes,
			};
			uint32_t len = frame_build(buf, 0, (uint16_t)(BASE_PORT + cd->core), &m,
						   model + cd->elem_off + f * 256);

			inject_buf(a, cd->core, buf, len);
		}
	}
	drain_replies(a, 200); /* the INIT ACKs */
	for (uint32_t t = 0; t < 3; t++) {
		for (uint32_t r2 = 0; r2 < 2; r2++) {
			for (uint32_t i = 0; i < 4096; i++) {
				g[r2][i] = grad(r2, t, 0, i, true);
			}
		}
		pbox_optimizer_step(opt, pbox_kernels_get(), model, NULL, NULL,
				    (const float *const *)g, 2, 4096, &a->s.job.opt_params, t + 1);
		for (uint32_t c = 0; c < nchunks; c++) {
			memcpy(want[c], model + a->s.desc.chunks[c].elem_off,
			       a->s.desc.chunks[c].bytes);
		}
		if (t == 0) {
			memcpy(v1, model, 4096 * 4);
		}
		for (uint32_t r2 = 0; r2 < 2; r2++) {
			for (uint32_t c = 0; c < nchunks; c++) {
				const struct pbox_chunk_desc *cd = &a->s.desc.chunks[c];

				for (uint32_t f = 0; f < cd->nfrags; f++) {
					struct pbox_msg m = {
						.type = PBOX_MSG_PUSH,
						.encoding = PBOX_ENC_F32,
						.flags = PBOX_F_WANT_REPLY,
						.job = 42,
						.sender = r2,
						.cookie = a->s.cookies[r2],
						.chunk = c,
						.iter = t,
						.frag_off = f * 1024,
						.frag_len = pbox_frag_len(&a->s.desc, cd->bytes, f),
						.chunk_len = cd->bytes,
						.seq = t,
					};
					uint32_t len = frame_build(
						buf, r2, (uint16_t)(BASE_PORT + cd->core), &m,
						g[r2] + cd->elem_off + f * 256);

					inject_buf(a, cd->core, buf, len);
				}
			}
		}
		if (t < 2) {
			uint32_t need = 2 * nfrags, got = 0;

			while (got < need) {
				struct rte_mbuf *m = next_reply(a, 5000);

				assert_non_null(m);
				if (!parse_reply(m, r) || r->m.type != PBOX_MSG_DATA) {
					rte_pktmbuf_free(m);
					continue;
				}
				assert_int_equal(r->m.iter, t + 1);
				assert_memory_equal(r->payload,
						    (uint8_t *)want[r->m.chunk] + r->m.frag_off,
						    r->len);
				got++;
				if (t == 0) {
					held[nheld++] = m; /* the "NIC" keeps version 1 */
				} else {
					rte_pktmbuf_free(m);
				}
			}
			continue;
		}
		/* Version 3 would overwrite version 1, still held: no reply may come, and the
		 * held payloads must still read version 1. */
		{
			struct rte_mbuf *m;
			uint32_t got = 0;

			while ((m = next_reply(a, 300)) != NULL) {
				if (parse_reply(m, r) && r->m.type == PBOX_MSG_DATA) {
					fail_msg("version %u replied while version 1 was held",
						 r->m.iter);
				}
				rte_pktmbuf_free(m);
			}
			assert_true(DSTAT(a, reclaim_waits) > 0);
			/* The core waiting for the release is RCU-offline meanwhile: a grace
			 * period completes (a core spinning online would hold up every grace
			 * period, and with them every table change, until the NIC let go). */
			{
				struct gp_probe gp;
				bool gp_ok;

				gp_probe_start(&gp);
				gp_ok = gp_probe_wait(&gp, 3000);
				if (!gp_ok) {
					for (unsigned i = 0; i < nheld; i++) {
						rte_pktmbuf_free(held[i]);
					}
					nheld = 0;
				}
				/* Retire the table the waiting cores use, as pboxd would: a
				 * new one published, a grace period, the old one's published
				 * reference dropped. Their pins keep it until they are done
				 * with the datagram (ASan would see a use after free). */
				if (gp_ok) {
					rcu_assign_pointer(a->tab, tab2);
					synchronize_rcu();
					pbox_jobtab_put(a->s.tab);
					assert_int_equal(
						__atomic_load_n(&g_tab_releases, __ATOMIC_ACQUIRE),
						0);
				}
				gp_probe_join(&gp);
				assert_true(gp_ok);
			}
			for (unsigned i = 0; i < nheld; i++) {
				assert_true(parse_reply(held[i], r));
				assert_int_equal(r->m.iter, 1);
				assert_memory_equal(
					r->payload,
					(const uint8_t *)(v1 +
							  a->s.desc.chunks[r->m.chunk].elem_off) +
						r->m.frag_off,
					r->len);
				rte_pktmbuf_free(held[i]);
			}
			while (got < 2 * nfrags) {
				m = next_reply(a, 5000);
				assert_non_null(m);
				if (parse_reply(m, r) && r->m.type == PBOX_MSG_DATA) {
					assert_int_equal(r->m.iter, 3);
					assert_memory_equal(r->payload,
							    (uint8_t *)want[r->m.chunk] +
								    r->m.frag_off,
							    r->len);
					got++;
				}
				rte_pktmbuf_free(m);
			}
		}
	}
	/* The waiting cores unpinned the retired table once done with it. */
	for (unsigned i = 0; i < 5000 && __atomic_load_n(&g_tab_releases, __ATOMIC_ACQUIRE) == 0;
	     i++) {
		sleep_offline(1);
	}
	assert_int_equal(__atomic_load_n(&g_tab_releases, __ATOMIC_ACQUIRE), 1);
	drain_replies(a, 50);
	for (uint32_t c = 0; c < nchunks; c++) {
		free(want[c]);
	}
	free(want);
	free(model);
	free(v1);
	free(g[0]);
	free(g[1]);
	free(buf);
	free(r);
	app_close(a);
	free(tab2);
	free(a);
}

/*
 * A session ends (its job leaves the table) while the "NIC" still holds zero-copy replies
 * pointing into its chunk memory, as a device with a slow or stalled TX ring would. The
 * memory must stay mapped and intact until the last of those replies is freed, and be
 * released (unmapped) then, by the cores' completion path: not before, and not never.
 * Another job's state is mapped in between: had the arenas been unmapped, it would take
 * their addresses and its bytes would go out in the held replies.
 */
static void test_lifetime_session_end(void **state)
{
	static const struct pbox_keyspec keys[] = { { 5, 8192 } };
	struct sim_job_cfg jc = {
		.nranks = 2,
		.ncores = NCORES,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	enum { MAX_HELD = 512 };
	struct app *a = calloc(1, sizeof(*a));
	struct reply *r = malloc(sizeof(*r));
	struct rte_mbuf **held = calloc(MAX_HELD, sizeof(*held));
	uint8_t *snap = malloc((size_t)MAX_HELD * 1024);
	uint32_t *lens = calloc(MAX_HELD, sizeof(*lens));
	unsigned nheld = 0, need = 0;
	struct pbox_job_state *st, *other;
	struct rte_mbuf *m;

	(void)state;
	app_open(a, &jc);
	st = a->s.job.state;
	st->release = count_release;
	__atomic_store_n(&g_state_releases, 0, __ATOMIC_RELAXED);
	for (uint32_t c = 0; c < a->s.desc.nchunks; c++) {
		need += a->s.desc.chunks[c].nfrags * jc.nranks;
	}
	push_iteration(a, 0, true, 4242, false);
	/* Hold every result fragment (and the re-sent ones the duplicates ask for). */
	while ((m = next_reply(a, nheld < need ? 5000 : 200)) != NULL) {
		if (!parse_reply(m, r) || r->m.type != PBOX_MSG_DATA) {
			rte_pktmbuf_free(m);
			continue;
		}
		assert_true(r->zero_copy);
		assert_true(nheld < MAX_HELD && r->len <= 1024);
		memcpy(snap + (size_t)nheld * 1024, r->payload, r->len);
		lens[nheld] = r->len;
		held[nheld++] = m;
	}
	assert_true(nheld >= need);
	/* The session ends as pboxd ends it: a table without the job, the grace period
	 * after which no lcore can reach the state, the transport's retire, and the
	 * session's reference dropped. */
	rcu_assign_pointer(a->tab, NULL);
	synchronize_rcu();
	pbox_dpdk_retire(a->d, st);
	a->s.job.state = NULL; /* no longer the harness's to free */
	pbox_job_state_put(st);
	other = pbox_job_state_create(&a->s.job);
	assert_non_null(other);
	for (uint32_t k = 0; k < other->ncores; k++) {
		memset(other->core[k].arena, 0x5a, other->core[k].arena_bytes);
	}
	sleep_offline(200); /* the lcores run their completion path meanwhile */
	assert_int_equal(__atomic_load_n(&g_state_releases, __ATOMIC_ACQUIRE), 0);
	assert_true(DSTAT(a, retire_waits) >= 1);
	assert_int_equal(DSTAT(a, retire_full) + DSTAT(a, retire_stalled), 0);
	for (unsigned i = 0; i < nheld; i++) {
		assert_true(parse_reply(held[i], r));
		assert_int_equal(r->len, lens[i]);
		if (memcmp(r->payload, snap + (size_t)i * 1024, r->len) != 0) {
			fail_msg("held reply %u (chunk %u offset %u) changed after the session "
				 "ended",
				 i, r->m.chunk, r->m.frag_off);
		}
	}
	/* The NIC lets go of all but one: still kept. Then the last one. */
	for (unsigned i = 1; i < nheld; i++) {
		rte_pktmbuf_free(held[i]);
	}
	sleep_offline(100);
	assert_int_equal(__atomic_load_n(&g_state_releases, __ATOMIC_ACQUIRE), 0);
	rte_pktmbuf_free(held[0]);
	for (unsigned i = 0; i < 5000 && __atomic_load_n(&g_state_releases, __ATOMIC_ACQUIRE) == 0;
	     i++) {
		sleep_offline(1);
	}
	assert_int_equal(__atomic_load_n(&g_state_releases, __ATOMIC_ACQUIRE), 1);
	pbox_job_state_free(other);
	drain_replies(a, 50);
	app_close(a);
	free(a);
	free(r);
	free(held);
	free(snap);
	free(lens);
}

/* Frames that must be ignored, each under its own counter; ARP answered. */
static void test_garbage_and_arp(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 256 } };
	struct sim_job_cfg jc = {
		.nranks = 1,
		.ncores = NCORES,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 1024,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	struct app *a = calloc(1, sizeof(*a));
	uint8_t *buf = malloc(MAX_FRAME), g[1024] = { 0 };
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)buf;
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	struct pbox_wire_hdr *ph = (struct pbox_wire_hdr *)(udp + 1);
	struct rte_arp_hdr *arp = (struct rte_arp_hdr *)(eth + 1);
	struct pbox_msg good;
	uint32_t len, owner;
	uint16_t dport;
	struct rte_mbuf *m;
	bool arp_seen = false;

	(void)state;
	app_open(a, &jc);
	owner = a->s.desc.chunks[0].core;
	dport = (uint16_t)(BASE_PORT + owner);
	good = (struct pbox_msg){
		.type = PBOX_MSG_PUSH,
		.encoding = PBOX_ENC_F32,
		.job = 42,
		.sender = 0,
		.cookie = a->s.cookies[0],
		.chunk = 0,
		.iter = 0,
		.frag_off = 0,
		.frag_len = 1024,
		.chunk_len = 1024,
	};
#define REBUILD() (len = frame_build(buf, 0, dport, &good, g))
	/* runt */
	REBUILD();
	inject_buf(a, owner, buf, 10);
	/* IPv6 */
	REBUILD();
	eth->ether_type = htons(RTE_ETHER_TYPE_IPV6);
	inject_buf(a, owner, buf, len);
	/* IPv4 to another host */
	REBUILD();
	ip->dst_addr = htonl(RTE_IPV4(10, 0, 0, 99));
	ip->hdr_checksum = 0;
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	inject_buf(a, owner, buf, len);
	/* ICMP to us */
	REBUILD();
	ip->next_proto_id = IPPROTO_ICMP;
	ip->hdr_checksum = 0;
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	inject_buf(a, owner, buf, len);
	/* UDP to a port that is no core's */
	REBUILD();
	udp->dst_port = htons(BASE_PORT + NCORES);
	inject_buf(a, owner, buf, len);
	/* bad IPv4 header checksum */
	REBUILD();
	ip->hdr_checksum ^= 0x1234;
	inject_buf(a, owner, buf, len);
	/* IP version 5 */
	REBUILD();
	ip->version_ihl = 0x55;
	inject_buf(a, owner, buf, len);
	/* a fragment */
	REBUILD();
	ip->fragment_offset = htons(RTE_IPV4_HDR_MF_FLAG);
	ip->hdr_checksum = 0;
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	inject_buf(a, owner, buf, len);
	/* IP total length beyond the frame */
	REBUILD();
	ip->total_length = htons((uint16_t)(len - 14 + 100));
	ip->hdr_checksum = 0;
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	inject_buf(a, owner, buf, len);
	/* UDP length beyond the IP packet */
	REBUILD();
	udp->dgram_len = htons((uint16_t)(len - 34 + 8));
	inject_buf(a, owner, buf, len);
	/* pbox: bad magic, truncated header, wrong cookie, unknown job */
	REBUILD();
	ph->magic = 0x12345678;
	inject_buf(a, owner, buf, len);
	REBUILD();
	udp->dgram_len = htons(8 + 40);
	ip->total_length = htons(20 + 8 + 40);
	ip->hdr_checksum = 0;
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	inject_buf(a, owner, buf, 14 + 20 + 8 + 40);
	good.cookie ^= 1;
	REBUILD();
	inject_buf(a, owner, buf, len);
	good.cookie ^= 1;
	good.job = 43;
	REBUILD();
	inject_buf(a, owner, buf, len);
	good.job = 42;
	/* ARP: a request for us (answered), one for someone else, and a reply (ignored) */
	memset(buf, 0, 64);
	memset(eth->dst_addr.addr_bytes, 0xff, 6);
	eth->src_addr.addr_bytes[0] = 0x02;
	eth->src_addr.addr_bytes[5] = 0x77;
	eth->ether_type = htons(RTE_ETHER_TYPE_ARP);
	arp->arp_hardware = htons(RTE_ARP_HRD_ETHER);
	arp->arp_protocol = htons(RTE_ETHER_TYPE_IPV4);
	arp->arp_hlen = 6;
	arp->arp_plen = 4;
	arp->arp_opcode = htons(RTE_ARP_OP_REQUEST);
	arp->arp_data.arp_sha = eth->src_addr;
	arp->arp_data.arp_sip = htonl(RTE_IPV4(10, 0, 0, 77));
	arp->arp_data.arp_tip = htonl(APP_IP);
	inject_buf(a, 1 - owner, buf, 60);
	arp->arp_data.arp_tip = htonl(RTE_IPV4(10, 0, 0, 2));
	inject_buf(a, owner, buf, 60);
	arp->arp_data.arp_tip = htonl(APP_IP);
	arp->arp_opcode = htons(RTE_ARP_OP_REPLY);
	inject_buf(a, owner, buf, 60);
	/* and a good push after all that, which must still be answered */
	REBUILD();
	inject_buf(a, 1 - owner, buf, len);

	while ((m = next_reply(a, 500)) != NULL) {
		const struct rte_ether_hdr *re = rte_pktmbuf_mtod(m, const struct rte_ether_hdr *);

		if (re->ether_type == htons(RTE_ETHER_TYPE_ARP)) {
			const struct rte_arp_hdr *ra = (const struct rte_arp_hdr *)(re + 1);
			struct rte_ether_addr mac;

			rte_eth_macaddr_get(a->port, &mac);
			assert_int_equal(ntohs(ra->arp_opcode), RTE_ARP_OP_REPLY);
			assert_int_equal(ra->arp_data.arp_sip, htonl(APP_IP));
			assert_int_equal(ra->arp_data.arp_tip, htonl(RTE_IPV4(10, 0, 0, 77)));
			assert_memory_equal(&ra->arp_data.arp_sha, &mac, 6);
			assert_memory_equal(&re->src_addr, &mac, 6);
			assert_int_equal(re->dst_addr.addr_bytes[5], 0x77);
			arp_seen = true;
		}
		rte_pktmbuf_free(m);
	}
	assert_true(arp_seen);
	assert_int_equal(DSTAT(a, truncated), 2); /* runt, IP length beyond the frame */
	assert_int_equal(DSTAT(a, ignored_l2), 1);
	assert_int_equal(DSTAT(a, ignored_l3), 3);
	assert_int_equal(DSTAT(a, bad_ip), 2);
	assert_int_equal(DSTAT(a, ip_fragments), 1);
	assert_int_equal(DSTAT(a, bad_udp), 1);
	assert_int_equal(DSTAT(a, arp_replies), 1);
	assert_int_equal(DSTAT(a, arp_ignored), 2);
	assert_int_equal(estat_drop(a, PBOX_DROP_BAD_MAGIC), 1);
	assert_int_equal(estat_drop(a, PBOX_DROP_TRUNCATED), 1);
	assert_int_equal(estat_drop(a, PBOX_DROP_BAD_COOKIE), 1);
	assert_int_equal(estat_drop(a, PBOX_DROP_UNKNOWN_JOB), 1);
	assert_int_equal(pbox_stat_read(&a->stats[owner].agg_frags), 1);
	assert_int_equal(pbox_stat_read(&a->stats[owner].iterations), 1);
	free(buf);
	app_close(a);
	free(a);
}

/* UDP checksums: net_ring has no RX offloads, so they are verified in software, across
 * segments; a wrong one is dropped under bad_udp, a right one aggregated, and one left
 * unfinished for a NIC offload (just the pseudo-header sum, as a veth delivers it)
 * accepted. */
static void test_udp_checksum(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 256 } };
	struct sim_job_cfg jc = {
		.nranks = 3,
		.ncores = NCORES,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 1024,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	struct app *a = calloc(1, sizeof(*a));
	uint8_t *buf = malloc(MAX_FRAME);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(buf + 14);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	/* inside the UDP header, and at odd offsets inside the payload */
	static const uint32_t cuts[] = { 14 + 20 + 5, 14 + 20 + 8 + 64 + 333,
					 14 + 20 + 8 + 64 + 700, 0 };
	float g[256];
	uint32_t owner, len;
	struct rte_mbuf *m;

	(void)state;
	for (uint32_t i = 0; i < 256; i++) {
		g[i] = (float)(i % 13) - 6.0f;
	}
	app_open(a, &jc);
	owner = a->s.desc.chunks[0].core;
	for (uint32_t r = 0; r < 3; r++) {
		struct pbox_msg msg = {
			.type = PBOX_MSG_PUSH,
			.encoding = PBOX_ENC_F32,
			.flags = PBOX_F_WANT_REPLY,
			.job = 42,
			.sender = r,
			.cookie = a->s.cookies[r],
			.frag_len = 1024,
			.chunk_len = 1024,
		};

		len = frame_build(buf, r, (uint16_t)(BASE_PORT + owner), &msg, g);
		udp->dgram_cksum =
			r == 2 ? rte_ipv4_phdr_cksum(ip, 0) : rte_ipv4_udptcp_cksum(ip, udp);
		assert_true(udp->dgram_cksum != 0);
		if (r == 1) {
			/* First a corrupted copy: one payload bit flipped. */
			buf[len - 1] ^= 0x10;
			inject_buf(a, owner, buf, len);
			buf[len - 1] ^= 0x10;
		}
		inject(a, owner, to_mbuf(buf, len, r == 1 ? cuts : NULL));
	}
	while ((m = next_reply(a, 500)) != NULL) {
		rte_pktmbuf_free(m);
	}
	assert_int_equal(DSTAT(a, bad_udp), 1);
	assert_int_equal(pbox_stat_read(&a->stats[owner].agg_frags), 3);
	assert_int_equal(pbox_stat_read(&a->stats[owner].iterations), 1);
	free(buf);
	app_close(a);
	free(a);
}

/* A worker leaves while the others wait for its contribution: publishing the job table
 * without it is enough, with no further datagram, for the cores to complete the
 * iteration and answer the remaining ranks with the sum of their own gradients. */
static void test_member_leaves(void **state)
{
	static const struct pbox_keyspec keys[] = { { 5, 3000 } };
	struct sim_job_cfg jc = {
		.nranks = 3,
		.ncores = NCORES,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	struct app *a = calloc(1, sizeof(*a));
	uint8_t *buf = malloc(MAX_FRAME);
	float *g = malloc(MAX_FRAME), **want;
	struct reply *r = malloc(sizeof(*r));
	struct pbox_jobtab *tab2;
	struct pbox_job job2;
	uint64_t live2;
	uint32_t nchunks, need = 0, got = 0;
	struct rte_mbuf *m;

	(void)state;
	app_open(a, &jc);
	nchunks = a->s.desc.nchunks;
	want = calloc(nchunks, sizeof(*want));
	for (uint32_t c = 0; c < nchunks; c++) {
		const struct pbox_chunk_desc *cd = &a->s.desc.chunks[c];

		want[c] = calloc(1, cd->bytes);
		need += 2 * cd->nfrags;
		for (uint32_t i = 0; i < cd->bytes / 4; i++) {
			want[c][i] = grad(0, 0, c, i, true) + grad(1, 0, c, i, true);
		}
	}
	/* Ranks 0 and 1 push iteration 0 of every chunk; rank 2 never does. */
	for (uint32_t rank = 0; rank < 2; rank++) {
		for (uint32_t c = 0; c < nchunks; c++) {
			const struct pbox_chunk_desc *cd = &a->s.desc.chunks[c];

			for (uint32_t f = 0; f < cd->nfrags; f++) {
				struct pbox_msg msg = {
					.type = PBOX_MSG_PUSH,
					.encoding = PBOX_ENC_F32,
					.flags = PBOX_F_WANT_REPLY,
					.job = 42,
					.sender = rank,
					.cookie = a->s.cookies[rank],
					.chunk = c,
					.frag_off = f * 1024,
					.frag_len = pbox_frag_len(&a->s.desc, cd->bytes, f),
					.chunk_len = cd->bytes,
				};
				uint32_t len;

				for (uint32_t i = 0; i < msg.frag_len / 4; i++) {
					g[i] = grad(rank, 0, c, f * 256 + i, true);
				}
				len = frame_build(buf, rank, (uint16_t)(BASE_PORT + cd->core), &msg,
						  g);
				inject_buf(a, cd->core, buf, len);
			}
		}
	}
	while ((m = next_reply(a, 300)) != NULL) {
		if (parse_reply(m, r) && r->m.type == PBOX_MSG_DATA) {
			fail_msg("a result while rank 2's contribution is missing");
		}
		rte_pktmbuf_free(m);
	}
	/* Rank 2 leaves: a new table, as pboxd publishes it (a new job entry with the new
	 * live set and generation, over the same job state). */
	job2 = a->s.job;
	live2 = a->s.live[0] & ~(UINT64_C(1) << 2);
	job2.live = &live2;
	job2.nlive = 2;
	job2.generation++;
	tab2 = calloc(1, sizeof(*tab2) + sizeof(tab2->jobs[0]));
	assert_non_null(tab2);
	tab2->generation = a->s.tab->generation + 1;
	tab2->njobs = 1;
	tab2->jobs[0] = &job2;
	rcu_assign_pointer(a->tab, tab2);
	while (got < need) {
		uint32_t rank;

		m = next_reply(a, 5000);
		if (m == NULL) {
			fail_msg("%u of %u result fragments 5 s after rank 2 left", got, need);
		}
		if (!parse_reply(m, r) || r->m.type != PBOX_MSG_DATA) {
			rte_pktmbuf_free(m);
			continue;
		}
		for (rank = 0; rank < 2 && a->s.cookies[rank] != r->m.cookie; rank++) {
		}
		assert_true(rank < 2);
		assert_int_equal(r->m.iter, 0);
		assert_memory_equal(r->payload, (const uint8_t *)want[r->m.chunk] + r->m.frag_off,
				    r->len);
		got++;
		rte_pktmbuf_free(m);
	}
	assert_int_equal(pbox_stat_read(&a->stats[0].iterations) +
				 pbox_stat_read(&a->stats[1].iterations),
			 nchunks);
	assert_true(pbox_stat_read(&a->stats[0].membership_changes) +
			    pbox_stat_read(&a->stats[1].membership_changes) >=
		    1);
	app_close(a); /* the lcores are stopped: the table can go */
	free(tab2);
	for (uint32_t c = 0; c < nchunks; c++) {
		free(want[c]);
	}
	free(want);
	free(g);
	free(buf);
	free(r);
	free(a);
}

/* The automatic --lcores value: ranges, one group for the unpinned lcores. (The EAL of
 * this test parses one: see group_setup.) */
static void test_lcores_arg(void **state)
{
	char buf[4096], want[64];
	cpu_set_t set;
	int cpus[64];

	(void)state;
	CPU_ZERO(&set);
	for (int c = 0; c < 64; c++) {
		CPU_SET(c, &set);
		cpus[c] = -1;
	}
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 3, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "(0-3)@(0-63)");
	/* 64 unpinned cores on 64 CPUs: still short */
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 64, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "(0-64)@(0-63)");
	/* some pinned; CPU runs and single CPUs */
	CPU_ZERO(&set);
	for (int c = 0; c < 4; c++) {
		CPU_SET(c, &set);
	}
	CPU_SET(8, &set);
	CPU_SET(10, &set);
	CPU_SET(11, &set);
	cpus[1] = 5;
	cpus[3] = 9;
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 4, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "(0-1,3)@(0-3,8,10-11),2@5,4@9");
	cpus[0] = 7;
	cpus[2] = 6;
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 4, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "(0)@(0-3,8,10-11),1@7,2@5,3@6,4@9");
	/* a run starting at RTE_MAX_LCORE starts with that id alone (EAL parser) */
	CPU_ZERO(&set);
	for (int c = RTE_MAX_LCORE; c < RTE_MAX_LCORE + 3; c++) {
		CPU_SET(c, &set);
	}
	cpus[0] = -1;
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 1, buf, sizeof(buf)), 0);
	snprintf(want, sizeof(want), "(0-1)@(%d,%d-%d)", RTE_MAX_LCORE, RTE_MAX_LCORE + 1,
		 RTE_MAX_LCORE + 2);
	assert_string_equal(buf, want);
	/* every other CPU of a large machine: fits 4 KB, not 64 bytes */
	CPU_ZERO(&set);
	for (int c = 0; c < 512; c += 2) {
		CPU_SET(c, &set);
	}
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 1, buf, sizeof(buf)), 0);
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 1, buf, 64), -E2BIG);
	CPU_ZERO(&set);
	assert_int_equal(pbox_dpdk_lcores_arg(&set, cpus, 1, buf, sizeof(buf)), -EINVAL);
}

static int teardown(void **state)
{
	(void)state;
	if (g_open != NULL) {
		app_close(g_open);
	}
	pbox_job_set_arena_ops(NULL);
	g_dma = g_expect_copy = false;
	return 0;
}

/* The EAL keeps pointers into its argv until rte_eal_cleanup, and rewrites argv itself
 * (it stores the program name over the last option): the strings are freed from
 * g_eal_strs. */
static char *g_eal_argv[16], *g_eal_strs[16];

static int group_setup(void **state)
{
	static const char *const args[] = {
		"test_dpdk_ring", "--no-huge",     "-m",       "512", "--no-pci",
		"--no-shconf",    "--lcores",      "(lcores)", /* made by pbox_dpdk_lcores_arg */
		"--log-level",    "lib.eal:error",
	};
	static const int unpinned[NCORES] = { -1, -1 };
	char **argv = g_eal_argv, lcores[64];
	int argc = (int)(sizeof(args) / sizeof(args[0]));
	cpu_set_t cpus;

	_Static_assert(sizeof(args) / sizeof(args[0]) < sizeof(g_eal_argv) / sizeof(g_eal_argv[0]),
		       "room for the EAL arguments and their NULL");

	(void)state;
	/* Every lcore on CPUs 0 and 1, as pboxd asks for unpinned cores: "(0-2)@(0-1)". */
	CPU_ZERO(&cpus);
	CPU_SET(0, &cpus);
	CPU_SET(1, &cpus);
	if (pbox_dpdk_lcores_arg(&cpus, unpinned, NCORES, lcores, sizeof(lcores)) != 0) {
		return -1;
	}
	for (int i = 0; i < argc; i++) {
		/* the EAL keeps pointers into argv */
		argv[i] = strdup(strcmp(args[i], "(lcores)") == 0 ? lcores : args[i]);
		g_eal_strs[i] = argv[i];
	}
	argv[argc] = NULL;
	if (rte_eal_init(argc, argv) < 0) {
		fprintf(stderr, "EAL initialisation failed\n");
		return -1;
	}
	rcu_register_thread();
	g_pool = rte_pktmbuf_pool_create("gen", 32767, 256, 0, MAX_FRAME / 2 + RTE_PKTMBUF_HEADROOM,
					 (int)rte_socket_id());
	return g_pool != NULL ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	rte_mempool_free(g_pool);
	rcu_unregister_thread();
	rte_eal_cleanup();
	for (size_t i = 0; i < sizeof(g_eal_strs) / sizeof(g_eal_strs[0]); i++) {
		free(g_eal_strs[i]);
		g_eal_strs[i] = NULL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_aggregate_1_to_8, teardown),
		cmocka_unit_test_teardown(test_multiseg, teardown),
		cmocka_unit_test_teardown(test_lifetime_server_opt_reclaim, teardown),
		cmocka_unit_test_teardown(test_lifetime_session_end, teardown),
		cmocka_unit_test_teardown(test_lifetime_dma_arenas, teardown),
		cmocka_unit_test_teardown(test_garbage_and_arp, teardown),
		cmocka_unit_test_teardown(test_udp_checksum, teardown),
		cmocka_unit_test_teardown(test_member_leaves, teardown),
		cmocka_unit_test(test_lcores_arg),
	};

	if (argc > 1) {
		cmocka_set_test_filter(argv[1]);
	}
	return cmocka_run_group_tests_name("dpdk_ring", tests, group_setup, group_teardown);
}
