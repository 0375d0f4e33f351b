/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's control listener: TCP connections speaking the newline-delimited JSON protocol
 * of common/ctlproto.h. Requests are dispatched to the sessions module (hello, register,
 * leave) or answered here (stats). A connection that sends garbage gets an error object
 * and, after repeated garbage or an oversized line, is closed; it never takes pboxd down.
 *
 * Threading: control thread only; driven from the main poll loop.
 */
#ifndef PBOXD_CONTROL_H
#define PBOXD_CONTROL_H

#include <jansson.h>
#include <poll.h>

#include "sessions.h"

struct pboxd_control;

/* Produces the stats object for a {"op":"stats"} request (new reference). */
typedef json_t *(*pboxd_stats_fn)(void *arg);

/* Listen on host:port. Returns NULL after logging why. */
struct pboxd_control *pboxd_control_open(const char *host, uint16_t port,
					 struct pboxd_sessions *sessions, pboxd_stats_fn stats,
					 void *stats_arg);
void pboxd_control_close(struct pboxd_control *c);

/* Stop accepting new connections (draining); existing ones are served. */
void pboxd_control_stop_accepting(struct pboxd_control *c);

/* Fill up to max pollfds (listener + connections); returns the count. */
unsigned pboxd_control_pollfds(struct pboxd_control *c, struct pollfd *p, unsigned max);

/* Handle the events reported in p[0..n) (as filled by pboxd_control_pollfds). */
void pboxd_control_handle(struct pboxd_control *c, const struct pollfd *p, unsigned n);

/* Heartbeat check, every pboxd_sessions_heartbeat_ms: members silent for longer than the
 * worker timeout (on the clock that stamps their requests) are declared dead; their
 * connections are closed by the next pboxd_control_handle. */
void pboxd_control_tick(struct pboxd_control *c);

/* Bound port (host order). */
uint16_t pboxd_control_port(const struct pboxd_control *c);

#endif /* PBOXD_CONTROL_H */
