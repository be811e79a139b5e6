//! Issue 8, acceptance 1: every pass on GraphModules, shown before and after in printed form,
//! and numerically equal outputs before and after on every zoo model; the pass manager's
//! pipeline and its errors.

use ferrofx_core::ops::binary::{add, mul};
use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::passes::manager::PassManager;
use ferrofx_fx::passes::{constant_fold::fold_constants, eliminate_common_subexpressions, fuse, simplify};
use ferrofx_fx::{symbolic_trace, trace_with_inputs, GraphModule, Target};
use ferrofx_nn::functional as F;
use ferrofx_nn::zoo::DigitsCnn;
use ferrofx_nn::Module;

static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn run(gm: &GraphModule, x: &Tensor) -> Tensor {
    let _g = ferrofx_core::autograd::no_grad();
    gm.forward(x).unwrap()
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let scale = a.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max) / scale
}

/// The zoo in eval mode, each traced with an example input, with that input.
fn zoo() -> Vec<(&'static str, GraphModule, Tensor)> {
    manual_seed(21);
    let zoo = ferrofx_nn::zoo::catalogue().unwrap();
    zoo.into_iter()
        .map(|z| {
            let gm = trace_with_inputs(z.model.as_ref(), &[Value::Tensor(z.input.clone())]).unwrap();
            (z.name, gm, z.input)
        })
        .collect()
}

type GmPass = fn(&mut GraphModule) -> Result<usize>;

fn passes() -> Vec<(&'static str, GmPass)> {
    vec![
        ("fuse_conv_bn", fuse::fuse_conv_bn),
        ("remove_identity_dropout", fuse::remove_identity_dropout),
        ("fold_constants", |gm| fold_constants(gm, &[])),
        ("cse", |gm| {
            eliminate_common_subexpressions(gm.graph_mut())
                .map_err(|e| ferrofx_core::Error::argument("cse", e.to_string()))
        }),
        ("simplify", |gm| {
            simplify(gm.graph_mut()).map_err(|e| ferrofx_core::Error::argument("simplify", e.to_string()))
        }),
        ("dce", |gm| {
            let before = gm.graph().len();
            gm.graph_mut().eliminate_dead_code(None).unwrap();
            Ok(before - gm.graph().len())
        }),
    ]
}

#[test]
fn every_pass_keeps_every_zoo_model_numerically_equal() {
    let _s = serial();
    for (name, gm, x) in zoo() {
        let want = run(&gm, &x);
        for (pass, f) in passes() {
            let mut edited = GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
            let changed = f(&mut edited).unwrap_or_else(|e| panic!("{pass} on {name}: {e}"));
            edited.graph().lint().unwrap_or_else(|e| panic!("{pass} on {name} breaks lint: {e}"));
            let got = run(&edited, &x);
            let d = max_rel_diff(&want, &got);
            assert!(d < 1e-4, "{pass} on {name} ({changed} changes): outputs differ by {d}");
        }
        // and the whole inference pipeline
        let mut edited = GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
        let report = PassManager::inference().run(&mut edited).unwrap();
        let d = max_rel_diff(&want, &run(&edited, &x));
        assert!(d < 1e-4, "the inference pipeline on {name}: outputs differ by {d}\n{report}");
        let folded = report.get("fuse_conv_bn").map(|r| r.changed);
        match name {
            "resnet18" => assert_eq!(folded, Some(20), "{report}"),
            "resnet50" => assert_eq!(folded, Some(53), "{report}"),
            "digits_cnn" => assert_eq!(folded, Some(2), "{report}"),
            _ => {}
        }
    }
}

fn lines(gm: &GraphModule) -> Vec<String> {
    gm.graph().to_string().lines().skip(1).map(|l| l.trim().to_string()).collect()
}

#[test]
fn fusion_passes_before_and_after_on_the_digits_cnn() {
    let _s = serial();
    manual_seed(5);
    let mut m = DigitsCnn::new().unwrap();
    m.eval();
    let x = randn(&[3, 1, 8, 8], None).unwrap();
    let mut gm = symbolic_trace(&m).unwrap();
    let want = run(&gm, &x);
    let before = lines(&gm);
    assert_eq!(
        before[..4],
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%conv1 : [num_users=1] = call_module[target=conv1](args = (%x,), kwargs = {})",
            "%bn1 : [num_users=1] = call_module[target=bn1](args = (%conv1,), kwargs = {})",
            "%relu : [num_users=1] = call_function[target=relu](args = (%bn1,), kwargs = {})",
        ]
    );
    assert!(before.iter().any(|l| l.starts_with("%dropout ")));
    assert_eq!(fuse::fuse_conv_bn(&mut gm).unwrap(), 2);
    assert_eq!(fuse::remove_identity_dropout(&mut gm).unwrap(), 1);
    let after = lines(&gm);
    assert_eq!(
        after[..3],
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%conv1 : [num_users=1] = call_module[target=conv1](args = (%x,), kwargs = {})",
            "%relu : [num_users=1] = call_function[target=relu](args = (%conv1,), kwargs = {})",
        ]
    );
    assert!(!after.iter().any(|l| l.contains("bn") || l.contains("dropout")), "{after:#?}");
    assert!(after.iter().any(|l| l.contains("call_module[target=fc2](args = (%relu_2,)")), "{after:#?}");
    assert!(max_rel_diff(&want, &run(&gm, &x)) < 1e-5);
}

/// `relu(x * c * 1 + 0) + relu(x * c * 1 + 0)` with a captured constant `c`:
/// simplification and CSE each have something to do; constant folding gets a `c * 2` node
/// added by surgery (tracing itself already computes concrete-only expressions).
#[derive(ferrofx_nn::Module)]
struct Redundant {
    #[module(skip)]
    c: Tensor,
}

impl Module for Redundant {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let a = F::relu(&add(&mul(&mul(x, &self.c)?, 1.0)?, 0.0)?)?;
        let b = F::relu(&add(&mul(&mul(x, &self.c)?, 1.0)?, 0.0)?)?;
        add(&a, &b)
    }
}

#[test]
fn folding_simplify_cse_and_dce_before_and_after() {
    let _s = serial();
    let m = Redundant { c: Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3]).unwrap() };
    let x = Tensor::from_vec(vec![1.0f32, 2.0, -3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    // with an example input: simplify needs dtypes to know `* 1` and `+ 0` are identities
    let mut gm = trace_with_inputs(&m, &[Value::Tensor(x.clone())]).unwrap();
    let text = gm.graph().to_string();
    assert!(text.contains("get_attr[target=_tensor_constant0]"), "{text}");
    assert_eq!(text.matches("call_function[target=mul]").count(), 4, "{text}");
    // nothing to fold in a fresh trace: concrete-only expressions were computed while tracing
    assert_eq!(fold_constants(&mut gm, &[]).unwrap(), 0);

    // as in FX, the tracer made a get_attr node per use of the constant: `_tensor_constant0`
    // and `_tensor_constant0_1`, both reading `_tensor_constant0`; make them one first
    let c = gm.graph().iter().find(|n| n.name() == "_tensor_constant0").map(|n| n.id()).unwrap();
    let c1 = gm.graph().iter().find(|n| n.name() == "_tensor_constant0_1").map(|n| n.id()).unwrap();
    assert_eq!(gm.graph().node(c1).unwrap().target().name(), "_tensor_constant0");
    gm.graph_mut().replace_all_uses_with(c1, c).unwrap();
    gm.graph_mut().erase_node(c1).unwrap();
    // surgery: scale the constant by 2 inside the graph
    let first_mul = gm.graph().iter().find(|n| n.name() == "mul").map(|n| n.id()).unwrap();
    let scaled = {
        let mut g = gm.graph_mut().inserting_before(Some(first_mul)).unwrap();
        g.call_function(Target::named("mul"), vec![c.into(), ferrofx_fx::Argument::Float(2.0)]).unwrap()
    };
    gm.graph_mut().replace_all_uses_with_where(c, scaled, |u| u.id() != scaled, false).unwrap();
    let m2 = Redundant { c: mul(&m.c, 2.0).unwrap() };
    let want = m2.forward(&x).unwrap();
    assert_eq!(run(&gm, &x).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());

    // constant folding: c * 2 becomes one constant, the unused original is dropped
    assert_eq!(fold_constants(&mut gm, &[]).unwrap(), 1);
    let text = gm.graph().to_string();
    assert!(text.contains("get_attr[target=_folded_constant0]"), "{text}");
    assert!(!text.contains("_tensor_constant0"), "the unused constant is dropped: {text}");
    assert_eq!(gm.attributes().keys().collect::<Vec<_>>(), ["_folded_constant0"]);
    assert_eq!(run(&gm, &x).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());

    // simplification: * 1 and + 0 go
    assert_eq!(simplify(gm.graph_mut()).unwrap(), 4);
    let text = gm.graph().to_string();
    assert_eq!(text.matches("call_function[target=mul]").count(), 2, "{text}");
    assert!(!text.contains("target=add](args = (%mul"), "{text}");
    // CSE: the two branches are the same computation
    assert_eq!(eliminate_common_subexpressions(gm.graph_mut()).unwrap(), 2);
    let text = gm.graph().to_string();
    assert!(text.contains("call_function[target=add](args = (%relu, %relu)"), "{text}");
    assert_eq!(run(&gm, &x).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());

    // DCE: a dead node added by hand is removed
    let out = gm.graph().iter().find(|n| n.name() == "output").map(|n| n.id()).unwrap();
    let xs = gm.graph().iter().find(|n| n.name() == "x").map(|n| n.id()).unwrap();
    {
        let mut g = gm.graph_mut().inserting_before(Some(out)).unwrap();
        g.call_function(Target::named("exp"), vec![xs.into()]).unwrap();
    }
    assert!(gm.graph().to_string().contains("%exp : [num_users=0]"));
    gm.graph_mut().eliminate_dead_code(None).unwrap();
    assert!(!gm.graph().to_string().contains("%exp"));
}

#[test]
fn frozen_attributes_fold_and_unknown_ones_are_refused() {
    let _s = serial();
    #[derive(ferrofx_nn::Module)]
    struct Affine {
        w: Tensor,
        b: Tensor,
    }
    impl Module for Affine {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            add(&x.matmul(&self.w.t()?)?, &mul(&self.b, 0.5)?)
        }
    }
    let m = Affine {
        w: Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap(),
        b: Tensor::from_vec(vec![1.0f32, -1.0], &[2]).unwrap(),
    };
    let mut gm = symbolic_trace(&m).unwrap();
    let x = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2]).unwrap();
    let want = m.forward(&x).unwrap();
    // not frozen: parameters are not constants, nothing folds
    assert_eq!(fold_constants(&mut gm, &[]).unwrap(), 0);
    let e = fold_constants(&mut gm, &["bias"]).unwrap_err().to_string();
    assert!(e.contains("'bias' is not an attribute") && e.contains("w, b"), "{e}");
    // frozen: w.t() and b * 0.5 fold
    assert_eq!(fold_constants(&mut gm, &["w", "b"]).unwrap(), 2);
    let text = gm.graph().to_string();
    assert!(text.contains("_folded_constant0") && text.contains("_folded_constant1"), "{text}");
    assert!(!text.contains("get_attr[target=w]") && !text.contains("get_attr[target=b]"), "{text}");
    assert_eq!(run(&gm, &x).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    // and the folded module saves and loads
    let back = GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
    assert_eq!(run(&back, &x).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
}

#[test]
fn the_pass_manager_reports_and_stops_at_a_pass_that_breaks_the_module() {
    let _s = serial();
    manual_seed(8);
    let mut m = DigitsCnn::new().unwrap();
    m.eval();
    let mut gm = symbolic_trace(&m).unwrap();
    let pm = PassManager::inference();
    assert_eq!(
        pm.names(),
        ["dce", "fuse_conv_bn", "remove_identity_dropout", "fold_constants", "cse", "simplify", "dce"]
    );
    let report = pm.run(&mut gm).unwrap();
    let text = report.to_string();
    assert!(text.lines().next().unwrap().starts_with("pass"), "{text}");
    assert!(text.contains("fuse_conv_bn"), "{text}");
    assert_eq!(report.passes.len(), 7);
    assert_eq!(report.get("fuse_conv_bn").unwrap().nodes_before - report.get("fuse_conv_bn").unwrap().nodes_after, 2);
    assert_eq!(report.total_changed(), 3);

    // a pass that points a call at a module that does not exist is caught by name
    let bad = PassManager::new().add("break_it", |gm: &mut GraphModule| {
        let x = gm.graph().iter().find(|n| n.name() == "x").map(|n| n.id()).unwrap();
        let out = gm.graph().iter().find(|n| n.name() == "output").map(|n| n.id()).unwrap();
        let mut g = gm.graph_mut().inserting_before(Some(out)).unwrap();
        let n = g.call_module("no_such_layer", vec![x.into()]).unwrap();
        g.output(n.into()).ok();
        Ok(1)
    });
    let e = bad.run(&mut gm).unwrap_err().to_string();
    assert!(e.contains("break_it"), "{e}");
    // an error inside a pass is reported with the pass's name
    let failing = PassManager::new().add("fold_unknown", |gm: &mut GraphModule| fold_constants(gm, &["nope"]));
    let e = failing.run(&mut gm).unwrap_err().to_string();
    assert!(e.contains("in pass 'fold_unknown'") && e.contains("'nope' is not an attribute"), "{e}");
}
