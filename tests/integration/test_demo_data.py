#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The trainer's Fashion-MNIST loader: a small valid data set (plain and gzip IDX files)
trains, and every kind of damaged file is refused with a message that names the file and
the cause; `pbox demo` on damaged data reports the failing rank and its error and leaves
no process behind."""
import gzip
import os
import shutil
import struct
import subprocess
import tempfile

from pboxtest import build_path, check_gone, fail, run_demo

NAMES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def idx_images(n, rows=28, cols=28, magic=0x803, payload=None):
    data = bytes((i * 7 + 3) % 256 for i in range(n * rows * cols)) if payload is None \
        else payload
    return struct.pack(">IIII", magic, n, rows, cols) + data


def idx_labels(labels, magic=0x801):
    return struct.pack(">II", magic, len(labels)) + bytes(labels)


def write_set(d, compress, **override):
    files = {
        "train_images": idx_images(60),
        "train_labels": idx_labels([i % 10 for i in range(60)]),
        "test_images": idx_images(20),
        "test_labels": idx_labels([(i * 3) % 10 for i in range(20)]),
    }
    files.update(override)
    os.makedirs(d, exist_ok=True)
    for key, data in files.items():
        if data is None:
            continue
        path = os.path.join(d, NAMES[key])
        if compress:
            with gzip.open(path + ".gz", "wb") as f:
                f.write(data)
        else:
            with open(path, "wb") as f:
                f.write(data)


def train(d, extra=()):
    return subprocess.run([build_path("apps/pbox"), "train", "--local", "--data", d,
                           "--workers", "2", "--batch", "20", "--epochs", "2"] + list(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=60)


def expect_ok(d, what):
    p = train(d)
    if p.returncode != 0 or "epoch 2/2" not in p.stdout:
        fail("%s: training failed (%d): %s%s" % (what, p.returncode, p.stdout, p.stderr))
    print("%s: trains" % what)


def expect_error(d, what, *needles):
    p = train(d)
    if p.returncode == 0:
        fail("%s: accepted: %s" % (what, p.stdout))
    for n in needles:
        if n not in p.stderr:
            fail("%s: error does not mention %r:\n%s" % (what, n, p.stderr))
    print("%s: refused: %s" % (what, p.stderr.strip().splitlines()[-1]))


def main():
    root = tempfile.mkdtemp(prefix="pbox-data-")
    try:
        plain, gz = os.path.join(root, "plain"), os.path.join(root, "gz")
        write_set(plain, False)
        write_set(gz, True)
        expect_ok(plain, "uncompressed IDX files")
        expect_ok(gz, "gzip IDX files")

        cases = [
            ("bad image magic", False, {"train_images": idx_images(60, magic=0x804)},
             ["train-images-idx3-ubyte", "magic 0x00000804"]),
            ("labels file given as images", False,
             {"train_images": idx_labels([1] * 60)}, ["train-images-idx3-ubyte", "magic"]),
            ("truncated pixels", True,
             {"test_images": idx_images(20)[:-100]}, ["t10k-images-idx3-ubyte.gz", "truncated"]),
            ("trailing bytes", False,
             {"test_labels": idx_labels([1] * 20) + b"\0"},
             ["t10k-labels-idx1-ubyte", "trailing bytes"]),
            ("label out of range", True,
             {"train_labels": idx_labels([1, 2, 3, 10] + [0] * 56)},
             ["train-labels-idx1-ubyte.gz", "label 10 of sample 3"]),
            ("count mismatch", False,
             {"train_labels": idx_labels([1] * 59)},
             ["train-labels-idx1-ubyte", "59 labels", "60 images"]),
            ("zero samples", False, {"test_images": idx_images(0)},
             ["t10k-images-idx3-ubyte", "0 samples"]),
            ("wrong image size", False,
             {"train_images": idx_images(60, 20, 20), "test_images": idx_images(20, 20, 20)},
             ["20x20", "784"]),
            ("missing file", False, {"test_labels": None},
             ["t10k-labels-idx1-ubyte.gz: no such file"]),
            ("batch larger than the data", False, {}, []),
        ]
        for i, (what, compress, override, needles) in enumerate(cases):
            d = os.path.join(root, "case%d" % i)
            if what == "batch larger than the data":
                write_set(d, compress, train_images=idx_images(10),
                          train_labels=idx_labels([0] * 10))
                expect_error(d, what, "batch 20", "training set size (10)")
                continue
            write_set(d, compress, **override)
            expect_error(d, what, *needles)

        # A corrupt gzip stream (valid header, garbage deflate data).
        d = os.path.join(root, "corrupt-gzip")
        write_set(d, True)
        path = os.path.join(d, NAMES["train_images"] + ".gz")
        with open(path, "r+b") as f:
            f.seek(30)
            f.write(b"\xff" * 64)
        expect_error(d, "corrupt gzip data", "train-images-idx3-ubyte.gz")

        # The demo on damaged data: every rank fails; the report names a rank and the file.
        d = os.path.join(root, "demo")
        write_set(d, False, train_labels=idx_labels([1, 2, 3, 10] + [0] * 56))
        p = run_demo(["--data", d, "--batch", "12", "--epochs", "1"], timeout=50, watch=True)
        if p.returncode != 1:
            fail("demo on damaged data exited with %d:\n%s%s" % (p.returncode, p.stdout,
                                                                  p.stderr))
        if "failed" not in p.stderr or "rank " not in p.stderr or \
                "label 10 of sample 3" not in p.stderr:
            fail("demo did not report the failing rank and its error:\n%s" % p.stderr)
        if not any("pboxd" in c for _, c in p.kids):
            fail("the demo on damaged data did not start pboxd: %s" % p.kids)
        check_gone(p.kids, None, "demo on damaged data")
        print("demo on damaged data: %s; none of its %d processes left" %
              ([l for l in p.stderr.splitlines() if "failed" in l][0], len(p.kids)))
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
