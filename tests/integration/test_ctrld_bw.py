#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pbox-ctrld's bandwidth matrix over loopback (its ops and refusals; the accuracy is
checked in namespaces by tests/netns/test_ctrld_bw.py):
 - --check-config refuses bad bandwidth groups (unknown pboxd, a name as address, a bad
   cap, no pairs, a pair twice) and expands all_to to every managed pboxd;
 - a pair to the pboxd's own responder is probed every interval (probes count up) and has
   an estimate with its timestamp; a pair to a silent port fails with the cause;
 - bw_list / bw_probe need the admin token (EACCES); an unknown pair is ENOENT, missing
   arguments EINVAL; `pbox bw probe A B --wait` prints the new result;
 - a cap above the agent's max_rate is refused by the pboxd and shown as the last error."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

from pboxtest import Pboxd, _lc_value, build_path, control_request, fail, free_port, \
    print_tail, wait_answering


def write_conf(path, ctrl, pboxds, bw):
    with open(path, "w") as f:
        f.write("ctrld = %s;\npboxds = %s;\n" % (_lc_value(ctrl), _lc_value(pboxds)))
        if bw is not None:
            f.write("bandwidth = %s;\n" % _lc_value(bw))


def check_config(binary, path, want_rc, want_text):
    p = subprocess.run([binary, "-c", path, "--check-config"], capture_output=True, text=True)
    print("--check-config -> %d %s" % (p.returncode, (p.stdout + p.stderr).strip()))
    if p.returncode != want_rc or want_text not in p.stdout + p.stderr:
        fail("--check-config: expected %d and '%s'" % (want_rc, want_text))


def expect(r, errno, what):
    print("%s -> %s" % (what, json.dumps(r)[:200]))
    if r.get("ok") is not False or r.get("errno") != errno:
        fail("%s: expected errno %d, got %s" % (what, errno, r))


def main():
    ctrld_bin = build_path("ctrlplane/ctrld/pbox-ctrld")
    pbox_bin = build_path("apps/pbox")
    tmp = tempfile.mkdtemp(prefix="pboxtest-ctrld-bw-")
    token = "bw-secret"
    uport = free_port(socket.SOCK_DGRAM)
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    good = "127.0.0.1:%d" % uport
    mute = "127.0.0.1:%d" % silent.getsockname()[1]
    with Pboxd([], probe={"port": uport, "address": "127.0.0.1", "max_rate": "200mbit",
                          "max_budget_s": 2}) as d:
        cport = free_port(socket.SOCK_STREAM)
        caddr = "127.0.0.1:%d" % cport
        ctrl = {"listen": caddr, "admin_token": token, "request_timeout": 3000}
        managed = [{"name": "a", "control": d.control, "admin_token": d.admin_token}]
        conf = os.path.join(tmp, "ctrld.conf")
        bw = {"interval": 1, "cap": "100mbit", "budget": 1,
              "pairs": [{"from": "a", "to": good}, {"from": "a", "to": mute}]}
        for bad, text in (
                (dict(bw, pairs=[{"from": "b", "to": good}]), "not the name of a managed"),
                (dict(bw, pairs=[{"from": "a", "to": "probe.example.com:1"}]),
                 "expected a numeric ADDRESS[:PORT]"),
                (dict(bw, cap="fast"), "cap: expected a rate"),
                ({"interval": 5}, "no probe pairs"),
                (dict(bw, pairs=[{"from": "a", "to": good}], all_to=[good]),
                 "given twice")):
            write_conf(conf, ctrl, managed, bad)
            check_config(ctrld_bin, conf, 78, text)
        write_conf(conf, ctrl, managed, {"all_to": [good, mute]})
        check_config(ctrld_bin, conf, 0, "ok")
        write_conf(conf, ctrl, managed, bw)
        log = open(os.path.join(tmp, "ctrld.log"), "w")
        ctrld = subprocess.Popen([ctrld_bin, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 20
            while True:
                time.sleep(0.2)
                try:
                    r = control_request(caddr, {"op": "bw_list", "admin_token": token})
                except OSError:
                    r = {}
                pairs = {p["to"]: p for p in r.get("pairs", [])}
                if len(pairs) == 2 and pairs[good]["probes"] >= 2 and \
                        pairs[mute]["state"] == "failed":
                    break
                if time.time() > deadline:
                    fail("no periodic probes within 20 s: %s" % r)
            print("bw_list: %s" % json.dumps(r)[:600])
            g, m = pairs[good], pairs[mute]
            if g["state"] not in ("ok", "probing") or "estimate" not in g or \
                    g["estimate"]["r_max_bps"] > 100e6 * 1.001 or g["age_s"] > 30:
                fail("the loopback pair: %s" % g)
            if "timed out" not in m.get("last_error", "") or "estimate" in m:
                fail("the silent pair: %s" % m)
            expect(control_request(caddr, {"op": "bw_list"}), 13, "bw_list without token")
            expect(control_request(caddr, {"op": "bw_list", "admin_token": "x"}), 13,
                   "bw_list with a wrong token")
            expect(control_request(caddr, {"op": "bw_probe", "admin_token": token,
                                           "from": "a", "to": "127.0.0.1:1"}), 2,
                   "bw_probe of an unknown pair")
            expect(control_request(caddr, {"op": "bw_probe", "admin_token": token,
                                           "from": "a"}), 22, "bw_probe without to")
            env = dict(os.environ, PBOX_ADMIN_TOKEN=token)
            p = subprocess.run([pbox_bin, "bw", "probe", "--wait", "20", "--control", caddr,
                                "a", good], env=env, capture_output=True, text=True,
                               timeout=60)
            print("pbox bw probe -> %d\n%s%s" % (p.returncode, p.stdout, p.stderr))
            if p.returncode != 0 or "Mbit/s" not in p.stdout:
                fail("pbox bw probe a %s" % good)
            p = subprocess.run([pbox_bin, "bw", "--control", caddr], env=env,
                               capture_output=True, text=True, timeout=60)
            print("pbox bw -> %d\n%s" % (p.returncode, p.stdout))
            if p.returncode != 0 or good not in p.stdout or mute not in p.stdout or \
                    "timed out" not in p.stdout:
                fail("pbox bw list")
            p = subprocess.run([pbox_bin, "bw", "--help"], capture_output=True, text=True)
            if p.returncode != 0 or "Usage: pbox bw" not in p.stdout:
                fail("pbox bw --help")
        finally:
            ctrld.terminate()
            rc = ctrld.wait(timeout=30)
            log.close()
            print_tail(os.path.join(tmp, "ctrld.log"), 20, "pbox-ctrld log")
        if rc != 0:
            fail("pbox-ctrld exited %d" % rc)

        # A cap above the agent's max_rate: refused by the pboxd, shown as the last error.
        write_conf(conf, ctrl, managed, dict(bw, interval=0, cap="1gbit",
                                             pairs=[{"from": "a", "to": good}]))
        ctrld = subprocess.Popen([ctrld_bin, "-c", conf], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.STDOUT)
        try:
            r = wait_answering(caddr, {"op": "bw_probe", "admin_token": token, "from": "a",
                                       "to": good}, "pbox-ctrld")
            while True:
                e = control_request(caddr, {"op": "bw_list", "admin_token": token})["pairs"][0]
                if e["state"] == "failed":
                    break
                if time.time() > deadline:
                    fail("the over-cap probe did not fail: %s" % e)
                time.sleep(0.1)
            print("over the agent's cap: %s" % e)
            if "above this agent's limits" not in e["last_error"]:
                fail("over-cap refusal not shown: %s" % e)
        finally:
            ctrld.terminate()
            ctrld.wait(timeout=30)
        if d.stats()["probe"]["refused_limits"] != 1:
            fail("the pboxd did not count the over-cap refusal")
    # A pboxd that never answers: pbox-ctrld stops within seconds all the same (it does
    # not wait out the probe's budget + request timeout, 10 + 3 + 2 s here).
    mute_tcp = socket.socket()
    mute_tcp.bind(("127.0.0.1", 0))
    mute_tcp.listen(8)
    write_conf(conf, dict(ctrl, request_timeout=3000),
               [{"name": "m", "control": "127.0.0.1:%d" % mute_tcp.getsockname()[1],
                 "admin_token": "x"}],
               {"interval": 60, "cap": "100mbit", "budget": 10,
                "pairs": [{"from": "m", "to": good}]})
    ctrld = subprocess.Popen([ctrld_bin, "-c", conf], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 20
    while True:
        try:
            e = control_request(caddr, {"op": "bw_list", "admin_token": token})["pairs"][0]
            if e["state"] == "probing":
                break
        except OSError:
            pass
        if time.time() > deadline:
            fail("pbox-ctrld did not start probing the mute pboxd")
        time.sleep(0.1)
    t0 = time.time()
    ctrld.terminate()
    out, _ = ctrld.communicate(timeout=30)
    dt = time.time() - t0
    print("pbox-ctrld stopped in %.1f s during a probe (exit %d)" % (dt, ctrld.returncode))
    if ctrld.returncode != 0 or dt > 6:
        print(out[-2000:])
        fail("pbox-ctrld did not stop promptly during a probe")
    mute_tcp.close()
    silent.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print("pbox-ctrld bandwidth matrix: ops, refusals, periodic and on-demand probes OK")


if __name__ == "__main__":
    main()
