/* SPDX-License-Identifier: BSD-3-Clause */
/* The kernel-UDP transport (transport/udp/udp.h) on loopback sockets: GSO send grouping (which
 * datagrams share a message), GRO receive splitting (datagrams come back one by one, with
 * their sizes and contents, in order, also when a call has room for fewer than a message
 * holds), the forced and the run-time fallback without GSO, and the blocking receive with
 * its wake-up. Every datagram carries its index in the header and a payload pattern
 * derived from it, so a split at a wrong offset or a lost / merged datagram fails. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <cmocka.h>

#include "common/log.h"
#include "transport/udp/udp.h"

#define PAY_MAX 2048u

/* One datagram to send: to which receiver and with how many payload bytes. */
struct dgram {
	unsigned to; /* index into the receivers */
	uint32_t len;
};

static uint8_t g_payload[512][PAY_MAX];

static struct pbox_udp *open_udp(bool no_gso, bool no_gro)
{
	struct pbox_udp_cfg cfg = {
		.addr = "127.0.0.1",
		.burst = 32,
		.sock_buf = 4 << 20,
		.no_gso = no_gso,
		.no_gro = no_gro,
	};
	struct pbox_udp *u = pbox_udp_open(&cfg);

	assert_non_null(u);
	return u;
}

static void fill(unsigned idx, struct pbox_wire_hdr *h, uint32_t len)
{
	memset(h, 0, sizeof(*h));
	h->magic = 0x70626f78u;
	h->seq = idx;
	h->frag_len = (uint16_t)len;
	for (uint32_t i = 0; i < len; i++) {
		g_payload[idx][i] = (uint8_t)(idx * 131u + i * 7u + (i >> 8));
	}
}

/* Queue d[0..n) from tx (datagram i with index i) and flush. */
static void send_all(struct pbox_udp *tx, struct pbox_udp **rx, const struct dgram *d, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct pbox_wire_hdr h;
		struct pbox_peer to;

		assert_true(i < 512 && d[i].len <= PAY_MAX);
		fill(i, &h, d[i].len);
		assert_int_equal(pbox_peer_from_str(&to, "127.0.0.1", pbox_udp_port(rx[d[i].to])),
				 0);
		assert_int_equal(
			pbox_udp_tx_ops.send(tx, &to, &h, d[i].len ? g_payload[i] : NULL, d[i].len),
			0);
	}
	pbox_udp_tx_ops.flush(tx);
}

/* Receive on rx[r] exactly the datagrams of d addressed to r, in order, `room` at most
 * per call, checking each one's size and bytes. */
static void expect_all(struct pbox_udp *rx, unsigned r, const struct dgram *d, unsigned n,
		       unsigned room)
{
	struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];
	unsigned next = 0, got = 0, idle = 0;

	while (next < n && d[next].to != r) {
		next++;
	}
	while (next < n) {
		unsigned k = pbox_udp_rx_burst(rx, pkts, room);

		assert_true(k <= room);
		if (k == 0) {
			/* loopback usually delivers within the sender's call; on a loaded
			 * machine ksoftirqd may take a while: up to 10 s */
			assert_true(++idle < 1000);
			pbox_udp_wait(rx, 10, -1);
			continue;
		}
		for (unsigned j = 0; j < k; j++) {
			struct pbox_wire_hdr h;

			assert_true(next < n);
			assert_int_equal(pkts[j].len, sizeof(h) + d[next].len);
			memcpy(&h, pkts[j].data, sizeof(h));
			assert_int_equal(h.seq, next);
			assert_int_equal(h.frag_len, d[next].len);
			assert_memory_equal(pkts[j].data + sizeof(h), g_payload[next], d[next].len);
			got++;
			do {
				next++;
			} while (next < n && d[next].to != r);
		}
	}
	/* nothing extra (a duplicate or a split piece) */
	assert_int_equal(pbox_udp_rx_burst(rx, pkts, room), 0);
	(void)got;
}

/* The test's traffic: a run of MTU-1500-sized datagrams with a short last one, a second
 * run, header-only datagrams, sizes that grow (a new message each time), and datagrams
 * alternating between two receivers (never in one message). */
static unsigned traffic(struct dgram *d)
{
	unsigned n = 0;

	for (unsigned i = 0; i < 20; i++) {
		d[n++] = (struct dgram){ 0, 1408 };
	}
	d[n++] = (struct dgram){ 0, 500 };
	for (unsigned i = 0; i < 10; i++) {
		d[n++] = (struct dgram){ 0, 1408 };
	}
	for (unsigned i = 0; i < 3; i++) {
		d[n++] = (struct dgram){ 0, 0 };
	}
	d[n++] = (struct dgram){ 0, 100 };
	d[n++] = (struct dgram){ 0, 200 };
	for (unsigned i = 0; i < 6; i++) {
		d[n++] = (struct dgram){ i % 2, 1024 };
	}
	return n;
}

/* Messages the grouping rules give for traffic(): [20 x 1408 + 500], [10 x 1408],
 * [3 x 0], [100], [200], and 6 single datagrams (alternating receivers). */
#define TRAFFIC_MSGS     11u
#define TRAFFIC_GSO_MSGS 3u

static void run_traffic(bool tx_gso, bool rx_gro, unsigned room)
{
	struct pbox_udp *tx = open_udp(!tx_gso, true);
	struct pbox_udp *rx[2] = { open_udp(true, !rx_gro), open_udp(true, !rx_gro) };
	struct dgram d[64];
	unsigned n = traffic(d);
	struct pbox_udp_info info;
	const struct pbox_udp_stats *ts = pbox_udp_stats(tx);

	pbox_udp_info(tx, &info);
	if (tx_gso && !info.gso) {
		printf("skip: the kernel has no UDP_SEGMENT\n");
		goto out;
	}
	pbox_udp_info(rx[0], &info);
	if (rx_gro && !info.gro) {
		printf("skip: the kernel has no UDP_GRO\n");
		goto out;
	}
	send_all(tx, rx, d, n);
	assert_int_equal(ts->tx_pkts, n);
	assert_int_equal(ts->tx_dropped, 0);
	assert_int_equal(ts->tx_msgs, tx_gso ? TRAFFIC_MSGS : n);
	assert_int_equal(ts->tx_gso_msgs, tx_gso ? TRAFFIC_GSO_MSGS : 0);
	expect_all(rx[0], 0, d, n, room);
	expect_all(rx[1], 1, d, n, room);
	if (tx_gso && rx_gro) {
		/* The GSO messages reach a GRO socket whole on loopback. */
		assert_int_equal(pbox_udp_stats(rx[0])->rx_gro_msgs, TRAFFIC_GSO_MSGS);
		assert_int_equal(pbox_udp_stats(rx[0])->rx_msgs, TRAFFIC_MSGS - 3);
	} else {
		assert_int_equal(pbox_udp_stats(rx[0])->rx_gro_msgs, 0);
	}
	assert_int_equal(pbox_udp_stats(rx[0])->rx_pkts + pbox_udp_stats(rx[1])->rx_pkts, n);
out:
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);
	pbox_udp_close(rx[1]);
}

/* GSO sender, receiver without GRO: the kernel segments; each datagram arrives alone. */
static void test_gso_send(void **state)
{
	(void)state;
	run_traffic(true, false, PBOX_UDP_MAX_BURST);
}

/* GSO sender, GRO receiver: messages arrive coalesced and the transport splits them. */
static void test_gro_split(void **state)
{
	(void)state;
	run_traffic(true, true, PBOX_UDP_MAX_BURST);
}

/* The same with room for 7 and for 1 datagram per call: the rest of a coalesced message
 * comes with the next calls, in order. */
static void test_gro_split_small_room(void **state)
{
	(void)state;
	run_traffic(true, true, 7);
	run_traffic(true, true, 1);
}

/* GSO off by configuration: one datagram per message, the same datagrams arrive. */
static void test_no_gso(void **state)
{
	(void)state;
	run_traffic(false, true, PBOX_UDP_MAX_BURST);
	run_traffic(false, false, PBOX_UDP_MAX_BURST);
}

/* The kernel refuses GSO at send time (SO_NO_CHECK: it will not segment without UDP
 * checksums): the transport falls back, and every datagram still arrives. */
static void test_gso_refused_fallback(void **state)
{
	struct pbox_udp *tx = open_udp(false, true);
	struct pbox_udp *rx[2] = { open_udp(true, false), open_udp(true, false) };
	struct dgram d[64];
	unsigned n = traffic(d);
	struct pbox_udp_info info;
	int one = 1;

	(void)state;
	pbox_udp_info(tx, &info);
	if (!info.gso) {
		printf("skip: the kernel has no UDP_SEGMENT\n");
		goto out;
	}
	assert_int_equal(setsockopt(pbox_udp_fd(tx), SOL_SOCKET, SO_NO_CHECK, &one, sizeof(one)),
			 0);
	send_all(tx, rx, d, n);
	pbox_udp_info(tx, &info);
	assert_false(info.gso);
	assert_int_equal(pbox_udp_stats(tx)->tx_pkts, n);
	assert_int_equal(pbox_udp_stats(tx)->tx_dropped, 0);
	assert_int_equal(pbox_udp_stats(tx)->tx_gso_msgs, 0);
	expect_all(rx[0], 0, d, n, PBOX_UDP_MAX_BURST);
	expect_all(rx[1], 1, d, n, PBOX_UDP_MAX_BURST);
out:
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);
	pbox_udp_close(rx[1]);
}

/* Message bounds: at most PBOX_UDP_GSO_MAX_SEGS datagrams and PBOX_UDP_MAX_MSG bytes. */
static void test_gso_bounds(void **state)
{
	struct pbox_udp *tx = open_udp(false, true);
	struct pbox_udp *rx[1] = { open_udp(true, false) };
	static struct dgram d[300];
	unsigned n = 0;
	struct pbox_udp_info info;

	(void)state;
	pbox_udp_info(tx, &info);
	if (!info.gso) {
		printf("skip: the kernel has no UDP_SEGMENT\n");
		goto out;
	}
	/* 100 header-only: 64 + 36 */
	for (unsigned i = 0; i < 100; i++) {
		d[n++] = (struct dgram){ 0, 0 };
	}
	/* 100 of 2048 + 64 bytes: 31 per 65507-byte message -> 31, 31, 31, 7 */
	for (unsigned i = 0; i < 100; i++) {
		d[n++] = (struct dgram){ 0, 2048 };
	}
	send_all(tx, rx, d, n);
	assert_int_equal(pbox_udp_stats(tx)->tx_pkts, n);
	assert_int_equal(pbox_udp_stats(tx)->tx_msgs, 2 + 4);
	expect_all(rx[0], 0, d, n, PBOX_UDP_MAX_BURST);
out:
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);
}

static void *waiter(void *arg)
{
	struct pbox_rx_pkt pkts[4];

	return (void *)(uintptr_t)pbox_udp_rx_wait(arg, pkts, 4, 20000);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* rx_wait returns a datagram that is queued, times out with 0, and returns 0 at once
 * after a wake from another thread (not after its 20 s timeout). */
static void test_rx_wait(void **state)
{
	struct pbox_udp *tx = open_udp(true, true);
	struct pbox_udp *rx[1] = { open_udp(true, true) };
	struct dgram d[1] = { { 0, 10 } };
	struct pbox_rx_pkt pkts[4];
	pthread_t t;
	void *ret;
	double t0;

	(void)state;
	send_all(tx, rx, d, 1);
	assert_int_equal(pbox_udp_rx_wait(rx[0], pkts, 4, 1000), 1);
	assert_int_equal(pkts[0].len, sizeof(struct pbox_wire_hdr) + 10);
	assert_int_equal(pbox_udp_rx_wait(rx[0], pkts, 4, 1), 0);
	t0 = now_s();
	assert_int_equal(pthread_create(&t, NULL, waiter, rx[0]), 0);
	nanosleep(&(struct timespec){ 0, 50000000 }, NULL); /* most likely asleep by now */
	pbox_udp_wake(rx[0]);
	pthread_join(t, &ret);
	assert_int_equal((uintptr_t)ret, 0);
	assert_true(now_s() - t0 < 10.0);
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);
}

/* rx_more: false once a receive drained the socket (fewer messages than slots), true
 * after a receive that filled every slot (the burst is 32: 40 datagrams queued), and
 * true while a coalesced GRO message still has datagrams to hand out. */
static void test_rx_more(void **state)
{
	struct pbox_udp *tx = open_udp(true, true);
	struct pbox_udp *rx[1] = { open_udp(true, true) };
	struct dgram d[40];
	struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];
	struct pbox_udp_info info;
	bool gso;

	(void)state;
	for (unsigned i = 0; i < 40; i++) {
		d[i] = (struct dgram){ 0, 100 };
	}
	send_all(tx, rx, d, 3);
	assert_int_equal(pbox_udp_rx_burst(rx[0], pkts, PBOX_UDP_MAX_BURST), 3);
	assert_false(pbox_udp_rx_more(rx[0]));
	send_all(tx, rx, d, 40);
	assert_int_equal(pbox_udp_rx_burst(rx[0], pkts, PBOX_UDP_MAX_BURST), 32);
	assert_true(pbox_udp_rx_more(rx[0]));
	assert_int_equal(pbox_udp_rx_burst(rx[0], pkts, PBOX_UDP_MAX_BURST), 8);
	assert_false(pbox_udp_rx_more(rx[0]));
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);

	/* A GSO message of 20 datagrams, received coalesced, handed out 7 at a time. */
	tx = open_udp(false, true);
	rx[0] = open_udp(true, false);
	pbox_udp_info(tx, &info);
	gso = info.gso;
	pbox_udp_info(rx[0], &info);
	if (!gso || !info.gro) {
		printf("skip (GRO part): the kernel has no UDP_SEGMENT / UDP_GRO\n");
	} else {
		for (unsigned i = 0; i < 20; i++) {
			d[i] = (struct dgram){ 0, 1408 };
		}
		send_all(tx, rx, d, 20);
		assert_int_equal(pbox_udp_rx_burst(rx[0], pkts, 7), 7);
		assert_true(pbox_udp_rx_more(rx[0]));
		assert_int_equal(pbox_udp_rx_burst(rx[0], pkts, 7), 7);
		assert_int_equal(pbox_udp_rx_burst(rx[0], pkts, 7), 6);
		assert_false(pbox_udp_rx_more(rx[0]));
	}
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);
}

/* The payload of datagram pkts[k] (sent as index idx) is where it should be: in place p
 * (placed[k] == p) or whole behind its header. */
static void check_placed(const struct pbox_rx_pkt *pk, int16_t placed, const uint8_t *dst,
			 unsigned idx, uint32_t len, int16_t want_place)
{
	struct pbox_wire_hdr h;

	assert_int_equal(placed, want_place);
	assert_int_equal(pk->len, sizeof(h) + len);
	memcpy(&h, pk->data, sizeof(h));
	assert_int_equal(h.seq, idx);
	assert_memory_equal(placed >= 0 ? dst : pk->data + sizeof(h), g_payload[idx], len);
}

/*
 * Receive placement: a datagram of exactly header + place.len bytes leaves its payload
 * in its place; a shorter one, and a header-only one, in a slot that had a place come
 * back whole (the place's bytes copied back); places are ignored where GRO can coalesce.
 */
static void test_rx_placed(void **state)
{
	struct pbox_udp *tx = open_udp(true, true);
	struct pbox_udp *rx[2] = { open_udp(true, true), open_udp(true, false) };
	struct dgram d[5] = { { 0, 1000 }, { 0, 1000 }, { 0, 500 }, { 0, 1000 }, { 0, 0 } };
	static uint8_t dst[4][1000];
	struct pbox_udp_place pl[4];
	struct pbox_rx_pkt pkts[8];
	int16_t placed[8];
	struct pbox_udp_info info;

	(void)state;
	for (unsigned i = 0; i < 4; i++) {
		pl[i].dst = dst[i];
		pl[i].len = sizeof(dst[i]);
	}
	memset(dst, 0xee, sizeof(dst));
	send_all(tx, rx, d, 5);
	/* Room for 3: three messages, the first two placed, the short one whole. */
	assert_int_equal(pbox_udp_rx_placed(rx[0], pkts, 3, pl, 4, placed, 1000), 3);
	check_placed(&pkts[0], placed[0], dst[0], 0, 1000, 0);
	check_placed(&pkts[1], placed[1], dst[1], 1, 1000, 1);
	check_placed(&pkts[2], placed[2], dst[2], 2, 500, -1);
	/* The next call's slots start again at place 0; the header-only one comes whole. */
	assert_int_equal(pbox_udp_rx_placed(rx[0], pkts, 8, pl, 4, placed, 1000), 2);
	check_placed(&pkts[0], placed[0], dst[0], 3, 1000, 0);
	check_placed(&pkts[1], placed[1], dst[1], 4, 0, -1);
	assert_int_equal(pbox_udp_stats(rx[0])->rx_placed, 3);
	assert_int_equal(pbox_udp_stats(rx[0])->rx_unplaced, 2);
	assert_int_equal(pbox_udp_rx_placed(rx[0], pkts, 8, pl, 4, placed, 1), 0);

	/* With GRO, 1000-byte places are not used (two such datagrams fit one message). */
	pbox_udp_info(rx[1], &info);
	if (info.gro) {
		struct dgram g[3] = { { 1, 1000 }, { 1, 1000 }, { 1, 1000 } };
		unsigned got = 0;

		send_all(tx, rx, g, 3);
		while (got < 3) {
			unsigned n = pbox_udp_rx_placed(rx[1], pkts, 8, pl, 4, placed, 1000);

			assert_true(n > 0);
			for (unsigned k = 0; k < n; k++, got++) {
				check_placed(&pkts[k], placed[k], NULL, got, 1000, -1);
			}
		}
		assert_int_equal(pbox_udp_stats(rx[1])->rx_placed, 0);
	}
	pbox_udp_close(tx);
	pbox_udp_close(rx[0]);
	pbox_udp_close(rx[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gso_send),
		cmocka_unit_test(test_gro_split),
		cmocka_unit_test(test_gro_split_small_room),
		cmocka_unit_test(test_no_gso),
		cmocka_unit_test(test_gso_refused_fallback),
		cmocka_unit_test(test_gso_bounds),
		cmocka_unit_test(test_rx_wait),
		cmocka_unit_test(test_rx_placed),
		cmocka_unit_test(test_rx_more),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
