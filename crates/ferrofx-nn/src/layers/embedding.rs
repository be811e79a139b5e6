//! Embedding.

use crate::spec::{self, Attr, ModuleSpec, TensorSource};
use crate::{functional as F, init, Module};
use ferrofx_core::{Error, Result, Tensor};

/// `nn.Embedding(num_embeddings, embedding_dim, padding_idx)`: weight N(0, 1), the padding row
/// zeroed.
#[derive(crate::Module, Clone)]
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
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::embedding(x, &self.weight, self.padding_idx)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("Embedding")
                .with("num_embeddings", Attr::Int(self.num as i64))
                .with("embedding_dim", Attr::Int(self.dim as i64))
                .with("padding_idx", self.padding_idx.map_or(Attr::None, Attr::Int)),
        )
    }
    fn extra_repr(&self) -> String {
        let mut s = format!("{}, {}", self.num, self.dim);
        if let Some(p) = self.padding_idx {
            s += &format!(", padding_idx={p}");
        }
        s
    }
}

impl Embedding {
    /// `nn.Embedding.from_pretrained(weight, padding_idx=padding_idx)`: an Embedding using
    /// `weight` `[num_embeddings, embedding_dim]` as it is (shared, not copied, not
    /// re-initialised).
    ///
    /// ```
    /// use ferrofx_nn::{Embedding, Module, Tensor};
    /// let w = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]).unwrap();
    /// let e = Embedding::from_pretrained(w, None).unwrap();
    /// let ids = Tensor::from_vec(vec![2i64], &[1]).unwrap();
    /// assert_eq!(e.call(&ids).unwrap().to_vec::<f32>().unwrap(), vec![4.0, 5.0]);
    /// ```
    pub fn from_pretrained(weight: Tensor, padding_idx: Option<i64>) -> Result<Embedding> {
        let &[num, dim] = weight.shape() else {
            return Err(Error::shape(
                "Embedding",
                format!("Embeddings parameter is expected to be 2-dimensional, got shape {:?}", weight.shape()),
            ));
        };
        let padding_idx = match padding_idx {
            Some(p) if p >= num as i64 || p < -(num as i64) => {
                return Err(Error::argument("Embedding", "Padding_idx must be within num_embeddings"))
            }
            Some(p) if p < 0 => Some(p + num as i64),
            other => other,
        };
        Ok(Embedding { weight, padding_idx, num, dim })
    }

    /// Rebuilds an Embedding from its spec and weight.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<Embedding> {
        let (num, dim) = (s.size("num_embeddings", 1)?, s.size("embedding_dim", 1)?);
        let padding_idx = s.opt_int("padding_idx")?;
        if matches!(padding_idx, Some(p) if p < 0 || p >= num as i64) {
            return Err(Error::argument("Embedding", "Padding_idx must be within num_embeddings"));
        }
        let weight = spec::tensor(s, src, "weight", &[num, dim])?;
        Ok(Embedding { weight, padding_idx, num, dim })
    }
}
