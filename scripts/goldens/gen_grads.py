"""PyTorch gradient goldens for ferrofx autograd.

For each case: float64 inputs, a fixed upstream gradient per floating output, the first-order
gradients of the inputs that require grad and, for the second-order subset, Hessian-vector
products (double backward: grad of <u, grad(out, x, v, create_graph=True)>).

Writes tests/data/golden_grads.safetensors: tensors `<case>/in<i>`, `<case>/v<j>`,
`<case>/grad<i>`, `<case>/u<i>`, `<case>/hvp<i>`, and metadata "cases" (JSON list of
{name, op, args, kwargs, grad, second}); args are literals or {"t": i} / {"tl": [i, ...]}
references to inputs, {"i": nested ints} / {"m": nested bools} literal int64 / bool tensors and
{"il": [...]} a list of such literals (a `Tensor[]` of index tensors). Cases made with
`values=True` also store their outputs (`<case>/out<j>`), which the runner compares. The Rust runner is crates/ferrofx-core/tests/autograd_golden.rs.

In-place cases: `prep` maps an input index to a list of [op, *args] calls applied to that input
before the case's op (e.g. [["clone"], ["select", 0, 1]]: a non-leaf copy, then a view of it);
Every case also records the `grad_fn` name of each output (`grad_fn`: list, null for outputs
without history), which the runner compares with ferrofx's node names.

`ret` (an input index) makes the case's output the result of that input's first prep call (the
base an in-place op on a view wrote through, whose history is then CopySlices). The torch
function of such a case must do the same explicitly.

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


# Cases whose outputs are compared too (`<case>/out<j>`, metadata "values": true).
VALUES = set()


def case(name, op, inputs, grad, args, fn, kwargs=None, second=False, prep=None, ret=None, names_only=False, values=False):
    if values:
        VALUES.add(name)
    CASES.append((name, op, inputs, grad, args, kwargs or {}, fn, second, prep or {}, ret, names_only))


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

# The cases below draw their inputs from a saved generator state that is restored afterwards,
# so the upstream gradients drawn in main() for the cases above stay as they were.
_RNG = torch.get_rng_state()
torch.manual_seed(16)
# In-place ops (version-correct saving; issue 16). `a.mul_(b)` with `a` not requiring grad and
# `b` requiring grad: PyTorch saves the original `a` (grad of b = v * a_before), never the
# overwritten one.
case("mul__self_nograd", "mul_", [rn(2, 3), rn(3)], [1], [T(0), T(1)], lambda a, b: a.mul_(b))
case("div__self_nograd", "div_", [rn(2, 3), pos(3)], [1], [T(0), T(1)], lambda a, b: a.div_(b))
CL = [["clone"]]
case("mul__both", "mul_", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], lambda a, b: a.clone().mul_(b), second=True, prep={0: CL})
case("div__both", "div_", [rn(2, 3), pos(3)], [0, 1], [T(0), T(1)], lambda a, b: a.clone().div_(b), second=True, prep={0: CL})
case("pow__tensor", "pow_", [pos(2, 3), rn(3)], [0, 1], [T(0), T(1)], lambda a, b: a.clone().pow_(b), second=True, prep={0: CL})
for n in ["relu_", "sigmoid_", "tanh_", "exp_", "sin_", "abs_", "elu_", "hardtanh_", "silu_", "erf_", "neg_"]:
    f = (lambda a: F.silu(a, inplace=True)) if n == "silu_" else getattr(torch, n, None) or getattr(F, n)
    case(n, n, [rn(2, 5)], [0], [T(0)], lambda a, f=f: f(a.clone()), second=n in ("sigmoid_", "tanh_", "exp_", "sin_"), prep={0: CL})
for n in ["log_", "sqrt_", "rsqrt_", "reciprocal_"]:
    case(n, n, [pos(2, 5)], [0], [T(0)], lambda a, n=n: getattr(a.clone(), n)(), second=n == "log_", prep={0: CL})
case("leaky_relu_", "leaky_relu_", [rn(2, 5)], [0], [T(0), 0.2], lambda a: F.leaky_relu_(a.clone(), 0.2), prep={0: CL})
case("clamp_", "clamp_", [rn(3, 4)], [0], [T(0), -0.5, 0.5], lambda a: a.clone().clamp_(-0.5, 0.5), prep={0: CL})
case("copy_", "copy_", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], lambda a, b: a.clone().copy_(b), prep={0: CL})
case("copy__plain_dst", "copy_", [rn(2, 3), rn(2, 3)], [1], [T(0), T(1)], lambda a, b: a.copy_(b))
case("fill__tensor", "fill_", [rn(2, 3), torch.randn((), dtype=D)], [0, 1], [T(0), T(1)], lambda a, b: a.clone().fill_(b), prep={0: CL})
case("zero_", "zero_", [rn(2, 3)], [0], [T(0)], lambda a: a.clone().zero_(), prep={0: CL})
case("clone", "clone", [rn(2, 3)], [0], [T(0)], lambda a: a.clone())


# CopySlices: in-place ops through views of a base that requires grad (or of a plain base
# written with values that require grad); the output is the base.
def through(view, op):
    def f(a, *rest):
        y = a.clone()
        op(view(y), *rest)
        return y
    return f


case("cs_select_mul_", "mul_", [rn(3, 4), rn(4)], [0, 1], [T(0), T(1)],
     through(lambda y: y.select(0, 1), lambda v, b: v.mul_(b)), second=True, prep={0: [["clone"], ["select", 0, 1]]}, ret=0)
case("cs_narrow_add_", "add_", [rn(3, 4), rn(3, 2)], [0, 1], [T(0), T(1)],
     through(lambda y: y.narrow(1, 1, 2), lambda v, b: v.add_(b)), prep={0: [["clone"], ["narrow", 1, 1, 2]]}, ret=0)
case("cs_slice_step_mul_", "mul_", [rn(3, 5), rn(3, 3)], [0, 1], [T(0), T(1)],
     through(lambda y: y[:, 0:5:2], lambda v, b: v.mul_(b)), second=True, prep={0: [["clone"], ["slice", 1, 0, 5, 2]]}, ret=0)
case("cs_transpose_mul_", "mul_", [rn(2, 3), rn(2)], [0, 1], [T(0), T(1)],
     through(lambda y: y.transpose(0, 1), lambda v, b: v.mul_(b)), prep={0: [["clone"], ["transpose", 0, 1]]}, ret=0)
case("cs_view_copy_", "copy_", [rn(2, 3), rn(6)], [0, 1], [T(0), T(1)],
     through(lambda y: y.view(6), lambda v, b: v.copy_(b)), prep={0: [["clone"], ["view", [6]]]}, ret=0)
case("cs_select_sigmoid_", "sigmoid_", [rn(3, 4)], [0], [T(0)],
     through(lambda y: y.select(1, 2), lambda v: v.sigmoid_()), second=True, prep={0: [["clone"], ["select", 1, 2]]}, ret=0)
case("cs_nested_views_", "mul_", [rn(3, 4), rn(2)], [0, 1], [T(0), T(1)],
     through(lambda y: y.t().narrow(0, 1, 2).select(1, 2), lambda v, b: v.mul_(b)),
     prep={0: [["clone"], ["t"], ["narrow", 0, 1, 2], ["select", 1, 2]]}, ret=0)

# Gradient conventions at the edges (PyTorch 2.15): clamp passes the gradient where
# min <= x <= max (bounds included); tensor bounds get it where x is below / above them;
# pow's gradient is 0 where the exponent is 0, and d/de at x == 0 is 0 for e >= 0.
EDGE = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=D)
case("clamp_at_bounds", "clamp", [EDGE.clone()], [0], [T(0), -0.5, 0.5], lambda a: a.clamp(-0.5, 0.5))
case("clamp_tensor_bounds", "clamp", [EDGE.clone(), torch.tensor([-0.5, -0.5, 0.2, 0.7, 2.0], dtype=D), torch.tensor([0.0, -0.5, 0.0, 0.5, 1.5], dtype=D)],
     [0, 1, 2], [T(0), T(1), T(2)], lambda a, lo, hi: a.clamp(lo, hi))
case("pow_at_zero", "pow", [torch.tensor([0.0, 0.0, 0.0, 2.0, 0.0], dtype=D), torch.tensor([0.0, 1.0, 2.0, 0.5, 3.0], dtype=D)], [0, 1], [T(0), T(1)], torch.pow)
case("pow_scalar_zero_exp", "pow", [torch.tensor([0.0, 1.5, -2.0], dtype=D)], [0], [T(0), 0.0], lambda a: a ** 0.0)


def plain_base(view, op):
    def f(a, *rest):
        op(view(a), *rest)
        return a
    return f


# x = zeros; x[1] = w (setitem = select + copy_): x gets CopySlices, dx/dw flows.
case("cs_plain_base_copy_", "copy_", [torch.zeros(3, 4, dtype=D), rn(4)], [1], [T(0), T(1)],
     plain_base(lambda y: y.select(0, 1), lambda v, b: v.copy_(b)), prep={0: [["alias"], ["select", 0, 1]]}, ret=0)
case("cs_plain_base_mul_", "mul_", [rn(3, 4), rn(3, 2)], [1], [T(0), T(1)],
     plain_base(lambda y: y.narrow(1, 0, 2), lambda v, b: v.mul_(b)), prep={0: [["alias"], ["narrow", 1, 0, 2]]}, ret=0)

# Node names and gradient conventions checked by name (issue 16): max()/min() over all
# elements (MaxBackward1), max(dim) (values MaxBackward0, indices without grad_fn),
# split_with_sizes (SplitWithSizesBackward0), clamp_min/clamp_max with a number
# (ClampMinBackward0: no gradient at the bound or for NaN) or a tensor (ClampMinBackward1: half
# to each side at a tie, NaN on either side passes to both), clamp with tensor bounds on a grid
# of ties, crossed and NaN bounds.
NAN = float("nan")
case("max_all", "max", [rn(3, 4)], [0], [T(0)], torch.max)
case("min_all", "min", [rn(3, 4)], [0], [T(0)], torch.min)
case("max_dim_both", "max.dim", [rn(2, 3, 4)], [0], [T(0), 1], lambda a: a.max(1))
case("min_dim_keepdim", "min.dim", [rn(2, 3, 4)], [0], [T(0), 2, True], lambda a: a.min(2, keepdim=True))
case("split_with_sizes", "split_with_sizes", [rn(5, 2)], [0], [T(0), [2, 3]], lambda a: a.split_with_sizes([2, 3]))
TIE_X = torch.tensor([0.5, 1.0, 2.0, NAN, 1.0, NAN], dtype=D)
TIE_B = torch.tensor([1.0, 1.0, 1.0, 1.0, NAN, NAN], dtype=D)
case("clamp_min_scalar_ties", "clamp_min", [TIE_X.clone()], [0], [T(0), 1.0], lambda a: torch.clamp_min(a, 1.0))
case("clamp_max_scalar_ties", "clamp_max", [TIE_X.clone()], [0], [T(0), 1.0], lambda a: torch.clamp_max(a, 1.0))
case("clamp_min_tensor_ties", "clamp_min", [TIE_X.clone(), TIE_B.clone()], [0, 1], [T(0), T(1)], torch.clamp_min)
case("clamp_max_tensor_ties", "clamp_max", [TIE_X.clone(), TIE_B.clone()], [0, 1], [T(0), T(1)], torch.clamp_max)
case("clamp_min_tensor_bcast", "clamp_min", [rn(2, 3), torch.tensor(0.1, dtype=D)], [0, 1], [T(0), T(1)], torch.clamp_min)
case("clamp_min_", "clamp_min_", [TIE_X.clone()], [0], [T(0), 1.0], lambda a: a.clone().clamp_min_(1.0), prep={0: CL})
case("clamp_max__tensor", "clamp_max_", [TIE_X.clone(), TIE_B.clone()], [0, 1], [T(0), T(1)], lambda a, b: a.clone().clamp_max_(b), prep={0: CL})
case("clamp_tensor_min_only_ties", "clamp", [TIE_X.clone(), TIE_B.clone()], [0, 1], [T(0), T(1)], lambda a, b: torch.clamp(a, min=b))
case("clamp_tensor_max_only_ties", "clamp", [TIE_X.clone(), TIE_B.clone()], [0, 1], [T(0), None, T(1)], lambda a, b: torch.clamp(a, max=b))
_g = [(x, lo, hi) for x in [0.0, 1.0, 2.0, 3.0, NAN] for lo in [1.0, NAN] for hi in [2.0, 1.0, 0.0, NAN]]
case("clamp_tensor_bounds_grid", "clamp", [torch.tensor([g[i] for g in _g], dtype=D) for i in range(3)], [0, 1, 2],
     [T(0), T(1), T(2)], lambda a, lo, hi: torch.clamp(a, lo, hi))
# PyTorch's node names where they are not CamelCase(op) + "Backward0" (checked through the
# `grad_fn` list of each case): matmul/linear by rank, the 1-d pools (a squeeze of the 2-d op),
# rsub/scatter with a number, reductions over all elements, view ops, copies.
case("matmul_1d_2d", "matmul", [rn(3), rn(3, 4)], [0, 1], [T(0), T(1)], torch.matmul)
case("matmul_dot", "matmul", [rn(3), rn(3)], [0, 1], [T(0), T(1)], torch.matmul)
case("matmul_2d_1d", "matmul", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], torch.matmul)
case("matmul_3d_3d", "matmul", [rn(2, 2, 3), rn(2, 3, 4)], [0, 1], [T(0), T(1)], torch.matmul)
case("matmul_3d_1d", "matmul", [rn(2, 2, 3), rn(3)], [0, 1], [T(0), T(1)], torch.matmul)
case("linear_2d_bias", "linear", [rn(3, 4), rn(2, 4), rn(2)], [0, 1, 2], [T(0), T(1), T(2)], F.linear)
case("linear_2d", "linear", [rn(3, 4), rn(2, 4)], [0, 1], [T(0), T(1)], F.linear)
case("linear_1d", "linear", [rn(4), rn(2, 4)], [0, 1], [T(0), T(1)], F.linear)
case("linear_1d_bias", "linear", [rn(4), rn(2, 4), rn(2)], [0, 1, 2], [T(0), T(1), T(2)], F.linear)
case("linear_3d", "linear", [rn(2, 3, 4), rn(2, 4)], [0, 1], [T(0), T(1)], F.linear)
case("max_pool1d_2d_input", "max_pool1d", [rn(2, 7)], [0], [T(0), [3]], lambda x: F.max_pool1d(x, 3))
case("sum_all", "sum", [rn(2, 3)], [0], [T(0)], torch.sum)
case("mean_all", "mean", [rn(2, 3)], [0], [T(0)], torch.mean)
case("prod_all", "prod", [rn(2, 3)], [0], [T(0)], torch.prod)
case("amin", "amin", [rn(2, 3)], [0], [T(0), [1]], lambda a: a.amin(1))
case("sum_to_size", "sum_to_size", [rn(2, 3)], [0], [T(0), [1, 3]], lambda a: a.sum_to_size(1, 3))
case("rsub_scalar", "rsub", [rn(2, 3)], [0], [T(0), 1.0], lambda a: 1.0 - a)
case("rsub_tensor", "rsub", [rn(2, 3), rn(3)], [0, 1], [T(0), T(1)], lambda a, b: torch.rsub(a, b))
case("scatter_value", "scatter", [rn(2, 3)], [0], [T(0), 1, {"i": [[0], [2]]}, 1.5], lambda a: a.scatter(1, ix([[0], [2]]), 1.5))
case("scatter_src", "scatter", [rn(2, 3), rn(2, 1)], [0, 1], [T(0), 1, {"i": [[0], [2]]}, T(1)], lambda a, b: a.scatter(1, ix([[0], [2]]), b))
case("expm1", "expm1", [rn(2, 3)], [0], [T(0)], torch.expm1)
case("tan", "tan", [rn(2, 3) * 0.5], [0], [T(0)], torch.tan)
case("sign", "sign", [rn(2, 3)], [0], [T(0)], torch.sign)
case("floor", "floor", [rn(2, 3)], [0], [T(0)], torch.floor)
case("pixel_unshuffle", "pixel_unshuffle", [rn(1, 1, 4, 4)], [0], [T(0), 2], lambda a: F.pixel_unshuffle(a, 2))
case("pad_replicate", "pad", [rn(1, 3, 4)], [0], [T(0), [1, 1], "replicate"], lambda a: F.pad(a, [1, 1], "replicate"))
case("reshape", "reshape", [rn(3, 4)], [0], [T(0), [12]], lambda a: a.reshape(12))
case("flatten", "flatten", [rn(3, 4)], [0], [T(0)], torch.flatten)
case("permute", "permute", [rn(3, 4)], [0], [T(0), [1, 0]], lambda a: a.permute(1, 0))
case("transpose", "transpose", [rn(3, 4)], [0], [T(0), 0, 1], lambda a: a.transpose(0, 1))
case("t", "t", [rn(3, 4)], [0], [T(0)], torch.t)
case("select", "select", [rn(3, 4)], [0], [T(0), 0, 1], lambda a: a[1])
case("slice", "slice", [rn(3, 4)], [0], [T(0), 1, 1, 3], lambda a: a[:, 1:3])
case("narrow", "narrow", [rn(3, 4)], [0], [T(0), 1, 1, 2], lambda a: a.narrow(1, 1, 2))
case("unsqueeze", "unsqueeze", [rn(3, 4)], [0], [T(0), 0], lambda a: a.unsqueeze(0))
case("squeeze_dim", "squeeze", [rn(1, 4)], [0], [T(0), 0], lambda a: a.squeeze(0))
case("squeeze_all", "squeeze", [rn(1, 4)], [0], [T(0)], lambda a: a.squeeze())
case("expand", "expand", [rn(3, 1)], [0], [T(0), [2, 3, 4]], lambda a: a.expand(2, 3, 4))
case("contiguous_of_t", "contiguous", [rn(3, 4)], [0], [T(0)], lambda a: a.t().contiguous(), prep={0: [["t"]]})
case("masked_fill__clone", "masked_fill_", [rn(2, 3)], [0], [T(0), {"m": [True, False, True]}, 0.5],
     lambda a: a.clone().masked_fill_(mk([True, False, True], (3,)), 0.5), prep={0: CL})
case("scatter__clone", "scatter_", [rn(2, 3), rn(2, 1)], [0, 1], [T(0), 1, {"i": [[0], [2]]}, T(1)],
     lambda a, b: a.clone().scatter_(1, ix([[0], [2]]), b), prep={0: CL})
# setitem-style updates through a view (CopySlices): x[1].masked_fill_(mask, v), x[:, 1:].scatter_(...).
case("cs_select_masked_fill_", "masked_fill_", [rn(3, 4)], [0], [T(0), {"m": [True, False, False, True]}, 2.0],
     through(lambda y: y.select(0, 1), lambda v: v.masked_fill_(mk([True, False, False, True], (4,)), 2.0)),
     prep={0: [["clone"], ["select", 0, 1]]}, ret=0)
case("cs_narrow_scatter_", "scatter_", [rn(3, 4), rn(3, 1)], [0, 1], [T(0), 1, {"i": [[0], [2], [1]]}, T(1)],
     through(lambda y: y.narrow(1, 1, 3), lambda v, b: v.scatter_(1, ix([[0], [2], [1]]), b)),
     prep={0: [["clone"], ["narrow", 1, 1, 3]]}, ret=0)
case("cs_plain_base_masked_fill__tensor", "masked_fill_", [torch.zeros(3, 4, dtype=D), torch.randn((), dtype=D)], [1],
     [T(0), {"m": [True, False, True, False]}, T(1)],
     plain_base(lambda y: y.select(0, 2), lambda v, b: v.masked_fill_(mk([True, False, True, False], (4,)), b)),
     prep={0: [["alias"], ["select", 0, 2]]}, ret=0)
# index_copy (x[idx] = src along one dim): out of place, in place on a copy, through a view.
case("index_copy", "index_copy", [rn(4, 3), rn(2, 3)], [0, 1], [T(0), 0, {"i": [3, 1]}, T(1)],
     lambda a, b: a.index_copy(0, ix([3, 1]), b), second=True)
case("index_copy__clone", "index_copy_", [rn(3, 4), rn(3, 2)], [0, 1], [T(0), 1, {"i": [0, 2]}, T(1)],
     lambda a, b: a.clone().index_copy_(1, ix([0, 2]), b), prep={0: CL})
case("cs_select_index_copy_", "index_copy_", [rn(3, 4), rn(2)], [0, 1], [T(0), 0, {"i": [3, 0]}, T(1)],
     through(lambda y: y.select(0, 1), lambda v, b: v.index_copy_(0, ix([3, 0]), b)),
     prep={0: [["clone"], ["select", 0, 1]]}, ret=0)
# Random ops: names only.
case("dropout_train", "dropout", [rn(3, 4)], [0], [T(0), 0.5, True], lambda a: F.dropout(a, 0.5, True), names_only=True)
case("native_dropout", "native_dropout", [rn(3, 4)], [0], [T(0), 0.5, True], lambda a: torch.native_dropout(a, 0.5, True), names_only=True)

# index / index_put (advanced indexing, `x[i0, i1]`, `x[mask]`, `x[:, i] = v`): outputs (`values`),
# gradients and names. `{"il": [...]}` is the registry's `Tensor[] indices`; PyTorch's `None`
# entries are the `positions` keyword (the tuple position of each index tensor).
IL = lambda *xs: {"il": list(xs)}
I = lambda v: {"i": v}
M = lambda v: {"m": v}
A = torch.ops.aten
MASK34 = [[True, False, True, True], [False, False, True, False], [True, True, False, False]]
case("index_put_rows_dup", "index_put", [rn(4, 3), rn(3)], [0, 1], [T(0), IL(I([3, 1, 3])), T(1)],
     lambda a, b: a.index_put((ix([3, 1, 3]),), b), second=True, values=True)
case("index_put_accumulate", "index_put", [rn(4, 3), rn(2, 3)], [0, 1], [T(0), IL(I([[0], [2]]), I([1, 1, 0])), T(1)],
     lambda a, b: a.index_put((ix([[0], [2]]), ix([1, 1, 0])), b, accumulate=True), {"accumulate": True}, values=True)
case("index_put_nonadjacent", "index_put", [rn(2, 3, 4), rn(3)], [0, 1], [T(0), IL(I([1, 0]), I([3, -1])), T(1)],
     lambda a, b: A.index_put(a, [ix([1, 0]), None, ix([3, -1])], b), {"positions": [0, 2]}, values=True)
case("index_put_mask", "index_put", [rn(3, 4), torch.randn((), dtype=D)], [0, 1], [T(0), IL(M(MASK34)), T(1)],
     lambda a, b: a.index_put((mk(sum(MASK34, []), (3, 4)),), b), values=True)
case("index_put__clone", "index_put_", [rn(3, 4), rn(3, 1)], [0, 1], [T(0), IL(I([2, 0])), T(1)],
     lambda a, b: A.index_put_(a.clone(), [None, ix([2, 0])], b), {"positions": [1]}, prep={0: CL}, values=True)
case("cs_select_index_put_", "index_put_", [rn(3, 4), rn(2)], [0, 1], [T(0), IL(I([3, 0])), T(1)],
     through(lambda y: y.select(0, 1), lambda v, b: v.index_put_((ix([3, 0]),), b)),
     prep={0: [["clone"], ["select", 0, 1]]}, ret=0, values=True)
case("index_rows", "index", [rn(4, 3)], [0], [T(0), IL(I([2, 0, 2]))], lambda a: a[ix([2, 0, 2])], second=True, values=True)
case("index_cols_mask", "index", [rn(2, 3, 4)], [0], [T(0), IL(M([True, False, True]))],
     lambda a: a[:, mk([True, False, True], (3,))], {"positions": [1]}, values=True)
case("index_nonadjacent", "index", [rn(2, 3, 4)], [0], [T(0), IL(I([[1], [0]]), I([0, 3, 3]))],
     lambda a: a[ix([[1], [0]]), :, ix([0, 3, 3])], {"positions": [0, 2]}, values=True)
case("index_mask2d", "index", [rn(3, 4)], [0], [T(0), IL(M(MASK34))], lambda a: a[mk(sum(MASK34, []), (3, 4))], values=True)

torch.set_rng_state(_RNG)


def main():
    tensors, meta = {}, []
    for name, op, inputs, grad, args, kwargs, fn, second, prep, ret, names_only in CASES:
        xs = [x.clone().requires_grad_(i in grad) for i, x in enumerate(inputs)]
        out = fn(*xs)
        if names_only:
            all_outs = out if isinstance(out, (tuple, list)) else [out]
            for i, x in enumerate(inputs):
                tensors[f"{name}/in{i}"] = x.contiguous()
            meta.append({"name": name, "op": op, "args": args, "kwargs": kwargs, "grad": grad, "second": False,
                         "names_only": True, "grad_fn": [o.grad_fn.name() if o.grad_fn is not None else None for o in all_outs]})
            continue
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o.is_floating_point()]
        vs = [torch.randn(o.shape, dtype=D) for o in outs]
        wrt = [xs[i] for i in grad]
        gs = torch.autograd.grad(outs, wrt, vs, create_graph=second, allow_unused=True)
        for i, x in enumerate(inputs):
            tensors[f"{name}/in{i}"] = x.contiguous()
        for j, v in enumerate(vs):
            tensors[f"{name}/v{j}"] = v
        if name in VALUES:
            for j, o in enumerate(outs):
                tensors[f"{name}/out{j}"] = o.detach().clone().contiguous()
        for i, g in zip(grad, gs):
            tensors[f"{name}/grad{i}"] = (g if g is not None else torch.zeros_like(xs[i])).detach().clone().contiguous()
        if second:
            us = [torch.randn(xs[i].shape, dtype=D) for i in grad]
            pairs = [(g, u) for g, u in zip(gs, us) if g is not None and g.requires_grad]
            hv = torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs], allow_unused=True)
            for i, u, h in zip(grad, us, hv):
                tensors[f"{name}/u{i}"] = u
                tensors[f"{name}/hvp{i}"] = (h if h is not None else torch.zeros_like(xs[i])).detach().clone().contiguous()
        all_outs = out if isinstance(out, (tuple, list)) else [out]
        names = [o.grad_fn.name() if o.grad_fn is not None else None for o in all_outs]
        m = {"name": name, "op": op, "args": args, "kwargs": kwargs, "grad": grad, "second": second, "n_out": len(outs),
             "grad_fn": names}
        if prep:
            m["prep"] = {str(k): v for k, v in prep.items()}
        if ret is not None:
            m["ret"] = ret
        if name in VALUES:
            m["values"] = True
        meta.append(m)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "tests", "data", "golden_grads.safetensors")
    save_file(tensors, path, metadata={"cases": json.dumps(meta)})
    print(f"{len(meta)} cases ({sum(m['second'] for m in meta)} with second order), {len(tensors)} tensors -> {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
