"""Golden cases for the view family (ops/view.rs)."""
import torch
from golden import Case, T, V

f64 = "float64"
CASES = [
    Case("view_basic", "view", lambda x, s: x.view(s), [T((2, 3, 4)), [6, -1]]),
    Case("view_int", "view", lambda x, s: x.view(s), [T((2, 3), "int64", "int"), [3, 2]]),
    Case("reshape_noncontig", "reshape", torch.reshape, [V(T((4, 3)), ("transpose", 0, 1)), [12]]),
    Case("reshape_infer", "reshape", torch.reshape, [T((2, 3, 4), f64), [-1, 4]]),
    Case("transpose_3d", "transpose", torch.transpose, [T((2, 3, 4)), 0, 2]),
    Case("transpose_neg", "transpose", torch.transpose, [T((2, 3, 4)), -1, -2]),
    Case("t_2d", "t", torch.t, [T((2, 5))]),
    Case("t_1d", "t", torch.t, [T((5,))]),
    Case("permute", "permute", torch.permute, [T((2, 3, 4)), [2, 0, 1]]),
    Case("narrow", "narrow", torch.narrow, [T((5, 4)), 0, 1, 3]),
    Case("narrow_neg_start", "narrow", torch.narrow, [T((5, 4)), 1, -2, 2]),
    Case("select", "select", torch.select, [T((3, 4, 5)), 1, -1]),
    Case("slice_step", "slice", lambda x, d, s, e, st: torch.ops.aten.slice(x, d, s, e, st), [T((10, 3)), 0, 1, 9, 3]),
    Case("slice_clamped", "slice", lambda x, d, s, e, st: torch.ops.aten.slice(x, d, s, e, st), [T((4, 6)), 1, -4, 100, 1]),
    Case("expand", "expand", lambda x, s: x.expand(s), [T((3, 1)), [2, 3, 4]]),
    Case("expand_keep", "expand", lambda x, s: x.expand(s), [T((3, 1)), [-1, 5]]),
    Case("squeeze_all", "squeeze", torch.squeeze, [T((1, 3, 1, 2))]),
    Case("squeeze_dim", "squeeze", torch.squeeze, [T((1, 3, 1, 2)), [2]]),
    Case("unsqueeze", "unsqueeze", torch.unsqueeze, [T((3, 2)), -1]),
    Case("flatten", "flatten", torch.flatten, [T((2, 3, 4, 5)), 1, 2]),
    Case("flatten_noncontig", "flatten", torch.flatten, [V(T((3, 4)), ("transpose", 0, 1))]),
    Case("contiguous_step", "contiguous", lambda x: x.contiguous(), [V(T((8, 3)), ("slice", 0, 0, 8, 2))]),
    Case("to_f32_i64", "to", lambda x, d: x.to(d), [T((7,), "float32", "randn"), torch.int64]),
    Case("to_f32_bool", "to", lambda x, d: x.to(d), [T((7,)), torch.bool]),
    Case("to_i64_f16", "to", lambda x, d: x.to(d), [T((7,), "int64", "int"), torch.float16]),
    Case("to_f64_bf16", "to", lambda x, d: x.to(d), [T((7,), f64), torch.bfloat16]),
    Case("to_neg_f32_u8", "to", lambda x, d: x.to(d), [T((6,), "float32", "int", -3, 3), torch.uint8],
         note="negative floats to uint8 wrap via int64, as PyTorch on x86"),
    Case("unflatten", "unflatten", torch.unflatten, [T((2, 12, 3)), 1, [3, -1]]),
    Case("unflatten_last_noncontig", "unflatten", torch.unflatten, [V(T((6, 4)), ("transpose", 0, 1)), -1, [2, 3]]),
]
