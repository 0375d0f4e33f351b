/* SPDX-License-Identifier: BSD-3-Clause */
/* AVX2 instantiation of the kernels (built with -mavx2, without -mfma). */
#include <immintrin.h>

#include "kern_isa.h"

typedef float vf __attribute__((vector_size(32)));
#define VW            8
#define KFN(name)     pbox_kern_##name##_avx2
#define KERN_ISA_NAME "avx2"
#define VSQRT(x)      ((vf)_mm256_sqrt_ps((__m256)(x)))
/* s first: minps/maxps return the second operand when either is NaN, so NaN stays NaN */
#define VMINS(x, s) ((vf)_mm256_min_ps(_mm256_set1_ps(s), (__m256)(x)))
#define VMAXS(x, s) ((vf)_mm256_max_ps(_mm256_set1_ps(s), (__m256)(x)))

#define VIMAX(a, b) ((vi)_mm256_max_epi32((__m256i)(a), (__m256i)(b)))

#include "kern_impl.h"
