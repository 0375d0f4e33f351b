#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd --transport dpdk refuses what it cannot run with a precise message and exit code,
never a crash: no DPDK port, EAL arguments the EAL rejects, a device that cannot do what is
configured (rte_flow steering on a device without rte_flow), fewer worker lcores than cores, a loopback data
address, EAL arguments without the dpdk transport. Runs the EAL with --no-huge."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from pboxtest import build_path, fail, free_ports  # noqa: E402

EAL = ["--no-pci", "--no-huge", "-m", "256", "--no-shconf", "--log-level", "lib.eal:error"]


def run(args, want_rc, want_msg):
    tcp, _ = free_ports(1)
    cmd = [build_path("dataplane/pboxd"), "--control", "127.0.0.1:%d" % tcp] + args
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        fail("%s: did not exit within 60 s" % " ".join(args))
    out = r.stdout + r.stderr
    if r.returncode != want_rc or want_msg not in out:
        fail("%s: exit %d (want %d), output lacks %r:\n%s" %
             (" ".join(args), r.returncode, want_rc, want_msg, out))
    print("ok: exit %d, '%s'" % (r.returncode, want_msg))


def main():
    r = subprocess.run([build_path("dataplane/pboxd"), "--transport", "dpdk", "--check-config",
                        "--data-address", "10.0.0.1"], capture_output=True, text=True)
    if "not available" in r.stderr:
        print("SKIP: pboxd was built without DPDK")
        sys.exit(77)
    if os.geteuid() != 0:
        print("SKIP: the EAL needs root here (/var/run/dpdk, memory locking)")
        sys.exit(77)
    dp = ["--transport", "dpdk", "--data-address", "10.0.0.1"]
    run(dp + ["--"] + EAL, 69, "no usable port")
    run(dp + ["--"] + EAL + ["--definitely-not-an-eal-option"], 64, "the EAL refused")
    conf = os.path.join(tempfile.mkdtemp(prefix="pbox-dpdk-err-"), "pboxd.conf")
    with open(conf, "w") as f:
        f.write('appliance = { dpdk = { steering = "flow"; }; };\n')
    run(dp + ["-c", conf, "--cores", "2", "--"] + EAL +
        ["--lcores", "(0-2)@(0-1)", "--vdev", "net_ring0"], 69, "does not take the rte_flow rules")
    run(dp + ["--cores", "2", "--"] + EAL + ["-l", "0"], 69, "worker lcore")
    run(["--transport", "dpdk", "--"] + EAL, 78, "needs data_address")
    run(["--"] + EAL, 78, "need --transport dpdk")
    print("6 passed, 0 failed")


if __name__ == "__main__":
    main()
