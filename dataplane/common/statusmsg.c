/* SPDX-License-Identifier: BSD-3-Clause */
/* The status request: one decoder and one encoder for pboxd, pbox-ctrld and `pbox status`. */
#include "statusmsg.h"

#include <errno.h>
#include <stdio.h>

void pbox_statusmsg_defaults(struct pbox_statusmsg *m)
{
	*m = (struct pbox_statusmsg){ .job = -1,
				      .max_groups = PBOX_STATUS_GROUPS_DEFAULT,
				      .max_ranges = PBOX_STATUS_RANGES_DEFAULT,
				      .max_ranks = PBOX_STATUS_RANKS_DEFAULT };
}

static int limit_of(const json_t *req, const char *key, uint32_t max, uint32_t *out, char *err,
		    size_t errlen)
{
	const json_t *x = json_object_get(req, key);

	if (x == NULL) {
		return 0;
	}
	if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > max) {
		snprintf(err, errlen, "status: %s must be an integer from 1 to %u", key, max);
		return -EINVAL;
	}
	*out = (uint32_t)json_integer_value(x);
	return 0;
}

int pbox_statusmsg_decode(const json_t *req, struct pbox_statusmsg *m, char *err, size_t errlen)
{
	const json_t *j = json_object_get(req, "job"), *tok = json_object_get(req, "admin_token");

	pbox_statusmsg_defaults(m);
	if (!json_is_object(req)) {
		snprintf(err, errlen, "status: the request must be an object");
		return -EINVAL;
	}
	if (j != NULL && !json_is_null(j)) {
		if (!json_is_integer(j) || json_integer_value(j) < 0 ||
		    json_integer_value(j) > UINT32_MAX) {
			snprintf(err, errlen, "status: job must be a job id (an integer >= 0)");
			return -EINVAL;
		}
		m->job = json_integer_value(j);
	}
	if (tok != NULL) {
		if (!json_is_string(tok)) {
			snprintf(err, errlen, "status: admin_token must be a string");
			return -EINVAL;
		}
		m->admin_token = json_string_value(tok);
	}
	if (limit_of(req, "max_groups", PBOX_STATUS_GROUPS_MAX, &m->max_groups, err, errlen) != 0 ||
	    limit_of(req, "max_ranges", PBOX_STATUS_RANGES_MAX, &m->max_ranges, err, errlen) != 0 ||
	    limit_of(req, "max_ranks", PBOX_STATUS_RANKS_MAX, &m->max_ranks, err, errlen) != 0) {
		return -EINVAL;
	}
	return 0;
}

json_t *pbox_statusmsg_encode(const struct pbox_statusmsg *m)
{
	json_t *o = json_pack("{s:s, s:I, s:I, s:I}", "op", "status", "max_groups",
			      (json_int_t)m->max_groups, "max_ranges", (json_int_t)m->max_ranges,
			      "max_ranks", (json_int_t)m->max_ranks);

	if (o == NULL) {
		return NULL;
	}
	if (m->job >= 0) {
		json_object_set_new(o, "job", json_integer(m->job));
	}
	if (m->admin_token != NULL && m->admin_token[0] != '\0') {
		json_object_set_new(o, "admin_token", json_string(m->admin_token));
	}
	return o;
}
