/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * How pboxd's status reads a chunk that its core writes (dataplane/pboxd/jobstatus.h):
 *  - the cases: no contribution yet (idle), some ranks done (waiting, with exactly those
 *    ranks), a server-optimizer chunk without its model (uninitialized), partial senders;
 *  - a state caught between a done bit and its count is never reported (changing);
 *  - while a writer thread runs iterations the way the engine does (open the slot, set each
 *    rank's done bit then count it, advance the version), every read reported as waiting
 *    is a state that existed: its done set is exactly the first ndone ranks of the order
 *    the writer completes them in, for the iteration it names.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/bitmap.h"
#include "pboxd/jobstatus.h"

#define NW     130 /* three bitmap words */
#define NFRAGS 4
#define WINDOW 2

struct fake {
	struct pbox_chunk_state cs;
	struct pbox_slot slot[WINDOW];
	uint64_t done[WINDOW][3];
	uint16_t wcnt[WINDOW][NW];
};

static void fake_init(struct fake *f)
{
	memset(f, 0, sizeof(*f));
	f->cs.slot = f->slot;
	f->cs.initialized = true;
	for (int s = 0; s < WINDOW; s++) {
		f->slot[s].done = f->done[s];
		f->slot[s].wcnt = f->wcnt[s];
	}
}

static void test_cases(void **state)
{
	struct fake f;
	uint64_t done[3], partial[3];
	uint32_t it;

	(void)state;
	fake_init(&f);
	f.cs.version = 6;
	assert_int_equal(pboxd_chunk_read(&f.cs, WINDOW, NW, NFRAGS, done, partial, &it),
			 PBOXD_CHUNK_IDLE);
	assert_int_equal(it, 6);
	/* The slot of 6 still holds iteration 4's result: idle too. */
	f.slot[0] = (struct pbox_slot){
		.iter = 4, .open = true, .ndone = NW, .done = f.done[0], .wcnt = f.wcnt[0]
	};
	assert_int_equal(pboxd_chunk_read(&f.cs, WINDOW, NW, NFRAGS, done, partial, &it),
			 PBOXD_CHUNK_IDLE);
	/* Ranks 0, 64 and 129 done, rank 7 sent 2 of 4 fragments. */
	f.slot[0].iter = 6;
	f.slot[0].ndone = 3;
	memset(f.done[0], 0, sizeof(f.done[0]));
	pbox_bit_set(f.done[0], 0);
	pbox_bit_set(f.done[0], 64);
	pbox_bit_set(f.done[0], 129);
	f.wcnt[0][0] = f.wcnt[0][64] = f.wcnt[0][129] = NFRAGS;
	f.wcnt[0][7] = 2;
	assert_int_equal(pboxd_chunk_read(&f.cs, WINDOW, NW, NFRAGS, done, partial, &it),
			 PBOXD_CHUNK_WAITING);
	assert_int_equal(it, 6);
	assert_memory_equal(done, f.done[0], sizeof(done));
	assert_true(pbox_bit_test(partial, 7));
	assert_int_equal(pbox_bit_next(partial, 0, NW), 7);
	assert_int_equal(pbox_bit_next(partial, 8, NW), NW);
	/* A done bit set but not yet counted: never reported as a state. */
	pbox_bit_set(f.done[0], 5);
	assert_int_equal(pboxd_chunk_read(&f.cs, WINDOW, NW, NFRAGS, done, NULL, &it),
			 PBOXD_CHUNK_CHANGING);
	f.slot[0].ndone = 4;
	assert_int_equal(pboxd_chunk_read(&f.cs, WINDOW, NW, NFRAGS, done, NULL, &it),
			 PBOXD_CHUNK_WAITING);
	/* A server-optimizer chunk waiting for its initial model. */
	f.cs.initialized = false;
	assert_int_equal(pboxd_chunk_read(&f.cs, WINDOW, NW, NFRAGS, done, NULL, &it),
			 PBOXD_CHUNK_UNINIT);
}

/* ---- a writer running iterations as the engine does, and a reader checking each read ---- */

#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

struct race {
	struct fake f;
	bool stop;
	uint32_t order[NW]; /* the order ranks complete in (a permutation) */
};

static void *writer(void *arg)
{
	struct race *r = arg;
	struct fake *f = &r->f;

	for (uint32_t v = 0; !__atomic_load_n(&r->stop, __ATOMIC_RELAXED); v++) {
		struct pbox_slot *sl = &f->slot[v % WINDOW];

		/* slot_open: iter, ndone, open, then the bitmaps are cleared. */
		ST(&sl->iter, v);
		ST(&sl->ndone, 0);
		ST(&sl->open, true);
		for (int w = 0; w < 3; w++) {
			ST(&sl->done[w], 0);
		}
		for (uint32_t k = 0; k < NW; k++) {
			uint32_t rank = r->order[(k + v) % NW];

			ST(&sl->done[rank / 64], sl->done[rank / 64] | 1ull << (rank % 64));
			ST(&sl->ndone, k + 1);
		}
		__atomic_store_n(&f->cs.version, v + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static void test_race(void **state)
{
	static struct race r;
	uint64_t done[3];
	uint32_t it, waiting = 0, changing = 0;
	pthread_t t;
	struct timespec t0, now;

	(void)state;
	fake_init(&r.f);
	for (uint32_t i = 0; i < NW; i++) {
		r.order[i] = (i * 37) % NW; /* 37 is prime to 130: a permutation */
	}
	assert_int_equal(pthread_create(&t, NULL, writer, &r), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		enum pboxd_chunk_read k =
			pboxd_chunk_read(&r.f.cs, WINDOW, NW, NFRAGS, done, NULL, &it);

		if (k == PBOXD_CHUNK_WAITING) {
			uint64_t want[3] = { 0 };
			uint32_t n = 0;

			for (int w = 0; w < 3; w++) {
				n += (uint32_t)__builtin_popcountll(done[w]);
			}
			/* The first n ranks of iteration it's order, nothing else. */
			for (uint32_t j = 0; j < n; j++) {
				pbox_bit_set(want, r.order[(j + it) % NW]);
			}
			assert_memory_equal(done, want, sizeof(want));
			waiting++;
		} else if (k == PBOXD_CHUNK_CHANGING) {
			changing++;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) < 300000000L);
	__atomic_store_n(&r.stop, true, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	print_message("%u consistent waiting reads, %u changing, writer at iteration %u\n", waiting,
		      changing, r.f.cs.version);
	assert_true(waiting > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cases),
		cmocka_unit_test(test_race),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
