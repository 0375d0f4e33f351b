/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Synchronisation models on the engine (FluentPS's conditions, ASAP's NOTIFY-ACK): for
 * scripted arrival orders, exactly which push-pulls are answered (and with which model
 * version) and which are held, step by step; PSSP's pause frequencies and their identity
 * across cores; drop-stragglers never losing a contribution; credits and version words;
 * ranks leaving mid-iteration.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/bitmap.h"
#include "common/compiler.h"
#include "common/crc.h"
#include "engine/sync.h"
#include "sim.h"

#define N     3
#define NELEM 16 /* one chunk, one fragment */

static const struct pbox_keyspec g_key[] = { { 1, NELEM } };

static struct sim_job_cfg job_cfg(enum pbox_sync_model model, uint32_t s, bool eager)
{
	struct sim_job_cfg c = {
		.nranks = N,
		.ncores = 1,
		.keys = g_key,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_SERVER_OPT,
		.optimizer = "sgd",
		.no_nodes = true,
	};

	pbox_opt_params_default(&c.opt);
	c.opt.lr = 1.0f; /* w -= sum of gradients: every contribution shows in the model */
	c.sync.model = model;
	c.sync.staleness = s;
	c.sync.eager = eager;
	c.sync.seed = 7;
	return c;
}

static float grad_of(uint32_t r, uint32_t t, uint32_t i)
{
	return (float)(1 + r * 100 + t * 10 + i % 3); /* small integers: sums are exact */
}

static void init_model(struct sim *s)
{
	float w[NELEM] = { 0 };
	struct pbox_msg m = { .type = PBOX_MSG_INIT, .chunk = 0, .frag_len = NELEM * 4 };
	struct pbox_msg r;

	sim_send_msg(s, 0, &m, w);
	while (sim_take_reply(s, 0, &r, NULL)) {
	}
}

static void push_pull(struct sim *s, uint32_t rank, uint32_t t)
{
	float g[NELEM];
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.flags = PBOX_F_WANT_REPLY,
		.chunk = 0,
		.iter = t,
		.frag_len = NELEM * 4,
	};

	for (uint32_t i = 0; i < NELEM; i++) {
		g[i] = grad_of(rank, t, i);
	}
	sim_send_msg(s, rank, &m, g);
}

/* The versions sent to each rank since the last call (-1: none). */
static void replies(struct sim *s, int32_t *ver)
{
	for (uint32_t r = 0; r < N; r++) {
		struct pbox_msg m;

		ver[r] = -1;
		while (sim_take_reply(s, r, &m, NULL)) {
			if (m.type == PBOX_MSG_DATA) {
				assert_int_equal(ver[r], -1); /* one answer per push-pull */
				ver[r] = (int32_t)m.iter;
			}
			assert_true(m.type != PBOX_MSG_ERROR);
		}
	}
}

/* One step of a table: rank `who` push-pulls its next iteration; `want` lists the model
 * version each rank gets right after (-1: no answer: held, or not asked). */
struct step {
	uint32_t who;
	int32_t want[N];
};

static void run_table(struct sim_job_cfg cfg, const struct step *steps, unsigned n,
		      const char *name)
{
	uint32_t next[N] = { 0 };
	bool busy[N] = { false };
	struct sim s;

	assert_int_equal(sim_init(&s, &cfg), 0);
	init_model(&s);
	for (unsigned i = 0; i < n; i++) {
		int32_t got[N];

		/* The script only lets a rank push when its last push-pull was answered. */
		if (busy[steps[i].who]) {
			fail_msg("%s step %u: bad script, rank %u still waits", name, i + 1,
				 steps[i].who);
		}
		push_pull(&s, steps[i].who, next[steps[i].who]++);
		busy[steps[i].who] = true;
		replies(&s, got);
		for (uint32_t r = 0; r < N; r++) {
			if (got[r] != steps[i].want[r]) {
				fail_msg(
					"%s step %u (rank %u pushed iteration %u): rank %u got %d, "
					"table says %d",
					name, i + 1, steps[i].who, next[steps[i].who] - 1, r,
					got[r], steps[i].want[r]);
			}
			if (got[r] >= 0) {
				busy[r] = false;
			}
		}
	}
	sim_fini(&s);
}

#define X -1

/* BSP: a push-pull of iteration t is answered with version t + 1, when everyone is in. */
static void test_table_bsp(void **state)
{
	static const struct step t[] = {
		{ 0, { X, X, X } }, { 1, { X, X, X } }, { 2, { 1, 1, 1 } },
		{ 0, { X, X, X } }, { 1, { X, X, X } }, { 2, { 2, 2, 2 } },
	};

	(void)state;
	run_table(job_cfg(PBOX_SYNC_BSP, 0, false), t, PBOX_ARRAY_SIZE(t), "bsp");
}

/* SSP, s = 1, lazy: answered iff t <= V; a held pull waits for its own iteration. */
static const struct step g_ssp1[] = {
	{ 0, { 0, X, X } },                     /* t=0 <= V=0 */
	{ 1, { X, 0, X } }, { 0, { X, X, X } }, /* t=1 > 0: held (wants 2) */
	{ 1, { X, X, X } }, { 2, { X, X, 1 } }, /* V=1: the held ones want 2, still waiting */
	{ 2, { 2, 2, 2 } },                     /* V=2: released */
	{ 0, { 2, X, X } },                     /* t=2 <= 2 */
	{ 1, { X, 2, X } }, { 0, { X, X, X } }, /* t=3 > 2 */
	{ 2, { X, X, 3 } },                     /* V=3: rank 0 wants 4 */
	{ 1, { X, 3, X } },                     /* t=3 <= V=3 */
};

static void test_table_ssp(void **state)
{
	(void)state;
	run_table(job_cfg(PBOX_SYNC_SSP, 1, false), g_ssp1, PBOX_ARRAY_SIZE(g_ssp1),
		  "ssp s=1 lazy");
}

/* SSP, s = 1, eager (soft barrier): held pulls go out at the next advance. */
static void test_table_ssp_eager(void **state)
{
	static const struct step t[] = {
		{ 0, { 0, X, X } }, { 1, { X, 0, X } }, { 0, { X, X, X } },
		{ 1, { X, X, X } }, { 2, { 1, 1, 1 } }, /* V=1: everything held is released, with
							   version 1 */
		{ 0, { X, X, X } },                     /* t=2 > V=1 */
		{ 1, { X, X, X } }, { 2, { 2, 2, 2 } },
	};

	(void)state;
	run_table(job_cfg(PBOX_SYNC_SSP, 1, true), t, PBOX_ARRAY_SIZE(t), "ssp s=1 eager");
}

/* ASP: always answered; the first contribution completes an iteration and later ones
 * are added to the next one, so the model moves at the pace of the fastest worker. */
static const struct step g_asp[] = {
	{ 0, { 1, X, X } }, /* completes iteration 0 */
	{ 1, { X, 1, X } }, /* its iteration 0 is late: added to iteration 1 */
	{ 0, { 2, X, X } }, /* t=1: completes 1 (with rank 1's gradient) */
	{ 1, { X, 2, X } }, /* t=1 late: added to 2 */
	{ 0, { 3, X, X } }, /* t=2: completes 2 */
	{ 2, { X, X, 3 } }, /* the straggler's t=0: added to 3 */
	{ 2, { X, X, 3 } }, /* and its t=1 */
	{ 1, { X, 3, X } }, /* t=2: late, added to 3 */
	{ 0, { 4, X, X } }, /* t=3: completes 3 with three folded gradients */
};

static void test_table_asp(void **state)
{
	(void)state;
	run_table(job_cfg(PBOX_SYNC_ASP, 0, false), g_asp, PBOX_ARRAY_SIZE(g_asp), "asp");
}

/* PSSP at its limits: c = 1 pauses exactly as SSP does, c = 0 never pauses (ASP). */
static void test_table_pssp_limits(void **state)
{
	struct sim_job_cfg c = job_cfg(PBOX_SYNC_PSSP, 1, false);
	const struct step *t = g_ssp1;
	static const struct step asp_like[] = {
		{ 0, { 0, X, X } }, { 1, { X, 0, X } }, { 0, { 0, X, X } }, /* k=1 >= s, c=0 */
		{ 1, { X, 0, X } }, { 2, { X, X, 1 } },
	};

	(void)state;
	c.sync.probability = 1.0;
	run_table(c, t, PBOX_ARRAY_SIZE(g_ssp1), "pssp c=1");
	c.sync.probability = 0.0;
	run_table(c, asp_like, PBOX_ARRAY_SIZE(asp_like), "pssp c=0");
	/* Dynamic with alpha = 2: P(k >= s) = 2 / (1 + e^(s-k)) >= 1: like SSP. */
	c = job_cfg(PBOX_SYNC_PSSP_DYN, 1, false);
	c.sync.alpha = 2.0;
	run_table(c, t, PBOX_ARRAY_SIZE(g_ssp1), "pssp-dyn a=2");
}

/* Never lost: replay a table's pushes; the model at version `version` must be exactly
 * minus the sum of every push (SGD, lr 1), the late ones included. */
static void never_lost(struct sim_job_cfg c, const struct step *t, unsigned n, uint32_t version,
		       uint32_t late)
{
	struct sim s;
	uint32_t next[N] = { 0 };
	float model[NELEM] = { 0 }, got[NELEM];
	struct pbox_msg m = { .type = PBOX_MSG_PULL, .chunk = 0, .iter = version };
	uint8_t payload[NELEM * 4];

	assert_int_equal(sim_init(&s, &c), 0);
	init_model(&s);
	for (unsigned i = 0; i < n; i++) {
		uint32_t r = t[i].who;
		int32_t v[N];

		push_pull(&s, r, next[r]);
		for (uint32_t e = 0; e < NELEM; e++) {
			model[e] -= grad_of(r, next[r], e);
		}
		next[r]++;
		replies(&s, v);
	}
	sim_send_msg(&s, 0, &m, NULL);
	assert_true(sim_take_reply(&s, 0, &m, payload));
	assert_int_equal(m.type, PBOX_MSG_DATA);
	assert_int_equal(m.iter, version);
	memcpy(got, payload, sizeof(got));
	assert_memory_equal(got, model, sizeof(model));
	assert_int_equal(SIM_STAT(&s, late_contribs), late);
	sim_fini(&s);
}

static void test_asp_never_lost(void **state)
{
	(void)state;
	never_lost(job_cfg(PBOX_SYNC_ASP, 0, false), g_asp, PBOX_ARRAY_SIZE(g_asp), 4, 5);
}

/* Drop-stragglers, quorum 2 of 3: iterations complete with any two; the straggler's
 * late contributions are folded into the next open iteration and answered at once. */
static void test_table_drop_stragglers(void **state)
{
	struct sim_job_cfg c = job_cfg(PBOX_SYNC_DROP_STRAGGLERS, 0, false);
	static const struct step t[] = {
		{ 0, { X, X, X } }, { 1, { 1, 1, X } }, /* two of three: iteration 0 done */
		{ 0, { X, X, X } }, { 1, { 2, 2, X } },
		{ 2, { X, X, 2 } }, /* rank 2's iteration 0: late, folded into 2, answered */
		{ 0, { X, X, X } }, /* iteration 2 has rank 0 (rank 2's fold does not count) */
		{ 2, { X, X, 2 } }, /* rank 2's iteration 1: late too */
		{ 1, { 3, 3, X } },
	};

	(void)state;
	c.sync.quorum = 2;
	run_table(c, t, PBOX_ARRAY_SIZE(t), "drop-stragglers");
	/* Rank 2's folds went into iteration 2, now complete: version 3. */
	never_lost(c, t, PBOX_ARRAY_SIZE(t), 3, 2);
}

/* PSSP draws: the pause frequency matches c, and the dynamic probability, within 5 sigma. */
static void test_pssp_frequencies(void **state)
{
	struct pbox_sync_cfg c = {
		.model = PBOX_SYNC_PSSP, .staleness = 3, .probability = 0.3, .seed = 11
	};
	const uint32_t n = 200000;
	uint32_t paused = 0;

	(void)state;
	for (uint32_t i = 0; i < n; i++) {
		/* progress p = 10 + s at version 10: k = s, always in the paused region */
		paused += pbox_sync_pssp_pause(&c, 5, i % 64, 13 + i / 64 * 100, 10 + i / 64 * 100);
	}
	{
		double sd = sqrt(n * 0.3 * 0.7);

		assert_true(fabs(paused - n * 0.3) < 5 * sd);
	}
	/* Below the staleness bound nobody pauses. */
	for (uint32_t i = 0; i < 1000; i++) {
		assert_false(pbox_sync_pssp_pause(&c, 5, i, 12, 10));
	}
	c.model = PBOX_SYNC_PSSP_DYN;
	c.alpha = 1.0;
	for (uint32_t k = 3; k <= 6; k++) {
		double p = 1.0 / (1.0 + exp(3.0 - (double)k)), sd = sqrt(n * p * (1 - p));

		paused = 0;
		for (uint32_t i = 0; i < n; i++) {
			paused += pbox_sync_pssp_pause(&c, 5, i % 97, 1000 + i + k, 1000 + i);
		}
		if (fabs(paused - n * p) >= 5 * sd) {
			fail_msg("pssp-dyn k=%u: %u of %u paused, expected %.0f", k, paused, n,
				 n * p);
		}
	}
}

/* Every core (chunk) decides the same for a worker and iteration: run a PSSP job on two
 * cores, one chunk each, and compare which push-pulls each answered. */
static void test_pssp_same_on_every_core(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, NELEM }, { 2, NELEM } };
	struct sim_job_cfg c = job_cfg(PBOX_SYNC_PSSP, 1, false);
	struct sim s;
	uint32_t paused = 0, answered = 0;
	float g[NELEM] = { 0 };

	(void)state;
	c.ncores = 2;
	c.keys = keys;
	c.nkeys = 2;
	c.sync.probability = 0.5;
	c.window = 64;
	assert_int_equal(sim_init(&s, &c), 0);
	assert_true(s.desc.chunks[0].core != s.desc.chunks[1].core);
	for (uint32_t ch = 0; ch < 2; ch++) {
		struct pbox_msg m = { .type = PBOX_MSG_INIT, .chunk = ch, .frag_len = NELEM * 4 };
		struct pbox_msg r;

		sim_send_msg(&s, 0, &m, g);
		while (sim_take_reply(&s, 0, &r, NULL)) {
		}
	}
	/* Rank 0 runs ahead alone (nobody else pushes, so V stays 0): from t >= s each
	 * push-pull is paused on both chunks or on neither. */
	for (uint32_t t = 0; t < 60; t++) {
		bool got[2] = { false, false };
		struct pbox_msg r;

		for (uint32_t ch = 0; ch < 2; ch++) {
			struct pbox_msg m = { .type = PBOX_MSG_PUSH,
					      .flags = PBOX_F_WANT_REPLY,
					      .chunk = ch,
					      .iter = t,
					      .frag_len = NELEM * 4 };

			sim_send_msg(&s, 0, &m, g);
		}
		while (sim_take_reply(&s, 0, &r, NULL)) {
			if (r.type == PBOX_MSG_DATA) {
				got[r.chunk] = true;
			}
		}
		if (got[0] != got[1]) {
			fail_msg("iteration %u: chunk 0 %s, chunk 1 %s", t,
				 got[0] ? "answered" : "paused", got[1] ? "answered" : "paused");
		}
		if (t >= 1) {
			paused += !got[0];
			answered += got[0];
		}
		/* A paused pull stays held; forget it so the next iteration is a fresh draw
		 * (a real worker would wait; here we only test the decision). */
		for (uint32_t k = 0; k < 2; k++) {
			for (uint32_t i = 0; i < s.job.state->core[k].nchunks; i++) {
				struct pbox_chunk_state *cs = &s.job.state->core[k].chunks[i];

				if (cs->pull_want[0] != PBOX_PULL_NONE) {
					cs->pull_want[0] = PBOX_PULL_NONE;
					cs->nheld--;
				}
			}
		}
	}
	assert_true(paused > 10 && answered > 10); /* c = 0.5 over 59 draws */
	sim_fini(&s);
}

/* NOTIFY-ACK: with one credit, a second contribution cannot start while the first is
 * unconsumed; it is refused and nothing of the first is disturbed. */
static void test_credits(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 512 } }; /* 2 fragments of 1 KB */
	struct sim_job_cfg c = {
		.nranks = 2,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.deterministic = true,
		.no_nodes = true,
		.window = 4,
	};
	struct sim s;
	float g0[512], g1[512], out[512];
	uint8_t payload[1024];
	struct pbox_msg r;
	uint32_t acks = 0;

	(void)state;
	for (uint32_t i = 0; i < 512; i++) {
		g0[i] = (float)i;
		g1[i] = 1000.0f + (float)i;
	}
	assert_int_equal(sim_init(&s, &c), 0);
	{
		struct pbox_msg m = {
			.type = PBOX_MSG_PUSH, .chunk = 0, .iter = 0, .frag_len = 1024
		};

		sim_send_msg(&s, 0, &m, g0); /* first half of iteration 0 */
		m.iter = 1;
		sim_send_msg(&s, 0, &m, g1); /* second contribution: refused */
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_CREDIT]), 1);
		m.iter = 0;
		m.frag_off = 1024;
		sim_send_msg(&s, 0, &m, g0 + 256); /* completes iteration 0: ACK */
		while (sim_take_reply(&s, 0, &r, NULL)) {
			acks += r.type == PBOX_MSG_ACK;
		}
		assert_int_equal(acks, 1);
		m.iter = 1;
		m.frag_off = 0;
		sim_send_msg(&s, 0, &m, g1); /* now it is accepted */
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_CREDIT]), 1);
		/* Rank 1 completes iteration 0; its sum holds rank 0's iteration-0 data only. */
		m.frag_off = 0;
		m.iter = 0;
		m.flags = PBOX_F_WANT_REPLY;
		sim_send_msg(&s, 1, &m, g0);
		m.frag_off = 1024;
		sim_send_msg(&s, 1, &m, g0 + 256);
		while (sim_take_reply(&s, 1, &r, payload)) {
			if (r.type == PBOX_MSG_DATA) {
				memcpy((uint8_t *)out + r.frag_off, payload, r.frag_len);
			}
		}
		for (uint32_t i = 0; i < 512; i++) {
			assert_true(out[i] == 2.0f * (float)i);
		}
	}
	sim_fini(&s);
}

/* Version words: with verification on, a fragment whose CRC32C does not match its bytes is
 * dropped and never aggregated; a matching one is. */
static void test_version_words(void **state)
{
	struct sim_job_cfg c = job_cfg(PBOX_SYNC_BSP, 0, false);
	struct sim s;
	float g[NELEM];
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.flags = PBOX_F_CRC,
		.chunk = 0,
		.iter = 0,
		.frag_len = NELEM * 4,
	};

	(void)state;
	c.mode = PBOX_MODE_AGGREGATE;
	c.verify_crc = true;
	assert_int_equal(sim_init(&s, &c), 0);
	for (uint32_t i = 0; i < NELEM; i++) {
		g[i] = (float)i;
	}
	m.arg1 = pbox_crc32c(g, sizeof(g), PBOX_CRC_INIT) ^ 1;
	sim_send_msg(&s, 0, &m, g);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_CHECKSUM]), 1);
	assert_int_equal(SIM_STAT(&s, agg_frags), 0);
	m.arg1 ^= 1;
	sim_send_msg(&s, 0, &m, g);
	assert_int_equal(SIM_STAT(&s, agg_frags), 1);
	/* The word is the CRC32C of the concatenated bytes, however they are cut. */
	{
		struct pbox_iov v[3] = { { g, 5 },
					 { (uint8_t *)g + 5, 30 },
					 { (uint8_t *)g + 35, 29 } };

		assert_int_equal(pbox_crc32c_iov(v, 3), pbox_crc32c(g, sizeof(g), PBOX_CRC_INIT));
	}
	sim_fini(&s);
}

/* A rank leaves mid-iteration: the iteration completes with the remaining ranks; what the
 * departed rank had sent in time (a fragment) still counts, the rest does not stall it. */
static void test_member_leaves(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 512 } }; /* 2 fragments */
	struct sim_job_cfg c = {
		.nranks = 3,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.no_nodes = true,
	};
	struct sim s;
	float g[512], out[512];
	uint8_t payload[1024];
	struct pbox_msg r;

	(void)state;
	for (uint32_t i = 0; i < 512; i++) {
		g[i] = 1.0f;
	}
	for (int det = 0; det < 2; det++) {
		c.deterministic = det;
		assert_int_equal(sim_init(&s, &c), 0);
		for (uint32_t w = 0; w < 2; w++) {
			for (uint32_t f = 0; f < 2; f++) {
				struct pbox_msg m = { .type = PBOX_MSG_PUSH,
						      .flags = PBOX_F_WANT_REPLY,
						      .chunk = 0,
						      .frag_off = f * 1024,
						      .frag_len = 1024 };

				sim_send_msg(&s, w, &m, g + f * 256);
			}
		}
		{
			/* Rank 2 sends its first fragment only, then is gone. */
			struct pbox_msg m = { .type = PBOX_MSG_PUSH, .chunk = 0, .frag_len = 1024 };

			sim_send_msg(&s, 2, &m, g);
		}
		assert_false(sim_take_reply(&s, 0, &r, NULL) && r.type == PBOX_MSG_DATA);
		sim_remove_rank(&s, 2);
		assert_int_equal(SIM_STAT(&s, iterations), 1);
		memset(out, 0, sizeof(out));
		while (sim_take_reply(&s, 0, &r, payload)) {
			if (r.type == PBOX_MSG_DATA) {
				memcpy((uint8_t *)out + r.frag_off, payload, r.frag_len);
			}
		}
		for (uint32_t i = 0; i < 512; i++) {
			assert_true(out[i] == (i < 256 ? 3.0f : 2.0f));
		}
		assert_int_equal(SIM_STAT(&s, membership_changes), 1);
		sim_fini(&s);
	}
}

/* An incomplete contribution's retransmission round is not acknowledged (it would make
 * the worker stop resending what the appliance still lacks). */
static void test_no_ack_for_incomplete(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 768 } }; /* 3 fragments */
	struct sim_job_cfg c = {
		.nranks = 2,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct sim s;
	float g[768] = { 0 };
	struct pbox_msg r;
	uint32_t acks = 0;

	(void)state;
	assert_int_equal(sim_init(&s, &c), 0);
	for (int round = 0; round < 2; round++) {
		for (uint32_t f = 0; f < 3; f += 2) { /* fragment 1 lost every time */
			struct pbox_msg m = { .type = PBOX_MSG_PUSH,
					      .flags = round ? PBOX_F_RETRANSMIT : 0,
					      .chunk = 0,
					      .frag_off = f * 1024,
					      .frag_len = 1024 };

			sim_send_msg(&s, 0, &m, g + f * 256);
		}
	}
	while (sim_take_reply(&s, 0, &r, NULL)) {
		acks += r.type == PBOX_MSG_ACK;
	}
	assert_int_equal(acks, 0);
	sim_fini(&s);
}

/* Drop-stragglers with multi-fragment chunks: a straggler that had sent part of its
 * contribution when the quorum completed the iteration finishes it late (folded forward,
 * acknowledged), and is not refused a credit by its own half-sent contribution. */
static void test_straggler_finishes_late(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 32 } }; /* 2 fragments of 64 B */
	struct sim_job_cfg c = {
		.nranks = 3,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 128,
		.frag_bytes = 64,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct sim s;
	float g[32] = { 0 };
	struct pbox_msg r;
	uint32_t acks = 0;

	(void)state;
	c.sync.model = PBOX_SYNC_DROP_STRAGGLERS;
	c.sync.quorum = 2;
	assert_int_equal(sim_init(&s, &c), 0);
	{
		struct pbox_msg m = { .type = PBOX_MSG_PUSH, .chunk = 0, .frag_len = 64 };

		sim_send_msg(&s, 2, &m, g); /* rank 2: first half of iteration 0 */
		for (uint32_t w = 0; w < 2; w++) {
			for (uint32_t f = 0; f < 2; f++) {
				m.frag_off = f * 64;
				sim_send_msg(&s, w, &m, g + f * 16);
			}
		}
		assert_int_equal(s.job.state->core[0].chunks[0].version, 1);
		m.frag_off = 64;
		sim_send_msg(&s, 2, &m, g + 16); /* rank 2: the rest, late */
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_CREDIT]), 0);
		assert_int_equal(SIM_STAT(&s, late_contribs), 1);
		while (sim_take_reply(&s, 2, &r, NULL)) {
			acks += r.type == PBOX_MSG_ACK && r.iter == 0;
		}
		assert_int_equal(acks, 1);
		m.iter = 1;
		m.frag_off = 0;
		sim_send_msg(&s, 2, &m, g); /* its next contribution starts at once */
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_CREDIT]), 0);
	}
	sim_fini(&s);
}

/* ASP with two-fragment chunks: a straggler's late second half folds into the iteration
 * that reuses its own iteration's slot (0 + window); the contribution still completes,
 * is acknowledged, takes no extra credit, and every gradient reaches the model. */
static void test_asp_late_half_reuses_its_slot(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 32 } }; /* 2 fragments of 64 B */
	struct sim_job_cfg c = job_cfg(PBOX_SYNC_ASP, 0, false);
	float zero[16] = { 0 }, g[16], want[32] = { 0 }, got[32];
	uint8_t payload[64];
	struct pbox_msg m, r;
	uint32_t acks = 0;
	struct sim s;

	(void)state;
	c.keys = keys;
	c.chunk_bytes = 128;
	c.frag_bytes = 64;
	assert_int_equal(sim_init(&s, &c), 0);
	for (uint32_t f = 0; f < 2; f++) {
		m = (struct pbox_msg){
			.type = PBOX_MSG_INIT, .chunk = 0, .frag_off = f * 64, .frag_len = 64
		};
		sim_send_msg(&s, 0, &m, zero);
	}
#define PUSH(rank, t, f)                                               \
	do {                                                           \
		for (uint32_t i = 0; i < 16; i++) {                    \
			g[i] = (float)(1 + (rank)*100 + (t)*10 + (f)); \
			want[(f)*16 + i] -= g[i];                      \
		}                                                      \
		m = (struct pbox_msg){ .type = PBOX_MSG_PUSH,          \
				       .chunk = 0,                     \
				       .iter = (t),                    \
				       .frag_off = (f)*64,             \
				       .frag_len = 64 };               \
		sim_send_msg(&s, (rank), &m, g);                       \
	} while (0)
	PUSH(1, 0, 0); /* rank 1: first half of iteration 0 */
	for (uint32_t t = 0; t < 4; t++) {
		PUSH(0, t, 0);
		PUSH(0, t, 1);
	}
	assert_int_equal(s.job.state->core[0].chunks[0].version, 4);
	PUSH(1, 0, 1); /* the rest of iteration 0: folded into 4, in slot 0 */
	PUSH(1, 1, 0);
	PUSH(1, 1, 1);
	PUSH(0, 4, 0);
	PUSH(0, 4, 1);
#undef PUSH
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_CREDIT]), 0);
	assert_int_equal(SIM_STAT(&s, late_contribs), 2);
	while (sim_take_reply(&s, 1, &r, NULL)) {
		acks += r.type == PBOX_MSG_ACK;
	}
	assert_int_equal(acks, 2);
	assert_int_equal(s.job.state->core[0].chunks[0].version, 5);
	m = (struct pbox_msg){ .type = PBOX_MSG_PULL, .chunk = 0, .iter = 5 };
	sim_send_msg(&s, 0, &m, NULL);
	while (sim_take_reply(&s, 0, &r, payload)) {
		if (r.type == PBOX_MSG_DATA) {
			memcpy((uint8_t *)got + r.frag_off, payload, r.frag_len);
		}
	}
	assert_memory_equal(got, want, sizeof(got));
	sim_fini(&s);
}

/* ---- many ranks (bitmaps over several words) and the iteration limit ------------------ */

#define MR_ELEM 2048u /* two chunks of 4096 B, four 1 KB fragments each */
#define MR_FRAG 1024u

static const struct pbox_keyspec g_mr_key[] = { { 1, MR_ELEM } };

static float mr_grad(uint32_t r, uint32_t t, uint32_t i)
{
	return (float)(1 + (r * 7 + t * 3 + i) % 5); /* small integers: sums are exact */
}

static void mr_push(struct sim *s, uint32_t r, uint32_t t, uint32_t c, uint32_t f)
{
	const struct pbox_chunk_desc *cd = &s->desc.chunks[c];
	float g[MR_FRAG / 4];
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.flags = PBOX_F_WANT_REPLY,
		.chunk = c,
		.iter = t,
		.frag_off = f * MR_FRAG,
		.frag_len = MR_FRAG,
	};

	for (uint32_t i = 0; i < MR_FRAG / 4; i++) {
		g[i] = mr_grad(r, t, cd->elem_off + f * MR_FRAG / 4 + i);
	}
	sim_send_msg(s, r, &m, g);
}

/* Every fragment of iteration t from every rank not in gone[], last fragments first and
 * ranks from the top, so completions happen in the middle of the bitmaps' words. */
static void mr_push_all(struct sim *s, uint32_t t, const bool *gone)
{
	for (uint32_t c = 0; c < s->desc.nchunks; c++) {
		for (uint32_t f = s->desc.chunks[c].nfrags; f-- > 0;) {
			for (uint32_t r = s->nranks; r-- > 0;) {
				if (!gone[r]) {
					mr_push(s, r, t, c, f);
				}
			}
		}
	}
}

struct mr_check {
	const struct pbox_jobdesc *d;
	uint32_t iter, nlive;
	float want[MR_ELEM];
	uint32_t data[SIM_MAX_RANKS];
	uint32_t bad, errors;
};

static void mr_reply(uint32_t rank, const struct pbox_msg *m, const uint8_t *payload, void *arg)
{
	struct mr_check *k = arg;

	if (m->type == PBOX_MSG_ERROR) {
		k->errors++;
		return;
	}
	if (m->type != PBOX_MSG_DATA) {
		return;
	}
	k->data[rank]++;
	if (m->iter != k->iter || m->arg0 != k->nlive ||
	    memcmp(payload, k->want + k->d->chunks[m->chunk].elem_off + m->frag_off / 4,
		   m->frag_len) != 0) {
		if (k->bad++ < 3) {
			float got0;

			memcpy(&got0, payload, 4);
			print_message(
				"rank %u chunk %u off %u iter %u/%u arg0 %u/%u: %g vs %g\n", rank,
				m->chunk, m->frag_off, m->iter, k->iter, m->arg0, k->nlive,
				(double)got0,
				(double)k->want[k->d->chunks[m->chunk].elem_off + m->frag_off / 4]);
		}
	}
}

/* Results of iteration t: every rank not in gone[] gets all 8 fragments, exactly want,
 * labelled t and with the live count; the gone ranks get nothing. */
static void mr_expect(struct sim *s, struct mr_check *k, uint32_t t, uint32_t nlive,
		      const bool *gone)
{
	k->d = &s->desc;
	k->iter = t;
	k->nlive = nlive;
	k->bad = 0;
	k->errors = 0;
	memset(k->data, 0, sizeof(k->data));
	sim_take_all(s, mr_reply, k);
	assert_int_equal(k->bad, 0);
	assert_int_equal(k->errors, 0);
	for (uint32_t r = 0; r < s->nranks; r++) {
		if (k->data[r] != (gone[r] ? 0 : 8)) {
			fail_msg("%u ranks, iteration %u: rank %u got %u result fragments",
				 s->nranks, t, r, k->data[r]);
		}
	}
}

/* 65, 129 and 1,024 ranks (pboxd's limit): sums, duplicates, and ranks leaving at word
 * boundaries (0, 63, 64, 127, 128, the last) and one (1) mid-contribution, in both
 * summation modes. */
static void test_many_ranks(void **state)
{
	static const uint32_t sizes[] = { 65, 129, PBOX_MAX_WORKERS };
	static struct mr_check k;
	static bool gone[SIM_MAX_RANKS];

	(void)state;
	for (unsigned si = 0; si < PBOX_ARRAY_SIZE(sizes); si++) {
		for (int det = 0; det < 2; det++) {
			const uint32_t n = sizes[si], leave[] = { 0, 63, 64, 127, 128, n - 1, 1 };
			struct sim_job_cfg c = {
				.nranks = n,
				.ncores = 2,
				.keys = g_mr_key,
				.nkeys = 1,
				.chunk_bytes = 4096,
				.frag_bytes = MR_FRAG,
				.mode = PBOX_MODE_AGGREGATE,
				.reduce = PBOX_REDUCE_SUM,
				.deterministic = det,
				.no_nodes = true,
			};
			uint32_t nlive = n, ndups = 0;
			struct sim s;

			assert_int_equal(sim_init(&s, &c), 0);
			assert_int_equal(s.desc.nchunks, 2);
			memset(gone, 0, sizeof(gone));
			mr_push_all(&s, 0, gone);
			assert_int_equal(SIM_STAT(&s, iterations), 2);
			assert_int_equal(SIM_STAT(&s, agg_frags), n * 8);
			for (uint32_t i = 0; i < MR_ELEM; i++) {
				k.want[i] = 0;
				for (uint32_t r = 0; r < n; r++) {
					k.want[i] += mr_grad(r, 0, i);
				}
			}
			mr_expect(&s, &k, 0, n, gone);
			/* Network duplicates of a complete iteration: counted, no effect. */
			for (uint32_t r = 0; r < n; r += 63) {
				mr_push(&s, r, 0, 1, 3);
				ndups++;
			}
			assert_int_equal(SIM_STAT(&s, dups), ndups);
			assert_int_equal(SIM_STAT(&s, agg_frags), n * 8);

			/* Iteration 1: rank 1 sends one fragment and leaves, the others in
			 * leave[] send nothing and leave; what rank 1 sent still counts. */
			for (unsigned i = 0; i < PBOX_ARRAY_SIZE(leave); i++) {
				if (leave[i] < n && !gone[leave[i]]) {
					gone[leave[i]] = true;
					nlive--;
				}
			}
			mr_push(&s, 1, 1, 0, 0);
			mr_push_all(&s, 1, gone);
			assert_int_equal(SIM_STAT(&s, iterations), 2);
			for (unsigned i = 0; i < PBOX_ARRAY_SIZE(leave); i++) {
				if (leave[i] < n && pbox_bit_test(s.live, leave[i])) {
					assert_int_equal(SIM_STAT(&s, iterations), 2);
					sim_remove_rank(&s, leave[i]);
				}
			}
			assert_int_equal(s.job.nlive, nlive);
			assert_int_equal(SIM_STAT(&s, iterations), 4);
			for (uint32_t i = 0; i < MR_ELEM; i++) {
				k.want[i] = i < MR_FRAG / 4 ? mr_grad(1, 1, i) : 0;
				for (uint32_t r = 0; r < n; r++) {
					k.want[i] += gone[r] ? 0 : mr_grad(r, 1, i);
				}
			}
			mr_expect(&s, &k, 1, nlive, gone);

			/* Iteration 2 with the remaining ranks, the bitmaps full of holes. */
			mr_push_all(&s, 2, gone);
			assert_int_equal(SIM_STAT(&s, iterations), 6);
			for (uint32_t i = 0; i < MR_ELEM; i++) {
				k.want[i] = 0;
				for (uint32_t r = 0; r < n; r++) {
					k.want[i] += gone[r] ? 0 : mr_grad(r, 2, i);
				}
			}
			mr_expect(&s, &k, 2, nlive, gone);
			assert_int_equal(SIM_STAT(&s, agg_frags), n * 8 + 1 + nlive * 16);
			for (int r = 1; r < PBOX_DROP_COUNT; r++) {
				assert_int_equal(SIM_STAT(&s, drops[r]), 0);
			}
			sim_fini(&s);
		}
	}
}

/* Drop-stragglers with 129 and 1,024 ranks and a quorum of all but two: the iteration
 * completes without the last two (16-bit per-fragment counts near the top of the range),
 * and their late contributions are added to the next iteration, never lost. */
static void test_many_ranks_stragglers(void **state)
{
	static const uint32_t sizes[] = { 129, PBOX_MAX_WORKERS };
	static struct mr_check k;
	static bool late[SIM_MAX_RANKS], none[SIM_MAX_RANKS];

	(void)state;
	for (unsigned si = 0; si < PBOX_ARRAY_SIZE(sizes); si++) {
		const uint32_t n = sizes[si];
		struct sim_job_cfg c = {
			.nranks = n,
			.ncores = 2,
			.keys = g_mr_key,
			.nkeys = 1,
			.chunk_bytes = 4096,
			.frag_bytes = MR_FRAG,
			.mode = PBOX_MODE_AGGREGATE,
			.reduce = PBOX_REDUCE_SUM,
			.no_nodes = true,
		};
		struct sim s;

		c.sync.model = PBOX_SYNC_DROP_STRAGGLERS;
		c.sync.quorum = n - 2;
		assert_int_equal(sim_init(&s, &c), 0);
		memset(late, 0, sizeof(late));
		late[n - 1] = late[n - 2] = true;
		mr_push_all(&s, 0, late);
		assert_int_equal(SIM_STAT(&s, iterations), 2);
		for (uint32_t i = 0; i < MR_ELEM; i++) {
			k.want[i] = 0;
			for (uint32_t r = 0; r < n - 2; r++) {
				k.want[i] += mr_grad(r, 0, i);
			}
		}
		mr_expect(&s, &k, 0, n, late);
		/* The two stragglers' iteration 0, late: folded into iteration 1. */
		for (uint32_t r = n - 2; r < n; r++) {
			for (uint32_t ch = 0; ch < 2; ch++) {
				for (uint32_t f = 0; f < 4; f++) {
					mr_push(&s, r, 0, ch, f);
				}
			}
		}
		assert_int_equal(SIM_STAT(&s, folded_frags), 16);
		assert_int_equal(SIM_STAT(&s, late_contribs), 4);
		assert_int_equal(SIM_STAT(&s, iterations), 2);
		sim_take_all(&s, mr_reply, &k); /* their ACKs */
		mr_push_all(&s, 1, late);
		assert_int_equal(SIM_STAT(&s, iterations), 4);
		for (uint32_t i = 0; i < MR_ELEM; i++) {
			k.want[i] = mr_grad(n - 2, 0, i) + mr_grad(n - 1, 0, i);
			for (uint32_t r = 0; r < n - 2; r++) {
				k.want[i] += mr_grad(r, 1, i);
			}
		}
		mr_expect(&s, &k, 1, n, late);
		(void)none;
		sim_fini(&s);
	}
}

/* Iteration numbers never wrap: a chunk runs up to PBOX_ITER_LIMIT iterations, in order
 * and with held pulls answered (server optimizer; aggregate with a window of 3, not a
 * power of two); the next push, or a pull for a later version, is refused with EOVERFLOW
 * and counted. (Without the limit, iteration UINT32_MAX - 1 of a server-optimizer job
 * held a pull for version UINT32_MAX = PBOX_PULL_NONE: counted as held, never answered.) */
static void test_iteration_limit(void **state)
{
	const uint32_t lim = PBOX_ITER_LIMIT;

	(void)state;
	for (int agg = 0; agg < 2; agg++) {
		struct sim_job_cfg c = job_cfg(PBOX_SYNC_BSP, 0, false);
		struct pbox_chunk_state *cs;
		struct sim s;
		int32_t ver[N];
		uint32_t first = agg ? lim - 5 : (lim - 3) & ~1u, errs = 0;
		struct pbox_msg m, r;

		if (agg) {
			c.mode = PBOX_MODE_AGGREGATE;
			c.window = 3;
		}
		assert_int_equal(sim_init(&s, &c), 0);
		if (!agg) {
			init_model(&s);
		}
		/* As if the job had run `first` iterations (the model version v lives in
		 * model[v & 1]: first is even). */
		cs = &s.job.state->core[0].chunks[0];
		cs->version = first;
		for (uint32_t t = first; t < lim; t++) {
			push_pull(&s, 0, t);
			push_pull(&s, 1, t);
			replies(&s, ver);
			assert_int_equal(ver[0], -1);
			push_pull(&s, 2, t);
			replies(&s, ver);
			for (uint32_t w = 0; w < N; w++) {
				assert_int_equal(ver[w], agg ? (int32_t)t : (int32_t)(t + 1));
			}
			assert_int_equal(cs->nheld, 0);
		}
		assert_int_equal(cs->version, lim);
		push_pull(&s, 0, lim);
		m = (struct pbox_msg){ .type = PBOX_MSG_PULL, .chunk = 0, .iter = lim + 1 };
		sim_send_msg(&s, 1, &m, NULL);
		for (uint32_t w = 0; w < 2; w++) {
			while (sim_take_reply(&s, w, &r, NULL)) {
				assert_int_equal(r.type, PBOX_MSG_ERROR);
				assert_int_equal(r.arg0, EOVERFLOW);
				errs++;
			}
		}
		assert_int_equal(errs, 2);
		assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_ITER_LIMIT]), 2);
		assert_int_equal(cs->version, lim);
		/* The last result is still there. */
		m = (struct pbox_msg){ .type = PBOX_MSG_PULL,
				       .chunk = 0,
				       .iter = agg ? lim - 1 : lim };
		sim_send_msg(&s, 1, &m, NULL);
		assert_true(sim_take_reply(&s, 1, &r, NULL));
		assert_int_equal(r.type, PBOX_MSG_DATA);
		assert_int_equal(r.iter, agg ? lim - 1 : lim);
		sim_fini(&s);
	}
}

/* Drop one datagram in `every`, both directions (deterministic). */
static enum sim_verdict mr_lossy(struct sim *s, enum sim_dir dir, uint32_t ep,
				 const struct pbox_msg *m, void *arg)
{
	uint32_t *count = arg;

	(void)s;
	(void)dir;
	(void)ep;
	(void)m;
	return ++*count % 97 == 0 ? SIM_DROP : SIM_PASS;
}

/* 129 and 1,024 worker nodes push-pull through the engine with 1% loss on the virtual
 * clock: every rank gets the exact sum of every iteration. */
static void test_many_ranks_nodes(void **state)
{
	static const uint32_t sizes[] = { 129, PBOX_MAX_WORKERS };
	static float g[SIM_MAX_RANKS][MR_ELEM], out[SIM_MAX_RANKS][MR_ELEM], want[MR_ELEM];
	static struct pbox_op op[SIM_MAX_RANKS];

	(void)state;
	for (unsigned si = 0; si < PBOX_ARRAY_SIZE(sizes); si++) {
		const uint32_t n = sizes[si];
		struct sim_job_cfg c = {
			.nranks = n,
			.ncores = 2,
			.keys = g_mr_key,
			.nkeys = 1,
			.chunk_bytes = 4096,
			.frag_bytes = MR_FRAG,
			.mode = PBOX_MODE_AGGREGATE,
			.reduce = PBOX_REDUCE_SUM,
			.timeout_ms = 60000,
		};
		uint32_t count = 0;
		struct sim s;

		assert_int_equal(sim_init(&s, &c), 0);
		s.filter = mr_lossy;
		s.filter_arg = &count;
		for (uint32_t t = 0; t < 2; t++) {
			s.ncompleted = 0;
			for (uint32_t i = 0; i < MR_ELEM; i++) {
				want[i] = 0;
				for (uint32_t r = 0; r < n; r++) {
					want[i] += mr_grad(r, t, i);
				}
			}
			for (uint32_t r = 0; r < n; r++) {
				for (uint32_t i = 0; i < MR_ELEM; i++) {
					g[r][i] = mr_grad(r, t, i);
				}
				op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
							  .key = 0,
							  .iter = t,
							  .src = g[r],
							  .dst = out[r] };
				assert_int_equal(pbox_node_submit(s.node[r], &op[r]), 0);
				pbox_node_flush(s.node[r]);
			}
			for (int i = 0; i < 20000 && s.ncompleted < n; i++) {
				sim_advance(&s, 1000000);
			}
			assert_int_equal(s.ncompleted, n);
			for (uint32_t r = 0; r < n; r++) {
				assert_int_equal(op[r].status, 0);
				assert_memory_equal(out[r], want, sizeof(want));
			}
		}
		{
			uint64_t retx = 0;

			for (uint32_t r = 0; r < n; r++) {
				retx += pbox_node_stats(s.node[r])->retransmits;
			}
			print_message("%u ranks: %u datagrams, %u lost, %llu retransmissions\n", n,
				      count, count / 97, (unsigned long long)retx);
			assert_true(retx > 0); /* losses did happen and were repaired */
		}
		sim_fini(&s);
	}
}

static void test_names(void **state)
{
	(void)state;
	for (int m = PBOX_SYNC_BSP; m <= PBOX_SYNC_DROP_STRAGGLERS; m++) {
		assert_int_equal(pbox_sync_parse(pbox_sync_name(m)), m);
		assert_true(pbox_sync_ops(m)->min_window(
				    &(struct pbox_sync_cfg){ .staleness = 3 }) >= 2);
	}
	assert_int_equal(pbox_sync_parse("bogus"), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_bsp),
		cmocka_unit_test(test_table_ssp),
		cmocka_unit_test(test_table_ssp_eager),
		cmocka_unit_test(test_table_asp),
		cmocka_unit_test(test_asp_never_lost),
		cmocka_unit_test(test_table_pssp_limits),
		cmocka_unit_test(test_table_drop_stragglers),
		cmocka_unit_test(test_pssp_frequencies),
		cmocka_unit_test(test_pssp_same_on_every_core),
		cmocka_unit_test(test_credits),
		cmocka_unit_test(test_version_words),
		cmocka_unit_test(test_member_leaves),
		cmocka_unit_test(test_no_ack_for_incomplete),
		cmocka_unit_test(test_straggler_finishes_late),
		cmocka_unit_test(test_asp_late_half_reuses_its_slot),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_many_ranks),
		cmocka_unit_test(test_many_ranks_stragglers),
		cmocka_unit_test(test_many_ranks_nodes),
		cmocka_unit_test(test_iteration_limit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
