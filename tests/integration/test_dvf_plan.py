#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The DVF threshold switch follows the control plane's plan on both sides.

Two runtime aggregate jobs with the same dvf group: delta_low 0 (sends every value that
is not zero: sums stay exact) and delta_up 1e30 (sends nothing), link "insufficient" (so
delta_up unless a plan says otherwise). Job 7 is created with a plan whose per-rank links
are sufficient and whose broadcast selects delta_low: the workers (libpbox's push filter,
from their plan slice) and pboxd (the engine's broadcast filter, from the plan in its job
table) must both use delta_low, and pbox-check-worker finds every result exact. Job 8 has
no plan: delta_up everywhere, nothing is sent, and its workers must see wrong results
(the check that the test can tell the two apart). Then job 7 gets a plan selecting
delta_up for the broadcast (job_plan): the appliance stops sending and pboxd's counters
show it."""
import time

from pboxtest import Pboxd, build_path, fail
from test_runtime_jobs import Admin, finish, worker
import test_runtime_jobs

DVF = {"low": 0, "up": 1e30, "link": "insufficient", "codec": "lz4"}


def plan(rev, bcast):
    return {"tree": {"revision": rev, "parent": [-1, -1]},
            "thresholds": {"delta_low": 0.001, "delta_up": 0.01,
                           "broadcast": {"select": bcast,
                                         "delta": 0.001 if bcast == "delta_low" else 0.01},
                           "workers": [{"link": "sufficient"}, {"link": "sufficient"}]}}


def job(jid):
    return {"id": jid, "token": "t%d" % jid, "workers": 2, "mode": "aggregate",
            "reduce": "sum", "dvf": DVF}


def out_vals(d):
    v = d.stats()["totals"]["dvf"]
    return v["out_vals"], v["out_dense"]


def mismatched(d, jid, what):
    """Run a short session of job jid: whether its workers saw results that are not the
    exact sums (a rank stops at its first mismatch; its peer then fails waiting)."""
    ranks = [worker(d, jid, "t%d" % jid, r, 2, "--sum", "--iters", "5", keys="3000,40",
                    timeout_ms=3000) for r in range(2)]
    outs = [finish(p, "job %d rank %d (%s)" % (jid, r, what)) for r, p in enumerate(ranks)]
    return all(rc != 0 for rc, _ in outs) and any("MISMATCH" in out for _, out in outs)


def main():
    test_runtime_jobs.W = build_path("tests/integration/pbox-check-worker")
    with Pboxd([], cores=2, memory_budget="256M",
               control_socket="/tmp/pboxtest-dvfplan-%d.sock" % time.time_ns()) as d:
        local = Admin(d.appliance["control_socket"])
        for jid, extra in ((7, {"plan": plan(1, "delta_low")}), (8, {})):
            r = local.req(dict({"op": "job_create", "job": job(jid)}, **extra))
            if r != {"ok": True, "id": jid}:
                fail("job_create %d: %s" % (jid, r))
        ranks = [worker(d, 7, "t7", r, 2, "--sum", "--iters", "30", keys="3000,40")
                 for r in range(2)]
        for r, p in enumerate(ranks):
            if finish(p, "job 7 rank %d (plan: delta_low)" % r)[0] != 0:
                fail("job 7 under a delta_low plan did not get exact sums")
        sent, dense = out_vals(d)
        print("job 7: %d of %d broadcast values sent" % (sent, dense // 4))
        if sent == 0:
            fail("the appliance sent nothing under a delta_low plan")
        if not mismatched(d, 8, "no plan: delta_up"):
            fail("job 8 without a plan (delta_up = 1e30) got exact sums")
        # A plan selecting delta_up for job 7's broadcasts: pboxd republishes the table.
        r = local.req({"op": "job_plan", "id": 7, "plan": plan(2, "delta_up")})
        if r.get("applied") is not True:
            fail("job_plan: %s" % r)
        before = out_vals(d)
        if not mismatched(d, 7, "plan: delta_up broadcasts"):
            fail("job 7 under a delta_up broadcast plan got exact sums")
        after = out_vals(d)
        print("job 7 under the delta_up plan: %d more values sent for %d more dense bytes"
              % (after[0] - before[0], after[1] - before[1]))
        if after[1] == before[1] or after[0] != before[0]:
            fail("broadcasts under a delta_up plan still sent values: %s -> %s"
                 % (before, after))
        local.close()
    print("dvf plan: workers and pboxd switch delta_low / delta_up by the plan")


if __name__ == "__main__":
    main()
