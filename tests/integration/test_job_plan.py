#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd's job_plan (dataplane/pboxd/sessions.h: a job's plan swapped in with RCU):
 - refusals, each answered with its errno and counted (job_plan_refused): no admin token,
   a wrong one, an unknown job (ENOENT), malformed plans (EINVAL: not an object, a member
   other than tree/thresholds, a revision that is not an integer >= 0, no plan at all);
 - a plan that is not newer than the held one is not applied (applied false, the held
   revision in the answer, counted as job_plan_stale) and job_list keeps the held plan;
 - plans are swapped in thousands of times (each revision one newer) while a runtime job
   trains, and the job's model stays exact (pbox-check-worker checks every value);
 - job_list and `pbox job list` show the last plan and its revision."""
import os
import subprocess
import time

from pboxtest import Pboxd, build_path, control_request, fail
from test_runtime_jobs import Admin, finish, worker
import test_runtime_jobs

EACCES, ENOENT, EINVAL = 13, 2, 22
SWAP_SECONDS = 8.0


def plan(rev, delta=0.001):
    return {"tree": {"revision": rev, "parent": [-1, 0]},
            "thresholds": {"broadcast": {"select": "delta_low", "delta": delta}}}


def refused(r, err, words, what):
    print("%s -> %s" % (what, r))
    if r.get("ok") is not False or r.get("errno") != err or \
            any(w not in r.get("error", "") for w in words):
        fail("%s: expected errno %d naming %s, got %s" % (what, err, words, r))


def held(a, jid):
    for j in a.req({"op": "job_list"})["jobs"]:
        if j["id"] == jid:
            return j
    fail("job %d is not listed" % jid)


def main():
    test_runtime_jobs.W = build_path("tests/integration/pbox-check-worker")
    with Pboxd([], cores=2, memory_budget="256M",
               control_socket="/tmp/pboxtest-plan-%d.sock" % time.time_ns()) as d:
        local = Admin(d.appliance["control_socket"])
        spec = {"id": 5, "token": "t5", "workers": 2, "mode": "server-optimizer",
                "optimizer": {"name": "sgd", "lr": 0.5}}
        r = local.req({"op": "job_create", "job": spec, "plan": plan(1)})
        if r != {"ok": True, "id": 5}:
            fail("job_create of job 5 with a plan: %s" % r)
        j = held(local, 5)
        if j.get("plan_revision") != 1 or j.get("plan") != plan(1):
            fail("job 5 does not hold its plan: %s" % j)

        # Refusals.
        refused(control_request(d.control, {"op": "job_plan", "id": 5, "plan": plan(9)}),
                EACCES, ["admin token"], "no token")
        refused(control_request(d.control, {"op": "job_plan", "id": 5, "plan": plan(9),
                                            "admin_token": "nope"}),
                EACCES, ["wrong admin token"], "wrong token")
        refused(local.req({"op": "job_plan", "id": 77, "plan": plan(9)}), ENOENT,
                ["job 77"], "unknown job")
        refused(local.req({"op": "job_plan", "id": 5, "plan": [1]}), EINVAL,
                ["must be an object"], "plan not an object")
        refused(local.req({"op": "job_plan", "id": 5, "plan": {"tree": {}, "x": {}}}),
                EINVAL, ["plan.x"], "unknown plan member")
        refused(local.req({"op": "job_plan", "id": 5,
                           "plan": {"tree": {"revision": -3}}}),
                EINVAL, ["revision"], "negative revision")
        refused(local.req({"op": "job_plan", "id": 5, "plan": {"tree": {"revision": "2"}}}),
                EINVAL, ["revision"], "string revision")
        refused(local.req({"op": "job_plan", "id": 5}), EINVAL, ["job 5", "plan"],
                "no plan")
        refused(local.req({"op": "job_plan", "id": -1, "plan": plan(2)}), EINVAL, ["id"],
                "bad id")
        # Stale: not newer than the held revision 1.
        for rev in (1, 0):
            r = local.req({"op": "job_plan", "id": 5, "plan": plan(rev, delta=0.5)})
            print("stale revision %d -> %s" % (rev, r))
            if r.get("ok") is not True or r.get("applied") is not False or \
                    r.get("revision") != 1 or "not newer" not in r.get("reason", ""):
                fail("a stale plan (revision %d) was not ignored clearly: %s" % (rev, r))
        if held(local, 5).get("plan") != plan(1):
            fail("a stale plan replaced the held one")

        # Swaps while job 5 trains; the model must stay exact.
        ranks = [worker(d, 5, "t5", r, 2, "--server-opt", "--lr", "0.5", "--iters", "1500",
                        keys="5000,300,7") for r in range(2)]
        rev = 1
        t0 = time.time()
        while any(p.poll() is None for p in ranks) and time.time() - t0 < SWAP_SECONDS:
            rev += 1
            r = local.req({"op": "job_plan", "id": 5, "plan": plan(rev, delta=rev * 1e-6)})
            if r != {"ok": True, "id": 5, "applied": True, "revision": rev}:
                fail("swap to revision %d: %s" % (rev, r))
        swaps = rev - 1
        print("%d plan swaps in %.1f s while job 5 trained" % (swaps, time.time() - t0))
        if swaps < 200:
            fail("only %d plan swaps while job 5 trained" % swaps)
        for r, p in enumerate(ranks):
            if finish(p, "job 5 rank %d (under plan swaps)" % r)[0] != 0:
                fail("job 5's model was not exact while its plan was swapped")
        j = held(local, 5)
        if j.get("plan_revision") != rev or j.get("plan") != plan(rev, delta=rev * 1e-6):
            fail("job_list does not show the last plan (revision %d): %s" % (rev, j))
        env = dict(os.environ, PBOX_ADMIN_TOKEN=d.admin_token)
        p = subprocess.run([build_path("apps/pbox"), "job", "list", "--control",
                            d.control], env=env, capture_output=True, text=True, timeout=60)
        print("pbox job list -> %d\n%s" % (p.returncode, p.stdout))
        if p.returncode != 0 or ("plan: tree rev %d" % rev) not in p.stdout:
            fail("pbox job list does not show plan revision %d" % rev)
        ctl = d.stats()["control"]
        print("counters: plans_swapped %d job_plan_stale %d job_plan_refused %d"
              % (ctl["plans_swapped"], ctl["job_plan_stale"], ctl["job_plan_refused"]))
        if ctl["plans_swapped"] != swaps or ctl["job_plan_stale"] != 2 or \
                ctl["job_plan_refused"] != 9:
            fail("job_plan counters: %s" % ctl)
        local.close()
    print("job_plan: refusals, stale revisions and %d RCU plan swaps under training OK"
          % swaps)


if __name__ == "__main__":
    main()
