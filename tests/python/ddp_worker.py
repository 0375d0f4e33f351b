# SPDX-License-Identifier: BSD-3-Clause
"""One DDP rank for tests/python/test_ddp.py, started like torchrun starts its workers
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment).

  --mode rebuild  a model whose backward order differs from its definition order and
                  small buckets: DDP's first iteration uses one bucket, then it rebuilds
                  them (several, of different sizes) in gradient-ready order
  --mode nosync   gradient accumulation: all micro-batches but the last under no_sync()
  --mode dies     trains until told the appliance is gone; expects backward() to raise
  --mode view     as rebuild, with DDP(gradient_as_bucket_view=True): the gradients are
                  views of DDP's buckets, and the hook's result a different tensor

Backend pbox exchanges from registered bucket buffers over shm (PBoxState(registered=True)),
pbox-plain from DDP's own buckets (PBoxState(registered=False)).

Phases run one after the other in one process group, each on a fresh model. Rank 0
writes the parameters after every step (and, with the pbox backend, every bucket the hook
saw and the per-key iteration counts) to <out-dir>/<mode>-<backend>.npy / .json.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class BackwardOrderDiffers(nn.Module):
    """Defined a, b, c, first; used first, a, b, c: gradients are ready c, b, a, first,
    not in the reverse definition order DDP guesses for its first buckets."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 64)
        self.c = nn.Linear(64, 10)
        self.first = nn.Linear(24, 32)

    def forward(self, x):
        x = torch.tanh(self.first(x))
        x = torch.tanh(self.a(x))
        x = torch.tanh(self.b(x))
        return self.c(x)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(24, 48)
        self.l2 = nn.Linear(48, 10)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def batch(seed, rank, step, micro=0, n=16):
    g = torch.Generator().manual_seed(seed * 1000003 + rank * 10007 + step * 101 + micro)
    return torch.randn(n, 24, generator=g), torch.randint(0, 10, (n,), generator=g)


def build(mode):
    torch.manual_seed(7)
    if mode in ("rebuild", "view"):
        # Small caps so that the rebuilt layout has several buckets (read by DDP's
        # constructor).
        dist._DEFAULT_FIRST_BUCKET_BYTES = 4096
        return DDP(BackwardOrderDiffers(), bucket_cap_mb=0.005,
                   gradient_as_bucket_view=mode == "view")
    return DDP(Small())


def run_phase(mode, backend, job, a, rank):
    """Train one fresh model; rank 0 writes its record to <out_dir>/<mode>-<backend>."""
    model = build(mode)
    seen = []
    params = []
    state = None
    if backend in ("pbox", "pbox-plain"):
        import pbox.torch
        state = pbox.torch.PBoxState(model, job=job, registered=backend == "pbox")

        def recording_hook(st, bucket):
            keys = [st._key_of[q.data_ptr()] for q in bucket.parameters()]
            seen.append({"step": len(params), "index": bucket.index(),
                         "numel": bucket.buffer().numel(), "keys": keys})
            return st.allreduce(bucket)

        model.register_comm_hook(state, recording_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    if mode == "dies":
        step = 0
        try:
            while step < 3000:
                x, y = batch(1, rank, step)
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                step += 1
                if step == 3:
                    print("READY", flush=True)
                time.sleep(0.002)
        except RuntimeError as e:
            print("ERROR after %d steps: %s" % (step, e), flush=True)
            sys.exit(3)
        print("no error after %d steps" % step, flush=True)
        sys.exit(0)

    for step in range(a.steps):
        micro = a.accumulate if mode == "nosync" else 1
        for m in range(micro):
            x, y = batch(1, rank, step, m)
            ctx = model.no_sync() if m < micro - 1 else contextlib.nullcontext()
            with ctx:
                (F.cross_entropy(model(x), y) / micro).backward()
        opt.step()
        opt.zero_grad()
        params.append(torch.cat([q.detach().flatten() for q in model.parameters()]).numpy()
                      .copy())

    if rank == 0:
        out = os.path.join(a.out_dir, "%s-%s" % (mode, backend))
        np.save(out + ".npy", np.stack(params))
        info = {"buckets": seen,
                "nparams": len(list(model.parameters())),
                "sizes": [q.numel() for q in model.parameters()]}
        if state is not None:
            info["iterations"] = {str(k): v for k, v in state.iterations().items()}
            info["client_stats"] = state.client.stats()
            info["transport"] = state.client.transport
            info["memory"] = state.memory
            info["bucket_stats"] = state.bucket_stats
        with open(out + ".json", "w") as f:
            json.dump(info, f)
    if state is not None:
        state.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--phase", action="append", required=True, metavar="MODE:BACKEND[:JOB]",
                   help="mode rebuild|nosync|dies|view, backend gloo|pbox|pbox-plain, pbox job id; "
                        "repeatable, run in order")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--out-dir", default=".")
    a = p.parse_args()
    phases = []
    for ph in a.phase:
        f = ph.split(":")
        if (len(f) not in (2, 3) or f[0] not in ("rebuild", "nosync", "dies", "view")
                or f[1] not in ("gloo", "pbox", "pbox-plain")
                or (f[1] != "gloo") != (len(f) == 3)):
            p.error("bad --phase %r" % ph)
        phases.append((f[0], f[1], int(f[2]) if len(f) == 3 else None))

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for mode, backend, job in phases:
        run_phase(mode, backend, job, a, dist.get_rank())
    # Rank 0 hosts the process group's store: it leaves last.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
