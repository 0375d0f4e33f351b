#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""`pbox demo --mode broadcast --dvf` (Parameter Flow's filter on the pushes and on the
broadcasts, default thresholds and codec): trains to at least 85% test accuracy in two
epochs with every replica identical, moves far fewer bytes than the dense payload, and
reports what the filter did. Then the same run with loss, duplication and reordering
injected on every send (pboxd's and the workers'): the replicas are bit-identical to the
loss-free run's, so a resent fragment carried the same bytes (neither residual was
applied twice)."""
import json
import re
import sys

from pboxtest import fail, run_demo

MODEL_FLOATS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
ARGS = ["--mode", "broadcast", "--dvf", "--epochs", "2", "--json"]


def demo(extra):
    p = run_demo(ARGS + extra, timeout=240)
    sys.stdout.write(p.stderr)
    if p.returncode != 0:
        fail("pbox demo %s exited with %d:\n%s" % (" ".join(ARGS + extra), p.returncode,
                                                  p.stdout))
    return p, json.loads(p.stdout)


def main():
    p, res = demo([])
    dense = 2 * 3 * res["steps"] * MODEL_FLOATS * 4  # every push and every result, dense
    print("dvf demo: test accuracy %.2f%%, %d bytes on the wire (dense payload %d: %.2fx)"
          % (100 * res["final_test_acc"], res["wire_bytes"], dense,
             dense / res["wire_bytes"]))
    if not res["ok"] or res["dvf"] is None or res["mode"] != "broadcast":
        fail("unexpected summary: %s" % p.stdout)
    if res["final_test_acc"] < 0.85:
        fail("final test accuracy %.4f is below 0.85" % res["final_test_acc"])
    if not res["replicas_identical"]:
        fail("replicas differ: %s" % res["model_crcs"])
    d = res["appliance"]["dvf"]
    if sum(d["rejects"].values()) != 0 or res["appliance"]["drops"]["bad_block"] != 0:
        fail("blocks rejected on a clean run: %s" % d)
    # The default thresholds drop most pushed values and many broadcast ones.
    if not (d["in_bytes"] * 2 < d["in_dense"] and d["out_bytes"] * 1.2 < d["out_dense"]
            and d["blocks"] > 0 and d["in_vals"] * 4 < d["in_dense"]):
        fail("the filter did little: %s" % d)
    if not res["wire_bytes"] * 1.5 < dense:
        fail("%d bytes on the wire for %d dense bytes of payload" % (res["wire_bytes"], dense))
    if not re.search(r"^dvf: pushes .* for .* dense \([0-9.]+x smaller, [0-9.]+% of the "
                     r"values sent\); broadcasts", p.stderr, re.M):
        fail("no dvf line in the output")

    # 30 steps each, with and without faults (short: every loss costs a timeout).
    _, clean = demo(["--max-steps", "30"])
    _, lossy = demo(["--max-steps", "30", "--fault", "drop=0.02,dup=0.02,reorder=0.05,seed=11"])
    if lossy["appliance"]["rx_retransmits"] == 0:
        fail("the fault injector caused no retransmission")
    if lossy["model_crcs"] != clean["model_crcs"] or not clean["replicas_identical"]:
        fail("under loss the replicas differ from the loss-free run: %s vs %s"
             % (lossy["model_crcs"], clean["model_crcs"]))
    print("under loss: %d retransmissions received by pboxd, replicas bit-identical to the "
          "loss-free run" % lossy["appliance"]["rx_retransmits"])


if __name__ == "__main__":
    main()
