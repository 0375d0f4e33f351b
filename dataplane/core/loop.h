/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The per-core data-plane loop, shared by every transport (kernel UDP, DPDK; AF_XDP and
 * RDMA next). A transport is a module providing struct pbox_loop_ops; the loop owns what
 * is the same for all of them, in one place:
 *
 *   rx (poller: receive a burst, run the engine on it; BUSY if it handled anything)
 *   -> observe the job table (pbox_engine_observe_table) -> tx (flush, completions,
 *   release / reclaim) -> end (drop what the iteration pinned) -> RCU quiescent state ->
 *   busy / idle cycle accounting -> when idle, sleep or block RCU-offline.
 *
 * Idle: without busy_poll, once the core has found nothing to do for longer than idle_tsc
 * TSC cycles (0: at once), it goes RCU-offline (a publish never waits for it) and either
 * calls the transport's wait hook (block for input; the input found is handled at once,
 * in the same iteration) or, without one, sleeps idle_sleep_us. A wait never outlasts
 * output the transport holds back (tx_due_ns). Every cycle is counted busy or idle in
 * stats; polls counts iterations.
 *
 * Threading: pbox_loop_run runs on the core's own thread (a pthread, a DPDK lcore) and
 * registers it with liburcu-qsbr for the duration of the call. pbox_loop_stop may be
 * called from any thread: it sets the stop flag and calls the wake hook. The
 * configuration fields are set before pbox_loop_run and read-only afterwards; stop is
 * written by pbox_loop_stop, the per-iteration fields by the core only.
 */
#ifndef PBOX_CORE_LOOP_H
#define PBOX_CORE_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <urcu-qsbr.h>

#include "engine/engine.h"

/* What a poller did: SPDK's thread_execute_poller convention. */
enum pbox_poll_rc {
	PBOX_POLL_IDLE = 0,
	PBOX_POLL_BUSY = 1,
};

struct pbox_loop;

/* A transport's per-core hooks; xc is the transport's per-core state. Only rx is
 * required. All but wake run on the core's thread, RCU-online unless stated. */
struct pbox_loop_ops {
	/* Receive a burst and hand it to the engine. Reads the job table with
	 * pbox_loop_table() after receiving (a worker admitted by a table published before
	 * its datagram was sent is then always seen). */
	enum pbox_poll_rc (*rx)(void *xc, struct pbox_loop *l);
	/* After the table was observed: flush replies, poll completions, release what the
	 * device let go of. rx_rc: what rx returned. May be NULL. */
	void (*tx)(void *xc, struct pbox_loop *l, enum pbox_poll_rc rx_rc);
	/* End of the iteration, right before the quiescent state: no job table may be in use
	 * after it (drop pins). May be NULL. */
	void (*end)(void *xc);
	/* Idle: block until input may be there, or timeout_ms passed, or wake was called;
	 * RCU-offline (must not touch RCU-protected data). Returns true if the loop should
	 * run rx at once (what was received is handled in this same iteration). NULL: the
	 * loop sleeps idle_sleep_us instead. */
	bool (*wait)(void *xc, int timeout_ms);
	/* Like wait, but also return when fd is readable (an extra poller's doorbell, see
	 * struct pbox_loop_poller). NULL: the loop sleeps idle_sleep_us instead. */
	bool (*wait_fd)(void *xc, int timeout_ms, int fd);
	/* Output the transport holds back on purpose (a result pacer, core/pace.h) that the
	 * tx hook releases when due: nanoseconds until the next of it is due, 0 if now,
	 * UINT64_MAX if none. Before sleeping the loop asks it: due within a millisecond, it
	 * does not sleep; otherwise it waits (wait or wait_fd) no longer than until then, so
	 * held output never waits for the next input or the wait_ms timeout. May be NULL
	 * (nothing is held). */
	uint64_t (*tx_due_ns)(void *xc);
	/* Any thread: make a wait in progress, and every later one, return at once. May be
	 * NULL (waits end on their timeout). */
	void (*wake)(void *xc);
	/* On the core's thread after the loop ended, still RCU-registered: give back what
	 * the core holds (queued frames, pins). May be NULL. */
	void (*fini)(void *xc);
};

/*
 * A second source of datagrams on the same core, polled after the transport's rx (the
 * shared-memory rings of local workers, transport/shm/pboxd_shm.h). On the core's thread.
 */
struct pbox_loop_poller {
	/* Receive and hand to the engine, like pbox_loop_ops.rx. */
	enum pbox_poll_rc (*poll)(void *arg, struct pbox_loop *l);
	/* The core is about to sleep (RCU-offline follows): returns a descriptor that
	 * becomes readable when the poller has input (the loop then waits with wait_fd),
	 * -1 if it has nothing to wait for (the transport's own wait), or -EAGAIN if input
	 * is already there (no sleep). */
	int (*sleep_prepare)(void *arg);
	/* After a sleep that sleep_prepare returned a descriptor for. */
	void (*sleep_end)(void *arg);
};

struct pbox_loop {
	const struct pbox_loop_ops *ops;
	const struct pbox_loop_poller *poller; /* NULL: none */
	void *poller_arg;
	void *xc;
	struct pbox_engine *engine;     /* the core's engine (its stats are the loop's) */
	struct pbox_jobtab *const *tab; /* the RCU-published job table pointer */
	bool busy_poll;                 /* never sleep nor block */
	uint64_t idle_tsc;              /* idle this long (TSC) before sleeping; 0: at once */
	uint32_t idle_sleep_us;         /* sleep length without a wait hook */
	int wait_ms;                    /* timeout passed to the wait hook */
	bool stop;                      /* set by pbox_loop_stop */
	/* Per iteration (the core's thread): the table rx read, if it read one. */
	const struct pbox_jobtab *cur_tab;
	bool tab_read;
	uint64_t last_work; /* TSC of the last busy iteration */
};

/* The job table as of now; the core may use it until the end of the iteration. Call
 * after receiving. */
static inline const struct pbox_jobtab *pbox_loop_table(struct pbox_loop *l);

/* Run the loop on the calling thread until pbox_loop_stop. Registers the thread with
 * liburcu-qsbr for the duration and calls ops->fini before unregistering. */
void pbox_loop_run(struct pbox_loop *l);

/* Any thread: ask the loop to stop and wake it from a wait; returns at once. */
void pbox_loop_stop(struct pbox_loop *l);

/* Whether pbox_loop_stop was called. */
static inline bool pbox_loop_stopping(const struct pbox_loop *l)
{
	return __atomic_load_n(&l->stop, __ATOMIC_ACQUIRE);
}

static inline const struct pbox_jobtab *pbox_loop_table(struct pbox_loop *l)
{
	l->cur_tab = rcu_dereference(*l->tab);
	l->tab_read = true;
	return l->cur_tab;
}

#endif /* PBOX_CORE_LOOP_H */
