#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pbox-ctrld's job plans (ctrlplane/ctrld/plan.h) over loopback:
 - --check-config refuses bad plan groups (delta_low above delta_up, a host twice);
 - a job created through pbox-ctrld with a placement carries a plan: a checked tree
   (every rank's chain of parents reaches the root within the depth, degree bound) and
   thresholds, both in pbox-ctrld's job_list and on the pboxd it was published to;
 - a bad placement is refused (EINVAL);
 - when the bandwidth matrix gets a measurement, the plan is recomputed: the measured rank's
   link becomes insufficient (its estimate is below min_rate = 1gbit, the probe cap being
   100mbit), its push and the broadcast select delta_up, the unmeasured rank stays unknown
   with delta_low, and the tree's revision counts up; pbox-ctrld sends the new plan to the
   pboxd (job_plan), whose job_list then shows it and its revision;
 - `pbox job list` shows the plan (tree revision, parents, DVF choices);
 - a plan given by the client is kept as given."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

from pboxtest import Pboxd, _lc_value, build_path, control_request, fail, free_port, \
    print_tail, wait_answering


def write_conf(path, ctrl, pboxds, bw, plan):
    with open(path, "w") as f:
        f.write("ctrld = %s;\npboxds = %s;\nbandwidth = %s;\nplan = %s;\n" % (
            _lc_value(ctrl), _lc_value(pboxds), _lc_value(bw), _lc_value(plan)))


def check_tree(tree, n, degree, depth):
    parent = tree["parent"]
    if len(parent) != n:
        fail("tree of %d ranks: %s" % (n, tree))
    kids = {}
    for r in range(n):
        v, hops = r, 0
        while v != -1 and hops <= depth:
            v = parent[v]
            hops += 1
        if v != -1 or hops > depth:
            fail("rank %d does not reach the root within %d hops: %s" % (r, depth, parent))
        kids[parent[r]] = kids.get(parent[r], 0) + 1
    if max(kids.values()) > degree:
        fail("degree above %d: %s" % (degree, parent))


def job_of(addr, token, jid):
    r = control_request(addr, {"op": "job_list", "admin_token": token})
    for j in r.get("jobs", []):
        if j["id"] == jid:
            return j
    fail("job %d not listed: %s" % (jid, r))


def main():
    ctrld_bin = build_path("ctrlplane/ctrld/pbox-ctrld")
    tmp = tempfile.mkdtemp(prefix="pboxtest-ctrld-plan-")
    token = "plan-secret"
    uport = free_port(socket.SOCK_DGRAM)
    good = "127.0.0.1:%d" % uport
    job = {"id": 7, "token": "p", "workers": 4, "mode": "server-optimizer",
           "optimizer": {"name": "sgd", "lr": 0.5}}
    with Pboxd([], cores=2, memory_budget="256M",
               probe={"port": uport, "address": "127.0.0.1", "max_rate": "200mbit",
                      "max_budget_s": 2}) as d:
        caddr = "127.0.0.1:%d" % free_port(socket.SOCK_STREAM)
        ctrl = {"listen": caddr, "admin_token": token, "request_timeout": 3000,
                "reconcile_interval": 200}
        managed = [{"name": "a", "control": d.control, "admin_token": d.admin_token}]
        bw = {"interval": 0, "cap": "100mbit", "budget": 1,
              "pairs": [{"from": "a", "to": good}]}
        hosts = [{"name": "a", "edge": 0, "agg": 0},
                 {"name": "w0", "addr": good, "edge": 0, "agg": 0},
                 {"name": "w1", "edge": 0, "agg": 0},
                 {"name": "w2", "edge": 1, "agg": 0},
                 {"name": "w3", "edge": 2, "agg": 1}]
        plan = {"degree": 2, "depth": 2, "alpha": 0.1, "min_rate": "1gbit",
                "hysteresis": 0.1, "delta_low": 0.001, "delta_up": 0.01, "hosts": hosts}
        conf = os.path.join(tmp, "ctrld.conf")
        for bad, text in ((dict(plan, delta_low=0.1), "must not exceed delta_up"),
                          (dict(plan, hosts=hosts + [hosts[1]]), "given twice")):
            write_conf(conf, ctrl, managed, bw, bad)
            p = subprocess.run([ctrld_bin, "-c", conf, "--check-config"],
                               capture_output=True, text=True)
            print("--check-config -> %d %s" % (p.returncode, (p.stdout + p.stderr).strip()))
            if p.returncode != 78 or text not in p.stdout + p.stderr:
                fail("--check-config: expected 78 and '%s'" % text)
        write_conf(conf, ctrl, managed, bw, plan)
        log = open(os.path.join(tmp, "ctrld.log"), "w")
        ctrld = subprocess.Popen([ctrld_bin, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_answering(caddr, {"op": "job_list", "admin_token": token}, "pbox-ctrld")
            r = control_request(caddr, {"op": "job_create", "admin_token": token,
                                        "job": dict(job, id=8), "placement": ["w0", "zz"]})
            if r.get("ok") is not False or r.get("errno") != 22:
                fail("a placement naming an unknown host was accepted: %s" % r)
            r = control_request(caddr, {"op": "job_create", "admin_token": token, "job": job,
                                        "placement": ["w0", "w1", "w2", "w3"]})
            if r.get("ok") is not True:
                fail("job_create with a placement: %s" % r)
            j = job_of(caddr, token, 7)
            print("plan at creation: %s" % json.dumps(j.get("plan")))
            p0 = j["plan"]
            check_tree(p0["tree"], 4, 2, 2)
            if p0["tree"]["method"] not in ("exact", "exact-time-limit") or \
                    p0["tree"]["costs"] != "tiers":
                fail("tree at creation: %s" % p0["tree"])
            links = [w["link"] for w in p0["thresholds"]["workers"]]
            if links != ["unknown"] * 4 or p0["thresholds"]["broadcast"]["select"] != \
                    "delta_low":
                fail("thresholds before any probe: %s" % p0["thresholds"])
            pj = control_request(d.control, {"op": "job_list", "admin_token": d.admin_token})
            on_pboxd = [x for x in pj["jobs"] if x["id"] == 7]
            if not on_pboxd or on_pboxd[0].get("plan") != p0:
                fail("the pboxd does not hold the plan: %s" % pj)
            # A measurement: the plan follows.
            r = control_request(caddr, {"op": "bw_probe", "admin_token": token,
                                        "from": "a", "to": good})
            if r.get("ok") is not True:
                fail("bw_probe: %s" % r)
            deadline = time.time() + 20
            while True:
                j = job_of(caddr, token, 7)
                if j["plan"]["thresholds"]["workers"][0]["link"] != "unknown":
                    break
                if time.time() > deadline:
                    fail("the plan did not follow the measurement: %s" % j)
                time.sleep(0.2)
            p1 = j["plan"]
            print("plan after the probe: %s" % json.dumps(p1))
            w = p1["thresholds"]["workers"]
            if w[0]["link"] != "insufficient" or w[0]["push"] != "delta_up" or \
                    not 0 < w[0]["bw_bps"] <= 100e6 * 1.001 or \
                    [x["link"] for x in w[1:]] != ["unknown"] * 3 or \
                    w[1]["push"] != "delta_low" or \
                    p1["thresholds"]["broadcast"]["select"] != "delta_up" or \
                    p1["thresholds"]["broadcast"]["delta"] != 0.01:
                fail("thresholds after the probe: %s" % p1["thresholds"])
            check_tree(p1["tree"], 4, 2, 2)
            if p1["tree"]["revision"] <= p0["tree"]["revision"] or \
                    p1["tree"]["costs"] != "partly-measured+tiers":
                fail("tree after the probe: %s" % p1["tree"])
            # pbox-ctrld sends the new plan to the pboxd (job_plan): it swaps it in.
            deadline = time.time() + 20
            while True:
                pj = control_request(d.control, {"op": "job_list",
                                                 "admin_token": d.admin_token})
                on_pboxd = [x for x in pj["jobs"] if x["id"] == 7]
                if on_pboxd and on_pboxd[0].get("plan") == p1 and \
                        on_pboxd[0].get("plan_revision") == p1["tree"]["revision"]:
                    break
                if time.time() > deadline:
                    fail("the pboxd did not get plan revision %d: %s"
                         % (p1["tree"]["revision"], on_pboxd))
                time.sleep(0.2)
            print("the pboxd holds plan revision %d" % on_pboxd[0]["plan_revision"])
            c = control_request(caddr, {"op": "job_list", "admin_token": token})["control"]
            if c["plans_sent"] < 1 or c["plan_failures"] != 0:
                fail("pbox-ctrld's plan counters: %s" % c)
            r = control_request(caddr, {"op": "job_plan", "admin_token": token, "id": 7,
                                        "plan": p1})
            if r.get("ok") is not False or r.get("errno") != 95:
                fail("pbox-ctrld accepted a job_plan: %s" % r)
            env = dict(os.environ, PBOX_ADMIN_TOKEN=token)
            p = subprocess.run([build_path("apps/pbox"), "job", "list", "--control",
                                caddr], env=env, capture_output=True, text=True, timeout=60)
            print("pbox job list -> %d\n%s" % (p.returncode, p.stdout))
            want = "plan: tree rev %d" % p1["tree"]["revision"]
            if p.returncode != 0 or want not in p.stdout or \
                    "broadcast delta_up; pushes up low low low" not in p.stdout:
                fail("pbox job list does not show the plan")
            # A client's plan is kept as given.
            given = {"tree": {"parent": [-1, -1]}, "thresholds": None}
            r = control_request(caddr, {"op": "job_create", "admin_token": token,
                                        "job": dict(job, id=9, token="q", workers=2),
                                        "plan": given})
            if r.get("ok") is not True or job_of(caddr, token, 9).get("plan") != given:
                fail("a given plan was not kept: %s" % r)
        finally:
            ctrld.terminate()
            rc = ctrld.wait(timeout=30)
            log.close()
            print_tail(os.path.join(tmp, "ctrld.log"), 15, "pbox-ctrld log")
        if rc != 0:
            fail("pbox-ctrld exited %d" % rc)
    shutil.rmtree(tmp, ignore_errors=True)
    print("pbox-ctrld plans: trees, thresholds, recomputation and publication OK")


if __name__ == "__main__":
    main()
