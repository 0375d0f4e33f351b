/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Strict parsing of command-line option values, shared by the `pbox` command, the
 * benchmarks and the test workers. The whole string must be the number: no sign on an
 * unsigned value, no blanks, no trailing text, no overflow, and the value within [lo, hi].
 * On a bad value each function prints one line to stderr that names the program, the
 * option and the value, e.g.
 *     pbox demo: --batch abc: expected an integer between 1 and 60000
 * and returns -EINVAL, leaving *out unchanged. Comma-separated lists of integers:
 * pbox_parse_u64_list() in numlist.h (included).
 *
 * Thread safety: no state; messages go to stderr.
 */
#ifndef PBOX_ARGS_H
#define PBOX_ARGS_H

#include <stdint.h>

#include "numlist.h"

/* A decimal integer in [lo, hi]. 0 or -EINVAL (reported). */
int pbox_arg_u64(const char *prog, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		 uint64_t *out);
int pbox_arg_u32(const char *prog, const char *opt, const char *s, uint32_t lo, uint32_t hi,
		 uint32_t *out);

/* A finite number (strtod syntax) in [lo, hi]. 0 or -EINVAL (reported). */
int pbox_arg_double(const char *prog, const char *opt, const char *s, double lo, double hi,
		    double *out);

/* A byte count: a decimal integer with an optional binary suffix K, M or G (x 2^10, 2^20,
 * 2^30; either case), in [lo, hi] after scaling. 0 or -EINVAL (reported). */
int pbox_arg_size(const char *prog, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		  uint64_t *out);

#endif /* PBOX_ARGS_H */
