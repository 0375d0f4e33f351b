/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: TSB's decoders of untrusted bytes.
 *
 * The first byte chooses the target:
 *  - even: the rest is a control-channel line, decoded as a tree position event
 *    (common/tsbmsg.c: pbox_tsb_pos_decode, for a rank and job size the input chooses) and,
 *    as the client does with the register answer, as a session key (pbox_tsb_key_parse).
 *    A position that decodes must satisfy every rule the decoder promises, and encode back
 *    to an event that decodes to the same position.
 *  - odd: a worker node with a session key and a position (parent rank 1, children 2 and
 *    3) is fed broadcast fragments (libpbox/relay.c through pbox_node_rx): each built by the
 *    harness with fields the input chooses, a MAC that is right or wrong, a source that is
 *    the parent, the appliance, or anyone, and optionally corrupted bytes; or raw bytes.
 *    Invariants: a fragment is forwarded only if its MAC verifies under the key and it came
 *    from the parent or the appliance, byte for byte as received, to the children only,
 *    and only once per receipt; nothing with a bad MAC is ever counted as received.
 */
#include <arpa/inet.h>
#include <errno.h>

#include <jansson.h>

#include "common/log.h"
#include "common/tsb.h"
#include "common/tsbmsg.h"
#include "fuzz.h"
#include "harness.h"
#include "libpbox/node.h"

#define JOB     42
#define NELEM   600
#define MAXDG   (PBOX_WIRE_HDR_LEN + 1024)
#define NEVENTS 64

static const struct pbox_tsb_key g_key = { { 7,  7,  7,  7,  1,  2,  3,  4,  5,  6,  7,
					     8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18,
					     19, 20, 21, 22, 23, 24, 25, 26, 27, 28 } };

struct fix {
	struct pbox_jobdesc desc;
	struct pbox_node *node;
	struct pbox_peer core, parent, child[2];
	const uint8_t *last; /* the datagram being received */
	uint32_t last_len;
	bool last_ok; /* it must verify */
	uint32_t fwd; /* forwards seen for it */
	bool serving; /* it is a child's PULL: answers come from the cache */
	uint32_t served;
	uint64_t now_ns;
};

static int tx_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		   const void *payload, uint32_t len)
{
	struct fix *x = ctx;
	uint8_t buf[MAXDG];
	struct pbox_msg m;

	if (to->port == x->core.port) {
		return 0; /* the node's own requests (pulls): fuzz_node checks those */
	}
	FUZZ_CHECK(len <= MAXDG - PBOX_WIRE_HDR_LEN, "a %u-byte payload", len);
	memcpy(buf, hdr, PBOX_WIRE_HDR_LEN);
	if (len != 0) {
		memcpy(buf + PBOX_WIRE_HDR_LEN, payload, len);
	}
	FUZZ_CHECK(pbox_wire_decode(buf, PBOX_WIRE_HDR_LEN + len, &m) == PBOX_DROP_NONE,
		   "an undecodable datagram to port %u", ntohs(to->port));
	if (to->port == x->parent.port && to->ip == x->parent.ip) {
		/* a repair request to the parent */
		FUZZ_CHECK(m.type == PBOX_MSG_PULL && m.cookie == pbox_tsb_cookie(&g_key),
			   "type %u to the parent", m.type);
		return 0;
	}
	FUZZ_CHECK(to->port == x->child[0].port || to->port == x->child[1].port,
		   "sent to port %u, not a child", ntohs(to->port));
	FUZZ_CHECK(pbox_tsb_verify(&g_key, buf, PBOX_WIRE_HDR_LEN + len),
		   "a fragment without a valid MAC sent to a child");
	FUZZ_CHECK(x->last != NULL, "a datagram to a child outside a receive");
	if (x->serving) {
		x->served++;
		return 0;
	}
	FUZZ_CHECK(x->last_ok, "a fragment forwarded that must not be");
	FUZZ_CHECK(len + PBOX_WIRE_HDR_LEN == x->last_len &&
			   memcmp(buf, x->last, PBOX_WIRE_HDR_LEN + len) == 0,
		   "the forwarded datagram is not the one received");
	x->fwd++;
	return 0;
}

static const struct pbox_tx_ops g_tx = {
	.send = tx_send,
	.flush = pbox_test_tx_flush,
	.queued = pbox_test_tx_queued,
	.reclaim = pbox_test_tx_reclaim,
};

static void on_done(struct pbox_op *op, void *arg)
{
	(void)op;
	(void)arg;
}

static void fuzz_position(struct fz *f)
{
	uint32_t workers = 1 + fz_u8(f) % 80, self = fz_u8(f) % workers;
	json_t *j = json_loadb((const char *)f->p, f->n, 0, NULL);
	struct pbox_tsb_pos pos, back;
	struct pbox_tsb_key k;
	char err[200];

	if (json_is_string(j)) {
		(void)pbox_tsb_key_parse(json_string_value(j), &k);
	}
	if (j == NULL || pbox_tsb_pos_decode(j, workers, self, &pos, err, sizeof(err)) != 0) {
		json_decref(j);
		return;
	}
	json_decref(j);
	FUZZ_CHECK(pos.revision >= 1, "revision %llu", (unsigned long long)pos.revision);
	FUZZ_CHECK(pos.parent == PBOX_TSB_ROOT || (pos.parent < workers && pos.parent != self),
		   "parent %u", pos.parent);
	FUZZ_CHECK((pos.parent == PBOX_TSB_ROOT) == (pos.parent_addr.port == 0),
		   "parent address and parent disagree");
	FUZZ_CHECK(pos.nchildren <= PBOX_TSB_MAX_DEGREE, "%u children", pos.nchildren);
	for (uint32_t c = 0; c < pos.nchildren; c++) {
		FUZZ_CHECK(pos.child[c] < workers && pos.child[c] != self &&
				   pos.child[c] != pos.parent && pos.child_addr[c].port != 0,
			   "child %u", pos.child[c]);
		for (uint32_t d = 0; d < c; d++) {
			FUZZ_CHECK(pos.child[d] != pos.child[c], "child %u twice", pos.child[c]);
		}
	}
	j = pbox_tsb_pos_encode(&pos);
	FUZZ_CHECK(j != NULL, "encode");
	FUZZ_CHECK(pbox_tsb_pos_decode(j, workers, self, &back, err, sizeof(err)) == 0,
		   "re-decode: %s", err);
	json_decref(j);
	FUZZ_CHECK(memcmp(&pos, &back, sizeof(pos)) == 0, "the round trip changed the position");
}

static void fuzz_relay(struct fz *f)
{
	static const struct pbox_keyspec keys[] = { { 1, NELEM } };
	struct fix x = { 0 };
	struct pbox_tsb_pos pos = { .revision = 1, .parent = 1, .nchildren = 2, .child = { 2, 3 } };
	struct pbox_tsb_key wrong = g_key;
	uint64_t cookie = pbox_tsb_cookie(&g_key);
	uint32_t frag = 256u << (fz_u8(f) % 3); /* 256, 512 or 1024 */
	char err[200];
	static float dst[NELEM], src[NELEM];
	struct pbox_op op = { .kind = PBOX_OP_PULL, .key = 0, .iter = 0, .dst = dst };
	uint64_t prev_rx = 0;

	if (pbox_jobdesc_build(&x.desc, keys, 1, 4, 1, 1024, frag, NULL, err, sizeof(err)) != 0) {
		return;
	}
	x.core.ip = htonl(0x0a000001);
	x.core.port = htons(10000);
	x.parent.ip = htonl(0x0a000002);
	x.parent.port = htons(20001);
	for (int c = 0; c < 2; c++) {
		x.child[c].ip = htonl(0x0a000003u + (uint32_t)c);
		x.child[c].port = htons((uint16_t)(20002 + c));
	}
	pos.parent_addr = x.parent;
	memcpy(pos.child_addr, x.child, sizeof(x.child));
	{
		struct pbox_node_cfg nc = {
			.desc = &x.desc,
			.job = JOB,
			.rank = 0,
			.cookie = 0x1234,
			.server_opt = true,
			.cores = &x.core,
			.tx = &g_tx,
			.tx_ctx = &x,
			.now_ns = pbox_test_clock,
			.now_arg = &x.now_ns,
			.staleness = fz_u8(f) & 1 ? UINT32_MAX : 0,
			.done = on_done,
		};

		x.node = pbox_node_create(&nc);
	}
	if (x.node == NULL || pbox_node_tsb_key(x.node, &g_key) != 0 ||
	    pbox_node_tsb_position(x.node, &pos) != 0) {
		pbox_node_destroy(x.node);
		pbox_jobdesc_free(&x.desc);
		return;
	}
	(void)src;
	if (fz_u8(f) & 1) {
		pbox_node_submit(x.node, &op);
	}
	wrong.b[fz_u8(f) % PBOX_TSB_KEY_BYTES] ^= (uint8_t)(1u << (fz_u8(f) % 8));
	for (int e = 0; e < NEVENTS && !fz_empty(f); e++) {
		uint8_t dg[MAXDG], how = fz_u8(f);
		uint32_t len;
		struct pbox_peer from;
		const struct pbox_node_stats *st = pbox_node_stats(x.node);
		bool mac_ok = false, src_ok;

		switch (how % 3) {
		case 0:
			from = x.parent;
			break;
		case 1:
			from = x.core;
			break;
		default:
			from.ip = htonl(0x0a000009);
			from.port = htons(fz_u16(f));
			break;
		}
		src_ok = how % 3 != 2 || (from.ip == x.core.ip && from.port == x.core.port);
		if ((how & 0x88) == 0x08) {
			/* a child's repair request, from a child's address or not */
			uint32_t c = fz_u8(f) % x.desc.nchunks;
			struct pbox_msg m = {
				.type = PBOX_MSG_PULL,
				.flags = PBOX_F_RETRANSMIT,
				.job = JOB,
				.sender = 2 + fz_u8(f) % 2u,
				.cookie = fz_u8(f) & 7 ? cookie : fz_u64(f),
				.chunk = c,
				.iter = fz_u8(f) % 3u,
				.chunk_len = x.desc.chunks[c].bytes,
			};

			if (fz_u8(f) & 1) {
				m.flags |= PBOX_F_SACK;
				m.arg0 = m.iter;
				m.sack = fz_u8(f);
			}
			if (fz_u8(f) & 1) {
				from = x.child[m.sender - 2];
			}
			pbox_wire_encode(&m, (struct pbox_wire_hdr *)dg);
			x.last = dg;
			x.last_len = PBOX_WIRE_HDR_LEN;
			x.last_ok = false;
			x.serving = true;
			pbox_node_rx(x.node, dg, PBOX_WIRE_HDR_LEN, &from);
			x.serving = false;
			x.last = NULL;
			continue;
		}
		if (how & 0x80) {
			/* raw bytes */
			len = PBOX_MIN((uint32_t)fz_u16(f) % MAXDG, (uint32_t)f->n);
			fz_bytes(f, dg, len);
			mac_ok = len >= PBOX_WIRE_HDR_LEN && pbox_tsb_verify(&g_key, dg, len);
		} else {
			uint32_t c = fz_u8(f) % x.desc.nchunks;
			const struct pbox_chunk_desc *cd = &x.desc.chunks[c];
			uint32_t fr = fz_u8(f) % cd->nfrags;
			struct pbox_msg m = {
				.type = PBOX_MSG_DATA,
				.encoding = PBOX_ENC_F32,
				.flags = (uint16_t)(PBOX_F_TREE |
						    (fz_u8(f) & 1 ? PBOX_F_RETRANSMIT : 0)),
				.job = JOB,
				.sender = PBOX_SENDER_APPLIANCE,
				.cookie = fz_u8(f) & 7 ? cookie : fz_u64(f),
				.chunk = c,
				.iter = fz_u8(f) % 3,
				.frag_off = fr * x.desc.frag_bytes,
				.frag_len = pbox_frag_len(&x.desc, cd->bytes, fr),
				.chunk_len = cd->bytes,
				.arg0 = 4,
			};

			len = PBOX_WIRE_HDR_LEN + m.frag_len;
			fz_bytes(f, dg + PBOX_WIRE_HDR_LEN, m.frag_len);
			pbox_wire_encode(&m, (struct pbox_wire_hdr *)dg);
			m.sack = pbox_tsb_mac(how & 0x40 ? &wrong : &g_key,
					      (struct pbox_wire_hdr *)dg, dg + PBOX_WIRE_HDR_LEN,
					      m.frag_len);
			pbox_wire_encode(&m, (struct pbox_wire_hdr *)dg);
			if (how & 0x20) {
				/* corrupt one byte */
				dg[fz_u16(f) % len] ^= (uint8_t)(1u + fz_u8(f) % 255);
			}
			mac_ok = pbox_tsb_verify(&g_key, dg, len);
		}
		x.last = dg;
		x.last_len = len;
		x.last_ok = mac_ok && src_ok;
		x.serving = len >= PBOX_WIRE_HDR_LEN && dg[5] == PBOX_MSG_PULL;
		x.fwd = 0;
		prev_rx = st->tsb_rx;
		pbox_node_rx(x.node, dg, len, &from);
		FUZZ_CHECK(x.fwd == 0 || x.fwd == 2, "forwarded to %u of 2 children", x.fwd);
		FUZZ_CHECK(st->tsb_rx == prev_rx || x.last_ok,
			   "a fragment accepted that must not be");
		FUZZ_CHECK((x.fwd == 2) == (st->tsb_rx == prev_rx + 1),
			   "accepted and forwarded disagree");
		x.last = NULL;
		x.serving = false;
		if (how & 0x10) {
			x.now_ns += (uint64_t)fz_u16(f) * 100000;
			pbox_node_timers(x.node);
			pbox_node_flush(x.node);
		}
	}
	pbox_node_fail(x.node, -ECANCELED, "end of input");
	pbox_node_destroy(x.node);
	pbox_jobdesc_free(&x.desc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f;

	pbox_log_set_sink(pbox_test_log_silent, NULL);
	fz_init(&f, data, size);
	if (fz_u8(&f) & 1) {
		fuzz_relay(&f);
	} else {
		fuzz_position(&f);
	}
	return 0;
}
