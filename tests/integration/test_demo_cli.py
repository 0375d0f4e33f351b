#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The `pbox` command line: help texts, option errors, `pbox stats` against a running
pboxd, and the demo's clean-up: a worker killed mid-run is reported by rank and cause, and
Ctrl-C (SIGINT) or SIGQUIT stops everything; in every case no child process and no
temporary file is left behind, and the job token is on no command line."""
import json
import os
import re
import signal
import subprocess
import tempfile
import time

from pboxtest import Pboxd, build_path, check_gone, children, fail


def pbox_path():
    return build_path("apps/pbox")


def run(args, env=None, timeout=30):
    return subprocess.run([pbox_path()] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, env=env)


def check_help():
    p = run(["--help"])
    for cmd in ("demo", "train", "stats"):
        if p.returncode != 0 or not re.search(r"^  %s " % cmd, p.stdout, re.M):
            fail("pbox --help does not list %s:\n%s" % (cmd, p.stdout))
    for cmd, opts in (("demo", ["--workers", "--epochs", "--batch", "--lr", "--optimizer",
                                "--deterministic", "--no-deterministic", "--cores", "--seed",
                                "--mtu", "--fault", "--save-model", "--json"]),
                      ("train", ["--local", "--server", "--rank", "--save-model"]),
                      ("stats", ["--control", "--socket", "--admin-token-file", "--json"])):
        p = run([cmd, "--help"])
        missing = [o for o in opts if o not in p.stdout]
        if p.returncode != 0 or missing:
            fail("pbox %s --help (exit %d) lacks %s" % (cmd, p.returncode, missing))
    p = run(["frobnicate"])
    if p.returncode != 64 or "unknown command 'frobnicate'" not in p.stderr:
        fail("unknown command: exit %d, %s" % (p.returncode, p.stderr))
    print("help texts: ok")


def check_option_errors():
    cases = [
        (["demo", "--workers", "0"], "--workers 0: expected an integer between 1 and 64"),
        (["demo", "--batch", "abc"], "--batch abc: expected an integer"),
        (["demo", "--lr", "-1"], "--lr -1: expected a number"),
        (["demo", "--optimizer", "lbfgs"], "--optimizer lbfgs: unknown"),
        (["demo", "--workers", "5", "--batch", "4"], "--batch 4: every one of the 5 workers"),
        (["demo", "--fault", "drop=2"], "--fault drop=2"),
        (["demo", "extra"], "unexpected argument 'extra'"),
        (["train", "--lr", "0.1", "--token", "x"], "--lr, --momentum and --wd are for --local"),
        (["train", "--local", "--optimizer", "rmsprop"], "--optimizer rmsprop: unknown"),
        (["stats", "--bogus"], "Try 'pbox stats --help'"),
    ]
    env = dict(os.environ)
    env.pop("PBOX_TOKEN", None)
    for args, msg in cases:
        p = run(args, env=env)
        if p.returncode != 64 or msg not in p.stderr:
            fail("pbox %s: exit %d, stderr %r; expected 64 and %r" % (" ".join(args),
                                                                      p.returncode, p.stderr,
                                                                      msg))
    p = run(["train"], env=env)
    if p.returncode != 64 or "no job token" not in p.stderr:
        fail("pbox train without a token: exit %d, %s" % (p.returncode, p.stderr))
    env["PBOX_PBOXD"] = "/nonexistent/pboxd"
    p = run(["demo"], env=env)
    if p.returncode == 0 or "PBOX_PBOXD=/nonexistent/pboxd: not an executable" not in p.stderr:
        fail("demo with a bad PBOX_PBOXD: exit %d, %s" % (p.returncode, p.stderr))
    # the same with --json: a report saying it failed, not a crash (it read the workers'
    # table before there was one: exit 139)
    p = run(["demo", "--json"], env=env)
    if p.returncode != 1 or json.loads(p.stdout).get("ok") is not False:
        fail("demo --json with a bad PBOX_PBOXD: exit %d, %s%s" % (p.returncode, p.stdout,
                                                                  p.stderr))
    print("option errors: ok")


def check_stats():
    jobs = [{"id": 4, "token": "t", "workers": 2, "mode": "server-optimizer"}]
    sock_dir = tempfile.mkdtemp(prefix="pboxtest-sock-")
    sock = os.path.join(sock_dir, "pboxd.sock")
    with Pboxd(jobs, cores=2, control_socket=sock) as d:
        # Without the admin token or the local socket, pboxd refuses.
        p = run(["stats", "--control", d.control, "--json"])
        if p.returncode != 1 or "stats needs the appliance's admin token" not in p.stderr:
            fail("pbox stats without a token: exit %d, %s" % (p.returncode, p.stderr))
        # Over the local socket, no token is needed.
        p = run(["stats", "--socket", sock, "--json"])
        if p.returncode != 0 or json.loads(p.stdout)["jobs"][0]["id"] != 4:
            fail("pbox stats --socket: exit %d: %s%s" % (p.returncode, p.stdout, p.stderr))
        tok = os.path.join(sock_dir, "admin-token")
        with open(tok, "w") as f:
            f.write(d.admin_token + "\n")
        p = run(["stats", "--control", d.control, "--admin-token-file", tok, "--json"])
        if p.returncode != 0:
            fail("pbox stats --admin-token-file: exit %d: %s" % (p.returncode, p.stderr))
        env = dict(os.environ, PBOX_ADMIN_TOKEN=d.admin_token)
        p = run(["stats", "--control", d.control, "--json"], env=env)
        if p.returncode != 0:
            fail("pbox stats --json: exit %d: %s" % (p.returncode, p.stderr))
        st = json.loads(p.stdout)
        if len(st["cores"]) != 2 or st["jobs"][0]["id"] != 4:
            fail("pbox stats --json: unexpected reply %s" % p.stdout)
        p = run(["stats", "--control", d.control], env=env)
        lines = p.stdout.splitlines()
        if p.returncode != 0 or not lines[0].startswith("pboxd %s: 2 data-plane cores"
                                                        % d.control):
            fail("pbox stats: exit %d:\n%s%s" % (p.returncode, p.stdout, p.stderr))
        for want in (r"^core\s+rx_pkts", r"^0\s+\d+", r"^1\s+\d+", r"^all\s+\d+",
                     r"^  job 4: idle, server-optimizer, 0/2 workers connected"):
            if not re.search(want, p.stdout, re.M):
                fail("pbox stats output lacks %r:\n%s" % (want, p.stdout))
        print(p.stdout, end="")
        port = d.control.rsplit(":", 1)[1]
    if os.path.exists(sock):
        fail("pboxd left its control socket %s behind" % sock)
    os.unlink(os.path.join(sock_dir, "admin-token"))
    os.rmdir(sock_dir)
    p = run(["stats", "--control", "127.0.0.1:" + port])
    if p.returncode != 1 or "cannot connect" not in p.stderr or port not in p.stderr:
        fail("pbox stats without pboxd: exit %d, %s" % (p.returncode, p.stderr))
    print("stats: ok (%s)" % p.stderr.strip())


def start_demo(tmpdir):
    env = dict(os.environ, TMPDIR=tmpdir)
    p = subprocess.Popen([pbox_path(), "demo", "--epochs", "20"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    # Wait until every worker is training: the demo says so, then prints progress.
    deadline = time.time() + 60
    line = ""
    while time.time() < deadline and "ready" not in line:
        line = p.stdout.readline()
        if not line and p.poll() is not None:
            fail("demo ended early with %d: %s" % (p.returncode, p.stderr.read()))
    kids = children(p.pid)
    if len([k for k in kids if " train " in k[1]]) != 3 or \
            len([k for k in kids if "pboxd" in k[1]]) != 1:
        p.kill()
        fail("expected pboxd and 3 workers under the demo, found %s" % kids)
    # The job's token is in the workers' environment, not on command lines anyone can read.
    if any("--token" in c for _, c in kids):
        p.kill()
        fail("the job token is on a command line: %s" % kids)
    return p, kids


def check_worker_killed():
    with tempfile.TemporaryDirectory(prefix="pbox-demo-kill-") as tmpdir:
        p, kids = start_demo(tmpdir)
        victim = [k for k in kids if "--rank 1 " in k[1]][0]
        os.kill(victim[0], signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        if p.returncode != 1 or "rank 1 failed: killed by signal 9" not in err:
            fail("demo after a killed worker: exit %d, stderr:\n%s" % (p.returncode, err))
        check_gone(kids, tmpdir, "killed worker")
        print("killed worker: %s" % [l for l in err.splitlines() if "failed" in l][0])


def check_interrupt(sig):
    name = signal.Signals(sig).name
    with tempfile.TemporaryDirectory(prefix="pbox-demo-int-") as tmpdir:
        p, kids = start_demo(tmpdir)
        t0 = time.time()
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        if p.returncode != 130 or "interrupted" not in err:
            fail("demo after %s: exit %d, stderr:\n%s" % (name, p.returncode, err))
        check_gone(kids, tmpdir, name)
        print("%s: stopped in %.1f s, nothing left behind" % (name, time.time() - t0))


def main():
    check_help()
    check_option_errors()
    check_stats()
    check_worker_killed()
    check_interrupt(signal.SIGINT)
    check_interrupt(signal.SIGQUIT)


if __name__ == "__main__":
    main()
