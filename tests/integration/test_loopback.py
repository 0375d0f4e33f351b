#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd + 3 workers over loopback: aggregate (mean) and server-optimizer (NAG) jobs on two
cores, several keys of mixed sizes, synchronous and asynchronous calls; every result is
checked exactly by the workers, and pboxd's counters must show the work and no drops.
When a job's session ends, its chunk state is freed (after the grace period of the last
job table that listed it): the lifetime counter states_freed grows by one per session."""
import subprocess
import sys
import time

from pboxtest import Pboxd, build_path, fail

KEYS = "1000,50000,3,8192,8193"


def run_ranks(d, job, token, n, extra):
    procs = [subprocess.Popen([build_path("tests/integration/pbox-check-worker"),
                               "--server", d.control, "--job", str(job), "--token", token,
                               "--rank", str(r), "--workers", str(n), "--keys", KEYS,
                               "--iters", "12"] + extra,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=120)
        sys.stdout.write(out)
        if p.returncode != 0:
            d.dump_log()
            fail("job %d rank %d exited with %d" % (job, r, p.returncode))


def states_freed_reaches(d, n):
    """Wait (up to 20 s: the reaper runs after an RCU grace period) until pboxd's stats
    say n job states were freed; fail if they never do."""
    deadline = time.time() + 20
    while True:
        life = d.stats()["lifetime"]
        if life["states_freed"] >= n:
            return life
        if time.time() > deadline:
            fail("%d sessions ended, but pboxd freed %d job states: %s"
                 % (n, life["states_freed"], life))
        time.sleep(0.1)


def main():
    jobs = [
        {"id": 1, "token": "agg-secret", "workers": 3, "mode": "aggregate", "reduce": "mean"},
        {"id": 2, "token": "opt-secret", "workers": 3, "mode": "server-optimizer",
         "optimizer": {"name": "nag", "lr": 0.5, "momentum": 0.9}},
    ]
    with Pboxd(jobs, cores=2) as d:
        life = d.stats()["lifetime"]
        if life["states_freed"] != 0:
            fail("job states freed before any session: %s" % life)
        run_ranks(d, 1, "agg-secret", 3, [])
        states_freed_reaches(d, 1)
        run_ranks(d, 2, "opt-secret", 3, ["--server-opt", "--optimizer", "nag", "--async"])
        life = states_freed_reaches(d, 2)
        print("pboxd lifetime counters: %s" % life)
        st = d.stats()
        tot = st["totals"]
        # 12 iterations x 2 jobs x every chunk; both cores did some of it.
        if tot["iterations"] == 0 or any(c["iterations"] == 0 for c in st["cores"]):
            fail("a core did no work: %s" % st["cores"])
        if tot["dropped"] != 0:
            fail("unexpected drops: %s" % tot["drops"])
        for j in st["jobs"]:
            if j["state"] != "idle":
                fail("job %d still %s after its workers left" % (j["id"], j["state"]))
        print("pboxd totals: %d iterations, %d fragments aggregated, busy %.1f%%" %
              (tot["iterations"], tot["agg_frags"], tot["busy_pct"]))


if __name__ == "__main__":
    main()
