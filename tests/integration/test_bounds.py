#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The bound programs bench_comm.py measures pbox against (perf/README.md sections 4 and 5)
run, report and refuse bad input: pbox-udp-echo-bound as an echo, as an aggregating
exchange (--reduce, whose workers check every element of their results: the mean of all
workers' 1.0s) for 1, 2 and 3 workers, with --no-copy, and with pboxd's ways added
(--copy-first: accumulating; --ack: ACKs of waiting contributions; --scan: NaN / Inf
checks); pbox-shm-bound. Small
exchanges (4 MiB), so this is a check of the programs, not a measurement."""
import json
import subprocess

from pboxtest import build_path, fail

MB4 = str(4 << 20)


def run(prog, *args, rc=0):
    p = subprocess.run([build_path(prog)] + list(args), capture_output=True, text=True,
                       timeout=120)
    if p.returncode != rc:
        fail("%s %s: exit %d, expected %d: %s" % (prog, " ".join(args), p.returncode, rc,
                                                  p.stderr.strip()))
    return p


def json_of(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


def check_times(r, what, iters):
    if len(r["iter_seconds"]) != iters or not all(t > 0 for t in r["iter_seconds"]):
        fail("%s: iteration times %s" % (what, r["iter_seconds"]))
    if not 0 < r["median_s"] < 60:
        fail("%s: median %s" % (what, r["median_s"]))


def main():
    echo = "perf/pbox-udp-echo-bound"
    for workers in (1, 2, 3):
        for extra in ([], ["--reduce"], ["--reduce", "--no-copy"],
                      ["--reduce", "--copy-first"], ["--reduce", "--ack", "--scan"],
                      ["--reduce", "--copy-first", "--ack", "--scan"]):
            args = ["--bytes", MB4, "--workers", str(workers), "--iters", "3", "--warmup",
                    "1", "--json"] + extra
            r = json_of(run(echo, *args))
            what = "echo bound %s, %d workers" % (" ".join(extra) or "(echo)", workers)
            check_times(r, what, 3 * workers)
            if r["reduce"] != ("--reduce" in extra) or r["copy"] != (
                    "--no-copy" not in extra) or r["copy_first"] != ("--copy-first" in extra) \
                    or r["ack"] != ("--ack" in extra) or r["scan"] != ("--scan" in extra):
                fail("%s: reported %s" % (what, r))
    # Datagram sizes that are not a header and whole floats, GSO with --reduce, bad
    # numbers: refused with a message, exit 2.
    for bad in (["--reduce", "--size", "66"], ["--reduce", "--size", "64"],
                ["--reduce", "--gso"], ["--reduce", "--bytes", "4194303"],
                ["--workers", "0"], ["--workers", "65"], ["--size", "x"], ["--bogus"],
                ["--ack"], ["--copy-first"], ["--no-copy"], ["--scan"]):
        p = run(echo, *bad, rc=2)
        if not p.stderr.strip():
            fail("pbox-udp-echo-bound %s: no message" % " ".join(bad))
    p = run(echo, "--help")
    for opt in ("--reduce", "--no-copy", "--copy-first", "--ack", "--scan"):
        if opt not in p.stdout:
            fail("pbox-udp-echo-bound --help does not describe " + opt)

    shm = "perf/pbox-shm-bound"
    for workers in (1, 2, 3):
        r = json_of(run(shm, "--bytes", MB4, "--workers", str(workers), "--iters", "3",
                        "--json"))
        check_times(r, "shm bound, %d workers" % workers, 3)
    run(shm, "--bytes", "4194303", rc=2)
    print("bound programs: echo, aggregating (holding or accumulating; with and without the "
          "result copy, with ACKs and checks) and shared-memory bounds ran for 1-3 workers; 12 "
          "bad argument sets refused")


if __name__ == "__main__":
    main()
