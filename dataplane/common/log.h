/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Logging for every pbox program and library.
 *
 * Messages go to stderr (or a sink set with pbox_log_set_sink()) with a timestamp, the
 * level and the component, e.g. "12:03:04.512 WARN  engine: job 7 chunk 12: ...". Each
 * component has its own level; PBOX_LOG_DEBUG() is compiled out unless the build has
 * -Dpbox_debug_logs=true, so debug statements cost nothing on a release hot path.
 *
 * Two line formats: the default for people (above), and JSON lines for log collectors
 * (pbox_log_set_format, or PBOX_LOG_FORMAT=json in the environment):
 *   {"ts":"2026-11-25T10:16:50.123Z","level":"warn","daemon":"pboxd","component":"admin",
 *    "object":"job 7","msg":"job 7: rank 2 (127.0.0.1:5000) left without a goodbye"}
 * ts is UTC with milliseconds; daemon is the ident (pbox_log_set_ident; "" if none);
 * object is the message's prefix before its first ": " when that prefix names an object by
 * the logging convention ("job 7", "core 0", "port 1 rxq 0", "pboxd a": noun and id
 * pairs, at most 48 bytes), else the component; msg is the whole message. One write per
 * line.
 *
 * Thread safety: all functions may be called from any thread. Levels are read without
 * locking; a change made with pbox_log_set_level() is seen by other threads eventually.
 * Never call from a per-packet path except for rate-limited conditions.
 */
#ifndef PBOX_LOG_H
#define PBOX_LOG_H

#include <stdarg.h>

#include "compiler.h"

enum pbox_log_level {
	PBOX_LOG_LVL_ERR = 0,
	PBOX_LOG_LVL_WARN,
	PBOX_LOG_LVL_INFO,
	PBOX_LOG_LVL_DEBUG,
};

/* Components with their own level. Keep pbox_log_component_names in log.c in step. */
enum pbox_log_component {
	PBOX_LOGC_MAIN = 0, /* program main / CLI */
	PBOX_LOGC_CONFIG,
	PBOX_LOGC_ENGINE,
	PBOX_LOGC_TRANSPORT,
	PBOX_LOGC_ADMIN,
	PBOX_LOGC_CLIENT,
	PBOX_LOGC_KERNELS,
	PBOX_LOGC_COUNT,
};

enum pbox_log_format {
	PBOX_LOG_FORMAT_TEXT = 0, /* "12:03:04.512 pboxd WARN  engine: ..." */
	PBOX_LOG_FORMAT_JSON = 1, /* one JSON object per line (above) */
};

/* Called for every message that passes the level filter, instead of writing stderr. */
typedef void (*pbox_log_sink_fn)(enum pbox_log_level lvl, enum pbox_log_component comp,
				 const char *msg, void *arg);

void pbox_log(enum pbox_log_level lvl, enum pbox_log_component comp, const char *fmt, ...)
	PBOX_PRINTF(3, 4);
void pbox_vlog(enum pbox_log_level lvl, enum pbox_log_component comp, const char *fmt, va_list ap);

/* Set the level of one component, or of all with comp == PBOX_LOGC_COUNT. */
void pbox_log_set_level(enum pbox_log_component comp, enum pbox_log_level lvl);
/* Parse "err|warn|info|debug" (or "0".."3"); returns the level or -EINVAL. */
int pbox_log_parse_level(const char *s);
/* Apply PBOX_LOG_LEVEL (e.g. "debug") and PBOX_LOG_FORMAT ("text", "json") from the
 * environment if set. */
void pbox_log_init_from_env(void);
/* Route messages to sink (NULL restores stderr). */
void pbox_log_set_sink(pbox_log_sink_fn sink, void *arg);
/* Parse "text" / "json"; returns the format or -EINVAL. */
int pbox_log_parse_format(const char *s);
/* Line format of messages written to stderr (a sink gets the bare message either way). */
void pbox_log_set_format(enum pbox_log_format fmt);
/* Prefix every line with this program name, e.g. "pboxd" (copied, max 31 chars). */
void pbox_log_set_ident(const char *ident);

#define PBOX_LOG_ERR(c, ...)  pbox_log(PBOX_LOG_LVL_ERR, PBOX_LOGC_##c, __VA_ARGS__)
#define PBOX_LOG_WARN(c, ...) pbox_log(PBOX_LOG_LVL_WARN, PBOX_LOGC_##c, __VA_ARGS__)
#define PBOX_LOG_INFO(c, ...) pbox_log(PBOX_LOG_LVL_INFO, PBOX_LOGC_##c, __VA_ARGS__)
#ifdef PBOX_DEBUG_LOGS
#define PBOX_LOG_DEBUG(c, ...) pbox_log(PBOX_LOG_LVL_DEBUG, PBOX_LOGC_##c, __VA_ARGS__)
#else
#define PBOX_LOG_DEBUG(c, ...)                                                    \
	do {                                                                      \
		if (0) {                                                          \
			pbox_log(PBOX_LOG_LVL_DEBUG, PBOX_LOGC_##c, __VA_ARGS__); \
		}                                                                 \
	} while (0)
#endif

#endif /* PBOX_LOG_H */
