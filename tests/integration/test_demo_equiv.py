#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Bit-exactness of distributed training: `pbox demo` with 3 workers on a deterministic
server-optimizer job must produce exactly the model of the single-process reference
(`pbox train --local --workers 3`), and the same run with packet faults (drop, duplicate,
reorder on the workers' and pboxd's sends) must produce exactly the same model again.
A second configuration (Adam, 4 workers with uneven shards of the batch, 2 pboxd cores,
fragmented chunks) must match its reference too. A run with a different seed must
differ, so the comparison can fail."""
import json
import os
import subprocess
import sys
import tempfile
import time

from pboxtest import build_path, fail, run_demo

STEPS = 200
FAULT = "drop=0.02,dup=0.02,reorder=0.05,seed=11"


def checked(args, p, t0):
    sys.stdout.write(p.stderr)
    if p.returncode != 0:
        fail("pbox %s exited with %d:\n%s" % (" ".join(args), p.returncode, p.stdout))
    print("pbox %s: %.1f s" % (" ".join(args[:3]), time.time() - t0), flush=True)
    return p.stdout


def pbox(args, timeout):
    t0 = time.time()
    p = subprocess.run([build_path("apps/pbox")] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    return checked(args, p, t0)


def demo(model, extra=(), workers=3, steps=STEPS):
    args = ["--json", "--workers", str(workers), "--epochs", "1", "--max-steps", str(steps),
            "--save-model", model] + list(extra)
    t0 = time.time()
    out = checked(["demo"] + args, run_demo(args, timeout=200), t0)
    res = json.loads(out)
    if not res["ok"] or res["steps"] != steps:
        fail("demo did not run %d steps: %s" % (steps, out))
    return res


def same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        da, db = fa.read(), fb.read()
    if len(da) < 900000:
        fail("%s is only %d bytes; expected the whole 784-256-128-10 model" % (a, len(da)))
    return da == db


def main():
    with tempfile.TemporaryDirectory(prefix="pbox-equiv-") as tmp:
        ref, dist, faulty, other = (os.path.join(tmp, n) for n in
                                    ("ref.bin", "dist.bin", "faulty.bin", "other.bin"))
        pbox(["train", "--local", "--workers", "3", "--epochs", "1", "--max-steps", str(STEPS),
              "--save-model", ref], timeout=120)
        clean = demo(dist)
        if not same(dist, ref):
            fail("distributed model differs from the single-process reference")
        print("distributed (3 workers, deterministic) == single-process reference: "
              "bit-identical after %d steps" % STEPS)

        lossy = demo(faulty, ["--fault", FAULT])
        # The faults must really have hit the run, or the comparison proves nothing.
        app = lossy.get("appliance") or {}
        if lossy["retransmits"] == 0 or app.get("dups", 0) == 0:
            fail("fault injection had no visible effect: worker retransmits %d, pboxd dups %s"
                 % (lossy["retransmits"], app.get("dups")))
        if not same(faulty, dist):
            fail("model trained under packet loss differs from the lossless run")
        print("with faults %s (%d worker retransmits, %d duplicates at pboxd): bit-identical"
              % (FAULT, lossy["retransmits"], app["dups"]))
        if lossy["final_test_acc"] != clean["final_test_acc"]:
            fail("test accuracy differs: %s vs %s" % (lossy["final_test_acc"],
                                                      clean["final_test_acc"]))

        pbox(["train", "--local", "--workers", "3", "--epochs", "1", "--max-steps", str(STEPS),
              "--seed", "7", "--save-model", other], timeout=120)
        if same(other, ref):
            fail("a different seed gave the same model; the comparison cannot tell runs apart")

        # 250 = 63 + 63 + 62 + 62: the first two ranks take one sample more.
        adam = ["--optimizer", "adam", "--lr", "0.001", "--batch", "250"]
        pbox(["train", "--local", "--workers", "4", "--epochs", "1", "--max-steps", "60",
              "--save-model", ref] + adam, timeout=120)
        demo(dist, adam + ["--cores", "2", "--mtu", "9000"], workers=4, steps=60)
        if not same(dist, ref):
            fail("Adam, 4 workers, 2 cores: distributed model differs from the reference")
        print("Adam, 4 workers (uneven shards), 2 pboxd cores, MTU 9000: bit-identical")


if __name__ == "__main__":
    main()
