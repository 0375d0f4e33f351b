/* SPDX-License-Identifier: BSD-3-Clause */
/* Typed, range-checked libconfig settings with precise errors (see confkit.h). */
#include "confkit.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void setting_path(const config_setting_t *s, char *buf, size_t len)
{
	char tmp[256];
	const config_setting_t *p = config_setting_parent(s);

	if (p == NULL || config_setting_is_root(p)) {
		snprintf(buf, len, "%s", config_setting_name(s) ? config_setting_name(s) : "");
		return;
	}
	setting_path(p, tmp, sizeof(tmp));
	if (config_setting_name(s) != NULL) {
		snprintf(buf, len, "%s.%s", tmp, config_setting_name(s));
	} else {
		snprintf(buf, len, "%s[%d]", tmp, config_setting_index(s));
	}
}

int pbox_conf_bad(struct pbox_confkit *c, const config_setting_t *s, const char *fmt, ...)
{
	char path[256], msg[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	setting_path(s, path, sizeof(path));
	/* Settings built from a JSON job description have no line. */
	if (config_setting_source_line(s) == 0) {
		snprintf(c->err, c->errlen, "%s: %s: %s", c->file, path, msg);
	} else {
		snprintf(c->err, c->errlen, "%s:%u: %s: %s", c->file, config_setting_source_line(s),
			 path, msg);
	}
	return -EINVAL;
}

/* Every member of group g must be one of the allowed names. */
int pbox_conf_only(struct pbox_confkit *c, const config_setting_t *g, const char *const *allowed)
{
	for (int i = 0; i < config_setting_length(g); i++) {
		const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
		const char *name = config_setting_name(s);
		bool ok = false;

		for (const char *const *a = allowed; *a != NULL && !ok; a++) {
			ok = strcmp(*a, name) == 0;
		}
		if (!ok) {
			char list[512] = "";

			for (const char *const *a = allowed; *a != NULL; a++) {
				strncat(list, *a, sizeof(list) - strlen(list) - 3);
				if (a[1] != NULL) {
					strncat(list, ", ", sizeof(list) - strlen(list) - 1);
				}
			}
			return pbox_conf_bad(c, s, "unknown setting (expected one of: %s)", list);
		}
	}
	return 0;
}

int pbox_conf_u32(struct pbox_confkit *c, const config_setting_t *g, const char *name, uint32_t lo,
		  uint32_t hi, uint32_t *out)
{
	const config_setting_t *s = config_setting_get_member(g, name);
	long long v;

	if (s == NULL) {
		return 0;
	}
	if (config_setting_type(s) != CONFIG_TYPE_INT &&
	    config_setting_type(s) != CONFIG_TYPE_INT64) {
		return pbox_conf_bad(c, s, "must be an integer");
	}
	v = config_setting_get_int64(s);
	if (v < (long long)lo || v > (long long)hi) {
		return pbox_conf_bad(c, s, "must be between %u and %u (got %lld)", lo, hi, v);
	}
	*out = (uint32_t)v;
	return 0;
}

int pbox_conf_float(struct pbox_confkit *c, const config_setting_t *g, const char *name, double lo,
		    double hi, float *out)
{
	const config_setting_t *s = config_setting_get_member(g, name);
	double v;

	if (s == NULL) {
		return 0;
	}
	switch (config_setting_type(s)) {
	case CONFIG_TYPE_FLOAT:
		v = config_setting_get_float(s);
		break;
	case CONFIG_TYPE_INT:
	case CONFIG_TYPE_INT64:
		v = (double)config_setting_get_int64(s);
		break;
	default:
		return pbox_conf_bad(c, s, "must be a number");
	}
	if (!(v >= lo && v <= hi)) {
		return pbox_conf_bad(c, s, "must be between %g and %g (got %g)", lo, hi, v);
	}
	*out = (float)v;
	return 0;
}

int pbox_conf_bool(struct pbox_confkit *c, const config_setting_t *g, const char *name, bool *out)
{
	const config_setting_t *s = config_setting_get_member(g, name);

	if (s == NULL) {
		return 0;
	}
	if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
		return pbox_conf_bad(c, s, "must be true or false");
	}
	*out = config_setting_get_bool(s) != 0;
	return 0;
}

int pbox_conf_str(struct pbox_confkit *c, const config_setting_t *g, const char *name, char *out,
		  size_t len, const config_setting_t **where)
{
	const config_setting_t *s = config_setting_get_member(g, name);
	const char *v;

	if (where != NULL) {
		*where = s;
	}
	if (s == NULL) {
		return 0;
	}
	if (config_setting_type(s) != CONFIG_TYPE_STRING) {
		return pbox_conf_bad(c, s, "must be a string");
	}
	v = config_setting_get_string(s);
	if (strlen(v) >= len) {
		return pbox_conf_bad(c, s, "too long (at most %zu characters)", len - 1);
	}
	snprintf(out, len, "%s", v);
	return 0;
}

/* A string setting that must be one of names[] (NULL-terminated): *out becomes its index,
 * and is left alone when the setting is absent. `what` names it in the error. */
int pbox_conf_choice(struct pbox_confkit *c, const config_setting_t *g, const char *name,
		     const char *what, const char *const *names, int *out)
{
	const config_setting_t *where;
	char buf[64], list[160] = "";
	size_t len = 0;
	int rc = pbox_conf_str(c, g, name, buf, sizeof(buf), &where);

	if (rc != 0 || where == NULL) {
		return rc;
	}
	for (int i = 0; names[i] != NULL; i++) {
		if (strcmp(buf, names[i]) == 0) {
			*out = i;
			return 0;
		}
		if (len < sizeof(list)) {
			len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s",
						i == 0 ? "" : ", ", names[i]);
		}
	}
	return pbox_conf_bad(c, where, "unknown %s '%s' (%s)", what, buf, list);
}
