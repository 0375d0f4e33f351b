/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A client of the newline-JSON control channel (ctlproto.h) for one request at a time:
 * used by the pbox command and by pbox-ctrld to administer the pboxds it manages.
 *
 * Thread safety: no shared state; each call opens, uses and closes its own connection.
 */
#ifndef PBOX_CTLCLIENT_H
#define PBOX_CTLCLIENT_H

#include <stddef.h>

#include <jansson.h>

/*
 * Send req to addr ("host:port", or a Unix socket path starting with '/') and return its
 * reply in *reply (owned by the caller; unsolicited {"event":...} lines are skipped).
 * With an admin_token (not NULL, not "") on a TCP address, the connection first proves it
 * ({"op":"auth"}): an administration request may be longer than what a daemon reads before
 * authentication; a refused auth is returned as the reply. Bounded by timeout_ms in all.
 * Returns 0, or a negative errno with err naming the address and the cause
 * (-ECONNREFUSED: nothing listens there, -ETIMEDOUT, -EPROTO: the reply is not JSON,
 * -ECONNRESET: closed without a reply, -EINVAL: a bad address).
 */
int pbox_ctl_request(const char *addr, const char *admin_token, const json_t *req, json_t **reply,
		     int timeout_ms, char *err, size_t errlen);

#endif /* PBOX_CTLCLIENT_H */
