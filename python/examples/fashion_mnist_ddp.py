#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Train a small CNN on Fashion-MNIST with DistributedDataParallel, its gradients averaged
either by the process group (--backend gloo: allreduce) or by a PBox appliance
(--backend pbox: the pbox.torch communication hook). Launch with torchrun:

  one machine, 2 ranks:
    PBOX_SERVER=127.0.0.1:7000 PBOX_JOB=1 PBOX_TOKEN=s3cret \\
      torchrun --standalone --nproc_per_node=2 fashion_mnist_ddp.py --backend pbox

  two machines (run on each; --node_rank 0 on the first, 1 on the second):
    PBOX_SERVER=<pbox-host>:7000 PBOX_JOB=1 PBOX_TOKEN=s3cret \\
      torchrun --nnodes=2 --node_rank=<0|1> --nproc_per_node=1 \\
        --master_addr=<first-host> --master_port=29500 fashion_mnist_ddp.py --backend pbox

The data are Debian's dataset-fashion-mnist IDX files. Rank 0 prints progress and the test
accuracy after training, and can write parameter snapshots (--check-every/--check-out) and
a JSON summary (--metrics-out).
"""
import argparse
import contextlib
import gzip
import json
import os
import sys
import time

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    sys.exit("fashion_mnist_ddp: PyTorch is missing (%s); on Debian: apt-get install "
             "python3-torch, and run /usr/bin/python3" % e)

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # of the Fashion-MNIST training images


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, padding=2)
        self.conv2 = nn.Conv2d(8, 16, 5, padding=2)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def read_idx(path, ndim):
    """An IDX file (gzip): magic 0x0000 08 <ndim>, big-endian dimensions, uint8 data."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        sys.exit("fashion_mnist_ddp: cannot read %s: %s (install dataset-fashion-mnist or "
                 "pass --data-dir)" % (path, e))
    if len(raw) < 4 + 4 * ndim or raw[:3] != b"\0\0\x08" or raw[3] != ndim:
        sys.exit("fashion_mnist_ddp: %s is not a %d-dimensional uint8 IDX file" % (path, ndim))
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        sys.exit("fashion_mnist_ddp: %s: %d bytes of data for dimensions %s"
                 % (path, data.size, dims))
    return data.reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 1)
    if len(images) != len(labels):
        sys.exit("fashion_mnist_ddp: %s: %d images but %d labels"
                 % (data_dir, len(images), len(labels)))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Fashion-MNIST CNN with DDP; gradients averaged by gloo allreduce or by "
                    "a PBox appliance. Launch with torchrun.")
    p.add_argument("--backend", choices=["gloo", "pbox"], default="gloo",
                   help="who averages the gradients (default gloo)")
    p.add_argument("--data-dir", default=DEFAULT_DATA,
                   help="directory of the IDX .gz files (default %(default)s)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many optimizer steps (0: run the epochs)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    p.add_argument("--accumulate", type=int, default=1,
                   help="micro-batches per optimizer step; all but the last run under "
                        "no_sync() (default 1)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: cores / local ranks)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP bucket size (default 25)")
    p.add_argument("--check-every", type=int, default=0,
                   help="rank 0 records all parameters every N steps and at the end")
    p.add_argument("--check-out", help="file for the recorded parameters (.npz)")
    p.add_argument("--metrics-out", help="rank 0 writes a JSON summary here")
    p.add_argument("--pbox-server", help="pboxd control address (default: $PBOX_SERVER)")
    p.add_argument("--pbox-job", type=int, help="job id (default: $PBOX_JOB)")
    p.add_argument("--pbox-token", help="job token (default: $PBOX_TOKEN)")
    p.add_argument("--verify-allreduce", action="store_true",
                   help="pbox backend: also reduce every bucket through the process group "
                        "and compare (see pbox.torch.PBoxState(verify=True))")
    p.add_argument("--log-every", type=int, default=100)
    a = p.parse_args(argv)
    for name in ("epochs", "batch_size", "accumulate"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.check_every and not a.check_out:
        p.error("--check-every needs --check-out")
    return a


def evaluate(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    model.train()
    return correct / len(x)


def main(argv):
    a = parse_args(argv)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            sys.exit("fashion_mnist_ddp: %s is not set: launch with torchrun (see --help)" % var)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)
    model = DDP(Net(), bucket_cap_mb=a.bucket_cap_mb)
    state = None
    if a.backend == "pbox":
        import pbox.torch
        state = pbox.torch.register(model, server=a.pbox_server, job=a.pbox_job,
                                    token=a.pbox_token, verify=a.verify_allreduce)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)

    x_train, y_train = load(a.data_dir, "train")
    sampler = torch.utils.data.DistributedSampler(range(len(x_train)), num_replicas=world,
                                                  rank=rank, shuffle=True, seed=a.seed)
    checks = {}

    def record(step):
        if rank == 0 and a.check_every:
            checks["step_%d" % step] = torch.cat(
                [p.detach().flatten() for p in model.parameters()]).numpy().copy()

    step, t0, done = 0, time.perf_counter(), False
    micro = a.batch_size
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        batches = [idx[i:i + micro] for i in range(0, len(idx), micro)]
        for b in range(0, len(batches) - a.accumulate + 1, a.accumulate):
            group = batches[b:b + a.accumulate]
            for j, bi in enumerate(group):
                last = j == len(group) - 1
                ctx = model.no_sync() if not last else contextlib.nullcontext()
                with ctx:
                    loss = F.cross_entropy(model(x_train[bi]), y_train[bi])
                    (loss / len(group)).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            step += 1
            if a.check_every and step % a.check_every == 0:
                record(step)
            if rank == 0 and a.log_every and step % a.log_every == 0:
                print("step %d loss %.4f" % (step, loss.item()), flush=True)
            if a.max_steps and step >= a.max_steps:
                done = True
                break
        if done:
            break
    elapsed = time.perf_counter() - t0
    if a.check_every and ("step_%d" % step) not in checks:
        record(step)

    summary = None
    if rank == 0:
        x_test, y_test = load(a.data_dir, "test")
        acc = evaluate(model.module, x_test, y_test)
        summary = {"backend": a.backend, "world_size": world, "steps": step,
                   "seconds": elapsed, "step_ms": 1000.0 * elapsed / max(step, 1),
                   "test_accuracy": acc}
        if state is not None:
            summary["pbox_iterations"] = min(state.iterations().values())
            if state.verify:
                summary["verify"] = state.verify_stats
        print("backend %s, %d ranks: %d steps in %.1f s (%.1f ms/step), test accuracy %.4f"
              % (a.backend, world, step, elapsed, summary["step_ms"], acc), flush=True)
        if "verify" in summary:
            v = summary["verify"]
            print("verified %d buckets: %d values differ from the rank-ordered mean; largest "
                  "difference from the default allreduce: %.2f of the rounding bound"
                  % (v["buckets"], v["ordered_mismatches"], v["max_default_dev"]), flush=True)
        if a.check_every:
            np.savez(a.check_out, **checks)
        if a.metrics_out:
            with open(a.metrics_out, "w") as f:
                json.dump(summary, f)
    if state is not None:
        state.close()
    # Rank 0 hosts the process group's store: it leaves last.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
