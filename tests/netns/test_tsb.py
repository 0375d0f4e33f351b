#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""TSB (tree-based streaming broadcast) in network namespaces: an appliance and 6 workers
on perf/netlab's lab (rate-limited links), a server-optimizer job (`pbox train`,
deterministic BSP) with tree = { degree = 2; depth = 3; }: the appliance feeds ranks 0
and 1, which relay to 2, 3 and 4, 5.

  1. A tree run of the training: every rank saves the bit-identical model, equal to the
     single-process reference (`pbox train --local`), which is what the star run gives
     (test_demo_equiv and the demo hold the star to it; `--star` here runs it too).
  2. The tree was used: pboxd says so, and the appliance's link carried much less than
     the results of a star run would need (it sends each result to 2 ranks, not 6).
  3. A relay (rank 1) killed mid-training (on_worker_loss = "continue") while another
     relay's sends (rank 0: its forwards to 2 and 3 and its pushes) lose 3 % (the
     transport's fault injector): the 5 survivors finish and save identical models.
Skips (exit 77) when not root or ip/tc are missing.
"""
import filecmp
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf", "netlab"))
import netlab  # noqa: E402
from pboxtest import fail  # noqa: E402 (netlab puts it on the path)

WORKERS = 6
# At 500 Mbit/s a star step takes >= 90 ms (6 results of 0.94 MB on the appliance link),
# so 30 steps outlast the second pboxd needs to put the tree in use.
STEPS = 30
KILL_STEPS = 100


def f32(x):
    """x as the float32 pboxd will parse (printed with 17 digits)."""
    return float("%.17g" % struct.unpack("f", struct.pack("f", x))[0])


def job(tree, on_loss=None):
    j = {"id": 1, "token": netlab.TOKEN, "workers": WORKERS, "mode": "server-optimizer",
         "deterministic": True,
         # pbox train's defaults: nag, lr 0.05, momentum 0.9, rescale 1 / batch (240)
         "optimizer": {"name": "nag", "lr": f32(0.05), "momentum": f32(0.9),
                       "rescale": f32(1.0 / 240)}}
    if tree:
        j["tree"] = {"degree": 2, "depth": 3}
    if on_loss:
        j["on_worker_loss"] = on_loss
    return j


def train_cmd(pbox, d, r, steps, out):
    return [pbox, "train", "--server", d.control, "--job", 1, "--token", netlab.TOKEN,
            "--rank", r, "--workers", WORKERS, "--max-steps", steps, "--save-model", out,
            "--timeout-ms", 20000]


def run(lab, build, tmp, name, tree, kill=None, fault=None):
    """One training run; returns (models, the appliance link's tx / rx bytes once the tree
    is in use (the whole run without a tree), pboxd log, pboxd's totals)."""
    import netns
    pbox = os.path.join(build, "apps", "pbox")
    models = [os.path.join(tmp, "%s-%d.bin" % (name, r)) for r in range(WORKERS)]
    steps = KILL_STEPS if kill is not None else STEPS
    t0 = time.time()
    c0 = lab.link_counters()
    with netns.Pboxd(lab, "udp", [job(tree, "continue" if kill is not None else None)],
                     cores=1, extra_app={"mtu": 1500, "deterministic": True,
                                         "worker_timeout": 3}) as d:
        procs = []
        for r in range(WORKERS):
            env = {"PBOX_FAULT": fault} if fault and r == 0 else None
            procs.append(lab.popen(lab.worker_ns[r], train_cmd(pbox, d, r, steps, models[r]),
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
        c1 = tsb = None
        if tree:
            # Once the tree is in use (pboxd logs it): the appliance's traffic from now on.
            deadline = time.time() + 30
            while "broadcast tree" not in d.log() and time.time() < deadline:
                time.sleep(0.05)
            if "broadcast tree" not in d.log():
                d.dump_log()
                fail("%s: pboxd never put the tree in use" % name)
            c1 = lab.link_counters()
            tsb = d.stats()["jobs"][0].get("tsb")  # while the session runs
        if kill is not None:
            # Kill the relay mid-training.
            time.sleep(0.3)
            if procs[kill].poll() is not None:
                fail("%s: rank %d finished before it could be killed (raise KILL_STEPS)" %
                     (name, kill))
            procs[kill].send_signal(signal.SIGKILL)
            print("test_tsb: %s: rank %d killed at %.1f s" % (name, kill, time.time() - t0),
                  flush=True)
        outs = []
        for r, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                d.dump_log()
                fail("%s: rank %d did not finish" % (name, r))
            outs.append((p.returncode, err))
        log = d.log()
        st = d.stats()
        totals = st["totals"]
        totals["tsb"] = tsb
    for r, (rc, err) in enumerate(outs):
        if r == kill:
            continue
        if rc != 0:
            sys.stderr.write(err[-3000:])
            sys.stderr.write(log[-3000:])
            fail("%s: rank %d exited with %d" % (name, r, rc))
    app = netlab.counters_delta(c1 or c0, lab.link_counters())["app"]
    tx = app["tx_bytes"] / max(1, app["rx_bytes"])
    print("test_tsb: %s run: %.1f s" % (name, time.time() - t0), flush=True)
    return models, tx, log, totals


def identical(models, what):
    for m in models[1:]:
        if not filecmp.cmp(models[0], m, shallow=False):
            fail("%s: %s differs from %s" % (what, m, models[0]))


def main():
    why = netlab.missing()
    if why:
        print("SKIP: " + why)
        return 77
    build = os.environ.get("PBOX_BUILD_DIR") or os.path.join(HERE, "..", "..", "build")
    sc = netlab.Scenario.from_dict({"workers": WORKERS, "worker_rate": "500mbit",
                                    "appliance_rate": "500mbit", "mtu": 1500})
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="pbox-tsb-") as tmp, netlab.Lab(sc) as lab:
        ref = os.path.join(tmp, "ref.bin")
        r = subprocess.run([os.path.join(build, "apps", "pbox"), "train",
                            "--local", "--workers", str(WORKERS), "--max-steps", str(STEPS),
                            "--save-model", ref], capture_output=True, text=True)
        if r.returncode != 0:
            fail("pbox train --local: %s" % r.stderr)
        if "--star" in sys.argv:
            star, star_ratio, _, _ = run(lab, build, tmp, "star", tree=False)
            identical(star + [ref], "star run and the reference")
            print("appliance link tx / rx: star %.2f" % star_ratio)
        tree, ratio, log, totals = run(lab, build, tmp, "tree", tree=True)
        tsb = totals["tsb"]
        if not (tsb and tsb["live"] and tsb["tree"] == "job"):
            fail("pboxd's stats do not show the tree in use: %s" % tsb)
        print("test_tsb: pboxd's tsb stats: %s" % tsb)
        identical(tree + [ref], "tree run and the reference")
        # The appliance receives 6 pushes per step; it sends the result 6 times in a star
        # (tx / rx about 1), twice down this tree (about 1/3).
        print("appliance link tx / rx with the tree in use: %.2f" % ratio)
        if not ratio < 0.6:
            fail("the appliance sent %.2f bytes per byte received with the tree: not a tree" %
                 ratio)
        kill, _, log, totals = run(lab, build, tmp, "kill", tree=True, kill=1,
                                   fault="drop=0.03,seed=5")
        identical([m for r, m in enumerate(kill) if r != 1], "survivors of the relay kill")
        if "rank 1 was lost" not in log:
            fail("pboxd did not see the relay die")
        # Rank 0's lost forwards were asked for again by 2 and 3 and sent by the appliance.
        if not totals.get("replies_resent", 0) > 0:
            fail("no result was re-sent in the lossy run: %s" % totals)
        print("test_tsb: ok (%.0f s)" % (time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
