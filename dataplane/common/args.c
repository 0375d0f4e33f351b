/* SPDX-License-Identifier: BSD-3-Clause */
/* Strict option-value parsing with messages that name the option (see args.h). */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The leading digits of s as a number; *end after them. -EINVAL unless s starts with a
 * digit (strtoull would accept blanks and a sign), -ERANGE on overflow. */
static int leading_u64(const char *s, uint64_t *v, char **end)
{
	unsigned long long x;

	if (!isdigit((unsigned char)s[0])) {
		return -EINVAL;
	}
	errno = 0;
	x = strtoull(s, end, 10);
	if (errno != 0) {
		return -ERANGE;
	}
	*v = x;
	return 0;
}

int pbox_arg_u64(const char *prog, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		 uint64_t *out)
{
	uint64_t v;
	char *end;

	if (leading_u64(s, &v, &end) != 0 || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "%s: %s %s: expected an integer between %llu and %llu\n", prog, opt,
			s, (unsigned long long)lo, (unsigned long long)hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int pbox_arg_u32(const char *prog, const char *opt, const char *s, uint32_t lo, uint32_t hi,
		 uint32_t *out)
{
	uint64_t v;
	int rc = pbox_arg_u64(prog, opt, s, lo, hi, &v);

	if (rc == 0) {
		*out = (uint32_t)v;
	}
	return rc;
}

int pbox_arg_double(const char *prog, const char *opt, const char *s, double lo, double hi,
		    double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || isspace((unsigned char)s[0]) || *end != '\0' ||
	    !isfinite(v) || v < lo || v > hi) {
		fprintf(stderr, "%s: %s %s: expected a number between %g and %g\n", prog, opt, s,
			lo, hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int pbox_arg_size(const char *prog, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		  uint64_t *out)
{
	unsigned shift = 0;
	uint64_t v;
	char *end;
	int rc;

	rc = leading_u64(s, &v, &end);
	if (rc == 0) {
		switch (*end) {
		case 'k':
		case 'K':
			shift = 10;
			break;
		case 'm':
		case 'M':
			shift = 20;
			break;
		case 'g':
		case 'G':
			shift = 30;
			break;
		default:
			break;
		}
		if (shift != 0) {
			end++;
		}
		if (*end != '\0' || v > (UINT64_MAX >> shift)) {
			rc = -EINVAL;
		}
	}
	if (rc == 0) {
		v <<= shift;
	}
	if (rc != 0 || v < lo || v > hi) {
		fprintf(stderr,
			"%s: %s %s: expected a byte count between %llu and %llu (suffixes K, M, "
			"G)\n",
			prog, opt, s, (unsigned long long)lo, (unsigned long long)hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}
