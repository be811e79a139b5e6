//! A BERT encoder with Hugging Face's layout and key names (`BertModel` of `transformers`,
//! without the pooler): embeddings with position and token-type ids, post-LayerNorm encoder
//! layers of multi-head self-attention under the attention mask and a GELU feed-forward.
//!
//! The forward pass uses no concrete shape, so `symbolic_trace` records a graph that runs on
//! any batch size and sequence length: position ids are `cumsum(ones_like(ids)) - 1`, heads
//! are split with `unflatten` + `permute` (views, no copy) and merged with `permute` + `flatten`.
//!
//! ```
//! use ferrofx_nn::zoo::{BertConfig, BertModel};
//! use ferrofx_nn::Tensor;
//!
//! let cfg = BertConfig { vocab_size: 50, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2,
//!     intermediate_size: 16, max_position_embeddings: 16, ..BertConfig::default() };
//! let bert = BertModel::new(&cfg).unwrap();
//! let ids = Tensor::from_vec(vec![1i64, 7, 9, 2, 1, 5, 2, 0], &[2, 4]).unwrap();
//! let mask = Tensor::from_vec(vec![1i64, 1, 1, 1, 1, 1, 1, 0], &[2, 4]).unwrap();
//! let h = bert.forward_masked(&ids, &mask).unwrap();
//! assert_eq!(h.shape(), &[2, 4, 8]);
//! ```

use crate::layers::{Embedding, LayerNorm, Linear};
use crate::{functional as F, Module};
use ferrofx_core::ops::creation;
use ferrofx_core::{DType, Error, Result, Tensor};
use serde::Deserialize;

/// The fields of Hugging Face's `config.json` that a BERT encoder needs (others are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct BertConfig {
    /// Rows of the word embedding.
    pub vocab_size: usize,
    /// Width of every token's hidden state.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads (`hidden_size` must be a multiple).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// `"gelu"` (exact, erf), `"gelu_new"` / `"gelu_pytorch_tanh"` (tanh approximation) or `"relu"`.
    pub hidden_act: String,
    /// Rows of the position embedding: the longest sequence the model takes.
    pub max_position_embeddings: usize,
    /// Rows of the token-type embedding.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Only `"absolute"` is supported.
    pub position_embedding_type: String,
    /// `model_type` (`"bert"`).
    pub model_type: String,
}

impl Default for BertConfig {
    /// `transformers.BertConfig()`'s defaults (BERT-base).
    fn default() -> Self {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: "gelu".into(),
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            position_embedding_type: "absolute".into(),
            model_type: "bert".into(),
        }
    }
}

impl BertConfig {
    /// Parses a `config.json` document; `origin` (the file name) is named in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<BertConfig> {
        let cfg: BertConfig = serde_json::from_str(text).map_err(|e| {
            Error::io(
                "BertConfig",
                format!(
                    "{origin} is not a valid BERT config.json ({e}); fix: restore the file from the model's package"
                ),
            )
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Checks the values a model can be built from; `origin` is named in errors.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::argument("BertConfig", format!("{origin}: {msg}")));
        if !matches!(self.model_type.as_str(), "bert" | "") {
            return bad(format!("model_type is \"{}\"; only BERT encoders (\"bert\") are supported", self.model_type));
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0; it must be positive"));
            }
        }
        // Bounds keep a hostile config from asking for an unbounded allocation before the
        // weights are compared with it (BERT-large is 1024 wide, 24 layers, 30522 tokens).
        for (name, v, max) in [
            ("vocab_size", self.vocab_size, 1 << 21),
            ("hidden_size", self.hidden_size, 1 << 14),
            ("num_hidden_layers", self.num_hidden_layers, 256),
            ("intermediate_size", self.intermediate_size, 1 << 16),
            ("max_position_embeddings", self.max_position_embeddings, 1 << 16),
            ("type_vocab_size", self.type_vocab_size, 1 << 10),
        ] {
            if v > max {
                return bad(format!("{name} = {v} is larger than ferrofx accepts ({max})"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !matches!(self.hidden_act.as_str(), "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "relu") {
            return bad(format!(
                "hidden_act \"{}\" is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)",
                self.hidden_act
            ));
        }
        if self.position_embedding_type != "absolute" {
            return bad(format!(
                "position_embedding_type \"{}\" is not supported (only \"absolute\")",
                self.position_embedding_type
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps {} must be a finite number >= 0", self.layer_norm_eps));
        }
        Ok(())
    }
}

fn layer_norm(cfg: &BertConfig) -> Result<LayerNorm> {
    LayerNorm::with(&[cfg.hidden_size], cfg.layer_norm_eps, true, true)
}

/// `BertEmbeddings`: word + position + token-type embeddings, then LayerNorm.
#[derive(crate::Module)]
pub struct BertEmbeddings {
    /// `[vocab_size, hidden]`
    pub word_embeddings: Embedding,
    /// `[max_position_embeddings, hidden]`
    pub position_embeddings: Embedding,
    /// `[type_vocab_size, hidden]`
    pub token_type_embeddings: Embedding,
    /// Normalisation of the sum.
    #[module(rename = "LayerNorm")]
    pub layer_norm: LayerNorm,
}

impl BertEmbeddings {
    /// Embeddings of `input_ids` `[N, L]` (int64) at positions `0..L`, token type 0.
    pub fn embed(&self, input_ids: &Tensor) -> Result<Tensor> {
        let ones = creation::ones_like(input_ids, Some(DType::I64))?;
        let positions = F::sub(&ones.cumsum(1)?, 1i64)?;
        let token_types = creation::zeros_like(input_ids, Some(DType::I64))?;
        let h = F::add(&self.word_embeddings.call(input_ids)?, &self.position_embeddings.call(&positions)?)?;
        let h = F::add(&h, &self.token_type_embeddings.call(&token_types)?)?;
        self.layer_norm.call(&h)
    }
}

impl Module for BertEmbeddings {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.embed(x)
    }
}

/// `BertSelfAttention`: query/key/value projections and scaled dot-product attention per head.
#[derive(crate::Module)]
pub struct BertSelfAttention {
    /// `[hidden, hidden]`
    pub query: Linear,
    /// `[hidden, hidden]`
    pub key: Linear,
    /// `[hidden, hidden]`
    pub value: Linear,
    /// Heads.
    pub num_heads: usize,
}

impl BertSelfAttention {
    /// `[N, L, H*d]` -> `[N, H, L, d]` as a view (`unflatten` + `permute`), without knowing N
    /// or L (traceable symbolically).
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        x.unflatten(2, &[self.num_heads as i64, -1])?.permute(&[0, 2, 1, 3])
    }

    /// Self-attention of `h` `[N, L, hidden]` under the additive mask `[N, 1, 1, L]` (0 where
    /// a key may be attended, the most negative f32 where not).
    pub fn attend(&self, h: &Tensor, additive_mask: &Tensor) -> Result<Tensor> {
        let q = self.split_heads(&self.query.call(h)?)?;
        let k = self.split_heads(&self.key.call(h)?)?;
        let v = self.split_heads(&self.value.call(h)?)?;
        // softmax(q kᵀ / sqrt(d) + mask) v, fused: the [N, H, L, L] scores are never stored
        let ctx = F::scaled_dot_product_attention(&q, &k, &v, Some(additive_mask), 0.0, false)?; // [N, H, L, d]
        ctx.permute(&[0, 2, 1, 3])?.flatten(2, 3)
    }
}

impl Module for BertSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let no_mask = Tensor::from_vec(vec![0f32], &[1, 1, 1, 1])?;
        self.attend(x, &no_mask)
    }
}

/// `BertSelfOutput` / `BertOutput`: dense projection, residual add, LayerNorm (post-norm).
#[derive(crate::Module)]
pub struct BertResidualOutput {
    /// Projection back to the hidden width.
    pub dense: Linear,
    /// Post-norm.
    #[module(rename = "LayerNorm")]
    pub layer_norm: LayerNorm,
}

impl BertResidualOutput {
    /// `LayerNorm(dense(x) + residual)`.
    pub fn project(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        self.layer_norm.call(&F::add(&self.dense.call(x)?, residual)?)
    }
}

impl Module for BertResidualOutput {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.project(x, x)
    }
}

/// `BertAttention`: self-attention (`self.*` keys) and its output block (`output.*`).
#[derive(crate::Module)]
pub struct BertAttention {
    /// Q, K, V.
    #[module(rename = "self")]
    pub self_attention: BertSelfAttention,
    /// Output projection + residual + LayerNorm.
    pub output: BertResidualOutput,
}

impl Module for BertAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.output.project(&self.self_attention.forward(x)?, x)
    }
}

/// `BertIntermediate`: the feed-forward's first projection and activation.
#[derive(crate::Module)]
pub struct BertIntermediate {
    /// `[intermediate, hidden]`
    pub dense: Linear,
    /// `hidden_act` of the config.
    pub activation: String,
}

impl Module for BertIntermediate {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.dense.call(x)?;
        match self.activation.as_str() {
            "relu" => F::relu(&h),
            "gelu_new" | "gelu_pytorch_tanh" => F::gelu(&h, "tanh"),
            _ => F::gelu(&h, "none"),
        }
    }
}

/// `BertLayer`: attention block then feed-forward block, each with residual and post-norm.
#[derive(crate::Module)]
pub struct BertLayer {
    /// Attention block.
    pub attention: BertAttention,
    /// Feed-forward in.
    pub intermediate: BertIntermediate,
    /// Feed-forward out + residual + LayerNorm.
    pub output: BertResidualOutput,
}

impl BertLayer {
    /// One layer on `h` `[N, L, hidden]` under the additive mask `[N, 1, 1, L]`.
    pub fn forward_masked(&self, h: &Tensor, additive_mask: &Tensor) -> Result<Tensor> {
        let a = self.attention.self_attention.attend(h, additive_mask)?;
        let a = self.attention.output.project(&a, h)?;
        let f = self.intermediate.forward(&a)?;
        self.output.project(&f, &a)
    }
}

impl Module for BertLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let no_mask = Tensor::from_vec(vec![0f32], &[1, 1, 1, 1])?;
        self.forward_masked(x, &no_mask)
    }
}

/// `BertEncoder`: the stack of layers (`layer.0`, `layer.1`, ...).
#[derive(crate::Module)]
pub struct BertEncoder {
    /// The layers.
    pub layer: Vec<BertLayer>,
}

impl Module for BertEncoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let no_mask = Tensor::from_vec(vec![0f32], &[1, 1, 1, 1])?;
        self.layer.iter().try_fold(x.clone(), |h, l| l.forward_masked(&h, &no_mask))
    }
}

/// Hugging Face's `BertModel` without the pooler: `(input_ids, attention_mask)` `[N, L]` ->
/// the last hidden state `[N, L, hidden]`. State dict keys are Hugging Face's
/// (`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`, ...).
#[derive(crate::Module)]
pub struct BertModel {
    /// Token, position and type embeddings.
    pub embeddings: BertEmbeddings,
    /// The layers.
    pub encoder: BertEncoder,
    /// What the model was built from.
    pub config: BertConfig,
}

impl BertModel {
    /// A model with fresh (random) weights of the shapes `cfg` describes; load real weights with
    /// [`Module::load_state_dict`] (or start from [`BertModel::zeroed`], which skips the random
    /// initialisation).
    pub fn new(cfg: &BertConfig) -> Result<BertModel> {
        BertModel::build(cfg, &|i, o| Linear::new(i, o, true), &|n, d| Embedding::new(n, d, None))
    }

    /// A model of the shapes `cfg` describes with every weight zero (LayerNorms 1 and 0): the
    /// cheap start for [`Module::load_state_dict`] of pretrained weights.
    pub fn zeroed(cfg: &BertConfig) -> Result<BertModel> {
        let zeros = |shape: &[usize]| crate::init::parameter(shape, crate::init::zeros_);
        BertModel::build(
            cfg,
            &|i, o| Ok(Linear { weight: zeros(&[o, i])?, bias: Some(zeros(&[o])?), in_features: i, out_features: o }),
            &|n, d| Embedding::from_pretrained(zeros(&[n, d])?, None),
        )
    }

    fn build(
        cfg: &BertConfig,
        lin: &dyn Fn(usize, usize) -> Result<Linear>,
        emb: &dyn Fn(usize, usize) -> Result<Embedding>,
    ) -> Result<BertModel> {
        cfg.validate("BertConfig")?;
        let d = cfg.hidden_size;
        let layer = (0..cfg.num_hidden_layers)
            .map(|_| {
                Ok(BertLayer {
                    attention: BertAttention {
                        self_attention: BertSelfAttention {
                            query: lin(d, d)?,
                            key: lin(d, d)?,
                            value: lin(d, d)?,
                            num_heads: cfg.num_attention_heads,
                        },
                        output: BertResidualOutput { dense: lin(d, d)?, layer_norm: layer_norm(cfg)? },
                    },
                    intermediate: BertIntermediate {
                        dense: lin(d, cfg.intermediate_size)?,
                        activation: cfg.hidden_act.clone(),
                    },
                    output: BertResidualOutput { dense: lin(cfg.intermediate_size, d)?, layer_norm: layer_norm(cfg)? },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(BertModel {
            embeddings: BertEmbeddings {
                word_embeddings: emb(cfg.vocab_size, d)?,
                position_embeddings: emb(cfg.max_position_embeddings, d)?,
                token_type_embeddings: emb(cfg.type_vocab_size, d)?,
                layer_norm: layer_norm(cfg)?,
            },
            encoder: BertEncoder { layer },
            config: cfg.clone(),
        })
    }

    /// The additive attention mask `[N, 1, 1, L]` of a 0/1 `attention_mask` `[N, L]`:
    /// `(1 - mask) * f32::MIN`, as `transformers` builds it.
    pub fn additive_mask(attention_mask: &Tensor) -> Result<Tensor> {
        let m = attention_mask.to_dtype(DType::F32)?;
        let m = F::mul(&ferrofx_core::ops::binary::rsub(&m, 1.0)?, f32::MIN as f64)?;
        m.unsqueeze(1)?.unsqueeze(1)
    }

    /// The last hidden state `[N, L, hidden]` of `input_ids` `[N, L]` (int64) where
    /// `attention_mask` `[N, L]` is 1 on tokens and 0 on padding.
    pub fn forward_masked(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let mask = BertModel::additive_mask(attention_mask)?;
        let mut h = self.embeddings.embed(input_ids)?;
        for layer in &self.encoder.layer {
            h = layer.forward_masked(&h, &mask)?;
        }
        Ok(h)
    }
}

impl Module for BertModel {
    /// Every token attended (no padding).
    fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.forward_masked(input_ids, &creation::ones_like(input_ids, Some(DType::I64))?)
    }
    fn forward_values(&self, inputs: &[ferrofx_core::Value]) -> Result<Vec<ferrofx_core::Value>> {
        let (ids, mask) = two_tensors(inputs, "BertModel")?;
        Ok(vec![self.forward_masked(ids, mask)?.into()])
    }
}

/// The two tensor inputs `(input_ids, attention_mask)` of a BERT-style forward.
pub(crate) fn two_tensors<'a>(inputs: &'a [ferrofx_core::Value], what: &str) -> Result<(&'a Tensor, &'a Tensor)> {
    use ferrofx_core::Value;
    match inputs {
        [Value::Tensor(ids), Value::Tensor(mask)] => Ok((ids, mask)),
        [Value::Tensor(_)] => Err(Error::argument(
            what,
            "takes (input_ids, attention_mask); got input_ids only: pass the attention mask too (1 on tokens, 0 on padding)",
        )),
        _ => Err(Error::argument(
            what,
            format!("takes two tensors (input_ids [N, L], attention_mask [N, L]), got {} argument(s)", inputs.len()),
        )),
    }
}
