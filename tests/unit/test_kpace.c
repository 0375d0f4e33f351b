/* SPDX-License-Identifier: BSD-3-Clause */
/* Kernel pacing of the kernel-UDP transport (transport/udp/kpace.h): the departure-time
 * arithmetic (one timeline per socket or per destination, a rate that can go up again,
 * the most lead, no times without a rate), the rate parser, and on loopback sockets that
 * the transport sets SO_TXTIME, says pacing is inactive there (no fq), and still delivers
 * every datagram whole and in order with the SCM_TXTIME control message beside GSO's. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
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
#include "transport/udp/kpace.h"
#include "transport/udp/udp.h"

#define MS 1000000ull

static void test_shared_timeline(void **state)
{
	struct pbox_kpace k;

	(void)state;
	assert_int_equal(pbox_kpace_init(&k, false, 1000000, 0), 0); /* 1 MB/s: 1 us a byte */
	assert_int_equal(k.max_lead_ns, PBOX_KPACE_DEFAULT_LEAD_NS);
	/* back to back: each waits for the one before; any destination shares the line */
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 1000), 1000);
	assert_int_equal(pbox_kpace_stamp(&k, 2, 2, 1000, 1000), 1001000);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 500, 1500000), 2001000);
	/* after a pause longer than the backlog: at once, no credit for the idle time */
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 10 * MS), 10 * MS);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 10 * MS), 11 * MS);
	assert_int_equal(k.stats.stamped, 5);
	assert_int_equal(k.stats.delayed, 3);
	assert_int_equal(k.stats.capped, 0);
	pbox_kpace_fini(&k);
}

/* The reason for departure times over SO_MAX_PACING_RATE: the rate may rise again. */
static void test_rate_changes(void **state)
{
	struct pbox_kpace k;

	(void)state;
	assert_int_equal(pbox_kpace_init(&k, false, 0, 0), 0);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 5), 0); /* no rate: no time */
	assert_int_equal(k.stats.stamped, 0);
	pbox_kpace_set_rate(&k, 1000000);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 0), 0);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 0), 1 * MS);
	pbox_kpace_set_rate(&k, 10000000); /* 10x faster from now on */
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 0), 2 * MS);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 0), 2 * MS + 100000);
	pbox_kpace_set_rate(&k, 0);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 0), 0);
	pbox_kpace_fini(&k);
}

static void test_per_destination(void **state)
{
	struct pbox_kpace k;

	(void)state;
	assert_int_equal(pbox_kpace_init(&k, true, 1000000, 0), 0);
	/* each worker's results on their own line: one does not wait behind another */
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000001, 7, 1000, 0), 0);
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000002, 7, 1000, 0), 0);
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000001, 8, 1000, 0), 0); /* other port */
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000001, 7, 1000, 0), 1 * MS);
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000002, 7, 2000, 0), 1 * MS);
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000002, 7, 1000, 0), 3 * MS);
	assert_int_equal(pbox_kpace_stamp(&k, 0x0a000001, 7, 1000, 0), 2 * MS);
	assert_int_equal(k.stats.shared, 0);
	pbox_kpace_fini(&k);
}

/* More destinations than the table: the rest share the socket's line, all still paced. */
static void test_table_full(void **state)
{
	struct pbox_kpace k;
	uint64_t want_shared = 0;

	(void)state;
	assert_int_equal(pbox_kpace_init(&k, true, 1000000, 1000000 * MS), 0);
	for (uint32_t i = 0; i < 3 * PBOX_KPACE_MAX_DST; i++) {
		uint64_t before = k.stats.shared;
		uint64_t t = pbox_kpace_stamp(&k, 0x0a000000 + i, 9, 1000, 0);

		if (k.stats.shared > before) {
			/* on the shared line: after every earlier message on it */
			assert_int_equal(t, want_shared);
			want_shared += 1 * MS;
		} else {
			assert_int_equal(t, 0); /* a new destination's first message */
		}
	}
	assert_true(k.stats.shared >= 2 * PBOX_KPACE_MAX_DST);
	assert_int_equal(k.stats.stamped, 3 * PBOX_KPACE_MAX_DST);
	pbox_kpace_fini(&k);
}

static void test_lead_cap(void **state)
{
	struct pbox_kpace k;
	uint64_t prev = 0;

	(void)state;
	assert_int_equal(pbox_kpace_init(&k, false, 1000000, 2 * MS), 0);
	for (unsigned i = 0; i < 10; i++) {
		uint64_t t = pbox_kpace_stamp(&k, 1, 1, 1000, 0);

		assert_true(t >= prev);
		assert_true(t <= 2 * MS); /* never held longer than the lead */
		prev = t;
	}
	assert_int_equal(prev, 2 * MS);
	assert_int_equal(k.stats.capped, 7); /* 0, 1, 2 ms fit; the rest are pulled back */
	/* time goes on: the line resumes from where the capped messages left it */
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1000, 2 * MS), 3 * MS);
	/* a message of 1.5 ms at the rate: the lead becomes two of them (3 ms), not 2 ms */
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1500, 2 * MS), 4 * MS); /* 2 ms ahead */
	assert_int_equal(k.stats.capped, 7);
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1500, 2 * MS), 5 * MS); /* 5.5: capped */
	assert_int_equal(pbox_kpace_stamp(&k, 1, 1, 1500, 2 * MS), 5 * MS);
	assert_int_equal(k.stats.capped, 9);
	assert_int_equal(k.stats.lead_max_ns, 4500000); /* the last one: 6.5 ms at 2 ms */
	pbox_kpace_fini(&k);
}

static void test_parse_rate(void **state)
{
	uint64_t r = 0;

	(void)state;
	assert_int_equal(pbox_kpace_parse_rate("1g", &r), 0);
	assert_int_equal(r, 125000000);
	assert_int_equal(pbox_kpace_parse_rate("200m", &r), 0);
	assert_int_equal(r, 25000000);
	assert_int_equal(pbox_kpace_parse_rate("1000000000", &r), 0);
	assert_int_equal(r, 125000000);
	assert_int_equal(pbox_kpace_parse_rate("500kbit", &r), 0);
	assert_int_equal(r, 62500);
	assert_int_equal(pbox_kpace_parse_rate("1Gbit", &r), 0);
	assert_int_equal(r, 125000000);
	assert_int_equal(pbox_kpace_parse_rate("", &r), -EINVAL);
	assert_int_equal(pbox_kpace_parse_rate(NULL, &r), -EINVAL);
	assert_int_equal(pbox_kpace_parse_rate("0", &r), -EINVAL);
	assert_int_equal(pbox_kpace_parse_rate("7", &r), -EINVAL); /* under 1 byte/s */
	assert_int_equal(pbox_kpace_parse_rate("1t", &r), -EINVAL);
	assert_int_equal(pbox_kpace_parse_rate("-1g", &r), -EINVAL);
	assert_int_equal(pbox_kpace_parse_rate("1g ", &r), -EINVAL);
	assert_int_equal(pbox_kpace_parse_rate("99999999999999999999", &r), -EINVAL);
}

static struct pbox_udp *open_udp(bool kpace, bool per_dst, uint64_t rate)
{
	struct pbox_udp_cfg cfg = {
		.addr = "127.0.0.1",
		.burst = 32,
		.sock_buf = 4 << 20,
		.kpace = kpace,
		.kpace_per_dst = per_dst,
		.kpace_rate_Bps = rate,
	};
	struct pbox_udp *u = pbox_udp_open(&cfg);

	assert_non_null(u);
	return u;
}

static struct sock_txtime get_txtime(struct pbox_udp *u)
{
	struct sock_txtime st;
	socklen_t l = sizeof(st);

	memset(&st, 0xff, sizeof(st));
	assert_int_equal(getsockopt(pbox_udp_fd(u), SOL_SOCKET, SO_TXTIME, &st, &l), 0);
	return st;
}

/* On loopback: the option is set, the log line says the times are ignored here, and
 * paced sends (GSO runs and single datagrams, to two receivers) arrive whole, in order. */
static void test_socket(void **state)
{
	struct pbox_udp *tx = open_udp(true, true, 2000000); /* 16 Mbit/s: times ahead */
	struct pbox_udp *off = open_udp(false, false, 0);
	struct pbox_udp *rx[2] = { open_udp(false, false, 0), open_udp(false, false, 0) };
	struct pbox_udp_info info;
	struct sock_txtime st = get_txtime(tx);
	char buf[320];
	static uint8_t pay[64][1400];
	unsigned got[2] = { 0, 0 };
	const unsigned n = 64;

	(void)state;
	assert_int_equal(st.clockid, CLOCK_MONOTONIC);
	assert_int_equal(st.flags, 0);
	assert_int_equal(get_txtime(off).clockid, 0); /* untouched: the kernel's default */
	pbox_udp_info(tx, &info);
	assert_true(info.kpace);
	assert_int_equal(info.kpace_egress, 0);
	assert_non_null(strstr(pbox_udp_info_str(tx, buf, sizeof(buf)), "kernel pacing INACTIVE"));
	assert_non_null(strstr(buf, "loopback"));
	assert_non_null(strstr(pbox_udp_info_str(off, buf, sizeof(buf)), "kernel pacing off"));
	assert_false(pbox_udp_kpace(off));
	for (unsigned i = 0; i < n; i++) {
		struct pbox_wire_hdr h;
		struct pbox_peer to;
		uint32_t len = i % 9 == 8 ? 300 : 1400; /* GSO runs, cut by short ones */

		memset(&h, 0, sizeof(h));
		h.seq = i;
		h.frag_len = (uint16_t)len;
		memset(pay[i], (int)(i + 1), len);
		assert_int_equal(pbox_peer_from_str(&to, "127.0.0.1", pbox_udp_port(rx[i / 32])),
				 0);
		assert_int_equal(pbox_udp_tx_ops.send(tx, &to, &h, pay[i], len), 0);
	}
	pbox_udp_tx_ops.flush(tx);
	assert_int_equal(pbox_udp_stats(tx)->tx_pkts, n);
	assert_true(pbox_udp_stats(tx)->tx_gso_msgs > 0);
	assert_int_equal(pbox_udp_kpace_stats(tx)->stamped, pbox_udp_stats(tx)->tx_msgs);
	assert_true(pbox_udp_kpace_stats(tx)->delayed > 0);
	for (unsigned r = 0; r < 2; r++) {
		struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];

		while (got[r] < 32) {
			unsigned k = pbox_udp_rx_wait(rx[r], pkts, PBOX_UDP_MAX_BURST, 2000);

			assert_true(k > 0);
			for (unsigned j = 0; j < k; j++) {
				const struct pbox_wire_hdr *h = (const void *)pkts[j].data;
				unsigned i = 32 * r + got[r];

				assert_int_equal(h->seq, i);
				assert_int_equal(pkts[j].len, sizeof(*h) + h->frag_len);
				assert_memory_equal(pkts[j].data + sizeof(*h), pay[i], h->frag_len);
				got[r]++;
			}
		}
	}
	pbox_udp_close(tx);
	pbox_udp_close(off);
	pbox_udp_close(rx[0]);
	pbox_udp_close(rx[1]);
}

/* A message built again after the kernel refused it (here the GSO fallback: SO_NO_CHECK
 * makes the kernel refuse UDP_SEGMENT) keeps the departure time its datagrams got: the
 * timeline advances once for their bytes, not once per attempt. */
static void test_resend_keeps_times(void **state)
{
	struct pbox_udp *tx = open_udp(true, false, 100000000); /* 800 Mbit/s */
	struct pbox_udp *rx = open_udp(false, false, 0);
	static uint8_t pay[1400];
	struct pbox_peer to;
	struct pbox_udp_info info;
	const int one = 1;
	const unsigned n = 20;
	unsigned got = 0;

	(void)state;
	pbox_udp_info(tx, &info);
	if (!info.gso) {
		skip(); /* no GSO on this kernel: nothing to fall back from */
	}
	assert_int_equal(setsockopt(pbox_udp_fd(tx), SOL_SOCKET, SO_NO_CHECK, &one, sizeof(one)),
			 0);
	assert_int_equal(pbox_peer_from_str(&to, "127.0.0.1", pbox_udp_port(rx)), 0);
	for (unsigned i = 0; i < n; i++) {
		struct pbox_wire_hdr h;

		memset(&h, 0, sizeof(h));
		h.seq = i;
		h.frag_len = sizeof(pay);
		assert_int_equal(pbox_udp_tx_ops.send(tx, &to, &h, pay, sizeof(pay)), 0);
	}
	pbox_udp_tx_ops.flush(tx);
	pbox_udp_info(tx, &info);
	assert_false(info.gso); /* the kernel refused the run; sent one per message */
	assert_int_equal(pbox_udp_stats(tx)->tx_pkts, n);
	assert_int_equal(pbox_udp_stats(tx)->tx_gso_msgs, 0);
	/* one stamp, for the refused run; the 20 single messages reuse its time */
	assert_int_equal(pbox_udp_kpace_stats(tx)->stamped, 1);
	assert_int_equal(pbox_udp_kpace_stats(tx)->lead_max_ns, 0);
	while (got < n) {
		struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];
		unsigned k = pbox_udp_rx_wait(rx, pkts, PBOX_UDP_MAX_BURST, 2000);

		assert_true(k > 0);
		got += k;
	}
	assert_int_equal(got, n);
	pbox_udp_close(tx);
	pbox_udp_close(rx);
}

/* The egress check: traffic to 127.0.0.1 leaves from loopback, which ignores the times;
 * every interface's answer is a verdict or an error, always with a reason. */
static void test_egress(void **state)
{
	uint32_t lo = htonl(INADDR_LOOPBACK), src = 0;
	char why[256];
	int rc;

	(void)state;
	assert_int_equal(pbox_kpace_route_src(lo, &src), 0);
	assert_int_equal(src, lo);
	assert_int_equal(pbox_kpace_egress(src, why, sizeof(why)), 0);
	assert_non_null(strstr(why, "loopback"));
	rc = pbox_kpace_egress(0, why, sizeof(why));
	assert_true(rc == 0 || rc == 1 || rc < 0);
	assert_true(why[0] != '\0');
	/* a reason longer than the buffer is cut, never overrun */
	rc = pbox_kpace_egress(0, why, 8);
	assert_true(strlen(why) < 8);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shared_timeline), cmocka_unit_test(test_rate_changes),
		cmocka_unit_test(test_per_destination), cmocka_unit_test(test_table_full),
		cmocka_unit_test(test_lead_cap),        cmocka_unit_test(test_parse_rate),
		cmocka_unit_test(test_socket),          cmocka_unit_test(test_resend_keeps_times),
		cmocka_unit_test(test_egress),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
