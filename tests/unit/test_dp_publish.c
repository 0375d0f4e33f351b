/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's data plane (dataplane.c, kernel-UDP transport, one core) publishing job tables
 * while a reader thread holds the old one and deliberately passes no quiescent state:
 *  - publish returns at once (it used to wait in synchronize_rcu() for that reader, and
 *    with it every control-channel request);
 *  - nothing the reader can still see is freed while it reads (the old table, its job
 *    entry, the job state and its arena: under ASan a use after free would be reported);
 *  - once the reader passes a quiescent state, the old table and the ended session's
 *    state are freed (by call_rcu and the reaper thread), and at stop the last table.
 * The reader stalls 3 s at most on its own, so a regression fails instead of hanging.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <urcu-qsbr.h>

#include "pboxd/dataplane.h"
#include "sim.h"

#define STALL_MS 3000u

struct reader {
	struct pboxd_dp *dp;
	pthread_t thread;
	bool holding; /* set by the reader: it has the table and passes no quiescent state */
	bool go_on;   /* set by the test: the reader may finish */
	uint32_t job_id;
	uint8_t arena_byte;
	bool timed_out;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* A data-plane reader that stops passing quiescent states while it holds the table. */
static void *reader_main(void *arg)
{
	struct reader *r = arg;
	const struct pbox_jobtab *tab;
	const struct pbox_job *job;
	uint64_t start;

	rcu_register_thread();
	tab = rcu_dereference(r->dp->tab);
	job = tab != NULL && tab->njobs == 1 ? tab->jobs[0] : NULL;
	__atomic_store_n(&r->holding, true, __ATOMIC_RELEASE);
	start = now_ms();
	while (!__atomic_load_n(&r->go_on, __ATOMIC_ACQUIRE)) {
		if (now_ms() - start > STALL_MS) {
			r->timed_out = true;
			break;
		}
		sleep_ms(1);
	}
	/* Still inside the read side: all of it must be intact. */
	if (job != NULL) {
		r->job_id = job->wire.id;
		r->arena_byte = ((const uint8_t *)job->state->core[0].arena)[100];
	}
	rcu_unregister_thread();
	return NULL;
}

static int start_dp(struct pboxd_dp *dp, struct pboxd_config *cfg)
{
	int rc = -EADDRINUSE;

	pboxd_config_defaults(cfg);
	cfg->ncores = 1;
	cfg->idle_us = 50;
	for (unsigned i = 0; i < 20 && rc == -EADDRINUSE; i++) {
		cfg->base_port = (uint16_t)(20000 + ((unsigned)getpid() * 7 + i * 131) % 40000);
		rc = pboxd_dp_start(dp, cfg);
	}
	return rc;
}

/* A table as pboxd's sessions build it: one malloc'd entry per job. */
static struct pbox_jobtab *table_with(const struct pbox_job *job, uint64_t generation)
{
	struct pbox_jobtab *t = calloc(1, sizeof(*t) + sizeof(t->jobs[0]));

	assert_non_null(t);
	t->generation = generation;
	if (job != NULL) {
		struct pbox_job *j = malloc(sizeof(*j));

		assert_non_null(j);
		*j = *job;
		t->jobs[0] = j;
		t->njobs = 1;
	}
	return t;
}

static void test_publish_does_not_wait(void **state)
{
	static const struct pbox_keyspec keys[] = { { 3, 5000 } };
	struct sim_job_cfg jc = {
		.nranks = 2,
		.ncores = 1,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct pboxd_config cfg;
	struct pboxd_dp dp;
	struct pboxd_dp_lifetime life;
	struct reader rd = { .dp = &dp };
	struct pbox_job job;
	struct pbox_job_state *st;
	struct sim s;
	uint64_t t0, took;

	(void)state;
	assert_int_equal(sim_init(&s, &jc), 0);
	assert_int_equal(start_dp(&dp, &cfg), 0);
	/* The session's state, as sessions.c makes it: one reference, the session's. */
	job = s.job;
	st = pbox_job_state_create(&job);
	assert_non_null(st);
	memset(st->core[0].arena, 0xc3, st->core[0].arena_bytes);
	job.state = st;
	assert_int_equal(pboxd_dp_publish(&dp, table_with(&job, 1)), 0);

	assert_int_equal(pthread_create(&rd.thread, NULL, reader_main, &rd), 0);
	while (!__atomic_load_n(&rd.holding, __ATOMIC_ACQUIRE)) {
		sleep_ms(1);
	}
	/* The session ends while the reader holds the old table. */
	t0 = now_ms();
	assert_int_equal(pboxd_dp_publish(&dp, table_with(NULL, 2)), 0);
	pbox_job_state_put(st);
	took = now_ms() - t0;
	if (took > 1000) {
		fail_msg("publish took %llu ms: it waited for the stalled reader",
			 (unsigned long long)took);
	}
	sleep_ms(100);
	pboxd_dp_lifetime_stats(&dp, &life);
	assert_int_equal(life.tables_freed, 0);
	assert_int_equal(life.states_freed, 0);

	__atomic_store_n(&rd.go_on, true, __ATOMIC_RELEASE);
	pthread_join(rd.thread, NULL);
	assert_false(rd.timed_out);
	assert_int_equal(rd.job_id, job.wire.id);
	assert_int_equal(rd.arena_byte, 0xc3);
	/* After the reader's quiescent state: the old table, then the state. */
	t0 = now_ms();
	do {
		sleep_ms(1);
		pboxd_dp_lifetime_stats(&dp, &life);
	} while ((life.tables_freed < 1 || life.states_freed < 1) && now_ms() - t0 < 10000);
	assert_int_equal(life.tables_freed, 1);
	assert_int_equal(life.states_freed, 1);
	assert_int_equal(life.publish_nomem, 0);
	pboxd_dp_stop(&dp); /* drops the last table */
	pboxd_dp_lifetime_stats(&dp, &life);
	assert_int_equal(life.tables_freed, 2);
	sim_fini(&s);
}

/* Stopping with a session still published frees everything: nothing leaks (LSan) and
 * nothing is freed twice (ASan). */
static void test_stop_with_session(void **state)
{
	static const struct pbox_keyspec keys[] = { { 1, 3000 } };
	struct sim_job_cfg jc = {
		.nranks = 1,
		.ncores = 1,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	struct pboxd_config cfg;
	struct pboxd_dp dp;
	struct pboxd_dp_lifetime life;
	struct pbox_job job;
	struct sim s;

	(void)state;
	assert_int_equal(sim_init(&s, &jc), 0);
	assert_int_equal(start_dp(&dp, &cfg), 0);
	job = s.job;
	job.state = pbox_job_state_create(&job);
	assert_non_null(job.state);
	assert_int_equal(pboxd_dp_publish(&dp, table_with(&job, 1)), 0);
	assert_int_equal(pboxd_dp_publish(&dp, table_with(&job, 2)), 0);
	pbox_job_state_put(job.state); /* the session's: the tables keep it */
	pboxd_dp_stop(&dp);
	pboxd_dp_lifetime_stats(&dp, &life);
	assert_int_equal(life.tables_freed, 2);
	assert_int_equal(life.states_freed, 1);
	sim_fini(&s);
}

/* Many publishes over a live core (membership churn): each returns in microseconds,
 * every retired table is freed, the state once, after its session's last table. Prints
 * the publish times (the number the README quotes). */
static void test_publish_churn(void **state)
{
	static const struct pbox_keyspec keys[] = { { 9, 20000 } };
	struct sim_job_cfg jc = {
		.nranks = 4,
		.ncores = 1,
		.keys = keys,
		.nkeys = 1,
		.chunk_bytes = 8192,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.no_nodes = true,
	};
	enum { N = 2000 };
	struct pboxd_config cfg;
	struct pboxd_dp dp;
	struct pboxd_dp_lifetime life;
	struct pbox_job job;
	struct sim s;
	uint64_t total_ns = 0, max_ns = 0, t0;

	(void)state;
	assert_int_equal(sim_init(&s, &jc), 0);
	assert_int_equal(start_dp(&dp, &cfg), 0);
	job = s.job;
	job.state = pbox_job_state_create(&job);
	assert_non_null(job.state);
	for (uint32_t i = 0; i < N; i++) {
		struct pbox_jobtab *t = table_with(&job, i + 1);
		struct timespec a, b;
		uint64_t ns;

		clock_gettime(CLOCK_MONOTONIC, &a);
		assert_int_equal(pboxd_dp_publish(&dp, t), 0);
		clock_gettime(CLOCK_MONOTONIC, &b);
		ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec -
		     (uint64_t)a.tv_nsec;
		total_ns += ns;
		max_ns = ns > max_ns ? ns : max_ns;
	}
	assert_int_equal(pboxd_dp_publish(&dp, table_with(NULL, N + 1)), 0);
	pbox_job_state_put(job.state);
	printf("publish with a live core: mean %.1f us, max %.1f us over %d\n",
	       (double)total_ns / N / 1e3, (double)max_ns / 1e3, N);
	t0 = now_ms();
	do {
		sleep_ms(1);
		pboxd_dp_lifetime_stats(&dp, &life);
	} while ((life.tables_freed < N || life.states_freed < 1) && now_ms() - t0 < 20000);
	assert_int_equal(life.tables_freed, N);
	assert_int_equal(life.states_freed, 1);
	pboxd_dp_stop(&dp);
	sim_fini(&s);
}

/* argv[1], if given: a cmocka test filter. */
int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_publish_does_not_wait),
		cmocka_unit_test(test_stop_with_session),
		cmocka_unit_test(test_publish_churn),
	};

	if (argc > 1) {
		cmocka_set_test_filter(argv[1]);
	}
	return cmocka_run_group_tests_name("dp_publish", tests, NULL, NULL);
}
