"""PyTorch side of `cargo run --release -p ferrofx-core --example bench_kernels`.

Prints the same case names and units (ms per call, GFLOP/s for matmul) so the two outputs can
be compared line by line. Usage: python scripts/bench/nn_kernels_torch.py [--quick] [--cpu-time] [--backward] [filter...]
`--backward` times each convolution's input and weight gradients (`torch.autograd.grad` on a
retained graph) instead of its forward.
"""
import sys
import time

import torch

QUICK = "--quick" in sys.argv
CPU_TIME = "--cpu-time" in sys.argv
BACKWARD = "--backward" in sys.argv
# --cpu-time: one thread, mean CPU time per call of this thread (robust on a loaded machine)
torch.set_num_threads(1 if CPU_TIME else 2)
FILTER = [a for a in sys.argv[1:] if not a.startswith("--")]


def wanted(name):
    return not FILTER or any(f in name for f in FILTER)

# (name, cin, cout, k, stride, pad, hw)
CONVS = [
    ("conv1 7x7/2 3->64 @224", 3, 64, 7, 2, 3, 224),
    ("3x3 64->64 @56", 64, 64, 3, 1, 1, 56),
    ("3x3/2 64->128 @56", 64, 128, 3, 2, 1, 56),
    ("1x1/2 64->128 @56", 64, 128, 1, 2, 0, 56),
    ("3x3 128->128 @28", 128, 128, 3, 1, 1, 28),
    ("3x3/2 128->256 @28", 128, 256, 3, 2, 1, 28),
    ("1x1/2 128->256 @28", 128, 256, 1, 2, 0, 28),
    ("3x3 256->256 @14", 256, 256, 3, 1, 1, 14),
    ("3x3/2 256->512 @14", 256, 512, 3, 2, 1, 14),
    ("1x1/2 256->512 @14", 256, 512, 1, 2, 0, 14),
    ("3x3 512->512 @7", 512, 512, 3, 1, 1, 7),
]


def bench(f, min_time=0.3 if not QUICK else 0.1):
    for _ in range(3):
        f()
    if CPU_TIME:
        c0, t0, n = time.thread_time(), time.perf_counter(), 0
        while time.perf_counter() - t0 < min_time * 3 or n < 3:
            f()
            n += 1
        return (time.thread_time() - c0) / n
    n, t0 = 0, time.perf_counter()
    best = float("inf")
    while True:
        s = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - s)
        n += 1
        if time.perf_counter() - t0 > min_time and n >= 3:
            break
    return best


def conv_cases():
    """(label, x, w, stride, pad) of every wanted convolution case, with random x and w."""
    for batch in (1, 8):
        for name, cin, cout, k, s, p, hw in CONVS:
            label = f"conv2d b{batch} {name}"
            if wanted(label):
                yield label, torch.randn(batch, cin, hw, hw), torch.randn(cout, cin, k, k), s, p


if BACKWARD:
    for label, x, w, s, p in conv_cases():

        def grad_of(x, w, wrt):
            # one graph per gradient, only its input requiring grad
            y = torch.nn.functional.conv2d(x, w, None, s, p)
            gy = torch.randn_like(y)
            return bench(lambda: torch.autograd.grad(y, wrt, gy, retain_graph=True))

        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        gx, gw = grad_of(xg, w, xg), grad_of(x, wg, wg)
        print(f"{label}: grad_x {gx * 1e3:.3f} ms  grad_w {gw * 1e3:.3f} ms")
    sys.exit(0)

with torch.no_grad():
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    out = torch.empty(1024, 1024)
    if wanted("matmul 1024^3 f32"):
        dt = bench(lambda: torch.matmul(a, b, out=out))
        print(f"matmul 1024^3 f32: {dt * 1e3:.3f} ms  {2 * 1024**3 / dt / 1e9:.1f} GFLOP/s")
    for label, x, w, s, p in conv_cases():
        dt = bench(lambda: torch.nn.functional.conv2d(x, w, None, s, p))
        print(f"{label}: {dt * 1e3:.3f} ms")
