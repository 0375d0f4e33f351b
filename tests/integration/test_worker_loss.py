#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A worker killed mid-iteration gives the other workers of its job a clear error at
once (the appliance aborts the session and tells them), while another job on the same
appliance keeps training; the aborted job can start a new session afterwards. A worker
that stops without dying (stalled) gives the others a clear timeout error. A worker that
stops sending heartbeats (a stopped process) is declared dead after worker_timeout and
its session aborted, well before the others' own timeout."""
from functools import partial
import signal
import subprocess
import time

from pboxtest import Pboxd, build_path, fail, stop_process
from pboxtest import finish as finish_tail

# These ranks' whole output is printed; they have 60 s unless told otherwise.
finish = partial(finish_tail, timeout=60, tail=None)

W = None


def start(d, job, token, rank, n, *extra, timeout_ms=5000):
    return subprocess.Popen([W, "--server", d.control, "--job", str(job), "--token", token,
                             "--rank", str(rank), "--workers", str(n), "--keys", "20000,77",
                             "--timeout-ms", str(timeout_ms)] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main():
    global W
    W = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 1, "token": "a", "workers": 3, "mode": "aggregate"},
            {"id": 2, "token": "b", "workers": 2, "mode": "server-optimizer",
             "optimizer": {"name": "sgd", "lr": 0.5}}]
    with Pboxd(jobs, cores=2) as d:
        # Job 2 trains for a while on the same appliance.
        other = [start(d, 2, "b", r, 2, "--server-opt", "--iters", "400") for r in range(2)]
        # Job 1: rank 2 dies abruptly at iteration 5.
        t0 = time.time()
        ranks = [start(d, 1, "a", r, 3, "--iters", "50", "--expect-fail") for r in range(2)]
        dying = start(d, 1, "a", 2, 3, "--iters", "50", "--exit-at", "5")
        rc, _ = finish(dying, "job 1 rank 2 (killed)")
        if rc != 3:
            fail("the dying worker should exit with 3, got %d" % rc)
        for r, p in enumerate(ranks):
            rc, out = finish(p, "job 1 rank %d" % r)
            if rc != 0 or "aborted" not in out or "rank 2" not in out:
                fail("rank %d of job 1 did not get a clear abort error" % r)
        elapsed = time.time() - t0
        if elapsed > 4.5:
            fail("the survivors took %.1f s to learn of the loss (expected at once, well "
                 "before their 5 s timeout)" % elapsed)
        for r, p in enumerate(other):
            rc, _ = finish(p, "job 2 rank %d" % r, timeout=240)
            if rc != 0:
                fail("job 2 was disturbed by job 1's failure")
        # Job 1 starts a new session once its survivors are gone.
        again = [start(d, 1, "a", r, 3, "--iters", "5") for r in range(3)]
        for r, p in enumerate(again):
            if finish(p, "job 1 new session rank %d" % r)[0] != 0:
                fail("job 1 could not start a new session after the abort")
        # A stalled (not dead) worker: the others time out with a message that says so.
        stalled = start(d, 1, "a", 2, 3, "--iters", "50", "--stall-at", "2")
        waiting = [start(d, 1, "a", r, 3, "--iters", "50", "--expect-fail") for r in range(2)]
        for r, p in enumerate(waiting):
            rc, out = finish(p, "job 1 rank %d (peer stalled)" % r)
            if rc != 0 or "timed out" not in out or "workers had contributed" not in out:
                fail("rank %d did not report a clear timeout" % r)
        stalled.kill()
        stalled.wait()
        log = d.log()
        if "rank 2 (127.0.0.1:" not in log or "session aborted" not in log:
            fail("pboxd did not log the abort with the rank and its address")
    silent_worker()


def silent_worker():
    """SIGSTOP a worker: its connection stays open but its heartbeats stop."""
    jobs = [{"id": 1, "token": "a", "workers": 3, "mode": "aggregate"}]
    with Pboxd(jobs, cores=1, worker_timeout=2) as d:
        ranks = [start(d, 1, "a", r, 3, "--iters", "400", "--expect-fail", timeout_ms=30000)
                 for r in range(2)]
        stopped = start(d, 1, "a", 2, 3, "--iters", "400", timeout_ms=30000)
        # Let all three train a few iterations, then freeze rank 2.
        deadline = time.time() + 30
        while True:
            job = [j for j in d.stats()["jobs"] if j["id"] == 1][0]
            if job.get("registered") == 3 and job.get("version_min", 0) >= 3:
                break
            if time.time() > deadline:
                fail("job 1 did not start training: %s" % job)
            time.sleep(0.05)
        stop_process(stopped)
        t0 = time.time()
        try:
            for r, p in enumerate(ranks):
                rc, out = finish(p, "job 1 rank %d (peer stopped)" % r)
                if rc != 0 or "aborted" not in out or "no heartbeat" not in out:
                    fail("rank %d was not told that rank 2 was declared dead" % r)
            elapsed = time.time() - t0
        finally:
            stopped.send_signal(signal.SIGCONT)
            stopped.kill()
            stopped.wait()
        print("rank 2 declared dead %.1f s after it stopped (worker_timeout 2 s)" % elapsed)
        if elapsed > 10:
            fail("the survivors took %.1f s to learn of the silent worker (worker_timeout "
                 "2 s, their own timeout 30 s)" % elapsed)
        if "declared dead: no heartbeat for 2 s" not in d.log():
            fail("pboxd did not log why rank 2 was removed")


if __name__ == "__main__":
    main()
