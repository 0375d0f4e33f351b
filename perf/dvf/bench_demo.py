#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The demo with and without DVF: bytes on the wire, time to 85 % test accuracy, and the
sparsity and compression ratio of the pushes and broadcasts over training.

Runs `pbox demo --mode broadcast --json` (3 workers, 3 epochs, deterministic) once per
configuration: dense, DVF at the default thresholds (delta_low), DVF with delta_up as the
numerator throughout (what an insufficient link gives), and the server-optimizer demo
dense and with DVF pushes. While a run trains, its pboxd's counters are read every
--interval seconds (`pbox stats --json` with the demo's admin token, from the
configuration the demo writes in its TMPDIR): per interval, the share of values sent
(1 - sparsity) and dense bytes / wire bytes of the pushes and of the broadcasts.

Time to 85 %: the demo evaluates once per epoch, so it is the training time up to the
end of the first epoch whose test accuracy reaches 85 % (epoch resolution).

Usage: perf/dvf/bench_demo.py --build-dir build [--json out.json] [--plot out.png]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

CONFIGS = [
    ("broadcast dense", ["--mode", "broadcast"]),
    ("broadcast + DVF (delta_low)", ["--mode", "broadcast", "--dvf"]),
    ("broadcast + DVF (delta_up)", ["--mode", "broadcast", "--dvf", "--dvf-low", "8"]),
    ("server-optimizer dense", []),
    ("server-optimizer + DVF pushes", ["--dvf"]),
]


def poll_stats(pbox, tmpdir, interval, stop, samples):
    """Read the demo's pboxd counters every interval seconds until stop is set."""
    ctl = tok = None
    tokfile = os.path.join(tmpdir, "bench-admin-token")
    t0 = time.time()
    while not stop.is_set():
        if ctl is None:
            for conf in glob.glob(os.path.join(tmpdir, "pbox-demo-*", "pboxd.conf")):
                try:
                    text = open(conf).read()
                except OSError:
                    continue
                c = re.search(r'control = "([^"]+)"', text)
                t = re.search(r'admin_token = "([^"]+)"', text)
                if c and t:
                    ctl, tok = c.group(1), t.group(1)
                    with open(tokfile, "w") as f:
                        f.write(tok + "\n")
        if ctl is not None:
            p = subprocess.run([pbox, "stats", "--control", ctl, "--admin-token-file",
                                tokfile, "--json"], capture_output=True, text=True)
            if p.returncode == 0:
                try:
                    tot = json.loads(p.stdout)["totals"]
                    samples.append({"t": time.time() - t0, "dvf": tot.get("dvf"),
                                    "rx_bytes": tot["rx_bytes"], "tx_bytes": tot["tx_bytes"]})
                except (ValueError, KeyError):
                    pass
        stop.wait(interval)


def run(pbox, args, interval):
    with tempfile.TemporaryDirectory(prefix="pbox-bench-dvf-") as tmpdir:
        samples, stop = [], threading.Event()
        th = threading.Thread(target=poll_stats, args=(pbox, tmpdir, interval, stop, samples))
        th.start()
        t0 = time.time()
        p = subprocess.run([pbox, "demo", "--json"] + args, capture_output=True, text=True,
                           env=dict(os.environ, TMPDIR=tmpdir))
        wall = time.time() - t0
        stop.set()
        th.join()
    if p.returncode != 0:
        sys.exit("pbox demo %s failed (%d):\n%s" % (" ".join(args), p.returncode, p.stderr))
    res = json.loads(p.stdout)
    t85, acc = None, 0.0
    for e in res["epochs"]:
        acc += e["train_s"]
        if t85 is None and e["test_acc"] >= 0.85:
            t85 = acc
    series = []
    for a, b in zip(samples, samples[1:]):
        da, db = a["dvf"], b["dvf"]
        row = {"t": b["t"], "wire": (b["rx_bytes"] + b["tx_bytes"]) - (a["rx_bytes"] + a["tx_bytes"])}
        if da is not None and db is not None:
            for side in ("in", "out"):
                dense = db[side + "_dense"] - da[side + "_dense"]
                if dense > 0:
                    row[side + "_sent"] = 4.0 * (db[side + "_vals"] - da[side + "_vals"]) / dense
                    row[side + "_ratio"] = dense / max(1, db[side + "_bytes"] - da[side + "_bytes"])
        series.append(row)
    dvf = res.get("appliance", {}).get("dvf")
    return {
        "args": args, "wall_s": wall, "final_test_acc": res["final_test_acc"],
        "epoch_test_acc": [e["test_acc"] for e in res["epochs"]],
        "train_s": sum(e["train_s"] for e in res["epochs"]), "time_to_85_s": t85,
        "wire_bytes": res["wire_bytes"], "samples_per_s": res["samples_per_s"],
        "replicas_identical": res.get("replicas_identical"), "dvf": dvf, "series": series,
    }


def table(results):
    base = {}
    print("| run | test acc (epochs 1-3) | wire bytes | vs dense | time to 85 % | pushes: "
          "values sent, ratio | broadcasts: values sent, ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results:
        kind = name.split()[0]
        if "dense" in name:
            base[kind] = r["wire_bytes"]
        d = r["dvf"]
        push = bc = "-"
        if d and d["in_dense"]:
            push = "%.1f %%, %.2fx" % (400.0 * d["in_vals"] / d["in_dense"],
                                       d["in_dense"] / d["in_bytes"])
        if d and d["out_dense"]:
            bc = "%.1f %%, %.2fx" % (400.0 * d["out_vals"] / d["out_dense"],
                                     d["out_dense"] / d["out_bytes"])
        print("| %s | %s | %.2f GB | %s | %s | %s | %s |" % (
            name, " / ".join("%.2f" % (100 * a) for a in r["epoch_test_acc"]),
            r["wire_bytes"] / 1e9,
            "%.2fx less" % (base[kind] / r["wire_bytes"]) if kind in base else "-",
            "%.1f s" % r["time_to_85_s"] if r["time_to_85_s"] is not None else "not reached",
            push, bc))


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results:
        s = [x for x in r["series"] if "in_sent" in x]
        if not s:
            continue
        t = [x["t"] for x in s]
        ax[0].plot(t, [1 - x["in_sent"] for x in s], label=name + ": pushes")
        ax[1].plot(t, [x["in_ratio"] for x in s], label=name + ": pushes")
        b = [x for x in s if "out_sent" in x]
        if b:
            ax[0].plot([x["t"] for x in b], [1 - x["out_sent"] for x in b], "--",
                       label=name + ": broadcasts")
            ax[1].plot([x["t"] for x in b], [x["out_ratio"] for x in b], "--",
                       label=name + ": broadcasts")
    ax[0].set_title("sparsity of what DVF sends (per interval)")
    ax[0].set_xlabel("seconds since the demo started")
    ax[0].set_ylabel("sparsity (values kept back)")
    ax[1].set_title("dense bytes / bytes on the wire (per interval)")
    ax[1].set_xlabel("seconds since the demo started")
    ax[1].set_ylabel("compression ratio")
    ax[0].legend(fontsize=7)
    fig.text(0.01, 0.01, "perf/dvf/bench_demo.py; 3 workers, 3 epochs, loopback MTU 65535; "
             "shared 2-vCPU machine", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--only", help="comma-separated indexes of the runs (0-%d)" % (len(CONFIGS) - 1))
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    pbox = os.path.join(a.build_dir, "apps", "pbox")
    which = [int(i) for i in a.only.split(",")] if a.only else range(len(CONFIGS))
    results = []
    for i in which:
        name, args = CONFIGS[i]
        print("running: %s (pbox demo --json %s)" % (name, " ".join(args)), file=sys.stderr)
        results.append((name, run(pbox, args, a.interval)))
    table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "runs": [dict(r, name=n) for n, r in results]}, f, indent=1)
    if a.plot:
        plot(results, a.plot)


if __name__ == "__main__":
    main()
