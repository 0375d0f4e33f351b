# SPDX-License-Identifier: BSD-3-Clause
"""pbox.Client against a real pboxd: round trips of numpy arrays and torch tensors, in
place and without copies, asynchronous handles, and the errors a user meets (wrong token,
dead or hung appliance, mismatched sizes and types), each raised with libpbox's message."""
import concurrent.futures
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import pbox
import pboxtest
from conftest import PKG_DIR, aggregate_job, run_ranks, subprocess_env

TOKEN = "secret"


def connect(d, rank, workers, job=1, **kw):
    kw.setdefault("timeout", 10.0)
    return pbox.Client(d.control, job, TOKEN, rank, workers, **kw)


def grad(rank, it, key, n):
    """Small integers: every summation order gives the same float32 result, and the mean
    over 2 or 4 ranks is exact."""
    i = np.arange(n, dtype=np.int64)
    return (((rank + 1) * 3 + it * 5 + key * 7 + i % 13) % 32 - 16).astype(np.float32)


def mean_of(workers, it, key, n):
    return sum(grad(r, it, key, n) for r in range(workers)) / np.float32(workers)


def test_numpy_round_trip(appliance):
    """Keys from 1 value to several chunks, sync and async, in place and into out."""
    d = appliance([aggregate_job(1, 2)])
    sizes = {0: 1, 1: 1000, 2: 8193, 3: 300000}

    def rank(r):
        with connect(d, r, 2) as c:
            c.register(sizes)
            assert c.keys == sizes
            for it in range(3):
                for k, n in sizes.items():
                    g = grad(r, it, k, n)
                    if k % 2 == 0:
                        c.push_pull(k, it, g)  # in place
                        out = g
                    else:
                        out = np.zeros(n, np.float32)
                        c.push_pull_async(k, it, g, out).wait(10)
                        np.testing.assert_array_equal(g, grad(r, it, k, n))  # not written
                    np.testing.assert_array_equal(out, mean_of(2, it, k, n))
            st = c.stats()
            assert st["ops_done"] == 3 * len(sizes) and st["ops_failed"] == 0
            # the shared-memory transport's counters (pbox_client_stats' shm_*)
            assert sorted(k for k in st if k.startswith("shm_")) == [
                "shm_bad_desc", "shm_rx_desc", "shm_stale", "shm_torn", "shm_tx_full",
                "shm_tx_waits"]
            return c.info

    infos = run_ranks(2, rank)
    assert [i["rank"] for i in infos] == [0, 1]
    assert infos[0]["workers"] == 2 and infos[0]["mode"] == "aggregate"
    assert infos[0]["total_bytes"] == 4 * sum(sizes.values())


def test_torch_round_trip(appliance):
    """Contiguous CPU tensors (also ones that require grad, and views into a larger
    tensor) are exchanged in place; push and pull separately give the same aggregate."""
    d = appliance([aggregate_job(1, 2)])
    n = 5000

    def rank(r):
        with connect(d, r, 2) as c:
            c.register([(10, n), (11, n), (12, n)])
            w = torch.from_numpy(grad(r, 0, 10, n)).requires_grad_()
            ptr = w.data_ptr()
            c.push_pull(10, 0, w)
            assert w.data_ptr() == ptr
            assert torch.equal(w.detach(), torch.from_numpy(mean_of(2, 0, 10, n)))

            big = torch.zeros(3 * n)
            big[n:2 * n] = torch.from_numpy(grad(r, 0, 11, n))
            c.push_pull(11, 0, big[n:2 * n])  # a contiguous view: results land in big
            assert torch.equal(big[n:2 * n], torch.from_numpy(mean_of(2, 0, 11, n)))
            assert torch.count_nonzero(big[:n]) == 0 and torch.count_nonzero(big[2 * n:]) == 0

            c.push(12, 0, torch.from_numpy(grad(r, 0, 12, n)))
            out = torch.full((n,), -1.0)
            c.pull(12, 0, out)
            assert torch.equal(out, torch.from_numpy(mean_of(2, 0, 12, n)))

    run_ranks(2, rank)


def _hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def test_zero_copy_large_buffers(appliance):
    """A 32 MiB push-pull per rank copies nothing of its size: the process's peak RSS
    (which any copy, written in full, would raise by 32 MiB per rank) stays far below it,
    and the results are in the caller's memory. (Not tracemalloc: stopping it while a
    libpbox thread takes the GIL crashes CPython 3.11, python/cpython#128679.)"""
    d = appliance([aggregate_job(1, 2)])
    n = 8 << 20  # float32 values: 32 MiB
    clients = run_ranks(2, lambda r: connect(d, r, 2))
    try:
        run_ranks(2, lambda r: clients[r].register({0: n, 1: n}))
        arrays = [np.full(n, r + 1, np.float32) for r in range(2)]
        tensors = [torch.full((n,), float(2 * r + 1)) for r in range(2)]
        addrs = [a.ctypes.data for a in arrays]
        ptrs = [t.data_ptr() for t in tensors]
        # Warm-up: both iterations of the job's window (2) for both keys, so whatever
        # memory the transport maps is mapped before the peak is reset: on the
        # shared-memory transport the worker maps its job's results' arenas read-only
        # (shared with pboxd, in RSS once touched, not a copy).
        scratch = [np.zeros(n, np.float32) for r in range(2)]
        for it in (0, 1):
            for key in (0, 1):
                run_ranks(2, lambda r, k=key, i=it: clients[r].push_pull(k, i, scratch[r]))
        del scratch

        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS to the current RSS
        hwm0 = _hwm_kib()
        run_ranks(2, lambda r: clients[r].push_pull(0, 2, arrays[r]))
        run_ranks(2, lambda r: clients[r].push_pull_async(1, 2, tensors[r]).wait(30))
        rss_growth = (_hwm_kib() - hwm0) * 1024
    finally:
        for c in clients:
            c.close()
    assert rss_growth < (8 << 20), "peak RSS grew by %d bytes" % rss_growth
    for r in range(2):
        assert arrays[r].ctypes.data == addrs[r] and tensors[r].data_ptr() == ptrs[r]
        assert np.all(arrays[r] == 1.5)
        assert torch.all(tensors[r] == 2.0)


# The fault mix, with more loss: at MTU 1500 a 32 KB chunk is 24 fragments, and a
# lost result fragment of an in-place push-pull used to fail it with EILSEQ.
LOSSY = "drop=0.04,dup=0.02,reorder=0.05"


@pytest.mark.parametrize("workers", [2, 3])
def test_in_place_mtu1500_with_loss(appliance, workers):
    """In-place push-pulls (numpy arrays and tensors, as the DDP hook does) at MTU 1500
    with loss, duplicates and reordering on every link, in both directions: every result
    is exact, nothing fails, the loss was really there (retransmissions or probes), and
    no datagram came from anywhere but the appliance."""
    d = appliance([aggregate_job(1, workers, reduce="sum")], mtu=1500,
                  fault=LOSSY + ",seed=%d" % (17 + workers))
    sizes = {0: 1, 1: 8000, 2: 300000}
    iters = 6

    def rank(r):
        with connect(d, r, workers, timeout=30, fault=LOSSY + ",seed=%d" % (100 + r)) as c:
            c.register(sizes)
            info = c.info
            assert info["frag_bytes"] <= 1500 and info["chunk_bytes"] == 32768
            for it in range(iters):
                for k, n in sizes.items():
                    g = grad(r, it, k, n)
                    want = sum(grad(q, it, k, n) for q in range(workers))
                    if k == 1:
                        t = torch.from_numpy(g.copy())
                        c.push_pull(k, it, t)
                        np.testing.assert_array_equal(t.numpy(), want)
                    else:
                        c.push_pull_async(k, it, g).wait(60)
                        np.testing.assert_array_equal(g, want)
            return c.stats()

    stats = run_ranks(workers, rank, timeout=300)
    for st in stats:
        assert st["ops_failed"] == 0 and st["ops_done"] == iters * len(sizes), st
        assert st["foreign"] == 0, st
    assert sum(st["retransmits"] + st["probes"] for st in stats) > 0, stats


def test_wrong_token(appliance):
    d = appliance([aggregate_job(1, 2)])
    with pytest.raises(pbox.PboxPermissionError) as ei:
        pbox.Client(d.control, 1, "not-the-token", 0, 2, timeout=5)
    assert ei.value.errno == errno.EACCES
    assert "token" in str(ei.value)
    assert isinstance(ei.value, pbox.PboxError) and isinstance(ei.value, PermissionError)


def test_unknown_job_and_bad_rank(appliance):
    d = appliance([aggregate_job(1, 2)])
    with pytest.raises(pbox.PboxError) as ei:
        pbox.Client(d.control, 7, TOKEN, 0, timeout=5)
    assert ei.value.errno == errno.ENOENT and "7" in str(ei.value)
    with pytest.raises(pbox.PboxError) as ei:
        pbox.Client(d.control, 1, TOKEN, 5, timeout=5)
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ValueError, match="out of range"):
        pbox.Client(d.control, 1, TOKEN, 2, 2)


def test_world_size_must_match_job(appliance):
    d = appliance([aggregate_job(1, 2)])
    with pytest.raises(pbox.PboxError, match="has 2 workers.*world size 3"):
        pbox.Client(d.control, 1, TOKEN, 0, 3, timeout=5)
    # The refused client left: the rank can connect again.
    connect(d, 0, 2).close()


def test_no_appliance_listening():
    """Nothing at the address: a ConnectionError at once, naming the address."""
    tcp, _ = pboxtest.free_ports(1)
    t0 = time.monotonic()
    with pytest.raises(pbox.PboxConnectionError) as ei:
        pbox.Client("127.0.0.1:%d" % tcp, 1, TOKEN, 0, timeout=5)
    assert time.monotonic() - t0 < 5
    assert "127.0.0.1:%d" % tcp in str(ei.value) and "pboxd" in str(ei.value)


def test_appliance_killed_during_operation(appliance):
    """pboxd dies while a push-pull waits for the other rank: the waiting operation fails
    with a ConnectionError well within its timeout."""
    d = appliance([aggregate_job(1, 2)])
    clients = run_ranks(2, lambda r: connect(d, r, 2, timeout=20))
    try:
        run_ranks(2, lambda r: clients[r].register({0: 1000}))
        g = np.ones(1000, np.float32)
        h = clients[0].push_pull_async(0, 0, g)  # rank 1 never pushes
        time.sleep(0.2)
        assert not h.done()
        d.proc.kill()
        d.proc.wait()
        t0 = time.monotonic()
        with pytest.raises(pbox.PboxConnectionError) as ei:
            h.wait(timeout=30)
        assert time.monotonic() - t0 < 10
        assert "closed the control connection" in str(ei.value)
        # Later operations fail at once with the same cause.
        with pytest.raises(pbox.PboxConnectionError):
            clients[1].push_pull(0, 0, g)
    finally:
        for c in clients:
            c.close()
    d.stop()


def test_hung_appliance_times_out(appliance):
    """pboxd stopped (SIGSTOP): connecting and operating both end with a TimeoutError after
    the configured timeout, not before and not much later."""
    d = appliance([aggregate_job(1, 1)])
    c = connect(d, 0, 1, timeout=1.5)
    try:
        c.register({0: 100})
        pboxtest.stop_process(d.proc)
        try:
            g = np.ones(100, np.float32)
            t0 = time.monotonic()
            with pytest.raises(pbox.PboxTimeoutError) as ei:
                c.push_pull(0, 0, g)
            took = time.monotonic() - t0
            assert 1.4 <= took < 10, took
            assert "timed out" in str(ei.value) and "key 0" in str(ei.value)
            assert ei.value.errno == errno.ETIMEDOUT and isinstance(ei.value, TimeoutError)

            t0 = time.monotonic()
            with pytest.raises(pbox.PboxTimeoutError):
                pbox.Client(d.control, 1, TOKEN, 0, timeout=1.0)
            assert 0.9 <= time.monotonic() - t0 < 10
        finally:
            d.proc.send_signal(signal.SIGCONT)
    finally:
        c.close()


def test_mismatched_sizes_and_types(appliance):
    d = appliance([aggregate_job(1, 2)])
    clients = run_ranks(2, lambda r: connect(d, r, 2))
    try:
        c = clients[0]
        c.register({0: 100, 1: 50})
        with pytest.raises(ValueError, match="key 0: grad holds 99 float32 values but the key "
                                             "has 100"):
            c.push(0, 0, np.zeros(99, np.float32))
        with pytest.raises(ValueError, match="key 1: out holds 100"):
            c.push_pull(1, 0, np.zeros(50, np.float32), np.zeros(100, np.float32))
        with pytest.raises(TypeError, match="format 'd'.*float32"):
            c.push(0, 0, np.zeros(100))
        with pytest.raises(TypeError, match="torch.float64"):
            c.push(0, 0, torch.zeros(100, dtype=torch.float64))
        with pytest.raises(ValueError, match="not contiguous"):
            c.push(0, 0, torch.zeros(200)[::2])
        with pytest.raises(ValueError, match="C-contiguous"):
            c.push(0, 0, np.zeros(200, np.float32)[::2])
        ro = np.zeros(100, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="key 0: out cannot be used as a writable"):
            c.pull(0, 0, ro)
        with pytest.raises(TypeError, match="float32 buffer, not list"):
            c.push(0, 0, [0.0] * 100)
        with pytest.raises(KeyError, match="key 5 was not registered"):
            c.push(5, 0, np.zeros(100, np.float32))
        with pytest.raises(ValueError, match="does not fit"):
            c.push_pull_many(np.zeros(120, np.float32), [(0, 0, 0), (1, 0, 100)])
        with pytest.raises(ValueError, match="key 0 appears twice"):
            c.push_pull_many(np.zeros(300, np.float32), [(0, 0, 0), (0, 0, 100)])
        assert c.stats()["ops_done"] == 0  # nothing was started by the refused calls

        # A rank registering other sizes than the session's is refused by the appliance
        # with the first difference named.
        with pytest.raises(pbox.PboxError) as ei:
            clients[1].register({0: 100, 1: 51})
        assert ei.value.errno == errno.EINVAL
        assert "key 1" in str(ei.value) or "51" in str(ei.value), str(ei.value)
    finally:
        for c in clients:
            c.close()


def test_async_wait_timeout_and_gil(appliance):
    """A handle's wait(timeout) raises TimeoutError while the peer is late and leaves the
    operation running; the GIL is free meanwhile, so another Python thread progresses, and
    both ranks can live in one process."""
    d = appliance([aggregate_job(1, 2)])
    clients = run_ranks(2, lambda r: connect(d, r, 2))
    try:
        run_ranks(2, lambda r: clients[r].register({3: 4096}))
        g0 = grad(0, 0, 3, 4096)
        h = clients[0].push_pull_async(3, 0, g0)
        counter = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                counter[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        try:
            with pytest.raises(TimeoutError, match="still in flight") as ei:
                h.wait(timeout=0.5)
            assert not isinstance(ei.value, pbox.PboxError)
        finally:
            stop.set()
            t.join()
        assert counter[0] > 1000, "the waiting thread held the GIL"
        assert not h.done()
        assert "in flight" in repr(h)

        # A second operation on the busy key is refused by libpbox, and says why.
        with pytest.raises(pbox.PboxError) as ei:
            clients[0].push_pull(3, 1, np.zeros(4096, np.float32))
        assert ei.value.errno == errno.EBUSY and "in flight" in str(ei.value)

        g1 = grad(1, 0, 3, 4096)
        clients[1].push_pull(3, 0, g1)  # blocks with the GIL released until both are in
        h.wait(timeout=10)
        assert h.done() and "done" in repr(h)
        np.testing.assert_array_equal(g0, mean_of(2, 0, 3, 4096))
        np.testing.assert_array_equal(g1, g0)
    finally:
        for c in clients:
            c.close()


def test_notify_futures_and_push_pull_many(appliance):
    """push_pull_many completes a concurrent.futures.Future and a torch future from the
    progress thread with the given result; slices of one buffer are exchanged in place."""
    d = appliance([aggregate_job(1, 2)])
    sizes = {0: 10, 1: 3000, 2: 77}
    offsets = {2: 0, 0: 77, 1: 87}
    total = sum(sizes.values())

    def rank(r):
        with connect(d, r, 2) as c:
            c.register(sizes)
            for it in range(3):
                buf = torch.zeros(total)
                for k, o in offsets.items():
                    buf[o:o + sizes[k]] = torch.from_numpy(grad(r, it, k, sizes[k]))
                if it % 2 == 0:
                    fut = torch.futures.Future()
                    h = c.push_pull_many(buf, [(k, it, o) for k, o in offsets.items()], fut, buf)
                    assert fut.wait() is buf
                else:
                    fut = concurrent.futures.Future()
                    h = c.push_pull_many(buf, [(k, it, o) for k, o in offsets.items()],
                                         notify=fut, result="done")
                    assert fut.result(timeout=10) == "done"
                assert h.done() and h.nkeys == 3
                h.wait()
                for k, o in offsets.items():
                    assert torch.equal(buf[o:o + sizes[k]],
                                       torch.from_numpy(mean_of(2, it, k, sizes[k])))

    run_ranks(2, rank)


def test_close_cancels_operations_in_flight(appliance):
    """Closing a client fails its operations in flight (ECANCELED) and completes their
    futures with the error; the closed client refuses further use."""
    d = appliance([aggregate_job(1, 2)])
    clients = run_ranks(2, lambda r: connect(d, r, 2))
    run_ranks(2, lambda r: clients[r].register({0: 64}))
    fut = concurrent.futures.Future()
    h = clients[0].push_pull_async(0, 0, np.ones(64, np.float32), notify=fut)
    clients[0].close()
    assert h.done() and clients[0].closed
    with pytest.raises(pbox.PboxError) as ei:
        h.wait()
    assert ei.value.errno == errno.ECANCELED
    assert isinstance(fut.exception(timeout=5), pbox.PboxError)
    with pytest.raises(pbox.PboxError, match="closed"):
        clients[0].push(0, 0, np.ones(64, np.float32))
    clients[1].close()


def test_info_reports_the_jobs_contract(appliance):
    """info says how the job reduces (from connecting on) and, once keys are registered,
    how it synchronises: the sync model, the staleness bound (-1: none) and the operations
    per key that may be in flight (credits), which the client then allows."""
    opt = {"name": "sgd", "lr": 0.5}
    d = appliance([aggregate_job(1, 1, reduce="sum"),
                   {"id": 2, "token": TOKEN, "workers": 1, "mode": "server-optimizer",
                    "optimizer": opt, "sync": {"model": "ssp", "staleness": 2},
                    "flow": {"mode": "notify-ack", "credits": 3}},
                   {"id": 3, "token": TOKEN, "workers": 1, "mode": "server-optimizer",
                    "optimizer": opt, "sync": {"model": "asp"}}])
    with connect(d, 0, 1) as c:
        i = c.info
        assert i["mode"] == "aggregate" and i["reduce"] == "sum"
        assert i["sync"] is None and i["staleness"] is None and i["credits"] is None
        c.register({0: 8})
        i = c.info
        assert (i["reduce"], i["sync"], i["staleness"], i["credits"]) == ("sum", "bsp", 0, 1)
    with connect(d, 0, 1, job=2) as c:
        c.register({0: 8})
        i = c.info
        assert (i["mode"], i["sync"], i["staleness"], i["credits"]) == (
            "server-optimizer", "ssp", 2, 3)
        c.init(0, np.zeros(8, np.float32))
        # Pulls of a model version that does not exist yet stay in flight: three at once.
        outs = [np.zeros(8, np.float32) for _ in range(4)]
        hs = [c.pull_async(0, 100, outs[k]) for k in range(3)]
        with pytest.raises(pbox.PboxError) as ei:
            c.pull_async(0, 100, outs[3])
        assert ei.value.errno == errno.EBUSY and "3 operation(s) in flight" in str(ei.value)
        c.close()
        for h in hs:  # each with its own error, from libpbox
            with pytest.raises(pbox.PboxError, match="the client was closed") as ei:
                h.wait(10)
            assert ei.value.errno == errno.ECANCELED
    with connect(d, 0, 1, job=3) as c:
        c.register({0: 8})
        assert (c.info["sync"], c.info["staleness"]) == ("asp", -1)


def test_import_errors_are_clear(tmp_path):
    """Without libpbox (the package copied away from the build tree's library) and without
    torch, the imports fail with messages that say what to do."""
    pkg = tmp_path / "pbox"
    shutil.copytree(os.path.join(PKG_DIR, "pbox"), pkg,
                    ignore=shutil.ignore_patterns("*.p", "__pycache__"))
    env = subprocess_env(PYTHONPATH=str(tmp_path), LD_LIBRARY_PATH="")
    r = subprocess.run([sys.executable, "-c", "import pbox"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "cannot load libpbox" in r.stderr and "ldconfig" in r.stderr, r.stderr

    for so in pkg.glob("_pbox*.so"):
        so.unlink()
    r = subprocess.run([sys.executable, "-c", "import pbox"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "is not built" in r.stderr, r.stderr

    code = "import sys; sys.modules['torch'] = None; import pbox.torch"
    r = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "pbox.torch needs PyTorch" in r.stderr and "python3-torch" in r.stderr, r.stderr


def test_server_optimizer_init_and_pull(appliance):
    """Server-optimizer job: rank 0 sets the initial model with init, every rank pulls
    version 0, and a push-pull of iteration t returns model t + 1 (SGD on the appliance:
    w - lr * (sum of gradients), exact here with small integers and lr 0.5)."""
    d = appliance([{"id": 5, "token": TOKEN, "workers": 2, "mode": "server-optimizer",
                    "optimizer": {"name": "sgd", "lr": 0.5}}])
    n = 3000
    w0 = np.arange(n, dtype=np.float32) % 7

    def rank(r):
        with connect(d, r, 2, job=5) as c:
            assert c.info["mode"] == "server-optimizer"
            c.register({9: n})
            if r == 0:
                c.init_async(9, torch.from_numpy(w0)).wait(10)
            w = torch.zeros(n)
            c.pull(9, 0, w)
            np.testing.assert_array_equal(w.numpy(), w0)
            expect = w0.copy()
            for it in range(3):
                c.push_pull(9, it, grad(r, it, 9, n), w)
                expect = expect - np.float32(0.5) * (grad(0, it, 9, n) + grad(1, it, 9, n))
                np.testing.assert_array_equal(w.numpy(), expect)

    run_ranks(2, rank)


def test_client_released_inside_its_own_completion(appliance):
    """The last reference to a client can go away on libpbox's progress thread, in the
    code a completion runs (here a future's done-callback; the garbage collector can do
    the same there). Closing must then not join the thread it runs on: the client is
    closed anyway, and the appliance sees it leave."""
    d = appliance([aggregate_job(1, 1)])
    holder = [connect(d, 0, 1)]
    holder[0].register({0: 256})
    fut = concurrent.futures.Future()
    fut.add_done_callback(lambda f: holder.clear())
    buf = np.ones(256, np.float32)
    holder[0].push_pull_async(0, 0, buf, notify=fut)
    assert fut.result(timeout=10) is None
    assert holder == [] and np.all(buf == 1.0)
    deadline = time.monotonic() + 10
    while True:
        jobs = {j["id"]: j for j in d.stats()["jobs"]}
        if jobs[1]["state"] == "idle":
            break
        assert time.monotonic() < deadline, "the client never left: %s" % jobs[1]
        time.sleep(0.05)
    connect(d, 0, 1).close()  # the rank is free again
