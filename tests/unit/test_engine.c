/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The chunk engine, spoken to on the wire directly (no worker node): N contributions give
 * exactly one optimizer step; duplicates, reordering and multi-piece datagrams change
 * nothing; lost replies are re-sent; iteration windows, init, held pulls, aborts and
 * misdirected chunks behave as engine.h says.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/bitmap.h"
#include "dvf/dvf_job.h"
#include "kernels/kernels.h"
#include "sim.h"

#define FRAG  1024u
#define NELEM 3000u /* 12000 bytes: chunks of 8192 + 3808 bytes with chunk_bytes 8192 */

static uint64_t g_rng = 0x243f6a8885a308d3ull;

static uint32_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (uint32_t)(g_rng >> 32);
}

/* Gradient of rank r at iteration t: arbitrary floats (not exactly summable). */
static float gval(uint32_t r, uint32_t t, uint32_t i)
{
	return (float)((int)((r * 131 + t * 71 + i * 17) % 1000) - 500) / 37.0f;
}

static void fill_grad(float *g, uint32_t r, uint32_t t)
{
	for (uint32_t i = 0; i < NELEM; i++) {
		g[i] = gval(r, t, i);
	}
}

struct frag {
	uint32_t rank, chunk, f;
};

static void push_frag(struct sim *s, uint32_t rank, uint32_t t, uint32_t c, uint32_t f,
		      const float *g, uint16_t flags)
{
	const struct pbox_chunk_desc *cd = &s->desc.chunks[c];
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.flags = flags,
		.chunk = c,
		.iter = t,
		.frag_off = f * FRAG,
		.frag_len = pbox_frag_len(&s->desc, cd->bytes, f),
		.seq = 1,
	};

	sim_send_msg(s, rank, &m, (const uint8_t *)(g + cd->elem_off) + f * FRAG);
}

/* Every fragment of every chunk from every rank, in a shuffled order. */
static void push_all(struct sim *s, uint32_t t, float **g, bool shuffle, bool dup)
{
	struct frag list[256];
	uint32_t n = 0;

	for (uint32_t r = 0; r < s->nranks; r++) {
		for (uint32_t c = 0; c < s->desc.nchunks; c++) {
			for (uint32_t f = 0; f < s->desc.chunks[c].nfrags; f++) {
				list[n++] = (struct frag){ r, c, f };
			}
		}
	}
	for (uint32_t i = n - 1; shuffle && i > 0; i--) {
		uint32_t j = rnd() % (i + 1);
		struct frag tmp = list[i];

		list[i] = list[j];
		list[j] = tmp;
	}
	for (uint32_t i = 0; i < n; i++) {
		push_frag(s, list[i].rank, t, list[i].chunk, list[i].f, g[list[i].rank],
			  PBOX_F_WANT_REPLY);
		if (dup) {
			/* as the network duplicates it: same flags */
			push_frag(s, list[i].rank, t, list[i].chunk, list[i].f, g[list[i].rank],
				  PBOX_F_WANT_REPLY);
		}
	}
}

/* Collect the DATA replies to rank into out; returns the number of DATA datagrams. */
static uint32_t collect(struct sim *s, uint32_t rank, float *out, uint32_t *label, uint32_t *acks,
			uint32_t *errors)
{
	uint8_t payload[PBOX_WIRE_MAX_PAYLOAD];
	struct pbox_msg m;
	uint32_t n = 0;

	while (sim_take_reply(s, rank, &m, payload)) {
		if (m.type == PBOX_MSG_DATA) {
			memcpy((uint8_t *)(out + s->desc.chunks[m.chunk].elem_off) + m.frag_off,
			       payload, m.frag_len);
			*label = m.iter;
			n++;
		} else if (m.type == PBOX_MSG_ACK && acks) {
			(*acks)++;
		} else if (m.type == PBOX_MSG_ERROR && errors) {
			errors[0]++;
			errors[1] = m.arg0;
		}
	}
	return n;
}

static const struct pbox_keyspec g_keys[] = { { 7, NELEM } };

static void agg_run(bool det, bool shuffle, bool dup, uint32_t nranks)
{
	struct sim_job_cfg cfg = {
		.nranks = nranks,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_MEAN,
		.deterministic = det,
		.no_nodes = true,
	};
	struct sim s;
	float *g[SIM_MAX_RANKS], want[NELEM], got[NELEM];

	assert_int_equal(sim_init(&s, &cfg), 0);
	for (uint32_t r = 0; r < nranks; r++) {
		g[r] = malloc(NELEM * sizeof(float));
	}
	for (uint32_t t = 0; t < 4; t++) {
		const float *src[SIM_MAX_RANKS];

		for (uint32_t r = 0; r < nranks; r++) {
			fill_grad(g[r], r, t);
			src[r] = g[r];
		}
		push_all(&s, t, g, shuffle, dup);
		/* Exactly one completion per chunk per iteration. */
		assert_int_equal(SIM_STAT(&s, iterations), (t + 1) * s.desc.nchunks);
		pbox_kernels_get()->reduce(want, src, nranks, NELEM, (float)nranks);
		for (uint32_t r = 0; r < nranks; r++) {
			uint32_t label = 99, data;

			memset(got, 0, sizeof(got));
			data = collect(&s, r, got, &label, NULL, NULL);
			assert_int_equal(label, t);
			assert_int_equal(data, 8 + 4); /* fragments of the two chunks */
			if (det || nranks <= 2) {
				/* rank order (or two terms: commutative) is exact */
				assert_memory_equal(got, want, sizeof(want));
			} else {
				for (uint32_t i = 0; i < NELEM; i++) {
					assert_true(fabsf(got[i] - want[i]) <=
						    1e-5f * (1 + fabsf(want[i])));
				}
			}
		}
	}
	if (dup) {
		assert_int_equal(SIM_STAT(&s, dups), 4 * nranks * 12);
	}
	assert_int_equal(SIM_STAT(&s, agg_frags), 4 * nranks * 12);
	for (uint32_t r = 0; r < nranks; r++) {
		free(g[r]);
	}
	sim_fini(&s);
}

static void test_aggregate_in_order(void **state)
{
	(void)state;
	for (uint32_t n = 1; n <= 5; n++) {
		agg_run(false, false, false, n);
	}
}

static void test_aggregate_shuffled_dups_deterministic(void **state)
{
	(void)state;
	for (uint32_t n = 1; n <= 6; n++) {
		agg_run(true, true, true, n);
	}
}

static void test_aggregate_shuffled_dups(void **state)
{
	(void)state;
	agg_run(false, true, true, 4);
}

/* Server optimizer: init, held pulls, one NAG step per iteration, exact vs a reference. */
static void server_opt_run(uint32_t nranks)
{
	struct sim_job_cfg cfg = {
		.nranks = nranks,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_SERVER_OPT,
		.deterministic = true,
		.optimizer = "nag",
		.no_nodes = true,
	};
	struct sim s;
	float *g[8], w[NELEM], mom[NELEM] = { 0 }, got[NELEM];
	uint32_t errs[2] = { 0 }, label, acks = 0;

	pbox_opt_params_default(&cfg.opt);
	cfg.opt.lr = 0.05f;
	cfg.opt.rescale = 1.0f / (float)nranks;
	cfg.opt.wd = 1e-4f;
	assert_int_equal(sim_init(&s, &cfg), 0);
	for (uint32_t r = 0; r < nranks; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 0);
	}
	/* A push before the model exists is refused with EAGAIN. */
	push_frag(&s, 1, 0, 0, 0, g[1], PBOX_F_WANT_REPLY);
	collect(&s, 1, got, &label, NULL, errs);
	assert_int_equal(errs[0], 1);
	assert_int_equal(errs[1], EAGAIN);
	assert_int_equal(s.stats[0].drops[PBOX_DROP_NOT_READY], 1);
	/* Pulls of version 0 are held until rank 0's INIT is complete. */
	for (uint32_t c = 0; c < s.desc.nchunks; c++) {
		struct pbox_msg m = { .type = PBOX_MSG_PULL, .chunk = c, .iter = 0 };

		sim_send_msg(&s, 2, &m, NULL);
	}
	assert_int_equal(collect(&s, 2, got, &label, NULL, NULL), 0);
	assert_int_equal(SIM_STAT(&s, pulls_held), s.desc.nchunks);
	for (uint32_t i = 0; i < NELEM; i++) {
		w[i] = gval(9, 9, i);
	}
	/* An initial model fragment holding NaN is refused (non_finite = "reject"): counted,
	 * EDOM to rank 0, and it never reaches the model (checked below against w). */
	{
		struct pbox_msg m = { .type = PBOX_MSG_INIT, .chunk = 0, .frag_len = FRAG };
		float bad[FRAG / 4];

		memcpy(bad, w, sizeof(bad));
		bad[7] = NAN;
		sim_send_msg(&s, 0, &m, bad);
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 1);
		collect(&s, 0, got, &label, NULL, errs);
		assert_int_equal(errs[1], EDOM);
	}
	for (uint32_t c = 0; c < s.desc.nchunks; c++) {
		for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
			const struct pbox_chunk_desc *cd = &s.desc.chunks[c];
			struct pbox_msg m = {
				.type = PBOX_MSG_INIT,
				.chunk = c,
				.frag_off = f * FRAG,
				.frag_len = pbox_frag_len(&s.desc, cd->bytes, f),
			};

			sim_send_msg(&s, 0, &m, (const uint8_t *)(w + cd->elem_off) + f * FRAG);
		}
	}
	collect(&s, 0, got, &label, &acks, NULL);
	assert_int_equal(acks, s.desc.nchunks);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 2, got, &label, NULL, NULL), 12);
	assert_memory_equal(got, w, sizeof(w));
	assert_int_equal(label, 0);
	for (uint32_t t = 0; t < 3; t++) {
		const float *src[8];

		for (uint32_t r = 0; r < nranks; r++) {
			fill_grad(g[r], r, t);
			src[r] = g[r];
		}
		push_all(&s, t, g, true, false);
		pbox_optimizer_step(pbox_optimizer_find("nag"), pbox_kernels_get(), w, mom, NULL,
				    src, nranks, NELEM, &cfg.opt, t + 1);
		assert_int_equal(SIM_STAT(&s, iterations), (t + 1) * s.desc.nchunks);
		for (uint32_t r = 0; r < nranks; r++) {
			memset(got, 0, sizeof(got));
			assert_int_equal(collect(&s, r, got, &label, NULL, NULL), 12);
			assert_int_equal(label, t + 1);
			assert_memory_equal(got, w, sizeof(w));
		}
	}
	for (uint32_t r = 0; r < nranks; r++) {
		free(g[r]);
	}
	sim_fini(&s);
}

/* 3 ranks: the optimizer sums the staged copies itself; 7: they are reduced first (more
 * than four sources); both exactly the reference step over the ranks in order. */
static void test_server_optimizer(void **state)
{
	(void)state;
	server_opt_run(3);
	server_opt_run(7);
}

/* A lost reply: the retransmitted push of a complete iteration gets the result again,
 * once per round, and is not added twice. A push too far ahead is dropped. */
static void test_resend_and_window(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	struct sim s;
	float *g[2], first[NELEM], again[NELEM];
	uint32_t label, errs[2] = { 0 };

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	for (uint32_t r = 0; r < 2; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 0);
	}
	push_all(&s, 0, g, false, false);
	collect(&s, 0, first, &label, NULL, NULL);
	collect(&s, 1, again, &label, NULL, NULL);
	/* Rank 1 lost its reply and sends its whole contribution again. */
	for (uint32_t c = 0; c < s.desc.nchunks; c++) {
		for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
			push_frag(&s, 1, 0, c, f, g[1], PBOX_F_WANT_REPLY | PBOX_F_RETRANSMIT);
		}
	}
	memset(again, 0, sizeof(again));
	assert_int_equal(collect(&s, 1, again, &label, NULL, NULL), 12); /* once per chunk */
	assert_memory_equal(again, first, sizeof(first));
	assert_int_equal(SIM_STAT(&s, replies_resent), s.desc.nchunks);
	assert_int_equal(SIM_STAT(&s, iterations), s.desc.nchunks);
	/* Iteration 0 + window (2) is beyond the window. */
	push_frag(&s, 0, 3, 0, 0, g[0], 0);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_FUTURE_ITER]), 1);
	/* The result of iteration 0 can be pulled while retained... */
	{
		struct pbox_msg m = { .type = PBOX_MSG_PULL, .chunk = 1, .iter = 0 };

		sim_send_msg(&s, 0, &m, NULL);
		assert_int_equal(collect(&s, 0, again, &label, NULL, NULL), 4);
	}
	/* ...but not once two more iterations have replaced it. */
	for (uint32_t t = 1; t <= 2; t++) {
		fill_grad(g[0], 0, t);
		fill_grad(g[1], 1, t);
		push_all(&s, t, g, false, false);
		collect(&s, 0, again, &label, NULL, NULL);
		collect(&s, 1, again, &label, NULL, NULL);
	}
	{
		struct pbox_msg m = { .type = PBOX_MSG_PULL, .chunk = 1, .iter = 0 };

		sim_send_msg(&s, 0, &m, NULL);
		collect(&s, 0, again, &label, NULL, errs);
		assert_int_equal(errs[0], 1);
		assert_int_equal(errs[1], ESTALE);
	}
	free(g[0]);
	free(g[1]);
	sim_fini(&s);
}

/* Multi-piece datagrams (as from multi-segment mbufs) give bit-identical results. */
static void test_iov_pieces(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 3,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_MEAN,
		.no_nodes = true,
	};
	struct sim a, b;
	float *g[3], ra[NELEM], rb[NELEM];
	uint32_t label;

	(void)state;
	assert_int_equal(sim_init(&a, &cfg), 0);
	assert_int_equal(sim_init(&b, &cfg), 0);
	for (uint32_t r = 0; r < 3; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 5);
	}
	push_all(&a, 0, g, false, false);
	for (uint32_t r = 0; r < 3; r++) {
		for (uint32_t c = 0; c < b.desc.nchunks; c++) {
			const struct pbox_chunk_desc *cd = &b.desc.chunks[c];

			for (uint32_t f = 0; f < cd->nfrags; f++) {
				uint8_t pkt[PBOX_WIRE_HDR_LEN + FRAG];
				struct pbox_iov seg[8];
				struct pbox_msg m = {
					.type = PBOX_MSG_PUSH,
					.encoding = PBOX_ENC_F32,
					.flags = PBOX_F_WANT_REPLY,
					.job = 42,
					.sender = r,
					.cookie = b.cookies[r],
					.chunk = c,
					.frag_off = f * FRAG,
					.frag_len = pbox_frag_len(&b.desc, cd->bytes, f),
					.chunk_len = cd->bytes,
				};
				struct pbox_peer from = { .ip = 1,
							  .port = __builtin_bswap16(20000 + r) };
				uint32_t len = PBOX_WIRE_HDR_LEN + m.frag_len, off = 0, n = 0;

				pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
				memcpy(pkt + PBOX_WIRE_HDR_LEN,
				       (const uint8_t *)(g[r] + cd->elem_off) + f * FRAG,
				       m.frag_len);
				/* Cut at random byte positions, header included. */
				while (off < len && n < 7) {
					uint32_t take = 1 + rnd() % 300;

					take = take > len - off ? len - off : take;
					seg[n++] = (struct pbox_iov){ pkt + off, take };
					off += take;
				}
				if (off < len) {
					seg[n++] = (struct pbox_iov){ pkt + off, len - off };
				}
				pbox_engine_rx_iov(&b.eng[cd->core], b.tab, seg, n, &from);
				pbox_engine_flush(&b.eng[cd->core]);
			}
		}
	}
	for (uint32_t r = 0; r < 3; r++) {
		memset(ra, 0, sizeof(ra));
		memset(rb, 0, sizeof(rb));
		collect(&a, r, ra, &label, NULL, NULL);
		collect(&b, r, rb, &label, NULL, NULL);
		assert_memory_equal(ra, rb, sizeof(ra));
		free(g[r]);
	}
	sim_fini(&a);
	sim_fini(&b);
}

/* Aborted job: authenticated requests get ECONNABORTED; a chunk sent to the wrong core
 * and garbage are counted. */
static void test_abort_misdirected(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 4096 }, { 2, 4096 } };
	struct sim_job_cfg cfg = {
		.nranks = 2,
		.ncores = 2,
		.keys = keys,
		.nkeys = 2,
		.chunk_bytes = 16384,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct sim s;
	float g[4096] = { 0 }, out[8192];
	uint8_t pkt[PBOX_WIRE_HDR_LEN + FRAG];
	uint32_t label, errs[2] = { 0 };
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.encoding = PBOX_ENC_F32,
		.job = 42,
		.sender = 0,
		.chunk = 0,
		.frag_len = FRAG,
		.chunk_len = 16384,
	};
	struct pbox_peer from = { .ip = 1, .port = __builtin_bswap16(20000) };
	uint32_t wrong;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	m.cookie = s.cookies[0];
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	memcpy(pkt + PBOX_WIRE_HDR_LEN, g, FRAG);
	wrong = s.desc.chunks[0].core ^ 1;
	pbox_engine_rx(&s.eng[wrong], s.tab, pkt, sizeof(pkt), &from);
	assert_int_equal(s.stats[wrong].drops[PBOX_DROP_MISDIRECTED], 1);
	memset(pkt, 0x5a, sizeof(pkt));
	pbox_engine_rx(&s.eng[0], s.tab, pkt, sizeof(pkt), &from);
	assert_int_equal(s.stats[0].drops[PBOX_DROP_BAD_MAGIC], 1);
	pbox_engine_rx(&s.eng[0], NULL, pkt, 10, &from);
	assert_int_equal(s.stats[0].drops[PBOX_DROP_TRUNCATED], 1);
	s.job.run = PBOX_JOB_ABORTED;
	s.job.abort_errno = ECONNABORTED;
	push_frag(&s, 1, 0, 0, 0, g, 0);
	collect(&s, 1, out, &label, NULL, errs);
	assert_int_equal(errs[0], 1);
	assert_int_equal(errs[1], ECONNABORTED);
	sim_fini(&s);
}

/* Pull chunk c, iteration t, as rank from address `from`. */
static void pull_from(struct sim *s, uint32_t rank, uint32_t c, uint32_t t,
		      const struct pbox_peer *from)
{
	struct pbox_msg m = { .type = PBOX_MSG_PULL, .chunk = c, .iter = t };

	sim_send_msg_from(s, rank, &m, NULL, from);
}

/* Reflection: a datagram with a valid cookie from another address neither re-targets the
 * rank's replies nor gets an answer there; it is dropped and counted. A new cookie (the
 * rank registered again) lets it move. */
static void test_source_pinned(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct pbox_peer a0 = sim_rank_addr(0), a1 = sim_rank_addr(1), victim = sim_rank_addr(7);
	float *g[2], got[NELEM];
	uint32_t label, nf0;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	nf0 = s.desc.chunks[0].nfrags;
	for (uint32_t r = 0; r < 2; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 0);
	}
	/* Iteration 0 from the ranks' own addresses pins them. */
	push_all(&s, 0, g, false, false);
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 12);
	assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 12);
	/* Rank 0's cookie from rank 1's address, and from a victim's: no reply anywhere. */
	pull_from(&s, 0, 0, 0, &a1);
	pull_from(&s, 0, 0, 0, &victim);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 2);
	assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 0);
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 0);
	assert_int_equal(SIM_STAT(&s, tx_errors), 0);
	/* Replies still go to the pinned address. */
	pull_from(&s, 0, 0, 0, &a0);
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), nf0);
	assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 0);
	/* The same port on another host is another address. */
	a0.ip ^= 1;
	pull_from(&s, 0, 0, 0, &a0);
	a0.ip ^= 1;
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 3);
	/* Registered again (new cookie): the next datagram pins the new address. */
	s.cookies[0] ^= 0x55;
	pull_from(&s, 0, 0, 0, &a1);
	assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), nf0);
	pull_from(&s, 0, 0, 0, &a0);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 4);
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 0);
	for (uint32_t r = 0; r < 2; r++) {
		free(g[r]);
	}
	sim_fini(&s);
}

/* The pin is per rank, not per core: a sender that learned a rank's cookie cannot pin
 * itself on a core the rank has not used yet (and so reflect replies or lock the rank
 * out of that core); a new cookie re-pins on every core. */
static void test_source_pinned_cores(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 1,
		.ncores = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct pbox_peer a0 = sim_rank_addr(0), a1 = sim_rank_addr(1), victim = sim_rank_addr(7);
	float *g[1], got[NELEM];
	uint32_t label, nf0, nf1;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(s.desc.nchunks, 2);
	assert_int_not_equal(s.desc.chunks[0].core, s.desc.chunks[1].core);
	nf0 = s.desc.chunks[0].nfrags;
	nf1 = s.desc.chunks[1].nfrags;
	g[0] = malloc(NELEM * sizeof(float));
	fill_grad(g[0], 0, 0);
	/* Rank 0 uses only chunk 0's core: pinned there. */
	for (uint32_t f = 0; f < nf0; f++) {
		push_frag(&s, 0, 0, 0, f, g[0], PBOX_F_WANT_REPLY);
	}
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), nf0);
	/* Its cookie from the victim's address, first on chunk 1's core: refused there too. */
	pull_from(&s, 0, 1, 0, &victim);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 1);
	/* The rank itself can use chunk 1's core; nothing ever goes to the victim. */
	for (uint32_t f = 0; f < nf1; f++) {
		push_frag(&s, 0, 0, 1, f, g[0], PBOX_F_WANT_REPLY);
	}
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), nf1);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 1);
	assert_int_equal(SIM_STAT(&s, tx_errors), 0);
	/* Registered again from another address, seen first on chunk 1's core: the new pin
	 * holds on chunk 0's core as well. */
	s.cookies[0] ^= 0x55;
	pull_from(&s, 0, 1, 0, &a1);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 1);
	pull_from(&s, 0, 0, 0, &a0);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_SOURCE]), 2);
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 0);
	free(g[0]);
	sim_fini(&s);
}

/* Rank r's fragment f of chunk c, iteration t, in two pieces cut at payload byte `cut`. */
static void push_frag_split(struct sim *s, uint32_t r, uint32_t t, uint32_t c, uint32_t f,
			    const float *g, uint32_t cut)
{
	const struct pbox_chunk_desc *cd = &s->desc.chunks[c];
	uint8_t pkt[PBOX_WIRE_HDR_LEN + FRAG];
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.encoding = PBOX_ENC_F32,
		.flags = PBOX_F_WANT_REPLY,
		.job = 42,
		.sender = r,
		.cookie = s->cookies[r],
		.chunk = c,
		.iter = t,
		.frag_off = f * FRAG,
		.frag_len = pbox_frag_len(&s->desc, cd->bytes, f),
		.chunk_len = cd->bytes,
	};
	struct pbox_peer from = sim_rank_addr(r);
	struct pbox_iov seg[2];

	pbox_wire_encode(&m, (struct pbox_wire_hdr *)pkt);
	memcpy(pkt + PBOX_WIRE_HDR_LEN, (const uint8_t *)(g + cd->elem_off) + f * FRAG, m.frag_len);
	seg[0] = (struct pbox_iov){ pkt, PBOX_WIRE_HDR_LEN + cut };
	seg[1] = (struct pbox_iov){ pkt + PBOX_WIRE_HDR_LEN + cut, m.frag_len - cut };
	pbox_engine_rx_iov(&s->eng[cd->core], s->tab, seg, 2, &from);
	pbox_engine_flush(&s->eng[cd->core]);
}

/* non_finite = "reject" (the default): a fragment with NaN or Inf is refused before it
 * touches the sum, counted, and its sender told EDOM; the iteration completes with the
 * corrected fragment and the result is finite. "propagate": the IEEE result, counted. */
static void test_non_finite(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	uint32_t bad = 1 * FRAG / 4 + 5; /* chunk 0, fragment 1, element 5 */
	float *g[2], got[NELEM];
	uint32_t label, errs[2] = { 0 };
	struct sim s;

	(void)state;
	for (uint32_t r = 0; r < 2; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 0);
	}
	assert_int_equal(sim_init(&s, &cfg), 0);
	g[0][bad] = NAN;
	push_all(&s, 0, g, false, false);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 1);
	assert_int_equal(SIM_STAT(&s, nonfinite), 1);
	assert_int_equal(s.job.state->core[0].nonfinite, 1);
	/* Chunk 1 is done; chunk 0 waits for rank 0's fragment 1. */
	assert_int_equal(SIM_STAT(&s, iterations), 1);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 0, got, &label, NULL, errs), 4);
	assert_int_equal(errs[0], 1);
	assert_int_equal(errs[1], EDOM);
	assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 4);
	/* An infinity split across two pieces is found too. */
	g[0][bad] = -INFINITY;
	push_frag_split(&s, 0, 0, 0, 1, g[0], 5 * 4 + 2);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 2);
	assert_int_equal(SIM_STAT(&s, nonfinite), 2);
	/* Resent finite: the iteration completes, the result is the finite sum. */
	g[0][bad] = 1.0f;
	push_frag(&s, 0, 0, 0, 1, g[0], PBOX_F_WANT_REPLY);
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 8);
	assert_true(got[bad] == 1.0f + g[1][bad]);
	for (uint32_t i = 0; i < 8192 / 4; i++) {
		assert_true(isfinite(got[i]));
	}
	sim_fini(&s);

	cfg.non_finite = PBOX_NON_FINITE_PROPAGATE;
	assert_int_equal(sim_init(&s, &cfg), 0);
	g[0][bad] = NAN;
	g[1][bad + 1] = INFINITY;
	push_all(&s, 0, g, false, false);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 0);
	assert_int_equal(SIM_STAT(&s, nonfinite), 2);
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 1, got, &label, NULL, errs), 12);
	assert_true(isnan(got[bad]));
	assert_true(isinf(got[bad + 1]) && got[bad + 1] > 0);
	assert_true(got[bad + 2] == g[0][bad + 2] + g[1][bad + 2]);
	sim_fini(&s);
	for (uint32_t r = 0; r < 2; r++) {
		free(g[r]);
	}
}

/* The engine's kernels, wrapped to count which route a fragment took: the separate scan
 * (nonfinite) or the fused data passes. */
static const struct pbox_kernels *g_real;
static unsigned g_n_scan, g_n_copy, g_n_addc, g_n_addf, g_n_sum2;

static size_t w_nonfinite(const float *g, size_t n)
{
	g_n_scan++;
	return g_real->nonfinite(g, n);
}

static size_t w_copy_nonfinite(float *d, const float *g, size_t n)
{
	g_n_copy++;
	return g_real->copy_nonfinite(d, g, n);
}

static size_t w_add_nonfinite(float *acc, const float *g, size_t n)
{
	g_n_addc++;
	return g_real->add_nonfinite(acc, g, n);
}

static size_t w_add_finite(float *acc, const float *g, size_t n)
{
	g_n_addf++;
	return g_real->add_finite(acc, g, n);
}

static size_t w_sum2_nonfinite(float *out, const float *acc, const float *g, size_t n, float div)
{
	g_n_sum2++;
	return g_real->sum2_nonfinite(out, acc, g, n, div);
}

/* Fragments of all chunks of the job. */
static unsigned nfrags_total(const struct sim *s)
{
	unsigned n = 0;

	for (uint32_t c = 0; c < s->desc.nchunks; c++) {
		n += s->desc.chunks[c].nfrags;
	}
	return n;
}

static void wrap_kernels(struct sim *s, struct pbox_kernels *k)
{
	g_real = s->eng[0].kern;
	*k = *g_real;
	k->nonfinite = w_nonfinite;
	k->copy_nonfinite = w_copy_nonfinite;
	k->add_nonfinite = w_add_nonfinite;
	k->add_finite = w_add_finite;
	k->sum2_nonfinite = w_sum2_nonfinite;
	for (uint32_t i = 0; i < s->ncores; i++) {
		s->eng[i].kern = k;
	}
	g_n_scan = g_n_copy = g_n_addc = g_n_addf = g_n_sum2 = 0;
}

/* Everything of chunk c's slot for iteration 0 (its accumulator without fragment skip's
 * bytes if skip < nfrags) serialised into out; returns the length. */
static size_t slot_image(struct sim *s, uint32_t c, uint32_t skip, uint8_t *out)
{
	const struct pbox_chunk_desc *cd = &s->desc.chunks[c];
	const struct pbox_slot *sl = &s->job.state->core[cd->core].chunks[cd->local].slot[0];
	size_t fwords = pbox_bitmap_words(cd->nfrags), n = 0;
	uint32_t nw = s->desc.nworkers;

#define IMG(p, len)                      \
	do {                             \
		memcpy(out + n, p, len); \
		n += len;                \
	} while (0)
	IMG(&sl->iter, 4);
	IMG(&sl->ndone, 4);
	IMG(&sl->nfinal, 4);
	IMG(&sl->quorum, 4);
	IMG(&sl->open, 1);
	IMG(sl->bits, nw * fwords * 8);
	IMG(sl->wcnt, nw * 2);
	IMG(sl->need, cd->nfrags * 2);
	IMG(sl->fcnt, cd->nfrags * 2);
	IMG(sl->done, pbox_bitmap_words(nw) * 8);
	for (uint32_t f = 0; f < cd->nfrags; f++) {
		if (f != skip) {
			IMG((const uint8_t *)sl->acc + f * FRAG,
			    pbox_frag_len(&s->desc, cd->bytes, f));
		}
	}
#undef IMG
	return n;
}

/*
 * The non-finite check fused into the data pass (push_data): a refused later arrival
 * (add_finite) leaves the slot and the whole accumulator bit-identical; a refused first
 * arrival (copy_nonfinite) leaves the slot bit-identical and its fragment empty, whose
 * bytes then never reach a result (the sums come out bit-exact); counts and drop reasons
 * are those of the separate scan, which non-fusable pushes (the slot's first, a
 * duplicate, the final one) still take. "propagate": counted while adding, IEEE sums.
 */
static void test_non_finite_fused(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 3,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	static uint8_t before[16384], after[16384];
	const uint32_t fe = FRAG / 4; /* elements per fragment */
	struct pbox_kernels k;
	float *g[3], got[NELEM], keep[4];
	uint32_t label, errs[2] = { 0 };
	size_t nb;
	struct sim s;

	(void)state;
	for (uint32_t r = 0; r < 3; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 0);
	}
	assert_int_equal(sim_init(&s, &cfg), 0);
	wrap_kernels(&s, &k);
	/* The slot's first datagram is scanned apart (the slot is opened after the check);
	 * the next first arrival is copied and counted in one pass. */
	push_frag(&s, 0, 0, 0, 0, g[0], PBOX_F_WANT_REPLY);
	push_frag(&s, 0, 0, 0, 1, g[0], PBOX_F_WANT_REPLY);
	assert_int_equal(g_n_scan, 1);
	assert_int_equal(g_n_copy, 1);

	/* Later arrival, refused: NaN first, Inf last, then three at once. */
	nb = slot_image(&s, 0, UINT32_MAX, before);
	keep[0] = g[1][fe];
	keep[1] = g[1][2 * fe - 1];
	g[1][fe] = NAN;
	push_frag(&s, 1, 0, 0, 1, g[1], PBOX_F_WANT_REPLY);
	g[1][fe] = keep[0];
	g[1][2 * fe - 1] = -INFINITY;
	push_frag(&s, 1, 0, 0, 1, g[1], PBOX_F_WANT_REPLY);
	g[1][fe] = NAN;
	g[1][fe + 8] = INFINITY;
	push_frag(&s, 1, 0, 0, 1, g[1], PBOX_F_WANT_REPLY);
	g[1][fe] = keep[0];
	g[1][fe + 8] = gval(1, 0, fe + 8);
	g[1][2 * fe - 1] = keep[1];
	assert_int_equal(g_n_addf, 3);
	assert_int_equal(g_n_scan, 1);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 3);
	assert_int_equal(SIM_STAT(&s, nonfinite), 1 + 1 + 3);
	assert_int_equal(s.job.state->core[0].nonfinite, 5);
	assert_int_equal(slot_image(&s, 0, UINT32_MAX, after), nb);
	assert_memory_equal(before, after, nb);
	assert_int_equal(collect(&s, 1, got, &label, NULL, errs), 0);
	assert_int_equal(errs[0], 3);
	assert_int_equal(errs[1], EDOM);

	/* First arrival, refused (Inf in the last element): the slot is as before, fragment
	 * 2 still empty. */
	nb = slot_image(&s, 0, 2, before);
	keep[2] = g[1][3 * fe - 1];
	g[1][3 * fe - 1] = INFINITY;
	push_frag(&s, 1, 0, 0, 2, g[1], PBOX_F_WANT_REPLY);
	g[1][3 * fe - 1] = keep[2];
	assert_int_equal(g_n_copy, 2);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 4);
	assert_int_equal(slot_image(&s, 0, 2, after), nb);
	assert_memory_equal(before, after, nb);

	/* A duplicate holding NaN is refused as non-finite, as before (the separate scan
	 * runs first), not counted as a duplicate. */
	keep[3] = g[0][3];
	g[0][3] = NAN;
	push_frag(&s, 0, 0, 0, 0, g[0], PBOX_F_WANT_REPLY);
	g[0][3] = keep[3];
	assert_int_equal(g_n_scan, 2);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 5);
	assert_int_equal(SIM_STAT(&s, dups), 0);
	assert_int_equal(SIM_STAT(&s, nonfinite), 7);

	/* Everything finite now, rank by rank: each sum is ((g0 + g1) + g2), bit-exact, the
	 * refused bytes of fragment 2 nowhere. */
	for (uint32_t r = 0; r < 3; r++) {
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				if (r != 0 || c != 0 || f > 1) {
					push_frag(&s, r, 0, c, f, g[r], PBOX_F_WANT_REPLY);
				}
			}
		}
	}
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 5);
	assert_int_equal(SIM_STAT(&s, nonfinite), 7);
	assert_true(g_n_addf > 0);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 2, got, &label, NULL, NULL), 12);
	for (uint32_t i = 0; i < NELEM; i++) {
		float want = (g[0][i] + g[1][i]) + g[2][i];

		if (memcmp(&got[i], &want, 4) != 0) {
			fail_msg("element %u: %a, want %a", i, (double)got[i], (double)want);
		}
	}
	sim_fini(&s);

	/* Deterministic mode: every push of an open slot, the final one too, is copied to
	 * its rank's stage and counted in one pass; refused, nothing of the slot changes. */
	cfg.deterministic = true;
	assert_int_equal(sim_init(&s, &cfg), 0);
	wrap_kernels(&s, &k);
	push_frag(&s, 0, 0, 0, 0, g[0], PBOX_F_WANT_REPLY);
	push_frag(&s, 0, 0, 0, 1, g[0], PBOX_F_WANT_REPLY);
	nb = slot_image(&s, 0, UINT32_MAX, before);
	g[1][fe + 7] = NAN;
	push_frag(&s, 1, 0, 0, 1, g[1], PBOX_F_WANT_REPLY);
	g[1][fe + 7] = gval(1, 0, fe + 7);
	assert_int_equal(slot_image(&s, 0, UINT32_MAX, after), nb);
	assert_memory_equal(before, after, nb);
	push_frag(&s, 1, 0, 0, 1, g[1], PBOX_F_WANT_REPLY);
	nb = slot_image(&s, 0, UINT32_MAX, before);
	g[2][2 * fe - 1] = INFINITY; /* the fragment's final arrival */
	push_frag(&s, 2, 0, 0, 1, g[2], PBOX_F_WANT_REPLY);
	g[2][2 * fe - 1] = gval(2, 0, 2 * fe - 1);
	assert_int_equal(slot_image(&s, 0, UINT32_MAX, after), nb);
	assert_memory_equal(before, after, nb);
	assert_int_equal(g_n_scan, 1);
	assert_int_equal(g_n_copy, 4);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 2);
	assert_int_equal(SIM_STAT(&s, nonfinite), 2);
	for (uint32_t r = 0; r < 3; r++) {
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				if (c != 0 || (r == 0 && f > 1) || (r == 1 && f != 1) || r == 2) {
					push_frag(&s, r, 0, c, f, g[r], PBOX_F_WANT_REPLY);
				}
			}
		}
	}
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 2);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 2, got, &label, NULL, NULL), 12);
	for (uint32_t i = 0; i < NELEM; i++) {
		float want = (g[0][i] + g[1][i]) + g[2][i];

		assert_int_equal(memcmp(&got[i], &want, 4), 0);
	}
	sim_fini(&s);
	cfg.deterministic = false;

	/* "propagate": counted while adding (add_nonfinite), nothing refused. */
	cfg.non_finite = PBOX_NON_FINITE_PROPAGATE;
	assert_int_equal(sim_init(&s, &cfg), 0);
	wrap_kernels(&s, &k);
	g[0][fe + 1] = INFINITY; /* first arrival of fragment 1 */
	g[1][fe + 2] = NAN;      /* later arrivals */
	g[1][fe + 3] = NAN;
	g[1][2 * fe - 1] = -INFINITY;
	for (uint32_t r = 0; r < 3; r++) {
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				push_frag(&s, r, 0, c, f, g[r], PBOX_F_WANT_REPLY);
			}
		}
	}
	assert_true(g_n_addc > 0);
	assert_int_equal(g_n_addf, 0);
	/* Every fragment's final arrival (rank 2's) summed and counted in one pass
	 * (sum2_nonfinite); each slot's first datagram copied and counted after the slot
	 * was opened (nothing is refused): no separate scan at all. */
	assert_int_equal(g_n_sum2, nfrags_total(&s));
	assert_int_equal(g_n_copy, nfrags_total(&s));
	assert_int_equal(g_n_scan, 0);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 0);
	assert_int_equal(SIM_STAT(&s, nonfinite), 4);
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 12);
	for (uint32_t i = 0; i < NELEM; i++) {
		float want = (g[0][i] + g[1][i]) + g[2][i];

		assert_int_equal(memcmp(&got[i], &want, 4), 0);
	}
	sim_fini(&s);

	/* "propagate", mean: the final arrival divides in the same pass, bit for bit what the
	 * final reduce gives ((g0 + g1) + g2) / 3, NaN / Inf elements included; a non-final
	 * arrival under "reject" still takes the separate scan (the accumulator cannot be
	 * restored once summed). */
	cfg.reduce = PBOX_REDUCE_MEAN;
	assert_int_equal(sim_init(&s, &cfg), 0);
	wrap_kernels(&s, &k);
	g[2][3 * fe + 5] = NAN; /* a final arrival's NaN */
	for (uint32_t r = 0; r < 3; r++) {
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				push_frag(&s, r, 0, c, f, g[r], PBOX_F_WANT_REPLY);
			}
		}
	}
	assert_int_equal(g_n_sum2, nfrags_total(&s));
	assert_int_equal(SIM_STAT(&s, nonfinite), 5);
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 12);
	for (uint32_t i = 0; i < NELEM; i++) {
		float want = ((g[0][i] + g[1][i]) + g[2][i]) / 3.0f;

		if (isnan(want) ? !isnan(got[i]) : memcmp(&got[i], &want, 4) != 0) {
			fail_msg("mean, element %u: %a, want %a", i, (double)got[i], (double)want);
		}
	}
	assert_true(isnan(got[3 * fe + 5]));
	sim_fini(&s);
	cfg.reduce = PBOX_REDUCE_SUM;

	/* "propagate", deterministic, ranks arriving last to first: every push, each slot's
	 * first too, copied to its rank's stage and counted in one pass; the rank-order sum
	 * bit for bit. */
	cfg.deterministic = true;
	assert_int_equal(sim_init(&s, &cfg), 0);
	wrap_kernels(&s, &k);
	for (uint32_t r = 3; r-- > 0;) {
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				push_frag(&s, r, 0, c, f, g[r], PBOX_F_WANT_REPLY);
			}
		}
	}
	assert_int_equal(g_n_scan, 0);
	assert_int_equal(g_n_copy, 3 * nfrags_total(&s));
	assert_int_equal(SIM_STAT(&s, nonfinite), 5);
	assert_int_equal(SIM_STAT(&s, iterations), 2);
	memset(got, 0, sizeof(got));
	assert_int_equal(collect(&s, 0, got, &label, NULL, NULL), 12);
	for (uint32_t i = 0; i < NELEM; i++) {
		float want = (g[0][i] + g[1][i]) + g[2][i];

		if (isnan(want) ? !isnan(got[i]) : memcmp(&got[i], &want, 4) != 0) {
			fail_msg("deterministic, element %u: %a, want %a", i, (double)got[i],
				 (double)want);
		}
	}
	sim_fini(&s);
	cfg.deterministic = false;
	for (uint32_t r = 0; r < 3; r++) {
		free(g[r]);
	}
}

/* Every reply to rank 0 (type, place, encoding, length, payload bytes) appended to out;
 * returns the bytes written. */
static unsigned g_dvf_replies;

static size_t reply_image(struct sim *s, uint8_t *out, size_t max)
{
	static uint8_t payload[PBOX_WIRE_MAX_PAYLOAD];
	struct pbox_msg m;
	size_t n = 0;

	while (sim_take_reply(s, 0, &m, payload)) {
		uint32_t len = m.type == PBOX_MSG_DATA ? m.frag_len : 0;

		g_dvf_replies += m.type == PBOX_MSG_DATA && m.encoding == PBOX_ENC_DVF;

		assert_true(n + 16 + len <= max);
		memcpy(out + n, &m.type, 1);
		memcpy(out + n + 1, &m.encoding, 1);
		memcpy(out + n + 2, &m.chunk, 4);
		memcpy(out + n + 6, &m.frag_off, 4);
		memcpy(out + n + 10, &len, 4);
		n += 16;
		memcpy(out + n, payload, len);
		n += len;
	}
	return n;
}

/*
 * The final arrival summed in its check's pass (sum2_nonfinite, "propagate") gives the
 * replies the separate scan and the final reduce give ("reject", contiguous payloads; and
 * payloads in two pieces, never fused), byte for byte, where the job filters its results
 * with DVF (the result is encoded from the sum the fused pass wrote), over several
 * iterations so the appliance's residual carries.
 */
static void test_final_fused_dvf_results(void **state)
{
	struct pbox_dvf_job dvf;
	struct sim_job_cfg cfg = {
		.nranks = 3,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
		.dvf = &dvf,
	};
	static uint8_t img[3][1u << 20];
	size_t len[3];
	struct pbox_kernels k;
	float *g[3];
	struct sim s;

	(void)state;
	g_dvf_replies = 0;
	pbox_dvf_job_default(&dvf);
	dvf.params.delta_low = 20.0f;
	dvf.params.delta_up = 20.0f;
	for (uint32_t r = 0; r < 3; r++) {
		g[r] = malloc(NELEM * sizeof(float));
	}
	/* run 0: every payload in two pieces (not fusable: scanned apart, then summed and
	 * reduced), the reference; 1: "propagate", the final sum fused; 2: "reject", the final
	 * arrival scanned apart, then reduced */
	for (int run = 0; run < 3; run++) {
		cfg.non_finite = run == 1 ? PBOX_NON_FINITE_PROPAGATE : PBOX_NON_FINITE_REJECT;
		assert_int_equal(sim_init(&s, &cfg), 0);
		wrap_kernels(&s, &k);
		len[run] = 0;
		for (uint32_t t = 0; t < 4; t++) {
			for (uint32_t r = 0; r < 3; r++) {
				fill_grad(g[r], r, t);
			}
			if (run != 0) {
				push_all(&s, t, g, false, false);
			}
			for (uint32_t r = 0; r < 3 && run == 0; r++) {
				for (uint32_t c = 0; c < s.desc.nchunks; c++) {
					for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
						push_frag_split(&s, r, t, c, f, g[r], 22);
					}
				}
			}
			len[run] +=
				reply_image(&s, img[run] + len[run], sizeof(img[run]) - len[run]);
		}
		assert_int_equal(SIM_STAT(&s, iterations), 4 * s.desc.nchunks);
		assert_true(SIM_STAT(&s, dvf_out_frags) > 0);
		if (run == 1) {
			assert_int_equal(g_n_sum2, 4 * nfrags_total(&s));
		} else {
			assert_int_equal(g_n_sum2, 0);
		}
		sim_fini(&s);
	}
	assert_true(g_dvf_replies > 0); /* filtered results among them */
	assert_int_equal(len[0], len[1]);
	assert_memory_equal(img[0], img[1], len[0]);
	assert_int_equal(len[0], len[2]);
	assert_memory_equal(img[0], img[2], len[0]);
	for (uint32_t r = 0; r < 3; r++) {
		free(g[r]);
	}
}

/* Whether got holds, bit for bit, ((a + b) [/ 2]) of the first n elements. */
static void check_sum2(const float *got, const float *a, const float *b, uint32_t n, bool mean)
{
	for (uint32_t i = 0; i < n; i++) {
		float want = a[i] + b[i];

		if (mean) {
			want = want / 2.0f;
		}
		if (memcmp(&got[i], &want, 4) != 0) {
			fail_msg("element %u: %a, want %a", i, (double)got[i], (double)want);
		}
	}
}

/*
 * Under non_finite = "reject", a refused final arrival of a fragment (the one whose sum
 * or mean would overwrite the accumulator with the result) changes nothing: the slot and
 * its whole accumulator stay bit-identical, nothing is finalised or answered but the
 * EDOM error, and the resent finite fragment then gives the exact sum / mean. Fragments
 * of 1 KB (and a short one) and of 12,000 bytes. NaN / Inf
 * at the first, a middle and the last element of every fragment of both chunks (full and
 * short fragments), sum and mean. Likewise a refused datagram that would open a slot
 * (iteration t + 2 in the slot of t) leaves iteration t's retained result in place, still
 * served bit-exact to a pull.
 */
static void test_reject_final_unchanged(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	static const float bad[] = { NAN, INFINITY, -INFINITY };
	static uint8_t before[16384], after[16384];
	struct pbox_kernels k;
	float *g[2], got[NELEM], again[NELEM];
	uint32_t label;

	(void)state;
	for (uint32_t r = 0; r < 2; r++) {
		g[r] = malloc(NELEM * sizeof(float));
		fill_grad(g[r], r, 0);
	}
	for (unsigned v = 0; v < 2; v++) {
		uint32_t refused = 0, errs[2] = { 0 };
		unsigned scans;
		struct sim s;

		cfg.reduce = v == 0 ? PBOX_REDUCE_SUM : PBOX_REDUCE_MEAN;
		assert_int_equal(sim_init(&s, &cfg), 0);
		wrap_kernels(&s, &k);
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				push_frag(&s, 0, 0, c, f, g[0], PBOX_F_WANT_REPLY);
			}
		}
		scans = g_n_scan;
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			const struct pbox_chunk_desc *cd = &s.desc.chunks[c];

			for (uint32_t f = 0; f < cd->nfrags; f++) {
				uint32_t fe = pbox_frag_len(&s.desc, cd->bytes, f) / 4;
				uint32_t base = cd->elem_off + f * FRAG / 4;
				const uint32_t pos[3] = { 0, fe / 2, fe - 1 };

				for (unsigned p = 0; p < 3; p++) {
					float keep = g[1][base + pos[p]];
					size_t nb = slot_image(&s, c, UINT32_MAX, before);

					g[1][base + pos[p]] = bad[(f + p) % 3];
					push_frag(&s, 1, 0, c, f, g[1], PBOX_F_WANT_REPLY);
					g[1][base + pos[p]] = keep;
					refused++;
					assert_int_equal(slot_image(&s, c, UINT32_MAX, after), nb);
					assert_memory_equal(before, after, nb);
				}
			}
		}
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), refused);
		assert_int_equal(SIM_STAT(&s, nonfinite), refused);
		assert_int_equal(SIM_STAT(&s, iterations), 0);
		/* checked apart before anything is summed */
		assert_int_equal(g_n_sum2, 0);
		assert_int_equal(g_n_scan, scans + refused);
		assert_int_equal(collect(&s, 1, got, &label, NULL, errs), 0);
		assert_int_equal(errs[0], refused);
		assert_int_equal(errs[1], EDOM);

		/* Resent finite: the exact sum / mean, nothing of the refused values in it. */
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			for (uint32_t f = 0; f < s.desc.chunks[c].nfrags; f++) {
				push_frag(&s, 1, 0, c, f, g[1], PBOX_F_WANT_REPLY);
			}
		}
		assert_int_equal(SIM_STAT(&s, iterations), s.desc.nchunks);
		memset(got, 0, sizeof(got));
		assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 12);
		assert_int_equal(label, 0);
		check_sum2(got, g[0], g[1], NELEM, v == 1);
		collect(&s, 0, again, &label, NULL, NULL);

		/* Iteration 1, then a refused push of iteration 2, which would open the slot
		 * still holding iteration 0's result: that result stays, and is served. */
		push_all(&s, 1, g, false, false);
		assert_int_equal(SIM_STAT(&s, iterations), 2 * s.desc.nchunks);
		collect(&s, 0, again, &label, NULL, NULL);
		collect(&s, 1, again, &label, NULL, NULL);
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			size_t nb = slot_image(&s, c, UINT32_MAX, before);
			float keep = g[0][s.desc.chunks[c].elem_off + 3];

			g[0][s.desc.chunks[c].elem_off + 3] = NAN;
			push_frag(&s, 0, 2, c, 0, g[0], PBOX_F_WANT_REPLY);
			g[0][s.desc.chunks[c].elem_off + 3] = keep;
			assert_int_equal(slot_image(&s, c, UINT32_MAX, after), nb);
			assert_memory_equal(before, after, nb);
		}
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]),
				 refused + s.desc.nchunks);
		memset(again, 0, sizeof(again));
		for (uint32_t c = 0; c < s.desc.nchunks; c++) {
			struct pbox_msg m = { .type = PBOX_MSG_PULL, .chunk = c, .iter = 0 };

			sim_send_msg(&s, 1, &m, NULL);
		}
		assert_int_equal(collect(&s, 1, again, &label, NULL, NULL), 12);
		assert_int_equal(label, 0);
		assert_memory_equal(again, got, sizeof(got));
		sim_fini(&s);
	}

	/* A fragment of 12,000 bytes, larger than L1 holds beside its accumulator: checked
	 * apart, then summed; refused, nothing changes either. */
	cfg.chunk_bytes = 16384;
	cfg.frag_bytes = 16384;
	cfg.reduce = PBOX_REDUCE_SUM;
	{
		struct pbox_msg m = {
			.type = PBOX_MSG_PUSH,
			.flags = PBOX_F_WANT_REPLY,
			.frag_len = NELEM * 4,
			.seq = 1,
		};
		uint32_t errs[2] = { 0 };
		struct sim s;
		size_t nb;

		assert_int_equal(sim_init(&s, &cfg), 0);
		assert_int_equal(s.desc.nchunks, 1);
		wrap_kernels(&s, &k);
		sim_send_msg(&s, 0, &m, g[0]);
		nb = slot_image(&s, 0, UINT32_MAX, before);
		g[1][NELEM - 1] = INFINITY;
		m.seq = 2;
		sim_send_msg(&s, 1, &m, g[1]);
		g[1][NELEM - 1] = gval(1, 0, NELEM - 1);
		assert_int_equal(slot_image(&s, 0, UINT32_MAX, after), nb);
		assert_memory_equal(before, after, nb);
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_NON_FINITE]), 1);
		assert_int_equal(g_n_sum2, 0);
		assert_int_equal(g_n_scan, 2); /* the slot's first datagram, the final one */
		assert_int_equal(collect(&s, 1, got, &label, NULL, errs), 0);
		assert_int_equal(errs[1], EDOM);
		m.seq = 3;
		sim_send_msg(&s, 1, &m, g[1]);
		assert_int_equal(SIM_STAT(&s, iterations), 1);
		memset(got, 0, sizeof(got));
		assert_int_equal(collect(&s, 1, got, &label, NULL, NULL), 1);
		check_sum2(got, g[0], g[1], NELEM, false);
		sim_fini(&s);
	}
	for (uint32_t r = 0; r < 2; r++) {
		free(g[r]);
	}
}

/*
 * NACKs: a push round that ends (PBOX_F_LAST) with fragments missing is answered with an
 * ACK carrying PBOX_F_SACK: the first missing fragment as the base, the ones held after it
 * as bits; the seq of the round's last datagram echoed. A round's end without LAST (a
 * network duplicate) or a complete contribution gets none. Chunk 0 has 8 fragments.
 */
static void test_nack_bitmap(void **state)
{
	struct sim_job_cfg cfg = {
		.nranks = 2,
		.keys = g_keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = FRAG,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	static float g[NELEM];
	struct pbox_msg m;
	struct sim s;

	(void)state;
	fill_grad(g, 0, 0);
	assert_int_equal(sim_init(&s, &cfg), 0);
	/* fragments 0, 1, 3, 6 of 8; the round ends at 6 */
	push_frag(&s, 0, 0, 0, 0, g, PBOX_F_WANT_REPLY);
	push_frag(&s, 0, 0, 0, 1, g, PBOX_F_WANT_REPLY);
	push_frag(&s, 0, 0, 0, 3, g, PBOX_F_WANT_REPLY);
	assert_false(sim_take_reply(&s, 0, &m, NULL));
	push_frag(&s, 0, 0, 0, 6, g, PBOX_F_WANT_REPLY | PBOX_F_LAST);
	assert_true(sim_take_reply(&s, 0, &m, NULL));
	assert_int_equal(m.type, PBOX_MSG_ACK);
	assert_int_equal(m.flags, PBOX_F_SACK);
	assert_int_equal(m.frag_off, 2 * FRAG);
	assert_int_equal(m.sack, (1u << 1) | (1u << 4)); /* 3 and 6 held after the base 2 */
	assert_int_equal(m.arg0, 1);                     /* push_frag's seq */
	assert_int_equal(SIM_STAT(&s, nacks), 1);
	/* A duplicate of the round's end with LAST: the same NACK again (the first was lost). */
	push_frag(&s, 0, 0, 0, 6, g, PBOX_F_WANT_REPLY | PBOX_F_LAST | PBOX_F_RETRANSMIT);
	assert_true(sim_take_reply(&s, 0, &m, NULL));
	assert_true(m.flags & PBOX_F_SACK);
	assert_int_equal(m.sack, (1u << 1) | (1u << 4));
	/* The rest: the contribution completes, an ACK (rank 1 has not pushed), no NACK. */
	for (uint32_t f = 2; f < 8; f++) {
		if (f != 3 && f != 6) {
			push_frag(&s, 0, 0, 0, f, g,
				  PBOX_F_WANT_REPLY | (f == 7 ? PBOX_F_LAST : 0));
		}
	}
	assert_true(sim_take_reply(&s, 0, &m, NULL));
	assert_int_equal(m.type, PBOX_MSG_ACK);
	assert_int_equal(m.flags, 0);
	assert_false(sim_take_reply(&s, 0, &m, NULL));
	assert_int_equal(SIM_STAT(&s, nacks), 2);
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_aggregate_in_order),
		cmocka_unit_test(test_aggregate_shuffled_dups_deterministic),
		cmocka_unit_test(test_aggregate_shuffled_dups),
		cmocka_unit_test(test_server_optimizer),
		cmocka_unit_test(test_resend_and_window),
		cmocka_unit_test(test_iov_pieces),
		cmocka_unit_test(test_abort_misdirected),
		cmocka_unit_test(test_source_pinned),
		cmocka_unit_test(test_source_pinned_cores),
		cmocka_unit_test(test_non_finite),
		cmocka_unit_test(test_non_finite_fused),
		cmocka_unit_test(test_final_fused_dvf_results),
		cmocka_unit_test(test_reject_final_unchanged),
		cmocka_unit_test(test_nack_bitmap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
