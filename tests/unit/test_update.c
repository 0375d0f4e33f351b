/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The optimizer of a broadcast job as the worker reads it from pboxd's hello reply
 * (pbox_update_parse_optimizer): every float parameter survives pboxd's encoding (a
 * double in JSON text, jansson's %.17g) bit for bit, so every worker runs the same F; a
 * missing, mistyped, non-finite or out-of-range member, or an unknown optimizer, is
 * refused with the member named.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "libpbox/update.h"

/* As sessions.c packs it, through the text the control channel carries. */
static json_t *hello_optimizer(const char *name, const struct pbox_opt_params *p)
{
	json_t *o = json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "name", name, "lr",
			      (double)p->lr, "momentum", (double)p->momentum, "wd", (double)p->wd,
			      "rescale", (double)p->rescale, "clip", (double)p->clip, "beta1",
			      (double)p->beta1, "beta2", (double)p->beta2, "eps", (double)p->eps);
	char *text = json_dumps(o, JSON_COMPACT);
	json_t *back = json_loads(text, 0, NULL);

	free(text);
	json_decref(o);
	assert_non_null(back);
	return back;
}

static void test_round_trip(void **state)
{
	struct pbox_opt_params p = { .lr = 0.05f,
				     .momentum = 0.9f,
				     .wd = 1e-4f,
				     .rescale = 1.0f / 240.0f,
				     .clip = 0.0f,
				     .beta1 = 0.9f,
				     .beta2 = 0.999f,
				     .eps = 1e-8f },
			       got;
	const struct pbox_optimizer_ops *opt = NULL;
	char why[160];
	json_t *o;

	(void)state;
	for (int i = 0; i < 200; i++) {
		/* floats of every magnitude, including ones with no short decimal form */
		p.lr = nextafterf(p.lr * 1.37f, INFINITY);
		p.rescale = ldexpf(1.0f + (float)i / 257.0f, -i % 40);
		o = hello_optimizer("adamw", &p);
		assert_int_equal(pbox_update_parse_optimizer(o, &opt, &got, why, sizeof(why)), 0);
		assert_string_equal(opt->name, "adamw");
		assert_memory_equal(&got, &p, sizeof(p));
		json_decref(o);
		if (p.lr > 1e30f) {
			p.lr = 1e-30f;
		}
	}
}

static void expect_refused(const char *text, const char *fragment)
{
	const struct pbox_optimizer_ops *opt;
	struct pbox_opt_params p;
	json_t *o = json_loads(text, JSON_DECODE_ANY, NULL);
	char why[160] = "";

	assert_int_equal(pbox_update_parse_optimizer(o, &opt, &p, why, sizeof(why)), -EPROTO);
	if (strstr(why, fragment) == NULL) {
		fail_msg("'%s': '%s' does not say '%s'", text, why, fragment);
	}
	json_decref(o);
}

static void test_refusals(void **state)
{
	(void)state;
	expect_refused("null", "needs 'optimizer'");
	expect_refused("[1]", "needs 'optimizer'");
	expect_refused("{\"lr\":0.1}", "with a 'name'");
	expect_refused("{\"name\":\"lion\",\"lr\":0.1}", "unknown optimizer 'lion'");
	expect_refused("{\"name\":\"sgd\",\"lr\":0.1,\"momentum\":0,\"wd\":0,\"rescale\":1,"
		       "\"clip\":0,\"beta1\":0.9,\"beta2\":0.999}",
		       "'eps' missing");
	expect_refused("{\"name\":\"sgd\",\"lr\":\"0.1\",\"momentum\":0,\"wd\":0,\"rescale\":1,"
		       "\"clip\":0,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8}",
		       "'lr' missing or not a finite float");
	expect_refused("{\"name\":\"sgd\",\"lr\":1e39,\"momentum\":0,\"wd\":0,\"rescale\":1,"
		       "\"clip\":0,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8}",
		       "'lr' missing or not a finite float");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_refusals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
