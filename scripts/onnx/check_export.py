#!/usr/bin/env python3
"""Checks the models ferrofx exported in the zoo round-trip test (issue 23, acceptance 3).

Usage: .venv/bin/python scripts/onnx/check_export.py DIR

For each DIR/<name>.onnx (written by `cargo test -p ferrofx-onnx --test onnx zoo_round_trip`,
with DIR/<name>.input.pb and ferrofx's output DIR/<name>.ferrofx.pb beside it):
onnx.checker.check_model(full_check=True), then onnxruntime on the input, compared with
ferrofx's output: max |diff| / max |ferrofx| must be <= 1e-5. Exits 1 if any model fails.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

TOL = 1e-5


def load(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def main():
    root = sys.argv[1]
    bad = 0
    names = sorted(f[:-5] for f in os.listdir(root) if f.endswith(".onnx"))
    for name in names:
        path = os.path.join(root, name + ".onnx")
        try:
            onnx.checker.check_model(onnx.load(path), full_check=True)
            so = ort.SessionOptions()
            so.intra_op_num_threads = 2
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            x = load(os.path.join(root, name + ".input.pb"))
            want = load(os.path.join(root, name + ".ferrofx.pb"))
            got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
            err = float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-6))
            ok = err <= TOL
            bad += 0 if ok else 1
            print(f"{name:<20} checker(full_check) ok  onnxruntime vs ferrofx max rel err {err:.2e}"
                  f"{'' if ok else f'  FAILED (> {TOL:g})'}")
        except Exception as e:  # report every model
            bad += 1
            print(f"{name:<20} FAILED: {str(e)[:300]}")
    print(f"check_export: {bad} of {len(names)} models failed" if bad else f"check_export: all {len(names)} models ok")
    sys.exit(1 if bad or not names else 0)


if __name__ == "__main__":
    main()
