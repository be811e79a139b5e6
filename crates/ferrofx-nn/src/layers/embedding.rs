//! Embedding.

use crate::{functional as F, init, Module};
use ferrofx_core::{Error, Result, Tensor};

/// `nn.Embedding(num_embeddings, embedding_dim, padding_idx)`: weight N(0, 1), the padding row
/// zeroed.
#[derive(crate::Module)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`
    pub weight: Tensor,
    /// Row whose gradient is zero.
    pub padding_idx: Option<i64>,
    num: usize,
    dim: usize,
}

impl Embedding {
    /// `Embedding(num_embeddings, embedding_dim, padding_idx)`.
    pub fn new(num_embeddings: usize, embedding_dim: usize, padding_idx: Option<i64>) -> Result<Embedding> {
        let pidx = match padding_idx {
            Some(p) if p >= num_embeddings as i64 || p < -(num_embeddings as i64) => {
                return Err(Error::argument("Embedding", "Padding_idx must be within num_embeddings"))
            }
            Some(p) if p < 0 => Some(p + num_embeddings as i64),
            other => other,
        };
        let weight = init::parameter(&[num_embeddings, embedding_dim], |t| {
            init::normal_(t, 0.0, 1.0)?;
            if let Some(p) = pidx {
                init::zeros_(&t.select(0, p)?)?;
            }
            Ok(())
        })?;
        Ok(Embedding { weight, padding_idx: pidx, num: num_embeddings, dim: embedding_dim })
    }
}

impl Module for Embedding {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::embedding(x, &self.weight, self.padding_idx)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn extra_repr(&self) -> String {
        let mut s = format!("{}, {}", self.num, self.dim);
        if let Some(p) = self.padding_idx {
            s += &format!(", padding_idx={p}");
        }
        s
    }
}
