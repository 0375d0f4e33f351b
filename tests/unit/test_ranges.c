/* SPDX-License-Identifier: BSD-3-Clause */
/* Bounded range lists (common/ranges.h): merging, the bound and its "(+N more)". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/ranges.h"

static const char *list(struct pbox_ranges *r, uint32_t max, const uint32_t *v, size_t n)
{
	assert_int_equal(pbox_ranges_init(r, max), 0);
	for (size_t i = 0; i < n; i++) {
		pbox_ranges_add(r, v[i]);
	}
	return pbox_ranges_str(r);
}

static void test_ranges(void **state)
{
	static const uint32_t a[] = { 0, 1, 2, 3, 5, 7, 8, 4294967294u, 4294967295u };
	static const uint32_t b[] = { 2, 2, 1, 3 }; /* repeats and a smaller value ignored */
	struct pbox_ranges r;

	(void)state;
	assert_string_equal(list(&r, 16, NULL, 0), "");
	pbox_ranges_free(&r);
	assert_string_equal(list(&r, 16, a, 1), "0");
	pbox_ranges_free(&r);
	assert_string_equal(list(&r, 16, a, 9), "0-3,5,7-8,4294967294-4294967295");
	pbox_ranges_free(&r);
	assert_string_equal(list(&r, 2, a, 9), "0-3,5 (+4 more)");
	pbox_ranges_free(&r);
	assert_string_equal(list(&r, 1, a, 9), "0-3 (+5 more)");
	pbox_ranges_free(&r);
	assert_string_equal(list(&r, 4, b, 4), "2-3");
	pbox_ranges_free(&r);
}

/* A million values in 500,000 ranges stay within the bound's text. */
static void test_bound(void **state)
{
	struct pbox_ranges r;
	const char *s;

	(void)state;
	assert_int_equal(pbox_ranges_init(&r, 3), 0);
	for (uint32_t v = 0; v < 1500000; v++) {
		if (v % 3 != 2) {
			pbox_ranges_add(&r, v);
		}
	}
	s = pbox_ranges_str(&r);
	assert_string_equal(s, "0-1,3-4,6-7 (+999994 more)");
	pbox_ranges_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ranges),
		cmocka_unit_test(test_bound),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
