"""Golden cases for joining, indexing and padding (ops/join.rs, index.rs, shape_misc.rs)."""
import torch
import torch.nn.functional as F
from golden import Case, T, V

f64, i64, i32 = "float64", "int64", "int32"
TR = ("transpose", 0, 1)


def idx(shape, high, low=0):
    return T(shape, i64, "int", low, high)


CASES = [
    # cat / stack
    Case("cat_dim0", "cat", torch.cat, [[T((2, 3)), T((4, 3))]]),
    Case("cat_dim1", "cat", torch.cat, [[T((2, 3)), T((2, 1)), T((2, 5))], 1]),
    Case("cat_neg_dim", "cat", torch.cat, [[T((2, 3, 2)), T((2, 3, 4))], -1]),
    Case("cat_promote", "cat", torch.cat, [[T((2, 3), i64, "int"), T((1, 3)), T((2, 3), f64)]]),
    Case("cat_noncontig", "cat", torch.cat, [[V(T((3, 2)), TR), V(T((4, 3)), ("slice", 0, 0, 4, 2))], 1]),
    Case("cat_legacy_empty", "cat", torch.cat, [[T((0,)), T((2, 3))]]),
    Case("cat_bool", "cat", torch.cat, [[T((2,), "bool", "bool"), T((3,), "bool", "bool")]]),
    Case("stack_dim0", "stack", torch.stack, [[T((2, 3)), T((2, 3)), T((2, 3))]]),
    Case("stack_last", "stack", torch.stack, [[T((2, 3)), V(T((3, 2)), TR)], -1]),
    Case("stack_mid_int", "stack", torch.stack, [[T((2, 3), i32, "int"), T((2, 3), i32, "int")], 1]),
    # split / chunk / unbind
    Case("split", "split", torch.split, [T((7, 3)), 3]),
    Case("split_dim1", "split", torch.split, [T((2, 5)), 2, 1]),
    Case("split_with_sizes", "split_with_sizes", torch.split, [T((2, 6)), [1, 2, 3], 1]),
    Case("chunk", "chunk", torch.chunk, [T((7, 3)), 3]),
    Case("chunk_dim1_transposed", "chunk", torch.chunk, [V(T((6, 4)), TR), 2, 1]),
    Case("unbind", "unbind", torch.unbind, [T((3, 2))]),
    Case("unbind_dim1", "unbind", torch.unbind, [T((2, 3, 2)), 1]),
    # gather / scatter / index_select
    Case("gather_dim1", "gather", torch.gather, [T((3, 5)), 1, idx((3, 4), 5)]),
    Case("gather_dim0", "gather", torch.gather, [T((4, 3)), 0, idx((2, 3), 4)]),
    Case("gather_smaller", "gather", torch.gather, [T((4, 5, 6)), 2, idx((2, 3, 8), 6)]),
    Case("gather_transposed", "gather", torch.gather, [V(T((5, 3)), TR), 1, idx((3, 2), 5)]),
    Case("gather_int", "gather", torch.gather, [T((3, 5), i64, "int"), 1, idx((3, 2), 5)]),
    Case("scatter_src", "scatter", torch.scatter, [T((3, 5)), 1, idx((3, 2), 5), T((3, 4))]),
    Case("scatter_value", "scatter", torch.scatter, [T((3, 5)), 0, idx((2, 5), 3), 7.5]),
    Case("scatter_add_reduce", "scatter", torch.scatter, [T((3, 5)), 1, idx((3, 4), 5), T((3, 4))], {"reduce": "add"}),
    Case("scatter_mul_reduce", "scatter", torch.scatter, [T((3, 5)), 1, idx((3, 4), 5), T((3, 4))], {"reduce": "multiply"}),
    Case("scatter_transposed_src", "scatter", torch.scatter, [T((4, 4)), 1, idx((4, 2), 4), V(T((3, 4)), TR)]),
    Case("scatter_add", "scatter_add", torch.scatter_add, [T((3, 5)), 1, idx((3, 6), 5), T((3, 6))]),
    Case("scatter_add_dim0_f64", "scatter_add", torch.scatter_add, [T((4, 3), f64), 0, idx((5, 3), 4), T((5, 3), f64)]),
    Case("scatter_add_int", "scatter_add", torch.scatter_add, [T((4, 3), i64, "int"), 0, idx((5, 3), 4), T((5, 3), i64, "int")]),
    Case("index_select_dim0", "index_select", torch.index_select, [T((5, 3)), 0, idx((4,), 5)]),
    Case("index_select_dim1", "index_select", torch.index_select, [T((2, 5, 3)), 1, idx((7,), 5)]),
    Case("index_select_i32", "index_select", torch.index_select, [T((5, 3)), 1, T((2,), i32, "int", 0, 3)]),
    Case("index_select_transposed", "index_select", torch.index_select, [V(T((5, 3)), TR), 1, idx((3,), 5)]),
    # masked_fill / masked_select
    Case("masked_fill", "masked_fill", torch.masked_fill, [T((3, 4)), T((3, 4), "bool", "bool"), -1.5]),
    Case("masked_fill_broadcast", "masked_fill", torch.masked_fill, [T((3, 4)), T((4,), "bool", "bool"), 2.0]),
    Case("masked_fill_tensor_value", "masked_fill", torch.masked_fill, [T((3, 4)), T((3, 1), "bool", "bool"), T((), "float32", "const", value=9.0)]),
    Case("masked_fill_int", "masked_fill", torch.masked_fill, [T((3, 4), i64, "int"), T((3, 4), "bool", "bool"), 7]),
    Case("masked_fill_transposed", "masked_fill", torch.masked_fill, [V(T((4, 3)), TR), T((3, 4), "bool", "bool"), 0.0]),
    Case("masked_select", "masked_select", torch.masked_select, [T((3, 4)), T((3, 4), "bool", "bool")]),
    Case("masked_select_broadcast", "masked_select", torch.masked_select, [T((3, 4)), T((4,), "bool", "bool")]),
    # pad / one_hot / pixel_shuffle
    Case("pad_constant", "pad", F.pad, [T((2, 3)), [1, 2]]),
    Case("pad_constant_2d_value", "pad", F.pad, [T((1, 2, 3, 4)), [1, 0, 2, 1]], {"value": 3.5}),
    Case("pad_constant_negative", "pad", F.pad, [T((2, 5)), [-1, 2, 0, -1]]),
    Case("pad_reflect_1d", "pad", F.pad, [T((1, 2, 5)), [2, 3], "reflect"]),
    Case("pad_reflect_2d", "pad", F.pad, [T((1, 2, 4, 5)), [1, 2, 3, 1], "reflect"]),
    Case("pad_replicate_2d", "pad", F.pad, [T((1, 2, 3, 4)), [2, 1, 0, 3], "replicate"]),
    Case("pad_replicate_3d", "pad", F.pad, [T((1, 1, 2, 3, 2)), [1, 1, 2, 0, 1, 1], "replicate"]),
    Case("pad_circular", "pad", F.pad, [T((1, 2, 5)), [2, 1], "circular"]),
    Case("pad_reflect_transposed", "pad", F.pad, [V(T((5, 2)), TR), [2, 2], "reflect"]),
    Case("pad_int", "pad", F.pad, [T((2, 3), i64, "int"), [1, 1, 1, 1]], {"value": 4.0}),
    Case("one_hot", "one_hot", F.one_hot, [idx((5,), 4), 6]),
    Case("one_hot_infer", "one_hot", F.one_hot, [idx((2, 3), 5)]),
    Case("pixel_shuffle", "pixel_shuffle", F.pixel_shuffle, [T((2, 8, 3, 4)), 2]),
    Case("pixel_shuffle_3d", "pixel_shuffle", F.pixel_shuffle, [T((9, 2, 3)), 3]),
    Case("pixel_unshuffle", "pixel_unshuffle", F.pixel_unshuffle, [T((2, 2, 6, 4)), 2]),
]
