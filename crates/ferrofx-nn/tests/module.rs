//! Module trait, #[derive(Module)], call hook, state dict (step 1 of issue 5).

use ferrofx_core::{DType, Tensor, Value};
use ferrofx_nn::{
    load_state_dict_file, save_state_dict, state_dict_from_bytes, state_dict_to_bytes, Linear, Module, ModuleCallHook,
    ModuleDict, ModuleList, ModuleStructure, Result, Sequential, StateDict, TensorKind,
};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(ferrofx_nn::Module)]
struct Block {
    conv1: Linear,
    #[module(buffer)]
    running: Tensor,
    #[module(buffer)]
    maybe: Option<Tensor>,
    scale: Tensor,
    gamma: Option<Tensor>,
    width: usize,
    name: String,
    ratio: f64,
    #[module(skip)]
    #[allow(dead_code)]
    cache: Option<Tensor>,
    training: bool,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.conv1.call(x)
    }
}

fn block(i: usize) -> Block {
    Block {
        conv1: Linear::new(i, i, true).unwrap(),
        running: Tensor::from_vec(vec![0.0f32; i], &[i]).unwrap(),
        maybe: None,
        scale: Tensor::from_vec(vec![1.0f32], &[1]).unwrap().requires_grad_(true).unwrap(),
        gamma: None,
        width: i,
        name: "b".into(),
        ratio: 0.5,
        cache: Some(Tensor::scalar(1.0f32)),
        training: true,
    }
}

#[derive(ferrofx_nn::Module)]
#[module(name = "ResNetLike")]
struct Net {
    stem: Linear,
    layer1: Vec<Block>,
    #[module(rename = "fc")]
    head: Box<dyn Module>,
    extra: Option<Linear>,
    missing: Option<Linear>,
    seq: Sequential,
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.stem.call(x)?;
        for b in &self.layer1 {
            h = b.call(&h)?;
        }
        h = self.seq.call(&h)?;
        self.head.call(&h)
    }
}

fn net() -> Net {
    ferrofx_core::ops::random::manual_seed(0);
    Net {
        stem: Linear::new(3, 4, true).unwrap(),
        layer1: vec![block(4), block(4)],
        head: Box::new(Linear::new(4, 2, false).unwrap()),
        extra: Some(Linear::new(1, 1, false).unwrap()),
        missing: None,
        seq: Sequential::new().append(Linear::new(4, 4, true).unwrap()),
    }
}

fn names(v: Vec<(String, Tensor)>) -> Vec<String> {
    v.into_iter().map(|(n, _)| n).collect()
}

#[test]
fn derive_discovers_parameters_buffers_children_with_pytorch_paths() {
    let n = net();
    assert_eq!(n.type_name(), "ResNetLike");
    assert_eq!(
        names(n.named_parameters()),
        [
            "stem.weight",
            "stem.bias",
            "layer1.0.scale",
            "layer1.0.conv1.weight",
            "layer1.0.conv1.bias",
            "layer1.1.scale",
            "layer1.1.conv1.weight",
            "layer1.1.conv1.bias",
            "fc.weight",
            "extra.weight",
            "seq.0.weight",
            "seq.0.bias",
        ]
    );
    assert_eq!(names(n.named_buffers()), ["layer1.0.running", "layer1.1.running"]);
    let mods: Vec<(String, &str)> = n.named_modules().into_iter().map(|(p, m)| (p, m.type_name())).collect();
    assert_eq!(
        mods,
        [
            ("".to_string(), "ResNetLike"),
            ("stem".into(), "Linear"),
            ("layer1.0".into(), "Block"),
            ("layer1.0.conv1".into(), "Linear"),
            ("layer1.1".into(), "Block"),
            ("layer1.1.conv1".into(), "Linear"),
            ("fc".into(), "Linear"),
            ("extra".into(), "Linear"),
            ("seq".into(), "Sequential"),
            ("seq.0".into(), "Linear"),
        ]
    );
    let kids: Vec<String> = n.named_children().into_iter().map(|(p, _)| p).collect();
    assert_eq!(kids, ["stem", "layer1.0", "layer1.1", "fc", "extra", "seq"]);
    // state dict: per module parameters then buffers
    let sd = n.state_dict();
    let keys: Vec<&str> = sd.keys().map(|k| k.as_str()).collect();
    assert_eq!(&keys[2..6], ["layer1.0.scale", "layer1.0.running", "layer1.0.conv1.weight", "layer1.0.conv1.bias"]);
    assert_eq!(sd.len(), 14);
}

#[test]
fn parameters_are_the_modules_own_handles() {
    let n = net();
    let p = n.parameters();
    assert!(p[0].same(&n.stem.weight));
    assert!(p.iter().all(|t| t.requires_grad()));
    assert!(n.buffers().iter().all(|t| !t.requires_grad()));
    assert!(n.get_tensor("layer1.1.conv1.bias").unwrap().same(n.layer1[1].conv1.bias.as_ref().unwrap()));
    assert!(n.get_tensor("layer1.1.running").unwrap().same(&n.layer1[1].running));
    assert_eq!(n.get_submodule("layer1.1.conv1").unwrap().type_name(), "Linear");
    assert_eq!(n.get_submodule("seq.0").unwrap().type_name(), "Linear");
    let e = n.get_submodule("layer1.7").unwrap_err().to_string();
    assert!(e.contains("ResNetLike has no submodule 'layer1'"), "{e}");
    let e = n.get_tensor("stem.nope").unwrap_err().to_string();
    assert!(e.contains("Linear has no parameter or buffer 'nope'"), "{e}");
}

#[test]
fn shared_parameters_listed_once() {
    let l = Linear::new(2, 2, false).unwrap();
    let l2 = Linear { weight: l.weight.clone(), bias: None, in_features: 2, out_features: 2 };
    let s = Sequential::new().append(l).append(l2);
    assert_eq!(names(s.named_parameters()), ["0.weight"]);
    assert_eq!(s.state_dict().len(), 2); // state_dict keeps both keys, as PyTorch
}

#[test]
fn train_eval_apply_and_dtype() {
    let mut n = net();
    assert!(n.is_training());
    n.eval();
    assert!(!n.layer1[0].training && !n.layer1[1].training);
    assert!(!n.is_training());
    n.train(true);
    assert!(n.layer1[1].training);
    let mut count = 0;
    n.apply(&mut |m| {
        if m.type_name() == "Linear" {
            count += 1
        }
    });
    assert_eq!(count, 6);
    n.to_dtype(DType::F64).unwrap();
    assert!(n.parameters().iter().all(|p| p.dtype() == DType::F64 && p.requires_grad() && p.is_leaf()));
    assert_eq!(n.layer1[0].running.dtype(), DType::F64);
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[1, 3]).unwrap();
    assert_eq!(n.forward(&x).unwrap().shape(), &[1, 2]);
    let e = n.to_dtype(DType::I64).unwrap_err().to_string();
    assert!(e.contains("only accepts floating point dtypes"), "{e}");
}

#[test]
fn repr_looks_like_pytorch() {
    let s = Sequential::new().append(Linear::new(3, 4, true).unwrap()).append(ferrofx_nn::Flatten::default());
    assert_eq!(
        s.repr(),
        "Sequential(\n  (0): Linear(in_features=3, out_features=4, bias=True)\n  (1): Flatten(start_dim=1, end_dim=-1)\n)"
    );
}

#[test]
fn containers() {
    let mut l = ModuleList::new();
    l.push(Linear::new(1, 1, true).unwrap());
    l.push(Linear::new(1, 2, true).unwrap());
    assert_eq!(names(l.named_parameters())[2], "1.weight");
    assert!(l.forward(&Tensor::scalar(1.0f32)).unwrap_err().to_string().contains("ModuleList has no forward"));
    let mut d = ModuleDict::new();
    d.insert("enc", Linear::new(1, 1, false).unwrap()).unwrap();
    d.insert("dec", Linear::new(1, 1, false).unwrap()).unwrap();
    assert_eq!(names(d.named_parameters()), ["enc.weight", "dec.weight"]);
    assert!(d.insert("a.b", Linear::new(1, 1, false).unwrap()).unwrap_err().to_string().contains("can't contain"));
}

struct Recorder(RefCell<Vec<String>>);
impl ModuleCallHook for Recorder {
    fn call_module(&self, module: &dyn Module, inputs: &[Value]) -> Result<Vec<Value>> {
        self.0.borrow_mut().push(format!("{}:{}", module.type_name(), module.is_builtin_leaf()));
        // a tracer would record a call_module node for leaves; this one runs every module
        module.forward_values(inputs)
    }
}

#[test]
fn module_call_hook_sees_every_call() {
    let n = net();
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 3]).unwrap();
    let plain = n.call(&x).unwrap();
    let rec = Rc::new(Recorder(RefCell::new(Vec::new())));
    let hooked = ferrofx_nn::with_module_call_hook(rec.clone(), || n.call(&x)).unwrap();
    assert_eq!(plain.to_vec::<f32>().unwrap(), hooked.to_vec::<f32>().unwrap());
    assert_eq!(
        *rec.0.borrow(),
        [
            "ResNetLike:false",
            "Linear:true",
            "Block:false",
            "Linear:true",
            "Block:false",
            "Linear:true",
            "Sequential:false",
            "Linear:true",
            "Linear:true"
        ]
    );
    assert!(!ferrofx_nn::has_module_call_hook());
}

#[test]
fn state_dict_round_trip_through_safetensors() {
    let a = net();
    let b = net2();
    let bytes = state_dict_to_bytes(&a.state_dict(), None).unwrap();
    let sd = state_dict_from_bytes(&bytes).unwrap();
    let handle = b.stem.weight.clone();
    let report = b.load_state_dict(&sd, true).unwrap();
    assert_eq!(report, Default::default());
    assert!(b.stem.weight.same(&handle), "load_state_dict copies in place");
    for ((ka, ta), (kb, tb)) in a.state_dict().iter().zip(b.state_dict().iter()) {
        assert_eq!(ka, kb);
        assert_eq!(ta.to_vec_f64().unwrap(), tb.to_vec_f64().unwrap(), "{ka}");
    }
    let path = std::env::temp_dir().join(format!("ferrofx_nn_sd_{}.safetensors", std::process::id()));
    save_state_dict(&a.state_dict(), &path).unwrap();
    let sd2 = load_state_dict_file(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(sd2.len(), 14);
    assert!(state_dict_from_bytes(&bytes[..bytes.len() - 3])
        .unwrap_err()
        .to_string()
        .contains("invalid safetensors data"));
    assert!(load_state_dict_file("/nonexistent/x.safetensors").unwrap_err().to_string().contains("cannot read"));
}

fn net2() -> Net {
    ferrofx_core::ops::random::manual_seed(1);
    let mut n = net();
    ferrofx_core::ops::random::manual_seed(1);
    n.stem = Linear::new(3, 4, true).unwrap();
    n
}

// ----- acceptance 4: load_state_dict errors, by message (PyTorch's wording) -----

fn simple() -> Sequential {
    Sequential::new().append(Linear::new(4, 3, true).unwrap())
}

#[test]
fn load_state_dict_missing_unexpected_and_size_mismatch() {
    let m = simple();
    let mut sd: StateDict = m.state_dict();
    sd.shift_remove("0.bias");
    sd.insert("0.extra".into(), Tensor::from_vec(vec![0.0f32], &[1]).unwrap());
    sd.insert("0.weight".into(), Tensor::from_vec(vec![0.0f32; 15], &[3, 5]).unwrap());
    let before = m.state_dict()["0.weight"].to_vec::<f32>().unwrap();
    let e = m.load_state_dict(&sd, true).unwrap_err();
    assert_eq!(
        e.message(),
        "Error(s) in loading state_dict for Sequential:\n\tMissing key(s) in state_dict: \"0.bias\". \n\tUnexpected key(s) in state_dict: \"0.extra\". \n\tsize mismatch for 0.weight: copying a param with shape torch.Size([3, 5]) from checkpoint, the shape in current model is torch.Size([3, 4])."
    );
    // non-strict still rejects shape mismatches, and nothing was modified
    let e = m.load_state_dict(&sd, false).unwrap_err();
    assert_eq!(
        e.message(),
        "Error(s) in loading state_dict for Sequential:\n\tsize mismatch for 0.weight: copying a param with shape torch.Size([3, 5]) from checkpoint, the shape in current model is torch.Size([3, 4])."
    );
    assert_eq!(m.state_dict()["0.weight"].to_vec::<f32>().unwrap(), before);
}

#[test]
fn load_state_dict_missing_only_and_non_strict_report() {
    let m = simple();
    let mut sd = m.state_dict();
    sd.shift_remove("0.bias");
    sd.shift_remove("0.weight");
    let e = m.load_state_dict(&sd, true).unwrap_err();
    assert_eq!(
        e.message(),
        "Error(s) in loading state_dict for Sequential:\n\tMissing key(s) in state_dict: \"0.weight\", \"0.bias\". "
    );
    let mut sd = m.state_dict();
    sd.insert("junk".into(), Tensor::scalar(1i64));
    let e = m.load_state_dict(&sd, true).unwrap_err();
    assert_eq!(
        e.message(),
        "Error(s) in loading state_dict for Sequential:\n\tUnexpected key(s) in state_dict: \"junk\". "
    );
    let new_w = Tensor::from_vec(vec![2.0f64; 12], &[3, 4]).unwrap(); // f64 converts to f32
    let mut sd = StateDict::new();
    sd.insert("0.weight".into(), new_w);
    sd.insert("junk".into(), Tensor::scalar(1i64));
    let r = m.load_state_dict(&sd, false).unwrap();
    assert_eq!(r.missing_keys, ["0.bias"]);
    assert_eq!(r.unexpected_keys, ["junk"]);
    assert_eq!(m.state_dict()["0.weight"].to_vec::<f32>().unwrap(), vec![2.0f32; 12]);
    assert_eq!(m.state_dict()["0.weight"].dtype(), DType::F32);
}

#[test]
fn generic_modules_and_kinds() {
    #[derive(ferrofx_nn::Module)]
    struct Wrap<M: Module> {
        inner: M,
        tag: u8,
    }
    impl<M: Module> Module for Wrap<M> {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            self.inner.call(x)
        }
    }
    let w = Wrap { inner: Linear::new(2, 2, true).unwrap(), tag: 1 };
    assert_eq!(names(w.named_parameters()), ["inner.weight", "inner.bias"]);
    let mut kinds = Vec::new();
    w.inner.visit_tensors(&mut |n, k, _| kinds.push((n.to_string(), k)));
    assert_eq!(kinds, [("weight".to_string(), TensorKind::Parameter), ("bias".to_string(), TensorKind::Parameter)]);
    assert_eq!(w.tag, 1);
    let dynm: &dyn Module = &w;
    assert!(dynm.as_any().downcast_ref::<Wrap<Linear>>().is_some());
}

#[test]
fn default_init_bounds_and_seed() {
    // the default generator is shared by parallel tests: use a private one
    use ferrofx_core::ops::random::{with_generator, Generator};
    let a = with_generator(&Generator::new(3), || Linear::new(16, 8, true)).unwrap();
    let b = with_generator(&Generator::new(3), || Linear::new(16, 8, true)).unwrap();
    assert_eq!(a.weight.to_vec::<f32>().unwrap(), b.weight.to_vec::<f32>().unwrap());
    let w = a.weight.to_vec::<f32>().unwrap();
    assert!(w.iter().all(|v| v.abs() <= 0.25 + 1e-6));
    assert!(w.iter().any(|v| v.abs() > 0.2));
    assert!(a.bias.unwrap().to_vec::<f32>().unwrap().iter().all(|v| v.abs() <= 0.25));
}
