/* SPDX-License-Identifier: BSD-3-Clause */
/* Logging: level filter per component, timestamped lines on stderr or a caller's sink. */
#include "log.h"

#include <errno.h>
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

void pbox_log_init_from_env(void)
{
	const char *e = getenv("PBOX_LOG_LEVEL");
	int lvl;

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
