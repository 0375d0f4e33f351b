#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pbox-ctrld publishing jobs to a pboxd that has none of its own:
 - --check-config validates static jobs with pboxd's job validation;
 - its static job is published at start and workers train on it with exact results;
 - `pbox job create|list|rm --control CTRLD` creates, lists (with where each job lives)
   and removes jobs through it; a job no managed pboxd can hold is refused with the
   pboxd's reason; requests without the admin token are refused;
 - a restarted pboxd (which forgets runtime jobs) gets its jobs published again, and
   workers train on them exactly."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from pboxtest import Pboxd, _lc_value, build_path, control_request, fail, finish, pbox_job, \
    wait_for

W = None


def worker(d, job, token, rank, n, *extra):
    return subprocess.Popen([W, "--server", d.control, "--job", str(job), "--token", token,
                             "--rank", str(rank), "--workers", str(n), "--keys", "20000,77",
                             "--timeout-ms", "10000"] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def train(d, job, token, what):
    ranks = [worker(d, job, token, r, 2, "--server-opt", "--lr", "0.5", "--iters", "20")
             for r in range(2)]
    for r, p in enumerate(ranks):
        if finish(p, "%s rank %d" % (what, r), tail=200)[0] != 0:
            fail("%s: rank %d did not train exactly" % (what, r))


def pboxd_jobs(d):
    r = control_request(d.control, {"op": "job_list", "admin_token": d.admin_token})
    if r.get("ok") is not True:
        fail("pboxd job_list: %s" % r)
    return {j["id"]: j for j in r["jobs"]}


def write_conf(path, ctrld, pboxds, jobs):
    with open(path, "w") as f:
        f.write("ctrld = %s;\npboxds = %s;\n" % (_lc_value(ctrld), _lc_value(pboxds)))
        if jobs:
            f.write("jobs = %s;\n" % _lc_value(jobs))


def limits(caddr):
    """Before the admin token: lines over 4 KiB are refused and closed; a connection
    that keeps sending bad requests is closed."""
    host, port = caddr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b'{"op":"job_list","pad":"' + b"x" * 8000 + b'"}\n')
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        r = json.loads(data.split(b"\n")[0])
        if r.get("errno") != 7:  # E2BIG
            fail("a long unauthenticated line was not refused: %s" % r)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"nonsense\n" * 20)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        if data.count(b"\n") != 8:
            fail("pbox-ctrld answered %d bad requests before closing (expected 8)"
                 % data.count(b"\n"))
    # Wrong admin tokens: 3 (the burst), then refused even with the right one until the
    # bucket refills (600 a minute: one every 0.1 s).
    errs = [control_request(caddr, {"op": "job_list", "admin_token": "wrong"}).get("errno")
            for _ in range(4)]
    if errs != [13, 13, 13, 11]:
        fail("wrong admin tokens were not limited per address: %s" % errs)
    time.sleep(0.5)
    print("pbox-ctrld limits: long line refused, bad client closed after 8 requests, "
          "wrong tokens limited")


def main():
    global W
    W = build_path("tests/integration/pbox-check-worker")
    ctrld_bin = build_path("ctrlplane/ctrld/pbox-ctrld")
    tmp = tempfile.mkdtemp(prefix="pboxtest-ctrld-")
    token = "ctrld-secret"
    job1 = {"id": 1, "token": "a", "workers": 2, "mode": "server-optimizer",
            "optimizer": {"name": "sgd", "lr": 0.5}}
    with Pboxd([], cores=2, memory_budget="256M") as d:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        conf = os.path.join(tmp, "ctrld.conf")
        ctrl = {"listen": "127.0.0.1:%d" % port, "admin_token": token,
                "reconcile_interval": 200, "request_timeout": 3000,
                "auth_failures_burst": 3, "auth_failures_per_minute": 600,
                "control_socket": os.path.join(tmp, "ctrld.sock")}
        managed = [{"name": "a", "control": d.control, "admin_token": d.admin_token}]
        # --check-config: pboxd's validation of static jobs.
        write_conf(conf, ctrl, managed, [dict(job1, workers=0)])
        p = subprocess.run([ctrld_bin, "-c", conf, "--check-config"], capture_output=True,
                           text=True)
        if p.returncode != 78 or "job.workers: must be between 1 and 1024" not in p.stderr:
            fail("--check-config accepted a job with 0 workers: %d %s" % (p.returncode,
                                                                           p.stderr))
        write_conf(conf, ctrl, managed, [job1])
        example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "ctrlplane", "ctrld", "pbox-ctrld.conf.example")
        for c in (conf, example):
            p = subprocess.run([ctrld_bin, "-c", c, "--check-config"], capture_output=True,
                               text=True)
            if p.returncode != 0:
                fail("--check-config refused a good configuration %s: %s" % (c, p.stderr))
        log = open(os.path.join(tmp, "ctrld.log"), "w")
        ctrld = subprocess.Popen([ctrld_bin, "-c", conf], stdout=log,
                                 stderr=subprocess.STDOUT)
        try:
            caddr = "127.0.0.1:%d" % port
            wait_for(lambda: 1 in pboxd_jobs(d), "the static job's publication")
            train(d, 1, "a", "job 1 (static in pbox-ctrld)")
            tf = os.path.join(tmp, "token")
            with open(tf, "w") as f:
                f.write(token + "\n")
            via = ["--control", caddr, "--admin-token-file", tf]
            pbox_job("create", *via, "id=2", "token=b", "workers=2", "mode=server-optimizer",
                 "optimizer.name=sgd", "optimizer.lr=0.5")
            if 2 not in pboxd_jobs(d):
                fail("job 2 created through pbox-ctrld is not on the pboxd")
            # A plan (tree / thresholds) given to pbox-ctrld reaches the pboxd.
            plan = {"tree": {"parent": [None, 0]}, "thresholds": {"delta_low": 0.01}}
            r = control_request(caddr, {"op": "job_create", "admin_token": token,
                                        "job": dict(job1, id=4, token="d"), "plan": plan})
            if r.get("ok") is not True or pboxd_jobs(d)[4].get("plan") != plan:
                fail("job 4's plan did not reach the pboxd: %s" % r)
            if control_request(caddr, {"op": "job_rm", "id": 4,
                                       "admin_token": token}).get("ok") is not True:
                fail("job_rm 4 through pbox-ctrld")
            out = pbox_job("list", "--socket", ctrl["control_socket"])
            if "published" not in out or " a" not in out:
                fail("pbox job list through pbox-ctrld does not say where the jobs are")
            out = pbox_job("create", *via, "id=3", "token=c", "workers=2", "keys=0:200000000",
                       ok=False)
            if "pboxd a:" not in out or "can never start" not in out:
                fail("an over-budget job was not refused with the pboxd's reason")
            out = pbox_job("create", *via, "id=3", "token=c", "workers=2", "sync.model=nope",
                       ok=False)
            if "unknown model 'nope'" not in out:
                fail("a bad definition was not refused with its cause")
            out = pbox_job("list", "--control", caddr, ok=False)
            if "admin token" not in out:
                fail("pbox-ctrld answered without the admin token")
            limits(caddr)
            # A restarted pboxd gets its jobs back.
            d.halt()
            d.start()
            wait_for(lambda: {1, 2} <= set(pboxd_jobs(d)), "re-publication after restart")
            train(d, 2, "b", "job 2 (published again)")
            if "job 2 removed" not in pbox_job("rm", *via, "2"):
                fail("pbox job rm through pbox-ctrld")
            if 2 in pboxd_jobs(d):
                fail("job 2 is still on the pboxd after its removal through pbox-ctrld")
            listed = json.loads(pbox_job("list", *via, "--json"))
            c = listed["control"]
            if c["wrong_admin_token"] != 3 or c["auth_rate_limited"] != 1 or \
                    c["republished"] < 2 or c["job_create_refused"] != 2:
                fail("pbox-ctrld's counters: %s" % c)
            if [j["id"] for j in listed["jobs"]] != [1] or not listed["pboxds"][0]["up"]:
                fail("pbox-ctrld's job list after removal: %s" % listed)
        finally:
            ctrld.send_signal(signal.SIGTERM)
            rc = ctrld.wait(10)
            log.close()
            with open(os.path.join(tmp, "ctrld.log")) as f:
                text = f.read()
            print("---- pbox-ctrld log ----\n" + text)
            shutil.rmtree(tmp, ignore_errors=True)
        if rc != 0:
            fail("pbox-ctrld exited with %d" % rc)
        for w in ["job 1: published to pboxd a", "published again to pboxd a",
                  "job_create of job 3 refused", "job 2: removed from pboxd a"]:
            if w not in text:
                fail("pbox-ctrld's log lacks '%s'" % w)


if __name__ == "__main__":
    main()
