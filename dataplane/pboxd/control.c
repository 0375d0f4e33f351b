/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's control listener: JSON lines over TCP (see control.h). */
#include "control.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/ctlproto.h"
#include "common/log.h"

#define MAX_CONNS        4096
#define MAX_BAD_REQUESTS 8

struct conn {
	struct pboxd_member_ref ref; /* first: container_of from the sessions callback */
	int fd;
	struct pbox_linebuf in;
	unsigned bad;
	bool dead;
	struct conn *next;
};

struct pboxd_control {
	int lfd;
	uint16_t port;
	bool accepting;
	struct pboxd_sessions *sessions;
	pboxd_stats_fn stats;
	void *stats_arg;
	struct conn *conns;
	unsigned nconns;
};

static void send_obj(struct conn *c, const json_t *o)
{
	int rc;

	if (c->dead) {
		return;
	}
	rc = pbox_ctl_send(c->fd, o, 2000);
	if (rc < 0) {
		PBOX_LOG_WARN(ADMIN, "%s: cannot send: %s; closing", c->ref.peer, strerror(-rc));
		c->dead = true;
	}
}

static void send_event(struct pboxd_member_ref *ref, json_t *obj)
{
	send_obj((struct conn *)ref, obj);
}

static void kick(struct pboxd_member_ref *ref)
{
	((struct conn *)ref)->dead = true;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct pboxd_control *pboxd_control_open(const char *host, uint16_t port,
					 struct pboxd_sessions *sessions, pboxd_stats_fn stats,
					 void *stats_arg)
{
	struct pboxd_control *c = calloc(1, sizeof(*c));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	socklen_t sl = sizeof(sa);
	int one = 1;

	if (c == NULL) {
		return NULL;
	}
	c->sessions = sessions;
	c->stats = stats;
	c->stats_arg = stats_arg;
	c->accepting = true;
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		PBOX_LOG_ERR(ADMIN, "control address '%s' is not an IPv4 address", host);
		free(c);
		return NULL;
	}
	c->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->lfd < 0) {
		PBOX_LOG_ERR(ADMIN, "socket: %s", strerror(errno));
		free(c);
		return NULL;
	}
	setsockopt(c->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(c->lfd, 128) != 0) {
		PBOX_LOG_ERR(ADMIN, "cannot listen on %s:%u: %s", host, port, strerror(errno));
		close(c->lfd);
		free(c);
		return NULL;
	}
	getsockname(c->lfd, (struct sockaddr *)&sa, &sl);
	c->port = ntohs(sa.sin_port);
	PBOX_LOG_INFO(ADMIN, "control channel on tcp %s:%u", host, c->port);
	return c;
}

uint16_t pboxd_control_port(const struct pboxd_control *c)
{
	return c->port;
}

void pboxd_control_stop_accepting(struct pboxd_control *c)
{
	c->accepting = false;
}

static void conn_free(struct pboxd_control *ctl, struct conn *c)
{
	pboxd_sessions_disconnect(ctl->sessions, &c->ref);
	close(c->fd);
	pbox_linebuf_free(&c->in);
	free(c);
	ctl->nconns--;
}

void pboxd_control_close(struct pboxd_control *ctl)
{
	if (ctl == NULL) {
		return;
	}
	while (ctl->conns != NULL) {
		struct conn *c = ctl->conns;

		ctl->conns = c->next;
		conn_free(ctl, c);
	}
	close(ctl->lfd);
	free(ctl);
}

unsigned pboxd_control_pollfds(struct pboxd_control *ctl, struct pollfd *p, unsigned max)
{
	unsigned n = 0;

	if (max == 0) {
		return 0;
	}
	p[n++] = (struct pollfd){ .fd = ctl->accepting ? ctl->lfd : -1, .events = POLLIN };
	for (struct conn *c = ctl->conns; c != NULL && n < max; c = c->next) {
		p[n++] = (struct pollfd){ .fd = c->fd, .events = POLLIN };
	}
	return n;
}

static void accept_all(struct pboxd_control *ctl)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(ctl->lfd, (struct sockaddr *)&sa, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct conn *c;
		char ip[INET_ADDRSTRLEN];
		int one = 1;

		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				PBOX_LOG_WARN(ADMIN, "accept: %s", strerror(errno));
			}
			return;
		}
		if (ctl->nconns >= MAX_CONNS) {
			PBOX_LOG_WARN(ADMIN, "refusing a connection: %u already open", ctl->nconns);
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (c == NULL) {
			close(fd);
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->fd = fd;
		pbox_linebuf_init(&c->in);
		inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
		snprintf(c->ref.peer, sizeof(c->ref.peer), "%s:%u", ip, ntohs(sa.sin_port));
		c->ref.send_event = send_event;
		c->ref.kick = kick;
		c->ref.last_seen_ms = now_ms();
		c->next = ctl->conns;
		ctl->conns = c;
		ctl->nconns++;
	}
}

static void handle_line(struct pboxd_control *ctl, struct conn *c, const char *line)
{
	json_error_t jerr;
	json_t *req = json_loads(line, 0, &jerr), *resp;
	const char *op;

	if (req == NULL || !json_is_object(req)) {
		resp = pbox_ctl_error(EINVAL, "not a JSON object: %s",
				      req ? "wrong type" : jerr.text);
		c->bad++;
		goto out;
	}
	op = json_string_value(json_object_get(req, "op"));
	c->ref.last_seen_ms = now_ms();
	if (op != NULL && strcmp(op, "ping") == 0) {
		/* Heartbeat (last_seen_ms stamped above): no answer, so it never interleaves
		 * with request/response. */
		json_decref(req);
		return;
	}
	if (op == NULL) {
		resp = pbox_ctl_error(EINVAL, "request without an \"op\"");
		c->bad++;
	} else if (strcmp(op, "hello") == 0) {
		resp = pboxd_sessions_hello(ctl->sessions, &c->ref, req);
	} else if (strcmp(op, "register") == 0) {
		resp = pboxd_sessions_register(ctl->sessions, &c->ref, req);
	} else if (strcmp(op, "leave") == 0) {
		resp = pboxd_sessions_leave(ctl->sessions, &c->ref);
	} else if (strcmp(op, "stats") == 0) {
		resp = ctl->stats(ctl->stats_arg);
	} else {
		resp = pbox_ctl_error(EINVAL,
				      "unknown op '%s' (hello, register, leave, ping, stats)", op);
		c->bad++;
	}
out:
	send_obj(c, resp);
	json_decref(resp);
	json_decref(req);
	if (c->bad >= MAX_BAD_REQUESTS) {
		PBOX_LOG_WARN(ADMIN, "%s: %u malformed requests; closing", c->ref.peer, c->bad);
		c->dead = true;
	}
}

static void serve(struct pboxd_control *ctl, struct conn *c)
{
	long n = pbox_linebuf_fill(&c->in, c->fd);
	char *line;

	while (!c->dead && (line = pbox_linebuf_next(&c->in)) != NULL) {
		handle_line(ctl, c, line);
	}
	if (n == 0 || (n < 0 && n != -EAGAIN)) {
		if (n == -E2BIG) {
			json_t *e = pbox_ctl_error(E2BIG, "request line longer than %u bytes",
						   PBOX_CTL_MAX_LINE);

			send_obj(c, e);
			json_decref(e);
		}
		c->dead = true;
	}
}

void pboxd_control_tick(struct pboxd_control *ctl)
{
	pboxd_sessions_tick(ctl->sessions, now_ms());
}

void pboxd_control_handle(struct pboxd_control *ctl, const struct pollfd *p, unsigned n)
{
	struct conn **pp;

	for (unsigned i = 1; i < n; i++) {
		if (p[i].revents == 0) {
			continue;
		}
		for (struct conn *c = ctl->conns; c != NULL; c = c->next) {
			if (c->fd == p[i].fd) {
				serve(ctl, c);
				break;
			}
		}
	}
	if (n > 0 && (p[0].revents & POLLIN)) {
		accept_all(ctl);
	}
	/* Deferred removal: sessions callbacks above may have marked connections dead. */
	for (pp = &ctl->conns; *pp != NULL;) {
		struct conn *c = *pp;

		if (c->dead) {
			*pp = c->next;
			conn_free(ctl, c);
		} else {
			pp = &c->next;
		}
	}
}
