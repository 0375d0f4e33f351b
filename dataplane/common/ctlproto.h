/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The control channel between workers (and operators) and pboxd: newline-delimited JSON
 * objects over TCP. One request object per line, one response object per line, plus
 * unsolicited event objects ({"event": ...}) from the appliance.
 *
 *   {"op":"hello","job":J,"rank":R,"token":"...","version":1}
 *       -> {"ok":true,"workers":N,"mode":"aggregate"|"server-optimizer"|"broadcast",
 *           "reduce":"sum"|"mean"} and for broadcast jobs "optimizer":{"name":..,"lr":..,
 *           "momentum","wd","rescale","clip","beta1","beta2","eps"} (the workers run it)
 *   {"op":"register","keys":[[id,nelem],...]}
 *       -> {"ok":true,"cookie":"<16 hex>","data_addr":"a.b.c.d","ports":[p0,...],
 *           "chunk_bytes":B,"frag_bytes":F,"window":W,"core_map":[k,...]}
 *   {"op":"leave"}                 -> {"ok":true}   (a clean goodbye; then close)
 *   {"op":"stats"}                 -> {"ok":true,"cores":[{...}],"jobs":[{...}]}
 *   errors                         -> {"ok":false,"errno":E,"error":"what and why"}
 *   events                            {"event":"abort","errno":E,"reason":"..."}
 *
 * Thread safety: a line buffer belongs to one connection and one thread.
 */
#ifndef PBOX_CTLPROTO_H
#define PBOX_CTLPROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#define PBOX_CTL_PROTO_VERSION 1
/* Default bound of a line (pbox_linebuf_init): what clients accept from the appliance (a
 * register answer's core_map of 2^24 chunks stays below it). pboxd bounds the requests
 * it reads much lower, with pbox_linebuf_set_max. */
#define PBOX_CTL_MAX_LINE (64u << 20)
/* Bytes one key of a register request takes at most: "[4294967295, 1099511627776], " is
 * 29; 32 leaves room for a little more whitespace. */
#define PBOX_CTL_REGISTER_KEY_BYTES 32u
/* The rest of a register request (op, braces, framing). */
#define PBOX_CTL_REQUEST_OVERHEAD 1024u

/* The longest request line a register of nkeys keys needs. */
static inline size_t pbox_ctl_register_line_bytes(size_t nkeys)
{
	return nkeys * PBOX_CTL_REGISTER_KEY_BYTES + PBOX_CTL_REQUEST_OVERHEAD;
}

struct pbox_linebuf {
	char *buf;
	size_t len;
	size_t cap;
	size_t start; /* first byte not yet returned as a line */
	size_t max;   /* longest line accepted, without its newline */
};

/* An empty buffer accepting lines up to PBOX_CTL_MAX_LINE bytes. */
void pbox_linebuf_init(struct pbox_linebuf *lb);
void pbox_linebuf_free(struct pbox_linebuf *lb);

/* Change the longest line accepted from now on (max >= 1). Lowering it below what is
 * already buffered makes the next fill return -E2BIG unless a newline is there. */
void pbox_linebuf_set_max(struct pbox_linebuf *lb, size_t max);

/* Read what fd has (non-blocking fds: until EAGAIN, or until the buffer holds a line of
 * the maximum length). Returns bytes read (> 0), 0 on EOF, -EAGAIN if nothing was
 * available, -E2BIG if a line exceeds the limit, or -errno. The buffer never grows
 * beyond max + 1 bytes. */
long pbox_linebuf_fill(struct pbox_linebuf *lb, int fd);

/* A complete line is buffered (pbox_linebuf_next would return one). */
static inline bool pbox_linebuf_has_line(const struct pbox_linebuf *lb)
{
	return lb->buf != NULL && lb->start < lb->len &&
	       memchr(lb->buf + lb->start, '\n', lb->len - lb->start) != NULL;
}

/* Bytes read but not yet returned as lines. */
static inline size_t pbox_linebuf_pending(const struct pbox_linebuf *lb)
{
	return lb->len - lb->start;
}

/* Next complete line (NUL-terminated, without the newline) or NULL. Valid until the next
 * fill or next call. */
char *pbox_linebuf_next(struct pbox_linebuf *lb);

/* Encode obj compactly with a trailing newline: a malloc'd buffer of *len bytes (not
 * NUL-terminated), or NULL (out of memory). Does not steal obj. */
char *pbox_ctl_encode(const json_t *obj, size_t *len);

/* Encode obj compactly with a trailing newline and write it all to fd (blocking fds, or
 * non-blocking ones that have room: waits up to timeout_ms for the rest). Does not steal
 * obj. Returns 0 or -errno. */
int pbox_ctl_send(int fd, const json_t *obj, int timeout_ms);

/* a equals b, compared in time independent of where they differ (tokens cannot be
 * guessed byte by byte). */
bool pbox_ctl_token_equal(const char *a, const char *b);

/*
 * A log rate limit, so that a client cannot flood a daemon's log: at most
 * PBOX_RATELOG_BURST lines per PBOX_RATELOG_WINDOW_MS; the first line after a quiet window
 * says how many were left out. One per kind of message; not thread-safe.
 */
#define PBOX_RATELOG_BURST     10u
#define PBOX_RATELOG_WINDOW_MS 10000u
struct pbox_ratelog {
	uint64_t window_start_ms;
	uint32_t n;
	uint64_t suppressed;
};

/* true: log now (*suppressed: lines left out before this one, then reset). now_ms: any
 * monotonic milliseconds. */
static inline bool pbox_ratelog_ok(struct pbox_ratelog *rl, uint64_t now_ms, uint64_t *suppressed)
{
	*suppressed = 0;
	if (now_ms - rl->window_start_ms >= PBOX_RATELOG_WINDOW_MS) {
		rl->window_start_ms = now_ms;
		rl->n = 0;
	}
	if (rl->n >= PBOX_RATELOG_BURST) {
		rl->suppressed++;
		return false;
	}
	rl->n++;
	*suppressed = rl->suppressed;
	rl->suppressed = 0;
	return true;
}

/* Build {"ok":false,"errno":err,"error":msg}. err is positive. */
json_t *pbox_ctl_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* PBOX_CTLPROTO_H */
