"""Writes tests/data/quant_dynamic_goldens.json: PyTorch's dynamic quantization (fbgemm engine)
for the ferrofx-quant tests of `quantized_linear_dynamic` and `quantize_dynamic`.

- "choose_qparams": torch._choose_qparams_per_tensor (fbgemm's ChooseQuantizationParams) on
  ranges including degenerate ones (all zeros, tiny ranges below the 6.1e-5 scale threshold);
- "linear": torch.ops.quantized.linear_dynamic on int8 weights (per tensor and per channel),
  with and without bias, reduce_range on and off, 2-D and 3-D inputs;
- "mlp": an MLP (Linear 24->32, ReLU, Linear 32->10, the keys of ferrofx's zoo::Mlp) through
  torch.ao.quantization.quantize_dynamic with per-channel int8 weights
  (per_channel_dynamic_qconfig, reduce_range as PyTorch's dynamic Linear sets it).

Run from the repo root: .venv/bin/python scripts/quant/gen_dynamic_goldens.py
"""
import json
import os
import struct
import warnings

import torch
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

warnings.filterwarnings("ignore")
torch.manual_seed(2026)
torch.backends.quantized.engine = "fbgemm"
OUT = os.path.join("tests", "data", "quant_dynamic_goldens.json")


def f32s(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def bits(t):
    return [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in t.reshape(-1).tolist()]


def choose_cases():
    out = []
    ranges = [(-1.0, 3.0), (0.0, 0.0), (0.5, 2.0), (-2.0, -0.25), (-1e-6, 2e-6), (0.0, 1e-5), (-3e-3, 0.0),
              (-7.3, 7.3), (-0.1, 100.0), (-1e-30, 1e-30), (1.0, 1.0)]
    for lo, hi in ranges:
        for rr in (False, True):
            x = torch.tensor([lo, hi], dtype=torch.float32)
            s, z = torch._choose_qparams_per_tensor(x, rr)
            out.append({"min": float(x[0]), "max": float(x[1]), "reduce_range": rr,
                        "scale_bits": bits(torch.tensor([s], dtype=torch.float32))[0], "zero_point": int(z)})
    return out


def linear_case(name, shape, n, per_channel, bias, reduce_range, x=None):
    k = shape[-1]
    if x is None:
        x = torch.randn(*shape) * 2 + 0.3
    w = torch.randn(n, k) * 0.2
    if per_channel:
        scales = (w.abs().amax(1) / 127).clamp(min=1e-6).to(torch.float32)
        qw = torch.quantize_per_channel(w, scales.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    else:
        s = float(w.abs().max() / 127)
        scales = torch.full((n,), s, dtype=torch.float32)
        qw = torch.quantize_per_tensor(w, s, 0, torch.qint8)
    b = torch.randn(n) if bias else None
    packed = torch.ops.quantized.linear_prepack(qw, b)
    y = torch.ops.quantized.linear_dynamic(x, packed, reduce_range)
    s, z = torch._choose_qparams_per_tensor(x, reduce_range)
    return {"name": name, "x_shape": list(x.shape), "x": f32s(x), "n": n,
            "weight": qw.int_repr().reshape(-1).tolist(), "weight_scale": f32s(scales) if per_channel else [float(scales[0])],
            "bias": f32s(b) if b is not None else None, "reduce_range": reduce_range,
            "input_scale_bits": bits(torch.tensor([s], dtype=torch.float32))[0], "input_zero_point": int(z),
            "y_shape": list(y.shape), "y_bits": bits(y)}


def linear_cases():
    cases = []
    for rr in (False, True):
        cases.append(linear_case(f"pc_bias_rr{int(rr)}", (5, 70), 9, True, True, rr))
        cases.append(linear_case(f"pt_nobias_rr{int(rr)}", (3, 33), 4, False, False, rr))
        cases.append(linear_case(f"pc_3d_rr{int(rr)}", (2, 7, 130), 17, True, True, rr))
        cases.append(linear_case(f"positive_rr{int(rr)}", (4, 64), 8, True, True, rr, x=torch.rand(4, 64) * 3 + 0.5))
        cases.append(linear_case(f"negative_rr{int(rr)}", (4, 48), 5, True, True, rr, x=-torch.rand(4, 48) * 2))
    cases.append(linear_case("tiny_range", (3, 40), 6, True, True, False, x=torch.randn(3, 40) * 1e-6))
    cases.append(linear_case("zeros", (2, 16), 3, True, True, False, x=torch.zeros(2, 16)))
    cases.append(linear_case("one_row_many_out", (1, 96), 64, True, True, True))
    return cases


def mlp_case():
    m = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).eval()
    x = torch.randn(6, 24) * 1.5
    q = quantize_dynamic(m, {torch.nn.Linear: per_channel_dynamic_qconfig})
    with torch.no_grad():
        y, yf = q(x), m(x)
    state = {f"layers.{k}": f32s(v) for k, v in m.state_dict().items()}
    shapes = {f"layers.{k}": list(v.shape) for k, v in m.state_dict().items()}
    return {"state": state, "shapes": shapes, "x": f32s(x), "x_shape": list(x.shape), "y_bits": bits(y),
            "y_float": f32s(yf), "modules": str(q)}


def main():
    data = {"torch": torch.__version__, "choose_qparams": choose_cases(), "linear": linear_cases(), "mlp": mlp_case()}
    with open(OUT, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
