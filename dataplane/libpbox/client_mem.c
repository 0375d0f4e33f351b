/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox_mem_alloc's buffers: registered with pboxd where the worker uses shared memory
 * (pushes read in place), else plain anonymous memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_int.h"
#include "common/log.h"
#include "transport/shm/shm.h"

int pbox_mem_alloc(struct pbox_client *c, size_t bytes, void **out)
{
	const char *env = getenv("PBOX_SHM_REGISTER");
	struct mem_block *b;
	char why[256] = "";
	int rc = -1;

	if (c == NULL || out == NULL || bytes == 0) {
		return pbox_client_error(-EINVAL, "pbox_mem_alloc: NULL argument or 0 bytes");
	}
	if (c->node == NULL) {
		return pbox_client_error(-ENOTCONN, "pbox_mem_alloc: call pbox_register first");
	}
	b = calloc(1, sizeof(*b));
	if (b == NULL) {
		return pbox_client_error(-ENOMEM, "pbox_mem_alloc: out of memory");
	}
	if (c->shm != NULL && (env == NULL || strcmp(env, "0") != 0)) {
		rc = pbox_shm_client_mem_reg(c->shm, bytes, &b->p, why, sizeof(why));
		if (rc != 0) {
			PBOX_LOG_INFO(CLIENT,
				      "job %u rank %u: %s; using plain memory (pushes from it are "
				      "copied)",
				      c->info.job, c->info.rank, why);
		}
	}
	b->shared = rc == 0;
	b->bytes = bytes;
	if (!b->shared) {
		b->p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			    0);
		if (b->p == MAP_FAILED) {
			rc = -errno;
			free(b);
			return pbox_client_error(rc, "pbox_mem_alloc: cannot map %zu bytes: %s",
						 bytes, strerror(-rc));
		}
	}
	pthread_mutex_lock(&c->lock);
	b->next = c->mem;
	c->mem = b;
	pthread_mutex_unlock(&c->lock);
	*out = b->p;
	return 0;
}

/* Unlink p's block from c->mem (under lock); NULL if p is none. */
static struct mem_block *mem_take(struct pbox_client *c, const void *p)
{
	struct mem_block **pp, *b = NULL;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->mem; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->p == p) {
			b = *pp;
			*pp = b->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return b;
}

int pbox_mem_free(struct pbox_client *c, void *p)
{
	struct mem_block *b;

	if (c == NULL || p == NULL) {
		return 0;
	}
	b = mem_take(c, p);
	if (b == NULL) {
		return pbox_client_error(-EINVAL,
					 "pbox_mem_free: %p is not a block of pbox_mem_alloc", p);
	}
	if (b->shared) {
		(void)pbox_shm_client_mem_unreg(c->shm, p);
	} else {
		munmap(p, b->bytes);
	}
	free(b);
	return 0;
}

int pbox_mem_detach(struct pbox_client *c, void *p)
{
	struct mem_block *b = c != NULL && p != NULL ? mem_take(c, p) : NULL;

	if (b == NULL) {
		return pbox_client_error(-EINVAL,
					 "pbox_mem_detach: %p is not a block of pbox_mem_alloc", p);
	}
	if (b->shared) {
		(void)pbox_shm_client_mem_detach(c->shm, p);
	}
	free(b);
	return 0;
}

bool pbox_mem_registered(struct pbox_client *c, const void *p)
{
	bool shared = false;

	if (c == NULL) {
		return false;
	}
	pthread_mutex_lock(&c->lock);
	for (const struct mem_block *b = c->mem; b != NULL; b = b->next) {
		if ((const uint8_t *)p >= (const uint8_t *)b->p &&
		    (const uint8_t *)p < (const uint8_t *)b->p + b->bytes) {
			shared = b->shared;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return shared;
}
