/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CRC32C "version words" of payloads (ISA-L's crc32_iscsi: runtime-dispatched SSE4.2 /
 * PCLMUL code). A worker stamps each fragment of a contribution with the CRC32C of its
 * bytes when the contribution is submitted; a resend re-reads the caller's buffer and must
 * produce the same word, so a buffer changed while its push was in flight is caught
 * instead of being aggregated (ASAP's torn-buffer check), and the appliance can verify
 * the word on receipt.
 *
 * Thread safety: pure functions.
 */
#ifndef PBOX_CRC_H
#define PBOX_CRC_H

#include <stddef.h>
#include <stdint.h>

#include "xport.h"

#define PBOX_CRC_INIT 0xffffffffu

/* CRC32C of len bytes, continuing from crc (PBOX_CRC_INIT to start). */
uint32_t pbox_crc32c(const void *buf, size_t len, uint32_t crc);

/* CRC32C of the concatenation of n pieces (equal to pbox_crc32c of the whole). */
uint32_t pbox_crc32c_iov(const struct pbox_iov *v, unsigned n);

#endif /* PBOX_CRC_H */
