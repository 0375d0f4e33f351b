/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Probe datagrams: encoders and the validating decoder (see probe_wire.h). Fields are
 * read and written byte by byte in little endian, never through a cast of the buffer
 * (no alignment or endianness assumptions about what arrives).
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "probe_wire.h"
#include "slops.h"

static_assert(PBOX_PROBE_ACK_BYTES <= PBOX_PROBE_REQ_BYTES, "HELLO_ACK must not amplify");
static_assert(PBOX_PROBE_REPORT_BYTES <= PBOX_PROBE_REQ_BYTES, "REPORT must not amplify");
static_assert(PBOX_SLOPS_MAX_STREAM_LEN <= UINT16_MAX, "count and seq are u16");

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)v);
	put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)get16(p) | (uint32_t)get16(p + 2) << 16;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Header and zeroed padding up to len; returns len or 0 if it does not fit. */
static size_t start(uint8_t *b, size_t cap, size_t len, uint8_t type, uint64_t token)
{
	if (cap < len) {
		return 0;
	}
	memset(b, 0, len);
	put32(b, PBOX_PROBE_MAGIC);
	b[4] = PBOX_PROBE_VERSION;
	b[5] = type;
	put64(b + 8, token);
	return len;
}

size_t pbox_probe_encode_hello(void *buf, size_t cap, uint64_t nonce)
{
	uint8_t *b = buf;

	if (!start(b, cap, PBOX_PROBE_REQ_BYTES, PBOX_PROBE_HELLO, 0)) {
		return 0;
	}
	put64(b + 16, nonce);
	return PBOX_PROBE_REQ_BYTES;
}

size_t pbox_probe_encode_ack(void *buf, size_t cap, uint64_t token, uint64_t nonce,
			     uint16_t max_stream_len, uint16_t max_datagram)
{
	uint8_t *b = buf;

	if (!start(b, cap, PBOX_PROBE_ACK_BYTES, PBOX_PROBE_HELLO_ACK, token)) {
		return 0;
	}
	put64(b + 16, nonce);
	put16(b + 24, max_stream_len);
	put16(b + 26, max_datagram);
	return PBOX_PROBE_ACK_BYTES;
}

size_t pbox_probe_encode_data(void *buf, size_t cap, size_t len, uint64_t token, uint32_t stream,
			      uint16_t seq, uint16_t count, uint32_t period_ns, int64_t send_ns)
{
	uint8_t *b = buf;

	if (len < PBOX_PROBE_DATA_HDR || len > PBOX_PROBE_MAX_DATAGRAM ||
	    !start(b, cap, len, PBOX_PROBE_DATA, token)) {
		return 0;
	}
	put32(b + 16, stream);
	put16(b + 20, seq);
	put16(b + 22, count);
	put32(b + 24, period_ns);
	put64(b + 32, (uint64_t)send_ns);
	return len;
}

void pbox_probe_stamp_data(void *buf, int64_t send_ns)
{
	put64((uint8_t *)buf + 32, (uint64_t)send_ns);
}

size_t pbox_probe_encode_report_req(void *buf, size_t cap, uint64_t token, uint32_t stream)
{
	uint8_t *b = buf;

	if (!start(b, cap, PBOX_PROBE_REQ_BYTES, PBOX_PROBE_REPORT_REQ, token)) {
		return 0;
	}
	put32(b + 16, stream);
	return PBOX_PROBE_REQ_BYTES;
}

size_t pbox_probe_encode_report(void *buf, size_t cap, uint64_t token,
				const struct pbox_probe_msg *m)
{
	uint8_t *b = buf;

	if (!start(b, cap, PBOX_PROBE_REPORT_BYTES, PBOX_PROBE_REPORT, token)) {
		return 0;
	}
	put32(b + 16, m->u.report.stream);
	put16(b + 20, m->u.report.count);
	put16(b + 22, m->u.report.received);
	put64(b + 24, m->u.report.rx_bytes);
	put64(b + 32, (uint64_t)m->u.report.send_excess_ns);
	put64(b + 40, (uint64_t)m->u.report.duration_ns);
	put64(b + 48, (uint64_t)m->u.report.rx_span_ns);
	put32(b + 56, (uint32_t)m->u.report.pct_ppm);
	put32(b + 60, (uint32_t)m->u.report.pdt_ppm);
	return PBOX_PROBE_REPORT_BYTES;
}

size_t pbox_probe_encode_bye(void *buf, size_t cap, uint64_t token)
{
	return start(buf, cap, PBOX_PROBE_HDR_BYTES, PBOX_PROBE_BYE, token);
}

int pbox_probe_decode(const void *buf, size_t len, struct pbox_probe_msg *out)
{
	const uint8_t *b = buf;

	if (len < PBOX_PROBE_HDR_BYTES || get32(b) != PBOX_PROBE_MAGIC ||
	    b[4] != PBOX_PROBE_VERSION) {
		return -EBADMSG;
	}
	memset(out, 0, sizeof(*out));
	out->type = b[5];
	out->token = get64(b + 8);
	if (get16(b + 6) != 0) {
		return -EPROTO;
	}
	switch (out->type) {
	case PBOX_PROBE_HELLO:
		if (len < PBOX_PROBE_REQ_BYTES || out->token != 0) {
			return -EPROTO;
		}
		out->u.hello.nonce = get64(b + 16);
		return 0;
	case PBOX_PROBE_HELLO_ACK:
		if (len < PBOX_PROBE_ACK_BYTES || get32(b + 28) != 0) {
			return -EPROTO;
		}
		out->u.ack.nonce = get64(b + 16);
		out->u.ack.max_stream_len = get16(b + 24);
		out->u.ack.max_datagram = get16(b + 26);
		return 0;
	case PBOX_PROBE_DATA:
		if (len < PBOX_PROBE_DATA_HDR || len > PBOX_PROBE_MAX_DATAGRAM ||
		    get32(b + 28) != 0) {
			return -EPROTO;
		}
		out->u.data.stream = get32(b + 16);
		out->u.data.seq = get16(b + 20);
		out->u.data.count = get16(b + 22);
		out->u.data.period_ns = get32(b + 24);
		out->u.data.send_ns = (int64_t)get64(b + 32);
		if (out->u.data.count < 2 || out->u.data.count > PBOX_SLOPS_MAX_STREAM_LEN ||
		    out->u.data.seq >= out->u.data.count || out->u.data.period_ns < 1000 ||
		    out->u.data.period_ns > 1000000000) {
			return -EPROTO;
		}
		return 0;
	case PBOX_PROBE_REPORT_REQ:
		if (len < PBOX_PROBE_REQ_BYTES) {
			return -EPROTO;
		}
		out->u.report_req.stream = get32(b + 16);
		return 0;
	case PBOX_PROBE_REPORT:
		if (len < PBOX_PROBE_REPORT_BYTES) {
			return -EPROTO;
		}
		out->u.report.stream = get32(b + 16);
		out->u.report.count = get16(b + 20);
		out->u.report.received = get16(b + 22);
		out->u.report.rx_bytes = get64(b + 24);
		out->u.report.send_excess_ns = (int64_t)get64(b + 32);
		out->u.report.duration_ns = (int64_t)get64(b + 40);
		out->u.report.rx_span_ns = (int64_t)get64(b + 48);
		out->u.report.pct_ppm = (int32_t)get32(b + 56);
		out->u.report.pdt_ppm = (int32_t)get32(b + 60);
		if (out->u.report.count > PBOX_SLOPS_MAX_STREAM_LEN ||
		    out->u.report.received > out->u.report.count ||
		    out->u.report.pct_ppm < -1000000 || out->u.report.pct_ppm > 1000000 ||
		    out->u.report.pdt_ppm < -1000000 || out->u.report.pdt_ppm > 1000000 ||
		    out->u.report.rx_span_ns < 0 || out->u.report.duration_ns < 0) {
			return -EPROTO;
		}
		return 0;
	case PBOX_PROBE_BYE:
		return 0;
	default:
		return -EPROTO;
	}
}
