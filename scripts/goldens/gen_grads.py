"""PyTorch gradient goldens for ferrofx autograd.

For each case: float64 inputs, a fixed upstream gradient per floating output, the first-order
gradients of the inputs that require grad and, for the second-order subset, Hessian-vector
products (double backward: grad of <u, grad(out, x, v, create_graph=True)>).

Writes tests/data/golden_grads.safetensors: tensors `<case>/in<i>`, `<case>/v<j>`,
`<case>/grad<i>`, `<case>/u<i>`, `<case>/hvp<i>`, and metadata "cases" (JSON list of
{name, op, args, kwargs, grad, second}); args are literals or {"t": i} / {"tl": [i, ...]}
references to inputs. The Rust runner is crates/ferrofx-core/tests/autograd_golden.rs.

Run: .venv/bin/python scripts/goldens/gen_grads.py
"""
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(0)
D = torch.float64


def rn(*s):
    return torch.randn(*s, dtype=D)


def pos(*s):
    return torch.rand(*s, dtype=D) * 2 + 0.5


def ix(v, shape=None):
    t = torch.tensor(v, dtype=torch.int64)
    return t.reshape(shape) if shape else t


def mk(v, shape):
    return torch.tensor(v, dtype=torch.bool).reshape(shape)


# (name, op, inputs, grad_mask, args(list with ("t", i) refs), kwargs, torch fn(*inputs), second)
T = lambda i: {"t": i}
CASES = []


def case(name, op, inputs, grad, args, fn, kwargs=None, second=False):
    CASES.append((name, op, inputs, grad, args, kwargs or {}, fn, second))


# elementwise
case("add", "add", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], lambda a, b: a + 2 * b, {"alpha": 2})
case("sub", "sub", [rn(2, 3), rn(2, 1)], [0, 1], [T(0), T(1)], lambda a, b: a - b)
case("mul", "mul", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], lambda a, b: a * b, second=True)
case("mul_scalar", "mul", [rn(4)], [0], [T(0), 2.5], lambda a: a * 2.5)
case("div", "div", [rn(2, 3), pos(3)], [0, 1], [T(0), T(1)], lambda a, b: a / b, second=True)
case("pow", "pow", [pos(2, 3), rn(3)], [0, 1], [T(0), T(1)], torch.pow, second=True)
case("pow_scalar", "pow", [rn(5)], [0], [T(0), 3], lambda a: a ** 3)
for n in ["neg", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "silu", "abs", "erf", "atan", "softsign", "elu", "selu", "hardswish", "hardsigmoid", "leaky_relu", "softplus", "hardtanh", "relu6"]:
    f = getattr(torch, n, None) or getattr(F, n)
    case(n, n, [rn(2, 5)], [0], [T(0)], f, second=n in ("exp", "tanh", "sigmoid", "silu", "sin"))
for n in ["log", "sqrt", "rsqrt", "reciprocal", "log1p", "log2", "log10"]:
    case(n, n, [pos(2, 5)], [0], [T(0)], getattr(torch, n), second=n in ("log", "sqrt"))
case("gelu", "gelu", [rn(2, 5)], [0], [T(0)], F.gelu, second=True)
case("gelu_tanh", "gelu", [rn(2, 5)], [0], [T(0)], lambda a: F.gelu(a, approximate="tanh"), {"approximate": "tanh"}, second=True)
case("maximum", "maximum", [rn(2, 3), rn(2, 3)], [0, 1], [T(0), T(1)], torch.maximum)
case("minimum", "minimum", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], torch.minimum)
case("clamp", "clamp", [rn(3, 4)], [0], [T(0), -0.5, 0.5], lambda a: torch.clamp(a, -0.5, 0.5))
case("where", "where", [rn(2, 3), rn(3)], [0, 1], [{"m": [[True, False, True], [False, True, True]]}, T(0), T(1)],
     lambda a, b: torch.where(mk([True, False, True, False, True, True], (2, 3)), a, b))
# reductions
case("sum", "sum", [rn(2, 3, 4)], [0], [T(0), [0, 2]], lambda a: a.sum((0, 2)))
case("mean", "mean", [rn(2, 3, 4)], [0], [T(0), [1], True], lambda a: a.mean(1, keepdim=True), second=True)
case("prod", "prod", [rn(2, 3, 4)], [0], [T(0), 2], lambda a: a.prod(2), second=True)
case("amax", "amax", [rn(2, 3, 4)], [0], [T(0), [0, 2]], lambda a: a.amax((0, 2)))
case("max_dim", "max.dim", [rn(2, 3, 4)], [0], [T(0), 1], lambda a: a.max(1).values)
case("var", "var", [rn(2, 3, 4)], [0], [T(0), [1, 2]], lambda a: a.var((1, 2)), second=True)
case("std", "std", [rn(2, 3, 4)], [0], [T(0), [2]], lambda a: a.std(2, correction=0), {"correction": 0}, second=True)
case("logsumexp", "logsumexp", [rn(2, 3, 4)], [0], [T(0), [1]], lambda a: a.logsumexp(1), second=True)
case("norm", "norm", [rn(2, 3, 4)], [0], [T(0), 2.0, [2]], lambda a: a.norm(2, 2), second=True)
case("norm_p3", "norm", [rn(2, 3, 4)], [0], [T(0), 3.0, [2]], lambda a: a.norm(3, 2))
case("softmax", "softmax", [rn(2, 3, 4)], [0], [T(0), 1], lambda a: a.softmax(1), second=True)
case("log_softmax", "log_softmax", [rn(2, 3, 4)], [0], [T(0), -1], lambda a: a.log_softmax(-1), second=True)
case("cumsum", "cumsum", [rn(2, 5)], [0], [T(0), 1], lambda a: a.cumsum(1))
case("cumprod", "cumprod", [rn(2, 5)], [0], [T(0), 1], lambda a: a.cumprod(1))
case("sort", "sort", [rn(3, 5)], [0], [T(0), 1, True], lambda a: a.sort(1, True).values)
case("topk", "topk", [rn(3, 5)], [0], [T(0), 2], lambda a: a.topk(2).values)
# joining / indexing
case("cat", "cat", [rn(2, 3), rn(2, 2)], [0, 1], [{"tl": [0, 1]}, 1], lambda a, b: torch.cat([a, b], 1))
case("stack", "stack", [rn(2, 3), rn(2, 3)], [0, 1], [{"tl": [0, 1]}, 1], lambda a, b: torch.stack([a, b], 1))
case("split", "split", [rn(2, 5)], [0], [T(0), 2, 1], lambda a: a.split(2, 1))
case("chunk", "chunk", [rn(4, 3)], [0], [T(0), 2], lambda a: a.chunk(2))
case("unbind", "unbind", [rn(3, 2)], [0], [T(0), 1], lambda a: a.unbind(1))
case("gather", "gather", [rn(2, 3)], [0], [T(0), 1, {"i": [[0, 2, 2], [1, 0, 0]]}], lambda a: a.gather(1, ix([[0, 2, 2], [1, 0, 0]])), second=True)
case("scatter_add", "scatter_add", [rn(2, 3), rn(2, 2)], [0, 1], [T(0), 1, {"i": [[2, 2], [1, 2]]}, T(1)], lambda a, b: a.scatter_add(1, ix([[2, 2], [1, 2]]), b))
case("index_select", "index_select", [rn(3, 4)], [0], [T(0), 1, {"i": [3, 0, 3]}], lambda a: a.index_select(1, ix([3, 0, 3])))
case("masked_fill", "masked_fill", [rn(2, 3)], [0], [T(0), {"m": [True, False, True]}, 0.5], lambda a: a.masked_fill(mk([True, False, True], (3,)), 0.5))
case("masked_select", "masked_select", [rn(2, 3)], [0], [T(0), {"m": [True, False, True]}], lambda a: a.masked_select(mk([True, False, True], (3,))))
case("embedding", "embedding", [rn(5, 3)], [0], [{"i": [[1, 4], [1, 0]]}, T(0), 0], lambda w: F.embedding(ix([[1, 4], [1, 0]]), w, padding_idx=0))
case("pad", "pad", [rn(2, 3, 4)], [0], [T(0), [1, 2, 0, 1]], lambda a: F.pad(a, [1, 2, 0, 1]))
case("pad_reflect", "pad", [rn(1, 3, 4)], [0], [T(0), [2, 1], "reflect"], lambda a: F.pad(a, [2, 1], "reflect"))
case("pixel_shuffle", "pixel_shuffle", [rn(1, 4, 2, 3)], [0], [T(0), 2], lambda a: F.pixel_shuffle(a, 2))
# linear algebra
case("matmul", "matmul", [rn(2, 2, 3), rn(3, 4)], [0, 1], [T(0), T(1)], torch.matmul, second=True)
case("matmul_vec", "matmul", [rn(3), rn(2, 3, 4)], [0, 1], [T(0), T(1)], torch.matmul)
case("mm", "mm", [rn(2, 3), rn(3, 2)], [0, 1], [T(0), T(1)], torch.mm, second=True)
case("bmm", "bmm", [rn(2, 2, 3), rn(2, 3, 2)], [0, 1], [T(0), T(1)], torch.bmm)
case("addmm", "addmm", [rn(2), rn(2, 3), rn(3, 2)], [0, 1, 2], [T(0), T(1), T(2)], lambda a, b, c: torch.addmm(a, b, c, beta=0.5, alpha=2.0), {"beta": 0.5, "alpha": 2.0})
case("linear", "linear", [rn(2, 3, 4), rn(2, 4), rn(2)], [0, 1, 2], [T(0), T(1), T(2)], F.linear, second=True)
# conv / pool / norm
case("conv2d", "conv2d", [rn(2, 2, 6, 5), rn(4, 1, 3, 2), rn(4)], [0, 1, 2], [T(0), T(1), T(2), [2, 1], [1, 0], [1, 2], 2],
     lambda x, w, b: F.conv2d(x, w, b, (2, 1), (1, 0), (1, 2), 2), second=True)
case("conv2d_same", "conv2d", [rn(1, 2, 5, 5), rn(3, 2, 2, 2)], [0, 1], [T(0), T(1), None, [1, 1], "same"],
     lambda x, w: F.conv2d(x, w, None, 1, "same"))
case("conv1d", "conv1d", [rn(2, 4, 7), rn(4, 2, 3), rn(4)], [0, 1, 2], [T(0), T(1), T(2), [2], [1], [1], 2],
     lambda x, w, b: F.conv1d(x, w, b, 2, 1, 1, 2), second=True)
case("conv_transpose2d", "conv_transpose2d", [rn(1, 4, 3, 3), rn(4, 1, 3, 2), rn(2)], [0, 1, 2],
     [T(0), T(1), T(2), [2, 1], [1, 0], [1, 0], 2, [1, 2]],
     lambda x, w, b: F.conv_transpose2d(x, w, b, (2, 1), (1, 0), (1, 0), 2, (1, 2)), second=True)
case("max_pool2d", "max_pool2d", [rn(2, 2, 5, 5)], [0], [T(0), [3, 2], [2, 2], [1, 0]], lambda x: F.max_pool2d(x, (3, 2), (2, 2), (1, 0)))
case("max_pool1d", "max_pool1d", [rn(2, 2, 7)], [0], [T(0), [3], [2], [1]], lambda x: F.max_pool1d(x, 3, 2, 1))
case("avg_pool2d", "avg_pool2d", [rn(2, 2, 5, 5)], [0], [T(0), [3, 2], [2, 2], [1, 1], True, False],
     lambda x: F.avg_pool2d(x, (3, 2), (2, 2), (1, 1), True, False), second=True)
case("avg_pool1d", "avg_pool1d", [rn(2, 2, 7)], [0], [T(0), [3], [2], [1]], lambda x: F.avg_pool1d(x, 3, 2, 1))
case("adaptive_avg_pool2d", "adaptive_avg_pool2d", [rn(2, 2, 5, 5)], [0], [T(0), [3, 2]], lambda x: F.adaptive_avg_pool2d(x, (3, 2)))
case("adaptive_max_pool2d", "adaptive_max_pool2d", [rn(2, 2, 5, 5)], [0], [T(0), [2, 3]], lambda x: F.adaptive_max_pool2d(x, (2, 3)))
case("layer_norm", "layer_norm", [rn(2, 3, 4), pos(4), rn(4)], [0, 1, 2], [T(0), [4], T(1), T(2)], lambda x, w, b: F.layer_norm(x, (4,), w, b), second=True)
case("batch_norm", "batch_norm", [rn(3, 2, 2, 2), pos(2), rn(2)], [0, 1, 2], [T(0), None, None, T(1), T(2), True],
     lambda x, w, b: F.batch_norm(x, None, None, w, b, True), second=True)
case("group_norm", "group_norm", [rn(2, 4, 3), pos(4), rn(4)], [0, 1, 2], [T(0), 2, T(1), T(2)], lambda x, w, b: F.group_norm(x, 2, w, b), second=True)


def main():
    tensors, meta = {}, []
    for name, op, inputs, grad, args, kwargs, fn, second in CASES:
        xs = [x.clone().requires_grad_(i in grad) for i, x in enumerate(inputs)]
        out = fn(*xs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o.is_floating_point()]
        vs = [torch.randn(o.shape, dtype=D) for o in outs]
        wrt = [xs[i] for i in grad]
        gs = torch.autograd.grad(outs, wrt, vs, create_graph=second, allow_unused=True)
        for i, x in enumerate(inputs):
            tensors[f"{name}/in{i}"] = x.contiguous()
        for j, v in enumerate(vs):
            tensors[f"{name}/v{j}"] = v
        for i, g in zip(grad, gs):
            tensors[f"{name}/grad{i}"] = (g if g is not None else torch.zeros_like(xs[i])).detach().clone().contiguous()
        if second:
            us = [torch.randn(xs[i].shape, dtype=D) for i in grad]
            pairs = [(g, u) for g, u in zip(gs, us) if g is not None and g.requires_grad]
            hv = torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs], allow_unused=True)
            for i, u, h in zip(grad, us, hv):
                tensors[f"{name}/u{i}"] = u
                tensors[f"{name}/hvp{i}"] = (h if h is not None else torch.zeros_like(xs[i])).detach().clone().contiguous()
        meta.append({"name": name, "op": op, "args": args, "kwargs": kwargs, "grad": grad, "second": second, "n_out": len(outs)})
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "tests", "data", "golden_grads.safetensors")
    save_file(tensors, path, metadata={"cases": json.dumps(meta)})
    print(f"{len(meta)} cases ({sum(m['second'] for m in meta)} with second order), {len(tensors)} tensors -> {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
