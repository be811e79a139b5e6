"""Golden cases for embedding (ops/embedding.rs)."""
import torch
import torch.nn.functional as F
from golden import Case, T, V

CASES = [
    Case("embedding", "embedding", F.embedding, [T((2, 5), "int64", "int", 0, 10), T((10, 4))]),
    Case("embedding_i32", "embedding", F.embedding, [T((7,), "int32", "int", 0, 6), T((6, 3))]),
    Case("embedding_scalar_index", "embedding", F.embedding, [T((), "int64", "int", 0, 6), T((6, 3))]),
    Case("embedding_padding_idx", "embedding", F.embedding, [T((3, 4), "int64", "int", 0, 5), T((5, 2)), 0]),
    Case("embedding_int_table", "embedding", F.embedding, [T((4,), "int64", "int", 0, 5), T((5, 3), "int64", "int")]),
    Case("embedding_f64", "embedding", F.embedding, [T((4,), "int64", "int", 0, 5), T((5, 3), "float64")]),
    Case("embedding_noncontig_weight", "embedding", F.embedding, [T((4,), "int64", "int", 0, 5), V(T((3, 5)), ("transpose", 0, 1))]),
    Case("embedding_noncontig_idx", "embedding", F.embedding, [V(T((4, 3), "int64", "int", 0, 5), ("transpose", 0, 1)), T((5, 2))]),
]
