/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Comma-separated lists of unsigned integers on command lines ("--keys 1024,4096",
 * "--sizes 64,1024,8192"), parsed strictly: every item a decimal number within [lo, hi],
 * no empty items, at most max of them.
 *
 * Thread safety: pure function.
 */
#ifndef PBOX_NUMLIST_H
#define PBOX_NUMLIST_H

#include <stdint.h>

/* Parses s into out[0..n); returns n (>= 1), or -EINVAL on an empty list, an item that is
 * not a decimal number, one outside [lo, hi], or more than max items. */
int pbox_parse_u64_list(const char *s, uint64_t *out, unsigned max, uint64_t lo, uint64_t hi);

#endif
