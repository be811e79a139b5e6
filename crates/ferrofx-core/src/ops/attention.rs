//! `scaled_dot_product_attention` with PyTorch's semantics
//! (`torch.nn.functional.scaled_dot_product_attention`): `softmax(q kᵀ · scale + mask) v` over
//! the last two dims, batch dims broadcast, the mask boolean (true = may attend) or additive
//! (same float dtype as the query), `is_causal` for a lower-triangular mask, `scale` defaulting
//! to `1/sqrt(E)`. A row that may attend to nothing gives zeros (PyTorch's safe softmax).
//!
//! The f32 kernel is fused: per matrix of the batch (split across the rayon pool), blocks of
//! query rows get their scores from one GEMM that starts from the additive mask, the softmax
//! runs on them while they are in cache (vectorised `exp`), and a second GEMM multiplies them by
//! the values; the `[.., L, S]` score tensor is never materialised. Operands are read through
//! their strides, so heads split with `unflatten` + `permute` need no copy. Other float dtypes
//! run the same formula with tensor ops. The backward is written with tensor ops (it recomputes
//! the probabilities), so it is itself differentiable.
//!
//! ```
//! use ferrofx_core::ops::attention::scaled_dot_product_attention;
//! use ferrofx_core::Tensor;
//! let q = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[1, 2, 2]).unwrap();
//! let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 2, 2]).unwrap();
//! let causal = scaled_dot_product_attention(&q, &q, &v, None, true, None).unwrap();
//! // the first query sees only the first key
//! assert_eq!(&causal.to_vec::<f32>().unwrap()[..2], &[1.0, 2.0]);
//! ```

use crate::autograd::BackwardCtx;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, Layout, Shape, StridedIter};
use crate::op::args::{bool_, float, opt_float, opt_tensor, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, MetaOutputs, OpDef, Outputs, Saves,
};
use crate::ops::linalg::{MatElem, Par};
use crate::ops::{binary, kernel, vmath};
use crate::storage::Storage;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;

const OP: &str = "scaled_dot_product_attention";

/// Query rows whose scores are computed at once (bounds the per-thread buffer to `ROWS × S`).
const ROWS: usize = 128;

/// The checked shapes of a call.
struct Sig {
    /// Broadcast batch dims of query, key, value (and mask).
    batch: Shape,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    scale: f64,
    causal: bool,
}

impl Sig {
    fn out_shape(&self) -> Shape {
        let mut o = self.batch.clone();
        o.extend_from_slice(&[self.l, self.ev]);
        o
    }
}

fn dtype_name(d: DType) -> &'static str {
    crate::ops::linalg::dtype_title(d)
}

/// Checks the arguments and computes the shapes (shared by meta, kernel and backward).
fn check(args: &[Value]) -> Result<Sig> {
    let (q, k, v) = (tensor(OP, args, 0)?, tensor(OP, args, 1)?, tensor(OP, args, 2)?);
    let mask = opt_tensor(OP, args, 3)?;
    let dropout = float(OP, args, 4)?;
    let causal = bool_(OP, args, 5)?;
    let scale = opt_float(OP, args, 6)?;
    let gqa = bool_(OP, args, 7)?;
    if q.ndim() < 2 || k.ndim() < 2 || v.ndim() < 2 {
        return Err(Error::shape(
            OP,
            format!(
                "Expected query, key, and value to all be at least 2 dimensional, but got query.dim: {} key.dim: {} and value.dim: {} instead.",
                q.ndim(),
                k.ndim(),
                v.ndim()
            ),
        ));
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::dtype(
            OP,
            format!(
                "Expected query, key, and value to have the same dtype, but got query.dtype: {} key.dtype: {} and value.dtype: {} instead.",
                q.dtype(),
                k.dtype(),
                v.dtype()
            ),
        ));
    }
    if !q.dtype().is_floating_point() {
        return Err(Error::dtype(
            OP,
            format!(
                "\"{OP}\" not implemented for '{}': pass floating point query, key and value",
                dtype_name(q.dtype())
            ),
        ));
    }
    if dropout != 0.0 {
        return Err(Error::argument(
            OP,
            format!("dropout_p = {dropout} is not supported: pass dropout_p=0.0 (inference), or compute the attention weights with softmax and apply dropout to them"),
        ));
    }
    if gqa {
        return Err(Error::argument(
            OP,
            "enable_gqa=True is not supported: repeat the key/value heads to the query's head count (repeat_interleave) and pass enable_gqa=False",
        ));
    }
    if causal && mask.is_some() {
        return Err(Error::argument(
            OP,
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True",
        ));
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let (l, e) = (qs[qs.len() - 2], qs[qs.len() - 1]);
    let (s, ek) = (ks[ks.len() - 2], ks[ks.len() - 1]);
    let (sv, ev) = (vs[vs.len() - 2], vs[vs.len() - 1]);
    if ek != e || sv != s {
        return Err(Error::shape(
            OP,
            format!(
                "query {qs:?}, key {ks:?} and value {vs:?} do not fit: expected query [.., L, E], key [.., S, E] and value [.., S, Ev] (key's last dim {ek} vs query's {e}, value's rows {sv} vs key's {s})"
            ),
        ));
    }
    let batch = broadcast_shapes(OP, &qs[..qs.len() - 2], &ks[..ks.len() - 2])
        .and_then(|b| broadcast_shapes(OP, &b, &vs[..vs.len() - 2]))
        .map_err(|_| {
            Error::shape(OP, format!("the batch dims of query {qs:?}, key {ks:?} and value {vs:?} do not broadcast"))
        })?;
    if let Some(m) = mask {
        if m.dtype() != DType::Bool && m.dtype() != q.dtype() {
            return Err(Error::dtype(
                OP,
                format!(
                    "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: {} and  query.dtype: {} instead.",
                    m.dtype(),
                    q.dtype()
                ),
            ));
        }
        let mut target = batch.clone();
        target.extend_from_slice(&[l, s]);
        if broadcast_shapes(OP, m.shape(), &target).map(|b| b != target).unwrap_or(true) {
            return Err(Error::shape(
                OP,
                format!(
                    "attn_mask of shape {:?} does not broadcast to the scores' shape {target:?} ([.., L, S])",
                    m.shape()
                ),
            ));
        }
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    Ok(Sig { batch, l, s, e, ev, scale, causal })
}

fn meta(args: &[Value]) -> Result<MetaOutputs> {
    let sig = check(args)?;
    Ok(smallvec![TensorMeta::contiguous(&sig.out_shape(), tensor(OP, args, 0)?.dtype())])
}

/// FLOPs: the two products (2·L·S·E and 2·L·S·Ev per matrix) and ~5 per score for the scale,
/// mask and softmax; bytes: the operands and the output (scores stay in cache).
fn cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes = 0u64;
    for a in args {
        if let Value::Tensor(t) = a {
            bytes += t.meta_nbytes() as u64;
        }
    }
    bytes += outs.iter().map(|o| o.nbytes() as u64).sum::<u64>();
    let flops = match check(args) {
        Ok(sig) => {
            let b: u64 = sig.batch.iter().map(|&d| d as u64).product();
            let (l, s, e, ev) = (sig.l as u64, sig.s as u64, sig.e as u64, sig.ev as u64);
            b * l * s * (2 * e + 2 * ev + 5)
        }
        Err(_) => 0,
    };
    Cost { flops, bytes }
}

/// Storage offsets of each matrix of `l` (`[batch.., r, c]`), in row-major batch order.
fn batch_offsets(l: &Layout) -> Vec<usize> {
    let n = l.ndim();
    let bl = Layout::from_parts(l.shape()[..n - 2].into(), l.strides()[..n - 2].into(), l.offset());
    StridedIter::new(&bl).collect()
}

/// `t`'s layout broadcast to `[batch.., r, c]`.
fn operand(t: &Tensor, batch: &[usize], r: usize, c: usize) -> Result<Layout> {
    let mut target: Shape = batch.into();
    target.extend_from_slice(&[r, c]);
    t.concrete(OP)?.1.broadcast_to(OP, &target)
}

/// Where a mask element lives: the mask's matrix offsets and row/column strides.
struct MaskView<'a, M> {
    data: &'a [M],
    offs: Vec<usize>,
    rs: usize,
    cs: usize,
}

/// The fused f32 kernel (see the module doc).
fn fused_f32(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, sig: &Sig) -> Result<Tensor> {
    let out_shape = sig.out_shape();
    let mut out = crate::memory::alloc_filled::<f32>(OP, &out_shape, 0.0)?;
    let (l, s, e, ev) = (sig.l, sig.s, sig.e, sig.ev);
    if out.is_empty() {
        return Tensor::from_vec(out, &out_shape);
    }
    let (lq, lk, lv) = (operand(q, &sig.batch, l, e)?, operand(k, &sig.batch, s, e)?, operand(v, &sig.batch, s, ev)?);
    let lm = mask.map(|m| operand(m, &sig.batch, l, s)).transpose()?;
    let (oq, ok, ov) = (batch_offsets(&lq), batch_offsets(&lk), batch_offsets(&lv));
    let om = lm.as_ref().map(batch_offsets);
    // One read guard per distinct storage (q, k, v are often views of one tensor).
    let mut tensors: Vec<&Tensor> = vec![q, k, v];
    tensors.extend(mask);
    let mut storages: Vec<&Storage> = Vec::new();
    let mut which = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let st = t.concrete(OP)?.0;
        match storages.iter().position(|x| x.same(st)) {
            Some(i) => which.push(i),
            None => {
                which.push(storages.len());
                storages.push(st);
            }
        }
    }
    let guards: Vec<_> = storages.iter().map(|st| st.read()).collect();
    let f32_of = |i: usize| {
        let g = &guards[which[i]];
        g.as_slice::<f32>().ok_or_else(|| Error::dtype(OP, format!("expected float32 data, got {}", g.dtype())))
    };
    let (dq, dk, dv) = (f32_of(0)?, f32_of(1)?, f32_of(2)?);
    let mut fmask = None;
    let mut bmask = None;
    if let (Some(m), Some(lm), Some(om)) = (mask, lm.as_ref(), om) {
        let st = lm.strides();
        let (rs, cs) = (st[st.len() - 2], st[st.len() - 1]);
        let g = &guards[which[3]];
        if m.dtype() == DType::Bool {
            let data = g.as_slice::<bool>().ok_or_else(|| Error::dtype(OP, "expected a bool attn_mask"))?;
            bmask = Some(MaskView { data, offs: om, rs, cs });
        } else {
            fmask = Some(MaskView { data: f32_of(3)?, offs: om, rs, cs });
        }
    }
    let nd = lq.ndim();
    let (qrs, qcs) = (lq.strides()[nd - 2] as isize, lq.strides()[nd - 1] as isize);
    let (krs, kcs) = (lk.strides()[nd - 2] as isize, lk.strides()[nd - 1] as isize);
    let (vrs, vcs) = (lv.strides()[nd - 2] as isize, lv.strides()[nd - 1] as isize);
    let scale = sig.scale as f32;
    let causal = sig.causal;
    let rows_max = ROWS.min(l);
    let one = |bi: usize, o: &mut [f32], sc: &mut Vec<f32>, par: Par| {
        sc.resize(rows_max * s, 0.0);
        for r0 in (0..l).step_by(ROWS) {
            let rows = ROWS.min(l - r0);
            let scores = &mut sc[..rows * s];
            let read_dst = match &fmask {
                Some(m) => {
                    for (i, row) in scores.chunks_exact_mut(s).enumerate() {
                        let base = m.offs[bi] + (r0 + i) * m.rs;
                        if m.cs == 1 {
                            row.copy_from_slice(&m.data[base..base + s]);
                        } else {
                            for (j, x) in row.iter_mut().enumerate() {
                                *x = m.data[base + j * m.cs];
                            }
                        }
                    }
                    true
                }
                None => false,
            };
            // SAFETY: oq/ok[bi] are storage offsets of matrices of bounds-checked layouts
            // (broadcast views of q and k), so rows r0..r0+rows of q's L x E matrix and every
            // element of k's S x E matrix (read transposed) are inside dq / dk; `scores` is an
            // exclusive rows x S buffer.
            unsafe {
                f32::gemm(
                    rows,
                    s,
                    e,
                    scores.as_mut_ptr(),
                    s as isize,
                    1,
                    read_dst,
                    dq.as_ptr().add(oq[bi]).offset(r0 as isize * qrs),
                    qrs,
                    qcs,
                    dk.as_ptr().add(ok[bi]),
                    kcs,
                    krs,
                    1.0,
                    scale,
                    par,
                );
            }
            for (i, row) in scores.chunks_exact_mut(s).enumerate() {
                let qi = r0 + i;
                if let Some(m) = &bmask {
                    let base = m.offs[bi] + qi * m.rs;
                    for (j, x) in row.iter_mut().enumerate() {
                        if !m.data[base + j * m.cs] {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                if causal && qi + 1 < s {
                    row[qi + 1..].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                }
                let mx = vmath::max(row);
                if mx == f32::NEG_INFINITY {
                    // nothing may be attended: zeros, as PyTorch's safe softmax
                    row.iter_mut().for_each(|x| *x = 0.0);
                    continue;
                }
                let sum = vmath::exp_shifted_sum_inplace(row, mx);
                vmath::scale(row, (1.0 / sum) as f32);
            }
            // SAFETY: `scores` holds rows x S probabilities; ov[bi] is the offset of value's
            // S x Ev matrix in a bounds-checked layout; rows r0.. of `o` (an exclusive L x Ev
            // chunk of the output) are written.
            unsafe {
                f32::gemm(
                    rows,
                    ev,
                    s,
                    o.as_mut_ptr().add(r0 * ev),
                    ev as isize,
                    1,
                    false,
                    scores.as_ptr(),
                    s as isize,
                    1,
                    dv.as_ptr().add(ov[bi]),
                    vrs,
                    vcs,
                    0.0,
                    1.0,
                    par,
                );
            }
        }
    };
    let nb = oq.len();
    if nb > 1 {
        out.par_chunks_mut(l * ev).enumerate().for_each_init(Vec::new, |sc, (bi, o)| one(bi, o, sc, Par::Seq));
    } else {
        one(0, &mut out, &mut Vec::new(), Par::Pool);
    }
    drop(guards);
    Tensor::from_vec(out, &out_shape)
}

/// The attention probabilities `softmax(q kᵀ · scale + mask)` with tensor ops (differentiable);
/// rows with nothing to attend are 0.
fn probabilities(q: &Tensor, k: &Tensor, mask: Option<&Tensor>, sig: &Sig) -> Result<Tensor> {
    let scores = binary::mul(&q.matmul(&k.transpose(-2, -1)?)?, sig.scale)?;
    let scores = match mask {
        Some(m) if m.dtype() == DType::Bool => scores.masked_fill(&m.logical_not()?, f64::NEG_INFINITY)?,
        Some(m) => binary::add(&scores, m)?,
        None if sig.causal => {
            let (l, s) = (sig.l, sig.s);
            let above: Vec<bool> = (0..l * s).map(|x| x % s > x / s).collect();
            scores.masked_fill(&Tensor::from_vec(above, &[l, s])?, f64::NEG_INFINITY)?
        }
        None => scores,
    };
    let p = scores.softmax(-1)?;
    // softmax of a row of -inf is NaN; the safe softmax gives 0 there
    let finite = crate::op::call("eq", vec![(&p).into(), (&p).into()], vec![])?
        .pop()
        .ok_or_else(|| Error::schema("eq", "op returned no output"))?;
    p.where_cond(&finite, 0.0)
}

fn kernel_fn(args: &[Value]) -> Result<Outputs> {
    let sig = check(args)?;
    let (q, k, v) = (tensor(OP, args, 0)?, tensor(OP, args, 1)?, tensor(OP, args, 2)?);
    let mask = opt_tensor(OP, args, 3)?;
    let out = match q.dtype() {
        DType::F32 => fused_f32(q, k, v, mask, &sig)?,
        d @ (DType::F16 | DType::BF16) => {
            let w = |t: &Tensor| kernel::cast(t, DType::F32);
            let m = mask.map(|m| if m.dtype() == DType::Bool { Ok(m.clone()) } else { w(m) }).transpose()?;
            kernel::cast(&fused_f32(&w(q)?, &w(k)?, &w(v)?, m.as_ref(), &sig)?, d)?
        }
        _ => {
            let _g = crate::autograd::no_grad();
            let p = probabilities(q, k, mask, &sig)?;
            kernel::contiguous(&p.matmul(v)?)?
        }
    };
    Ok(smallvec![out])
}

/// The gradients of query, key, value and a float mask, from recomputed probabilities `p`:
/// `dV = pᵀ g`, `dS = p ⊙ (g vᵀ - rowsum(g vᵀ ⊙ p))`, `dQ = dS k · scale`, `dK = dSᵀ q · scale`,
/// `dMask = dS`, each summed back over broadcast batch dims.
fn backward(ctx: &BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>> {
    let g = ctx.grad(0).ok_or_else(|| Error::autograd(OP, "missing output gradient"))?;
    let sig = check(ctx.args())?;
    let (q, k, v) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let mask = if ctx.is_tensor_arg(3) { Some(ctx.input(3)?) } else { None };
    let p = probabilities(q, k, mask, &sig)?;
    let to = |t: Tensor, like: &Tensor| -> Result<Tensor> {
        if t.shape() == like.shape() {
            Ok(t)
        } else {
            t.sum_to_size(&like.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())
        }
    };
    let dv = if ctx.needs_grad(2) { Some(to(p.transpose(-2, -1)?.matmul(g)?, v)?) } else { None };
    let need_s = ctx.needs_grad(0) || ctx.needs_grad(1) || (mask.is_some() && ctx.needs_grad(3));
    let (mut dq, mut dk, mut dm) = (None, None, None);
    if need_s {
        let dp = g.matmul(&v.transpose(-2, -1)?)?;
        let row = binary::mul(&dp, &p)?.sum_dim(&[-1], true)?;
        let ds = binary::mul(&p, &binary::sub(&dp, &row)?)?;
        if ctx.needs_grad(0) {
            dq = Some(to(binary::mul(&ds.matmul(k)?, sig.scale)?, q)?);
        }
        if ctx.needs_grad(1) {
            dk = Some(to(binary::mul(&ds.transpose(-2, -1)?.matmul(q)?, sig.scale)?, k)?);
        }
        if let Some(m) = mask {
            if ctx.needs_grad(3) && m.dtype() != DType::Bool {
                dm = Some(to(ds, m)?);
            }
        }
    }
    Ok(vec![dq, dk, dv, dm, None, None, None, None])
}

/// `scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
/// is_causal=False, scale=None, enable_gqa=False)`.
pub static SCALED_DOT_PRODUCT_ATTENTION: OpDef = OpDef {
    name: OP,
    schema: &[
        ArgSpec::req("query", T::Tensor),
        ArgSpec::req("key", T::Tensor),
        ArgSpec::req("value", T::Tensor),
        ArgSpec::opt("attn_mask", T::OptTensor, D::None),
        ArgSpec::opt("dropout_p", T::Float, D::Float(0.0)),
        ArgSpec::opt("is_causal", T::Bool, D::Bool(false)),
        ArgSpec::kw("scale", T::OptFloat, D::None),
        ArgSpec::kw("enable_gqa", T::Bool, D::Bool(false)),
    ],
    meta,
    kernel: kernel_fn,
    cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: Some(backward),
    saves: Saves::inputs(0b1111),
    doc: "softmax(query @ key.T * scale + attn_mask) @ value, fused (scores never materialised).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&SCALED_DOT_PRODUCT_ATTENTION];

/// `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, is_causal=
/// is_causal, scale=scale)` (no dropout): query `[.., L, E]`, key `[.., S, E]`, value
/// `[.., S, Ev]` -> `[.., L, Ev]`. `attn_mask` is boolean (true where a query may attend a key)
/// or additive, broadcastable to `[.., L, S]`.
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let args = [
        query.into(),
        key.into(),
        value.into(),
        attn_mask.into(),
        Value::Float(0.0),
        Value::Bool(is_causal),
        scale.map_or(Value::None, Value::Float),
        Value::Bool(false),
    ];
    let mut out = dispatch(&SCALED_DOT_PRODUCT_ATTENTION, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
