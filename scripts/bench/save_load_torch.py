"""PyTorch side of crates/ferrofx-fx/examples/bench_save_load.rs: torch.save / torch.load of
torchvision ResNet-50's state dict (the same weights ferrofx saves in its traced-module file).
Prints `save_first_ms`, `save_ms`, `load_first_ms`, `load_ms` (first call and best of --repeat,
wall clock) and `file_mb`.

Usage: python scripts/bench/save_load_torch.py [--repeat R] [--dir DIR]
"""
import argparse
import os
import tempfile
import time

import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--repeat", type=int, default=5)
p.add_argument("--dir", default=tempfile.gettempdir())
a = p.parse_args()

torch.manual_seed(0)
sd = torchvision.models.resnet50().eval().state_dict()
path = os.path.join(a.dir, "ferrofx_bench_torch_resnet50.pt")


def first_and_best(f, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return times[0], min(times)


save = first_and_best(lambda: torch.save(sd, path), a.repeat)
load = first_and_best(lambda: torch.load(path, weights_only=True), a.repeat)
print(f"save_first_ms {save[0] * 1e3:.3f}")
print(f"save_ms {save[1] * 1e3:.3f}")
print(f"load_first_ms {load[0] * 1e3:.3f}")
print(f"load_ms {load[1] * 1e3:.3f}")
print(f"file_mb {os.path.getsize(path) / 1e6:.3f}")
os.remove(path)
