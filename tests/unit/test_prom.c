/* SPDX-License-Identifier: BSD-3-Clause */
/* The Prometheus text writer (common/prom.h): exact lines, escapes, invalid names, and
 * the size bound (whole lines only, the truncation marker). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/prom.h"

static void test_format(void **state)
{
	struct pbox_prom p;
	const char *t;

	(void)state;
	assert_int_equal(pbox_prom_init(&p, 4096), 0);
	pbox_prom_family(&p, "x_total", "counter", "a \\ back\nslash");
	pbox_prom_u64(&p, "x_total", (pbox_prom_labels){ "a", "q\"\\\nz", "b", "2", NULL },
		      18446744073709551615ull);
	pbox_prom_u64(&p, "x_total", NULL, 0);
	pbox_prom_family(&p, "y", "gauge", "g");
	pbox_prom_f64(&p, "y", NULL, 0.25);
	pbox_prom_f64(&p, "y", (pbox_prom_labels){ "k", "v", NULL }, 1.0 / 0.0);
	t = pbox_prom_finish(&p);
	assert_string_equal(t,
			    "# HELP x_total a \\\\ back\\nslash\n"
			    "# TYPE x_total counter\n"
			    "x_total{a=\"q\\\"\\\\\\nz\",b=\"2\"} 18446744073709551615\n"
			    "x_total 0\n"
			    "# HELP y g\n"
			    "# TYPE y gauge\n"
			    "y 0.25\n"
			    "y{k=\"v\"} +Inf\n"
			    "# HELP pbox_metrics_truncated 1 if series were left out to keep the "
			    "response within its size bound\n"
			    "# TYPE pbox_metrics_truncated gauge\n"
			    "pbox_metrics_truncated 0\n");
	assert_false(p.truncated);
	assert_int_equal(p.dropped, 0);
	pbox_prom_free(&p);
}

static void test_names(void **state)
{
	struct pbox_prom p;

	(void)state;
	assert_true(pbox_prom_valid_name("a:b_c9", false));
	assert_false(pbox_prom_valid_name("a:b", true));
	assert_false(pbox_prom_valid_name("9a", false));
	assert_false(pbox_prom_valid_name("a-b", false));
	assert_false(pbox_prom_valid_name("", false));
	assert_int_equal(pbox_prom_init(&p, 4096), 0);
	pbox_prom_family(&p, "bad-name", "gauge", "x");
	pbox_prom_u64(&p, "bad name", NULL, 1);
	pbox_prom_u64(&p, "ok", (pbox_prom_labels){ "bad-label", "v", NULL }, 1);
	assert_int_equal(p.dropped, 3);
	assert_int_equal(p.len, 0);
	pbox_prom_free(&p);
}

static void test_bound(void **state)
{
	struct pbox_prom p;
	const char *t, *last;
	size_t lines = 0;

	(void)state;
	assert_int_equal(pbox_prom_init(&p, 1000), 0);
	pbox_prom_family(&p, "big", "gauge", "many samples");
	for (int i = 0; i < 1000; i++) {
		char v[16];

		snprintf(v, sizeof(v), "%d", i);
		pbox_prom_u64(&p, "big", (pbox_prom_labels){ "i", v, NULL }, (uint64_t)i);
	}
	assert_true(p.truncated);
	t = pbox_prom_finish(&p);
	assert_true(strlen(t) <= 1000);
	assert_int_equal(strlen(t), p.len);
	/* Whole lines only, and the marker last. */
	assert_int_equal(t[p.len - 1], '\n');
	for (const char *c = t; *c; c++) {
		lines += *c == '\n';
	}
	assert_true(lines > 5);
	last = strstr(t, "pbox_metrics_truncated 1\n");
	assert_non_null(last);
	assert_string_equal(last, "pbox_metrics_truncated 1\n");
	pbox_prom_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_bound),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
