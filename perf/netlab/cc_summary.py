#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Summarise netlab `run --json` files for the flow/congestion-control comparison
(perf/netlab/README.md): one row per (file, scenario, system) with the median exchange,
its ratio to the link-rate bound, and pbox's retransmitted payload as a share of the
payload it had to send (retransmitted datagrams x fragment bytes, an upper bound: a
chunk's last fragment is shorter; the workers' exchanges: warm-up included), the
drops of the switch ports towards the workers (tbf, what result bursts overflow) and the
result fragments pboxd sent again (selective result resend), both per exchange, and how
busy pboxd's data-plane core was (near 100: the CPU binds, not the link).

Usage: perf/netlab/cc_summary.py LABEL=FILE [LABEL=FILE ...]
"""
import json
import sys


def runs(doc):
    """A file holds one scenario's result, or a list of them."""
    if isinstance(doc, list):
        return doc
    if "results" in doc and isinstance(doc["results"], list):
        return doc["results"]
    return [doc]


def main(argv):
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("| build | loss | system | median s (min–max) | x link bound | "
          "retransmitted payload % | worker tx MB per exchange | switch drops to workers / "
          "results resent per exchange | pboxd busy % | host load before/after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arg in argv:
        label, _, path = arg.partition("=")
        with open(path) as f:
            doc = json.load(f)
        for r in runs(doc):
            sc = r["scenario"]
            bound = r["bounds"]["link_bound_s"]
            for name, p in r["systems"].items():
                if p.get("status") != "ok":
                    print("| %s | %g | %s | %s: %s | | | | | | |" % (
                        label, sc["loss"], name, p.get("status"), p.get("error", "")))
                    continue
                ex = len(p["iter_seconds"]) + sc["warmup"]
                links = [v for k, v in p["links"].items() if k.startswith("w")]
                tx = sum(v["tx_bytes"] for v in links) / ex / len(links) / 1e6
                retx = "–"
                if p.get("retransmits") is not None:
                    pay = p["exchange_bytes"] * sc["workers"] * ex
                    retx = "%.3f" % (100.0 * p["retransmits"] * p["frag_bytes"] / pay)
                drops = sum(v.get("tbf_drops_switch", v.get("tbf_drops", 0)) for v in links)
                resent = (p.get("pboxd") or {}).get("replies_resent")
                dr = "%.0f / %s" % (drops / ex, "–" if resent is None else "%.0f" % (resent / ex))
                busy = (p.get("pboxd") or {}).get("busy_pct")
                busy = "–" if busy is None else "%.0f" % busy
                print("| %s | %g | %s | %.2f (%.2f–%.2f) | %.2f | %s | %.0f | %s | %s | %.1f / %.1f |" % (
                    label, sc["loss"], name, p["median_s"], p["min_s"], p["max_s"],
                    p["median_s"] / bound, retx, tx, dr, busy, r["host"]["load_before"],
                    r["host"]["load_after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
