/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The control channel between workers (and operators) and pboxd: newline-delimited JSON
 * objects over TCP. One request object per line, one response object per line, plus
 * unsolicited event objects ({"event": ...}) from the appliance.
 *
 *   {"op":"hello","job":J,"rank":R,"token":"...","version":1}
 *       -> {"ok":true,"workers":N,"mode":"aggregate"|"server-optimizer","reduce":"sum"|"mean"}
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

#include <stddef.h>

#include <jansson.h>

#define PBOX_CTL_PROTO_VERSION 1
/* Longest line accepted (a register of a million keys stays below it). */
#define PBOX_CTL_MAX_LINE (64u << 20)

struct pbox_linebuf {
	char *buf;
	size_t len;
	size_t cap;
	size_t start; /* first byte not yet returned as a line */
};

void pbox_linebuf_init(struct pbox_linebuf *lb);
void pbox_linebuf_free(struct pbox_linebuf *lb);

/* Read what fd has (non-blocking fds: until EAGAIN). Returns bytes read (> 0), 0 on EOF,
 * -EAGAIN if nothing was available, -E2BIG if a line exceeds the limit, or -errno. */
long pbox_linebuf_fill(struct pbox_linebuf *lb, int fd);

/* Next complete line (NUL-terminated, without the newline) or NULL. Valid until the next
 * fill or next call. */
char *pbox_linebuf_next(struct pbox_linebuf *lb);

/* Encode obj compactly with a trailing newline and write it all to fd (blocking fds, or
 * non-blocking ones that have room: waits up to timeout_ms for the rest). Does not steal
 * obj. Returns 0 or -errno. */
int pbox_ctl_send(int fd, const json_t *obj, int timeout_ms);

/* Build {"ok":false,"errno":err,"error":msg}. err is positive. */
json_t *pbox_ctl_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* PBOX_CTLPROTO_H */
