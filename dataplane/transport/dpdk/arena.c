/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Chunk arenas in DPDK memory (see pbox_dpdk_arena_ops in dpdk.h): hugepage memory on
 * the ports' NUMA socket, which the EAL maps for device DMA, so replies can be sent by
 * reference on PCI NICs as on virtual devices.
 */
#include <rte_malloc.h>

#include "common/log.h"
#include "dpdk_impl.h"

static void *arena_alloc(void *ctx, size_t bytes, uint32_t core)
{
	int socket = (int)(intptr_t)ctx;
	void *p = rte_zmalloc_socket("pbox_arena", bytes, 4096, socket);

	if (p == NULL && socket != SOCKET_ID_ANY) {
		p = rte_zmalloc_socket("pbox_arena", bytes, 4096, SOCKET_ID_ANY);
		if (p != NULL) {
			PBOX_LOG_WARN(TRANSPORT,
				      "core %u: %zu bytes of chunk state did not fit socket %d's "
				      "DPDK memory: taken from another socket (slower)",
				      core, bytes, socket);
		}
	}
	if (p == NULL) {
		PBOX_LOG_ERR(TRANSPORT,
			     "core %u: no DPDK memory for %zu bytes of chunk state (reserve more "
			     "hugepages: tests/dpdk/setup.sh shows how)",
			     core, bytes);
	}
	return p;
}

static void arena_free(void *ctx, void *p, size_t bytes)
{
	(void)ctx;
	(void)bytes;
	rte_free(p);
}

void pbox_dpdk_arena_ops(struct pbox_arena_ops *ops, int socket)
{
	ops->alloc = arena_alloc;
	ops->free = arena_free;
	ops->ctx = (void *)(intptr_t)(socket < 0 ? SOCKET_ID_ANY : socket);
}
