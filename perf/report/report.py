#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/report: run pbox's benchmarks (or read what they wrote) and write a report with
PNG plots: report.md and report.html in --out, one PNG per plot, and data/ with the raw
outputs and manifest.json (which command made each file, when, on which machine).

Plots (each carries the machine, the date and the command that produced its data, in
the image and in the PNG's text chunks Machine / Date / Command):
  sweep    chunk-size sweep: exchanges/s per worker vs chunk_bytes, per send window
           (perf/bench_comm.py --parts sweep --json)
  kernels  aggregation kernels' bandwidth at an in-cache and a DRAM size, against
           memcpy at the same sizes, the memory limit (build/perf/pbox-bench-kernels)
  comm     communication only: exchanges/s per worker vs workers for pbox
           (bench_comm.py --parts main), with Gloo and the pbox DDP hook on the same
           machine where perf/torch/bench_ddp.py results exist
  netlab   pbox vs Gloo in perf/netlab's rate-limited namespaces: exchanges/s per
           scenario against the link-rate bound (perf/netlab/results/*.json)
  sync     synchronisation models with a slowed worker: steps/s and accuracy
           (perf/sync/bench_sync.py --only sync)
  dvf      DVF traffic: wire bytes per dense byte and filter+encode+compress GB/s vs
           sparsity, per codec (build/perf/dvf/pbox-bench-dvf --json FILE.jsonl)
  slops    SLoPS probing accuracy: the estimated range [r_min, r_max] against the true
           available bandwidth, and the time per estimate (perf/slops/bench_slops.py
           --json; root and namespaces, so read from perf/slops/results like netlab)

  /usr/bin/python3 perf/report/report.py --build-dir build --out report       # run, ~6 min
  /usr/bin/python3 perf/report/report.py --build-dir build --quick --out report  # ~1 min
  /usr/bin/python3 perf/report/report.py --from report/data --out report2   # re-plot
--from DIR reads DIR/manifest.json if there is one; otherwise every *.json, *.txt and
*.md file in DIR is classified by its content, and its provenance is what the file
itself says (netlab records the CPUs and load) plus its modification time.
"""
import argparse
import datetime
import glob
import html
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PERF = os.path.dirname(HERE)
ROOT = os.path.dirname(PERF)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = ("sweep", "kernels", "comm", "netlab", "sync", "dvf", "slops")
FIG_SIZE = (9.0, 5.4)  # inches; at DPI 120: 1080 x 648 pixels
DPI = 120


class ReportError(Exception):
    pass


# ---- provenance -------------------------------------------------------------------------

def this_machine():
    """One line: host, CPU model and count, kernel, load average."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s: %s, %d CPUs, Linux %s, load %.1f" % (
        socket.gethostname(), model or platform.processor() or "unknown CPU",
        os.cpu_count() or 0, platform.release(), os.getloadavg()[0])


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def file_date(path):
    """When a file's data was made, as well as we can tell: the commit that last changed
    it when it is in git (a checkout's file times are the checkout's), else its mtime."""
    try:
        p = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(path)), "log", "-1",
                            "--format=%ct", "--", os.path.basename(path)],
                           capture_output=True, text=True, timeout=10)
        if p.returncode == 0 and p.stdout.strip():
            t = datetime.datetime.fromtimestamp(int(p.stdout), datetime.timezone.utc)
            return t.strftime("%Y-%m-%d %H:%M UTC") + " (committed)"
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    t = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M UTC") + " (file time)"


class Source:
    """A data file and where it came from."""

    def __init__(self, kind, path, command, date, machine):
        self.kind, self.path = kind, path
        self.command, self.date, self.machine = command, date, machine

    def as_dict(self):
        return {"kind": self.kind, "file": os.path.basename(self.path),
                "command": self.command, "date": self.date, "machine": self.machine}


# ---- reading the benchmarks' outputs -----------------------------------------------------

def classify(path):
    """The kind of a benchmark output file from its content, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    if path.endswith(".jsonl"):
        try:
            recs = [json.loads(l) for l in text.splitlines() if l.strip()]
        except ValueError:
            return None
        if recs and all(isinstance(r, dict) and "codec" in r and "enc_gbs" in r
                        and "ratio" in r for r in recs):
            return "dvf"
        return None
    if path.endswith(".json"):
        try:
            d = json.loads(text)
        except ValueError:
            return None
        recs = d if isinstance(d, list) else [d]
        if recs and all(isinstance(r, dict) and "scenario" in r and "systems" in r
                        for r in recs):
            return "netlab"
        if recs and all(isinstance(r, dict) and "chunk_bytes" in r and "model" in r
                        and "workers" in r for r in recs):
            return "comm"
        if isinstance(d, dict) and "comm" in d and "world_size" in d:
            return "torch"
        if isinstance(d, dict) and isinstance(d.get("runs"), list) and d["runs"] and \
                all(isinstance(r, dict) and "r_min_bps" in r and "r_max_bps" in r
                    for r in d["runs"]):
            return "slops"
        return None
    if "buffers of" in text and "calls/rep" in text:
        return "kernels"
    if re.search(r"^\| model \| steps/s", text, re.M):
        return "sync"
    return None


def parse_size(s):
    m = re.match(r"^\s*([\d.]+)\s*([KMG]?)B?\s*$", s)
    if not m:
        raise ValueError("not a size: %r" % s)
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])


def fmt_size(n):
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= mult:
            v = n / mult
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % n


def read_kernels(path):
    """pbox-bench-kernels' text: {size_bytes: {operation: best GB/s}}."""
    sizes, cur = {}, None
    with open(path) as f:
        for line in f:
            m = re.match(r"^buffers of (\S+ \S+) \(n = \d+ floats\)", line)
            if m:
                cur = sizes.setdefault(parse_size(m.group(1).replace(" ", "")), {})
                continue
            m = re.match(r"^  (\S+(?: \S+)?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
            if m and cur is not None:
                cur[m.group(1)] = float(m.group(3))
    if not sizes or not all(sizes.values()):
        raise ReportError("%s: no 'buffers of ...' tables of pbox-bench-kernels" % path)
    return sizes


def read_sync(path):
    """bench_sync.py's markdown: [{model, steps_s, samples_s, acc, held, vs_bsp}]."""
    rows = []
    with open(path) as f:
        lines = f.read().splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("| model | steps/s"))
    except StopIteration:
        raise ReportError("%s: no '| model | steps/s |' table of bench_sync.py" % path)
    for l in lines[start + 2:]:
        if not l.startswith("|"):
            break
        c = [x.strip() for x in l.strip("|").split("|")]
        rows.append({"model": c[0], "steps_s": float(c[1]), "samples_s": float(c[2]),
                     "acc": float(c[3].rstrip("%")), "held": int(c[4]),
                     "vs_bsp": float(c[5].rstrip("x"))})
    if not rows:
        raise ReportError("%s: the sync table is empty" % path)
    return rows


def load_json(path):
    with open(path) as f:
        d = json.load(f)
    return d if isinstance(d, list) else [d]


# ---- plots ------------------------------------------------------------------------------

def stamp(fig, sources):
    """Machine, date and command on the figure (footer) and in its PNG metadata."""
    srcs = sources if isinstance(sources, list) else [sources]
    machines = sorted({s.machine for s in srcs})
    dates = sorted({s.date for s in srcs})
    commands = [s.command for s in srcs]
    lines = ["machine: " + "; ".join(machines), "date: " + "; ".join(dates)]
    lines += ["command: " + c for c in commands]
    width = int(fig.get_figwidth() * 17)  # characters of 6.5 pt monospace per line
    lines = [w for l in lines for w in textwrap.wrap(l, width, subsequent_indent="  ")]
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6.5, family="monospace",
             va="bottom", ha="left", color="#444444")
    footer = (len(lines) * 6.5 * 1.25 + 10) / 72 / fig.get_figheight()
    fig.tight_layout(rect=(0, footer, 1, 1))
    fig.pbox_metadata = {"Machine": "; ".join(machines), "Date": "; ".join(dates),
                         "Command": " ;; ".join(commands),
                         "Software": "pbox perf/report (matplotlib %s)" % matplotlib.__version__}
    return fig


def labelled(ax, title, xlabel, ylabel):
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def window_label(rec):
    mi = rec.get("max_inflight") or 0
    if not mi:
        return "libpbox's default window (chunks)"
    return "about %s in flight" % fmt_size(mi * rec["chunk_bytes"])


def sweep_groups(recs):
    """Records of the chunk-size sweep: runs that differ only in chunk size (and the
    window, which follows it), keyed by (model, workers, mtu, window label)."""
    groups = {}
    for r in recs:
        if "error" in r or "xps_worker" not in r:
            continue
        key = (r["model"], r["workers"], r["mtu"], window_label(r))
        groups.setdefault(key, []).append(r)
    return {k: sorted(v, key=lambda r: r["chunk_bytes"]) for k, v in groups.items()
            if len({r["chunk_bytes"] for r in v}) >= 3}


def plot_sweep(recs, source):
    groups = sweep_groups(recs)
    if not groups:
        raise ReportError("no chunk-size sweep in %s (bench_comm.py --parts sweep)" % source.path)
    fig, ax = plt.subplots(figsize=FIG_SIZE)
    for (model, workers, mtu, win), rs in sorted(groups.items()):
        ax.plot([r["chunk_bytes"] for r in rs], [r["xps_worker"] for r in rs], marker="o",
                label="%s, %d workers, MTU %d, %s" % (model, workers, mtu, win))
    ax.set_xscale("log", base=2)
    ticks = sorted({r["chunk_bytes"] for rs in groups.values() for r in rs})
    ax.set_xticks(ticks)
    ax.set_xticklabels([fmt_size(t) for t in ticks], rotation=45, fontsize=8)
    ax.set_ylim(bottom=0)
    labelled(ax, "Chunk-size sweep: full-model exchanges per second per worker",
             "chunk_bytes (appliance)", "exchanges/s per worker")
    ax.legend(fontsize=8)
    return stamp(fig, source)


def plot_kernels(sizes, source):
    ops = [op for op in next(iter(sizes.values())) if not op.startswith("copy-")]
    small, large = min(sizes), max(sizes)
    fig, ax = plt.subplots(figsize=FIG_SIZE)
    x = range(len(ops))
    w = 0.4
    ax.bar([i - w / 2 for i in x], [sizes[small].get(op, 0) for op in ops], w,
           label="%s buffers (in cache)" % fmt_size(small))
    ax.bar([i + w / 2 for i in x], [sizes[large].get(op, 0) for op in ops], w,
           label="%s buffers (DRAM)" % fmt_size(large))
    for size, style, what in ((large, "--", "the memory limit"), (small, ":", "in cache")):
        if "memcpy" in sizes[size]:
            ax.axhline(sizes[size]["memcpy"], ls=style, color="k", lw=1,
                       label="memcpy at %s: %s" % (fmt_size(size), what))
    ax.set_xticks(list(x))
    ax.set_xticklabels(ops, rotation=45, ha="right", fontsize=8)
    labelled(ax, "Aggregation kernels vs memcpy (best of the repetitions)",
             "kernel and ISA", "GB/s (bytes read + written)")
    ax.legend(fontsize=8)
    return stamp(fig, source)


def plot_comm(recs, source, torch=None, torch_source=None):
    main = {}
    for r in recs:
        if "error" in r or "xps_worker" not in r or r.get("max_inflight"):
            continue
        main.setdefault((r["model"], r["chunk_bytes"], r["mtu"]), {})[r["workers"]] = r
    main = {k: v for k, v in main.items() if len(v) >= 2}
    if not main:
        raise ReportError("no comm-only runs with 2 or more worker counts in %s "
                          "(bench_comm.py --parts main)" % source.path)
    fig, ax = plt.subplots(figsize=FIG_SIZE)
    colors = {}
    for (model, chunk, mtu), byn in sorted(main.items()):
        ns = sorted(byn)
        line = ax.plot(ns, [byn[n]["xps_worker"] for n in ns], marker="o",
                       label="pbox (bench_comm), %s, chunk %s, MTU %d" % (model, fmt_size(chunk), mtu))
        colors[model] = line[0].get_color()
    sources = [source]
    if torch:
        for model, d in sorted(torch[0].get("comm", {}).items()):
            n = torch[0]["world_size"]
            c = colors.get(model)
            if "gloo_ms" in d:
                ax.scatter([n], [1000.0 / d["gloo_ms"]], marker="s", s=60, color=c,
                           edgecolors="k", label="Gloo allreduce (bench_ddp), %s" % model)
            if "pbox_ms" in d:
                ax.scatter([n], [1000.0 / d["pbox_ms"]], marker="^", s=60, color=c,
                           edgecolors="k", label="pbox DDP hook (bench_ddp), %s" % model)
        sources.append(torch_source)
    ax.set_xticks(sorted({n for v in main.values() for n in v}))
    ax.set_ylim(bottom=0)
    labelled(ax, "Communication only on this machine: exchanges/s per worker vs workers",
             "workers", "full-model exchanges/s per worker")
    ax.legend(fontsize=7)
    return stamp(fig, sources)


def netlab_label(r):
    sc = r["scenario"]
    parts = ["%d x %s" % (sc["workers"], sc["worker_rate"]), "MTU %d" % sc["mtu"]]
    if sc.get("loss"):
        parts.append("loss %g" % sc["loss"])
    if sc.get("max_inflight"):
        parts.append("window %d" % sc["max_inflight"])
    return ", ".join(parts)


def plot_netlab(recs, sources):
    rows = []
    for r in recs:
        pb = r["systems"].get("pbox", {})
        gl = r["systems"].get("gloo", {})
        pb_x = 1.0 / pb["median_s"] if pb.get("status") == "ok" and pb.get("median_s") else None
        gl_x = 1.0 / gl["median_s"] if gl.get("status") == "ok" and gl.get("median_s") else None
        bound = r.get("bounds", {}).get("pbox_bound_s")
        if pb_x is None and gl_x is None:
            continue
        rows.append((netlab_label(r), pb_x, gl_x, 1.0 / bound if bound else None))
    if not rows:
        raise ReportError("no completed netlab runs")
    fig, ax = plt.subplots(figsize=(max(FIG_SIZE[0], 0.8 * len(rows) + 3), FIG_SIZE[1]))
    x = range(len(rows))
    w = 0.38
    ax.bar([i - w / 2 for i in x], [r[1] or 0 for r in rows], w, label="pbox")
    ax.bar([i + w / 2 for i in x], [r[2] or 0 for r in rows], w, label="Gloo (ring allreduce)")
    bx = [i for i, r in enumerate(rows) if r[3]]
    ax.scatter(bx, [rows[i][3] for i in bx], marker="_", s=600, color="k", zorder=3,
               label="link-rate bound (pbox)")
    # Unlimited links are ~50x faster than 100 Mbit/s ones: a log axis shows both.
    ax.set_yscale("log")
    for i, r in enumerate(rows):
        if r[2] is None:
            ax.text(i + w / 2, 0.02, "no run", rotation=90, fontsize=7, ha="center",
                    va="bottom", transform=ax.get_xaxis_transform())
    ax.set_xticks(list(x))
    ax.set_xticklabels([r[0] for r in rows], rotation=40, ha="right", fontsize=7)
    vals = [v for r in rows for v in r[1:] if v]
    ax.set_ylim(min(vals) / 2, max(vals) * 3)
    labelled(ax, "perf/netlab: exchanges per second (ResNet-50 gradient, median)",
             "scenario (workers x link rate, MTU, loss, window)", "exchanges/s (log scale)")
    ax.legend(fontsize=8, loc="upper left")
    return stamp(fig, sources)


def plot_sync(rows, source):
    fig, ax = plt.subplots(figsize=FIG_SIZE)
    x = range(len(rows))
    bars = ax.bar(list(x), [r["steps_s"] for r in rows], color="#4c72b0")
    for b, r in zip(bars, rows):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                "%.2fx\n%.1f%%" % (r["vs_bsp"], r["acc"]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x))
    ax.set_xticklabels([r["model"] for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, max(r["steps_s"] for r in rows) * 1.2)
    labelled(ax, "Synchronisation models, one worker slowed 2x (labels: vs BSP, test accuracy)",
             "synchronisation model", "training steps per second")
    return stamp(fig, source)


def read_dvf(path):
    """pbox-bench-dvf --json rows (one JSON object per line)."""
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    if not rows:
        raise ReportError("%s: no pbox-bench-dvf rows" % path)
    return rows


def dvf_input_label(name):
    return name.split(" (")[0].split(",")[0] if name else "?"


def plot_dvf(rows, source):
    fig, (ax_t, ax_g) = plt.subplots(1, 2, figsize=(FIG_SIZE[0] * 1.3, FIG_SIZE[1]))
    inputs = sorted({r["input"] for r in rows})
    styles = ["-", "--", ":", "-."]
    colours = {}
    for i, inp in enumerate(inputs):
        for codec in sorted({r["codec"] for r in rows if r["input"] == inp}):
            rs = sorted((r for r in rows if r["input"] == inp and r["codec"] == codec),
                        key=lambda r: r["sparsity"])
            c = colours.setdefault(codec, "C%d" % (len(colours) % 10))
            label = codec if len(inputs) == 1 else "%s, %s" % (codec, dvf_input_label(inp))
            x = [100 * r["sparsity"] for r in rs]
            ax_t.plot(x, [100.0 / r["ratio"] for r in rs], marker="o", color=c,
                      linestyle=styles[i % len(styles)], label=label)
            ax_g.plot(x, [r["enc_gbs"] for r in rs], marker="o", color=c,
                      linestyle=styles[i % len(styles)], label=label)
    snap = sorted({(r["input"], r["snappy_enc_gbs"]) for r in rows})
    for i, (inp, gbs) in enumerate(snap):
        ax_g.axhline(gbs, color="k", linestyle=styles[i % len(styles)], linewidth=0.8,
                     label="snappy alone, unfiltered" +
                     ("" if len(inputs) == 1 else " (%s)" % dvf_input_label(inp)))
    ax_t.set_yscale("log")
    labelled(ax_t, "DVF traffic: bytes on the wire per dense byte",
             "sparsity (share of |U| below delta, %)", "wire / dense bytes (%, log scale)")
    labelled(ax_g, "DVF filter+encode+compress, one core",
             "sparsity (share of |U| below delta, %)", "GB/s of dense input")
    ax_t.legend(fontsize=7, ncol=2)
    ax_g.legend(fontsize=7, ncol=2)
    fig.suptitle("inputs: " + "; ".join(inputs), fontsize=8)
    return stamp(fig, source)


def slops_runs(sources):
    """(cross, true Mbit/s, r_min, r_max, seconds, in_range, sender_limited) of runs whose
    true available bandwidth is known (rate 'max' runs have none), from every SLoPS file."""
    out = []
    for s in sources:
        with open(s.path) as f:
            d = json.load(f)
        for r in d["runs"]:
            if r.get("true_bps") and r.get("r_min_bps") is not None:
                out.append((r["cross"], r["true_bps"] / 1e6, r["r_min_bps"] / 1e6,
                            r["r_max_bps"] / 1e6, r.get("duration_s") or r.get("wall_s"),
                            r["r_min_bps"] <= r["true_bps"] <= r["r_max_bps"],
                            "sender_limited" in (r.get("flags") or "")))
    if not out:
        raise ReportError("no SLoPS run with a known available bandwidth")
    return out


def plot_slops(sources):
    runs = slops_runs(sources)
    fig, (ax_a, ax_t) = plt.subplots(1, 2, figsize=(FIG_SIZE[0] * 1.3, FIG_SIZE[1]))
    markers = {"none": "o", "udp": "s", "tcp": "^"}
    for i, cross in enumerate(sorted({r[0] for r in runs})):
        rs = [r for r in runs if r[0] == cross]
        c = "C%d" % i
        # Hollow: the prober reported sender_limited (it could not send faster; the
        # range is then a lower bound of what the path carries).
        for limited in (False, True):
            sub = [r for r in rs if r[6] == limited]
            if not sub:
                continue
            mid = [(r[2] + r[3]) / 2 for r in sub]
            ax_a.errorbar([r[1] for r in sub], mid,
                          yerr=[[m - r[2] for m, r in zip(mid, sub)],
                                [r[3] - m for m, r in zip(mid, sub)]],
                          fmt=markers.get(cross, "D"), color=c, capsize=3, markersize=5,
                          mfc="none" if limited else c, linestyle="none",
                          label=("cross traffic: %s (%d of %d ranges hold the true value)" %
                                 (cross, sum(r[5] for r in rs), len(rs))) if not limited
                          else "%s, sender_limited (hollow)" % cross)
        ax_t.scatter([r[1] for r in rs], [r[4] for r in rs], marker=markers.get(cross, "D"),
                     color=c, label="cross traffic: %s" % cross)
    lo = min(min(r[1], r[2]) for r in runs) / 1.5
    hi = max(max(r[1], r[3]) for r in runs) * 1.5
    ax_a.plot([lo, hi], [lo, hi], color="k", linewidth=0.8, label="estimate = true")
    for ax in (ax_a, ax_t):
        ax.set_xscale("log")
    ax_a.set_yscale("log")
    ax_a.set_xlim(lo, hi)
    ax_a.set_ylim(lo, hi)
    ax_t.set_ylim(0, max(r[4] for r in runs) * 1.15)
    labelled(ax_a, "SLoPS estimate range vs true available bandwidth",
             "true available bandwidth (Mbit/s, log scale)",
             "estimated range [r_min, r_max] (Mbit/s, log scale)")
    labelled(ax_t, "SLoPS time per estimate", "true available bandwidth (Mbit/s, log scale)",
             "seconds per estimate")
    ax_a.legend(fontsize=7, loc="upper left")
    ax_t.legend(fontsize=7)
    return stamp(fig, sources)


def save(fig, path):
    meta = dict(getattr(fig, "pbox_metadata", {}))
    meta["Title"] = fig.axes[0].get_title() if fig.axes else ""
    fig.savefig(path, dpi=DPI, metadata=meta)
    plt.close(fig)


# ---- running the benchmarks ---------------------------------------------------------------

def run_benchmarks(args, data):
    """Run what --only asks for into data/; returns [Source]."""
    build = os.path.abspath(args.build_dir)
    py = "/usr/bin/python3"
    machine = this_machine()
    out = []
    if "kernels" in args.only:
        cmd = [os.path.join(build, "perf", "pbox-bench-kernels")]
        if args.quick:
            cmd += ["--reps", "3", "--large", "64M"]
        out.append(run_one("kernels", cmd, os.path.join(data, "kernels.txt"), machine))
    if "sweep" in args.only or "comm" in args.only:
        parts = ",".join(p for p, k in (("main", "comm"), ("sweep", "sweep")) if k in args.only)
        cmd = [py, os.path.join(PERF, "bench_comm.py"), "--build-dir", build, "--parts", parts,
               "--json", os.path.join(data, "comm.json")]
        if args.quick:
            cmd += ["--models", "resnet50", "--workers", "2,3", "--seconds", "1",
                    "--sweep-seconds", "1", "--sweep-chunks", "8K,32K,128K,512K,2M",
                    "--windows", "4M"]
        s = run_one("comm", cmd, os.path.join(data, "comm.log"), machine)
        s.path = os.path.join(data, "comm.json")
        out.append(s)
    if "sync" in args.only:
        cmd = [py, os.path.join(PERF, "sync", "bench_sync.py"), "--build-dir", build,
               "--only", "sync", "--epochs", "1" if args.quick else "3"]
        out.append(run_one("sync", cmd, os.path.join(data, "sync.md"), machine))
    if "dvf" in args.only:
        jpath = os.path.join(data, "dvf.jsonl")
        cmd = [os.path.join(build, "perf", "dvf", "pbox-bench-dvf"), "--json", jpath]
        cmd += ["--seconds", "0.05"] if args.quick else ["--repeat", "3", "--seconds", "0.2"]
        s = run_one("dvf", cmd, os.path.join(data, "dvf.md"), machine)
        s.path = jpath
        out.append(s)
    return out


def run_one(kind, cmd, path, machine):
    date = now()
    print("report: running %s" % " ".join(shlex.quote(c) for c in cmd), flush=True)
    t0 = time.time()
    with open(path, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise ReportError("%s failed (exit %d): %s" % (cmd[0], p.returncode, p.stderr[-1500:]))
    print("report: %s done in %.0f s" % (kind, time.time() - t0), flush=True)
    return Source(kind, path, " ".join(shlex.quote(c) for c in cmd), date, machine)


def read_dir(d):
    """Sources of a --from directory: its manifest, else files classified by content."""
    man = os.path.join(d, "manifest.json")
    if os.path.exists(man):
        with open(man) as f:
            m = json.load(f)
        return [Source(e["kind"], os.path.join(d, e["file"]), e["command"], e["date"],
                       e["machine"]) for e in m["sources"]]
    out = []
    for path in sorted(glob.glob(os.path.join(d, "*"))):
        kind = classify(path)
        if kind is not None:
            out.append(describe(path, kind))
    return out


def describe(path, kind, origin=None):
    """A Source for a file whose command was not recorded: the usual command of its
    kind, the file's time, and what the file says of the machine (netlab: CPUs, load)."""
    origin = origin or path
    machine = "unknown (not recorded in %s)" % os.path.basename(origin)
    if kind == "slops":
        with open(path) as f:
            d = json.load(f)
        if d.get("nproc"):
            machine = "%s CPUs, load %s (from the file)" % (
                d["nproc"], "/".join("%.1f" % x for x in d.get("loadavg") or []) or "?")
        date = file_date(origin)
        ts = [r["timestamp_ns"] for r in d["runs"] if r.get("timestamp_ns")]
        if ts:
            t = datetime.datetime.fromtimestamp(min(ts) / 1e9, datetime.timezone.utc)
            date = t.strftime("%Y-%m-%d %H:%M UTC") + " (from the file)"
        if d.get("command"):
            shown = os.path.relpath(origin, ROOT) if origin.startswith(ROOT + os.sep) \
                else origin
            return Source(kind, path, "/usr/bin/python3 %s  [read from %s]" %
                          (d["command"], shown), date, machine)
    if kind == "netlab":
        hosts = [r.get("host") or {} for r in load_json(path)]
        if hosts and hosts[0]:
            machine = "%s CPUs, load %.1f-%.1f (from the file)" % (
                hosts[0].get("cpus", "?"), min(h.get("load_before", 0) for h in hosts),
                max(h.get("load_after", 0) for h in hosts))
    shown = os.path.relpath(origin, ROOT) if origin.startswith(ROOT + os.sep) else origin
    return Source(kind, path, "%s  [read from %s]" % (KNOWN_COMMANDS[kind], shown),
                  file_date(origin), machine)


KNOWN_COMMANDS = {
    "comm": "/usr/bin/python3 perf/bench_comm.py --build-dir build --json FILE",
    "kernels": "build/perf/pbox-bench-kernels",
    "netlab": "/usr/bin/python3 perf/netlab/netlab.py run --scenario ... --json FILE",
    "torch": "PBOX_BUILD_DIR=build /usr/bin/python3 perf/torch/bench_ddp.py --out FILE",
    "sync": "/usr/bin/python3 perf/sync/bench_sync.py --build-dir build --only sync",
    "dvf": "build/perf/dvf/pbox-bench-dvf --json FILE.jsonl",
    "slops": "/usr/bin/python3 perf/slops/bench_slops.py --build-dir build --json FILE",
}


# ---- the report -------------------------------------------------------------------------------

def make_plots(sources, only, outdir):
    """[(kind, png, caption, [Source])]; kinds without data are listed with the reason."""
    by = {}
    for s in sources:
        by.setdefault(s.kind, []).append(s)
    made, missing = [], []

    def emit(kind, fig_fn, caption, srcs):
        png = os.path.join(outdir, kind + ".png")
        try:
            fig = fig_fn()
        except ReportError as e:
            missing.append((kind, str(e)))
            return
        save(fig, png)
        made.append((kind, os.path.basename(png), caption, srcs))

    comm = by.get("comm", [])
    if "sweep" in only:
        if comm:
            emit("sweep", lambda: plot_sweep(load_json(comm[0].path), comm[0]),
                 "Chunk-size sweep (bench_comm.py, loopback). Higher is better; where the "
                 "curve flattens, per-chunk costs no longer dominate.", comm[:1])
        else:
            missing.append(("sweep", "no bench_comm.py JSON"))
    if "kernels" in only:
        k = by.get("kernels", [])
        if k:
            emit("kernels", lambda: plot_kernels(read_kernels(k[0].path), k[0]),
                 "Kernel bandwidth. Against the dashed line (memcpy at the DRAM size) the "
                 "DRAM bars show how close aggregation runs to the memory limit; the "
                 "in-cache bars how much faster a chunk that stays in cache is.", k[:1])
        else:
            missing.append(("kernels", "no pbox-bench-kernels output"))
    if "comm" in only:
        t = by.get("torch", [])
        if comm:
            emit("comm", lambda: plot_comm(load_json(comm[0].path), comm[0],
                                           load_json(t[0].path) if t else None,
                                           t[0] if t else None),
                 "Communication only, one machine: pboxd and the workers share its CPUs, "
                 "so the rate falls with more workers; Gloo and the DDP hook (squares, "
                 "triangles) come from bench_ddp.py's no-compute exchange.",
                 comm[:1] + t[:1])
        else:
            missing.append(("comm", "no bench_comm.py JSON"))
    if "netlab" in only:
        n = by.get("netlab", [])
        if n:
            recs = [r for s in n for r in load_json(s.path)]
            emit("netlab", lambda: plot_netlab(recs, n),
                 "perf/netlab: rate-limited links in namespaces; the bar above the bound "
                 "marker would be impossible, the gap below it is protocol cost.", n)
        else:
            missing.append(("netlab", "no perf/netlab results"))
    if "sync" in only:
        s = by.get("sync", [])
        if s:
            emit("sync", lambda: plot_sync(read_sync(s[0].path), s[0]),
                 "Steps per second under each synchronisation model with rank 2 slowed 2x; "
                 "labels: speed relative to BSP and final test accuracy.", s[:1])
        else:
            missing.append(("sync", "no bench_sync.py output"))
    if "dvf" in only:
        d = by.get("dvf", [])
        if d:
            emit("dvf", lambda: plot_dvf(read_dvf(d[0].path), d[0]),
                 "DVF (perf/dvf/README.md): left, the traffic each codec leaves at a given "
                 "sparsity (lower is better; 100 % is the dense gradient); right, the cost "
                 "of producing it on one core against snappy compressing the unfiltered "
                 "blocks.", d[:1])
        else:
            missing.append(("dvf", "no pbox-bench-dvf --json output"))
    if "slops" in only:
        sl = by.get("slops", [])
        if sl:
            emit("slops", lambda: plot_slops(sl),
                 "SLoPS (perf/slops): each bar is one estimate's range; a good prober's "
                 "bars cross the diagonal. Runs with rate 'max' (no known true value) "
                 "are left out.", sl)
        else:
            missing.append(("slops", "no perf/slops/bench_slops.py JSON"))
    return made, missing


def write_report(outdir, made, missing, sources, invocation):
    md = ["# pbox performance report", "",
          "Written %s on %s by `%s`." % (now(), this_machine(), invocation), "",
          "Every plot names the machine, date and command of its data. The machine may "
          "have been shared: compare values measured side by side, not across runs.", ""]
    for kind, png, caption, srcs in made:
        md += ["## %s" % kind, "", "![%s](%s)" % (kind, png), "", caption, ""]
        for s in srcs:
            md.append("* data `%s`: `%s` (%s; %s)" % (os.path.relpath(s.path, outdir),
                                                     s.command, s.date, s.machine))
        md.append("")
    if missing:
        md += ["## Not plotted", ""] + ["* %s: %s" % m for m in missing] + [""]
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write("\n".join(md))
    body = ["<h1>pbox performance report</h1>",
            "<p>Written %s on %s by <code>%s</code>.</p>" % (
                html.escape(now()), html.escape(this_machine()), html.escape(invocation))]
    for kind, png, caption, srcs in made:
        body += ["<h2>%s</h2>" % kind, '<img src="%s" alt="%s">' % (png, kind),
                 "<p>%s</p><ul>" % html.escape(caption)]
        body += ["<li>data <code>%s</code>: <code>%s</code> (%s; %s)</li>" % (
            html.escape(os.path.relpath(s.path, outdir)), html.escape(s.command),
            html.escape(s.date), html.escape(s.machine)) for s in srcs]
        body.append("</ul>")
    if missing:
        body += ["<h2>Not plotted</h2><ul>"] + [
            "<li>%s: %s</li>" % (html.escape(a), html.escape(b)) for a, b in missing] + ["</ul>"]
    with open(os.path.join(outdir, "report.html"), "w") as f:
        f.write("<!DOCTYPE html><html><head><meta charset='utf-8'><title>pbox performance"
                "</title></head><body>%s</body></html>\n" % "\n".join(body))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", required=True, help="directory for report.md/.html and the PNGs")
    ap.add_argument("--from", dest="src", metavar="DIR",
                    help="read benchmark outputs from DIR instead of running them")
    ap.add_argument("--build-dir", default=os.environ.get("PBOX_BUILD_DIR", "build"),
                    help="meson build directory (running the benchmarks)")
    ap.add_argument("--only", default=",".join(KINDS),
                    help="plots to make: %s (default: all)" % ",".join(KINDS))
    ap.add_argument("--quick", action="store_true",
                    help="shorter benchmark runs (fewer models, sizes and seconds)")
    ap.add_argument("--netlab", default=os.path.join(PERF, "netlab", "results"),
                    help="netlab results to include when running (default: "
                         "perf/netlab/results; netlab itself needs root and minutes)")
    ap.add_argument("--torch", default=os.path.join(PERF, "torch", "results.json"),
                    help="bench_ddp.py results to include when running")
    ap.add_argument("--slops", default=os.path.join(PERF, "slops", "results"),
                    help="bench_slops.py results to include when running (default: "
                         "perf/slops/results; it needs root and namespaces)")
    a = ap.parse_args(argv)
    a.only = [k.strip() for k in a.only.split(",") if k.strip()]
    for k in a.only:
        if k not in KINDS:
            ap.error("--only: unknown plot '%s' (%s)" % (k, ", ".join(KINDS)))
    os.makedirs(a.out, exist_ok=True)
    invocation = " ".join(shlex.quote(x) for x in ["perf/report/report.py"] + (argv or sys.argv[1:]))
    try:
        if a.src:
            if not os.path.isdir(a.src):
                raise ReportError("--from %s: not a directory" % a.src)
            sources = read_dir(a.src)
            if not sources:
                raise ReportError("--from %s: no benchmark output found (bench_comm.py / "
                                  "netlab / bench_slops.py JSON, pbox-bench-kernels .txt, "
                                  "bench_sync.py .md, pbox-bench-dvf .jsonl)" % a.src)
        else:
            data = os.path.join(a.out, "data")
            os.makedirs(data, exist_ok=True)
            sources = run_benchmarks(a, data)
            for extra, kind in ((a.netlab, "netlab"), (a.torch, "torch"), (a.slops, "slops")):
                files = sorted(glob.glob(os.path.join(extra, "*.json"))) if os.path.isdir(extra) \
                    else ([extra] if os.path.exists(extra) else [])
                for f in files:
                    if classify(f) == kind:
                        copy = os.path.join(data, "%s-%s" % (kind, os.path.basename(f)))
                        shutil.copy(f, copy)
                        sources.append(describe(copy, kind, origin=f))
            with open(os.path.join(data, "manifest.json"), "w") as f:
                json.dump({"sources": [dict(s.as_dict(), file=os.path.relpath(s.path, data))
                                       for s in sources]}, f, indent=1)
        made, missing = make_plots(sources, a.only, a.out)
        write_report(a.out, made, missing, sources, invocation)
    except ReportError as e:
        print("report: %s" % e, file=sys.stderr)
        return 1
    for kind, png, _, _ in made:
        print("report: %s" % os.path.join(a.out, png))
    for kind, why in missing:
        print("report: not plotted: %s: %s" % (kind, why))
    print("report: %s" % os.path.join(a.out, "report.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
