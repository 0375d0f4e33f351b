#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The trainer's mathematics against PyTorch autograd: on a small data set whose global
batch is the whole training split (so the shuffle does not matter), one SGD step of
`pbox train --local` (3 simulated ranks, each summing its shard's gradient; the optimizer
rescales by 1/batch) must move the saved model by lr * mean gradient as PyTorch computes
it for the same network, and the reported loss and accuracy must match PyTorch's. Also
reads the model file format documented in trainer.h."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from pboxtest import build_path, fail

N_TRAIN, N_TEST, LR = 48, 20, 0.05
DIMS = [784, 256, 128, 10]


def write_idx(d):
    # Deterministic pseudo-random pixels and labels (a small LCG).
    state = 12345

    def nxt():
        nonlocal state
        state = (state * 1103515245 + 12345) & 0x7fffffff
        return state >> 16

    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        pixels = bytes(nxt() % 256 for _ in range(n * 784))
        labels = bytes(nxt() % 10 for _ in range(n))
        with open(os.path.join(d, "%s-images-idx3-ubyte" % prefix), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + pixels)
        with open(os.path.join(d, "%s-labels-idx1-ubyte" % prefix), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + labels)


def read_model(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"PBOXMLP1":
        fail("%s: bad magic %r" % (path, data[:8]))
    off = 8
    nl, = struct.unpack_from("<I", data, off)
    off += 4
    dims = list(struct.unpack_from("<%dI" % (nl + 1), data, off))
    off += 4 * (nl + 1)
    nt, = struct.unpack_from("<I", data, off)
    off += 4
    sizes = []
    for _ in range(nt):
        key, n = struct.unpack_from("<IQ", data, off)
        off += 12
        sizes.append((key, n))
    if dims != DIMS or [k for k, _ in sizes] != list(range(2 * len(DIMS) - 2)):
        fail("%s: layers %s keys %s" % (path, dims, sizes))
    tensors = []
    for _, n in sizes:
        tensors.append(data[off:off + 4 * n])
        off += 4 * n
    if off != len(data):
        fail("%s: %d bytes after the last tensor" % (path, len(data) - off))
    return tensors


def train(d, epochs, model):
    p = subprocess.run([build_path("apps/pbox"), "train", "--local", "--json",
                        "--data", d, "--workers", "3", "--batch", str(N_TRAIN), "--epochs",
                        str(epochs), "--optimizer", "sgd", "--lr", str(LR), "--save-model",
                        model], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    if p.returncode != 0:
        fail("pbox train exited with %d: %s" % (p.returncode, p.stderr))
    return [json.loads(l) for l in p.stdout.splitlines()]


def main():
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print("SKIP: needs numpy and torch (%s)" % e)
        sys.exit(77)
    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="pbox-grad-")
    try:
        write_idx(d)
        train(d, 1, os.path.join(d, "w1.bin"))
        events = train(d, 2, os.path.join(d, "w2.bin"))
        w1 = [np.frombuffer(t, dtype="<f4").astype(np.float64)
              for t in read_model(os.path.join(d, "w1.bin"))]
        w2 = [np.frombuffer(t, dtype="<f4").astype(np.float64)
              for t in read_model(os.path.join(d, "w2.bin"))]

        with open(os.path.join(d, "train-images-idx3-ubyte"), "rb") as f:
            px = np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(N_TRAIN, 784)
        with open(os.path.join(d, "train-labels-idx1-ubyte"), "rb") as f:
            y = np.frombuffer(f.read()[8:], dtype=np.uint8)
        x = (px.astype(np.float64) / 255.0 - 0.2860) / 0.3530

        # The same network in PyTorch (double precision), at the model after step 1.
        params = []
        for i in range(len(DIMS) - 1):
            w = torch.tensor(w1[2 * i].reshape(DIMS[i + 1], DIMS[i]), requires_grad=True)
            b = torch.tensor(w1[2 * i + 1], requires_grad=True)
            params += [w, b]
        h = torch.tensor(x)
        for i in range(len(DIMS) - 1):
            h = h @ params[2 * i].T + params[2 * i + 1]
            if i < len(DIMS) - 2:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, torch.tensor(y, dtype=torch.long),
                                                 reduction="sum")
        loss.backward()
        correct = int((h.argmax(1).numpy() == y).sum())

        ep2 = [e for e in events if e["ev"] == "epoch" and e["epoch"] == 2][0]
        if abs(ep2["train"]["loss"] - loss.item()) > 1e-4 * abs(loss.item()):
            fail("loss at step 2: pbox %.6f, PyTorch %.6f" % (ep2["train"]["loss"], loss.item()))
        if ep2["train"]["correct"] != correct or ep2["train"]["samples"] != N_TRAIN:
            fail("accuracy at step 2: pbox %d/%d, PyTorch %d/%d" % (
                ep2["train"]["correct"], ep2["train"]["samples"], correct, N_TRAIN))
        worst = 0.0
        for i, p in enumerate(params):
            want = LR * p.grad.numpy().reshape(-1) / N_TRAIN
            got = w1[i] - w2[i]
            scale = max(np.abs(want).max(), 1e-6)
            err = np.abs(got - want).max() / scale
            worst = max(worst, err)
            if err > 2e-3:
                fail("tensor %d: step differs from lr * mean gradient by %.3g (relative)"
                     % (i, err))
        print("loss %.6f (PyTorch %.6f), %d/%d correct; SGD step matches autograd within "
              "%.2g relative" % (ep2["train"]["loss"], loss.item(), correct, N_TRAIN, worst))
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
