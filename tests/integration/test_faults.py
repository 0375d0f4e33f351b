#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Loss, duplication and reordering injected on both sides (2% drop, 2% duplicate, 5%
reorder, MTU 1500 so every chunk is many fragments): every result the workers get is
still exactly right (each worker checks every element), for aggregate and
server-optimizer jobs. The counters must show that faults really happened."""
import os
import subprocess
import sys

from pboxtest import Pboxd, build_path, fail

KEYS = "1000,50000,3,8192"
FAULT = "drop=0.02,dup=0.02,reorder=0.05"


def run_ranks(d, job, token, n, extra):
    procs = []
    for r in range(n):
        env = dict(os.environ, PBOX_FAULT="%s,seed=%d" % (FAULT, 11 + r))
        procs.append(subprocess.Popen(
            [build_path("tests/integration/pbox-check-worker"), "--server", d.control,
             "--job", str(job), "--token", token, "--rank", str(r), "--workers", str(n),
             "--keys", KEYS, "--iters", "10", "--timeout-ms", "60000"] + extra,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    retx = 0
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=240)
        sys.stdout.write(out)
        if p.returncode != 0:
            d.dump_log()
            fail("job %d rank %d exited with %d" % (job, r, p.returncode))
        retx += int(out.split(" retransmits")[0].rsplit(",", 1)[1])
    return retx


def main():
    jobs = [
        {"id": 1, "token": "a", "workers": 3, "mode": "aggregate", "reduce": "sum"},
        {"id": 2, "token": "b", "workers": 2, "mode": "server-optimizer",
         "deterministic": True, "optimizer": {"name": "adam", "lr": 0.25}},
    ]
    with Pboxd(jobs, cores=2, mtu=1500, fault=FAULT + ",seed=5") as d:
        r1 = run_ranks(d, 1, "a", 3, ["--sum", "--async"])
        r2 = run_ranks(d, 2, "b", 2, ["--server-opt", "--optimizer", "adam", "--lr", "0.25"])
        tot = d.stats()["totals"]
        print("workers retransmitted %d + %d datagrams; appliance saw %d duplicates, "
              "resent %d results" % (r1, r2, tot["dups"], tot["replies_resent"]))
        if r1 == 0 or r2 == 0 or tot["dups"] == 0 or tot["rx_retransmits"] == 0:
            fail("fault injection had no visible effect: %s" % tot)
        if tot["drops"]["bad_cookie"] or tot["drops"]["bad_alignment"]:
            fail("faults must not look like malformed traffic: %s" % tot["drops"])


if __name__ == "__main__":
    main()
