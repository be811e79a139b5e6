//! ONNX sequence ops (`SequenceEmpty`, `SequenceConstruct`, `SequenceInsert`, `SequenceAt`,
//! `SequenceErase`, `SequenceLength`, `SplitToSequence`, `ConcatFromSequence`).
//!
//! A sequence is a list of tensors known while the model is imported, like a Python list
//! while torch.fx traces: the list itself is unrolled away and only the tensor ops on its
//! elements (`slice`, `select`, `cat`, `stack`) are recorded. Positions and split sizes must
//! therefore be known at import (constants, initializers or values computed from shapes);
//! `SequenceLength` folds to a constant. Sequences as graph inputs or outputs, and
//! `SequenceMap` (a subgraph per element), are not supported.

use super::{call, v, Node};
use ferrofx_core::{Result, Tensor, Value};

/// The sequence ops the importer evaluates.
pub(crate) const OPS: &[&str] = &[
    "ConcatFromSequence",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "SplitToSequence",
];

/// What a sequence op produces.
pub(crate) enum SeqOut {
    /// A tensor (`SequenceAt`, `SequenceLength`, `ConcatFromSequence`).
    Tensor(Tensor),
    /// A sequence.
    Sequence(Vec<Tensor>),
}

/// Whether `op` is a sequence op evaluated here.
pub(crate) fn is_sequence_op(op: &str) -> bool {
    OPS.contains(&op)
}

/// Sequence input `i` of the node.
fn seq<'s>(n: &Node<'_>, seqs: &'s [Option<Vec<Tensor>>], i: usize) -> Result<&'s Vec<Tensor>> {
    seqs.get(i).and_then(|s| s.as_ref()).ok_or_else(|| {
        n.err(format!("input {i} (`{}`) must be a sequence", n.proto.input.get(i).map(String::as_str).unwrap_or("")))
    })
}

/// A position input (a scalar known at import), checked against `[-len, len]` (`insert`) or
/// `[-len, len - 1]`, returned non-negative.
fn position(n: &Node<'_>, i: usize, len: usize, insert: bool) -> Result<Option<usize>> {
    let Some(t) = n.opt(i) else { return Ok(None) };
    let p = n.const_ints(t, "position")?;
    let [p] = p[..] else { return Err(n.err(format!("`position` must be a scalar, got shape {:?}", t.shape()))) };
    let len_i = len as i64;
    let hi = if insert { len_i } else { len_i - 1 };
    if p < -len_i || p > hi {
        return Err(n.err(format!(
            "position {p} is out of range for a sequence of length {len} (allowed: {} to {hi})",
            -len_i
        )));
    }
    Ok(Some(if p < 0 { (p + len_i) as usize } else { p as usize }))
}

/// Evaluates sequence op `n`; `seqs[i]` is input `i` when it is a sequence.
pub(crate) fn eval(n: &Node<'_>, seqs: &[Option<Vec<Tensor>>]) -> Result<SeqOut> {
    match n.op() {
        "SequenceEmpty" => Ok(SeqOut::Sequence(vec![])),
        "SequenceConstruct" => {
            let items = (0..n.inputs.len()).map(|i| n.x(i).cloned()).collect::<Result<Vec<_>>>()?;
            if let Some(bad) = items.iter().find(|t| t.dtype() != items[0].dtype()) {
                return Err(n.err(format!(
                    "all elements must have one dtype, got {:?} and {:?}",
                    items[0].dtype(),
                    bad.dtype()
                )));
            }
            Ok(SeqOut::Sequence(items))
        }
        "SequenceInsert" => {
            let mut s = seq(n, seqs, 0)?.clone();
            let t = n.x(1)?.clone();
            if let Some(first) = s.first() {
                if first.dtype() != t.dtype() {
                    return Err(n.err(format!(
                        "the inserted tensor is {:?} but the sequence holds {:?}",
                        t.dtype(),
                        first.dtype()
                    )));
                }
            }
            let at = position(n, 2, s.len(), true)?.unwrap_or(s.len());
            s.insert(at, t);
            Ok(SeqOut::Sequence(s))
        }
        "SequenceAt" => {
            let s = seq(n, seqs, 0)?;
            let at = position(n, 1, s.len(), false)?.ok_or_else(|| n.err("`position` is required"))?;
            Ok(SeqOut::Tensor(s[at].clone()))
        }
        "SequenceErase" => {
            let mut s = seq(n, seqs, 0)?.clone();
            if s.is_empty() {
                return Err(n.err("cannot erase from an empty sequence"));
            }
            let at = position(n, 1, s.len(), false)?.unwrap_or(s.len() - 1);
            s.remove(at);
            Ok(SeqOut::Sequence(s))
        }
        "SequenceLength" => {
            let len = seq(n, seqs, 0)?.len() as i64;
            Ok(SeqOut::Tensor(Tensor::from_vec(vec![len], &[])?))
        }
        "SplitToSequence" => split_to_sequence(n).map(SeqOut::Sequence),
        "ConcatFromSequence" => {
            let s = seq(n, seqs, 0)?;
            if s.is_empty() {
                return Err(n.err("cannot concatenate an empty sequence"));
            }
            let new_axis = n.i("new_axis", 0) != 0;
            let rank = s[0].ndim() + usize::from(new_axis);
            let axis = n.axis(n.attr("axis").and_then(|a| a.i).ok_or_else(|| n.err("`axis` is required"))?, rank)?;
            let op = if new_axis { "stack" } else { "cat" };
            Ok(SeqOut::Tensor(
                call(op, vec![Value::Tensors(s.clone()), Value::Int(axis as i64)]).map_err(|e| n.err(e))?,
            ))
        }
        other => Err(n.err(format!("`{other}` is not a sequence op"))),
    }
}

/// The most elements a sequence made by `SplitToSequence` may have (each is a node of the
/// imported graph).
const MAX_PIECES: i64 = 1 << 16;

fn split_to_sequence(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axis = n.dim_axis(n.i("axis", 0), x.ndim())?;
    let len = x.shape()[axis] as i64;
    let too_many = |pieces: i64| -> Result<()> {
        if pieces > MAX_PIECES {
            return Err(n.err(format!(
                "splitting axis {axis} of length {len} makes {pieces} tensors; at most {MAX_PIECES} are supported"
            )));
        }
        Ok(())
    };
    let sizes: Vec<i64> = match n.opt(1) {
        None => {
            // size-1 pieces; keepdims=0 drops the axis
            too_many(len)?;
            if n.i("keepdims", 1) == 0 {
                return (0..len).map(|i| call("select", vec![v(x), Value::Int(axis as i64), Value::Int(i)])).collect();
            }
            vec![1; len as usize]
        }
        Some(t) => {
            let vals = n.const_ints(t, "split")?;
            if t.ndim() == 0 {
                let step = vals[0];
                if step <= 0 {
                    return Err(n.err(format!("`split` must be positive, got {step}")));
                }
                too_many(len / step + 1)?;
                let mut out = vec![step; (len / step) as usize];
                if len % step != 0 {
                    out.push(len % step);
                }
                out
            } else {
                too_many(vals.len() as i64)?;
                if vals.iter().any(|&s| s < 0) || vals.iter().fold(0i64, |a, &s| a.saturating_add(s)) != len {
                    return Err(
                        n.err(format!("`split` {vals:?} must be non-negative sizes summing to the axis length {len}"))
                    );
                }
                vals
            }
        }
    };
    let mut start = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for s in sizes {
        out.push(call(
            "slice",
            vec![v(x), Value::Int(axis as i64), Value::Int(start), Value::Int(start + s), Value::Int(1)],
        )?);
        start += s;
    }
    Ok(out)
}
