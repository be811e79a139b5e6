//! [`wrap`]: FX's `torch.fx.wrap` for Rust functions: a user function recorded as one
//! `call_function` leaf instead of being traced through.
//!
//! Python's `wrap("f")` patches the global `f` so that a call on proxies records a node. Rust
//! functions cannot be patched, so the function is registered as an op of the registry (the
//! single dispatch point every traced call goes through) and called through the returned
//! [`Wrapped`] handle: run eagerly it runs the kernel, traced it records
//! `call_function[target=name]`. Being a registry op, the node runs in a GraphModule and saves
//! and loads by name (a process that loads the file registers the function first, as it would
//! import it in Python). ferrofx's own ops need no wrapping: every registry op is a leaf
//! already, as FX's autowrapped functions.
//!
//! ```
//! use ferrofx_core::op::{ArgSpec, ArgType, MetaOutputs, Outputs};
//! use ferrofx_core::{Result, Tensor, Value};
//! use ferrofx_fx::{symbolic_trace, wrap::wrap};
//! use ferrofx_nn::Module;
//!
//! fn meta(a: &[Value]) -> Result<MetaOutputs> {
//!     Ok(smallvec::smallvec![a[0].as_tensor().unwrap().meta().unwrap()])
//! }
//! fn kernel(a: &[Value]) -> Result<Outputs> {
//!     let x = a[0].as_tensor().unwrap();
//!     Ok(smallvec::smallvec![(&(x * x)? + 1.0)?])
//! }
//! static SCHEMA: &[ArgSpec] = &[ArgSpec::req("x", ArgType::Tensor)];
//! let square_plus_one = wrap("doc_square_plus_one", SCHEMA, meta, kernel).unwrap();
//!
//! #[derive(ferrofx_nn::Module)]
//! struct M {}
//! impl Module for M {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         // traced: one call_function node, not its mul and add
//!         let f = ferrofx_fx::wrap::wrapped("doc_square_plus_one").unwrap();
//!         f.call1(&x.relu()?)
//!     }
//! }
//! let gm = symbolic_trace(&M {}).unwrap();
//! assert!(gm.graph().to_string().contains("call_function[target=doc_square_plus_one]"));
//! let x = Tensor::from_vec(vec![-1.0f32, 2.0], &[2]).unwrap();
//! assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 5.0]);
//! # let _ = square_plus_one;
//! ```

use ferrofx_core::op::{self, ArgSpec, Category, Cost, Effect, KernelFn, MetaFn, OpDef, Saves};
use ferrofx_core::{Error, Result, Tensor, Value};

/// A wrapped user function: a registry op called through the dispatch point.
#[derive(Clone, Copy, Debug)]
pub struct Wrapped {
    def: &'static OpDef,
}

impl Wrapped {
    /// The registry op.
    pub fn op(&self) -> &'static OpDef {
        self.def
    }

    /// Calls the function: runs it, or records a `call_function` node while tracing.
    pub fn call(&self, args: Vec<Value>) -> Result<Vec<Tensor>> {
        Ok(op::call(self.def.name, args, vec![])?.into_iter().collect())
    }

    /// Calls a function of one tensor returning one tensor.
    pub fn call1(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.call(vec![Value::Tensor(x.clone())])?;
        match (out.pop(), out.is_empty()) {
            (Some(t), true) => Ok(t),
            _ => Err(Error::argument(self.def.name, "expected the wrapped function to return one tensor")),
        }
    }
}

/// Registers `kernel` (with its `schema` and its `meta`, the output shapes from the input
/// shapes, used when tracing with example inputs) as the pure function `name`, to be recorded
/// as a `call_function` leaf (FX's `torch.fx.wrap`). Wrapping the same name again with the same
/// kernel returns the same function; another kernel under a taken name is an error.
pub fn wrap(name: &str, schema: &'static [ArgSpec], meta: MetaFn, kernel: KernelFn) -> Result<Wrapped> {
    if let Some(def) = op::lookup(name) {
        if std::ptr::fn_addr_eq(def.kernel, kernel) {
            return Ok(Wrapped { def });
        }
        return Err(Error::schema(
            name,
            format!("wrap: the name '{name}' is taken by another op; choose another name for the wrapped function"),
        ));
    }
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let def = op::register(OpDef {
        name,
        schema,
        meta,
        kernel,
        cost: |_, _| Cost::default(),
        effect: Effect::Pure,
        category: Category::Other,
        backward: None,
        saves: Saves::NOTHING,
        doc: "A user function wrapped as a call_function leaf (FX's torch.fx.wrap).",
    })?;
    Ok(Wrapped { def })
}

/// The function wrapped under `name` earlier, or an error naming it.
pub fn wrapped(name: &str) -> Result<Wrapped> {
    op::lookup(name)
        .map(|def| Wrapped { def })
        .ok_or_else(|| Error::argument("wrap", format!("no function is wrapped under the name '{name}'")))
}
