/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's descriptor budget (pboxd/fdbudget.h): one account for control connections, shm
 * connections and results' memfds under the open-file limit, read at every take; results'
 * memfds leave PBOXD_FD_CONN_HEADROOM for connections; refusals counted per class;
 * everything given back leaves the account as it was.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "pboxd/fdbudget.h"

static struct rlimit g_saved;

static void set_soft(rlim_t soft)
{
	struct rlimit rl = g_saved;

	rl.rlim_cur = soft;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

static json_int_t num(json_t *o, const char *a, const char *b)
{
	json_t *v = json_object_get(o, a);

	return json_integer_value(b != NULL ? json_object_get(v, b) : v);
}

static void test_one_account(void **state)
{
	json_t *st;
	char buf[200];

	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &g_saved), 0);
	if (g_saved.rlim_max != RLIM_INFINITY && g_saved.rlim_max < PBOXD_FD_RESERVE + 200) {
		skip();
	}
	set_soft(PBOXD_FD_RESERVE + 10);
	assert_int_equal(pboxd_fd_limit(), PBOXD_FD_RESERVE + 10);
	/* 10 free: 6 control connections and 2 shm connections fit, nothing more. */
	for (int i = 0; i < 6; i++) {
		assert_int_equal(pboxd_fd_take(PBOXD_FD_CONTROL, 1), 0);
	}
	assert_int_equal(pboxd_fd_take(PBOXD_FD_SHM, 2), 0);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_SHM, 2), 0);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_CONTROL, 1), -EMFILE);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_SHM, 2), -EMFILE);
	/* memfds leave the headroom for connections even with descriptors free */
	pboxd_fd_give(PBOXD_FD_SHM, 2);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_RESULTS, 1), -EMFILE);
	assert_non_null(strstr(pboxd_fd_explain(buf, sizeof(buf)),
			       "open-file limit 138: 128 reserved, control 6, shm 2, metrics 0, "
			       "results 0 held, 2 free"));
	/* a limit raised (or lowered) while running counts at the next take */
	set_soft(PBOXD_FD_RESERVE + 8 + PBOXD_FD_CONN_HEADROOM + 2);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_RESULTS, 1), 0);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_RESULTS, 1), 0);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_RESULTS, 1), -EMFILE);
	assert_int_equal(pboxd_fd_take(PBOXD_FD_CONTROL, 1), 0); /* connections still fit */
	set_soft(PBOXD_FD_RESERVE); /* below what is held: everything refused */
	assert_int_equal(pboxd_fd_take(PBOXD_FD_CONTROL, 1), -EMFILE);

	st = pboxd_fd_stats();
	assert_int_equal(num(st, "held", "control"), 7);
	assert_int_equal(num(st, "held", "shm"), 2);
	assert_int_equal(num(st, "held", "results"), 2);
	assert_int_equal(num(st, "refused", "control"), 2);
	assert_int_equal(num(st, "refused", "shm"), 1);
	assert_int_equal(num(st, "refused", "results"), 2);
	assert_int_equal(num(st, "free", NULL), 0);
	assert_int_equal(num(st, "reserve", NULL), PBOXD_FD_RESERVE);
	json_decref(st);

	pboxd_fd_give(PBOXD_FD_CONTROL, 7);
	pboxd_fd_give(PBOXD_FD_SHM, 2);
	pboxd_fd_give(PBOXD_FD_RESULTS, 2);
	set_soft(PBOXD_FD_RESERVE + 10);
	st = pboxd_fd_stats();
	assert_int_equal(num(st, "held", "control") + num(st, "held", "shm") +
				 num(st, "held", "results"),
			 0);
	assert_int_equal(num(st, "free", NULL), 10);
	json_decref(st);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &g_saved), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_account),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
