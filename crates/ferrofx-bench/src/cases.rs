//! The benchmark cases. Each has an id shared with the reference script
//! (`scripts/bench_reference.py`), so both sides run the same workload.

use ferrofx_core::op::{self, CallKind};
use ferrofx_core::{Result, Tensor, Value};

/// A closure that runs one timed call.
pub type Runner = Box<dyn FnMut()>;

/// What a case measures.
pub struct Case {
    /// Stable id, shared with the reference script.
    pub id: &'static str,
    /// Group (issue area): `kernels`, `autograd`, `nn`, `fx`, ...
    pub group: &'static str,
    /// One line for the table.
    pub what: &'static str,
    /// Work per call for throughput columns: (amount, unit), e.g. (2·n³, "GFLOP/s").
    pub work: Option<(f64, &'static str)>,
    /// Calls per timing sample (tiny ops are batched).
    pub inner: usize,
    /// Builds the closure to time.
    pub setup: fn() -> Result<Runner>,
}

/// Deterministic pseudo-random f32 data in [-1, 1) (no dependency on the random ops).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A tensor of `shape` with [`data`].
pub fn tensor(shape: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::from_vec(data(shape.iter().product(), seed), shape)
}

fn call(name: &str, args: Vec<Value>) -> Result<()> {
    op::call(name, args, vec![]).map(|_| ())
}

fn matmul_1024() -> Result<Runner> {
    let a = tensor(&[1024, 1024], 1)?;
    let b = tensor(&[1024, 1024], 2)?;
    call("matmul", vec![(&a).into(), (&b).into()])?;
    Ok(Box::new(move || {
        let _ = op::call("matmul", vec![(&a).into(), (&b).into()], vec![]);
    }))
}

fn add_16m() -> Result<Runner> {
    let a = tensor(&[16 << 20], 1)?;
    let b = tensor(&[16 << 20], 2)?;
    call("add", vec![(&a).into(), (&b).into()])?;
    Ok(Box::new(move || {
        let _ = op::call("add", vec![(&a).into(), (&b).into()], vec![]);
    }))
}

fn add_inplace_16m() -> Result<Runner> {
    let a = tensor(&[16 << 20], 1)?;
    let b = tensor(&[16 << 20], 2)?;
    call("add_", vec![(&a).into(), (&b).into()])?;
    Ok(Box::new(move || {
        let _ = op::call("add_", vec![(&a).into(), (&b).into()], vec![]);
    }))
}

fn add_tiny() -> Result<Runner> {
    let a = Tensor::from_vec(vec![1.0f32], &[1])?;
    let b = Tensor::from_vec(vec![2.0f32], &[1])?;
    let add = op::require("add")?;
    let args = [Value::from(&a), Value::from(&b), Value::Int(1)];
    op::dispatch(add, CallKind::Method, &args)?;
    Ok(Box::new(move || {
        let _ = op::dispatch(add, CallKind::Method, &args);
    }))
}

macro_rules! conv_case {
    ($fn:ident, $n:expr, $cin:expr, $cout:expr, $hw:expr, $k:expr, $s:expr, $p:expr) => {
        fn $fn() -> Result<Runner> {
            let x = tensor(&[$n, $cin, $hw, $hw], 1)?;
            let w = tensor(&[$cout, $cin, $k, $k], 2)?;
            let args = move || {
                vec![
                    Value::from(&x),
                    Value::from(&w),
                    Value::None,
                    Value::Ints(vec![$s, $s]),
                    Value::Ints(vec![$p, $p]),
                ]
            };
            call("conv2d", args())?;
            Ok(Box::new(move || {
                let _ = op::call("conv2d", args(), vec![]);
            }))
        }
    };
}
conv_case!(conv_r18_conv1_b1, 1, 3, 64, 224, 7, 2, 3);
conv_case!(conv_r18_l1_b1, 1, 64, 64, 56, 3, 1, 1);
conv_case!(conv_r18_l2_b1, 1, 128, 128, 28, 3, 1, 1);
conv_case!(conv_r18_l3_b1, 1, 256, 256, 14, 3, 1, 1);
conv_case!(conv_r18_l4_b1, 1, 512, 512, 7, 3, 1, 1);
conv_case!(conv_r18_l1_b8, 8, 64, 64, 56, 3, 1, 1);
conv_case!(conv_r18_down_b8, 8, 128, 256, 28, 1, 2, 0);

fn conv_flops(n: f64, cin: f64, cout: f64, hw_out: f64, k: f64) -> f64 {
    2.0 * n * cout * hw_out * hw_out * cin * k * k
}

/// Every case, in table order.
pub fn all() -> Vec<Case> {
    vec![
        Case {
            id: "matmul_1024_f32",
            group: "kernels",
            what: "matmul 1024x1024 @ 1024x1024 f32",
            work: Some((2.0 * 1024f64.powi(3), "GFLOP/s")),
            inner: 1,
            setup: matmul_1024,
        },
        Case {
            id: "add_16m_f32",
            group: "kernels",
            what: "add 16M f32, result allocated on both sides",
            work: Some((3.0 * 4.0 * (16u64 << 20) as f64, "GB/s")),
            inner: 1,
            setup: add_16m,
        },
        Case {
            id: "add_inplace_16m_f32",
            group: "kernels",
            what: "add_ 16M f32 in place",
            work: Some((3.0 * 4.0 * (16u64 << 20) as f64, "GB/s")),
            inner: 1,
            setup: add_inplace_16m,
        },
        Case {
            id: "add_tiny_f32",
            group: "kernels",
            what: "add of 1-element tensors (per-op overhead)",
            work: None,
            inner: 10_000,
            setup: add_tiny,
        },
        Case {
            id: "conv2d_r18_conv1_b1",
            group: "kernels",
            what: "conv2d 7x7/2 3->64 @224, batch 1",
            work: Some((conv_flops(1.0, 3.0, 64.0, 112.0, 7.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_conv1_b1,
        },
        Case {
            id: "conv2d_r18_l1_b1",
            group: "kernels",
            what: "conv2d 3x3 64->64 @56, batch 1",
            work: Some((conv_flops(1.0, 64.0, 64.0, 56.0, 3.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_l1_b1,
        },
        Case {
            id: "conv2d_r18_l2_b1",
            group: "kernels",
            what: "conv2d 3x3 128->128 @28, batch 1",
            work: Some((conv_flops(1.0, 128.0, 128.0, 28.0, 3.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_l2_b1,
        },
        Case {
            id: "conv2d_r18_l3_b1",
            group: "kernels",
            what: "conv2d 3x3 256->256 @14, batch 1",
            work: Some((conv_flops(1.0, 256.0, 256.0, 14.0, 3.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_l3_b1,
        },
        Case {
            id: "conv2d_r18_l4_b1",
            group: "kernels",
            what: "conv2d 3x3 512->512 @7, batch 1",
            work: Some((conv_flops(1.0, 512.0, 512.0, 7.0, 3.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_l4_b1,
        },
        Case {
            id: "conv2d_r18_l1_b8",
            group: "kernels",
            what: "conv2d 3x3 64->64 @56, batch 8",
            work: Some((conv_flops(8.0, 64.0, 64.0, 56.0, 3.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_l1_b8,
        },
        Case {
            id: "conv2d_r18_down_b8",
            group: "kernels",
            what: "conv2d 1x1/2 128->256 @28, batch 8",
            work: Some((conv_flops(8.0, 128.0, 256.0, 14.0, 1.0), "GFLOP/s")),
            inner: 1,
            setup: conv_r18_down_b8,
        },
    ]
}
