"""Per-node times of ONNX Runtime on a torchvision model (issue 18's per-layer tables).

Exports torchvision's `arch` at `batch` x 3 x 224 x 224 the way `scripts/bench_reference.py`
does (torch.onnx, ONNX Runtime default optimisations, 2 intra-op threads), runs it `runs`
times with `SessionOptions.enable_profiling` and prints, per node, the fastest run's time
(microseconds), its op type and its weight shape, slowest first, then the sum per kernel shape.

    .venv/bin/python scripts/bench/ort_profile.py resnet50 1 [runs] [top]
"""
import json
import os
import sys
import tempfile
import warnings


def main():
    arch = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 70
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    import torchvision

    m = getattr(torchvision.models, arch)().eval()
    x = torch.randn(batch, 3, 224, 224)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), path, dynamo=False, input_names=["x"], output_names=["y"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tmp, "ort")
    so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    xn = x.numpy()
    for _ in range(runs):
        sess.run(None, {"x": xn})
    prof = sess.end_profiling()
    events = json.load(open(prof))
    # weight shapes of the optimised graph's nodes
    g = onnx.load(so.optimized_model_filepath).graph
    inits = {i.name: list(i.dims) for i in g.initializer}
    wshape = {}
    for n in g.node:
        ws = [inits[i] for i in n.input[1:2] if i in inits]
        wshape[n.name] = (n.op_type, ws[0] if ws else None)
    best = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        best[name] = min(best.get(name, 1e18), e["dur"])
    rows = sorted(best.items(), key=lambda kv: -kv[1])
    total = sum(best.values())
    print(f"{arch} batch {batch}: {len(best)} nodes, sum of per-node best {total / 1000:.3f} ms")
    for name, us in rows[:top]:
        op, ws = wshape.get(name, ("?", None))
        print(f"{us:8.0f} us  {op:14} {str(ws):24} {name}")


if __name__ == "__main__":
    main()
