#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd + 3 workers over loopback: aggregate (mean) and server-optimizer (NAG) jobs on two
cores, several keys of mixed sizes, synchronous and asynchronous calls; every result is
checked exactly by the workers, and pboxd's counters must show the work and no drops."""
import subprocess
import sys

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


def main():
    jobs = [
        {"id": 1, "token": "agg-secret", "workers": 3, "mode": "aggregate", "reduce": "mean"},
        {"id": 2, "token": "opt-secret", "workers": 3, "mode": "server-optimizer",
         "optimizer": {"name": "nag", "lr": 0.5, "momentum": 0.9}},
    ]
    with Pboxd(jobs, cores=2) as d:
        run_ranks(d, 1, "agg-secret", 3, [])
        run_ranks(d, 2, "opt-secret", 3, ["--server-opt", "--optimizer", "nag", "--async"])
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
