# SPDX-License-Identifier: BSD-3-Clause
"""Fixtures of the pbox Python tests.

The tests use the package built in the meson build tree named by PBOX_BUILD_DIR (default:
<repo>/build): <build>/python holds pbox/ with the extension. pboxd comes from the same
tree, started on free loopback ports by tests/integration/pboxtest.py.

    PBOX_BUILD_DIR=build /usr/bin/python3 -m pytest tests/python
"""
import json
import os
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("PBOX_BUILD_DIR") or os.path.join(REPO, "build"))
PKG_DIR = os.path.join(BUILD, "python")
EXAMPLE = os.path.join(REPO, "python", "examples", "fashion_mnist_ddp.py")

os.environ["PBOX_BUILD_DIR"] = BUILD
sys.path.insert(0, PKG_DIR)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import pboxtest  # noqa: E402

if not os.path.isdir(os.path.join(PKG_DIR, "pbox")):
    raise pytest.UsageError("%s has no pbox package: build with meson/ninja and set "
                            "PBOX_BUILD_DIR to the build directory" % PKG_DIR)


def subprocess_env(**extra):
    """Environment for child Python processes: the built package on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                   else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def aggregate_job(job_id, workers, token="secret", reduce="mean", **kw):
    j = {"id": job_id, "token": token, "workers": workers, "mode": "aggregate",
         "reduce": reduce}
    j.update(kw)
    return j


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Lets fixtures see whether the test failed (item.pbox_failed).
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        item.pbox_failed = True


def dump_appliance(d):
    """pboxd's counters and log, for a failed test's report."""
    try:
        print("pboxd stats: %s" % json.dumps(d.stats()), file=sys.stderr)
    except OSError as e:
        print("pboxd stats unavailable: %s" % e, file=sys.stderr)
    d.dump_log()


@pytest.fixture
def appliance(request):
    """start(jobs, **appliance_settings) -> a running pboxtest.Pboxd. Every pboxd still
    running at the end of the test is stopped and must exit cleanly; after a failed test
    its counters and log are printed."""
    started = []

    def start(jobs, cores=2, **kw):
        kw.setdefault("mtu", 65535)
        d = pboxtest.Pboxd(jobs, cores=cores, **kw)
        d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        if getattr(request.node, "pbox_failed", False) and d.proc is not None:
            dump_appliance(d)
        if d.proc is not None:
            rc = d.stop()
            if rc != 0:
                d.dump_log()
                pytest.fail("pboxd exited with status %d" % rc)


def run_ranks(n, fn, timeout=120):
    """Run fn(rank) for rank 0..n-1 in threads (each rank its own pbox.Client); return the
    results, re-raising the first exception."""
    results = [None] * n
    errors = [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: B036 - reported to the test below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            pytest.fail("a rank thread did not finish within %d s" % timeout)
    for e in errors:
        if e is not None:
            raise e
    return results
