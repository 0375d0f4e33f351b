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
  compare  pbox against Gloo allreduce (torch.distributed over TCP on loopback, DDP's
         buckets, all in flight: perf/netlab/gloo_worker.py) and against the echo bound
         (pbox-udp-echo-bound: a minimal recvmmsg / sendmmsg echo with pbox's datagram
         size, --cores echo threads; with GSO/GRO when pbox's datagrams are below 64 KB),
         against the aggregating bound where pbox's datagrams are 32 KB or more ("agg":
         pbox-udp-echo-bound --reduce, the same echo summing each datagram of all
         workers once and sending the one result to each, which streams it into its
         result buffer: aggregation with no protocol)
         and pbox with its workers on the shared-memory transport ("shm": their buffers
         from pbox_mem_alloc, registered with pboxd; "shm copy": malloc'ed buffers,
         every push copied into the ring; "shm bnd": pbox-shm-bound, the least memory
         work of such an exchange on --cores threads; --no-shm leaves the three out;
         every other pbox figure forces kernel UDP with PBOX_TRANSPORT=udp),
         for each --workers count and --compare-mtus, --reps rounds with the systems
         interleaved (the order rotating each round); medians of seconds per exchange
         (the slowest rank's per iteration for pbox and Gloo). --baseline-build DIR adds
         the pbox of another build tree (e.g. the previous transport) to every round.
         --netns-mtu M runs the whole benchmark in a fresh network namespace whose
         loopback has MTU M (the host's loopback is never changed).

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
pboxd's data-plane busy share; cpu s/exch is the CPU seconds of pboxd and the workers per
exchange round (warm-up rounds included).

    /usr/bin/python3 perf/bench_comm.py --build-dir build
    /usr/bin/python3 perf/bench_comm.py --build-dir build --parts compare --workers 2,3
"""
import argparse
import json
import os
import resource
import socket
import statistics
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


def run_one(args, model, workers, chunk_bytes, mtu, max_inflight, seconds, build_dir=None,
            transport="udp", plain_mem=False):
    """One pboxd + workers run; returns a result dict (with "error" if it failed). The
    programs come from build_dir if given, else from --build-dir. transport: the workers'
    data path (PBOX_TRANSPORT: "udp", the kernel-UDP figures everywhere but the compare
    part's shm column; "shm", the shared-memory rings). plain_mem: the workers' buffers
    are malloc'ed, not pbox_mem_alloc'ed (over shm: every push copied into the ring)."""
    from pboxtest import Pboxd, build_path
    sys.path.insert(0, os.path.join(HERE, "netlab"))
    import netlab

    os.environ["PBOX_BUILD_DIR"] = build_dir or args.build_dir

    table = os.path.join(HERE, "models", model + ".txt")
    job = {"id": 1, "token": TOKEN, "workers": workers, "mode": "aggregate",
           "reduce": "mean"}
    if getattr(args, "non_finite", None):
        job["non_finite"] = args.non_finite
    res = {"model": model, "workers": workers, "chunk_bytes": chunk_bytes, "mtu": mtu,
           "max_inflight": max_inflight}
    worker = build_path("perf/pbox-bench-comm")
    rcv0 = udp_rcvbuf_errors()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    try:
        extra = {"idle_us": args.idle_us} if args.idle_us is not None else {}
        if args.shm_ring_kb:
            extra["shm"] = {"ring_kb": args.shm_ring_kb}
        with Pboxd([job], cores=args.cores, mtu=mtu, chunk_bytes=chunk_bytes,
                   busy_poll=args.busy_poll, **extra) as d:
            cmd = [worker, "--server", d.control, "--job", "1", "--token", TOKEN,
                   "--model", table, "--seconds", str(seconds), "--json"]
            if max_inflight:
                cmd += ["--max-inflight", str(max_inflight)]
            if args.rto_ms:
                cmd += ["--rto-ms", str(args.rto_ms)]
            if plain_mem:
                cmd += ["--plain-mem"]
            wenv = dict(os.environ, PBOX_TRANSPORT=transport)
            procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=wenv)
                     for r in range(workers)]
            outs = []
            try:
                done = netlab.wait_all(procs, seconds * 20 + 180)
            except netlab.LabError as e:
                done = []
                res["error"] = str(e)
            for r, (rc, out, err) in enumerate(done):
                if rc != 0:
                    last = err.strip().splitlines()
                    res.setdefault("error", "rank %d exited with %d: %s" %
                                   (r, rc, last[-1] if last else "no message"))
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
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res["cpu_s"] = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    res["wall_s"] = time.time() - t0
    tot = st["totals"]
    res["pboxd"] = {k: tot[k] for k in ("busy_pct", "dups", "rx_retransmits", "replies_resent",
                                        "dropped", "tx_errors", "rx_truncated")}
    # The UDP transport's counters (datagrams per recvmmsg call, GSO / GRO use), where
    # the build reports them.
    res["transport"] = st.get("transport")
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
        # datagrams the workers received, and of them results received straight into
        # the caller's buffer (libpbox's receive placement; absent in older builds)
        "client_rx_pkts": sum(o.get("rx_pkts", 0) for o in outs),
        "client_rx_placed": sum(o.get("rx_placed", 0) for o in outs),
        # shared-memory workers: results read through descriptors into pboxd's results'
        # arena, and those dropped as stale / torn (rewritten before / while read)
        "shm_rx_desc": sum(o.get("shm_rx_desc", 0) for o in outs),
        "shm_stale": sum(o.get("shm_stale", 0) for o in outs),
        "shm_torn": sum(o.get("shm_torn", 0) for o in outs),
        # whether every rank's buffers were shared with pboxd (pbox_mem_alloc over shm)
        "registered": all(o.get("registered", False) for o in outs),
        # the workers' own CPU seconds per exchange (libpbox: progress thread included)
        "client_cpu_per_iter": (sum(o["cpu_s"] for o in outs) / r0["iters"]
                                if all("cpu_s" in o for o in outs) and r0["iters"] else None),
        "iter_seconds": per_iteration_max([o.get("iter_seconds", []) for o in outs]),
        # CPU seconds of pboxd and the workers per exchange round (2 warm-up rounds
        # included): less sensitive to other load on the machine than the wall time.
        "cpu_per_round": res["cpu_s"] / (r0["iters"] + 2),
    })
    return res


def per_iteration_max(rank_times):
    """Exchange time of each iteration: the slowest rank's."""
    rank_times = [t for t in rank_times if t]
    if not rank_times:
        return []
    n = min(len(t) for t in rank_times)
    return [max(t[i] for t in rank_times) for i in range(n)]


def frag_bytes_for_mtu(mtu, chunk_bytes):
    """pbox_frag_bytes_for_mtu (common/jobdesc.c): IPv4 + UDP + pbox header inside the
    MTU, a multiple of 64, at most 65408 and the chunk."""
    room = min(mtu - 28 - 64, 65408)
    return min(room - room % 64, chunk_bytes)


def model_bytes(model):
    sys.path.insert(0, os.path.join(HERE, "netlab"))
    import netlab
    _, sizes = netlab.read_table(os.path.join(HERE, "models", model + ".txt"))
    return 4 * sum(sizes), sizes


def run_echo(args, model, workers, chunk_bytes, mtu, iters, reduce=False, copy=True):
    """The echo bound: pbox's datagram size (fragment + 64-byte header), GSO/GRO below
    64 KB. reduce: the aggregating bound (--reduce; datagrams of 32 KB and more only);
    copy=False: without the workers' result copy (--no-copy). Returns {"median_s", ...}
    or {"error"}."""
    nbytes, _ = model_bytes(model)
    size = frag_bytes_for_mtu(mtu, chunk_bytes) + 64
    cmd = [os.path.join(args.build_dir, "perf", "pbox-udp-echo-bound"),
           "--bytes", str(nbytes), "--size", str(size), "--workers", str(workers),
           "--threads", str(args.cores), "--iters", str(iters), "--json"]
    if reduce:
        cmd += ["--reduce"] + ([] if copy else ["--no-copy"])
    elif size < 32768:
        cmd.append("--gso")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"error": "echo bound did not finish"}
    if p.returncode != 0:
        return {"error": "echo bound: " + (p.stderr.strip().splitlines() or ["failed"])[-1]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["gso"] = "--gso" in cmd
    return r


def run_shm_bound(args, model, workers, iters):
    """The shared-memory bound (pbox-shm-bound): the least memory work of an exchange with
    pbox's API, on --cores threads. Returns {"median_s", ...} or {"error"}."""
    nbytes, _ = model_bytes(model)
    cmd = [os.path.join(args.build_dir, "perf", "pbox-shm-bound"), "--bytes", str(nbytes),
           "--workers", str(workers), "--threads", str(args.cores), "--chunk",
           str(args.chunk_bytes), "--iters", str(iters), "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"error": "shm bound did not finish"}
    if p.returncode != 0:
        return {"error": "shm bound: " + (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def free_tcp_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_gloo(args, model, workers, iters):
    """run_gloo_once, again (up to 3 times) if the rendezvous port was taken meanwhile."""
    for _ in range(3):
        r = run_gloo_once(args, model, workers, iters)
        if "Address already in use" not in r.get("error", ""):
            break
    return r


def run_gloo_once(args, model, workers, iters):
    """Gloo allreduce of the model's gradient in DDP's buckets (25 MB, the first 1 MB),
    every bucket in flight, over loopback. Returns {"median_s", ...} or {"error"}."""
    sys.path.insert(0, os.path.join(HERE, "netlab"))
    import netlab
    _, sizes = model_bytes(model)
    buckets = netlab.gloo_buckets(sizes, 25 << 20)
    script = os.path.join(HERE, "netlab", "gloo_worker.py")
    master = "127.0.0.1:%d" % free_tcp_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(["/usr/bin/python3", script, "--rank", str(r), "--world",
                               str(workers), "--master", master, "--buckets",
                               ",".join(map(str, buckets)), "--iterations", str(iters),
                               "--warmup", "2", "--timeout", "120"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for r in range(workers)]
    times, err = [], None
    try:
        done = netlab.wait_all(procs, 300)
    except netlab.LabError as e:
        done, err = [], "gloo %s" % e
    for r, (rc, out, e) in enumerate(done):
        if rc != 0:
            err = err or "gloo rank %d: %s" % (r, (e.strip().splitlines() or ["failed"])[-1])
            continue
        times.append(json.loads(out.strip().splitlines()[-1])["iter_seconds"])
    if err:
        return {"error": err}
    t = per_iteration_max(times)
    return {"median_s": statistics.median(t), "iter_seconds": t}


def compare(args, model, workers, mtu):
    """--reps rounds of pbox (and the baseline build's pbox), Gloo and the echo bound,
    interleaved; returns the row dict."""
    # agg: the aggregating echo bound, for datagrams that need no GSO
    # (aggn: without the workers' result copy)
    agg = ["agg", "aggn"] if frag_bytes_for_mtu(mtu, args.chunk_bytes) + 64 >= 32768 else []
    systems = (["pbox"] + (["shm", "shmp", "shmb"] if args.shm else []) + ["gloo", "echo"] +
               agg + (["base"] if args.baseline_build else []))
    samples = {k: [] for k in systems}
    extra = {k: [] for k in systems}
    cpu = {k: [] for k in systems}
    errors = []
    for rnd in range(args.reps):
        order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
        for sysname in order:
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if sysname in ("pbox", "base", "shm", "shmp"):
                r = run_one(args, model, workers, args.chunk_bytes, mtu, 0, args.seconds,
                            build_dir=args.baseline_build if sysname == "base" else None,
                            transport=("shm" if sysname in ("shm", "shmp") else
                                       args.baseline_transport if sysname == "base" else
                                       "udp"), plain_mem=sysname == "shmp")
                if "error" not in r and not r.get("iter_seconds"):
                    r["error"] = "no iteration times"
                elif "error" not in r and sysname == "shm" and not r.get("registered"):
                    r["error"] = "the buffers were not registered with pboxd"
            elif sysname == "gloo":
                r = run_gloo(args, model, workers, args.compare_iters)
            elif sysname == "shmb":
                r = run_shm_bound(args, model, workers, args.compare_iters)
            else:
                r = run_echo(args, model, workers, args.chunk_bytes, mtu, args.compare_iters,
                             reduce=sysname in ("agg", "aggn"), copy=sysname != "aggn")
            if "error" in r:
                errors.append("%s: %s" % (sysname, r["error"]))
                continue
            samples[sysname].append(statistics.median(r["iter_seconds"]))
            extra[sysname].append(r)
            # CPU seconds of every process of the run (pboxd, workers, echo processes)
            # per exchange round, untimed rounds included: robust to a loaded machine.
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rounds = (r["iters"] + 2) if sysname in ("pbox", "base", "shm", "shmp") else (
                args.compare_iters + 2 if sysname in ("echo", "agg", "aggn", "shmb") else 0)
            if rounds:
                cpu[sysname].append((ru1.ru_utime - ru0.ru_utime + ru1.ru_stime -
                                     ru0.ru_stime) / rounds)
    row = {"model": model, "workers": workers, "mtu": mtu, "reps": args.reps,
           "frag_bytes": frag_bytes_for_mtu(mtu, args.chunk_bytes), "errors": errors,
           "samples": samples, "cpu_samples": cpu,
           "runs": {k: [{x: r.get(x) for x in ("iters", "retransmits", "probes", "rcvbuf_errors",
                                               "client_dropped", "pboxd", "transport",
                                               "median_s", "gso", "client_rx_pkts",
                                               "client_rx_placed", "client_cpu_per_iter",
                                               "shm_rx_desc", "shm_stale", "shm_torn",
                                               "registered")}
                        for r in extra[k]] for k in systems}}
    for k in systems:
        row[k] = statistics.median(samples[k]) if samples[k] else None
        row[k + "_cpu"] = statistics.median(cpu[k]) if cpu[k] else None
    for k in ("pbox", "base", "shm", "shmp"):
        tr = [r.get("transport") for r in extra.get(k, []) if r.get("transport")]
        if tr:
            tot = tr[-1]["totals"]
            row[k + "_per_call"] = tot.get("rx_pkts_per_call")
            row[k + "_gso"] = tr[-1].get("gso")
        row[k + "_retx"] = sum(r.get("retransmits", 0) for r in extra.get(k, []))
        row[k + "_rcvbuf"] = sum(r.get("rcvbuf_errors") or 0 for r in extra.get(k, []))
        # share of the workers' received datagrams that landed in the caller's buffer
        rxp = sum(r.get("client_rx_pkts", 0) for r in extra.get(k, []))
        row[k + "_placed"] = (sum(r.get("client_rx_placed", 0) for r in extra.get(k, [])) /
                              rxp if rxp else None)
        wc = [r["client_cpu_per_iter"] for r in extra.get(k, []) if r.get("client_cpu_per_iter")]
        row[k + "_wcpu"] = statistics.median(wc) if wc else None
    row["shm_desc"], row["shm_stale"], row["shm_torn"] = (
        sum(r.get(x, 0) for r in extra.get("shm", [])) for x in
        ("shm_rx_desc", "shm_stale", "shm_torn"))
    return row


def compare_table(rows, args, load, secs):
    base = bool(args.baseline_build)
    shm = bool(args.shm)
    print("\ncompare: %s, chunk_bytes %s, %d pboxd cores / echo threads, %d rounds "
          "interleaved, medians of s per exchange (%.0f s); load average %.1f before, %.1f "
          "after" % (rows[0]["model"] if rows else "-", fmt_size(args.chunk_bytes), args.cores,
                     args.reps, secs, load, os.getloadavg()[0]))
    hdr = "%2s %5s %6s %8s %8s %8s %s %9s %9s %s %8s %5s" % (
        "N", "mtu", "frag", "pbox", "gloo", "echo", "%8s " % "base" if base else "",
        "gloo/pbox", "pbox/echo", "%9s " % "base/pbox" if base else "", "dg/call", "retx")
    hdr += " %7s %8s %8s %9s %6s %8s" % ("rcvbuf", "cpu pbox", "cpu echo", "echo/pbox",
                                         "placed", "wcpu")
    hdr += " %8s %8s %9s %9s %8s %9s" % ("agg", "cpu agg", "pbox/agg", "agg/echo", "agg nc",
                                         "aggn/echo")
    if base:
        hdr += " %8s %8s" % ("cpu base", "wcpu bas")
    if shm:
        hdr += " %8s %8s %9s %8s %8s %8s %9s %8s %8s %11s %8s %9s %9s" % (
            "shm", "gloo/shm", "pbox/shm", "cpu shm", "wcpu shm", "shm copy", "copy/shm",
            "cpu copy", "wcpu cop", "stale/torn", "shm bnd", "gloo/bnd", "shm/bnd")
    print(hdr)

    def f(v):
        return "%8.4f" % v if v else "%8s" % "-"

    def q(a, b):
        return "%9.2f" % (a / b) if a and b else "%9s" % "-"
    for r in rows:
        line = "%2d %5d %6s %s %s %s %s%s %s %s%8s %5d" % (
            r["workers"], r["mtu"], fmt_size(r["frag_bytes"]), f(r["pbox"]), f(r["gloo"]),
            f(r["echo"]), f(r.get("base")) + " " if base else "", q(r["gloo"], r["pbox"]),
            q(r["echo"], r["pbox"]), q(r.get("base"), r["pbox"]) + " " if base else "",
            "%.2f" % r["pbox_per_call"] if r.get("pbox_per_call") else "-", r["pbox_retx"])
        line += " %7d %s %s %s %6s" % (r["pbox_rcvbuf"], f(r["pbox_cpu"]), f(r["echo_cpu"]),
                                       q(r["echo_cpu"], r["pbox_cpu"]),
                                       "%.2f" % r["pbox_placed"]
                                       if r.get("pbox_placed") is not None else "-")
        line += " %s" % f(r.get("pbox_wcpu"))
        line += " %s %s %s %s %s %s" % (
            f(r.get("agg")), f(r.get("agg_cpu")), q(r.get("agg"), r["pbox"]),
            q(r["echo"], r.get("agg")), f(r.get("aggn")), q(r["echo"], r.get("aggn")))
        if base:
            line += " %s %s" % (f(r.get("base_cpu")), f(r.get("base_wcpu")))
        if shm:
            line += " %s %s %s %s %s %s %s %s %s" % (
                f(r.get("shm")), q(r["gloo"], r.get("shm")), q(r["pbox"], r.get("shm")),
                f(r.get("shm_cpu")), f(r.get("shm_wcpu")), f(r.get("shmp")),
                q(r.get("shmp"), r.get("shm")), f(r.get("shmp_cpu")), f(r.get("shmp_wcpu")))
            line += " %11s" % ("%d/%d" % (r["shm_stale"], r["shm_torn"]))
            line += " %s %s %s" % (f(r.get("shmb")), q(r["gloo"], r.get("shmb")),
                                   q(r.get("shmb"), r.get("shm")))
        print(line)
        for e in r["errors"]:
            print("   error: " + e)
    if shm:
        print("shm: pbox with the workers on the shared-memory transport (pbox: kernel UDP), "
              "their buffers from pbox_mem_alloc (shared with pboxd: pushes not copied); "
              "gloo/shm > 1: shm faster than Gloo; pbox/shm: speed-up of shm over UDP; shm "
              "copy: the same with malloc'ed buffers (every push copied into the ring); "
              "copy/shm: speed-up of the registered buffers; stale/torn: shm results dropped "
              "(rewritten before / while read) and re-requested, over all rounds; shm bnd: "
              "the shared-memory bound (pbox-shm-bound: each gradient read once, the result "
              "written once and into each worker's buffer, --cores threads, no protocol); "
              "gloo/bnd: the most any exchange with pbox's API reaches against Gloo here; "
              "shm/bnd: share of the bound reached")
    print("gloo/pbox > 1: pbox faster than Gloo; pbox/echo: share of the echo bound reached"
          "%s; dg/call: pboxd's datagrams per recvmmsg call; retx, rcvbuf: pbox's retransmitted "
          "datagrams and the kernel's UDP RcvbufErrors over all rounds; cpu: CPU seconds of all "
          "processes per exchange round (medians; echo/pbox: pbox's CPU efficiency against "
          "the bound); placed: share of the workers' received datagrams that went straight "
          "into the caller's buffer; wcpu: the workers' own CPU seconds per exchange (summed "
          "over workers, timed iterations only; '-' for builds that do not report it); agg: "
          "the aggregating bound (pbox-udp-echo-bound --reduce: each datagram summed once from "
          "its receive buffers, the result sent to every worker and streamed into its result "
          "buffer; no protocol; '-' below 32 KB datagrams); pbox/agg: share of it pbox "
          "reaches; agg/echo: share of the echo bound any aggregating exchange can reach; agg "
          "nc, aggn/echo: the same without the workers' result copy (--no-copy: a bound even "
          "for receiving every result in place)" %
          ("; base/pbox: speed-up over the baseline build" if base else ""))
    sys.stdout.flush()


FMT = "%-9s %6s %2s %6s %7s %5s %6s %5s %7s %7s %7s %7s %7s %7s %7s %5s %6s"
HEADER = FMT % ("model", "MB", "N", "chunk", "frag", "mtu", "window", "iters", "exch/s",
                "exch/s", "GB/s", "GB/s", "retx", "probes", "rcvbuf", "busy%", "cpu s")
HEADER2 = FMT % ("", "", "", "", "", "", "", "", "/worker", "total", "/worker", "total", "",
                 "", "", "pboxd", "/exch")


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
                  "%.1f" % r["pboxd"]["busy_pct"], "%.3f" % r["cpu_per_round"])


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
    ap.add_argument("--rto-ms", type=int, metavar="MS",
                    help="libpbox's first retransmission timeout in the workers (default: "
                         "libpbox's)")
    ap.add_argument("--idle-us", type=int, metavar="US",
                    help="pboxd idle_us: how long a core polls before it blocks (default: "
                         "pboxd's)")
    ap.add_argument("--json", metavar="FILE", help="also write every result to FILE")
    ap.add_argument("--compare-mtus", default="65535",
                    help="appliance MTUs of the compare part (default 65535)")
    ap.add_argument("--compare-model", default="resnet50", help="model of the compare part")
    ap.add_argument("--compare-iters", type=int, default=10,
                    help="timed iterations of Gloo and of the echo bound per round")
    ap.add_argument("--reps", type=int, default=3, help="rounds of the compare part")
    ap.add_argument("--no-shm", dest="shm", action="store_false",
                    help="compare part: leave out pbox over the shared-memory transport")
    ap.add_argument("--non-finite", choices=("reject", "propagate"),
                    help="the job's non_finite policy (default: pboxd's, reject)")
    ap.add_argument("--shm-ring-kb", type=int, metavar="KB",
                    help="pboxd shm.ring_kb (default: pboxd's)")
    ap.add_argument("--baseline-build", metavar="DIR",
                    help="compare part: also run pboxd and the workers of this build tree")
    ap.add_argument("--baseline-transport", choices=("udp", "shm"), default="udp",
                    help="the baseline build's workers' transport (default udp)")
    ap.add_argument("--netns-mtu", type=int, metavar="MTU",
                    help="run in a new network namespace whose loopback has this MTU")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.netns_mtu and not args.in_netns:
        return in_netns(args)

    args.build_dir = os.path.abspath(args.build_dir or os.path.join(ROOT, "build"))
    os.environ["PBOX_BUILD_DIR"] = args.build_dir
    if args.baseline_build:
        args.baseline_build = os.path.abspath(args.baseline_build)
    if not (args.seconds > 0 and args.sweep_seconds > 0):
        ap.error("--seconds and --sweep-seconds must be positive")
    if args.cores < 1:
        ap.error("--cores must be at least 1")
    if args.max_inflight < 0:
        ap.error("--max-inflight must be 0 (libpbox's default) or more")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for p in parts:
        if p not in ("main", "mtu", "sweep", "compare"):
            ap.error("--parts: unknown part '%s' (main, mtu, sweep, compare)" % p)
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
    if "compare" in parts:
        t0, load = time.time(), os.getloadavg()[0]
        rows = [compare(args, args.compare_model, n, int(m))
                for m in args.compare_mtus.split(",") for n in workers]
        compare_table(rows, args, load, time.time() - t0)
        everything += rows
        if any(r["errors"] for r in rows):
            everything.append({"error": "compare: some runs failed"})
    failed = any("error" in r for r in everything)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 1 if failed else 0


def in_netns(args):
    """Run this benchmark again inside a new network namespace whose loopback has MTU
    args.netns_mtu; the namespace is deleted afterwards, whatever happens."""
    ns = "pbox-bench-%d" % os.getpid()
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "mtu", str(args.netns_mtu), "up"],
                       check=True)
        print("in network namespace %s, loopback mtu %d" % (ns, args.netns_mtu))
        sys.stdout.flush()
        return subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3",
                               os.path.abspath(__file__)] + sys.argv[1:] +
                              ["--in-netns"]).returncode
    except (OSError, subprocess.CalledProcessError) as e:
        print("cannot set up the namespace (root needed): %s" % e, file=sys.stderr)
        return 1
    finally:
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
