#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A/B of pbox builds only (no Gloo, no echo bound): bench_comm.run_one for each build in
rotating order, --reps rounds, the same scenario as bench_comm.py's compare part (ResNet-50,
32 KB chunks, MTU 65535, pboxd 2 cores, kernel UDP). Prints each run and the medians of
s per exchange, CPU s per exchange round (all processes) and the workers' CPU (timed
iterations), and writes every run to OUT (JSON).

    perf/bench_ab.py new=build,old=/tmp/base/build 2 6 perf/results/ab.json
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import bench_comm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", help="NAME=BUILD_DIR,NAME=BUILD_DIR,...")
    ap.add_argument("workers", type=int)
    ap.add_argument("reps", type=int)
    ap.add_argument("out")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.builds.split(","))
    names = list(builds)
    args = argparse.Namespace(idle_us=None, shm_ring_kb=None, non_finite=None, cores=2,
                              busy_poll=False, rto_ms=None, build_dir=builds[names[0]])
    res = {k: [] for k in names}
    for r in range(a.reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            x = bench_comm.run_one(args, "resnet50", a.workers, 32 << 10, 65535, 0, 3.0,
                                   build_dir=builds[k])
            if "error" in x:
                print(r, k, "error:", x["error"], flush=True)
                continue
            d = dict(iters=x["iters"], med=statistics.median(x["iter_seconds"]),
                     cpu=x["cpu_s"] / (x["iters"] + 2), wcpu=x.get("client_cpu_per_iter"),
                     retx=x.get("retransmits"), load=os.getloadavg()[0])
            res[k].append(d)
            print(r, k, {n: (round(v, 4) if isinstance(v, float) else v) for n, v in d.items()},
                  flush=True)
    for k in names:
        v = res[k]
        if v:
            print("%-8s s/exch %.4f  cpu %.4f  workers' cpu %.4f  rounds %d" % (
                k, statistics.median(d["med"] for d in v), statistics.median(d["cpu"] for d in v),
                statistics.median(d["wcpu"] or 0 for d in v), len(v)))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
