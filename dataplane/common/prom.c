/* SPDX-License-Identifier: BSD-3-Clause */
/* The Prometheus text format, bounded (prom.h). */
#include "prom.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kept back for the truncation marker's family and sample. */
#define PROM_RESERVE 192u

int pbox_prom_init(struct pbox_prom *p, size_t max)
{
	memset(p, 0, sizeof(*p));
	p->max = max < 256 ? 256 : max;
	p->cap = p->max < 65536 ? p->max : 65536;
	p->buf = malloc(p->cap);
	if (p->buf == NULL) {
		return -ENOMEM;
	}
	p->buf[0] = '\0';
	return 0;
}

void pbox_prom_free(struct pbox_prom *p)
{
	free(p->buf);
	p->buf = NULL;
}

bool pbox_prom_valid_name(const char *name, bool label)
{
	if (name == NULL || *name == '\0') {
		return false;
	}
	for (const char *c = name; *c != '\0'; c++) {
		bool alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' ||
			     (!label && *c == ':');

		if (!alpha && !(c != name && *c >= '0' && *c <= '9')) {
			return false;
		}
	}
	return true;
}

/* Append line (n bytes) whole, or set truncated. limit: bytes usable. */
static void put(struct pbox_prom *p, const char *line, size_t n, size_t limit)
{
	if (p->buf == NULL || p->truncated || p->len + n + 1 > limit) {
		p->truncated = true;
		return;
	}
	if (p->len + n + 1 > p->cap) {
		size_t cap = p->cap;
		char *b;

		while (cap < p->len + n + 1) {
			cap *= 2;
		}
		cap = cap > p->max ? p->max : cap;
		b = realloc(p->buf, cap);
		if (b == NULL) {
			p->truncated = true;
			return;
		}
		p->buf = b;
		p->cap = cap;
	}
	memcpy(p->buf + p->len, line, n);
	p->len += n;
	p->buf[p->len] = '\0';
}

/* A growing scratch line. */
struct line {
	char *s;
	size_t len, cap;
	bool bad;
};

static void lput(struct line *l, const char *s, size_t n)
{
	if (l->bad) {
		return;
	}
	if (l->len + n + 1 > l->cap) {
		size_t cap = l->cap ? l->cap : 256;
		char *b;

		while (cap < l->len + n + 1) {
			cap *= 2;
		}
		b = realloc(l->s, cap);
		if (b == NULL) {
			l->bad = true;
			return;
		}
		l->s = b;
		l->cap = cap;
	}
	memcpy(l->s + l->len, s, n);
	l->len += n;
	l->s[l->len] = '\0';
}

static void lputs(struct line *l, const char *s)
{
	lput(l, s, strlen(s));
}

/* Escape \ and newline (HELP), and " too (label values). */
static void lput_escaped(struct line *l, const char *s, bool quote)
{
	for (; *s != '\0'; s++) {
		if (*s == '\\') {
			lput(l, "\\\\", 2);
		} else if (*s == '\n') {
			lput(l, "\\n", 2);
		} else if (quote && *s == '"') {
			lput(l, "\\\"", 2);
		} else {
			lput(l, s, 1);
		}
	}
}

static void family(struct pbox_prom *p, const char *name, const char *type, const char *help,
		   size_t limit)
{
	struct line l = { 0 };

	if (!pbox_prom_valid_name(name, false)) {
		p->dropped++;
		return;
	}
	lputs(&l, "# HELP ");
	lputs(&l, name);
	lputs(&l, " ");
	lput_escaped(&l, help, false);
	lputs(&l, "\n# TYPE ");
	lputs(&l, name);
	lputs(&l, " ");
	lputs(&l, type);
	lputs(&l, "\n");
	if (l.bad) {
		p->truncated = true;
	} else {
		put(p, l.s, l.len, limit);
	}
	free(l.s);
}

void pbox_prom_family(struct pbox_prom *p, const char *name, const char *type, const char *help)
{
	family(p, name, type, help, p->max - PROM_RESERVE);
}

static void sample(struct pbox_prom *p, const char *name, const char *const *labels,
		   const char *value, size_t limit)
{
	struct line l = { 0 };

	if (!pbox_prom_valid_name(name, false)) {
		p->dropped++;
		return;
	}
	lputs(&l, name);
	if (labels != NULL && labels[0] != NULL) {
		lputs(&l, "{");
		for (size_t i = 0; labels[i] != NULL && labels[i + 1] != NULL; i += 2) {
			if (!pbox_prom_valid_name(labels[i], true)) {
				p->dropped++;
				free(l.s);
				return;
			}
			if (i) {
				lputs(&l, ",");
			}
			lputs(&l, labels[i]);
			lputs(&l, "=\"");
			lput_escaped(&l, labels[i + 1], true);
			lputs(&l, "\"");
		}
		lputs(&l, "}");
	}
	lputs(&l, " ");
	lputs(&l, value);
	lputs(&l, "\n");
	if (l.bad) {
		p->truncated = true;
	} else {
		put(p, l.s, l.len, limit);
	}
	free(l.s);
}

void pbox_prom_u64(struct pbox_prom *p, const char *name, const char *const *labels, uint64_t v)
{
	char b[32];

	snprintf(b, sizeof(b), "%" PRIu64, v);
	sample(p, name, labels, b, p->max - PROM_RESERVE);
}

void pbox_prom_f64(struct pbox_prom *p, const char *name, const char *const *labels, double v)
{
	char b[40];

	if (isnan(v)) {
		snprintf(b, sizeof(b), "NaN");
	} else if (isinf(v)) {
		snprintf(b, sizeof(b), v > 0 ? "+Inf" : "-Inf");
	} else {
		snprintf(b, sizeof(b), "%.17g", v);
	}
	sample(p, name, labels, b, p->max - PROM_RESERVE);
}

const char *pbox_prom_finish(struct pbox_prom *p)
{
	bool t = p->truncated;

	p->truncated = false; /* the marker goes into the kept-back room */
	family(p, "pbox_metrics_truncated", "gauge",
	       "1 if series were left out to keep the response within its size bound", p->max);
	sample(p, "pbox_metrics_truncated", NULL, t ? "1" : "0", p->max);
	p->truncated = t;
	return p->buf;
}
