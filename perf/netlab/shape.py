#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/netlab/shape.py: issue 10's target shape at a scale of rates, in one command.

N workers on R Mbit/s links and the appliance on F x R (default 4 workers, F = 4), MTU
1500, the ResNet-50 gradient; for every R of --rates: pbox (and its variants, e.g. the
appliance's result pacer) and Gloo allreduce on the same lab, interleaved over --rounds
rounds (the order alternates), beside the link-rate bound (gradient bytes / R) and a
CPU-bound estimate (pbox over unlimited veths in the same topology, also interleaved
with Gloo). Then, optionally, the loss curve at one rate: --losses on every link, both
directions (netlab's loss methods; 'xdp' applies it to Gloo too, and its loss-free point
keeps the XDP program attached at probability 0 so that both run the same path).

    /usr/bin/python3 perf/netlab/shape.py run --rates 1000,400,200,100 --rounds 2 \\
        --losses 0,0.001,0.01,0.05 --loss-rate auto --json perf/results/netlab_shape.json
    /usr/bin/python3 perf/netlab/shape.py table perf/results/netlab_shape.json

Per point: each system's exchange times (the slowest rank's per timed iteration, pooled
over the rounds: median, min, max, each round's median), x the link-rate bound, x the
CPU bound, Gloo / pbox, and what says which resource binds: the workers' link
utilisation (bytes their interfaces sent per exchange x 8 / (R x median)), the tbf drops,
pbox's retransmissions and pboxd's busy %. "binds" is "link" when the link-rate bound
exceeds the CPU bound, else "cpu". Run as root (namespaces), with Debian's python3.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netlab  # noqa: E402
from netlab import Lab, LabError, Scenario  # noqa: E402

# pbox variants: extra environment for pboxd (and the workers) of each run.
VARIANTS = {
    "pbox": {"PBOX_PACE": "0", "PBOX_KPACE": "0"},  # the default: sent as they complete
    "pbox-pace": {"PBOX_PACE": "1"},     # the core loop's per-worker pacer (core/pace.h)
    # kernel pacing (transport/udp/kpace.h): departure times on every message, pboxd's per
    # worker at the worker link rate (PBOX_KPACE_RATE, set per point), libpbox's at its
    # congestion controller's rate; honoured only where fq is on the egress (--host-qdisc)
    "pbox-kpace": {"PBOX_PACE": "0", "PBOX_KPACE": "1"},
}
# pbox-old: the default, with libpbox and pbox-bench-comm from --old-build (a build of an
# earlier commit: before/after comparisons in one interleaved run); pboxd is this build's.
OLD = "pbox-old"


def parse_list(text, conv, what):
    try:
        out = [conv(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise LabError("%s: '%s' is not a comma-separated list" % (what, text))
    if not out:
        raise LabError("%s: empty list" % what)
    return out


def with_env(env, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_one(lab, sc, system, build_dir, loss, timeout, old_build=None):
    if system == "gloo":
        return netlab.run_gloo(lab, sc, timeout)
    if system == OLD:
        return with_env(VARIANTS["pbox"], lambda: run_old(lab, sc, build_dir, old_build, loss,
                                                          timeout))
    env = dict(VARIANTS[system])
    if env.get("PBOX_KPACE") == "1" and sc.worker_bps():
        env["PBOX_KPACE_RATE"] = "%d" % int(sc.worker_bps())
    return with_env(env, lambda: netlab.run_pbox(lab, sc, build_dir, loss, timeout))


def run_old(lab, sc, build_dir, old_build, loss, timeout):
    """pbox with the workers' pbox-bench-comm (and its libpbox) from old_build, pboxd from
    build_dir: a directory of links that netlab.run_pbox takes as its build."""
    mix = os.path.join(old_build, "netlab-mix")
    os.makedirs(os.path.join(mix, "perf"), exist_ok=True)
    os.makedirs(os.path.join(mix, "dataplane"), exist_ok=True)
    links = {os.path.join("perf", "pbox-bench-comm"): old_build,
             os.path.join("dataplane", "libpbox.so.0"): old_build,
             os.path.join("dataplane", "pboxd"): build_dir}
    for rel, src in links.items():
        dst = os.path.join(mix, rel)
        if os.path.lexists(dst):
            os.unlink(dst)
        os.symlink(os.path.realpath(os.path.join(src, rel)), dst)
    return netlab.run_pbox(lab, sc, mix, loss, timeout)


def pooled(runs, sc, nbytes, rate_bps):
    """Summary of one system's runs (one per round) at one point."""
    ok = [r for r in runs if r.get("status") == "ok"]
    out = {"rounds": len(runs), "failed": [r.get("error") for r in runs
                                           if r.get("status") != "ok"]}
    if not ok:
        return out
    times = [t for r in ok for t in r["iter_seconds"]]
    out.update(netlab.summary(times))
    out["iter_seconds"] = times
    out["round_medians_s"] = [r["median_s"] for r in ok]
    # steadiness: how far single exchanges stray from the median
    out["max_over_median"] = out["max_s"] / out["median_s"]
    out["cv"] = statistics.pstdev(times) / statistics.mean(times)
    kp = [r["kpace"] for r in ok if r.get("kpace")]
    if kp:
        out["kpace"] = {"on": all(k["on"] for k in kp), "egress_fq": min(
            k["egress_fq"] for k in kp), **{c: sum(k[c] for k in kp) for c in (
                "stamped", "delayed", "capped")}, "lead_max_ms": max(
                    k.get("lead_max_ms", 0) for k in kp)}
    exch = sum(len(r["iter_seconds"]) + sc.warmup for r in ok)
    wl = [v for r in ok for k, v in r["links"].items() if k != "app"]
    wtx = sum(v["tx_bytes"] for v in wl) / exch / sc.workers
    out["worker_tx_bytes_per_exchange"] = wtx
    if rate_bps:
        out["worker_link_utilisation"] = wtx * 8 / rate_bps / out["median_s"]
    out["tbf_drops_host"] = sum(v["tbf_drops_host"] for r in ok for v in r["links"].values())
    out["tbf_drops_switch"] = sum(v["tbf_drops_switch"] for r in ok
                                  for v in r["links"].values())
    if "retransmits" in ok[0]:
        out["retransmits"] = sum(r["retransmits"] for r in ok)
        frag = ok[0]["frag_bytes"]
        out["retransmitted_payload_pct"] = 100.0 * out["retransmits"] * frag / (
            nbytes * sc.workers * exch)
        busy = [r["pboxd"]["busy_pct"] for r in ok if r["pboxd"].get("busy_pct") is not None]
        out["pboxd_busy_pct"] = statistics.mean(busy) if busy else None
        out["pboxd"] = {k: sum((r["pboxd"].get(k) or 0) for r in ok)
                        for k in ("dups", "rx_retransmits", "replies_resent", "dropped")}
    inj = [r["loss_injected"] for r in ok if "loss_injected" in r]
    if inj:
        fr = sum(v["frames"] for d in inj for v in d.values())
        dr = sum(v["dropped"] for d in inj for v in d.values())
        out["loss_injected"] = {"frames": fr, "dropped": dr,
                                "rate": dr / fr if fr else None}
    return out


def run_point(args, sc, systems, build_dir, nbytes, rate_bps, loss_always=False,
              log=None):
    """Every system of `systems` on one lab, --rounds times, order alternating."""
    b = netlab.bounds(sc, nbytes)
    timeout = sc.timeout or netlab.default_timeout(sc, b)
    runs = {s: [] for s in systems}
    loss = netlab.LOSS_METHODS[sc.loss_method](sc.loss, sc.seed, build_dir)
    if loss_always and hasattr(loss, "always"):
        loss.always = True
    with Lab(sc) as lab:
        loss.apply(lab)
        counted = hasattr(loss, "counters") and loss.links
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else list(reversed(systems))
            for s in order:
                if s == "gloo" and sc.loss > 0 and "gloo" not in loss.systems:
                    runs[s].append({"status": "skipped", "error": "loss method %s: pbox "
                                    "only" % sc.loss_method})
                    continue
                before = loss.counters(lab) if counted else None
                t0 = time.time()
                try:
                    r = run_one(lab, sc, s, build_dir, loss, timeout, args.old_build)
                except LabError as e:
                    r = {"status": "failed", "error": str(e)}
                if counted:
                    after = loss.counters(lab)
                    r["loss_injected"] = {ep: {k: after[ep][k] - before[ep][k]
                                               for k in after[ep]} for ep in after}
                runs[s].append(r)
                log("  round %d %-10s %s (%.0f s)" % (
                    rnd + 1, s, "median %.3f s" % r["median_s"] if r.get("status") == "ok"
                    else "%s: %s" % (r.get("status"), r.get("error")), time.time() - t0))
    pts = {s: pooled(runs[s], sc, nbytes, rate_bps) for s in systems}
    return {"scenario": sc.to_dict(), "bounds": b, "systems": pts,
            "runs": runs, "load": os.getloadavg()[0]}


def scenario(args, rate_mbit, loss=0.0):
    d = {"workers": args.workers, "mtu": args.mtu, "model": args.model,
         "iterations": args.iterations, "warmup": args.warmup, "loss": loss,
         "loss_method": args.loss_method, "appliance_cores": args.appliance_cores,
         "worker_rate": "%gmbit" % rate_mbit if rate_mbit else "none",
         "appliance_rate": "%gmbit" % (rate_mbit * args.appliance_factor)
         if rate_mbit else "none", "seed": args.seed, "host_qdisc": getattr(args, "host_qdisc", "tbf")}
    if args.timeout:
        d["timeout"] = args.timeout
    return Scenario.from_dict(d)


def ratios(pt, link_bound, cpu_bound):
    s = pt["systems"]
    out = {}
    for name, p in s.items():
        if "median_s" not in p:
            continue
        if link_bound:
            p["over_link_bound"] = p["median_s"] / link_bound
        if cpu_bound and name != "gloo":
            p["over_cpu_bound"] = p["median_s"] / cpu_bound
        if name != "gloo" and "median_s" in s.get("gloo", {}):
            out["gloo_over_" + name] = s["gloo"]["median_s"] / p["median_s"]
    return out


def cmd_run(args):
    rates = [] if args.rates == "none" else parse_list(args.rates, float, "--rates")
    variants = parse_list(args.pbox, str, "--pbox")
    for v in variants:
        if v not in VARIANTS and v != OLD:
            raise LabError("--pbox: unknown variant '%s' (known: %s, %s)" % (
                v, ", ".join(VARIANTS), OLD))
    if OLD in variants:
        if not args.old_build:
            raise LabError("--pbox %s needs --old-build DIR" % OLD)
        args.old_build = os.path.abspath(args.old_build)
        for rel in ("perf/pbox-bench-comm", "dataplane/libpbox.so.0"):
            if not os.path.exists(os.path.join(args.old_build, rel)):
                raise LabError("--old-build %s has no %s" % (args.old_build, rel))
    systems = variants + (["gloo"] if args.gloo else [])
    losses = parse_list(args.losses, float, "--losses") if args.losses else []
    if any(not 0 <= p <= 0.5 for p in losses) or any(r <= 0 for r in rates):
        raise LabError("--losses must be within 0..0.5 and --rates positive")
    why = netlab.missing()
    if why:
        raise LabError(why)
    build_dir = os.path.abspath(args.build_dir)
    why = netlab.build_dir_problem(build_dir, ["pbox"])
    if why:
        raise LabError(why)
    _, sizes = netlab.read_table(scenario(args, None).model_path())
    nbytes = 4 * sum(sizes)
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    res = {"command": sys.argv, "workers": args.workers, "mtu": args.mtu,
           "model": args.model, "gradient_bytes": nbytes, "appliance_factor":
           args.appliance_factor, "rounds": args.rounds, "iterations": args.iterations,
           "warmup": args.warmup, "host": {"cpus": os.cpu_count(),
                                           "load_before": os.getloadavg()[0]},
           "data": "from RAM: each worker's gradient is %d MB, not cache-resident" % (
               nbytes // 1000000), "points": [], "loss": []}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)

    cpu = None
    if not args.no_cpu_bound:
        log("shape: CPU bound: unlimited veths, %s" % ", ".join(systems))
        pt = run_point(args, scenario(args, None), systems, build_dir, nbytes, None,
                       log=log)
        ratios(pt, None, None)
        res["cpu_bound"] = pt
        cpu = pt["systems"][variants[0]].get("median_s")
        res["cpu_bound_s"] = cpu
        save()
    for rate in rates:
        sc = scenario(args, rate)
        link = 8.0 * nbytes / (rate * 1e6)
        log("shape: %g Mbit/s workers, %g Mbit/s appliance: link-rate bound %.3f s" % (
            rate, rate * args.appliance_factor, link))
        pt = run_point(args, sc, systems, build_dir, nbytes, rate * 1e6, log=log)
        pt.update({"rate_mbit": rate, "link_bound_s": link, "cpu_bound_s": cpu,
                   "binds": None if cpu is None else ("link" if link > cpu else "cpu")})
        pt["ratios"] = ratios(pt, link, cpu)
        res["points"].append(pt)
        save()
    if losses:
        lr = args.loss_rate
        if lr == "auto" and cpu is None:
            raise LabError("--loss-rate auto needs the CPU bound and --rates")
        if lr == "auto":
            ok = [p["rate_mbit"] for p in res["points"] if p["binds"] == "link" and
                  p["link_bound_s"] >= 1.25 * cpu]
            if not ok:
                raise LabError("--loss-rate auto: no rate of --rates has its link-rate "
                               "bound 1.25x above the CPU bound")
            lr = max(ok)
        lr = float(lr)
        link = 8.0 * nbytes / (lr * 1e6)
        res["loss_rate_mbit"] = lr
        lsys = variants + (["gloo"] if args.gloo and args.loss_method == "xdp" else [])
        for p in losses:
            sc = scenario(args, lr, p)
            log("shape: loss %g (%s) at %g Mbit/s" % (p, args.loss_method, lr))
            pt = run_point(args, sc, lsys, build_dir, nbytes, lr * 1e6, loss_always=True,
                           log=log)
            pt.update({"rate_mbit": lr, "loss": p, "link_bound_s": link})
            pt["ratios"] = ratios(pt, link, cpu)
            res["loss"].append(pt)
            save()
        base = res["loss"][0]["systems"] if losses[0] == 0 else {}
        for pt in res["loss"]:
            for name, s in pt["systems"].items():
                if "median_s" in s and "median_s" in base.get(name, {}):
                    s["over_loss_free"] = s["median_s"] / base[name]["median_s"]
    res["host"]["load_after"] = os.getloadavg()[0]
    save()
    print("\n".join(table(res)))
    return 0


def fmt(x, f="%.2f"):
    return "–" if x is None else f % x


def row(label, name, s):
    if "median_s" not in s:
        return "| %s | %s | failed: %s | | | | | | | | |" % (label, name, "; ".join(
            str(e) for e in s.get("failed", [])))
    return "| %s | %s | %.2f (%.2f–%.2f) | %s | %s | %s | %s | %.0f | %s | %d / %d | %s |" % (
        label, name, s["median_s"], s["min_s"], s["max_s"], fmt(s.get("over_link_bound")),
        fmt(s.get("over_cpu_bound")), fmt(s.get("over_loss_free")),
        fmt(s.get("worker_link_utilisation")),
        s["worker_tx_bytes_per_exchange"] / 1e6, fmt(s.get("retransmitted_payload_pct"),
                                                     "%.3f"),
        s["tbf_drops_host"], s["tbf_drops_switch"], fmt(s.get("pboxd_busy_pct"), "%.0f"))


def table(res):
    out = ["| point | system | median s (min–max) | x link bound | x CPU bound | "
           "x loss-free | worker link utilisation | worker tx MB per exchange | "
           "retransmitted payload % | tbf drops host / switch | pboxd busy % |",
           "|---" * 11 + "|"]
    if "cpu_bound" in res:
        for name, s in res["cpu_bound"]["systems"].items():
            out.append(row("unlimited", name, s))
    for pt in res["points"]:
        lab = "%g Mbit/s (bound %.2f s, %s binds)" % (pt["rate_mbit"], pt["link_bound_s"],
                                                     pt["binds"])
        for name, s in pt["systems"].items():
            out.append(row(lab, name, s))
    for pt in res["loss"]:
        lab = "%g Mbit/s, loss %g" % (pt["rate_mbit"], pt["loss"])
        for name, s in pt["systems"].items():
            out.append(row(lab, name, s))
    rs = []
    for pt in res["points"]:
        for k, v in sorted(pt.get("ratios", {}).items()):
            rs.append("%g Mbit/s %s %.2f" % (pt["rate_mbit"], k.replace("_", " "), v))
    if rs:
        out += ["", "; ".join(rs)]
    return out + [""] + spread_table(res)


def spread_table(res):
    """Steadiness: every round's median and how far single exchanges stray (max / median,
    coefficient of variation), with pboxd's kernel-pacing counters where it was on."""
    out = ["| point | system | round medians s | max / median | CV | pboxd messages "
           "stamped / delayed / capped (egress fq) | pboxd most lead ms |", "|---" * 7 + "|"]
    pts = [("unlimited", res["cpu_bound"])] if "cpu_bound" in res else []
    pts += [("%g Mbit/s" % p["rate_mbit"], p) for p in res["points"]]
    pts += [("%g Mbit/s, loss %g" % (p["rate_mbit"], p["loss"]), p) for p in res["loss"]]
    for lab, pt in pts:
        for name, s in pt["systems"].items():
            if "median_s" not in s:
                continue
            k = s.get("kpace")
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                lab, name, ", ".join("%.2f" % m for m in s.get("round_medians_s", [])),
                fmt(s.get("max_over_median")), fmt(s.get("cv")),
                "%d / %d / %d (%s)" % (k["stamped"], k["delayed"], k["capped"],
                                       "yes" if k["egress_fq"] > 0 else "no")
                if k and k["on"] else "–", fmt(k.get("lead_max_ms"), "%.1f")
                if k and k["on"] and "lead_max_ms" in k else "–"))
    return out


def cmd_table(args):
    for path in args.files:
        try:
            with open(path) as f:
                res = json.load(f)
        except (OSError, ValueError) as e:
            raise LabError("%s: %s" % (path, e))
        print("\n".join(table(res)))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="shape", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("run", help="run the rate ladder (and the loss curve)")
    p.add_argument("--rates", default="1000,400,200,100",
                   help="worker link rates in Mbit/s (default 1000,400,200,100; 'none': only "
                   "the loss curve)")
    p.add_argument("--appliance-factor", type=float, default=4.0,
                   help="appliance link = factor x worker rate (default 4)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--iterations", type=int, default=3, help="timed exchanges per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved runs of every system per point (default 2)")
    p.add_argument("--appliance-cores", type=int, default=1)
    p.add_argument("--pbox", default="pbox",
                   help="pbox variants, comma-separated (%s, %s; default pbox)" %
                   (", ".join(VARIANTS), OLD))
    p.add_argument("--old-build", metavar="DIR", help="build directory of an earlier "
                   "commit: its libpbox and pbox-bench-comm run as system %s" % OLD)
    p.add_argument("--no-gloo", dest="gloo", action="store_false", help="pbox only")
    p.add_argument("--no-cpu-bound", action="store_true",
                   help="skip the unlimited-veth point (the CPU bound)")
    p.add_argument("--losses", help="loss probabilities for the loss curve, e.g. "
                   "0,0.001,0.01,0.05 (put 0 first: the ratios are to it)")
    p.add_argument("--loss-rate", default="auto", help="worker rate (Mbit/s) of the loss "
                   "curve, or 'auto': the highest rate whose link bound is >= 1.25x the "
                   "CPU bound")
    p.add_argument("--loss-method", default="xdp", choices=sorted(netlab.LOSS_METHODS))
    p.add_argument("--host-qdisc", default="tbf", choices=("tbf", "tbf+fq"),
                   help="each namespace's egress qdisc (netlab host_qdisc; tbf+fq: kernel "
                   "pacing is honoured)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, help="seconds per system run")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--build-dir", default=os.environ.get("PBOX_BUILD_DIR") or
                   os.path.join(netlab.ROOT, "build"))
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("table", help="markdown table of shape.py JSON files")
    p.add_argument("files", nargs="+")
    p.set_defaults(fn=cmd_table)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except LabError as e:
        print("shape: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
