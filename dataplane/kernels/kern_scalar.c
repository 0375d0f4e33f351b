/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Plain-C instantiation of the kernels: the reference every vector path is tested
 * against. VW == 1, so every element goes through the scalar form of the element macros.
 * Built with -fno-tree-vectorize so the reference really is one element at a time.
 */
#include "kern_isa.h"

typedef float vf;
#define VW            1
#define KFN(name)     pbox_kern_##name##_scalar
#define KERN_ISA_NAME "scalar"
#define VSQRT(x)      sqrtf(x)
#define VMINS(x, s)   ((s) < (x) ? (s) : (x)) /* NaN x stays NaN */
#define VMAXS(x, s)   ((s) > (x) ? (s) : (x))

#include "kern_impl.h"
