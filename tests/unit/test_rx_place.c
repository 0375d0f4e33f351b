/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Results received straight into the caller's buffer (node.h: pbox_node_rx_places,
 * pbox_node_rx_burst) against the simulated appliance. The results meant for rank 0 are
 * captured from the sim and fed to its node the way the UDP transport's placement does
 * (transport/udp/udp.h): the i-th datagram of a burst has its header in a scratch buffer
 * and its payload in place i, whatever datagram it is; one whose length does not match
 * is copied back behind its header, as the transport does, after having overwritten the
 * place (as the kernel would). Order, loss, duplicates, datagrams from elsewhere, forged
 * cookies and stale iterations must all leave the caller's buffer holding exactly the
 * sum, and a place that got a bad datagram must not count as received.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim.h"

#define NFLOAT   2500 /* key 0: 3 chunks of 4096 bytes, 10 fragments of <= 1024 bytes */
#define MAXDG    64
#define DG_BYTES (PBOX_WIRE_HDR_LEN + 1024)

static const struct pbox_keyspec g_keys[] = { { 5, NFLOAT } };

struct dgram {
	uint32_t len;
	uint32_t core;
	uint32_t chunk, frag_off;
	uint8_t b[DG_BYTES];
};

/* Captures (and drops) the results the appliance sends to rank 0. */
struct capture {
	uint32_t n;
	struct dgram d[MAXDG];
};

static enum sim_verdict capture(struct sim *s, enum sim_dir dir, uint32_t ep,
				const struct pbox_msg *m, void *arg)
{
	struct capture *c = arg;
	struct pbox_wire_hdr h;
	struct dgram *d;

	if (dir != SIM_TO_WORKER || ep != 0 || m->type != PBOX_MSG_DATA) {
		return SIM_PASS;
	}
	assert_true(c->n < MAXDG);
	d = &c->d[c->n++];
	pbox_wire_encode(m, &h);
	memcpy(d->b, &h, sizeof(h));
	memcpy(d->b + sizeof(h), m->payload, m->frag_len);
	d->len = (uint32_t)sizeof(h) + m->frag_len;
	d->core = s->filter_from;
	d->chunk = m->chunk;
	d->frag_off = m->frag_off;
	return SIM_DROP;
}

static struct sim_job_cfg cfg2(void)
{
	struct sim_job_cfg c = {
		.nranks = 2,
		.ncores = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.rto_ms = 10,
		.timeout_ms = 2000,
	};

	return c;
}

static float g_src[2][NFLOAT], g_dst[2][NFLOAT];

static void submit(struct sim *s, uint32_t r, struct pbox_op *op, uint32_t iter, bool in_place)
{
	for (uint32_t i = 0; i < NFLOAT; i++) {
		g_src[r][i] = (float)(r * 10000 + i + iter);
		g_dst[r][i] = -1.0f;
	}
	*op = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
				.key = 0,
				.iter = iter,
				.src = g_src[r],
				.dst = in_place ? g_src[r] : g_dst[r] };
	assert_int_equal(pbox_node_submit(s->node[r], op), 0);
	pbox_node_flush(s->node[r]);
}

static void check_sum(const float *out, uint32_t iter)
{
	for (uint32_t i = 0; i < NFLOAT; i++) {
		assert_true(out[i] == (float)(i + iter) + (float)(10000 + i + iter));
	}
}

/* What the UDP transport hands over for a burst of datagrams (see the file comment). */
struct burst {
	uint8_t scratch[MAXDG][DG_BYTES];
	struct pbox_rx_pkt pkts[MAXDG];
	int16_t placed[MAXDG];
	struct pbox_node_place place[MAXDG];
	unsigned np, n;
};

static void emulate(struct sim *s, struct burst *b, const struct dgram *const *dg, unsigned n,
		    const struct pbox_peer *from)
{
	b->n = n;
	for (unsigned k = 0; k < n; k++) {
		const struct dgram *d = dg[k];
		struct pbox_rx_pkt *p = &b->pkts[k];
		uint32_t pay = d->len - PBOX_WIRE_HDR_LEN;

		p->data = b->scratch[k];
		p->len = d->len;
		p->from = from != NULL ? *from : s->core_peer[d->core];
		memcpy(b->scratch[k], d->b, PBOX_WIRE_HDR_LEN);
		b->placed[k] = -1;
		if (k < b->np) {
			/* The kernel fills the place whatever the datagram is. */
			memcpy(b->place[k].dst, d->b + PBOX_WIRE_HDR_LEN,
			       pay < b->place[k].len ? pay : b->place[k].len);
			if (pay == b->place[k].len) {
				b->placed[k] = (int16_t)k;
				continue;
			}
		}
		memcpy(b->scratch[k] + PBOX_WIRE_HDR_LEN, d->b + PBOX_WIRE_HDR_LEN, pay);
	}
}

static void feed(struct sim *s, struct burst *b, const struct dgram *const *dg, unsigned n,
		 const struct pbox_peer *from)
{
	b->np = pbox_node_rx_places(s->node[0], b->place, n);
	emulate(s, b, dg, n, from);
	pbox_node_rx_burst(s->node[0], b->pkts, b->n, b->place, b->np, b->placed);
	pbox_node_flush(s->node[0]);
}

/* Rank 0 contributes first (acknowledged, waits), rank 1 completes the iteration; the
 * results for rank 0 are captured. */
static void setup(struct sim *s, struct capture *c, struct pbox_op *op, uint32_t iter,
		  bool in_place)
{
	s->filter = capture;
	s->filter_arg = c;
	c->n = 0;
	submit(s, 0, &op[0], iter, in_place);
	sim_pump(s, 0);
	submit(s, 1, &op[1], iter, false);
	sim_pump(s, 0);
	assert_int_equal(op[1].status, 0);
	check_sum(g_dst[1], iter);
	assert_int_equal(c->n, 10);
}

/* In order, bursts of 4: every payload lands where it belongs, no copy. */
static void test_placed_in_order(void **state)
{
	struct sim_job_cfg cfg = cfg2();
	static struct capture c;
	static struct burst b;
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	setup(&s, &c, op, 0, false);
	assert_int_equal(pbox_node_rx_place_want(s.node[0]), 1); /* no history yet */
	/* The appliance's order, one core at a time (as the socket sees runs). */
	for (uint32_t core = 0; core < 2; core++) {
		const struct dgram *run[MAXDG];
		unsigned n = 0;

		for (uint32_t i = 0; i < c.n; i++) {
			if (c.d[i].core == core) {
				run[n++] = &c.d[i];
			}
		}
		for (unsigned i = 0; i < n; i += 4) {
			feed(&s, &b, run + i, n - i < 4 ? n - i : 4, NULL);
		}
	}
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(op[0].status, 0);
	check_sum(g_dst[0], 0);
	/* The first burst is placed from the oldest chunk on; then the run is followed. */
	print_message("placed %llu of 10\n",
		      (unsigned long long)pbox_node_stats(s.node[0])->rx_placed);
	assert_true(pbox_node_stats(s.node[0])->rx_placed >= 7);
	assert_true(pbox_node_rx_place_want(s.node[0]) > 1); /* runs of hits: ask for more */
	sim_fini(&s);
}

/*
 * Hostile and unlucky bursts: reversed order (every slot a miss), a forged cookie, a
 * datagram from another address, a stale iteration, duplicates of accepted fragments,
 * the same fragment twice in one burst. The caller's buffer ends up exactly the sum,
 * and a place that received garbage is not taken as received.
 */
static void test_placed_hostile(void **state)
{
	struct sim_job_cfg cfg = cfg2();
	static struct capture c, old;
	static struct burst b;
	static struct dgram forged, stale;
	const struct dgram *bad[4];
	struct pbox_peer elsewhere;
	struct pbox_wire_hdr h;
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	/* Iteration 0 completes normally; its results are kept as stale ones. */
	setup(&s, &old, op, 0, false);
	s.filter = NULL;
	for (uint32_t i = 0; i < old.n; i++) {
		pbox_node_rx(s.node[0], old.d[i].b, old.d[i].len, &s.core_peer[old.d[i].core]);
	}
	assert_int_equal(op[0].status, 0);
	s.ncompleted = 0;
	setup(&s, &c, op, 1, false);

	/* The place rank 0 expects first gets, in turn: a forged cookie, a datagram from
	 * elsewhere, a stale iteration; all of the right length, all filling the place. */
	b.np = pbox_node_rx_places(s.node[0], b.place, 1);
	assert_int_equal(b.np, 1);
	for (uint32_t i = 0; i < c.n; i++) {
		if (c.d[i].chunk == b.place[0].chunk && c.d[i].frag_off == b.place[0].frag_off) {
			forged = c.d[i];
		}
	}
	for (uint32_t i = 0; i < old.n; i++) {
		if (old.d[i].chunk == b.place[0].chunk &&
		    old.d[i].frag_off == b.place[0].frag_off) {
			stale = old.d[i];
		}
	}
	memcpy(&h, forged.b, sizeof(h));
	h.cookie ^= 1;
	memcpy(forged.b, &h, sizeof(h));
	memset(forged.b + PBOX_WIRE_HDR_LEN, 0x7f, forged.len - PBOX_WIRE_HDR_LEN);
	bad[0] = &forged;
	feed(&s, &b, bad, 1, NULL);
	assert_true(pbox_node_stats(s.node[0])->drops[PBOX_DROP_BAD_COOKIE] > 0);
	elsewhere = s.core_peer[stale.core];
	elsewhere.port = htons(9);
	bad[0] = &c.d[0];
	for (uint32_t i = 0; i < c.n; i++) {
		if (c.d[i].chunk == b.place[0].chunk && c.d[i].frag_off == b.place[0].frag_off) {
			bad[0] = &c.d[i];
		}
	}
	feed(&s, &b, bad, 1, &elsewhere);
	assert_true(pbox_node_stats(s.node[0])->foreign > 0);
	bad[0] = &stale;
	feed(&s, &b, bad, 1, NULL);
	assert_true(pbox_node_stats(s.node[0])->stale_results > 0);
	/* None of them counted: the same place is still offered. */
	{
		struct pbox_node_place again;

		assert_int_equal(pbox_node_rx_places(s.node[0], &again, 1), 1);
		assert_ptr_equal(again.dst, b.place[0].dst);
	}
	assert_int_equal(s.ncompleted, 1); /* rank 1 only */

	/* Reversed order in bursts of 3, each burst carrying a duplicate of its first
	 * datagram (the same fragment twice in one burst), then every datagram again. */
	for (unsigned i = 0; i < c.n; i += 2) {
		const struct dgram *run[3];
		unsigned n = 0;

		run[n++] = &c.d[c.n - 1 - i];
		if (i + 1 < c.n) {
			run[n++] = &c.d[c.n - 2 - i];
		}
		run[n++] = &c.d[c.n - 1 - i];
		feed(&s, &b, run, n, NULL);
	}
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(op[0].status, 0);
	check_sum(g_dst[0], 1);
	/* Late duplicates after completion: the buffer is the caller's again, untouched. */
	for (uint32_t i = 0; i < c.n; i++) {
		const struct dgram *one = &c.d[i];

		feed(&s, &b, &one, 1, NULL);
		assert_int_equal(b.np, 0);
	}
	check_sum(g_dst[0], 1);
	assert_true(pbox_node_stats(s.node[0])->rx_unplaced > 0);
	sim_fini(&s);
}

/*
 * In place (src == dst): while a chunk's contribution may still be resent, its slots
 * are not offered (a datagram landing there would overwrite the gradient a resend
 * reads); once acknowledged they are, and the result lands in place.
 */
static void test_placed_in_place(void **state)
{
	struct sim_job_cfg cfg = cfg2();
	static struct capture c;
	static struct burst b;
	struct pbox_node_place pl[MAXDG];
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	/* Nothing acknowledged yet: nothing offered. */
	s.filter = capture;
	s.filter_arg = &c;
	submit(&s, 0, &op[0], 0, true);
	assert_int_equal(pbox_node_rx_places(s.node[0], pl, MAXDG), 0);
	/* Acknowledged: the slots are the result's now. */
	sim_pump(&s, 0);
	assert_int_equal(pbox_node_rx_places(s.node[0], pl, MAXDG), 10);
	for (uint32_t i = 0; i < 10; i++) {
		assert_true((float *)pl[i].dst >= g_src[0] &&
			    (float *)pl[i].dst < g_src[0] + NFLOAT);
	}
	submit(&s, 1, &op[1], 0, false);
	sim_pump(&s, 0);
	assert_int_equal(c.n, 10);
	for (uint32_t i = 0; i < c.n; i += 5) {
		const struct dgram *run[5];

		for (uint32_t k = 0; k < 5; k++) {
			run[k] = &c.d[i + k];
		}
		feed(&s, &b, run, 5, NULL);
	}
	assert_int_equal(op[0].status, 0);
	check_sum(g_src[0], 0);
	sim_fini(&s);

	/* Rank 0 contributes last, in place: its results answer its push while the chunks
	 * are still unacknowledged; no place is offered then, the copy path takes them. */
	assert_int_equal(sim_init(&s, &cfg), 0);
	submit(&s, 1, &op[1], 0, false);
	sim_pump(&s, 0);
	s.filter = capture;
	s.filter_arg = &c;
	c.n = 0;
	submit(&s, 0, &op[0], 0, true);
	assert_int_equal(pbox_node_rx_places(s.node[0], pl, MAXDG), 0);
	sim_pump(&s, 0);
	assert_int_equal(c.n, 10);
	assert_int_equal(pbox_node_rx_places(s.node[0], pl, MAXDG), 0);
	for (uint32_t i = 0; i < c.n; i++) {
		const struct dgram *one = &c.d[i];

		feed(&s, &b, &one, 1, NULL);
		if (i == 0) {
			assert_int_equal(b.np, 0); /* the first result acknowledges its chunk */
		}
	}
	assert_int_equal(op[0].status, 0);
	check_sum(g_src[0], 0);
	sim_fini(&s);
}

/*
 * Result fragments of 4 KB and more are copied with non-temporal stores (node.c
 * result_copy): a destination off the 16-byte grid, fragments of 8 KB and a last one of
 * another length come out exact (destinations 4 and 12 bytes off the grid).
 */
static void test_streamed_copy(void **state)
{
	static const struct pbox_keyspec key[] = { { 7, 10007 } }; /* 40028 B: 2 chunks */
	struct sim_job_cfg cfg = cfg2();
	static float src[2][10007], out[2][10007 + 4];
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	cfg.keys = key;
	cfg.chunk_bytes = 32768;
	cfg.frag_bytes = 8192;
	assert_int_equal(sim_init(&s, &cfg), 0);
	for (uint32_t r = 0; r < 2; r++) {
		for (uint32_t i = 0; i < 10007; i++) {
			src[r][i] = (float)(r * 100000 + i);
		}
		op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
					  .key = 0,
					  .iter = 0,
					  .src = src[r],
					  .dst = out[r] + 1 + 2 * r }; /* 4 and 12 bytes off */
		assert_int_equal(pbox_node_submit(s.node[r], &op[r]), 0);
		pbox_node_flush(s.node[r]);
	}
	sim_pump(&s, 0);
	for (int i = 0; i < 100 && s.ncompleted < 2; i++) {
		sim_advance(&s, 5000000ull);
	}
	assert_int_equal(s.ncompleted, 2);
	for (uint32_t r = 0; r < 2; r++) {
		assert_int_equal(op[r].status, 0);
		assert_true(out[r][0] == 0.0f);
		for (uint32_t i = 0; i < 10007; i++) {
			assert_true(op[r].dst[i] == (float)i + (float)(100000 + i));
		}
		assert_true(out[r][1 + 2 * r + 10007] == 0.0f); /* nothing written past the end */
	}
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_placed_in_order),
		cmocka_unit_test(test_placed_hostile),
		cmocka_unit_test(test_placed_in_place),
		cmocka_unit_test(test_streamed_copy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
