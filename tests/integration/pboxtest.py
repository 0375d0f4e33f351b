# SPDX-License-Identifier: BSD-3-Clause
"""Helpers for pbox integration tests (standard library only).

    from pboxtest import Pboxd, build_path
    with Pboxd(jobs=[{"id": 1, "token": "t", "workers": 3}], cores=2) as d:
        subprocess.run([build_path("tests/integration/pbox-check-worker"), ...,
                        "--server", d.control])
        print(d.stats()["totals"]["dropped"])

Pboxd picks free ports, writes a libconfig file, starts the build tree's pboxd, waits
until its control channel answers, and on exit stops it with SIGTERM and checks that it
exited cleanly. Tests find the build tree through PBOX_BUILD_DIR (set by meson).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["Pboxd", "build_path", "free_ports", "to_libconfig", "control_request", "fail"]


def build_path(rel):
    """Path of a file in the meson build tree."""
    root = os.environ.get("PBOX_BUILD_DIR")
    if not root:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.join(here, "..", "..", "build")
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        fail("%s not found (set PBOX_BUILD_DIR to the meson build directory)" % path)
    return path


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def free_ports(n_udp):
    """A TCP port and a run of n_udp consecutive free UDP ports on 127.0.0.1."""
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n_udp >= 65000:
            continue
        socks = []
        try:
            for k in range(n_udp):
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(u)
                u.bind(("127.0.0.1", base + k))
            t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(t)
            t.bind(("127.0.0.1", 0))
            tcp = t.getsockname()[1]
            return tcp, base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    fail("no free ports")


def _lc_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + " ".join("%s = %s;" % (k, _lc_value(x)) for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, dict) for x in v):
            return "( " + ", ".join(_lc_value(x) for x in v) + " )"
        if v and all(isinstance(x, (list, tuple)) for x in v):
            return "( " + ", ".join(_lc_value(x) for x in v) + " )"
        return "[ " + ", ".join(_lc_value(x) for x in v) + " ]"
    raise TypeError("cannot express %r in libconfig" % (v,))


def to_libconfig(appliance, jobs):
    """libconfig text for an appliance group and a list of job dicts."""
    out = "appliance = %s;\n" % _lc_value(appliance)
    if jobs:
        out += "jobs = %s;\n" % _lc_value(list(jobs))
    return out


def control_request(addr, obj, timeout=10.0):
    """Send one JSON request to a pboxd control address "host:port"; return the reply."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall((json.dumps(obj) + "\n").encode())
        buf = b""
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    return json.loads(buf.split(b"\n", 1)[0])


class Pboxd:
    """A pboxd process for one test, on free loopback ports."""

    def __init__(self, jobs, cores=2, extra_args=(), **appliance):
        self.tcp, self.base = free_ports(cores)
        self.control = "127.0.0.1:%d" % self.tcp
        app = {"cores": cores, "control": self.control, "base_port": self.base,
               "data_address": "127.0.0.1", "drain_timeout": 2}
        app.update(appliance)
        self.dir = tempfile.mkdtemp(prefix="pboxtest-")
        self.conf = os.path.join(self.dir, "pboxd.conf")
        with open(self.conf, "w") as f:
            f.write(to_libconfig(app, jobs))
        self.logpath = os.path.join(self.dir, "pboxd.log")
        self.args = [build_path("dataplane/pboxd"), "-c", self.conf] + list(extra_args)
        self.proc = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, et, ev, tb):
        rc = self.stop()
        if et is None and rc != 0:
            self.dump_log()
            fail("pboxd exited with status %d" % rc)
        if et is not None:
            self.dump_log()
        return False

    def start(self):
        self.logf = open(self.logpath, "w")
        self.proc = subprocess.Popen(self.args, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.dump_log()
                fail("pboxd exited at start with status %d" % self.proc.returncode)
            try:
                socket.create_connection(("127.0.0.1", self.tcp), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.dump_log()
        fail("pboxd did not open its control port")

    def stats(self):
        return control_request(self.control, {"op": "stats"})

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.dump_log()
                fail("pboxd did not stop within %d s of signal %d" % (timeout, sig))
        self.logf.close()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def log(self):
        with open(self.logpath) as f:
            return f.read()

    def dump_log(self):
        try:
            sys.stderr.write("---- pboxd log ----\n" + self.log() + "-------------------\n")
        except OSError:
            pass
