#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Admission: a wrong token, an unknown job, a rank out of range, a rank that is already
connected and a key set that differs from the session's are each refused with a clear
message, and none of them disturbs the workers that were admitted."""
import subprocess
import time

from pboxtest import Pboxd, build_path, fail

WORKER = None


def worker(d, *args, wait=True):
    p = subprocess.Popen([WORKER, "--server", d.control] + list(args),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return p
    out, _ = p.communicate(timeout=60)
    return p.returncode, out


def refused(d, why, *args):
    rc, out = worker(d, "--expect-fail", *args)
    print(out.strip())
    if rc != 0:
        fail("expected a refusal (%s); got status %d: %s" % (why, rc, out))
    if why not in out:
        fail("refusal does not say '%s': %s" % (why, out))


def main():
    global WORKER
    WORKER = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 7, "token": "right", "workers": 2, "mode": "aggregate"}]
    with Pboxd(jobs, cores=1) as d:
        common = ["--job", "7", "--workers", "2", "--keys", "100,200", "--iters", "3"]
        refused(d, "wrong token", "--token", "wrong", "--rank", "0", *common)
        refused(d, "job 8 is not configured", "--job", "8", "--token", "right", "--rank", "0",
                "--workers", "2", "--keys", "5")
        refused(d, "rank 2 is out of range", "--token", "right", "--rank", "2", *common)
        # Rank 0 joins and waits for rank 1 (its first push-pull blocks).
        r0 = worker(d, "--token", "right", "--rank", "0", *common, wait=False)
        time.sleep(1.0)
        refused(d, "rank 0 of job 7 is already connected", "--token", "right", "--rank", "0",
                *common)
        refused(d, "key #1 is id 101 with 300 elements here, but id 101 with 200",
                "--token", "right", "--rank", "1", "--job", "7", "--workers", "2",
                "--keys", "100,300", "--iters", "3")
        rc, out = worker(d, "--token", "right", "--rank", "1", *common)
        out0, _ = r0.communicate(timeout=60)
        print(out.strip())
        print(out0.strip())
        if rc != 0 or r0.returncode != 0:
            fail("admitted workers failed after the refusals")
        log = d.log()
        if "wrong token for job 7" not in log:
            fail("pboxd did not log the refused token")


if __name__ == "__main__":
    main()
