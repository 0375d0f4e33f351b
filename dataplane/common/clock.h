/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Wall-clock-independent time in seconds for the tools, the trainer and the benchmarks:
 * intervals, deadlines and rates outside the data plane (whose cores count TSC cycles).
 *
 * Thread safety: pure function.
 */
#ifndef PBOX_CLOCK_H
#define PBOX_CLOCK_H

#include <time.h>

/* CLOCK_MONOTONIC in seconds: only differences mean something. */
static inline double pbox_mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* PBOX_CLOCK_H */
