"""Golden-file framework: describe op calls once, run them in PyTorch, store inputs and outputs.

A *case* names a ferrofx registry op, the PyTorch callable that defines the expected result,
and the arguments. Tensor arguments are `T(...)` specs materialised with a fixed seed; `V(...)`
wraps a tensor spec in a view (transpose, step slice, expand) applied identically on both sides
so non-contiguous inputs are covered. Everything else (ints, floats, bools, lists, strings,
dtypes, None) is passed as is.

Output: `tests/data/golden_<family>.safetensors`: tensors `<case>/in<i>` and `<case>/out<j>`,
plus metadata key "cases" holding a JSON list that the Rust runner
(`crates/ferrofx-core/tests/golden.rs`) reads.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from safetensors.torch import save_file

DTYPES = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass
class T:
    """A tensor argument: shape, dtype and how to fill it.

    kind: "randn" (normal), "rand" (uniform [0,1)), "pos" (uniform [0.5, 2.5): for log, sqrt,
    pow...), "int" (integers in [low, high)), "bool", "arange" (0, 1, 2, ...),
    "const" (all `value`).
    """
    shape: tuple
    dtype: str = "float32"
    kind: str = "randn"
    low: int = -5
    high: int = 5
    value: float = 0.0
    requires_grad: bool = False

    def make(self, gen: torch.Generator) -> torch.Tensor:
        shape = tuple(self.shape)
        dt = DTYPES[self.dtype]
        if self.kind == "randn":
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
        elif self.kind == "rand":
            t = torch.rand(shape, generator=gen, dtype=torch.float64)
        elif self.kind == "pos":
            t = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 + 0.5
        elif self.kind == "int":
            t = torch.randint(self.low, self.high, shape, generator=gen, dtype=torch.int64)
        elif self.kind == "bool":
            t = torch.rand(shape, generator=gen) < 0.5
        elif self.kind == "arange":
            n = 1
            for s in shape:
                n *= s
            t = torch.arange(n, dtype=torch.float64).reshape(shape)
        elif self.kind == "const":
            t = torch.full(shape, self.value, dtype=torch.float64)
        else:
            raise ValueError(f"unknown kind {self.kind}")
        return t.to(dt).contiguous()


@dataclass
class V:
    """A view of a tensor spec: ("transpose", d0, d1), ("slice", dim, start, end, step),
    ("expand", [sizes]), ("permute", [dims]), ("select", dim, index)."""
    base: T
    view: tuple

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        kind, *a = self.view
        if kind == "transpose":
            return t.transpose(a[0], a[1])
        if kind == "slice":
            dim, start, end, step = a
            idx = [slice(None)] * t.dim()
            idx[dim] = slice(start, end, step)
            return t[tuple(idx)]
        if kind == "expand":
            return t.expand(*a[0])
        if kind == "permute":
            return t.permute(*a[0])
        if kind == "select":
            return t.select(a[0], a[1])
        raise ValueError(f"unknown view {kind}")


@dataclass
class Case:
    """One op call. `fn` receives the materialised args/kwargs and returns a tensor or a
    tuple/list of tensors. `check="meta"` compares only shapes and dtypes (random ops)."""
    name: str
    op: str
    fn: Callable[..., Any]
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6
    check: str = "values"
    note: str = ""


def _encode(value, case_name, tensors, counter, gen):
    """Returns (json_description, torch_value)."""
    if isinstance(value, (T, V)):
        base = value.base if isinstance(value, V) else value
        t = base.make(gen)
        key = f"{case_name}/in{counter[0]}"
        counter[0] += 1
        tensors[key] = t
        desc = {"tensor": key}
        tv = t.clone()  # in-place ops must not change the stored input
        if isinstance(value, V):
            desc["view"] = list(value.view)
            tv = value.apply(tv)
        return desc, tv
    if value is None:
        return {"none": None}, None
    if isinstance(value, bool):
        return {"bool": value}, value
    if isinstance(value, int):
        return {"int": value}, value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}, value  # JSON has no inf/nan: "inf", "-inf", "nan"
        return {"float": value}, value
    if isinstance(value, str):
        return {"str": value}, value
    if isinstance(value, torch.dtype):
        return {"dtype": DTYPE_NAMES[value]}, value
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (T, V)) for v in value) and value:
            descs, vals = zip(*[_encode(v, case_name, tensors, counter, gen) for v in value])
            return {"tensors": list(descs)}, list(vals)
        if all(isinstance(v, bool) for v in value):
            raise ValueError("bool lists are not supported")
        if all(isinstance(v, int) for v in value):
            return {"ints": list(value)}, list(value)
        if all(isinstance(v, (int, float)) for v in value):
            return {"floats": [float(v) for v in value]}, list(value)
    raise TypeError(f"cannot encode argument {value!r} in case {case_name}")


def generate(family: str, cases: list[Case], out_dir: str | None = None, seed: int = 0) -> str:
    """Runs every case in PyTorch and writes `golden_<family>.safetensors`. Returns the path."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    meta_cases = []
    names = set()
    for c in cases:
        if c.name in names:
            raise ValueError(f"duplicate case name {c.name}")
        names.add(c.name)
        counter = [0]
        args_desc, args_val = [], []
        for a in c.args:
            d, v = _encode(a, c.name, tensors, counter, gen)
            args_desc.append(d)
            args_val.append(v)
        kwargs_desc, kwargs_val = {}, {}
        for k, a in c.kwargs.items():
            d, v = _encode(a, c.name, tensors, counter, gen)
            kwargs_desc[k] = d
            kwargs_val[k] = v
        out = c.fn(*args_val, **kwargs_val)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        out_keys = []
        for j, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                o = torch.tensor(o)
            key = f"{c.name}/out{j}"
            tensors[key] = o.detach().contiguous().clone()
            out_keys.append(key)
        meta_cases.append({
            "name": c.name, "op": c.op, "args": args_desc, "kwargs": kwargs_desc,
            "outputs": out_keys, "rtol": c.rtol, "atol": c.atol, "check": c.check,
            "note": c.note,
        })
    root = out_dir or os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
    os.makedirs(root, exist_ok=True)
    path = os.path.normpath(os.path.join(root, f"golden_{family}.safetensors"))
    # safetensors refuses shared/non-contiguous storage; everything is cloned contiguous above.
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, path, metadata={
        "cases": json.dumps(meta_cases),
        "torch_version": torch.__version__,
        "family": family,
    })
    print(f"{path}: {len(cases)} cases, {len(tensors)} tensors, {os.path.getsize(path)} bytes")
    return path
