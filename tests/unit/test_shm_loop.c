/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The core loop's second poller (struct pbox_loop_poller, core/loop.h), as the shared-
 * memory rings use it beside a transport, with a scripted transport and poller on the
 * test's thread:
 *  - the poller runs after rx in every iteration, and its BUSY makes the iteration busy
 *    (no sleep after it);
 *  - before sleeping the loop asks the poller: -1 means the transport's own wait, a
 *    descriptor means wait_fd on it (then sleep_end), -EAGAIN means no sleep at all;
 *  - a transport without wait_fd sleeps idle_sleep_us instead, and sleep_end still runs;
 *  - output the transport holds back (tx_due_ns, a result pacer) bounds every wait, the
 *    poller's included: due within a millisecond, no sleep at all (a pacer's results once
 *    waited for the next input or the 100 ms timeout while local workers were connected).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <urcu-qsbr.h>

#include "core/loop.h"

#define LOG_MAX 64

struct script {
	char log[LOG_MAX + 1];
	unsigned nlog;
	unsigned rx_calls, polls, prepares;
	unsigned stop_after_rx;
	unsigned busy_poll_at; /* the poll call that finds input (1-based; 0: none) */
	int prepare_rc[8];     /* sleep_prepare's answers, in order (then -1) */
	int fd_waited, ms_waited;
	int ms_waited_plain; /* the transport's own wait */
	unsigned ndue;
	uint64_t due[8]; /* tx_due_ns's answers, in order (then UINT64_MAX) */
};

static void note(struct script *s, char c)
{
	if (s->nlog < LOG_MAX) {
		s->log[s->nlog++] = c;
		s->log[s->nlog] = '\0';
	}
}

static enum pbox_poll_rc s_rx(void *xc, struct pbox_loop *l)
{
	struct script *s = xc;

	note(s, 'r');
	if (++s->rx_calls == s->stop_after_rx) {
		pbox_loop_stop(l);
	}
	return PBOX_POLL_IDLE;
}

static bool s_wait(void *xc, int timeout_ms)
{
	struct script *s = xc;

	note(s, 'w');
	s->ms_waited_plain = timeout_ms;
	return false;
}

static uint64_t s_due(void *xc)
{
	struct script *s = xc;
	unsigned i = s->ndue++;

	note(s, 'd');
	return i < PBOX_ARRAY_SIZE(s->due) ? s->due[i] : UINT64_MAX;
}

static bool s_wait_fd(void *xc, int timeout_ms, int fd)
{
	struct script *s = xc;

	note(s, 'W');
	s->fd_waited = fd;
	s->ms_waited = timeout_ms;
	return false;
}

static enum pbox_poll_rc p_poll(void *arg, struct pbox_loop *l)
{
	struct script *s = arg;

	(void)l;
	if (++s->polls == s->busy_poll_at) {
		note(s, 'P');
		return PBOX_POLL_BUSY;
	}
	note(s, 'p');
	return PBOX_POLL_IDLE;
}

static int p_prepare(void *arg)
{
	struct script *s = arg;
	unsigned i = s->prepares++;

	note(s, '?');
	return i < PBOX_ARRAY_SIZE(s->prepare_rc) ? s->prepare_rc[i] : -1;
}

static void p_end(void *arg)
{
	note(arg, 's');
}

static const struct pbox_loop_poller poller = {
	.poll = p_poll,
	.sleep_prepare = p_prepare,
	.sleep_end = p_end,
};

static struct pbox_jobtab *no_table;

static void run(struct script *s, const struct pbox_loop_ops *ops, struct pbox_core_stats *st)
{
	struct pbox_engine e = { .stats = st };
	struct pbox_loop l = {
		.ops = ops,
		.poller = &poller,
		.poller_arg = s,
		.xc = s,
		.engine = &e,
		.tab = &no_table,
		.wait_ms = 100,
		.idle_sleep_us = 10,
	};

	memset(st, 0, sizeof(*st));
	pbox_loop_run(&l);
}

static void test_poller_and_waits(void **state)
{
	static const struct pbox_loop_ops ops = { .rx = s_rx,
						  .wait = s_wait,
						  .wait_fd = s_wait_fd };
	struct script s = { .stop_after_rx = 5,
			    .busy_poll_at = 1,
			    .prepare_rc = { -1, 7, -EAGAIN } };
	struct pbox_core_stats st;

	(void)state;
	run(&s, &ops, &st);
	/* busy first pass: no sleep; then the transport's wait; wait_fd on the poller's
	 * descriptor and sleep_end; no sleep at all; the stop ends the last pass. */
	assert_string_equal(s.log, "rPrp?wrp?Wsrp?rp");
	assert_int_equal(s.fd_waited, 7);
	assert_int_equal(s.ms_waited, 100);
	assert_int_equal(pbox_stat_read(&st.polls), 5);
	assert_true(pbox_stat_read(&st.busy_cycles) > 0);
	assert_true(pbox_stat_read(&st.idle_cycles) > 0);
}

static void test_no_wait_fd_hook_sleeps(void **state)
{
	static const struct pbox_loop_ops ops = { .rx = s_rx };
	struct script s = { .stop_after_rx = 3, .prepare_rc = { 7, -1 } };
	struct pbox_core_stats st;

	(void)state;
	run(&s, &ops, &st);
	/* A descriptor but no wait_fd: idle_sleep_us, then sleep_end; -1: the same sleep. */
	assert_string_equal(s.log, "rp?srp?rp");
	assert_int_equal(pbox_stat_read(&st.polls), 3);
}

static void test_held_output_bounds_waits(void **state)
{
	static const struct pbox_loop_ops ops = {
		.rx = s_rx, .wait = s_wait, .wait_fd = s_wait_fd, .tx_due_ns = s_due
	};
	struct script s = { .stop_after_rx = 5,
			    .prepare_rc = { 7, -1, 7 },
			    .due = { 500000, 30000000, 12999999, UINT64_MAX } };
	struct pbox_core_stats st;

	(void)state;
	run(&s, &ops, &st);
	/* Due in 0.5 ms: no sleep (and the poller is not armed); due in 30 ms: wait_fd on the
	 * poller's descriptor for 30 ms, not 100; 12.999 ms: the transport's own wait for 12
	 * (it wakes early, then polls); nothing held: wait_fd for the whole 100 ms. */
	assert_string_equal(s.log, "rpdrpd?Wsrpd?wrpd?Wsrp");
	assert_int_equal(s.ms_waited_plain, 12);
	assert_int_equal(s.ms_waited, 100);
	assert_int_equal(pbox_stat_read(&st.polls), 5);
}

static void test_held_output_ms(void **state)
{
	static const struct pbox_loop_ops ops = {
		.rx = s_rx, .wait = s_wait, .wait_fd = s_wait_fd, .tx_due_ns = s_due
	};
	struct script s = { .stop_after_rx = 2, .prepare_rc = { 7 }, .due = { 30000000 } };
	struct pbox_core_stats st;

	(void)state;
	run(&s, &ops, &st);
	assert_string_equal(s.log, "rpd?Wsrp");
	assert_int_equal(s.fd_waited, 7);
	assert_int_equal(s.ms_waited, 30);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_poller_and_waits),
		cmocka_unit_test(test_no_wait_fd_hook_sleeps),
		cmocka_unit_test(test_held_output_bounds_waits),
		cmocka_unit_test(test_held_output_ms),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
