#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Workers as control-plane agents (libpbox/probe.h, pboxd/sessions.h), over loopback:
 - a worker advertises its probe responder at register; the pboxd lists it in job_list
   ("agents"), with its own responder ("probe"); a worker with PBOX_PROBE=off has none;
 - {"op":"probe","via":{"job","rank"}} is refused without the admin token (EACCES),
   malformed (EINVAL), for an unknown job or a rank without an agent (ENOENT);
 - a probe via rank 0 towards the pboxd's responder comes back with a result
   (r_min <= r_max <= cap); one above the worker's own cap is refused by the worker
   (EPERM, through the pboxd);
 - job_plan pushes each registered rank its slice of the plan: the workers log the
   revision, their parent, children and push threshold (rank 1 with an insufficient
   link pushes delta_up); a plan arriving before a rank registers comes with its register
   answer;
 - the job's results stay exact (pbox-check-worker) and both workers exit 0."""
import json
import os
import socket
import subprocess
import tempfile
import time

from pboxtest import Pboxd, build_path, control_request, fail, free_port

EACCES, EPERM, EINVAL, ENOENT = 13, 1, 22, 2
JOB, JTOK = 9, "agent-job"


def expect(r, errno, what):
    print("%s -> %s" % (what, json.dumps(r)[:200]))
    if r.get("ok") is not False or r.get("errno") != errno:
        fail("%s: expected errno %d, got %s" % (what, errno, r))


def plan(rev, link1):
    w = [{"rank": 0, "link": "sufficient", "push": "delta_low", "delta": 0.001,
          "bw_bps": 9e8},
         {"rank": 1, "link": link1, "push": "delta_up" if link1 == "insufficient" else
          "delta_low", "delta": 0.01 if link1 == "insufficient" else 0.001, "bw_bps": 2e7}]
    return {"tree": {"root": "a", "parent": [-1, 0], "revision": rev},
            "thresholds": {"min_rate_bps": 5e7, "hysteresis": 0.1, "delta_low": 0.001,
                           "delta_up": 0.01,
                           "broadcast": {"select": "delta_up" if link1 == "insufficient"
                                         else "delta_low",
                                         "delta": 0.01 if link1 == "insufficient"
                                         else 0.001},
                           "workers": w}}


def main():
    port = free_port(socket.SOCK_DGRAM)
    cw = build_path("tests/integration/pbox-check-worker")
    tmp = tempfile.mkdtemp(prefix="pboxtest-agent-")
    stopf = os.path.join(tmp, "stop")
    job = {"id": JOB, "token": JTOK, "workers": 2, "mode": "aggregate"}
    with Pboxd([job], probe={"port": port, "address": "127.0.0.1", "max_rate": "200mbit",
                             "max_budget_s": 3}) as d:
        tok = d.admin_token

        def job_entry():
            r = control_request(d.control, {"op": "job_list", "admin_token": tok})
            return [j for j in r["jobs"] if j["id"] == JOB][0]

        # A plan held before anyone registers: it comes with the register answers.
        r = control_request(d.control, {"op": "job_plan", "id": JOB, "plan": plan(2, "sufficient"),
                                        "admin_token": tok})
        if r.get("applied") is not True:
            fail("job_plan: %s" % r)
        ws = []
        for rank in range(2):
            env = dict(os.environ, PBOX_PROBE_MAX_RATE="200mbit", PBOX_PROBE_MAX_BUDGET_S="3")
            if rank == 1:
                env["PBOX_PROBE"] = "off"
            ws.append(subprocess.Popen(
                [cw, "--server", d.control, "--job", str(JOB), "--token", JTOK, "--rank",
                 str(rank), "--workers", "2", "--keys", "4096", "--iters", "100000",
                 "--sleep-ms", "5", "--stop-file", stopf, "--timeout-ms", "30000"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        deadline = time.time() + 20
        while True:
            e = job_entry()
            if e.get("registered") == 2:
                break
            if time.time() > deadline:
                fail("the workers did not register: %s" % e)
            time.sleep(0.1)
        print("job_list: agents %s, probe %s" % (e.get("agents"), e.get("probe")))
        agents = e.get("agents", [])
        if len(agents) != 1 or agents[0]["rank"] != 0 or \
                not agents[0]["probe"].startswith("127.0.0.1:") or \
                e.get("probe") != "127.0.0.1:%d" % port:
            fail("job_list agents: %s" % e)
        req = {"peer": "127.0.0.1:%d" % port, "cap_bps": 2e8, "budget_ms": 2000}

        def via(v, token=tok, request=req, timeout=20):
            o = {"op": "probe", "via": v, "request": request}
            if token is not None:
                o["admin_token"] = token
            return control_request(d.control, o, timeout=timeout)

        expect(via({"job": JOB, "rank": 0}, token=None), EACCES, "no admin token")
        expect(via({"job": JOB}), EINVAL, "via without a rank")
        expect(via({"job": 99, "rank": 0}), ENOENT, "unknown job")
        expect(via({"job": JOB, "rank": 1}), ENOENT, "a rank without an agent")
        expect(via({"job": JOB, "rank": 0}, request=dict(req, cap_bps=5e8)), EPERM,
               "above the worker's cap")
        t0 = time.time()
        r = via({"job": JOB, "rank": 0})
        res = r.get("result", {})
        print("probe by rank 0 towards the pboxd: %.1f..%.1f Mbit/s in %.1f s" % (
            res.get("r_min_bps", 0) / 1e6, res.get("r_max_bps", 0) / 1e6, time.time() - t0))
        if r.get("ok") is not True or not 0 < res["r_min_bps"] <= res["r_max_bps"] <= 2e8 * 1.001:
            fail("probe via rank 0: %s" % r)
        # A new plan: pushed to both registered ranks.
        r = control_request(d.control, {"op": "job_plan", "id": JOB,
                                        "plan": plan(3, "insufficient"), "admin_token": tok})
        if r.get("applied") is not True:
            fail("job_plan: %s" % r)
        time.sleep(1.0)
        with open(stopf + ".tmp", "w") as f:
            f.write("%d\n" % (job_entry().get("version_max", 0) + 20))
        os.rename(stopf + ".tmp", stopf)
        outs = []
        for rank, w in enumerate(ws):
            try:
                out, _ = w.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()
                fail("rank %d did not stop" % rank)
            print("[rank %d] exit %d:\n%s" % (rank, w.returncode, out.strip()[-1500:]))
            if w.returncode != 0 or "OK" not in out:
                fail("rank %d failed" % rank)
            outs.append(out)
        want = [
            ("job 9 rank 0: plan revision 2: push delta 0.001 (delta_low; link sufficient",
             "parent -1, depth 1, children [1]"),
            ("job 9 rank 1: plan revision 2: push delta 0.001 (delta_low; link sufficient",
             "parent 0, depth 2, children []"),
            ("job 9 rank 0: plan revision 3: push delta 0.001 (delta_low; link sufficient",
             "broadcast delta 0.01 (delta_up), parent -1, depth 1, children [1]"),
            ("job 9 rank 1: plan revision 3: push delta 0.01 (delta_up; link insufficient",
             "broadcast delta 0.01 (delta_up), parent 0, depth 2, children []"),
        ]
        for head, tail in want:
            rank = int(head.split()[3][0])
            lines = [ln for ln in outs[rank].splitlines() if head in ln and tail in ln]
            if not lines:
                fail("rank %d did not log '%s ... %s'" % (rank, head, tail))
        st = d.stats()
        print("probe counters: %s" % st.get("probe"))
    os.unlink(stopf)
    os.rmdir(tmp)
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
