#!/usr/bin/env python3
"""PyTorch 2.15 reference for ferrofx's eager activation checkpointing and saved-tensor hooks.

Prints the figures and messages quoted by the checkpoint tests in
`crates/ferrofx-nn/tests/train.rs` (small enough to quote inline, so no golden file):

    .venv/bin/python scripts/checkpoint_reference.py
"""
import torch
from torch.utils.checkpoint import checkpoint


def f(t):
    return (t.sin() * t).exp()


def main():
    # gradients, retain_graph, number of runs of the checkpointed function
    calls = [0]

    def counted(t):
        calls[0] += 1
        return f(t)

    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = checkpoint(counted, x, use_reentrant=False)
    y.sum().backward(retain_graph=True)
    print("grad", x.grad.tolist())
    y.sum().backward()
    print("grad after second backward", x.grad.tolist(), "calls", calls[0])
    try:
        y.sum().backward()
    except RuntimeError as e:
        print("third backward:", e)

    # nested checkpoints
    c = {"inner": 0, "outer": 0}

    def inner(t):
        c["inner"] += 1
        return t.sin() * t

    def outer(t):
        c["outer"] += 1
        return checkpoint(inner, t.exp(), use_reentrant=False).cos()

    x = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
    y = checkpoint(outer, x, use_reentrant=False)
    print("nested calls after forward", dict(c))
    y.sum().backward()
    print("nested calls after backward", dict(c), "grad", x.grad.tolist())

    # an input modified in place between forward and backward
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a = x * 1
    y = checkpoint(f, a, use_reentrant=False)
    a.mul_(2)
    try:
        y.sum().backward()
    except RuntimeError as e:
        print("in place (non-leaf):", e)
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = checkpoint(f, x, use_reentrant=False)
    with torch.no_grad():
        x.add_(1)
    try:
        y.sum().backward()
    except RuntimeError as e:
        print("in place (leaf):", e)

    # the recomputation saves fewer tensors
    n = [0]

    def g(t):
        n[0] += 1
        return t.sin().cos() if n[0] == 1 else t.sin() + 1

    y = checkpoint(g, torch.tensor([1.0, 2.0, 3.0], requires_grad=True), use_reentrant=False)
    try:
        y.sum().backward()
    except Exception as e:
        print("fewer saved:", str(e).split("\n\n")[0])

    # a hook registered inside the checkpointed function fires once
    fired = [0]

    def h(t):
        u = t.sin()
        u.register_hook(lambda grad: fired.__setitem__(0, fired[0] + 1))
        return u * t

    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    checkpoint(h, x, use_reentrant=False).sum().backward()
    print("hook calls", fired[0])

    # saved_tensors_hooks: how many tensors are packed
    packs = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packs.append(1) or t, lambda t: t):
        z = x * x
        z.exp()
        z.sin()
    print("packed", len(packs))


if __name__ == "__main__":
    main()
