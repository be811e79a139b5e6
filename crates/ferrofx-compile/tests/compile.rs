//! Issue 18, acceptance 1 and 4: fusion rules, memory-plan validity and compiled = eager on
//! every zoo model, the shape cache, a property test of random elementwise graphs against the
//! unfused Interpreter, and the save/load round trip of a compiled module.

use ferrofx_compile::fusion::{fuse_elementwise, plan_fusion};
use ferrofx_compile::memory::plan_memory;
use ferrofx_compile::{compile, CompileOptions};
use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{DType, Result, Tensor, Value};
use ferrofx_fx::interpreter::DefaultInterpreter;
use ferrofx_fx::{trace_with_inputs, Argument, Graph, GraphModule, Interpreter, Opcode, ShapeProp, Target};
use ferrofx_nn::zoo::{DigitsCnn, Mlp};
use ferrofx_nn::Module;
use indexmap::IndexMap;
use proptest::prelude::*;

static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// max |a - b| / max(|a|, 1e-3), NaNs required at the same places.
fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let (a, b) = (f32s(a), f32s(b));
    let scale = a.iter().filter(|v| v.is_finite()).fold(1e-3f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(&b) {
        if x.is_nan() || y.is_nan() {
            assert!(x.is_nan() && y.is_nan(), "NaN mismatch: {x} vs {y}");
        } else if x.is_infinite() || y.is_infinite() {
            assert_eq!(x, y);
        } else {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    worst
}

fn fused_nodes(gm: &GraphModule) -> Vec<(String, String)> {
    gm.graph()
        .iter()
        .filter(|n| n.op() == Opcode::CallFunction && n.target().name() == "fused_elementwise")
        .map(|n| {
            let expr = match &n.args()[1] {
                Argument::Str(s) => s.to_string(),
                other => panic!("expr argument is {other:?}"),
            };
            (n.name().to_string(), expr)
        })
        .collect()
}

/// The `conv2d_fused` nodes: (name, has a residual, activation).
fn conv_epilogues(gm: &GraphModule) -> ConvEpilogues {
    gm.graph()
        .iter()
        .filter(|n| n.op() == Opcode::CallFunction && matches!(n.target().name(), "conv2d_fused" | "nchwc_conv2d"))
        .map(|n| {
            let act = match &n.args()[8] {
                Argument::Str(s) => s.to_string(),
                other => panic!("activation argument is {other:?}"),
            };
            (n.name().to_string(), n.args()[7].as_node().is_some(), act)
        })
        .collect()
}

fn ops_left(gm: &GraphModule) -> Vec<String> {
    gm.graph()
        .iter()
        .filter(|n| matches!(n.op(), Opcode::CallFunction | Opcode::CallMethod))
        .map(|n| n.target().name().to_string())
        .collect()
}

/// A module from a function of its one input.
#[derive(ferrofx_nn::Module)]
struct Fn1 {
    #[module(skip)]
    f: fn(&Tensor) -> Result<Tensor>,
}
impl Module for Fn1 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (self.f)(x)
    }
}
fn fn1(f: fn(&Tensor) -> Result<Tensor>) -> Fn1 {
    Fn1 { f }
}

/// A module from a function of two inputs.
#[derive(ferrofx_nn::Module)]
struct Fn2 {
    #[module(skip)]
    f: fn(&Tensor, &Tensor) -> Result<Tensor>,
}
fn fn2(f: fn(&Tensor, &Tensor) -> Result<Tensor>) -> Fn2 {
    Fn2 { f }
}
impl Module for Fn2 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (self.f)(x, x)
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        match inputs {
            [Value::Tensor(a), Value::Tensor(b)] => Ok(vec![Value::Tensor((self.f)(a, b)?)]),
            _ => Err(ferrofx_core::Error::argument("Fn2", "expected two tensors")),
        }
    }
}

/// Traces `m` with `inputs`, fuses, and checks the fused module equals eager bit for bit.
fn fuse_and_check(m: &dyn Module, inputs: &[Value]) -> GraphModule {
    let mut gm = trace_with_inputs(m, inputs).unwrap();
    let want = m.forward_values(inputs).unwrap();
    fuse_elementwise(&mut gm).unwrap();
    gm.graph().lint().unwrap();
    let got = gm.forward_values(inputs).unwrap();
    for (w, g) in want.iter().zip(&got) {
        let (w, g) = (w.as_tensor().unwrap(), g.as_tensor().unwrap());
        assert_eq!(max_rel_diff(w, g), 0.0, "fused result differs from eager\n{}", gm.graph());
    }
    gm
}

#[test]
fn seed003_chains_become_one_node() {
    let _s = serial();
    manual_seed(1);
    let x = randn(&[3, 17, 40], None).unwrap();
    let y = randn(&[3, 17, 40], None).unwrap();
    let gm = fuse_and_check(&fn1(|x| ((x + 1.0)? * 2.0)?.relu()), &[(&x).into()]);
    assert_eq!(ops_left(&gm), ["fused_elementwise"]);
    let printed = gm.graph().to_string();
    assert!(printed.contains("%fused_add_mul_relu"), "{printed}");
    assert!(printed.contains("t0 = add(x0, 1.0); t1 = mul(t0, 2.0); t2 = relu(t1)"), "{printed}");
    assert!(gm.code().unwrap().contains("fused_elementwise"));

    let gm = fuse_and_check(&fn2(|x, y| (x + (y * 2.0)?)?.relu()), &[(&x).into(), (&y).into()]);
    let fused = fused_nodes(&gm);
    assert_eq!(fused.len(), 1);
    assert_eq!(fused[0].1, "t0 = mul(x0, 2.0); t1 = add(x1, t0); t2 = relu(t1)");
}

#[test]
fn a_value_used_outside_the_group_stays_a_boundary() {
    let _s = serial();
    let x = randn(&[8, 33], None).unwrap();
    // a = x + 1 is used by the chain and by the final mul: a stays materialised when the
    // second user is not in the group; here both users are in one group, so it fuses
    let gm = fuse_and_check(
        &fn1(|x| {
            let a = (x + 1.0)?;
            let b = a.sigmoid()?;
            &a * &b
        }),
        &[(&x).into()],
    );
    assert_eq!(ops_left(&gm), ["fused_elementwise"]);

    // a used by two separate chains that end in different outputs-of-matmul: a boundary
    let gm = fuse_and_check(
        &fn1(|x| {
            let a = (x.exp()? + 1.0)?;
            let left = a.relu()?.matmul(&x.t()?)?;
            let right = a.tanh()?.matmul(&x.t()?)?;
            &left + &right
        }),
        &[(&x).into()],
    );
    let plan = plan_fusion(gm.graph()).unwrap();
    // exp+add fused (a's users are outside any one group) — a is computed once, not twice
    let fused = fused_nodes(&gm);
    assert!(fused.iter().any(|(_, e)| e == "t0 = exp(x0); t1 = add(t0, 1.0)"), "{fused:?}");
    assert_eq!(ops_left(&gm).iter().filter(|o| *o == "relu" || *o == "tanh").count(), 2);
    let _ = plan;

    // the reason is reported for `show --fused`
    let mut gm = trace_with_inputs(
        &fn1(|x| {
            let a = (x + 1.0)?;
            let b = (a.relu()? * 3.0)?;
            ferrofx_core::ops::join::cat(&[a.clone(), b], 0)
        }),
        &[(&x).into()],
    )
    .unwrap();
    ShapeProp::propagate(&mut gm, &[(&x).into()]).unwrap();
    let plan = plan_fusion(gm.graph()).unwrap();
    assert!(plan.boundaries.iter().any(|b| b.node == "add" && b.reason.contains("also used by 'cat'")), "{plan}");
}

#[test]
fn broadcast_operands_are_read_not_recomputed() {
    let _s = serial();
    let x = randn(&[2, 4, 5, 6], None).unwrap();
    let b = randn(&[4, 1, 1], None).unwrap();
    // bias * 2 has shape [4,1,1]: it stays its own op and is read broadcast by the group
    let gm = fuse_and_check(&fn2(|x, b| ((x + (b * 2.0)?)? * x)?.relu()), &[(&x).into(), (&b).into()]);
    let fused = fused_nodes(&gm);
    assert_eq!(fused.len(), 1, "{}", gm.graph());
    assert_eq!(ops_left(&gm).iter().filter(|o| *o == "mul").count(), 1, "{}", gm.graph());
    // a 0-dim tensor operand and a broadcast leading dim
    let s = Tensor::from_vec(vec![0.5f32], &[]).unwrap();
    fuse_and_check(&fn2(|x, s| ((x * s)? - 1.0)?.abs()), &[(&x).into(), (&s).into()]);
    let row = randn(&[6], None).unwrap();
    fuse_and_check(&fn2(|x, r| ((x + r)?.sigmoid()? * 4.0)?.clamp(0.5, 3.0)), &[(&x).into(), (&row).into()]);
}

#[test]
fn comparison_masks_fuse_into_the_float_op_that_reads_them() {
    let _s = serial();
    let g = randn(&[3, 5, 7], None).unwrap();
    let y = randn(&[3, 5, 7], None).unwrap().relu().unwrap();
    // relu's backward as the joint graph records it: `mul(grad, gt(y, 0))`, one pass
    let gm = fuse_and_check(&fn2(|g, y| g * &y.gt(0.0)?), &[(&g).into(), (&y).into()]);
    assert_eq!(ops_left(&gm), ["fused_elementwise"], "{}", gm.graph());
    assert_eq!(fused_nodes(&gm)[0].1, "t0 = gt(x0, 0.0); t1 = mul(x1, t0)");
    // a mask also returned as a bool output stays materialised (bool) and is read by the group
    // as 1.0 / 0.0; a comparison is never the root of a group (its value must stay bool)
    let two = |g: &Tensor, y: &Tensor| -> Result<Vec<Value>> {
        let m = y.le(g)?;
        Ok(vec![((g * &m)? + 1.0)?.into(), m.into()])
    };
    #[derive(ferrofx_nn::Module)]
    struct Two {
        #[module(skip)]
        f: fn(&Tensor, &Tensor) -> Result<Vec<Value>>,
    }
    impl Module for Two {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            Ok(x.clone())
        }
        fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
            let (a, b) = (inputs[0].as_tensor().unwrap(), inputs[1].as_tensor().unwrap());
            (self.f)(a, b)
        }
    }
    let gm = fuse_and_check(&Two { f: two }, &[(&g).into(), (&y).into()]);
    assert_eq!(ops_left(&gm).iter().filter(|o| *o == "le").count(), 1, "{}", gm.graph());
    assert_eq!(fused_nodes(&gm).len(), 1, "{}", gm.graph());
    let out = gm.forward_values(&[(&g).into(), (&y).into()]).unwrap();
    assert_eq!(out[1].as_tensor().unwrap().dtype(), DType::Bool);
    // a comparison of another dtype (int64) is not fused
    let i = Tensor::from_vec((0..105).collect::<Vec<i64>>(), &[3, 5, 7]).unwrap();
    let gm = fuse_and_check(&fn2(|g, i| (g * &i.gt(50i64)?)?.relu()), &[(&g).into(), (&i).into()]);
    assert_eq!(ops_left(&gm).iter().filter(|o| *o == "gt").count(), 1, "{}", gm.graph());
}

#[test]
fn other_dtypes_are_never_fused() {
    let _s = serial();
    let x = randn(&[10, 3], None).unwrap();
    let xd = randn(&[10, 3], Some(DType::F64)).unwrap();
    let xi = Tensor::from_vec((0..30).collect::<Vec<i64>>(), &[10, 3]).unwrap();
    // f32 + f64 promotes to f64: nothing fuses (the group would compute in the wrong dtype)
    let gm = fuse_and_check(&fn2(|a, b| ((a + b)? * 2.0)?.relu()), &[(&x).into(), (&xd).into()]);
    assert!(fused_nodes(&gm).is_empty(), "{}", gm.graph());
    // int64 tensor: `i + 1` stays int64, `* 0.5` promotes to float32: only the float part may fuse
    let gm = fuse_and_check(&fn1(|i| (((i + 1)? * 0.5)? + 1.0)?.relu()), &[(&xi).into()]);
    let left = ops_left(&gm);
    assert!(left.contains(&"add".to_string()) && left.contains(&"mul".to_string()), "{left:?}");
    assert_eq!(fused_nodes(&gm).len(), 1);
}

#[test]
fn non_contiguous_and_aliasing_inputs() {
    let _s = serial();
    let x = randn(&[9, 9], None).unwrap();
    // x.t() is a view: it is not fused; the group reads it through its strides, and reads x
    // itself (the same storage) as another input
    let gm = fuse_and_check(&fn1(|x| ((x.t()? + x)? * 0.5)?.tanh()), &[(&x).into()]);
    assert_eq!(fused_nodes(&gm).len(), 1);
    assert!(ops_left(&gm).contains(&"t".to_string()) || ops_left(&gm).contains(&"transpose".to_string()));
    // x + x: one input read twice
    fuse_and_check(&fn1(|x| ((x + x)? * x)?.mul(-1.0)), &[(&x).into()]);
    // a non-contiguous (strided, offset) placeholder value
    let big = randn(&[20, 30], None).unwrap();
    let strided = big.narrow(1, 3, 17).unwrap().t().unwrap();
    fuse_and_check(&fn1(|x| ((x - 2.0)?.exp()? + 1.0)?.log()), &[(&strided).into()]);
}

#[test]
fn in_place_ops_and_views_are_never_fused_unsafely() {
    let _s = serial();
    let x = randn(&[4, 6], None).unwrap();
    // y = x + 1 is computed before x.add_(1): fusing it into relu (after the add_) would read
    // the mutated x
    let m = fn1(|x| {
        let x = x.contiguous()?.mul(1.0)?;
        let y = (&x + 1.0)?;
        x.add_(1.0)?;
        (y.relu()? + &x)?.sigmoid()
    });
    let gm = fuse_and_check(&m, &[(&x).into()]);
    let left = ops_left(&gm);
    assert!(left.contains(&"add_".to_string()), "{left:?}");
    assert!(left.contains(&"add".to_string()), "the add before the in-place op must stay: {left:?}");
    // a view between elementwise ops splits the chain
    let gm = fuse_and_check(&fn1(|x| (x + 1.0)?.view(&[6, 4])?.relu()), &[(&x).into()]);
    assert!(fused_nodes(&gm).is_empty());
}

#[test]
fn expressions_are_data_and_bad_ones_are_errors() {
    let x = randn(&[5], None).unwrap();
    for bad in [
        "t0 = system(x0)",
        "t0 = add(x0)",
        "t1 = relu(x0)",
        "t0 = relu(t0)",
        "t0 = add(1.0, 2.0)",
        "t0 = clamp(x0, x0, 1.0)",
        "",
        "t0 = relu(x0); t1 = add(x1, t0)",
    ] {
        let err = ferrofx_core::ops::fused::fused_elementwise(std::slice::from_ref(&x), bad).unwrap_err();
        assert!(err.to_string().contains("fused_elementwise"), "{bad}: {err}");
    }
    let xi = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let err = ferrofx_core::ops::fused::fused_elementwise(&[xi], "t0 = relu(x0)").unwrap_err();
    assert!(err.to_string().contains("float32"), "{err}");
    let y = randn(&[4], None).unwrap();
    let err = ferrofx_core::ops::fused::fused_elementwise(&[x, y], "t0 = add(x0, x1)").unwrap_err();
    assert!(err.to_string().contains("broadcast"), "{err}");
}

/// The evaluator's paths on an output of 25 MB (many parallel tasks and blocks, a partial last
/// strip, non-temporal stores): contiguous, broadcast-row, transposed (strided) and
/// one-element inputs, bit-equal to the eager ops.
#[test]
fn large_fused_kernel_equals_eager_on_every_input_layout() {
    let _s = serial();
    manual_seed(5);
    let n: usize = (1 << 21) + 5; // rows of 2M + 5 floats: the last block ends in a partial strip
    let ni = n as i64;
    let x = randn(&[3, ni], None).unwrap();
    let row = randn(&[ni], None).unwrap(); // broadcast over the rows: gathered per block
    let zt = randn(&[ni, 3], None).unwrap().t().unwrap(); // [3, n] with strides [1, 3]
    let s = Tensor::from_vec(vec![0.75f32], &[1]).unwrap(); // one value: decoded as a constant
    assert!(3 * n * 4 >= ferrofx_core::ops::fused::STREAM_MIN_BYTES);
    let expr = "t0 = mul(x1, 2.0); t1 = add(x0, t0); t2 = sub(t1, x2); t3 = mul(t2, x3); t4 = relu(t3)";
    let got =
        ferrofx_core::ops::fused::fused_elementwise(&[x.clone(), row.clone(), zt.clone(), s.clone()], expr).unwrap();
    let want = ((((&x + (&row * 2.0)).unwrap() - &zt).unwrap() * &s).unwrap()).relu().unwrap();
    assert_eq!(got.shape(), &[3, n]);
    assert!(got.is_contiguous());
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    // below the streaming threshold, over the same layouts
    let small = |t: &Tensor, d: i64| t.narrow(d, 0, 1000).unwrap();
    let (xs, rs, zs) = (small(&x, 1), small(&row, 0), small(&zt, 1));
    let got =
        ferrofx_core::ops::fused::fused_elementwise(&[xs.clone(), rs.clone(), zs.clone(), s.clone()], expr).unwrap();
    let want = ((((&xs + (&rs * 2.0)).unwrap() - &zs).unwrap() * &s).unwrap()).relu().unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
}

/// The zoo in eval mode, with an input each.
fn zoo() -> Vec<(&'static str, Box<dyn Module>, Tensor)> {
    manual_seed(21);
    ferrofx_nn::zoo::catalogue().unwrap().into_iter().map(|z| (z.name, z.model, z.input)).collect()
}

#[test]
fn compiled_equals_eager_and_memory_plans_are_valid_on_every_zoo_model() {
    let _s = serial();
    let _g = ferrofx_core::autograd::no_grad();
    for (name, m, x) in zoo() {
        let want = m.forward(&x).unwrap();
        let gm = trace_with_inputs(m.as_ref(), &[(&x).into()]).unwrap();
        let compiled = compile(&gm, &[(&x).into()], CompileOptions::default()).unwrap();
        let got = compiled.forward(&x).unwrap();
        let d = max_rel_diff(&want, &got);
        assert!(d <= 1e-4, "{name}: compiled differs from eager by {d}");
        let spec = compiled.latest().unwrap();
        spec.module.graph().lint().unwrap();
        // the Interpreter runs the compiled graph too (fused nodes, get_attr of fused weights)
        match &DefaultInterpreter(&spec.module).run(&[(&x).into()]).unwrap()[..] {
            [Value::Tensor(t)] => assert_eq!(max_rel_diff(&got, t), 0.0, "{name}: Interpreter"),
            other => panic!("{name}: {other:?}"),
        }
        spec.memory.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(spec.memory.arena_bytes >= spec.memory.lower_bound_bytes, "{name}");
        assert!(spec.memory.arena_bytes <= spec.memory.total_bytes, "{name}");
        if matches!(name, "resnet18" | "resnet50" | "mobilenet_v2" | "digits_cnn" | "mlp") {
            assert!(spec.memory.arena_bytes < spec.memory.total_bytes, "{name}: no reuse at all: {}", spec.memory);
        }
        if matches!(name, "resnet18" | "resnet50") {
            // every residual add + relu is in the block's last convolution; no add or relu
            // is left as a node of its own
            let blocks = if name == "resnet18" { 8 } else { 16 };
            let convs = conv_epilogues(&spec.module);
            assert_eq!(convs.iter().filter(|(_, res, act)| *res && act == "relu").count(), blocks, "{name}: {convs:?}");
            let left = ops_left(&spec.module);
            assert!(!left.iter().any(|o| o == "add" || o == "relu" || o == "fused_elementwise"), "{name}: {left:?}");
        }
        if name == "mobilenet_v2" {
            // every relu6 and every residual add is a convolution epilogue
            let left = ops_left(&spec.module);
            assert!(!left.iter().any(|o| o == "add" || o == "relu6" || o == "hardtanh"), "{left:?}");
            let convs = conv_epilogues(&spec.module);
            assert!(convs.iter().any(|(_, res, act)| *res && act == "none"), "{convs:?}");
            assert!(convs.iter().any(|(_, _, act)| act == "relu6"), "{convs:?}");
        }
        println!("{name}: {} fused groups; {}", fused_nodes(&spec.module).len(), spec.memory);
    }
}

#[test]
fn memory_plan_reuses_and_checks_overlaps() {
    let _s = serial();
    let x = randn(&[64, 64], None).unwrap();
    // a chain of unfusable ops (matmuls): buffers alternate, so the arena holds two
    let mut gm = trace_with_inputs(&fn1(|x| x.matmul(x)?.matmul(x)?.matmul(x)?.matmul(x)), &[(&x).into()]).unwrap();
    ShapeProp::propagate(&mut gm, &[(&x).into()]).unwrap();
    let mut plan = plan_memory(gm.graph()).unwrap();
    plan.validate().unwrap();
    assert_eq!(plan.buffers.len(), 4);
    assert_eq!(plan.arena_bytes, 2 * 64 * 64 * 4, "{plan}");
    assert_eq!(plan.lower_bound_bytes, 2 * 64 * 64 * 4);
    // break it: two live buffers at one offset
    plan.buffers[1].offset = plan.buffers[0].offset;
    assert!(plan.validate().unwrap_err().to_string().contains("overlap"));
    // elementwise ops write in place when their input dies there
    let mut gm = trace_with_inputs(&fn1(|x| x.matmul(x)?.exp()?.matmul(x)), &[(&x).into()]).unwrap();
    ShapeProp::propagate(&mut gm, &[(&x).into()]).unwrap();
    let plan = plan_memory(gm.graph()).unwrap();
    plan.validate().unwrap();
    assert_eq!(plan.in_place, 1, "{plan}");
}

#[test]
fn shape_cache_recompiles_once_per_signature_and_is_bounded() {
    let _s = serial();
    let mut m = Mlp::new(8, &[16], 3).unwrap();
    m.eval();
    let x = randn(&[4, 8], None).unwrap();
    let gm = trace_with_inputs(&m, &[(&x).into()]).unwrap();
    let opts = CompileOptions { cache_size: 2, ..CompileOptions::default() };
    let c = compile(&gm, &[(&x).into()], opts).unwrap();
    assert_eq!((c.cache_stats().misses, c.cache_stats().hits), (1, 0));
    c.forward(&x).unwrap();
    assert_eq!(c.cache_stats().hits, 1);
    let x2 = randn(&[2, 8], None).unwrap();
    let x3 = randn(&[7, 8], None).unwrap();
    c.forward(&x2).unwrap();
    c.forward(&x2).unwrap();
    assert_eq!((c.cache_stats().misses, c.cache_stats().hits), (2, 2));
    c.forward(&x3).unwrap(); // evicts [4, 8], the least recently used
    let s = c.cache_stats();
    assert_eq!((s.misses, s.evictions, s.len), (3, 1, 2));
    c.forward(&x).unwrap();
    assert_eq!(c.cache_stats().misses, 4);
    // results of every specialisation equal eager (the pre-packed weights change the GEMM's
    // blocking, so the sums may round differently)
    for x in [&x, &x2, &x3] {
        let d = max_rel_diff(&m.forward(x).unwrap(), &c.forward(x).unwrap());
        assert!(d <= 1e-6, "{d}");
    }
    // a shape that makes the graph invalid: a clear error naming compile and the shapes
    let bad = randn(&[4, 9], None).unwrap();
    let err = c.forward(&bad).unwrap_err().to_string();
    assert!(err.contains("compile") && err.contains("[4, 9]"), "{err}");
}

/// Specialising runs shape propagation on the example inputs: it frees each value after its
/// last use and records no autograd graph, even with grad mode on and weights that require
/// grad (the autograd graph would keep every activation alive: the sum of all values).
#[test]
fn specializing_frees_activations_as_it_goes() {
    use ferrofx_core::memory::tracking::MemoryTracker;
    let _s = serial();
    let mut m = ferrofx_nn::zoo::ResNet::resnet18(10).unwrap();
    m.eval();
    assert!(m.parameters().iter().all(|p| p.requires_grad()));
    let x = randn(&[1, 3, 32, 32], None).unwrap();
    let gm = trace_with_inputs(&m, &[(&x).into()]).unwrap();
    let c = compile(&gm, &[(&x).into()], CompileOptions::default()).unwrap();
    let x4 = randn(&[4, 3, 96, 96], None).unwrap();
    let tracker = MemoryTracker::start();
    let spec = c.specialize(&[(&x4).into()]).unwrap();
    let peak = tracker.stats().peak_total();
    drop(tracker);
    let plan = &spec.memory;
    // the values alive at once in the unfused graph the first propagation runs (a conv's
    // output beside its ReLU's), well below every value held to the end (0.79 of them when
    // the propagation recorded autograd: its saved tensors); the compiled graph's values are
    // 2.7x its lower bound (stem, pool and stages in NCHW16c: no reorder copies)
    assert!(plan.total_bytes > 2 * plan.lower_bound_bytes, "{plan}");
    assert!(peak * 5 < plan.total_bytes * 3, "peak {peak} bytes while specialising; {plan}");
}

#[test]
fn compiled_module_saves_and_loads_with_fused_nodes() {
    let _s = serial();
    let mut m = DigitsCnn::new().unwrap();
    m.eval();
    let x = randn(&[3, 1, 8, 8], None).unwrap();
    let gm = trace_with_inputs(&m, &[(&x).into()]).unwrap();
    let c = compile(&gm, &[(&x).into()], CompileOptions::default()).unwrap();
    let spec = c.latest().unwrap();
    let before = spec.module.forward(&x).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("digits.compiled.fxm");
    spec.module.save(&path).unwrap();
    let loaded = GraphModule::load(&path).unwrap();
    assert_eq!(fused_nodes(&loaded), fused_nodes(&spec.module));
    assert_eq!(max_rel_diff(&before, &loaded.forward(&x).unwrap()), 0.0);

    // seed 003 model: its fused node survives and still computes
    let y = randn(&[2, 3], None).unwrap();
    let mut g = trace_with_inputs(&fn1(|x| ((x + 1.0)? * 2.0)?.relu()), &[(&y).into()]).unwrap();
    fuse_elementwise(&mut g).unwrap();
    let bytes = g.to_bytes().unwrap();
    let back = GraphModule::from_bytes(&bytes).unwrap();
    assert_eq!(fused_nodes(&back).len(), 1);
    assert_eq!(max_rel_diff(&g.forward(&y).unwrap(), &back.forward(&y).unwrap()), 0.0);

    // a file whose expression names an unknown function: an error, nothing runs
    let text = String::from_utf8_lossy(&bytes).replace("relu(t1)", "evil(t1)");
    if let Ok(evil) = GraphModule::from_bytes(text.as_bytes()) {
        let err = evil.forward(&y).unwrap_err().to_string();
        assert!(err.contains("unknown function 'evil'"), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Composite layers inlined, linear weights pre-packed

#[test]
fn transformer_layers_are_inlined_and_linear_weights_prepacked() {
    let _s = serial();
    let _g = ferrofx_core::autograd::no_grad();
    manual_seed(5);
    let mut m = ferrofx_nn::zoo::TransformerClassifier::new(50, 32, 4, 64, 2, 16, 3, 0.0).unwrap();
    m.eval();
    let ids = Tensor::from_vec((0..2 * 16).map(|i| (i * 7 % 50) as i64).collect::<Vec<_>>(), &[2, 16]).unwrap();
    let gm = trace_with_inputs(&m, &[(&ids).into()]).unwrap();
    assert!(gm.leaf_modules().values().any(|l| l.type_name() == "TransformerEncoderLayer"));
    let c = compile(&gm, &[(&ids).into()], CompileOptions::default()).unwrap();
    let spec = c.latest().unwrap();
    let g = &spec.module;
    // no opaque layer is left; its operations are nodes
    assert!(!g
        .leaf_modules()
        .values()
        .any(|l| matches!(l.type_name(), "TransformerEncoderLayer" | "MultiheadAttention")));
    let ops = ops_left(g);
    // self-attention as PyTorch's need_weights=False path: one fused attention node per layer
    assert_eq!(ops.iter().filter(|o| *o == "scaled_dot_product_attention").count(), 2, "{ops:?}");
    // every linear (the packed in-projection, out_proj, linear1, linear2 per layer, the head)
    // is an addmm on a transposed contiguous constant
    assert!(!ops.iter().any(|o| o == "linear"), "{ops:?}");
    assert_eq!(ops.iter().filter(|o| *o == "addmm").count(), 2 * 4 + 1, "{ops:?}");
    let packed: Vec<&String> = g.attributes().keys().filter(|k| k.contains("_weight") && k.ends_with("_t")).collect();
    assert_eq!(packed.len(), 2 * 4 + 1, "{packed:?}");
    for k in &packed {
        assert!(g.get_attr(k).unwrap().is_contiguous(), "{k}");
    }
    let want = m.forward(&ids).unwrap();
    let got = c.forward(&ids).unwrap();
    let d = max_rel_diff(&want, &got);
    assert!(d <= 1e-5, "compiled transformer differs from eager by {d}");
    // another batch size inlines again for its shapes
    let ids2 = Tensor::from_vec((0..16).map(|i| (i * 3 % 50) as i64).collect::<Vec<_>>(), &[1, 16]).unwrap();
    let d2 = max_rel_diff(&m.forward(&ids2).unwrap(), &c.forward(&ids2).unwrap());
    assert!(d2 <= 1e-5, "{d2}");
    // the packed weights are data: the compiled module saves, loads and computes the same
    let back = GraphModule::from_bytes(&g.to_bytes().unwrap()).unwrap();
    assert_eq!(max_rel_diff(&g.forward(&ids).unwrap(), &back.forward(&ids).unwrap()), 0.0);
    // without the inference passes (training graphs: weights change), nothing is pre-packed
    let opts = CompileOptions { inference_passes: false, ..CompileOptions::default() };
    let c2 = compile(&gm, &[(&ids).into()], opts).unwrap();
    let ops2 = ops_left(&c2.latest().unwrap().module);
    assert!(!ops2.iter().any(|o| o == "addmm") && ops2.iter().any(|o| o == "linear"), "{ops2:?}");
}

// ---------------------------------------------------------------------------------------------
// Convolution epilogue fusion

/// A convolution followed by `f(conv(x), x)`.
#[derive(ferrofx_nn::Module)]
struct ConvThen {
    conv: ferrofx_nn::Conv2d,
    #[module(skip)]
    f: fn(&Tensor, &Tensor) -> Result<Tensor>,
}
impl Module for ConvThen {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (self.f)(&self.conv.forward(x)?, x)
    }
}

fn conv_then(f: fn(&Tensor, &Tensor) -> Result<Tensor>) -> ConvThen {
    let opts = ferrofx_nn::Conv2dOpts { padding: 1, ..Default::default() };
    ConvThen { conv: ferrofx_nn::Conv2d::with(6, 6, 3, opts).unwrap(), f }
}

/// Compiles `m` on `x`, checks it against eager (<= 1e-5 relative) and returns the compiled
/// graph's `conv2d_fused` nodes and the ops left.
/// `conv2d_fused` nodes as (name, has a residual, activation).
type ConvEpilogues = Vec<(String, bool, String)>;

fn compile_conv(
    m: &dyn Module,
    x: &Tensor,
) -> (ConvEpilogues, Vec<String>, std::sync::Arc<ferrofx_compile::Specialization>) {
    let _g = ferrofx_core::autograd::no_grad();
    let want = m.forward(x).unwrap();
    let gm = trace_with_inputs(m, &[x.into()]).unwrap();
    let c = compile(&gm, &[x.into()], CompileOptions::default()).unwrap();
    let got = c.forward(x).unwrap();
    let d = max_rel_diff(&want, &got);
    assert!(d <= 1e-5, "compiled differs from eager by {d}");
    let spec = c.latest().unwrap();
    spec.module.graph().lint().unwrap();
    (conv_epilogues(&spec.module), ops_left(&spec.module), spec)
}

#[test]
fn conv_epilogues_fuse_residual_adds_and_activations() {
    let _s = serial();
    let x = randn(&[2, 6, 9, 9], None).unwrap();
    // residual on either side of the add, then relu: one node
    let (convs, left, _) = compile_conv(&conv_then(|y, x| (y + x)?.relu()), &x);
    assert_eq!(convs, vec![("conv2d_add_relu".to_string(), true, "relu".to_string())], "{left:?}");
    assert_eq!(left, vec!["conv2d_fused".to_string()]);
    let (convs, _, _) = compile_conv(&conv_then(|y, x| (x + y)?.relu()), &x);
    assert_eq!(convs.len(), 1);
    assert!(convs[0].1);
    // activations of MobileNet, EfficientNet and hardtanh
    for (f, act) in [
        ((|y, _| y.relu6()) as fn(&Tensor, &Tensor) -> Result<Tensor>, "relu6"),
        (|y, _| y.silu(), "silu"),
        (|y, _| y.hardswish(), "hardswish"),
        (|y, _| ferrofx_core::ops::unary::clamp(y, -0.5, 0.5), "clamp(-0.5, 0.5)"),
        (|y, _| ferrofx_core::ops::unary::hardtanh(y, -1.0, 1.0), "clamp(-1.0, 1.0)"),
    ] {
        let (convs, left, _) = compile_conv(&conv_then(f), &x);
        assert_eq!(convs.len(), 1, "{act}: {left:?}");
        assert_eq!(convs[0].2, act);
        assert!(!convs[0].1);
    }
    // a residual add without activation
    let (convs, _, _) = compile_conv(&conv_then(|y, x| y + x), &x);
    assert_eq!(convs, vec![("conv2d_add".to_string(), true, "none".to_string())]);
}

#[test]
fn conv_epilogues_respect_boundaries() {
    let _s = serial();
    let x = randn(&[2, 6, 9, 9], None).unwrap();
    // the convolution's value is used twice: it stays materialised, nothing is fused into it
    let (convs, left, _) = compile_conv(&conv_then(|y, _| y.relu()? * y), &x);
    assert!(convs.is_empty(), "{convs:?}");
    assert!(left.iter().any(|o| o == "fused_elementwise" || o == "relu"), "{left:?}");
    // the add's value is used twice (by the relu and the product): the fused node ends at the
    // add, whose value it materialises, and the relu stays outside
    let (convs, left, _) = compile_conv(&conv_then(|y, x| (y + x)?.relu()? * (y + x)?), &x);
    assert_eq!(convs, vec![("conv2d_add".to_string(), true, "none".to_string())], "{left:?}");
    assert!(left.iter().any(|o| o == "fused_elementwise" || o == "relu"), "{left:?}");
    // a broadcast add is not a residual (its other operand has another shape)
    let (convs, left, _) = compile_conv(&conv_then(|y, x| (y + x.mean_dim(&[2, 3], true)?)?.relu()), &x);
    assert!(convs.is_empty(), "{convs:?} {left:?}");
    // add with alpha is not a plain residual add
    let (convs, _, _) = compile_conv(&conv_then(|y, x| ferrofx_core::ops::binary::add_alpha(y, x, 2.0)?.relu()), &x);
    assert!(convs.iter().all(|c| !c.1), "{convs:?}");
}

#[test]
fn fused_convolutions_save_load_and_run_in_the_interpreter() {
    let _s = serial();
    let x = randn(&[2, 6, 9, 9], None).unwrap();
    let (convs, _, spec) = compile_conv(&conv_then(|y, x| ferrofx_core::ops::unary::clamp(&(y + x)?, 0.0, 6.0)), &x);
    let gm = &spec.module;
    assert_eq!(convs.len(), 1);
    let _g = ferrofx_core::autograd::no_grad();
    let before = gm.forward(&x).unwrap();
    let code = gm.code().unwrap();
    assert!(code.contains("conv2d_fused") && code.contains("relu6"), "{code}");
    let back = GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
    assert_eq!(conv_epilogues(&back), convs);
    assert_eq!(max_rel_diff(&before, &back.forward(&x).unwrap()), 0.0);
    let interp = DefaultInterpreter(&back).run(&[(&x).into()]).unwrap();
    match &interp[..] {
        [Value::Tensor(t)] => assert_eq!(max_rel_diff(&before, t), 0.0),
        other => panic!("{other:?}"),
    }
    // a file whose activation is not one of the closed set: an error naming it, nothing runs
    let text = String::from_utf8_lossy(&gm.to_bytes().unwrap()).replace("relu6", "evil6");
    assert!(text.contains("evil6"));
    // (a file format with a checksum refuses the edited file outright: also nothing runs)
    if let Ok(evil) = GraphModule::from_bytes(text.as_bytes()) {
        let e = evil.forward(&x).unwrap_err().to_string();
        assert!(e.contains("unknown activation 'evil6'"), "{e}");
    }
}

/// The layout pass on ResNet-18: on AVX-512 the convolutions it prefers run in NCHW16c, values
/// are reordered only where they cross layouts (each at most once), the downsampling 1x1s
/// stay blocked, and the compiled module equals eager, saves, loads and runs in the
/// Interpreter with the same outputs. Without AVX-512 nothing is converted.
#[test]
fn nchwc_layout_converts_resnet_chains_with_reorders_at_the_ends() {
    let _s = serial();
    let _g = ferrofx_core::autograd::no_grad();
    manual_seed(5);
    let m = ferrofx_nn::zoo::catalogue().unwrap().into_iter().find(|z| z.name == "resnet18").unwrap();
    let x = randn(&[1, 3, 64, 64], None).unwrap();
    let want = m.model.forward(&x).unwrap();
    let gm = trace_with_inputs(m.model.as_ref(), &[(&x).into()]).unwrap();
    let compiled = compile(&gm, &[(&x).into()], CompileOptions::default()).unwrap();
    let spec = compiled.latest().unwrap();
    let g = spec.module.graph();
    let count = |t: &str| g.iter().filter(|n| n.op() == Opcode::CallFunction && n.target().name() == t).count();
    let (blocked, to_blocked, to_nchw) =
        (count("nchwc_conv2d"), count("nchwc_reorder_input"), count("nchwc_reorder_output"));
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    if avx512 {
        assert!(blocked >= 8, "{blocked} blocked convolutions: {}", spec.module.code().unwrap());
        // a reorder per value, and fewer reorders than blocked convolutions: chains, not
        // single convolutions wrapped in reorders
        assert!(to_blocked + to_nchw < blocked, "{to_blocked} + {to_nchw} reorders for {blocked} convolutions");
        for n in g.iter().filter(|n| n.target().name() == "nchwc_reorder_input") {
            let src = n.args()[0].as_node().unwrap();
            let same =
                g.iter().filter(|m| m.target().name() == "nchwc_reorder_input" && m.args()[0].as_node() == Some(src));
            assert_eq!(same.count(), 1, "{} reordered twice", n.name());
        }
        // the downsampling 1x1 convolutions joined the chains
        assert!(g.iter().all(|n| n.op() != Opcode::CallModule || !n.target().name().contains("downsample")));
        // one chain from the input to the global average pool: the stem reads the NCHW input
        // in place, the max pool and the Winograd 3x3s run blocked, one reorder at the end
        assert_eq!(blocked, 20, "{}", spec.module.code().unwrap());
        assert_eq!((to_blocked, to_nchw, count("nchwc_max_pool2d")), (0, 1, 1), "{}", spec.module.code().unwrap());
    } else {
        assert_eq!(blocked + to_blocked + to_nchw, 0);
    }
    spec.module.graph().lint().unwrap();
    spec.memory.validate().unwrap();
    let got = compiled.forward(&x).unwrap();
    assert!(max_rel_diff(&want, &got) <= 1e-4, "{}", max_rel_diff(&want, &got));
    let back = GraphModule::from_bytes(&spec.module.to_bytes().unwrap()).unwrap();
    assert_eq!(max_rel_diff(&got, &back.forward(&x).unwrap()), 0.0);
    match &DefaultInterpreter(&back).run(&[(&x).into()]).unwrap()[..] {
        [Value::Tensor(t)] => assert_eq!(max_rel_diff(&got, t), 0.0),
        other => panic!("{other:?}"),
    }
    // MobileNetV2: every convolution, from the stem (which reads the NCHW input in place) to
    // the last 1x1, is one blocked chain, the 16-32-channel stages (padded to blocks) and the
    // depthwise layers included, reordered out once before the pooling
    let mut mbm = ferrofx_nn::zoo::MobileNetV2::new(10, 1.0).unwrap();
    mbm.eval();
    let xm = randn(&[1, 3, 128, 128], None).unwrap();
    let gmm = trace_with_inputs(&mbm, &[(&xm).into()]).unwrap();
    let cm = compile(&gmm, &[(&xm).into()], CompileOptions::default()).unwrap();
    let mspec = cm.latest().unwrap();
    let mg = mspec.module.graph();
    let mcount = |t: &str| mg.iter().filter(|n| n.op() == Opcode::CallFunction && n.target().name() == t).count();
    let depthwise_blocked = mg
        .iter()
        .filter(|n| n.target().name() == "nchwc_conv2d" && matches!(n.args()[6], Argument::Int(g) if g > 1))
        .count();
    if avx512 {
        assert_eq!((mcount("nchwc_conv2d"), depthwise_blocked), (52, 17), "{}", mspec.module.code().unwrap());
        assert_eq!((mcount("nchwc_reorder_input"), mcount("nchwc_reorder_output")), (0, 1));
        assert_eq!(mcount("conv2d_fused"), 0);
    } else {
        assert_eq!(mcount("nchwc_conv2d"), 0);
    }
    mg.lint().unwrap();
    let got_m = cm.forward(&xm).unwrap();
    assert!(max_rel_diff(&mbm.forward(&xm).unwrap(), &got_m) <= 1e-4);
    let back_m = GraphModule::from_bytes(&mspec.module.to_bytes().unwrap()).unwrap();
    assert_eq!(max_rel_diff(&got_m, &back_m.forward(&xm).unwrap()), 0.0);
    // turned off: the same graph without blocked nodes
    let opts = CompileOptions { nchwc_layout: false, ..CompileOptions::default() };
    let plain = compile(&gm, &[(&x).into()], opts).unwrap();
    let pg = plain.latest().unwrap();
    assert!(pg.module.graph().iter().all(|n| !n.target().name().starts_with("nchwc")));
    assert!(max_rel_diff(&want, &plain.forward(&x).unwrap()) <= 1e-4);
}

// ---------------------------------------------------------------------------------------------
// Property test: random elementwise graphs, fused vs the unfused Interpreter.

const UNARY: &[&str] = &[
    "neg",
    "abs",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "silu",
    "gelu",
    "erf",
    "sin",
    "floor",
    "hardswish",
    "hardsigmoid",
    "relu6",
    "log1p",
    "expm1",
];
const BINARY: &[&str] = &["add", "sub", "mul", "div", "maximum", "minimum"];

#[derive(Debug, Clone)]
enum Step {
    Unary(usize, usize),
    Binary(usize, usize, usize),
    Scalar(usize, usize, f64),
    Clamp(usize, f64, f64),
    Leaky(usize, f64),
    /// `cmp(a, b or a constant)` read by `mul(c, mask)` and, when the flag is set, also by
    /// `add(a, mask)` (a mask with two users, maybe in two groups)
    Mask(usize, usize, Option<usize>, f64, usize, bool),
}

const COMPARE: &[&str] = &["eq", "ne", "gt", "ge", "lt", "le"];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..UNARY.len(), any::<usize>()).prop_map(|(o, a)| Step::Unary(o, a)),
        (0..BINARY.len(), any::<usize>(), any::<usize>()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        (0..4usize, any::<usize>(), -3.0f64..3.0).prop_map(|(o, a, c)| Step::Scalar(o, a, c)),
        (any::<usize>(), -2.0f64..0.0, 0.0f64..2.0).prop_map(|(a, lo, hi)| Step::Clamp(a, lo, hi)),
        (any::<usize>(), 0.0f64..0.5).prop_map(|(a, s)| Step::Leaky(a, s)),
        (
            0..COMPARE.len(),
            any::<usize>(),
            proptest::option::of(any::<usize>()),
            -1.0f64..1.0,
            any::<usize>(),
            any::<bool>()
        )
            .prop_map(|(o, a, b, k, c, two)| Step::Mask(o, a, b, k, c, two)),
    ]
}

/// Builds a graph over placeholders of shapes [4, 37], [37] (broadcast) and [4, 37], applying
/// the steps to random earlier values; returns the last two values (several outputs: some
/// intermediate values have users outside their group).
fn build(steps: &[Step]) -> Graph {
    let mut g = Graph::new();
    let mut vals = vec![g.placeholder("a").unwrap(), g.placeholder("b").unwrap(), g.placeholder("c").unwrap()];
    for s in steps {
        let pick = |i: usize| vals[i % vals.len()];
        let n = match s {
            Step::Unary(o, a) => g.call_function(Target::named(UNARY[*o]), vec![pick(*a).into()]),
            Step::Binary(o, a, b) => g.call_function(Target::named(BINARY[*o]), vec![pick(*a).into(), pick(*b).into()]),
            Step::Scalar(o, a, c) => {
                g.call_function(Target::named(BINARY[*o]), vec![pick(*a).into(), Argument::Float(*c)])
            }
            Step::Clamp(a, lo, hi) => g.call_function(
                Target::named("clamp"),
                vec![pick(*a).into(), Argument::Float(*lo), Argument::Float(*hi)],
            ),
            Step::Leaky(a, s) => {
                g.call_function(Target::named("leaky_relu"), vec![pick(*a).into(), Argument::Float(*s)])
            }
            Step::Mask(o, a, b, k, c, two) => {
                // 0.0 as the constant now and then: relu's backward `gt(y, 0)`, and exact ties
                let other = match b {
                    Some(b) => pick(*b).into(),
                    None => Argument::Float(if *k < -0.5 { 0.0 } else { *k }),
                };
                let m = g.call_function(Target::named(COMPARE[*o]), vec![pick(*a).into(), other]).unwrap();
                let (pa, pc) = (pick(*a), pick(*c));
                if *two {
                    let s = g.call_function(Target::named("add"), vec![pa.into(), m.into()]).unwrap();
                    vals.push(s);
                }
                g.call_function(Target::named("mul"), vec![pc.into(), m.into()])
            }
        }
        .unwrap();
        vals.push(n);
    }
    let k = vals.len();
    g.output(Argument::tuple([vals[k - 1].into(), vals[k / 2].into()])).unwrap();
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn random_elementwise_graphs_fuse_to_the_same_values(steps in proptest::collection::vec(step(), 1..14), seed in 0u64..1000) {
        let _s = serial();
        manual_seed(seed);
        let inputs: Vec<Value> = vec![
            randn(&[4, 37], None).unwrap().into(),
            randn(&[37], None).unwrap().into(),
            randn(&[4, 37], None).unwrap().into(),
        ];
        let g = build(&steps);
        let mut gm = GraphModule::from_parts(g, IndexMap::new(), IndexMap::new(), "Random", false).unwrap();
        let want = DefaultInterpreter(&gm).run(&inputs).unwrap();
        ShapeProp::propagate(&mut gm, &inputs).unwrap();
        let groups = fuse_elementwise(&mut gm).unwrap();
        gm.graph().lint().unwrap();
        let got = gm.forward_values(&inputs).unwrap();
        let got_interp = DefaultInterpreter(&gm).run(&inputs).unwrap();
        prop_assert_eq!(want.len(), got.len());
        for ((w, g), gi) in want.iter().zip(&got).zip(&got_interp) {
            let (w, g, gi) = (w.as_tensor().unwrap(), g.as_tensor().unwrap(), gi.as_tensor().unwrap());
            let d = max_rel_diff(w, g);
            prop_assert!(d == 0.0, "differs by {} with {} groups:\n{}", d, groups, gm.graph());
            prop_assert_eq!(max_rel_diff(g, gi), 0.0);
        }
    }
}
