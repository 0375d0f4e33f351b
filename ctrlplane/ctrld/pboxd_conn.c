/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld's non-blocking requests to one pboxd (see pboxd_conn.h). */
#include "pboxd_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
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
#include "common/log.h"

struct preq {
	char *line; /* the encoded request with its newline */
	size_t len;
	uint64_t deadline_ms;
	bool retried; /* sent once on a reused connection that closed without a reply */
	ctrld_pconn_done_fn done;
	void *arg;
	struct preq *next;
};

enum phase {
	PH_CLOSED,
	PH_CONNECTING,
	PH_AUTH, /* {"op":"auth"} written / its reply awaited */
	PH_IDLE, /* open, nothing in flight */
	PH_REQ,  /* the head request written / its reply awaited */
};

struct ctrld_pconn {
	char control[256];
	char token[256];
	uint32_t timeout_ms;
	bool unix_path;
	bool have_addr, numeric;
	struct sockaddr_in sa;
	int fd;
	enum phase ph;
	bool reused; /* the connection served a request before the head's */
	const char *wbuf;
	char *auth_line;
	size_t auth_len, wlen, woff;
	struct pbox_linebuf in;
	struct preq *head, *tail;
	uint32_t nq;
	struct preq *failed; /* not queued (queue full, out of memory): failed next turn */
	uint32_t nfailed;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Resolve the host of c->control into c->sa. 0 or -EINVAL. */
static int resolve(struct ctrld_pconn *c)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char host[256], port[8];
	uint16_t pn;

	if (pbox_hostport_split(c->control, false, 1, host, sizeof(host), &pn) != 0) {
		return -EINVAL;
	}
	snprintf(port, sizeof(port), "%u", pn);
	if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL) {
		return -EINVAL;
	}
	memcpy(&c->sa, ai->ai_addr, sizeof(c->sa));
	freeaddrinfo(ai);
	c->numeric = inet_pton(AF_INET, host, &(struct in_addr){ 0 }) == 1;
	c->have_addr = true;
	return 0;
}

struct ctrld_pconn *ctrld_pconn_new(const char *control, const char *admin_token,
				    uint32_t timeout_ms)
{
	struct ctrld_pconn *c = calloc(1, sizeof(*c));

	if (c == NULL) {
		return NULL;
	}
	snprintf(c->control, sizeof(c->control), "%s", control);
	snprintf(c->token, sizeof(c->token), "%s", admin_token ? admin_token : "");
	c->timeout_ms = timeout_ms;
	c->unix_path = control[0] == '/';
	c->fd = -1;
	c->ph = PH_CLOSED;
	pbox_linebuf_init(&c->in);
	if (!c->unix_path) {
		(void)resolve(c); /* retried at connect when it failed */
		if (c->token[0] != '\0') {
			json_t *auth =
				json_pack("{s:s, s:s}", "op", "auth", "admin_token", c->token);

			c->auth_line = auth ? pbox_ctl_encode(auth, &c->auth_len) : NULL;
			json_decref(auth);
			if (c->auth_line == NULL) {
				pbox_linebuf_free(&c->in);
				free(c);
				return NULL;
			}
		}
	}
	return c;
}

static void close_conn(struct ctrld_pconn *c)
{
	if (c->fd >= 0) {
		close(c->fd);
	}
	c->fd = -1;
	c->ph = PH_CLOSED;
	c->wbuf = NULL;
	c->wlen = c->woff = 0;
	c->reused = false;
	pbox_linebuf_free(&c->in);
	pbox_linebuf_init(&c->in);
}

/* Take the head request off the queue and complete it. */
static void complete_head(struct ctrld_pconn *c, int rc, json_t *reply, const char *err)
{
	struct preq *r = c->head;

	c->head = r->next;
	if (c->head == NULL) {
		c->tail = NULL;
	}
	c->nq--;
	r->done(r->arg, rc, rc == 0 ? reply : NULL, rc == 0 ? "" : err);
	free(r->line);
	free(r);
}

static void fail_head(struct ctrld_pconn *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fail_head(struct ctrld_pconn *c, int rc, const char *fmt, ...)
{
	char err[384];
	va_list ap;
	int n = snprintf(err, sizeof(err), "%s: ", c->control);

	va_start(ap, fmt);
	vsnprintf(err + n, sizeof(err) - (size_t)n, fmt, ap);
	va_end(ap);
	complete_head(c, rc, NULL, err);
}

static void fail_unqueued(struct ctrld_pconn *c);

void ctrld_pconn_cancel(struct ctrld_pconn *c)
{
	close_conn(c);
	while (c->head != NULL || c->failed != NULL) {
		fail_unqueued(c);
		if (c->head != NULL) {
			fail_head(c, -ECANCELED, "pbox-ctrld is stopping");
		}
	}
}

void ctrld_pconn_free(struct ctrld_pconn *c)
{
	if (c == NULL) {
		return;
	}
	ctrld_pconn_cancel(c);
	pbox_linebuf_free(&c->in);
	free(c->auth_line);
	free(c);
}

void ctrld_pconn_submit(struct ctrld_pconn *c, const json_t *req, ctrld_pconn_done_fn done,
			void *arg)
{
	struct preq *r = calloc(1, sizeof(*r));

	if (r == NULL) {
		/* done must run exactly once and cannot run from here: without even this
		 * record there is no way to keep that promise. */
		PBOX_LOG_ERR(ADMIN, "pboxd %s: out of memory queueing a request", c->control);
		abort();
	}
	r->done = done;
	r->arg = arg;
	r->deadline_ms = now_ms() + c->timeout_ms;
	if (c->nq >= CTRLD_PCONN_MAX_QUEUE) {
		r->len = 1; /* failed at the next turn: queue full */
	} else {
		r->line = req != NULL ? pbox_ctl_encode(req, &r->len) : NULL;
		if (r->line == NULL) {
			r->len = 0; /* failed at the next turn: out of memory */
		}
	}
	if (r->line == NULL) {
		r->next = c->failed;
		c->failed = r;
		c->nfailed++;
		return;
	}
	if (c->tail != NULL) {
		c->tail->next = r;
	} else {
		c->head = r;
	}
	c->tail = r;
	c->nq++;
}

uint32_t ctrld_pconn_pending(const struct ctrld_pconn *c)
{
	return c->nq + c->nfailed;
}

/* Complete the requests that could not be queued. */
static void fail_unqueued(struct ctrld_pconn *c)
{
	while (c->failed != NULL) {
		struct preq *r = c->failed;
		char err[384];

		c->failed = r->next;
		c->nfailed--;
		if (r->len == 1) {
			snprintf(err, sizeof(err),
				 "%s: %u requests queued for it already (not sent; retried or "
				 "refused)",
				 c->control, CTRLD_PCONN_MAX_QUEUE);
		} else {
			snprintf(err, sizeof(err), "%s: out of memory", c->control);
		}
		r->done(r->arg, r->len == 1 ? -ENOBUFS : -ENOMEM, NULL, err);
		free(r);
	}
}

void ctrld_pconn_pollfd(struct ctrld_pconn *c, struct pollfd *pfd, uint64_t *wake_ms)
{
	*pfd = (struct pollfd){ .fd = c->fd, .events = 0 };
	if (c->failed != NULL) {
		*wake_ms = 0;
	}
	switch (c->ph) {
	case PH_CLOSED:
		pfd->fd = -1;
		if (c->head != NULL) {
			*wake_ms = 0; /* connect now */
		}
		return;
	case PH_CONNECTING:
		pfd->events = POLLOUT;
		break;
	case PH_IDLE:
		pfd->events = POLLIN;
		if (c->head != NULL) {
			*wake_ms = 0;
		}
		break;
	case PH_AUTH:
	case PH_REQ:
		pfd->events = (short)(POLLIN | (c->woff < c->wlen ? POLLOUT : 0));
		break;
	}
	if (c->head != NULL) {
		*wake_ms = PBOX_MIN(*wake_ms, c->head->deadline_ms);
	}
}

/* Begin writing buf on the open connection. */
static void start_write(struct ctrld_pconn *c, enum phase ph, const char *buf, size_t len)
{
	c->ph = ph;
	c->wbuf = buf;
	c->wlen = len;
	c->woff = 0;
}

/* The connection is open (and authenticated): the next request goes out. */
static void opened(struct ctrld_pconn *c)
{
	if (c->auth_line != NULL) {
		start_write(c, PH_AUTH, c->auth_line, c->auth_len);
	} else {
		c->ph = PH_IDLE;
	}
}

/* Start a connection for the head request. 0 (connecting or open) or -errno (the head
 * failed with its cause). */
static int start_connect(struct ctrld_pconn *c)
{
	int rc;

	if (c->unix_path) {
		struct sockaddr_un su = { .sun_family = AF_UNIX };

		if (strlen(c->control) >= sizeof(su.sun_path)) {
			fail_head(c, -ENAMETOOLONG, "path too long for a Unix socket");
			return -ENAMETOOLONG;
		}
		memcpy(su.sun_path, c->control, strlen(c->control) + 1);
		c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&su, sizeof(su)) != 0) {
			rc = -errno;
			close_conn(c);
			fail_head(c, rc, "cannot connect: %s%s", strerror(-rc),
				  rc == -ENOENT || rc == -ECONNREFUSED
					  ? " (is pboxd running, with this control_socket?)"
					  : "");
			return rc;
		}
		opened(c);
		return 0;
	}
	if (!c->have_addr && resolve(c) != 0) {
		fail_head(c, -EINVAL, "expected HOST:PORT with a host that resolves");
		return -EINVAL;
	}
	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->fd < 0) {
		rc = -errno;
		close_conn(c);
		fail_head(c, rc, "socket: %s", strerror(-rc));
		return rc;
	}
	if (connect(c->fd, (struct sockaddr *)&c->sa, sizeof(c->sa)) == 0) {
		opened(c);
		return 0;
	}
	if (errno == EINPROGRESS) {
		c->ph = PH_CONNECTING;
		return 0;
	}
	rc = -errno;
	close_conn(c);
	c->have_addr = c->numeric;
	fail_head(c, rc, "cannot connect: %s%s", strerror(-rc),
		  rc == -ECONNREFUSED ? " (is the daemon running, with this control address?)"
				      : "");
	return rc;
}

/* Write what is left of wbuf. 0, or -errno (the connection failed). */
static int flush(struct ctrld_pconn *c)
{
	while (c->woff < c->wlen) {
		ssize_t w = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (w < 0) {
			return errno == EAGAIN || errno == EINTR ? 0 : -errno;
		}
		c->woff += (size_t)w;
	}
	return 0;
}

/* The connection broke while the head was in flight (rc; how). A reused connection that
 * the pboxd closed before answering anything gets the head once more on a new one. */
static void broke(struct ctrld_pconn *c, int rc, const char *how)
{
	bool retry = c->ph == PH_REQ && c->reused && pbox_linebuf_pending(&c->in) == 0 &&
		     !c->head->retried && (rc == -ECONNRESET || rc == -EPIPE);

	close_conn(c);
	if (retry) {
		c->head->retried = true;
		return;
	}
	fail_head(c, rc, "%s", how);
}

/* Read what came; complete the head with its reply. */
static void read_replies(struct ctrld_pconn *c)
{
	long n = pbox_linebuf_fill(&c->in, c->fd);
	char *line;

	while ((line = pbox_linebuf_next(&c->in)) != NULL) {
		json_error_t jerr;
		json_t *o = json_loads(line, 0, &jerr);

		if (o == NULL) {
			char why[256];

			snprintf(why, sizeof(why), "the reply is not JSON: %s", jerr.text);
			if (c->ph == PH_IDLE) {
				close_conn(c);
				return;
			}
			close_conn(c);
			fail_head(c, -EPROTO, "%s", why);
			return;
		}
		if (json_object_get(o, "event") != NULL || c->ph == PH_IDLE) {
			json_decref(o); /* unsolicited; not an answer */
			continue;
		}
		if (c->ph == PH_AUTH) {
			if (!json_is_true(json_object_get(o, "ok"))) {
				/* The refusal is the reply (as ctlclient.h does). */
				close_conn(c);
				complete_head(c, 0, o, "");
				json_decref(o);
				return;
			}
			json_decref(o);
			c->ph = PH_IDLE;
			continue;
		}
		/* PH_REQ: the head's answer. */
		c->ph = PH_IDLE;
		c->reused = true;
		c->wbuf = NULL;
		c->wlen = c->woff = 0;
		complete_head(c, 0, o, "");
		json_decref(o);
		return; /* the next one is started by the caller */
	}
	if (n == 0) {
		if (c->ph == PH_IDLE) {
			close_conn(c); /* closed while idle: a new one for the next request */
		} else {
			broke(c, -ECONNRESET, "the connection was closed without a reply");
		}
	} else if (n < 0 && n != -EAGAIN) {
		char how[160];

		snprintf(how, sizeof(how), "reading the reply: %s", strerror((int)-n));
		if (c->ph == PH_IDLE) {
			close_conn(c);
		} else {
			broke(c, (int)n, how);
		}
	}
}

void ctrld_pconn_process(struct ctrld_pconn *c, short revents)
{
	uint64_t now = now_ms();

	/* Requests that could not be queued, and those that waited too long (the queue is
	 * in deadline order). */
	fail_unqueued(c);
	while (c->head != NULL && c->head->deadline_ms <= now) {
		if (c->ph == PH_CONNECTING) {
			close_conn(c);
			fail_head(c, -ETIMEDOUT, "cannot connect: no answer within %u ms",
				  c->timeout_ms);
		} else if (c->ph == PH_AUTH || c->ph == PH_REQ) {
			close_conn(c);
			fail_head(c, -ETIMEDOUT, "no reply within %u ms", c->timeout_ms);
		} else {
			fail_head(
				c, -ETIMEDOUT,
				"no reply within %u ms (it waited behind earlier requests to this "
				"pboxd)",
				c->timeout_ms);
		}
	}
	if (c->ph == PH_CONNECTING && (revents & (POLLOUT | POLLERR | POLLHUP))) {
		int soerr = 0;
		socklen_t sl = sizeof(soerr);

		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) {
			soerr = errno;
		}
		if (soerr != 0) {
			close_conn(c);
			c->have_addr = c->numeric;
			if (c->head != NULL) {
				fail_head(c, -soerr, "cannot connect: %s%s", strerror(soerr),
					  soerr == ECONNREFUSED ? " (is the daemon running, with "
								  "this control address?)"
								: "");
			}
		} else {
			opened(c);
		}
	}
	/* Bounded: every round either completes a request or waits for the socket. */
	for (int rounds = 0; rounds < 64; rounds++) {
		enum phase before = c->ph;
		uint32_t nq = c->nq;

		if (c->ph == PH_CLOSED) {
			if (c->head == NULL) {
				return;
			}
			(void)start_connect(c);
		} else if (c->ph == PH_IDLE) {
			if (c->head != NULL) {
				start_write(c, PH_REQ, c->head->line, c->head->len);
			} else if (revents & (POLLIN | POLLHUP | POLLERR)) {
				read_replies(c); /* events, or the pboxd closed it */
				return;
			} else {
				return;
			}
		}
		if (c->ph == PH_AUTH || c->ph == PH_REQ) {
			int rc = flush(c);

			if (rc != 0) {
				char how[160];

				snprintf(how, sizeof(how), "sending the request: %s",
					 strerror(-rc));
				broke(c, rc, how);
				continue;
			}
			read_replies(c);
		}
		if (c->ph == before && c->nq == nq) {
			return; /* waiting for the socket */
		}
	}
}
