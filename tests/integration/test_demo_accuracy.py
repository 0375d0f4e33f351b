#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""`pbox demo` with its defaults (3 workers, pboxd, Fashion-MNIST) trains to at least 85%
test accuracy, reports every epoch over all ranks and the whole test set, counts the bytes
its workers put on the wire, and prints plain progress lines when stderr is not a
terminal."""
import json
import re
import sys
import time

from pboxtest import fail, run_demo

MODEL_FLOATS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10


def main():
    t0 = time.time()
    p = run_demo(["--json"], timeout=300)
    elapsed = time.time() - t0
    sys.stdout.write(p.stderr)
    if p.returncode != 0:
        fail("pbox demo exited with %d:\n%s" % (p.returncode, p.stdout))
    res = json.loads(p.stdout)
    print("demo: %.1f s, final test accuracy %.2f%%, %.0f samples/s"
          % (elapsed, 100 * res["final_test_acc"], res["samples_per_s"]))
    if not res["ok"] or res["workers"] != 3:
        fail("unexpected summary: %s" % p.stdout)
    if res["final_test_acc"] < 0.85:
        fail("final test accuracy %.4f is below 0.85" % res["final_test_acc"])
    epochs = res["epochs"]
    if [e["epoch"] for e in epochs] != [1, 2, 3]:
        fail("expected epochs 1..3 in the summary, got %s" % [e["epoch"] for e in epochs])
    for e in epochs:
        if e["test_samples"] != 10000 or e["steps"] != 250:
            fail("epoch %d: %d test samples, %d steps; expected the whole test set and 250 "
                 "steps of 240" % (e["epoch"], e["test_samples"], e["steps"]))
        if not 0 < e["train_loss"] < 2.4 or not 0.5 < e["train_acc"] <= 1:
            fail("epoch %d: implausible train loss %s / accuracy %s"
                 % (e["epoch"], e["train_loss"], e["train_acc"]))
    if not epochs[2]["train_loss"] < epochs[0]["train_loss"]:
        fail("train loss did not fall: %s" % [e["train_loss"] for e in epochs])
    # Every step, every worker sends its gradient and receives the model: a lower bound
    # on the bytes; headers and retransmissions stay far below doubling it.
    payload = 2 * 3 * res["steps"] * MODEL_FLOATS * 4
    if not payload <= res["wire_bytes"] < 2 * payload:
        fail("%d bytes on the wire for %d bytes of payload" % (res["wire_bytes"], payload))
    if res["samples"] != 3 * 250 * 240 or res["samples_per_s"] <= 0:
        fail("samples %d, %.1f samples/s" % (res["samples"], res["samples_per_s"]))
    for e in (1, 2, 3):
        if not re.search(r"^epoch %d/3: train loss [0-9.]+ acc [0-9.]+%% \| test acc "
                         r"[0-9.]+%%" % e, p.stderr, re.M):
            fail("no summary line for epoch %d in the output" % e)
    if "\x1b[" in p.stderr or "\r" in p.stderr:
        fail("terminal control sequences in output that is not a terminal")
    if not re.search(r"^final test accuracy: [0-9.]+%", p.stderr, re.M):
        fail("no final accuracy line")


if __name__ == "__main__":
    main()
