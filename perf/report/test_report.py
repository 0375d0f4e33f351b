#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/report renders its plots from the fixtures in perf/report/fixtures (small outputs
of the real benchmarks): every figure has a title and labelled axes and carries the
machine, date and command in the image and in its PNG text chunks; the PNGs exist and
have a sane size; `report.py --from` writes report.md/.html that reference each of
them; unreadable input is refused with a message."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")
sys.path.insert(0, HERE)
import report  # noqa: E402

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)
    return cond


def png_info(path):
    """(width, height, {text key: value}) of a PNG, read chunk by chunk."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("%s is not a PNG" % path)
    pos, width, height, text = 8, 0, 0, {}
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]:
            raise ValueError("%s: bad CRC in chunk %s" % (path, kind))
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            k, v = body.split(b"\0", 1)
            text[k.decode("latin-1")] = v.decode("latin-1")
        elif kind == b"zTXt":
            k, rest = body.split(b"\0", 1)
            text[k.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            k, rest = body.split(b"\0", 1)
            comp, _, rest = rest[0], rest[1], rest[2:]
            _, _, val = rest.split(b"\0", 2)
            text[k.decode("latin-1")] = (zlib.decompress(val) if comp else val).decode()
        pos += 12 + n
    return width, height, text


def check_figure(name, fig):
    """Labels checked on the figure objects, before saving."""
    axes = fig.axes
    check(len(axes) >= 1, "%s: no axes" % name)
    for ax in axes:
        check(ax.get_title().strip(), "%s: an axes without a title" % name)
        check(ax.get_xlabel().strip(), "%s: x axis not labelled" % name)
        check(ax.get_ylabel().strip(), "%s: y axis not labelled" % name)
        check(ax.has_data(), "%s: nothing drawn" % name)
    footer = "\n".join(t.get_text() for t in fig.texts)
    for word in ("machine:", "date:", "command:"):
        check(word in footer, "%s: the figure does not show '%s'" % (name, word))


def check_png(name, path, src):
    if not check(os.path.exists(path), "%s: %s was not written" % (name, path)):
        return
    w, h, text = png_info(path)
    size = os.path.getsize(path)
    print("  %s: %d x %d px, %d bytes, text keys %s" % (name, w, h, size, sorted(text)))
    check(800 <= w <= 4000 and 400 <= h <= 3000, "%s: %d x %d px is not a sane size" %
          (name, w, h))
    check(size > 20000, "%s: %d bytes: too small to hold a plot" % (name, size))
    check(text.get("Command", "").find(src.command.split()[0]) >= 0,
          "%s: PNG Command %r does not name %r" % (name, text.get("Command"), src.command))
    check(src.machine in text.get("Machine", ""), "%s: PNG Machine %r lacks %r" %
          (name, text.get("Machine"), src.machine))
    check(src.date in text.get("Date", ""), "%s: PNG Date %r lacks %r" %
          (name, text.get("Date"), src.date))


def main():
    out = tempfile.mkdtemp(prefix="pbox-report-test-")
    try:
        sources = {s.kind: s for s in report.read_dir(FIX)}
        print("fixtures: %s" % ", ".join("%s=%s" % (k, os.path.basename(s.path))
                                         for k, s in sorted(sources.items())))
        check(set(sources) == {"comm", "kernels", "netlab", "sync", "torch", "dvf", "slops"},
              "fixtures not all classified: %s" % sorted(sources))
        comm = report.load_json(sources["comm"].path)
        figs = {
            "sweep": (report.plot_sweep(comm, sources["comm"]), sources["comm"]),
            "kernels": (report.plot_kernels(report.read_kernels(sources["kernels"].path),
                                            sources["kernels"]), sources["kernels"]),
            "comm": (report.plot_comm(comm, sources["comm"],
                                      report.load_json(sources["torch"].path),
                                      sources["torch"]), sources["comm"]),
            "netlab": (report.plot_netlab(report.load_json(sources["netlab"].path),
                                          [sources["netlab"]]), sources["netlab"]),
            "sync": (report.plot_sync(report.read_sync(sources["sync"].path),
                                      sources["sync"]), sources["sync"]),
            "dvf": (report.plot_dvf(report.read_dvf(sources["dvf"].path), sources["dvf"]),
                    sources["dvf"]),
            "slops": (report.plot_slops([sources["slops"]]), sources["slops"]),
        }
        for name, (fig, src) in figs.items():
            check_figure(name, fig)
            path = os.path.join(out, name + ".png")
            report.save(fig, path)
            check_png(name, path, src)
        # The sweep plots one point per chunk size of each window.
        sweep_pts = sum(len(l.get_xdata()) for l in figs["sweep"][0].axes[0].lines) \
            if figs["sweep"][0].axes else 0
        groups = report.sweep_groups(comm)
        check(sweep_pts == sum(len(v) for v in groups.values()) > 0,
              "sweep: %d points drawn for %d runs" % (sweep_pts,
                                                      sum(len(v) for v in groups.values())))
        # DVF: one point per row in each panel (traffic, throughput); traffic = 1/ratio.
        rows = report.read_dvf(sources["dvf"].path)
        t_ax, g_ax = figs["dvf"][0].axes[:2]
        pts = [(x, y) for l in t_ax.lines for x, y in zip(l.get_xdata(), l.get_ydata())]
        check(len(pts) == len(rows), "dvf: %d traffic points for %d rows" % (len(pts), len(rows)))
        want = sorted((round(100 * r["sparsity"], 6), round(100 / r["ratio"], 6)) for r in rows)
        check(sorted((round(x, 6), round(y, 6)) for x, y in pts) == want,
              "dvf: the traffic points are not 100/ratio at each sparsity")
        check(sum(len(l.get_xdata()) for l in g_ax.lines if len(l.get_xdata()) > 2) == len(rows),
              "dvf: the throughput panel does not show every row")
        # SLoPS: one range per run with a known true value (the 'max' row has none).
        runs = report.slops_runs([sources["slops"]])
        with open(sources["slops"].path) as f:
            raw = json.load(f)["runs"]
        check(len(runs) == sum(1 for r in raw if r.get("true_bps")) and len(runs) < len(raw),
              "slops: %d runs plotted of %d (the 'max' row must be left out)" %
              (len(runs), len(raw)))
        a_ax = figs["slops"][0].axes[0]
        drawn = sum(len(c[0].get_xdata()) for c in a_ax.containers)
        check(drawn == len(runs), "slops: %d ranges drawn for %d runs" % (drawn, len(runs)))

        # pbox-bench-dvf --json, for real (tiny): its rows are classified and plotted.
        build = os.environ.get("PBOX_BUILD_DIR")
        bench = os.path.join(build or "", "perf", "dvf", "pbox-bench-dvf")
        if build and os.path.exists(bench):
            jl = os.path.join(out, "bench-dvf.jsonl")
            p = subprocess.run([bench, "--sparsity", "0.5,0.9", "--codecs", "none,lz4",
                                "--seconds", "0.01", "--mlp-steps", "1", "--json", jl],
                               capture_output=True, text=True, timeout=120)
            if check(p.returncode == 0, "pbox-bench-dvf --json: exit %d: %s" %
                     (p.returncode, p.stderr[-500:])):
                rows = report.read_dvf(jl)
                table = [l for l in p.stdout.splitlines() if l.startswith("| 0.") or
                         re.match(r"^\| [\d.e+-]+ \| [\d.]+ \|", l)]
                check(report.classify(jl) == "dvf" and len(rows) == 4 == len(table),
                      "pbox-bench-dvf --json: %d rows (%s) for %d table rows" %
                      (len(rows), report.classify(jl), len(table)))
                check(all(abs(r["ratio"] - float(t.split("|")[7])) < 0.006
                          for r, t in zip(rows, table)),
                      "pbox-bench-dvf --json: ratios differ from the table's")
                src = report.Source("dvf", jl, "pbox-bench-dvf --json", "now", "here")
                fig = report.plot_dvf(rows, src)
                check_figure("dvf (bench)", fig)
                report.save(fig, os.path.join(out, "bench-dvf.png"))
                print("  pbox-bench-dvf --json: %d rows, plotted" % len(rows))
        else:
            print("  (PBOX_BUILD_DIR has no pbox-bench-dvf: its --json is not run here)")

        # The command line, end to end.
        rdir = os.path.join(out, "cli")
        p = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--from", FIX,
                            "--out", rdir], capture_output=True, text=True)
        print(p.stdout.strip())
        if check(p.returncode == 0, "report.py --from fixtures exited with %d: %s" %
                 (p.returncode, p.stderr[-800:])):
            md = open(os.path.join(rdir, "report.md")).read()
            html = open(os.path.join(rdir, "report.html")).read()
            for kind in report.KINDS:
                png = os.path.join(rdir, kind + ".png")
                check(os.path.exists(png) and os.path.getsize(png) > 20000,
                      "cli: %s missing or tiny" % png)
                check("(%s.png)" % kind in md and 'src="%s.png"' % kind in html,
                      "cli: the report does not show %s.png" % kind)
            check("Not plotted" not in md and "not plotted" not in p.stdout,
                  "cli: a plot is reported missing from the complete fixtures: %s" % p.stdout)

        # Without a manifest, files are recognised by their content.
        bare = os.path.join(out, "bare")
        shutil.copytree(FIX, bare)
        os.unlink(os.path.join(bare, "manifest.json"))
        kinds = {s.kind: s for s in report.read_dir(bare)}
        check(set(kinds) == set(sources), "without the manifest: %s" % sorted(kinds))
        check(all("[read from" in s.command and ("file time" in s.date or "committed" in s.date
                                                 or "from the file" in s.date)
                  for s in kinds.values()),
              "without the manifest the provenance must say it was read from the files")

        # Refusals: an empty directory, a kernels file without its tables.
        empty = os.path.join(out, "empty")
        os.makedirs(empty)
        p = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--from", empty,
                            "--out", os.path.join(out, "x")], capture_output=True, text=True)
        check(p.returncode == 1 and "no benchmark output found" in p.stderr,
              "an empty --from directory: exit %d, %r" % (p.returncode, p.stderr))
        bad = os.path.join(out, "bad.txt")
        with open(bad, "w") as f:
            f.write("calls/rep\nbuffers of nothing\n")
        try:
            report.read_kernels(bad)
            check(False, "read_kernels accepted a file without tables")
        except report.ReportError as e:
            check("no 'buffers of" in str(e), "read_kernels: %s" % e)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("report plots: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
