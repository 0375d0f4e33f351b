/* SPDX-License-Identifier: BSD-3-Clause */
/* Newline-delimited JSON framing of the control channel (see ctlproto.h). */
#include "ctlproto.h"

#include "common/compiler.h"

#include <pbox/pbox.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pbox_linebuf_init(struct pbox_linebuf *lb)
{
	memset(lb, 0, sizeof(*lb));
	lb->max = PBOX_CTL_MAX_LINE;
}

void pbox_linebuf_free(struct pbox_linebuf *lb)
{
	size_t max = lb->max;

	free(lb->buf);
	memset(lb, 0, sizeof(*lb));
	lb->max = max;
}

void pbox_linebuf_set_max(struct pbox_linebuf *lb, size_t max)
{
	lb->max = max ? max : 1;
}

long pbox_linebuf_fill(struct pbox_linebuf *lb, int fd)
{
	long total = 0;

	/* Drop what was already returned. */
	if (lb->start > 0) {
		memmove(lb->buf, lb->buf + lb->start, lb->len - lb->start);
		lb->len -= lb->start;
		lb->start = 0;
	}
	for (;;) {
		ssize_t n;

		/* A line of max bytes plus its newline, plus the terminator we keep room for. */
		size_t limit = lb->max + 2;

		if (lb->cap - lb->len < 4096 && lb->cap < limit) {
			size_t ncap = PBOX_MIN(lb->cap ? lb->cap * 2 : 16384, limit);
			char *nb;

			nb = realloc(lb->buf, ncap);
			if (nb == NULL) {
				return -ENOMEM;
			}
			lb->buf = nb;
			lb->cap = ncap;
		}
		if (lb->len + 1 >= PBOX_MIN(lb->cap, limit)) {
			/* Full: fine if a line is complete (the caller takes it, then reads on);
			 * otherwise the line is longer than max. */
			if (memchr(lb->buf, '\n', lb->len) != NULL) {
				return total > 0 ? total : -EAGAIN;
			}
			return -E2BIG;
		}
		n = read(fd, lb->buf + lb->len, PBOX_MIN(lb->cap, limit) - lb->len - 1);
		if (n > 0) {
			lb->len += (size_t)n;
			total += n;
			continue;
		}
		if (n == 0) {
			return total > 0 ? total : 0;
		}
		if (errno == EINTR) {
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			return total > 0 ? total : -EAGAIN;
		}
		return -errno;
	}
}

char *pbox_linebuf_next(struct pbox_linebuf *lb)
{
	char *line, *nl;

	if (lb->buf == NULL || lb->start >= lb->len) {
		return NULL;
	}
	line = lb->buf + lb->start;
	nl = memchr(line, '\n', lb->len - lb->start);
	if (nl == NULL) {
		return NULL;
	}
	*nl = '\0';
	lb->start = (size_t)(nl - lb->buf) + 1;
	return line;
}

char *pbox_ctl_encode(const json_t *obj, size_t *len)
{
	char *s = json_dumps(obj, JSON_COMPACT);

	if (s == NULL) {
		return NULL;
	}
	*len = strlen(s);
	s[*len] = '\n'; /* json_dumps leaves room for the terminator we overwrite */
	(*len)++;
	return s;
}

int pbox_ctl_send(int fd, const json_t *obj, int timeout_ms)
{
	size_t len, off = 0;
	char *s = pbox_ctl_encode(obj, &len);
	int rc = 0;

	if (s == NULL) {
		return -ENOMEM;
	}
	while (off < len) {
		ssize_t n = write(fd, s + off, len - off);

		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };

			if (poll(&p, 1, timeout_ms) <= 0) {
				rc = -ETIMEDOUT;
				break;
			}
			continue;
		}
		rc = n < 0 ? -errno : -EIO;
		break;
	}
	free(s);
	return rc;
}

json_t *pbox_ctl_error(int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:i, s:s}", "ok", 0, "errno", err, "error", msg);
}

bool pbox_ctl_token_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = la != lb;

	for (size_t i = 0; i < la; i++) {
		d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
	}
	return d == 0;
}

/* ---- control-plane messages ---------------------------------------------------------- */

static const char *const g_link_names[] = { "unknown", "sufficient", "insufficient" };

json_t *pbox_ctl_plan_encode(const struct pbox_plan *p)
{
	json_t *ch = json_array(), *o;

	for (uint32_t i = 0; ch != NULL && i < p->nchildren && i < PBOX_PLAN_MAX_CHILDREN; i++) {
		json_array_append_new(ch, json_integer(p->children[i]));
	}
	o = json_pack("{s:I, s:f, s:s, s:s, s:f, s:{s:s, s:f}, s:f, s:f, s:f, s:I, s:I, s:o, s:s}",
		      "revision", (json_int_t)p->revision, "delta", p->delta, "push",
		      p->push_up ? "delta_up" : "delta_low", "link",
		      g_link_names[(unsigned)p->link < 3 ? p->link : 0], "link_bps", p->link_bps,
		      "broadcast", "select", p->broadcast_up ? "delta_up" : "delta_low", "delta",
		      p->broadcast_delta, "delta_low", p->delta_low, "delta_up", p->delta_up,
		      "min_rate_bps", p->min_rate_bps, "parent", (json_int_t)p->parent, "depth",
		      (json_int_t)p->depth, "children", ch, "phub", p->phub);
	return o;
}

/* A finite number >= 0 (integers too) into *v. */
static int num_ge0(const json_t *j, const char *name, double *v, char *err, size_t errlen)
{
	const json_t *m = json_object_get(j, name);

	if (!json_is_number(m) || !isfinite(json_number_value(m)) || json_number_value(m) < 0) {
		snprintf(err, errlen, "plan: \"%s\" must be a finite number >= 0", name);
		return -EINVAL;
	}
	*v = json_number_value(m);
	return 0;
}

/* "delta_low" or "delta_up" into *up. */
static int select_of(const json_t *m, const char *name, bool *up, char *err, size_t errlen)
{
	const char *s = json_string_value(m);

	if (s != NULL && strcmp(s, "delta_low") == 0) {
		*up = false;
		return 0;
	}
	if (s != NULL && strcmp(s, "delta_up") == 0) {
		*up = true;
		return 0;
	}
	snprintf(err, errlen, "plan: \"%s\" must be \"delta_low\" or \"delta_up\"", name);
	return -EINVAL;
}

static int link_of(const char *s, enum pbox_plan_link *out)
{
	for (unsigned i = 0; s != NULL && i < 3; i++) {
		if (strcmp(s, g_link_names[i]) == 0) {
			*out = (enum pbox_plan_link)i;
			return 0;
		}
	}
	return -EINVAL;
}

int pbox_ctl_plan_decode(const json_t *j, struct pbox_plan *out, char *err, size_t errlen)
{
	static const char *const known[] = { "revision",     "delta",     "push",      "link",
					     "link_bps",     "broadcast", "delta_low", "delta_up",
					     "min_rate_bps", "parent",    "depth",     "children",
					     "phub",         NULL };
	const char *key, *ph;
	const json_t *v, *b, *ch;
	json_int_t rev, parent, depth;
	size_t i;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!json_is_object(j)) {
		snprintf(err, errlen, "plan: not an object");
		return -EINVAL;
	}
	json_object_foreach((json_t *)j, key, v)
	{
		unsigned k = 0;

		while (known[k] != NULL && strcmp(known[k], key) != 0) {
			k++;
		}
		if (known[k] == NULL) {
			snprintf(err, errlen, "plan: unknown member \"%.40s\"", key);
			return -EINVAL;
		}
	}
	rev = json_integer_value(json_object_get(j, "revision"));
	parent = json_integer_value(json_object_get(j, "parent"));
	depth = json_integer_value(json_object_get(j, "depth"));
	b = json_object_get(j, "broadcast");
	ch = json_object_get(j, "children");
	ph = json_string_value(json_object_get(j, "phub"));
	if (!json_is_integer(json_object_get(j, "revision")) || rev < 1) {
		snprintf(err, errlen, "plan: \"revision\" must be an integer >= 1");
		return -EINVAL;
	}
	out->revision = rev;
	if ((rc = num_ge0(j, "delta", &out->delta, err, errlen)) != 0 ||
	    (rc = num_ge0(j, "link_bps", &out->link_bps, err, errlen)) != 0 ||
	    (rc = num_ge0(j, "delta_low", &out->delta_low, err, errlen)) != 0 ||
	    (rc = num_ge0(j, "delta_up", &out->delta_up, err, errlen)) != 0 ||
	    (rc = num_ge0(j, "min_rate_bps", &out->min_rate_bps, err, errlen)) != 0 ||
	    (rc = select_of(json_object_get(j, "push"), "push", &out->push_up, err, errlen)) != 0) {
		return rc;
	}
	if (link_of(json_string_value(json_object_get(j, "link")), &out->link) != 0) {
		snprintf(err, errlen, "plan: \"link\" must be unknown, sufficient or insufficient");
		return -EINVAL;
	}
	if (!json_is_object(b) || json_object_size(b) != 2) {
		snprintf(err, errlen,
			 "plan: \"broadcast\" must be {\"select\": ..., \"delta\": D}");
		return -EINVAL;
	}
	if ((rc = select_of(json_object_get(b, "select"), "broadcast.select", &out->broadcast_up,
			    err, errlen)) != 0 ||
	    (rc = num_ge0(b, "delta", &out->broadcast_delta, err, errlen)) != 0) {
		return rc;
	}
	if (out->delta_low > out->delta_up) {
		snprintf(err, errlen, "plan: delta_low %g exceeds delta_up %g", out->delta_low,
			 out->delta_up);
		return -EINVAL;
	}
	if (out->delta != (out->push_up ? out->delta_up : out->delta_low) ||
	    out->broadcast_delta != (out->broadcast_up ? out->delta_up : out->delta_low)) {
		snprintf(err, errlen, "plan: a delta does not match its selection");
		return -EINVAL;
	}
	if (!json_is_integer(json_object_get(j, "parent")) || parent < -1 || parent > INT32_MAX) {
		snprintf(err, errlen, "plan: \"parent\" must be an integer rank or -1");
		return -EINVAL;
	}
	out->parent = (int32_t)parent;
	if (!json_is_integer(json_object_get(j, "depth")) || depth < 1 || depth > 1024) {
		snprintf(err, errlen, "plan: \"depth\" must be an integer 1..1024");
		return -EINVAL;
	}
	out->depth = (uint32_t)depth;
	if ((parent == -1) != (depth == 1)) {
		snprintf(err, errlen, "plan: depth 1 exactly when the parent is the appliance");
		return -EINVAL;
	}
	if (!json_is_array(ch) || json_array_size(ch) > PBOX_PLAN_MAX_CHILDREN) {
		snprintf(err, errlen, "plan: \"children\" must be an array of at most %u ranks",
			 PBOX_PLAN_MAX_CHILDREN);
		return -EINVAL;
	}
	json_array_foreach(ch, i, v)
	{
		json_int_t r = json_integer_value(v);

		if (!json_is_integer(v) || r < 0 || r > INT32_MAX || r == parent) {
			snprintf(err, errlen,
				 "plan: children[%zu] is not a rank (or is the parent)", i);
			return -EINVAL;
		}
		for (uint32_t k = 0; k < out->nchildren; k++) {
			if (out->children[k] == (uint32_t)r) {
				snprintf(err, errlen, "plan: rank %lld is a child twice",
					 (long long)r);
				return -EINVAL;
			}
		}
		out->children[out->nchildren++] = (uint32_t)r;
	}
	if (ph == NULL || strlen(ph) >= sizeof(out->phub) ||
	    (ph[0] != '\0' && strcmp(ph, "single") != 0 && strcmp(ph, "hierarchical") != 0)) {
		snprintf(err, errlen,
			 "plan: \"phub\" must be \"single\", \"hierarchical\" or \"\"");
		return -EINVAL;
	}
	snprintf(out->phub, sizeof(out->phub), "%s", ph);
	return 0;
}

int pbox_ctl_plan_slice(const json_t *plan, uint32_t rank, uint32_t workers, struct pbox_plan *out,
			char *err, size_t errlen)
{
	const json_t *tree = json_object_get(plan, "tree"),
		     *thr = json_object_get(plan, "thresholds");
	const json_t *par = json_object_get(tree, "parent"),
		     *bc = json_object_get(thr, "broadcast");
	const json_t *w = json_array_get(json_object_get(thr, "workers"), rank);
	const char *ph =
		json_string_value(json_object_get(json_object_get(plan, "phub"), "recommend"));
	json_int_t rev = json_integer_value(json_object_get(tree, "revision"));
	uint32_t at = rank, steps = 0;
	size_t i;
	const json_t *v;

	memset(out, 0, sizeof(*out));
	if (!json_is_array(par) || json_array_size(par) != workers || rank >= workers) {
		snprintf(err, errlen, "plan: no tree of %u ranks", workers);
		return -EINVAL;
	}
	out->revision = rev > 0 ? rev : 1;
	json_array_foreach(par, i, v)
	{
		json_int_t p = json_integer_value(v);

		if (!json_is_integer(v) || p < -1 || p >= (json_int_t)workers ||
		    p == (json_int_t)i) {
			snprintf(err, errlen, "plan: tree.parent[%zu] is not -1 or another rank",
				 i);
			return -EINVAL;
		}
		if (p == (json_int_t)rank) {
			if (out->nchildren >= PBOX_PLAN_MAX_CHILDREN) {
				snprintf(err, errlen, "plan: rank %u has too many children", rank);
				return -EINVAL;
			}
			out->children[out->nchildren++] = (uint32_t)i;
		}
	}
	out->parent = (int32_t)json_integer_value(json_array_get(par, rank));
	/* Depth: the steps up to the appliance (a cycle never gets there). */
	for (;;) {
		json_int_t p = json_integer_value(json_array_get(par, at));

		steps++;
		if (p < 0) {
			break;
		}
		if (steps > workers) {
			snprintf(err, errlen, "plan: the tree has a cycle through rank %u", rank);
			return -EINVAL;
		}
		at = (uint32_t)p;
	}
	out->depth = steps;
	/* Thresholds the plan does not give count as unknown / 0 (no filtering); jansson's
	 * getters take NULL. */
	out->delta_low = json_number_value(json_object_get(thr, "delta_low"));
	out->delta_up = json_number_value(json_object_get(thr, "delta_up"));
	out->min_rate_bps = json_number_value(json_object_get(thr, "min_rate_bps"));
	if (link_of(json_string_value(json_object_get(w, "link")), &out->link) != 0) {
		out->link = PBOX_PLAN_LINK_UNKNOWN;
	}
	out->link_bps = json_number_value(json_object_get(w, "bw_bps"));
	out->push_up = out->link == PBOX_PLAN_LINK_INSUFFICIENT;
	out->delta = out->push_up ? out->delta_up : out->delta_low;
	out->broadcast_up =
		json_string_value(json_object_get(bc, "select")) != NULL &&
		strcmp(json_string_value(json_object_get(bc, "select")), "delta_up") == 0;
	out->broadcast_delta = out->broadcast_up ? out->delta_up : out->delta_low;
	if (!isfinite(out->delta_low) || !isfinite(out->delta_up) || out->delta_low < 0 ||
	    out->delta_low > out->delta_up || !isfinite(out->min_rate_bps) ||
	    out->min_rate_bps < 0 || !isfinite(out->link_bps) || out->link_bps < 0) {
		snprintf(err, errlen, "plan: thresholds out of range");
		return -EINVAL;
	}
	if (ph != NULL && (strcmp(ph, "single") == 0 || strcmp(ph, "hierarchical") == 0)) {
		snprintf(out->phub, sizeof(out->phub), "%s", ph);
	}
	return 0;
}

/* An integer id 1..2^53 (exact in a double, as JSON readers elsewhere may parse it). */
static int id_of(const json_t *j, uint64_t *id, char *err, size_t errlen)
{
	json_int_t v = json_integer_value(json_object_get(j, "id"));

	if (!json_is_integer(json_object_get(j, "id")) || v < 1 || v > (1LL << 53)) {
		snprintf(err, errlen, "probe: \"id\" must be an integer 1..2^53");
		return -EINVAL;
	}
	*id = (uint64_t)v;
	return 0;
}

int pbox_ctl_probe_event_decode(const json_t *j, uint64_t *id, const json_t **request, char *err,
				size_t errlen)
{
	const char *ev = json_string_value(json_object_get(j, "event"));

	if (!json_is_object(j) || ev == NULL || strcmp(ev, "probe") != 0 ||
	    json_object_size(j) != 3) {
		snprintf(err, errlen, "probe: expected {\"event\":\"probe\",\"id\",\"request\"}");
		return -EINVAL;
	}
	*request = json_object_get(j, "request");
	if (!json_is_object(*request)) {
		snprintf(err, errlen, "probe: \"request\" must be an object");
		return -EINVAL;
	}
	return id_of(j, id, err, errlen);
}

int pbox_ctl_probe_result_decode(const json_t *j, uint64_t *id, const json_t **result,
				 int *errno_out, const char **error, char *err, size_t errlen)
{
	const char *op = json_string_value(json_object_get(j, "op"));
	const json_t *e = json_object_get(j, "errno");
	int rc;

	*result = NULL;
	*error = NULL;
	*errno_out = 0;
	if (!json_is_object(j) || op == NULL || strcmp(op, "probe_result") != 0) {
		snprintf(err, errlen, "probe_result: not a probe_result");
		return -EINVAL;
	}
	if ((rc = id_of(j, id, err, errlen)) != 0) {
		return rc;
	}
	if (json_object_size(j) == 3 && json_is_object(json_object_get(j, "result"))) {
		*result = json_object_get(j, "result");
		return 0;
	}
	if (json_object_size(j) == 4 && json_is_integer(e) && json_integer_value(e) >= 1 &&
	    json_integer_value(e) <= 4095 && json_is_string(json_object_get(j, "error"))) {
		*errno_out = (int)json_integer_value(e);
		*error = json_string_value(json_object_get(j, "error"));
		return 0;
	}
	snprintf(err, errlen,
		 "probe_result: expected {\"op\",\"id\",\"result\"} or {\"op\",\"id\","
		 "\"errno\",\"error\"}");
	return -EINVAL;
}
