/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reading libconfig settings with one error convention, shared by pboxd's and
 * pbox-ctrld's configuration files and by job descriptions (so the control-plane split
 * creates no import loop: LAYOUT.md seam 2).
 *
 * Every error is written to the context's err as "file:line: path: message" (path like
 * "jobs[0].sync.model"; without ":line" for settings built in memory, e.g. from a JSON
 * job description) and returned as -EINVAL. Getters leave *out alone when the setting is
 * absent (defaults are the caller's) and return 0.
 *
 * Thread safety: none needed; a context belongs to one caller.
 */
#ifndef PBOX_CONFKIT_H
#define PBOX_CONFKIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libconfig.h>

#include "common/compiler.h"

/* Error context: the file (or another origin, e.g. "job description"). */
struct pbox_confkit {
	const char *file;
	char *err;
	size_t errlen;
};

/* Write "file:line: path: message" for setting s; returns -EINVAL. */
int pbox_conf_bad(struct pbox_confkit *c, const config_setting_t *s, const char *fmt, ...)
	PBOX_PRINTF(3, 4);

/* Every member of group g is one of allowed (NULL-terminated), else -EINVAL listing them. */
int pbox_conf_only(struct pbox_confkit *c, const config_setting_t *g, const char *const *allowed);

/* Member name of g: an integer in lo..hi. */
int pbox_conf_u32(struct pbox_confkit *c, const config_setting_t *g, const char *name, uint32_t lo,
		  uint32_t hi, uint32_t *out);
/* Member name of g: a number (integer or float) in lo..hi. */
int pbox_conf_float(struct pbox_confkit *c, const config_setting_t *g, const char *name, double lo,
		    double hi, float *out);
int pbox_conf_bool(struct pbox_confkit *c, const config_setting_t *g, const char *name, bool *out);
/* Member name of g: a string shorter than len. *where (if not NULL): the setting, NULL when
 * absent. */
int pbox_conf_str(struct pbox_confkit *c, const config_setting_t *g, const char *name, char *out,
		  size_t len, const config_setting_t **where);
/* Member name of g: one of names (NULL-terminated); *out becomes its index. `what` names it
 * in the error. */
int pbox_conf_choice(struct pbox_confkit *c, const config_setting_t *g, const char *name,
		     const char *what, const char *const *names, int *out);

#endif /* PBOX_CONFKIT_H */
