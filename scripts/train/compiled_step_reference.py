"""PyTorch eager reference of the compiled training step benchmark (issue 21, group `train`).

One training step = forward, cross-entropy loss, backward, SGD update (lr 0.01), on
  * train_step_mlp: the digits MLP (64 -> 64 -> 10, ReLU), batch 32;
  * train_step_resnet18_b8: torchvision ResNet-18 (10 classes), batch 8, 224 px, train mode.
Prints one JSON line per case: {"id": ..., "seconds": median seconds per step}.
Run by `cargo run --release -p ferrofx-bench -- --group train` with .venv/bin/python.
"""
import argparse
import json
import statistics
import sys
import time


def median_secs(fn, quick):
    warm, budget, min_n = (0.05, 0.3, 3) if quick else (0.3, 2.0, 5)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm:
        fn()
    samples = []
    t0 = time.perf_counter()
    while len(samples) < min_n or time.perf_counter() - t0 < budget:
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ids", default="", help="comma-separated case ids (default: all)")
    a = ap.parse_args()
    import torch
    from torch import nn
    import torch.nn.functional as F
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(json.dumps({"torch_version": torch.__version__}), flush=True)

    def stepper(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        return step

    mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    cases = {
        "train_step_mlp": lambda: stepper(mlp, torch.randn(32, 64), torch.arange(32) % 10),
    }

    def resnet():
        import torchvision
        m = torchvision.models.resnet18(num_classes=10)
        m.train()
        return stepper(m, torch.randn(8, 3, 224, 224), torch.arange(8) % 10)
    cases["train_step_resnet18_b8"] = resnet
    wanted = [i for i in a.ids.split(",") if i]
    for cid, make in cases.items():
        if wanted and cid not in wanted:
            continue
        try:
            s = median_secs(make(), a.quick)
            print(json.dumps({"id": cid, "seconds": s}), flush=True)
        except Exception as e:  # torchvision missing...: say so in the table
            print(json.dumps({"id": cid, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
