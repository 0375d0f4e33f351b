/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the SLoPS probe protocol (ctrlplane/probe): the datagram decoder both
 * ends use (pbox_probe_decode), the responder's packet logic
 * (pbox_probe_responder_input), which anyone can reach on its UDP port, and the JSON
 * request/result messages between pbox-ctrld and the agents.
 *
 * The first byte chooses the mode (its value modulo 3):
 *  - 0: the rest is one datagram for the decoder; what decodes is encoded again with
 *    the matching encoder and must decode to the same message;
 *  - 2: the rest is JSON text for the controller's messages (probe_msg.h): a decoded
 *    request stays within the agent's limits, and requests and results survive being
 *    encoded and decoded again;
 *  - 1: a responder (table size, per-address share and HELLO rate from the next bytes)
 *    receives a sequence of events, each chosen by one byte: a structured datagram (the
 *    input picks the source among 3 addresses, the type, a token: the one that address
 *    was given, another, or 0, and each field; optionally one byte corrupted), a raw
 *    datagram, or the clock advancing (short steps, or past the session idle time).
 *
 * Invariants beyond the sanitizers: no reply is longer than the datagram that caused it,
 * and no address ever got more bytes than it sent (no amplification, no reflection); a
 * reply decodes and is a HELLO_ACK or a REPORT; a REPORT answers only a source holding
 * that session's token; the open sessions never exceed the table, nor the per-address
 * share for any address.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>

#include "agent.h"
#include "probe_msg.h"
#include "common/log.h"
#include "fuzz.h"
#include "harness.h"
#include "probe_wire.h"

#define NADDR 3

static void check_same(const struct pbox_probe_msg *a, const struct pbox_probe_msg *b)
{
	FUZZ_CHECK(a->type == b->type && a->token == b->token, "type/token changed");
	switch (a->type) {
	case PBOX_PROBE_HELLO:
		FUZZ_CHECK(a->u.hello.nonce == b->u.hello.nonce, "hello");
		break;
	case PBOX_PROBE_HELLO_ACK:
		FUZZ_CHECK(!memcmp(&a->u.ack, &b->u.ack, sizeof(a->u.ack)), "ack");
		break;
	case PBOX_PROBE_DATA:
		FUZZ_CHECK(a->u.data.stream == b->u.data.stream && a->u.data.seq == b->u.data.seq &&
				   a->u.data.count == b->u.data.count &&
				   a->u.data.period_ns == b->u.data.period_ns &&
				   a->u.data.send_ns == b->u.data.send_ns,
			   "data");
		break;
	case PBOX_PROBE_REPORT_REQ:
		FUZZ_CHECK(a->u.report_req.stream == b->u.report_req.stream, "report_req");
		break;
	case PBOX_PROBE_REPORT:
		FUZZ_CHECK(!memcmp(&a->u.report, &b->u.report, sizeof(a->u.report)), "report");
		break;
	default:
		break;
	}
}

static void decode_roundtrip(const uint8_t *d, size_t n)
{
	struct pbox_probe_msg m, m2;
	uint8_t b[PBOX_PROBE_MAX_DATAGRAM];
	size_t len = 0;

	if (pbox_probe_decode(d, n, &m) != 0) {
		return;
	}
	switch (m.type) {
	case PBOX_PROBE_HELLO:
		len = pbox_probe_encode_hello(b, sizeof(b), m.u.hello.nonce);
		break;
	case PBOX_PROBE_HELLO_ACK:
		len = pbox_probe_encode_ack(b, sizeof(b), m.token, m.u.ack.nonce,
					    m.u.ack.max_stream_len, m.u.ack.max_datagram);
		break;
	case PBOX_PROBE_DATA:
		len = pbox_probe_encode_data(b, sizeof(b), n, m.token, m.u.data.stream,
					     m.u.data.seq, m.u.data.count, m.u.data.period_ns,
					     m.u.data.send_ns);
		break;
	case PBOX_PROBE_REPORT_REQ:
		len = pbox_probe_encode_report_req(b, sizeof(b), m.token, m.u.report_req.stream);
		break;
	case PBOX_PROBE_REPORT:
		len = pbox_probe_encode_report(b, sizeof(b), m.token, &m);
		break;
	case PBOX_PROBE_BYE:
		len = pbox_probe_encode_bye(b, sizeof(b), m.token);
		break;
	default:
		FUZZ_CHECK(0, "decoded an unknown type %u", m.type);
	}
	FUZZ_CHECK(len > 0 && len <= n, "re-encoded type %u: %zu bytes from %zu", m.type, len, n);
	FUZZ_CHECK(pbox_probe_decode(b, len, &m2) == 0, "re-encoded type %u does not decode",
		   m.type);
	check_same(&m, &m2);
}

struct peer {
	struct sockaddr_in sa;
	uint64_t token;  /* from its last HELLO_ACK */
	uint64_t rx, tx; /* bytes it sent to the responder, and got back */
};

static size_t build(struct fz *f, struct peer *p, uint8_t *b, size_t cap)
{
	uint64_t token;
	size_t len = 0;

	switch (fz_below(f, 3)) {
	case 0:
		token = p->token;
		break;
	case 1:
		token = fz_u64(f);
		break;
	default:
		token = 0;
		break;
	}
	switch (fz_below(f, 6)) {
	case 0:
		len = pbox_probe_encode_hello(b, cap, fz_u8(f));
		break;
	case 1: {
		/* One read per statement: C leaves the order of argument evaluation open. */
		uint16_t count = (uint16_t)(2 + fz_below(f, 40));
		uint16_t seq = (uint16_t)fz_below(f, count + 1); /* sometimes out of range */
		size_t dlen = PBOX_PROBE_DATA_HDR + fz_below(f, 200);
		uint32_t stream = fz_below(f, 4);
		uint32_t period = fz_bool(f) ? 100000 : fz_u32(f);
		int64_t send_ns = (int64_t)fz_u64(f);

		len = pbox_probe_encode_data(b, cap, dlen, token, stream, seq, count, period,
					     send_ns);
		break;
	}
	case 2:
		len = pbox_probe_encode_report_req(b, cap, token, fz_below(f, 4));
		break;
	case 3:
		len = pbox_probe_encode_bye(b, cap, token);
		break;
	case 4: {
		uint64_t nonce = fz_u64(f);
		uint16_t max_len = fz_u16(f);
		uint16_t max_dgram = fz_u16(f);

		len = pbox_probe_encode_ack(b, cap, token, nonce, max_len, max_dgram);
		break;
	}
	default: {
		struct pbox_probe_msg m = { .type = PBOX_PROBE_REPORT };

		m.u.report.count = (uint16_t)fz_below(f, 10);
		len = pbox_probe_encode_report(b, cap, token, &m);
		break;
	}
	}
	if (len > 0 && fz_bool(f)) {
		size_t at = fz_below(f, (uint32_t)len);

		b[at] = fz_u8(f);
	}
	if (len > 0 && fz_bool(f)) {
		len = fz_below(f, (uint32_t)len + 1); /* truncated */
	}
	return len;
}

static void responder_session(struct fz *f)
{
	struct pbox_probe_responder_conf conf = {
		.max_sessions = 1 + fz_below(f, 4),
		.max_per_addr = 1 + fz_below(f, 3),
		.hello_per_s = 1 + fz_below(f, 200),
		.idle_ns = 1000000000,
	};
	struct pbox_probe_responder *r = pbox_probe_responder_create(&conf);
	struct peer peers[NADDR];
	int64_t now = 1000000000;
	unsigned i, events = 0;

	FUZZ_CHECK(r != NULL, "responder_create");
	memset(peers, 0, sizeof(peers));
	for (i = 0; i < NADDR; i++) {
		peers[i].sa.sin_family = AF_INET;
		/* Two ports on one address, and another address: per-address limits. */
		peers[i].sa.sin_addr.s_addr = htonl(i < 2 ? 0x0a000001 : 0x0a000002);
		peers[i].sa.sin_port = htons((uint16_t)(40000 + i));
	}
	while (!fz_empty(f) && events++ < 2000) {
		uint8_t pkt[512], reply[PBOX_PROBE_REQ_BYTES];
		struct pbox_probe_msg m;
		struct peer *p = &peers[fz_below(f, NADDR)];
		size_t len, out;
		uint8_t op = fz_below(f, 8);

		if (op >= 6) {
			now += op == 6 ? fz_u16(f) * 1000 : 2000000000;
			continue;
		}
		if (op == 5) {
			len = fz_below(f, sizeof(pkt) + 1);
			fz_bytes(f, pkt, len);
		} else {
			len = build(f, p, pkt, sizeof(pkt));
		}
		out = pbox_probe_responder_input(r, (struct sockaddr *)&p->sa, sizeof(p->sa), pkt,
						 len, now, now + fz_u16(f), reply, sizeof(reply));
		p->rx += len;
		p->tx += out;
		FUZZ_CHECK(out <= len, "a %zu-byte reply to %zu bytes", out, len);
		FUZZ_CHECK(p->tx <= p->rx, "peer got %llu bytes for %llu",
			   (unsigned long long)p->tx, (unsigned long long)p->rx);
		if (out) {
			FUZZ_CHECK(pbox_probe_decode(reply, out, &m) == 0, "reply does not decode");
			FUZZ_CHECK(m.type == PBOX_PROBE_HELLO_ACK || m.type == PBOX_PROBE_REPORT,
				   "reply type %u", m.type);
			if (m.type == PBOX_PROBE_HELLO_ACK) {
				p->token = m.token;
			} else {
				FUZZ_CHECK(m.token == p->token && p->token != 0,
					   "a REPORT to a peer without that session");
			}
		}
		FUZZ_CHECK(pbox_probe_responder_sessions(r, now) <= conf.max_sessions,
			   "sessions over the table");
	}
	pbox_probe_responder_destroy(r);
}

/* A controller's request or an agent's result as JSON text: what decodes must encode
 * and decode again to the same message; requests never pass the agent's limits. */
static void json_messages(const uint8_t *d, size_t n)
{
	struct pbox_probe_limits lim = { .max_cap_bps = 1e9, .max_budget_ns = 10000000000LL };
	struct pbox_probe_request req, req2;
	struct pbox_probe_result res, res2;
	json_t *j = json_loadb((const char *)d, n, JSON_DECODE_ANY, NULL), *k;
	char err[128];

	if (j == NULL) {
		return;
	}
	if (pbox_probe_request_from_json(j, &lim, &req, err, sizeof(err)) == 0) {
		FUZZ_CHECK(req.cap_bps <= lim.max_cap_bps && req.budget_ns <= lim.max_budget_ns &&
				   req.cap_bps > req.min_bps,
			   "request past the limits");
		k = pbox_probe_request_to_json(&req);
		FUZZ_CHECK(k != NULL, "request_to_json");
		FUZZ_CHECK(pbox_probe_request_from_json(k, &lim, &req2, err, sizeof(err)) == 0,
			   "re-encoded request refused: %s", err);
		FUZZ_CHECK(req2.cap_bps == req.cap_bps && req2.budget_ns == req.budget_ns &&
				   req2.streams == req.streams &&
				   req2.stream_len == req.stream_len &&
				   req2.max_datagram == req.max_datagram,
			   "request changed");
		json_decref(k);
	}
	if (pbox_probe_result_from_json(j, &res, err, sizeof(err)) == 0) {
		k = pbox_probe_result_to_json(&res, "peer");
		FUZZ_CHECK(k != NULL, "result_to_json");
		FUZZ_CHECK(pbox_probe_result_from_json(k, &res2, err, sizeof(err)) == 0,
			   "re-encoded result refused: %s", err);
		FUZZ_CHECK(res2.r_min_bps == res.r_min_bps && res2.r_max_bps == res.r_max_bps &&
				   res2.flags == res.flags &&
				   res2.timestamp_ns == res.timestamp_ns &&
				   (res2.grey_min_bps > res2.grey_max_bps) ==
					   (res.grey_min_bps > res.grey_max_bps),
			   "result changed");
		json_decref(k);
	}
	json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f;

	pbox_log_set_sink(pbox_test_log_silent, NULL);
	fz_init(&f, data, size);
	switch (fz_u8(&f) % 3) {
	case 0: {
		size_t n;
		const uint8_t *rest = fz_rest(&f, &n);

		decode_roundtrip(rest, n);
		break;
	}
	case 1:
		responder_session(&f);
		break;
	default: {
		size_t n;
		const uint8_t *rest = fz_rest(&f, &n);

		json_messages(rest, n);
		break;
	}
	}
	return 0;
}
