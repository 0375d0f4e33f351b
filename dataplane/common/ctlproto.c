/* SPDX-License-Identifier: BSD-3-Clause */
/* Newline-delimited JSON framing of the control channel (see ctlproto.h). */
#include "ctlproto.h"

#include "common/compiler.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pbox_linebuf_init(struct pbox_linebuf *lb)
{
	memset(lb, 0, sizeof(*lb));
	lb->max = PBOX_CTL_MAX_LINE;
}

void pbox_linebuf_free(struct pbox_linebuf *lb)
{
	size_t max = lb->max;

	free(lb->buf);
	memset(lb, 0, sizeof(*lb));
	lb->max = max;
}

void pbox_linebuf_set_max(struct pbox_linebuf *lb, size_t max)
{
	lb->max = max ? max : 1;
}

long pbox_linebuf_fill(struct pbox_linebuf *lb, int fd)
{
	long total = 0;

	/* Drop what was already returned. */
	if (lb->start > 0) {
		memmove(lb->buf, lb->buf + lb->start, lb->len - lb->start);
		lb->len -= lb->start;
		lb->start = 0;
	}
	for (;;) {
		ssize_t n;

		/* A line of max bytes plus its newline, plus the terminator we keep room for. */
		size_t limit = lb->max + 2;

		if (lb->cap - lb->len < 4096 && lb->cap < limit) {
			size_t ncap = PBOX_MIN(lb->cap ? lb->cap * 2 : 16384, limit);
			char *nb;

			nb = realloc(lb->buf, ncap);
			if (nb == NULL) {
				return -ENOMEM;
			}
			lb->buf = nb;
			lb->cap = ncap;
		}
		if (lb->len + 1 >= PBOX_MIN(lb->cap, limit)) {
			/* Full: fine if a line is complete (the caller takes it, then reads on);
			 * otherwise the line is longer than max. */
			if (memchr(lb->buf, '\n', lb->len) != NULL) {
				return total > 0 ? total : -EAGAIN;
			}
			return -E2BIG;
		}
		n = read(fd, lb->buf + lb->len, PBOX_MIN(lb->cap, limit) - lb->len - 1);
		if (n > 0) {
			lb->len += (size_t)n;
			total += n;
			continue;
		}
		if (n == 0) {
			return total > 0 ? total : 0;
		}
		if (errno == EINTR) {
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			return total > 0 ? total : -EAGAIN;
		}
		return -errno;
	}
}

char *pbox_linebuf_next(struct pbox_linebuf *lb)
{
	char *line, *nl;

	if (lb->buf == NULL || lb->start >= lb->len) {
		return NULL;
	}
	line = lb->buf + lb->start;
	nl = memchr(line, '\n', lb->len - lb->start);
	if (nl == NULL) {
		return NULL;
	}
	*nl = '\0';
	lb->start = (size_t)(nl - lb->buf) + 1;
	return line;
}

char *pbox_ctl_encode(const json_t *obj, size_t *len)
{
	char *s = json_dumps(obj, JSON_COMPACT);

	if (s == NULL) {
		return NULL;
	}
	*len = strlen(s);
	s[*len] = '\n'; /* json_dumps leaves room for the terminator we overwrite */
	(*len)++;
	return s;
}

int pbox_ctl_send(int fd, const json_t *obj, int timeout_ms)
{
	size_t len, off = 0;
	char *s = pbox_ctl_encode(obj, &len);
	int rc = 0;

	if (s == NULL) {
		return -ENOMEM;
	}
	while (off < len) {
		ssize_t n = write(fd, s + off, len - off);

		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };

			if (poll(&p, 1, timeout_ms) <= 0) {
				rc = -ETIMEDOUT;
				break;
			}
			continue;
		}
		rc = n < 0 ? -errno : -EIO;
		break;
	}
	free(s);
	return rc;
}

json_t *pbox_ctl_error(int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:i, s:s}", "ok", 0, "errno", err, "error", msg);
}

bool pbox_ctl_token_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = la != lb;

	for (size_t i = 0; i < la; i++) {
		d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
	}
	return d == 0;
}
