/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers shared by the subcommands of the `pbox` program: one request on pboxd's
 * control channel (with the operator options and error messages every command shares), counters
 * read from JSON, and byte counts for people. Option values are parsed by common/args.h
 * (pbox_arg_*, with the program name "pbox <command>").
 *
 * Thread safety: no state; pbox_cli_bytes() writes the caller's buffer.
 */
#ifndef PBOX_APPS_CLI_H
#define PBOX_APPS_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

/* The first line of path (without the newline) into tok. 0 or -errno with err. */
int pbox_cli_read_token_file(const char *path, char *tok, size_t len, char *err, size_t errlen);

/* The admin token an operator command uses: the first line of path (--admin-token-file)
 * when path is not NULL, else the environment variable PBOX_ADMIN_TOKEN, else "" (none:
 * the Unix control socket needs none). 0 or -errno with err. */
int pbox_cli_admin_token(const char *path, char *tok, size_t len, char *err, size_t errlen);

/*
 * The daemon an operator command asks: --control HOST:PORT, --socket PATH (absolute) and
 * --admin-token-file FILE, shared by pbox stats, status, job and bw, with --json and
 * -h/--help. Every message the helpers below print starts with cmd ("pbox status: ...").
 * Fill cmd, addr (the default address) and usage, write the command's option table as
 * PBOX_CLI_CTL_LONGOPTS, its own options, PBOX_CLI_CTL_LONGOPTS_END, and read the options
 * with pbox_cli_ctl_getopt().
 */
struct pbox_cli_ctl {
	const char *cmd;        /* "pbox status": the prefix of every message */
	const char *addr;       /* the default, then --control or --socket */
	void (*usage)(FILE *f); /* the command's help text (--help prints it on stdout) */
	const char *token_file; /* --admin-token-file, or NULL */
	/* pbox stats sends the token inside its request ({"op":"stats","admin_token":...})
	 * instead of proving it first, and says "ADDR refused the request: REASON". */
	bool token_in_request;
	bool json;       /* --json */
	int exit_status; /* what the command returns after PBOX_CLI_CTL_EXIT */
	char token[512]; /* set by pbox_cli_ctl_token() */
};

/* The three options' entries at the start of a struct option table ... */
#define PBOX_CLI_CTL_LONGOPTS                                                                    \
	{ "control", required_argument, NULL, 'c' }, { "socket", required_argument, NULL, 's' }, \
	{                                                                                        \
		"admin-token-file", required_argument, NULL, 't'                                 \
	}

/* ... and its last entries: --json, --help and the end of the table. */
#define PBOX_CLI_CTL_LONGOPTS_END                                               \
	{ "json", no_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' }, \
	{                                                                       \
		NULL, 0, NULL, 0                                                \
	}

/* pbox_cli_ctl_getopt(): the command returns c->exit_status now. */
#define PBOX_CLI_CTL_EXIT (-2)

/*
 * getopt_long(argc, argv, shortopts, longopts) for an operator command, taking the options
 * every one of them has: --control, --socket and --admin-token-file, --json (sets c->json)
 * and -h/--help (prints c->usage on stdout). The caller sets optind first. Returns the next
 * option the command takes itself ('?' for an unknown one, after getopt's message), -1
 * after the last option (optind: the first operand), or PBOX_CLI_CTL_EXIT with
 * c->exit_status set: 0 after --help, 64 after printing "CMD: --socket ARG: expected an
 * absolute path".
 */
int pbox_cli_ctl_getopt(struct pbox_cli_ctl *c, int argc, char **argv, const char *shortopts,
			const struct option *longopts);

/* Read the admin token (pbox_cli_admin_token) into c->token. 0, or -errno after printing
 * "CMD: CAUSE" (the caller exits with 64). */
int pbox_cli_ctl_token(struct pbox_cli_ctl *c);

/*
 * Send req (consumed, may be NULL after a failed allocation) to c->addr with c->token and
 * return the reply in *reply (owned by the caller) when the daemon said "ok". Every
 * failure is printed and leaves *reply NULL: -ENOMEM ("CMD: out of memory"), the
 * request's -errno ("CMD[ VERB]: CAUSE"), or -EPERM when the daemon refused
 * ("CMD[ VERB]: ADDR refused: REASON"). verb may be NULL.
 */
int pbox_cli_ctl_call(const struct pbox_cli_ctl *c, const char *verb, json_t *req, json_t **reply,
		      int timeout_ms);

/* Print o as indented JSON and a newline on stdout (--json). */
void pbox_cli_print_json(const json_t *o);

/* "1.41 GB", "940.6 KB", "512 B" (decimal units). Returns buf. */
const char *pbox_cli_bytes(double bytes, char *buf, size_t len);

#endif /* PBOX_APPS_CLI_H */
