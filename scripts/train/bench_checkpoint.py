#!/usr/bin/env python3
"""PyTorch reference of the `train` benchmark group (issue 21): training steps with and without
activation checkpointing, run by `cargo run --release -p ferrofx-bench -- --group train`.

    .venv/bin/python scripts/train/bench_checkpoint.py --ids train_resnet18_b32,train_resnet18_b32_checkpoint

Models (the twins of what crates/ferrofx-bench/src/cases_train.rs builds from ferrofx's zoo):
torchvision's ResNet-18 (batch 32, 3x224x224, 1000 classes) and the transformer encoder of
`scripts/bench_reference.py` (d_model 384, 12 heads, ff 1536, 6 post-norm GELU layers, dropout
0, batch 32, 128 tokens, 2 classes). A step is: zero_grad (grads set to None), forward,
cross-entropy, backward, SGD step (lr 0.01, no momentum). Checkpointing is
`torch.utils.checkpoint.checkpoint_sequential(functions, len(functions), x, use_reentrant=False)`:
one segment per residual block (ResNet-18: the stem conv1-bn1-relu-maxpool and the 8 basic
blocks) or per encoder layer; as always with checkpoint_sequential the last segment is not
checkpointed (backward needs its activations at once). A `_budget` case checkpoints only the
segments ferrofx's CheckpointPlan picked for memory budget 0.5 (given as `--plan id=i:j:...`),
each with its own `torch.utils.checkpoint.checkpoint(f, h, use_reentrant=False)`.

Each case runs in a fresh interpreter (2 threads) and prints one JSON line:
  seconds               median step time (1+ warm-up steps, then >= 5 steps and >= 2 s)
  activation_peak_bytes the most bytes alive at once among the tensor buffers allocated by the
                        forward pass (model + loss) and by checkpoint's recomputation in
                        backward: PyTorch's CPU allocator events from torch.profiler
                        (profile_memory), matched by address, for one step -- what ferrofx's
                        MemoryTracker counts under Category::Activation
  rss_peak_bytes        growth of the process's peak RSS (VmHWM, reset through
                        /proc/self/clear_refs) over its RSS once the model, input and optimizer
                        exist, over the first two steps (gradients, activations, allocator and
                        library workspaces)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REGION = "ferrofx_bench.checkpoint_region"


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def build(model, batch):
    """(functions, head, x, y, params): the model as a sequence of segments (stem/blocks or
    layers) and a head, its input and labels."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    if model == "resnet18":
        import torchvision
        m = torchvision.models.resnet18().train()
        stem = nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool)
        functions = [stem, *m.layer1, *m.layer2, *m.layer3, *m.layer4]

        def head(h):
            return m.fc(torch.flatten(m.avgpool(h), 1))
        g = torch.Generator().manual_seed(1)
        x = torch.rand((batch, 3, 224, 224), generator=g) * 2 - 1
        y = torch.tensor([(i * 37) % 1000 for i in range(batch)], dtype=torch.int64)
        return functions, head, x, y, m
    if model == "transformer":
        sys.path.insert(0, os.path.dirname(HERE))
        from bench_reference import transformer_classifier
        m, _ = transformer_classifier()
        m.train()
        ids = torch.tensor([[(b * 131 + i * 7) % 1000 for i in range(128)] for b in range(batch)], dtype=torch.int64)
        y = torch.tensor([i % 2 for i in range(batch)], dtype=torch.int64)

        def embed(t):
            return m.embed(t) + m.pos[: t.shape[1]]

        def head(h):
            return m.head(h.mean(1))
        return list(m.layers), head, ids, y, (m, embed)
    raise SystemExit(f"unknown model {model}")


def marked(f):
    """`f` inside a profiler range, so the allocations of checkpoint's recomputation (which
    reruns it during backward) can be told apart."""
    import torch

    def run(x):
        with torch.profiler.record_function(REGION):
            return f(x)
    return run


def make_step(model, batch, ckpt, plan=None):
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential
    functions, head, x, y, owner = build(model, batch)
    embed = None
    if isinstance(owner, tuple):
        owner, embed = owner
    opt = torch.optim.SGD(owner.parameters(), lr=0.01)
    functions = [marked(f) for f in functions]

    def step():
        opt.zero_grad(set_to_none=True)
        h = embed(x) if embed is not None else x
        if plan is not None:
            for i, f in enumerate(functions):
                h = checkpoint(f, h, use_reentrant=False) if i in plan else f(h)
        elif ckpt:
            h = checkpoint_sequential(functions, len(functions), h, use_reentrant=False)
        else:
            for f in functions:
                h = f(h)
        loss = F.cross_entropy(head(h), y)
        loss.backward()
        opt.step()
        return loss
    return step


def activation_peak(step):
    """Peak live bytes of the buffers allocated in forward or in a recomputation, over one
    profiled step (see the module documentation)."""
    from torch._C._profiler import _ExtraFields_Allocation
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocs = []

    def walk(e, in_region):
        in_region = in_region or e.name == REGION
        ex = e.extra_fields
        if isinstance(ex, _ExtraFields_Allocation):
            allocs.append((e.start_time_ns, ex.ptr, ex.alloc_size, in_region))
        for c in e.children:
            walk(c, in_region)
    roots = prof.profiler.kineto_results.experimental_event_tree()
    for r in roots:
        walk(r, False)
    allocs.sort(key=lambda a: a[0])
    # forward ends where the autograd engine's first node starts
    fwd_end = None
    for r in roots:
        if r.name.startswith("autograd::engine::evaluate_function"):
            fwd_end = r.start_time_ns if fwd_end is None else min(fwd_end, r.start_time_ns)
    live, peak, owner = 0, 0, {}
    for t, ptr, size, in_region in allocs:
        if size > 0:
            act = in_region or (fwd_end is not None and t < fwd_end)
            owner[ptr] = (size, act)
            if act:
                live += size
                peak = max(peak, live)
        else:
            s, act = owner.pop(ptr, (0, False))
            if act:
                live -= s
    return peak


def run_case(cid, quick, plans):
    import torch
    torch.set_num_threads(2)
    parts = cid.split("_")  # train_<model>_b<batch>[_checkpoint|_budget]
    model, batch, ckpt = parts[1], int(parts[2][1:]), parts[-1] == "checkpoint"
    plan = None
    if parts[-1] == "budget":
        if cid not in plans:
            raise SystemExit(f"{cid}: no --plan {cid}=i:j:... given")
        plan = set(plans[cid])
    step = make_step(model, batch, ckpt, plan)
    before = status("VmRSS:")
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        reset = False
    for _ in range(2):
        step()
    rss = status("VmHWM:") - before if reset else None
    act = activation_peak(step)
    warm, measure, min_samples = (0.05, 0.3, 3) if quick else (0.3, 2.0, 5)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm:
        step()
    samples = []
    t0 = time.perf_counter()
    while len(samples) < min_samples or time.perf_counter() - t0 < measure:
        t = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t)
    return {"id": cid, "seconds": statistics.median(samples), "activation_peak_bytes": act,
            "rss_peak_bytes": rss, "samples": len(samples)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plan", action="append", default=[],
                    help="id=i:j:...: the segments a _budget case checkpoints")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    plans = {}
    for p in a.plan:
        cid, _, segs = p.partition("=")
        plans[cid] = [int(i) for i in segs.split(":") if i]
    if a.child:
        print(json.dumps(run_case(a.child, a.quick, plans)), flush=True)
        return 0
    import torch
    print(json.dumps({"torch_version": torch.__version__}), flush=True)
    for cid in [i for i in a.ids.split(",") if i]:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", cid] + (["--quick"] if a.quick else [])
        cmd += [f"--plan={p}" for p in a.plan]
        out = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
        if out.returncode != 0 or line is None:
            err = (out.stderr.strip().splitlines() or ["no output"])[-1]
            print(json.dumps({"id": cid, "error": err}), flush=True)
        else:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
