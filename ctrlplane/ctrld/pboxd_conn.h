/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's requests to one managed pboxd, as a state machine driven by pbox-ctrld's poll
 * loop: nothing here blocks (issue 11: a pboxd that accepts and never answers, answers
 * slowly, or a dead host must not stall the control API for the other clients).
 *
 * One persistent connection per pboxd (TCP host:port or its Unix control socket), opened
 * when a request is queued: a non-blocking connect, {"op":"auth"} with the pboxd's admin
 * token on TCP (as common/ctlclient.h does: the refusal is then the request's reply), then
 * the queued requests one at a time (write the line, read one bounded reply line; the
 * pboxd's unsolicited {"event":...} lines are skipped). The connection stays open between
 * requests; a close by the pboxd while it is idle is noticed (POLLIN/EOF) and a request
 * that meets a reused connection closed before any reply byte is retried once on a new
 * one. The queue holds at most CTRLD_PCONN_MAX_QUEUE requests: beyond that a request fails
 * (-ENOBUFS) instead of waiting.
 *
 * Timeouts: every request completes within timeout_ms of being queued: it fails with
 * -ETIMEDOUT ("ADDR: no reply within N ms" and what it waited for) when it has not been
 * answered by then, also while it waits behind others; the connection of a request that
 * timed out is closed (a late reply must not be taken for the next request's).
 *
 * Completion: done(arg, rc, reply, err) is called exactly once per request, from
 * ctrld_pconn_process or ctrld_pconn_free (rc -ECANCELED), never from ctrld_pconn_submit:
 * rc 0 with reply (borrowed: valid during the call; incref to keep), or -errno with err
 * ("ADDR: cause", as ctlclient.h words it; the caller names the pboxd) and reply NULL.
 * done may submit new requests (to this or another pboxd).
 *
 * The host name of a TCP address is resolved when the object is made (blocking: at start)
 * and again only after a connect to it failed.
 *
 * Threading: one thread (pbox-ctrld's main loop). Errors: -errno.
 */
#ifndef PBOX_CTRLD_PBOXD_CONN_H
#define PBOX_CTRLD_PBOXD_CONN_H

#include <poll.h>
#include <stdint.h>

#include <jansson.h>

#define CTRLD_PCONN_MAX_QUEUE 1024u

struct ctrld_pconn;

typedef void (*ctrld_pconn_done_fn)(void *arg, int rc, json_t *reply, const char *err);

/* A connection object for the pboxd at control (host:port or a Unix socket path starting
 * with '/'), with admin_token ("" or NULL: none). Returns NULL when out of memory. */
struct ctrld_pconn *ctrld_pconn_new(const char *control, const char *admin_token,
				    uint32_t timeout_ms);
/* Close the connection and complete every queued request with -ECANCELED (also those
 * that their done functions queue meanwhile); c stays usable. */
void ctrld_pconn_cancel(struct ctrld_pconn *c);
/* Cancel (as above) and free. NULL: nothing. */
void ctrld_pconn_free(struct ctrld_pconn *c);

/* Queue req (not taken: encoded now; NULL fails as out of memory). done is called later
 * (see above). Out of memory for the request's record aborts the process (done could not
 * be called otherwise). */
void ctrld_pconn_submit(struct ctrld_pconn *c, const json_t *req, ctrld_pconn_done_fn done,
			void *arg);

/* Requests queued or in flight. */
uint32_t ctrld_pconn_pending(const struct ctrld_pconn *c);

/* Fill *pfd for this turn of the loop (fd -1: nothing to watch) and lower *wake_ms (a
 * CLOCK_MONOTONIC ms time) to the next deadline. */
void ctrld_pconn_pollfd(struct ctrld_pconn *c, struct pollfd *pfd, uint64_t *wake_ms);

/* Advance after poll with the revents of the pollfd that ctrld_pconn_pollfd filled:
 * connect, write, read, time out, complete requests. */
void ctrld_pconn_process(struct ctrld_pconn *c, short revents);

#endif /* PBOX_CTRLD_PBOXD_CONN_H */
