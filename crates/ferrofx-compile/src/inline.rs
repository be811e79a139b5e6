//! Inlining composite layers: `MultiheadAttention` and `TransformerEncoderLayer` are leaves of
//! the default tracer (as in torch.fx, where `torch.nn` layers are leaves), so a traced
//! transformer is a chain of opaque `call_module` nodes that no pass can look into. The
//! compiler traces such a module again with the layers opened — the `GraphModule` is itself a
//! module, so [`ferrofx_fx::Tracer`] records what running it does, with every composite leaf
//! traced through down to its primitive layers (`Linear`, `LayerNorm`, `Dropout`) and registry
//! ops (`matmul`, `softmax`, `gelu`, ...). torch.compile's graph capture does the same: it
//! traces through `nn.Module` calls.
//!
//! The composite layers compute with their inputs' shapes (head split, sequence length), so
//! the inlined graph is specialised to those shapes: [`crate::compile`] inlines per shape
//! specialisation, after which its other passes (pre-packed weights, fusion, memory plan) see
//! the transformer's ops.

use ferrofx_core::{Result, Value};
use ferrofx_fx::{GraphModule, Tracer};
use ferrofx_nn::Module;

/// The leaf layers [`inline_composite_modules`] opens.
pub const COMPOSITE_LAYERS: &[&str] = &["MultiheadAttention", "TransformerEncoderLayer"];

fn is_composite(m: &dyn Module) -> bool {
    COMPOSITE_LAYERS.contains(&m.type_name())
}

/// Whether `gm` calls a composite layer (see the module docs).
pub fn has_composite_leaf(gm: &GraphModule) -> bool {
    gm.leaf_modules().values().any(|m| is_composite(m.as_ref()))
}

/// `gm` traced again with `inputs`, every composite layer traced through (other leaves stay
/// leaves). The result computes the same values; its graph holds the layers' operations,
/// specialised to `inputs`' shapes.
///
/// ```
/// use ferrofx_compile::inline::{has_composite_leaf, inline_composite_modules};
/// use ferrofx_fx::trace_with_inputs;
/// use ferrofx_nn::{Module, TransformerEncoderLayer};
///
/// let mut layer = TransformerEncoderLayer::new(16, 2, 32, 0.0, "relu", true, false)?;
/// layer.eval();
/// let x = ferrofx_core::ops::random::randn(&[2, 5, 16], None)?;
/// let gm = trace_with_inputs(&layer, &[(&x).into()])?;
/// assert!(!gm.graph().to_string().contains("scaled_dot_product_attention")); // one opaque call_module
/// let inlined = inline_composite_modules(&gm, &[(&x).into()])?;
/// assert!(!has_composite_leaf(&inlined));
/// assert!(inlined.graph().to_string().contains("scaled_dot_product_attention"));
/// let d = (inlined.forward(&x)? - layer.forward(&x)?)?.abs()?.max()?.item()?;
/// assert!(d < 1e-6, "{d}");
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn inline_composite_modules(gm: &GraphModule, inputs: &[Value]) -> Result<GraphModule> {
    let _g = ferrofx_core::autograd::no_grad();
    let out = Tracer::new().is_leaf_module(|m, _| !is_composite(m)).trace_with_inputs(gm, inputs)?;
    out.lint()?;
    Ok(out)
}
