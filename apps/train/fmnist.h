/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fashion-MNIST (or MNIST) loader: reads the IDX files of one split, gzip-compressed or
 * not (zlib reads both), and validates them completely before anything is trained on
 * them: magic numbers, dimensions, exact payload sizes, no trailing bytes, labels < 10,
 * and the same sample count in the image and label files.
 *
 * Files (Debian package dataset-fashion-mnist installs them in PBOX_FMNIST_DEFAULT_DIR):
 *   train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]
 *   t10k-images-idx3-ubyte[.gz]   t10k-labels-idx1-ubyte[.gz]
 *
 * Thread safety: the functions keep no state; a loaded set is read-only and may be shared.
 */
#ifndef PBOX_TRAIN_FMNIST_H
#define PBOX_TRAIN_FMNIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PBOX_FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define PBOX_FMNIST_CLASSES     10

struct pbox_fmnist_set {
	uint32_t n;      /* samples */
	uint32_t rows;   /* image height */
	uint32_t cols;   /* image width */
	uint8_t *images; /* n * rows * cols pixels, sample-major, row-major inside */
	uint8_t *labels; /* n class indices, each < PBOX_FMNIST_CLASSES */
};

/*
 * Load the training (train = true) or test split from dir into set (overwritten).
 * Returns 0; -ENOENT (a file is missing: neither NAME nor NAME.gz), -EINVAL (a file is
 * not valid IDX: bad magic, dimensions, size, label value, or the two files disagree),
 * -EIO (read or gzip error) or -ENOMEM. On error, err holds a message naming the file
 * and the cause, and set holds nothing to free.
 */
int pbox_fmnist_load(const char *dir, bool train, struct pbox_fmnist_set *set, char *err,
		     size_t errlen);

/*
 * Pixels as network inputs: sample i of the output is sample idx[i] of the set, or
 * first + i if idx is NULL; x gets n * rows * cols floats standardised with the training
 * split's pixel mean and deviation, y the n labels. Indices must be < set->n.
 */
void pbox_fmnist_gather(const struct pbox_fmnist_set *set, const uint32_t *idx, uint32_t first,
			uint32_t n, float *x, uint8_t *y);

/* Free what pbox_fmnist_load allocated; the set is zeroed. */
void pbox_fmnist_free(struct pbox_fmnist_set *set);

#endif /* PBOX_TRAIN_FMNIST_H */
