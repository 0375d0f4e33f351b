#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""UDP GSO / GRO end to end (transport/udp/udp.c): at MTU 1500 every chunk is many datagrams,
which the workers and pboxd send as GSO messages and receive as GRO messages. Three runs
of the same aggregate job, every result checked element by element by the workers:
offloads on both sides (the counters must show GSO and GRO messages), off on both sides
(PBOX_UDP_GSO=0 PBOX_UDP_GRO=0: none may appear), and GSO senders with a pboxd that does
not take GRO (the kernel segments on receive: pboxd must see no coalesced message)."""
import os
import subprocess
import sys

from pboxtest import Pboxd, build_path, fail

KEYS = "50000,3,8192,20000"


def run(label, pboxd_env, worker_env):
    jobs = [{"id": 1, "token": "a", "workers": 2, "mode": "aggregate", "reduce": "sum"}]
    saved = dict(os.environ)
    os.environ.update(pboxd_env)
    try:
        d = Pboxd(jobs, cores=2, mtu=1500)
        d.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        procs = [subprocess.Popen(
            [build_path("tests/integration/pbox-check-worker"), "--server", d.control,
             "--job", "1", "--token", "a", "--rank", str(r), "--workers", "2",
             "--keys", KEYS, "--iters", "10", "--sum", "--async", "--timeout-ms", "60000"],
            env=dict(os.environ, **worker_env), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) for r in range(2)]
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=120)
            sys.stdout.write(out)
            if p.returncode != 0:
                d.dump_log()
                fail("%s: rank %d exited with %d" % (label, r, p.returncode))
        t = d.stats().get("transport")
    finally:
        if d.stop() != 0:
            d.dump_log()
            fail("%s: pboxd exited with an error" % label)
    if t is None or t.get("name") != "udp":
        fail("%s: pboxd reports no udp transport counters: %s" % (label, t))
    tot = t["totals"]
    print("%s: pboxd gso %s gro %s; received %d datagrams in %d messages (%d GRO), %d calls; "
          "sent %d datagrams in %d messages (%d GSO)" %
          (label, t["gso"], t["gro"], tot["rx_pkts"], tot["rx_msgs"], tot["rx_gro_msgs"],
           tot["rx_calls"], tot["tx_pkts"], tot["tx_msgs"], tot["tx_gso_msgs"]))
    return t


def main():
    on = run("offloads on", {}, {})
    if not on["gso"] or not on["gro"]:
        print("skip: this kernel has no UDP GSO / GRO; only the fallback was tested")
    else:
        tot = on["totals"]
        if tot["tx_gso_msgs"] == 0 or tot["tx_msgs"] >= tot["tx_pkts"]:
            fail("pboxd sent no GSO message at MTU 1500: %s" % tot)
        if tot["rx_gro_msgs"] == 0 or tot["rx_msgs"] >= tot["rx_pkts"]:
            fail("pboxd received no coalesced (GRO) message from GSO workers: %s" % tot)
    off_env = {"PBOX_UDP_GSO": "0", "PBOX_UDP_GRO": "0"}
    off = run("offloads off", off_env, off_env)
    tot = off["totals"]
    if off["gso"] or off["gro"] or tot["tx_gso_msgs"] or tot["rx_gro_msgs"]:
        fail("PBOX_UDP_GSO=0 / PBOX_UDP_GRO=0 did not turn the offloads off: %s" % off)
    if tot["tx_msgs"] != tot["tx_pkts"] or tot["rx_msgs"] != tot["rx_pkts"]:
        fail("without offloads every message must be one datagram: %s" % tot)
    mixed = run("GSO workers, pboxd without GRO", {"PBOX_UDP_GRO": "0"}, {})
    if mixed["totals"]["rx_gro_msgs"] or mixed["totals"]["rx_msgs"] != mixed["totals"]["rx_pkts"]:
        fail("pboxd without GRO received coalesced messages: %s" % mixed["totals"])


if __name__ == "__main__":
    main()
