/* SPDX-License-Identifier: BSD-3-Clause */
/* Control requests, JSON counters and byte formatting for the pbox subcommands. */
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

int pbox_cli_admin_request(const char *addr, const char *admin_token, const json_t *req,
			   json_t **reply, int timeout_ms, char *err, size_t errlen)
{
	return pbox_ctl_request(addr, admin_token, req, reply, timeout_ms, err, errlen);
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
