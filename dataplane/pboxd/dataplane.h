/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's data-plane cores. The transport is an ops table chosen once at start-up:
 * kernel UDP (below, the default) or DPDK (dataplane/dpdk/pboxd_dpdk.c).
 *
 * Kernel UDP: one pinned poll-mode thread per core, each with its own socket
 * (base_port + core), its own chunk engine and counters.
 *
 * Every core runs the same loop: receive a burst -> read the job table (RCU) -> run the
 * engine on each datagram -> flush replies -> quiescent state -> account busy / idle
 * cycles. When idle for idle_us (and busy_poll is off) a core goes RCU-offline and sleeps
 * in poll() until a datagram or the stop signal arrives.
 *
 * Threading: pboxd_dp_start/stop/publish are called by the control thread only. The job
 * table is published with rcu_xchg_pointer and the old one returned after
 * synchronize_rcu(), so the caller may free it. Counters are read with pbox_stat_read().
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

struct pbox_udp;
struct pboxd_dp;

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
	/* After a new job table is visible: return once no transmit references chunk memory
	 * of jobs the old table had (zero-copy transports). May be NULL. */
	void (*quiesce)(struct pboxd_dp *dp);
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

struct pboxd_core {
	struct pbox_core_stats stats; /* first: its own cache lines */
	uint32_t idx;
	int cpu;
	pthread_t thread;
	bool started;
	struct pbox_udp *udp;
	struct pbox_engine engine;
	struct pboxd_dp *dp;
} PBOX_CACHE_ALIGNED;

struct pboxd_dp {
	struct pbox_jobtab *tab; /* RCU-published; NULL: no sessions */
	const struct pboxd_transport_ops *ops;
	void *xport;
	uint32_t ncores;
	struct pboxd_core *cores;
	bool busy_poll;
	uint64_t idle_cycles_before_sleep;
	int stop_fd;
	bool stop;
	uint64_t tsc_hz;
};

/* Open every core's socket and start the threads. Returns 0 or a negative errno after
 * logging which core and why (e.g. port in use). On failure nothing is left running. */
int pboxd_dp_start(struct pboxd_dp *dp, const struct pboxd_config *cfg);

/* Stop and join the cores, close their sockets. Safe on a partly started dp. */
void pboxd_dp_stop(struct pboxd_dp *dp);

/* Publish tab (may be NULL); returns the previous table once no core can see it. */
struct pbox_jobtab *pboxd_dp_publish(struct pboxd_dp *dp, struct pbox_jobtab *tab);

/* Sum of datagrams the transports could not send, received truncated, etc., per core. */
void pboxd_dp_transport_stats(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
			      uint64_t *rx_truncated);

/* The transport's own counters: a JSON object (new reference) or NULL if it has none; and
 * as text (nothing if none). */
json_t *pboxd_dp_transport_json(const struct pboxd_dp *dp);
void pboxd_dp_transport_print(FILE *f, const struct pboxd_dp *dp);

/* The transport called name in this build, or NULL. */
const struct pboxd_transport_ops *pboxd_transport_find(const char *name);

#endif /* PBOXD_DATAPLANE_H */
