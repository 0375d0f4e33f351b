#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The training demo under relaxed synchronisation with one deliberately slowed worker
(rank 2 computes 2x as long): SSP (s=2), ASP and PSSP (s=2, c=0.5) all reach >= 85% test
accuracy in 5 epochs. (At 3 epochs, where BSP reaches 87.6%, PSSP's stale momentum steps
leave it at 85-86.6%, too close to the bar for a test; by epoch 5 every mode is at
86.5-87.5%.) Each demo run must have run under the requested model at pboxd (its stats
name it), and ASP must hold almost no pulls. Then a worker killed mid-training under SSP
with on_worker_loss = continue: the other ranks finish their training, and pboxd logs
the loss and counts it."""
import json
import signal
import subprocess
import sys
import time

from pboxtest import Pboxd, build_path, fail, run_demo


def demo(*args):
    p = run_demo(["--json", "--epochs", "5", "--slow-rank", "2", "--slow-factor", "2"] +
                 list(args), timeout=300)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        fail("pbox demo %s failed with %d" % (" ".join(args), p.returncode))
    return json.loads(p.stdout)


def killed_worker():
    jobs = [{"id": 1, "token": "t", "workers": 3, "mode": "server-optimizer",
             "optimizer": {"name": "nag", "lr": 0.05, "momentum": 0.9, "rescale": 1 / 240},
             "sync": {"model": "ssp", "staleness": 2}, "on_worker_loss": "continue"}]
    with Pboxd(jobs, cores=1, mtu=65535) as d:
        ranks = []
        for r in range(3):
            ranks.append(subprocess.Popen(
                [build_path("apps/pbox"), "train", "--json", "--server", d.control,
                 "--job", "1", "--token", "t", "--rank", str(r), "--workers", "3",
                 "--epochs", "2", "--timeout-ms", "20000"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        # Kill rank 2 once it has trained a few steps.
        t0 = time.time()
        for line in ranks[2].stdout:
            ev = json.loads(line)
            if ev["ev"] == "step" and ev["total_steps"] >= 20:
                break
            if time.time() - t0 > 120:
                fail("rank 2 did not start training")
        ranks[2].send_signal(signal.SIGKILL)
        ranks[2].wait()
        for r in (0, 1):
            out, err = ranks[r].communicate(timeout=240)
            if ranks[r].returncode != 0:
                sys.stderr.write(err)
                fail("rank %d did not finish after rank 2 was killed" % r)
            done = [json.loads(l) for l in out.splitlines() if '"ev":"done"' in l]
            epochs = [json.loads(l) for l in out.splitlines() if '"ev":"epoch"' in l]
            if not done or len(epochs) != 2:
                fail("rank %d did not report 2 epochs and done" % r)
            print("rank %d finished 2 epochs after the loss of rank 2; its test slice: %.4f"
                  % (r, epochs[-1]["test"]["correct"] / epochs[-1]["test"]["samples"]))
        log = d.log()
        if "was lost" not in log or "continues with 2 of 3 workers" not in log:
            fail("pboxd did not log the lost worker and the smaller session")
        removed = [j for j in d.stats()["jobs"] if j["id"] == 1][0]["removed"]
        if removed < 1:
            fail("pboxd's job counters do not show the removed worker")


def main():
    for args in (["--sync", "ssp", "--staleness", "2"], ["--sync", "asp"],
                 ["--sync", "pssp", "--staleness", "2", "--probability", "0.5"]):
        r = demo(*args)
        print("%-40s test accuracy %.4f, %.0f samples/s, %d pulls held" %
              (" ".join(args), r["final_test_acc"], r["samples_per_s"],
               r["appliance"]["pulls_held"]))
        if r["final_test_acc"] < 0.85:
            fail("%s: test accuracy %.4f < 0.85" % (" ".join(args), r["final_test_acc"]))
        # Accuracy alone would pass under BSP too: the model must have reached pboxd.
        ran = r["appliance"].get("sync")
        if ran != args[1]:
            fail("%s: pboxd ran the job under %r" % (" ".join(args), ran))
        # ASP never holds a pull back after the initial model (66 in perf/sync/README.md,
        # against ~50000 under BSP with this straggler).
        if args[1] == "asp" and r["appliance"]["pulls_held"] >= 1000:
            fail("asp: pboxd held %d pulls; an ASP job holds almost none"
                 % r["appliance"]["pulls_held"])
    killed_worker()


if __name__ == "__main__":
    main()
