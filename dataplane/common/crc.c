/* SPDX-License-Identifier: BSD-3-Clause */
/* CRC32C version words through ISA-L (see crc.h). */
#include "crc.h"

#include <isa-l/crc.h>
#include <limits.h>

uint32_t pbox_crc32c(const void *buf, size_t len, uint32_t crc)
{
	const unsigned char *p = buf;

	/* ISA-L takes an int length; chunks are far below that, but stay correct. */
	while (len > 0) {
		int n = len > (size_t)INT_MAX ? INT_MAX : (int)len;

		crc = crc32_iscsi((unsigned char *)p, n, crc);
		p += n;
		len -= (size_t)n;
	}
	return crc;
}

uint32_t pbox_crc32c_iov(const struct pbox_iov *v, unsigned n)
{
	uint32_t crc = PBOX_CRC_INIT;

	for (unsigned i = 0; i < n; i++) {
		crc = pbox_crc32c(v[i].base, v[i].len, crc);
	}
	return crc;
}
