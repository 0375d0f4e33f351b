/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A transmitter that sends nothing, for engine benchmarks: every datagram is accepted and
 * counted, payload memory is released at once (as kernel UDP does after a flush), so the
 * engine's own cost is measured without a socket or a NIC.
 *
 * Threading: one engine (one thread) per process.
 */
#ifndef PBOX_BENCH_NULL_TX_H
#define PBOX_BENCH_NULL_TX_H

#include "common/xport.h"

extern const struct pbox_tx_ops pbox_bench_null_tx;

#endif /* PBOX_BENCH_NULL_TX_H */
