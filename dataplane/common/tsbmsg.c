/* SPDX-License-Identifier: BSD-3-Clause */
/* TSB's control-channel messages (see tsbmsg.h). */
#include "tsbmsg.h"
#include "hostport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

int pbox_tsb_addr_parse(const char *s, struct pbox_peer *p)
{
	char host[INET_ADDRSTRLEN];
	uint16_t port;
	struct in_addr a;

	if (pbox_hostport_split(s, false, 1, host, sizeof(host), &port) != 0 ||
	    inet_pton(AF_INET, host, &a) != 1) {
		return -EINVAL;
	}
	memset(p, 0, sizeof(*p));
	p->ip = a.s_addr;
	p->port = htons(port);
	return 0;
}

void pbox_tsb_addr_fmt(const struct pbox_peer *p, char *out, size_t len)
{
	char host[INET_ADDRSTRLEN];
	struct in_addr a = { .s_addr = p->ip };

	inet_ntop(AF_INET, &a, host, sizeof(host));
	snprintf(out, len, "%s:%u", host, ntohs(p->port));
}

json_t *pbox_tsb_pos_encode(const struct pbox_tsb_pos *pos)
{
	char addr[32];
	json_t *o, *ch = json_array();

	for (uint32_t c = 0; c < pos->nchildren && ch != NULL; c++) {
		pbox_tsb_addr_fmt(&pos->child_addr[c], addr, sizeof(addr));
		if (json_array_append_new(
			    ch, json_pack("[I, s]", (json_int_t)pos->child[c], addr)) != 0) {
			json_decref(ch);
			return NULL;
		}
	}
	o = json_pack("{s:s, s:I, s:I, s:o}", "event", "tsb", "revision", (json_int_t)pos->revision,
		      "parent",
		      pos->parent == PBOX_TSB_ROOT ? (json_int_t)-1 : (json_int_t)pos->parent,
		      "children", ch);
	if (o != NULL && pos->parent != PBOX_TSB_ROOT) {
		pbox_tsb_addr_fmt(&pos->parent_addr, addr, sizeof(addr));
		if (json_object_set_new(o, "parent_addr", json_string(addr)) != 0) {
			json_decref(o);
			return NULL;
		}
	}
	return o;
}

int pbox_tsb_pos_decode(const json_t *j, uint32_t workers, uint32_t self, struct pbox_tsb_pos *pos,
			char *err, size_t errlen)
{
	const json_t *ev, *rev, *par, *paddr, *ch, *v;
	const char *key;
	json_int_t p;
	size_t i;

	if (!json_is_object(j)) {
		return bad(err, errlen, "tsb event: not an object");
	}
	json_object_foreach((json_t *)j, key, v)
	{
		if (strcmp(key, "event") != 0 && strcmp(key, "revision") != 0 &&
		    strcmp(key, "parent") != 0 && strcmp(key, "parent_addr") != 0 &&
		    strcmp(key, "children") != 0) {
			return bad(err, errlen, "tsb event: unknown member '%.64s'", key);
		}
	}
	ev = json_object_get(j, "event");
	rev = json_object_get(j, "revision");
	par = json_object_get(j, "parent");
	paddr = json_object_get(j, "parent_addr");
	ch = json_object_get(j, "children");
	if (!json_is_string(ev) || strcmp(json_string_value(ev), "tsb") != 0) {
		return bad(err, errlen, "tsb event: 'event' must be \"tsb\"");
	}
	if (!json_is_integer(rev) || json_integer_value(rev) < 1) {
		return bad(err, errlen, "tsb event: 'revision' must be an integer >= 1");
	}
	if (!json_is_integer(par)) {
		return bad(err, errlen, "tsb event: 'parent' must be an integer");
	}
	p = json_integer_value(par);
	if (p < -1 || p >= (json_int_t)workers || p == (json_int_t)self) {
		return bad(err, errlen,
			   "tsb event: 'parent' must be -1 or a rank 0..%u other than %u",
			   workers - 1, self);
	}
	memset(pos, 0, sizeof(*pos));
	pos->revision = (uint64_t)json_integer_value(rev);
	pos->parent = p < 0 ? PBOX_TSB_ROOT : (uint32_t)p;
	if ((p < 0) != (paddr == NULL)) {
		return bad(err, errlen,
			   "tsb event: 'parent_addr' must be given exactly when "
			   "'parent' is a rank");
	}
	if (paddr != NULL &&
	    (!json_is_string(paddr) ||
	     pbox_tsb_addr_parse(json_string_value(paddr), &pos->parent_addr) != 0)) {
		return bad(err, errlen, "tsb event: 'parent_addr' must be \"a.b.c.d:port\"");
	}
	if (!json_is_array(ch) || json_array_size(ch) > PBOX_TSB_MAX_DEGREE) {
		return bad(err, errlen, "tsb event: 'children' must be an array of at most %u",
			   PBOX_TSB_MAX_DEGREE);
	}
	json_array_foreach(ch, i, v)
	{
		const json_t *r = json_array_get(v, 0), *a = json_array_get(v, 1);
		json_int_t rank;

		if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(r) ||
		    !json_is_string(a)) {
			return bad(err, errlen, "tsb event: children[%zu] must be [rank, \"addr\"]",
				   i);
		}
		rank = json_integer_value(r);
		if (rank < 0 || rank >= (json_int_t)workers || rank == (json_int_t)self ||
		    rank == p) {
			return bad(err, errlen,
				   "tsb event: children[%zu]: rank must be 0..%u, not %u nor the "
				   "parent",
				   i, workers - 1, self);
		}
		for (uint32_t c = 0; c < pos->nchildren; c++) {
			if (pos->child[c] == (uint32_t)rank) {
				return bad(err, errlen, "tsb event: children[%zu]: rank %lld twice",
					   i, (long long)rank);
			}
		}
		if (pbox_tsb_addr_parse(json_string_value(a), &pos->child_addr[pos->nchildren]) !=
		    0) {
			return bad(err, errlen,
				   "tsb event: children[%zu]: address must be \"a.b.c.d:port\"", i);
		}
		pos->child[pos->nchildren++] = (uint32_t)rank;
	}
	return 0;
}
