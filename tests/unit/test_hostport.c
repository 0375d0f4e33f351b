/* SPDX-License-Identifier: BSD-3-Clause */
/* "HOST:PORT" strings (common/hostport.h): accepted forms, and every malformed one refused
 * with the outputs left alone. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/hostport.h"

static void test_accepts(void **state)
{
	char host[16];
	uint16_t port;

	(void)state;
	assert_int_equal(pbox_hostport_split("127.0.0.1:7000", false, 1, host, sizeof(host), &port),
			 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 7000);
	/* the last ':' splits; the host is not looked at */
	assert_int_equal(pbox_hostport_split("a:b:65535", false, 1, host, sizeof(host), &port), 0);
	assert_string_equal(host, "a:b");
	assert_int_equal(port, 65535);
	assert_int_equal(pbox_hostport_split("h:0", false, 0, host, sizeof(host), &port), 0);
	assert_int_equal(port, 0);
	assert_int_equal(pbox_hostport_split("h:00080", false, 1, host, sizeof(host), &port), 0);
	assert_int_equal(port, 80);
	assert_int_equal(pbox_hostport_split(":9", true, 0, host, sizeof(host), &port), 0);
	assert_string_equal(host, "");
	assert_int_equal(port, 9);
	/* a host of hlen - 1 bytes fits */
	assert_int_equal(
		pbox_hostport_split("123456789012345:1", false, 1, host, sizeof(host), &port), 0);
	assert_string_equal(host, "123456789012345");
}

static void test_refuses(void **state)
{
	static const struct {
		const char *s;
		bool empty_host;
		uint16_t min_port;
	} bad[] = {
		{ "", true, 0 },
		{ "7000", true, 0 },      /* no ':' */
		{ ":7000", false, 0 },    /* empty host where not allowed */
		{ "h:", true, 0 },        /* no port */
		{ "h:0", false, 1 },      /* below min_port */
		{ "h:65536", false, 0 },  /* above 65535 */
		{ "h:000001", false, 0 }, /* more than 5 digits */
		{ "h:+80", false, 0 },    /* a sign */
		{ "h:-1", false, 0 },
		{ "h: 80", false, 0 }, /* blanks */
		{ "h:80 ", false, 0 },
		{ "h:80x", false, 0 },              /* trailing text */
		{ "h:0x50", false, 0 },             /* not decimal */
		{ "h:http", false, 0 },             /* a service name */
		{ "1234567890123456:1", false, 1 }, /* host too long for 16 bytes */
	};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char host[16] = "unchanged";
		uint16_t port = 4242;

		assert_int_equal(pbox_hostport_split(bad[i].s, bad[i].empty_host, bad[i].min_port,
						     host, sizeof(host), &port),
				 -EINVAL);
		assert_string_equal(host, "unchanged");
		assert_int_equal(port, 4242);
	}
	assert_int_equal(pbox_hostport_split(NULL, true, 0, (char[4]){ 0 }, 4, &(uint16_t){ 0 }),
			 -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accepts),
		cmocka_unit_test(test_refuses),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
