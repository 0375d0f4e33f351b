#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""One rank of the demo's training (784-256-128-10 MLP, Fashion-MNIST, NAG lr 0.05
momentum 0.9, global batch split over the ranks) with torch.distributed's gloo backend:
DDP averages the ranks' gradients with allreduce, as a PyTorch user would train it.
Not bit-identical to `pbox train` (torch's own initialisation and shuffles). Prints one JSON
line per epoch: {"ev": "epoch", "epoch", "train_s", "eval_s", "test": {"correct",
"samples"}} (test set sharded over the ranks; add the ranks' counts)."""

import argparse
import datetime
import gzip
import json
import os
import time


def idx(path):
    with gzip.open(path, "rb") as f:
        b = f.read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    import numpy as np
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=240)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=a.timeout))
    ld = lambda n: idx(os.path.join(a.data, n))  # noqa: E731
    xtr = torch.tensor(ld("train-images-idx3-ubyte.gz").reshape(-1, 784) / 255.0,
                       dtype=torch.float32)
    ytr = torch.tensor(ld("train-labels-idx1-ubyte.gz").astype("int64"))
    xte = torch.tensor(ld("t10k-images-idx3-ubyte.gz").reshape(-1, 784) / 255.0,
                       dtype=torch.float32)
    yte = torch.tensor(ld("t10k-labels-idx1-ubyte.gz").astype("int64"))
    net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 10))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, nesterov=True)
    lossf = torch.nn.CrossEntropyLoss()
    per = a.batch // a.world
    steps = len(xtr) // a.batch
    te = torch.arange(len(xte)).chunk(a.world)[a.rank]
    g = torch.Generator().manual_seed(a.seed)
    for ep in range(1, a.epochs + 1):
        t0 = time.monotonic()
        perm = torch.randperm(len(xtr), generator=g)
        model.train()
        for s in range(steps):
            ix = perm[s * a.batch + a.rank * per:s * a.batch + (a.rank + 1) * per]
            opt.zero_grad()
            lossf(model(xtr[ix]), ytr[ix]).backward()  # DDP: mean over the ranks
            opt.step()
        t1 = time.monotonic()
        model.eval()
        with torch.no_grad():
            correct = int((net(xte[te]).argmax(1) == yte[te]).sum())
        print(json.dumps({"ev": "epoch", "epoch": ep, "train_s": t1 - t0,
                          "eval_s": time.monotonic() - t1,
                          "test": {"correct": correct, "samples": len(te)}}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
