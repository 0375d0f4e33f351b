#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/netlab: an emulated cluster in network namespaces (see perf/netlab/README.md).

An appliance and N workers, each in its own network namespace, joined by veth pairs to a
Linux bridge in a "switch" namespace. Every link is rate-limited in both directions with
tc tbf (the egress of the switch side and of the namespace side), the appliance link at
its own rate; all veths and the bridge carry the chosen MTU. On that lab it runs pboxd
with pbox-bench-comm workers, and Gloo allreduce through torch.distributed on the same
worker links with the same gradient tensors, and writes per-system exchange times as
JSON.

    /usr/bin/python3 perf/netlab/netlab.py run --workers 4 --worker-rate 200mbit \\
        --mtu 1500 --system pbox,gloo --iterations 5 --json out.json
    /usr/bin/python3 perf/netlab/netlab.py run --scenario perf/netlab/scenarios/rate200.toml
    /usr/bin/python3 perf/netlab/netlab.py up --workers 2      # a lab to poke at; Ctrl-C
    /usr/bin/python3 perf/netlab/netlab.py cleanup             # leftovers of dead runs

As a library (tests, other benchmarks):

    from netlab import Lab, Scenario
    sc = Scenario.from_dict({"workers": 2, "worker_rate": "50mbit"})
    with Lab(sc) as lab:
        lab.run(lab.worker_ns[0], ["ping", "-c1", lab.app_ip])

Names: every namespace of a run is called netlab-<pid>-<random>-<role> (roles: sw, app,
w0, w1, ...), so parallel runs and other tests never collide, and `cleanup` can tell a
dead run's leftovers (its pid is gone) from a live run's. Interfaces live inside the
namespaces only (created in the switch namespace, one end moved), so their names never
clash with the host's.

Loss: netem is not available on this machine (nor nftables/iptables). Two methods
(LOSS_METHODS; `loss_method`): "transport", pbox's own fault injector (pboxd's `fault`
config and the workers' PBOX_FAULT: every datagram sent by pboxd and by each worker is
dropped with probability `loss`), which Gloo cannot be given (its runs are skipped with
that reason); and "xdp", nicfw's test-only loss injector (pbox-xdp-loss, an XDP program)
on the receiving side of every namespace's veth, which drops each frame with probability
`loss` whatever the system (TCP offloads are turned off on those veths so that a frame
is one MTU-sized packet).

Teardown always runs: the Lab is a context manager, registers an atexit handler and
handles SIGTERM/SIGINT/SIGHUP; it kills the processes it started (and any process left
in its namespaces) and deletes its namespaces, which removes their veths and the bridge.
"""
import argparse
import atexit
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "dpdk"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

PREFIX = "netlab-"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
IFNAME = "nl0"  # the link's name inside every namespace
SUBNET = "10.232.0."  # tests/dpdk/netns.py's CTL_IP is the appliance's address
APP_IP = SUBNET + "1"
WORKER_IP0 = 11
MAX_WORKERS = 200
GLOO_PORT = 29500
CROSS_PORT0 = 5201
TOKEN = "netlab"
# pbox-tsb: pbox with the job's results broadcast down a tree of the workers (TSB;
# tree_degree, tree_depth)
# pbox-dvf: pbox with DVF on the wire (pushes and results filtered; dvf_low, dvf_up);
# pbox-dvf-tsb: both. DVF systems push Gaussian gradients (grad_sigma), new every
# iteration; the others push a constant gradient (the bytes on the wire are the same).
SYSTEMS = ("pbox", "pbox-tsb", "pbox-dvf", "pbox-dvf-tsb", "gloo", "ps-lite")
PBOX_SYSTEMS = ("pbox", "pbox-tsb", "pbox-dvf", "pbox-dvf-tsb")
PS_LITE_REASON = ("ps-lite is not built: it needs its sources and ZeroMQ fetched from the "
                  "internet, which this machine does not have")


def wait_all(procs, timeout):
    """Wait for every process, reading all their pipes at once; [(rc, stdout, stderr)].
    Reading them one process at a time would leave the others' pipes unread: a rank that
    fills its 64 KiB stdout pipe (a JSON event per step) blocks in write(), and a BSP job
    then stalls every rank. Past timeout seconds all are killed and LabError raised."""
    res = [None] * len(procs)

    def drain(r, p):
        res[r] = p.communicate()

    ths = [threading.Thread(target=drain, args=(r, p), daemon=True)
           for r, p in enumerate(procs)]
    for t in ths:
        t.start()
    deadline = time.time() + timeout
    for r, t in enumerate(ths):
        t.join(max(0, deadline - time.time()))
        if t.is_alive():
            for q in procs:
                q.kill()
            raise LabError("rank %d did not finish within %d s" % (r, timeout))
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, res)]


class LabError(Exception):
    """A scenario that cannot be run or a lab that cannot be built; the message says why."""


# ---- scenario ------------------------------------------------------------------------

RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(v, what="rate"):
    """Bits per second from "100mbit", "1gbit", "1.5gbit", "250m", 1e9; None for
    "none"/"off"/"unlimited"/None (no rate limit)."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise LabError("%s: %r is not a rate" % (what, v))
    if isinstance(v, (int, float)):
        bps = float(v)
    else:
        s = str(v).strip().lower()
        if s in ("none", "off", "unlimited", ""):
            return None
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)", s)
        if not m or m.group(2) not in RATE_UNITS and m.group(2) != "":
            raise LabError("%s: '%s' is not a rate (e.g. 100mbit, 1gbit, 1.5gbit, none)" %
                           (what, v))
        bps = float(m.group(1)) * RATE_UNITS.get(m.group(2), 1)
    if not (8e3 <= bps <= 4e11):
        raise LabError("%s: %r is outside 8kbit..400gbit" % (what, v))
    return bps


def fmt_rate(bps):
    if bps is None:
        return "unlimited"
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= f:
            return "%g%s" % (bps / f, unit)
    return "%gbit" % bps


def parse_size(v, what="size"):
    """Bytes from 32768, "32K", "4M"."""
    if isinstance(v, bool):
        raise LabError("%s: %r is not a size" % (what, v))
    if isinstance(v, int):
        n = v
    else:
        m = re.fullmatch(r"([0-9]+)\s*([kKmMgG]?)[bB]?", str(v).strip())
        if not m:
            raise LabError("%s: '%s' is not a size (e.g. 32K, 65536, 4M)" % (what, v))
        n = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
    if n <= 0:
        raise LabError("%s: must be positive" % what)
    return n


def _int(lo, hi):
    def conv(v, what):
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise LabError("%s: %r is not an integer" % (what, v))
        try:
            n = int(v)
        except ValueError:
            raise LabError("%s: '%s' is not an integer" % (what, v))
        if not lo <= n <= hi:
            raise LabError("%s: %d is outside %d..%d" % (what, n, lo, hi))
        return n
    return conv


def _float(lo, hi):
    def conv(v, what):
        if isinstance(v, bool):
            raise LabError("%s: %r is not a number" % (what, v))
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise LabError("%s: '%s' is not a number" % (what, v))
        if not (lo <= x <= hi):
            raise LabError("%s: %g is outside %g..%g" % (what, x, lo, hi))
        return x
    return conv


def _rate(v, what):
    return parse_rate(v, what)


def _opt(conv):
    def c(v, what):
        if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "auto")):
            return None
        return conv(v, what)
    return c


def _size(v, what):
    return parse_size(v, what)


def _systems(v, what):
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out = []
    for s in items:
        s = str(s).strip().lower()
        if not s:
            continue
        if s not in SYSTEMS:
            raise LabError("%s: unknown system '%s' (%s)" % (what, s, ", ".join(SYSTEMS)))
        if s not in out:
            out.append(s)
    if not out:
        raise LabError("%s: no system given (%s)" % (what, ", ".join(SYSTEMS)))
    return out


def _choice(*choices):
    def conv(v, what):
        if v not in choices:
            raise LabError("%s: '%s' is not one of %s" % (what, v, ", ".join(choices)))
        return v
    return conv


def _model(v, what):
    if not isinstance(v, str) or not v:
        raise LabError("%s: a model name (perf/models/NAME.txt) or a table path" % what)
    path = v if os.sep in v or v.endswith(".txt") else os.path.join(ROOT, "perf", "models",
                                                                   v + ".txt")
    if not os.path.isfile(path):
        raise LabError("%s: no model table %s (names: %s)" % (
            what, path, ", ".join(sorted(f[:-4] for f in os.listdir(
                os.path.join(ROOT, "perf", "models")) if f.endswith(".txt")))))
    return v


def _endpoint(v, what, workers):
    if v == "app":
        return v
    m = re.fullmatch(r"w([0-9]+)", str(v))
    if not m or int(m.group(1)) >= workers:
        raise LabError("%s: '%s' is not an endpoint (app, w0 .. w%d)" % (what, v, workers - 1))
    return v


def _cross(v, what):
    if not isinstance(v, (list, tuple)):
        raise LabError("%s: a list of flows {from, to, rate, proto}" % what)
    out = []
    for i, f in enumerate(v):
        w = "%s[%d]" % (what, i)
        if isinstance(f, str):  # "w0>w1:50mbit[:tcp]" on the command line
            m = re.fullmatch(r"([a-z0-9]+)>([a-z0-9]+):([^:]+)(?::(udp|tcp))?", f.strip())
            if not m:
                raise LabError("%s: '%s' is not FROM>TO:RATE[:udp|tcp] (e.g. w0>w1:50mbit)" %
                               (w, f))
            f = {"from": m.group(1), "to": m.group(2), "rate": m.group(3),
                 "proto": m.group(4) or "udp"}
        if not isinstance(f, dict):
            raise LabError("%s: a table {from, to, rate, proto}" % w)
        unknown = set(f) - {"from", "to", "rate", "proto"}
        if unknown:
            raise LabError("%s: unknown key(s) %s" % (w, ", ".join(sorted(unknown))))
        for k in ("from", "to", "rate"):
            if k not in f:
                raise LabError("%s: '%s' is missing" % (w, k))
        proto = f.get("proto", "udp")
        if proto not in ("udp", "tcp"):
            raise LabError("%s.proto: '%s' is not udp or tcp" % (w, proto))
        if parse_rate(f["rate"], w + ".rate") is None:
            raise LabError("%s.rate: cross traffic needs a rate" % w)
        if f["from"] == f["to"]:
            raise LabError("%s: from and to are the same namespace" % w)
        out.append({"from": f["from"], "to": f["to"], "rate": f["rate"], "proto": proto})
    return out


# name -> (converter, default, help). Rates are stored as given (parsed on use) so that a
# scenario prints back the way it was written.
FIELDS = {
    "workers": (_int(1, MAX_WORKERS), 4, "worker namespaces (and ranks)"),
    "worker_rate": (_rate, "1gbit", "rate of every worker link, each direction "
                                    "(tbf; 'none': unlimited)"),
    "appliance_rate": (_rate, None, "rate of the appliance link, each direction "
                                    "(default: unlimited)"),
    "mtu": (_int(1280, 65535), 1500, "MTU of every veth and the bridge, and pboxd's mtu"),
    "loss": (_float(0.0, 0.5), 0.0, "random loss probability per datagram and direction"),
    "loss_method": (_choice("transport", "xdp"), "transport",
                    "how loss is applied: 'transport' (pbox's fault injector, pbox only) "
                    "or 'xdp' (nicfw's XDP loss injector on every link, every system)"),
    "model": (_model, "resnet50", "gradient tensors: perf/models/NAME.txt or a table path"),
    "systems": (_systems, ["pbox", "gloo"], "systems to run: pbox, gloo, ps-lite"),
    "iterations": (_int(1, 100000), 5, "timed exchanges per system"),
    "warmup": (_int(1, 1000), 1, "untimed exchanges first"),
    "chunk_bytes": (_opt(_size), None, "pboxd chunk_bytes (default: pboxd's)"),
    "appliance_cores": (_int(1, 64), 1, "pboxd data-plane cores"),
    "max_inflight": (_opt(_int(1, 1 << 20)), None, "libpbox max_inflight (default: "
                                                   "libpbox's)"),
    "queue_ms": (_float(0.1, 10000), 10.0, "switch port buffer: the tbf queue of the "
                                           "switch side of each link, in ms at its rate"),
    "host_queue": (_int(1, 1000000), 1000, "host NIC queue: the tbf queue of the namespace "
                                           "side of each link, in MTU-sized packets "
                                           "(Linux's default txqueuelen is 1000)"),
    "burst": (_opt(_size), None, "tbf burst bytes (default: max(64K, 1 ms at the rate))"),
    "host_qdisc": (_choice("tbf", "tbf+fq"), "tbf",
                   "each namespace's own egress: 'tbf' alone, or 'tbf+fq' (fq as the tbf's "
                   "child, host_queue packets per flow: it honours SO_TXTIME departure "
                   "times, pbox's kernel pacing; refused where the kernel has no sch_fq)"),
    "cross": (_cross, [], "cross-traffic flows (iperf3): FROM>TO:RATE[:udp|tcp]"),
    "gloo_bucket_mb": (_float(0.001, 4096), 25.0, "Gloo bucket cap in MB (DDP's default)"),
    "timeout": (_opt(_float(1, 86400)), None, "seconds per system run (default: from "
                                              "the link-rate bound)"),
    "seed": (_int(0, 1 << 31), 1, "fault-injector seed"),
    "tree_degree": (_int(1, 64), 2, "pbox-tsb: the broadcast tree's degree T"),
    "tree_depth": (_int(1, 16), 3, "pbox-tsb: the broadcast tree's depth H"),
    "dvf_low": (_float(0.0, 1e30), 2.0, "pbox-dvf*: the job's dvf low (delta_low)"),
    "dvf_up": (_float(0.0, 1e30), 8.0, "pbox-dvf*: the job's dvf up (delta_up)"),
    "grad_sigma": (_float(1e-30, 1e30), 1.2, "pbox-dvf*: deviation of the Gaussian "
                                             "gradients pushed (pbox-bench-comm "
                                             "--grad-sigma)"),
}


class Scenario:
    """A validated scenario: one attribute per FIELDS entry."""

    def __init__(self, **kw):
        for k, (_, default, _) in FIELDS.items():
            setattr(self, k, kw.get(k, default))

    @classmethod
    def from_dict(cls, d, where="scenario"):
        if not isinstance(d, dict):
            raise LabError("%s: expected a table of settings" % where)
        unknown = sorted(set(d) - set(FIELDS))
        if unknown:
            raise LabError("%s: unknown setting(s) %s (known: %s)" %
                           (where, ", ".join(unknown), ", ".join(FIELDS)))
        vals = {}
        for k, v in d.items():
            conv = FIELDS[k][0]
            what = "%s.%s" % (where, k)
            if k == "cross":
                continue
            r = conv(v, what)
            vals[k] = v if k in ("worker_rate", "appliance_rate") else r
        sc = cls(**vals)
        if "cross" in d:
            sc.cross = _cross(d["cross"], where + ".cross")
        for i, f in enumerate(sc.cross):
            for k in ("from", "to"):
                _endpoint(f[k], "%s.cross[%d].%s" % (where, i, k), sc.workers)
        return sc

    def to_dict(self):
        return {k: getattr(self, k) for k in FIELDS}

    # derived values
    def worker_bps(self):
        return parse_rate(self.worker_rate)

    def appliance_bps(self):
        return parse_rate(self.appliance_rate)

    def model_path(self):
        v = self.model
        if os.sep in v or v.endswith(".txt"):
            return os.path.abspath(v)
        return os.path.join(ROOT, "perf", "models", v + ".txt")


def load_scenarios(path):
    """Scenarios from a JSON or TOML file: its top-level settings are one scenario, or,
    with a list `scenario` ([[scenario]] in TOML), the defaults of each listed one."""
    try:
        if path.endswith(".toml"):
            import tomllib
            with open(path, "rb") as f:
                d = tomllib.load(f)
        else:
            with open(path) as f:
                d = json.load(f)
    except OSError as e:
        raise LabError("scenario file %s: %s" % (path, e.strerror))
    except ValueError as e:  # json.JSONDecodeError and tomllib.TOMLDecodeError
        raise LabError("scenario file %s: %s" % (path, e))
    if not isinstance(d, dict):
        raise LabError("scenario file %s: expected a table of settings" % path)
    items = d.pop("scenario", None)
    if items is None:
        return [d]
    if not isinstance(items, list) or not items or not all(isinstance(x, dict) for x in items):
        raise LabError("scenario file %s: 'scenario' must be a non-empty list of tables" % path)
    return [dict(d, **x) for x in items]


# ---- prerequisites -------------------------------------------------------------------

def missing(need_tc=True):
    """Why a lab cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc); run as root"
    for tool in ("ip",) + (("tc",) if need_tc else ()):
        if shutil.which(tool) is None and not os.path.exists("/usr/sbin/" + tool) \
                and not os.path.exists("/sbin/" + tool):
            return "the '%s' command (iproute2) is missing: apt-get install iproute2" % tool
    return None


def build_dir_problem(build_dir, systems):
    """Why the build tree cannot run the scenario's systems, or None."""
    if "pbox" not in systems:
        return None
    for rel in ("dataplane/pboxd", "perf/pbox-bench-comm"):
        p = os.path.join(build_dir, rel)
        if not os.path.exists(p):
            return ("%s not found: build first (meson setup %s && ninja -C %s) or give "
                    "--build-dir" % (p, build_dir, build_dir))
    return None


def sh(*cmd, ns=None, check=True, timeout=60):
    full = (["ip", "netns", "exec", ns] if ns else []) + [str(c) for c in cmd]
    try:
        r = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabError("%s: did not finish within %d s" % (" ".join(full), timeout))
    if check and r.returncode != 0:
        raise LabError("%s: %s" % (" ".join(full), r.stderr.strip() or "exit %d" %
                                   r.returncode))
    return r


def list_namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [l.split()[0] for l in r.stdout.splitlines() if l.strip()]


def ns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def kill_ns_processes(ns):
    """SIGKILL every process in namespace ns (they are a lab's by its name) and wait."""
    pids = ns_pids(ns)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + 5
    while pids and time.time() < deadline:
        pids = [p for p in pids if os.path.exists("/proc/%d" % p)]
        time.sleep(0.05)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup(all_runs=False, run=None):
    """Remove namespaces of netlab runs whose process is gone (all_runs: of every run; run:
    the one prefix netlab-<pid>-<tag>). Returns the names removed."""
    removed = []
    for ns in list_namespaces():
        m = re.fullmatch(re.escape(PREFIX) + r"([0-9]+)-([0-9a-z]+)-[a-z0-9]+", ns)
        if not m:
            continue
        if run is not None and not ns.startswith(run):
            continue
        if run is None and not all_runs and _pid_alive(int(m.group(1))):
            continue
        kill_ns_processes(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        removed.append(ns)
    return removed


# ---- loss methods (the seam for issue 13's XDP program) ------------------------------

class TransportLoss:
    """Loss injected by pbox's own transport: pboxd's `fault` config and PBOX_FAULT for
    each worker drop every datagram they send with probability p. Affects pbox only."""
    systems = PBOX_SYSTEMS

    def __init__(self, p, seed, build_dir=None):
        self.p = p
        self.seed = seed

    def apply(self, lab):
        pass  # nothing on the links

    def pboxd_fault(self):
        return "drop=%g,seed=%d" % (self.p, self.seed) if self.p > 0 else None

    def worker_env(self, rank):
        if self.p <= 0:
            return {}
        return {"PBOX_FAULT": "drop=%g,seed=%d" % (self.p, self.seed + 1 + rank)}


class XdpLoss:
    """Loss on the links: nicfw/loss.bpf.c (pbox-xdp-loss) on the XDP hook of every
    namespace's own veth drops each frame it receives with probability p, decided by a
    hash of (seed + link index, frame index). A datagram crosses exactly one such hook
    (its destination's), so the loss per datagram and direction is p, as with the
    transport method, for every system. TSO/GSO/GRO are turned off on those veths so that
    a TCP frame is one MTU-sized segment."""
    systems = SYSTEMS

    def __init__(self, p, seed, build_dir=None):
        self.p = p
        self.seed = seed
        self.tool = os.path.join(build_dir or os.path.join(ROOT, "build"),
                                 "nicfw", "pbox-xdp-loss")
        self.links = []
        self.always = False  # attach at p = 0 too (a loss-free point on the same path)

    def apply(self, lab):
        if self.p <= 0 and not self.always:
            return
        if not os.path.exists(self.tool):
            raise LabError("%s not found: loss_method 'xdp' needs a build with nicfw/ "
                           "(clang, bpftool, libbpf-dev)" % self.tool)
        for i, ep in enumerate(["app"] + ["w%d" % k for k in range(lab.sc.workers)]):
            ns, _ = lab.ns_of(ep)
            if shutil.which("ethtool"):
                sh("ethtool", "-K", IFNAME, "tso", "off", "gso", "off", "gro", "off", ns=ns,
                   check=False)
            sh(self.tool, "attach", IFNAME, "--probability", repr(self.p), "--seed",
               self.seed + i, ns=ns)
            self.links.append((ep, ns))

    def counters(self, lab):
        """{endpoint: {"frames": n, "dropped": n}} of each link's injector."""
        return {ep: json.loads(sh(self.tool, "stats", IFNAME, ns=ns).stdout)
                for ep, ns in self.links}

    def pboxd_fault(self):
        return None

    def worker_env(self, rank):
        return {}


LOSS_METHODS = {"transport": TransportLoss, "xdp": XdpLoss}


# ---- the lab -------------------------------------------------------------------------

class Lab:
    """Namespaces, veths, bridge and rate limits of one scenario; see the file comment."""

    _live = []

    def __init__(self, sc, run_id=None):
        self.sc = sc
        tag = run_id or "%d-%s" % (os.getpid(), "".join(
            random.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(6)))
        self.prefix = PREFIX + tag + "-"
        self.sw_ns = self.prefix + "sw"
        self.app_ns = self.prefix + "app"
        self.worker_ns = [self.prefix + "w%d" % i for i in range(sc.workers)]
        self.app_ip = APP_IP
        self.worker_ip = [SUBNET + "%d" % (WORKER_IP0 + i) for i in range(sc.workers)]
        self.procs = []  # also filled by tests/dpdk/netns.Pboxd
        self.created = []
        self._old = None
        self.closed = False

    def namespaces(self):
        return [self.sw_ns, self.app_ns] + self.worker_ns

    def ns_of(self, endpoint):
        """Namespace and address of "app" or "w<i>"."""
        if endpoint == "app":
            return self.app_ns, self.app_ip
        i = int(endpoint[1:])
        return self.worker_ns[i], self.worker_ip[i]

    # -- set-up and teardown --

    def __enter__(self):
        Lab._live.append(self)
        if len(Lab._live) == 1:
            atexit.register(Lab._close_all)
        self._old = {}
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                self._old[s] = signal.signal(s, Lab._on_signal)
            except ValueError:  # not the main thread: atexit and __exit__ still run
                pass
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et, ev, tb):
        self.close()
        return False

    @staticmethod
    def _close_all():
        for lab in list(Lab._live):
            lab.close()

    @staticmethod
    def _on_signal(signo, frame):
        print("netlab: signal %d: tearing the lab down" % signo, file=sys.stderr, flush=True)
        Lab._close_all()
        os._exit(128 + signo)

    def _create(self):
        sc = self.sc
        for ns in self.namespaces():
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            for k in ("all", "default"):
                sh("sysctl", "-qw", "net.ipv6.conf.%s.disable_ipv6=1" % k, ns=ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "link", "add", "name", "br0", "type", "bridge", ns=self.sw_ns)
        sh("ip", "link", "set", "br0", "mtu", sc.mtu, ns=self.sw_ns, check=False)
        sh("ip", "link", "set", "br0", "up", ns=self.sw_ns)
        for t in ("iptables", "ip6tables", "arptables"):
            sh("sysctl", "-qw", "net.bridge.bridge-nf-call-%s=0" % t, ns=self.sw_ns, check=False)
        self._link(self.app_ns, "app", self.app_ip, sc.appliance_bps())
        for i, ns in enumerate(self.worker_ns):
            self._link(ns, "w%d" % i, self.worker_ip[i], sc.worker_bps())
        sh("ip", "link", "set", "br0", "mtu", sc.mtu, ns=self.sw_ns)

    def _link(self, ns, swname, ip, bps):
        sc = self.sc
        sh("ip", "link", "add", "name", IFNAME, "mtu", sc.mtu, "type", "veth", "peer", "name",
           swname, "mtu", sc.mtu, ns=self.sw_ns)
        sh("ip", "link", "set", IFNAME, "netns", ns, ns=self.sw_ns)
        sh("ip", "link", "set", swname, "master", "br0", "up", ns=self.sw_ns)
        sh("ip", "addr", "add", ip + "/24", "dev", IFNAME, ns=ns)
        sh("ip", "link", "set", IFNAME, "up", ns=ns)
        if bps is not None:
            self._tbf(self.sw_ns, swname, bps, host=False)  # towards the namespace
            self._tbf(ns, IFNAME, bps, host=True)  # from the namespace

    def tbf_args(self, bps, host):
        """tc tbf parameters of one link direction: host (the namespace's own egress, a
        NIC queue of host_queue packets) or the switch port's (queue_ms at the rate)."""
        sc = self.sc
        burst = sc.burst or max(64 << 10, int(bps / 8 / 1000))
        if host:
            limit = sc.host_queue * (sc.mtu + 14)
        else:
            limit = int(bps / 8 * sc.queue_ms / 1000)
        return ["rate", "%dbit" % int(bps), "burst", str(burst),
                "limit", str(max(limit, burst, 2 * (sc.mtu + 14)))]

    def _tbf(self, ns, dev, bps, host):
        sh("tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf",
           *self.tbf_args(bps, host), ns=ns)
        if host and self.sc.host_qdisc == "tbf+fq":
            # fq under the tbf: it holds each packet until its departure time (SO_TXTIME)
            # and hands it to the tbf, which still limits the link's rate.
            r = sh("tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "fq",
                   "flow_limit", self.sc.host_queue, "limit", 10 * self.sc.host_queue,
                   ns=ns, check=False)
            if r.returncode != 0:
                raise LabError("host_qdisc tbf+fq: %s (%s)" % (
                    r.stderr.strip(), "this kernel has no sch_fq: CONFIG_NET_SCH_FQ"
                    if "unknown" in r.stderr else "tc qdisc add ... fq"))

    def close(self):
        """Kill what runs in the lab and delete its namespaces (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self.procs = []
        for ns in reversed(self.created):
            kill_ns_processes(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []
        if self._old:
            for s, h in self._old.items():
                signal.signal(s, h)
            self._old = None
        if self in Lab._live:
            Lab._live.remove(self)

    # -- running things --

    def popen(self, ns, argv, env=None, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", ns] + [str(a) for a in argv],
                             env=None if env is None else dict(os.environ, **env), **kw)
        self.procs.append(p)
        return p

    def run(self, ns, argv, **kw):
        return sh(*argv, ns=ns, **kw)

    def run_ranks(self, cmds, envs, timeout):
        """Run cmds[r] in worker namespace r, all at once; return [(rc, stdout, stderr)].
        Past timeout seconds all are killed and LabError raised."""
        procs = [self.popen(self.worker_ns[r], argv, env=envs[r], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
                 for r, argv in enumerate(cmds)]
        return wait_all(procs, timeout)

    def link_counters(self):
        """{endpoint: {tx_bytes, rx_bytes, tx_packets, rx_packets, tbf_drops_host,
        tbf_drops_switch}} of each namespace's link: its interface's counters (tx: sent by
        the namespace) and the drops of the tbf on its own egress (host) and on the switch
        port's egress towards it (switch)."""
        out = {}
        for ep in ["app"] + ["w%d" % i for i in range(self.sc.workers)]:
            ns, _ = self.ns_of(ep)
            st = json.loads(sh("ip", "-j", "-s", "link", "show", "dev", IFNAME,
                               ns=ns).stdout)[0]["stats64"]
            c = {"tx_bytes": st["tx"]["bytes"], "rx_bytes": st["rx"]["bytes"],
                 "tx_packets": st["tx"]["packets"], "rx_packets": st["rx"]["packets"],
                 "tbf_drops_host": 0, "tbf_drops_switch": 0}
            for side, qns, dev in (("host", ns, IFNAME), ("switch", self.sw_ns, ep)):
                for q in json.loads(sh("tc", "-j", "-s", "qdisc", "show", "dev", dev,
                                       ns=qns).stdout):
                    if q.get("kind") == "tbf":
                        c["tbf_drops_" + side] += q.get("drops", 0)
            out[ep] = c
        return out


def counters_delta(a, b):
    return {ep: {k: b[ep][k] - a[ep][k] for k in a[ep]} for ep in a}


# ---- cross traffic -------------------------------------------------------------------

class Cross:
    """iperf3 flows between lab namespaces for the duration of a `with` block."""

    def __init__(self, lab, flows):
        self.lab = lab
        self.flows = flows
        self.procs = []

    def __enter__(self):
        if not self.flows:
            return self
        if shutil.which("iperf3") is None:
            raise LabError("cross traffic needs iperf3 (apt-get install iperf3)")
        for k, f in enumerate(self.flows):
            dns, dip = self.lab.ns_of(f["to"])
            sns, _ = self.lab.ns_of(f["from"])
            port = CROSS_PORT0 + k
            srv = self.lab.popen(dns, ["iperf3", "-s", "-p", port], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            self.procs.append(srv)
            bps = int(parse_rate(f["rate"]))
            args = ["iperf3", "-c", dip, "-p", port, "-t", "86400", "-b", bps]
            if f["proto"] == "udp":
                args += ["-u", "-l", self.lab.sc.mtu - 28]
            deadline = time.time() + 10
            while True:  # the server needs a moment to listen
                time.sleep(0.2)
                cli = self.lab.popen(sns, args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
                time.sleep(0.5)
                if cli.poll() is None:
                    break
                err = cli.stderr.read().strip()
                if time.time() > deadline:
                    raise LabError("cross traffic %s>%s: iperf3 client: %s" %
                                   (f["from"], f["to"], err))
            self.procs.append(cli)
        return self

    def check(self):
        for p in self.procs:
            if p.poll() is not None:
                raise LabError("a cross-traffic iperf3 exited early (status %d)" %
                               p.returncode)

    def __exit__(self, et, ev, tb):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        return False


# ---- systems -------------------------------------------------------------------------

def read_table(path):
    """(model name, [tensor element counts]) of a perf/models table."""
    name, sizes = os.path.basename(path)[:-4], []
    with open(path) as f:
        for line in f:
            if line.startswith("# model "):
                name = line.split()[2]
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            parts = s.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise LabError("%s: bad line '%s'" % (path, s))
            sizes.append(int(parts[1]))
    if not sizes:
        raise LabError("%s: no tensors" % path)
    return name, sizes


def summary(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def per_iteration_max(rank_times):
    """Exchange time of each iteration: the slowest rank's."""
    n = min(len(t) for t in rank_times)
    return [max(t[i] for t in rank_times) for i in range(n)]


def run_pbox(lab, sc, build_dir, loss, timeout, tree=False, dvf=False):
    import netns  # tests/dpdk/netns.py: pboxd in a namespace, on pboxtest's config writer
    os.environ["PBOX_BUILD_DIR"] = build_dir
    job = {"id": 1, "token": TOKEN, "workers": sc.workers, "mode": "aggregate",
           "reduce": "mean"}
    if tree:
        job["tree"] = {"degree": sc.tree_degree, "depth": sc.tree_depth}
    if dvf:
        # Sums, like the demo's broadcasts: the results' sparsity comes from their values.
        job["dvf"] = {"low": sc.dvf_low, "up": sc.dvf_up}
        job["reduce"] = "sum"
    app = {"mtu": sc.mtu}
    if sc.chunk_bytes:
        app["chunk_bytes"] = sc.chunk_bytes
    fault = loss.pboxd_fault()
    if fault:
        app["fault"] = fault
    worker = os.path.join(build_dir, "perf", "pbox-bench-comm")
    res = {}
    c0 = lab.link_counters()
    t0 = time.time()
    try:
        with netns.Pboxd(lab, "udp", [job], cores=sc.appliance_cores, extra_app=app) as d:
            cmds = []
            for r in range(sc.workers):
                cmd = [worker, "--server", d.control, "--job", 1, "--token", TOKEN, "--rank", r,
                       "--model", sc.model_path(), "--iters", sc.iterations, "--warmup",
                       sc.warmup, "--timeout-ms", int(min(3600, timeout) * 1000), "--json"]
                if sc.max_inflight:
                    cmd += ["--max-inflight", sc.max_inflight]
                if dvf:
                    cmd += ["--grad-sigma", repr(sc.grad_sigma)]
                cmds.append(cmd)
            outs = lab.run_ranks(cmds, [loss.worker_env(r) for r in range(sc.workers)],
                                 timeout)
            st = d.stats()
    except SystemExit:
        # pboxtest.fail() printed why, with pboxd's log.
        return {"status": "failed", "error": "pboxd failed (its log is printed above)"}
    ranks = []
    for r, (rc, out, err) in enumerate(outs):
        if rc != 0:
            sys.stderr.write(err)
            last = err.strip().splitlines()
            return {"status": "failed", "error": "rank %d exited with %d: %s" % (
                r, rc, last[-1] if last else "no message")}
        try:
            ranks.append(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            return {"status": "failed", "error": "rank %d printed no result: %r" % (
                r, out[-200:])}
    times = per_iteration_max([o["iter_seconds"] for o in ranks])
    tot = st["totals"]
    res.update({"status": "ok", "iter_seconds": times, **summary(times),
                # pbox-bench-comm checks every element, exits 1 otherwise (DVF: finite)
                "exact": not dvf,
                "wall_s": time.time() - t0,
                "retransmits": sum(o["retransmits"] for o in ranks),
                "probes": sum(o["probes"] for o in ranks),
                "frag_bytes": ranks[0]["frag_bytes"], "chunk_bytes": ranks[0]["chunk_bytes"],
                "pboxd": {k: tot.get(k) for k in ("busy_pct", "dups", "rx_retransmits",
                                                  "replies_resent", "dropped", "tx_errors")},
                "pace": (st.get("transport") or {}).get("pace"),  # result pacing (core/pace.h)
                # kernel pacing of pboxd's sends (transport/udp/kpace.h)
                "kpace": (st.get("transport") or {}).get("kpace"),
                "links": counters_delta(c0, lab.link_counters())})
    dv = tot.get("dvf")
    if dvf and dv and dv.get("in_dense") and dv.get("out_dense"):
        # The whole run's (warm-up included): values kept back and dense / wire bytes.
        res["dvf"] = {"push_sparsity": 1 - 4.0 * dv["in_vals"] / dv["in_dense"],
                      "push_ratio": dv["in_dense"] / max(dv["in_bytes"], 1),
                      "result_sparsity": 1 - 4.0 * dv["out_vals"] / dv["out_dense"],
                      "result_ratio": dv["out_dense"] / max(dv["out_bytes"], 1),
                      "counters": dv}
    return res


def gloo_buckets(sizes, cap_bytes):
    """DDP's bucket assignment: tensors in reverse order, the first bucket capped at 1 MiB,
    the others at cap_bytes; a bucket closes once it reaches its cap."""
    buckets, cur, cur_bytes = [], 0, 0
    caps = [1 << 20, cap_bytes]
    for n in reversed(sizes):
        cur += n
        cur_bytes += 4 * n
        if cur_bytes >= caps[min(len(buckets), 1)]:
            buckets.append(cur)
            cur, cur_bytes = 0, 0
    if cur:
        buckets.append(cur)
    return buckets


def run_gloo(lab, sc, timeout):
    _, sizes = read_table(sc.model_path())
    buckets = gloo_buckets(sizes, int(sc.gloo_bucket_mb * (1 << 20)))
    script = os.path.join(HERE, "gloo_worker.py")
    c0 = lab.link_counters()
    t0 = time.time()
    cmds = [[PYTHON, script, "--rank", r, "--world", sc.workers, "--master",
             "%s:%d" % (lab.worker_ip[0], GLOO_PORT), "--buckets", ",".join(map(str, buckets)),
             "--iterations", sc.iterations, "--warmup", sc.warmup, "--timeout", int(timeout)]
            for r in range(sc.workers)]
    env = {"GLOO_SOCKET_IFNAME": IFNAME, "OMP_NUM_THREADS": "1"}
    outs = lab.run_ranks(cmds, [env] * sc.workers, timeout)
    ranks = []
    for r, (rc, out, err) in enumerate(outs):
        if rc != 0:
            sys.stderr.write(err[-4000:])
            last = err.strip().splitlines()
            return {"status": "failed", "error": "gloo rank %d exited with %d: %s" % (
                r, rc, last[-1] if last else "no message")}
        ranks.append(json.loads(out.strip().splitlines()[-1]))
    times = per_iteration_max([o["iter_seconds"] for o in ranks])
    return {"status": "ok", "iter_seconds": times, **summary(times),
            "exact": all(o["exact"] for o in ranks), "buckets": len(buckets),
            "wall_s": time.time() - t0, "links": counters_delta(c0, lab.link_counters())}


def bounds(sc, nbytes):
    """Link-rate bounds in seconds per exchange (None where a link is unlimited)."""
    w, a, n = sc.worker_bps(), sc.appliance_bps(), sc.workers
    link = 8.0 * nbytes / w if w else None
    app = 8.0 * nbytes * n / a if a else None
    pbox = max([x for x in (link, app) if x is not None], default=None)
    # A ring allreduce sends (and receives) 2 (n-1)/n of the gradient on each link.
    gloo = link * 2 * (n - 1) / n if link is not None and n > 1 else (0.0 if link else None)
    # TSB: the appliance receives n pushes and sends T copies of the result; a relay sends
    # its push and T copies of the result on its own link.
    t = min(sc.tree_degree, n)
    tsb_app = 8.0 * nbytes * max(n, t) / a if a else None
    tsb_relay = link * (1 + t) if link is not None and n > t else link
    tsb = max([x for x in (tsb_relay, tsb_app) if x is not None], default=None)
    return {"link_bound_s": link, "pbox_bound_s": pbox, "gloo_ring_bound_s": gloo,
            "appliance_bound_s": app, "tsb_bound_s": tsb}


def default_timeout(sc, b):
    per = max([x for x in (b["pbox_bound_s"], b["gloo_ring_bound_s"]) if x], default=1.0)
    return max(180.0, 40.0 * per * (sc.iterations + sc.warmup))


def run_scenario(sc, build_dir, log=print):
    """Build the lab, run every system of sc on it, return the result dict."""
    name, sizes = read_table(sc.model_path())
    nbytes = 4 * sum(sizes)
    b = bounds(sc, nbytes)
    timeout = sc.timeout or default_timeout(sc, b)
    loss = LOSS_METHODS[sc.loss_method](sc.loss, sc.seed, build_dir)
    res = {"scenario": sc.to_dict(), "model": {"name": name, "tensors": len(sizes),
                                               "bytes": nbytes},
           "rates_bps": {"worker": sc.worker_bps(), "appliance": sc.appliance_bps()},
           "bounds": b, "loss_method": sc.loss_method, "systems": {}, "host": {
               "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}}
    with Lab(sc) as lab:
        res["lab"] = {"prefix": lab.prefix, "namespaces": lab.namespaces(),
                      "tbf": {"%s_%s" % (link, side): lab.tbf_args(bps, side == "host")
                              for link, bps in (("worker", sc.worker_bps()),
                                                ("appliance", sc.appliance_bps()))
                              if bps for side in ("host", "switch")}}
        loss.apply(lab)
        for system in sc.systems:
            if system == "ps-lite":
                res["systems"][system] = {"status": "skipped", "reason": PS_LITE_REASON}
                continue
            if sc.loss > 0 and system not in loss.systems:
                res["systems"][system] = {
                    "status": "skipped",
                    "reason": "loss %g is injected by pbox's transport (netem and nftables "
                              "are not available here; loss_method 'xdp' applies to every "
                              "system); %s cannot be given it" % (sc.loss, system)}
                continue
            log("netlab: %s on %d workers, worker links %s, appliance link %s, mtu %d, "
                "loss %g ..." % (system, sc.workers, fmt_rate(sc.worker_bps()),
                                 fmt_rate(sc.appliance_bps()), sc.mtu, sc.loss))
            counted = hasattr(loss, "counters") and bool(getattr(loss, "links", None))
            before = loss.counters(lab) if counted else None
            try:
                with Cross(lab, sc.cross) as cross:
                    if system in PBOX_SYSTEMS:
                        r = run_pbox(lab, sc, build_dir, loss, timeout,
                                     tree=system.endswith("-tsb"), dvf="-dvf" in system)
                    else:
                        r = run_gloo(lab, sc, timeout)
                    cross.check()
            except LabError as e:
                r = {"status": "failed", "error": str(e)}
            if r["status"] == "ok":
                r["exchange_bytes"] = nbytes
                if b["link_bound_s"]:
                    r["over_link_bound"] = r["median_s"] / b["link_bound_s"]
                own = b["pbox_bound_s" if system == "pbox" else
                        "tsb_bound_s" if system == "pbox-tsb" else "gloo_ring_bound_s"]
                if own and "-dvf" not in system:  # DVF's bytes depend on the values
                    r["over_own_bound"] = r["median_s"] / own
            res["systems"][system] = r
            if counted:  # this system's frames and drops on each link
                after = loss.counters(lab)
                r["loss_injected"] = {ep: {k: after[ep][k] - before[ep][k] for k in after[ep]}
                                      for ep in after}
            log("netlab:   %s" % (("median %.3f s (min %.3f, max %.3f)" % (
                r["median_s"], r["min_s"], r["max_s"])) if r["status"] == "ok" else
                r.get("error")))
    p, g = res["systems"].get("pbox", {}), res["systems"].get("gloo", {})
    t = res["systems"].get("pbox-tsb", {})
    if p.get("status") == "ok" and g.get("status") == "ok":
        res["ratios"] = {"gloo_over_pbox": g["median_s"] / p["median_s"]}
    if p.get("status") == "ok" and t.get("status") == "ok":
        res.setdefault("ratios", {})["pbox_over_tsb"] = p["median_s"] / t["median_s"]
    res["host"]["load_after"] = os.getloadavg()[0]
    return res


# ---- command line --------------------------------------------------------------------

def add_scenario_args(ap):
    for k, (_, default, hlp) in FIELDS.items():
        flag = "--" + k.replace("_", "-")
        if k == "systems":
            ap.add_argument("--system", "--systems", dest=k, metavar="LIST",
                            help="%s (default: pbox,gloo)" % hlp)
        elif k == "cross":
            ap.add_argument(flag, dest=k, action="append", metavar="FROM>TO:RATE[:PROTO]",
                            help=hlp + "; repeatable")
        else:
            ap.add_argument(flag, dest=k, metavar=k.split("_")[-1].upper(),
                            help=hlp if "default" in hlp else "%s (default: %s)" % (
                                hlp, default))


def scenario_overrides(args):
    return {k: getattr(args, k) for k in FIELDS if getattr(args, k, None) is not None}


def cmd_run(args):
    base = load_scenarios(args.scenario) if args.scenario else [{}]
    over = scenario_overrides(args)
    scs = [Scenario.from_dict(dict(d, **over), "scenario %d" % (i + 1) if len(base) > 1
                              else "scenario") for i, d in enumerate(base)]
    why = missing()
    if why:
        raise LabError(why)
    build_dir = os.path.abspath(args.build_dir)
    for sc in scs:
        why = build_dir_problem(build_dir, sc.systems)
        if why:
            raise LabError(why)
    results = []
    for sc in scs:
        results.append(run_scenario(sc, build_dir,
                                    log=lambda s: print(s, file=sys.stderr, flush=True)))
        if args.json:  # after every scenario, so a long matrix keeps what it has
            with open(args.json, "w") as f:
                json.dump(results[0] if len(results) == 1 and len(scs) == 1 else results, f,
                          indent=1)
    for r in results:
        print_result(r)
    return 0 if all(s["status"] != "failed" for r in results
                    for s in r["systems"].values()) else 1


def print_result(r):
    sc = r["scenario"]
    b = r["bounds"]
    print("%s, %d workers, worker links %s, appliance %s, mtu %d, loss %g (%s); %.1f MB "
          "per exchange; link-rate bound %s" % (
              r["model"]["name"], sc["workers"], fmt_rate(r["rates_bps"]["worker"]),
              fmt_rate(r["rates_bps"]["appliance"]), sc["mtu"], sc["loss"], r["loss_method"],
              r["model"]["bytes"] / 1e6,
              "%.3f s" % b["link_bound_s"] if b["link_bound_s"] else "none"))
    for name, s in r["systems"].items():
        if s["status"] == "ok":
            extra = ""
            if "over_link_bound" in s:
                extra = ", %.2fx the link-rate bound" % s["over_link_bound"]
            if "over_own_bound" in s:
                extra += " (%.2fx its own)" % s["over_own_bound"]
            if "dvf" in s:
                extra += ", DVF: pushes %.1f %% sparse (%.2fx), results %.1f %% (%.2fx)" % (
                    100 * s["dvf"]["push_sparsity"], s["dvf"]["push_ratio"],
                    100 * s["dvf"]["result_sparsity"], s["dvf"]["result_ratio"])
            if "retransmits" in s:
                extra += ", %d retransmits" % s["retransmits"]
            print("  %-7s median %.3f s  min %.3f  max %.3f%s" % (
                name, s["median_s"], s["min_s"], s["max_s"], extra))
        else:
            print("  %-7s %s: %s" % (name, s["status"], s.get("reason") or s.get("error")))
    if "gloo_over_pbox" in r.get("ratios", {}):
        print("  gloo / pbox: %.2f" % r["ratios"]["gloo_over_pbox"])
    if "pbox_over_tsb" in r.get("ratios", {}):
        print("  pbox (star) / pbox-tsb: %.2f" % r["ratios"]["pbox_over_tsb"])


def cmd_up(args):
    sc = Scenario.from_dict(scenario_overrides(args))
    why = missing()
    if why:
        raise LabError(why)
    with Lab(sc) as lab:
        print("lab up: appliance %s in %s; workers %s; switch %s. Ctrl-C (or SIGTERM) "
              "tears it down." % (lab.app_ip, lab.app_ns, ", ".join(
                  "%s in %s" % x for x in zip(lab.worker_ip, lab.worker_ns)), lab.sw_ns),
              flush=True)
        while True:
            time.sleep(3600)


def cmd_cleanup(args):
    why = missing(need_tc=False)
    if why:
        raise LabError(why)
    removed = cleanup(all_runs=args.all, run=args.run)
    print("removed %d namespace(s)%s" % (len(removed), (": " + " ".join(removed))
                                          if removed else ""))
    return 0


def markdown_rows(results):
    """One markdown table row per system of each result (netlab table)."""
    rows = ["| MTU | worker / appliance link | loss | system | median s (min–max) | "
            "x link bound | x own bound | worker tx MB per exchange | retransmits | "
            "tbf drops host / switch |", "|---" * 10 + "|"]
    for r in results:
        sc = r["scenario"]
        for name, s in r["systems"].items():
            if s["status"] != "ok":
                rows.append("| %d | %s / %s | %g | %s | %s: %s | | | | | |" % (
                    sc["mtu"], fmt_rate(r["rates_bps"]["worker"]),
                    fmt_rate(r["rates_bps"]["appliance"]), sc["loss"], name, s["status"],
                    s.get("reason") or s.get("error")))
                continue
            links = s["links"]
            wtx = sum(v["tx_bytes"] for k, v in links.items() if k != "app")
            exch = sc["workers"] * (sc["iterations"] + sc["warmup"])
            own = None if "-dvf" in name else r["bounds"].get(
                "pbox_bound_s" if name == "pbox" else "tsb_bound_s"
                if name == "pbox-tsb" else "gloo_ring_bound_s")
            if all("tbf_drops_host" in v for v in links.values()):
                drops = "%d / %d" % (sum(v["tbf_drops_host"] for v in links.values()),
                                     sum(v["tbf_drops_switch"] for v in links.values()))
            else:  # files written before the split: both together
                drops = "%d (both)" % sum(v.get("tbf_drops", 0) for v in links.values())
            rows.append("| %d | %s / %s | %g | %s | %.2f (%.2f–%.2f) | %s | %s | %.0f | %s | "
                        "%s |" % (
                            sc["mtu"], fmt_rate(r["rates_bps"]["worker"]),
                            fmt_rate(r["rates_bps"]["appliance"]), sc["loss"], name,
                            s["median_s"], s["min_s"], s["max_s"],
                            "%.2f" % s["over_link_bound"] if "over_link_bound" in s else "–",
                            "%.2f" % (s["median_s"] / own) if own else "–",
                            wtx / 1e6 / exch, s.get("retransmits", "–"), drops))
    return rows


def cmd_table(args):
    results = []
    for path in args.files:
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise LabError("%s: %s" % (path, e))
        results += d if isinstance(d, list) else [d]
    print("\n".join(markdown_rows(results)))
    return 0


def cmd_check(args):
    why = missing() or build_dir_problem(os.path.abspath(args.build_dir), ["pbox"])
    print(why or "ok: root, ip and tc present, build tree has pboxd and pbox-bench-comm")
    print("iperf3 (cross traffic): %s" % (shutil.which("iperf3") or "missing"))
    return 1 if why else 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="netlab", description="An emulated cluster in network namespaces: pbox and "
        "Gloo on rate-limited veth links (see perf/netlab/README.md).")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    default_build = os.environ.get("PBOX_BUILD_DIR") or os.path.join(ROOT, "build")
    p = sub.add_parser("run", help="run a scenario and report (JSON with --json)",
                       description="Build a lab, run each system of the scenario on it, "
                       "tear it down, print and (--json) write the results. Settings come "
                       "from --scenario FILE (JSON or TOML; a [[scenario]] list runs several) "
                       "and are overridden by the options.")
    p.add_argument("--scenario", metavar="FILE", help="scenario file (.json or .toml)")
    p.add_argument("--json", metavar="FILE", help="write the results to FILE")
    p.add_argument("--build-dir", default=default_build,
                   help="meson build directory (default: $PBOX_BUILD_DIR, else ./build)")
    add_scenario_args(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("up", help="build a lab and keep it until Ctrl-C",
                       description="Build the lab of the given settings, print its "
                       "namespaces and addresses, and keep it until SIGINT/SIGTERM.")
    add_scenario_args(p)
    p.set_defaults(fn=cmd_up)
    p = sub.add_parser("cleanup", help="remove leftover lab namespaces",
                       description="Remove the namespaces (and the processes in them) of "
                       "netlab runs whose process is gone; --all: of every run.")
    p.add_argument("--all", action="store_true", help="also those of runs still alive")
    p.add_argument("--run", metavar="PREFIX", help="only namespaces starting with PREFIX")
    p.set_defaults(fn=cmd_cleanup)
    p = sub.add_parser("table", help="markdown table of result files",
                       description="Print the results of `run --json` files as a markdown "
                       "table (the one in perf/netlab/README.md).")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(fn=cmd_table)
    p = sub.add_parser("check", help="say whether a lab can be built here")
    p.add_argument("--build-dir", default=default_build, help="meson build directory")
    p.set_defaults(fn=cmd_check)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except LabError as e:
        print("netlab: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
