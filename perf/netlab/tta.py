#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Time to accuracy of the demo's training (Fashion-MNIST MLP, `pbox train` ranks) on
netlab's rate-limited links, side by side in one run: pbox broadcast-update job (dense
star), + DVF, + DVF + TSB, and Gloo allreduce (gloo_train.py, torch DDP).

pboxd runs in the appliance namespace, one `pbox train --rank r` per worker namespace.
Per epoch: the test accuracy (the ranks' shards added) and the training time (the slowest
rank's train + eval seconds, summed over epochs; process start and data loading not
counted). Bytes on the wire: every byte the namespaces' interfaces sent during the run.

  /usr/bin/python3 perf/netlab/tta.py --workers 3 --worker-rate 100mbit \
      --appliance-rate 200mbit --epochs 2 --json perf/netlab/results/tta.json
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlab  # noqa: E402
from netlab import Lab, Scenario  # noqa: E402

SYSTEMS = ("pbox", "pbox-dvf", "pbox-dvf-tsb", "gloo")


def curve(ranks_epochs, target):
    """ranks_epochs[r] = [epoch events]; return per-epoch rows and the time to target."""
    rows, t, tta = [], 0.0, None
    for e in range(min(len(x) for x in ranks_epochs)):
        evs = [x[e] for x in ranks_epochs]
        t += max(ev["train_s"] + ev["eval_s"] for ev in evs)
        acc = sum(ev["test"]["correct"] for ev in evs) / sum(ev["test"]["samples"] for ev in evs)
        rows.append({"epoch": e + 1, "test_acc": acc, "elapsed_s": t})
        if tta is None and acc >= target:
            tta = t
    return rows, tta


def parse_ranks(outs, what):
    """Every rank's epoch events, and the first failure (or None): a rank that failed
    after some epochs still leaves those epochs' (complete) measurements."""
    eps, why = [], None
    for r, (rc, out, err) in enumerate(outs):
        if rc != 0 and why is None:
            sys.stderr.write(err[-2000:])
            last = err.strip().splitlines()
            why = "%s rank %d exited with %d: %s" % (what, r, rc, last[-1] if last else "")
        evs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        eps.append([e for e in evs if e.get("ev") == "epoch"])
    return eps, why


def run_pbox(lab, sc, a, dvf, tree):
    import netns
    os.environ["PBOX_BUILD_DIR"] = a.build_dir
    job = {"id": 1, "token": netlab.TOKEN, "workers": sc.workers, "mode": "broadcast",
           "reduce": "sum",
           "optimizer": {"name": "nag", "lr": 0.05, "momentum": 0.9, "rescale": 1.0 / a.batch},
           "sync": {"model": "bsp"}}
    if dvf:
        job["dvf"] = {"low": a.dvf_low, "up": a.dvf_up}
    if tree:
        job["tree"] = {"degree": a.tree_degree, "depth": a.tree_depth}
    pbox = os.path.join(a.build_dir, "apps", "pbox")
    c0 = lab.link_counters()
    with netns.Pboxd(lab, "udp", [job], cores=1, extra_app={"mtu": sc.mtu}) as d:
        cmds = [[pbox, "train", "--server", d.control, "--job", 1, "--token", netlab.TOKEN,
                 "--rank", r, "--workers", sc.workers, "--epochs", a.epochs, "--batch",
                 a.batch, "--json", "--timeout-ms", a.op_timeout_ms] for r in range(sc.workers)]
        outs = lab.run_ranks(cmds, [{}] * sc.workers, a.timeout)
        st = d.stats()
    tot = st["totals"]
    res = {"pboxd": {k: tot.get(k) for k in ("busy_pct", "dups", "rx_retransmits",
                                             "replies_resent", "dropped")}}
    if tot.get("dvf"):
        res["dvf"] = tot["dvf"]
    return parse_ranks(outs, "pbox"), c0, res


def run_gloo(lab, sc, a):
    c0 = lab.link_counters()
    script = os.path.join(netlab.HERE, "gloo_train.py")
    cmds = [[netlab.PYTHON, script, "--rank", r, "--world", sc.workers, "--master",
             "%s:%d" % (lab.worker_ip[0], netlab.GLOO_PORT), "--epochs", a.epochs,
             "--batch", a.batch, "--timeout", a.timeout] for r in range(sc.workers)]
    env = {"GLOO_SOCKET_IFNAME": netlab.IFNAME, "OMP_NUM_THREADS": "1"}
    outs = lab.run_ranks(cmds, [env] * sc.workers, a.timeout)
    return parse_ranks(outs, "gloo"), c0, {}


def table(paths):
    """A markdown row per system of each result file (`tta.py --table FILE...`)."""
    print("| system | test accuracy per epoch (s elapsed) | s to target | MB on the wire "
          "(appliance sent) | tbf drops | status |")
    print("|---|---|---|---|---|---|")
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        for name, r in d["systems"].items():
            if "epochs" not in r:
                print("| %s | | | | | %s |" % (name, r.get("error")))
                continue
            print("| %s | %s | %s | %.0f (%.0f) | %d | %s |" % (
                name, ", ".join("%.2f %% (%.1f)" % (100 * x["test_acc"], x["elapsed_s"])
                                for x in r["epochs"]),
                "%.1f" % r["tta_s"] if r["tta_s"] else "not reached",
                r["wire_tx_bytes"] / 1e6, r["app_tx_bytes"] / 1e6, r["tbf_drops"],
                "ok" if r["status"] == "ok" else "failed: " + r["error"][:120]))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        table(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--worker-rate", default="100mbit")
    ap.add_argument("--appliance-rate", default="200mbit")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=240)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--system", default=",".join(SYSTEMS))
    ap.add_argument("--tree-degree", type=int, default=1)
    ap.add_argument("--tree-depth", type=int, default=3)
    ap.add_argument("--dvf-low", type=float, default=2.0)
    ap.add_argument("--dvf-up", type=float, default=8.0)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--op-timeout-ms", type=int, default=20000,
                    help="pbox train --timeout-ms: a stuck operation fails the rank")
    ap.add_argument("--build-dir", default=os.path.join(netlab.ROOT, "build"))
    ap.add_argument("--json")
    a = ap.parse_args()
    a.build_dir = os.path.abspath(a.build_dir)
    sc = Scenario.from_dict({"workers": a.workers, "worker_rate": a.worker_rate,
                             "appliance_rate": a.appliance_rate, "mtu": a.mtu})
    out = {"scenario": vars(a), "load_before": os.getloadavg(), "systems": {}}
    with Lab(sc) as lab:
        for system in a.system.split(","):
            t0 = time.time()
            try:
                if system == "gloo":
                    (eps, why), c0, extra = run_gloo(lab, sc, a)
                else:
                    (eps, why), c0, extra = run_pbox(lab, sc, a, "-dvf" in system,
                                                     system.endswith("-tsb"))
            except (netlab.LabError, SystemExit) as e:
                out["systems"][system] = {"status": "failed", "error": str(e)}
                print("%s: failed: %s" % (system, e), flush=True)
                continue
            links = netlab.counters_delta(c0, lab.link_counters())
            rows, tta = curve(eps, a.target)
            r = {"status": "failed" if why else "ok", "error": why, "epochs": rows, "tta_s": tta, "wall_s": time.time() - t0,
                 "wire_tx_bytes": sum(c["tx_bytes"] for c in links.values()),
                 "app_tx_bytes": links["app"]["tx_bytes"],
                 "tbf_drops": sum(c["tbf_drops_host"] + c["tbf_drops_switch"]
                                  for c in links.values()),
                 "links": links, **extra}
            out["systems"][system] = r
            print("%s%s: %s; to %.0f%%: %s; %.1f MB on the wire (appliance sent %.1f MB)" % (
                system, " (FAILED: %s)" % why if why else "", ", ".join("epoch %d %.2f%% at %.1f s" % (
                    x["epoch"], 100 * x["test_acc"], x["elapsed_s"]) for x in rows),
                100 * a.target, "%.1f s" % tta if tta else "not reached",
                r["wire_tx_bytes"] / 1e6, r["app_tx_bytes"] / 1e6), flush=True)
    out["load_after"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
