# SPDX-License-Identifier: BSD-3-Clause
"""pbox: the worker side of a PBox parameter-server appliance, for Python.

    import numpy as np, pbox
    with pbox.Client("10.0.0.1:7000", job=1, token="s3cret", rank=r, world_size=n) as c:
        c.register({0: 1000, 1: 50})            # key id -> float32 elements, same on all ranks
        g = np.ones(1000, np.float32)
        c.push_pull(0, 0, g)                     # in place: g is now the aggregate
        h = c.push_pull_async(1, 0, np.ones(50, np.float32))
        h.wait(timeout=5.0)                      # raises TimeoutError if still running

Buffers are numpy arrays, contiguous CPU float32 torch tensors or any float32 object with
the buffer protocol; they are read and written in place, never copied. Errors are
pbox.PboxError (an OSError: .errno, and libpbox's message) or one of its subclasses
PboxTimeoutError, PboxConnectionError, PboxPermissionError. Blocking calls release the GIL.

Registered memory: c.alloc(nbytes) (after register) returns a pbox.Memory, bytes that a
pboxd on this host shares (shm transport), so pushes from it are not copied; view it with
numpy.frombuffer(m, numpy.float32) or torch.frombuffer(m, dtype=torch.float32). It is
freed when its last reference (views included) goes; views taken before c.close() stay
valid, new ones are refused.

The PyTorch DDP communication hook is in pbox.torch.
"""
import atexit
import weakref


def _load_extension():
    try:
        from . import _pbox
    except ImportError as e:
        text = str(e)
        if "libpbox" in text:
            raise ImportError(
                "pbox: the extension pbox._pbox is built but cannot load libpbox (%s). After "
                "`meson install`, run `ldconfig`; when using the build tree, set "
                "PYTHONPATH=<build>/python and do not move the package out of it." % text) from e
        raise ImportError(
            "pbox: the C extension pbox._pbox is not built or not on the path (%s). Build it "
            "with `meson setup build && ninja -C build` (needs python3-dev) and set "
            "PYTHONPATH=build/python, or `meson install` it into /usr/bin/python3's "
            "site-packages." % text) from e
    return _pbox


_pbox = _load_extension()

Handle = _pbox.Handle
Memory = _pbox.Memory
PboxError = _pbox.PboxError
PboxTimeoutError = _pbox.PboxTimeoutError
PboxConnectionError = _pbox.PboxConnectionError
PboxPermissionError = _pbox.PboxPermissionError
version = _pbox.version
__version__ = _pbox.version()

__all__ = ["Client", "Handle", "Memory", "PboxError", "PboxTimeoutError", "PboxConnectionError",
           "PboxPermissionError", "version"]

_live_clients = weakref.WeakSet()


class Client(_pbox.Client):
    __doc__ = _pbox.Client.__doc__

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _live_clients.add(self)


@atexit.register
def _close_all():
    # Completion callbacks take the GIL from libpbox's progress thread; that must not
    # happen while the interpreter is being torn down, so clients close before.
    for c in list(_live_clients):
        c.close()


def _as_buffer(obj, role):
    """Adapter for objects without the buffer protocol: torch tensors become numpy views
    of the same memory (no copy). Anything else is refused with the reason."""
    if type(obj).__module__.split(".")[0] == "torch":
        import torch
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu":
                raise TypeError("%s: pbox exchanges CPU tensors; this one is on %s (use .cpu())"
                                % (role, obj.device))
            if obj.layout != torch.strided:
                raise TypeError("%s: %s tensors are not supported; pbox exchanges dense tensors"
                                % (role, obj.layout))
            if obj.dtype != torch.float32:
                raise TypeError("%s: tensor of %s; pbox exchanges torch.float32"
                                % (role, obj.dtype))
            if not obj.is_contiguous():
                raise ValueError("%s: tensor is not contiguous (.contiguous() makes a copy, "
                                 "which would not receive the result)" % role)
            return obj.detach().numpy()
    raise TypeError("%s must be a numpy array, a contiguous CPU torch tensor or another "
                    "float32 buffer, not %s" % (role, type(obj).__name__))


_pbox._set_buffer_adapter(_as_buffer)
