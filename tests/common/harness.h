/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pieces every unit test or fuzz harness that drives a libpbox node or a chunk engine by
 * hand needs (LAYOUT seam 7): a log sink that discards, the no-op callbacks of a transmit
 * ops table whose send() copies (common/xport.h), and a virtual clock read from a
 * counter the harness advances.
 *
 * Threading: none of these keeps state; each may be called from any thread.
 */
#ifndef PBOX_TEST_HARNESS_H
#define PBOX_TEST_HARNESS_H

#include <stdint.h>

#include "common/log.h"

/* A pbox_log_sink_fn that drops every message (fuzzers: logs are not what is tested). */
void pbox_test_log_silent(enum pbox_log_level lvl, enum pbox_log_component comp, const char *msg,
			  void *arg);

/* pbox_tx_ops callbacks of a transport whose send() has already consumed the datagram:
 * nothing to flush, no payload left referenced (queued() is 0, reclaim(upto) returns
 * upto). ctx is ignored. */
void pbox_test_tx_flush(void *ctx);
uint64_t pbox_test_tx_queued(void *ctx);
uint64_t pbox_test_tx_reclaim(void *ctx, uint64_t upto);

/* A node's or engine's now_ns callback: arg points at the harness's uint64_t clock (ns). */
uint64_t pbox_test_clock(void *arg);

#endif /* PBOX_TEST_HARNESS_H */
