/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's client (pbox/pbox.h) inside: the session struct the client's files share,
 * and the functions they call across files. Not installed.
 *
 * Files: client.c (errors, connect, getters, close), client_ctl.c (the control channel:
 * requests and the events pboxd sends), client_progress.c (the progress thread that
 * drives the worker node), client_register.c (registration: the session parameters, the
 * data path), client_ops.c (operations on keys and waiting for them), client_mem.c
 * (pbox_mem_alloc's buffers).
 *
 * Threads: API calls run on the caller's threads; the node, the UDP socket and the
 * control socket (after registration) belong to the progress thread. They meet in
 * c->lock, which guards the submission list and op states only (never held while
 * touching the network), and the eventfd that wakes the progress thread.
 */
#ifndef PBOX_LIBPBOX_CLIENT_INT_H
#define PBOX_LIBPBOX_CLIENT_INT_H

#include <pbox/pbox.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/ctlproto.h"
#include "common/jobdesc.h"
#include "common/tsbmsg.h"
#include "dvf/dvf_job.h"
#include "node.h"
#include "probe.h"
#include "update.h"

#ifndef PBOX_VERSION_STRING
#define PBOX_VERSION_STRING "0.0.0"
#endif

enum cop_state {
	COP_FREE = 0,
	COP_SUBMITTED, /* handed to the progress thread */
	COP_DONE,      /* completed, status not yet collected by a wait */
};

struct cop {
	struct pbox_op op;
	enum cop_state state;
	uint32_t version; /* label of the last result received on this key */
	pbox_done_fn cb;
	void *cb_arg;
	struct cop *next; /* submission list */
	bool waited;      /* a thread waits for it (wait_locked): its completion signals */
};

struct pbox_client {
	struct pbox_client_opts opts;
	char server_host[256];
	uint16_t server_port;
	char token[256];
	char local_addr[64]; /* copies of opts' strings: the caller's may not outlive connect */
	char fault[256];
	char transport[8];  /* the data path chosen at registration ("": not yet) */
	char shm_name[108]; /* pboxd's shared-memory socket ("": not offered) */
	char probe_spec[80];
	struct pbox_wprobe *probe;    /* the SLoPS agent (libpbox/probe.h); NULL: off */
	struct pbox_plan plan;        /* the control plane's plan for this rank, under lock */
	int64_t plan_rev;             /* plan.revision (atomic reads) */
	struct pbox_ratelog plan_log; /* plan change lines (progress thread) */
	int ctl_fd;
	struct pbox_linebuf ctl_in;
	struct pbox_job_info info;
	char data_addr[64];
	uint64_t cookie;
	/* synchronisation contract from the register reply */
	uint32_t staleness;
	uint32_t credits;
	bool plain, folds_late;
	bool crc;                /* stamp fragments with CRC32C version words */
	bool sampled_words;      /* else: sampled version words (node.h) */
	uint64_t rx_placed;      /* snapshot (under lock) of the node's rx_placed */
	struct pbox_dvf_job dvf; /* the job's DVF settings (enabled: pushes are filtered) */
	uint32_t heartbeat_ms;
	uint32_t resume_version;     /* from the register reply: a restored checkpoint's version */
	struct pbox_tsb_key tsb_key; /* TSB: the session key from the register reply */
	bool tsb;
	uint64_t next_ping_ns;
	/* after registration */
	struct pbox_jobdesc desc;
	struct pbox_peer *cores;
	struct pbox_udp *udp;
	struct pbox_shm_client *shm; /* the data path when not NULL (udp stays open) */
	struct mem_block *mem;       /* pbox_mem_alloc's blocks, under lock */
	struct pbox_node *node;
	struct cop *ops; /* per key index */
	pthread_t thread;
	bool thread_started;
	int wake_fd;
	bool stop; /* set by pbox_close, read by the progress thread (atomics) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct cop *sub_head, *sub_tail;
	struct pbox_client_stats stats; /* snapshot, under lock */
	/* broadcast jobs: the optimizer every worker runs (from the hello reply) */
	const struct pbox_optimizer_ops *bc_opt;
	struct pbox_opt_params bc_params;
	int fail_err; /* set once the job / connection failed */
	char fail_msg[256];
	bool node_failed; /* progress thread: fail_err applied to the node */
};

/* A block of pbox_mem_alloc: registered with pboxd (shared: the shm client maps it) or
 * plain anonymous memory. */
struct mem_block {
	void *p;
	size_t bytes;
	bool shared;
	struct mem_block *next;
};

/* ---- across the client's files ------------------------------------------------------ */

/* pbox_last_error()'s buffer, per thread (client.c). */
#define PBOX_CLIENT_ERRMSG_LEN 512

/* Control channel (client_ctl.c). Connect c->ctl_fd to c->server_host:server_port
 * (bounded by opts' timeout): 0 or a negative errno, with pbox_last_error() saying why. */
int pbox_client_ctl_connect(struct pbox_client *c);
/* Send req (consumed) and wait for the response object (*resp, the caller's reference);
 * events arriving first are handled. 0, or a negative errno with pbox_last_error() set
 * (an error answer of pboxd included). */
int pbox_client_ctl_call(struct pbox_client *c, json_t *req, json_t **resp);
/* The DVF push filter's delta_low / delta_up switch follows the plan's push_up (with
 * c->lock held, whenever the plan or the node changes). */
void pbox_client_dvf_plan(struct pbox_client *c);
/* A rank plan from pboxd (register answer or plan event): decoded strictly, published,
 * what changed logged. A malformed one is logged and ignored (the previous plan stays). */
void pbox_client_plan_event(struct pbox_client *c, const json_t *j);
/* Send a control line (ans consumed) from the progress thread (small: waits at most 1 s
 * for room). */
void pbox_client_ctl_answer(struct pbox_client *c, json_t *ans);
/* Read control events (abort, plans, probes, the tree) and notice a closed control
 * connection, without blocking. Returns true if a failure is now recorded. */
bool pbox_client_ctl_read_events(struct pbox_client *c);
/* Tell pboxd this worker is alive, when due (its liveness check declares silent workers
 * dead). */
void pbox_client_heartbeat(struct pbox_client *c);

/* Progress thread (client_progress.c). Record the first failure of the session; the
 * progress loop applies it to the node. */
void pbox_client_record_failure(struct pbox_client *c, int err, const char *msg);
/* On the progress thread: control events, then fail the node if the session failed. */
void pbox_client_ctl_events(struct pbox_client *c);
/* The node's completion callback (struct pbox_node_cfg.done), on the progress thread:
 * completes op's slot, wakes its waiters, runs its callback (client_progress.c). */
void pbox_client_op_done(struct pbox_op *op, void *arg);
/* The progress thread's body (pthread_create), arg the client (client_progress.c). */
void *pbox_client_progress_main(void *arg);

#endif /* PBOX_LIBPBOX_CLIENT_INT_H */
