# SPDX-License-Identifier: BSD-3-Clause
"""Network namespaces for the DPDK tests and benchmarks (standard library only).

    with Topology(nworker_ns=2) as topo:
        with topo.pboxd("dpdk", jobs) as d:       # or "udp"
            outs = topo.run_workers(d, [...])
            print(d.stats())

Topology: an appliance namespace with two veth links into a bridge in a switch namespace:
`dp0` (the data port: DPDK binds net_af_xdp to it; its address DATA_IP exists only in
DPDK) and `ct0` (kernel: the control channel, and the data port of the kernel-UDP
transport at CTL_IP). Each worker namespace has one veth `w0` into the same bridge with
an address on both subnets, so workers reach either transport over the same wires. IPv6
is off everywhere so no stray neighbour discovery lands in the counters.

Everything made here (namespaces, hence their veths and the bridge, and the processes
started in them) is removed on exit, whether the test passed or not, and on SIGTERM.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = os.path.join(HERE, "..", "integration")
sys.path.insert(0, INTEGRATION)
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf", "netlab"))
import netlab  # noqa: E402
import pboxtest  # noqa: E402
from pboxtest import build_path, fail  # noqa: E402

DATA_IP = "10.231.0.1"
CTL_IP = "10.232.0.1"
CONTROL_PORT = 7000
BASE_PORT = 7100
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def missing():
    """Why the namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, AF_XDP, hugepages)"
    for tool in ("ip",):
        if subprocess.run(["sh", "-c", "command -v " + tool], capture_output=True).returncode:
            return "the '%s' command (iproute2) is missing" % tool
    if not glob.glob("/usr/lib/*/dpdk/pmds-*/librte_net_af_xdp.so*"):
        return "the DPDK AF_XDP driver (librte-net-af-xdp23) is not installed"
    free = 0
    for f in glob.glob("/sys/kernel/mm/hugepages/hugepages-*/free_hugepages"):
        with open(f) as fh:
            free += int(fh.read())
    if free < 64:
        return "fewer than 64 free hugepages (run tests/dpdk/setup.sh as root)"
    r = subprocess.run([build_path("dataplane/pboxd"), "--transport", "dpdk", "--check-config",
                        "--data-address", DATA_IP], capture_output=True, text=True)
    if "not available" in r.stderr:
        return "pboxd was built without DPDK (-Ddpdk=disabled or no libdpdk-dev)"
    return None


def sh(*cmd, ns=None, check=True):
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    r = subprocess.run(full, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(full), r.stderr.strip()))
    return r


class Pboxd(pboxtest.Pboxd):
    """pboxd in the appliance namespace, on the "udp" or "dpdk" transport, at the
    namespace's fixed addresses. Stopping it, its log and the exit-status check are
    pboxtest.Pboxd's."""

    def __init__(self, topo, transport, jobs, cores=1, extra_app=None):
        self.topo = topo
        self.transport = transport
        app = {"transport": transport, "data_address": DATA_IP if transport == "dpdk" else CTL_IP,
               "base_port": BASE_PORT, "control": "%s:%d" % (CTL_IP, CONTROL_PORT),
               "mtu": 1500}
        if transport == "dpdk":
            app["dpdk"] = {"eal": ["--no-pci", "--in-memory", "--log-level", "lib.eal:error",
                                   "--vdev", "net_af_xdp0,iface=dp0,queue_count=%d" % cores]}
        app.update(extra_app or {})
        # The configuration names the namespace's addresses: they override the free
        # loopback ports pboxtest picks.
        super().__init__(jobs, cores=cores, **app)
        self.control = app["control"]
        self.args = ["ip", "netns", "exec", topo.app_ns] + self.args

    def start(self):
        """Start pboxd in the appliance namespace; it is ready when its log says so (its
        control port is not reachable from this namespace)."""
        self.logf = open(self.logpath, "w")
        self.proc = subprocess.Popen(self.args, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.topo.procs.append(self.proc)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.dump_log()
                fail("pboxd (%s) exited at start with status %d" %
                     (self.transport, self.proc.returncode))
            if "ready:" in self.log():
                return
            time.sleep(0.1)
        self.dump_log()
        fail("pboxd (%s) did not become ready" % self.transport)

    def run_to_exit(self, args=None, timeout=30):
        """Run pboxd (args: its command line instead of self.args) in the foreground, for a
        configuration it must refuse to start with; return (exit status, log). The
        directory is removed afterwards."""
        self.logf = open(self.logpath, "w")
        r = subprocess.run(args or self.args, stdout=self.logf, stderr=subprocess.STDOUT,
                           timeout=timeout)
        self.logf.close()
        log = self.log()
        self.remove_dir()
        return r.returncode, log

    def stats(self):
        """The stats object, asked from inside the appliance namespace."""
        code = ("import json, sys\n"
                "sys.path.insert(0, %r)\n"
                "from pboxtest import control_request\n"
                "print(json.dumps(control_request(%r, {'op': 'stats', "
                "'admin_token': %r})))\n") % (INTEGRATION, self.control, self.admin_token)
        return json.loads(sh(PYTHON, "-c", code, ns=self.topo.app_ns).stdout)

    def dump_log(self):
        sys.stderr.write("(pboxd on the %s transport)\n" % self.transport)
        super().dump_log()


class Topology:
    def __init__(self, nworker_ns=2, data_queues=1):
        tag = "%d" % os.getpid()
        self.app_ns = "pbA" + tag
        self.sw_ns = "pbS" + tag
        self.worker_ns = ["pbW%d_%s" % (i, tag) for i in range(nworker_ns)]
        self.data_queues = data_queues
        self.procs = []
        self.worker_ip = {}

    # -- set-up and teardown --

    def __enter__(self):
        self._old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._create()
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, et, ev, tb):
        self.close()
        return False

    def _on_signal(self, signo, frame):
        self.close()
        sys.exit(128 + signo)

    def _create(self):
        for ns in [self.app_ns, self.sw_ns] + self.worker_ns:
            sh("ip", "netns", "add", ns)
            for k in ("all", "default"):
                sh("sysctl", "-qw", "net.ipv6.conf.%s.disable_ipv6=1" % k, ns=ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "link", "add", "br0", "type", "bridge", ns=self.sw_ns)
        sh("ip", "link", "set", "br0", "up", ns=self.sw_ns)
        # A plain L2 switch: with br_netfilter the bridge would validate (and drop) the
        # malformed frames the tests send on purpose.
        for t in ("iptables", "ip6tables", "arptables"):
            sh("sysctl", "-qw", "net.bridge.bridge-nf-call-%s=0" % t, ns=self.sw_ns, check=False)
        q = str(self.data_queues)
        self._veth(self.app_ns, "dp0", "dp0s", ["numrxqueues", q, "numtxqueues", q])
        self._veth(self.app_ns, "ct0", "ct0s", ["numrxqueues", "1", "numtxqueues", "1"])
        sh("ip", "addr", "add", CTL_IP + "/24", "dev", "ct0", ns=self.app_ns)
        for i, ns in enumerate(self.worker_ns):
            self._veth(ns, "w0", "w%ds" % i, ["numrxqueues", "1", "numtxqueues", "1"])
            sh("ip", "addr", "add", "10.231.0.%d/24" % (11 + i), "dev", "w0", ns=ns)
            sh("ip", "addr", "add", "10.232.0.%d/24" % (11 + i), "dev", "w0", ns=ns)
            self.worker_ip[ns] = "10.231.0.%d" % (11 + i)

    def _veth(self, ns, name, peer, qargs):
        # Created in the switch namespace, one end then moved: no name clash with the host.
        sh("ip", "link", "add", name, *qargs, "type", "veth", "peer", "name", peer, *qargs,
           ns=self.sw_ns)
        sh("ip", "link", "set", name, "netns", ns, ns=self.sw_ns)
        sh("ip", "link", "set", peer, "master", "br0", "up", ns=self.sw_ns)
        sh("ip", "link", "set", name, "up", ns=ns)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self.procs = []
        for ns in self.worker_ns + [self.app_ns, self.sw_ns]:
            sh("ip", "netns", "del", ns, check=False)
        if getattr(self, "_old", None):
            for s, h in self._old.items():
                signal.signal(s, h)
            self._old = None

    # -- running things --

    def pboxd(self, transport, jobs, **kw):
        return Pboxd(self, transport, jobs, **kw)

    def worker_cmd_ns(self, rank):
        """Workers alternate between the worker namespaces."""
        return self.worker_ns[rank % len(self.worker_ns)]

    def run_workers(self, d, job, token, nranks, args, timeout=120):
        """Start nranks pbox-dpdk-workers (ranks spread over the worker namespaces), wait,
        return their outputs; fail if any exits non-zero."""
        return self.run_ranks(d, [[build_path("tests/dpdk/pbox-dpdk-worker"), "--server",
                                   d.control, "--job", str(job), "--token", token, "--rank",
                                   str(r), "--timeout-ms", "20000"] + list(args)
                                  for r in range(nranks)], timeout)

    def start_ranks(self, cmds):
        """Start cmds[r] as rank r in its worker namespace (stdout and stderr in one pipe);
        return the processes, for wait_ranks()."""
        procs = []
        for r, argv in enumerate(cmds):
            cmd = ["ip", "netns", "exec", self.worker_cmd_ns(r)] + list(argv)
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.procs.append(p)
            procs.append(p)
        return procs

    def wait_ranks(self, d, procs, timeout=120):
        """Wait for the ranks start_ranks() started and return their outputs; fail (with
        pboxd d's log) if any exits non-zero or outlives timeout. Every rank's pipe is read
        at once (netlab.wait_all): a rank blocked on a full pipe would stall the others."""
        try:
            done = netlab.wait_all(procs, timeout)
        except netlab.LabError as e:
            d.dump_log()
            fail(str(e))
        for r, (rc, out, _) in enumerate(done):
            if rc != 0:
                d.dump_log()
                fail("rank %d exited with %d: %s" % (r, rc, out))
        return [out for _, out, _ in done]

    def run_ranks(self, d, cmds, timeout=120):
        """Run cmds[r] as rank r in its worker namespace, all at once; return the outputs;
        fail if any exits non-zero or outlives timeout (start_ranks, then wait_ranks)."""
        return self.wait_ranks(d, self.start_ranks(cmds), timeout)
