/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Probe request and result <-> JSON (see probe_msg.h).
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "probe_msg.h"
#include "probe_wire.h"

static const char *const g_flag_names[] = { "converged", "at_cap", "at_min", "sender_limited",
					    "budget" };
#define NFLAGS (sizeof(g_flag_names) / sizeof(g_flag_names[0]))

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* A finite JSON number (integer or real) in [lo, hi]. */
static int get_num(const json_t *v, double lo, double hi, double *out)
{
	double x;

	if (!json_is_number(v)) {
		return -EINVAL;
	}
	x = json_number_value(v);
	if (!isfinite(x) || x < lo || x > hi) {
		return -EINVAL;
	}
	*out = x;
	return 0;
}

/* A JSON integer in [lo, hi]. */
static int get_int(const json_t *v, json_int_t lo, json_int_t hi, json_int_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		return -EINVAL;
	}
	*out = json_integer_value(v);
	return 0;
}

int pbox_probe_request_from_json(const json_t *j, const struct pbox_probe_limits *lim,
				 struct pbox_probe_request *out, char *err, size_t errlen)
{
	const char *key;
	json_t *v;
	json_int_t n;
	double x;
	bool peer = false, cap = false, budget = false;

	if (!json_is_object(j)) {
		return fail(err, errlen, -EINVAL, "%s", "a probe request is a JSON object");
	}
	pbox_probe_request_defaults(out);
	json_object_foreach((json_t *)j, key, v)
	{
		if (!strcmp(key, "peer")) {
			const char *s = json_string_value(v);

			if (s == NULL || strlen(s) > 255 ||
			    pbox_probe_parse_numeric_addr(s, PBOX_PROBE_PORT, &out->peer,
							  &out->peer_len) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "peer: expected \"ADDRESS[:PORT]\" (numeric)");
			}
			peer = true;
		} else if (!strcmp(key, "cap_bps")) {
			if (get_num(v, 1e3, 1e12, &out->cap_bps) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "cap_bps: expected a number of bit/s in 1e3..1e12");
			}
			cap = true;
		} else if (!strcmp(key, "budget_ms")) {
			if (get_int(v, 1, 3600000, &n) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "budget_ms: expected an integer in 1..3600000");
			}
			out->budget_ns = (int64_t)n * 1000000;
			budget = true;
		} else if (!strcmp(key, "resolution")) {
			if (get_num(v, 0.001, 0.5, &out->resolution) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "resolution: expected a number in 0.001..0.5");
			}
		} else if (!strcmp(key, "mtu")) {
			if (get_int(v, PBOX_SLOPS_MIN_PACKET,
				    PBOX_PROBE_MAX_DATAGRAM + PBOX_PROBE_IPUDP_BYTES, &n) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "mtu: expected an integer in 200..9028");
			}
			out->max_datagram = (uint32_t)n;
		} else if (!strcmp(key, "streams")) {
			if (get_int(v, 1, PBOX_SLOPS_MAX_FLEET_STREAMS, &n) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "streams: expected an integer in 1..64");
			}
			out->streams = (uint32_t)n;
		} else if (!strcmp(key, "stream_len")) {
			if (get_int(v, 10, PBOX_SLOPS_MAX_STREAM_LEN, &n) < 0) {
				return fail(err, errlen, -EINVAL, "%s",
					    "stream_len: expected an integer in 10..400");
			}
			out->stream_len = (uint32_t)n;
		} else {
			return fail(err, errlen, -EINVAL, "unknown key \"%.64s\"", key);
		}
	}
	if (!peer || !cap || !budget) {
		return fail(err, errlen, -EINVAL, "%s", "peer, cap_bps and budget_ms are required");
	}
	if (!(out->cap_bps > out->min_bps)) {
		return fail(err, errlen, -EINVAL, "%s", "cap_bps must be above 1 Mbit/s");
	}
	x = out->cap_bps;
	if (x > lim->max_cap_bps || out->budget_ns > lim->max_budget_ns) {
		return fail(err, errlen, -EPERM, "%s",
			    "cap_bps or budget_ms above what this agent allows");
	}
	return 0;
}

static void peer_text(const struct sockaddr_storage *ss, socklen_t len, char *buf, size_t n)
{
	char host[64], port[8];

	if (getnameinfo((const struct sockaddr *)ss, len, host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, n, "?");
	} else {
		snprintf(buf, n, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
	}
}

json_t *pbox_probe_request_to_json(const struct pbox_probe_request *req)
{
	char peer[80];

	peer_text(&req->peer, req->peer_len, peer, sizeof(peer));
	return json_pack("{s:s, s:f, s:I, s:f, s:I, s:I, s:I}", "peer", peer, "cap_bps",
			 req->cap_bps, "budget_ms", (json_int_t)(req->budget_ns / 1000000),
			 "resolution", req->resolution, "mtu", (json_int_t)req->max_datagram,
			 "streams", (json_int_t)req->streams, "stream_len",
			 (json_int_t)req->stream_len);
}

json_t *pbox_probe_result_to_json(const struct pbox_probe_result *res, const char *peer)
{
	bool grey = res->grey_min_bps <= res->grey_max_bps;
	json_t *flags = json_array(), *j;
	size_t i;

	if (flags == NULL) {
		return NULL;
	}
	for (i = 0; i < NFLAGS; i++) {
		if (res->flags & (1u << i)) {
			json_array_append_new(flags, json_string(g_flag_names[i]));
		}
	}
	j = json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:o, s:I, s:I, s:I, s:f, s:I, s:I}", "peer",
		      peer, "r_min_bps", res->r_min_bps, "r_max_bps", res->r_max_bps,
		      "grey_min_bps", grey ? res->grey_min_bps : 0.0, "grey_max_bps",
		      grey ? res->grey_max_bps : 0.0, "adr_bps", res->adr_bps, "flags", flags,
		      "fleets", (json_int_t)res->fleets, "streams", (json_int_t)res->streams,
		      "bytes_sent", (json_int_t)res->bytes_sent, "max_stream_bps",
		      res->max_stream_bps, "timestamp_ns", (json_int_t)res->timestamp_ns,
		      "duration_ns", (json_int_t)res->duration_ns);
	return j; /* json_pack's "o" took flags, also on failure */
}

int pbox_probe_result_from_json(const json_t *j, struct pbox_probe_result *out, char *err,
				size_t errlen)
{
	static const struct {
		const char *key;
		size_t off;
		bool required;
	} rates[] = {
		{ "r_min_bps", offsetof(struct pbox_probe_result, r_min_bps), true },
		{ "r_max_bps", offsetof(struct pbox_probe_result, r_max_bps), true },
		{ "grey_min_bps", offsetof(struct pbox_probe_result, grey_min_bps), false },
		{ "grey_max_bps", offsetof(struct pbox_probe_result, grey_max_bps), false },
		{ "adr_bps", offsetof(struct pbox_probe_result, adr_bps), false },
		{ "max_stream_bps", offsetof(struct pbox_probe_result, max_stream_bps), false },
	};
	json_t *flags, *v;
	json_int_t n;
	size_t i, k;

	if (!json_is_object(j)) {
		return fail(err, errlen, -EINVAL, "%s", "a probe result is a JSON object");
	}
	memset(out, 0, sizeof(*out));
	for (i = 0; i < sizeof(rates) / sizeof(rates[0]); i++) {
		v = json_object_get(j, rates[i].key);
		if (v == NULL && !rates[i].required) {
			continue;
		}
		if (get_num(v, 0, 1e12, (double *)((char *)out + rates[i].off)) < 0) {
			return fail(err, errlen, -EINVAL, "%s: expected a rate in 0..1e12 bit/s",
				    rates[i].key);
		}
	}
	if (out->r_min_bps > out->r_max_bps) {
		return fail(err, errlen, -EINVAL, "%s", "r_min_bps above r_max_bps");
	}
	if (out->grey_min_bps > out->grey_max_bps) {
		return fail(err, errlen, -EINVAL, "%s", "grey_min_bps above grey_max_bps");
	}
	if (out->grey_max_bps == 0) {
		out->grey_max_bps = -1; /* none */
	}
	flags = json_object_get(j, "flags");
	if (!json_is_array(flags)) {
		return fail(err, errlen, -EINVAL, "%s", "flags: expected an array of names");
	}
	json_array_foreach(flags, i, v)
	{
		const char *s = json_string_value(v);

		for (k = 0; s && k < NFLAGS && strcmp(s, g_flag_names[k]); k++) {
		}
		if (s == NULL || k == NFLAGS) {
			return fail(err, errlen, -EINVAL, "%s", "flags: unknown flag");
		}
		out->flags |= 1u << k;
	}
	if (get_int(json_object_get(j, "timestamp_ns"), 0, INT64_MAX, &n) < 0) {
		return fail(err, errlen, -EINVAL, "%s", "timestamp_ns: expected an integer >= 0");
	}
	out->timestamp_ns = n;
	if (get_int(json_object_get(j, "duration_ns"), 0, INT64_MAX, &n) < 0) {
		return fail(err, errlen, -EINVAL, "%s", "duration_ns: expected an integer >= 0");
	}
	out->duration_ns = n;
	if ((v = json_object_get(j, "fleets")) != NULL) {
		if (get_int(v, 0, 1000000, &n) < 0) {
			return fail(err, errlen, -EINVAL, "%s", "fleets: expected 0..1000000");
		}
		out->fleets = (unsigned)n;
	}
	if ((v = json_object_get(j, "streams")) != NULL) {
		if (get_int(v, 0, 100000000, &n) < 0) {
			return fail(err, errlen, -EINVAL, "%s", "streams: expected 0..1e8");
		}
		out->streams = (unsigned)n;
	}
	if ((v = json_object_get(j, "bytes_sent")) != NULL) {
		if (get_int(v, 0, INT64_MAX, &n) < 0) {
			return fail(err, errlen, -EINVAL, "%s", "bytes_sent: expected >= 0");
		}
		out->bytes_sent = (uint64_t)n;
	}
	return 0;
}
