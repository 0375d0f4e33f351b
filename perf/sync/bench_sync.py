#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Synchronisation-model and flow-control benchmarks (one run, same machine).

1. The training demo with rank 2 slowed to half speed (its compute takes 2x as long),
   under every synchronisation model, lazy and eager release: steps per second, final
   test accuracy, and the pulls the appliance had to hold back (FluentPS's DPRs).
2. Flow control: three workers stream pushes of 4 x 1 MB keys with no compute into an
   aggregate job under NOTIFY-ACK with 1, 2 and 4 credits and with plain pushes:
   contributions per second per worker and retransmissions.

Usage: bench_sync.py --build-dir BUILD [--epochs N] [--iters K]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from pboxtest import Pboxd, run_demo  # noqa: E402


def demo(epochs, args):
    p = run_demo(["--json", "--epochs", str(epochs), "--slow-rank", "2", "--slow-factor", "2"] +
                 args, timeout=900)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-2000:])
        raise SystemExit("pbox demo %s failed" % " ".join(args))
    return json.loads(p.stdout)


def sync_table(epochs):
    runs = [
        ("BSP", ["--sync", "bsp"]),
        ("SSP s=2, lazy", ["--sync", "ssp", "--staleness", "2"]),
        ("SSP s=2, eager", ["--sync", "ssp", "--staleness", "2", "--release", "eager"]),
        ("ASP", ["--sync", "asp"]),
        ("PSSP s=2 c=0.5, lazy", ["--sync", "pssp", "--staleness", "2", "--probability", "0.5"]),
        ("PSSP s=2 c=0.5, eager", ["--sync", "pssp", "--staleness", "2", "--probability",
                                   "0.5", "--release", "eager"]),
        ("PSSP-dyn s=2 a=1, lazy", ["--sync", "pssp-dyn", "--staleness", "2", "--alpha", "1"]),
        ("drop-stragglers 2 of 3", ["--sync", "drop-stragglers", "--quorum", "2"]),
    ]
    print("## Synchronisation models, rank 2 slowed 2x (%d epochs, 3 workers)\n" % epochs)
    print("| model | steps/s | samples/s | test accuracy | pulls held | vs BSP |")
    print("|---|---|---|---|---|---|")
    base = None
    for name, args in runs:
        r = demo(epochs, args)
        steps_s = r["steps"] / r["train_s"]
        base = base or steps_s
        print("| %s | %.1f | %.0f | %.2f%% | %d | %.2fx |" %
              (name, steps_s, r["samples_per_s"], 100 * r["final_test_acc"],
               r["appliance"]["pulls_held"], steps_s / base), flush=True)
    print()


def flow_table(build, iters):
    keys = ",".join(["262144"] * 4)
    worker = os.path.join(build, "perf", "sync", "pbox-bench-flow")
    print("## Flow control: 3 workers streaming pushes of 4 x 1 MB keys, %d iterations\n" %
          iters)
    print("| flow | pushes/s per worker | GB/s per worker | retransmits | vs NOTIFY-ACK k=1 |")
    print("|---|---|---|---|---|")
    base = None
    for name, flow in (("NOTIFY-ACK, 1 credit", {"mode": "notify-ack", "credits": 1}),
                       ("NOTIFY-ACK, 2 credits", {"mode": "notify-ack", "credits": 2}),
                       ("NOTIFY-ACK, 4 credits", {"mode": "notify-ack", "credits": 4}),
                       ("plain pushes", {"mode": "plain"})):
        jobs = [{"id": 1, "token": "t", "workers": 3, "mode": "aggregate", "window": 8,
                 "flow": flow}]
        with Pboxd(jobs, cores=1, mtu=65535) as d:
            procs = [subprocess.Popen([worker, "--server", d.control, "--job", "1", "--token",
                                       "t", "--rank", str(r), "--keys", keys, "--iters",
                                       str(iters)], stdout=subprocess.PIPE, text=True)
                     for r in range(3)]
            res = []
            for p in procs:
                out, _ = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise SystemExit("pbox-bench-flow failed under %s" % name)
                res.append(json.loads(out))
        pps = sum(x["pushes_per_s"] for x in res) / 3
        gbs = sum(x["gbytes_per_s"] for x in res) / 3
        base = base or pps
        print("| %s | %.0f | %.2f | %d | %.2fx |" %
              (name, pps, gbs, sum(x["retransmits"] for x in res), pps / base), flush=True)
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--only", choices=["sync", "flow"])
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    os.environ["PBOX_BUILD_DIR"] = build  # for pboxtest
    if a.only != "flow":
        sync_table(a.epochs)
    if a.only != "sync":
        flow_table(build, a.iters)


if __name__ == "__main__":
    main()
