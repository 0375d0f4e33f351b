#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""sd_notify readiness of pboxd and pbox-ctrld (Type=notify units): with NOTIFY_SOCKET
pointing at a Unix datagram socket this test binds, each daemon sends READY=1 (with a
STATUS= summary) from its main process only once its control port answers, and
STOPPING=1 when SIGTERM starts its shutdown."""
import array
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from pboxtest import Pboxd, _lc_value, build_path, control_request, fail


def notify_socket(tmp):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(tmp, "notify")
    s.bind(path)
    # The kernel attaches the sender's credentials: NotifyAccess=main needs the main pid.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return s, path


def wait_message(s, key, proc, what, timeout=20):
    """The first datagram (from proc's pid) holding the line key; its fields as a dict."""
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        s.settimeout(0.2)
        try:
            data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            # Only once nothing is left to read: it may have sent it and exited.
            if proc.poll() is not None:
                fail("%s exited (status %d) before sending %s (got %s)" %
                     (what, proc.returncode, key, seen))
            continue
        pid = None
        for level, kind, blob in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", blob[:12])[0]
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        seen.append(fields)
        if pid != proc.pid:
            fail("%s: notification %s from pid %s, not the main process %d" % (what, fields,
                                                                                 pid, proc.pid))
        if key in fields:
            return fields
    fail("%s sent no %s within %d s (got %s)" % (what, key, timeout, seen))


def check_pboxd(tmp, s, path):
    job = {"id": 1, "token": "a", "workers": 2, "mode": "server-optimizer",
           "optimizer": {"name": "sgd", "lr": 0.5}}
    d = Pboxd([job], cores=2, memory_budget="256M")
    d.logf = open(d.logpath, "w")
    d.proc = subprocess.Popen(d.args, stdout=d.logf, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, NOTIFY_SOCKET=path))
    try:
        ready = wait_message(s, "READY", d.proc, "pboxd")
        # Right after READY=1 the control port answers (no retry).
        r = control_request(d.control, {"op": "stats", "admin_token": d.admin_token})
        if r.get("ok") is not True:
            fail("pboxd's control port right after READY=1: %s" % r)
        if ready.get("READY") != "1" or ready.get("STATUS") != "udp transport, 2 cores, 1 job":
            fail("pboxd's READY notification: %s" % ready)
        d.proc.send_signal(signal.SIGTERM)
        stopping = wait_message(s, "STOPPING", d.proc, "pboxd")
        if stopping.get("STOPPING") != "1":
            fail("pboxd's STOPPING notification: %s" % stopping)
        rc = d.stop()
        if rc != 0:
            d.dump_log()
            fail("pboxd exited with status %d after SIGTERM" % rc)
        print("pboxd: READY=1 (STATUS=%s) with the control port up; STOPPING=1 on SIGTERM"
              % ready["STATUS"])
    except BaseException:
        d.stop(signal.SIGKILL)
        d.dump_log()
        raise


def check_ctrld(tmp, s, path):
    with Pboxd([], cores=1, memory_budget="256M") as d:
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        port = ls.getsockname()[1]
        ls.close()
        token = "notify-secret"
        conf = os.path.join(tmp, "ctrld.conf")
        job = {"id": 7, "token": "a", "workers": 1, "mode": "server-optimizer",
               "optimizer": {"name": "sgd", "lr": 0.5}}
        with open(conf, "w") as f:
            f.write("ctrld = %s;\npboxds = %s;\njobs = %s;\n" % (
                _lc_value({"listen": "127.0.0.1:%d" % port, "admin_token": token}),
                _lc_value([{"name": "a", "control": d.control,
                            "admin_token": d.admin_token}]),
                _lc_value([job])))
        log = open(os.path.join(tmp, "ctrld.log"), "w")
        p = subprocess.Popen([build_path("ctrlplane/ctrld/pbox-ctrld"), "-c", conf],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, NOTIFY_SOCKET=path))
        try:
            ready = wait_message(s, "READY", p, "pbox-ctrld")
            r = control_request("127.0.0.1:%d" % port, {"op": "job_list",
                                                        "admin_token": token})
            if r.get("ok") is not True:
                fail("pbox-ctrld's control port right after READY=1: %s" % r)
            if ready.get("STATUS") != "1 pboxd, 1 job (1 published)":
                fail("pbox-ctrld's READY notification: %s" % ready)
            p.send_signal(signal.SIGTERM)
            stopping = wait_message(s, "STOPPING", p, "pbox-ctrld")
            if stopping.get("STOPPING") != "1":
                fail("pbox-ctrld's STOPPING notification: %s" % stopping)
            if p.wait(30) != 0:
                fail("pbox-ctrld exited with status %d after SIGTERM" % p.returncode)
        except BaseException:
            p.kill()
            p.wait()
            log.close()
            with open(os.path.join(tmp, "ctrld.log")) as f:
                sys.stderr.write("---- pbox-ctrld log ----\n" + f.read())
            raise
        log.close()
        print("pbox-ctrld: READY=1 (STATUS=%s) with the control port up; STOPPING=1 on "
              "SIGTERM" % ready["STATUS"])


def main():
    if os.environ.get("PBOX_HAVE_SYSTEMD") != "1":
        print("SKIP: built without libsystemd (meson -Dsystemd): no sd_notify to test")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pboxtest-notify-")
    s, path = notify_socket(tmp)
    try:
        check_pboxd(tmp, s, path)
        check_ctrld(tmp, s, path)
    finally:
        s.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
