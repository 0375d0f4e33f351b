/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The control plane's typed messages to workers (common/ctlproto.h):
 *  - a job plan sliced per rank: parent, children (the ranks whose parent it is), depth,
 *    the rank's push threshold from its link state, the broadcast threshold, PHub's
 *    recommendation; every slice encodes to a rank plan the strict decoder gives back
 *    unchanged;
 *  - slicing refuses trees of the wrong size, parents out of range and cycles;
 *  - the decoder refuses unknown members, a delta that does not match its selection, a
 *    child twice or equal to the parent, depth 1 with a worker parent, a bad phub;
 *  - probe events and probe_results: ids 1..2^53, either a result or an errno/error.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pbox/pbox.h>

#include "common/ctlproto.h"

static json_t *job_plan(const char *parents)
{
	json_error_t e;
	char text[1024];
	json_t *j;

	snprintf(text, sizeof(text),
		 "{\"tree\":{\"parent\":%s,\"revision\":7},\"thresholds\":{\"min_rate_bps\":2e7,"
		 "\"delta_low\":0.001,\"delta_up\":0.01,\"broadcast\":{\"select\":\"delta_up\","
		 "\"delta\":0.01},\"workers\":[{\"rank\":0,\"link\":\"sufficient\",\"bw_bps\":4e7},"
		 "{\"rank\":1,\"link\":\"insufficient\",\"bw_bps\":9e6},{\"rank\":2,\"link\":"
		 "\"unknown\"},{\"rank\":3,\"link\":\"sufficient\",\"bw_bps\":3e7}]},\"phub\":"
		 "{\"recommend\":\"hierarchical\"}}",
		 parents);
	j = json_loads(text, 0, &e);
	assert_non_null(j);
	return j;
}

static void test_slice(void **state)
{
	(void)state;
	json_t *jp = job_plan("[-1, 0, 1, 0]"), *enc;
	struct pbox_plan *p = malloc(sizeof(*p)), *q = malloc(sizeof(*q));
	char err[256];

	assert_int_equal(pbox_ctl_plan_slice(jp, 0, 4, p, err, sizeof(err)), 0);
	assert_int_equal(p->revision, 7);
	assert_int_equal(p->parent, -1);
	assert_int_equal(p->depth, 1);
	assert_int_equal(p->nchildren, 2);
	assert_int_equal(p->children[0], 1);
	assert_int_equal(p->children[1], 3);
	assert_int_equal(p->link, PBOX_PLAN_LINK_SUFFICIENT);
	assert_false(p->push_up);
	assert_true(p->delta == 0.001);
	assert_true(p->broadcast_up);
	assert_true(p->broadcast_delta == 0.01);
	assert_string_equal(p->phub, "hierarchical");
	assert_int_equal(pbox_ctl_plan_slice(jp, 2, 4, p, err, sizeof(err)), 0);
	assert_int_equal(p->parent, 1);
	assert_int_equal(p->depth, 3);
	assert_int_equal(p->nchildren, 0);
	assert_int_equal(p->link, PBOX_PLAN_LINK_UNKNOWN);
	assert_int_equal(pbox_ctl_plan_slice(jp, 1, 4, p, err, sizeof(err)), 0);
	assert_true(p->push_up);
	assert_true(p->delta == 0.01);
	assert_true(p->link_bps == 9e6);
	/* Encode, decode strictly: the same plan. */
	enc = pbox_ctl_plan_encode(p);
	assert_int_equal(pbox_ctl_plan_decode(enc, q, err, sizeof(err)), 0);
	assert_int_equal(q->revision, p->revision);
	assert_int_equal(q->parent, p->parent);
	assert_int_equal(q->depth, p->depth);
	assert_int_equal(q->nchildren, 1);
	assert_int_equal(q->children[0], 2);
	assert_true(q->push_up && q->delta == 0.01 && q->link == PBOX_PLAN_LINK_INSUFFICIENT);
	assert_string_equal(q->phub, "hierarchical");
	json_decref(enc);
	/* Refusals. */
	assert_int_equal(pbox_ctl_plan_slice(jp, 4, 4, p, err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_ctl_plan_slice(jp, 0, 3, p, err, sizeof(err)), -EINVAL);
	json_decref(jp);
	jp = job_plan("[1, 2, 0, -1]");
	assert_int_equal(pbox_ctl_plan_slice(jp, 0, 4, p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "cycle"));
	json_decref(jp);
	jp = job_plan("[-1, 4, 0, 0]");
	assert_int_equal(pbox_ctl_plan_slice(jp, 0, 4, p, err, sizeof(err)), -EINVAL);
	json_decref(jp);
	free(p);
	free(q);
}

/* The rank plan enc with member name set to the JSON text v, decoded. */
static int decode_with(const json_t *enc, const char *name, const char *v)
{
	json_t *j = json_deep_copy(enc);
	struct pbox_plan *p = malloc(sizeof(*p));
	char err[256];
	int rc;

	json_object_set_new(j, name, json_loads(v, JSON_DECODE_ANY, NULL));
	rc = pbox_ctl_plan_decode(j, p, err, sizeof(err));
	json_decref(j);
	free(p);
	return rc;
}

static void test_decode_strict(void **state)
{
	(void)state;
	struct pbox_plan *p = calloc(1, sizeof(*p));
	json_t *enc;

	p->revision = 3;
	p->delta_low = p->delta = p->broadcast_delta = 0.001;
	p->delta_up = 0.01;
	p->parent = 1;
	p->depth = 2;
	p->nchildren = 1;
	p->children[0] = 2;
	enc = pbox_ctl_plan_encode(p);
	assert_int_equal(decode_with(enc, "depth", "2"), 0);
	assert_int_equal(decode_with(enc, "extra", "1"), -EINVAL);
	assert_int_equal(decode_with(enc, "delta", "0.01"), -EINVAL);
	assert_int_equal(decode_with(enc, "push", "\"delta_up\""), -EINVAL);
	assert_int_equal(decode_with(enc, "children", "[2, 2]"), -EINVAL);
	assert_int_equal(decode_with(enc, "children", "[1]"), -EINVAL);
	assert_int_equal(decode_with(enc, "depth", "1"), -EINVAL);
	assert_int_equal(decode_with(enc, "revision", "0"), -EINVAL);
	assert_int_equal(decode_with(enc, "link", "\"fast\""), -EINVAL);
	assert_int_equal(decode_with(enc, "link_bps", "-1"), -EINVAL);
	assert_int_equal(decode_with(enc, "phub", "\"maybe\""), -EINVAL);
	assert_int_equal(decode_with(enc, "delta_low", "0.5"), -EINVAL);
	assert_int_equal(decode_with(enc, "broadcast", "{\"select\":\"delta_low\"}"), -EINVAL);
	json_decref(enc);
	free(p);
}

static void test_probe_messages(void **state)
{
	(void)state;
	json_t *ev = json_pack("{s:s, s:I, s:{s:s}}", "event", "probe", "id", (json_int_t)5,
			       "request", "peer", "10.0.0.2:1");
	json_t *ok =
		json_pack("{s:s, s:I, s:{}}", "op", "probe_result", "id", (json_int_t)5, "result");
	json_t *no = json_pack("{s:s, s:I, s:i, s:s}", "op", "probe_result", "id", (json_int_t)5,
			       "errno", EBUSY, "error", "busy");
	json_t *bad = json_pack("{s:s, s:I, s:i, s:s}", "op", "probe_result", "id", (json_int_t)0,
				"errno", EBUSY, "error", "busy");
	const json_t *m;
	const char *e;
	uint64_t id;
	int en;
	char err[256];

	assert_int_equal(pbox_ctl_probe_event_decode(ev, &id, &m, err, sizeof(err)), 0);
	assert_int_equal(id, 5);
	assert_true(json_is_object(m));
	assert_int_equal(pbox_ctl_probe_result_decode(ok, &id, &m, &en, &e, err, sizeof(err)), 0);
	assert_true(m != NULL && en == 0 && e == NULL);
	assert_int_equal(pbox_ctl_probe_result_decode(no, &id, &m, &en, &e, err, sizeof(err)), 0);
	assert_true(m == NULL && en == EBUSY && strcmp(e, "busy") == 0);
	assert_int_equal(pbox_ctl_probe_result_decode(bad, &id, &m, &en, &e, err, sizeof(err)),
			 -EINVAL);
	json_object_set_new(ok, "errno", json_integer(1));
	assert_int_equal(pbox_ctl_probe_result_decode(ok, &id, &m, &en, &e, err, sizeof(err)),
			 -EINVAL);
	json_decref(ev);
	json_decref(ok);
	json_decref(no);
	json_decref(bad);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slice),
		cmocka_unit_test(test_decode_strict),
		cmocka_unit_test(test_probe_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
