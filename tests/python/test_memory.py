# SPDX-License-Identifier: BSD-3-Clause
"""pbox.Client.alloc: registered memory (pbox_mem_alloc) from Python.

Exact results of push_pull from and into registered buffers (numpy and torch views, in
place and into another buffer); over shm pboxd reads the pushes in place (its rx_ref
counter) and only then; plain memory over UDP or with PBOX_SHM_REGISTER=0, same results;
freeing in any order (views keep the memory, the last reference frees the registration);
after close the views taken before keep their bytes, everything else raises a clear error.
"""
import errno
import gc
import os
import resource
import time
import weakref

import numpy as np
import pytest
import torch

import pbox
from conftest import aggregate_job, run_ranks

TOKEN = "secret"
N = 300000  # float32 values of key 0: several chunks, every fragment a reference


def connect(d, rank, workers, job=1):
    return pbox.Client(d.control, job, TOKEN, rank, workers, timeout=10.0)


def grad(rank, it, n):
    """Small integers: the mean over 2 ranks is exact in any order."""
    i = np.arange(n, dtype=np.int64)
    return (((rank + 1) * 3 + it * 5 + i % 13) % 32 - 16).astype(np.float32)


def mean_of(workers, it, n):
    return sum(grad(r, it, n) for r in range(workers)) / np.float32(workers)


def shm_refs(d):
    return d.stats()["transport"]["shm"]["rx_ref"]


def gone(ref):
    """Whether ref's object goes within 5 s: an operation's buffers are released by its
    last completion callback, on libpbox's progress thread, just after the wait returns."""
    for _ in range(1000):
        if ref() is None:
            return True
        time.sleep(0.005)
    gc.collect()  # (no cycle is expected: reference counting alone frees it)
    return ref() is None


def exchange(d, expect_transport, expect_registered):
    """2 ranks, 3 iterations each: numpy in place, torch in place, numpy into a second
    registered buffer. Returns the ranks' transports."""
    def rank(r):
        with connect(d, r, 2) as c:
            c.register({0: N})
            assert c.transport == expect_transport
            m, m_out = c.alloc(4 * N), c.alloc(4 * N)
            assert isinstance(m, pbox.Memory) and len(m) == m.nbytes == 4 * N
            assert m.registered is expect_registered and m_out.registered is expect_registered
            assert m.address % 4096 == 0
            g = np.frombuffer(m, np.float32)
            assert not g.any()  # zeroed
            t = torch.frombuffer(m, dtype=torch.float32)
            out = np.frombuffer(m_out, np.float32)
            g[:] = grad(r, 0, N)
            c.push_pull(0, 0, g)
            np.testing.assert_array_equal(g, mean_of(2, 0, N))
            t.copy_(torch.from_numpy(grad(r, 1, N)))
            c.push_pull(0, 1, t)
            np.testing.assert_array_equal(t.numpy(), mean_of(2, 1, N))
            g[:] = grad(r, 2, N)
            c.push_pull_async(0, 2, g, out).wait(10)
            np.testing.assert_array_equal(out, mean_of(2, 2, N))
            np.testing.assert_array_equal(g, grad(r, 2, N))  # the source is not written
            return c.transport

    return run_ranks(2, rank)


def test_registered_exact_over_shm(appliance, monkeypatch):
    monkeypatch.setenv("PBOX_TRANSPORT", "shm")
    monkeypatch.delenv("PBOX_SHM_REGISTER", raising=False)
    d = appliance([aggregate_job(1, 2)])
    exchange(d, "shm", True)
    # every push of 3 iterations x 2 ranks came as references into the registered memory
    assert shm_refs(d) >= 6 * (4 * N // 65536)


@pytest.mark.parametrize("how", ["udp", "refused"])
def test_plain_memory_same_results(appliance, monkeypatch, how):
    if how == "udp":
        monkeypatch.setenv("PBOX_TRANSPORT", "udp")
    else:
        monkeypatch.setenv("PBOX_TRANSPORT", "shm")
        monkeypatch.setenv("PBOX_SHM_REGISTER", "0")
    d = appliance([aggregate_job(1, 2)])
    exchange(d, "udp" if how == "udp" else "shm", False)
    if how == "refused":
        assert shm_refs(d) == 0  # copied into the ring, not read in place


def test_freeing_order(appliance, monkeypatch):
    """Views keep the memory alive; the last reference unregisters it. pboxd holds at most
    shm.max_regions (64) regions per worker: 70 allocations in a row are all registered
    only if each one freed its registration."""
    monkeypatch.setenv("PBOX_TRANSPORT", "shm")
    monkeypatch.delenv("PBOX_SHM_REGISTER", raising=False)
    d = appliance([aggregate_job(1, 1)])
    with connect(d, 0, 1) as c:
        c.register({0: 1000})
        for i in range(70):
            m = c.alloc(4000)
            assert m.registered, "allocation %d not registered: earlier ones not freed" % i
            v = np.frombuffer(m, np.float32)
            v[:] = i
            if i % 2:  # the Memory first, then its view (which still works)
                ref = weakref.ref(m)
                del m
                assert ref() is not None  # the view holds it
                c.push_pull(0, i, v)
                assert (v == i).all()
                del v
                assert gone(ref)
            else:  # the view first
                c.push_pull(0, i, v)
                ref = weakref.ref(m)
                del v
                del m
                assert gone(ref)
        # pboxd handles the unregistrations on its own time
        for _ in range(500):
            live = d.stats()["transport"]["shm"]["regions"]["live"]
            if live == 0:
                break
            time.sleep(0.01)
        assert live == 0, "%d regions still registered with pboxd" % live
        # a torch tensor over it keeps it too
        m = c.alloc(4000)
        t = torch.frombuffer(m, dtype=torch.float32)
        ref = weakref.ref(m)
        del m
        t.fill_(3.0)
        c.push_pull(0, 70, t)
        assert bool((t == 3.0).all())
        del t
        assert gone(ref)


def test_use_after_close(appliance, monkeypatch):
    """Closing with registered memory in use: the views taken before keep their bytes (no
    crash on access); new views, allocations and operations raise pbox.PboxError."""
    monkeypatch.setenv("PBOX_TRANSPORT", "shm")
    monkeypatch.delenv("PBOX_SHM_REGISTER", raising=False)
    # Two ranks: rank 1 takes part in iteration 0 only, so rank 0's iteration 1 cannot
    # complete and is certainly in flight when rank 0 closes (with one rank it could
    # finish first on a descheduled main thread).
    d = appliance([aggregate_job(1, 2)])
    c = connect(d, 0, 2)
    c1 = connect(d, 1, 2)
    with pytest.raises(pbox.PboxError) as ei:
        c.alloc(4096)  # before register
    assert ei.value.errno == errno.ENOTCONN and "register" in str(ei.value)
    c.register({0: N})
    c1.register({0: N})
    with pytest.raises(ValueError):
        c.alloc(0)
    m = c.alloc(4 * N)
    assert m.registered
    v = np.frombuffer(m, np.float32)
    t = torch.frombuffer(m, dtype=torch.float32)
    v[:] = grad(0, 0, N)
    v1 = grad(1, 0, N)
    h1 = c1.push_pull_async(0, 0, v1)
    c.push_pull(0, 0, v)
    h1.wait(10)
    np.testing.assert_array_equal(v, mean_of(2, 0, N))
    # an operation from it still in flight when the client closes fails, nothing else
    h = c.push_pull_async(0, 1, v)
    c.close()
    with pytest.raises(pbox.PboxError):
        h.wait(10)
    c1.close()
    assert m.closed and not m.registered and "closed" in repr(m)
    v[:] = grad(0, 0, N)  # still mapped, still writable
    np.testing.assert_array_equal(t.numpy(), grad(0, 0, N))
    with pytest.raises(pbox.PboxError, match="closed"):
        memoryview(m)
    with pytest.raises(pbox.PboxError, match="closed"):
        np.frombuffer(m, np.float32)
    with pytest.raises(pbox.PboxError, match="closed"):
        c.alloc(4096)
    with pytest.raises(pbox.PboxError, match="closed"):
        c.push_pull(0, 2, v)
    del m, v
    gc.collect()
    t.add_(1.0)  # the tensor still holds the memory
    assert float(t[5]) == float(grad(0, 0, 6)[5]) + 1.0
    del t
    gc.collect()


def test_register_at_fd_limit(appliance, monkeypatch):
    """pboxd at its open-file limit cannot take a region's memfd (the kernel cuts the
    descriptor off the message): the registration is refused, counted and logged, the
    memory stays usable as plain memory, and the worker's shm connection lives on (a
    region registered once the limit is back is shared)."""
    monkeypatch.setenv("PBOX_TRANSPORT", "shm")
    monkeypatch.delenv("PBOX_SHM_REGISTER", raising=False)
    d = appliance([aggregate_job(1, 1)])
    with connect(d, 0, 1) as c:
        c.register({0: N})
        pid = d.proc.pid
        before = d.stats()["transport"]["shm"]["regions"]["refused"]
        # the limit at pboxd's lowest free descriptor, once its set stopped changing
        prev = None
        for _ in range(100):
            cur = set(int(x) for x in os.listdir("/proc/%d/fd" % pid))
            if cur == prev:
                break
            prev = cur
            time.sleep(0.1)
        old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(set(range(len(cur) + 1)) - cur),
                                                       old[1]))
        try:
            m = c.alloc(4 * N)
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
        assert not m.registered
        v = np.frombuffer(m, np.float32)
        v[:] = grad(0, 0, N)
        c.push_pull(0, 0, v)
        np.testing.assert_array_equal(v, grad(0, 0, N))
        m2 = c.alloc(4 * N)
        assert m2.registered
        v2 = np.frombuffer(m2, np.float32)
        v2[:] = grad(0, 1, N)
        c.push_pull(0, 1, v2)
        np.testing.assert_array_equal(v2, grad(0, 1, N))
        assert d.stats()["transport"]["shm"]["regions"]["refused"] == before + 1
        assert c.transport == "shm"
        del v, v2, m, m2
    assert "its descriptor could not be received" in d.log()


def test_memory_keeps_client_alive(appliance, monkeypatch):
    """A Memory holds its client: dropping the client object while memory is in use
    neither closes the connection under it nor crashes; the last Memory reference
    frees both."""
    monkeypatch.setenv("PBOX_TRANSPORT", "shm")
    d = appliance([aggregate_job(1, 1)])
    c = connect(d, 0, 1)
    c.register({0: 1000})
    m = c.alloc(4000)
    cref = weakref.ref(c)
    del c
    gc.collect()
    assert cref() is not None and not cref().closed
    v = np.frombuffer(m, np.float32)
    v[:] = 2.0
    cref().push_pull(0, 0, v)
    assert (v == 2.0).all()
    del m, v
    assert gone(cref)
