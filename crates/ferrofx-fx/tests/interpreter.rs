//! Interpreter (default hooks, run_node override), ShapeProp, Transformer.

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Result, Value};
use ferrofx_fx::interpreter::default_run_node;
use ferrofx_fx::{
    symbolic_trace, trace_with_inputs, DefaultInterpreter, Env, GraphModule, Interpreter, Node, NodeValue, Opcode,
    ShapeProp, Transformer,
};
use ferrofx_nn::zoo::{DigitsCnn, ResNet};
use ferrofx_nn::Module;

#[test]
fn default_interpreter_matches_the_plan() {
    manual_seed(11);
    let mut m = ResNet::build(false, [1, 1, 1, 1], [8, 16, 32, 64], 10).unwrap();
    m.eval();
    let gm = symbolic_trace(&m).unwrap();
    let x = randn(&[2, 3, 32, 32], None).unwrap();
    let a = DefaultInterpreter(&gm).run(&[x.clone().into()]).unwrap();
    let b = gm.forward(&x).unwrap();
    assert_eq!(a[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
}

/// Counts nodes per opcode by overriding run_node (FX's "profiling interpreter" pattern).
struct Counter<'m> {
    gm: &'m GraphModule,
    seen: Vec<(String, Opcode)>,
}

impl<'m> Interpreter<'m> for Counter<'m> {
    fn module(&self) -> &'m GraphModule {
        self.gm
    }
    fn run_node(&mut self, node: Node<'m>, env: &Env) -> Result<NodeValue> {
        self.seen.push((node.name().to_string(), node.op()));
        default_run_node(self, node, env)
    }
}

#[test]
fn run_node_override_sees_every_node() {
    let m = DigitsCnn::new().unwrap();
    let gm = symbolic_trace(&m).unwrap();
    let mut c = Counter { gm: &gm, seen: vec![] };
    let x = randn(&[2, 1, 8, 8], None).unwrap();
    c.run(&[x.into()]).unwrap();
    let names: Vec<&str> = c.seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        // FX: run_node sees every node, the placeholder and the output included
        [
            "x", "conv1", "bn1", "relu", "conv2", "bn2", "relu_1", "pool", "flatten", "fc1", "relu_2", "dropout",
            "fc2", "output"
        ]
    );
}

#[test]
fn shape_prop_fills_tensor_meta_like_tracing_with_inputs() {
    let m = DigitsCnn::new().unwrap();
    let mut gm = symbolic_trace(&m).unwrap();
    assert!(gm.graph().iter().all(|n| n.meta().tensor_meta.is_none()));
    let x = randn(&[3, 1, 8, 8], None).unwrap();
    ShapeProp::propagate(&mut gm, &[Value::Tensor(x.clone())]).unwrap();
    let shape = |gm: &GraphModule, name: &str| {
        gm.graph().iter().find(|n| n.name() == name).unwrap().meta().tensor_meta.as_ref().unwrap().shape.clone()
    };
    assert_eq!(shape(&gm, "conv1"), [3, 16, 8, 8]);
    assert_eq!(shape(&gm, "pool"), [3, 32, 4, 4]);
    assert_eq!(shape(&gm, "flatten"), [3, 512]);
    assert_eq!(shape(&gm, "fc2"), [3, 10]);
    // Same metadata as tracing with example inputs.
    let traced = trace_with_inputs(&m, &[x.into()]).unwrap();
    for n in traced.graph().iter().filter(|n| n.op() != Opcode::Output) {
        let other = gm.graph().iter().find(|o| o.name() == n.name()).unwrap();
        let (a, b) = (n.meta().tensor_meta.as_ref().unwrap(), other.meta().tensor_meta.as_ref().unwrap());
        assert_eq!((&a.shape, a.dtype, &a.strides), (&b.shape, b.dtype, &b.strides), "{}", n.name());
    }
}

struct Identity;
impl Transformer for Identity {}

#[test]
fn identity_transformer_copies_the_graph_module() {
    manual_seed(12);
    let mut m = ResNet::build(true, [1, 1, 1, 1], [8, 16, 32, 64], 10).unwrap();
    m.eval();
    let gm = symbolic_trace(&m).unwrap();
    let copy = Identity.transform(&gm).unwrap();
    assert_eq!(copy.code().unwrap(), gm.code().unwrap());
    assert_eq!(copy.graph().to_string(), gm.graph().to_string());
    let x = randn(&[1, 3, 32, 32], None).unwrap();
    assert_eq!(copy.forward(&x).unwrap().to_vec::<f32>().unwrap(), gm.forward(&x).unwrap().to_vec::<f32>().unwrap());
    // The copy shares the parameters.
    assert_eq!(copy.get_parameter("fc.weight").unwrap().id(), m.fc.weight.id());
}

/// `relu(x) * 2 + 1`: the input is dead after the first node.
#[derive(ferrofx_nn::Module)]
struct ReluMulAdd {}
impl Module for ReluMulAdd {
    fn forward(&self, x: &ferrofx_core::Tensor) -> Result<ferrofx_core::Tensor> {
        &(&x.relu()? * 2.0)? + 1.0
    }
}

/// A graph run on inputs it owns frees each input after its last use (what a compiled backward
/// needs to release the saved activations as it goes); run on borrowed inputs, the caller keeps
/// them alive to the end. Same outputs either way.
#[test]
fn forward_values_owned_frees_each_input_after_its_last_use() {
    use ferrofx_core::memory::tracking::MemoryTracker;
    use ferrofx_core::Tensor;
    let gm = ferrofx_fx::symbolic_trace(&ReluMulAdd {}).unwrap();
    let n = 1 << 18;
    let run = |owned: bool| -> (usize, Vec<f32>) {
        let tracker = MemoryTracker::start();
        let x = Tensor::from_vec((0..n).map(|i| i as f32 - 1000.0).collect::<Vec<_>>(), &[n]).unwrap();
        let out = if owned {
            gm.forward_values_owned(vec![Value::Tensor(x)])
        } else {
            gm.forward_values(&[Value::Tensor(x)])
        };
        let peak = tracker.stats().peak_total();
        (peak, out.unwrap()[0].as_tensor().unwrap().to_vec::<f32>().unwrap())
    };
    let ((owned, a), (borrowed, b)) = (run(true), run(false));
    assert_eq!(a, b);
    let unit = 4 * n;
    // owned: x and relu(x), then relu(x) and the product, then the product and the sum
    assert_eq!(owned, 2 * unit, "owned peak {owned} B");
    // borrowed: x stays alive beside the two intermediates
    assert_eq!(borrowed, 3 * unit, "borrowed peak {borrowed} B");
}
