/* SPDX-License-Identifier: BSD-3-Clause */
/* AVX-512F instantiation of the kernels (built with -mavx512f). */
#include <immintrin.h>

#include "kern_isa.h"

typedef float vf __attribute__((vector_size(64)));
#define VW            16
#define KFN(name)     pbox_kern_##name##_avx512
#define KERN_ISA_NAME "avx512"
#define VSQRT(x)      ((vf)_mm512_sqrt_ps((__m512)(x)))
/* s first: minps/maxps return the second operand when either is NaN, so NaN stays NaN */
#define VMINS(x, s) ((vf)_mm512_min_ps(_mm512_set1_ps(s), (__m512)(x)))
#define VMAXS(x, s) ((vf)_mm512_max_ps(_mm512_set1_ps(s), (__m512)(x)))

#define VIMAX(a, b) ((vi)_mm512_max_epi32((__m512i)(a), (__m512i)(b)))

#include "kern_impl.h"
