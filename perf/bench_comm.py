#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Communication-only ("zero compute") benchmark of pboxd, after PHub's method.

For each run it starts a pboxd with one aggregate job (loopback, free ports), starts N
pbox-bench-comm workers that register a model's parameter tensors (perf/models/*.txt) and
exchange the whole model every iteration with no computation, and collects their rates
and pboxd's counters. Three parts, each a table:

  main   every model table x every worker count, appliance mtu 65535 (the main numbers)
  mtu    one model and worker count at mtu 1500 beside mtu 65535
  sweep  one model over appliance chunk_bytes 4 KB, 8 KB, ... 4 MB

The mtu and sweep parts run every point with each send window of --windows: "default" is
libpbox's own max_inflight (a number of chunks, so the bytes in flight grow with the chunk
size), a byte size B sets max_inflight = max(1, B / chunk_bytes) so that the bytes in
flight stay about the same across chunk sizes. The window column shows max_inflight.

Columns: exchanges/s is full-model exchanges per second per worker (all workers of a BSP
job run in lockstep, so they agree) and in total (the sum over workers); GB/s counts the
gradient pushed plus the aggregate received, 2 x model bytes per exchange, per worker and
in total. retx and probes are libpbox's retransmitted datagrams and result re-requests
(timed iterations, summed over workers); rcvbuf is the kernel's UDP RcvbufErrors counter
over the run (system-wide: datagrams dropped because a socket buffer was full); busy% is
pboxd's data-plane busy share.

    /usr/bin/python3 perf/bench_comm.py --build-dir build
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

TOKEN = "bench-comm"


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    try:
        if s and s[-1].upper() in mult:
            return int(s[:-1]) * mult[s[-1].upper()]
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not a size (e.g. 4K, 32768, 4M)" % s)


def fmt_size(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return "%d MB" % (n >> 20)
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return "%d KB" % (n >> 10)
    return "%d B" % n


def udp_rcvbuf_errors():
    """The kernel's UDP RcvbufErrors counter (system-wide), or None if unreadable."""
    try:
        with open("/proc/net/snmp") as f:
            rows = [l.split() for l in f if l.startswith("Udp:")]
        return int(rows[1][rows[0].index("RcvbufErrors")])
    except (OSError, IndexError, ValueError):
        return None


def run_one(args, model, workers, chunk_bytes, mtu, max_inflight, seconds):
    """One pboxd + workers run; returns a result dict (with "error" if it failed)."""
    from pboxtest import Pboxd, build_path

    table = os.path.join(HERE, "models", model + ".txt")
    job = {"id": 1, "token": TOKEN, "workers": workers, "mode": "aggregate",
           "reduce": "mean"}
    res = {"model": model, "workers": workers, "chunk_bytes": chunk_bytes, "mtu": mtu,
           "max_inflight": max_inflight}
    worker = build_path("perf/pbox-bench-comm")
    rcv0 = udp_rcvbuf_errors()
    t0 = time.time()
    try:
        with Pboxd([job], cores=args.cores, mtu=mtu, chunk_bytes=chunk_bytes,
                   busy_poll=args.busy_poll) as d:
            cmd = [worker, "--server", d.control, "--job", "1", "--token", TOKEN,
                   "--model", table, "--seconds", str(seconds), "--json"]
            if max_inflight:
                cmd += ["--max-inflight", str(max_inflight)]
            procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
                     for r in range(workers)]
            outs = []
            for r, p in enumerate(procs):
                try:
                    out, err = p.communicate(timeout=seconds * 20 + 180)
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    out, err = p.communicate()
                    res["error"] = "rank %d did not finish in time" % r
                    continue
                if p.returncode != 0:
                    last = err.strip().splitlines()
                    res.setdefault("error", "rank %d exited with %d: %s" %
                                   (r, p.returncode, last[-1] if last else "no message"))
                    sys.stderr.write(err)
                    continue
                try:
                    outs.append(json.loads(out.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    res.setdefault("error", "rank %d printed no result: %r" % (r, out[-200:]))
            st = d.stats()
    except SystemExit:
        # pboxtest.fail() has printed why, with pboxd's log; keep the other runs going.
        res["error"] = "pboxd failed (its log is printed above)"
        return res
    except OSError as e:
        res["error"] = "pboxd control channel: %s" % e
        return res
    rcv1 = udp_rcvbuf_errors()
    res["wall_s"] = time.time() - t0
    tot = st["totals"]
    res["pboxd"] = {k: tot[k] for k in ("busy_pct", "dups", "rx_retransmits", "replies_resent",
                                        "dropped", "tx_errors", "rx_truncated")}
    res["rcvbuf_errors"] = rcv1 - rcv0 if rcv0 is not None and rcv1 is not None else None
    res["ranks"] = outs
    if "error" in res or len(outs) != workers:
        res.setdefault("error", "missing results")
        return res
    r0 = outs[0]
    res.update({
        "model_bytes": r0["model_bytes"], "frag_bytes": r0["frag_bytes"],
        "nchunks": r0["nchunks"], "iters": r0["iters"],
        "seconds": max(o["seconds"] for o in outs),
        "xps_worker": sum(o["exchanges_per_s"] for o in outs) / workers,
        "xps_total": sum(o["exchanges_per_s"] for o in outs),
        "gbps_worker": sum(o["push_gbps"] + o["recv_gbps"] for o in outs) / workers,
        "gbps_total": sum(o["push_gbps"] + o["recv_gbps"] for o in outs),
        "retransmits": sum(o["retransmits"] for o in outs),
        "probes": sum(o["probes"] for o in outs),
        "client_dropped": sum(o["dropped"] for o in outs),
    })
    return res


FMT = "%-9s %6s %2s %6s %7s %5s %6s %5s %7s %7s %7s %7s %7s %7s %7s %5s"
HEADER = FMT % ("model", "MB", "N", "chunk", "frag", "mtu", "window", "iters", "exch/s",
                "exch/s", "GB/s", "GB/s", "retx", "probes", "rcvbuf", "busy%")
HEADER2 = FMT % ("", "", "", "", "", "", "", "", "/worker", "total", "/worker", "total", "",
                 "", "", "pboxd")


def window_label(mi):
    return str(mi) if mi else "dflt"


def window_chunks(spec, chunk_bytes):
    """max_inflight for a --windows entry: 0 (libpbox's default) or bytes / chunk."""
    if spec == "default":
        return 0
    return max(1, parse_size(spec) // chunk_bytes)


def row(r):
    if "error" in r:
        return "%-9s %6s %2d %6s %7s %5d %6s  FAILED: %s" % (
            r["model"], "", r["workers"], fmt_size(r["chunk_bytes"]), "", r["mtu"],
            window_label(r["max_inflight"]), r["error"])
    rcv = "?" if r["rcvbuf_errors"] is None else str(r["rcvbuf_errors"])
    return FMT % (r["model"], "%.1f" % (r["model_bytes"] / 1e6), r["workers"],
                  fmt_size(r["chunk_bytes"]), fmt_size(r["frag_bytes"]), r["mtu"],
                  window_label(r["max_inflight"]), r["iters"], "%.3f" % r["xps_worker"],
                  "%.3f" % r["xps_total"], "%.3f" % r["gbps_worker"],
                  "%.3f" % r["gbps_total"], r["retransmits"], r["probes"], rcv,
                  "%.1f" % r["pboxd"]["busy_pct"])


def table(title, results, load):
    print("\n%s; load average %.1f before, %.1f after" % (title, load, os.getloadavg()[0]))
    print(HEADER)
    print(HEADER2)
    for r in results:
        print(row(r))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Runs take about --seconds each plus start-up and warm-up; the defaults keep "
               "each part under about 3 minutes on a 2-core machine.")
    ap.add_argument("--build-dir", default=os.environ.get("PBOX_BUILD_DIR"),
                    help="meson build directory (default: $PBOX_BUILD_DIR, else ./build)")
    ap.add_argument("--parts", default="main,mtu,sweep",
                    help="comma-separated parts to run: main, mtu, sweep (default: all)")
    ap.add_argument("--models", default="resnet50,alexnet,vgg19",
                    help="model tables for the main part (perf/models/NAME.txt)")
    ap.add_argument("--workers", default="2,3", help="worker counts for the main part")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="timed duration of each main and mtu run (default 3)")
    ap.add_argument("--sweep-seconds", type=float, default=2.0,
                    help="timed duration of each sweep run (default 2)")
    ap.add_argument("--cores", type=int, default=2, help="pboxd data-plane cores (default 2)")
    ap.add_argument("--chunk-bytes", type=parse_size, default=32 << 10,
                    help="chunk_bytes of the main and mtu parts (default 32K)")
    ap.add_argument("--mtu", type=int, default=65535,
                    help="appliance mtu of the main and sweep parts (default 65535)")
    ap.add_argument("--mtu-model", default="resnet50", help="model of the mtu part")
    ap.add_argument("--mtu-workers", type=int, default=2, help="workers of the mtu part")
    ap.add_argument("--sweep-model", default="resnet50", help="model of the sweep part")
    ap.add_argument("--sweep-workers", type=int, default=2, help="workers of the sweep part")
    ap.add_argument("--sweep-chunks", default="4K,8K,16K,32K,64K,128K,256K,512K,1M,2M,4M",
                    help="chunk sizes of the sweep part")
    ap.add_argument("--max-inflight", type=int, default=0,
                    help="libpbox max_inflight of the workers in the main part "
                         "(default: libpbox's)")
    ap.add_argument("--windows", default="default,4M",
                    help="send windows of the mtu and sweep parts: 'default' and/or byte "
                         "budgets (default: default,4M)")
    ap.add_argument("--busy-poll", action="store_true", help="pboxd busy_poll = true")
    ap.add_argument("--json", metavar="FILE", help="also write every result to FILE")
    args = ap.parse_args()

    if args.build_dir:
        os.environ["PBOX_BUILD_DIR"] = os.path.abspath(args.build_dir)
    if not (args.seconds > 0 and args.sweep_seconds > 0):
        ap.error("--seconds and --sweep-seconds must be positive")
    if args.cores < 1:
        ap.error("--cores must be at least 1")
    if args.max_inflight < 0:
        ap.error("--max-inflight must be 0 (libpbox's default) or more")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for p in parts:
        if p not in ("main", "mtu", "sweep"):
            ap.error("--parts: unknown part '%s' (main, mtu, sweep)" % p)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models + [args.sweep_model, args.mtu_model]:
        if not os.path.exists(os.path.join(HERE, "models", m + ".txt")):
            ap.error("no model table perf/models/%s.txt (generate it with "
                     "perf/models/gen_model_tables.py)" % m)
    try:
        workers = [int(w) for w in args.workers.split(",")]
        chunks = [parse_size(c) for c in args.sweep_chunks.split(",")]
        windows = [w.strip() for w in args.windows.split(",") if w.strip()]
        for w in windows:
            window_chunks(w, 1)
    except (ValueError, argparse.ArgumentTypeError) as e:
        ap.error(str(e))
    if any(w < 1 for w in workers):
        ap.error("--workers: counts must be at least 1")

    print("pbox comm-only benchmark: %d online CPUs, pboxd cores = %d, loopback, "
          "%.1f s per run (sweep %.1f s)" %
          (os.cpu_count(), args.cores, args.seconds, args.sweep_seconds))
    everything = []
    if "main" in parts:
        t0, load = time.time(), os.getloadavg()[0]
        res = [run_one(args, m, n, args.chunk_bytes, args.mtu, args.max_inflight, args.seconds)
               for m in models for n in workers]
        table("main: chunk_bytes %s, mtu %d (%.0f s)" %
              (fmt_size(args.chunk_bytes), args.mtu, time.time() - t0), res, load)
        everything += res
    if "mtu" in parts:
        t0, load = time.time(), os.getloadavg()[0]
        res = [run_one(args, args.mtu_model, args.mtu_workers, args.chunk_bytes, mtu,
                       window_chunks(w, args.chunk_bytes), args.seconds)
               for w in windows for mtu in (65535, 1500)]
        table("mtu: %s, %d workers, chunk_bytes %s (%.0f s)" %
              (args.mtu_model, args.mtu_workers, fmt_size(args.chunk_bytes), time.time() - t0),
              res, load)
        everything += res
    if "sweep" in parts:
        t0, load = time.time(), os.getloadavg()[0]
        # Window variants of one chunk size run back to back so they meet the same noise.
        res = [run_one(args, args.sweep_model, args.sweep_workers, c, args.mtu,
                       window_chunks(w, c), args.sweep_seconds)
               for c in chunks for w in windows]
        table("sweep: %s, %d workers, mtu %d (%.0f s)" %
              (args.sweep_model, args.sweep_workers, args.mtu, time.time() - t0), res, load)
        everything += res
    failed = any("error" in r for r in everything)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
