#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""One rank of netlab's Gloo peer: allreduce (sum) of a model's gradient, bucketed as DDP
buckets it (the bucket sizes come from netlab.gloo_buckets), every bucket in flight at
once, then all waited for — what DDP's allreduce hook does in one backward pass, with no
computation. Each bucket is refilled with ones (untimed) before every exchange, and after
the last one every element must be exactly the world size. Prints one JSON line:
{"rank", "iter_seconds": [...], "bytes", "exact"}.

Run by netlab.py in the rank's namespace with GLOO_SOCKET_IFNAME set to the lab link.
"""
import argparse
import datetime
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="rank 0's HOST:PORT for the rendezvous")
    ap.add_argument("--buckets", required=True, help="comma-separated bucket element counts")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=600, help="seconds for any collective")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank,
                            world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    sizes = [int(x) for x in a.buckets.split(",")]
    bufs = [torch.empty(n, dtype=torch.float32) for n in sizes]
    times = []
    for i in range(a.warmup + a.iterations):
        for b in bufs:
            b.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    exact = all(bool(torch.all(b == float(a.world))) for b in bufs)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "iter_seconds": times, "bytes": 4 * sum(sizes),
                      "exact": exact}), flush=True)
    if not exact:
        print("gloo rank %d: allreduce results are not exactly %d" % (a.rank, a.world),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
