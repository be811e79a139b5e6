#!/usr/bin/env python3
"""Checks the models ferrofx exported in the zoo round-trip test (issue 23, acceptance 3).

Usage: .venv/bin/python scripts/onnx/check_export.py ZOO_DIR

For each ZOO_DIR/<name>/ferrofx.onnx: onnx.checker.check_model(full_check=True), then
onnxruntime on input_0.pb compared with PyTorch's output_0.pb (max |diff| / max |ref|).
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def load(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def main():
    root = sys.argv[1]
    bad = 0
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "ferrofx.onnx")
        if not os.path.exists(path):
            continue
        try:
            onnx.checker.check_model(onnx.load(path), full_check=True)
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            x = load(os.path.join(root, name, "input_0.pb"))
            want = load(os.path.join(root, name, "output_0.pb"))
            got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
            err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))
            print(f"{name:<20} checker ok  onnxruntime vs PyTorch max rel err {err:.2e}")
        except Exception as e:  # report every model
            bad += 1
            print(f"{name:<20} FAILED: {str(e)[:300]}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
