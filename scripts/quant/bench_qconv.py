"""PyTorch's side of the `qkernels` benchmark group (crates/ferrofx-bench/src/cases_qkernels.rs):
every distinct conv and the final linear of ResNet-18/50 at batch 1 and 8.

Int8 ids (`qconv_...`, `qlinear_...`) run `torch.ops.quantized.conv2d` / `linear` with the fbgemm
engine on weights pre-packed once (`conv2d_prepack`, per-channel qint8) and a quint8 input in
channels-last memory format (the layout a converted model's quantized convs pass to each other,
so no per-call layout change is timed); `_f32` ids run `F.conv2d` / `F.linear` on float tensors.
Same shapes, scales and zero points as the Rust side (the data differs: it does not change the
time of these kernels).

Imported by scripts/bench_reference.py (`cases()` maps id -> setup returning (fn, inner)); run
alone it prints one JSON line per case:
`.venv/bin/python scripts/quant/bench_qconv.py [--quick] [--threads N] [--filter S]`.
"""

import json
import sys

# (in, out, kernel, stride, input size); kernel 0 = linear. Keep in sync with cases_qkernels.rs.
SHAPES = [
    (3, 64, 7, 2, 224), (64, 64, 3, 1, 56), (64, 128, 3, 2, 56), (128, 128, 3, 1, 28),
    (64, 128, 1, 2, 56), (128, 256, 3, 2, 28), (256, 256, 3, 1, 14), (128, 256, 1, 2, 28),
    (256, 512, 3, 2, 14), (512, 512, 3, 1, 7), (256, 512, 1, 2, 14), (64, 64, 1, 1, 56),
    (64, 256, 1, 1, 56), (256, 64, 1, 1, 56), (256, 128, 1, 1, 56), (128, 128, 3, 2, 56),
    (128, 512, 1, 1, 28), (256, 512, 1, 2, 56), (512, 128, 1, 1, 28), (512, 256, 1, 1, 28),
    (256, 256, 3, 2, 28), (256, 1024, 1, 1, 14), (512, 1024, 1, 2, 28), (1024, 256, 1, 1, 14),
    (1024, 512, 1, 1, 14), (512, 512, 3, 2, 14), (512, 2048, 1, 1, 7), (1024, 2048, 1, 2, 14),
    (2048, 512, 1, 1, 7), (512, 1000, 0, 0, 0), (2048, 1000, 0, 0, 0),
]
BATCHES = (1, 8)
# the transformer's dynamically quantized linears (in, out) on 128 tokens. Keep in sync with
# DYNAMIC in cases_qkernels.rs.
DYNAMIC = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]
DYNAMIC_ROWS = 128


def case_id(shape, batch, f32):
    ci, co, k, s, hw = shape
    base = f"qlinear_{ci}x{co}_b{batch}" if k == 0 else f"qconv_{ci}x{co}_k{k}s{s}_{hw}_b{batch}"
    return base + "_f32" if f32 else base


def make(shape, batch, f32):
    import warnings

    import torch
    import torch.nn.functional as F

    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
    torch.backends.quantized.engine = "fbgemm"
    ci, co, k, s, hw = shape
    g = torch.Generator().manual_seed(1)
    x = torch.rand((batch, ci) if k == 0 else (batch, ci, hw, hw), generator=g) * 2 - 1
    w = torch.rand((co, ci) if k == 0 else (co, ci, k, k), generator=g) * 2 - 1
    b = torch.rand(co, generator=g) * 2 - 1
    if f32:
        if k == 0:
            return lambda: F.linear(x, w, b), 1
        return lambda: F.conv2d(x, w, b, s, k // 2), 1
    w_scale = torch.tensor([0.002 + (j % 11) * 1e-4 for j in range(co)], dtype=torch.double)
    wq = torch.quantize_per_channel(w * 0.25, w_scale, torch.zeros(co, dtype=torch.long), 0, torch.qint8)
    xq = torch.quantize_per_tensor((x + 1) * 2.5, 0.02, 128, torch.quint8)
    if k == 0:
        packed = torch.ops.quantized.linear_prepack(wq, b)
        return lambda: torch.ops.quantized.linear(xq, packed, 0.05, 64), 1
    xq = xq.contiguous(memory_format=torch.channels_last)
    packed = torch.ops.quantized.conv2d_prepack(wq, b, [s, s], [k // 2, k // 2], [1, 1], 1)
    return lambda: torch.ops.quantized.conv2d(xq, packed, 0.05, 64), 1


def make_dynamic(ci, co, f32):
    import torch
    import torch.nn.functional as F

    torch.backends.quantized.engine = "fbgemm"
    g = torch.Generator().manual_seed(1)
    x = torch.rand((DYNAMIC_ROWS, ci), generator=g) * 2 - 1
    w = torch.rand((co, ci), generator=g) * 2 - 1
    b = torch.rand(co, generator=g) * 2 - 1
    if f32:
        return lambda: F.linear(x, w, b), 1
    # what quantize_dynamic's Linear runs: per-channel qint8 weights pre-packed once, the float
    # input quantized per call (reduce_range=True, PyTorch's x86 default)
    w_scale = (w.abs().amax(dim=1) / 127.5).double()
    wq = torch.quantize_per_channel(w, w_scale, torch.zeros(co, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(wq, b)
    return lambda: torch.ops.quantized.linear_dynamic(x, packed, True), 1


def cases():
    """id -> setup returning (fn, inner), for scripts/bench_reference.py."""
    out = {}
    for ci, co in DYNAMIC:
        for f32 in (False, True):
            cid = f"qlinear_dyn_{ci}x{co}_m{DYNAMIC_ROWS}" + ("_f32" if f32 else "")
            out[cid] = (lambda a=ci, b=co, f=f32: make_dynamic(a, b, f))
    for shape in SHAPES:
        for batch in BATCHES:
            for f32 in (False, True):
                out[case_id(shape, batch, f32)] = (lambda sh=shape, b=batch, f=f32: make(sh, b, f))
    return out


def main():
    import os
    import torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench_reference import median_secs
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--filter", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    quick = a.quick
    for cid, setup in cases().items():
        if a.filter not in cid:
            continue
        fn, inner = setup()
        with torch.no_grad():
            print(json.dumps({"id": cid, "seconds": median_secs(fn, inner, quick)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
