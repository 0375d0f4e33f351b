/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's file-descriptor budget: the one account of the descriptors pboxd holds for as
 * long as a client or a session lasts, against the open-file limit (RLIMIT_NOFILE, soft).
 *
 *   limit = PBOXD_FD_RESERVE + control + shm + metrics + results + free
 *
 *   reserve  pboxd's own descriptors, opened at start or for a short while: listeners,
 *            epoll, timers, the cores' sockets and eventfds, log and checkpoint files,
 *            pbox-ctrld's connection, the one control.c keeps to shed a connection when
 *            accept() fails with EMFILE. No holder below ever takes them.
 *   control  control connections (TCP and the operators' Unix socket), 1 each; also
 *            capped by control_limits.max_connections.
 *   shm      shared-memory connections, 2 each (the socket and the worker's eventfd),
 *            and 1 + cores more until the welcome is sent (the rings' memfd and dups of
 *            the results' memfds it carries); also capped by shm.max_conns. A refused
 *            worker is told EMFILE and takes kernel UDP (unless it forced
 *            PBOX_TRANSPORT=shm).
 *   metrics  the /metrics endpoint's connections, 2 each (the socket and a dup), taken
 *            at start for metrics.max_connections: pboxd does not start if they do not
 *            fit.
 *   results  results' memfds (transport/shm/pboxd_shm.c), 1 per (session, core), held
 *            for the session. They are optional (a session without them sends its
 *            results to shared-memory workers as copies), so they never take the last
 *            PBOXD_FD_CONN_HEADROOM free descriptors: those stay for connections.
 *
 * The limit is read at every take, so a limit lowered while pboxd runs (prlimit) counts
 * at once. A take that does not fit is refused with -EMFILE and counted per class; the
 * caller logs it with the object (peer, job and core) and pboxd_fd_explain's numbers.
 * Descriptors are taken before the object that holds them is created and given back after
 * it is closed: the account is never below what is open.
 *
 * Threading: any thread (atomics); the control thread takes control connections, the
 * shm listener shm connections, session creation results' memfds.
 */
#ifndef PBOXD_FDBUDGET_H
#define PBOXD_FDBUDGET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define PBOXD_FD_RESERVE       128u
#define PBOXD_FD_CONN_HEADROOM 64u

enum pboxd_fd_class {
	PBOXD_FD_CONTROL = 0,
	PBOXD_FD_SHM,
	PBOXD_FD_METRICS,
	PBOXD_FD_RESULTS,
	PBOXD_FD_CLASSES,
};

/* Take n descriptors for a holder of class k: 0, or -EMFILE (refused, counted). */
int pboxd_fd_take(enum pboxd_fd_class k, uint32_t n);
/* Give back n descriptors taken for class k. */
void pboxd_fd_give(enum pboxd_fd_class k, uint32_t n);

/* The open-file limit now (UINT64_MAX: none). */
uint64_t pboxd_fd_limit(void);

/* Descriptors this process has open now (/proc/self/fd; 0 if it cannot be read): at
 * start, before any holder, what the reserve has to hold. */
uint32_t pboxd_fd_open_now(void);

/* "open-file limit L: R reserved, control C, shm S, metrics X, results M held, F free"
 * into buf; returns buf. */
const char *pboxd_fd_explain(char *buf, size_t len);

/* {"limit", "reserve", "headroom", "free", "held": {control, shm, metrics, results},
 *  "refused": {...the same classes}} (new reference; limit and free -1: no limit). */
json_t *pboxd_fd_stats(void);

#endif /* PBOXD_FDBUDGET_H */
