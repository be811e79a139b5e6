#!/usr/bin/env python3
"""PyTorch reference for `cargo run --release -p ferrofx-bench`.

Runs the cases with the ids given in --ids (same ids as crates/ferrofx-bench/src/cases.rs) and
prints one JSON object per case: {"id": ..., "seconds": median seconds per call}. With --serve
(what the bench uses) it reads case ids from stdin instead, one per line, times each when asked
(a case asked again in a row reuses its model: the bench alternates its own timing and this
one's over rounds) and ends each answer with {"id": ..., "done": true}.

The whole-model inference cases also run on ONNX Runtime (CPU, 2 threads, default graph
optimisations) when it is installed: torchvision's model is exported with torch.onnx and each
such case prints a second object, {"id": ..., "engine": "onnxruntime", "seconds": ...}.
"""
import argparse
import json
import os
import statistics
import sys
import time


def median_secs(fn, inner=1, quick=False):
    warm, measure, min_samples = (0.05, 0.3, 3) if quick else (0.3, 2.0, 5)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm:
        for _ in range(inner):
            fn()
    samples = []
    t0 = time.perf_counter()
    while len(samples) < min_samples or time.perf_counter() - t0 < measure:
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t) / inner)
    return statistics.median(samples)


def data(shape, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 2 - 1


def cases():
    import torch
    import torch.fx
    import torch.nn.functional as F

    def matmul_1024():
        a, b = data((1024, 1024), 1), data((1024, 1024), 2)
        return lambda: torch.matmul(a, b), 1

    def add_16m():
        # allocating on both sides (ferrofx has no out= form): like for like
        a, b = data((16 << 20,), 1), data((16 << 20,), 2)
        return lambda: torch.add(a, b), 1

    def add_inplace_16m():
        a, b = data((16 << 20,), 1), data((16 << 20,), 2)
        return lambda: a.add_(b), 1

    def add_tiny():
        a, b = torch.tensor([1.0]), torch.tensor([2.0])
        return lambda: a.add(b), 10_000

    def conv(n, cin, cout, hw, k, s, p):
        def make():
            x, w = data((n, cin, hw, hw), 1), data((cout, cin, k, k), 2)
            return lambda: F.conv2d(x, w, None, s, p), 1
        return make

    def mul_tiny():
        x = torch.ones(1, requires_grad=True)
        w = torch.full((1,), 0.5, requires_grad=True)

        def run():
            with torch.enable_grad():
                (x * w).backward()
        return run, 2_000

    def mlp_step():
        p = lambda shape, seed: (data(shape, seed) * 0.1).requires_grad_()
        w1, b1, w2, b2 = p((64, 64), 1), p((64,), 2), p((10, 64), 3), p((10,), 4)
        xb = data((32, 64), 5)
        tgt = (torch.arange(32) % 10).reshape(32, 1)
        ps = [w1, b1, w2, b2]

        def step():
            with torch.enable_grad():
                h = F.linear(xb, w1, b1).relu()
                o = F.linear(h, w2, b2)
                loss = -o.log_softmax(1).gather(1, tgt).mean()
                loss.backward()
            with torch.no_grad():
                for q in ps:
                    q.sub_(q.grad, alpha=0.01)
                    q.grad = None
        return step, 50

    def resnet(fifty):
        import torchvision
        return torchvision.models.resnet50() if fifty else torchvision.models.resnet18()

    def infer(fifty):
        def make():
            m = resnet(fifty).eval()
            x = data((1, 3, 224, 224), 1)
            return lambda: m(x), 1
        return make

    def resnet18_train_b8():
        m = resnet(False).train()
        x = data((8, 3, 224, 224), 1)

        def run():
            with torch.enable_grad():
                m(x).sum().backward()
            for q in m.parameters():
                q.grad = None
        return run, 1

    def folded_r50():
        from torch.fx.experimental.optimization import fuse
        m = fuse(resnet(True).eval())
        x = data((1, 3, 224, 224), 1)
        return lambda: m(x), 1

    def trace(fifty):
        def make():
            m = resnet(fifty)
            return lambda: torch.fx.symbolic_trace(m), 1
        return make

    def recompile(fifty):
        def make():
            gm = torch.fx.symbolic_trace(resnet(fifty))
            return lambda: gm.recompile(), 1
        return make

    def save_load(load):
        def make():
            import atexit
            import os
            import tempfile
            sd = resnet(True).eval().state_dict()
            tag = "load" if load else "save"
            path = os.path.join(tempfile.gettempdir(), f"ferrofx_bench_ref_{tag}_{os.getpid()}.pt")
            torch.save(sd, path)
            atexit.register(lambda: os.path.exists(path) and os.remove(path))
            if load:
                return lambda: torch.load(path, weights_only=True), 1
            return lambda: torch.save(sd, path), 1
        return make

    # issue 18, group `compile`: PyTorch eager on the same workloads
    def seed003(two):
        def make():
            x = data((16 << 20,), 1)
            if two:
                y = data((16 << 20,), 2)
                return lambda: torch.relu(x + 2 * y), 1
            return lambda: torch.relu((x + 1) * 2), 1
        return make

    def copy(n):
        def make():
            x = data((n,), 3)
            return lambda: x.clone(), 1
        return make

    def model_infer(arch, batch):
        def make():
            import torchvision
            m = getattr(torchvision.models, arch)().eval()
            x = data((batch, 3, 224, 224), 1)
            return lambda: m(x), 1
        return make

    compile_cases = {
        "compile_copy_16m": copy(16 << 20),
        "compile_add_mul_relu_16m_unfused": seed003(False),
        "compile_add_mul_relu_16m_fused": seed003(False),
        "compile_copy_24m": copy(24 << 20),
        "compile_add_scaled_relu_16m_unfused": seed003(True),
        "compile_add_scaled_relu_16m_fused": seed003(True),
    }
    for arch in ("resnet18", "resnet50", "mobilenet_v2"):
        for b in (1, 8):
            compile_cases[f"compile_{arch}_b{b}"] = model_infer(arch, b)

    def transformer_infer():
        m, ids = transformer_classifier()
        return lambda: m(ids), 1
    compile_cases["compile_transformer"] = transformer_infer

    return {
        **compile_cases,
        "autograd_mul_tiny": mul_tiny,
        "autograd_mlp_step": mlp_step,
        "resnet18_infer_b1": infer(False),
        "resnet50_infer_b1": infer(True),
        "resnet18_train_b8": resnet18_train_b8,
        "fx_graph_module_resnet18_b1": infer(False),
        "fx_resnet50_folded_b1": folded_r50,
        "fx_symbolic_trace_resnet18": trace(False),
        "fx_symbolic_trace_resnet50": trace(True),
        "fx_recompile_resnet18": recompile(False),
        "fx_recompile_resnet50": recompile(True),
        "save_resnet50": save_load(False),
        "load_resnet50": save_load(True),
        "matmul_1024_f32": matmul_1024,
        "add_16m_f32": add_16m,
        "add_inplace_16m_f32": add_inplace_16m,
        "add_tiny_f32": add_tiny,
        "conv2d_r18_conv1_b1": conv(1, 3, 64, 224, 7, 2, 3),
        "conv2d_r18_l1_b1": conv(1, 64, 64, 56, 3, 1, 1),
        "conv2d_r18_l2_b1": conv(1, 128, 128, 28, 3, 1, 1),
        "conv2d_r18_l3_b1": conv(1, 256, 256, 14, 3, 1, 1),
        "conv2d_r18_l4_b1": conv(1, 512, 512, 7, 3, 1, 1),
        "conv2d_r18_l1_b8": conv(8, 64, 64, 56, 3, 1, 1),
        "conv2d_r18_down_b8": conv(8, 128, 256, 28, 1, 2, 0),
    }


def transformer_classifier():
    """PyTorch's twin of ferrofx's zoo `TransformerClassifier` as the `compile` group builds it
    (all-MiniLM-L6 sized: d_model 384, 12 heads, ff 1536, 6 post-norm GELU layers, batch first,
    128 tokens, mean pooling, 2 classes) and its input ids."""
    import torch
    from torch import nn

    class TransformerClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 384)
            self.pos = nn.Parameter(torch.randn(128, 384) * 0.02)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(384, 12, 1536, dropout=0.0, activation="gelu", batch_first=True)
                for _ in range(6))
            self.head = nn.Linear(384, 2)

        def forward(self, ids):
            h = self.embed(ids) + self.pos[: ids.shape[1]]
            for layer in self.layers:
                h = layer(h)
            return self.head(h.mean(1))

    torch.manual_seed(0)
    ids = torch.tensor([[i * 7 % 1000 for i in range(128)]], dtype=torch.int64)
    return TransformerClassifier().eval(), ids


# Run in a fresh interpreter that imports only onnxruntime and numpy, so memory freed earlier
# by this process (PyTorch's eager run, the export) cannot hide the session's own growth.
ORT_PEAK_CHILD = """
import sys, numpy as np, onnxruntime as ort
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
x = np.load(sys.argv[2])
before = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")
so = ort.SessionOptions()
so.intra_op_num_threads = 2
so.inter_op_num_threads = 1
sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
for _ in range(3):
    sess.run(None, {"x": x})
print(max(0, status("VmHWM:") - before))
"""


def ort_peak_bytes(path, x):
    """Peak RSS growth (bytes) of creating an ONNX Runtime session on `path` and running it 3
    times on `x`, in a fresh interpreter; None if that cannot be measured here."""
    import subprocess
    import tempfile

    import numpy as np
    with tempfile.NamedTemporaryFile(suffix=".npy", delete=False) as f:
        np.save(f, x)
    try:
        out = subprocess.run([sys.executable, "-c", ORT_PEAK_CHILD, path, f.name], capture_output=True,
                             text=True, timeout=600)
        return int(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    finally:
        os.remove(f.name)


# (arch, batch) -> peak RSS growth (bytes) over creating the ONNX Runtime session and 3 runs
ORT_PEAK = {}


# Case id -> the torchvision model ONNX Runtime runs for it (batch 1, 224 px). The folded
# ResNet-50 case compares with the same export: ONNX Runtime folds BatchNorm into the
# convolutions itself.
ORT_CASES = {
    "resnet18_infer_b1": "resnet18",
    "resnet50_infer_b1": "resnet50",
    "fx_resnet50_folded_b1": "resnet50",
    "fx_graph_module_resnet18_b1": "resnet18",
    # issue 18: compiled ferrofx against ONNX Runtime, batch 1 and 8
    **{f"compile_{a}_b{b}": (a, b) for a in ("resnet18", "resnet50", "mobilenet_v2") for b in (1, 8)},
    "compile_transformer": ("transformer", 1),
}


def ort_case(spec, cache={}):
    """A function running `spec` (an arch, or (arch, batch)) on ONNX Runtime, or raises if it
    is unavailable."""
    arch, batch = spec if isinstance(spec, tuple) else (spec, 1)
    import os
    import tempfile

    import onnxruntime as ort
    import torch
    import torchvision
    if (arch, batch) not in cache:
        if arch == "transformer":
            m, x = transformer_classifier()
        else:
            m = getattr(torchvision.models, arch)().eval()
            x = data((batch, 3, 224, 224), 1)
        path = os.path.join(tempfile.gettempdir(), f"ferrofx_bench_{arch}_b{batch}_{os.getpid()}.onnx")
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (x,), path, dynamo=False, input_names=["x"], output_names=["y"])
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.inter_op_num_threads = 1
        xn = x.numpy()
        # peak memory (issue 18's rows): the growth of the peak RSS over loading the session
        # (weights, graph optimisation) and 3 runs (arena, activations), in a fresh process
        peak = ort_peak_bytes(path, xn)
        if peak is not None:
            ORT_PEAK[(arch, batch)] = peak
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        os.remove(path)
        cache[(arch, batch)] = lambda: sess.run(None, {"x": xn})
    return cache[(arch, batch)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--serve", action="store_true", help="read case ids from stdin, answer each")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(2)
    print(json.dumps({"torch_version": torch.__version__}), flush=True)
    table = cases()
    # all-MiniLM-L6-v2 (group minilm): its own file, with its own ONNX Runtime export
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "minilm"))
    import bench_minilm
    table.update(bench_minilm.cases())
    ort_extra = bench_minilm.ort_cases()
    # ONNX import and inference (group onnx): ONNX Runtime only, on the same .onnx files
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx"))
    import bench_onnx
    ort_extra.update(bench_onnx.ort_cases())
    # int8 kernels per layer (group qkernels): torch.ops.quantized (fbgemm) and float conv/linear
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant"))
    import bench_qconv
    table.update(bench_qconv.cases())
    # int8 quantization (group quant): PyTorch quantize_fx and onnxruntime quantize_static
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant"))
    import bench_quant
    table.update(bench_quant.cases())
    table.update(bench_quant.dynamic_cases(transformer_classifier))
    ort_extra.update(bench_quant.ort_cases())
    ctx = {"table": table, "ort_extra": ort_extra, "quick": a.quick, "made": {}}
    if a.serve:
        # the tables are built: from here on this process is idle between cases, so nothing
        # ferrofx times (its own side, or a case alone in a fresh process) shares the machine
        # with this script's start-up
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            cid = line.strip()
            if cid:
                run_case(cid, ctx)
                print(json.dumps({"id": cid, "done": True}), flush=True)
        return 0
    for cid in [i for i in a.ids.split(",") if i]:
        run_case(cid, ctx)
    return 0


def run_case(cid, ctx):
    """Times case `cid` (PyTorch, and ONNX Runtime where it has one), printing a row each. The
    models of the last case asked are kept for the next ask (dropped when another case comes)."""
    import gc
    import torch
    table, ort_extra, made = ctx["table"], ctx["ort_extra"], ctx["made"]
    if made.get("id") != cid:
        made.clear()
        gc.collect()
        made["id"] = cid
    if cid not in table and cid not in ort_extra:
        print(json.dumps({"id": cid, "error": "no reference for this case"}), flush=True)
        return
    if cid in table:
        if "torch" not in made:
            made["torch"] = table[cid]()
        fn, inner = made["torch"]
        with torch.no_grad():
            s = median_secs(fn, inner, ctx["quick"])
        print(json.dumps({"id": cid, "seconds": s}), flush=True)
    if cid in ORT_CASES or cid in ort_extra:
        try:
            import onnxruntime
            if "ort" not in made:
                made["ort"] = ort_extra[cid]() if cid in ort_extra else ort_case(ORT_CASES[cid])
            fn = made["ort"]
            spec = ORT_CASES.get(cid)
            peak = ORT_PEAK.get(spec if isinstance(spec, tuple) else (spec, 1)) if cid.startswith("compile_") else None
            s = median_secs(fn, 1, ctx["quick"])
            row = {"id": cid, "engine": "onnxruntime", "version": onnxruntime.__version__, "seconds": s}
            if peak is not None:
                row["peak_bytes"] = peak
            print(json.dumps(row), flush=True)
        except Exception as e:  # not installed, or the export failed: say so in the table
            print(json.dumps({"id": cid, "engine": "onnxruntime", "error": f"{type(e).__name__}: {e}"}),
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
