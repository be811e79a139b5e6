"""Per-op-kind profile of PyTorch's int8 ResNet (quantize_fx, x86 backend), the reference of the
`quant` bench group, for the side-by-side table in docs/benchmarks.md (session 14).

Builds the same model as bench_quant.py (`_torch_int8`: same weights when the bench wrote
target/bench-quant/<arch>.safetensors, same calibration images), runs it under torch.profiler
on the bench's input images and prints the self CPU time per forward of each op kind, grouped
as the ferrofx side groups its nodes (FERROFX_QUANT_PROFILE=1 of the bench):

    .venv/bin/python scripts/quant/profile_quant.py --arch resnet18 --batch 8 [--threads 2]

Run from the repository root.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_quant  # noqa: E402

# PyTorch op name -> kind (the rows of the side-by-side table)
KINDS = {
    "quantized::conv2d": "conv",
    "quantized::conv2d_relu": "conv",
    "quantized::add": "add",
    "quantized::add_relu": "add",
    "aten::quantize_per_tensor": "quantize",
    "aten::dequantize": "dequantize",
    "aten::max_pool2d": "max_pool",
    "aten::quantized_max_pool2d": "max_pool",
    "aten::adaptive_avg_pool2d": "avg_pool",
    "aten::_adaptive_avg_pool2d": "avg_pool",
    "quantized::linear": "linear",
    "aten::flatten": "flatten/reshape",
    "aten::contiguous": "layout",
    "aten::clone": "layout",
    "aten::copy_": "layout",
    "aten::empty_like": "layout",
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    a = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(a.threads)
    q = bench_quant._torch_int8(a.arch)
    x = bench_quant._images(a.batch, 2)
    import time
    with torch.no_grad():
        for _ in range(3):
            q(x)
        t0 = time.perf_counter()
        for _ in range(a.runs):
            q(x)
        wall = (time.perf_counter() - t0) / a.runs
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.runs):
                q(x)
    kinds = {}
    for e in prof.key_averages():
        kind = KINDS.get(e.key)
        if kind is None:
            kind = "other: " + e.key
        kinds[kind] = kinds.get(kind, 0.0) + e.self_cpu_time_total / a.runs
    total = sum(kinds.values())
    print(f"PyTorch quantize_fx {a.arch} batch {a.batch}, {a.threads} threads: wall {wall * 1e3:.2f} ms "
          f"per forward (mean of {a.runs}); profiler self CPU time per forward (main thread, ms):")
    print("| kind | ms | share |")
    print("|---|---|---|")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        if v / total >= 0.001:
            print(f"| {k} | {v / 1e3:.3f} | {100 * v / total:.1f}% |")
    print(f"| total | {total / 1e3:.3f} | |")


if __name__ == "__main__":
    main()
