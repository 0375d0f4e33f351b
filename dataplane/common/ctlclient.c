/* SPDX-License-Identifier: BSD-3-Clause */
/* One request on a control channel (pboxd or pbox-ctrld), see ctlclient.h. */
#include "ctlclient.h"

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
#include "common/ctlproto.h"
#include "common/hostport.h"

static long long ms_left(const struct timespec *deadline)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (long long)(deadline->tv_sec - now.tv_sec) * 1000 +
	       (deadline->tv_nsec - now.tv_nsec) / 1000000;
}

/* Connect to pboxd's Unix control socket at path. */
static int connect_unix(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un su = { .sun_family = AF_UNIX };
	int fd, rc;

	if (strlen(path) >= sizeof(su.sun_path)) {
		snprintf(err, errlen, "%s: path too long for a Unix socket", path);
		return -ENAMETOOLONG;
	}
	memcpy(su.sun_path, path, strlen(path) + 1);
	/* Non-blocking like the TCP path: the reply is read until EAGAIN. A Unix connect
	 * completes at once (or fails with EAGAIN when the backlog is full). */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: socket: %s", path, strerror(errno));
		return rc;
	}
	if (connect(fd, (struct sockaddr *)&su, sizeof(su)) != 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot connect: %s%s", path, strerror(errno),
			 errno == ENOENT || errno == ECONNREFUSED
				 ? " (is pboxd running, with this control_socket?)"
				 : "");
		close(fd);
		return rc;
	}
	return fd;
}

/* Connect to host:port (or a Unix socket path starting with '/') without blocking longer
 * than the deadline. */
static int connect_to(const char *addr, const struct timespec *deadline, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char host[256], port[8];
	uint16_t pn;
	int fd, rc, soerr = 0;
	socklen_t sl = sizeof(soerr);
	struct pollfd p;

	if (addr[0] == '/') {
		return connect_unix(addr, err, errlen);
	}
	if (pbox_hostport_split(addr, false, 1, host, sizeof(host), &pn) != 0) {
		snprintf(err, errlen, "%s: expected HOST:PORT", addr);
		return -EINVAL;
	}
	snprintf(port, sizeof(port), "%u", pn);
	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc != 0) {
		snprintf(err, errlen, "%s: %s", addr, gai_strerror(rc));
		return -EINVAL;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: socket: %s", addr, strerror(errno));
		freeaddrinfo(ai);
		return rc;
	}
	rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	if (rc != 0 && errno != EINPROGRESS) {
		rc = -errno;
		goto fail;
	}
	p = (struct pollfd){ .fd = fd, .events = POLLOUT };
	rc = poll(&p, 1, (int)PBOX_MAX(ms_left(deadline), 0));
	if (rc == 0) {
		rc = -ETIMEDOUT;
		goto fail;
	}
	if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) {
		rc = -errno;
		goto fail;
	}
	if (soerr != 0) {
		rc = -soerr;
		goto fail;
	}
	return fd;
fail:
	snprintf(err, errlen, "%s: cannot connect: %s%s", addr, strerror(-rc),
		 rc == -ECONNREFUSED ? " (is the daemon running, with this control address?)" : "");
	close(fd);
	return rc;
}

/* Send req on fd and read its reply (events skipped) before the deadline. */
static int exchange(int fd, const char *addr, struct pbox_linebuf *lb, const json_t *req,
		    json_t **reply, const struct timespec *deadline, int timeout_ms, char *err,
		    size_t errlen)
{
	json_error_t jerr;
	int rc;

	*reply = NULL;
	rc = pbox_ctl_send(fd, req, timeout_ms);
	if (rc < 0) {
		snprintf(err, errlen, "%s: sending the request: %s", addr, strerror(-rc));
		return rc;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long long left = ms_left(deadline);
		char *line;
		long n;

		while ((line = pbox_linebuf_next(lb)) != NULL) {
			json_t *o = json_loads(line, 0, &jerr);

			if (o == NULL) {
				snprintf(err, errlen, "%s: the reply is not JSON: %s", addr,
					 jerr.text);
				return -EPROTO;
			}
			if (json_object_get(o, "event") != NULL) {
				json_decref(o); /* unsolicited; not our answer */
				continue;
			}
			*reply = o;
			return 0;
		}
		if (left <= 0) {
			snprintf(err, errlen, "%s: no reply within %d ms", addr, timeout_ms);
			return -ETIMEDOUT;
		}
		rc = poll(&p, 1, (int)left);
		if (rc < 0 && errno != EINTR) {
			rc = -errno;
			snprintf(err, errlen, "%s: poll: %s", addr, strerror(-rc));
			return rc;
		}
		if (rc <= 0) {
			continue;
		}
		n = pbox_linebuf_fill(lb, fd);
		if (n == 0) {
			snprintf(err, errlen, "%s: the connection was closed without a reply",
				 addr);
			return -ECONNRESET;
		}
		if (n < 0 && n != -EAGAIN) {
			rc = (int)n;
			snprintf(err, errlen, "%s: reading the reply: %s", addr, strerror(-rc));
			return rc;
		}
	}
}

int pbox_ctl_request(const char *addr, const char *admin_token, const json_t *req, json_t **reply,
		     int timeout_ms, char *err, size_t errlen)
{
	struct pbox_linebuf lb;
	struct timespec deadline;
	int fd, rc = 0;

	*reply = NULL;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += timeout_ms / 1000;
	deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (deadline.tv_nsec >= 1000000000) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000;
	}
	fd = connect_to(addr, &deadline, err, errlen);
	if (fd < 0) {
		return fd;
	}
	pbox_linebuf_init(&lb);
	if (admin_token != NULL && admin_token[0] != '\0' && addr[0] != '/') {
		/* Authenticate first: the request may be longer than what an unauthenticated
		 * connection may send in one line. */
		json_t *auth = json_pack("{s:s, s:s}", "op", "auth", "admin_token", admin_token);

		rc = auth ? exchange(fd, addr, &lb, auth, reply, &deadline, timeout_ms, err, errlen)
			  : -ENOMEM;
		json_decref(auth);
		if (rc == 0 && !json_is_true(json_object_get(*reply, "ok"))) {
			goto out; /* the refusal is the reply */
		}
		json_decref(*reply);
		*reply = NULL;
	}
	if (rc == 0) {
		rc = exchange(fd, addr, &lb, req, reply, &deadline, timeout_ms, err, errlen);
	}
out:
	pbox_linebuf_free(&lb);
	close(fd);
	return rc;
}
