/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The probe protocol's datagrams (UDP, its own port, default PBOX_PROBE_PORT): one
 * encoder per message and one decoder for all, which validates everything a hostile
 * peer could send.
 *
 * Every datagram starts with a 16-byte header, little endian:
 *
 *   offset 0  u32 magic "PBSP"      4  u8 version (1)   5  u8 type   6  u16 zero
 *          8  u64 token: the session's (0 in HELLO)
 *
 *   HELLO      (sender -> responder)  + u64 nonce; padded to PBOX_PROBE_REQ_BYTES
 *   HELLO_ACK  (responder -> sender)  + u64 nonce, u16 max stream length,
 *                                       u16 max datagram, u32 zero: 32 bytes
 *   DATA       (sender -> responder)  + u32 stream, u16 seq, u16 count, u32 period_ns,
 *                                       u32 zero, u64 send_ns; padded to the stream's size
 *   REPORT_REQ (sender -> responder)  + u32 stream; padded to PBOX_PROBE_REQ_BYTES
 *   REPORT     (responder -> sender)  + u32 stream, u16 count, u16 received,
 *                                       u64 rx_bytes, i64 send_excess_ns, i64 duration_ns,
 *                                       i64 rx_span_ns, i32 pct_ppm (-1000000: none),
 *                                       i32 pdt_ppm: 64 bytes
 *   BYE        (sender -> responder)  header only
 *
 * Anti-amplification: each reply (HELLO_ACK, REPORT) is no longer than the request that
 * triggers it (requests are padded to PBOX_PROBE_REQ_BYTES), so a spoofed source gets at
 * most the bytes it sent; the decoder rejects short requests.
 *
 * Thread safety: pure functions.
 */
#ifndef PBOX_PROBE_WIRE_H
#define PBOX_PROBE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define PBOX_PROBE_MAGIC        0x50534250u /* "PBSP" little endian */
#define PBOX_PROBE_VERSION      1
#define PBOX_PROBE_PORT         55001 /* pathload's UDP port */
#define PBOX_PROBE_PORT_STR     "55001"
#define PBOX_PROBE_HDR_BYTES    16
#define PBOX_PROBE_REQ_BYTES    64 /* HELLO and REPORT_REQ: at least the size of any reply */
#define PBOX_PROBE_ACK_BYTES    32
#define PBOX_PROBE_DATA_HDR     40 /* DATA before its padding */
#define PBOX_PROBE_REPORT_BYTES 64
#define PBOX_PROBE_MAX_DATAGRAM 9000 /* UDP payload: the largest MTU we probe with */
#define PBOX_PROBE_IPUDP_BYTES  28   /* IPv4 + UDP headers, counted in the rates */

enum pbox_probe_type {
	PBOX_PROBE_HELLO = 1,
	PBOX_PROBE_HELLO_ACK = 2,
	PBOX_PROBE_DATA = 3,
	PBOX_PROBE_REPORT_REQ = 4,
	PBOX_PROBE_REPORT = 5,
	PBOX_PROBE_BYE = 6,
};

struct pbox_probe_msg {
	uint8_t type;
	uint64_t token;
	union {
		struct {
			uint64_t nonce;
		} hello;
		struct {
			uint64_t nonce;
			uint16_t max_stream_len, max_datagram;
		} ack;
		struct {
			uint32_t stream;
			uint16_t seq, count;
			uint32_t period_ns;
			int64_t send_ns;
		} data;
		struct {
			uint32_t stream;
		} report_req;
		struct {
			uint32_t stream;
			uint16_t count, received;
			uint64_t rx_bytes;
			int64_t send_excess_ns, duration_ns, rx_span_ns;
			int32_t pct_ppm, pdt_ppm;
		} report;
	} u;
};

/*
 * Decode and validate one datagram of len bytes. Checks magic, version, type, the
 * reserved fields (zero), each type's minimum length (requests: PBOX_PROBE_REQ_BYTES),
 * DATA's count (2..PBOX_SLOPS_MAX_STREAM_LEN), seq < count and period (1 us..1 s),
 * a REPORT's received <= count and its PCT/PDT ranges.
 * Returns 0, -EBADMSG (not ours: magic/version), -EPROTO (ours but malformed).
 */
int pbox_probe_decode(const void *buf, size_t len, struct pbox_probe_msg *out);

/* Encoders: write the message (with padding for HELLO, REPORT_REQ and DATA) into buf of
 * cap bytes and return its length, or 0 when cap is too small. DATA's `len` is the UDP
 * payload size wanted (PBOX_PROBE_DATA_HDR .. PBOX_PROBE_MAX_DATAGRAM). */
size_t pbox_probe_encode_hello(void *buf, size_t cap, uint64_t nonce);
size_t pbox_probe_encode_ack(void *buf, size_t cap, uint64_t token, uint64_t nonce,
			     uint16_t max_stream_len, uint16_t max_datagram);
size_t pbox_probe_encode_data(void *buf, size_t cap, size_t len, uint64_t token, uint32_t stream,
			      uint16_t seq, uint16_t count, uint32_t period_ns, int64_t send_ns);
size_t pbox_probe_encode_report_req(void *buf, size_t cap, uint64_t token, uint32_t stream);
size_t pbox_probe_encode_report(void *buf, size_t cap, uint64_t token,
				const struct pbox_probe_msg *report);
size_t pbox_probe_encode_bye(void *buf, size_t cap, uint64_t token);

/* Rewrite only the send timestamp of an encoded DATA datagram (the sender fills the rest
 * of a stream's packets ahead and stamps each just before it leaves). */
void pbox_probe_stamp_data(void *buf, int64_t send_ns);

#endif /* PBOX_PROBE_WIRE_H */
