"""ONNX Runtime reference cases for `scripts/bench_reference.py` (group `onnx` of
`cargo run --release -p ferrofx-bench`).

Same files as crates/ferrofx-bench/src/cases_onnx.rs: $FERROFX_ONNX_ZOO/<model>/model.onnx
(written by scripts/onnx/export_zoo.py) run on its input_0.pb by ONNX Runtime's CPU execution
provider with 2 intra-op threads and the default graph optimisations. The import case times
creating the InferenceSession (parse + graph optimisation) of ResNet-50's file.
"""
import os

MODELS = {
    "onnx_resnet18_b1": "resnet18",
    "onnx_resnet50_b1": "resnet50",
    "onnx_mobilenet_v2_b1": "mobilenet_v2",
    "onnx_bert": "bert",
}


def _zoo(name):
    root = os.environ.get("FERROFX_ONNX_ZOO")
    if not root:
        raise RuntimeError("FERROFX_ONNX_ZOO is not set")
    return os.path.join(root, name)


def _session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _input(d):
    import onnx
    from onnx import numpy_helper
    t = onnx.TensorProto()
    with open(os.path.join(d, "input_0.pb"), "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def ort_cases():
    """{case id: () -> fn} on ONNX Runtime."""
    def infer(name):
        def build():
            d = _zoo(name)
            sess = _session(os.path.join(d, "model.onnx"))
            feed = {sess.get_inputs()[0].name: _input(d)}
            sess.run(None, feed)
            return lambda: sess.run(None, feed)
        return build

    def import_r50():
        path = os.path.join(_zoo("resnet50"), "model.onnx")
        return lambda: _session(path)

    cases = {cid: infer(name) for cid, name in MODELS.items()}
    cases["onnx_import_resnet50"] = import_r50
    return cases
