/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's data-plane cores. The transport is an ops table chosen once at start-up:
 * kernel UDP (below, the default), AF_XDP (dataplane/transport/afxdp/pboxd_afxdp.c) or
 * DPDK (dataplane/transport/dpdk/pboxd_dpdk.c).
 *
 * Kernel UDP: one pinned poll-mode thread per core, each with its own socket
 * (base_port + core), its own chunk engine and counters.
 *
 * Every core of every transport runs the core loop (core/loop.h): the transport is a
 * module of it (struct pbox_loop_ops) and keeps its per-core state behind
 * pboxd_core.xport_core. Kernel UDP: rx receives a burst, reads the job table (RCU) and
 * runs the engine on each datagram, then flushes replies; the loop observes the table,
 * runs the quiescent state and accounts busy / idle cycles. When its socket is empty (and
 * busy_poll is off) a core goes RCU-offline and blocks in its receive (the wait hook:
 * recvmmsg, MSG_WAITFORONE) until a datagram arrives or stop shuts the socket's receive
 * side (the wake hook); idle_us is the DPDK lcores' (kernel UDP does not poll).
 *
 * Threading: pboxd_dp_start/stop/publish are called by the control thread only, which
 * pboxd_dp_start registers with liburcu-qsbr and leaves RCU-offline (it goes online only
 * to queue a call_rcu). Counters are read with pbox_stat_read().
 *
 * Lifetime of what the cores read, without ever waiting on the control thread:
 *  - publish exchanges the table pointer and hands the old table to call_rcu: it is
 *    dropped after a grace period, on liburcu's call_rcu thread. A core that must wait
 *    for its transport in the middle of a datagram pins its table (pbox_jobtab_get) and
 *    goes RCU-offline, so grace periods go on; the table then goes when it unpins.
 *  - Job state is reference counted (job.h): each published table holds a reference.
 *    When the last table listing a state is dropped, the transport's retire() keeps it
 *    for as long as zero-copy replies may point into it and drops it from its
 *    completion path. Nothing is freed because a wait timed out: a state whose replies
 *    are never released stays mapped (logged and counted by the transport).
 *  - The last reference to a state may be dropped on a data-plane core; the arenas are
 *    then unmapped by the data plane's reaper thread, not there: munmap of a large,
 *    populated arena takes milliseconds and shoots down the TLBs of every core.
 */
#ifndef PBOXD_DATAPLANE_H
#define PBOXD_DATAPLANE_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "engine/engine.h"

struct pboxd_dp;
struct pboxd_shm;
struct pbox_xdp; /* nicfw/loader.h */

/*
 * A data-plane transport: how datagrams reach the cores' engines and leave them. Chosen
 * once at start-up by the configuration's transport name; every call below comes from
 * the control thread.
 */
struct pboxd_transport_ops {
	const char *name;
	/* Set up the transport and start the cores (dp->cores are allocated, their engines'
	 * core / kern / stats filled). Returns 0 or a negative errno after logging why;
	 * -EINVAL for bad transport arguments. On failure stop() cleans up. */
	int (*start)(struct pboxd_dp *dp, const struct pboxd_config *cfg);
	/* Stop and join the cores, release the transport. Safe on a partly started dp. */
	void (*stop)(struct pboxd_dp *dp);
	/* The last published table listing st has been dropped: no core can reach st any
	 * more. A transport whose replies may still point into st's arenas (zero copy)
	 * takes references (pbox_job_state_get) and drops them when its device let go of
	 * those replies. Any thread; must not block. May be NULL (the transport copies
	 * payloads before the cores' quiescent state). */
	void (*retire)(struct pboxd_dp *dp, struct pbox_job_state *st);
	/* The XDP filter (nicfw) is attached: register the transport's sockets in it (prog
	 * NULL: no filter). 0 or -errno after logging. May be NULL (nothing to register). */
	int (*xdp_attach)(struct pboxd_dp *dp, struct pbox_xdp *prog);
	void (*transport_stats)(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
				uint64_t *rx_truncated);
	/* Transport-specific counters as a JSON object (new reference), and as text. May be
	 * NULL. */
	json_t *(*stats_json)(const struct pboxd_dp *dp);
	void (*stats_print)(FILE *f, const struct pboxd_dp *dp);
};

extern const struct pboxd_transport_ops pboxd_udp_transport;
#ifdef PBOX_HAVE_DPDK
extern const struct pboxd_transport_ops pboxd_dpdk_transport;
#endif
#ifdef PBOX_HAVE_AFXDP
extern const struct pboxd_transport_ops pboxd_afxdp_transport;
#endif

struct pboxd_core {
	struct pbox_core_stats stats; /* first: its own cache lines */
	uint32_t idx;
	int cpu;
	void *xport_core; /* the transport's per-core state (its own type) */
	struct pbox_engine engine;
	struct pboxd_dp *dp;
} PBOX_CACHE_ALIGNED;

/* Lifetime counters: written by any thread with atomic adds, read with pbox_stat_read. */
struct pboxd_dp_lifetime {
	uint64_t tables_freed;  /* job tables freed after their grace period */
	uint64_t states_freed;  /* job states whose arenas were unmapped */
	uint64_t publish_nomem; /* publishes refused: no memory for the retirement */
};

struct pboxd_dp {
	struct pbox_jobtab *tab; /* RCU-published; NULL: no sessions */
	const struct pboxd_transport_ops *ops;
	void *xport;
	struct pboxd_shm *shm; /* local workers' rings beside kernel UDP (NULL: off) */
	uint32_t ncores;
	struct pboxd_core *cores;
	bool busy_poll;
	int stop_fd;
	bool stop;
	uint64_t tsc_hz;
	/* lifetime (dataplane.c) */
	bool rcu_registered; /* the control thread, by pboxd_dp_start */
	bool transport_down; /* ops->stop ran: nothing references chunk memory */
	bool reaper_started;
	pthread_t reaper;
	int reap_fd;                      /* eventfd: states on reap_list */
	struct pbox_job_state *reap_list; /* atomic LIFO via release_next */
	bool reap_stop;
	struct pboxd_dp_lifetime life;
};

/* Open every core's socket and start the threads. Returns 0 or a negative errno after
 * logging which core and why (e.g. port in use). On failure nothing is left running. */
int pboxd_dp_start(struct pboxd_dp *dp, const struct pboxd_config *cfg);

/* Stop and join the cores, close their sockets, drop the published table and free every
 * job state whose last reference is gone. Safe on a partly started dp. */
void pboxd_dp_stop(struct pboxd_dp *dp);

/*
 * Publish tab (may be NULL: no sessions) and retire the previous table; returns at once,
 * without waiting for a grace period. tab's job entries must each be one malloc'd block
 * (freed with pbox_jobtab_free); the data plane owns tab from now on, takes a reference
 * on every job state it lists, and becomes the releaser of those states (their arenas
 * are unmapped by its reaper thread once their last reference is dropped). Returns 0, or
 * -ENOMEM (logged, counted) with nothing published: the caller still owns tab.
 */
int pboxd_dp_publish(struct pboxd_dp *dp, struct pbox_jobtab *tab);

/* The lifetime counters. */
void pboxd_dp_lifetime_stats(const struct pboxd_dp *dp, struct pboxd_dp_lifetime *out);

/* Sum of datagrams the transports could not send, received truncated, etc., per core. */
void pboxd_dp_transport_stats(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
			      uint64_t *rx_truncated);

/* The transport's own counters: a JSON object (new reference) or NULL if it has none; and
 * as text (nothing if none). */
json_t *pboxd_dp_transport_json(const struct pboxd_dp *dp);
void pboxd_dp_transport_print(FILE *f, const struct pboxd_dp *dp);

/* The XDP filter prog (NULL: none) is attached: the transport's xdp_attach. 0 or -errno. */
int pboxd_dp_xdp_attach(struct pboxd_dp *dp, struct pbox_xdp *prog);

/* The transport called name in this build, or NULL. */
const struct pboxd_transport_ops *pboxd_transport_find(const char *name);

#endif /* PBOXD_DATAPLANE_H */
