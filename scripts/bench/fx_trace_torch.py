"""torch.fx side of crates/ferrofx-fx/examples/bench_trace.rs: symbolic_trace and recompile of
torchvision ResNet-18/50, and ResNet-18 GraphModule forward vs eager forward (batch 1,
eval, no_grad). Prints one `name value_ms` line per measurement (best of --repeat).

Usage: python scripts/bench/fx_trace_torch.py [--repeat R] [--clock cpu|wall] [--threads T]
"""
import argparse
import time

import torch
import torch.fx
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--repeat", type=int, default=5)
p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
p.add_argument("--threads", type=int, default=0)
p.add_argument("--forward-repeat", type=int, default=10)
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
clock = time.thread_time if a.clock == "cpu" else time.perf_counter


def best(f, n):
    b = float("inf")
    for _ in range(n):
        t = clock()
        f()
        b = min(b, clock() - t)
    return b * 1e3


for name, ctor in [("resnet18", torchvision.models.resnet18), ("resnet50", torchvision.models.resnet50)]:
    m = ctor().eval()
    gm = torch.fx.symbolic_trace(m)
    nodes = len(gm.graph.nodes)
    print(f"{name}.nodes {nodes}")
    print(f"{name}.symbolic_trace {best(lambda: torch.fx.symbolic_trace(m), a.repeat):.4f}")
    print(f"{name}.recompile {best(gm.recompile, a.repeat):.4f}")

m = torchvision.models.resnet18().eval()
gm = torch.fx.symbolic_trace(m)
x = torch.randn(1, 3, 224, 224)
with torch.no_grad():
    for _ in range(3):
        m(x)
        gm(x)
    # Wall clock for forwards (they use the intra-op thread pool).
    clock = time.perf_counter
    e = best(lambda: m(x), a.forward_repeat)
    g = best(lambda: gm(x), a.forward_repeat)
print(f"resnet18.forward_eager {e:.4f}")
print(f"resnet18.forward_graph_module {g:.4f}")
