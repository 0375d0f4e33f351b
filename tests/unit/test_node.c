/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's worker node against simulated appliance cores on a virtual clock: push-pull
 * round trips, retransmission after the timeout with doubling back-off, recovery of lost
 * results through probes, deadlines with messages that say what happened, appliance
 * errors, one operation per key.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "simjob.h"

#define MS 1000000ull

static const struct pbox_keyspec g_keys[] = { { 5, 2500 }, { 9, 10 } };

static struct sim_job_cfg base_cfg(uint32_t nranks)
{
	return simjob_cfg(nranks, g_keys, 2, 2000);
}

struct ranks {
	struct pbox_op op[SIM_MAX_RANKS];
	float g[SIM_MAX_RANKS][2500];
	float out[SIM_MAX_RANKS][2500];
};

static void start_all(struct sim *s, struct ranks *R, uint32_t key, uint32_t t, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++) {
		for (uint32_t i = 0; i < 2500; i++) {
			R->g[r][i] = (float)(r * 1000 + i + t);
		}
		assert_int_equal(simjob_push_pull(s, r, &R->op[r], key, t, R->g[r], R->out[r]), 0);
	}
}

static void check_sum(struct ranks *R, uint32_t n, uint32_t r, uint32_t t)
{
	for (uint32_t i = 0; i < 2500; i++) {
		float want = 0;

		for (uint32_t q = 0; q < n; q++) {
			want += (float)(q * 1000 + i + t);
		}
		assert_true(R->out[r][i] == want);
	}
}

static void test_roundtrip(void **state)
{
	struct sim_job_cfg cfg = base_cfg(3);
	static struct ranks R;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	for (uint32_t t = 0; t < 3; t++) {
		s.ncompleted = 0;
		start_all(&s, &R, 0, t, 3);
		sim_pump(&s, 0);
		assert_int_equal(s.ncompleted, 3);
		for (uint32_t r = 0; r < 3; r++) {
			assert_int_equal(R.op[r].status, 0);
			assert_int_equal(R.op[r].label, t);
			check_sum(&R, 3, r, t);
			assert_int_equal(pbox_node_stats(s.node[r])->retransmits, 0);
		}
	}
	/* A second operation on a busy key is refused with a message. */
	start_all(&s, &R, 0, 3, 1);
	{
		struct pbox_op again = { .kind = PBOX_OP_PUSH, .key = 0, .iter = 3, .src = R.g[0] };

		assert_int_equal(pbox_node_submit(s.node[0], &again), -EBUSY);
		assert_non_null(strstr(again.errmsg, "in flight"));
	}
	sim_fini(&s);
}

/* Drop the first `n` data datagrams from rank 0 to the appliance. */
struct dropper {
	uint32_t left;
	uint32_t dropped;
	uint8_t type;
	enum sim_dir dir;
	uint32_t endpoint;
};

static enum sim_verdict drop_first(struct sim *s, enum sim_dir dir, uint32_t ep,
				   const struct pbox_msg *m, void *arg)
{
	struct dropper *d = arg;

	(void)s;
	if (d->left > 0 && dir == d->dir && m->type == d->type &&
	    (dir == SIM_TO_WORKER ? ep == d->endpoint : m->sender == d->endpoint)) {
		d->left--;
		d->dropped++;
		return SIM_DROP;
	}
	return SIM_PASS;
}

static void test_retransmit_backoff(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static struct ranks R;
	struct dropper d = { .left = 3, .type = PBOX_MSG_PUSH, .dir = SIM_TO_APPLIANCE };
	struct sim s;
	uint64_t t0;

	(void)state;
	cfg.keys = &g_keys[1]; /* one key, one chunk, one fragment */
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &d;
	t0 = s.now_ns;
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 0);
	/* Nothing happens before the first timeout (10 ms)... */
	sim_advance(&s, 9 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 0);
	/* ...then resends at 10, 10+20, 10+20+40 ms: the third one gets through. */
	sim_advance(&s, 1 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 1);
	sim_advance(&s, 19 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 1);
	sim_advance(&s, 1 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 2);
	assert_int_equal(s.ncompleted, 0);
	sim_advance(&s, 40 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 3);
	assert_int_equal(d.dropped, 3);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, 0);
	assert_int_equal(s.now_ns - t0, 70 * MS);
	for (uint32_t i = 0; i < 10; i++) {
		assert_true(R.out[0][i] == R.g[0][i]);
	}
	/* The appliance added the contribution once, whatever the resends. */
	assert_int_equal(SIM_STAT(&s, agg_frags), 1);
	sim_fini(&s);
}

/* The result is lost after the ACK: the node probes with a PULL and gets it again. */
static void test_lost_result_probe(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static struct ranks R;
	struct dropper d = {
		.left = 1, .type = PBOX_MSG_DATA, .dir = SIM_TO_WORKER, .endpoint = 1
	};
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &d;
	/* Rank 0 first: it is acknowledged and waits; rank 1 completes the iteration. */
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	{
		R.op[1] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
					    .key = 0,
					    .iter = 0,
					    .src = R.g[1],
					    .dst = R.out[1] };
		for (uint32_t i = 0; i < 10; i++) {
			R.g[1][i] = (float)(1000 + i);
		}
		assert_int_equal(pbox_node_submit(s.node[1], &R.op[1]), 0);
		pbox_node_flush(s.node[1]);
	}
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 1); /* rank 0; rank 1's result was dropped */
	sim_advance(&s, 10 * MS);
	/* Rank 1 had no ACK either (its own result doubled as one): it resends its data and
	 * the appliance answers the retransmission round with the result. */
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(R.op[1].status, 0);
	for (uint32_t i = 0; i < 10; i++) {
		assert_true(R.out[1][i] == R.out[0][i]);
	}
	assert_int_equal(SIM_STAT(&s, replies_resent), 1);
	assert_int_equal(SIM_STAT(&s, agg_frags), 2);
	sim_fini(&s);
}

/* After an ACK the node only probes: dropping the result of a rank that was ACKed. */
static void test_probe_after_ack(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static struct ranks R;
	struct dropper d = {
		.left = 1, .type = PBOX_MSG_DATA, .dir = SIM_TO_WORKER, .endpoint = 0
	};
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &d;
	start_all(&s, &R, 0, 0, 2);
	/* Deliver rank 0's push alone first so it is ACKed and then waits. */
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 1); /* rank 1 */
	sim_advance(&s, 39 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->probes, 0); /* probes wait 4 x rto */
	sim_advance(&s, 1 * MS);
	assert_int_equal(pbox_node_stats(s.node[0])->probes, 1);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 0);
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(R.op[0].status, 0);
	sim_fini(&s);
}

static void test_deadline_messages(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static struct ranks R;
	struct dropper all = { .left = 1000000, .type = PBOX_MSG_PUSH, .dir = SIM_TO_APPLIANCE };
	struct sim s;

	(void)state;
	/* Appliance silent: every push is lost. */
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &all;
	start_all(&s, &R, 0, 0, 1);
	for (int i = 0; i < 200 && s.ncompleted == 0; i++) {
		sim_advance(&s, 20 * MS);
	}
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, -ETIMEDOUT);
	assert_non_null(strstr(R.op[0].errmsg, "no answer from the appliance"));
	assert_true(s.now_ns - R.op[0].start_ns >= 2000 * MS);
	assert_true(s.now_ns - R.op[0].start_ns < 2100 * MS);
	sim_fini(&s);

	/* A peer that never arrives: rank 0 is acknowledged, rank 1 never pushes. */
	assert_int_equal(sim_init(&s, &cfg), 0);
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	for (int i = 0; i < 200 && s.ncompleted == 0; i++) {
		sim_advance(&s, 20 * MS);
	}
	assert_int_equal(R.op[0].status, -ETIMEDOUT);
	assert_non_null(strstr(R.op[0].errmsg, "when last asked, 1 of 2 workers had contributed"));
	/* The node is usable again afterwards. */
	assert_int_equal(pbox_node_inflight(s.node[0]), 0);
	sim_fini(&s);
}

/* A gradient with a NaN under non_finite = "reject": the appliance answers ERROR(EDOM)
 * and the push fails with a message that names the cause and the setting; a push past
 * PBOX_ITER_LIMIT fails with EOVERFLOW and says so. */
static void test_nonfinite_message(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static struct ranks R;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	for (uint32_t r = 0; r < 2; r++) {
		for (uint32_t i = 0; i < 10; i++) {
			R.g[r][i] = (float)(r + i);
		}
		memset(&R.op[r], 0, sizeof(R.op[r]));
		R.op[r].kind = PBOX_OP_PUSH_PULL;
		R.op[r].key = 1;
		R.op[r].iter = 0;
		R.op[r].src = R.g[r];
		R.op[r].dst = R.out[r];
	}
	R.g[0][3] = NAN;
	for (uint32_t r = 0; r < 2; r++) {
		assert_int_equal(pbox_node_submit(s.node[r], &R.op[r]), 0);
		pbox_node_flush(s.node[r]);
	}
	sim_pump(&s, 0);
	assert_int_equal(R.op[0].status, -EDOM);
	if (strstr(R.op[0].errmsg, "push-pull of key 9 (chunk ") != R.op[0].errmsg ||
	    strstr(R.op[0].errmsg,
		   ", iteration 0) refused by the appliance: the gradient holds NaN or Inf and "
		   "the job rejects non-finite values (non_finite = \"reject\")") == NULL ||
	    strchr(R.op[0].errmsg, '\n') != NULL) {
		fail_msg("unexpected message: '%s'", R.op[0].errmsg);
	}
	sim_fini(&s);

	/* An iteration past the appliance's limit: ERROR(EOVERFLOW), named as such. */
	assert_int_equal(sim_init(&s, &cfg), 0);
	start_all(&s, &R, 1, PBOX_ITER_LIMIT, 1);
	sim_pump(&s, 0);
	assert_int_equal(R.op[0].status, -EOVERFLOW);
	if (strstr(R.op[0].errmsg, "refused by the appliance: the job reached the appliance's "
				   "iteration limit (PBOX_ITER_LIMIT") == NULL) {
		fail_msg("unexpected message: '%s'", R.op[0].errmsg);
	}
	sim_fini(&s);
}

static void test_appliance_error(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static struct ranks R;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.job.run = PBOX_JOB_ABORTED;
	s.job.abort_errno = ECONNABORTED;
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, -ECONNABORTED);
	assert_non_null(strstr(R.op[0].errmsg, "aborted"));
	/* pbox_node_fail: everything in flight and every later submit fails. */
	s.job.run = PBOX_JOB_RUNNING;
	start_all(&s, &R, 1, 0, 1);
	pbox_node_fail(s.node[0], -ECONNRESET, "appliance gone");
	assert_int_equal(R.op[0].status, -ECONNRESET);
	assert_int_equal(pbox_node_submit(s.node[0], &R.op[0]), -ECONNRESET);
	sim_fini(&s);
}

/* With duplicated and dropped datagrams in both directions (1 in 20 each), results stay
 * exact. */
static void test_chaos(void **state)
{
	struct sim_job_cfg cfg = base_cfg(3);
	static struct ranks R;
	struct simjob_chaos x = { .x = 77, .one_in = 20 };
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = simjob_chaos;
	s.filter_arg = &x;
	for (uint32_t t = 0; t < 20; t++) {
		s.ncompleted = 0;
		start_all(&s, &R, 0, t, 3);
		sim_pump(&s, 0);
		for (int i = 0; i < 500 && s.ncompleted < 3; i++) {
			sim_advance(&s, 5 * MS);
		}
		assert_int_equal(s.ncompleted, 3);
		for (uint32_t r = 0; r < 3; r++) {
			assert_int_equal(R.op[r].status, 0);
			check_sum(&R, 3, r, t);
		}
	}
	/* Each contribution was aggregated exactly once. */
	assert_int_equal(SIM_STAT(&s, agg_frags), 20 * 3 * 10);
	sim_fini(&s);
}

/* The caller changes its gradient buffer while the push is in flight: the resend's
 * version words no longer match and the operation fails instead of sending torn data. */
static void test_torn_buffer(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static struct ranks R;
	struct dropper d = { .left = 1, .type = PBOX_MSG_PUSH, .dir = SIM_TO_APPLIANCE };
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &d;
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	R.g[0][3] += 1.0f; /* the caller breaks the contract */
	sim_advance(&s, 10 * MS);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, -EILSEQ);
	assert_non_null(strstr(R.op[0].errmsg, "buffer changed while its push was in flight"));
	assert_int_equal(SIM_STAT(&s, agg_frags), 0); /* nothing torn reached the sum */
	sim_fini(&s);
}

/* Two credits: two pushes of one key may be in flight; a third is refused. */
struct crc_seen {
	uint32_t drop_last; /* drop this many round tails (the timeout resends them) */
	uint32_t pushes, flagged;
};

static enum sim_verdict count_crc(struct sim *s, enum sim_dir dir, uint32_t ep,
				  const struct pbox_msg *m, void *arg)
{
	struct crc_seen *c = arg;

	if (dir == SIM_TO_APPLIANCE && m->type == PBOX_MSG_PUSH) {
		c->pushes++;
		c->flagged += (m->flags & PBOX_F_CRC) != 0;
		if (c->drop_last > 0 && (m->flags & PBOX_F_LAST)) {
			c->drop_last--;
			return SIM_DROP;
		}
	}
	(void)s;
	(void)ep;
	return SIM_PASS;
}

/*
 * Sampled version words (cfg.sampled_words, what libpbox uses unless the appliance
 * verifies CRC32C words): nothing on the wire, a resend of unchanged bytes matches its
 * word and completes, and a caller that writes its next gradient into the buffer while
 * the push is in flight is caught at the resend, as with full words.
 */
static void test_torn_buffer_sampled(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static struct ranks R;
	struct crc_seen c = { .drop_last = 1 };
	struct sim s;

	(void)state;
	cfg.nkeys = 1; /* key 0: 2500 floats, 3 chunks of 4 fragments */
	cfg.sampled_words = true;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = count_crc;
	s.filter_arg = &c;
	/* A lost fragment, an unchanged buffer: the resend matches and the sum is right. */
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	for (int i = 0; i < 100 && s.ncompleted < 1; i++) {
		sim_advance(&s, 5 * MS);
	}
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, 0);
	check_sum(&R, 1, 0, 0);
	assert_true(pbox_node_stats(s.node[0])->retransmits > 0);
	assert_true(c.pushes > 10);
	assert_int_equal(c.flagged, 0);
	/* The caller writes the next gradient while the push is in flight. */
	s.ncompleted = 0;
	c.drop_last = 1;
	start_all(&s, &R, 0, 1, 1);
	sim_pump(&s, 0);
	for (uint32_t i = 0; i < 2500; i++) {
		R.g[0][i] += 0.5f;
	}
	for (int i = 0; i < 100 && s.ncompleted < 1; i++) {
		sim_advance(&s, 5 * MS);
	}
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, -EILSEQ);
	assert_non_null(strstr(R.op[0].errmsg, "buffer changed while its push was in flight"));
	sim_fini(&s);
}

static void test_credit_lanes(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static float g[3][10];
	struct pbox_op op[3];
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	cfg.credits = 2;
	assert_int_equal(sim_init(&s, &cfg), 0);
	for (int i = 0; i < 3; i++) {
		op[i] = (struct pbox_op){
			.kind = PBOX_OP_PUSH, .key = 0, .iter = (uint32_t)i, .src = g[i]
		};
	}
	assert_int_equal(pbox_node_submit(s.node[0], &op[0]), 0);
	assert_int_equal(pbox_node_submit(s.node[0], &op[1]), 0);
	assert_int_equal(pbox_node_submit(s.node[0], &op[2]), -EBUSY);
	assert_non_null(strstr(op[2].errmsg, "2 unacknowledged contribution(s) per chunk"));
	pbox_node_flush(s.node[0]);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(op[0].status, 0);
	assert_int_equal(op[1].status, 0);
	assert_int_equal(pbox_node_submit(s.node[0], &op[2]), 0);
	sim_fini(&s);
}

/* Plain flow: a push completes when sent (before any ACK); the node resends from its own
 * copy, so the caller may reuse the buffer at once. */
static void test_plain_flow(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	struct dropper d = { .left = 1, .type = PBOX_MSG_PUSH, .dir = SIM_TO_APPLIANCE };
	static float g[10], out[10];
	struct pbox_op op = { .kind = PBOX_OP_PUSH, .key = 0, .iter = 0, .src = g };
	struct pbox_op pull = { .kind = PBOX_OP_PULL, .key = 0, .iter = 0, .dst = out };
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	cfg.plain = true;
	cfg.credits = 4;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &d;
	for (int i = 0; i < 10; i++) {
		g[i] = (float)i;
	}
	assert_int_equal(pbox_node_submit(s.node[0], &op), 0);
	assert_int_equal(s.ncompleted, 1); /* complete before anything was delivered */
	memset(g, 0xff, sizeof(g));        /* reused at once */
	sim_pump(&s, 0);
	sim_advance(&s, 10 * MS); /* the dropped push is resent from the copy */
	assert_int_equal(pbox_node_submit(s.node[0], &pull), 0);
	pbox_node_flush(s.node[0]);
	sim_pump(&s, 0);
	assert_int_equal(pull.status, 0);
	for (int i = 0; i < 10; i++) {
		assert_true(out[i] == (float)i);
	}
	sim_fini(&s);
}

/* Plain flow, one credit: two pushes wait behind one whose data never arrives. When that
 * lane fails at its deadline (its op completed long ago, so the node fails as a whole),
 * the waiting pushes fail with the reason: none is reported sent, none is left waiting. */
static void test_plain_waiting_pushes_fail(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	struct dropper all = { .left = 1000000, .type = PBOX_MSG_PUSH, .dir = SIM_TO_APPLIANCE };
	static float g[3][10];
	struct pbox_op op[3];
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	cfg.plain = true;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &all;
	for (int i = 0; i < 3; i++) {
		op[i] = (struct pbox_op){
			.kind = PBOX_OP_PUSH, .key = 0, .iter = (uint32_t)i, .src = g[i]
		};
		assert_int_equal(pbox_node_submit(s.node[0], &op[i]), 0);
	}
	pbox_node_flush(s.node[0]);
	assert_int_equal(s.ncompleted, 1); /* the first, once sent; the others wait */
	assert_int_equal(op[0].status, 0);
	for (int i = 0; i < 200 && s.ncompleted < 3; i++) {
		sim_advance(&s, 20 * MS);
	}
	assert_int_equal(s.ncompleted, 3);
	for (int i = 1; i < 3; i++) {
		assert_int_equal(op[i].status, -ETIMEDOUT);
		assert_non_null(strstr(op[i].errmsg, "push of key 9 (iteration 0) timed out"));
	}
	assert_int_equal(pbox_node_inflight(s.node[0]), 0);
	assert_int_equal(pbox_node_stats(s.node[0])->ops_failed, 2);
	assert_int_equal(pbox_node_submit(s.node[0], &op[0]), -ETIMEDOUT);
	sim_fini(&s);
}

/* A pull's resends count as retransmissions, like a push's. */
static void test_pull_retransmits_counted(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	struct dropper d = { .left = 2, .type = PBOX_MSG_PULL, .dir = SIM_TO_APPLIANCE };
	static float out[10];
	struct pbox_op pull = { .kind = PBOX_OP_PULL, .key = 0, .iter = 0, .dst = out };
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_first;
	s.filter_arg = &d;
	assert_int_equal(pbox_node_submit(s.node[0], &pull), 0);
	pbox_node_flush(s.node[0]);
	sim_pump(&s, 0);
	sim_advance(&s, 10 * MS); /* first resend, dropped */
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 1);
	sim_advance(&s, 20 * MS); /* second resend, delivered */
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 2);
	assert_int_equal(d.dropped, 2);
	sim_fini(&s);
}

/* A result staler than the job's bound is ignored; the operation times out saying so. */
static void test_staleness_bound(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static struct ranks R;
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[1];
	cfg.nkeys = 1;
	cfg.mode = PBOX_MODE_SERVER_OPT;
	cfg.optimizer = "sgd";
	pbox_opt_params_default(&cfg.opt);
	cfg.sync.model = PBOX_SYNC_SSP;
	cfg.sync.staleness = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	/* The appliance misbehaves: it never pauses anyone (PSSP with c = 0) while the worker
	 * expects SSP(1). */
	s.job.sync = pbox_sync_ops(PBOX_SYNC_PSSP);
	s.job.sync_cfg.probability = 0.0;
	{
		static float w0[10];
		struct pbox_op init = { .kind = PBOX_OP_INIT, .key = 0, .src = w0 };

		assert_int_equal(pbox_node_submit(s.node[0], &init), 0);
		pbox_node_flush(s.node[0]);
		sim_pump(&s, 0);
		assert_int_equal(init.status, 0);
	}
	s.ncompleted = 0;
	/* Rank 0 alone runs ahead at version 0: iteration 0 wants version >= 0 (1 - s), which
	 * is fine; iteration 1 wants >= 1, and version 0 is too stale. */
	for (uint32_t t = 0; t < 2; t++) {
		R.op[0] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
					    .key = 0,
					    .iter = t,
					    .src = R.g[0],
					    .dst = R.out[0] };
		assert_int_equal(pbox_node_submit(s.node[0], &R.op[0]), 0);
		pbox_node_flush(s.node[0]);
		sim_pump(&s, 0);
		if (t == 0) {
			assert_int_equal(s.ncompleted, 1);
			assert_int_equal(R.op[0].status, 0);
			assert_int_equal(R.op[0].label, 0);
		}
	}
	assert_int_equal(s.ncompleted, 1);
	assert_true(pbox_node_stats(s.node[0])->stale_results >= 1);
	for (int i = 0; i < 200 && s.ncompleted < 2; i++) {
		sim_advance(&s, 20 * MS);
	}
	assert_int_equal(R.op[0].status, -ETIMEDOUT);
	assert_non_null(strstr(R.op[0].errmsg, "staler than the job's bound of 1"));
	sim_fini(&s);
}

/* Liveness when fast workers run into the window: a straggler, PSSP that never pauses
 * (so pushes beyond the window are refused and resent on the RETRY hint or the timeout),
 * lossy and duplicating links. Every operation of every rank completes. */
static void test_window_liveness(void **state)
{
	struct sim_job_cfg cfg = base_cfg(3);
	static struct ranks R;
	static float w0[2500];
	struct simjob_chaos x = { .x = 99, .one_in = 20 };
	uint32_t next[3] = { 0 }, done_iters[3] = { 0 };
	bool busy[3] = { false };
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[0]; /* 3 chunks */
	cfg.nkeys = 1;
	cfg.mode = PBOX_MODE_SERVER_OPT;
	cfg.optimizer = "sgd";
	pbox_opt_params_default(&cfg.opt);
	cfg.sync.model = PBOX_SYNC_PSSP;
	cfg.sync.staleness = 1;
	cfg.sync.probability = 0.0;
	cfg.timeout_ms = 60000;
	assert_int_equal(sim_init(&s, &cfg), 0);
	{
		struct pbox_op init = { .kind = PBOX_OP_INIT, .key = 0, .src = w0 };

		assert_int_equal(pbox_node_submit(s.node[0], &init), 0);
		pbox_node_flush(s.node[0]);
		sim_pump(&s, 0);
		assert_int_equal(init.status, 0);
	}
	s.filter = simjob_chaos;
	s.filter_arg = &x;
	for (uint32_t tick = 0; tick < 4000 && done_iters[2] < 40; tick++) {
		for (uint32_t r = 0; r < 3; r++) {
			/* rank 2 works at a third of the others' pace */
			if (busy[r] && R.op[r].status != 0) {
				fail_msg("rank %u failed: %s", r, R.op[r].errmsg);
			}
			if (busy[r] || (r == 2 && tick % 3 != 0)) {
				continue;
			}
			R.op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
						    .key = 0,
						    .iter = next[r]++,
						    .src = R.g[r],
						    .dst = R.out[r] };
			assert_int_equal(pbox_node_submit(s.node[r], &R.op[r]), 0);
			pbox_node_flush(s.node[r]);
			busy[r] = true;
		}
		s.ncompleted = 0;
		sim_advance(&s, 2 * MS);
		for (uint32_t r = 0; r < 3; r++) {
			if (busy[r] && pbox_node_inflight(s.node[r]) == 0) {
				assert_int_equal(R.op[r].status, 0);
				busy[r] = false;
				done_iters[r]++;
			}
		}
	}
	assert_int_equal(done_iters[2], 40);
	assert_true(SIM_STAT(&s, drops[PBOX_DROP_FUTURE_ITER]) > 0); /* the window was hit */
	sim_fini(&s);
}

/* The send window counts bytes: with room for one 4 KB chunk, a 3-chunk push sends one
 * chunk at a time, each after the previous one's ACK. */
static void test_window_bytes(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static float g[2500];
	struct pbox_op op = { .kind = PBOX_OP_PUSH, .key = 0, .iter = 0, .src = g };
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[0];
	cfg.nkeys = 1;
	cfg.window_bytes = 4096;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(pbox_node_submit(s.node[0], &op), 0);
	pbox_node_flush(s.node[0]);
	assert_int_equal(s.qtail - s.qhead, 4); /* the 4 fragments of chunk 0 only */
	assert_int_equal(sim_pump(&s, 4), 4);   /* they arrive; the ACK is queued */
	assert_int_equal(sim_pump(&s, 1), 1);   /* the ACK: chunk 1 goes */
	assert_int_equal(s.qtail - s.qhead, 4);
	sim_pump(&s, 0);
	assert_int_equal(op.status, 0);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(SIM_STAT(&s, agg_frags), 10);
	sim_fini(&s);
}

/* Drop the n-th result fragment (DATA) at offset frag_off to rank `rank`. */
struct frag_dropper {
	uint32_t rank;
	uint32_t chunk;
	uint32_t frag_off;
	uint32_t left;
	uint32_t dropped;
};

static enum sim_verdict drop_result_frag(struct sim *s, enum sim_dir dir, uint32_t ep,
					 const struct pbox_msg *m, void *arg)
{
	struct frag_dropper *d = arg;

	(void)s;
	if (d->left > 0 && dir == SIM_TO_WORKER && ep == d->rank && m->type == PBOX_MSG_DATA &&
	    m->chunk == d->chunk && m->frag_off == d->frag_off) {
		d->left--;
		d->dropped++;
		return SIM_DROP;
	}
	return SIM_PASS;
}

/*
 * An in-place push-pull (src == dst, as the DDP hook does) of the last rank to contribute:
 * it gets the result instead of an ACK, and one result fragment is lost. The fragments
 * that did arrive overwrote part of the source. The node must not resend (or re-verify)
 * the overwritten source: it probes for the missing fragment and completes with the exact
 * sum. (Before: the retransmission found the version words changed, -EILSEQ.)
 */
static void test_in_place_lost_result(void **state)
{
	struct sim_job_cfg cfg = base_cfg(2);
	static float buf[2][2500], want[2500];
	struct frag_dropper d = { .rank = 1, .chunk = 0, .frag_off = 1024, .left = 1 };
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	cfg.keys = &g_keys[0]; /* 3 chunks of 4, 4 and 2 fragments */
	cfg.nkeys = 1;
	cfg.verify_crc = true;
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = drop_result_frag;
	s.filter_arg = &d;
	for (uint32_t i = 0; i < 2500; i++) {
		buf[0][i] = (float)i;
		buf[1][i] = (float)(3 * i + 1);
		want[i] = buf[0][i] + buf[1][i];
	}
	/* Rank 0 first: it is acknowledged and waits; rank 1 completes the iteration. */
	for (uint32_t r = 0; r < 2; r++) {
		op[r] = (struct pbox_op){
			.kind = PBOX_OP_PUSH_PULL, .key = 0, .iter = 0, .src = buf[r], .dst = buf[r]
		};
		assert_int_equal(pbox_node_submit(s.node[r], &op[r]), 0);
		pbox_node_flush(s.node[r]);
		sim_pump(&s, 0);
	}
	assert_int_equal(d.dropped, 1);
	assert_int_equal(s.ncompleted, 1); /* rank 0; rank 1 misses one fragment */
	for (int i = 0; i < 100 && s.ncompleted < 2; i++) {
		sim_advance(&s, 10 * MS);
	}
	assert_int_equal(s.ncompleted, 2);
	for (uint32_t r = 0; r < 2; r++) {
		assert_int_equal(op[r].status, 0);
		for (uint32_t i = 0; i < 2500; i++) {
			assert_true(buf[r][i] == want[i]);
		}
	}
	/* Recovered with a probe, not by resending the (overwritten) gradient. */
	assert_int_equal(pbox_node_stats(s.node[1])->retransmits, 0);
	assert_int_equal(pbox_node_stats(s.node[1])->probes, 1);
	assert_int_equal(SIM_STAT(&s, agg_frags), 2 * 10);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_CHECKSUM]), 0);
	sim_fini(&s);
}

/* A key at the MTU-1500 geometry: ~1.4 KB fragments, two 32 KB chunks of 24 fragments
 * (23 full ones and a short one) and a shorter third chunk. */
static const struct pbox_keyspec g_mtu_keys[] = { { 7, 20000 } };

/*
 * In-place push-pulls at the MTU-1500 geometry with drops and duplicates on every link,
 * aggregate and server-optimizer jobs, several iterations: every operation completes with
 * the exact result and no contribution is counted twice or torn.
 */
static void in_place_chaos(enum pbox_job_mode mode, uint64_t seed)
{
	struct sim_job_cfg cfg = base_cfg(3);
	static float buf[3][20000], model[20000], want[20000];
	struct pbox_op op[3];
	struct simjob_chaos x = { .x = seed, .one_in = 20 };
	uint32_t nfrags = 0;
	struct sim s;

	cfg.keys = g_mtu_keys;
	cfg.nkeys = 1;
	cfg.chunk_bytes = 32768;
	cfg.frag_bytes = pbox_frag_bytes_for_mtu(1500, 32768);
	cfg.mode = mode;
	cfg.verify_crc = true;
	cfg.timeout_ms = 60000;
	if (mode == PBOX_MODE_SERVER_OPT) {
		cfg.optimizer = "sgd";
		pbox_opt_params_default(&cfg.opt);
		cfg.opt.lr = 0.5f;
	}
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(s.desc.chunks[0].nfrags, 24);
	for (uint32_t c = 0; c < s.desc.nchunks; c++) {
		nfrags += s.desc.chunks[c].nfrags;
	}
	for (uint32_t i = 0; i < 20000; i++) {
		model[i] = (float)(i % 97);
	}
	if (mode == PBOX_MODE_SERVER_OPT) {
		struct pbox_op init = { .kind = PBOX_OP_INIT, .key = 0, .src = model };

		assert_int_equal(pbox_node_submit(s.node[0], &init), 0);
		pbox_node_flush(s.node[0]);
		sim_pump(&s, 0);
		assert_int_equal(init.status, 0);
	}
	s.filter = simjob_chaos;
	s.filter_arg = &x;
	for (uint32_t t = 0; t < 8; t++) {
		for (uint32_t i = 0; i < 20000; i++) {
			float sum = 0;

			for (uint32_t r = 0; r < 3; r++) {
				buf[r][i] = (float)((r + 1) * (i % 13) + t);
				sum += buf[r][i];
			}
			/* plain SGD with lr 0.5: w - 0.5 * sum (sums of small integers: exact) */
			want[i] = mode == PBOX_MODE_SERVER_OPT ? model[i] - 0.5f * sum : sum;
		}
		s.ncompleted = 0;
		for (uint32_t r = 0; r < 3; r++) {
			op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
						  .key = 0,
						  .iter = t,
						  .src = buf[r],
						  .dst = buf[r] };
			assert_int_equal(pbox_node_submit(s.node[r], &op[r]), 0);
			pbox_node_flush(s.node[r]);
		}
		sim_pump(&s, 0);
		for (int i = 0; i < 2000 && s.ncompleted < 3; i++) {
			sim_advance(&s, 5 * MS);
		}
		assert_int_equal(s.ncompleted, 3);
		for (uint32_t r = 0; r < 3; r++) {
			if (op[r].status != 0) {
				fail_msg("iteration %u rank %u: %s", t, r, op[r].errmsg);
			}
			for (uint32_t i = 0; i < 20000; i++) {
				if (buf[r][i] != want[i]) {
					fail_msg("iteration %u rank %u element %u: %g, want %g", t,
						 r, i, (double)buf[r][i], (double)want[i]);
				}
			}
		}
		memcpy(model, want, sizeof(model));
	}
	/* Each contribution was aggregated exactly once, none of it torn. */
	assert_int_equal(SIM_STAT(&s, agg_frags), 8 * 3 * nfrags);
	assert_int_equal(SIM_STAT(&s, drops[PBOX_DROP_BAD_CHECKSUM]), 0);
	sim_fini(&s);
}

static void test_in_place_chaos_aggregate(void **state)
{
	(void)state;
	in_place_chaos(PBOX_MODE_AGGREGATE, 1234);
}

static void test_in_place_chaos_server_opt(void **state)
{
	(void)state;
	in_place_chaos(PBOX_MODE_SERVER_OPT, 4321);
}

/* Keep (instead of delivering) the first result datagram to rank 0. */
struct capture {
	uint8_t data[PBOX_WIRE_HDR_LEN + 64];
	uint32_t len;
	bool taken;
};

static enum sim_verdict capture_result(struct sim *s, enum sim_dir dir, uint32_t ep,
				       const struct pbox_msg *m, void *arg)
{
	struct capture *cap = arg;
	struct pbox_wire_hdr h;

	(void)s;
	if (cap->taken || dir != SIM_TO_WORKER || ep != 0 || m->type != PBOX_MSG_DATA) {
		return SIM_PASS;
	}
	pbox_wire_encode(m, &h);
	memcpy(cap->data, &h, PBOX_WIRE_HDR_LEN);
	memcpy(cap->data + PBOX_WIRE_HDR_LEN, m->payload, m->frag_len);
	cap->len = PBOX_WIRE_HDR_LEN + m->frag_len;
	cap->taken = true;
	return SIM_DROP;
}

/*
 * A worker reads data-plane replies only from the endpoint of the core that owns the
 * chunk: a valid result (right cookie, right iteration) sent from another address, from
 * another port of the appliance's address, or from another core of the appliance is
 * counted as foreign and dropped; the same datagram from the owning core completes the
 * operation.
 */
static void test_foreign_source(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static struct ranks R;
	struct capture cap = { .taken = false };
	struct sim s;
	uint32_t core;
	struct pbox_peer from;

	(void)state;
	cfg.keys = &g_keys[1]; /* one chunk, one fragment */
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	core = s.desc.chunks[0].core;
	s.filter = capture_result;
	s.filter_arg = &cap;
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	assert_true(cap.taken);
	assert_int_equal(s.ncompleted, 0);
	/* Another host. */
	from = s.core_peer[core];
	from.ip ^= htonl(0x00000100);
	pbox_node_rx(s.node[0], cap.data, cap.len, &from);
	/* The appliance's address, another port. */
	from = s.core_peer[core];
	from.port = htons(ntohs(from.port) + 100);
	pbox_node_rx(s.node[0], cap.data, cap.len, &from);
	/* Another core of the appliance (not the chunk's owner). */
	pbox_node_rx(s.node[0], cap.data, cap.len, &s.core_peer[core ^ 1]);
	/* No source at all. */
	pbox_node_rx(s.node[0], cap.data, cap.len, NULL);
	assert_int_equal(s.ncompleted, 0);
	for (uint32_t i = 0; i < 10; i++) {
		assert_true(R.out[0][i] == 0.0f); /* nothing written */
	}
	assert_int_equal(pbox_node_stats(s.node[0])->foreign, 4);
	/* The owning core. */
	pbox_node_rx(s.node[0], cap.data, cap.len, &s.core_peer[core]);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, 0);
	assert_int_equal(pbox_node_stats(s.node[0])->foreign, 4);
	for (uint32_t i = 0; i < 10; i++) {
		assert_true(R.out[0][i] == R.g[0][i]);
	}
	sim_fini(&s);
}

/*
 * A result whose payload is read in place (pbox_node_rx_split, the shared-memory
 * transport's results' arena): if the buffer's generation word changed while the
 * payload was copied (pboxd rewrote it), the fragment is not taken (torn_frags) and the
 * operation stays open; with the generation unchanged it completes with those bytes.
 */
static void test_split_torn(void **state)
{
	struct sim_job_cfg cfg = base_cfg(1);
	static struct ranks R;
	struct capture cap = { .taken = false };
	struct sim s;
	uint32_t core;
	uint64_t gen = 5;

	(void)state;
	cfg.keys = &g_keys[1]; /* one chunk, one fragment */
	cfg.nkeys = 1;
	assert_int_equal(sim_init(&s, &cfg), 0);
	core = s.desc.chunks[0].core;
	s.filter = capture_result;
	s.filter_arg = &cap;
	start_all(&s, &R, 0, 0, 1);
	sim_pump(&s, 0);
	assert_true(cap.taken);
	/* Rewritten meanwhile: generation 6, the descriptor said 5. */
	gen = 6;
	pbox_node_rx_split(s.node[0], cap.data, cap.data + PBOX_WIRE_HDR_LEN,
			   cap.len - PBOX_WIRE_HDR_LEN, &gen, 5, &s.core_peer[core]);
	assert_int_equal(s.ncompleted, 0);
	assert_int_equal(pbox_node_stats(s.node[0])->torn_frags, 1);
	/* Not a DATA datagram: refused whatever its generation. */
	{
		uint8_t ack[PBOX_WIRE_HDR_LEN];

		memcpy(ack, cap.data, sizeof(ack));
		ack[5] = PBOX_MSG_ACK; /* the type byte */
		pbox_node_rx_split(s.node[0], ack, cap.data + PBOX_WIRE_HDR_LEN,
				   cap.len - PBOX_WIRE_HDR_LEN, &gen, 6, &s.core_peer[core]);
		assert_int_equal(s.ncompleted, 0);
	}
	/* Unchanged: taken. */
	pbox_node_rx_split(s.node[0], cap.data, cap.data + PBOX_WIRE_HDR_LEN,
			   cap.len - PBOX_WIRE_HDR_LEN, &gen, 6, &s.core_peer[core]);
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(R.op[0].status, 0);
	assert_int_equal(pbox_node_stats(s.node[0])->torn_frags, 1);
	for (uint32_t i = 0; i < 10; i++) {
		assert_true(R.out[0][i] == R.g[0][i]);
	}
	sim_fini(&s);
}

/*
 * SSP under loss (staleness 2, a slow rank, drops and duplicates): a push-pull held at
 * the appliance (not ready) can be answered earlier by a probe, once the staleness bound
 * allows; the hold used to stay behind, and its release later sent the rank an unasked
 * result that the rank's next push-pull, still sending, took for its own answer. If one
 * of that push's fragments was lost it was never resent: the iteration, and the job,
 * stalled ("2 of 3 chunks done, 1 unanswered"). Fixed in the engine (answering a want
 * forgets the hold for it). Both with separate and with in-place buffers.
 */
static void ssp_loss(uint64_t seed, bool in_place)
{
	struct sim_job_cfg cfg = base_cfg(3);
	static struct ranks R;
	static float w0[2500];
	struct simjob_chaos x = { .x = seed, .one_in = 20 };
	uint32_t next[3] = { 0 }, done_iters[3] = { 0 };
	bool busy[3] = { false };
	struct sim s;

	cfg.keys = &g_keys[0]; /* 3 chunks of 4, 4 and 2 fragments */
	cfg.nkeys = 1;
	cfg.mode = PBOX_MODE_SERVER_OPT;
	cfg.optimizer = "sgd";
	pbox_opt_params_default(&cfg.opt);
	cfg.sync.model = PBOX_SYNC_SSP;
	cfg.sync.staleness = 2;
	cfg.timeout_ms = 5000;
	assert_int_equal(sim_init(&s, &cfg), 0);
	{
		struct pbox_op init = { .kind = PBOX_OP_INIT, .key = 0, .src = w0 };

		assert_int_equal(pbox_node_submit(s.node[0], &init), 0);
		pbox_node_flush(s.node[0]);
		sim_pump(&s, 0);
		assert_int_equal(init.status, 0);
	}
	s.filter = simjob_chaos;
	s.filter_arg = &x;
	for (uint32_t tick = 0; tick < 20000 && done_iters[2] < 40; tick++) {
		for (uint32_t r = 0; r < 3; r++) {
			/* rank 2 works at a third of the others' pace */
			if (busy[r] || (r == 2 && tick % 3 != 0)) {
				continue;
			}
			R.op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
						    .key = 0,
						    .iter = next[r]++,
						    .src = R.g[r],
						    .dst = in_place ? R.g[r] : R.out[r] };
			assert_int_equal(pbox_node_submit(s.node[r], &R.op[r]), 0);
			pbox_node_flush(s.node[r]);
			busy[r] = true;
		}
		sim_advance(&s, 2 * MS);
		for (uint32_t r = 0; r < 3; r++) {
			if (busy[r] && pbox_node_inflight(s.node[r]) == 0) {
				if (R.op[r].status != 0) {
					fail_msg("seed %llu rank %u: %s", (unsigned long long)seed,
						 r, R.op[r].errmsg);
				}
				busy[r] = false;
				done_iters[r]++;
			}
		}
	}
	assert_int_equal(done_iters[2], 40);
	sim_fini(&s);
}

static void test_ssp_loss_liveness(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= 12; seed++) {
		ssp_loss(seed, false);
		ssp_loss(seed + 1000, true);
	}
}

/* ---- congestion control, pacing and RTO on a simulated path (sim_set_links) ---------- */

#define BIG_ELEMS (1u << 20) /* 4 MiB: 128 chunks of 32 KB, 32 fragments of 1 KB each */
static const struct pbox_keyspec g_big_key[] = { { 7, BIG_ELEMS } };
static float g_big_src[2][BIG_ELEMS], g_big_dst[2][BIG_ELEMS];

static struct sim_job_cfg link_cfg(uint32_t nranks, uint32_t rto_ms)
{
	struct sim_job_cfg c = base_cfg(nranks);

	c.ncores = 1;
	c.keys = g_big_key;
	c.nkeys = 1;
	c.chunk_bytes = 32768;
	c.frag_bytes = 1024;
	c.rto_ms = rto_ms;
	c.timeout_ms = 60000;
	return c;
}

/* One push-pull of the big key by every rank, run on the links to completion; returns
 * the seconds it took and checks the sums. */
static double big_round(struct sim *s, uint32_t nranks, uint32_t iter)
{
	static struct pbox_op op[2];
	uint64_t t0 = s->now_ns;

	for (uint32_t r = 0; r < nranks; r++) {
		for (uint32_t i = 0; i < BIG_ELEMS; i++) {
			g_big_src[r][i] = (float)((i + r + iter) & 1023);
		}
		op[r] = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
					  .key = 0,
					  .iter = iter,
					  .src = g_big_src[r],
					  .dst = g_big_dst[r] };
		assert_int_equal(pbox_node_submit(s->node[r], &op[r]), 0);
		pbox_node_flush(s->node[r]);
	}
	assert_true(sim_run(s, s->now_ns + 60000 * MS));
	for (uint32_t r = 0; r < nranks; r++) {
		assert_int_equal(op[r].status, 0);
		for (uint32_t i = 0; i < BIG_ELEMS; i += 97) {
			float want = 0;

			for (uint32_t q = 0; q < nranks; q++) {
				want += (float)((i + q + iter) & 1023);
			}
			assert_true(g_big_dst[r][i] == want);
		}
	}
	return (double)(s->now_ns - t0) / 1e9;
}

/* Bytes one rank puts on its uplink for one round (headers included). */
static double big_wire_bytes(void)
{
	return (double)BIG_ELEMS * 4 * (1024 + PBOX_WIRE_HDR_LEN) / 1024;
}

/*
 * Two ranks on 100 Mbit/s links (2 ms each way, a drop-tail queue of 10 ms at the rate:
 * netlab's switch port), libpbox's default caps (4 MiB window, 256 chunks). The window must find
 * the path: the exchange runs at >= 90% of the link rate with < 1% of the bytes resent, and the
 * window ends near the path's bandwidth-delay product plus queue, not at the 4 MiB cap.
 * (Before: the fixed 4 MiB window flooded the queue: most of it dropped and resent.)
 */
static void test_cwnd_grows_to_path(void **state)
{
	struct sim_job_cfg cfg = link_cfg(2, 50);
	struct sim_link_cfg l = { .rate_Bps = 12500000, .delay_ns = 2 * MS, .queue_bytes = 125000 };
	struct sim s;
	double bound = big_wire_bytes() / (double)l.rate_Bps;
	uint64_t resent0[2];

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	big_round(&s, 2, 0); /* slow start: overshoots a little */
	for (uint32_t r = 0; r < 2; r++) {
		resent0[r] = pbox_node_stats(s.node[r])->retransmit_bytes;
		assert_true((double)resent0[r] < 0.03 * BIG_ELEMS * 4);
	}
	for (uint32_t t = 1; t < 4; t++) {
		double secs = big_round(&s, 2, t);

		print_message("round %u: %.3f s (bound %.3f s), cwnd %llu, srtt %llu us, drops "
			      "up %llu down %llu, resent %llu B\n",
			      t, secs, bound, (unsigned long long)pbox_node_stats(s.node[0])->cwnd,
			      (unsigned long long)pbox_node_stats(s.node[0])->srtt_us,
			      (unsigned long long)s.link_drops[SIM_TO_APPLIANCE],
			      (unsigned long long)s.link_drops[SIM_TO_WORKER],
			      (unsigned long long)pbox_node_stats(s.node[0])->retransmit_bytes);
		assert_true(secs <= bound / 0.9);
	}
	for (uint32_t r = 0; r < 2; r++) {
		const struct pbox_node_stats *st = pbox_node_stats(s.node[r]);

		/* the steady state: < 1% of the bytes sent again */
		assert_true((double)(st->retransmit_bytes - resent0[r]) < 0.01 * 3 * BIG_ELEMS * 4);
		assert_true(st->cwnd >= 32768 && st->cwnd <= 512 * 1024);
		assert_true(st->srtt_us >= 4000);
	}
	sim_fini(&s);
}

/*
 * A deep drop-tail queue (1 MiB, 80 ms at 100 Mbit/s, like a 1000-packet host queue):
 * slow start ends on the rising RTT, before the queue overflows, and the window holds
 * the link without a loss. (Before: the fixed 4 MiB window overflowed it every round.)
 */
static void test_cwnd_deep_queue(void **state)
{
	struct sim_job_cfg cfg = link_cfg(1, 50);
	struct sim_link_cfg l = { .rate_Bps = 12500000,
				  .delay_ns = 2 * MS,
				  .queue_bytes = 1 << 20 };
	struct sim s;
	double bound = big_wire_bytes() / (double)l.rate_Bps;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	for (uint32_t t = 0; t < 6; t++) {
		double secs = big_round(&s, 1, t);

		if (t > 0) {
			assert_true(secs <= bound / 0.9);
		}
	}
	print_message("deep queue: max %llu B, drops %llu, srtt %llu us\n",
		      (unsigned long long)s.link_max_queue[SIM_TO_APPLIANCE],
		      (unsigned long long)s.link_drops[SIM_TO_APPLIANCE],
		      (unsigned long long)pbox_node_stats(s.node[0])->srtt_us);
	assert_int_equal(s.link_drops[SIM_TO_APPLIANCE], 0);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 0);
	assert_int_equal(pbox_node_stats(s.node[0])->ss_exits, 1);
	sim_fini(&s);
}

/* Drop one push fragment of rank 0 once the window is open: the loss shrinks the window
 * (and counts one loss event), and the round still completes. */
struct nth_dropper {
	uint32_t skip; /* PUSH datagrams of rank 0 to let through first */
	uint32_t dropped;
	uint64_t drop_ns;
};

static enum sim_verdict drop_nth_push(struct sim *s, enum sim_dir dir, uint32_t ep,
				      const struct pbox_msg *m, void *arg)
{
	struct nth_dropper *d = arg;

	(void)ep;
	if (dir != SIM_TO_APPLIANCE || m->type != PBOX_MSG_PUSH || m->sender != 0 ||
	    d->dropped != 0) {
		return SIM_PASS;
	}
	if (d->skip > 0) {
		d->skip--;
		return SIM_PASS;
	}
	d->dropped = 1;
	d->drop_ns = s->now_ns;
	return SIM_DROP;
}

static void test_cwnd_shrinks_on_loss(void **state)
{
	struct sim_job_cfg cfg = link_cfg(1, 50);
	struct sim_link_cfg l = { .rate_Bps = 12500000,
				  .delay_ns = 2 * MS,
				  .queue_bytes = 1 << 20 };
	struct nth_dropper d = { .skip = 1000 };
	struct sim s;
	static struct pbox_op op;
	const struct pbox_node_stats *st;
	uint64_t before, after;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &l, &l), 0);
	st = pbox_node_stats(s.node[0]);
	big_round(&s, 1, 0);
	assert_int_equal(st->loss_events, 0);
	s.filter = drop_nth_push;
	s.filter_arg = &d;
	op = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
			       .key = 0,
			       .iter = 1,
			       .src = g_big_src[0],
			       .dst = g_big_dst[0] };
	assert_int_equal(pbox_node_submit(s.node[0], &op), 0);
	pbox_node_flush(s.node[0]);
	before = st->cwnd;
	while (st->loss_events == 0) {
		before = st->cwnd;
		assert_false(sim_run(&s, s.now_ns + MS));
	}
	after = st->cwnd;
	assert_int_equal(d.dropped, 1);
	assert_int_equal(st->loss_events, 1);
	assert_true(after < before);
	assert_true(after >= before / 2);
	assert_true(sim_run(&s, s.now_ns + 60000 * MS));
	assert_int_equal(op.status, 0);
	sim_fini(&s);
}

/*
 * The RTO follows the measured RTT (RFC 6298), not the configured first timeout: on a
 * 40 ms path with a first RTO of 10 ms... no, of 300 ms, the RTO settles above the RTT (no
 * spurious resend), and on a 2 ms path it falls to the 10 ms floor, so a lost fragment
 * is resent after about 10 ms instead of 300 ms.
 */
static void test_rto_follows_rtt(void **state)
{
	struct sim_job_cfg cfg = link_cfg(1, 300);
	struct sim_link_cfg slow = { .rate_Bps = 125000000,
				     .delay_ns = 20 * MS,
				     .queue_bytes = 1 << 22 };
	struct sim_link_cfg fast = { .rate_Bps = 125000000,
				     .delay_ns = 1 * MS,
				     .queue_bytes = 1 << 22 };
	struct nth_dropper d = { .skip = 100 };
	const struct pbox_node_stats *st;
	static struct pbox_op op;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &slow, &slow), 0);
	st = pbox_node_stats(s.node[0]);
	big_round(&s, 1, 0);
	big_round(&s, 1, 1);
	assert_true(st->srtt_us >= 40000 && st->srtt_us <= 80000);
	assert_true(st->rto_us > st->srtt_us && st->rto_us < 300000);
	assert_int_equal(st->retransmits, 0);
	sim_fini(&s);

	assert_int_equal(sim_init(&s, &cfg), 0);
	assert_int_equal(sim_set_links(&s, &fast, &fast), 0);
	st = pbox_node_stats(s.node[0]);
	big_round(&s, 1, 0);
	assert_true(st->rto_us >= 10000 && st->rto_us < 30000);
	s.filter = drop_nth_push;
	s.filter_arg = &d;
	op = (struct pbox_op){ .kind = PBOX_OP_PUSH_PULL,
			       .key = 0,
			       .iter = 1,
			       .src = g_big_src[0],
			       .dst = g_big_dst[0] };
	assert_int_equal(pbox_node_submit(s.node[0], &op), 0);
	pbox_node_flush(s.node[0]);
	while (st->retransmits == 0) {
		assert_false(sim_run(&s, s.now_ns + MS));
	}
	assert_int_equal(d.dropped, 1);
	assert_true(s.now_ns - d.drop_ns <= 30 * MS);
	assert_true(sim_run(&s, s.now_ns + 60000 * MS));
	assert_int_equal(op.status, 0);
	sim_fini(&s);
}

/* ---- selective repeat ----------------------------------------------------------------- */

static const struct pbox_keyspec g_one_chunk[] = { { 3, 8192 } }; /* 32 fragments of 1 KB */

/* Counts datagrams by type and direction, and drops chosen fragments once each. */
struct sr_filter {
	uint32_t push_sent, data_to0, nacks_to0;
	uint64_t drop_push; /* bitmap of PUSH fragments of rank 0 to drop once */
	uint64_t drop_data; /* bitmap of result fragments to rank 0 to drop once */
	uint64_t resent;    /* bitmap of PUSH fragments of rank 0 seen flagged RETRANSMIT */
};

static enum sim_verdict sr_count(struct sim *s, enum sim_dir dir, uint32_t ep,
				 const struct pbox_msg *m, void *arg)
{
	struct sr_filter *f = arg;
	uint32_t frag = m->frag_off / 1024;

	(void)s;
	if (dir == SIM_TO_APPLIANCE && m->type == PBOX_MSG_PUSH && m->sender == 0) {
		f->push_sent++;
		if (m->flags & PBOX_F_RETRANSMIT) {
			f->resent |= 1ull << frag;
		}
		if (f->drop_push & (1ull << frag)) {
			f->drop_push &= ~(1ull << frag);
			return SIM_DROP;
		}
	}
	if (dir == SIM_TO_WORKER && ep == 0 && m->type == PBOX_MSG_DATA) {
		f->data_to0++;
		if (f->drop_data & (1ull << frag)) {
			f->drop_data &= ~(1ull << frag);
			return SIM_DROP;
		}
	}
	if (dir == SIM_TO_WORKER && ep == 0 && m->type == PBOX_MSG_ACK &&
	    (m->flags & PBOX_F_SACK)) {
		f->nacks_to0++;
	}
	return SIM_PASS;
}

static struct sim_job_cfg sr_cfg(uint32_t nranks)
{
	struct sim_job_cfg c = base_cfg(nranks);

	c.ncores = 1;
	c.keys = g_one_chunk;
	c.nkeys = 1;
	c.chunk_bytes = 32768;
	c.frag_bytes = 1024;
	return c;
}

static void sr_submit(struct sim *s, uint32_t r, struct pbox_op *op, const float *src, float *dst)
{
	*op = (struct pbox_op){
		.kind = PBOX_OP_PUSH_PULL, .key = 0, .iter = 0, .src = src, .dst = dst
	};
	assert_int_equal(pbox_node_submit(s->node[r], op), 0);
	pbox_node_flush(s->node[r]);
}

/*
 * Fragments 5 and 9 of a 32-fragment push are lost. The round's last fragment (flagged
 * LAST) makes the appliance answer with a NACK holding its bitmap, and the worker re-sends
 * exactly fragments 5 and 9, at once, without waiting for a timeout: 32 + 2 datagrams.
 * (Before: after the timeout, all 32 fragments again.)
 */
static void test_selective_repeat_push(void **state)
{
	struct sim_job_cfg cfg = sr_cfg(1);
	struct sr_filter f = { .drop_push = (1ull << 5) | (1ull << 9) };
	static float src[8192], dst[8192];
	struct pbox_op op;
	struct sim s;

	(void)state;
	for (uint32_t i = 0; i < 8192; i++) {
		src[i] = (float)i;
	}
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = sr_count;
	s.filter_arg = &f;
	sr_submit(&s, 0, &op, src, dst);
	sim_pump(&s, 0); /* no clock advance: the NACK, not a timer, drives the resend */
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(op.status, 0);
	assert_int_equal(f.push_sent, 34);
	assert_int_equal(f.resent, (1ull << 5) | (1ull << 9));
	assert_int_equal(f.nacks_to0, 1);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 2);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmit_bytes, 2048);
	assert_int_equal(pbox_node_stats(s.node[0])->nacks, 1);
	assert_memory_equal(dst, src, sizeof(src));
	assert_int_equal(SIM_STAT(&s, agg_frags), 32);
	sim_fini(&s);
}

/*
 * The tail is lost (fragments 29..31, the last one carries LAST): no NACK comes. On the
 * timeout the worker sends one probe, the last missing fragment; the appliance's NACK
 * then names 29 and 30, which are re-sent: 32 + 1 + 2 datagrams, not 32 + 32.
 */
static void test_selective_repeat_tail(void **state)
{
	struct sim_job_cfg cfg = sr_cfg(1);
	struct sr_filter f = { .drop_push = 7ull << 29 };
	static float src[8192], dst[8192];
	struct pbox_op op;
	struct sim s;

	(void)state;
	for (uint32_t i = 0; i < 8192; i++) {
		src[i] = (float)(i * 3);
	}
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = sr_count;
	s.filter_arg = &f;
	sr_submit(&s, 0, &op, src, dst);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 0);
	assert_int_equal(f.push_sent, 32);
	sim_advance(&s, 10 * MS); /* the first RTO */
	assert_int_equal(s.ncompleted, 1);
	assert_int_equal(op.status, 0);
	assert_int_equal(f.push_sent, 35);
	assert_int_equal(f.resent, 7ull << 29);
	assert_int_equal(pbox_node_stats(s.node[0])->retransmits, 3);
	assert_memory_equal(dst, src, sizeof(src));
	sim_fini(&s);
}

/*
 * Results: rank 0 contributed first (ACK), rank 1 last; fragments 3 and 17 of rank 0's
 * result are lost. Rank 0's probe says which fragments it holds (PULL with a bitmap) and
 * the appliance sends only 3 and 17 again: 32 + 2 result datagrams to rank 0. The probe
 * goes one RTO after the result began to arrive.
 */
static void test_selective_repeat_result(void **state)
{
	struct sim_job_cfg cfg = sr_cfg(2);
	struct sr_filter f = { .drop_data = (1ull << 3) | (1ull << 17) };
	static float src[2][8192], dst[2][8192];
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	for (uint32_t i = 0; i < 8192; i++) {
		src[0][i] = (float)i;
		src[1][i] = (float)(2 * i);
	}
	assert_int_equal(sim_init(&s, &cfg), 0);
	s.filter = sr_count;
	s.filter_arg = &f;
	sr_submit(&s, 0, &op[0], src[0], dst[0]);
	sim_pump(&s, 0);
	sr_submit(&s, 1, &op[1], src[1], dst[1]);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 1); /* rank 1; rank 0 misses two fragments */
	assert_int_equal(f.data_to0, 32);
	/* One RTO (10 ms) after the result began to arrive, not the probe pace (40 ms) of a
	 * result that waits for peers. */
	sim_advance(&s, 10 * MS);
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(op[0].status, 0);
	assert_int_equal(f.data_to0, 34);
	for (uint32_t i = 0; i < 8192; i++) {
		assert_true(dst[0][i] == (float)(3 * i));
	}
	sim_fini(&s);
}

/*
 * The ACK is folded into the result when the result follows at once: the last contributor
 * of a push-pull gets its 32 result fragments and no ACK; only a contributor whose result
 * must wait for a peer is acknowledged on its own (NOTIFY-ACK frees its buffer and window
 * then). Appliance datagrams for one 2-rank exchange: 1 ACK + 2 x 32 DATA.
 */
static void test_ack_folded_into_result(void **state)
{
	struct sim_job_cfg cfg = sr_cfg(2);
	static float src[2][8192], dst[2][8192];
	struct pbox_op op[2];
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &cfg), 0);
	sr_submit(&s, 0, &op[0], src[0], dst[0]);
	sim_pump(&s, 0);
	assert_int_equal(SIM_STAT(&s, acks), 1);
	sr_submit(&s, 1, &op[1], src[1], dst[1]);
	sim_pump(&s, 0);
	assert_int_equal(s.ncompleted, 2);
	assert_int_equal(SIM_STAT(&s, acks), 1);
	assert_int_equal(SIM_STAT(&s, nacks), 0);
	assert_int_equal(SIM_STAT(&s, tx_pkts), 1 + 2 * 32);
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_retransmit_backoff),
		cmocka_unit_test(test_lost_result_probe),
		cmocka_unit_test(test_probe_after_ack),
		cmocka_unit_test(test_deadline_messages),
		cmocka_unit_test(test_appliance_error),
		cmocka_unit_test(test_nonfinite_message),
		cmocka_unit_test(test_chaos),
		cmocka_unit_test(test_torn_buffer),
		cmocka_unit_test(test_torn_buffer_sampled),
		cmocka_unit_test(test_credit_lanes),
		cmocka_unit_test(test_plain_flow),
		cmocka_unit_test(test_plain_waiting_pushes_fail),
		cmocka_unit_test(test_pull_retransmits_counted),
		cmocka_unit_test(test_staleness_bound),
		cmocka_unit_test(test_window_liveness),
		cmocka_unit_test(test_window_bytes),
		cmocka_unit_test(test_in_place_lost_result),
		cmocka_unit_test(test_in_place_chaos_aggregate),
		cmocka_unit_test(test_in_place_chaos_server_opt),
		cmocka_unit_test(test_foreign_source),
		cmocka_unit_test(test_split_torn),
		cmocka_unit_test(test_ssp_loss_liveness),
		cmocka_unit_test(test_cwnd_grows_to_path),
		cmocka_unit_test(test_cwnd_deep_queue),
		cmocka_unit_test(test_cwnd_shrinks_on_loss),
		cmocka_unit_test(test_rto_follows_rtt),
		cmocka_unit_test(test_selective_repeat_push),
		cmocka_unit_test(test_selective_repeat_tail),
		cmocka_unit_test(test_selective_repeat_result),
		cmocka_unit_test(test_ack_folded_into_result),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
