//! [`compile`] and [`CompiledModule`]: a GraphModule specialised to input shapes, with a
//! bounded cache of specialisations keyed by the inputs' shape signature.

use crate::fusion::{fuse_elementwise, plan_fusion, FusionPlan};
use crate::memory::{plan_memory, MemoryPlan};
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use ferrofx_fx::passes::manager::PassManager;
use ferrofx_fx::transformer::emit;
use ferrofx_fx::{Argument, Graph, GraphModule, Kwargs, Node, Opcode, ShapeProp, Target, Transformer};
use ferrofx_nn::Module;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What [`compile`] does.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    /// Run the inference pipeline first (`PassManager::inference`: DCE, Conv/Linear+BatchNorm
    /// folding, identity-dropout removal, constant folding, CSE, simplification).
    pub inference_passes: bool,
    /// Turn stateless activation leaves (`ReLU`, `ReLU6`, `Sigmoid`, `Tanh`, `SiLU`,
    /// `Hardswish`) into the registry ops they call, so they can fuse.
    pub lower_activation_modules: bool,
    /// Fuse elementwise groups ([`crate::fusion`]).
    pub fuse_elementwise: bool,
    /// Fuse a convolution's or a batch norm's residual add and activation into it
    /// ([`crate::epilogue`]), and relu's gradient mask into the backward kernels of max pooling
    /// and batch norm ([`crate::relu_backward`], training graphs).
    pub fuse_conv_epilogue: bool,
    /// Switch convolutions to the channel-blocked NCHW16c layout where its direct kernel is
    /// faster on this CPU, with reorders where values cross layouts ([`crate::layout`];
    /// inference graphs only: with [`CompileOptions::inference_passes`] and
    /// [`CompileOptions::fuse_conv_epilogue`]).
    pub nchwc_layout: bool,
    /// Trace composite layers (`MultiheadAttention`, `TransformerEncoderLayer`) through, per
    /// shape specialisation, so the other passes see their operations ([`crate::inline`]).
    pub inline_composite_modules: bool,
    /// Store each constant `linear` weight transposed and contiguous, multiplied by `addmm`
    /// ([`crate::linear_weights`]; with [`CompileOptions::inference_passes`] only: the weights
    /// are frozen).
    pub prepack_weights: bool,
    /// How many shape specialisations the cache keeps (least recently used dropped first).
    pub cache_size: usize,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            inference_passes: true,
            lower_activation_modules: true,
            fuse_elementwise: true,
            fuse_conv_epilogue: true,
            nchwc_layout: true,
            inline_composite_modules: true,
            prepack_weights: true,
            cache_size: 8,
        }
    }
}

/// The shapes and dtypes of a call's tensor inputs (other inputs by value): the cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShapeSignature(pub Vec<String>);

impl ShapeSignature {
    /// The signature of `inputs`.
    pub fn of(inputs: &[Value]) -> ShapeSignature {
        ShapeSignature(
            inputs
                .iter()
                .map(|v| match v {
                    Value::Tensor(t) => format!("{}{:?}", t.dtype(), t.shape()),
                    other => format!("{other:?}"),
                })
                .collect(),
        )
    }
}

impl fmt::Display for ShapeSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({})", self.0.join(", "))
    }
}

/// One specialisation: the optimised GraphModule for one shape signature and what the
/// compiler decided for it.
pub struct Specialization {
    /// The signature it was compiled for.
    pub signature: ShapeSignature,
    /// The optimised module (fused nodes are ordinary `fused_elementwise` nodes: print, save,
    /// load and interpret it like any GraphModule).
    pub module: GraphModule,
    /// The fusion groups and the boundaries left, with their reasons.
    pub fusion: FusionPlan,
    /// The arena plan of the intermediates and the peak intermediate memory.
    pub memory: MemoryPlan,
    /// Wall time of shape propagation, fusion and planning.
    pub compile_time: Duration,
    /// The signature's tensor shapes and dtypes (`None`: a non-tensor input, compared by its
    /// text): the allocation-free check of a call against the most recent specialisation.
    shapes: Vec<Option<(DType, Vec<usize>)>>,
}

impl Specialization {
    /// Whether `inputs` have this specialisation's signature, without building the signature
    /// text (a training step calls the same specialisation thousands of times).
    fn accepts(&self, inputs: &[Value]) -> bool {
        self.shapes.len() == inputs.len()
            && self.shapes.iter().zip(inputs).zip(&self.signature.0).all(|((s, v), text)| match (s, v) {
                (Some((dt, shape)), Value::Tensor(t)) => t.dtype() == *dt && t.shape() == shape.as_slice(),
                (None, Value::Tensor(_)) | (Some(_), _) => false,
                (None, other) => format!("{other:?}") == *text,
            })
    }
}

/// Cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Calls served by a cached specialisation.
    pub hits: u64,
    /// Calls that compiled a new one.
    pub misses: u64,
    /// Specialisations dropped because the cache was full.
    pub evictions: u64,
    /// Specialisations held now.
    pub len: usize,
}

/// A compiled module: runs like the GraphModule it was made from, specialised to each input
/// shape signature it meets (compiled once per signature, cached, bounded).
pub struct CompiledModule {
    prepared: GraphModule,
    options: CompileOptions,
    cache: Mutex<Vec<Arc<Specialization>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    prepare_time: Duration,
}

impl fmt::Debug for CompiledModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledModule")
            .field("module", &self.prepared.traced_type_name())
            .field("options", &self.options)
            .field("cache", &self.cache_stats())
            .finish()
    }
}

/// Copies a GraphModule (leaves copied sharing their tensors), turning stateless activation
/// leaves into registry ops when asked.
struct Prepare {
    activation_ops: HashMap<String, &'static str>,
}

impl Transformer for Prepare {
    fn call_module(&mut self, g: &mut Graph, node: Node<'_>, args: Vec<Argument>, kwargs: Kwargs) -> Result<Argument> {
        match self.activation_ops.get(node.target().name()) {
            Some(op) if args.len() == 1 && kwargs.is_empty() => {
                let err = |e: ferrofx_fx::GraphError| Error::argument("compile", e.to_string());
                let target = Target::op(op).map_err(err)?;
                let id =
                    g.create_node(Opcode::CallFunction, target, args, kwargs, Some(node.name()), None).map_err(err)?;
                *g.meta_mut(id).map_err(err)? = node.meta().clone();
                Ok(Argument::Node(id))
            }
            _ => emit(g, node, node.target().clone(), args, kwargs),
        }
    }
}

fn activation_op(type_name: &str) -> Option<&'static str> {
    Some(match type_name {
        "ReLU" => "relu",
        "ReLU6" => "relu6",
        "Sigmoid" => "sigmoid",
        "Tanh" => "tanh",
        "SiLU" => "silu",
        "Hardswish" => "hardswish",
        _ => return None,
    })
}

/// Compiles `gm` for inference (the compiled copy runs in eval mode, without autograd through
/// fused nodes), specialised to `example_inputs` (their shapes and dtypes; the
/// values are run once through shape propagation). torch.compile's role in ferrofx.
///
/// The pipeline is ordinary passes over a copy of `gm` (which is left untouched): the
/// inference passes, activation lowering, then, per shape signature, shape propagation,
/// [`crate::inline::inline_composite_modules`] (transformer layers opened),
/// [`crate::linear_weights::prepack_linear_weights`], [`crate::epilogue::fuse_conv_epilogue`],
/// [`crate::fusion::fuse_elementwise`] and [`crate::memory::plan_memory`]. Calls with other
/// shapes compile once more and are cached ([`CompileOptions::cache_size`]).
///
/// ```
/// use ferrofx_compile::{compile, CompileOptions};
/// use ferrofx_fx::trace_with_inputs;
/// use ferrofx_nn::zoo::DigitsCnn;
/// use ferrofx_nn::Module;
///
/// let mut model = DigitsCnn::new()?;
/// model.eval();
/// let x = ferrofx_core::ops::random::randn(&[4, 1, 8, 8], None)?;
/// let gm = trace_with_inputs(&model, &[(&x).into()])?;
/// let compiled = compile(&gm, &[(&x).into()], CompileOptions::default())?;
/// let (a, b) = (model.forward(&x)?, compiled.forward(&x)?);
/// assert_eq!(a.shape(), b.shape());
/// // the call above hit the plan compiled for `x`; another batch size compiles once more,
/// // then hits the cache
/// let x2 = ferrofx_core::ops::random::randn(&[2, 1, 8, 8], None)?;
/// compiled.forward(&x2)?;
/// compiled.forward(&x2)?;
/// assert_eq!(compiled.cache_stats().misses, 2);
/// assert_eq!(compiled.cache_stats().hits, 2);
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn compile(gm: &GraphModule, example_inputs: &[Value], options: CompileOptions) -> Result<CompiledModule> {
    if options.cache_size == 0 {
        return Err(Error::argument("compile", "CompileOptions::cache_size must be at least 1"));
    }
    let t0 = Instant::now();
    let activation_ops = if options.lower_activation_modules {
        gm.leaf_modules().iter().filter_map(|(p, m)| activation_op(m.type_name()).map(|op| (p.clone(), op))).collect()
    } else {
        HashMap::new()
    };
    let mut prepared = Prepare { activation_ops }.transform(gm)?;
    // compile targets inference: the copy (and its leaf copies) run in eval mode, so
    // BatchNorm uses its running statistics and can be folded; `gm` itself is unchanged
    prepared.eval();
    if options.inference_passes {
        PassManager::inference().run(&mut prepared)?;
    }
    prepared.delete_all_unused_submodules();
    let compiled = CompiledModule {
        prepared,
        options,
        cache: Mutex::new(Vec::new()),
        hits: AtomicU64::new(0),
        misses: AtomicU64::new(0),
        evictions: AtomicU64::new(0),
        prepare_time: t0.elapsed(),
    };
    compiled.specialize(example_inputs)?;
    Ok(compiled)
}

/// [`compile`] from input shapes alone (float32 inputs of these shapes).
pub fn compile_for_shapes(gm: &GraphModule, shapes: &[&[usize]], options: CompileOptions) -> Result<CompiledModule> {
    let inputs = shapes
        .iter()
        .map(|s| ferrofx_core::ops::kernel::zeros(s, DType::F32).map(Value::Tensor))
        .collect::<Result<Vec<_>>>()?;
    compile(gm, &inputs, options)
}

impl CompiledModule {
    /// The specialisation for `inputs`' signature, compiling it on a miss.
    pub fn specialize(&self, inputs: &[Value]) -> Result<Arc<Specialization>> {
        {
            let cache = self.cache.lock();
            if let Some(last) = cache.last().filter(|s| s.accepts(inputs)) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(last.clone());
            }
        }
        let sig = ShapeSignature::of(inputs);
        {
            let mut cache = self.cache.lock();
            if let Some(i) = cache.iter().position(|s| s.signature == sig) {
                let s = cache.remove(i);
                cache.push(s.clone());
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(s);
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let spec = Arc::new(self.build(sig, inputs)?);
        let mut cache = self.cache.lock();
        if !cache.iter().any(|s| s.signature == spec.signature) {
            cache.push(spec.clone());
        }
        while cache.len() > self.options.cache_size {
            cache.remove(0);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(spec)
    }

    fn build(&self, signature: ShapeSignature, inputs: &[Value]) -> Result<Specialization> {
        let t0 = Instant::now();
        // Shape propagation runs the graph on the example inputs; for an inference compile it
        // runs without autograd, which would otherwise keep every activation alive until the
        // outputs are dropped (MobileNetV2 at batch 8: 450 MB of saved tensors, not 46 MiB).
        // The recorded `requires_grad` of its values is then false, as it is when they run.
        let _no_grad = self.options.inference_passes.then(ferrofx_core::autograd::no_grad);
        let mut module = Prepare { activation_ops: HashMap::new() }.transform(&self.prepared)?;
        let invalid = |e: Error, module: &GraphModule| {
            Error::shape(
                "compile",
                format!(
                    "the inputs {signature} make the graph of '{}' invalid: {} (in op '{}'); pass inputs of the shapes the model accepts",
                    module.traced_type_name(),
                    e.message(),
                    e.op()
                ),
            )
        };
        ShapeProp::propagate(&mut module, inputs).map_err(|e| invalid(e, &module))?;
        if self.options.inline_composite_modules && crate::inline::has_composite_leaf(&module) {
            module = crate::inline::inline_composite_modules(&module, inputs)?;
            module.eval();
            if self.options.inference_passes {
                PassManager::inference().run(&mut module)?;
            }
            module.delete_all_unused_submodules();
            ShapeProp::propagate(&mut module, inputs).map_err(|e| invalid(e, &module))?;
        }
        if self.options.prepack_weights
            && self.options.inference_passes
            && crate::linear_weights::prepack_linear_weights(&mut module)? > 0
        {
            module.recompile()?;
            ShapeProp::propagate(&mut module, inputs).map_err(|e| invalid(e, &module))?;
        }
        if self.options.fuse_conv_epilogue {
            crate::epilogue::fuse_conv_epilogue(&mut module)?;
            crate::relu_backward::fuse_relu_backward(&mut module)?;
            if self.options.nchwc_layout && self.options.inference_passes {
                crate::layout::convert_to_nchwc(&mut module)?;
            }
            module.recompile()?;
        }
        let fusion = plan_fusion(module.graph())?;
        if self.options.fuse_elementwise {
            fuse_elementwise(&mut module)?;
            module.recompile()?;
        }
        let memory = plan_memory(module.graph())?;
        let shapes = inputs
            .iter()
            .map(|v| match v {
                Value::Tensor(t) => Some((t.dtype(), t.shape().to_vec())),
                _ => None,
            })
            .collect();
        Ok(Specialization { signature, module, fusion, memory, compile_time: t0.elapsed() + self.prepare_time, shapes })
    }

    /// Runs the compiled module on `inputs` (any shapes: a new signature compiles once).
    pub fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        self.specialize(inputs)?.module.forward_values(inputs)
    }

    /// Runs the compiled module on inputs it takes ownership of, each dropped after its last use
    /// ([`GraphModule::forward_values_owned`]: what a compiled backward needs to free the saved
    /// activations as it goes).
    pub fn forward_values_owned(&self, inputs: Vec<Value>) -> Result<Vec<Value>> {
        let spec = self.specialize(&inputs)?;
        spec.module.forward_values_owned(inputs)
    }

    /// Runs a one-input, one-output module.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.forward_values(&[Value::Tensor(x.clone())])?;
        match out.into_iter().next() {
            Some(Value::Tensor(t)) => Ok(t),
            other => Err(Error::argument("compile", format!("expected one tensor output, got {other:?}"))),
        }
    }

    /// The most recently used specialisation (the one for the example inputs right after
    /// [`compile`]).
    pub fn latest(&self) -> Option<Arc<Specialization>> {
        self.cache.lock().last().cloned()
    }

    /// The module after the shape-independent passes (before specialisation).
    pub fn prepared(&self) -> &GraphModule {
        &self.prepared
    }

    /// Hits, misses, evictions and size of the specialisation cache.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            len: self.cache.lock().len(),
        }
    }
}
