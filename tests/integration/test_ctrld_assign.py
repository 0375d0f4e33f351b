#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pbox-ctrld assigns chunks to a pboxd's cores and keeps its runtime jobs in a state file:
 - pboxd refuses an assignment that does not fit it, each with a clear error (a core it
   does not have, a map of the wrong length, another chunk size, a job without a fixed
   key set) and uses a good one: its job_list says who assigned the chunks;
 - pbox-ctrld learns the pboxd's cores and balances chunks by bytes across jobs: job 1
   (3 chunks) fills core 0 with 2 of them, so job 2's one chunk goes to core 1, where
   pboxd's own assignment would put it on core 0; workers of job 2 train exactly and
   pboxd's per-core counters show the traffic on core 1 and none on core 0;
 - `pbox job list` shows the placement summary; a job without a fixed key set, placed by
   pboxd at register, counts in the balance with the bytes pboxd put on each core;
 - the state file (mode 0600: it holds tokens) keeps the runtime jobs: pbox-ctrld
   restarted finds them (the pboxd still holds them: adopted, not published again); with
   the pboxd restarted too while pbox-ctrld was down, they are published again from the
   state file with the same assignment and job 2 trains again on core 1;
 - a removal that cannot reach its pboxd is kept in the state file and delivered after
   a restart;
 - a corrupt state file (bad JSON, another version, a bad job) stops pbox-ctrld at start
   with the file and the cause, and is left as it was."""
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile

from pboxtest import Pboxd, _lc_value, build_path, control_request, fail, finish, free_port, \
    pbox_job, stop_process, wait_for

EINVAL = 22


def pboxd_jobs(d):
    r = control_request(d.control, {"op": "job_list", "admin_token": d.admin_token})
    if r.get("ok") is not True:
        fail("pboxd job_list: %s" % r)
    return r


def core_rx(d):
    return [c["rx_pkts"] for c in d.stats()["cores"]]


def train(d, job, token, what):
    w = build_path("tests/integration/pbox-check-worker")
    ranks = [subprocess.Popen([w, "--server", d.control, "--job", str(job), "--token", token,
                               "--rank", str(r), "--workers", "2", "--keys", "8192",
                               "--timeout-ms", "10000", "--server-opt", "--lr", "0.5",
                               "--iters", "10"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    for r, p in enumerate(ranks):
        if finish(p, "%s rank %d" % (what, r), tail=200)[0] != 0:
            fail("%s: rank %d did not train exactly" % (what, r))


def refused(r, words, what):
    if r.get("ok") is not False or r.get("errno") != EINVAL or \
            not all(w in r.get("error", "") for w in words):
        fail("%s: not refused with EINVAL and %s: %s" % (what, words, r))
    print("refused (%s): %s" % (what, r["error"]))


def strict_pboxd(d):
    job = {"id": 50, "token": "x", "workers": 1, "keys": [[100, 24576]]}
    req = {"op": "job_create", "admin_token": d.admin_token, "job": job}
    refused(control_request(d.control, dict(req, assignment={"chunk_bytes": 32768,
                                                             "map": [0, 5, 1]})),
            ["chunk 1 on core 5", "2 data-plane cores"], "a core pboxd does not have")
    refused(control_request(d.control, dict(req, assignment={"chunk_bytes": 32768,
                                                             "map": [0, 1]})),
            ["places 2 chunks", "3 chunks"], "a map of the wrong length")
    refused(control_request(d.control, dict(req, assignment={"chunk_bytes": 16384,
                                                             "map": [0] * 6})),
            ["16384", "32768"], "another chunk size")
    refused(control_request(d.control, dict(req, job={k: v for k, v in job.items()
                                                      if k != "keys"},
                                            assignment={"chunk_bytes": 32768, "map": [0]})),
            ["fixed key set"], "no fixed key set")
    refused(control_request(d.control, dict(req, assignment={"chunk_bytes": 32768,
                                                             "map": [0, 1, 0], "x": 1})),
            ["assignment.x"], "an unknown member")
    if 50 in [j["id"] for j in pboxd_jobs(d)["jobs"]]:
        fail("a refused job is on the pboxd")
    r = control_request(d.control, dict(req, assignment={"chunk_bytes": 32768,
                                                         "map": [1, 1, 0]}))
    held = {j["id"]: j for j in pboxd_jobs(d)["jobs"]}
    if r.get("ok") is not True or held[50].get("chunks_assigned_by") != "control plane":
        fail("a good assignment was not taken: %s %s" % (r, held.get(50)))
    control_request(d.control, {"op": "job_rm", "id": 50, "admin_token": d.admin_token})
    app = pboxd_jobs(d)["appliance"]
    if app["ncores"] != 2 or app["chunk_bytes"] != 32768 or \
            [c["port"] for c in app["cores"]] != [d.base, d.base + 1]:
        fail("pboxd's job_list does not describe its cores: %s" % app)
    print("pboxd checks assignments strictly; its cores: %s" % app)


class Ctrld:
    def __init__(self, tmp, conf):
        self.tmp, self.conf, self.proc, self.n = tmp, conf, None, 0

    def start(self, port):
        self.n += 1
        self.log = os.path.join(self.tmp, "ctrld-%d.log" % self.n)
        self.proc = subprocess.Popen([build_path("ctrlplane/ctrld/pbox-ctrld"), "-c",
                                      self.conf], stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT)
        wait_for(lambda: self._up(port), "pbox-ctrld's start")

    def _up(self, port):
        if self.proc.poll() is not None:
            fail("pbox-ctrld exited at start (%d): %s" % (self.proc.returncode, self.text()))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(10)
        print("---- pbox-ctrld log %d ----\n%s" % (self.n, self.text()))
        if rc != 0:
            fail("pbox-ctrld exited with %d" % rc)

    def text(self):
        with open(self.log) as f:
            return f.read()


def main():
    tmp = tempfile.mkdtemp(prefix="pboxtest-ctrld-assign-")
    token = "ctrld-secret"
    with Pboxd([], cores=2, memory_budget="256M") as d:
        strict_pboxd(d)
        port = free_port()
        caddr = "127.0.0.1:%d" % port
        state = os.path.join(tmp, "ctrld.state")
        conf = os.path.join(tmp, "ctrld.conf")
        ctrl = {"listen": caddr, "admin_token": token, "reconcile_interval": 200,
                "request_timeout": 1000, "state_file": state}
        with open(conf, "w") as f:
            f.write("ctrld = %s;\npboxds = %s;\n" % (
                _lc_value(ctrl),
                _lc_value([{"name": "a", "control": d.control,
                            "admin_token": d.admin_token}])))
        c = Ctrld(tmp, conf)
        c.start(port)
        try:
            tf = os.path.join(tmp, "token")
            with open(tf, "w") as f:
                f.write(token + "\n")
            via = ["--control", caddr, "--admin-token-file", tf]
            pbox_job("create", *via, "id=1", "token=a", "workers=2", "keys=100:24576",
                 "mode=server-optimizer", "optimizer.name=sgd", "optimizer.lr=0.5")
            pbox_job("create", *via, "id=2", "token=b", "workers=2", "keys=100:8192",
                 "mode=server-optimizer", "optimizer.name=sgd", "optimizer.lr=0.5")
            pbox_job("create", *via, "id=3", "token=c", "workers=2")  # no fixed key set
            r = control_request(caddr, {"op": "job_create", "admin_token": token,
                                        "job": {"id": 9, "token": "z", "workers": 1,
                                                "keys": [[1, 10]]},
                                        "assignment": {"chunk_bytes": 32768, "map": [1]}})
            if r.get("errno") != EINVAL or "assigns the chunks" not in r.get("error", ""):
                fail("pbox-ctrld took a client's assignment: %s" % r)
            listed = json.loads(pbox_job("list", *via, "--json"))
            a = {j["id"]: j["assignment"] for j in listed["jobs"]}
            if a[1] != {"by": "pbox-ctrld", "pboxd": "a", "chunks": [2, 1],
                        "bytes": [65536, 32768]} or \
                    a[2] != {"by": "pbox-ctrld", "pboxd": "a", "chunks": [0, 1],
                             "bytes": [0, 32768]} or a[3] != {"by": "pboxd"}:
                fail("pbox-ctrld's assignment is not balanced across jobs: %s" % a)
            cores = listed["pboxds"][0]["cores"]
            if [k["assigned_bytes"] for k in cores] != [65536, 65536]:
                fail("pbox-ctrld's view of pboxd a's cores: %s" % cores)
            out = pbox_job("list", *via)
            if "chunks assigned by pbox-ctrld on a: core 0 0 chunks 0.0 KiB, core 1 1 chunk " \
                    "32.0 KiB" not in out:
                fail("pbox job list does not show the placement summary")
            held = {j["id"]: j for j in pboxd_jobs(d)["jobs"]}
            if held[2]["chunks_assigned_by"] != "control plane" or \
                    held[3]["chunks_assigned_by"] != "pboxd":
                fail("pboxd does not say who assigned the chunks: %s" % held)
            before = core_rx(d)
            train(d, 2, "b", "job 2")
            after = core_rx(d)
            print("rx packets per core before/after job 2: %s %s" % (before, after))
            if after[0] != before[0] or after[1] <= before[1]:
                fail("job 2's traffic is not where pbox-ctrld put its chunk (core 1)")
            mode = stat.S_IMODE(os.stat(state).st_mode)
            if mode != 0o600:
                fail("the state file has mode %o (tokens in it: 0600)" % mode)
            with open(state) as f:
                st = json.load(f)
            if st["format"] != "pbox-ctrld-state" or st["version"] != 1 or \
                    [e["job"]["id"] for e in st["jobs"]] != [1, 2, 3] or \
                    st["jobs"][1]["assignment"] != {"chunk_bytes": 32768, "map": [1]}:
                fail("the state file: %s" % st)
            # Job 3 (no fixed key set) placed by pboxd at register counts in the balance
            # while its session runs: its chunk on core 0 sends job 4's to core 1 (with
            # cores 0 and 1 at 64 KiB each otherwise, the tie would go to core 0).
            w = build_path("tests/integration/pbox-check-worker")
            ranks = [subprocess.Popen([w, "--server", d.control, "--job", "3", "--token", "c",
                                       "--rank", str(r), "--workers", "2", "--keys", "8192",
                                       "--timeout-ms", "10000", "--iters", "1000000"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for r in range(2)]
            try:
                def job3_seen():
                    j = {x["id"]: x for x in json.loads(pbox_job("list", *via, "--json"))["jobs"]}
                    return j[3]["assignment"].get("bytes") == [32768, 0]
                wait_for(job3_seen, "pbox-ctrld learning where pboxd put job 3's chunk")
                pbox_job("create", *via, "id=4", "token=d", "workers=2", "keys=100:8192")
                j = {x["id"]: x for x in json.loads(pbox_job("list", *via, "--json"))["jobs"]}
                if j[4]["assignment"]["chunks"] != [0, 1]:
                    fail("job 3's running session was not counted: job 4 %s" %
                         j[4]["assignment"])
            finally:
                for p in ranks:
                    p.kill()
                    p.wait()
            pbox_job("rm", *via, "4")
            pbox_job("rm", *via, "3")
            # pbox-ctrld restarted, the pboxd kept running: the jobs are adopted.
            c.stop()
            c.start(port)
            listed = json.loads(pbox_job("list", *via, "--json"))
            if [(j["id"], j["origin"], j["state"]) for j in listed["jobs"]] != \
                    [(1, "runtime", "published"), (2, "runtime", "published")] or \
                    listed["jobs"][1]["assignment"]["chunks"] != [0, 1]:
                fail("pbox-ctrld restarted lost its runtime jobs: %s" % listed)
            if "job 2: held by pboxd a already" not in c.text():
                fail("pbox-ctrld did not adopt what its pboxd held")
            # Both restarted: the state file's jobs are published again.
            c.stop()
            d.halt()
            d.start()
            if pboxd_jobs(d)["jobs"]:
                fail("the restarted pboxd has jobs before pbox-ctrld publishes them")
            c.start(port)
            wait_for(lambda: {1, 2} <= {j["id"] for j in pboxd_jobs(d)["jobs"]},
                     "publication of the state file's jobs")
            before = core_rx(d)
            train(d, 2, "b", "job 2 after both restarts")
            after = core_rx(d)
            print("rx packets per core before/after job 2: %s %s" % (before, after))
            if after[0] != before[0] or after[1] <= before[1]:
                fail("after the restarts job 2's traffic is not on core 1")
            # A removal that cannot reach its pboxd (stopped) is kept in the state file
            # and delivered after a restart of pbox-ctrld.
            stop_process(d.proc)
            try:
                if "job 1 removed" not in pbox_job("rm", *via, "1"):
                    fail("pbox job rm 1 through pbox-ctrld")
                with open(state) as f:
                    st = json.load(f)
                if st["removals"] != [{"id": 1, "pboxd": "a"}] or \
                        [e["job"]["id"] for e in st["jobs"]] != [2]:
                    fail("the pending removal is not in the state file: %s" % st)
                c.stop()
            finally:
                d.proc.send_signal(signal.SIGCONT)
            c.start(port)
            wait_for(lambda: 1 not in {j["id"] for j in pboxd_jobs(d)["jobs"]},
                     "delivery of job 1's removal after the restart")
            wait_for(lambda: json.load(open(state))["removals"] == [],
                     "the delivered removal leaving the state file")
            if "job 1: removal delivered to pboxd a" not in c.text():
                fail("pbox-ctrld did not log the delivered removal")
            c.stop()
            # Corrupt state files: refused at start with the cause, left in place.
            good = open(state).read()
            for text, words in [(good[:len(good) // 2], ["line 1", "not loaded"]),
                                (good.replace('"version":1', '"version":2'), ["version"]),
                                (good.replace('"workers":2', '"workers":0', 1),
                                 ["jobs[0]", "job.workers"]),
                                (good.replace('"jobs":[', '"jobs":[{"job":{"id":2}},', 1),
                                 ["jobs[0]"]),
                                (good.replace('"format":"pbox-ctrld-state"',
                                              '"format":"x"'), ["format"]),
                                (good.replace('"removals":[]', '"removals":[{"id":-1}]'),
                                 ["removals[0]"]),
                                (good.replace('"pboxd":"a"', '"placement":["x"],"pboxd":"a"',
                                              1), ["job 2 refused", "placement"])]:
                with open(state, "w") as f:
                    f.write(text)
                p = subprocess.run([build_path("ctrlplane/ctrld/pbox-ctrld"), "-c", conf],
                                   capture_output=True, text=True, timeout=20)
                if p.returncode != 78 or "state file %s" % state not in p.stderr or \
                        not all(w in p.stderr for w in words):
                    fail("a corrupt state file was not refused clearly (%d): %s"
                         % (p.returncode, p.stderr))
                if open(state).read() != text:
                    fail("pbox-ctrld changed a state file it refused")
                print("refused: %s" % p.stderr.strip())
            with open(state, "w") as f:
                f.write(good)
            p = subprocess.run([build_path("ctrlplane/ctrld/pbox-ctrld"), "-c", conf,
                                "--check-config"], capture_output=True, text=True)
            if p.returncode != 0 or "1 runtime job(s)" not in p.stdout:
                fail("--check-config with the state file: %s %s" % (p.stdout, p.stderr))
        finally:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
