#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""DDP on CPU, 2 ranks on this machine: the pbox communication hook against gloo allreduce,
side by side in one run.

  train: torchvision ResNet-50, random images, SGD; per step: wall time, the
         communication span (first bucket handed to the hook -> last bucket's future
         complete) and the communication after backward (last bucket handed to the hook,
         i.e. gradients all computed -> last future complete: the part not hidden behind
         compute). Three configurations from the same seed, built side by side and
         stepped in turn: compute only (every step under no_sync(): no communication),
         gloo (DDP's allreduce, as torch.distributed.algorithms.ddp_comm_hooks.
         default_hooks.allreduce_hook) and pbox (pbox.torch.hook).
  comm:  no compute: the gradients of ResNet-50 and of VGG-19, cut into DDP's buckets
         (1 MiB first bucket, then 25 MiB, in reverse parameter order), exchanged by
         gloo (all_reduce of every bucket, all in flight) and by pbox (push_pull_many of
         every bucket, all in flight: the calls the hook makes), in alternation.

Medians over the measured steps. The machine is shared: interleaving makes the ratios
fair, not the absolute times repeatable. Needs the meson build tree (pboxd, the pbox package):

  PBOX_BUILD_DIR=build /usr/bin/python3 perf/torch/bench_ddp.py --out results.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def parse_args(argv):
    p = argparse.ArgumentParser(description="DDP on CPU with 2 ranks: pbox hook vs gloo "
                                            "allreduce (ResNet-50 training; ResNet-50 and "
                                            "VGG-19 gradients with no compute).")
    p.add_argument("--steps", type=int, default=12, help="measured training steps (12)")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring (2)")
    p.add_argument("--batch", type=int, default=8, help="images per rank per step (8)")
    p.add_argument("--image", type=int, default=128, help="image side in pixels (128)")
    p.add_argument("--comm-iters", type=int, default=10,
                   help="measured comm iterations (10)")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-comm", action="store_true")
    p.add_argument("--registered", action="store_true",
                   help="comm: also pbox from registered bucket buffers (what pbox.torch's "
                        "hook does with registered=True over shm: copy the bucket in, "
                        "push-pull it in place), beside pbox from the plain buckets, in the "
                        "same alternation")
    p.add_argument("--pboxd-cores", type=int, default=2)
    p.add_argument("--out", help="write the results here (JSON)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for name in ("steps", "batch", "image", "comm_iters", "pboxd_cores"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


# ---- worker (one rank) -------------------------------------------------------------------

def worker(a):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {"world_size": world, "batch": a.batch, "image": a.image}

    if not a.skip_train:
        results["train"] = train(a, rank)
    if not a.skip_comm:
        results["comm"] = {}
        for job, name in ((2, "resnet50"), (3, "vgg19")):
            results["comm"][name] = comm_only(a, rank, world, job, name)

    if rank == 0:
        print("RESULTS " + json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def train(a, rank):
    """The three configurations are built side by side and stepped in turn (the order
    rotating every round), so that load from elsewhere on the machine falls on all of
    them alike."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pbox.torch

    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(a.batch, 3, a.image, a.image, generator=gen)
    y = torch.randint(0, 1000, (a.batch,), generator=gen)
    backends = ("compute", "gloo", "pbox")
    runs = {}
    for backend in backends:
        torch.manual_seed(1)
        model = DDP(torchvision.models.resnet50(), broadcast_buffers=False)
        run = {"model": model, "span": {"first": None, "last_call": None, "last": None},
               "state": None, "steps": [], "spans": [], "tails": []}

        def timed(inner, span):
            def hook(st, bucket):
                t = time.perf_counter()
                if span["first"] is None:
                    span["first"] = t
                span["last_call"] = t
                fut = inner(st, bucket)

                def done(f):
                    span["last"] = time.perf_counter()
                    return f.value()

                return fut.then(done)

            return hook

        if backend == "gloo":
            model.register_comm_hook(None, timed(default_hooks.allreduce_hook, run["span"]))
        elif backend == "pbox":
            run["state"] = pbox.torch.PBoxState(model, job=1)
            model.register_comm_hook(run["state"], timed(pbox.torch.hook, run["span"]))
        run["opt"] = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        runs[backend] = run

    for i in range(a.warmup + a.steps):
        for j in range(len(backends)):
            backend = backends[(i + j) % len(backends)]
            run = runs[backend]
            model, span = run["model"], run["span"]
            dist.barrier()
            span["first"] = span["last_call"] = span["last"] = None
            t0 = time.perf_counter()
            if backend == "compute":
                with model.no_sync():
                    F.cross_entropy(model(x), y).backward()
            else:
                F.cross_entropy(model(x), y).backward()
            run["opt"].step()
            run["opt"].zero_grad()
            t1 = time.perf_counter()
            if i >= a.warmup:
                run["steps"].append(t1 - t0)
                if span["first"] is not None:
                    run["spans"].append(span["last"] - span["first"])
                    run["tails"].append(span["last"] - span["last_call"])

    out = {}
    for backend, run in runs.items():
        r = {"step_ms": 1e3 * statistics.median(run["steps"]),
             "steps_ms": [1e3 * t for t in run["steps"]]}
        if run["spans"]:
            r["comm_span_ms"] = 1e3 * statistics.median(run["spans"])
            r["comm_tail_ms"] = 1e3 * statistics.median(run["tails"])
        if run["state"] is not None:
            r["client_stats"] = run["state"].client.stats()
            run["state"].close()
        out[backend] = r
    return out


def comm_only(a, rank, world, job, name):
    """The gradient of model `name`, exchanged with no compute by gloo and by pbox in
    alternation (which goes first alternates too)."""
    import torch
    import torch.distributed as dist
    import torchvision

    import pbox

    model = getattr(torchvision.models, name)()
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    groups, _ = dist._compute_bucket_assignment_by_size(
        list(reversed(params)), [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 1024 * 1024])
    buckets = []  # (flat tensor, [(key, offset)])
    for g in groups:
        keys = [len(params) - 1 - i for i in g]
        offs, o = [], 0
        for k in keys:
            offs.append((k, o))
            o += sizes[k]
        buckets.append((torch.randn(o, generator=torch.Generator().manual_seed(len(buckets))),
                        offs))
    del model, params
    r = {"params": sum(sizes), "bytes": 4 * sum(sizes), "buckets": len(buckets),
         "keys": len(sizes)}
    client = pbox.Client(os.environ["PBOX_SERVER"], job, os.environ["PBOX_TOKEN"], rank,
                         world, timeout=120)
    client.register([(k, n) for k, n in enumerate(sizes)])

    def gloo_iter(i):
        works = [dist.all_reduce(b, async_op=True) for b, _ in buckets]
        for w in works:
            w.wait()

    # Each pbox exchange takes the keys' next iteration (the ranks run the same order).
    it = [0]

    def next_iter():
        it[0] += 1
        return it[0] - 1

    def pbox_iter(_):
        i = next_iter()
        hs = [client.push_pull_many(b, [(k, i, o) for k, o in offs]) for b, offs in buckets]
        for h in hs:
            h.wait()

    regs = []
    if a.registered:
        r["transport"] = client.transport
        for b, _ in buckets:
            m = client.alloc(4 * b.numel())
            r.setdefault("registered", []).append(m.registered)
            regs.append((m, torch.frombuffer(m, dtype=torch.float32)))

    def pbox_reg_iter(_):
        # as the hook: the bucket copied into its registered buffer, exchanged there
        i = next_iter()
        hs = []
        for (b, offs), (_, t) in zip(buckets, regs):
            t.copy_(b)
            hs.append(client.push_pull_many(t, [(k, i, o) for k, o in offs]))
        for h in hs:
            h.wait()

    order = [("gloo", gloo_iter), ("pbox", pbox_iter)]
    if a.registered:
        order.append(("pbox_reg", pbox_reg_iter))
    times = {b: [] for b, _ in order}
    cpu = {b: [] for b, _ in order}  # this process's CPU seconds (all its threads)
    for i in range(a.warmup + a.comm_iters):
        # rotate who goes first
        for backend, fn in order[i % len(order):] + order[:i % len(order)]:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            fn(i)
            if i >= a.warmup:
                times[backend].append(time.perf_counter() - t0)
                cpu[backend].append(time.process_time() - c0)
    r["pbox_client_stats"] = client.stats()
    client.close()
    for b in times:
        r[b + "_ms"] = 1e3 * statistics.median(times[b])
        r[b + "_runs_ms"] = [1e3 * t for t in times[b]]
        r[b + "_cpu_ms"] = 1e3 * statistics.median(cpu[b])
        r[b + "_gbps"] = 8 * r["bytes"] / (r[b + "_ms"] / 1e3) / 1e9
    dist.barrier()
    return r


# ---- launcher ----------------------------------------------------------------------------

def launch(a, argv):
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    try:
        import pboxtest
    except ImportError as e:
        sys.exit("bench_ddp: cannot import tests/integration/pboxtest.py: %s" % e)
    build = os.path.abspath(os.environ.get("PBOX_BUILD_DIR") or os.path.join(REPO, "build"))
    os.environ["PBOX_BUILD_DIR"] = build
    if not os.path.isdir(os.path.join(build, "python", "pbox")):
        sys.exit("bench_ddp: %s/python/pbox not found: build with meson/ninja and set "
                 "PBOX_BUILD_DIR" % build)
    token = "bench"
    jobs = [{"id": j, "token": token, "workers": 2, "mode": "aggregate", "reduce": "mean"}
            for j in (1, 2, 3)]
    with pboxtest.Pboxd(jobs, cores=a.pboxd_cores, mtu=65535) as d:
        load0 = os.getloadavg()
        tcp, _ = pboxtest.free_ports(1)
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                       LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(tcp),
                       PBOX_SERVER=d.control, PBOX_TOKEN=token, OMP_NUM_THREADS="1",
                       PYTHONPATH=os.path.join(build, "python"))
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                           "--worker"] + argv, env=env,
                                          stdout=subprocess.PIPE, text=True))
        results = None
        for r, p in enumerate(procs):
            out, _ = p.communicate()
            for line in out.splitlines():
                if line.startswith("RESULTS "):
                    results = json.loads(line[len("RESULTS "):])
                else:
                    print("[rank %d] %s" % (r, line))
            if p.returncode != 0:
                sys.exit("bench_ddp: rank %d exited with %d" % (r, p.returncode))
        results["pboxd"] = d.stats()["totals"]
        results["loadavg_before_after"] = [load0[0], os.getloadavg()[0]]
    results["pboxd_cores"] = a.pboxd_cores
    report(results)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


def report(res):
    print("2 ranks, CPU, 1 torch thread per rank; pboxd with %d data-plane threads; all on "
          "this machine (%d cores)" % (res["pboxd_cores"], os.cpu_count() or 0))
    if "train" in res:
        t = res["train"]
        print("\nResNet-50 training step, batch %d x 3x%dx%d per rank (median ms)"
              % (res["batch"], res["image"], res["image"]))
        print("%-28s %10s %10s %10s" % ("", "gloo", "pbox", "pbox/gloo"))
        print("%-28s %10.0f %10s" % ("compute only (no_sync)", t["compute"]["step_ms"], ""))
        for key, label in (("step_ms", "step"), ("comm_span_ms", "communication span"),
                           ("comm_tail_ms", "communication after backward")):
            g, p = t["gloo"][key], t["pbox"][key]
            print("%-28s %10.0f %10.0f %10.2f" % (label, g, p, p / g if g > 0 else
                                                   float("nan")))
    if "comm" in res:
        print("\nGradient exchange with no compute (median ms per iteration)")
        print("%-28s %10s %10s %10s" % ("", "gloo", "pbox", "pbox/gloo"))
        for name, c in res["comm"].items():
            label = "%s (%.0f MB, %d buckets)" % (name, c["bytes"] / 1e6, c["buckets"])
            print("%-28s %10.0f %10.0f %10.2f" % (label, c["gloo_ms"], c["pbox_ms"],
                                                 c["pbox_ms"] / c["gloo_ms"]))
        if any("pbox_reg_ms" in c for c in res["comm"].values()):
            print("\nThe hook's bucket memory over %s (median ms per iteration)"
                  % next(iter(res["comm"].values())).get("transport", "?"))
            print("%-28s %10s %10s %10s" % ("", "plain", "registered", "reg/plain"))
            for name, c in res["comm"].items():
                print("%-28s %10.0f %10.0f %10.2f" % (name, c["pbox_ms"], c["pbox_reg_ms"],
                                                     c["pbox_reg_ms"] / c["pbox_ms"]))
                print("%-28s %10.0f %10.0f %10.2f" % ("  rank 0 CPU ms", c["pbox_cpu_ms"],
                                                     c["pbox_reg_cpu_ms"],
                                                     c["pbox_reg_cpu_ms"] / c["pbox_cpu_ms"]))
        if "loadavg_before_after" in res:
            print("load average (1 min) before / after: %.2f / %.2f"
                  % tuple(res["loadavg_before_after"]))


def main(argv):
    a = parse_args(argv)
    if a.worker:
        worker(a)
    else:
        launch(a, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
