#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of fuzz_ctlplan (tests/fuzz/corpus/ctlplan/seed-*), following the
byte grammar of tests/fuzz/fuzz_ctlplan.c (a mode byte, for mode 1 a worker-count byte,
then JSON): rank plans (valid, and each strictness rule broken once), job plans (valid,
a cycle, a parent out of range, a size that does not match), probe events and
probe_results (a result, an error, a bad id, both at once). Re-run after changing the
grammar.

Usage: tests/fuzz/gen_corpus_ctlplan.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "ctlplan")


def w(name, mode, obj, extra=b""):
    data = bytes([mode]) + extra + json.dumps(obj).encode()
    with open(os.path.join(OUT, "seed-" + name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    good = {"revision": 3, "delta": 0.01, "push": "delta_up", "link": "insufficient",
            "link_bps": 9.5e6, "broadcast": {"select": "delta_up", "delta": 0.01},
            "delta_low": 0.001, "delta_up": 0.01, "min_rate_bps": 25e6, "parent": -1,
            "depth": 1, "children": [1, 2], "phub": "single"}
    w("00-plan", 0, good)
    w("01-plan-delta-mismatch", 0, dict(good, delta=0.001))
    w("02-plan-child-twice", 0, dict(good, children=[1, 1]))
    w("03-plan-unknown", 0, dict(good, extra=1))
    w("04-plan-depth", 0, dict(good, parent=0, depth=1))
    w("05-plan-child-parent", 0, dict(good, parent=2, depth=2, children=[2]))
    w("06-plan-low", 0, dict(good, phub="", push="delta_low", delta=0.001, link="unknown"))
    jp = {"tree": {"root": "a", "parent": [-1, 0, 0], "revision": 4},
          "thresholds": {"min_rate_bps": 25e6, "hysteresis": 0.1, "delta_low": 0.001,
                         "delta_up": 0.01, "broadcast": {"select": "delta_up", "delta": 0.01},
                         "workers": [{"rank": 0, "link": "sufficient", "push": "delta_low",
                                      "delta": 0.001, "bw_bps": 4e7},
                                     {"rank": 1, "link": "insufficient", "push": "delta_up",
                                      "delta": 0.01, "bw_bps": 9e6},
                                     {"rank": 2, "link": "unknown", "push": "delta_low",
                                      "delta": 0.001}]},
          "phub": {"recommend": "hierarchical", "racks": 2}}
    w("07-jobplan", 1, jp, bytes([2]))
    cyc = json.loads(json.dumps(jp))
    cyc["tree"]["parent"] = [1, 2, 0]
    w("08-jobplan-cycle", 1, cyc, bytes([2]))
    bad = json.loads(json.dumps(jp))
    bad["tree"]["parent"] = [-1, 0, 5]
    w("09-jobplan-badparent", 1, bad, bytes([2]))
    w("10-jobplan-wrongsize", 1, jp, bytes([4]))
    w("11-probe-event", 2, {"event": "probe", "id": 7, "request": {
        "peer": "10.0.0.2:55001", "cap_bps": 1e8, "budget_ms": 3000}})
    w("12-probe-result", 2, {"op": "probe_result", "id": 7, "result": {"peer": "x"}})
    w("13-probe-error", 2, {"op": "probe_result", "id": 7, "errno": 16, "error": "busy"})
    w("14-probe-badid", 2, {"op": "probe_result", "id": 0, "errno": 16, "error": "busy"})
    w("15-probe-both", 2, {"op": "probe_result", "id": 9, "errno": 16, "error": "busy",
                           "result": {}})


if __name__ == "__main__":
    main()
