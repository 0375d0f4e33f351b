/* SPDX-License-Identifier: BSD-3-Clause */
/* "HOST:PORT" strings (hostport.h). */
#include "common/hostport.h"

#include <errno.h>
#include <string.h>

int pbox_hostport_split(const char *s, bool empty_host, uint16_t min_port, char *host, size_t hlen,
			uint16_t *port)
{
	const char *colon = s != NULL ? strrchr(s, ':') : NULL;
	size_t hl, nd;
	uint32_t p = 0;

	if (colon == NULL) {
		return -EINVAL;
	}
	hl = (size_t)(colon - s);
	nd = strlen(colon + 1);
	if ((hl == 0 && !empty_host) || hl >= hlen || nd == 0 || nd > 5 ||
	    strspn(colon + 1, "0123456789") != nd) {
		return -EINVAL;
	}
	for (const char *d = colon + 1; *d != '\0'; d++) {
		p = p * 10 + (uint32_t)(*d - '0');
	}
	if (p < min_port || p > 65535) {
		return -EINVAL;
	}
	memcpy(host, s, hl);
	host[hl] = '\0';
	*port = (uint16_t)p;
	return 0;
}
