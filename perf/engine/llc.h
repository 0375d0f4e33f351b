/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The size of the last-level cache, for benchmarks that must feed data that is not
 * cache-resident (a pool larger than the LLC).
 */
#ifndef PBOX_BENCH_LLC_H
#define PBOX_BENCH_LLC_H

#include <stdint.h>

/* Bytes of CPU 0's highest-level cache as sysfs reports it
 * (/sys/devices/system/cpu/cpu0/cache/index*), 0 if it cannot be read. Any thread. */
uint64_t pbox_bench_llc_bytes(void);

#endif /* PBOX_BENCH_LLC_H */
