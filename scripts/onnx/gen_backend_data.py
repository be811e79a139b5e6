#!/usr/bin/env python3
"""Writes ONNX's backend test cases for the ferrofx backend-suite runner.

Usage: .venv/bin/python scripts/onnx/gen_backend_data.py OUT_DIR

OUT_DIR/node/<case>/model.onnx + test_data_set_N/{input,output}_K.pb: the per-operator node
cases (`onnx.backend.test.case.node`; the `onnx` 1.23 wheel ships no generated node data and
its `cmd_tools generate-data` writes only the model cases, so this does the same for node
cases). The shipped suites (`pytorch-converted`, `pytorch-operator`, `simple`) are linked from
the wheel's `onnx/backend/test/data` into OUT_DIR.
"""
import os
import shutil
import sys

import onnx
import onnx.defs
import onnx.backend.test.case.node as node_cases
from onnx import numpy_helper, TensorProto


def write_case(out, case):
    d = os.path.join(out, case.kind, case.name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    with open(os.path.join(d, "model.onnx"), "wb") as f:
        f.write(case.model.SerializeToString())
    for i, (inputs, outputs) in enumerate(case.data_sets):
        ds = os.path.join(d, f"test_data_set_{i}")
        os.makedirs(ds)
        graph = case.model.graph
        for kind, values, infos in (("input", inputs, graph.input), ("output", outputs, graph.output)):
            for j, value in enumerate(values):
                info = infos[j]
                path = os.path.join(ds, f"{kind}_{j}.pb")
                with open(path, "wb") as f:
                    if info.type.HasField("sequence_type"):
                        f.write(numpy_helper.from_list(value, info.name).SerializeToString())
                    elif info.type.HasField("optional_type"):
                        f.write(numpy_helper.from_optional(value, info.name).SerializeToString())
                    elif info.type.HasField("map_type"):
                        f.write(numpy_helper.from_dict(value, info.name).SerializeToString())
                    elif isinstance(value, TensorProto):
                        f.write(value.SerializeToString())
                    else:
                        f.write(numpy_helper.from_array(value, info.name).SerializeToString())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    for case in node_cases.collect_testcases():
        try:
            write_case(out, case)
            n += 1
        except Exception as e:  # a case numpy_helper cannot serialise (e.g. exotic types)
            print(f"skipped {case.name}: {e}", file=sys.stderr)
    shipped = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    for suite in ("pytorch-converted", "pytorch-operator", "simple"):
        dst = os.path.join(out, suite)
        if os.path.islink(dst) or os.path.exists(dst):
            if os.path.islink(dst):
                os.unlink(dst)
            else:
                shutil.rmtree(dst)
        os.symlink(os.path.join(shipped, suite), dst)
    with open(os.path.join(out, "ops.txt"), "w") as f:
        names = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx")})
        for name in names:
            f.write(f"{name}\t\n")
    print(f"wrote {n} node cases to {out}/node; linked the shipped suites (onnx {onnx.__version__})")


if __name__ == "__main__":
    main()
