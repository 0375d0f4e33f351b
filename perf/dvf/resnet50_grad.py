#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write one real ResNet-50 gradient (torchvision, random initialisation, one batch of
random images and labels) as raw little-endian float32, parameters in model order: the
ResNet-50-sized input of perf/dvf/bench_dvf.c (--input). The data are random, so this is
a gradient of the right size and of a real network's layer structure, not of a trained
one.

Usage: /usr/bin/python3 perf/dvf/resnet50_grad.py OUT.f32 [--batch N] [--seed S]
"""
import argparse

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model = torchvision.models.resnet50()
    x = torch.randn(a.batch, 3, 224, 224)
    y = torch.randint(0, 1000, (a.batch,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).to(torch.float32)
    g.numpy().astype("<f4").tofile(a.out)
    print("%s: %d floats (%.1f MB), loss %.3f, |g| max %.3g mean %.3g" %
          (a.out, g.numel(), g.numel() * 4 / 1e6, loss.item(), g.abs().max().item(),
           g.abs().mean().item()))


if __name__ == "__main__":
    main()
