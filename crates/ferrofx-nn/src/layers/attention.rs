//! MultiheadAttention and TransformerEncoderLayer (PyTorch layout and key names).

use super::{Dropout, LayerNorm, Linear};
use crate::spec::{self, Attr, ModuleSpec, TensorSource};
use crate::{functional as F, init, Module};
use ferrofx_core::{DType, Error, Result, Tensor, Value};

/// `nn.MultiheadAttention(embed_dim, num_heads, dropout=0, bias=True, batch_first=False)`:
/// `in_proj_weight [3E, E]` (xavier_uniform), `in_proj_bias [3E]` (zeros), `out_proj`
/// (Linear, bias zeros).
///
/// `forward(x)` is self-attention returning the output only; `forward_values([query, key,
/// value, key_padding_mask?, need_weights?, attn_mask?])` returns `[output, weights]` with the
/// weights averaged over heads (or `None` when `need_weights` is false). Boolean masks mark
/// positions that may **not** be attended, as in PyTorch; float masks are added.
#[derive(crate::Module, Clone)]
pub struct MultiheadAttention {
    /// `[3E, E]`
    pub in_proj_weight: Tensor,
    /// `[3E]`
    pub in_proj_bias: Option<Tensor>,
    /// Output projection.
    pub out_proj: Linear,
    /// E
    pub embed_dim: usize,
    /// H
    pub num_heads: usize,
    /// Attention dropout.
    pub dropout: f64,
    /// Inputs are `[N, L, E]` instead of `[L, N, E]`.
    pub batch_first: bool,
    training: bool,
}

impl MultiheadAttention {
    /// `MultiheadAttention(embed_dim, num_heads, dropout, bias, batch_first)`.
    pub fn new(embed_dim: usize, num_heads: usize, dropout: f64, bias: bool, batch_first: bool) -> Result<Self> {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::argument(
                "MultiheadAttention",
                format!("embed_dim must be divisible by num_heads (got {embed_dim} and {num_heads})"),
            ));
        }
        let e = embed_dim;
        let in_proj_weight = init::parameter(&[3 * e, e], |t| init::xavier_uniform_(t, 1.0))?;
        let in_proj_bias = if bias { Some(init::parameter(&[3 * e], init::zeros_)?) } else { None };
        let out_proj = Linear::new(e, e, bias)?;
        if let Some(b) = &out_proj.bias {
            init::zeros_(b)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            embed_dim,
            num_heads,
            dropout,
            batch_first,
            training: true,
        })
    }

    /// Attention of `query` over `key`/`value`; returns the output and (if `need_weights`) the
    /// head-averaged weights `[N, L, S]`.
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
        need_weights: bool,
        attn_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let name = "MultiheadAttention";
        let (q_in, k_in, v_in) = if self.batch_first {
            (query.transpose(0, 1)?, key.transpose(0, 1)?, value.transpose(0, 1)?)
        } else {
            (query.clone(), key.clone(), value.clone())
        };
        let (qs, ks) = (q_in.shape().to_vec(), k_in.shape().to_vec());
        let e = self.embed_dim;
        if qs.len() != 3 || qs[2] != e || ks.len() != 3 || ks[2] != e || v_in.shape() != ks.as_slice() {
            return Err(Error::shape(
                name,
                format!(
                    "expected query [L, N, {e}] and key/value [S, N, {e}] (batch_first={}), got {:?}, {:?}, {:?}",
                    self.batch_first,
                    query.shape(),
                    key.shape(),
                    value.shape()
                ),
            ));
        }
        let (l, n, s) = (qs[0] as i64, qs[1] as i64, ks[0] as i64);
        let h = self.num_heads as i64;
        let hd = (e / self.num_heads) as i64;
        let ei = e as i64;
        if !need_weights && attn_mask.is_none() && key_padding_mask.is_none() {
            let o = self.attend_fused(query, key, value, [l, n, h, hd])?;
            return Ok((o, None));
        }
        let w = &self.in_proj_weight;
        let part = |i: i64| -> Result<(Tensor, Option<Tensor>)> {
            Ok((w.narrow(0, i * ei, ei)?, self.in_proj_bias.as_ref().map(|b| b.narrow(0, i * ei, ei)).transpose()?))
        };
        let (wq, bq) = part(0)?;
        let (wk, bk) = part(1)?;
        let (wv, bv) = part(2)?;
        let q = F::linear(&q_in, &wq, bq.as_ref())?;
        let k = F::linear(&k_in, &wk, bk.as_ref())?;
        let v = F::linear(&v_in, &wv, bv.as_ref())?;
        // [L, N, E] -> [N*H, L, hd]
        let q = q.reshape(&[l, n * h, hd])?.transpose(0, 1)?;
        let k = k.reshape(&[s, n * h, hd])?.transpose(0, 1)?;
        let v = v.reshape(&[s, n * h, hd])?.transpose(0, 1)?;
        let scores = F::mul(&q.matmul(&k.transpose(1, 2)?)?, 1.0 / (hd as f64).sqrt())?; // [N*H, L, S]
        let mut scores = scores;
        if let Some(m) = attn_mask {
            scores =
                if m.dtype() == DType::Bool { scores.masked_fill(m, f64::NEG_INFINITY)? } else { F::add(&scores, m)? };
        }
        if let Some(kpm) = key_padding_mask {
            if kpm.shape() != [n as usize, s as usize] {
                return Err(Error::shape(
                    name,
                    format!("key_padding_mask must be [N, S] = [{n}, {s}], got {:?}", kpm.shape()),
                ));
            }
            let kpm = if kpm.dtype() == DType::Bool { kpm.clone() } else { kpm.to_dtype(DType::Bool)? };
            let m = kpm.reshape(&[n, 1, 1, s])?.expand(&[n, h, 1, s])?.reshape(&[n * h, 1, s])?;
            scores = scores.masked_fill(&m, f64::NEG_INFINITY)?;
        }
        let p = F::softmax(&scores, -1)?;
        let p = F::dropout(&p, self.dropout, self.training)?;
        let o = p.matmul(&v)?; // [N*H, L, hd]
        let o = o.transpose(0, 1)?.reshape(&[l * n, ei])?;
        let o = self.out_proj.call(&o)?.reshape(&[l, n, ei])?;
        let o = if self.batch_first { o.transpose(0, 1)? } else { o };
        let weights = if need_weights { Some(p.reshape(&[n, h, l, s])?.mean_dim(&[1], false)?) } else { None };
        Ok((o, weights))
    }
}

impl MultiheadAttention {
    /// The attention without weights or masks, as PyTorch's `multi_head_attention_forward` with
    /// `need_weights=False`: one input projection when query, key and value are one tensor
    /// (`_in_projection_packed`), applied to the inputs in their own layout (no transposed
    /// copy), the heads as strided views `[N, H, L, hd]`, and the fused
    /// `scaled_dot_product_attention` (scores never materialised nor saved for backward: its
    /// backward recomputes them from q and k).
    fn attend_fused(&self, query: &Tensor, key: &Tensor, value: &Tensor, dims: [i64; 4]) -> Result<Tensor> {
        let [l, n, h, hd] = dims;
        let ei = self.embed_dim as i64;
        // [.., .., E] (batch first: [N, T, E]; else [T, N, E]) -> [N, H, T, hd]
        let heads = |t: &Tensor| -> Result<Tensor> {
            let sh = t.shape();
            let t = t.reshape(&[sh[0] as i64, sh[1] as i64, h, hd])?;
            t.permute(if self.batch_first { &[0, 2, 1, 3] } else { &[1, 2, 0, 3] })
        };
        let (q, k, v) = if query.same(key) && key.same(value) {
            let proj = F::linear(query, &self.in_proj_weight, self.in_proj_bias.as_ref())?;
            let sh = proj.shape().to_vec();
            let proj = proj.reshape(&[sh[0] as i64, sh[1] as i64, 3, ei])?;
            (heads(&proj.select(2, 0)?)?, heads(&proj.select(2, 1)?)?, heads(&proj.select(2, 2)?)?)
        } else {
            let w = &self.in_proj_weight;
            let part = |i: i64, x: &Tensor| -> Result<Tensor> {
                let b = self.in_proj_bias.as_ref().map(|b| b.narrow(0, i * ei, ei)).transpose()?;
                heads(&F::linear(x, &w.narrow(0, i * ei, ei)?, b.as_ref())?)
            };
            (part(0, query)?, part(1, key)?, part(2, value)?)
        };
        let o = F::scaled_dot_product_attention(&q, &k, &v, None, self.dropout, self.training)?; // [N, H, L, hd]
        if self.batch_first {
            let o = o.permute(&[0, 2, 1, 3])?.reshape(&[n * l, ei])?;
            self.out_proj.call(&o)?.reshape(&[n, l, ei])
        } else {
            let o = o.permute(&[2, 0, 1, 3])?.reshape(&[l * n, ei])?;
            self.out_proj.call(&o)?.reshape(&[l, n, ei])
        }
    }
}

impl Module for MultiheadAttention {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.attend(x, x, x, None, false, None)?.0)
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let t = |i: usize| -> Result<Option<&Tensor>> {
            match inputs.get(i) {
                None | Some(Value::None) => Ok(None),
                Some(Value::Tensor(t)) => Ok(Some(t)),
                Some(v) => Err(Error::argument(
                    "MultiheadAttention",
                    format!("argument {i} must be a tensor or None, got {v:?}"),
                )),
            }
        };
        let q = t(0)?.ok_or_else(|| Error::argument("MultiheadAttention", "missing query"))?;
        let k = t(1)?.unwrap_or(q);
        let v = t(2)?.unwrap_or(k);
        let need = match inputs.get(4) {
            Some(Value::Bool(b)) => *b,
            _ => true,
        };
        let (o, w) = self.attend(q, k, v, t(3)?, need, t(5)?)?;
        Ok(vec![Value::Tensor(o), w.map(Value::Tensor).unwrap_or(Value::None)])
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("MultiheadAttention")
                .with("embed_dim", Attr::Int(self.embed_dim as i64))
                .with("num_heads", Attr::Int(self.num_heads as i64))
                .with("dropout", Attr::Float(self.dropout))
                .with("bias", Attr::Bool(self.in_proj_bias.is_some()))
                .with("batch_first", Attr::Bool(self.batch_first))
                .with("training", Attr::Bool(self.training)),
        )
    }
}

/// `nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
/// activation="relu", layer_norm_eps=1e-5, batch_first=False, norm_first=False)`.
#[derive(crate::Module, Clone)]
pub struct TransformerEncoderLayer {
    /// Self-attention.
    pub self_attn: MultiheadAttention,
    /// Feed-forward in.
    pub linear1: Linear,
    /// Feed-forward dropout.
    pub dropout: Dropout,
    /// Feed-forward out.
    pub linear2: Linear,
    /// First norm.
    pub norm1: LayerNorm,
    /// Second norm.
    pub norm2: LayerNorm,
    /// Dropout after attention.
    pub dropout1: Dropout,
    /// Dropout after feed-forward.
    pub dropout2: Dropout,
    /// `"relu"` or `"gelu"`.
    pub activation: String,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
}

impl TransformerEncoderLayer {
    /// `TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
    /// layer_norm_eps=1e-5, batch_first, norm_first)`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        d_model: usize,
        nhead: usize,
        dim_feedforward: usize,
        dropout: f64,
        activation: &str,
        batch_first: bool,
        norm_first: bool,
    ) -> Result<Self> {
        if activation != "relu" && activation != "gelu" {
            return Err(Error::argument(
                "TransformerEncoderLayer",
                format!("activation should be relu/gelu, not {activation}"),
            ));
        }
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::new(d_model, nhead, dropout, true, batch_first)?,
            linear1: Linear::new(d_model, dim_feedforward, true)?,
            dropout: Dropout::new(dropout)?,
            linear2: Linear::new(dim_feedforward, d_model, true)?,
            norm1: LayerNorm::new(&[d_model])?,
            norm2: LayerNorm::new(&[d_model])?,
            dropout1: Dropout::new(dropout)?,
            dropout2: Dropout::new(dropout)?,
            activation: activation.to_string(),
            norm_first,
        })
    }

    fn sa(&self, x: &Tensor, mask: Option<&Tensor>, kpm: Option<&Tensor>) -> Result<Tensor> {
        let out = if mask.is_none() && kpm.is_none() {
            self.self_attn.call(x)?
        } else {
            let v = self.self_attn.call_values(&[
                x.into(),
                x.into(),
                x.into(),
                kpm.cloned().into(),
                false.into(),
                mask.cloned().into(),
            ])?;
            v.into_iter()
                .next()
                .and_then(|v| v.as_tensor().cloned())
                .ok_or_else(|| Error::argument("TransformerEncoderLayer", "attention returned no tensor"))?
        };
        self.dropout1.call(&out)
    }

    fn ff(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.linear1.call(x)?;
        let h = if self.activation == "gelu" { F::gelu(&h, "none")? } else { F::relu(&h)? };
        let h = self.dropout.call(&h)?;
        self.dropout2.call(&self.linear2.call(&h)?)
    }

    /// `forward(src, src_mask, src_key_padding_mask)`.
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>, kpm: Option<&Tensor>) -> Result<Tensor> {
        if self.norm_first {
            let x = F::add(x, &self.sa(&self.norm1.call(x)?, mask, kpm)?)?;
            F::add(&x, &self.ff(&self.norm2.call(&x)?)?)
        } else {
            let x = self.norm1.call(&F::add(x, &self.sa(x, mask, kpm)?)?)?;
            self.norm2.call(&F::add(&x, &self.ff(&x)?)?)
        }
    }
}

impl Module for TransformerEncoderLayer {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None, None)
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let t = |i: usize| match inputs.get(i) {
            Some(Value::Tensor(t)) => Some(t),
            _ => None,
        };
        let x = t(0).ok_or_else(|| Error::argument("TransformerEncoderLayer", "missing src"))?;
        Ok(vec![self.forward_masked(x, t(1), t(2))?.into()])
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("TransformerEncoderLayer")
                .with("d_model", Attr::Int(self.linear1.in_features as i64))
                .with("nhead", Attr::Int(self.self_attn.num_heads as i64))
                .with("dim_feedforward", Attr::Int(self.linear1.out_features as i64))
                .with("dropout", Attr::Float(self.dropout.p))
                .with("activation", Attr::Str(self.activation.clone()))
                .with("layer_norm_eps", Attr::Float(self.norm1.eps))
                .with("batch_first", Attr::Bool(self.self_attn.batch_first))
                .with("norm_first", Attr::Bool(self.norm_first))
                .with("training", Attr::Bool(self.is_training())),
        )
    }
}

impl MultiheadAttention {
    /// Rebuilds a MultiheadAttention from its spec and tensors (`out_proj.weight` ...).
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<MultiheadAttention> {
        let (e, h) = (s.size("embed_dim", 1)?, s.size("num_heads", 1)?);
        if !e.is_multiple_of(h) {
            return Err(Error::argument(
                "MultiheadAttention",
                format!("embed_dim must be divisible by num_heads (got {e} and {h})"),
            ));
        }
        let bias = s.bool("bias")?;
        let in_proj_weight = spec::tensor(s, src, "in_proj_weight", &[3 * e, e])?;
        let in_proj_bias = spec::opt_tensor(s, src, "in_proj_bias", &[3 * e], bias)?;
        let weight = spec::tensor(s, src, "out_proj.weight", &[e, e])?;
        let out_bias = spec::opt_tensor(s, src, "out_proj.bias", &[e], bias)?;
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj: Linear { weight, bias: out_bias, in_features: e, out_features: e },
            embed_dim: e,
            num_heads: h,
            dropout: s.float("dropout")?,
            batch_first: s.bool("batch_first")?,
            training: s.bool("training")?,
        })
    }
}

impl TransformerEncoderLayer {
    /// Rebuilds a TransformerEncoderLayer from its spec and tensors (`self_attn.*`, `linear1.*`,
    /// `norm1.*` ...).
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<TransformerEncoderLayer> {
        let (d, ff) = (s.size("d_model", 1)?, s.size("dim_feedforward", 1)?);
        let activation = s.str("activation")?;
        if activation != "relu" && activation != "gelu" {
            return Err(Error::argument(
                "TransformerEncoderLayer",
                format!("activation should be relu/gelu, not {activation}"),
            ));
        }
        let (p, eps, training) = (s.float("dropout")?, s.float("layer_norm_eps")?, s.bool("training")?);
        let attn = ModuleSpec::new("MultiheadAttention")
            .with("embed_dim", Attr::Int(d as i64))
            .with("num_heads", Attr::Int(s.int("nhead")?))
            .with("dropout", Attr::Float(p))
            .with("bias", Attr::Bool(true))
            .with("batch_first", Attr::Bool(s.bool("batch_first")?))
            .with("training", Attr::Bool(training));
        let lin = |i: usize, o: usize| {
            ModuleSpec::new("Linear")
                .with("in_features", Attr::Int(i as i64))
                .with("out_features", Attr::Int(o as i64))
                .with("bias", Attr::Bool(true))
        };
        let ln = ModuleSpec::new("LayerNorm")
            .with("normalized_shape", Attr::Ints(vec![d as i64]))
            .with("eps", Attr::Float(eps))
            .with("elementwise_affine", Attr::Bool(true))
            .with("bias", Attr::Bool(true));
        let mut dropout = Dropout::new(p)?;
        dropout.train(training);
        let child = |prefix: &str| {
            let prefix = format!("{prefix}.");
            move |src: &mut TensorSource, name: &str| src(&format!("{prefix}{name}"))
        };
        let (f_attn, f_l1, f_l2, f_n1, f_n2) =
            (child("self_attn"), child("linear1"), child("linear2"), child("norm1"), child("norm2"));
        let self_attn = MultiheadAttention::from_spec(&attn, &mut |n: &str| f_attn(src, n))?;
        let linear1 = Linear::from_spec(&lin(d, ff), &mut |n: &str| f_l1(src, n))?;
        let linear2 = Linear::from_spec(&lin(ff, d), &mut |n: &str| f_l2(src, n))?;
        let norm1 = LayerNorm::from_spec(&ln, &mut |n: &str| f_n1(src, n))?;
        let norm2 = LayerNorm::from_spec(&ln, &mut |n: &str| f_n2(src, n))?;
        Ok(TransformerEncoderLayer {
            self_attn,
            linear1,
            dropout,
            linear2,
            norm1,
            norm2,
            dropout1: dropout,
            dropout2: dropout,
            activation: activation.to_string(),
            norm_first: s.bool("norm_first")?,
        })
    }
}
