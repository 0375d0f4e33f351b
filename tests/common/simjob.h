/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The set-up the tests on the simulated appliance (tests/unit/sim.h) share: the job they
 * start from, a push-pull per rank, running the clock until the operations complete, and
 * a filter that drops and duplicates datagrams pseudo-randomly.
 *
 * Threading: single-threaded, like the simulator.
 */
#ifndef PBOX_TEST_SIMJOB_H
#define PBOX_TEST_SIMJOB_H

#include <stdint.h>

#include "sim.h"

/* The job most tests start from: nranks workers on 2 cores, the nkeys keys (kept: must
 * outlive the sim), 4 KiB chunks of 1 KiB fragments, an aggregate summing job, a 10 ms
 * retransmission timeout and timeout_ms for an operation. Tests change what they need. */
struct sim_job_cfg simjob_cfg(uint32_t nranks, const struct pbox_keyspec *keys, uint32_t nkeys,
			      uint32_t timeout_ms);

/* Submit a push-pull of iteration iter on key (src to dst) on rank's node and flush it;
 * *op is reset first and owned by the node until it completes. Returns
 * pbox_node_submit()'s result (0 or -errno; nothing is flushed on an error). */
int simjob_push_pull(struct sim *s, uint32_t rank, struct pbox_op *op, uint32_t key, uint32_t iter,
		     const float *src, float *dst);

/* Deliver what is queued, then advance the clock by step_ns at a time (at most max_steps
 * times) until n operations have completed since s->ncompleted was last reset. Returns
 * true if they did. */
bool simjob_run_until(struct sim *s, uint32_t n, uint64_t step_ns, uint32_t max_steps);

/* A filter (sim.filter, with a struct simjob_chaos as sim.filter_arg) that drops one
 * datagram in one_in and duplicates another, in both directions, chosen by an xorshift64
 * generator over x (seed: not 0): the same seed loses the same datagrams. */
struct simjob_chaos {
	uint64_t x;
	uint32_t one_in;
};

enum sim_verdict simjob_chaos(struct sim *s, enum sim_dir dir, uint32_t ep,
			      const struct pbox_msg *m, void *arg);

#endif /* PBOX_TEST_SIMJOB_H */
