/* SPDX-License-Identifier: BSD-3-Clause */
/* SSE2 instantiation of the kernels (the x86-64 baseline). */
#include <emmintrin.h>

#include "kern_isa.h"

typedef float vf __attribute__((vector_size(16)));
#define VW            4
#define KFN(name)     pbox_kern_##name##_sse2
#define KERN_ISA_NAME "sse2"
#define VSQRT(x)      ((vf)_mm_sqrt_ps((__m128)(x)))
/* s first: minps/maxps return the second operand when either is NaN, so NaN stays NaN */
#define VMINS(x, s) ((vf)_mm_min_ps(_mm_set1_ps(s), (__m128)(x)))
#define VMAXS(x, s) ((vf)_mm_max_ps(_mm_set1_ps(s), (__m128)(x)))

#include "kern_impl.h"
