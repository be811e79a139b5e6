"""PyTorch side of examples/bench_autograd.rs: per-op forward+backward on 1-element tensors and
the 64-64-10 MLP training step (batch 32, f32). Run with the venv python; single-threaded."""
import time
import torch
import torch.nn.functional as F

torch.set_num_threads(1)


def best(f, iters):
    for _ in range(iters // 10):
        f()
    b = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(iters):
            f()
        b = min(b, (time.perf_counter() - t) * 1e6 / iters)
    return b


x = torch.ones(1, requires_grad=True)
w = torch.full((1,), 0.5, requires_grad=True)
for name, fn in [("mul", lambda: (x * w)), ("exp", lambda: x.exp()), ("tanh", lambda: x.tanh())]:
    print(f"{name:<40} {best(lambda: fn().backward(), 20000):8.3f} us")

torch.manual_seed(0)
w1 = (torch.randn(64, 64) * 0.1).requires_grad_()
b1 = (torch.randn(64) * 0.1).requires_grad_()
w2 = (torch.randn(10, 64) * 0.1).requires_grad_()
b2 = (torch.randn(10) * 0.1).requires_grad_()
xb = torch.randn(32, 64)
tgt = (torch.arange(32) % 10).reshape(32, 1)
ps = [w1, b1, w2, b2]


def step():
    h = F.linear(xb, w1, b1).relu()
    o = F.linear(h, w2, b2)
    loss = -o.log_softmax(1).gather(1, tgt).mean()
    loss.backward()
    with torch.no_grad():
        for p in ps:
            p.sub_(p.grad, alpha=0.01)
            p.grad = None


print(f"{'mlp step':<40} {best(step, 2000):8.3f} us")
