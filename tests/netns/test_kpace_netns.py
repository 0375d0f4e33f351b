#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Kernel pacing (dataplane/transport/udp/kpace.h) over netlab's tbf-limited veths: a
2-worker lab at 40 Mbit/s worker links, an 80 Mbit/s appliance link, MTU 1500; pboxd and
both pbox-bench-comm workers with PBOX_KPACE=1 (pboxd: PBOX_KPACE_RATE=40 Mbit/s per
worker), 2 timed exchanges of a 1 MB gradient.

  1. The exchanges complete with exact results (pbox-bench-comm checks every element).
  2. pboxd's sockets carry SO_TXTIME with CLOCK_MONOTONIC (getsockopt, in its stats), its
     results got departure times and some of them later than their sending (the timeline
     at the worker rate was ahead: results leave in bursts). (Some are pulled back to the
     5 ms lead: a burst of results longer than that at 40 Mbit/s; the stats are printed.)
  3. Both sides log whether the kernel honours the times: with tbf alone on the egress
     "INACTIVE ... no fq (root qdisc tbf)", with fq under the tbf (netlab host_qdisc
     tbf+fq) "ACTIVE"; where the kernel has no sch_fq the second case is not run (printed).
  4. Without PBOX_KPACE nothing is stamped and the log says "kernel pacing off".
Skips (exit 77) when not root or ip/tc are missing.
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NETLAB = os.path.join(HERE, "..", "..", "perf", "netlab")
sys.path.insert(0, NETLAB)
import netlab  # noqa: E402

CLOCK_MONOTONIC = 1
RATE = 40e6


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def run(build, table, host_qdisc, kpace):
    """One lab, one pbox run; returns (pboxd's kpace stats, pboxd's log, workers' stderr)."""
    import netns  # tests/dpdk/netns.py (netlab puts it on the path)
    env = {"PBOX_KPACE": "1" if kpace else "0", "PBOX_KPACE_RATE": "%d" % RATE,
           "PBOX_PACE": "0"}
    sc = netlab.Scenario.from_dict({
        "workers": 2, "worker_rate": "40mbit", "appliance_rate": "80mbit", "mtu": 1500,
        "model": table, "systems": ["pbox"], "iterations": 2, "warmup": 1,
        "host_qdisc": host_qdisc})
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.environ["PBOX_BUILD_DIR"] = build
    try:
        with netlab.Lab(sc) as lab:
            job = {"id": 1, "token": netlab.TOKEN, "workers": 2, "mode": "aggregate",
                   "reduce": "mean"}
            with netns.Pboxd(lab, "udp", [job], extra_app={"mtu": 1500}) as d:
                worker = os.path.join(build, "perf", "pbox-bench-comm")
                cmds = [[worker, "--server", d.control, "--job", 1, "--token", netlab.TOKEN,
                         "--rank", r, "--model", table, "--iters", 2, "--warmup", 1,
                         "--timeout-ms", 60000, "--json"] for r in range(2)]
                outs = lab.run_ranks(cmds, [{"PBOX_LOG_LEVEL": "info"}] * 2, 90)
                st = d.stats()
                log = d.log()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for r, (rc, out, err) in enumerate(outs):
        if rc != 0:
            fail("%s kpace=%s: rank %d exited %d: %s\npboxd log:\n%s" % (
                host_qdisc, kpace, r, rc, err[-2000:], log[-3000:]))
        res = json.loads(out.strip().splitlines()[-1])
        if len(res["iter_seconds"]) != 2:
            fail("rank %d: %r" % (r, res))
    return st["transport"]["kpace"], log, [e for _, _, e in outs]


def check_on(kp, log, errs, want_fq):
    word = "ACTIVE" if want_fq else "INACTIVE"
    for line in [l for l in log.splitlines() if "kernel pacing" in l][:1] + [
            l for l in errs[0].splitlines() if "kernel pacing" in l][:1]:
        print(line.strip())
    print("pboxd kpace: %r" % kp)
    if not kp["on"] or kp["txtime_clockid"] != CLOCK_MONOTONIC:
        fail("pboxd's sockets: %r (SO_TXTIME with CLOCK_MONOTONIC expected)" % kp)
    if kp["egress_fq"] != (1 if want_fq else 0):
        fail("pboxd's egress check: %r (fq %s)" % (kp, want_fq))
    if kp["stamped"] == 0 or kp["delayed"] == 0:
        fail("pboxd stamped no result later than its sending: %r" % kp)
    if ("kernel pacing %s" % word) not in log:
        fail("pboxd's log does not say 'kernel pacing %s':\n%s" % (word, log[-3000:]))
    if not want_fq and "no fq (root qdisc tbf)" not in log:
        fail("pboxd's log does not name the egress qdisc:\n%s" % log[-3000:])
    for r, e in enumerate(errs):
        if ("kernel pacing %s" % word) not in e or "per socket" not in e:
            fail("rank %d's log does not say 'kernel pacing %s' (per socket):\n%s" % (
                r, word, e[-2000:]))


def main():
    why = netlab.missing()
    if why:
        print("SKIP: " + why)
        return 77
    build = os.path.abspath(os.environ.get("PBOX_BUILD_DIR") or
                            os.path.join(HERE, "..", "..", "build"))
    why = netlab.build_dir_problem(build, ["pbox"])
    if why:
        fail(why)
    with tempfile.TemporaryDirectory(prefix="kpace-test-") as d:
        table = os.path.join(d, "small.txt")
        with open(table, "w") as f:
            f.write("# model small\n# total 262144\na 200000\nb 62144\n")

        kp, log, errs = run(build, table, "tbf", True)
        check_on(kp, log, errs, False)
        print("tbf, kernel pacing on: exact; pboxd %r; logs say INACTIVE (no fq)" % kp)

        kp, log, errs = run(build, table, "tbf", False)
        if kp["on"] or kp["stamped"] != 0 or "kernel pacing off" not in log:
            fail("PBOX_KPACE=0: %r\n%s" % (kp, log[-2000:]))
        print("tbf, kernel pacing off: exact; pboxd %r" % kp)

        try:
            kp, log, errs = run(build, table, "tbf+fq", True)
        except netlab.LabError as e:
            if "no sch_fq" not in str(e):
                raise
            print("tbf+fq not run: %s" % e)
        else:
            check_on(kp, log, errs, True)
            print("tbf+fq, kernel pacing on: exact; pboxd %r; logs say ACTIVE" % kp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
