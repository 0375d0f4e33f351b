#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Jobs created, listed and removed at run time over pboxd's control channel
(job_create / job_list / job_rm, common/jobspec.h):
 - only with the admin token or over the Unix control socket (refusals counted, logged);
 - a runtime job trains exactly like a configured one (pbox-check-worker checks every
   result against the local computation);
 - bad definitions (the configuration file's own validation), duplicates and definitions
   over the memory budget are refused with the job and the cause;
 - removing a job while it trains gives its workers a clear error at once and leaves the
   appliance and the other jobs running;
 - the job table is swapped (create + remove of other jobs) thousands of times while a
   job trains, and its model stays exact."""
import json
import os
import re
import socket
import subprocess
import time

from pboxtest import Pboxd, build_path, fail, finish, pbox_job

W = None
SWAPS = 2000


class Admin:
    """One persistent control connection (request / response lines)."""

    def __init__(self, addr, token=None):
        if addr.startswith("/"):
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.connect(addr)
        else:
            host, port = addr.rsplit(":", 1)
            self.s = socket.create_connection((host, int(port)))
        self.s.settimeout(30)
        self.buf = b""
        if token is not None:
            r = self.req({"op": "auth", "admin_token": token})
            if r.get("ok") is not True:
                fail("auth refused: %s" % r)

    def req(self, obj):
        self.s.sendall((json.dumps(obj) + "\n").encode())
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                fail("pboxd closed the admin connection (after %s)" % obj)
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        self.s.close()


def worker(d, job, token, rank, n, *extra, keys="20000,77", timeout_ms=10000):
    return subprocess.Popen([W, "--server", d.control, "--job", str(job), "--token", token,
                             "--rank", str(rank), "--workers", str(n), "--keys", keys,
                             "--timeout-ms", str(timeout_ms)] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def expect_refused(r, err, words, what):
    if r.get("ok") is not False or r.get("errno") != err:
        fail("%s: expected errno %d, got %s" % (what, err, r))
    for w in words:
        if w not in r.get("error", ""):
            fail("%s: the error does not say '%s': %s" % (what, w, r))
    print("refused as expected (%s): %s" % (what, r["error"]))


def job_ids(a):
    r = a.req({"op": "job_list"})
    if r.get("ok") is not True:
        fail("job_list refused: %s" % r)
    return {j["id"]: j for j in r["jobs"]}


def cli(d):
    """`pbox job`: key=value words, a JSON file, the token file, the Unix socket."""
    tf = os.path.join(d.dir, "admin.token")
    with open(tf, "w") as f:
        f.write(d.admin_token + "\n")
    tcp = ["--control", d.control, "--admin-token-file", tf]
    # 1000 keys: a request line longer than pboxd reads before authentication.
    keys = ",".join("%d:%d" % (k, 100 + k) for k in range(1000))
    out = pbox_job("create", *tcp, "id=23", "token=t23", "workers=2", "keys=" + keys)
    if "job 23 created" not in out:
        fail("pbox job create did not say what it did")
    keys = ",".join("%d:%d" % (100 + k, 100 + k) for k in range(200))
    pbox_job("create", *tcp, "id=20", "token=t20", "workers=2", "mode=server-optimizer",
         "optimizer.name=sgd", "optimizer.lr=0.5", "keys=" + keys)
    jf = os.path.join(d.dir, "job21.json")
    with open(jf, "w") as f:
        json.dump({"id": 21, "token": "t21", "workers": 3, "sync": {"model": "bsp"}}, f)
    pbox_job("create", "--socket", d.appliance["control_socket"], "--file", jf, "workers=2")
    out = pbox_job("list", *tcp)
    if not re.search(r"^20 +runtime +server-optimizer", out, re.M) or \
            not re.search(r"^21 +runtime +aggregate +bsp +2 ", out, re.M):
        fail("pbox job list does not show jobs 20 and 21 as created")
    listed = json.loads(pbox_job("list", *tcp, "--json"))
    j20 = [j for j in listed["jobs"] if j["id"] == 20][0]
    j23 = [j for j in listed["jobs"] if j["id"] == 23][0]
    if j20["keys_configured"] != 200 or j23["keys_configured"] != 1000:
        fail("the key sets did not arrive: %s %s" % (j20, j23))
    ranks = [worker(d, 20, "t20", r, 2, "--server-opt", "--lr", "0.5", "--iters", "5",
                    keys=",".join(str(100 + k) for k in range(200)))
             for r in range(2)]
    for r, p in enumerate(ranks):
        if finish(p, "job 20 rank %d (created by pbox job)" % r)[0] != 0:
            fail("the job created by pbox job did not train exactly")
    out = pbox_job("create", *tcp, "id=22", "token=x", "workers=0", ok=False)
    if "job.workers: must be between 1 and 1024" not in out:
        fail("pbox job create did not print pboxd's reason")
    out = pbox_job("create", "--control", d.control, "id=22", "token=x", "workers=1", ok=False)
    if "admin token" not in out:
        fail("pbox job create without a token did not print the refusal")
    pbox_job("create", *tcp, "workers", ok=False)
    for i in (20, 21, 23):
        if "job %d removed" % i not in pbox_job("rm", *tcp, str(i)):
            fail("pbox job rm %d" % i)
    out = pbox_job("rm", *tcp, "21", ok=False)
    if "job 21 does not exist" not in out:
        fail("pbox job rm of a removed job did not say so")


def remove_while_allocating(d, local):
    """job_rm right after the first register of a large key set: the session is usually
    still allocating its chunk state (off the control thread); the waiting rank gets the
    removal as its register's answer, the state is freed when the allocation returns."""
    r = local.req({"op": "job_create", "job": {"id": 30, "token": "t30", "workers": 2}})
    if r.get("ok") is not True:
        fail("job_create of job 30: %s" % r)
    m = Admin(d.control)
    r = m.req({"op": "hello", "job": 30, "rank": 0, "token": "t30", "version": 1})
    if r.get("ok") is not True:
        fail("hello to job 30: %s" % r)
    m.s.sendall(b'{"op":"register","keys":[[0,12000000]]}\n')
    time.sleep(0.01)
    r = local.req({"op": "job_rm", "id": 30})
    if r != {"ok": True, "id": 30}:
        fail("job_rm of a starting job: %s" % r)
    m.s.settimeout(30)
    while b"\n" not in m.buf:
        chunk = m.s.recv(65536)
        if not chunk:
            break
        m.buf += chunk
    got = json.loads(m.buf.split(b"\n", 1)[0]) if b"\n" in m.buf else {}
    m.close()
    print("rank 0 of job 30 got: %s" % got)
    if "job 30 was removed" not in got.get("error", got.get("reason", "")):
        fail("the registering rank of a removed job was not told: %s" % got)
    # The state is freed whichever way the race went; the job is gone either way.
    deadline = time.time() + 30
    while "job 30: removed (its chunk state" not in d.log() and \
            "job 30: session ended" not in d.log():
        if time.time() > deadline:
            fail("job 30's chunk state was not freed")
        time.sleep(0.05)
    print("removal path taken: %s" % ("while allocating" if "freed once allocated" in d.log()
                                      else "after the session started"))
    if 30 in job_ids(local):
        fail("job 30 is still listed")


def main():
    global W
    W = build_path("tests/integration/pbox-check-worker")
    EACCES, ENOENT, EINVAL, EEXIST, ENOSPC = 13, 2, 22, 17, 28
    static = [{"id": 1, "token": "a", "workers": 2, "mode": "aggregate"}]
    with Pboxd(static, cores=2, memory_budget="256M",
               control_socket="/tmp/pboxtest-rt-%d.sock" % time.time_ns()) as d:
        sock = d.appliance["control_socket"]
        # Authentication: none, a wrong token, then the right one / the Unix socket.
        plain = Admin(d.control)
        expect_refused(plain.req({"op": "job_list"}), EACCES, ["admin token"], "no token")
        expect_refused(plain.req({"op": "job_rm", "id": 1, "admin_token": "nope"}), EACCES,
                       ["wrong admin token"], "wrong token")
        plain.close()
        a = Admin(d.control, d.admin_token)
        local = Admin(sock)
        jobs = job_ids(local)
        if list(jobs) != [1] or jobs[1]["origin"] != "config":
            fail("job_list should show the configured job 1: %s" % jobs)

        # A runtime job trains exactly like a configured one.
        spec = {"id": 5, "token": "t5", "workers": 2, "mode": "server-optimizer",
                "optimizer": {"name": "sgd", "lr": 0.5}}
        r = a.req({"op": "job_create", "job": spec})
        if r != {"ok": True, "id": 5}:
            fail("job_create of job 5: %s" % r)
        jobs = job_ids(a)
        if jobs.get(5, {}).get("origin") != "runtime" or jobs[5]["mode"] != "server-optimizer":
            fail("job 5 is not listed as a runtime server-optimizer job: %s" % jobs)
        ranks = [worker(d, 5, "t5", r, 2, "--server-opt", "--lr", "0.5", "--iters", "30")
                 for r in range(2)]
        for r, p in enumerate(ranks):
            if finish(p, "job 5 rank %d" % r)[0] != 0:
                fail("the runtime job did not train exactly")

        # The plan (trees, thresholds: the control plane's part) is kept and reported.
        plan = {"tree": {"parent": [None, 0]}, "thresholds": None}
        r = a.req({"op": "job_create", "job": dict(spec, id=8, token="t8"), "plan": plan})
        if r.get("ok") is not True or job_ids(a)[8].get("plan") != plan:
            fail("job 8's plan was not kept: %s %s" % (r, job_ids(a).get(8)))
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=9),
                              "plan": {"route": {}}}), EINVAL, ["plan.route"], "bad plan")
        if a.req({"op": "job_rm", "id": 8}).get("ok") is not True:
            fail("job_rm 8")

        # Refusals: the configuration file's validation, duplicates, budgets.
        expect_refused(a.req({"op": "job_create", "job": dict(spec)}), EEXIST,
                       ["job 5", "exists"], "duplicate runtime id")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=1)}), EEXIST,
                       ["job 1", "exists"], "duplicate of a configured job")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=6, workers=0)}),
                       EINVAL, ["job.workers", "between 1 and 1024"], "zero workers")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=6, colour="red")}),
                       EINVAL, ["job.colour", "unknown setting"], "unknown setting")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=6, mode="fast")}),
                       EINVAL, ["unknown mode 'fast'"], "bad mode")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=6, token=None)}),
                       EINVAL, ["job description: job.token", "null"],
                       "null token")
        expect_refused(a.req({"op": "job_create", "job": {"id": 6, "workers": 2}}), EINVAL,
                       ["token"], "no token")
        expect_refused(a.req({"op": "job_create", "job": [1, 2]}), EINVAL, ["\"job\""],
                       "not an object")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=6,
                                                                keys=[[0, 200000000]])}),
                       ENOSPC, ["job 6", "can never start", "appliance's memory_budget of 256"],
                       "over budget")
        expect_refused(a.req({"op": "job_create", "job": dict(spec, id=6, keys=[[0, 10]],
                                                                memory_budget="1K")}),
                       ENOSPC, ["job 6", "job's memory_budget"], "over the job's budget")
        expect_refused(a.req({"op": "job_rm", "id": 77}), ENOENT, ["job 77"], "rm unknown")
        if 6 in job_ids(a):
            fail("a refused job was added")

        # Removal while training: the workers get a clear error at once.
        r = a.req({"op": "job_create", "job": dict(spec, id=7, token="t7")})
        if r.get("ok") is not True:
            fail("job_create of job 7: %s" % r)
        ranks = [worker(d, 7, "t7", r, 2, "--server-opt", "--lr", "0.5", "--iters",
                        "1000000", "--expect-fail", timeout_ms=60000) for r in range(2)]
        deadline = time.time() + 30
        while True:
            j = job_ids(a).get(7, {})
            if j.get("registered") == 2 and j.get("version_min", 0) >= 3:
                break
            if time.time() > deadline:
                fail("job 7 did not start training: %s" % j)
            time.sleep(0.05)
        t0 = time.time()
        r = local.req({"op": "job_rm", "id": 7})
        if r != {"ok": True, "id": 7}:
            fail("job_rm of a training job: %s" % r)
        for r, p in enumerate(ranks):
            rc, out = finish(p, "job 7 rank %d (removed)" % r)
            if rc != 0 or "job 7 was removed" not in out:
                fail("rank %d of job 7 did not get a clear error naming the removal" % r)
        if time.time() - t0 > 10:
            fail("the workers of a removed job took %.1f s to learn of it" % (time.time() - t0))
        if 7 in job_ids(a):
            fail("job 7 is still listed after job_rm")

        cli(d)
        remove_while_allocating(d, local)

        # Thousands of table swaps (other jobs created and removed) while job 5 trains.
        ranks = [worker(d, 5, "t5", r, 2, "--server-opt", "--lr", "0.5", "--iters", "1500",
                        keys="5000,300,7")
                 for r in range(2)]
        swaps = 0
        t0 = time.time()
        while swaps < SWAPS or any(p.poll() is None for p in ranks):
            i = 1000 + swaps % 50
            r = local.req({"op": "job_create", "job": dict(spec, id=i, token="x%d" % i)})
            if r.get("ok") is not True:
                fail("swap %d: job_create %d: %s" % (swaps, i, r))
            r = local.req({"op": "job_rm", "id": i})
            if r.get("ok") is not True:
                fail("swap %d: job_rm %d: %s" % (swaps, i, r))
            swaps += 1
            if swaps > 200000:
                break
        print("%d create+remove pairs (%d table swaps) in %.1f s while job 5 trained"
              % (swaps, 2 * swaps, time.time() - t0))
        for r, p in enumerate(ranks):
            if finish(p, "job 5 rank %d (under swaps)" % r)[0] != 0:
                fail("job 5's model was not exact while the job table was swapped")
        st = d.stats()
        ctl = st["control"]
        if ctl["jobs_created"] < SWAPS + 2 or ctl["jobs_removed"] < SWAPS + 1:
            fail("the job counters missed operations: %s" % ctl)
        if ctl["job_create_refused"] != 10 or ctl["job_rm_refused"] != 2:
            fail("refusals not counted: %s" % ctl)
        if ctl["admin_refused"] != 2 or ctl["wrong_admin_token"] != 1:
            fail("admin refusals not counted: %s" % ctl)
        out = subprocess.run([build_path("apps/pbox"), "stats", "--socket", sock],
                             capture_output=True, text=True, timeout=30).stdout
        if not re.search(r"^runtime jobs: %d created, %d removed$" % (ctl["jobs_created"],
                                                                       ctl["jobs_removed"]),
                         out, re.M) or "jobs_created" in out:
            fail("pbox stats does not report the runtime jobs:\n%s" % out)
        a.close()
        local.close()
        log = d.log()
        for w in ["job_create of job 6 refused: job description: job.workers",
                  "job_create of job 6 refused: job 6: can never start",
                  "job 7 was removed from the appliance (job_rm from",
                  "job 5: created at run time",
                  "job_list refused: no admin token"]:
            if w not in log:
                fail("pboxd's log lacks '%s'" % w)


if __name__ == "__main__":
    main()
