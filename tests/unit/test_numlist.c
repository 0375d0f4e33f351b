/* SPDX-License-Identifier: BSD-3-Clause */
/* Command-line number lists: accepted forms, and every malformed one refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

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
	static const char *const bad[] = {
		"",   ",",  "1,", ",1",  "1,,2", "x",    "1x",        " 1",
		"-1", "+1", "0",  "101", "1 ,2", "0x10", "1,2,3,4,5", "18446744073709551616",
	};
	uint64_t v[4];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (pbox_parse_u64_list(bad[i], v, 4, 1, i == 15 ? UINT64_MAX : 100) != -EINVAL)
			fail_msg("accepted \"%s\"", bad[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accepts),
		cmocka_unit_test(test_refuses),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
