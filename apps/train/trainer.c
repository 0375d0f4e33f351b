/* SPDX-License-Identifier: BSD-3-Clause */
/* Distributed rank and single-process reference of the Fashion-MNIST MLP (see trainer.h). */
#include "trainer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/compiler.h"
#include "common/crc.h"
#include "common/log.h"
#include "fmnist.h"
#include "schedule.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	      "model files are written in host order, which must be little-endian");

static const unsigned g_dims[] = { 784, 256, 128, 10 };

/* Progress events at most this often, so a fast run does not flood its reader. */
#define STEP_EVENT_INTERVAL_S 0.1

/* Everything one training process holds. */
struct trainer {
	const struct pbox_train_cfg *cfg;
	pbox_train_event_fn cb;
	void *cb_arg;
	char *err;
	size_t errlen;

	struct pbox_fmnist_set train, test;
	struct pbox_mlp *mlp;
	const struct pbox_mlp_layout *lay;
	struct pbox_sched sched;
	uint32_t workers;
	uint32_t max_shard; /* largest slice of a batch */
	float *w;           /* the model */
	float **g;          /* gradient of each rank this process computes */
	uint32_t ngrad;
	bool g0_pbox; /* g[0] is pbox_mem_alloc's (freed by pbox_close, not free()) */
	float *x;     /* one shard's inputs */
	uint8_t *y;
	float *tx; /* this process's slice of the test set */
	uint8_t *ty;
	uint32_t test_n;
	struct pbox_train_event ev;
	double last_step_ev;
};

static int fail(struct trainer *t, int rc, const char *fmt, ...) PBOX_PRINTF(3, 4);
static int fail(struct trainer *t, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(t->err, t->errlen, fmt, ap);
	va_end(ap);
	return rc;
}

unsigned pbox_train_dims(const unsigned **dims)
{
	*dims = g_dims;
	return PBOX_ARRAY_SIZE(g_dims) - 1;
}

void pbox_train_opt_params(double lr, double momentum, double wd, uint32_t batch,
			   struct pbox_opt_params *p)
{
	pbox_opt_params_default(p);
	/* pboxd reads its configuration as double and rounds once to float; do the same so
	 * that a value given as text means the same float on both sides. */
	p->lr = (float)lr;
	p->momentum = (float)momentum;
	p->wd = (float)wd;
	p->rescale = (float)(1.0 / (double)batch);
}

static void emit(struct trainer *t, enum pbox_train_event_kind kind)
{
	t->ev.kind = kind;
	if (kind == PBOX_TRAIN_EV_DONE) {
		/* Lets a caller compare the ranks' models without shipping them. */
		t->ev.model_crc = pbox_crc32c(t->w, t->lay->nparams * sizeof(float), PBOX_CRC_INIT);
	}
	if (t->cb != NULL) {
		t->cb(&t->ev, t->cb_arg);
	}
}

/*
 * Load the data, build the network and the schedule. test_rank / test_ranks select the
 * slice of the test set this process evaluates; ngrad gradient buffers are allocated.
 */
static int setup(struct trainer *t, uint32_t workers, uint32_t test_rank, uint32_t test_ranks,
		 uint32_t ngrad)
{
	const struct pbox_train_cfg *c = t->cfg;
	const char *dir = c->data_dir ? c->data_dir : PBOX_FMNIST_DEFAULT_DIR;
	uint32_t test_start;
	int rc;

	pbox_mlp_blas_single_thread();
	rc = pbox_fmnist_load(dir, true, &t->train, t->err, t->errlen);
	if (rc < 0) {
		return rc;
	}
	rc = pbox_fmnist_load(dir, false, &t->test, t->err, t->errlen);
	if (rc < 0) {
		return rc;
	}
	if (t->train.rows * t->train.cols != g_dims[0] ||
	    t->test.rows * t->test.cols != g_dims[0]) {
		return fail(t, -EINVAL,
			    "%s: images of %ux%u (training) and %ux%u (test) pixels; the network "
			    "takes %u",
			    dir, t->train.rows, t->train.cols, t->test.rows, t->test.cols,
			    g_dims[0]);
	}
	if (c->epochs == 0) {
		return fail(t, -EINVAL, "epochs: must be at least 1");
	}
	if (workers == 0 || c->batch < workers || c->batch > t->train.n) {
		return fail(t, -EINVAL,
			    "batch %u: must be between the number of workers (%u) and the training "
			    "set size (%u)",
			    c->batch, workers, t->train.n);
	}
	rc = pbox_sched_init(&t->sched, t->train.n, c->batch, workers, c->seed);
	if (rc < 0) {
		return fail(t, rc, "no memory for the shuffle of %u samples", t->train.n);
	}
	t->workers = workers;
	t->max_shard = (c->batch + workers - 1) / workers;
	t->mlp = pbox_mlp_create(g_dims, PBOX_ARRAY_SIZE(g_dims) - 1, PBOX_MAX(t->max_shard, 500u));
	if (t->mlp == NULL) {
		return fail(t, -ENOMEM, "cannot build the network (see the log above)");
	}
	t->lay = pbox_mlp_layout(t->mlp);
	t->w = pbox_mlp_alloc_params(t->mlp);
	t->g = calloc(ngrad, sizeof(*t->g));
	t->x = aligned_alloc(64,
			     PBOX_ALIGN_UP((size_t)t->max_shard * g_dims[0] * sizeof(float), 64));
	t->y = malloc(t->max_shard);
	pbox_sched_split(t->test.n, test_ranks, test_rank, &test_start, &t->test_n);
	t->tx = aligned_alloc(
		64, PBOX_ALIGN_UP(((size_t)t->test_n + 1) * g_dims[0] * sizeof(float), 64));
	t->ty = malloc((size_t)t->test_n + 1);
	if (t->w == NULL || t->g == NULL || t->x == NULL || t->y == NULL || t->tx == NULL ||
	    t->ty == NULL) {
		return fail(t, -ENOMEM, "no memory for the model and the batch buffers");
	}
	t->ngrad = ngrad;
	for (uint32_t i = 0; i < ngrad; i++) {
		t->g[i] = pbox_mlp_alloc_params(t->mlp);
		if (t->g[i] == NULL) {
			return fail(t, -ENOMEM, "no memory for gradient buffers");
		}
	}
	pbox_fmnist_gather(&t->test, NULL, test_start, t->test_n, t->tx, t->ty);

	memset(&t->ev, 0, sizeof(t->ev));
	t->ev.workers = workers;
	t->ev.epochs = c->epochs;
	t->ev.steps = t->sched.steps;
	t->ev.batch = c->batch;
	for (unsigned k = 0; k < t->lay->ntensors; k++) {
		t->ev.nparams += t->lay->nelem[k];
	}
	t->ev.nkeys = t->lay->ntensors;
	return 0;
}

static void teardown(struct trainer *t)
{
	for (uint32_t i = 0; t->g != NULL && i < t->ngrad; i++) {
		free(t->g[i]);
	}
	free(t->g);
	free(t->w);
	free(t->x);
	free(t->y);
	free(t->tx);
	free(t->ty);
	pbox_mlp_destroy(t->mlp);
	pbox_sched_free(&t->sched);
	pbox_fmnist_free(&t->train);
	pbox_fmnist_free(&t->test);
}

/* Gradient of rank r's shard of step into g; the batch totals are added to acc. */
static int shard_grad(struct trainer *t, uint32_t step, uint32_t rank, float *g,
		      struct pbox_mlp_stats *acc)
{
	struct pbox_mlp_stats st;
	const uint32_t *idx;
	uint32_t n;
	int rc;

	pbox_sched_shard(&t->sched, step, rank, &idx, &n);
	pbox_fmnist_gather(&t->train, idx, 0, n, t->x, t->y);
	rc = pbox_mlp_grad(t->mlp, t->w, t->x, t->y, n, g, &st);
	if (rc < 0) {
		return fail(t, rc, "gradient of step %u rank %u: invalid batch", step, rank);
	}
	acc->loss += st.loss;
	acc->correct += st.correct;
	acc->samples += st.samples;
	return 0;
}

/* c: the rank's client (NULL in the local reference), for its counters. */
static void step_event(struct trainer *t, uint32_t step, struct pbox_client *c)
{
	double now = pbox_mono_s();

	t->ev.step = step + 1;
	t->ev.total_steps++;
	if (now - t->last_step_ev >= STEP_EVENT_INTERVAL_S || step + 1 == t->sched.steps) {
		t->last_step_ev = now;
		if (c != NULL) {
			pbox_client_stats(c, &t->ev.net);
		}
		emit(t, PBOX_TRAIN_EV_STEP);
	}
}

static int epoch_end(struct trainer *t, double t0, double t1)
{
	int rc;

	memset(&t->ev.test, 0, sizeof(t->ev.test));
	rc = pbox_mlp_eval(t->mlp, t->w, t->tx, t->ty, t->test_n, &t->ev.test);
	if (rc < 0) {
		return fail(t, rc, "test set: a label is out of range");
	}
	t->ev.train_s = t1 - t0;
	t->ev.eval_s = pbox_mono_s() - t1;
	return 0;
}

static bool out_of_steps(const struct trainer *t)
{
	return t->cfg->max_steps != 0 && t->ev.total_steps >= t->cfg->max_steps;
}

int pbox_train_save_model(const char *path, const struct pbox_mlp_layout *lay, const float *w,
			  char *err, size_t errlen)
{
	char tmp[4096];
	FILE *f;
	uint32_t u;
	bool ok = true;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "wb");
	if (f == NULL) {
		int e = errno;

		snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(e));
		return -e;
	}
	ok &= fwrite("PBOXMLP1", 8, 1, f) == 1;
	u = lay->nlayers;
	ok &= fwrite(&u, 4, 1, f) == 1;
	for (unsigned l = 0; l <= lay->nlayers; l++) {
		u = lay->dims[l];
		ok &= fwrite(&u, 4, 1, f) == 1;
	}
	u = lay->ntensors;
	ok &= fwrite(&u, 4, 1, f) == 1;
	for (unsigned k = 0; k < lay->ntensors; k++) {
		uint64_t n = lay->nelem[k];

		u = k;
		ok &= fwrite(&u, 4, 1, f) == 1;
		ok &= fwrite(&n, 8, 1, f) == 1;
	}
	for (unsigned k = 0; k < lay->ntensors; k++) {
		ok &= fwrite(w + lay->off[k], sizeof(float), lay->nelem[k], f) == lay->nelem[k];
	}
	ok &= fflush(f) == 0;
	if (fclose(f) != 0 || !ok) {
		int e = errno ? errno : EIO;

		snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
		unlink(tmp);
		return -e;
	}
	if (rename(tmp, path) != 0) {
		int e = errno;

		snprintf(err, errlen, "%s: cannot rename to %s: %s", tmp, path, strerror(e));
		unlink(tmp);
		return -e;
	}
	return 0;
}

/* ---- the distributed rank ---------------------------------------------------------- */

static int pbox_fail(struct trainer *t, int rc, const char *what)
{
	return fail(t, rc, "rank %u: %s: %s", t->cfg->client.rank, what, pbox_last_error());
}

/* Rank 0 publishes the seeded initial model; every rank then pulls version 0. Resuming
 * (from > 0: the appliance restored that version from a checkpoint), every rank pulls it
 * instead and nothing is published. */
static int initial_model(struct trainer *t, struct pbox_client *c, uint32_t from)
{
	const struct pbox_mlp_layout *L = t->lay;
	int rc;

	if (t->cfg->client.rank == 0 && from == 0) {
		pbox_mlp_init_params(t->mlp, t->w, t->cfg->seed);
		for (unsigned k = 0; k < L->ntensors; k++) {
			rc = pbox_init(c, k, t->w + L->off[k]);
			if (rc < 0) {
				return pbox_fail(t, rc, "publishing the initial model");
			}
		}
	}
	for (unsigned k = 0; k < L->ntensors; k++) {
		rc = pbox_pull_async(c, k, from, t->w + L->off[k], NULL, NULL);
		if (rc < 0) {
			return pbox_fail(t, rc, "pulling the initial model");
		}
	}
	rc = pbox_wait_all(c, -1);
	if (rc < 0) {
		return pbox_fail(t, rc, "pulling the initial model");
	}
	return 0;
}

/* Whether step s of epoch e, not yet counted, ends the run (the last of the last epoch,
 * or max_steps). */
static bool last_step(const struct trainer *t, uint32_t e, uint32_t s)
{
	return (t->cfg->max_steps != 0 && t->ev.total_steps + 1 >= t->cfg->max_steps) ||
	       (e + 1 == t->cfg->epochs && s + 1 == t->sched.steps);
}

/* Broadcast jobs: push the step's gradient of every key and apply the aggregates the
 * sync rule needs (pbox_update_step); after the run's last step, every one left, so the
 * final model (tested, saved) is W^steps on every rank. */
static int update_step(struct trainer *t, struct pbox_update *u, uint32_t e, uint32_t s)
{
	const struct pbox_mlp_layout *L = t->lay;
	const float *g[2 * PBOX_MLP_MAX_LAYERS];
	int rc;

	for (unsigned k = 0; k < L->ntensors; k++) {
		g[k] = t->g[0] + L->off[k];
	}
	rc = pbox_update_step(u, g);
	if (rc < 0) {
		return pbox_fail(t, rc, "update step");
	}
	if (last_step(t, e, s) && (rc = pbox_update_sync(u)) < 0) {
		return pbox_fail(t, rc, "applying the last aggregates");
	}
	return 0;
}

/*
 * After pbox_register: the pushed gradient g[0] moves to pbox_mem_alloc's memory, which
 * pboxd shares over the shm transport (pushes from it are read in place, not copied into
 * the ring); over UDP it is plain memory, as before. Failing that, g[0] stays as it was.
 * The bytes pushed are the same either way, so is the model.
 */
static void grad_memory(struct trainer *t, struct pbox_client *c)
{
	size_t bytes = t->lay->nparams * sizeof(float);
	void *p;

	if (pbox_mem_alloc(c, bytes, &p) != 0) {
		PBOX_LOG_WARN(MAIN, "rank %u: gradients stay in plain memory: %s",
			      t->cfg->client.rank, pbox_last_error());
		return;
	}
	free(t->g[0]);
	t->g[0] = p;
	t->g0_pbox = true;
	t->ev.grad_registered = pbox_mem_registered(c, p);
}

/* from: the first iteration (a resumed run: the restored version; the step count under
 * BSP, where iterations and steps are the same). u: broadcast jobs' replica (else NULL). */
static int rank_loop(struct trainer *t, struct pbox_client *c, uint32_t from, struct pbox_update *u)
{
	const struct pbox_mlp_layout *L = t->lay;
	uint32_t rank = t->cfg->client.rank;
	double all_train = 0;
	int rc;

	uint32_t iter = from;

	t->ev.total_steps = from;
	for (uint32_t e = from / t->sched.steps; e < t->cfg->epochs && !out_of_steps(t); e++) {
		double t0 = pbox_mono_s(), t1;

		pbox_sched_epoch(&t->sched, e);
		t->ev.epoch = e + 1;
		t->ev.step = 0;
		memset(&t->ev.train, 0, sizeof(t->ev.train));
		for (uint32_t s = e == from / t->sched.steps ? from % t->sched.steps : 0;
		     s < t->sched.steps && !out_of_steps(t); s++) {
			double c0 = pbox_mono_s();
			uint32_t newest = UINT32_MAX;

			rc = shard_grad(t, s, rank, t->g[0], &t->ev.train);
			if (rc < 0) {
				return rc;
			}
			if (t->cfg->slow_factor > 1.0) {
				/* A deliberate straggler: its compute takes slow_factor times as
				 * long. */
				double extra = (pbox_mono_s() - c0) * (t->cfg->slow_factor - 1.0);
				struct timespec ts = {
					(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)
				};

				nanosleep(&ts, NULL);
			}
			if (u != NULL) {
				rc = update_step(t, u, e, s);
				if (rc < 0) {
					return rc;
				}
				step_event(t, s, c);
				continue;
			}
			for (unsigned k = 0; k < L->ntensors; k++) {
				rc = pbox_push_pull_async(c, k, iter, t->g[0] + L->off[k],
							  t->w + L->off[k], NULL, NULL);
				if (rc < 0) {
					return pbox_fail(t, rc, "push-pull");
				}
			}
			rc = pbox_wait_all(c, -1);
			if (rc < 0) {
				return pbox_fail(t, rc, "push-pull");
			}
			/* Next iteration: one more, or the oldest version returned if newer
			 * (BSP: always iter + 1). */
			for (unsigned k = 0; k < L->ntensors; k++) {
				int64_t v = pbox_result_version(c, k);

				if (v >= 0 && (uint32_t)v < newest) {
					newest = (uint32_t)v;
				}
			}
			iter = newest != UINT32_MAX && newest > iter + 1 ? newest : iter + 1;
			step_event(t, s, c);
		}
		t1 = pbox_mono_s();
		all_train += t1 - t0;
		rc = epoch_end(t, t0, t1);
		if (rc < 0) {
			return rc;
		}
		pbox_client_stats(c, &t->ev.net);
		emit(t, PBOX_TRAIN_EV_EPOCH);
	}
	t->ev.train_s = all_train;
	return 0;
}

int pbox_train_rank(const struct pbox_train_cfg *cfg, pbox_train_event_fn cb, void *arg, char *err,
		    size_t errlen)
{
	struct trainer t = { .cfg = cfg, .cb = cb, .cb_arg = arg, .err = err, .errlen = errlen };
	struct pbox_key_info keys[2 * PBOX_MLP_MAX_LAYERS];
	float *models[2 * PBOX_MLP_MAX_LAYERS];
	struct pbox_update *u = NULL;
	struct pbox_client *c = NULL;
	struct pbox_job_info info;
	double t0 = pbox_mono_s();
	uint32_t shard_start;
	int rc;

	rc = pbox_connect(&cfg->client, &c);
	if (rc < 0) {
		fail(&t, rc, "rank %u: connecting to %s: %s", cfg->client.rank,
		     cfg->client.server ? cfg->client.server : "127.0.0.1:7000", pbox_last_error());
		return rc;
	}
	pbox_job_info(c, &info);
	if (info.mode == PBOX_JOB_AGGREGATE) {
		rc = fail(&t, -EINVAL,
			  "job %u is an aggregate job; the trainer needs a server-optimizer job "
			  "(the appliance runs the optimizer) or a broadcast job (every rank "
			  "does)",
			  info.job);
		goto out;
	}
	if (cfg->workers != 0 && cfg->workers != info.workers) {
		rc = fail(&t, -EINVAL, "--workers %u, but job %u has %u workers", cfg->workers,
			  info.job, info.workers);
		goto out;
	}
	rc = setup(&t, info.workers, cfg->client.rank, info.workers, 1);
	if (rc < 0) {
		goto out;
	}
	for (unsigned k = 0; k < t.lay->ntensors; k++) {
		keys[k].id = k;
		keys[k].nelem = t.lay->nelem[k];
	}
	rc = pbox_register(c, keys, t.lay->ntensors);
	if (rc < 0) {
		rc = pbox_fail(&t, rc, "registering the model's keys");
		goto out;
	}
	if (info.mode == PBOX_JOB_BROADCAST) {
		/* Every rank starts from the same seeded model and keeps its own copy. */
		pbox_mlp_init_params(t.mlp, t.w, cfg->seed);
		for (unsigned k = 0; k < t.lay->ntensors; k++) {
			models[k] = t.w + t.lay->off[k];
		}
		rc = pbox_update_open(c, keys, t.lay->ntensors, models,
				      cfg->exact_lag ? PBOX_UPDATE_EXACT_LAG : 0, &u);
		if (rc < 0) {
			rc = pbox_fail(&t, rc, "opening the model replica");
			goto out;
		}
	} else {
		rc = initial_model(&t, c, pbox_resume_version(c));
		if (rc < 0) {
			goto out;
		}
	}
	grad_memory(&t, c);
	t.ev.rank = cfg->client.rank;
	snprintf(t.ev.transport, sizeof(t.ev.transport), "%s", pbox_transport(c));
	pbox_sched_split(cfg->batch, info.workers, cfg->client.rank, &shard_start, &t.ev.shard);
	t.ev.setup_s = pbox_mono_s() - t0;
	t.ev.total_steps = pbox_resume_version(c); /* where this rank starts */
	emit(&t, PBOX_TRAIN_EV_READY);
	rc = rank_loop(&t, c, pbox_resume_version(c), u);
	if (rc < 0) {
		goto out;
	}
	if (cfg->save_model != NULL) {
		rc = pbox_train_save_model(cfg->save_model, t.lay, t.w, err, errlen);
		if (rc < 0) {
			goto out;
		}
	}
	pbox_client_stats(c, &t.ev.net);
	emit(&t, PBOX_TRAIN_EV_DONE);
out:
	pbox_close(c); /* first: cancels a pull still held by the appliance after an error */
	if (t.g0_pbox) {
		t.g[0] = NULL; /* pbox_close freed it */
	}
	pbox_update_close(u);
	teardown(&t);
	return rc;
}

/* ---- the single-process reference -------------------------------------------------- */

int pbox_train_local(const struct pbox_train_cfg *cfg, pbox_train_event_fn cb, void *arg, char *err,
		     size_t errlen)
{
	struct trainer t = { .cfg = cfg, .cb = cb, .cb_arg = arg, .err = err, .errlen = errlen };
	const struct pbox_kernels *kern = pbox_kernels_get();
	float *m = NULL, *v = NULL;
	double t_start = pbox_mono_s(), all_train = 0;
	int rc;

	if (cfg->opt == NULL) {
		return fail(&t, -EINVAL, "no optimizer given");
	}
	if (cfg->workers == 0 || cfg->workers > 1024) {
		return fail(&t, -EINVAL, "workers %u: must be between 1 and 1024", cfg->workers);
	}
	rc = setup(&t, cfg->workers, 0, 1, cfg->workers);
	if (rc < 0) {
		goto out;
	}
	/* The appliance's optimizer state starts at zero, as here. */
	m = pbox_mlp_alloc_params(t.mlp);
	v = pbox_mlp_alloc_params(t.mlp);
	if (m == NULL || v == NULL) {
		rc = fail(&t, -ENOMEM, "no memory for the optimizer state");
		goto out;
	}
	pbox_mlp_init_params(t.mlp, t.w, cfg->seed);
	t.ev.shard = cfg->batch;
	t.ev.setup_s = pbox_mono_s() - t_start;
	emit(&t, PBOX_TRAIN_EV_READY);
	for (uint32_t e = 0; e < cfg->epochs && !out_of_steps(&t); e++) {
		double t0 = pbox_mono_s(), t1;

		pbox_sched_epoch(&t.sched, e);
		t.ev.epoch = e + 1;
		t.ev.step = 0;
		memset(&t.ev.train, 0, sizeof(t.ev.train));
		for (uint32_t s = 0; s < t.sched.steps && !out_of_steps(&t); s++) {
			for (uint32_t r = 0; r < cfg->workers; r++) {
				rc = shard_grad(&t, s, r, t.g[r], &t.ev.train);
				if (rc < 0) {
					goto out;
				}
			}
			/* Exactly the appliance's deterministic step: sources in rank order,
			 * t counting from 1. Elements between tensors are zero and stay so. */
			pbox_optimizer_step(cfg->opt, kern, t.w, m, v, (const float *const *)t.g,
					    cfg->workers, t.lay->nparams, &cfg->opt_params,
					    t.ev.total_steps + 1);
			step_event(&t, s, NULL);
		}
		t1 = pbox_mono_s();
		all_train += t1 - t0;
		rc = epoch_end(&t, t0, t1);
		if (rc < 0) {
			goto out;
		}
		emit(&t, PBOX_TRAIN_EV_EPOCH);
	}
	if (cfg->save_model != NULL) {
		rc = pbox_train_save_model(cfg->save_model, t.lay, t.w, err, errlen);
		if (rc < 0) {
			goto out;
		}
	}
	t.ev.train_s = all_train;
	emit(&t, PBOX_TRAIN_EV_DONE);
out:
	free(m);
	free(v);
	teardown(&t);
	return rc;
}
