#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""What pboxd's ways cost an aggregating exchange over kernel UDP, measured in its bound.

Runs pbox-udp-echo-bound --reduce (the aggregating bound: each datagram's contributions
kept in the receive buffers they arrived in, summed once when the last arrives, nothing
else) beside the same with one of pboxd's ways added, interleaved, --rounds rounds for
each worker count:
  copy-first  the first contribution copied into an accumulator and the others added
              to it, instead of holding the receive buffers ("tall" aggregation's gain)
  ack         a 64-byte ACK to each contribution that waits for others
  scan        each contribution checked for NaN / Inf in a pass of its own
  all         the three together
and prints the medians of seconds and of CPU seconds per exchange (all the program's
processes, warm-up included) and their ratios to the bound's. ResNet-50's gradient,
32 KB fragments and pbox's 64-byte header, 2 echo threads.

Usage: perf/agg_costs.py [--build-dir build] [--workers 2,3] [--rounds 5] [--iters 10]
                         [--json FILE]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

VARIANTS = [("bound", []), ("copy-first", ["--copy-first"]), ("ack", ["--ack"]),
            ("scan", ["--scan"]), ("all", ["--copy-first", "--ack", "--scan"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--workers", default="2,3", help="worker counts (default 2,3)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--iters", type=int, default=10, help="timed exchanges a run (default 10)")
    ap.add_argument("--json", help="write every run's figures to this file")
    a = ap.parse_args()
    prog = os.path.join(a.build_dir, "perf", "pbox-udp-echo-bound")
    if not os.path.exists(prog):
        sys.exit("agg_costs.py: %s not found (build first, or give --build-dir)" % prog)
    try:
        counts = [int(x) for x in a.workers.split(",")]
    except ValueError:
        sys.exit("agg_costs.py: --workers takes numbers separated by commas")
    if a.rounds < 1 or a.iters < 1 or not all(1 <= n <= 64 for n in counts):
        sys.exit("agg_costs.py: --rounds and --iters at least 1, worker counts 1..64")
    runs = {}
    for rnd in range(a.rounds):
        for n in counts:
            variants = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
            for name, extra in variants:
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                p = subprocess.run([prog, "--reduce", "--workers", str(n), "--iters",
                                    str(a.iters), "--json"] + extra,
                                   capture_output=True, text=True, timeout=300)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if p.returncode != 0:
                    sys.exit("agg_costs.py: %s failed: %s" % (name, p.stderr.strip()))
                r = json.loads(p.stdout.strip().splitlines()[-1])
                r["cpu_per_exchange"] = (r1.ru_utime - r0.ru_utime + r1.ru_stime -
                                         r0.ru_stime) / (a.iters + 2)
                runs.setdefault("%d %s" % (n, name), []).append(r)
                print("round %d, %d workers, %-10s %.4f s per exchange" %
                      (rnd + 1, n, name, r["median_s"]), file=sys.stderr)
    print("%2s %10s %10s %10s %8s %8s" % ("N", "", "s/exch", "CPU s/exch", "time x", "CPU x"))
    for n in counts:
        med = {}
        for name, _ in VARIANTS:
            rs = runs["%d %s" % (n, name)]
            med[name] = (statistics.median(r["median_s"] for r in rs),
                         statistics.median(r["cpu_per_exchange"] for r in rs))
            print("%2d %10s %10.4f %10.4f %8.2f %8.2f" % (
                n, name, med[name][0], med[name][1], med[name][0] / med["bound"][0],
                med[name][1] / med["bound"][1]))
    print("time x, CPU x: the variant's time and CPU per exchange over the bound's (> 1: "
          "what that way of pboxd's costs)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
