"""Golden cases for the elementwise family (ops/unary.rs, binary.rs, compare.rs, inplace.rs)."""
import torch
import torch.nn.functional as F
from golden import Case, T, V

f64, i64, i32, u8, i8, f16, bf16, b = "float64", "int64", "int32", "uint8", "int8", "float16", "bfloat16", "bool"
S = (3, 4)
TR = lambda shape=(4, 3), dt="float32", kind="randn": V(T(shape, dt, kind), ("transpose", 0, 1))  # noqa: E731
STEP = lambda dt="float32", kind="randn": V(T((6, 4), dt, kind), ("slice", 0, 0, 6, 2))  # noqa: E731

CASES = []


def add(*cases):
    CASES.extend(cases)


# ---- unary: floating ops (ints promote to float32) ----
FLOATING = {
    "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "log2": torch.log2,
    "log10": torch.log10, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "atan": torch.atan, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "reciprocal": torch.reciprocal, "erf": torch.erf,
}
POSITIVE = {"log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal"}
for name, fn in FLOATING.items():
    kind = "pos" if name in POSITIVE else "randn"
    add(
        Case(f"{name}_f32", name, fn, [T(S, "float32", kind)]),
        Case(f"{name}_f64", name, fn, [T(S, f64, kind)]),
        Case(f"{name}_transposed", name, fn, [TR(kind=kind)]),
        Case(f"{name}_int", name, fn, [T((7,), i64, "int", 1, 9)]),
    )
add(
    Case("exp_bool", "exp", torch.exp, [T((5,), b, "bool")]),
    Case("sqrt_neg_int", "sqrt", torch.sqrt, [T((6,), i32, "int", -4, 4)]),
    Case("sigmoid_u8", "sigmoid", torch.sigmoid, [T((5,), u8, "int", 0, 9)]),
    Case("exp_f16", "exp", torch.exp, [T((6,), f16)], rtol=1e-3, atol=1e-3,
         note="half result rounding: both compute in f32; allow 1 half ulp"),
    Case("tanh_bf16", "tanh", torch.tanh, [T((6,), bf16)], rtol=1e-2, atol=1e-2,
         note="bfloat16 has 8 mantissa bits"),
    Case("erf_step", "erf", torch.erf, [STEP()]),
    Case("log_zero_neg", "log", torch.log, [T((5,), "float32", "int", -2, 3)]),
)

# ---- unary: activations (floating inputs only) ----
ACT = {
    "silu": F.silu, "selu": F.selu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "softsign": F.softsign,
}
for name, fn in ACT.items():
    add(
        Case(f"{name}_f32", name, fn, [T((4, 5), "float32", "randn")]),
        Case(f"{name}_wide", name, fn, [T((40,), f64, "int", -8, 8)]),
        Case(f"{name}_transposed", name, fn, [TR()]),
    )
add(
    Case("softsign_int", "softsign", F.softsign, [T((6,), i64, "int")]),
    Case("gelu_none", "gelu", F.gelu, [T((4, 5))]),
    Case("gelu_tanh", "gelu", F.gelu, [T((4, 5))], {"approximate": "tanh"}),
    Case("gelu_f64_transposed", "gelu", F.gelu, [TR(dt=f64)]),
    Case("leaky_relu_default", "leaky_relu", F.leaky_relu, [T((4, 5))]),
    Case("leaky_relu_slope", "leaky_relu", F.leaky_relu, [T((4, 5)), 0.2]),
    Case("leaky_relu_kw", "leaky_relu", F.leaky_relu, [TR()], {"negative_slope": 0.3}),
    Case("elu_default", "elu", F.elu, [T((4, 5))]),
    Case("elu_alpha", "elu", lambda x, a: F.elu(x, alpha=a), [STEP(), 0.5]),
    Case("elu_scales", "elu", torch.ops.aten.elu, [T((9,), f64), 1.5, 2.0, 0.5]),
    Case("softplus_default", "softplus", F.softplus, [T((4, 5))]),
    Case("softplus_beta_threshold", "softplus", F.softplus, [T((4, 5), "float32", "int", -6, 6), 2, 3]),
    Case("softplus_f64", "softplus", F.softplus, [T((8,), f64)], {"beta": 0.5, "threshold": 10}),
    Case("hardtanh_default", "hardtanh", F.hardtanh, [T((10,))]),
    Case("hardtanh_bounds", "hardtanh", F.hardtanh, [T((10,)), -0.5, 0.25]),
    Case("hardtanh_int", "hardtanh", F.hardtanh, [T((10,), i64, "int"), -2, 3]),
    Case("relu6", "relu6", F.relu6, [T((10,), "float32", "int", -8, 9)]),
    Case("hardswish_f16", "hardswish", F.hardswish, [T((8,), f16)], rtol=1e-3, atol=1e-3, note="half rounding"),
)

# ---- unary: dtype-preserving ----
for name, fn in {"neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "sign": torch.sign, "floor": torch.floor,
                 "ceil": torch.ceil, "trunc": torch.trunc}.items():
    add(
        Case(f"{name}_f32", name, fn, [T(S, "float32", "randn")]),
        Case(f"{name}_int", name, fn, [T((7,), i64, "int")]),
        Case(f"{name}_i8", name, fn, [T((7,), i8, "int")]),
        Case(f"{name}_transposed", name, fn, [TR(dt=f64)]),
    )
add(
    Case("neg_u8", "neg", torch.neg, [T((6,), u8, "int", 0, 9)]),
    Case("sign_bool", "sign", torch.sign, [T((6,), b, "bool")]),
    Case("abs_f16", "abs", torch.abs, [T((6,), f16)]),
    Case("round_half_even", "round", torch.round, [T((9,), "float32", "int", -4, 5)]),
    Case("round_values", "round", torch.round, [T((12,)) ]),
    Case("round_decimals", "round", torch.round, [T((12,), f64)], {"decimals": 2}),
    Case("round_neg_decimals", "round", torch.round, [T((8,), "float32", "int", -5000, 5000)], {"decimals": -2}),
    Case("round_int", "round", torch.round, [T((5,), i64, "int")]),
    Case("clamp_scalars", "clamp", torch.clamp, [T(S), -0.5, 0.5]),
    Case("clamp_min_only", "clamp", torch.clamp, [T(S), 0.1]),
    Case("clamp_max_kw", "clamp", torch.clamp, [T(S)], {"max": 0.2}),
    Case("clamp_int", "clamp", torch.clamp, [T((9,), i64, "int"), -1, 2]),
    Case("clamp_int_float_bounds", "clamp", torch.clamp, [T((9,), i64, "int"), -1.5, 2.5]),
    Case("clamp_bool_int", "clamp", torch.clamp, [T((6,), b, "bool"), 0, 1]),
    Case("clamp_min_gt_max", "clamp", torch.clamp, [T((6,)), 1.0, -1.0]),
    Case("clamp_tensors", "clamp", torch.clamp, [T((3, 4)), T((4,)), T((3, 1), "float32", "pos")]),
    Case("clamp_tensor_min", "clamp", torch.clamp, [TR(), T((3, 1))]),
    Case("clamp_tensor_promote", "clamp", torch.clamp, [T((5,), i64, "int"), T((5,), f64)]),
)

# ---- binary ----
add(
    Case("add_same", "add", torch.add, [T(S), T(S)]),
    Case("add_broadcast_alpha", "add", torch.add, [T((3, 1)), T((4,))], {"alpha": 2}),
    Case("add_transposed", "add", torch.add, [TR(), T(S)]),
    Case("add_step_expand", "add", torch.add, [STEP(), V(T((3, 1)), ("expand", [3, 4]))]),
    Case("add_int_float_scalar", "add", torch.add, [T((5,), i64, "int"), 1.5]),
    Case("add_int_int_scalar", "add", torch.add, [T((5,), i32, "int"), 7]),
    Case("add_u8_i8", "add", torch.add, [T((5,), u8, "int", 0, 9), T((5,), i8, "int")]),
    Case("add_f32_zerodim_f64", "add", torch.add, [T((5,)), T((), f64)]),
    Case("add_int_zerodim_f64", "add", torch.add, [T((5,), i64, "int"), T((), f64)]),
    Case("add_f16_f32", "add", torch.add, [T((5,), f16), T((5,))]),
    Case("add_bool_bool", "add", torch.add, [T((6,), b, "bool"), T((6,), b, "bool")]),
    Case("add_bool_int", "add", torch.add, [T((6,), b, "bool"), T((6,), i64, "int")]),
    Case("add_3d_broadcast", "add", torch.add, [T((2, 1, 4)), T((3, 1))]),
    Case("add_permuted", "add", torch.add, [V(T((2, 3, 4)), ("permute", [2, 0, 1])), T((4, 2, 3), f64)]),
    Case("add_int_alpha", "add", torch.add, [T((5,), i64, "int"), T((5,), i64, "int")], {"alpha": -3}),
    Case("add_f16", "add", torch.add, [T((7,), f16), T((7,), f16)], rtol=1e-3, atol=1e-3, note="half rounding"),
    Case("sub_broadcast_alpha", "sub", torch.sub, [T((2, 3)), T((3,))], {"alpha": 0.5}),
    Case("sub_int", "sub", torch.sub, [T((5,), i64, "int"), 3]),
    Case("sub_select", "sub", torch.sub, [V(T((3, 4)), ("select", 1, 2)), T((3,), f64)]),
    Case("rsub", "rsub", torch.rsub, [T((5,)), 2.0]),
    Case("rsub_int_alpha", "rsub", torch.rsub, [T((5,), i64, "int"), T((5,), i64, "int")], {"alpha": 2}),
    Case("mul_broadcast", "mul", torch.mul, [T((4, 1)), T((1, 5))]),
    Case("mul_int_float", "mul", torch.mul, [T((5,), i32, "int"), 2.5]),
    Case("mul_bool", "mul", torch.mul, [T((5,), b, "bool"), T((5,), b, "bool")]),
    Case("mul_transposed_both", "mul", torch.mul, [TR(), TR(dt=f64)]),
    Case("div_true", "div", torch.div, [T(S), T(S, "float32", "pos")]),
    Case("div_int_int", "div", torch.div, [T((6,), i64, "int"), T((6,), i64, "int", 1, 4)]),
    Case("div_int_scalar", "div", torch.div, [T((6,), i64, "int"), 2]),
    Case("div_trunc_int", "div", torch.div, [T((8,), i64, "int", -9, 9), T((8,), i64, "int", 1, 4)], {"rounding_mode": "trunc"}),
    Case("div_floor_int", "div", torch.div, [T((8,), i64, "int", -9, 9), -3], {"rounding_mode": "floor"}),
    Case("div_floor_float", "div", torch.div, [T((10,)), 0.7], {"rounding_mode": "floor"}),
    Case("div_trunc_float", "div", torch.div, [T((10,), f64), T((10,), f64, "pos")], {"rounding_mode": "trunc"}),
    Case("div_by_zero_float", "div", torch.div, [T((4,)), T((4,), "float32", "const")]),
    Case("div_broadcast", "div", torch.div, [TR(), T((4,), "float32", "pos")]),
    Case("pow_tensor", "pow", torch.pow, [T(S, "float32", "pos"), T(S)]),
    Case("pow_scalar_exp", "pow", torch.pow, [T(S), 3]),
    Case("pow_square", "pow", torch.pow, [TR(), 2]),
    Case("pow_half", "pow", torch.pow, [T(S, "float32", "pos"), 0.5]),
    Case("pow_int_int", "pow", torch.pow, [T((6,), i64, "int"), 3]),
    Case("pow_int_tensor_neg", "pow", torch.pow, [T((8,), i64, "int", -3, 3), T((8,), i64, "int", -2, 4)]),
    Case("pow_scalar_base", "pow", torch.pow, [2, T((6,), i64, "int", 0, 8)]),
    Case("pow_float_base", "pow", torch.pow, [2.5, T((6,))]),
    Case("pow_int_float_exp", "pow", torch.pow, [T((6,), i64, "int", 1, 9), 0.5]),
    Case("pow_bool_int", "pow", torch.pow, [T((6,), b, "bool"), 2]),
    Case("maximum", "maximum", torch.maximum, [T(S), T((4,))]),
    Case("maximum_int_float", "maximum", torch.maximum, [T((6,), i64, "int"), T((6,))]),
    Case("maximum_bool", "maximum", torch.maximum, [T((6,), b, "bool"), T((6,), b, "bool")]),
    Case("minimum_transposed", "minimum", torch.minimum, [TR(), T((3, 1), f64)]),
    Case("minimum_int", "minimum", torch.minimum, [T((6,), i32, "int"), T((6,), i64, "int")]),
    Case("remainder_float", "remainder", torch.remainder, [T((10,)), -1.5]),
    Case("remainder_tensor", "remainder", torch.remainder, [T((10,), f64), T((10,), f64, "int", 1, 4)]),
    Case("remainder_int", "remainder", torch.remainder, [T((10,), i64, "int", -9, 9), T((10,), i64, "int", 1, 4)]),
    Case("remainder_int_neg", "remainder", torch.remainder, [T((10,), i64, "int", -9, 9), -4]),
    Case("remainder_scalar_tensor", "remainder", torch.remainder, [5, T((6,), i64, "int", 1, 5)]),
    Case("remainder_float_zero", "remainder", torch.remainder, [T((4,)), 0.0]),
    Case("fmod_float", "fmod", torch.fmod, [T((10,)), -1.5]),
    Case("fmod_int", "fmod", torch.fmod, [T((10,), i64, "int", -9, 9), T((10,), i64, "int", 1, 4)]),
    Case("fmod_step", "fmod", torch.fmod, [STEP(), 0.7]),
)

# ---- comparisons, logical, where ----
for name, fn in {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}.items():
    add(
        Case(f"{name}_tensor", name, fn, [T((4, 5), "float32", "int", -2, 2), T((5,), "float32", "int", -2, 2)]),
        Case(f"{name}_scalar", name, fn, [T((9,), i64, "int", -2, 2), 0.5]),
        Case(f"{name}_int_float", name, fn, [T((9,), i64, "int", -2, 2), T((9,), "float32", "int", -2, 2)]),
        Case(f"{name}_transposed", name, fn, [TR(), T((3, 1))]),
    )
add(
    Case("eq_bool_scalar", "eq", torch.eq, [T((6,), b, "bool"), True]),
    Case("lt_u8_i8", "lt", torch.lt, [T((9,), u8, "int", 0, 4), T((9,), i8, "int", -3, 3)]),
)
for name, fn in {"logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor}.items():
    add(
        Case(f"{name}_bool", name, fn, [T((3, 4), b, "bool"), T((4,), b, "bool")]),
        Case(f"{name}_mixed", name, fn, [T((8,), i64, "int", -1, 2), T((8,), "float32", "int", -1, 2)]),
        Case(f"{name}_transposed", name, fn, [TR(dt=b, kind="bool"), T((3, 4), b, "bool")]),
    )
add(
    Case("logical_not_float", "logical_not", torch.logical_not, [T((8,), "float32", "int", -1, 2)]),
    Case("logical_not_bool_view", "logical_not", torch.logical_not, [TR(dt=b, kind="bool")]),
    Case("where_basic", "where", torch.where, [T(S, b, "bool"), T(S), T(S)]),
    Case("where_broadcast_all", "where", torch.where, [T((3, 1), b, "bool"), T((4,)), T((2, 1, 1), f64)]),
    Case("where_scalars", "where", torch.where, [T((6,), b, "bool"), 1, 0.5]),
    Case("where_int_scalars", "where", torch.where, [T((6,), b, "bool"), 1, 0]),
    Case("where_tensor_scalar", "where", torch.where, [T((6,), b, "bool"), T((6,), i64, "int"), 2.5]),
    Case("where_views", "where", torch.where, [TR(dt=b, kind="bool"), STEP(), TR()]),
    Case("where_int_float", "where", torch.where, [T((6,), b, "bool"), T((6,), i64, "int"), T((6,))]),
)

# ---- in-place (the expected value is computed on a clone; ours writes into the input) ----
add(
    Case("add__tensor", "add_", lambda x, y: x.clone().add_(y), [T(S), T((4,))]),
    Case("add__alpha", "add_", lambda x, y, alpha: x.clone().add_(y, alpha=alpha), [T(S), T(S)], {"alpha": -2}),
    Case("add__view", "add_", lambda x, y: x.clone().add_(y), [TR(), 1.5]),
    Case("add__f32_f64", "add_", lambda x, y: x.clone().add_(y), [T((5,)), T((5,), f64)]),
    Case("add__int", "add_", lambda x, y: x.clone().add_(y), [T((5,), i64, "int"), T((5,), i32, "int")]),
    Case("sub__scalar", "sub_", lambda x, y: x.clone().sub_(y), [STEP(), 0.25]),
    Case("mul__broadcast", "mul_", lambda x, y: x.clone().mul_(y), [T(S), T((3, 1))]),
    Case("mul__f16", "mul_", lambda x, y: x.clone().mul_(y), [T((6,), f16), 3.0], rtol=1e-3, atol=1e-3, note="half rounding"),
    Case("div__float", "div_", lambda x, y: x.clone().div_(y), [T(S), T(S, "float32", "pos")]),
    Case("div__floor_int", "div_", lambda x, y, rounding_mode: x.clone().div_(y, rounding_mode=rounding_mode),
         [T((8,), i64, "int", -9, 9), 2], {"rounding_mode": "floor"}),
    Case("pow__scalar", "pow_", lambda x, y: x.clone().pow_(y), [T(S, "float32", "pos"), 1.5]),
    Case("remainder__", "remainder_", lambda x, y: x.clone().remainder_(y), [T((8,)), 0.75]),
    Case("fmod__", "fmod_", lambda x, y: x.clone().fmod_(y), [T((8,), i64, "int", -9, 9), 4]),
    Case("relu__view", "relu_", lambda x: x.clone().relu_(), [TR()]),
    Case("relu__int", "relu_", lambda x: x.clone().relu_(), [T((7,), i64, "int")]),
    Case("sigmoid__", "sigmoid_", lambda x: x.clone().sigmoid_(), [T(S)]),
    Case("tanh__", "tanh_", lambda x: x.clone().tanh_(), [STEP()]),
    Case("neg__", "neg_", lambda x: x.clone().neg_(), [T((5,), i64, "int")]),
    Case("abs__", "abs_", lambda x: x.clone().abs_(), [T((5,))]),
    Case("exp__", "exp_", lambda x: x.clone().exp_(), [T((5,), f64)]),
    Case("log__", "log_", lambda x: x.clone().log_(), [T((5,), "float32", "pos")]),
    Case("log1p__", "log1p_", lambda x: x.clone().log1p_(), [T((5,), "float32", "pos")]),
    Case("sqrt__", "sqrt_", lambda x: x.clone().sqrt_(), [T((5,), "float32", "pos")]),
    Case("rsqrt__", "rsqrt_", lambda x: x.clone().rsqrt_(), [T((5,), "float32", "pos")]),
    Case("sin__", "sin_", lambda x: x.clone().sin_(), [T((5,))]),
    Case("cos__", "cos_", lambda x: x.clone().cos_(), [T((5,))]),
    Case("reciprocal__", "reciprocal_", lambda x: x.clone().reciprocal_(), [T((5,), "float32", "pos")]),
    Case("sign__", "sign_", lambda x: x.clone().sign_(), [T((5,))]),
    Case("floor__", "floor_", lambda x: x.clone().floor_(), [T((5,))]),
    Case("ceil__", "ceil_", lambda x: x.clone().ceil_(), [T((5,))]),
    Case("round__", "round_", lambda x: x.clone().round_(), [T((5,))]),
    Case("trunc__", "trunc_", lambda x: x.clone().trunc_(), [T((5,))]),
    Case("erf__", "erf_", lambda x: x.clone().erf_(), [T((5,))]),
    Case("clamp__", "clamp_", lambda x, a, b: x.clone().clamp_(a, b), [T(S), -0.3, 0.3]),
    Case("leaky_relu__", "leaky_relu_", lambda x, s: F.leaky_relu(x.clone(), s, inplace=True), [T(S), 0.1]),
    Case("elu__", "elu_", lambda x: F.elu(x.clone(), inplace=True), [T(S)]),
    Case("selu__", "selu_", lambda x: F.selu(x.clone(), inplace=True), [T(S)]),
    Case("silu__", "silu_", lambda x: F.silu(x.clone(), inplace=True), [T(S)]),
    Case("hardtanh__", "hardtanh_", lambda x, a, b: F.hardtanh(x.clone(), a, b, inplace=True), [T(S), -0.5, 0.5]),
    Case("hardswish__", "hardswish_", lambda x: F.hardswish(x.clone(), inplace=True), [T(S)]),
    Case("hardsigmoid__", "hardsigmoid_", lambda x: F.hardsigmoid(x.clone(), inplace=True), [T(S)]),
    Case("logical_not__", "logical_not_", lambda x: x.clone().logical_not_(), [T((6,), b, "bool")]),
    Case("fill__scalar", "fill_", lambda x, v: x.clone().fill_(v), [TR(), 2.5]),
    Case("fill__int_float", "fill_", lambda x, v: x.clone().fill_(v), [T((4,), i64, "int"), 2.7]),
    Case("fill__zerodim", "fill_", lambda x, v: x.clone().fill_(v), [T((4,)), T((), f64)]),
    Case("zero__", "zero_", lambda x: x.clone().zero_(), [STEP()]),
    Case("copy__broadcast", "copy_", lambda x, y: x.clone().copy_(y), [T(S), T((4,), i64, "int")]),
    Case("copy__float_to_int", "copy_", lambda x, y: x.clone().copy_(y), [T((6,), i64, "int"), T((6,), "float32", "randn")]),
    Case("copy__transposed_src", "copy_", lambda x, y: x.clone().copy_(y), [T(S), TR(dt=f64)]),
)
