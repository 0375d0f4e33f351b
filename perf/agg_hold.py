#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""What holding receive buffers saves an aggregating exchange over kernel UDP.

Runs pbox-udp-echo-bound --reduce (the aggregating bound: each datagram's contributions
kept in the receive buffers they arrived in, summed once when the last arrives) and
--reduce --copy-first (the first contribution copied into an accumulator and the others
added to it, as pboxd does), interleaved, --rounds rounds for each worker count, and
prints the medians of seconds per exchange and of CPU seconds per exchange (all the
program's processes, warm-up included). ResNet-50's gradient, 32 KB fragments and pbox's
64-byte header, 2 echo threads, unless told otherwise.

Usage: perf/agg_hold.py [--build-dir build] [--workers 2,3] [--rounds 5] [--iters 10]
                        [--json FILE]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys


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
        sys.exit("agg_hold.py: %s not found (build first, or give --build-dir)" % prog)
    try:
        counts = [int(x) for x in a.workers.split(",")]
    except ValueError:
        sys.exit("agg_hold.py: --workers takes numbers separated by commas")
    if a.rounds < 1 or a.iters < 1 or not all(1 <= n <= 64 for n in counts):
        sys.exit("agg_hold.py: --rounds and --iters at least 1, worker counts 1..64")
    runs = {}
    for rnd in range(a.rounds):
        for n in counts:
            variants = [("hold", []), ("copy-first", ["--copy-first"])]
            if rnd % 2:
                variants.reverse()
            for name, extra in variants:
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                p = subprocess.run([prog, "--reduce", "--workers", str(n), "--iters",
                                    str(a.iters), "--json"] + extra,
                                   capture_output=True, text=True, timeout=300)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if p.returncode != 0:
                    sys.exit("agg_hold.py: %s failed: %s" % (name, p.stderr.strip()))
                r = json.loads(p.stdout.strip().splitlines()[-1])
                r["cpu_per_exchange"] = (r1.ru_utime - r0.ru_utime + r1.ru_stime -
                                         r0.ru_stime) / (a.iters + 2)
                runs.setdefault("%d %s" % (n, name), []).append(r)
                print("round %d, %d workers, %-10s %.4f s per exchange" %
                      (rnd + 1, n, name, r["median_s"]), file=sys.stderr)
    print("%2s %10s %10s %10s %12s" % ("N", "", "s/exch", "CPU s/exch", "copy/hold"))
    for n in counts:
        med = {}
        for name in ("hold", "copy-first"):
            rs = runs["%d %s" % (n, name)]
            med[name] = (statistics.median(r["median_s"] for r in rs),
                         statistics.median(r["cpu_per_exchange"] for r in rs))
            print("%2d %10s %10.4f %10.4f %12s" % (
                n, name, med[name][0], med[name][1],
                "" if name == "hold" else "%.2f / %.2f" % (
                    med[name][0] / med["hold"][0], med[name][1] / med["hold"][1])))
    print("copy/hold: copy-first's time and CPU per exchange over holding's (> 1: holding "
          "the receive buffers saves that much)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
