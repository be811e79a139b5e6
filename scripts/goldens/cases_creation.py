"""Golden cases for factories and random ops (ops/creation.rs, random.rs). Random ops compare
shapes and dtypes only (our ChaCha stream differs from PyTorch's mt19937 by design)."""
import torch
import torch.nn.functional as F
from golden import Case, T

f64, i64 = "float64", "int64"
CASES = [
    Case("arange_end", "arange", torch.arange, [5]),
    Case("arange_start_end_step", "arange", torch.arange, [1, 10, 3]),
    Case("arange_neg_step", "arange", torch.arange, [10, 1, -2]),
    Case("arange_float", "arange", torch.arange, [0.0, 1.0, 0.1]),
    Case("arange_float_step", "arange", torch.arange, [-1, 2, 0.25]),
    Case("arange_dtype", "arange", torch.arange, [0, 7], {"dtype": torch.float64}),
    Case("arange_int_dtype", "arange", torch.arange, [2, 9, 2], {"dtype": torch.int32}),
    Case("zeros", "zeros", torch.zeros, [[2, 3]]),
    Case("zeros_int", "zeros", torch.zeros, [[4]], {"dtype": torch.int64}),
    Case("ones", "ones", torch.ones, [[2, 1, 3]]),
    Case("ones_bool", "ones", torch.ones, [[3]], {"dtype": torch.bool}),
    Case("empty_shape", "empty", torch.empty, [[2, 0, 3]]),
    Case("full_float", "full", torch.full, [[2, 3], 1.5]),
    Case("full_int", "full", torch.full, [[2, 3], 7]),
    Case("full_bool", "full", torch.full, [[2], True]),
    Case("full_dtype", "full", torch.full, [[2, 2], 3], {"dtype": torch.float64}),
    Case("eye", "eye", torch.eye, [3]),
    Case("eye_rect", "eye", torch.eye, [2, 4]),
    Case("eye_int", "eye", torch.eye, [3, 2], {"dtype": torch.int64}),
    Case("linspace", "linspace", torch.linspace, [0.0, 1.0, 7]),
    Case("linspace_odd", "linspace", torch.linspace, [-3.3, 11.7, 100]),
    Case("linspace_one", "linspace", torch.linspace, [2.0, 5.0, 1]),
    Case("linspace_f64", "linspace", torch.linspace, [0.1, 0.9, 9], {"dtype": torch.float64}),
    Case("linspace_int", "linspace", torch.linspace, [0, 10, 4], {"dtype": torch.int64}),
    Case("zeros_like", "zeros_like", torch.zeros_like, [T((2, 3), i64, "int")]),
    Case("ones_like_dtype", "ones_like", torch.ones_like, [T((2, 3))], {"dtype": torch.float64}),
    Case("full_like", "full_like", torch.full_like, [T((2, 3)), 2.5]),
    Case("full_like_int", "full_like", torch.full_like, [T((2, 3), i64, "int"), 4]),
    Case("empty_like", "empty_like", lambda x: torch.zeros_like(x), [T((3, 1))]),
    # random: shapes and dtypes
    Case("rand", "rand", torch.rand, [[3, 4]], check="meta"),
    Case("rand_f64", "rand", torch.rand, [[3]], {"dtype": torch.float64}, check="meta"),
    Case("randn", "randn", torch.randn, [[2, 5]], check="meta"),
    Case("randint", "randint", torch.randint, [10, [3, 2]], check="meta"),
    Case("randint_low", "randint.low", torch.randint, [-5, 5, [4]], check="meta"),
    Case("randperm", "randperm", torch.randperm, [6], check="meta"),
    Case("rand_like", "rand_like", torch.rand_like, [T((2, 3), f64)], check="meta"),
    Case("randn_like", "randn_like", torch.randn_like, [T((2, 3))], check="meta"),
    Case("bernoulli", "bernoulli", torch.bernoulli, [T((4, 4), "float32", "rand")], check="meta"),
    Case("bernoulli_p", "bernoulli", torch.bernoulli, [T((4, 4)), 0.3], check="meta"),
    Case("dropout", "dropout", F.dropout, [T((4, 4)), 0.5, True], check="meta"),
    Case("dropout_eval", "dropout", F.dropout, [T((4, 4)), 0.5, False]),
    Case("native_dropout", "native_dropout", torch.native_dropout, [T((4, 4)), 0.25, True], check="meta"),
    Case("uniform_", "uniform_", lambda x, a, b: x.uniform_(a, b), [T((3, 3)), -1.0, 1.0], check="meta"),
    Case("normal_", "normal_", lambda x, m, s: x.normal_(m, s), [T((3, 3), f64), 2.0, 0.5], check="meta"),
]
