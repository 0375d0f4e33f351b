#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""`pbox status` on pboxd ({"op":"status"}, dataplane/pboxd/jobstatus.h):
 - a 3-rank job whose rank 2 stops pushing at iteration 5: status names rank 2 as missing
   on every chunk of the job (all waiting at iteration 5), ranks 0 and 1 at iteration 6,
   rank 2 at 5, within a bounded time, in the JSON and in the text output;
 - the answer is bounded (--max-ranks) and refused without the admin token (EACCES), for
   malformed limits (EINVAL) and an unknown job (ENOENT)."""
import json
import os
import subprocess
import time

from pboxtest import Pboxd, build_path, control_request, fail
from test_runtime_jobs import finish, worker
import test_runtime_jobs

EACCES, ENOENT, EINVAL = 13, 2, 22
STALL_AT = 5
BOUND_S = 20


def status(d, *args, ok=True):
    p = subprocess.run([build_path("dataplane/tools/pbox"), "status", "--socket",
                        d.appliance["control_socket"]] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    if (p.returncode == 0) != ok:
        fail("pbox status %s: exit %d: %s" % (" ".join(args), p.returncode, p.stdout))
    return p.stdout


def refused(r, err, word, what):
    print("%s -> %s" % (what, r))
    if r.get("ok") is not False or r.get("errno") != err or word not in r.get("error", ""):
        fail("%s: expected errno %d naming '%s', got %s" % (what, err, word, r))


def main():
    test_runtime_jobs.W = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 7, "token": "t7", "workers": 3, "mode": "aggregate"}]
    with Pboxd(jobs, cores=2, chunk_bytes=8192, worker_timeout=60,
               control_socket="/tmp/pboxtest-status-%d.sock" % time.time_ns()) as d:
        ws = [worker(d, 7, "t7", r, 3, "--iters", "100000", "--expect-fail",
                     timeout_ms=40000) for r in range(2)]
        ws.append(worker(d, 7, "t7", 2, 3, "--iters", "100000", "--stall-at", str(STALL_AT),
                         timeout_ms=40000))
        try:
            t0 = time.time()
            while True:
                st = json.loads(status(d, "--json", "--job", "7"))
                job = st["jobs"][0]
                w = job.get("waiting") or {}
                groups = w.get("groups", [])
                if job.get("chunks") and len(groups) == 1 and \
                        groups[0]["missing"] == "2" and groups[0]["nchunks"] >= 1 and \
                        groups[0]["iteration"] == STALL_AT and \
                        job.get("progress_ms_ago", 0) >= 500:
                    break
                if time.time() - t0 > BOUND_S:
                    fail("status did not name rank 2 as missing within %d s: %s" %
                         (BOUND_S, json.dumps(job)[:2000]))
                time.sleep(0.2)
            took = time.time() - t0
            g = groups[0]
            print("rank 2 named missing on %d of %d chunks (%s; the others idle: no rank "
                  "pushed them yet) after %.1f s" % (g["nchunks"], job["chunks"], g["chunks"],
                                                     took))
            # Chunks are pushed in order: the waiting ones are the first ones.
            n = g["nchunks"]
            if g["chunks"] != ("0-%d" % (n - 1) if n > 1 else "0") or g["missing_count"] != 1:
                fail("the group's chunk range is wrong: %s" % g)
            if w["chunks"] != n or w["iteration"] != STALL_AT or w["ungrouped"] != 0 or \
                    w["chunks"] + w["idle"] + w["changing"] != job["chunks"]:
                fail("waiting summary is wrong: %s" % w)
            nxt = {r["rank"]: r["next_iteration"] for r in job["ranks"]}
            want = STALL_AT + 1 if w["idle"] == 0 else STALL_AT
            if nxt != {0: want, 1: want, 2: STALL_AT}:
                fail("next iterations: %s (expected %d, %d, %d)" % (nxt, want, want, STALL_AT))
            for r in job["ranks"]:
                if not r["live"] or not r["registered"] or r["data_addr"] is None or \
                        not r["data_addr"].startswith("127.0.0.1:") or \
                        r["last_seen_ms_ago"] is None:
                    fail("rank entry incomplete: %s" % r)
            if job["version_min"] != STALL_AT or job["version_max"] != STALL_AT:
                fail("versions: %s..%s" % (job["version_min"], job["version_max"]))
            # Still stuck a moment later: the clock of the last progress runs.
            time.sleep(1.0)
            job = json.loads(status(d, "--json"))["jobs"][0]
            if job["progress_ms_ago"] < 900:
                fail("progress_ms_ago did not grow while stuck: %s" % job["progress_ms_ago"])
            text = status(d)
            print(text)
            want = "job 7: iteration %d, %d chunks waiting: rank 2 missing on chunks %s" % (
                STALL_AT, n, g["chunks"])
            if want not in text or "rank 2 last seen" not in text:
                fail("the text output does not say '%s ...; rank 2 last seen'" % want)
            # Bounded answers.
            small = json.loads(status(d, "--json", "--max-ranks", "1"))["jobs"][0]
            if len(small["ranks"]) != 1 or small["ranks_omitted"] != 2:
                fail("--max-ranks 1: %s" % small["ranks"])
            if "(2 more ranks" not in status(d, "--max-ranks", "1"):
                fail("the text output does not say that ranks were left out")
            # Refusals.
            refused(control_request(d.control, {"op": "status"}), EACCES, "admin token",
                    "no token")
            refused(control_request(d.control, {"op": "status", "admin_token": "x"}), EACCES,
                    "wrong admin token", "wrong token")
            sock = d.appliance["control_socket"]
            refused(control_request(sock, {"op": "status", "max_groups": 0}), EINVAL,
                    "max_groups", "max_groups 0")
            refused(control_request(sock, {"op": "status", "max_ranges": "9"}), EINVAL,
                    "max_ranges", "max_ranges string")
            refused(control_request(sock, {"op": "status", "job": 99}), ENOENT, "job 99",
                    "unknown job")
            r = control_request(d.control, {"op": "status", "admin_token": d.admin_token})
            if r.get("ok") is not True or r["jobs"][0]["id"] != 7:
                fail("status with the admin token: %s" % r)
        finally:
            for p in ws:
                p.kill()
            for r, p in enumerate(ws):
                finish(p, "rank %d" % r)
    print("test_status: ok")


if __name__ == "__main__":
    main()
