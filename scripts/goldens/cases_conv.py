"""Golden cases for convolutions (ops/conv.rs): conv1d, conv2d, conv_transpose2d."""
import torch
import torch.nn.functional as F
from golden import Case, T, V

f64 = "float64"
R = dict(rtol=1e-4, atol=1e-5, note="f32 sums over C*kH*kW terms in a different order than oneDNN")
CASES = [
    Case("conv2d_basic", "conv2d", F.conv2d, [T((2, 3, 8, 8)), T((4, 3, 3, 3))], **R),
    Case("conv2d_bias_pad", "conv2d", F.conv2d, [T((2, 3, 8, 8)), T((4, 3, 3, 3)), T((4,)), 1, 1], **R),
    Case("conv2d_stride", "conv2d", F.conv2d, [T((2, 3, 9, 10)), T((4, 3, 3, 3)), T((4,)), 2, 1], **R),
    Case("conv2d_stride_tuple", "conv2d", F.conv2d, [T((1, 3, 9, 10)), T((4, 3, 3, 2)), None, [2, 3], [1, 0]], **R),
    Case("conv2d_dilation", "conv2d", F.conv2d, [T((1, 2, 12, 12)), T((3, 2, 3, 3)), None, 1, 2, 2], **R),
    Case("conv2d_dilation_stride", "conv2d", F.conv2d, [T((1, 2, 13, 12)), T((3, 2, 3, 3)), None, 2, 1, [2, 1]], **R),
    Case("conv2d_groups", "conv2d", F.conv2d, [T((2, 4, 8, 8)), T((6, 2, 3, 3)), T((6,)), 1, 1, 1, 2], **R),
    Case("conv2d_depthwise", "conv2d", F.conv2d, [T((2, 4, 8, 8)), T((4, 1, 3, 3)), T((4,)), 1, 1, 1, 4], **R),
    Case("conv2d_pointwise", "conv2d", F.conv2d, [T((2, 8, 5, 5)), T((6, 8, 1, 1)), T((6,))], **R),
    Case("conv2d_pointwise_stride", "conv2d", F.conv2d, [T((2, 8, 7, 7)), T((6, 8, 1, 1)), None, 2], **R),
    Case("conv2d_same", "conv2d", F.conv2d, [T((1, 3, 9, 9)), T((4, 3, 3, 3)), T((4,)), 1, "same"], **R),
    Case("conv2d_same_even", "conv2d", F.conv2d, [T((1, 3, 9, 8)), T((4, 3, 4, 2)), None, 1, "same"], **R),
    Case("conv2d_same_dilated", "conv2d", F.conv2d, [T((1, 3, 10, 10)), T((4, 3, 2, 3)), None, 1, "same", 2], **R),
    Case("conv2d_valid", "conv2d", F.conv2d, [T((1, 3, 9, 9)), T((4, 3, 3, 3)), None, 1, "valid"], **R),
    Case("conv2d_large_shifted", "conv2d", F.conv2d, [T((2, 6, 33, 32)), T((8, 6, 3, 3)), T((8,)), 1, 1], **R),
    Case("conv2d_large_shifted_dil", "conv2d", F.conv2d, [T((1, 4, 36, 36)), T((6, 2, 3, 5)), None, 1, [2, 3], [2, 1], 2], **R),
    Case("conv2d_large_im2col", "conv2d", F.conv2d, [T((2, 16, 20, 20)), T((16, 16, 3, 3)), T((16,)), 1, 1], **R),
    Case("conv2d_7x7_s2", "conv2d", F.conv2d, [T((1, 3, 32, 32)), T((8, 3, 7, 7)), None, 2, 3], **R),
    Case("conv2d_asym_pad", "conv2d", F.conv2d, [T((1, 2, 10, 11)), T((3, 2, 3, 5)), None, 1, [0, 2]], **R),
    Case("conv2d_unbatched", "conv2d", F.conv2d, [T((3, 8, 8)), T((4, 3, 3, 3)), T((4,)), 1, 1], **R),
    Case("conv2d_noncontig_input", "conv2d", F.conv2d, [V(T((2, 3, 8, 9)), ("transpose", 2, 3)), T((4, 3, 3, 3))], **R),
    Case("conv2d_noncontig_weight", "conv2d", F.conv2d, [T((2, 3, 8, 8)), V(T((4, 3, 3, 3)), ("transpose", 2, 3))], **R),
    Case("conv2d_f64", "conv2d", F.conv2d, [T((2, 3, 8, 8), f64), T((4, 3, 3, 3), f64), T((4,), f64), 1, 1]),
    Case("conv2d_int64", "conv2d", F.conv2d, [T((1, 2, 5, 5), "int64", "int"), T((3, 2, 3, 3), "int64", "int"), None, 1, 1]),
    Case("conv2d_f16", "conv2d", F.conv2d, [T((1, 2, 6, 6), "float16"), T((3, 2, 3, 3), "float16")], rtol=1e-2, atol=1e-2,
         note="f16 computed in f32 and rounded once"),
    Case("conv2d_bf16", "conv2d", F.conv2d, [T((1, 2, 6, 6), "bfloat16"), T((3, 2, 3, 3), "bfloat16")], rtol=2e-2, atol=2e-2,
         note="bf16 computed in f32 and rounded once"),
    Case("conv1d_basic", "conv1d", F.conv1d, [T((2, 3, 10)), T((4, 3, 3)), T((4,))], **R),
    Case("conv1d_stride_pad_dil", "conv1d", F.conv1d, [T((2, 3, 17)), T((4, 3, 3)), None, 2, 2, 2], **R),
    Case("conv1d_groups", "conv1d", F.conv1d, [T((2, 4, 10)), T((6, 2, 3)), None, 1, 1, 1, 2], **R),
    Case("conv1d_same", "conv1d", F.conv1d, [T((2, 3, 10)), T((4, 3, 4)), None, 1, "same"], **R),
    Case("conv1d_unbatched", "conv1d", F.conv1d, [T((3, 10)), T((4, 3, 3))], **R),
    Case("conv_transpose2d_basic", "conv_transpose2d", F.conv_transpose2d, [T((2, 4, 5, 5)), T((4, 3, 3, 3)), T((3,))], **R),
    Case("conv_transpose2d_stride", "conv_transpose2d", F.conv_transpose2d, [T((2, 4, 5, 6)), T((4, 3, 3, 3)), None, 2, 1, 1], **R),
    Case("conv_transpose2d_groups_dil", "conv_transpose2d", F.conv_transpose2d,
         [T((1, 4, 5, 5)), T((4, 2, 3, 2)), T((4,)), [2, 1], [1, 0], [1, 0], 2, [1, 2]], **R),
    Case("conv_transpose2d_unbatched", "conv_transpose2d", F.conv_transpose2d, [T((4, 5, 5)), T((4, 3, 2, 2)), None, 2], **R),
    Case("conv_transpose2d_f64", "conv_transpose2d", F.conv_transpose2d, [T((1, 2, 4, 4), f64), T((2, 3, 3, 3), f64), None, 2, 1]),
]
