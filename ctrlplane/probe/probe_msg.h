/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The probe request and result as JSON objects: what pbox-ctrld sends an agent (libpbox,
 * pboxd, or pbox-probe) and what the agent sends back, over the newline-JSON control
 * channels (dataplane/common/ctlproto.h). One encoder and one validating decoder per
 * message, shared by both ends.
 *
 *   request {"peer": "10.0.0.2:55001", "cap_bps": 2e8, "budget_ms": 10000,
 *            "resolution": 0.05, "mtu": 1500, "streams": 12, "stream_len": 100}
 *            (peer, cap_bps and budget_ms required; the rest default as in
 *            pbox_probe_request_defaults())
 *   result  {"peer": "...", "r_min_bps": ..., "r_max_bps": ..., "grey_min_bps": ...,
 *            "grey_max_bps": ..., "adr_bps": ..., "flags": ["converged", ...],
 *            "fleets": n, "streams": n, "bytes_sent": n, "max_stream_bps": ...,
 *            "timestamp_ns": n, "duration_ns": n}   (grey_*: 0 and 0 when none)
 *
 * The agent is the one that sends probe traffic, so it decides the limits: a request
 * whose cap or budget exceeds the agent's own (struct pbox_probe_limits) is refused,
 * never clipped silently. Peers in requests are numeric addresses (no DNS lookup on a
 * request from the network).
 *
 * Thread safety: pure functions; the caller owns the json_t objects.
 */
#ifndef PBOX_PROBE_MSG_H
#define PBOX_PROBE_MSG_H

#include <jansson.h>

#include "agent.h"

/* What an agent allows a controller to ask for. */
struct pbox_probe_limits {
	double max_cap_bps;    /* largest rate cap it accepts */
	int64_t max_budget_ns; /* longest budget */
};

/*
 * Decode a request (untrusted: from the control channel) into *out, starting from
 * pbox_probe_request_defaults(). Returns 0, -EINVAL (a field missing, of the wrong type
 * or out of range, unknown keys included; *err names it), -EPERM (cap or budget above
 * lim). err (may be NULL) receives a one-line reason of at most errlen bytes.
 */
int pbox_probe_request_from_json(const json_t *j, const struct pbox_probe_limits *lim,
				 struct pbox_probe_request *out, char *err, size_t errlen);

/* Encode req (peer as its numeric address). NULL on allocation failure. */
json_t *pbox_probe_request_to_json(const struct pbox_probe_request *req);

/* Encode a result for peer (its text as given). NULL on allocation failure. */
json_t *pbox_probe_result_to_json(const struct pbox_probe_result *res, const char *peer);

/* Decode a result (untrusted: an agent's answer) into *out: every number finite and in
 * range (rates 0..1e12, r_min <= r_max, grey ordered or both 0, flags known). Returns 0
 * or -EINVAL with *err naming the field. */
int pbox_probe_result_from_json(const json_t *j, struct pbox_probe_result *out, char *err,
				size_t errlen);

#endif /* PBOX_PROBE_MSG_H */
