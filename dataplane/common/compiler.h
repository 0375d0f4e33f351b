/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Compiler helpers shared by every pbox component. Header only; no state.
 */
#ifndef PBOX_COMPILER_H
#define PBOX_COMPILER_H

#include <assert.h>
#include <stddef.h>

#define PBOX_CACHE_LINE 64

#define pbox_likely(x)   __builtin_expect(!!(x), 1)
#define pbox_unlikely(x) __builtin_expect(!!(x), 0)

#define PBOX_ALIGNED(a)    __attribute__((aligned(a)))
#define PBOX_CACHE_ALIGNED PBOX_ALIGNED(PBOX_CACHE_LINE)
#define PBOX_PRINTF(f, a)  __attribute__((format(printf, f, a)))
#define PBOX_UNUSED        __attribute__((unused))

#define PBOX_ARRAY_SIZE(a)      (sizeof(a) / sizeof((a)[0]))
#define PBOX_MIN(a, b)          ((a) < (b) ? (a) : (b))
#define PBOX_MAX(a, b)          ((a) > (b) ? (a) : (b))
#define PBOX_DIV_ROUND_UP(n, d) (((n) + (d)-1) / (d))
#define PBOX_ALIGN_UP(n, a)     (PBOX_DIV_ROUND_UP(n, a) * (a))

#define pbox_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#endif /* PBOX_COMPILER_H */
