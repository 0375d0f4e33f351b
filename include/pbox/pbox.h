/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox: the worker side of pbox.
 *
 * A training process connects to a PBox appliance (pboxd) as one rank of a job, registers
 * the job's keys (named float32 arrays: layers, buckets, ...), then exchanges them every
 * iteration:
 *
 *   struct pbox_client *c;
 *   struct pbox_client_opts o = { .server = "10.0.0.1:7000", .job = 1, .token = "s3cret",
 *                                 .rank = r };
 *   if (pbox_connect(&o, &c) < 0) die(pbox_last_error());
 *   if (pbox_register(c, keys, nkeys) < 0) die(pbox_last_error());
 *   if (r == 0) pbox_init(c, key, w0);               // server-optimizer jobs only
 *   pbox_pull(c, key, 0, w);                          // initial model
 *   for (t = 0; ...; t++) {
 *           compute(w, g);
 *           pbox_push_pull(c, key, t, g, w);           // gradient in, new model out
 *   }
 *   pbox_close(c);
 *
 * Job modes (set on the appliance): "server-optimizer" keeps the model on the appliance
 * and answers a push-pull of iteration t with model version t + 1; "aggregate" answers a
 * push-pull of iteration t with the sum (or mean) of all ranks' iteration-t gradients, and
 * the worker runs its own optimizer; "broadcast" (Parameter Flow's update-centric
 * communication) answers it with the aggregate every rank applies to its own copy of the
 * model with the job's optimizer (pbox_update_*, below).
 *
 * Synchronisation (set on the appliance per job): BSP by default; SSP, ASP, probabilistic
 * SSP and drop-stragglers let a push-pull return before every rank has contributed, with
 * a model at most `staleness` iterations old (pbox_job_info). The library checks that
 * bound on every result and blocks (then times out, with a message) rather than accept a
 * staler one. NOTIFY-ACK flow control: a job allows `credits` unacknowledged
 * contributions per chunk, i.e. that many operations per key in flight.
 *
 * Errors: every function returning int returns 0 or a negative errno, and then
 * pbox_last_error() (per thread) holds a message a person can act on, e.g.
 * "job 1: wrong token for rank 2" (-EACCES) or "push-pull of key 3 (iteration 17) timed
 * out after 30.0 s: ... a peer is slow, stopped or gone" (-ETIMEDOUT). Every wait is
 * bounded: by its timeout argument, and by the operation deadline (opts.timeout_ms).
 *
 * Threading: a client runs a progress thread that drives the network. The API may be
 * called from any thread, but one key must not be used by two threads at once. Buffers
 * passed to an operation belong to it until it completes (callback or wait): they are
 * read and written in place, without copies, by the progress thread. Completion
 * callbacks run on the progress thread and must not block. A push-pull may be in place
 * (grad == out), under any loss: once a fragment of the result has arrived the library
 * never reads or re-sends the gradient again (a result means the appliance has all of it).
 *
 * Sources: data-plane replies are accepted only from the address and port of the
 * appliance core that owns the chunk (the one the request went to); anything else is
 * dropped and counted (pbox_client_stats.foreign).
 */
#ifndef PBOX_PBOX_H
#define PBOX_PBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct pbox_client;

struct pbox_key_info {
	uint32_t id;
	uint64_t nelem; /* float32 elements */
};

struct pbox_client_opts {
	const char *server;     /* pboxd control address "host:port" (NULL: 127.0.0.1:7000) */
	uint32_t job;           /* job namespace id */
	const char *token;      /* the job's secret */
	uint32_t rank;          /* 0 .. workers-1 */
	const char *local_addr; /* local IPv4 address for the data socket (NULL: any) */
	uint32_t timeout_ms;    /* deadline of each operation and of connecting (0: 30 s) */
	uint32_t rto_ms;        /* first retransmission timeout (0: 50 ms) */
	uint32_t max_inflight;  /* chunks sent before their ACK (0: 256) ... */
	uint32_t window_bytes;  /* ... and their bytes (0: 4 MiB; one chunk may always go) */
	const char *fault;      /* fault injection spec, see PBOX_FAULT (NULL: env / none) */
	bool busy_poll;         /* progress thread spins instead of sleeping when idle */
	/* The SLoPS probe agent (pbox-ctrld measures this worker's paths through it): "off",
	 * or the UDP "ADDR:PORT" its responder listens on (port 0: any free port). NULL: env
	 * PBOX_PROBE, else on (the data socket's address, any free port). The agent probes
	 * only when pbox-ctrld asks through pboxd, at most at PBOX_PROBE_MAX_RATE (env, e.g.
	 * "200mbit"; default 1gbit) for PBOX_PROBE_MAX_BUDGET_S seconds (default 10);
	 * PBOX_PROBE_REALTIME=1 paces its streams from a SCHED_FIFO thread (needs
	 * CAP_SYS_NICE; a busy training process otherwise disturbs them). */
	const char *probe;
};

enum pbox_job_mode_public {
	PBOX_JOB_AGGREGATE = 0,
	PBOX_JOB_SERVER_OPTIMIZER = 1,
	PBOX_JOB_BROADCAST = 2,
};

struct pbox_job_info {
	uint32_t job;
	uint32_t rank;
	uint32_t workers;
	enum pbox_job_mode_public mode;
	bool mean;            /* aggregate jobs: the result is the mean (else the sum) */
	uint32_t cores;       /* appliance data-plane cores serving the job */
	uint32_t chunk_bytes; /* 0 until registered */
	uint32_t frag_bytes;
	uint32_t nchunks;
	uint64_t total_bytes; /* sum of the registered keys */
	char sync[16];        /* synchronisation model: "bsp", "ssp", "asp", ... */
	uint32_t staleness;   /* oldest model a result may be, in iterations (UINT32_MAX: any) */
	uint32_t credits;     /* operations per key that may be in flight at once */
	char optimizer[16];   /* broadcast jobs: the optimizer every rank runs ("" otherwise) */
};

struct pbox_client_stats {
	uint64_t tx_bytes; /* UDP payload bytes sent (headers included) */
	uint64_t rx_bytes;
	uint64_t tx_pkts;
	uint64_t rx_pkts;
	uint64_t retransmits; /* datagrams re-sent after a timeout */
	uint64_t probes;      /* result re-requests */
	uint64_t dropped;     /* received datagrams dropped by validation */
	uint64_t ops_done;
	uint64_t ops_failed;
	/* received datagrams dropped because they did not come from the appliance's
	 * data-plane endpoint (address and port) of the chunk's core: spoofed or stray */
	uint64_t foreign;
	/* Shared-memory transport only (pbox_transport() == "shm"; zero over UDP). Results
	 * pboxd wrote once for all workers arrive as descriptors into its read-only results'
	 * arena; one whose buffer pboxd reused before it was read (stale) or while it was
	 * copied (torn) is dropped and the result re-requested, like a lost datagram. */
	uint64_t shm_rx_desc;  /* results read through a descriptor */
	uint64_t shm_stale;    /* descriptors dropped: buffer rewritten before the read */
	uint64_t shm_torn;     /* results dropped: buffer rewritten during the copy */
	uint64_t shm_bad_desc; /* descriptors out of the arena's bounds (dropped) */
	uint64_t shm_tx_full;  /* datagrams dropped: the ring to pboxd stayed full */
	uint64_t shm_tx_waits; /* sends that waited for room in the ring */
};

/* sizeof(struct name) as this libpbox was built, for bindings that mirror the public
 * structs by hand (ctypes): "pbox_client_opts", "pbox_key_info", "pbox_job_info",
 * "pbox_client_stats", "pbox_plan". 0 for another name. A mirror whose size differs must not be
 * passed in: the structs grow at their end (new fields appended). Any thread. */
size_t pbox_struct_size(const char *name);

/* Completion callback of the asynchronous calls: key id and final status; when status is
 * negative, pbox_last_error() called inside the callback says why. Runs on the progress
 * thread: it must not block, and must not call pbox_close() on its own client. */
typedef void (*pbox_done_fn)(uint32_t key, int status, void *arg);

/*
 * Connect to pboxd and be admitted to the job as opts->rank. Fails with -EACCES (wrong
 * token), -ENOENT (no such job), -EINVAL (rank out of range), -EBUSY (rank already
 * connected, or job aborted and draining), -ECONNREFUSED / -ETIMEDOUT (no pboxd there).
 * Environment: PBOX_FAULT (fault spec) if opts->fault is NULL. The option strings are
 * copied: opts need not outlive the call.
 */
int pbox_connect(const struct pbox_client_opts *opts, struct pbox_client **out);

/*
 * Register the job's keys, identically on every rank (ids unique; any order, but the same
 * on all ranks). The first rank to register defines the key set of the session; a rank
 * whose keys differ is refused with -EINVAL and a message naming the first difference.
 * After this the data path is ready.
 */
int pbox_register(struct pbox_client *c, const struct pbox_key_info *keys, uint32_t nkeys);

/* Blocking operations (bounded by the operation deadline). */
int pbox_init(struct pbox_client *c, uint32_t key, const float *values);
int pbox_push(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad);
/* pull: server-optimizer jobs: the model with version >= iter (0 = the initial model);
 * aggregate jobs: the aggregate of iteration iter. */
int pbox_pull(struct pbox_client *c, uint32_t key, uint32_t iter, float *out);
/* out may equal grad (the result overwrites the gradient once it has been sent). */
int pbox_push_pull(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
		   float *out);

/* Asynchronous variants: return once the operation is started (0) or refused (-EBUSY:
 * the key has one in flight). cb (may be NULL) runs on the progress thread. */
int pbox_init_async(struct pbox_client *c, uint32_t key, const float *values, pbox_done_fn cb,
		    void *arg);
int pbox_push_async(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
		    pbox_done_fn cb, void *arg);
int pbox_pull_async(struct pbox_client *c, uint32_t key, uint32_t iter, float *out, pbox_done_fn cb,
		    void *arg);
int pbox_push_pull_async(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
			 float *out, pbox_done_fn cb, void *arg);

/*
 * Wait for the operation on key. timeout_ms < 0: until it completes (it has its own
 * deadline). Returns its status, 0 if nothing was in flight, or -ETIMEDOUT if the wait
 * timed out first (the operation continues; wait again or let it fail on its deadline).
 */
int pbox_wait(struct pbox_client *c, uint32_t key, int timeout_ms);
/* Wait for every operation in flight; returns the first error, if any. */
int pbox_wait_all(struct pbox_client *c, int timeout_ms);

int pbox_job_info(const struct pbox_client *c, struct pbox_job_info *info);

/* The data path pbox_register chose: "udp" (kernel UDP) or "shm" (shared-memory rings with
 * a pboxd on this host); "" before registration. The environment variable PBOX_TRANSPORT
 * ("udp", "shm" or "auto", the default) decides: auto takes shm when pboxd offers it and
 * its data address is on this host; shm fails the registration if it cannot be set up. */
const char *pbox_transport(const struct pbox_client *c);

/*
 * Memory shared with the appliance (workers on pboxd's own host, transport "shm"). A
 * buffer from pbox_mem_alloc lives in a memfd that pboxd maps too: a push, push-pull or
 * init whose source lies in it hands pboxd the place (region, offset, length) instead of
 * copying the bytes into the shared-memory ring, and pboxd adds them from there. Results
 * may be written into such a buffer as into any other (in place, grad == out, too).
 *
 * After pbox_register. Returns 0 with *out page-aligned memory of at least `bytes`
 * (zeroed), usable with every operation. It is shared when the transport is "shm" and
 * pboxd accepted it (pbox_mem_registered says which); otherwise (kernel UDP, pboxd's
 * limits per worker reached: shm.max_regions / max_region_mb, or PBOX_SHM_REGISTER=0 in
 * the environment) it is plain memory and pushes from it are copied as usual (logged).
 * Errors: -EINVAL (bytes 0, NULL), -ENOTCONN (before pbox_register), -ENOMEM.
 *
 * Ownership: the memory belongs to the client. The caller must not modify the bytes an
 * operation sends between its start and its completion (callback or wait): pboxd reads
 * them at its own pace, and re-reads them if a datagram is re-sent. Free it with
 * pbox_mem_free (no operation using it may be in flight) or leave it to pbox_close,
 * which frees what is left: no pointer into it may be used after pbox_close. Any thread.
 */
int pbox_mem_alloc(struct pbox_client *c, size_t bytes, void **out);
/* Free a block of pbox_mem_alloc (p: the pointer it returned; NULL: no-op). 0, or
 * -EINVAL (not such a block). */
int pbox_mem_free(struct pbox_client *c, void *p);
/* Whether p lies in a block of pbox_mem_alloc that pboxd shares (pushes from it go
 * without a copy). */
bool pbox_mem_registered(struct pbox_client *c, const void *p);
/*
 * Hand a block of pbox_mem_alloc over to the caller, bytes kept: libpbox forgets it (it is
 * no longer shared with pboxd; pbox_mem_free and pbox_close leave it alone) and the caller
 * unmaps it with munmap(p, bytes) (bytes: as allocated). For language bindings whose
 * buffers may outlive the client. An operation in flight that pushes from it may fail.
 * 0, or -EINVAL (not such a block). Any thread.
 */
int pbox_mem_detach(struct pbox_client *c, void *p);

/* The version (server-optimizer) or iteration (aggregate) of the last result received for
 * key: under SSP/ASP it may be older than the iteration asked for, and a straggler under
 * drop-stragglers can use it to catch up. Negative errno for an unknown key. */
int64_t pbox_result_version(struct pbox_client *c, uint32_t key);
/*
 * After pbox_register: the model version the appliance restored from a checkpoint for this
 * session (0: a fresh start). Resume contract for server-optimizer jobs: every key's model
 * of that version is on the appliance (pull it), iteration numbers continue from it, and
 * rank 0 must not send an initial model (pbox_init is acknowledged and ignored). Updates
 * after that version that were lost with the appliance are redone by pushing the same
 * iterations again.
 */
uint32_t pbox_resume_version(const struct pbox_client *c);
/* A snapshot of the client's counters, taken when an operation last completed (the foreign
 * count also whenever it changes). All zero before pbox_register. */
void pbox_client_stats(struct pbox_client *c, struct pbox_client_stats *st);

/* Of the datagrams received (pbox_client_stats.rx_pkts, same snapshot), how many were
 * result fragments received straight into the caller's buffer, with no copy after the
 * kernel's (kernel UDP only; libpbox's receive placement, on with PBOX_RX_PLACE=1).
 * A separate call so pbox_client_stats keeps its layout. */
uint64_t pbox_client_rx_placed(struct pbox_client *c);

/*
 * The control plane's plan for this rank (pbox-ctrld computes it, pboxd forwards it over
 * the control channel: with the register answer and whenever it changes; see README
 * "Broadcast trees and DVF thresholds"). Consumers: the DVF filter (which threshold to
 * push with) and TSB relaying (whom to forward the broadcast to). Without a control plane
 * no plan ever arrives (revision 0): push with the job's own delta_low and take results
 * from the appliance, as before.
 */
enum pbox_plan_link {
	PBOX_PLAN_LINK_UNKNOWN = 0,  /* not measured (counts as sufficient) */
	PBOX_PLAN_LINK_SUFFICIENT,   /* available bandwidth >= min_rate (with hysteresis) */
	PBOX_PLAN_LINK_INSUFFICIENT, /* below it */
};

#define PBOX_PLAN_MAX_CHILDREN 1024u /* pbox-ctrld's largest tree degree */
#define PBOX_PLAN_PARENT_ROOT  (-1)  /* parent: the appliance */

struct pbox_plan {
	int64_t revision; /* of the tree; 0: no plan received (every other field zero) */
	/* DVF thresholds (Parameter Flow): this rank pushes with `delta`, which is delta_up
	 * when its link is insufficient (push_up), else delta_low. */
	double delta;
	bool push_up;
	enum pbox_plan_link link;
	double link_bps; /* the estimate the link state came from (0: none) */
	/* what the appliance (root) broadcasts with: delta_up when any rank's link is
	 * insufficient */
	double broadcast_delta;
	bool broadcast_up;
	double delta_low, delta_up, min_rate_bps;
	/* Tree position (ranks; the appliance is PBOX_PLAN_PARENT_ROOT): this rank gets the
	 * broadcast from parent and relays it to children[0 .. nchildren-1]. depth: 1 for a
	 * child of the appliance. */
	int32_t parent;
	uint32_t depth;
	uint32_t nchildren;
	uint32_t children[PBOX_PLAN_MAX_CHILDREN];
	/* PHub's recommendation for the job (papers/phub.md): "single" (one appliance),
	 * "hierarchical" (rack-local reduction first), "" (not computed). */
	char phub[16];
};

/* Copy the current plan into *out (revision 0: none yet). Any thread; 0, or -EINVAL (NULL
 * argument). A plan change is logged by the library (INFO, "job J rank R: plan revision
 * N: ..."). */
int pbox_plan_get(struct pbox_client *c, struct pbox_plan *out);
/* The current plan's revision (0: none), without copying: a cheap check per iteration
 * before calling pbox_plan_get. Any thread. */
int64_t pbox_plan_revision(const struct pbox_client *c);

/*
 * ---- Broadcast-update jobs (mode "broadcast") ----
 *
 * Every rank keeps the full model and runs the job's optimizer (the optimizer { ... } of
 * the job definition, pbox_job_info.optimizer) on the aggregates the appliance sends
 * back, with the appliance's own optimizer kernels: ranks that apply the same aggregates
 * in the same order hold the same model, bit for bit. The appliance sums (reduce = "sum")
 * or averages the updates of an iteration; only updates cross the network, never the
 * model.
 *
 *   pbox_register(c, keys, nkeys);
 *   init(models);                          // W^0, the same on every rank (one seed)
 *   pbox_update_open(c, keys, nkeys, models, 0, &u);
 *   for (t = 0; t < steps; t++) {
 *           compute(models, g);            // this rank's update of every key
 *           pbox_update_step(u, g);        // push it, apply what the sync rule needs
 *   }
 *   pbox_update_sync(u);                   // apply the rest: every rank holds W^steps
 *   pbox_update_close(u);
 *
 * Synchronisation, with clock = updates pushed and version = aggregates applied:
 *   bsp      pbox_update_step of iteration t returns with the model W^(t+1) (one
 *            fused push-pull per key);
 *   ssp(s)   it pushes, then applies every aggregate that has arrived, and blocks only
 *            while clock - version > s (Parameter Flow's blocking rule): a rank runs at
 *            most s iterations ahead of the slowest and otherwise computes on the newest
 *            model the appliance has completed. Between steps a pull of its next
 *            aggregate stays in flight, which takes two operations per key: the job's
 *            flow credits >= 2 (pboxd's default for broadcast ssp jobs). With
 *            PBOX_UPDATE_EXACT_LAG (or credits = 1) a step applies exactly the
 *            aggregates the rule requires, U^(t-s) folded into the push as a push-pull:
 *            the model at clock t is always W^(t-s), which makes a deterministic job
 *            bit-reproducible under SSP too, at the price of gradients always s
 *            aggregates stale (less stable with high momentum).
 *            Either way the aggregate of iteration u is the sum of every rank's
 *            iteration-u update (never mixed with later ones), and every rank applies
 *            U^0, U^1, ... in that order: the same view everywhere.
 * Threading: one thread uses a struct pbox_update at a time; while it exists, the
 * registered keys must not be used with the other operations of the client.
 */
struct pbox_update;

#define PBOX_UPDATE_EXACT_LAG 0x1u

/* After pbox_register, with the same keys in the same order: models[i] is key
 * keys[i]'s model (keys[i].nelem floats, W^0). flags: 0 or PBOX_UPDATE_EXACT_LAG. The
 * library keeps the optimizer state and writes the models only inside pbox_update_step /
 * pbox_update_sync. Fails with -EINVAL (not a broadcast job, keys differ from the
 * registered ones, unknown flags), -ENOMEM. */
int pbox_update_open(struct pbox_client *c, const struct pbox_key_info *keys, uint32_t nkeys,
		     float *const *models, uint32_t flags, struct pbox_update **out);
/* Push updates[i] (key i's update of iteration pbox_update_clock(u)) and apply the
 * aggregates the sync rule requires before the next iteration (above). The updates
 * are read until it returns. Errors as pbox_push_pull's; after one, the replica is no
 * longer in step with the job: close it. */
int pbox_update_step(struct pbox_update *u, const float *const *updates);
/* Apply every aggregate not yet applied (version = clock): waits until every rank has
 * pushed every iteration this one has. Under BSP there is never any. */
int pbox_update_sync(struct pbox_update *u);
/* Iterations pushed, and aggregates applied (the model is W^version). */
uint32_t pbox_update_clock(const struct pbox_update *u);
uint32_t pbox_update_version(const struct pbox_update *u);
/* Wait for its operations still in flight (a pull, after an error), then free the
 * optimizer state (not the models). Before or after pbox_close of the client (which
 * cancels them at once: after an error, close the client first). NULL is a no-op. */
void pbox_update_close(struct pbox_update *u);

/* Leave the job cleanly, stop the progress thread, free everything. NULL is a no-op.
 * Operations still in flight, or submitted and not yet started, fail with -ECANCELED
 * (their callbacks run before pbox_close returns). Not from a completion callback. */
void pbox_close(struct pbox_client *c);

/* The message of the last error returned to this thread ("" if none). */
const char *pbox_last_error(void);

/* Library version string, e.g. "0.1.0". */
const char *pbox_version(void);

#ifdef __cplusplus
}
#endif

#endif /* PBOX_PBOX_H */
