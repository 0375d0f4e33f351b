/* SPDX-License-Identifier: BSD-3-Clause */
/* Command-line numbers (common/args.h, common/numlist.h): accepted forms, and every
 * malformed one refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/args.h"
#include "common/numlist.h"

static void test_accepts(void **state)
{
	uint64_t v[4];

	(void)state;
	assert_int_equal(pbox_parse_u64_list("7", v, 4, 1, 100), 1);
	assert_int_equal(v[0], 7);
	assert_int_equal(pbox_parse_u64_list("1,100,42", v, 4, 1, 100), 3);
	assert_int_equal(v[0], 1);
	assert_int_equal(v[1], 100);
	assert_int_equal(v[2], 42);
	assert_int_equal(pbox_parse_u64_list("18446744073709551615", v, 1, 0, UINT64_MAX), 1);
	assert_true(v[0] == UINT64_MAX);
}

static void test_refuses(void **state)
{
	static const struct {
		const char *s;
		uint64_t hi; /* items are accepted in [1, hi] */
	} bad[] = {
		{ "", 100 },
		{ ",", 100 },
		{ "1,", 100 },
		{ ",1", 100 },
		{ "1,,2", 100 },
		{ "x", 100 },
		{ "1x", 100 },
		{ " 1", 100 },
		{ "-1", 100 },
		{ "+1", 100 },
		{ "0", 100 },
		{ "101", 100 },
		{ "1 ,2", 100 },
		{ "0x10", 100 },
		{ "1,2,3,4,5", 100 },
		{ "18446744073709551616", UINT64_MAX }, /* overflows even the widest bound */
	};
	uint64_t v[4];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (pbox_parse_u64_list(bad[i].s, v, 4, 1, bad[i].hi) != -EINVAL) {
			fail_msg("accepted \"%s\"", bad[i].s);
		}
	}
}

static void test_args_accept(void **state)
{
	uint64_t u;
	uint32_t w;
	double d;

	(void)state;
	assert_int_equal(pbox_arg_u64("t", "--n", "18446744073709551615", 0, UINT64_MAX, &u), 0);
	assert_true(u == UINT64_MAX);
	assert_int_equal(pbox_arg_u32("t", "--n", "60000", 1, 60000, &w), 0);
	assert_int_equal(w, 60000);
	assert_int_equal(pbox_arg_double("t", "--x", "0.5", 0, 1, &d), 0);
	assert_true(d == 0.5);
	assert_int_equal(pbox_arg_double("t", "--x", "-1e-3", -1, 1, &d), 0);
	assert_true(d == -1e-3);
	assert_int_equal(pbox_arg_size("t", "--s", "32K", 1, UINT64_MAX, &u), 0);
	assert_int_equal(u, 32768);
	assert_int_equal(pbox_arg_size("t", "--s", "256m", 1, UINT64_MAX, &u), 0);
	assert_int_equal(u, 256u << 20);
	assert_int_equal(pbox_arg_size("t", "--s", "3G", 1, UINT64_MAX, &u), 0);
	assert_true(u == 3ull << 30);
	assert_int_equal(pbox_arg_size("t", "--s", "64", 1, UINT64_MAX, &u), 0);
	assert_int_equal(u, 64);
}

static void test_args_refuse(void **state)
{
	static const char *const bad_int[] = {
		"", "x", "5x", " 5", "5 ", "-5", "+5", "0x5", "11", "0", "18446744073709551616",
	};
	static const char *const bad_real[] = {
		"", "x", "0.5x", " 0.5", "nan", "inf", "2", "-0.1"
	};
	static const char *const bad_size[] = {
		"", "K", "1KB", "1T", "-1K", " 1K", "0", "17179869184G", "18446744073709551615K",
	};
	uint64_t u = 7;
	uint32_t w = 7;
	double d = 7;

	(void)state;
	for (size_t i = 0; i < sizeof(bad_int) / sizeof(bad_int[0]); i++) {
		if (pbox_arg_u64("t", "--n", bad_int[i], 1, 10, &u) != -EINVAL ||
		    pbox_arg_u32("t", "--n", bad_int[i], 1, 10, &w) != -EINVAL) {
			fail_msg("accepted integer \"%s\"", bad_int[i]);
		}
	}
	for (size_t i = 0; i < sizeof(bad_real) / sizeof(bad_real[0]); i++) {
		if (pbox_arg_double("t", "--x", bad_real[i], 0, 1, &d) != -EINVAL) {
			fail_msg("accepted number \"%s\"", bad_real[i]);
		}
	}
	for (size_t i = 0; i < sizeof(bad_size) / sizeof(bad_size[0]); i++) {
		if (pbox_arg_size("t", "--s", bad_size[i], 1, UINT64_MAX, &u) != -EINVAL) {
			fail_msg("accepted size \"%s\"", bad_size[i]);
		}
	}
	/* A refused value leaves the output alone. */
	assert_int_equal(u, 7);
	assert_int_equal(w, 7);
	assert_true(d == 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accepts),
		cmocka_unit_test(test_refuses),
		cmocka_unit_test(test_args_accept),
		cmocka_unit_test(test_args_refuse),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
