/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's non-blocking requests to a pboxd (ctrlplane/ctrld/pboxd_conn.h), against a
 * fake pboxd driven by the test in the same thread: the admin token is proved once and
 * the connection kept for the next request; unsolicited events are skipped; a request
 * without a reply fails after the timeout with the address and the cause (and the
 * connection is closed); requests beyond the queue's bound fail at once (-ENOBUFS); a
 * refused auth is the reply; a connection the pboxd closed while idle is replaced; nothing
 * listening fails with "cannot connect"; cancel completes every queued request.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pboxd_conn.h"

struct result {
	int calls;
	int rc;
	json_t *reply;
	char err[384];
};

static void done(void *arg, int rc, json_t *reply, const char *err)
{
	struct result *r = arg;

	r->calls++;
	r->rc = rc;
	json_decref(r->reply);
	r->reply = reply != NULL ? json_incref(reply) : NULL;
	snprintf(r->err, sizeof(r->err), "%s", err);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Turn c's state machine for ms (or until *stop becomes nonzero). */
static void pump(struct ctrld_pconn *c, int ms, const int *stop)
{
	uint64_t end = mono_ms() + (uint64_t)ms;

	while (mono_ms() < end && (stop == NULL || *stop == 0)) {
		struct pollfd p;
		uint64_t wake = UINT64_MAX;

		ctrld_pconn_pollfd(c, &p, &wake);
		(void)poll(&p, 1, 5);
		ctrld_pconn_process(c, p.revents);
	}
}

static int listener(uint16_t *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 8), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	*port = ntohs(sa.sin_port);
	return fd;
}

/* Accept the client's connection, turning c meanwhile. */
static int accept_one(struct ctrld_pconn *c, int lfd)
{
	for (int i = 0; i < 400; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);

		if (fd >= 0) {
			return fd;
		}
		pump(c, 5, NULL);
	}
	fail_msg("no connection from the client");
	return -1;
}

/* Read one line from the fake pboxd's side into buf, turning c meanwhile. */
static void read_line(struct ctrld_pconn *c, int fd, char *buf, size_t len)
{
	size_t n = 0;

	for (int i = 0; i < 400; i++) {
		ssize_t r = recv(fd, buf + n, 1, 0);

		if (r == 1) {
			if (buf[n] == '\n') {
				buf[n] = '\0';
				return;
			}
			n++;
			assert_true(n < len);
			continue;
		}
		assert_true(r < 0 && errno == EAGAIN);
		pump(c, 5, NULL);
	}
	fail_msg("no line from the client");
}

static void say(int fd, const char *s)
{
	assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

static json_t *req_list(void)
{
	return json_pack("{s:s}", "op", "job_list");
}

static void test_auth_persistent_events(void **state)
{
	uint16_t port;
	int lfd = listener(&port), s, extra;
	char addr[64], line[512];
	struct result r1 = { 0 }, r2 = { 0 };
	struct ctrld_pconn *c;
	json_t *req = req_list();

	(void)state;
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	c = ctrld_pconn_new(addr, "tok", 2000);
	assert_non_null(c);
	ctrld_pconn_submit(c, req, done, &r1);
	assert_int_equal(r1.calls, 0); /* never from submit */
	assert_int_equal(ctrld_pconn_pending(c), 1);
	s = accept_one(c, lfd);
	read_line(c, s, line, sizeof(line));
	assert_non_null(strstr(line, "\"auth\""));
	assert_non_null(strstr(line, "\"tok\""));
	say(s, "{\"ok\":true}\n");
	read_line(c, s, line, sizeof(line));
	assert_non_null(strstr(line, "job_list"));
	say(s, "{\"event\":\"noise\"}\n{\"ok\":true,\"n\":1}\n");
	pump(c, 1000, &r1.calls);
	assert_int_equal(r1.calls, 1);
	assert_int_equal(r1.rc, 0);
	assert_int_equal(json_integer_value(json_object_get(r1.reply, "n")), 1);
	/* The second request goes on the same connection, without a new auth. */
	ctrld_pconn_submit(c, req, done, &r2);
	read_line(c, s, line, sizeof(line));
	assert_non_null(strstr(line, "job_list"));
	extra = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
	assert_true(extra < 0);
	say(s, "{\"ok\":true,\"n\":2}\n");
	pump(c, 1000, &r2.calls);
	assert_int_equal(r2.rc, 0);
	assert_int_equal(json_integer_value(json_object_get(r2.reply, "n")), 2);
	assert_int_equal(ctrld_pconn_pending(c), 0);
	ctrld_pconn_free(c);
	close(s);
	close(lfd);
	json_decref(req);
	json_decref(r1.reply);
	json_decref(r2.reply);
}

static void test_timeout_and_queue_bound(void **state)
{
	uint16_t port;
	int lfd = listener(&port), s;
	char addr[64], line[512], b;
	struct result first = { 0 }, *rest = calloc(CTRLD_PCONN_MAX_QUEUE, sizeof(*rest));
	struct ctrld_pconn *c;
	json_t *req = req_list();
	uint64_t t0;

	(void)state;
	assert_non_null(rest);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	c = ctrld_pconn_new(addr, NULL, 300);
	t0 = mono_ms();
	ctrld_pconn_submit(c, req, done, &first);
	for (uint32_t i = 0; i < CTRLD_PCONN_MAX_QUEUE; i++) {
		ctrld_pconn_submit(c, req, done, &rest[i]);
	}
	/* The request beyond the bound fails at the next turn, the others wait. */
	ctrld_pconn_process(c, 0);
	assert_int_equal(rest[CTRLD_PCONN_MAX_QUEUE - 1].calls, 1);
	assert_int_equal(rest[CTRLD_PCONN_MAX_QUEUE - 1].rc, -ENOBUFS);
	assert_int_equal(first.calls, 0);
	s = accept_one(c, lfd);
	read_line(c, s, line, sizeof(line)); /* never answered */
	pump(c, 2000, &first.calls);
	assert_int_equal(first.rc, -ETIMEDOUT);
	assert_true(mono_ms() - t0 >= 290);
	assert_non_null(strstr(first.err, addr));
	assert_non_null(strstr(first.err, "no reply within 300 ms"));
	/* The connection of the request that timed out is closed. */
	for (int i = 0; i < 200 && recv(s, &b, 1, 0) < 0; i++) {
		usleep(5000);
	}
	assert_int_equal(recv(s, &b, 1, 0), 0);
	/* The queued ones waited as long: they fail too (queued time counts). */
	pump(c, 100, NULL);
	assert_int_equal(rest[0].calls, 1);
	assert_int_equal(rest[0].rc, -ETIMEDOUT);
	ctrld_pconn_cancel(c);
	for (uint32_t i = 0; i < CTRLD_PCONN_MAX_QUEUE; i++) {
		assert_int_equal(rest[i].calls, 1);
		json_decref(rest[i].reply);
	}
	assert_int_equal(ctrld_pconn_pending(c), 0);
	ctrld_pconn_free(c);
	close(s);
	close(lfd);
	json_decref(req);
	free(rest);
}

static void test_refused_auth_idle_close_no_listener(void **state)
{
	uint16_t port;
	int lfd = listener(&port), s;
	char addr[64], line[512];
	struct result r = { 0 }, r2 = { 0 }, r3 = { 0 };
	struct ctrld_pconn *c;
	json_t *req = req_list();

	(void)state;
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	c = ctrld_pconn_new(addr, "wrong", 2000);
	ctrld_pconn_submit(c, req, done, &r);
	s = accept_one(c, lfd);
	read_line(c, s, line, sizeof(line));
	say(s, "{\"ok\":false,\"errno\":13,\"error\":\"wrong admin token\"}\n");
	pump(c, 1000, &r.calls);
	assert_int_equal(r.rc, 0);
	assert_false(json_is_true(json_object_get(r.reply, "ok")));
	close(s);
	ctrld_pconn_free(c);
	/* Closed by the pboxd while idle: the next request goes on a new connection. */
	c = ctrld_pconn_new(addr, NULL, 2000);
	ctrld_pconn_submit(c, req, done, &r2);
	s = accept_one(c, lfd);
	read_line(c, s, line, sizeof(line));
	say(s, "{\"ok\":true}\n");
	pump(c, 1000, &r2.calls);
	assert_int_equal(r2.rc, 0);
	close(s);
	pump(c, 50, NULL);
	json_decref(r2.reply);
	memset(&r2, 0, sizeof(r2));
	ctrld_pconn_submit(c, req, done, &r2);
	s = accept_one(c, lfd);
	read_line(c, s, line, sizeof(line));
	say(s, "{\"ok\":true,\"again\":1}\n");
	pump(c, 1000, &r2.calls);
	assert_int_equal(r2.rc, 0);
	assert_int_equal(json_integer_value(json_object_get(r2.reply, "again")), 1);
	close(s);
	ctrld_pconn_free(c);
	/* Nothing listens there any more. */
	close(lfd);
	c = ctrld_pconn_new(addr, NULL, 2000);
	ctrld_pconn_submit(c, req, done, &r3);
	pump(c, 1000, &r3.calls);
	assert_int_equal(r3.rc, -ECONNREFUSED);
	assert_non_null(strstr(r3.err, "cannot connect"));
	ctrld_pconn_free(c);
	json_decref(req);
	json_decref(r.reply);
	json_decref(r2.reply);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_auth_persistent_events),
		cmocka_unit_test(test_timeout_and_queue_bound),
		cmocka_unit_test(test_refused_auth_idle_close_no_listener),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
