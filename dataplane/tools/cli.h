/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers shared by the subcommands of the `pbox` program: one request on pboxd's
 * control channel, counters read from JSON, and byte counts for people. Option values
 * are parsed by common/args.h (pbox_arg_*, with the program name "pbox <command>").
 *
 * Thread safety: no state; pbox_cli_bytes() writes the caller's buffer.
 */
#ifndef PBOX_TOOLS_CLI_H
#define PBOX_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Subcommands: each returns the process exit status. */
int pbox_cmd_train(int argc, char **argv);
int pbox_cmd_demo(int argc, char **argv);
int pbox_cmd_stats(int argc, char **argv);
int pbox_cmd_job(int argc, char **argv);
int pbox_cmd_bw(int argc, char **argv);
int pbox_cmd_status(int argc, char **argv);

/* The member key of o as an unsigned counter: 0 if o is not an object, key is absent, or
 * its value is not a positive integer (pboxd's and the workers' JSON counters). */
uint64_t pbox_cli_json_u64(const json_t *o, const char *key);

/*
 * Send one request to the pboxd control address "host:port" (or its Unix control socket,
 * a path starting with '/') and return its reply in
 * *reply (owned by the caller). Bounded by timeout_ms in all. Returns 0, or a negative
 * errno with err naming the address and the cause (-ECONNREFUSED: nothing listens there,
 * -ETIMEDOUT, -EPROTO: the reply is not JSON, -EINVAL: a bad address).
 */
int pbox_cli_ctl_request(const char *addr, const json_t *req, json_t **reply, int timeout_ms,
			 char *err, size_t errlen);

/* Like pbox_cli_ctl_request, on a connection that first proves admin_token ({"op":"auth"};
 * skipped when admin_token is NULL or "" or addr is a Unix socket): an administration
 * request may be longer than what pboxd reads before authentication. A refused auth is
 * returned as the reply. */
int pbox_cli_admin_request(const char *addr, const char *admin_token, const json_t *req,
			   json_t **reply, int timeout_ms, char *err, size_t errlen);

/* The first line of path (without the newline) into tok. 0 or -errno with err. */
int pbox_cli_read_token_file(const char *path, char *tok, size_t len, char *err, size_t errlen);

/* The admin token an operator command uses: the first line of path (--admin-token-file)
 * when path is not NULL, else the environment variable PBOX_ADMIN_TOKEN, else "" (none:
 * the Unix control socket needs none). 0 or -errno with err. */
int pbox_cli_admin_token(const char *path, char *tok, size_t len, char *err, size_t errlen);

/* "1.41 GB", "940.6 KB", "512 B" (decimal units). Returns buf. */
const char *pbox_cli_bytes(double bytes, char *buf, size_t len);

#endif /* PBOX_TOOLS_CLI_H */
