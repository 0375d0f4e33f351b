/* SPDX-License-Identifier: BSD-3-Clause */
/* The operator options, control requests, JSON counters and byte formatting for the pbox
 * subcommands. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/ctlclient.h"
#include "common/ctlproto.h"

uint64_t pbox_cli_json_u64(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);

	return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v)
							       : 0;
}

int pbox_cli_ctl_request(const char *addr, const json_t *req, json_t **reply, int timeout_ms,
			 char *err, size_t errlen)
{
	return pbox_ctl_request(addr, NULL, req, reply, timeout_ms, err, errlen);
}

int pbox_cli_read_token_file(const char *path, char *tok, size_t len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	int rc = 0;

	if (f == NULL) {
		rc = -errno;
		snprintf(err, errlen, "--admin-token-file %s: %s", path, strerror(errno));
		return rc;
	}
	if (fgets(tok, (int)len, f) == NULL) {
		snprintf(err, errlen, "--admin-token-file %s: empty", path);
		rc = -EINVAL;
	} else {
		tok[strcspn(tok, "\r\n")] = '\0';
	}
	fclose(f);
	return rc;
}

int pbox_cli_admin_token(const char *path, char *tok, size_t len, char *err, size_t errlen)
{
	const char *env = getenv("PBOX_ADMIN_TOKEN");

	if (path != NULL) {
		return pbox_cli_read_token_file(path, tok, len, err, errlen);
	}
	snprintf(tok, len, "%s", env != NULL ? env : "");
	return 0;
}

int pbox_cli_ctl_getopt(struct pbox_cli_ctl *c, int argc, char **argv, const char *shortopts,
			const struct option *longopts)
{
	int opt;

	while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			c->addr = optarg;
			break;
		case 's':
			if (optarg[0] != '/') {
				fprintf(stderr, "%s: --socket %s: expected an absolute path\n",
					c->cmd, optarg);
				c->exit_status = 64;
				return PBOX_CLI_CTL_EXIT;
			}
			c->addr = optarg;
			break;
		case 't':
			c->token_file = optarg;
			break;
		case 'j':
			c->json = true;
			break;
		case 'h':
			c->usage(stdout);
			c->exit_status = 0;
			return PBOX_CLI_CTL_EXIT;
		default:
			return opt;
		}
	}
	return -1;
}

int pbox_cli_ctl_token(struct pbox_cli_ctl *c)
{
	char err[768];
	int rc = pbox_cli_admin_token(c->token_file, c->token, sizeof(c->token), err, sizeof(err));

	if (rc != 0) {
		fprintf(stderr, "%s: %s\n", c->cmd, err);
	}
	return rc;
}

int pbox_cli_ctl_call(const struct pbox_cli_ctl *c, const char *verb, json_t *req, json_t **reply,
		      int timeout_ms)
{
	const char *sp = verb != NULL ? " " : "", *why;
	char err[768];
	int rc;

	*reply = NULL;
	if (req == NULL) {
		fprintf(stderr, "%s: out of memory\n", c->cmd);
		return -ENOMEM;
	}
	if (c->token_in_request && c->token[0] != '\0') {
		json_object_set_new(req, "admin_token", json_string(c->token));
	}
	rc = pbox_ctl_request(c->addr, c->token_in_request ? NULL : c->token, req, reply,
			      timeout_ms, err, sizeof(err));
	json_decref(req);
	if (rc != 0) {
		fprintf(stderr, "%s%s%s: %s\n", c->cmd, sp, verb ?: "", err);
		return rc;
	}
	if (!json_is_true(json_object_get(*reply, "ok"))) {
		why = json_string_value(json_object_get(*reply, "error"));
		if (c->token_in_request) {
			fprintf(stderr, "%s%s%s: %s refused the request: %s\n", c->cmd, sp,
				verb ?: "", c->addr, why ?: "no reason given");
		} else {
			fprintf(stderr, "%s%s%s: %s refused: %s\n", c->cmd, sp, verb ?: "", c->addr,
				why ?: "(no reason given)");
		}
		json_decref(*reply);
		*reply = NULL;
		return -EPERM;
	}
	return 0;
}

void pbox_cli_print_json(const json_t *o)
{
	json_dumpf(o, stdout, JSON_INDENT(2));
	printf("\n");
}

const char *pbox_cli_bytes(double bytes, char *buf, size_t len)
{
	static const char *const units[] = { "B", "KB", "MB", "GB", "TB", "PB" };
	unsigned u = 0;

	while (bytes >= 1000.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
		bytes /= 1000.0;
		u++;
	}
	if (u == 0) {
		snprintf(buf, len, "%.0f B", bytes);
	} else {
		snprintf(buf, len, "%.*f %s", bytes < 10 ? 2 : (bytes < 100 ? 1 : 0), bytes,
			 units[u]);
	}
	return buf;
}
