# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch DistributedDataParallel over a PBox appliance.

    import pbox.torch
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = pbox.torch.PBoxState(ddp)             # connects, registers the parameters
    ddp.register_comm_hook(state, pbox.torch.hook)

Every gradient bucket DDP hands to the hook is push-pulled through the appliance, whose
job must be mode = "aggregate", reduce = "mean", workers = the world size; the returned
torch.futures.Future is completed from libpbox's progress thread when every parameter in
the bucket has its mean. The process group (e.g. gloo) is then used only by DDP itself:
start-up broadcast, and the bucket-order broadcast of the first iterations.

Keys are parameter indexes in model.parameters(), the same on every rank, so neither the
bucket layout nor DDP's rebuild of it after the first iterations matters: a bucket is cut
into its parameters' slices, in place in the bucket's flat buffer. Each key counts its own
iterations; no_sync() skips the hook on every rank alike, so the counters stay in step.

Bucket memory: the hook exchanges DDP's bucket in place (plain). With registered=True
(or PBOX_TORCH_REGISTERED=1), over the shared-memory transport (workers on pboxd's host)
each bucket is exchanged from a buffer of registered memory instead (pbox.Client.alloc:
pboxd reads the pushes where they lie, no copy into the ring): the hook copies DDP's
bucket into it, push-pulls it in place and hands it back to DDP as the bucket's result.
That copy costs what the ring's copy saves (measured: no gain, README) and keeps a second
copy of the gradients, so it is off by default. Over UDP, or if pboxd refuses the
registration, the hook exchanges DDP's bucket in place. PBoxState.memory says which
("registered" / "plain"; logged once by the "pbox.torch" logger), and
PBoxState.bucket_stats counts buckets of each kind.

Configuration: arguments, else environment variables PBOX_SERVER ("host:port" of pboxd's
control channel), PBOX_JOB, PBOX_TOKEN, PBOX_TIMEOUT (seconds, default 30) and
PBOX_LOCAL_ADDR (local IPv4 address for the data socket); rank and world size from the
initialised process group, else torchrun's RANK and WORLD_SIZE.
"""
import logging
import os

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    raise ImportError(
        "pbox.torch needs PyTorch (%s). On Debian: apt-get install python3-torch, and run "
        "/usr/bin/python3 (the interpreter Debian's torch is built for)." % e) from e

import pbox

if not hasattr(dist, "GradBucket") or not hasattr(dist.GradBucket, "parameters"):
    raise ImportError("pbox.torch needs PyTorch >= 1.10 with distributed support "
                      "(torch.distributed.GradBucket.parameters); this is torch %s"
                      % torch.__version__)

__all__ = ["PBoxState", "hook", "register"]

_log = logging.getLogger("pbox.torch")


def _setting(value, env, what, convert=str, required=True):
    if value is not None:
        return value
    text = os.environ.get(env)
    if text is None or text == "":
        if required:
            raise ValueError("pbox.torch: no %s given: pass it or set %s" % (what, env))
        return None
    try:
        return convert(text)
    except ValueError:
        raise ValueError("pbox.torch: %s=%r is not a valid %s" % (env, text, what)) from None


def _rank_world(rank, world_size):
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else _setting(None, "RANK", "rank", int)
    if world_size is None:
        world_size = (dist.get_world_size() if dist.is_initialized()
                      else _setting(None, "WORLD_SIZE", "world size", int))
    return rank, world_size


class PBoxState:
    """Connection of one DDP rank to the appliance, and the hook's per-key counters.

    model: the DistributedDataParallel module (or the module it wraps: same parameters).
    Connecting and registering happen here, so configuration errors surface before
    training; every rank must create its state (the appliance waits for all of them).

    verify=True also reduces every bucket through the process group (a test and
    debugging aid that costs a second exchange per bucket) and compares, element by
    element, the appliance's mean with (a) the rank-ordered mean of the same gradients,
    which a job with deterministic = true must match bit for bit, and (b) what DDP's
    default allreduce computes (each rank multiplies by 1/N, then the process group
    sums), which may differ only by float32 rounding. Results are in verify_stats.
    """

    def __init__(self, model, server=None, job=None, token=None, rank=None, world_size=None,
                 timeout=None, local_addr=None, verify=False, registered=None):
        server = _setting(server, "PBOX_SERVER", "appliance address (host:port)")
        job = _setting(job, "PBOX_JOB", "job id", int)
        token = _setting(token, "PBOX_TOKEN", "job token")
        timeout = _setting(timeout, "PBOX_TIMEOUT", "timeout in seconds", float, False)
        local_addr = _setting(local_addr, "PBOX_LOCAL_ADDR", "local address", str, False)
        rank, world_size = _rank_world(rank, world_size)
        if registered is None:
            registered = (_setting(None, "PBOX_TORCH_REGISTERED", "0 or 1", int, False)
                          or 0) != 0

        params = list(model.parameters())
        keys = []
        self._key_of = {}
        for i, p in enumerate(params):
            if not p.requires_grad or p.numel() == 0:
                continue  # DDP leaves these out of its buckets
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError("pbox.torch: parameter %d is %s on %s; the pbox hook exchanges "
                                "float32 CPU gradients" % (i, p.dtype, p.device))
            keys.append((i, p.numel()))
            self._key_of[p.data_ptr()] = i
        if not keys:
            raise ValueError("pbox.torch: the model has no trainable parameters")
        # One extra one-element key, push-pulled once at the end of start-up: a barrier
        # of all ranks, so that training starts with every rank admitted, and a rank that
        # could not connect or register makes the others time out here rather than in
        # their first backward(). (Whether the job averages is read from client.info.)
        self._probe = len(params)
        keys.append((self._probe, 1))
        self.rank, self.world_size = rank, world_size
        self.nparams = len(keys) - 1
        self._iters = [0] * len(params)
        self.verify = verify
        # max_default_dev: the largest |appliance - default allreduce| seen, in units of
        # the rounding bound (<= 1: within it).
        self.verify_stats = {"buckets": 0, "elements": 0, "ordered_mismatches": 0,
                             "max_default_dev": 0.0}
        self.client = pbox.Client(server, job, token, rank, world_size, timeout=timeout,
                                  local_addr=local_addr)
        try:
            info = self.client.info
            if info["mode"] != "aggregate":
                raise pbox.PboxError(22, "job %d on pboxd at %s is a %s job; the DDP hook needs "
                                     "mode = \"aggregate\", reduce = \"mean\""
                                     % (job, server, info["mode"]))
            # With one rank the sum is the mean.
            if info["reduce"] != "mean" and world_size > 1:
                raise pbox.PboxError(22, "job %d on pboxd at %s sums gradients (reduce = "
                                     "\"%s\"); the DDP hook needs reduce = \"mean\""
                                     % (job, server, info["reduce"]))
            self.client.register(keys)
            self.client.push_pull(self._probe, 0, torch.ones(1))
        except BaseException:
            self.client.close()
            raise
        # Registered bucket buffers only pay over shm (elsewhere they are plain memory).
        self._use_registered = bool(registered) and self.client.transport == "shm"
        self.memory = "registered" if self._use_registered else "plain"
        self.bucket_stats = {"registered": 0, "plain": 0}
        self._reg = {}  # bucket index -> (pbox.Memory, float32 tensor over it)
        why = ("" if self._use_registered else
               " (transport %s%s)" % (self.client.transport,
                                      ", registered memory turned off" if not registered
                                      else ""))
        _log.info("pbox.torch: rank %d exchanges gradient buckets from %s memory%s",
                  rank, self.memory, why)

    def _bucket_buffer(self, index, buf):
        """The registered tensor for bucket index (re-allocated when DDP's rebuild changes
        its size), or None when pboxd refused the registration (then plain from now on)."""
        have = self._reg.get(index)
        if have is not None and have[1].numel() == buf.numel():
            return have[1]
        self._reg.pop(index, None)  # freed once DDP no longer holds its last result
        mem = self.client.alloc(buf.numel() * 4)
        if not mem.registered:
            self._use_registered = False
            self.memory = "plain"
            self._reg.clear()
            _log.warning("pbox.torch: rank %d: pboxd refused registered memory for bucket "
                         "%d (its limits, see libpbox's log); plain buckets from now on",
                         self.rank, index)
            return None
        t = torch.frombuffer(mem, dtype=torch.float32)
        self._reg[index] = (mem, t)
        return t
    def allreduce(self, bucket):
        """Start the mean of bucket's gradients over all ranks, in place; returns a
        torch.futures.Future of the bucket buffer."""
        fut = torch.futures.Future()
        try:
            buf = bucket.buffer()
            slices = []
            off = 0
            for p in bucket.parameters():
                n = p.numel()
                if n:
                    k = self._key_of.get(p.data_ptr())
                    if k is None:
                        raise RuntimeError(
                            "pbox.torch: bucket %d holds a parameter (shape %s) that was not "
                            "registered: create PBoxState from the model DDP wraps, after "
                            "moving it" % (bucket.index(), tuple(p.shape)))
                    slices.append((k, self._iters[k], off))
                off += n
            if off != buf.numel():
                raise RuntimeError("pbox.torch: bucket %d has %d values but its parameters "
                                   "have %d" % (bucket.index(), buf.numel(), off))
            if buf.dtype != torch.float32:
                raise TypeError("pbox.torch: bucket %d holds %s gradients; the hook exchanges "
                                "float32" % (bucket.index(), buf.dtype))
            grads = buf.clone() if self.verify else None
            xbuf = self._bucket_buffer(bucket.index(), buf) if self._use_registered else None
            if xbuf is not None:
                xbuf.copy_(buf)
                self.bucket_stats["registered"] += 1
            else:
                xbuf = buf
                self.bucket_stats["plain"] += 1
            # The future's value is the exchanged buffer: DDP copies it into the gradients.
            self.client.push_pull_many(xbuf, slices, fut, xbuf)
            for k, _, _ in slices:
                self._iters[k] += 1
        except Exception as e:  # DDP reports it from backward() through the future
            fut.set_exception(e)
            return fut
        if grads is not None:
            return self._verify(grads, fut)
        return fut

    def _verify(self, grads, fut):
        n = self.world_size
        default = torch.mul(grads, 1.0 / n)  # DDP's default: scale, then sum
        dist.all_reduce(default)
        every = [torch.empty_like(grads) for _ in range(n)]
        dist.all_gather(every, grads)
        ordered = every[0].clone()
        magnitude = every[0].abs()
        for g in every[1:]:
            ordered += g
            magnitude += g.abs()
        ordered /= n
        # Both sides are within a few units of float32 rounding (2^-24) of the exact mean,
        # relative to the mean of magnitudes; 8 units bound their difference.
        bound = magnitude.div_(n).mul_(8 * 2.0 ** -24).clamp_(min=2.0 ** -126)

        def check(f):
            got = f.value()
            st = self.verify_stats
            st["buckets"] += 1
            st["elements"] += got.numel()
            st["ordered_mismatches"] += int((got != ordered).sum())
            dev = float(((got - default).abs() / bound).max())
            st["max_default_dev"] = max(st["max_default_dev"], dev)
            return got

        return fut.then(check)

    def iterations(self):
        """Iterations exchanged so far, per key (parameter index): {key: count}."""
        return {k: self._iters[k] for k in self._key_of.values()}

    def close(self):
        """Leave the job (also done at interpreter exit). Tensors DDP still holds over
        registered buckets keep their values."""
        self.client.close()
        self._reg.clear()


def hook(state, bucket):
    """DDP communication hook: mean of the bucket over all ranks through the appliance."""
    return state.allreduce(bucket)


def register(ddp_model, **kwargs):
    """Create a PBoxState for ddp_model (keyword arguments as PBoxState's), register the
    hook, and return the state."""
    state = PBoxState(ddp_model, **kwargs)
    ddp_model.register_comm_hook(state, hook)
    return state
