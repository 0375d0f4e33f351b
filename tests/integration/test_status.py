#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""`pbox status` on pboxd ({"op":"status"}, dataplane/pboxd/jobstatus.h) and pbox-ctrld
(ctrlplane/ctrld/status.h):
 - a 3-rank job whose rank 2 stops pushing at iteration 5: status names rank 2 as missing
   on every chunk of the job (all waiting at iteration 5), ranks 0 and 1 at iteration 6,
   rank 2 at 5, within a bounded time, in the JSON and in the text output;
 - a rank that never connected: status names it missing and "not connected";
 - the answer is bounded (--max-ranks) and refused without the admin token (EACCES), for
   malformed limits (EINVAL) and an unknown job (ENOENT);
 - through pbox-ctrld (a job created there with a placement, a probe pair measured on
   demand): status lists the pboxd, the bandwidth entry with its estimate and age, the
   job's plan (tree revision, thresholds) and, asked of the job's pboxd, rank 2 missing on
   the waiting chunks; pbox-ctrld's /metrics parses and carries the jobs, the plan
   revision and the bandwidth entry."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

from pboxtest import Pboxd, _lc_value, build_path, control_request, fail, free_port, \
    wait_answering
from test_metrics import parse_prom, scrape, value
from test_runtime_jobs import finish, worker
import test_runtime_jobs

EACCES, ENOENT, EINVAL = 13, 2, 22
STALL_AT = 5
BOUND_S = 20


def status(d, *args, ok=True, where=None, env=None):
    where = where or ["--socket", d.appliance["control_socket"]]
    p = subprocess.run([build_path("apps/pbox"), "status"] + where + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30,
                       env=env)
    if (p.returncode == 0) != ok:
        fail("pbox status %s: exit %d: %s" % (" ".join(args), p.returncode, p.stdout))
    return p.stdout


def refused(r, err, word, what):
    print("%s -> %s" % (what, r))
    if r.get("ok") is not False or r.get("errno") != err or word not in r.get("error", ""):
        fail("%s: expected errno %d naming '%s', got %s" % (what, err, word, r))


def wait_stuck(get, what):
    """Poll get() (a job status object) until rank 2 is missing on waiting chunks."""
    t0 = time.time()
    while True:
        job = get()
        groups = (job.get("waiting") or {}).get("groups", [])
        if len(groups) == 1 and groups[0]["missing"] == "2" and \
                groups[0]["iteration"] == STALL_AT and job.get("progress_ms_ago", 0) >= 500:
            return job, time.time() - t0
        if time.time() - t0 > BOUND_S:
            fail("%s: rank 2 not named missing within %d s: %s" % (what, BOUND_S,
                                                                 json.dumps(job)[:2000]))
        time.sleep(0.2)


def ctrld_status():
    """pbox status and /metrics of pbox-ctrld over a pboxd that probes and trains."""
    ctrld_bin = build_path("ctrlplane/ctrld/pbox-ctrld")
    tmp = tempfile.mkdtemp(prefix="pboxtest-ctrld-status-")
    token = "status-secret"
    uport = free_port(socket.SOCK_DGRAM)
    peer = "127.0.0.1:%d" % uport
    with Pboxd([], cores=2, memory_budget="256M", worker_timeout=60,
               probe={"port": uport, "address": "127.0.0.1", "max_rate": "200mbit",
                      "max_budget_s": 2}) as d:
        caddr = "127.0.0.1:%d" % free_port(socket.SOCK_STREAM)
        mport = free_port(socket.SOCK_STREAM)
        ctrl = {"listen": caddr, "admin_token": token, "request_timeout": 3000,
                "reconcile_interval": 200, "log_format": "json"}
        managed = [{"name": "a", "control": d.control, "admin_token": d.admin_token}]
        bw = {"interval": 0, "cap": "100mbit", "budget": 1, "pairs": [{"from": "a", "to": peer}]}
        hosts = [{"name": "a", "edge": 0, "agg": 0},
                 {"name": "w0", "addr": peer, "edge": 0, "agg": 0},
                 {"name": "w1", "edge": 0, "agg": 0}, {"name": "w2", "edge": 1, "agg": 0}]
        plan = {"degree": 2, "depth": 2, "min_rate": "1gbit", "hosts": hosts}
        conf = os.path.join(tmp, "ctrld.conf")
        with open(conf, "w") as f:
            f.write("ctrld = %s;\npboxds = %s;\nbandwidth = %s;\nplan = %s;\n"
                    "metrics = { listen = \"127.0.0.1:%d\"; };\n" % (
                        _lc_value(ctrl), _lc_value(managed), _lc_value(bw), _lc_value(plan),
                        mport))
        log = open(os.path.join(tmp, "ctrld.log"), "w")
        ctrld = subprocess.Popen([ctrld_bin, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
        ws = []
        env = dict(os.environ, PBOX_ADMIN_TOKEN=token)
        try:
            wait_answering(caddr, {"op": "job_list", "admin_token": token}, "pbox-ctrld")
            r = control_request(caddr, {"op": "bw_probe", "admin_token": token, "from": "a",
                                        "to": peer})
            if r.get("ok") is not True:
                fail("bw_probe: %s" % r)
            r = control_request(caddr, {"op": "job_create", "admin_token": token,
                                        "job": {"id": 9, "token": "t9", "workers": 3},
                                        "placement": ["w0", "w1", "w2"]})
            if r.get("ok") is not True:
                fail("job_create through pbox-ctrld: %s" % r)
            ws = [worker(d, 9, "t9", r, 3, "--iters", "100000", "--expect-fail",
                         timeout_ms=40000) for r in range(2)]
            ws.append(worker(d, 9, "t9", 2, 3, "--iters", "100000", "--stall-at",
                             str(STALL_AT), timeout_ms=40000))
            where = ["--control", caddr]

            def get():
                st = json.loads(status(d, "--json", where=where, env=env))
                if st.get("daemon") != "pbox-ctrld":
                    fail("status through pbox-ctrld: %s" % st)
                j = [x for x in st["jobs"] if x["id"] == 9][0]
                return dict(j.get("status") or {}, _ctrld=st, _job=j)
            job, took = wait_stuck(get, "pbox-ctrld")
            print("through pbox-ctrld: rank 2 named missing after %.1f s" % took)
            st, cj = job["_ctrld"], job["_job"]
            if cj.get("pboxd") != "a" or not isinstance(cj.get("plan"), dict) or \
                    "tree" not in cj["plan"] or "thresholds" not in cj["plan"]:
                fail("the job's entry lacks its pboxd or plan: %s" % cj)
            if [p["name"] for p in st["pboxds"]] != ["a"] or not st["pboxds"][0]["up"]:
                fail("pboxds: %s" % st["pboxds"])
            deadline = time.time() + 20
            while True:
                bwl = json.loads(status(d, "--json", where=where, env=env))["bandwidth"]
                if len(bwl) == 1 and bwl[0].get("estimate") and "age_s" in bwl[0]:
                    break
                if time.time() > deadline:
                    fail("status does not list the measured pair: %s" % bwl)
                time.sleep(0.2)
            # The plan is recomputed once the probe's result is in: compare the text with
            # the JSON of the same revision.
            deadline = time.time() + 20
            while True:
                tree = json.loads(status(d, "--json", where=where, env=env))
                tree = [x for x in tree["jobs"] if x["id"] == 9][0]["plan"]["tree"]
                text = status(d, where=where, env=env)
                if "tree: rev %d" % tree["revision"] in text or time.time() > deadline:
                    break
            print(text)
            for want in ("bandwidth matrix:", "a            " + peer,
                         "tree: rev %d" % tree["revision"],
                         "parents [%s]" % " ".join(str(x) for x in tree["parent"]),
                         "thresholds: broadcast", "rank 2 missing on chunks",
                         "on pboxd a"):
                if want not in text:
                    fail("pbox status through pbox-ctrld does not show '%s'" % want)
            fams = scrape(mport, wait=2.0)
            if value(fams, "pbox_ctrld_jobs", state="published") != 1 or \
                    value(fams, "pbox_ctrld_pboxd_up", pboxd="a") != 1 or \
                    value(fams, "pbox_ctrld_jobs_with_plan") != 1 or \
                    value(fams, "pbox_ctrld_job_plan_revision", job=9) < 1 or \
                    value(fams, "pbox_ctrld_probes_total", **{"from": "a", "to": peer}) < 1 \
                    or value(fams, "pbox_ctrld_bandwidth_max_bps",
                             **{"from": "a", "to": peer}) <= 0:
                fail("pbox-ctrld's metrics are wrong")
            print("pbox-ctrld /metrics: %d families" % len(fams))
            r = control_request(caddr, {"op": "status"})
            if r.get("ok") is not False or r.get("errno") != EACCES:
                fail("pbox-ctrld answered status without the admin token: %s" % r)
            r = control_request(caddr, {"op": "status", "admin_token": token, "job": 77})
            if r.get("ok") is not False or r.get("errno") != ENOENT:
                fail("pbox-ctrld status of an unknown job: %s" % r)
        finally:
            for p in ws:
                p.kill()
                p.wait()
            ctrld.terminate()
            rc = ctrld.wait(timeout=30)
            log.close()
            text = open(os.path.join(tmp, "ctrld.log")).read()
            shutil.rmtree(tmp, ignore_errors=True)
        if rc != 0:
            print(text)
            fail("pbox-ctrld exited with %d" % rc)
        lines = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
        if not lines or any(x["daemon"] != "pbox-ctrld" for x in lines):
            fail("pbox-ctrld's log is not JSON lines: %s" % text[:500])


def main():
    test_runtime_jobs.W = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 7, "token": "t7", "workers": 3, "mode": "aggregate"},
            {"id": 8, "token": "t8", "workers": 3, "mode": "aggregate"}]
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
            if r.get("ok") is not True or [j["id"] for j in r["jobs"]] != [7, 8]:
                fail("status with the admin token: %s" % r)
            # A rank that never started: job 8's ranks 0 and 1 wait for it at iteration 0.
            ws += [worker(d, 8, "t8", r, 3, "--iters", "100000", "--expect-fail",
                          timeout_ms=40000) for r in range(2)]

            def get8():
                return json.loads(status(d, "--json", "--job", "8"))["jobs"][0]
            t0 = time.time()
            while True:
                job = get8()
                groups = (job.get("waiting") or {}).get("groups", [])
                if len(groups) == 1 and groups[0]["missing"] == "2" and \
                        groups[0]["iteration"] == 0:
                    break
                if time.time() - t0 > BOUND_S:
                    fail("job 8: rank 2 (never connected) not named: %s" % json.dumps(job))
                time.sleep(0.2)
            r2 = job["ranks"][2]
            if r2["connected"] or r2["registered"] or r2["peer"] is not None or \
                    r2["last_seen_ms_ago"] is not None or not r2["live"]:
                fail("job 8 rank 2: %s" % r2)
            text = status(d, "--job", "8")
            if "rank 2 missing on chunks" not in text or "rank 2 is not connected" not in text:
                fail("the text does not say rank 2 is missing and not connected:\n" + text)
            print([ln for ln in text.splitlines() if "waiting" in ln][0])
        finally:
            for p in ws:
                p.kill()
            for r, p in enumerate(ws):
                finish(p, "rank %d" % r)
    ctrld_status()
    print("test_status: ok")


if __name__ == "__main__":
    main()
