use crate::layers::{Embedding, Linear, TransformerEncoderLayer};
use crate::{init, Module};
use ferrofx_core::{Error, Result, Tensor};

/// A small Transformer encoder classifier: token embedding + learned positions, `num_layers`
/// post-norm `TransformerEncoderLayer`s (batch first, GELU), mean pooling over the sequence and
/// a linear head. Input: token ids `[N, L]` (int64, `L <= max_len`); output `[N, num_classes]`.
#[derive(crate::Module)]
pub struct TransformerClassifier {
    /// `[vocab, d_model]`
    pub embed: Embedding,
    /// `[max_len, d_model]`
    pub pos: Tensor,
    /// Encoder layers.
    pub layers: Vec<TransformerEncoderLayer>,
    /// Classifier head.
    pub head: Linear,
    max_len: usize,
}

impl TransformerClassifier {
    /// A new model.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        vocab: usize,
        d_model: usize,
        nhead: usize,
        dim_ff: usize,
        num_layers: usize,
        max_len: usize,
        num_classes: usize,
        dropout: f64,
    ) -> Result<Self> {
        let mut layers = Vec::new();
        for _ in 0..num_layers {
            layers.push(TransformerEncoderLayer::new(d_model, nhead, dim_ff, dropout, "gelu", true, false)?);
        }
        Ok(TransformerClassifier {
            embed: Embedding::new(vocab, d_model, None)?,
            pos: init::parameter(&[max_len, d_model], |t| init::normal_(t, 0.0, 0.02))?,
            layers,
            head: Linear::new(d_model, num_classes, true)?,
            max_len,
        })
    }
}

impl Module for TransformerClassifier {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.ndim() != 2 || x.shape()[1] > self.max_len {
            return Err(Error::shape(
                "TransformerClassifier",
                format!("expected token ids [N, L] with L <= {}, got {:?}", self.max_len, x.shape()),
            ));
        }
        let l = x.shape()[1] as i64;
        let mut h = crate::functional::add(&self.embed.call(x)?, &self.pos.narrow(0, 0, l)?)?;
        for layer in &self.layers {
            h = layer.call(&h)?;
        }
        self.head.call(&h.mean_dim(&[1], false)?)
    }
}
