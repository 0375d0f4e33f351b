/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers shared by the subcommands of the `pbox` program: strict number parsing with
 * messages that name the option, one request on pboxd's control channel, and byte
 * counts for people.
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

/*
 * Parse s as the value of option opt of command cmd: an unsigned integer in [lo, hi] or a
 * finite number in [lo, hi]. Returns 0, or -EINVAL after printing to stderr e.g.
 * "pbox demo: --batch abc: expected an integer between 1 and 60000".
 */
int pbox_cli_u32(const char *cmd, const char *opt, const char *s, uint32_t lo, uint32_t hi,
		 uint32_t *out);
int pbox_cli_u64(const char *cmd, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		 uint64_t *out);
int pbox_cli_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
		    double *out);

/*
 * Send one request to the pboxd control address "host:port" and return its reply in
 * *reply (owned by the caller). Bounded by timeout_ms in all. Returns 0, or a negative
 * errno with err naming the address and the cause (-ECONNREFUSED: nothing listens there,
 * -ETIMEDOUT, -EPROTO: the reply is not JSON, -EINVAL: a bad address).
 */
int pbox_cli_ctl_request(const char *addr, const json_t *req, json_t **reply, int timeout_ms,
			 char *err, size_t errlen);

/* "1.41 GB", "940.6 KB", "512 B" (decimal units). Returns buf. */
const char *pbox_cli_bytes(double bytes, char *buf, size_t len);

#endif /* PBOX_TOOLS_CLI_H */
