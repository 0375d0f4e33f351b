#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pbox-ctrld's control listener under misbehaving clients, as pboxd's (test_control_limits):
 - a connection that does not prove the admin token is closed after unauth_timeout;
 - at most max_unauth such connections: a new one closes the oldest (an authenticated one
   is never evicted); at most max_per_address from one address;
 - a long line before the token is refused (E2BIG) and closed;
 - a client that floods requests and never reads its answers is closed when its queue is
   full, and meanwhile another client is answered promptly;
 - with a low open-file limit at start, max_connections is fitted to it; when accept()
   runs out of descriptors the connection is shed and the listener paused, without
   spinning, and pbox-ctrld serves again afterwards.
Each case is counted in job_list's "control" object. Addresses 127.0.0.x stand for hosts."""
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from pboxtest import _lc_value, ask, build_path, closed_within, connect_from, fail, \
    free_ports, starve_descriptors

TOKEN = "limits-secret"
E2BIG = 7


class Ctrld:
    def __init__(self, tmp, limits, preexec=None):
        self.port = free_ports(0)[0]
        conf = os.path.join(tmp, "ctrld-%d.conf" % self.port)
        dead = free_ports(0)[0]  # nothing listens there: no pboxd is needed here
        ctrl = dict({"listen": "127.0.0.1:%d" % self.port, "admin_token": TOKEN,
                     "reconcile_interval": 60000, "request_timeout": 500}, **limits)
        with open(conf, "w") as f:
            f.write("ctrld = %s;\npboxds = %s;\n" % (
                _lc_value(ctrl), _lc_value([{"name": "a", "control": "127.0.0.1:%d" % dead}])))
        self.log = os.path.join(tmp, "ctrld-%d.log" % self.port)
        self.proc = subprocess.Popen([build_path("ctrlplane/ctrld/pbox-ctrld"), "-c", conf],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     preexec_fn=preexec)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        fail("pbox-ctrld did not start")

    def counters(self):
        with connect_from(self.port) as s:
            r = ask(s, {"op": "job_list", "admin_token": TOKEN})
        if r is None or r.get("ok") is not True:
            fail("job_list: %s" % r)
        return r["control"]

    def text(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(10)
        print("---- pbox-ctrld log ----\n%s" % self.text()[-3000:])
        if rc != 0:
            fail("pbox-ctrld exited with %d" % rc)


def check_limits(tmp):
    c = Ctrld(tmp, {"unauth_timeout": 1500, "max_unauth": 3, "max_per_address": 4,
                    "max_output_bytes": 65536})
    try:
        # An idle connection is closed after unauth_timeout.
        s = connect_from(c.port, "127.0.0.2")
        t = time.time()
        if not closed_within(s, 5):
            fail("an idle connection was not closed within 5 s (unauth_timeout 1.5 s)")
        print("idle connection closed after %.1f s" % (time.time() - t))
        s.close()
        # An authenticated connection, then idle ones from other hosts: the oldest idle
        # one is closed when a fourth comes (max_unauth 3), never the authenticated one.
        a = connect_from(c.port, "127.0.0.3")
        if ask(a, {"op": "auth", "admin_token": TOKEN}) != {"ok": True}:
            fail("auth refused")
        idle = [connect_from(c.port, "127.0.0.%d" % (10 + i)) for i in range(3)]
        time.sleep(0.1)
        late = connect_from(c.port, "127.0.0.20")
        if not closed_within(idle[0], 1.0):
            fail("the oldest unauthenticated connection was not evicted (max_unauth 3)")
        for s in idle[1:] + [late]:
            if closed_within(s, 0.05):
                fail("a newer unauthenticated connection was closed")
        r = ask(a, {"op": "job_list"})
        if r is None or r.get("ok") is not True:
            fail("the authenticated connection was disturbed: %s" % r)
        for s in idle + [late, a]:
            s.close()
        # max_per_address: the fifth from one address is closed at once (before its
        # unauth_timeout; the four are authenticated, so none is evicted for it).
        same = []
        for _ in range(4):
            same.append(connect_from(c.port, "127.0.0.30"))
            if ask(same[-1], {"op": "auth", "admin_token": TOKEN}) != {"ok": True}:
                fail("auth refused")
        s = connect_from(c.port, "127.0.0.30")
        if not closed_within(s, 0.3):
            fail("a fifth connection from one address was not refused (max_per_address 4)")
        for s in same + [s]:
            s.close()
        # A long line before the token: E2BIG, closed.
        s = connect_from(c.port, "127.0.0.40")
        r = ask(s, b'{"op":"job_list","pad":"' + b"x" * 8000 + b'"}\n')
        if r is None or r.get("errno") != E2BIG or not closed_within(s, 2):
            fail("a long unauthenticated line was not refused and closed: %s" % r)
        s.close()
        # A client that floods requests and never reads; another is answered meanwhile.
        flood = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        flood.bind(("127.0.0.50", 0))
        flood.settimeout(10)
        flood.connect(("127.0.0.1", c.port))
        flood.sendall((json.dumps({"op": "auth", "admin_token": TOKEN}) + "\n").encode())
        stop = threading.Event()

        def pump():
            line = (json.dumps({"op": "job_list"}) + "\n").encode() * 200
            try:
                while not stop.is_set():
                    flood.sendall(line)
            except OSError:
                pass

        th = threading.Thread(target=pump)
        th.start()
        b = connect_from(c.port, "127.0.0.51")
        if ask(b, {"op": "auth", "admin_token": TOKEN}) != {"ok": True}:
            fail("auth refused")
        worst = 0.0
        for _ in range(30):
            t = time.time()
            r = ask(b, {"op": "job_list"})
            worst = max(worst, time.time() - t)
            if r is None or r.get("ok") is not True:
                fail("a client was not answered while another flooded: %s" % r)
            time.sleep(0.02)
        deadline = time.time() + 30
        while time.time() < deadline and c.counters()["not_reading"] < 1:
            time.sleep(0.1)
        stop.set()
        flood.close()
        th.join(10)
        b.close()
        print("while a client flooded without reading: the other's slowest answer took "
              "%.3f s" % worst)
        if worst > 2.0:
            fail("a flooding client stalled another for %.1f s" % worst)
        time.sleep(1.7)  # connections still without the token time out
        n = c.counters()
        print("counters: %s" % n)
        if n["unauth_timeouts"] < 1 or n["evicted_unauth"] < 1 or \
                n["refused_per_address"] < 1 or n["line_too_long"] < 1 or \
                n["not_reading"] < 1 or n["unauthenticated"] != 0:
            fail("the refusals were not counted: %s" % n)
    finally:
        c.stop()


def check_fds(tmp):
    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    c = Ctrld(tmp, {"max_connections": 1000, "unauth_timeout": 1000}, preexec=low_nofile)
    try:
        if "max_connections 1000 lowered to 192" not in c.text() or \
                c.counters()["max_connections"] != 192:
            fail("pbox-ctrld did not fit max_connections to the open-file limit")
        # settle 1.5 s: the accepted ones time out.
        cpu, wall = starve_descriptors(c.proc.pid, c.port, 1.5)
        print("out of descriptors: pbox-ctrld used %.2f s of CPU in %.1f s" % (cpu, wall))
        if cpu > 0.2:
            fail("pbox-ctrld spins when accept() fails with EMFILE (%.2f s CPU)" % cpu)
        n = c.counters()
        print("counters: %s" % n)
        if n["accept_no_fds"] < 1 or n["listener_pauses"] < 1:
            fail("running out of descriptors was not counted: %s" % n)
        if "shedding and pausing the listener" not in c.text():
            fail("pbox-ctrld did not log running out of descriptors")
    finally:
        c.stop()


def main():
    tmp = tempfile.mkdtemp(prefix="pboxtest-ctrld-limits-")
    try:
        check_limits(tmp)
        check_fds(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
