/* SPDX-License-Identifier: BSD-3-Clause */
/* Logging: level filter per component, timestamped lines on stderr or a caller's sink. */
#include "log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const char *const g_component_names[PBOX_LOGC_COUNT] = {
	[PBOX_LOGC_MAIN] = "main",       [PBOX_LOGC_CONFIG] = "config",
	[PBOX_LOGC_ENGINE] = "engine",   [PBOX_LOGC_TRANSPORT] = "transport",
	[PBOX_LOGC_ADMIN] = "admin",     [PBOX_LOGC_CLIENT] = "client",
	[PBOX_LOGC_KERNELS] = "kernels",
};
static const char *const g_level_names[] = { "ERROR", "WARN", "INFO", "DEBUG" };

static enum pbox_log_level g_levels[PBOX_LOGC_COUNT] = {
	PBOX_LOG_LVL_INFO, PBOX_LOG_LVL_INFO, PBOX_LOG_LVL_INFO, PBOX_LOG_LVL_INFO,
	PBOX_LOG_LVL_INFO, PBOX_LOG_LVL_INFO, PBOX_LOG_LVL_INFO,
};
static pbox_log_sink_fn g_sink;
static void *g_sink_arg;
static char g_ident[32];
static enum pbox_log_format g_format;
static const char *const g_level_lower[] = { "error", "warn", "info", "debug" };

void pbox_log_set_level(enum pbox_log_component comp, enum pbox_log_level lvl)
{
	if (comp == PBOX_LOGC_COUNT) {
		for (int i = 0; i < PBOX_LOGC_COUNT; i++) {
			g_levels[i] = lvl;
		}
	} else if ((unsigned)comp < PBOX_LOGC_COUNT) {
		g_levels[comp] = lvl;
	}
}

int pbox_log_parse_level(const char *s)
{
	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(g_level_names); i++) {
		if (strcasecmp(s, g_level_names[i]) == 0) {
			return (int)i;
		}
	}
	if (strcasecmp(s, "err") == 0) {
		return PBOX_LOG_LVL_ERR;
	}
	if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0') {
		return s[0] - '0';
	}
	return -EINVAL;
}

int pbox_log_parse_format(const char *s)
{
	if (strcasecmp(s, "text") == 0) {
		return PBOX_LOG_FORMAT_TEXT;
	}
	if (strcasecmp(s, "json") == 0) {
		return PBOX_LOG_FORMAT_JSON;
	}
	return -EINVAL;
}

void pbox_log_set_format(enum pbox_log_format fmt)
{
	g_format = fmt;
}

void pbox_log_init_from_env(void)
{
	const char *e = getenv("PBOX_LOG_LEVEL"), *f = getenv("PBOX_LOG_FORMAT");
	int lvl;

	if (f != NULL && *f != '\0') {
		int fmt = pbox_log_parse_format(f);

		if (fmt < 0) {
			fprintf(stderr, "PBOX_LOG_FORMAT=%s: expected text or json\n", f);
		} else {
			g_format = (enum pbox_log_format)fmt;
		}
	}

	if (e == NULL || *e == '\0') {
		return;
	}
	lvl = pbox_log_parse_level(e);
	if (lvl < 0) {
		fprintf(stderr, "PBOX_LOG_LEVEL=%s: expected err, warn, info or debug\n", e);
		return;
	}
	pbox_log_set_level(PBOX_LOGC_COUNT, (enum pbox_log_level)lvl);
}

void pbox_log_set_sink(pbox_log_sink_fn sink, void *arg)
{
	g_sink = sink;
	g_sink_arg = arg;
}

void pbox_log_set_ident(const char *ident)
{
	snprintf(g_ident, sizeof(g_ident), "%s", ident ? ident : "");
}

/* Append s to out[*off..cap) as the body of a JSON string; stops (truncated, still
 * valid) when full. */
static void json_escape(char *out, size_t cap, size_t *off, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < n && s[i] != '\0'; i++) {
		unsigned char ch = (unsigned char)s[i];
		char esc[7];
		size_t k = 0;

		if (ch == '"' || ch == '\\') {
			esc[k++] = '\\';
			esc[k++] = (char)ch;
		} else if (ch == '\n') {
			esc[k++] = '\\';
			esc[k++] = 'n';
		} else if (ch == '\t') {
			esc[k++] = '\\';
			esc[k++] = 't';
		} else if (ch < 0x20 || ch == 0x7f) {
			memcpy(esc, "\\u00", 4);
			esc[4] = hex[ch >> 4];
			esc[5] = hex[ch & 15];
			k = 6;
		} else {
			esc[k++] = (char)ch;
		}
		if (*off + k >= cap) {
			return;
		}
		memcpy(out + *off, esc, k);
		*off += k;
	}
}

/* The object a message is about: its prefix before the first ": " when that prefix reads
 * as (noun, id) pairs, "job 7", "port 1 rxq 0", "pboxd 10.0.0.1:7000": nouns of letters,
 * '_' or '-', ids with a digit, '.', ':' or '/'. 0 otherwise (see log.h). */
static size_t object_len(const char *msg)
{
	const char *colon = strstr(msg, ": ");
	size_t n, i = 0, words = 0;

	if (colon == NULL || colon == msg || colon - msg > 48) {
		return 0;
	}
	n = (size_t)(colon - msg);
	while (i < n) {
		size_t start = i;
		bool idlike = false, nounlike = true;

		while (i < n && msg[i] != ' ') {
			char ch = msg[i];

			idlike |= (ch >= '0' && ch <= '9') || ch == '.' || ch == ':' || ch == '/';
			nounlike &= (ch >= 'a' && ch <= 'z') || ch == '_' || ch == '-';
			if (ch == '"' || ch == '\\' || (unsigned char)ch < 0x20) {
				return 0;
			}
			i++;
		}
		if (i == start || (words % 2 == 0 ? !nounlike : !idlike)) {
			return 0;
		}
		words++;
		i += i < n; /* the space */
	}
	return words >= 2 && words % 2 == 0 ? n : 0;
}

static void write_json(enum pbox_log_level lvl, enum pbox_log_component comp, const char *msg,
		       const struct timespec *ts)
{
	char line[3072];
	size_t off = 0, olen = object_len(msg);
	struct tm tm;

	gmtime_r(&ts->tv_sec, &tm);
	off = (size_t)snprintf(line, sizeof(line),
			       "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
			       "\"daemon\":\"",
			       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
			       tm.tm_sec, ts->tv_nsec / 1000000, g_level_lower[lvl]);
	json_escape(line, sizeof(line) - 64, &off, g_ident, sizeof(g_ident));
	off += (size_t)snprintf(line + off, sizeof(line) - off,
				"\",\"component\":\"%s\",\"object\":\"", g_component_names[comp]);
	if (olen != 0) {
		json_escape(line, sizeof(line) - 64, &off, msg, olen);
	} else {
		json_escape(line, sizeof(line) - 64, &off, g_component_names[comp], SIZE_MAX);
	}
	memcpy(line + off, "\",\"msg\":\"", 9);
	off += 9;
	json_escape(line, sizeof(line) - 4, &off, msg, SIZE_MAX);
	memcpy(line + off, "\"}\n", 4);
	off += 3;
	/* One write per line so lines from different threads do not interleave. */
	fwrite(line, 1, off, stderr);
}

void pbox_vlog(enum pbox_log_level lvl, enum pbox_log_component comp, const char *fmt, va_list ap)
{
	char msg[1024];
	struct timespec ts;
	struct tm tm;

	if ((unsigned)comp >= PBOX_LOGC_COUNT || lvl > g_levels[comp]) {
		return;
	}
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (g_sink != NULL) {
		g_sink(lvl, comp, msg, g_sink_arg);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	if (g_format == PBOX_LOG_FORMAT_JSON) {
		write_json(lvl, comp, msg, &ts);
		return;
	}
	localtime_r(&ts.tv_sec, &tm);
	/* One fprintf per line so lines from different threads do not interleave. */
	fprintf(stderr, "%02d:%02d:%02d.%03ld %s%s%-5s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
		ts.tv_nsec / 1000000, g_ident, g_ident[0] ? " " : "", g_level_names[lvl],
		g_component_names[comp], msg);
}

void pbox_log(enum pbox_log_level lvl, enum pbox_log_component comp, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	pbox_vlog(lvl, comp, fmt, ap);
	va_end(ap);
}
