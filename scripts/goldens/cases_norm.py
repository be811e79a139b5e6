"""Golden cases for normalisations (ops/norm.rs)."""
import torch
import torch.nn.functional as F
from golden import Case, T, V

f64 = "float64"
R = dict(rtol=1e-5, atol=1e-5)
pos = lambda shape, dt="float32": T(shape, dt, "pos")
CASES = [
    Case("batch_norm_eval", "batch_norm", F.batch_norm, [T((2, 3, 4, 4)), T((3,)), pos((3,)), T((3,)), T((3,))], **R),
    Case("batch_norm_eval_noaffine", "batch_norm", F.batch_norm, [T((4, 3)), T((3,)), pos((3,))], **R),
    Case("batch_norm_train", "batch_norm", lambda *a, **k: F.batch_norm(*a, **k),
         [T((4, 3, 5, 5)), T((3,)), pos((3,)), T((3,)), T((3,)), True, 0.2, 1e-3], **R),
    Case("batch_norm_train_nostats", "batch_norm", F.batch_norm, [T((4, 3, 5)), None, None, None, None, True], **R),
    Case("batch_norm_noncontig", "batch_norm", F.batch_norm, [V(T((3, 2, 6)), ("transpose", 0, 1)), None, None, T((3,)), None, True], **R),
    Case("batch_norm_f64", "batch_norm", F.batch_norm, [T((4, 3, 5), f64), T((3,), f64), pos((3,), f64), None, None, True]),
    Case("batch_norm_f16", "batch_norm", F.batch_norm, [T((4, 3, 5), "float16"), T((3,)), pos((3,))], rtol=1e-2, atol=1e-2,
         note="f16 input with f32 statistics (PyTorch's mixed precision rule); computed in f32"),
    Case("layer_norm", "layer_norm", F.layer_norm, [T((2, 3, 8)), [8], T((8,)), T((8,))], **R),
    Case("layer_norm_2d_shape", "layer_norm", F.layer_norm, [T((2, 3, 4, 5)), [4, 5], T((4, 5)), T((4, 5)), 1e-3], **R),
    Case("layer_norm_noaffine", "layer_norm", F.layer_norm, [T((5, 7)), [7]], **R),
    Case("layer_norm_noncontig", "layer_norm", F.layer_norm, [V(T((8, 4)), ("transpose", 0, 1)), [8], T((8,))], **R),
    Case("layer_norm_f64", "layer_norm", F.layer_norm, [T((3, 6), f64), [6], T((6,), f64), T((6,), f64)]),
    Case("layer_norm_bf16", "layer_norm", F.layer_norm, [T((3, 6), "bfloat16"), [6]], rtol=2e-2, atol=2e-2,
         note="bf16 computed in f32 and rounded once"),
    Case("group_norm", "group_norm", F.group_norm, [T((2, 6, 4, 4)), 3, T((6,)), T((6,))], **R),
    Case("group_norm_noaffine", "group_norm", F.group_norm, [T((2, 6, 5)), 2], **R),
    Case("group_norm_one_group", "group_norm", F.group_norm, [T((2, 4, 3, 3)), 1, T((4,)), None, 1e-3], **R),
    Case("group_norm_2d", "group_norm", F.group_norm, [T((3, 8)), 4], **R),
    Case("group_norm_noncontig", "group_norm", F.group_norm, [V(T((2, 4, 6, 5)), ("transpose", 2, 3)), 2, T((4,)), T((4,))], **R),
    Case("group_norm_f64", "group_norm", F.group_norm, [T((2, 4, 5), f64), 2, T((4,), f64), T((4,), f64)]),
]
