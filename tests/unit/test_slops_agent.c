/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The probe agent (ctrlplane/probe/agent.h):
 *  - the responder's packet logic, without sockets, on a virtual clock: sessions need a
 *    HELLO of full length, answer only the token's own address, hold one stream whose
 *    report carries what arrived; the table, the per-address share, the HELLO rate and
 *    idle expiry bound its state; no reply is longer than its request;
 *  - the controller's messages (probe_msg.h): a request is decoded strictly and refused
 *    above the agent's limits; a result survives encode/decode, and bad ones are refused;
 *  - the prober against a responder thread on loopback: it completes, and it never sent
 *    faster than its cap (bytes sent over the time taken, and the fastest stream).
 *    Loopback is not rate-limited: the estimate itself is not checked here (the netns
 *    test does that on tbf links), only what holds however busy the machine is.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent.h"
#include "probe_msg.h"
#include "probe_wire.h"

#define S 1000000000LL

static struct sockaddr_in addr(uint32_t ip, uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };

	a.sin_addr.s_addr = htonl(ip);
	a.sin_port = htons(port);
	return a;
}

static size_t input(struct pbox_probe_responder *r, struct sockaddr_in *from, const void *pkt,
		    size_t len, int64_t now, struct pbox_probe_msg *reply)
{
	uint8_t out[PBOX_PROBE_REQ_BYTES];
	size_t n = pbox_probe_responder_input(r, (struct sockaddr *)from, sizeof(*from), pkt, len,
					      now, now, out, sizeof(out));

	assert_true(n <= len);
	if (n) {
		assert_int_equal(pbox_probe_decode(out, n, reply), 0);
	}
	return n;
}

static uint64_t hello(struct pbox_probe_responder *r, struct sockaddr_in *from, uint64_t nonce,
		      int64_t now)
{
	uint8_t b[PBOX_PROBE_REQ_BYTES];
	struct pbox_probe_msg m;
	size_t len = pbox_probe_encode_hello(b, sizeof(b), nonce);

	if (input(r, from, b, len, now, &m) == 0) {
		return 0;
	}
	assert_int_equal(m.type, PBOX_PROBE_HELLO_ACK);
	assert_true(m.u.ack.nonce == nonce);
	return m.token;
}

static void test_responder_session(void **state)
{
	struct pbox_probe_responder *r = pbox_probe_responder_create(NULL);
	struct sockaddr_in a = addr(0x0a000001, 4000), other = addr(0x0a000009, 4000);
	uint8_t b[1500];
	struct pbox_probe_msg m;
	struct pbox_probe_responder_stats st;
	uint64_t token;
	int i;

	(void)state;
	assert_non_null(r);
	/* A HELLO shorter than the longest reply is not answered. */
	pbox_probe_encode_hello(b, sizeof(b), 1);
	assert_int_equal(input(r, &a, b, PBOX_PROBE_REQ_BYTES - 1, S, &m), 0);
	token = hello(r, &a, 1, S);
	assert_true(token != 0);
	assert_true(hello(r, &a, 1, S) == token); /* retransmitted: the same session */
	/* A stream of 50 packets 100 us apart, one lost, a delay growing 2 us per packet. */
	for (i = 0; i < 50; i++) {
		size_t len = pbox_probe_encode_data(b, sizeof(b), 1000, token, 7, (uint16_t)i, 50,
						    100000, 100000LL * i);

		if (i == 20) {
			continue;
		}
		assert_int_equal(pbox_probe_responder_input(r, (struct sockaddr *)&a, sizeof(a), b,
							    len, S, 5 * S + 102000LL * i, NULL, 0),
				 0);
		/* The same datagram from elsewhere, and a duplicate, change nothing. */
		pbox_probe_responder_input(r, (struct sockaddr *)&other, sizeof(other), b, len, S,
					   S, NULL, 0);
		pbox_probe_responder_input(r, (struct sockaddr *)&a, sizeof(a), b, len, S, S, NULL,
					   0);
	}
	pbox_probe_encode_report_req(b, sizeof(b), token, 7);
	assert_int_equal(input(r, &other, b, PBOX_PROBE_REQ_BYTES, S, &m), 0);
	assert_int_equal(input(r, &a, b, PBOX_PROBE_REQ_BYTES, S, &m), PBOX_PROBE_REPORT_BYTES);
	assert_int_equal(m.type, PBOX_PROBE_REPORT);
	assert_int_equal(m.u.report.count, 50);
	assert_int_equal(m.u.report.received, 49);
	assert_int_equal(m.u.report.rx_bytes, 49 * (1000 + PBOX_PROBE_IPUDP_BYTES));
	assert_true(m.u.report.pct_ppm > 900000 && m.u.report.pdt_ppm > 900000);
	assert_int_equal(m.u.report.rx_span_ns, 102000LL * 49);
	/* A late packet of an older stream does not reset the current one. */
	pbox_probe_encode_data(b, sizeof(b), 1000, token, 6, 0, 50, 100000, 0);
	pbox_probe_responder_input(r, (struct sockaddr *)&a, sizeof(a), b, 1000, S, S, NULL, 0);
	pbox_probe_encode_report_req(b, sizeof(b), token, 7);
	assert_int_equal(input(r, &a, b, PBOX_PROBE_REQ_BYTES, S, &m), PBOX_PROBE_REPORT_BYTES);
	assert_int_equal(m.u.report.received, 49);
	/* A report for a stream it never saw: count 0 (the prober takes it as all lost). */
	pbox_probe_encode_report_req(b, sizeof(b), token, 8);
	assert_int_equal(input(r, &a, b, PBOX_PROBE_REQ_BYTES, S, &m), PBOX_PROBE_REPORT_BYTES);
	assert_int_equal(m.u.report.count, 0);
	/* BYE ends the session: its token is dead. */
	assert_int_equal(input(r, &a, b, pbox_probe_encode_bye(b, sizeof(b), token), S, &m), 0);
	pbox_probe_encode_report_req(b, sizeof(b), token, 7);
	assert_int_equal(input(r, &a, b, PBOX_PROBE_REQ_BYTES, S, &m), 0);
	pbox_probe_responder_get_stats(r, &st);
	assert_int_equal(st.sessions_opened, 1);
	assert_int_equal(st.sessions_closed, 1);
	assert_int_equal(st.drop_duplicate, 49);
	assert_int_equal(st.drop_stream, 1);
	assert_true(st.drop_bad_token >= 50);
	assert_true(st.tx_bytes <= st.rx_bytes);
	pbox_probe_responder_destroy(r);
}

static void test_responder_bounds(void **state)
{
	struct pbox_probe_responder_conf conf = {
		.max_sessions = 3, .max_per_addr = 2, .hello_per_s = 10, .idle_ns = 2 * S
	};
	struct pbox_probe_responder *r = pbox_probe_responder_create(&conf);
	struct sockaddr_in a1 = addr(0x0a000001, 1), a2 = addr(0x0a000001, 2);
	struct sockaddr_in a3 = addr(0x0a000001, 3), b1 = addr(0x0a000002, 1);
	struct sockaddr_in c1 = addr(0x0a000003, 1);
	struct pbox_probe_responder_stats st;
	uint64_t n;

	(void)state;
	assert_true(hello(r, &a1, 1, S) != 0);
	assert_true(hello(r, &a2, 2, S) != 0);
	assert_true(hello(r, &a3, 3, S) == 0); /* third from one address */
	assert_true(hello(r, &b1, 4, S) != 0);
	assert_true(hello(r, &c1, 5, S) == 0); /* table full */
	assert_int_equal(pbox_probe_responder_sessions(r, S), 3);
	/* Idle sessions expire and make room. */
	assert_int_equal(pbox_probe_responder_sessions(r, 4 * S), 0);
	assert_true(hello(r, &c1, 5, 4 * S) != 0);
	/* The HELLO rate: 10 per second, as deep; 3 used at t=1 s, refilled by t=4 s. */
	for (n = 0; n < 20; n++) {
		struct sockaddr_in x = addr(0x0b000000 + (uint32_t)n, 1);

		hello(r, &x, 100 + n, 10 * S); /* the table takes 3 of them */
	}
	pbox_probe_responder_get_stats(r, &st);
	assert_int_equal(st.drop_full, 2 + 17);
	for (n = 0; n < 20; n++) {
		struct sockaddr_in x = addr(0x0c000000 + (uint32_t)n, 1);

		hello(r, &x, 200 + n, 13 * S); /* expired table: 3 sessions, then full */
	}
	pbox_probe_responder_get_stats(r, &st);
	assert_int_equal(st.sessions_opened, 3 + 1 + 3 + 3);
	pbox_probe_responder_destroy(r);

	/* The rate limit itself, with a big table. */
	conf.max_sessions = 100;
	conf.max_per_addr = 100;
	r = pbox_probe_responder_create(&conf);
	for (n = 0; n < 30; n++) {
		hello(r, &a1, 1000 + n, S);
	}
	pbox_probe_responder_get_stats(r, &st);
	assert_int_equal(st.sessions_opened, 10);
	assert_int_equal(st.drop_rate, 20);
	hello(r, &a1, 2000, S + S / 2); /* half a second: 5 more */
	pbox_probe_responder_get_stats(r, &st);
	assert_int_equal(st.sessions_opened, 11);
	pbox_probe_responder_destroy(r);
}

struct serve_arg {
	struct pbox_probe_responder *r;
	int fd;
	volatile sig_atomic_t stop;
	int rc;
};

static void *serve_thread(void *p)
{
	struct serve_arg *a = p;

	a->rc = pbox_probe_responder_serve(a->r, a->fd, &a->stop);
	return NULL;
}

static void test_prober_loopback_cap(void **state)
{
	struct serve_arg a = { .r = pbox_probe_responder_create(NULL) };
	struct sockaddr_storage ss;
	struct pbox_probe_request req;
	struct pbox_probe_result res;
	socklen_t len = sizeof(ss);
	pthread_t t;

	(void)state;
	assert_non_null(a.r);
	struct sockaddr_in any = addr(0x7f000001, 0); /* an ephemeral port */

	a.fd = pbox_probe_listen((struct sockaddr *)&any, sizeof(any));
	assert_true(a.fd >= 0);
	assert_int_equal(getsockname(a.fd, (struct sockaddr *)&ss, &len), 0);
	assert_int_equal(pthread_create(&t, NULL, serve_thread, &a), 0);

	pbox_probe_request_defaults(&req);
	req.peer = ss;
	req.peer_len = len;
	req.cap_bps = 30e6;
	req.budget_ns = 3 * S;
	assert_int_equal(pbox_probe_run(&req, &res), 0);
	print_message("loopback, cap 30 Mbit/s: [%.1f, %.1f] flags %#x, %u streams, %.2f s\n",
		      res.r_min_bps / 1e6, res.r_max_bps / 1e6, res.flags, res.streams,
		      res.duration_ns / 1e9);
	assert_true(res.streams >= 1);
	assert_true(res.max_stream_bps <= req.cap_bps);
	/* Every stream is followed by a gap at least as long: half the cap on average. */
	assert_true((double)res.bytes_sent * 8e9 / (double)res.duration_ns <= req.cap_bps / 2);
	assert_true(res.duration_ns <= req.budget_ns + 1 * S);
	assert_true(res.r_min_bps >= req.min_bps && res.r_max_bps <= req.cap_bps);

	/* Bad requests, and a port where nothing listens. */
	req.cap_bps = req.min_bps;
	assert_int_equal(pbox_probe_run(&req, &res), -EINVAL);
	a.stop = 1;
	pthread_join(t, NULL);
	assert_int_equal(a.rc, 0);
	close(a.fd);
	req.cap_bps = 30e6;
	req.reply_timeout_ns = 100000000;
	assert_true(pbox_probe_run(&req, &res) < 0); /* -ECONNREFUSED or -ETIMEDOUT */
	pbox_probe_responder_destroy(a.r);
}

static void test_parse_addr(void **state)
{
	struct sockaddr_storage ss;
	socklen_t len;

	(void)state;
	assert_int_equal(pbox_probe_parse_addr("10.1.2.3", 55001, &ss, &len), 0);
	assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 55001);
	assert_int_equal(pbox_probe_parse_addr("10.1.2.3:7", 55001, &ss, &len), 0);
	assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 7);
	assert_int_equal(pbox_probe_parse_addr("[::1]:9", 55001, &ss, &len), 0);
	assert_int_equal(ss.ss_family, AF_INET6);
	assert_int_equal(pbox_probe_parse_addr("::1", 55001, &ss, &len), 0);
	assert_int_equal(pbox_probe_parse_addr(":9", 55001, &ss, &len), 0);
	assert_int_equal(pbox_probe_parse_addr("10.1.2.3:0", 55001, &ss, &len), -EINVAL);
	assert_int_equal(pbox_probe_parse_addr("10.1.2.3:70000", 55001, &ss, &len), -EINVAL);
	assert_int_equal(pbox_probe_parse_addr("10.1.2.3:", 55001, &ss, &len), -EINVAL);
	assert_int_equal(pbox_probe_parse_addr("[::1", 55001, &ss, &len), -EINVAL);
}

static json_t *parse(const char *text)
{
	json_t *j = json_loads(text, 0, NULL);

	assert_non_null(j);
	return j;
}

static void test_messages(void **state)
{
	static const char *const bad_requests[] = {
		"[]",
		"{\"cap_bps\": 1e8, \"budget_ms\": 5000}",
		"{\"peer\": \"probe.example\", \"cap_bps\": 1e8, \"budget_ms\": 5000}",
		"{\"peer\": \"10.0.0.2\", \"cap_bps\": \"1e8\", \"budget_ms\": 5000}",
		"{\"peer\": \"10.0.0.2\", \"cap_bps\": 1e8, \"budget_ms\": 5000.5}",
		"{\"peer\": \"10.0.0.2\", \"cap_bps\": 1e8, \"budget_ms\": 0}",
		"{\"peer\": \"10.0.0.2\", \"cap_bps\": 1e8, \"budget_ms\": 5000, \"x\": 1}",
		"{\"peer\": \"10.0.0.2\", \"cap_bps\": 1e8, \"budget_ms\": 5000, "
		"\"stream_len\": 401}",
		"{\"peer\": \"10.0.0.2\", \"cap_bps\": 5e5, \"budget_ms\": 5000}",
	};
	static const char *const bad_results[] = {
		"{\"r_min_bps\": 2e8, \"r_max_bps\": 1e8, \"flags\": [], \"timestamp_ns\": 1, "
		"\"duration_ns\": 1}",
		"{\"r_min_bps\": 1e8, \"r_max_bps\": 2e8, \"flags\": [\"x\"], "
		"\"timestamp_ns\": 1, \"duration_ns\": 1}",
		"{\"r_min_bps\": -1, \"r_max_bps\": 2e8, \"flags\": [], \"timestamp_ns\": 1, "
		"\"duration_ns\": 1}",
		"{\"r_min_bps\": 1e8, \"r_max_bps\": 2e8, \"flags\": [], \"timestamp_ns\": 1}",
		"{\"r_min_bps\": 1e8, \"r_max_bps\": 2e8, \"grey_min_bps\": 3, "
		"\"grey_max_bps\": 2, \"flags\": [], \"timestamp_ns\": 1, \"duration_ns\": 1}",
	};
	struct pbox_probe_limits lim = { .max_cap_bps = 1e9, .max_budget_ns = 10 * S };
	struct pbox_probe_request req, req2;
	struct pbox_probe_result res = { 0 }, res2;
	char err[128];
	json_t *j;
	size_t i;

	(void)state;
	j = parse("{\"peer\": \"10.0.0.2:7000\", \"cap_bps\": 2e8, \"budget_ms\": 5000, "
		  "\"streams\": 6}");
	assert_int_equal(pbox_probe_request_from_json(j, &lim, &req, err, sizeof(err)), 0);
	json_decref(j);
	assert_true(req.cap_bps == 2e8 && req.budget_ns == 5 * S && req.streams == 6);
	assert_int_equal(req.stream_len, PBOX_SLOPS_STREAM_LEN);
	assert_int_equal(ntohs(((struct sockaddr_in *)&req.peer)->sin_port), 7000);
	j = pbox_probe_request_to_json(&req);
	assert_int_equal(pbox_probe_request_from_json(j, &lim, &req2, err, sizeof(err)), 0);
	json_decref(j);
	assert_true(req2.cap_bps == req.cap_bps && req2.budget_ns == req.budget_ns &&
		    req2.peer_len == req.peer_len && !memcmp(&req2.peer, &req.peer, req.peer_len));
	/* Above the agent's limits: refused, not clipped. */
	j = parse("{\"peer\": \"10.0.0.2\", \"cap_bps\": 2e9, \"budget_ms\": 5000}");
	assert_int_equal(pbox_probe_request_from_json(j, &lim, &req, err, sizeof(err)), -EPERM);
	json_decref(j);
	j = parse("{\"peer\": \"10.0.0.2\", \"cap_bps\": 2e8, \"budget_ms\": 20000}");
	assert_int_equal(pbox_probe_request_from_json(j, &lim, &req, err, sizeof(err)), -EPERM);
	json_decref(j);
	for (i = 0; i < sizeof(bad_requests) / sizeof(bad_requests[0]); i++) {
		j = parse(bad_requests[i]);
		assert_int_equal(pbox_probe_request_from_json(j, &lim, &req, err, sizeof(err)),
				 -EINVAL);
		json_decref(j);
	}

	res.r_min_bps = 48e6;
	res.r_max_bps = 51e6;
	res.grey_min_bps = 0;
	res.grey_max_bps = -1; /* none */
	res.adr_bps = 60e6;
	res.flags = PBOX_SLOPS_F_CONVERGED | PBOX_SLOPS_F_SENDER_LIMITED;
	res.fleets = 7;
	res.streams = 70;
	res.bytes_sent = 123456789;
	res.timestamp_ns = 1795591961026128689LL;
	res.duration_ns = 2 * S;
	j = pbox_probe_result_to_json(&res, "10.0.0.2:55001");
	assert_int_equal(pbox_probe_result_from_json(j, &res2, err, sizeof(err)), 0);
	json_decref(j);
	assert_true(res2.r_min_bps == res.r_min_bps && res2.r_max_bps == res.r_max_bps);
	assert_true(res2.grey_min_bps > res2.grey_max_bps); /* still none */
	assert_int_equal(res2.flags, res.flags);
	assert_true(res2.timestamp_ns == res.timestamp_ns && res2.duration_ns == res.duration_ns);
	assert_true(res2.bytes_sent == res.bytes_sent && res2.fleets == 7 && res2.streams == 70);
	for (i = 0; i < sizeof(bad_results) / sizeof(bad_results[0]); i++) {
		j = parse(bad_results[i]);
		assert_int_equal(pbox_probe_result_from_json(j, &res2, err, sizeof(err)), -EINVAL);
		json_decref(j);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_responder_session),
		cmocka_unit_test(test_responder_bounds),
		cmocka_unit_test(test_prober_loopback_cap),
		cmocka_unit_test(test_parse_addr),
		cmocka_unit_test(test_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
