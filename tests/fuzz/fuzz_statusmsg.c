/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the status request (common/statusmsg.h) as pboxd and pbox-ctrld decode it
 * from a client: one request line, json_loads (as both control channels), then
 * pbox_statusmsg_decode.
 *
 * Invariants beyond the sanitizers: a refused request has a message; an accepted one has
 * every bound in its documented range and a job id that is -1 or a uint32, and encodes
 * (pbox_statusmsg_encode) to a request that decodes to the same values.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/statusmsg.h"
#include "fuzz.h"

static void check(const struct pbox_statusmsg *m)
{
	FUZZ_CHECK(m->job >= -1 && m->job <= (int64_t)UINT32_MAX, "job %lld", (long long)m->job);
	FUZZ_CHECK(m->max_groups >= 1 && m->max_groups <= PBOX_STATUS_GROUPS_MAX, "max_groups %u",
		   m->max_groups);
	FUZZ_CHECK(m->max_ranges >= 1 && m->max_ranges <= PBOX_STATUS_RANGES_MAX, "max_ranges %u",
		   m->max_ranges);
	FUZZ_CHECK(m->max_ranks >= 1 && m->max_ranks <= PBOX_STATUS_RANKS_MAX, "max_ranks %u",
		   m->max_ranks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pbox_statusmsg m, back;
	json_error_t jerr;
	json_t *req, *enc;
	char err[256];
	int rc;

	if (size > 1 << 16) {
		return 0;
	}
	req = json_loadb((const char *)data, size, JSON_DISABLE_EOF_CHECK, &jerr);
	if (req == NULL) {
		return 0;
	}
	err[0] = '\0';
	rc = pbox_statusmsg_decode(req, &m, err, sizeof(err));
	if (rc != 0) {
		FUZZ_CHECK(rc == -EINVAL && err[0] != '\0', "refused (%d) without a message", rc);
		json_decref(req);
		return 0;
	}
	check(&m);
	enc = pbox_statusmsg_encode(&m);
	FUZZ_CHECK(enc != NULL, "encode failed");
	rc = pbox_statusmsg_decode(enc, &back, err, sizeof(err));
	FUZZ_CHECK(rc == 0, "the encoded request is refused: %s", err);
	FUZZ_CHECK(back.job == m.job && back.max_groups == m.max_groups &&
			   back.max_ranges == m.max_ranges && back.max_ranks == m.max_ranks,
		   "round trip changed the request");
	FUZZ_CHECK((m.admin_token == NULL || m.admin_token[0] == '\0') ==
			   (back.admin_token == NULL),
		   "round trip changed the admin token's presence");
	FUZZ_CHECK(back.admin_token == NULL || strcmp(back.admin_token, m.admin_token) == 0,
		   "round trip changed the admin token");
	json_decref(enc);
	json_decref(req);
	return 0;
}
