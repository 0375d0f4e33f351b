/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-ISA kernel tables defined by kern_<isa>.c; only dispatch.c uses them. */
#ifndef PBOX_KERN_ISA_H
#define PBOX_KERN_ISA_H

#include "kernels.h"

extern const struct pbox_kernels pbox_kern_table_avx512;
extern const struct pbox_kernels pbox_kern_table_avx2;
extern const struct pbox_kernels pbox_kern_table_sse2;
extern const struct pbox_kernels pbox_kern_table_scalar;

#endif /* PBOX_KERN_ISA_H */
