//! `embedding(input, weight, padding_idx=None)`: rows of a lookup table.
//!
//! `input` holds int64 or int32 indices of any shape; the output has shape
//! `input.shape + [embedding_dim]` and the table's dtype. `padding_idx` only matters for the
//! gradient (its row gets none), so the forward pass validates it and otherwise ignores it.
//! Every index is checked: an out-of-range one is an error naming the index and the table size.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::op::args::{opt_int, tensor};
use crate::op::{
    cost_memory, dispatch, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::ops::linalg::dtype_title;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;

fn check(args: &[Value]) -> Result<Shape> {
    let op = "embedding";
    let idx = tensor(op, args, 0)?;
    let w = tensor(op, args, 1)?;
    if !matches!(idx.dtype(), DType::I64 | DType::I32) {
        return Err(Error::dtype(
            op,
            format!(
                "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got {} ({}) instead",
                idx.dtype(),
                dtype_title(idx.dtype())
            ),
        ));
    }
    if w.ndim() != 2 {
        return Err(Error::shape(
            op,
            format!("'weight' must be 2-D (num_embeddings, embedding_dim), but got weight of shape {:?}", w.shape()),
        ));
    }
    let num = w.shape()[0] as i64;
    if let Some(p) = opt_int(op, args, 2)? {
        if p >= num || p < -num {
            return Err(Error::argument(
                op,
                format!("Padding_idx must be within num_embeddings: got padding_idx={p} for a table of {num} rows"),
            ));
        }
    }
    let mut shape: Shape = idx.shape().into();
    shape.push(w.shape()[1]);
    Ok(shape)
}

fn kernel_fn(args: &[Value]) -> Result<Outputs> {
    let op = "embedding";
    let shape = check(args)?;
    let idx = tensor(op, args, 0)?;
    let w = tensor(op, args, 1)?;
    let (num, dim) = (w.shape()[0], w.shape()[1]);
    let indices: Vec<i64> = match idx.dtype() {
        DType::I32 => idx.with_contiguous::<i32, _>(op, |s| s.iter().map(|&v| v as i64).collect())?,
        _ => idx.to_vec::<i64>()?,
    };
    if let Some((pos, &bad)) = indices.iter().enumerate().find(|(_, &v)| v < 0 || v >= num as i64) {
        return Err(Error::index(
            op,
            format!(
                "index {bad} (at position {pos} of input of shape {:?}) is out of range for an embedding table of {num} rows (valid indices are 0..{num})",
                idx.shape()
            ),
        ));
    }
    let dt = w.dtype();
    crate::match_dtype!(dt, E => {
        let out = w.with_contiguous::<E, _>(op, |table| -> Result<Vec<E>> {
            let mut out = crate::memory::alloc_filled(op, &shape, E::default())?;
            if dim > 0 {
                let copy = |(o, &i): (&mut [E], &i64)| o.copy_from_slice(&table[i as usize * dim..(i as usize + 1) * dim]);
                if out.len() >= crate::ops::kernel::PAR_THRESHOLD {
                    out.par_chunks_mut(dim).zip(indices.par_iter()).for_each(copy);
                } else {
                    out.chunks_mut(dim).zip(indices.iter()).for_each(copy);
                }
            }
            Ok(out)
        })??;
        Ok(smallvec![Tensor::from_vec(out, &shape)?])
    })
}

/// `embedding(input, weight, padding_idx=None)` (torch.nn.functional's argument order).
pub static EMBEDDING: OpDef = OpDef {
    name: "embedding",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::opt("padding_idx", T::OptInt, D::None),
    ],
    meta: |args| {
        let shape = check(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, tensor("embedding", args, 1)?.dtype())])
    },
    kernel: kernel_fn,
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(crate::autograd::formulas::index::embedding_backward),
    saves: Saves { inputs: 1, outputs: 0 },
    doc: "Looks up rows of weight for integer indices.",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&EMBEDDING];

/// `torch.nn.functional.embedding(input, weight, padding_idx)`.
pub fn embedding(input: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    let mut out: Outputs =
        dispatch(&EMBEDDING, CallKind::Function, &[input.into(), weight.into(), padding_idx.into()])?;
    out.pop().ok_or_else(|| Error::schema("embedding", "op returned no output"))
}
