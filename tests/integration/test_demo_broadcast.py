#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Broadcast-update jobs (Parameter Flow's UCC: every worker keeps the model and runs the
optimizer on the aggregates the appliance sends back), end to end with `pbox demo --mode
broadcast`:

  1. deterministic BSP, 100 steps: every rank's final model has the same CRC32C, and the
     model saved is byte for byte the single-process reference (`pbox train --local`);
     under packet faults (drop, duplicate, reorder; 30 steps) the reference's bytes too;
  2. SSP (staleness 1) with a straggler rank: the run completes and every rank ends with
     the same model (the same aggregates applied in the same order); with --exact-lag
     (every step on exactly W^(t-s)) the run is bit-reproducible: a straggler changes
     the timing, not one bit of the model;
  3. two epochs reach at least 85 % test accuracy on Fashion-MNIST, and the bytes on the
     wire are reported: every step each worker sends its update and receives the
     aggregate;
  4. a broadcast job created at run time (`pbox job create mode=broadcast
     optimizer.name=... sync.model=ssp`) trains two `pbox train` ranks to the same
     model, and `pbox job list` shows its mode."""
import json
import os
import subprocess
import sys
import tempfile
import time

from pboxtest import Pboxd, build_path, fail, run_demo

MODEL_FLOATS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
STEPS = 100
FAULT_STEPS = 30
FAULT = "drop=0.02,dup=0.02,reorder=0.05,seed=5"


def demo(args, timeout=200):
    t0 = time.time()
    p = run_demo(["--json", "--mode", "broadcast"] + args, timeout=timeout)
    sys.stdout.write(p.stderr)
    if p.returncode != 0:
        fail("pbox demo --mode broadcast %s exited with %d:\n%s"
             % (" ".join(args), p.returncode, p.stdout))
    res = json.loads(p.stdout)
    print("demo --mode broadcast %s: %.1f s" % (" ".join(args), time.time() - t0), flush=True)
    if not res["ok"] or res["mode"] != "broadcast":
        fail("unexpected summary: %s" % p.stdout)
    crcs = res["model_crcs"]
    if len(crcs) != res["workers"] or len(set(crcs)) != 1 or not res["replicas_identical"]:
        fail("ranks ended with different models: %s" % crcs)
    return res


def local(steps, path):
    subprocess.run([build_path("apps/pbox"), "train", "--local", "--workers", "3",
                    "--epochs", "1", "--max-steps", str(steps), "--save-model", path],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    with open(path, "rb") as f:
        return f.read()


def runtime_job():
    pbox = build_path("apps/pbox")
    with Pboxd([{"id": 1, "token": "a", "workers": 1}], cores=1) as d:
        tf = os.path.join(d.dir, "admin.token")
        with open(tf, "w") as f:
            f.write(d.admin_token + "\n")
        adm = ["--control", d.control, "--admin-token-file", tf]
        subprocess.run([pbox, "job", "create"] + adm +
                       ["id=7", "token=t7", "workers=2", "mode=broadcast", "reduce=sum",
                        "optimizer.name=momentum", "optimizer.lr=0.05",
                        "optimizer.rescale=0.004166666666666667", "sync.model=ssp",
                        "sync.staleness=1"], check=True, stdout=subprocess.DEVNULL, timeout=30)
        out = subprocess.run([pbox, "job", "list"] + adm, check=True, stdout=subprocess.PIPE,
                             text=True, timeout=30).stdout
        if not any(ln.split()[:1] == ["7"] and "broadcast" in ln.split()
                   for ln in out.splitlines()):
            fail("pbox job list does not show job 7 as a broadcast job:\n" + out)
        env = dict(os.environ, PBOX_TOKEN="t7")
        ranks = [subprocess.Popen([pbox, "train", "--json", "--server", d.control, "--job",
                                   "7", "--rank", str(r), "--workers", "2", "--epochs", "1",
                                   "--max-steps", "30"], stdout=subprocess.PIPE, text=True,
                                  env=env) for r in range(2)]
        crcs = []
        for r, p in enumerate(ranks):
            out, _ = p.communicate(timeout=120)
            done = [json.loads(ln) for ln in out.splitlines() if '"done"' in ln]
            if p.returncode != 0 or not done:
                fail("rank %d of the runtime broadcast job: exit %d\n%s"
                     % (r, p.returncode, out[-2000:]))
            crcs.append(done[-1]["model_crc"])
        if crcs[0] != crcs[1]:
            fail("runtime broadcast job: the ranks' models differ: %s" % crcs)
        print("runtime job (pbox job create mode=broadcast, ssp 1): both ranks hold the "
              "same model (crc32c %08x)" % crcs[0])


def main():
    runtime_job()
    with tempfile.TemporaryDirectory(prefix="pbox-bcast-") as tmp:
        ref, dist, faulty = (os.path.join(tmp, n) for n in ("ref.bin", "dist.bin", "f.bin"))
        local(STEPS, ref)
        clean = demo(["--workers", "3", "--epochs", "1", "--max-steps", str(STEPS),
                      "--save-model", dist])
        with open(ref, "rb") as a, open(dist, "rb") as b:
            da, db = a.read(), b.read()
        if len(da) < 4 * MODEL_FLOATS or da != db:
            fail("broadcast BSP model (%d bytes) differs from the single-process reference "
                 "(%d bytes)" % (len(db), len(da)))
        print("BSP: every rank's model identical (crc32c %08x) and == pbox train --local"
              % clean["model_crcs"][0])

        short = local(FAULT_STEPS, ref)
        lossy = demo(["--workers", "3", "--epochs", "1", "--max-steps", str(FAULT_STEPS),
                      "--save-model", faulty, "--fault", FAULT])
        if lossy["retransmits"] == 0:
            fail("fault injection had no visible effect (no retransmits)")
        with open(faulty, "rb") as b:
            if b.read() != short or short == db:
                fail("broadcast model trained under packet faults differs from the reference")
        print("with faults %s (%d retransmits): bit-identical" % (FAULT, lossy["retransmits"]))

        ssp = demo(["--workers", "3", "--epochs", "1", "--max-steps", "60", "--sync", "ssp",
                    "--staleness", "1", "--slow-rank", "2", "--slow-factor", "2"])
        if ssp["steps"] != 60 or ssp.get("appliance", {}).get("sync") != "ssp":
            fail("the SSP run did not run 60 steps under ssp: %s" % ssp)
        print("SSP(1) with a straggler: every rank's model identical (crc32c %08x)"
              % ssp["model_crcs"][0])

        exact = ["--workers", "3", "--epochs", "1", "--max-steps", "40", "--sync", "ssp",
                 "--staleness", "1", "--exact-lag"]
        a = demo(exact)
        b = demo(exact + ["--slow-rank", "0", "--slow-factor", "3"])
        if a["model_crcs"] != b["model_crcs"]:
            fail("SSP with --exact-lag is not reproducible: %s vs %s (with a straggler)"
                 % (a["model_crcs"], b["model_crcs"]))
        print("SSP(1) --exact-lag: the same model with and without a straggler (crc32c %08x)"
              % a["model_crcs"][0])

    res = demo(["--epochs", "2"], timeout=300)
    acc = res["final_test_acc"]
    print("2 epochs: final test accuracy %.2f%%, %d bytes on the wire"
          % (100 * acc, res["wire_bytes"]))
    if acc < 0.85:
        fail("final test accuracy %.4f is below 0.85" % acc)
    payload = 2 * res["workers"] * res["steps"] * MODEL_FLOATS * 4
    if not payload <= res["wire_bytes"] < 2 * payload:
        fail("%d bytes on the wire for %d bytes of updates and aggregates"
             % (res["wire_bytes"], payload))


if __name__ == "__main__":
    main()
