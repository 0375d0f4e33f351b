/* SPDX-License-Identifier: BSD-3-Clause */
/* Per source address connection counts and failed-authentication buckets (ctladdr.h). */
#include "ctladdr.h"

#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"

static unsigned bucket(uint32_t ip)
{
	return (ip * 2654435761u) >> 22; /* top 10 bits: PBOX_CTLADDR_BUCKETS */
}

void pbox_ctladdr_init(struct pbox_ctladdr_table *t, uint32_t burst, uint32_t per_minute)
{
	memset(t, 0, sizeof(*t));
	t->burst = burst;
	t->per_minute = per_minute;
}

void pbox_ctladdr_free(struct pbox_ctladdr_table *t)
{
	for (unsigned b = 0; b < PBOX_CTLADDR_BUCKETS; b++) {
		while (t->b[b] != NULL) {
			struct pbox_ctladdr *a = t->b[b];

			t->b[b] = a->next;
			free(a);
		}
	}
}

struct pbox_ctladdr *pbox_ctladdr_get(struct pbox_ctladdr_table *t, uint32_t ip, uint64_t now_ms)
{
	unsigned b = bucket(ip);
	struct pbox_ctladdr *a;

	for (a = t->b[b]; a != NULL; a = a->next) {
		if (a->ip == ip) {
			return a;
		}
	}
	a = calloc(1, sizeof(*a));
	if (a == NULL) {
		return NULL;
	}
	a->ip = ip;
	a->tokens = t->burst;
	a->refill_ms = now_ms;
	a->next = t->b[b];
	t->b[b] = a;
	return a;
}

static void refill(const struct pbox_ctladdr_table *t, struct pbox_ctladdr *a, uint64_t now)
{
	double add = (double)(now - a->refill_ms) * t->per_minute / 60000.0;

	a->tokens = PBOX_MIN(a->tokens + add, (double)t->burst);
	a->refill_ms = now;
}

bool pbox_ctladdr_auth_allowed(const struct pbox_ctladdr_table *t, struct pbox_ctladdr *a,
			       uint64_t now_ms)
{
	refill(t, a, now_ms);
	return a->tokens >= 1.0;
}

void pbox_ctladdr_auth_failed(struct pbox_ctladdr *a)
{
	a->tokens = PBOX_MAX(a->tokens - 1.0, 0.0);
}

void pbox_ctladdr_gc(struct pbox_ctladdr_table *t, uint64_t now_ms)
{
	for (unsigned b = 0; b < PBOX_CTLADDR_BUCKETS; b++) {
		for (struct pbox_ctladdr **pp = &t->b[b]; *pp != NULL;) {
			struct pbox_ctladdr *a = *pp;

			refill(t, a, now_ms);
			if (a->nconns == 0 && a->tokens >= t->burst) {
				*pp = a->next;
				free(a);
			} else {
				pp = &a->next;
			}
		}
	}
}
