/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The core loop (dataplane/core/loop.h) with a scripted transport:
 *  - a core blocked in its wait hook is RCU-offline: synchronize_rcu() on another thread
 *    completes while it waits (a publish never waits for an idle core);
 *  - input the wait found is handled in the same iteration (rx right after the wait,
 *    then tx and end), and the iteration counts once in polls;
 *  - pbox_loop_stop wakes a blocked wait through the wake hook; fini runs once;
 *  - busy_poll never waits; every iteration is counted, idle cycles only;
 *  - without a wait hook an idle core sleeps idle_sleep_us (RCU-offline) per iteration.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <urcu-qsbr.h>

#include "core/loop.h"

#define LOG_MAX 64

/* The scripted transport: what the loop called, in order. */
struct fake {
	struct pbox_loop *l;
	char log[LOG_MAX + 1];
	unsigned nlog;
	unsigned rx_calls, waits, fini_calls;
	unsigned stop_after_rx; /* rx stops the loop at this call (0: never) */
	bool input;             /* the next rx finds input (set by the test in a wait) */
	sem_t in_wait, release;
	bool block_in_wait;
	const struct pbox_jobtab *tab_seen_in_end;
};

static void note(struct fake *f, char c)
{
	if (f->nlog < LOG_MAX) {
		f->log[f->nlog++] = c;
		f->log[f->nlog] = '\0';
	}
}

static enum pbox_poll_rc fake_rx(void *xc, struct pbox_loop *l)
{
	struct fake *f = xc;
	bool input = __atomic_exchange_n(&f->input, false, __ATOMIC_ACQ_REL);

	note(f, input ? 'R' : 'r');
	f->rx_calls++;
	if (f->stop_after_rx != 0 && f->rx_calls == f->stop_after_rx) {
		pbox_loop_stop(l);
	}
	if (input) {
		(void)pbox_loop_table(l);
		return PBOX_POLL_BUSY;
	}
	return PBOX_POLL_IDLE;
}

static void fake_tx(void *xc, struct pbox_loop *l, enum pbox_poll_rc rc)
{
	(void)l;
	note(xc, rc == PBOX_POLL_BUSY ? 'T' : 't');
}

static void fake_end(void *xc)
{
	note(xc, 'e');
}

static bool fake_wait(void *xc, int timeout_ms)
{
	struct fake *f = xc;

	assert_int_equal(timeout_ms, 100);
	note(f, 'w');
	f->waits++;
	if (f->block_in_wait) {
		sem_post(&f->in_wait);
		sem_wait(&f->release);
	}
	return true;
}

static void fake_wake(void *xc)
{
	struct fake *f = xc;

	sem_post(&f->release);
}

static void fake_fini(void *xc)
{
	struct fake *f = xc;

	note(f, 'f');
	f->fini_calls++;
}

static const struct pbox_loop_ops fake_ops = {
	.rx = fake_rx,
	.tx = fake_tx,
	.end = fake_end,
	.wait = fake_wait,
	.wake = fake_wake,
	.fini = fake_fini,
};

static struct pbox_jobtab *no_table;

static void *loop_thread(void *arg)
{
	pbox_loop_run(arg);
	return NULL;
}

static void *sync_thread(void *arg)
{
	sem_t *done = arg;

	synchronize_rcu();
	sem_post(done);
	return NULL;
}

static int sem_wait_s(sem_t *s, int seconds)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += seconds;
	return sem_timedwait(s, &ts) == 0 ? 0 : -errno;
}

static void setup_loop(struct pbox_loop *l, struct pbox_engine *e, struct pbox_core_stats *st,
		       struct fake *f, const struct pbox_loop_ops *ops)
{
	memset(st, 0, sizeof(*st));
	memset(e, 0, sizeof(*e));
	e->stats = st;
	*l = (struct pbox_loop){
		.ops = ops,
		.xc = f,
		.engine = e,
		.tab = &no_table,
		.wait_ms = 100,
	};
	f->l = l;
	sem_init(&f->in_wait, 0, 0);
	sem_init(&f->release, 0, 0);
}

static void test_wait_offline_same_iteration_stop(void **state)
{
	struct pbox_core_stats st;
	struct pbox_engine e;
	struct pbox_loop l;
	struct fake f = { .block_in_wait = true };
	pthread_t t, s;
	sem_t synced;

	(void)state;
	setup_loop(&l, &e, &st, &f, &fake_ops);
	sem_init(&synced, 0, 0);
	assert_int_equal(pthread_create(&t, NULL, loop_thread, &l), 0);

	/* Blocked in its first wait: a grace period completes without it. */
	assert_int_equal(sem_wait_s(&f.in_wait, 30), 0);
	assert_int_equal(pthread_create(&s, NULL, sync_thread, &synced), 0);
	assert_int_equal(sem_wait_s(&synced, 30), 0);
	pthread_join(s, NULL);

	/* Input arrives during the wait: handled in the same iteration. */
	__atomic_store_n(&f.input, true, __ATOMIC_RELEASE);
	sem_post(&f.release);
	assert_int_equal(sem_wait_s(&f.in_wait, 30), 0); /* the next iteration's wait */
	assert_string_equal(f.log, "rtewRTertew");
	assert_int_equal(pbox_stat_read(&st.polls), 1);
	assert_true(pbox_stat_read(&st.busy_cycles) > 0);
	assert_true(pbox_stat_read(&st.idle_cycles) > 0);

	/* Stop wakes the blocked wait (no post of ours); fini once, after the loop. */
	pbox_loop_stop(&l);
	pthread_join(t, NULL);
	assert_int_equal(f.fini_calls, 1);
	assert_int_equal(f.log[f.nlog - 1], 'f');
	assert_int_equal(pbox_stat_read(&st.polls), 2);
	assert_null(l.cur_tab);
	sem_destroy(&synced);
}

static void test_busy_poll_never_waits(void **state)
{
	struct pbox_core_stats st;
	struct pbox_engine e;
	struct pbox_loop l;
	struct fake f = { .stop_after_rx = 20 };

	(void)state;
	setup_loop(&l, &e, &st, &f, &fake_ops);
	l.busy_poll = true;
	pbox_loop_run(&l);
	assert_int_equal(f.waits, 0);
	assert_int_equal(f.rx_calls, 20);
	assert_int_equal(pbox_stat_read(&st.polls), 20);
	assert_int_equal(pbox_stat_read(&st.busy_cycles), 0);
	assert_true(pbox_stat_read(&st.idle_cycles) > 0);
	assert_int_equal(f.fini_calls, 1);
}

static void test_sleep_without_wait_hook(void **state)
{
	static const struct pbox_loop_ops no_wait = {
		.rx = fake_rx,
		.fini = fake_fini,
	};
	struct pbox_core_stats st;
	struct pbox_engine e;
	struct pbox_loop l;
	struct fake f = { .stop_after_rx = 5 };
	struct timespec a, b;
	double ms;

	(void)state;
	setup_loop(&l, &e, &st, &f, &no_wait);
	l.idle_sleep_us = 2000;
	clock_gettime(CLOCK_MONOTONIC, &a);
	pbox_loop_run(&l);
	clock_gettime(CLOCK_MONOTONIC, &b);
	ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	/* Four full sleeps at least (the fifth rx stops the loop before it sleeps). */
	assert_true(ms >= 4 * 2.0);
	assert_int_equal(f.rx_calls, 5);
	assert_int_equal(pbox_stat_read(&st.polls), 5);
	assert_int_equal(f.fini_calls, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wait_offline_same_iteration_stop),
		cmocka_unit_test(test_busy_poll_never_waits),
		cmocka_unit_test(test_sleep_without_wait_hook),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
