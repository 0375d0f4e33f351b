/* SPDX-License-Identifier: BSD-3-Clause */
/* Job descriptions: JSON <-> libconfig groups, and the job-administration messages. */
#include "jobspec.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct conv {
	size_t nodes;
	char *err;
	size_t errlen;
};

static bool valid_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > PBOX_JOBSPEC_MAX_NAME) {
		return false;
	}
	if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '*')) {
		return false;
	}
	for (size_t i = 1; i < n; i++) {
		char ch = s[i];

		if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '*')) {
			return false;
		}
	}
	return true;
}

static bool fits_int32(json_int_t v)
{
	return v >= INT32_MIN && v <= INT32_MAX;
}

/* The libconfig type an array becomes: CONFIG_TYPE_ARRAY when every element is a scalar
 * of one kind (then *elem is that kind), else CONFIG_TYPE_LIST. */
static int array_kind(const json_t *a, int *elem)
{
	size_t i;
	const json_t *v;
	int kind = CONFIG_TYPE_NONE;

	if (json_array_size(a) == 0) {
		return CONFIG_TYPE_LIST;
	}
	json_array_foreach(a, i, v)
	{
		int k;

		switch (json_typeof(v)) {
		case JSON_INTEGER:
			k = fits_int32(json_integer_value(v)) ? CONFIG_TYPE_INT : CONFIG_TYPE_INT64;
			if ((kind == CONFIG_TYPE_INT && k == CONFIG_TYPE_INT64) ||
			    (kind == CONFIG_TYPE_INT64 && k == CONFIG_TYPE_INT)) {
				kind = CONFIG_TYPE_INT64;
				continue;
			}
			break;
		case JSON_REAL:
			k = CONFIG_TYPE_FLOAT;
			break;
		case JSON_STRING:
			k = CONFIG_TYPE_STRING;
			break;
		case JSON_TRUE:
		case JSON_FALSE:
			k = CONFIG_TYPE_BOOL;
			break;
		default:
			return CONFIG_TYPE_LIST;
		}
		if (kind != CONFIG_TYPE_NONE && kind != k) {
			return CONFIG_TYPE_LIST;
		}
		kind = k;
	}
	*elem = kind;
	return CONFIG_TYPE_ARRAY;
}

static int fail(struct conv *c, const char *path, const char *msg)
{
	snprintf(c->err, c->errlen, "%s: %s", path, msg);
	return -EINVAL;
}

static int to_setting(struct conv *c, const json_t *v, config_setting_t *parent, const char *name,
		      const char *path, unsigned depth, int forced_type);

static int fill_aggregate(struct conv *c, const json_t *v, config_setting_t *s, const char *path,
			  unsigned depth, int elem_type)
{
	char sub[256];

	if (json_is_object(v)) {
		const char *key;
		const json_t *m;

		json_object_foreach((json_t *)v, key, m)
		{
			int rc;

			snprintf(sub, sizeof(sub), "%s.%s", path, key);
			if (!valid_name(key)) {
				return fail(c, sub,
					    "not a setting name (letters, digits, '-', '_', at "
					    "most 64 bytes, starting with a letter)");
			}
			rc = to_setting(c, m, s, key, sub, depth + 1, CONFIG_TYPE_NONE);
			if (rc != 0) {
				return rc;
			}
		}
		return 0;
	}
	for (size_t i = 0; i < json_array_size(v); i++) {
		int rc;

		snprintf(sub, sizeof(sub), "%s[%zu]", path, i);
		rc = to_setting(c, json_array_get(v, i), s, NULL, sub, depth + 1, elem_type);
		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

static int to_setting(struct conv *c, const json_t *v, config_setting_t *parent, const char *name,
		      const char *path, unsigned depth, int forced_type)
{
	config_setting_t *s;
	int type, elem = CONFIG_TYPE_NONE;

	if (++c->nodes > PBOX_JOBSPEC_MAX_NODES) {
		return fail(c, path, "too many values in one job description");
	}
	if (depth > PBOX_JOBSPEC_MAX_DEPTH) {
		return fail(c, path, "nested too deeply");
	}
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		type = CONFIG_TYPE_GROUP;
		break;
	case JSON_ARRAY:
		type = array_kind(v, &elem);
		break;
	case JSON_INTEGER:
		type = fits_int32(json_integer_value(v)) ? CONFIG_TYPE_INT : CONFIG_TYPE_INT64;
		break;
	case JSON_REAL:
		if (!isfinite(json_real_value(v))) {
			return fail(c, path, "not a finite number");
		}
		type = CONFIG_TYPE_FLOAT;
		break;
	case JSON_STRING:
		if (json_string_length(v) > PBOX_JOBSPEC_MAX_STRING ||
		    strlen(json_string_value(v)) != json_string_length(v)) {
			return fail(c, path, "a string longer than 1024 bytes or with a NUL byte");
		}
		type = CONFIG_TYPE_STRING;
		break;
	case JSON_TRUE:
	case JSON_FALSE:
		type = CONFIG_TYPE_BOOL;
		break;
	default:
		return fail(c, path, "null is not a setting value");
	}
	/* An array's elements all take its element type (an int among int64s widens). */
	if (forced_type != CONFIG_TYPE_NONE) {
		type = forced_type;
	}
	if (parent != NULL && config_setting_is_group(parent) &&
	    config_setting_get_member(parent, name) != NULL) {
		return fail(c, path, "given twice");
	}
	s = config_setting_add(parent, name, type);
	if (s == NULL) {
		return fail(c, path, "cannot be stored (out of memory or an invalid value)");
	}
	switch (type) {
	case CONFIG_TYPE_GROUP:
	case CONFIG_TYPE_LIST:
	case CONFIG_TYPE_ARRAY:
		return fill_aggregate(c, v, s, path, depth, elem);
	case CONFIG_TYPE_INT:
		config_setting_set_int(s, (int)json_integer_value(v));
		return 0;
	case CONFIG_TYPE_INT64:
		config_setting_set_int64(s, (long long)json_integer_value(v));
		return 0;
	case CONFIG_TYPE_FLOAT:
		config_setting_set_float(s, json_number_value(v));
		return 0;
	case CONFIG_TYPE_STRING:
		config_setting_set_string(s, json_string_value(v));
		return 0;
	default:
		config_setting_set_bool(s, json_is_true(v));
		return 0;
	}
}

int pbox_jobspec_to_setting(const json_t *desc, config_setting_t *parent, const char *name,
			    char *err, size_t errlen)
{
	struct conv c = { .err = err, .errlen = errlen };
	int rc;

	if (!json_is_object(desc)) {
		snprintf(err, errlen, "%s: a job description must be a JSON object", name);
		return -EINVAL;
	}
	rc = to_setting(&c, desc, parent, name, name, 1, CONFIG_TYPE_NONE);
	if (rc != 0) {
		config_setting_t *g = config_setting_get_member(parent, name);

		if (g != NULL) {
			config_setting_remove(parent, name);
		}
	}
	return rc;
}

json_t *pbox_jobspec_from_setting(const config_setting_t *g)
{
	json_t *o = NULL;
	int n;

	switch (config_setting_type(g)) {
	case CONFIG_TYPE_GROUP:
	case CONFIG_TYPE_LIST:
	case CONFIG_TYPE_ARRAY:
		o = config_setting_is_group(g) ? json_object() : json_array();
		n = config_setting_length(g);
		for (int i = 0; o != NULL && i < n; i++) {
			const config_setting_t *e = config_setting_get_elem(g, (unsigned)i);
			json_t *v = pbox_jobspec_from_setting(e);

			if (v == NULL ||
			    (config_setting_is_group(g)
				     ? json_object_set_new(o, config_setting_name(e), v)
				     : json_array_append_new(o, v)) != 0) {
				json_decref(o);
				return NULL;
			}
		}
		return o;
	case CONFIG_TYPE_INT:
	case CONFIG_TYPE_INT64:
		return json_integer(config_setting_get_int64(g));
	case CONFIG_TYPE_FLOAT:
		return json_real(config_setting_get_float(g));
	case CONFIG_TYPE_STRING:
		return json_string(config_setting_get_string(g));
	case CONFIG_TYPE_BOOL:
		return json_boolean(config_setting_get_bool(g));
	default:
		return json_null();
	}
}

int pbox_jobspec_id(const json_t *desc, uint32_t *id)
{
	const json_t *v = json_object_get(desc, "id");

	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > (json_int_t)UINT32_MAX) {
		return -EINVAL;
	}
	*id = (uint32_t)json_integer_value(v);
	return 0;
}

static json_t *with_token(json_t *o, const char *admin_token)
{
	if (o != NULL && admin_token != NULL && admin_token[0] != '\0' &&
	    json_object_set_new(o, "admin_token", json_string(admin_token)) != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *pbox_jobmsg_create(const json_t *desc, const char *admin_token)
{
	return with_token(json_pack("{s:s, s:O}", "op", "job_create", "job", desc), admin_token);
}

json_t *pbox_jobmsg_create_plan(const json_t *desc, const json_t *plan, const char *admin_token)
{
	json_t *o = pbox_jobmsg_create(desc, admin_token);

	if (o != NULL && plan != NULL && json_object_set(o, "plan", (json_t *)plan) != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *pbox_jobmsg_rm(uint32_t id, const char *admin_token)
{
	return with_token(json_pack("{s:s, s:I}", "op", "job_rm", "id", (json_int_t)id),
			  admin_token);
}

json_t *pbox_jobmsg_list(const char *admin_token)
{
	return with_token(json_pack("{s:s}", "op", "job_list"), admin_token);
}

/* The plan member of job_create / job_plan: {"tree": object|null, "thresholds": object|null,
 * "phub": object|null (pbox-ctrld's PHub recommendation, optional)} and, in the tree, an
 * optional "revision" (an integer >= 0). */
static int check_plan(const json_t *plan, const char *op, char *err, size_t errlen)
{
	const char *key;
	const json_t *pv, *rev;

	if (!json_is_object(plan)) {
		snprintf(err, errlen, "%s: \"plan\" must be an object", op);
		return -EINVAL;
	}
	json_object_foreach((json_t *)plan, key, pv)
	{
		if ((strcmp(key, "tree") != 0 && strcmp(key, "thresholds") != 0 &&
		     strcmp(key, "phub") != 0) ||
		    !(json_is_object(pv) || json_is_null(pv))) {
			snprintf(err, errlen,
				 "%s: plan.%.64s: a plan has \"tree\", \"thresholds\" and "
				 "\"phub\" (objects or null) only",
				 op, key);
			return -EINVAL;
		}
	}
	rev = json_object_get(json_object_get(plan, "tree"), "revision");
	if (rev != NULL && (!json_is_integer(rev) || json_integer_value(rev) < 0)) {
		snprintf(err, errlen, "%s: plan.tree.revision must be an integer >= 0", op);
		return -EINVAL;
	}
	return 0;
}

int64_t pbox_jobspec_plan_revision(const json_t *plan)
{
	const json_t *rev = json_object_get(json_object_get(plan, "tree"), "revision");

	return json_is_integer(rev) && json_integer_value(rev) >= 0 ? json_integer_value(rev) : 0;
}

json_t *pbox_jobmsg_plan(uint32_t id, const json_t *plan, const char *admin_token)
{
	json_t *o =
		json_pack("{s:s, s:I, s:O}", "op", "job_plan", "id", (json_int_t)id, "plan", plan);

	if (o != NULL && admin_token != NULL && admin_token[0] != '\0' &&
	    json_object_set_new(o, "admin_token", json_string(admin_token)) != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int pbox_jobmsg_decode(const json_t *req, struct pbox_jobmsg *m, char *err, size_t errlen)
{
	const char *op = json_string_value(json_object_get(req, "op"));
	const json_t *tok = json_object_get(req, "admin_token"), *v;

	memset(m, 0, sizeof(*m));
	if (op == NULL) {
		return -ENOENT;
	}
	if (strcmp(op, "job_create") == 0) {
		m->op = PBOX_JOBMSG_CREATE;
	} else if (strcmp(op, "job_rm") == 0) {
		m->op = PBOX_JOBMSG_RM;
	} else if (strcmp(op, "job_list") == 0) {
		m->op = PBOX_JOBMSG_LIST;
	} else if (strcmp(op, "job_plan") == 0) {
		m->op = PBOX_JOBMSG_PLAN;
	} else {
		return -ENOENT;
	}
	if (tok != NULL && !json_is_string(tok)) {
		snprintf(err, errlen, "%s: admin_token must be a string", op);
		return -EINVAL;
	}
	m->admin_token = json_string_value(tok);
	switch (m->op) {
	case PBOX_JOBMSG_CREATE:
		m->job = json_object_get(req, "job");
		if (!json_is_object(m->job)) {
			snprintf(err, errlen,
				 "job_create needs \"job\": a job description object (the settings "
				 "of a configuration file's job group)");
			return -EINVAL;
		}
		m->plan = json_object_get(req, "plan");
		if (m->plan != NULL) {
			return check_plan(m->plan, "job_create", err, errlen);
		}
		return 0;
	case PBOX_JOBMSG_PLAN:
		v = json_object_get(req, "id");
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > (json_int_t)UINT32_MAX) {
			snprintf(err, errlen, "job_plan needs an integer \"id\" in 0..4294967295");
			return -EINVAL;
		}
		m->id = (uint32_t)json_integer_value(v);
		m->plan = json_object_get(req, "plan");
		if (m->plan == NULL) {
			snprintf(err, errlen, "job_plan of job %u needs \"plan\"", m->id);
			return -EINVAL;
		}
		return check_plan(m->plan, "job_plan", err, errlen);
	case PBOX_JOBMSG_RM:
		v = json_object_get(req, "id");
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > (json_int_t)UINT32_MAX) {
			snprintf(err, errlen, "job_rm needs an integer \"id\" in 0..4294967295");
			return -EINVAL;
		}
		m->id = (uint32_t)json_integer_value(v);
		return 0;
	default:
		return 0;
	}
}

/* "0:784000,1:1000" -> [[0,784000],[1,1000]] */
static json_t *parse_keys_kv(const char *v)
{
	json_t *arr = json_array();
	const char *p = v;

	while (arr != NULL && *p != '\0') {
		unsigned long long id, n;
		char *end;

		errno = 0;
		id = strtoull(p, &end, 10);
		if (end == p || *end != ':' || errno != 0) {
			goto bad;
		}
		p = end + 1;
		n = strtoull(p, &end, 10);
		if (end == p || (*end != ',' && *end != '\0') || errno != 0 || id > INT64_MAX ||
		    n > INT64_MAX) {
			goto bad;
		}
		json_array_append_new(arr, json_pack("[I, I]", (json_int_t)id, (json_int_t)n));
		p = *end == ',' ? end + 1 : end;
	}
	if (arr != NULL && json_array_size(arr) == 0) {
		goto bad;
	}
	return arr;
bad:
	json_decref(arr);
	return NULL;
}

/* The JSON value of a command-line word: an integer, a number, true/false, else a string. */
static json_t *kv_value(const char *v)
{
	char *end;
	long long i;
	double d;

	if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
		return json_boolean(v[0] == 't');
	}
	errno = 0;
	i = strtoll(v, &end, 10);
	if (end != v && *end == '\0' && errno == 0) {
		return json_integer(i);
	}
	d = strtod(v, &end);
	if (end != v && *end == '\0' && isfinite(d)) {
		return json_real(d);
	}
	return json_string(v);
}

int pbox_jobspec_set_kv(json_t *desc, const char *kv, char *err, size_t errlen)
{
	const char *eq = strchr(kv, '=');
	char path[256], *tok, *save = NULL, *next;
	json_t *obj = desc, *val;

	if (eq == NULL || eq == kv || (size_t)(eq - kv) >= sizeof(path)) {
		snprintf(err, errlen,
			 "'%s': expected SETTING=VALUE (e.g. workers=2, sync.model=ssp)", kv);
		return -EINVAL;
	}
	memcpy(path, kv, (size_t)(eq - kv));
	path[eq - kv] = '\0';
	if (path[0] == '.' || path[strlen(path) - 1] == '.' || strstr(path, "..") != NULL) {
		snprintf(err, errlen, "'%s': an empty setting name in '%s'", kv, path);
		return -EINVAL;
	}
	if (strcmp(path, "keys") == 0) {
		val = parse_keys_kv(eq + 1);
		if (val == NULL) {
			snprintf(err, errlen, "'%s': keys=ID:ELEMENTS,ID:ELEMENTS,...", kv);
			return -EINVAL;
		}
	} else {
		val = kv_value(eq + 1);
	}
	if (val == NULL) {
		return -ENOMEM;
	}
	for (tok = strtok_r(path, ".", &save); tok != NULL; tok = next) {
		next = strtok_r(NULL, ".", &save);
		if (!valid_name(tok)) {
			snprintf(err, errlen, "'%s': '%s' is not a setting name", kv, tok);
			json_decref(val);
			return -EINVAL;
		}
		if (next == NULL) {
			json_object_set_new(obj, tok, val);
			return 0;
		}
		if (!json_is_object(json_object_get(obj, tok))) {
			json_object_set_new(obj, tok, json_object());
		}
		obj = json_object_get(obj, tok);
	}
	json_decref(val);
	snprintf(err, errlen, "'%s': no setting name", kv);
	return -EINVAL;
}
