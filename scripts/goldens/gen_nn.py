"""Goldens for ferrofx-nn: built-in modules and losses (forward + gradients), optimizer
trajectories (5 steps), LR schedules, and a reduced-width torchvision ResNet.

    .venv/bin/python scripts/goldens/gen_nn.py
    .venv/bin/python scripts/goldens/gen_nn.py --full /tmp/ferrofx_torchvision   # full size

writes (small) files read by `crates/ferrofx-nn/tests/golden_nn.rs`:

* tests/data/golden_nn_modules.safetensors — per case `<case>/state/<key>` (the module's
  PyTorch state dict), `<case>/in<i>`, `<case>/gout` (the output gradient), `<case>/out`,
  `<case>/grad_in<i>`, `<case>/grad/<param>` and, for training-mode norms,
  `<case>/state_after/<key>`. Metadata "cases": JSON list of {name, kind, args, train}.
* tests/data/golden_nn_losses.safetensors — `<case>/in<i>`, `<case>/out`, `<case>/grad_in0`.
* tests/data/golden_nn_optim.safetensors — `<case>/p0_<j>`, `<case>/g<k>_<j>` (the gradient
  given at step k), `<case>/p<k+1>_<j>` (parameters after step k), and `<case>/lr` for
  schedulers.
* tests/data/golden_nn_resnet.safetensors — reduced-width ResNet-18/50 in torchvision layout
  (random init, seed 0, eval mode): state dict under `<model>/state/`, input, output.
"""
from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data")


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


# ----------------------------------------------------------------------------------------------
# modules: (name, kind, args, build, inputs, train)

def module_cases():
    cases = []

    def add(name, kind, args, module, inputs, train=False):
        cases.append((name, kind, args, module, inputs, train))

    g = gen(1)
    torch.manual_seed(0)
    add("linear", "Linear", [5, 3, True], nn.Linear(5, 3), [randn(g, 4, 5)])
    add("linear_nobias_3d", "Linear", [4, 2, False], nn.Linear(4, 2, bias=False), [randn(g, 2, 3, 4)])
    add("bilinear", "Bilinear", [3, 4, 2, True], nn.Bilinear(3, 4, 2), [randn(g, 5, 3), randn(g, 5, 4)])
    add("conv1d", "Conv1d", [2, 4, 3, 1, 1, 1, 1, True], nn.Conv1d(2, 4, 3, padding=1), [randn(g, 2, 2, 7)])
    add("conv2d", "Conv2d", [3, 4, 3, 1, 1, 1, 1, True], nn.Conv2d(3, 4, 3, padding=1), [randn(g, 2, 3, 6, 6)])
    add("conv2d_s2_groups", "Conv2d", [4, 6, 3, 2, 1, 1, 2, False], nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=False), [randn(g, 1, 4, 7, 7)])
    add("conv_transpose2d", "ConvTranspose2d", [3, 2, 3, 2, 1, 1, 1, True, 1], nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), [randn(g, 2, 3, 4, 4)])
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(3, generator=g) + 0.5)
        bn.bias.copy_(randn(g, 3))
    add("batchnorm2d_train", "BatchNorm2d", [3], bn, [randn(g, 4, 3, 5, 5)], train=True)
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.running_mean.copy_(randn(g, 3))
        bn.running_var.copy_(torch.rand(3, generator=g) + 0.5)
        bn.weight.copy_(torch.rand(3, generator=g) + 0.5)
    add("batchnorm2d_eval", "BatchNorm2d", [3], bn, [randn(g, 2, 3, 4, 4)])
    add("batchnorm1d_train", "BatchNorm1d", [4], nn.BatchNorm1d(4), [randn(g, 6, 4)], train=True)
    ln = nn.LayerNorm([6])
    with torch.no_grad():
        ln.weight.copy_(randn(g, 6))
        ln.bias.copy_(randn(g, 6))
    add("layernorm", "LayerNorm", [6], ln, [randn(g, 3, 4, 6)])
    gn = nn.GroupNorm(2, 4)
    with torch.no_grad():
        gn.weight.copy_(randn(g, 4))
    add("groupnorm", "GroupNorm", [2, 4], gn, [randn(g, 2, 4, 3, 3)])
    add("embedding", "Embedding", [10, 3, -1], nn.Embedding(10, 3), [torch.randint(0, 10, (2, 5), generator=g)])
    add("embedding_pad", "Embedding", [10, 3, 0], nn.Embedding(10, 3, padding_idx=0), [torch.tensor([[0, 2, 0, 9]])])
    for name, mod in [("relu", nn.ReLU()), ("gelu", nn.GELU()), ("gelu_tanh", nn.GELU("tanh")), ("silu", nn.SiLU()),
                      ("sigmoid", nn.Sigmoid()), ("tanh", nn.Tanh()), ("softmax", nn.Softmax(dim=1)),
                      ("logsoftmax", nn.LogSoftmax(dim=-1)), ("leakyrelu", nn.LeakyReLU(0.2)), ("elu", nn.ELU(0.7)),
                      ("hardswish", nn.Hardswish()), ("relu6", nn.ReLU6()), ("identity", nn.Identity()),
                      ("flatten", nn.Flatten()), ("dropout_eval", nn.Dropout(0.5))]:
        x = randn(g, 3, 4, 2) * 3
        add(name, type(mod).__name__, [], mod, [x])
    add("maxpool2d", "MaxPool2d", [2, 2, 0], nn.MaxPool2d(2), [randn(g, 2, 3, 6, 6)])
    add("maxpool2d_s2p1", "MaxPool2d", [3, 2, 1], nn.MaxPool2d(3, 2, 1), [randn(g, 1, 2, 7, 7)])
    add("avgpool2d", "AvgPool2d", [2, 2, 0], nn.AvgPool2d(2), [randn(g, 2, 3, 6, 6)])
    add("adaptiveavgpool2d", "AdaptiveAvgPool2d", [1, 1], nn.AdaptiveAvgPool2d((1, 1)), [randn(g, 2, 3, 5, 5)])
    add("mha_self", "MultiheadAttention", [8, 2, False], nn.MultiheadAttention(8, 2), [randn(g, 5, 2, 8)])
    add("mha_batch_first", "MultiheadAttention", [8, 4, True], nn.MultiheadAttention(8, 4, batch_first=True), [randn(g, 2, 3, 8)])
    add("transformer_layer", "TransformerEncoderLayer", [8, 2, 16, False], nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0), [randn(g, 4, 2, 8)])
    add("transformer_layer_bf_gelu", "TransformerEncoderLayerGelu", [8, 2, 16, True], nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True, norm_first=True), [randn(g, 2, 3, 8)])
    add("lstm", "LSTM", [3, 4, 1, False], nn.LSTM(3, 4), [randn(g, 5, 2, 3)])
    add("lstm_2layer_bf", "LSTM", [3, 4, 2, True], nn.LSTM(3, 4, num_layers=2, batch_first=True), [randn(g, 2, 5, 3)])
    return cases


def run_module(name, module, inputs, train, tensors):
    module.train(train)
    sd = {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
    for k, v in sd.items():
        tensors[f"{name}/state/{k}"] = v
    ins = []
    for i, x in enumerate(inputs):
        tensors[f"{name}/in{i}"] = x.detach().clone().contiguous()
        x = x.clone()
        if x.is_floating_point():
            x.requires_grad_(True)
        ins.append(x)
    if isinstance(module, nn.LSTM):
        out = module(ins[0])[0]
    elif isinstance(module, nn.MultiheadAttention):
        out = module(ins[0], ins[0], ins[0], need_weights=False)[0]
    elif isinstance(module, nn.TransformerEncoderLayer):
        # inputs require grad, so PyTorch takes its regular (not the fused "fast") path
        out = module(ins[0])
    else:
        out = module(*ins)
    gout = torch.randn(out.shape, generator=gen(7))
    tensors[f"{name}/out"] = out.detach().contiguous()
    tensors[f"{name}/gout"] = gout
    (out * gout).sum().backward()
    for i, x in enumerate(ins):
        if x.requires_grad and x.grad is not None:
            tensors[f"{name}/grad_in{i}"] = x.grad.contiguous()
    for k, p in module.named_parameters():
        if p.grad is not None:
            tensors[f"{name}/grad/{k}"] = p.grad.contiguous()
    if train:
        for k, v in module.state_dict().items():
            tensors[f"{name}/state_after/{k}"] = v.detach().clone().contiguous()


# ----------------------------------------------------------------------------------------------
# losses: (name, kind, options, inputs) — grads of the (sum of the) loss w.r.t. input 0

def loss_cases():
    g = gen(2)
    logits = randn(g, 6, 5)
    tgt = torch.tensor([0, 4, 2, -100, 1, 4])
    w = torch.rand(5, generator=g) + 0.5
    probs = torch.softmax(randn(g, 6, 5), 1)
    logits4 = randn(g, 2, 3, 4, 4)
    tgt4 = torch.randint(0, 3, (2, 4, 4), generator=g)
    x = randn(g, 4, 3)
    y = randn(g, 4, 3)
    p = torch.rand(4, 3, generator=g) * 0.98 + 0.01
    yb = (torch.rand(4, 3, generator=g) > 0.5).float()
    pw = torch.rand(3, generator=g) + 0.5
    lp = torch.log_softmax(randn(g, 4, 3), 1)
    tq = torch.softmax(randn(g, 4, 3), 1)
    C = []
    for red in ["mean", "sum", "none"]:
        C.append((f"ce_{red}", "cross_entropy", {"reduction": red, "ignore_index": -100}, [logits, tgt],
                  lambda a, b, red=red: F.cross_entropy(a, b, reduction=red)))
    C.append(("ce_weight_ls", "cross_entropy", {"reduction": "mean", "weight": True, "label_smoothing": 0.1}, [logits, tgt, w],
              lambda a, b, ww: F.cross_entropy(a, b, weight=ww, label_smoothing=0.1)))
    C.append(("ce_ls_sum", "cross_entropy", {"reduction": "sum", "label_smoothing": 0.2}, [logits, tgt],
              lambda a, b: F.cross_entropy(a, b, reduction="sum", label_smoothing=0.2)))
    C.append(("ce_probs", "cross_entropy", {"reduction": "mean"}, [logits, probs], lambda a, b: F.cross_entropy(a, b)))
    C.append(("ce_probs_ls_w", "cross_entropy", {"reduction": "mean", "weight": True, "label_smoothing": 0.1}, [logits, probs, w],
              lambda a, b, ww: F.cross_entropy(a, b, weight=ww, label_smoothing=0.1)))
    C.append(("ce_4d", "cross_entropy", {"reduction": "mean"}, [logits4, tgt4], lambda a, b: F.cross_entropy(a, b)))
    C.append(("ce_ignore_2", "cross_entropy", {"reduction": "mean", "ignore_index": 2}, [logits, tgt.clamp(min=0)],
              lambda a, b: F.cross_entropy(a, b, ignore_index=2)))
    C.append(("nll_weight", "nll_loss", {"reduction": "mean", "weight": True}, [torch.log_softmax(logits, 1), tgt, w],
              lambda a, b, ww: F.nll_loss(a, b, weight=ww)))
    C.append(("nll_sum", "nll_loss", {"reduction": "sum"}, [torch.log_softmax(logits, 1), tgt], lambda a, b: F.nll_loss(a, b, reduction="sum")))
    for red in ["mean", "sum", "none"]:
        C.append((f"mse_{red}", "mse_loss", {"reduction": red}, [x, y], lambda a, b, red=red: F.mse_loss(a, b, reduction=red)))
        C.append((f"l1_{red}", "l1_loss", {"reduction": red}, [x, y], lambda a, b, red=red: F.l1_loss(a, b, reduction=red)))
    C.append(("smooth_l1", "smooth_l1_loss", {"reduction": "mean", "beta": 1.0}, [x, y], lambda a, b: F.smooth_l1_loss(a, b)))
    C.append(("smooth_l1_beta", "smooth_l1_loss", {"reduction": "sum", "beta": 0.5}, [x, y], lambda a, b: F.smooth_l1_loss(a, b, reduction="sum", beta=0.5)))
    C.append(("bce", "binary_cross_entropy", {"reduction": "mean"}, [p, yb], lambda a, b: F.binary_cross_entropy(a, b)))
    C.append(("bce_weight_none", "binary_cross_entropy", {"reduction": "none", "weight": True}, [p, yb, pw],
              lambda a, b, ww: F.binary_cross_entropy(a, b, weight=ww.expand(4, 3), reduction="none")))
    C.append(("bce_logits", "binary_cross_entropy_with_logits", {"reduction": "mean"}, [x * 3, yb], lambda a, b: F.binary_cross_entropy_with_logits(a, b)))
    C.append(("bce_logits_pw", "binary_cross_entropy_with_logits", {"reduction": "sum", "pos_weight": True}, [x * 3, yb, pw],
              lambda a, b, q: F.binary_cross_entropy_with_logits(a, b, reduction="sum", pos_weight=q)))
    for red in ["batchmean", "sum", "mean", "none"]:
        C.append((f"kl_{red}", "kl_div", {"reduction": red}, [lp, tq], lambda a, b, red=red: F.kl_div(a, b, reduction=red)))
    tq0 = tq.clone()
    tq0[0, 1] = 0.0
    C.append(("kl_zero_target", "kl_div", {"reduction": "sum"}, [lp, tq0], lambda a, b: F.kl_div(a, b, reduction="sum")))
    C.append(("kl_log_target", "kl_div", {"reduction": "sum", "log_target": True}, [lp, torch.log(tq)],
              lambda a, b: F.kl_div(a, b, reduction="sum", log_target=True)))
    return C


# ----------------------------------------------------------------------------------------------
# optimizers: 2 parameters, 5 steps with given gradients

def optim_cases():
    return [
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1)),
        ("sgd_momentum_wd", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
        ("sgd_nesterov", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
        ("adam", lambda ps: torch.optim.Adam(ps, lr=0.01)),
        ("adam_wd", lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
        ("adamw", lambda ps: torch.optim.AdamW(ps, lr=0.01)),
        ("rmsprop", lambda ps: torch.optim.RMSprop(ps, lr=0.01)),
        ("rmsprop_centered_momentum", lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, weight_decay=0.05, momentum=0.5, centered=True)),
    ]


def sched_cases():
    return [
        ("steplr", lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5), 8),
        ("cosine", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=6, eta_min=0.001), 8),
        ("onecycle", lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10, cycle_momentum=False), 9),
    ]


# ----------------------------------------------------------------------------------------------
# reduced-width torchvision ResNets (same classes and key names as torchvision)

def small_resnet(block, layers, widths, num_classes):
    from torchvision.models.resnet import ResNet

    class SmallResNet(ResNet):
        def __init__(self):
            super().__init__(block, layers, num_classes=num_classes)
            # rebuild every stage with reduced widths, keeping torchvision's code paths
            self.inplanes = widths[0]
            self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.layer1 = self._make_layer(block, widths[0], layers[0])
            self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
            self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
            self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
            self.fc = nn.Linear(widths[3] * block.expansion, num_classes)

    m = SmallResNet()
    # non-trivial BN statistics so eval mode exercises them
    g = gen(5)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
    return m.eval()


def main():
    os.makedirs(OUT, exist_ok=True)
    # modules
    tensors, meta = {}, []
    for name, kind, args, module, inputs, train in module_cases():
        run_module(name, module, inputs, train, tensors)
        meta.append({"name": name, "kind": kind, "args": args, "train": train})
    save_file(tensors, os.path.join(OUT, "golden_nn_modules.safetensors"), metadata={"cases": json.dumps(meta)})
    print(f"modules: {len(meta)} cases")

    # losses
    tensors, meta = {}, []
    for name, kind, opts, inputs, fn in loss_cases():
        ins = [x.clone() for x in inputs]
        if ins[0].is_floating_point():
            ins[0].requires_grad_(True)
        out = fn(*ins)
        for i, x in enumerate(inputs):
            tensors[f"{name}/in{i}"] = x.detach().clone().contiguous()
        tensors[f"{name}/out"] = out.detach().contiguous()
        out.sum().backward()
        tensors[f"{name}/grad_in0"] = ins[0].grad.contiguous()
        meta.append({"name": name, "kind": kind, "opts": opts})
    save_file(tensors, os.path.join(OUT, "golden_nn_losses.safetensors"), metadata={"cases": json.dumps(meta)})
    print(f"losses: {len(meta)} cases")

    # optimizers
    tensors, meta = {}, []
    for name, make in optim_cases():
        g = gen(3)
        ps = [torch.randn(3, 4, generator=g).requires_grad_(True), torch.randn(4, generator=g).requires_grad_(True)]
        for j, p in enumerate(ps):
            tensors[f"{name}/p0_{j}"] = p.detach().clone()
        opt = make(ps)
        for k in range(5):
            for j, p in enumerate(ps):
                gr = torch.randn(p.shape, generator=g)
                p.grad = gr.clone()
                tensors[f"{name}/g{k}_{j}"] = gr
            opt.step()
            for j, p in enumerate(ps):
                tensors[f"{name}/p{k + 1}_{j}"] = p.detach().clone()
        meta.append({"name": name})
    for name, make, n in sched_cases():
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1)
        s = make(opt)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(n):
            opt.step()
            s.step()
            lrs.append(opt.param_groups[0]["lr"])
        tensors[f"{name}/lr"] = torch.tensor(lrs, dtype=torch.float64)
        meta.append({"name": name, "sched": True})
    save_file(tensors, os.path.join(OUT, "golden_nn_optim.safetensors"), metadata={"cases": json.dumps(meta)})
    print(f"optim: {len(meta)} cases")

    # reduced ResNets (torchvision layout)
    try:
        from torchvision.models.resnet import BasicBlock, Bottleneck
    except ImportError:
        print("torchvision missing: skipping ResNet goldens", file=sys.stderr)
        return
    tensors, meta = {}, []
    torch.manual_seed(0)
    for name, block, layers, widths in [("resnet18_w8", BasicBlock, [2, 2, 2, 2], [8, 16, 16, 32]),
                                         ("resnet50_w4", Bottleneck, [3, 4, 6, 3], [4, 8, 8, 16])]:
        m = small_resnet(block, layers, widths, 10)
        x = torch.randn(2, 3, 64, 64, generator=gen(9))
        with torch.no_grad():
            y = m(x)
        for k, v in m.state_dict().items():
            tensors[f"{name}/state/{k}"] = v.contiguous()
        tensors[f"{name}/in0"] = x
        tensors[f"{name}/out"] = y
        meta.append({"name": name, "layers": layers, "widths": widths, "bottleneck": block is Bottleneck})
    save_file(tensors, os.path.join(OUT, "golden_nn_resnet.safetensors"), metadata={"cases": json.dumps(meta)})
    print(f"resnet: {len(meta)} cases")


def export_full(out_dir):
    """Full-size torchvision resnet18/resnet50/mobilenet_v2 (random init, torch.manual_seed(0), eval mode):
    `<model>.safetensors` (the state dict as PyTorch saves it) and `<model>_io.safetensors`
    (input [1, 3, 224, 224] and output), for the full-size check (not committed: ~150 MB)."""
    from torchvision.models import mobilenet_v2, resnet18, resnet50
    from safetensors.torch import save_file as save
    os.makedirs(out_dir, exist_ok=True)
    for name, ctor in [("resnet18", resnet18), ("resnet50", resnet50), ("mobilenet_v2", mobilenet_v2)]:
        torch.manual_seed(0)
        m = ctor().eval()
        x = torch.randn(1, 3, 224, 224, generator=gen(11))
        with torch.no_grad():
            y = m(x)
        save(m.state_dict(), os.path.join(out_dir, f"{name}.safetensors"))
        save({"input": x, "output": y}, os.path.join(out_dir, f"{name}_io.safetensors"))
        print(f"{name}: {sum(p.numel() for p in m.parameters())} parameters -> {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--full":
        export_full(sys.argv[2])
    else:
        main()
