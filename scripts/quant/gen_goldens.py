"""Writes tests/data/quant_goldens.json: observer qparams and quantized-op outputs from
torch.ao.quantization / torch.ops.quantized (the fbgemm engine), for the ferrofx-quant tests.

Run from the repo root: .venv/bin/python scripts/quant/gen_goldens.py
Inputs are stored with the expected outputs, so the tests need no PyTorch.
"""
import json
import warnings
import os
import struct

import torch
from torch.ao.quantization import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                                   PerChannelMinMaxObserver)

torch.manual_seed(20)
warnings.filterwarnings("ignore", message="Please use quant_min")
torch.backends.quantized.engine = "fbgemm"
OUT = os.path.join("tests", "data", "quant_goldens.json")
# separate file so the op goldens above stay as they are when the workflow goldens change
OUT_WORKFLOW = os.path.join("tests", "data", "quant_workflow_goldens.json")


def f32s(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def bits(t):
    return [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in t.reshape(-1).tolist()]


DTYPES = {torch.quint8: "uint8", torch.qint8: "int8"}
SCHEMES = {
    torch.per_tensor_affine: "per_tensor_affine",
    torch.per_tensor_symmetric: "per_tensor_symmetric",
    torch.per_channel_affine: "per_channel_affine",
    torch.per_channel_symmetric: "per_channel_symmetric",
}


def observer_case(name, obs, batches, **kw):
    for b in batches:
        obs(b)
    scale, zp = obs.calculate_qparams()
    return {
        "name": name,
        "observer": type(obs).__name__,
        "dtype": DTYPES[obs.dtype],
        "qscheme": SCHEMES[obs.qscheme],
        "reduce_range": obs.reduce_range,
        **kw,
        "batches": [{"shape": list(b.shape), "data": f32s(b)} for b in batches],
        "min_val": f32s(obs.min_val),
        "max_val": f32s(obs.max_val),
        "scale_bits": bits(scale.float()),
        "zero_point": [int(v) for v in zp.reshape(-1).tolist()],
    }


def observers():
    cases = []
    randn = lambda *s: torch.randn(*s) * 3 + 0.5
    for dtype in (torch.quint8, torch.qint8):
        for qscheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            for rr in (False, True):
                if rr and dtype == torch.quint8 and qscheme == torch.per_tensor_symmetric:
                    continue  # PyTorch refuses this combination
                o = MinMaxObserver(dtype=dtype, qscheme=qscheme, reduce_range=rr)
                cases.append(observer_case(f"minmax_{DTYPES[dtype]}_{SCHEMES[qscheme]}_rr{int(rr)}", o,
                                           [randn(4, 16), randn(3, 16) * 2]))
    cases.append(observer_case("minmax_positive", MinMaxObserver(), [torch.rand(50) * 6 + 1]))
    cases.append(observer_case("minmax_negative", MinMaxObserver(), [-torch.rand(50) * 6 - 1]))
    cases.append(observer_case("minmax_constant_zero", MinMaxObserver(), [torch.zeros(8)]))
    cases.append(observer_case("minmax_tiny_range", MinMaxObserver(), [torch.tensor([1e-9, -2e-9, 0.0])]))
    for c in (0.01, 0.5):
        o = MovingAverageMinMaxObserver(averaging_constant=c)
        cases.append(observer_case(f"moving_average_{c}", o, [randn(32), randn(32) * 0.5 + 2, randn(32) * 4],
                                   averaging_constant=c))
    o = MovingAverageMinMaxObserver(averaging_constant=0.1, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    cases.append(observer_case("moving_average_qint8_symmetric", o, [randn(20), randn(20) * 3],
                               averaging_constant=0.1))
    o = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    cases.append(observer_case("per_channel_weight", o, [randn(6, 3, 2, 2)], ch_axis=0))
    o = PerChannelMinMaxObserver(ch_axis=1, dtype=torch.quint8, qscheme=torch.per_channel_affine)
    cases.append(observer_case("per_channel_axis1_affine", o, [randn(2, 5, 3), randn(4, 5, 3)], ch_axis=1))
    o = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                 reduce_range=True)
    cases.append(observer_case("per_channel_weight_rr", o, [randn(4, 9)], ch_axis=0))
    return cases


def histogram_observers():
    """HistogramObserver: 2048-bin running histogram, ranges that grow between batches (the old
    histogram is upsampled into the new range), a constant first batch, heavy tails that the
    L2 search clips, and a small bin count."""
    cases = []
    torch.manual_seed(2020)
    heavy = torch.cat([torch.randn(1200), torch.tensor([40.0, -25.0, 60.0])])
    specs = [
        ("histogram_single", {}, [torch.randn(4, 200)]),
        ("histogram_growing_range", {}, [torch.randn(300), torch.randn(400) * 3 + 1, torch.rand(200) * 2]),
        ("histogram_heavy_tail", {}, [heavy]),
        ("histogram_relu_like", {}, [torch.relu(torch.randn(600) * 2), torch.relu(torch.randn(500) * 2.5)]),
        ("histogram_constant_first", {}, [torch.full((10,), 0.75), torch.randn(300)]),
        ("histogram_qint8_symmetric", dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
         [torch.randn(500) * 0.4, torch.randn(400)]),
        ("histogram_reduce_range", dict(reduce_range=True), [torch.randn(600) + 2]),
        ("histogram_256_bins", dict(bins=256), [torch.randn(400), torch.randn(200) * 5]),
    ]
    for name, kw, batches in specs:
        o = HistogramObserver(**kw)
        cases.append(histogram_case(name, o, batches))
    return cases


def histogram_case(name, obs, batches):
    case = observer_case(name, obs, batches, bins=obs.bins)
    # the histogram sparsely, as [bin, count] pairs
    case["histogram"] = [[i, float(v)] for i, v in enumerate(obs.histogram.tolist()) if v != 0.0]
    new_min, new_max = obs._non_linear_param_search()
    case["search_min"], case["search_max"] = float(new_min), float(new_max)
    return case


def qrepr(q):
    return [int(v) for v in q.int_repr().reshape(-1).tolist()]


def ops():
    cases = []
    # quantize / dequantize: random values plus exact half-way points
    s, zp = 0.05, 37
    x = torch.cat([torch.randn(40) * 4, (torch.arange(-20, 20) + 0.5) * s, torch.tensor([1e6, -1e6])])
    for dt in (torch.quint8, torch.qint8):
        z = zp if dt == torch.quint8 else -5
        q = torch.quantize_per_tensor(x, s, z, dt)
        cases.append({"op": "quantize_per_tensor", "dtype": DTYPES[dt], "scale": s, "zero_point": z,
                      "input": f32s(x), "shape": list(x.shape), "q": qrepr(q), "dequant_bits": bits(q.dequantize())})
    w = torch.randn(4, 3, 5)
    scales = torch.rand(4, dtype=torch.float64) * 0.1 + 0.01
    zps = torch.tensor([0, 3, -2, 1])
    q = torch.quantize_per_channel(w, scales, zps, 0, torch.qint8)
    cases.append({"op": "quantize_per_channel", "dtype": "int8", "axis": 0, "scales": scales.tolist(),
                  "zero_points": zps.tolist(), "input": f32s(w), "shape": list(w.shape), "q": qrepr(q),
                  "dequant_bits": bits(q.dequantize())})
    q = torch.quantize_per_channel(w, scales[:3], torch.tensor([128, 100, 7]), 1, torch.quint8)
    cases.append({"op": "quantize_per_channel", "dtype": "uint8", "axis": 1, "scales": scales[:3].tolist(),
                  "zero_points": [128, 100, 7], "input": f32s(w), "shape": list(w.shape), "q": qrepr(q),
                  "dequant_bits": bits(q.dequantize())})

    def qweight(w):
        ws = (w.abs().reshape(w.shape[0], -1).amax(1) / 127.0).double()
        return torch.quantize_per_channel(w, ws, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8), ws

    # linear: K = 70 (a tail after 64), batch rows 5, 7 outputs, with and without bias and ReLU
    for relu in (False, True):
        for has_bias in (True, False):
            x = torch.randn(5, 70)
            qx = torch.quantize_per_tensor(x, 0.03, 120, torch.quint8)
            qw, ws = qweight(torch.randn(7, 70) * 0.2)
            b = torch.randn(7) if has_bias else None
            packed = torch.ops.quantized.linear_prepack(qw, b)
            f = torch.ops.quantized.linear_relu if relu else torch.ops.quantized.linear
            y = f(qx, packed, 0.07, 60)
            cases.append({"op": "quantized_linear", "relu": relu, "input": qrepr(qx), "input_shape": [5, 70],
                          "input_scale": 0.03, "input_zero_point": 120, "weight": qrepr(qw), "weight_shape": [7, 70],
                          "weight_scale": ws.tolist(), "bias": None if b is None else f32s(b),
                          "output_scale": 0.07, "output_zero_point": 60, "output": qrepr(y)})
    # conv2d: padding/stride/dilation/groups/depthwise and ReLU
    convs = [
        dict(n=2, c=3, h=9, w=8, oc=4, k=3, stride=1, padding=1, dilation=1, groups=1, relu=False),
        dict(n=1, c=4, h=11, w=10, oc=6, k=3, stride=2, padding=2, dilation=2, groups=2, relu=True),
        dict(n=2, c=5, h=7, w=7, oc=5, k=3, stride=1, padding=1, dilation=1, groups=5, relu=False),
        dict(n=1, c=16, h=5, w=6, oc=8, k=1, stride=1, padding=0, dilation=1, groups=1, relu=True),
    ]
    for cfg in convs:
        x = torch.randn(cfg["n"], cfg["c"], cfg["h"], cfg["w"])
        qx = torch.quantize_per_tensor(x, 0.04, 100, torch.quint8)
        qw, ws = qweight(torch.randn(cfg["oc"], cfg["c"] // cfg["groups"], cfg["k"], cfg["k"]) * 0.3)
        b = torch.randn(cfg["oc"])
        packed = torch.ops.quantized.conv2d_prepack(qw, b, [cfg["stride"]] * 2, [cfg["padding"]] * 2,
                                                    [cfg["dilation"]] * 2, cfg["groups"])
        f = torch.ops.quantized.conv2d_relu if cfg["relu"] else torch.ops.quantized.conv2d
        y = f(qx, packed, 0.09, 70)
        cases.append({"op": "quantized_conv2d", **cfg, "input": qrepr(qx), "input_scale": 0.04,
                      "input_zero_point": 100, "weight": qrepr(qw), "weight_shape": list(qw.shape),
                      "weight_scale": ws.tolist(), "bias": f32s(b), "output_scale": 0.09, "output_zero_point": 70,
                      "output_shape": list(y.shape), "output": qrepr(y)})
    for relu in (False, True):
        a = torch.quantize_per_tensor(torch.randn(3, 50), 0.02, 130, torch.quint8)
        b = torch.quantize_per_tensor(torch.randn(3, 50) * 2, 0.05, 90, torch.quint8)
        f = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
        y = f(a, b, 0.06, 110)
        cases.append({"op": "quantized_add", "relu": relu, "shape": [3, 50], "input": qrepr(a), "input_scale": 0.02,
                      "input_zero_point": 130, "other": qrepr(b), "other_scale": 0.05, "other_zero_point": 90,
                      "output_scale": 0.06, "output_zero_point": 110, "output": qrepr(y)})
    # adaptive average pooling keeps the input's scale and zero point (NCHW: the scalar kernel)
    for (n, c, h, w), size in (((2, 3, 7, 7), (1, 1)), ((1, 2, 5, 7), (2, 3)), ((1, 2, 4, 4), (3, 3))):
        qx = torch.quantize_per_tensor(torch.randn(n, c, h, w) * 2, 0.03, 90, torch.quint8)
        y = torch.ao.nn.quantized.functional.adaptive_avg_pool2d(qx, size)
        cases.append({"op": "quantized_adaptive_avg_pool2d", "shape": [n, c, h, w], "output_size": list(size),
                      "input": qrepr(qx), "scale": 0.03, "zero_point": 90, "output_shape": list(y.shape),
                      "output": qrepr(y)})
    return cases


def main():
    data = {"torch": torch.__version__, "engine": torch.backends.quantized.engine,
            "observers": observers(), "ops": ops()}
    with open(OUT, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print(f"wrote {OUT}: {len(data['observers'])} observer cases, {len(data['ops'])} op cases, "
          f"{os.path.getsize(OUT)} bytes")
    workflow = {"torch": torch.__version__, "histogram_observers": histogram_observers()}
    with open(OUT_WORKFLOW, "w") as f:
        json.dump(workflow, f, separators=(",", ":"))
    print(f"wrote {OUT_WORKFLOW}: {len(workflow['histogram_observers'])} histogram cases, "
          f"{os.path.getsize(OUT_WORKFLOW)} bytes")


if __name__ == "__main__":
    main()
