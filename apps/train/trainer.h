/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Fashion-MNIST trainer: a 784-256-128-10 MLP trained by synchronous data-parallel
 * SGD-family optimizers, either
 *
 *   - as one rank of a pbox "server-optimizer" job (pbox_train_rank): one key per
 *     parameter tensor; rank 0 initialises the model from the seed, every rank pulls
 *     version 0, then each step computes the gradient SUM over its shard of the global
 *     batch (schedule.h), push-pulls every key asynchronously, waits for all, and continues
 *     with the model version the appliance returns. The iteration a push is tagged with
 *     is the rank's progress: one more than the last, or the version it was given if that
 *     is newer (a straggler under drop-stragglers catches up); under BSP this is the step
 *     count. Under SSP/ASP the returned model may be older than the step count; or
 *   - as the single-process reference (pbox_train_local): the same seed, schedule and
 *     gradient code for each of the N shards, then pbox_optimizer_step() over the N
 *     gradients in rank order with t = step number (from 1), which is what pboxd does in
 *     deterministic mode; the final model is therefore bit-identical to a distributed run
 *     with deterministic = true (and with rescale = 1 / global batch, see
 *     pbox_train_opt_params()).
 *
 * Progress is reported through a callback (struct pbox_train_event) so that the command
 * line can print it for people or as JSON lines for `pbox demo`.
 *
 * Threading: the functions run on the calling thread (libpbox adds its progress thread)
 * and call the callback on it. They force OpenBLAS to one thread.
 */
#ifndef PBOX_TRAIN_TRAINER_H
#define PBOX_TRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include <pbox/pbox.h>

#include "kernels/kernels.h"
#include "mlp.h"

#define PBOX_TRAIN_DEFAULT_EPOCHS 3
#define PBOX_TRAIN_DEFAULT_BATCH  240
#define PBOX_TRAIN_DEFAULT_SEED   42
#define PBOX_TRAIN_DEFAULT_OPT    "nag"
#define PBOX_TRAIN_DEFAULT_LR     0.05
#define PBOX_TRAIN_DEFAULT_MOM    0.9

struct pbox_train_cfg {
	const char *data_dir;   /* NULL: PBOX_FMNIST_DEFAULT_DIR */
	uint32_t epochs;        /* >= 1 */
	uint32_t batch;         /* global batch B, workers <= B <= training samples */
	uint32_t workers;       /* local: N simulated ranks; rank: 0 or the job's worker count */
	uint64_t max_steps;     /* stop after this many steps in all (0: run every epoch) */
	uint64_t seed;          /* weights and shuffles */
	const char *save_model; /* write the final model here (NULL: do not) */

	/* pbox_train_rank only */
	struct pbox_client_opts client; /* server, job, token, rank, timeout, ... */
	double slow_factor;             /* >= 1: stretch each step's compute (a straggler) */
	bool exact_lag;                 /* broadcast jobs: PBOX_UPDATE_EXACT_LAG */

	/* pbox_train_local only: what the appliance job would be configured with */
	const struct pbox_optimizer_ops *opt;
	struct pbox_opt_params opt_params;
};

enum pbox_train_event_kind {
	PBOX_TRAIN_EV_READY, /* data loaded, model at version 0 */
	PBOX_TRAIN_EV_STEP,  /* a step finished (throttled to a few per second) */
	PBOX_TRAIN_EV_EPOCH, /* an epoch (or the run, at max_steps) finished and was tested */
	PBOX_TRAIN_EV_DONE,  /* training finished; model saved if asked */
};

struct pbox_train_event {
	enum pbox_train_event_kind kind;
	uint32_t rank;    /* the rank (local: 0) */
	uint32_t workers; /* N */
	uint32_t epoch;   /* 1-based; 0 in READY */
	uint32_t epochs;
	uint32_t step;        /* steps done in this epoch */
	uint32_t steps;       /* steps per epoch */
	uint64_t total_steps; /* steps done in all */
	uint32_t batch;
	uint32_t shard; /* samples per step this process trains (local: the batch) */
	size_t nparams; /* trained floats (the sum of the keys' sizes) */
	uint32_t nkeys;
	/* EPOCH: totals of this process's samples this epoch (train: as trained, before each
	 * step's update; test: its slice of the test set, with the epoch's final model). */
	struct pbox_mlp_stats train;
	struct pbox_mlp_stats test;
	double setup_s;               /* READY: seconds to load data and get the initial model */
	double train_s;               /* EPOCH: seconds in steps; DONE: in all epochs */
	double eval_s;                /* EPOCH: seconds testing */
	struct pbox_client_stats net; /* rank: the client's counters so far (local: zero);
					 in every event but READY */
	char transport[8];    /* READY of a rank: its data path ("udp" or "shm"); local: "" */
	bool grad_registered; /* READY of a rank: its gradients are pushed from memory pboxd
				 shares (pbox_mem_alloc, transport shm): not copied */
	uint32_t model_crc;   /* DONE: CRC32C of the final model's bytes */
};

typedef void (*pbox_train_event_fn)(const struct pbox_train_event *ev, void *arg);

/*
 * Run one rank of a server-optimizer job (cfg->client names the appliance and the rank),
 * or of a broadcast job: then every rank starts from the seeded model, keeps its own
 * copy and applies the job's optimizer to the aggregates (pbox_update_*, pbox.h); under
 * BSP the steps are those of a server-optimizer job, bit for bit, and after the last one
 * every rank holds the same model (under SSP(s) each step's gradient is taken on the
 * model s aggregates behind, and the run ends by applying the rest).
 * Returns 0, or a negative errno with a message in err naming what failed: the data
 * (see pbox_fmnist_load), the configuration (-EINVAL: batch out of range, worker count
 * differs from the job's, the job is an aggregate job) or a pbox operation (its error,
 * with pbox_last_error()'s text).
 */
int pbox_train_rank(const struct pbox_train_cfg *cfg, pbox_train_event_fn cb, void *arg, char *err,
		    size_t errlen);

/* The single-process reference of cfg->workers ranks. Errors as pbox_train_rank. */
int pbox_train_local(const struct pbox_train_cfg *cfg, pbox_train_event_fn cb, void *arg, char *err,
		     size_t errlen);

/*
 * Optimizer parameters of the trainer's jobs: defaults of pbox_opt_params_default() with
 * lr, momentum and wd rounded to float as pboxd rounds its configuration values, and
 * rescale = 1 / batch (the appliance sums the ranks' gradient sums). Both the appliance
 * configuration written by `pbox demo` and the local reference take them from here.
 */
void pbox_train_opt_params(double lr, double momentum, double wd, uint32_t batch,
			   struct pbox_opt_params *p);

/* The network's layer sizes (784, 256, 128, 10) and their count. */
unsigned pbox_train_dims(const unsigned **dims);

/*
 * Write a model file: magic "PBOXMLP1", then little-endian u32 layer count, the layer
 * sizes, u32 tensor count and per tensor (u32 key, u64 elements), then every tensor's
 * float32 values. Written to path.tmp and renamed, so a reader never sees half a file.
 * Returns 0 or a negative errno with err naming the file and the cause.
 */
int pbox_train_save_model(const char *path, const struct pbox_mlp_layout *lay, const float *w,
			  char *err, size_t errlen);

#endif /* PBOX_TRAIN_TRAINER_H */
