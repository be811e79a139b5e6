#!/usr/bin/env python3
"""Exports the real-model zoo of issue 23 with torch.onnx.export and writes reference outputs.

Usage: .venv/bin/python scripts/onnx/export_zoo.py OUT_DIR [NAME ...]

For each model: OUT_DIR/<name>/model.onnx (opset 17), input_0.pb (fixed seed) and
output_0.pb (PyTorch's output on it, eval mode). Weights are random (seeded): pretrained
weights cannot be downloaded here, and the import must match whatever the weights are.
Models: resnet18 resnet50 mobilenet_v2 mobilenet_v3_small efficientnet_b0 squeezenet1_1
vit_b_16 bert (a BERT-style encoder: torch.nn.TransformerEncoder with embeddings, GELU,
post-norm, attention mask input-free).
"""
import os
import sys

import torch
import torchvision
from onnx import numpy_helper

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


class BertLike(torch.nn.Module):
    """Token + position embeddings, LayerNorm, 4 post-norm encoder layers (GELU), pooler."""

    def __init__(self, vocab=1000, hidden=256, heads=4, layers=4, seq=64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(seq, hidden)
        self.norm = torch.nn.LayerNorm(hidden, eps=1e-12)
        layer = torch.nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pool = torch.nn.Linear(hidden, hidden)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.norm(self.tok(ids) + self.pos(pos))
        x = self.encoder(x)
        return torch.tanh(self.pool(x[:, 0]))


def build(name):
    if name == "bert":
        return BertLike(), torch.randint(0, 1000, (2, 64))
    fn = getattr(torchvision.models, name)
    kwargs = {"weights": None}
    model = fn(**kwargs)
    return model, torch.randn(1, 3, 224, 224)


NAMES = [
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "squeezenet1_1",
    "vit_b_16",
    "bert",
]


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or NAMES
    for name in names:
        torch.manual_seed(0)
        model, x = build(name)
        model.eval()
        # Random init leaves BN statistics at 0/1: give them values so the import is tested.
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
            if name == "vit_b_16":
                # torchvision initialises the ViT head to zeros: the output would be all zeros.
                torch.nn.init.normal_(model.heads.head.weight, std=0.02)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with torch.no_grad():
            y = model(x)
        path = os.path.join(d, "model.onnx")
        torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False, input_names=["input"],
                          output_names=["output"])
        with open(os.path.join(d, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x.numpy(), "input").SerializeToString())
        with open(os.path.join(d, "output_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(y.numpy(), "output").SerializeToString())
        print(f"{name}: {os.path.getsize(path) / 1e6:.1f} MB", flush=True)
    if not sys.argv[2:]:
        open(os.path.join(out, "done"), "w").close()


if __name__ == "__main__":
    main()
