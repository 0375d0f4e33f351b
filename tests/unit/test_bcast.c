/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Broadcast-update jobs (Parameter Flow's UCC) on the simulated appliance: worker nodes
 * push updates, the engine aggregates and answers with the aggregates, and every worker's
 * replica (libpbox/replica.h) applies them with the appliance's optimizer kernels.
 *
 *  - BSP, deterministic: after every iteration every replica is bit-identical to every
 *    other and to the single-process reference (pbox_optimizer_step over the ranks'
 *    gradients in rank order, the trainer's pbox_train_local), under datagram loss;
 *  - SSP(s) with ranks of different speeds: a worker computing iteration t holds exactly
 *    W^(t - s) (clock - version never exceeds s, PF's blocking rule), the fastest is never
 *    more than s + 1 pushes ahead of the slowest, and after the final catch-up every
 *    replica equals the reference of delayed SGD, W^(t+1) = F(W^t, sum_r g_r(W^(t-s))):
 *    the same stream of aggregates in the same order on every worker;
 *  - the window broadcast jobs need (pbox_job_min_window) and the node's refusal of a
 *    push-pull that would ask for an aggregate before U^0.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/compiler.h"
#include "engine/sync.h"
#include "libpbox/replica.h"
#include "sim.h"

#define NR    3
#define NKEYS 2
#define T     12

/* Two keys that do not fill their last chunk or fragment; chunks on both cores. */
static const struct pbox_keyspec g_keys[NKEYS] = { { 7, 1000 }, { 9, 333 } };

static size_t total_elems(void)
{
	return g_keys[0].nelem + g_keys[1].nelem;
}

/* The update rank r computes at iteration t from model w (the whole model, keys
 * concatenated): depends on the model, so any difference in the views would grow. */
static void grad(const float *w, uint32_t r, uint32_t t, float *g)
{
	for (size_t i = 0; i < total_elems(); i++) {
		g[i] = 0.5f * w[i] - 0.01f * (float)((i * 7 + r * 13 + t * 3) % 17) +
		       0.001f * (float)r;
	}
}

static struct sim_job_cfg job(uint32_t staleness, const char *opt)
{
	struct sim_job_cfg c = {
		.nranks = NR,
		.ncores = 2,
		.keys = g_keys,
		.nkeys = NKEYS,
		.chunk_bytes = 2048,
		.frag_bytes = 512,
		.mode = PBOX_MODE_BROADCAST,
		.reduce = PBOX_REDUCE_SUM,
		.deterministic = true,
		.optimizer = opt,
		.timeout_ms = 60000,
	};

	pbox_opt_params_default(&c.opt);
	c.opt.lr = 0.05f;
	c.opt.wd = 1e-4f;
	c.opt.rescale = 1.0f / NR;
	c.sync.model = staleness == 0 ? PBOX_SYNC_BSP : PBOX_SYNC_SSP;
	c.sync.staleness = staleness;
	return c;
}

/* One worker: its model (keys concatenated), replica, update and operations. */
struct worker {
	float *w;
	float *g;
	struct pbox_replica rep;
	struct pbox_op op[NKEYS];
	uint32_t want;    /* aggregate the ops in flight ask for (UINT32_MAX: none) */
	uint32_t pending; /* ops in flight */
	bool pulling;     /* the final catch-up */
};

static void worker_init(struct worker *wk, const struct sim_job_cfg *c, uint32_t lag)
{
	float *models[NKEYS];
	uint64_t nelem[NKEYS];
	char err[128];

	memset(wk, 0, sizeof(*wk));
	wk->w = calloc(total_elems(), sizeof(float));
	wk->g = calloc(total_elems(), sizeof(float));
	assert_non_null(wk->w);
	assert_non_null(wk->g);
	for (size_t i = 0; i < total_elems(); i++) {
		wk->w[i] = 0.02f * (float)((i * 31) % 23) - 0.2f; /* W^0, common */
	}
	models[0] = wk->w;
	models[1] = wk->w + g_keys[0].nelem;
	nelem[0] = g_keys[0].nelem;
	nelem[1] = g_keys[1].nelem;
	assert_int_equal(pbox_replica_init(&wk->rep, pbox_optimizer_find(c->optimizer), &c->opt,
					   NULL, lag, NKEYS, models, nelem, err, sizeof(err)),
			 0);
}

static void worker_fini(struct worker *wk)
{
	pbox_replica_fini(&wk->rep);
	free(wk->w);
	free(wk->g);
}

/* Push the worker's update of its clock (with the pull of the aggregate the blocking rule
 * needs), as pbox_update_step does. */
static void worker_push(struct sim *s, uint32_t r, struct worker *wk)
{
	wk->want = pbox_replica_push_wants(&wk->rep);
	grad(wk->w, r, wk->rep.clock, wk->g);
	for (uint32_t k = 0; k < NKEYS; k++) {
		wk->op[k] = (struct pbox_op){
			.kind = wk->want == UINT32_MAX ? PBOX_OP_PUSH : PBOX_OP_PUSH_PULL,
			.key = k,
			.iter = wk->rep.clock,
			.src = wk->g + (k ? g_keys[0].nelem : 0),
			.dst = wk->rep.keys[k].agg,
		};
		assert_int_equal(pbox_node_submit(s->node[r], &wk->op[k]), 0);
	}
	pbox_node_flush(s->node[r]);
	wk->pending = NKEYS;
	wk->rep.clock++;
}

/* Pull aggregate v (the catch-up at the end, as pbox_update_sync does). */
static void worker_pull(struct sim *s, uint32_t r, struct worker *wk)
{
	wk->want = wk->rep.version;
	for (uint32_t k = 0; k < NKEYS; k++) {
		wk->op[k] = (struct pbox_op){
			.kind = PBOX_OP_PULL,
			.key = k,
			.iter = wk->want,
			.dst = wk->rep.keys[k].agg,
		};
		assert_int_equal(pbox_node_submit(s->node[r], &wk->op[k]), 0);
	}
	pbox_node_flush(s->node[r]);
	wk->pending = NKEYS;
}

/* Account the completions the nodes reported; a worker whose ops are all done applies
 * the aggregate they brought. */
static void collect(struct sim *s, struct worker *wk)
{
	for (uint32_t i = 0; i < s->ncompleted; i++) {
		struct pbox_op *op = s->completed[i];

		for (uint32_t r = 0; r < NR; r++) {
			if (op >= wk[r].op && op < wk[r].op + NKEYS) {
				if (op->status != 0) {
					print_message("rank %u: %s\n", r, op->errmsg);
				}
				assert_int_equal(op->status, 0);
				if (wk[r].want != UINT32_MAX) {
					assert_int_equal(op->label, wk[r].want);
				}
				if (--wk[r].pending == 0 && wk[r].want != UINT32_MAX) {
					assert_int_equal(pbox_replica_apply(&wk[r].rep, wk[r].want),
							 0);
				}
			}
		}
	}
	s->ncompleted = 0;
}

/* Reference: W^(t+1) = F(W^t, sum over ranks in rank order of g_r(W^(t - lag))), or of
 * g_r(W^used[r * T + t]) when used is given (the versions the ranks computed on).
 * Returns W^steps in w (W^0 on entry). */
static void reference(const struct sim_job_cfg *c, const uint32_t *used, uint32_t lag,
		      uint32_t steps, float *w)
{
	const struct pbox_optimizer_ops *opt = pbox_optimizer_find(c->optimizer);
	size_t n = total_elems();
	float *hist = calloc((size_t)(steps + 1) * n, sizeof(float));
	float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
	float *g[NR];

	assert_non_null(hist);
	for (uint32_t r = 0; r < NR; r++) {
		g[r] = calloc(n, sizeof(float));
	}
	memcpy(hist, w, n * sizeof(float));
	for (uint32_t t = 0; t < steps; t++) {
		for (uint32_t r = 0; r < NR; r++) {
			uint32_t seen = used != NULL ? used[r * T + t] : t >= lag ? t - lag : 0;

			assert_true(seen <= t);
			grad(hist + (size_t)seen * n, r, t, g[r]);
		}
		/* The two keys are stepped separately, as the workers do (the kernels are
		 * elementwise; t counts from 1). */
		memcpy(w, hist + (size_t)t * n, n * sizeof(float));
		for (uint32_t k = 0; k < NKEYS; k++) {
			size_t off = k ? g_keys[0].nelem : 0;
			const float *src[NR];

			for (uint32_t r = 0; r < NR; r++) {
				src[r] = g[r] + off;
			}
			pbox_optimizer_step(opt, pbox_kernels_get(), w + off, m + off, v + off, src,
					    NR, g_keys[k].nelem, &c->opt, (uint64_t)t + 1);
		}
		memcpy(hist + (size_t)(t + 1) * n, w, n * sizeof(float));
	}
	for (uint32_t r = 0; r < NR; r++) {
		free(g[r]);
	}
	free(hist);
	free(m);
	free(v);
}

static enum sim_verdict lossy(struct sim *s, enum sim_dir dir, uint32_t ep,
			      const struct pbox_msg *m, void *arg)
{
	uint32_t *count = arg;

	(void)s;
	(void)dir;
	(void)ep;
	(void)m;
	return ++*count % 29 == 0 ? SIM_DROP : SIM_PASS;
}

/* BSP: lock-step; every replica equals the reference after every iteration. */
static void run_bsp(const char *optname)
{
	struct sim_job_cfg c = job(0, optname);
	struct worker wk[NR];
	float *ref = calloc(total_elems(), sizeof(float));
	uint32_t drops = 0;
	struct sim s;

	assert_int_equal(sim_init(&s, &c), 0);
	s.filter = lossy;
	s.filter_arg = &drops;
	for (uint32_t r = 0; r < NR; r++) {
		worker_init(&wk[r], &c, 0);
	}
	for (uint32_t t = 0; t < T; t++) {
		for (uint32_t r = 0; r < NR; r++) {
			assert_int_equal(pbox_replica_push_wants(&wk[r].rep), t);
			worker_push(&s, r, &wk[r]);
		}
		for (int i = 0; i < 100000 && (wk[0].pending || wk[1].pending || wk[2].pending);
		     i++) {
			sim_advance(&s, 1000000);
			collect(&s, wk);
		}
		for (uint32_t r = 0; r < NR; r++) {
			assert_int_equal(wk[r].pending, 0);
			assert_int_equal(wk[r].rep.version, t + 1);
		}
		for (size_t i = 0; i < total_elems(); i++) {
			ref[i] = 0.02f * (float)((i * 31) % 23) - 0.2f;
		}
		reference(&c, NULL, 0, t + 1, ref);
		for (uint32_t r = 0; r < NR; r++) {
			assert_memory_equal(wk[r].w, ref, total_elems() * sizeof(float));
		}
	}
	assert_true(drops >= 29); /* losses happened and were repaired */
	for (uint32_t r = 0; r < NR; r++) {
		worker_fini(&wk[r]);
	}
	free(ref);
	sim_fini(&s);
}

static void test_bsp_nag_identical(void **state)
{
	(void)state;
	run_bsp("nag");
}

static void test_bsp_adam_identical(void **state)
{
	(void)state;
	run_bsp("adam");
}

/* SSP(s): rank 0 starts a step whenever it may, rank 1 every other round, rank 2 every
 * fifth; every completion is checked against the blocking rule, the end against the
 * reference of delayed SGD. */
static void run_ssp(uint32_t lag, bool loss)
{
	static const uint32_t pace[NR] = { 1, 2, 5 };
	struct sim_job_cfg c = job(lag, "momentum");
	struct worker wk[NR];
	float *ref = calloc(total_elems(), sizeof(float));
	uint32_t drops = 0, max_gap = 0, round = 0;
	bool busy = true;
	struct sim s;

	assert_int_equal(sim_init(&s, &c), 0);
	assert_int_equal(s.job.window, 2 * lag + 2);
	if (loss) {
		s.filter = lossy;
		s.filter_arg = &drops;
	}
	for (uint32_t r = 0; r < NR; r++) {
		worker_init(&wk[r], &c, lag);
	}
	while (busy && round < 200000) {
		uint32_t lo = UINT32_MAX, hi = 0;

		busy = false;
		for (uint32_t r = 0; r < NR; r++) {
			struct worker *w = &wk[r];

			if (w->pending == 0 && w->rep.clock < T && round % pace[r] == 0) {
				/* Blocking rule: computing iteration clock needs
				 * clock - version <= s, and the lagged pulls keep exactly that. */
				assert_true(w->rep.clock - w->rep.version <= lag);
				assert_int_equal(w->rep.version,
						 w->rep.clock >= lag ? w->rep.clock - lag : 0);
				worker_push(&s, r, w);
			} else if (w->pending == 0 && w->rep.clock == T && w->rep.version < T) {
				w->pulling = true;
				worker_pull(&s, r, w);
			}
			busy |= w->pending != 0 || w->rep.version < T;
			lo = PBOX_MIN(lo, w->rep.clock);
			hi = PBOX_MAX(hi, w->rep.clock);
		}
		max_gap = PBOX_MAX(max_gap, hi - lo);
		sim_advance(&s, 1000000);
		collect(&s, wk);
		round++;
	}
	assert_false(busy);
	assert_true(max_gap <= lag + 1);
	if (lag > 0) {
		assert_true(max_gap >= 1); /* the fast rank did run ahead */
	}
	for (size_t i = 0; i < total_elems(); i++) {
		ref[i] = 0.02f * (float)((i * 31) % 23) - 0.2f;
	}
	reference(&c, NULL, lag, T, ref);
	for (uint32_t r = 0; r < NR; r++) {
		assert_int_equal(wk[r].rep.version, T);
		assert_memory_equal(wk[r].w, ref, total_elems() * sizeof(float));
	}
	for (uint32_t k = 0; k < s.ncores; k++) {
		assert_int_equal(s.stats[k].drops[PBOX_DROP_STALE_ITER], 0);
	}
	print_message("ssp s=%u: fastest ahead by up to %u pushes, %u datagrams dropped\n", lag,
		      max_gap, drops);
	for (uint32_t r = 0; r < NR; r++) {
		worker_fini(&wk[r]);
	}
	free(ref);
	sim_fini(&s);
}

static void test_ssp_same_view(void **state)
{
	(void)state;
	run_ssp(1, false);
	run_ssp(3, false);
}

static void test_ssp_same_view_lossy(void **state)
{
	(void)state;
	run_ssp(2, true);
}

/*
 * SSP as libpbox runs it by default (pbox_update_step): plain pushes in one lane of each
 * key, a chain of PULLs of U^version in the other (held by the engine until complete),
 * every aggregate applied as soon as all keys have it, a push only while clock - version
 * <= s. Ranks of different speeds, 3 % loss. Every replica ends equal to the reference
 * replayed with the versions each rank really computed on, so all applied the same
 * stream in the same order; the versions used were fresher than the bound allows.
 */
static void test_ssp_chained_pulls(void **state)
{
	static const uint32_t pace[NR] = { 1, 3, 2 };
	const uint32_t lag = 2;
	struct sim_job_cfg c = job(lag, "nag");
	struct worker wk[NR];
	struct pbox_op pull[NR][NKEYS];
	uint32_t pulls_out[NR] = { 0 }, used[NR * T], drops = 0, fresher = 0;
	float *ref = calloc(total_elems(), sizeof(float));
	struct sim s;

	(void)state;
	c.credits = 2;
	assert_int_equal(sim_init(&s, &c), 0);
	assert_int_equal(s.job.window, 2 * lag + 1 + 2);
	s.filter = lossy;
	s.filter_arg = &drops;
	for (uint32_t r = 0; r < NR; r++) {
		worker_init(&wk[r], &c, lag);
	}
	for (uint32_t round = 0; round < 200000; round++) {
		bool busy = false;

		for (uint32_t r = 0; r < NR; r++) {
			struct worker *w = &wk[r];

			if (w->pending == 0 && w->rep.clock < T && round % pace[r] == 0 &&
			    w->rep.clock - w->rep.version <= lag) {
				used[r * T + w->rep.clock] = w->rep.version;
				fresher += w->rep.clock - w->rep.version < lag;
				grad(w->w, r, w->rep.clock, w->g);
				for (uint32_t k = 0; k < NKEYS; k++) {
					w->op[k] = (struct pbox_op){
						.kind = PBOX_OP_PUSH,
						.key = k,
						.iter = w->rep.clock,
						.src = w->g + (k ? g_keys[0].nelem : 0),
					};
					assert_int_equal(pbox_node_submit(s.node[r], &w->op[k]), 0);
				}
				w->pending = NKEYS;
				w->want = UINT32_MAX;
				w->rep.clock++;
			}
			if (pulls_out[r] == 0 && w->rep.version < w->rep.clock) {
				for (uint32_t k = 0; k < NKEYS; k++) {
					pull[r][k] = (struct pbox_op){
						.kind = PBOX_OP_PULL,
						.key = k,
						.iter = w->rep.version,
						.dst = w->rep.keys[k].agg,
					};
					assert_int_equal(pbox_node_submit(s.node[r], &pull[r][k]),
							 0);
				}
				pulls_out[r] = NKEYS;
			}
			pbox_node_flush(s.node[r]);
			busy |= w->rep.clock < T || w->rep.version < T;
		}
		if (!busy) {
			break;
		}
		sim_advance(&s, 1000000);
		for (uint32_t i = 0; i < s.ncompleted; i++) {
			struct pbox_op *op = s.completed[i];

			assert_int_equal(op->status, 0);
			for (uint32_t r = 0; r < NR; r++) {
				if (op >= wk[r].op && op < wk[r].op + NKEYS) {
					wk[r].pending--;
				} else if (op >= pull[r] && op < pull[r] + NKEYS) {
					assert_int_equal(op->label, wk[r].rep.version);
					if (--pulls_out[r] == 0) {
						assert_int_equal(
							pbox_replica_apply(&wk[r].rep,
									   wk[r].rep.version),
							0);
					}
				}
			}
		}
		s.ncompleted = 0;
	}
	for (size_t i = 0; i < total_elems(); i++) {
		ref[i] = 0.02f * (float)((i * 31) % 23) - 0.2f;
	}
	reference(&c, used, 0, T, ref);
	for (uint32_t r = 0; r < NR; r++) {
		assert_int_equal(wk[r].rep.version, T);
		assert_memory_equal(wk[r].w, ref, total_elems() * sizeof(float));
	}
	print_message("chained pulls: %u of %u steps on a model fresher than the bound, %u "
		      "datagrams dropped\n",
		      fresher, NR * T, drops);
	assert_true(fresher > 0);
	for (uint32_t r = 0; r < NR; r++) {
		worker_fini(&wk[r]);
	}
	free(ref);
	sim_fini(&s);
}

/* A replica that caught up ahead of its lag (a catch-up pull mid-run) pushes without
 * asking for what it already has. */
static void test_replica_wants(void **state)
{
	struct sim_job_cfg c = job(2, "sgd");
	struct worker wk;

	(void)state;
	worker_init(&wk, &c, 2);
	assert_int_equal(pbox_replica_push_wants(&wk.rep), UINT32_MAX); /* clock 0 < s */
	wk.rep.clock = 2;
	assert_int_equal(pbox_replica_push_wants(&wk.rep), 0);
	wk.rep.clock = 4;
	wk.rep.version = 3;
	assert_int_equal(pbox_replica_push_wants(&wk.rep), UINT32_MAX);
	wk.rep.version = 2;
	assert_int_equal(pbox_replica_push_wants(&wk.rep), 2);
	assert_int_equal(pbox_replica_apply(&wk.rep, 5), -EINVAL); /* out of order */
	assert_int_equal(wk.rep.version, 2);
	worker_fini(&wk);
}

/* The engine, spoken to directly (broadcast, SSP(2), 2 ranks, one fragment): a push-pull
 * of t < s is only acknowledged; one of t >= s is answered with the aggregate of t - s
 * once that iteration is complete, and that aggregate is the sum of iteration t - s. */
static void test_engine_lagged_answers(void **state)
{
	static const struct pbox_keyspec key[] = { { 1, 16 } };
	struct sim_job_cfg c = job(2, "sgd");
	float g[16], out[16];
	struct sim s;

	(void)state;
	c.nranks = 2;
	c.ncores = 1;
	c.keys = key;
	c.nkeys = 1;
	c.no_nodes = true;
	assert_int_equal(sim_init(&s, &c), 0);
	for (uint32_t t = 0; t < 4; t++) {
		for (uint32_t r = 0; r < 2; r++) {
			struct pbox_msg m = { .type = PBOX_MSG_PUSH,
					      .flags = PBOX_F_WANT_REPLY,
					      .iter = t,
					      .frag_len = sizeof(g) },
					reply;
			bool data = false, ack = false;

			for (uint32_t i = 0; i < 16; i++) {
				g[i] = (float)(1 + r * 10 + t * 100 + i);
			}
			sim_send_msg(&s, r, &m, g);
			while (sim_take_reply(&s, r, &reply, (uint8_t *)out)) {
				assert_int_not_equal(reply.type, PBOX_MSG_ERROR);
				if (reply.type == PBOX_MSG_DATA) {
					uint32_t u = t - 2;

					assert_true(t >= 2);
					assert_int_equal(reply.iter, u);
					for (uint32_t i = 0; i < 16; i++) {
						assert_true(out[i] ==
							    (float)(2 + 10 + 200 * u + 2 * i));
					}
					data = true;
				}
				ack |= reply.type == PBOX_MSG_ACK;
			}
			/* Both ranks pushed every iteration before t: U^(t-2) is complete
			 * whenever t >= 2, so the answer comes at once. */
			if (t < 2) {
				assert_false(data);
				assert_true(ack);
			} else {
				assert_true(data);
			}
		}
	}
	sim_fini(&s);
}

static void test_windows_and_refusals(void **state)
{
	const struct pbox_sync_ops *ssp = pbox_sync_ops(PBOX_SYNC_SSP);
	const struct pbox_sync_ops *bsp = pbox_sync_ops(PBOX_SYNC_BSP);
	struct pbox_sync_cfg sc = { .model = PBOX_SYNC_SSP, .staleness = 3 };
	struct sim_job_cfg c = job(2, "sgd");
	float g[1333], out[1333];
	struct pbox_op op = {
		.kind = PBOX_OP_PUSH_PULL, .key = 0, .iter = 1, .src = g, .dst = out
	};
	struct sim s;

	(void)state;
	assert_int_equal(pbox_job_min_window(PBOX_MODE_BROADCAST, ssp, &sc, 1), 8);
	assert_int_equal(pbox_job_min_window(PBOX_MODE_BROADCAST, ssp, &sc, 2), 9);
	assert_int_equal(pbox_job_min_window(PBOX_MODE_BROADCAST, bsp, &sc, 1), 2);
	assert_int_equal(pbox_job_min_window(PBOX_MODE_SERVER_OPT, ssp, &sc, 1),
			 ssp->min_window(&sc));
	assert_int_equal(sim_init(&s, &c), 0);
	/* Under SSP(2) a push-pull of iteration 1 would ask for U^-1. */
	assert_int_equal(pbox_node_submit(s.node[0], &op), -EINVAL);
	assert_non_null(strstr(op.errmsg, "t - 2"));
	sim_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bsp_nag_identical),
		cmocka_unit_test(test_bsp_adam_identical),
		cmocka_unit_test(test_ssp_same_view),
		cmocka_unit_test(test_ssp_same_view_lossy),
		cmocka_unit_test(test_ssp_chained_pulls),
		cmocka_unit_test(test_replica_wants),
		cmocka_unit_test(test_engine_lagged_answers),
		cmocka_unit_test(test_windows_and_refusals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
