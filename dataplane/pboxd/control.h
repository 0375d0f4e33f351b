/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's control listener: TCP connections (and an optional Unix socket for operators)
 * speaking the newline-delimited JSON protocol of common/ctlproto.h. Requests are
 * dispatched to the sessions module (hello, register, leave), to the probe agent (probe,
 * admin only) or answered here (stats; status, admin only: jobstatus.h).
 *
 * Built to stay responsive under hostile clients, so that no client can stop another
 * job's workers from being heard:
 *  - epoll, level-triggered: every ready connection is served in turn, with bounded work
 *    per turn (a read of at most one line bound, answers queued without blocking);
 *  - connections that have not said a valid hello ("unauthenticated") are capped in all
 *    and per source address (a new one closes the oldest, after reading what it sent),
 *    closed after unauth_timeout seconds, and read with a small line bound;
 *  - all connections are capped in all (also by the open-file limit) and per address;
 *    each takes a descriptor from pboxd's budget (fdbudget.h), shared with shm connections
 *    and results' memfds, or is refused (counted, logged with the budget's numbers);
 *  - request lines are bounded by what a register of max_register_keys keys needs;
 *  - answers wait in a bounded per-connection queue; a client that does not read is
 *    closed when its queue would exceed max_output_bytes;
 *  - a member counts as alive from the last byte read from it, and the liveness check
 *    (pboxd_control_tick) first reads whatever members have sent;
 *  - failed admissions (wrong token, unknown job, wrong admin token) are counted and
 *    limited per source address by a token bucket;
 *  - stats are answered in full only with the admin token or over the Unix socket; a
 *    member of a job sees its own job; others are refused;
 *  - accept() failing for lack of descriptors (EMFILE / ENFILE) sheds the connection with
 *    a reserved descriptor and pauses the listener briefly instead of spinning;
 *  - every refusal is counted (the "control" object of the stats) and logged with the
 *    peer and the cause, at most a few lines per reason every 10 s.
 *
 * Threading: control thread only; driven from the main loop, which polls
 * pboxd_control_fd().
 */
#ifndef PBOXD_CONTROL_H
#define PBOXD_CONTROL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "sessions.h"

struct pboxd_control;

/* Produces the stats object for a {"op":"stats"} request (new reference): every job's and
 * core's counters when all is true, else only job `job` (a member asking). */
typedef json_t *(*pboxd_stats_fn)(void *arg, bool all, uint32_t job);

/* Listen on cfg's control address (and control_socket, if set) with cfg's limits. cfg
 * must outlive the listener. Returns NULL after logging why. */
struct pboxd_control *pboxd_control_open(const struct pboxd_config *cfg,
					 struct pboxd_sessions *sessions, pboxd_stats_fn stats,
					 void *stats_arg);
/* Close every connection (members are handled as disconnected) and the listeners; removes
 * the Unix socket's file. */
void pboxd_control_close(struct pboxd_control *c);

/* Stop accepting new connections (draining); existing ones are served. */
void pboxd_control_stop_accepting(struct pboxd_control *c);

/* A descriptor that is readable when pboxd_control_handle has work (an epoll fd). */
int pboxd_control_fd(const struct pboxd_control *c);

/* Serve what is ready, without blocking: accept, read and answer, flush queued answers,
 * expire unauthenticated connections, finish started sessions. */
void pboxd_control_handle(struct pboxd_control *c);

/* Heartbeat check, every pboxd_sessions_heartbeat_ms: first reads what every member's
 * connection holds (a stalled control thread must not evict members whose heartbeats sit
 * in socket buffers), then members silent for longer than the worker timeout are declared
 * dead; their connections are closed before this returns. */
void pboxd_control_tick(struct pboxd_control *c);

/* The control channel's counters as a JSON object (new reference). */
json_t *pboxd_control_stats(const struct pboxd_control *c);

/* Serve {"op":"probe"} with probe (probe.h; NULL: refused with ENOTSUP): admin only,
 * answered when the probe ends, one at a time. probe must outlive the listener.
 * Returns 0 or -errno (its eventfd could not be watched). */
struct pboxd_probe;
int pboxd_control_set_probe(struct pboxd_control *c, struct pboxd_probe *probe);

/* Bound port (host order). */
uint16_t pboxd_control_port(const struct pboxd_control *c);

/* Most connections served at once: max_connections, lowered to fit the open-file limit. */
uint32_t pboxd_control_max_connections(const struct pboxd_control *c);

#endif /* PBOXD_CONTROL_H */
