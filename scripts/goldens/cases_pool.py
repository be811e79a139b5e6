"""Golden cases for pooling (ops/pool.rs)."""
import torch
import torch.nn.functional as F
from golden import Case, T, V

f64 = "float64"
A = torch.ops.aten
CASES = [
    Case("max_pool2d_basic", "max_pool2d", F.max_pool2d, [T((2, 3, 8, 8)), 2]),
    Case("max_pool2d_stride_pad", "max_pool2d", F.max_pool2d, [T((2, 3, 9, 9)), 3, 2, 1]),
    Case("max_pool2d_rect", "max_pool2d", F.max_pool2d, [T((1, 2, 9, 11)), [3, 2], [2, 3], [1, 0]]),
    Case("max_pool2d_dilation", "max_pool2d", F.max_pool2d, [T((1, 2, 11, 11)), 3, 2, 1, 2]),
    Case("max_pool2d_ceil", "max_pool2d", F.max_pool2d, [T((1, 2, 8, 8)), 3, 2, 0, 1, True]),
    Case("max_pool2d_ceil_pad", "max_pool2d", F.max_pool2d, [T((1, 2, 7, 7)), 2, 2, 1, 1, True]),
    Case("max_pool2d_unbatched", "max_pool2d", F.max_pool2d, [T((3, 6, 6)), 2]),
    Case("max_pool2d_noncontig", "max_pool2d", F.max_pool2d, [V(T((2, 3, 8, 9)), ("transpose", 2, 3)), 2]),
    Case("max_pool2d_int64", "max_pool2d", F.max_pool2d, [T((1, 2, 6, 6), "int64", "int"), 2]),
    Case("max_pool2d_u8", "max_pool2d", F.max_pool2d, [T((1, 2, 6, 6), "uint8", "int", 0, 200), 3, 1, 1]),
    Case("max_pool2d_f64", "max_pool2d", F.max_pool2d, [T((1, 2, 6, 6), f64), 2]),
    Case("max_pool2d_f16", "max_pool2d", F.max_pool2d, [T((1, 2, 6, 6), "float16"), 2]),
    Case("max_pool2d_with_indices", "max_pool2d_with_indices", A.max_pool2d_with_indices, [T((2, 3, 9, 9)), [3, 3], [2, 2], [1, 1]]),
    Case("max_pool2d_with_indices_dil_ceil", "max_pool2d_with_indices", A.max_pool2d_with_indices,
         [T((1, 2, 10, 9)), [2, 3], [2, 2], [1, 1], [2, 1], True]),
    Case("max_pool2d_with_indices_ties", "max_pool2d_with_indices", A.max_pool2d_with_indices, [T((1, 1, 4, 4), kind="const", value=1.0), [2, 2]]),
    Case("max_pool1d", "max_pool1d", F.max_pool1d, [T((2, 3, 10)), 3]),
    Case("max_pool1d_all", "max_pool1d", F.max_pool1d, [T((2, 3, 17)), 3, 2, 1, 2, True]),
    Case("max_pool1d_unbatched", "max_pool1d", F.max_pool1d, [T((3, 10)), 2]),
    Case("max_pool1d_with_indices", "max_pool1d_with_indices", lambda x, k, s, p: F.max_pool1d(x, k, s, p, return_indices=True),
         [T((2, 3, 11)), [3], [2], [1]]),
    Case("avg_pool2d_basic", "avg_pool2d", F.avg_pool2d, [T((2, 3, 8, 8)), 2]),
    Case("avg_pool2d_pad_include", "avg_pool2d", F.avg_pool2d, [T((1, 2, 7, 7)), 3, 2, 1]),
    Case("avg_pool2d_pad_exclude", "avg_pool2d", F.avg_pool2d, [T((1, 2, 7, 7)), 3, 2, 1, False, False]),
    Case("avg_pool2d_ceil", "avg_pool2d", F.avg_pool2d, [T((1, 2, 8, 8)), 3, 2, 1, True, True]),
    Case("avg_pool2d_ceil_exclude", "avg_pool2d", F.avg_pool2d, [T((1, 2, 8, 8)), 3, 2, 1, True, False]),
    Case("avg_pool2d_divisor", "avg_pool2d", F.avg_pool2d, [T((1, 2, 6, 6)), 2, 2, 0, False, True, 3]),
    Case("avg_pool2d_int", "avg_pool2d", F.avg_pool2d, [T((1, 2, 6, 6), "int64", "int", -20, 20), 2]),
    Case("avg_pool2d_noncontig", "avg_pool2d", F.avg_pool2d, [V(T((2, 3, 8, 9)), ("transpose", 2, 3)), [2, 3]]),
    Case("avg_pool2d_f64", "avg_pool2d", F.avg_pool2d, [T((1, 2, 6, 6), f64), 3, 1, 1]),
    Case("avg_pool1d", "avg_pool1d", F.avg_pool1d, [T((2, 3, 10)), 3]),
    Case("avg_pool1d_all", "avg_pool1d", F.avg_pool1d, [T((2, 3, 11)), 3, 2, 1, True, False]),
    Case("adaptive_avg_pool2d", "adaptive_avg_pool2d", F.adaptive_avg_pool2d, [T((2, 3, 7, 9)), [3, 4]]),
    Case("adaptive_avg_pool2d_1", "adaptive_avg_pool2d", F.adaptive_avg_pool2d, [T((2, 3, 7, 7)), 1]),
    Case("adaptive_avg_pool2d_up", "adaptive_avg_pool2d", F.adaptive_avg_pool2d, [T((1, 2, 3, 3)), [5, 4]]),
    Case("adaptive_avg_pool2d_unbatched", "adaptive_avg_pool2d", F.adaptive_avg_pool2d, [T((3, 10, 6)), [4, 3]]),
    Case("adaptive_avg_pool2d_noncontig", "adaptive_avg_pool2d", F.adaptive_avg_pool2d, [V(T((2, 3, 8, 9)), ("transpose", 2, 3)), [3, 3]]),
    Case("adaptive_max_pool2d", "adaptive_max_pool2d", A.adaptive_max_pool2d, [T((2, 3, 7, 9)), [3, 4]]),
    Case("adaptive_max_pool2d_up", "adaptive_max_pool2d", A.adaptive_max_pool2d, [T((1, 2, 3, 5)), [4, 7]]),
    Case("adaptive_max_pool2d_f64", "adaptive_max_pool2d", A.adaptive_max_pool2d, [T((1, 2, 6, 6), f64), [2, 2]]),
]
