/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A bounded writer of the Prometheus text exposition format (version 0.0.4), for the
 * /metrics endpoints of pboxd and pbox-ctrld (common/metrics.h).
 *
 * Each metric family is opened once with pbox_prom_family (its "# HELP" and "# TYPE"
 * lines; HELP text escaped: backslash and newline), then its samples follow with
 * pbox_prom_u64 / pbox_prom_f64: name{label="value",...} value, label values escaped
 * (backslash, double quote, newline). Names and label names are the caller's constants
 * and must match [a-zA-Z_:][a-zA-Z0-9_:]* / [a-zA-Z_][a-zA-Z0-9_]* (checked: a bad one is
 * skipped and counted in `dropped`). Samples of one family must be written together.
 *
 * The text never exceeds max bytes: a family or sample that does not fit is left out
 * whole (no partial line), `truncated` is set, and pbox_prom_finish appends
 * pbox_metrics_truncated (room for it is kept back), so a scraper sees that data is
 * missing instead of a cut line.
 *
 * Thread safety: a writer belongs to one thread.
 */
#ifndef PBOX_PROM_H
#define PBOX_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pbox_prom {
	char *buf; /* NUL-terminated text (NULL after an allocation failure) */
	size_t len;
	size_t cap;
	size_t max;
	bool truncated;
	uint64_t dropped; /* samples with invalid names */
};

/* label pairs: { "core", "0", "reason", "bad_magic", NULL } */
typedef const char *const pbox_prom_labels[];

/* An empty text of at most max bytes (>= 256). 0 or -ENOMEM. */
int pbox_prom_init(struct pbox_prom *p, size_t max);
void pbox_prom_free(struct pbox_prom *p);

/* "# HELP name help" and "# TYPE name type" (type: counter, gauge, untyped). */
void pbox_prom_family(struct pbox_prom *p, const char *name, const char *type, const char *help);

/* One sample; labels NULL or NULL-terminated name/value pairs. */
void pbox_prom_u64(struct pbox_prom *p, const char *name, const char *const *labels, uint64_t v);
void pbox_prom_f64(struct pbox_prom *p, const char *name, const char *const *labels, double v);

/* Append the truncation marker when needed; returns the text (owned by p). */
const char *pbox_prom_finish(struct pbox_prom *p);

/* name is a valid metric name (true) / label name (label: true). */
bool pbox_prom_valid_name(const char *name, bool label);

#endif /* PBOX_PROM_H */
