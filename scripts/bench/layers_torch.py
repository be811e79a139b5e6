"""PyTorch side of `cargo run --release -p ferrofx-core --example bench_layers`: the
non-convolution layers of a ResNet-18 training step at batch 8, forward and backward, with the
same case names. Usage: python scripts/bench/layers_torch.py [filter...]
"""
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
FILTER = [a for a in sys.argv[1:] if not a.startswith("--")]


def wanted(name):
    return not FILTER or any(f in name for f in FILTER)


def best_ms(f):
    f()
    f()
    start, best, n = time.perf_counter(), float("inf"), 0
    while n < 3 or time.perf_counter() - start < 0.3:
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
        n += 1
    return best * 1e3


def case(name, inputs, forward):
    fwd = best_ms(lambda: forward(inputs))
    y = forward(inputs)
    gy = torch.randn_like(y)
    bwd = best_ms(lambda: torch.autograd.grad(y, inputs, gy, retain_graph=True))
    print(f"{name}: fwd {fwd:.3f} ms  bwd {bwd:.3f} ms")


print(f"torch threads: {torch.get_num_threads()}")
if wanted("maxpool 3x3/2 64@112"):
    x = torch.randn(8, 64, 112, 112, requires_grad=True)
    case("maxpool 3x3/2 64@112", [x], lambda t: F.max_pool2d(t[0], 3, 2, 1))
for c, hw in [(64, 112), (64, 56), (128, 28), (256, 14), (512, 7)]:
    name = f"batchnorm train {c}@{hw}"
    if not wanted(name):
        continue
    x = torch.randn(8, c, hw, hw, requires_grad=True)
    w = torch.randn(c, requires_grad=True)
    b = torch.randn(c, requires_grad=True)
    rm, rv = torch.zeros(c), torch.ones(c)
    case(name, [x, w, b], lambda t: F.batch_norm(t[0], rm, rv, t[1], t[2], True, 0.1, 1e-5))
for c, hw in [(64, 112), (64, 56), (512, 7)]:
    name = f"relu {c}@{hw}"
    if wanted(name):
        case(name, [torch.randn(8, c, hw, hw, requires_grad=True)], lambda t: F.relu(t[0]))
    name = f"add {c}@{hw}"
    if wanted(name):
        a, b = torch.randn(8, c, hw, hw, requires_grad=True), torch.randn(8, c, hw, hw, requires_grad=True)
        case(name, [a, b], lambda t: t[0] + t[1])
