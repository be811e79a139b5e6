//! `scaled_dot_product_attention` with PyTorch's semantics
//! (`torch.nn.functional.scaled_dot_product_attention`): `softmax(q kᵀ · scale + mask) v` over
//! the last two dims, batch dims broadcast, the mask boolean (true = may attend) or additive
//! (same float dtype as the query), `is_causal` for a lower-triangular mask, `scale` defaulting
//! to `1/sqrt(E)`. A row that may attend to nothing gives zeros (PyTorch's safe softmax).
//!
//! The f32 kernel is fused: per matrix of the batch (split across the rayon pool), blocks of
//! query rows get their scores from one GEMM that starts from the additive mask, the softmax
//! runs on them while they are in cache (vectorised `exp`), and a second GEMM multiplies them by
//! the values; the `[.., L, S]` score tensor is never materialised. On AVX-512 both products
//! and the row softmax run on the register tiles of `attention_tiles.rs` (the `gemm` crate
//! otherwise). Operands are read through their strides, so heads split with `unflatten` +
//! `permute` need no copy. Other float dtypes run the same formula with tensor ops. The backward is written with tensor ops (it recomputes
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
use crate::ops::attention_tiles as tiles;
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

thread_local! {
    /// `Kᵀ` of the matrix whose scores this thread computes, packed for the AVX-512 tiles.
    static KT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The forward's `ROWS × S` probabilities of this thread.
    static PROBS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

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

/// One read guard per distinct storage of `tensors` (q, k, v are often views of one tensor),
/// and for each tensor the index of its guard.
fn read_guards<'t>(
    op: &str,
    tensors: &[&'t Tensor],
) -> Result<(Vec<parking_lot::RwLockReadGuard<'t, crate::storage::CpuBuffer>>, Vec<usize>)> {
    let mut storages: Vec<&Storage> = Vec::new();
    let mut which = Vec::with_capacity(tensors.len());
    for t in tensors {
        let st = t.concrete(op)?.0;
        match storages.iter().position(|x| x.same(st)) {
            Some(i) => which.push(i),
            None => {
                which.push(storages.len());
                storages.push(st);
            }
        }
    }
    Ok((storages.iter().map(|st| st.read()).collect(), which))
}

/// A float32 matrix operand of the batch: its data, the storage offset of each matrix of the
/// broadcast batch, and its row and column strides.
struct Mat<'a> {
    data: &'a [f32],
    offs: Vec<usize>,
    rs: isize,
    cs: isize,
}

impl<'a> Mat<'a> {
    fn new(data: &'a [f32], l: &Layout) -> Mat<'a> {
        let nd = l.ndim();
        Mat { data, offs: batch_offsets(l), rs: l.strides()[nd - 2] as isize, cs: l.strides()[nd - 1] as isize }
    }
    /// Pointer to row `r` of matrix `bi`.
    ///
    /// # Safety
    /// `bi` and `r` must be inside the layout the offsets were taken from.
    unsafe fn row(&self, bi: usize, r: usize) -> *const f32 {
        self.data.as_ptr().add(self.offs[bi]).offset(r as isize * self.rs)
    }
}

/// The probabilities `softmax(q kᵀ · scale + mask)` of blocks of query rows, computed in a
/// caller's buffer (shared by the fused forward and backward, so both see the same values).
struct Scores<'a> {
    q: Mat<'a>,
    k: Mat<'a>,
    fmask: Option<MaskView<'a, f32>>,
    bmask: Option<MaskView<'a, bool>>,
    s: usize,
    e: usize,
    scale: f32,
    causal: bool,
}

impl Scores<'_> {
    /// Writes the probabilities of query rows `r0..r0 + rows` of matrix `bi` into `p`
    /// (`rows × S`, row-major). A row that may attend to nothing is all zeros.
    fn block(&self, bi: usize, r0: usize, rows: usize, p: &mut [f32], par: Par) {
        let s = self.s;
        let p = &mut p[..rows * s];
        let read_dst = match &self.fmask {
            Some(m) => {
                for (i, row) in p.chunks_exact_mut(s).enumerate() {
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
        // SAFETY: the offsets come from bounds-checked layouts broadcast to [batch.., L, E] and
        // [batch.., S, E], so rows r0..r0+rows of q's matrix and every element of k's matrix
        // (read transposed) are inside their data; `p` is an exclusive rows x S buffer.
        if tiles::available() {
            KT.with_borrow_mut(|kt| unsafe {
                // Kᵀ: element (t, j) = k[j][t]
                let np = tiles::pack_b(self.k.row(bi, 0), self.k.cs, self.k.rs, self.e, s, kt);
                tiles::gemm_packed_b(
                    rows,
                    s,
                    self.e,
                    self.q.row(bi, r0),
                    self.q.rs,
                    self.q.cs,
                    kt,
                    np,
                    p.as_mut_ptr(),
                    s,
                    read_dst,
                    self.scale,
                );
            });
        } else {
            unsafe {
                f32::gemm(
                    rows,
                    s,
                    self.e,
                    p.as_mut_ptr(),
                    s as isize,
                    1,
                    read_dst,
                    self.q.row(bi, r0),
                    self.q.rs,
                    self.q.cs,
                    self.k.row(bi, 0),
                    self.k.cs,
                    self.k.rs,
                    1.0,
                    self.scale,
                    par,
                );
            }
        }
        for (i, row) in p.chunks_exact_mut(s).enumerate() {
            let qi = r0 + i;
            if let Some(m) = &self.bmask {
                let base = m.offs[bi] + qi * m.rs;
                for (j, x) in row.iter_mut().enumerate() {
                    if !m.data[base + j * m.cs] {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            if self.causal && qi + 1 < s {
                row[qi + 1..].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
            }
            let fast = tiles::available();
            // SAFETY (both calls): AVX-512F, as `available` checked
            let mx = if fast { unsafe { tiles::row_max(row) } } else { vmath::max(row) };
            if mx == f32::NEG_INFINITY {
                // nothing may be attended: zeros, as PyTorch's safe softmax
                row.iter_mut().for_each(|x| *x = 0.0);
                continue;
            }
            if fast && !mx.is_nan() {
                unsafe { tiles::exp_normalize(row, mx) };
                continue;
            }
            let sum = vmath::exp_shifted_sum_inplace(row, mx);
            vmath::scale(row, (1.0 / sum) as f32);
        }
    }
}

/// The mask views of a [`Scores`] from the mask's guard slot.
#[allow(clippy::type_complexity)]
fn mask_views<'a>(
    op: &str,
    mask: Option<&Tensor>,
    lm: Option<&Layout>,
    guard: Option<&'a crate::storage::CpuBuffer>,
) -> Result<(Option<MaskView<'a, f32>>, Option<MaskView<'a, bool>>)> {
    let (Some(m), Some(lm), Some(g)) = (mask, lm, guard) else { return Ok((None, None)) };
    let st = lm.strides();
    let (rs, cs) = (st[st.len() - 2], st[st.len() - 1]);
    let offs = batch_offsets(lm);
    if m.dtype() == DType::Bool {
        let data = g.as_slice::<bool>().ok_or_else(|| Error::dtype(op, "expected a bool attn_mask"))?;
        Ok((None, Some(MaskView { data, offs, rs, cs })))
    } else {
        let data = g
            .as_slice::<f32>()
            .ok_or_else(|| Error::dtype(op, format!("expected a float32 attn_mask, got {}", g.dtype())))?;
        Ok((Some(MaskView { data, offs, rs, cs }), None))
    }
}

fn f32_data<'a>(op: &str, g: &'a crate::storage::CpuBuffer) -> Result<&'a [f32]> {
    g.as_slice::<f32>().ok_or_else(|| Error::dtype(op, format!("expected float32 data, got {}", g.dtype())))
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
    let mut tensors: Vec<&Tensor> = vec![q, k, v];
    tensors.extend(mask);
    let (guards, which) = read_guards(OP, &tensors)?;
    let (fmask, bmask) = mask_views(OP, mask, lm.as_ref(), which.get(3).map(|&i| &*guards[i]))?;
    let sc = Scores {
        q: Mat::new(f32_data(OP, &guards[which[0]])?, &lq),
        k: Mat::new(f32_data(OP, &guards[which[1]])?, &lk),
        fmask,
        bmask,
        s,
        e,
        scale: sig.scale as f32,
        causal: sig.causal,
    };
    let vm = Mat::new(f32_data(OP, &guards[which[2]])?, &lv);
    let rows_max = ROWS.min(l);
    let one = |bi: usize, o: &mut [f32], buf: &mut Vec<f32>, par: Par| {
        buf.resize(rows_max * s, 0.0);
        // the values of matrix `bi`, packed for the tiles once for all blocks of query rows
        let (mut vb, mut vp) = (Vec::new(), 0);
        let vb = &mut vb;
        for r0 in (0..l).step_by(ROWS) {
            let rows = ROWS.min(l - r0);
            sc.block(bi, r0, rows, buf, par);
            // SAFETY: `buf` holds rows x S probabilities; v's matrix bi is S x Ev inside its
            // bounds-checked layout; rows r0.. of `o` (an exclusive L x Ev chunk of the output)
            // are written.
            if tiles::available() {
                if r0 == 0 {
                    // SAFETY: as above (all of v's matrix bi is read)
                    vp = unsafe { tiles::pack_b(vm.row(bi, 0), vm.rs, vm.cs, s, ev, vb) };
                }
                // SAFETY: as above; `vb` holds V packed with `vp` floats per row
                unsafe {
                    tiles::gemm_packed_b(
                        rows,
                        ev,
                        s,
                        buf.as_ptr(),
                        s as isize,
                        1,
                        vb,
                        vp,
                        o.as_mut_ptr().add(r0 * ev),
                        ev,
                        false,
                        1.0,
                    )
                };
                continue;
            }
            unsafe {
                f32::gemm(
                    rows,
                    ev,
                    s,
                    o.as_mut_ptr().add(r0 * ev),
                    ev as isize,
                    1,
                    false,
                    buf.as_ptr(),
                    s as isize,
                    1,
                    vm.row(bi, 0),
                    vm.rs,
                    vm.cs,
                    0.0,
                    1.0,
                    par,
                );
            }
        }
    };
    if out.len() / (l * ev) > 1 {
        // each thread's probability buffer is kept between calls (it is written before read)
        super::team::chunks_mut(&mut out, l * ev, |bi, o| PROBS.with_borrow_mut(|buf| one(bi, o, buf, Par::Seq)));
    } else {
        PROBS.with_borrow_mut(|buf| one(0, &mut out, buf, Par::Pool));
    }
    drop(guards);
    Tensor::from_vec(out, &out_shape)
}

/// The fused f32 backward (flash attention's, without a saved log-sum-exp): per matrix of the
/// batch and block of query rows, the probabilities are recomputed in a `rows × S` buffer
/// ([`Scores::block`], the forward's own values), then `dV += Pᵀ G`, `dP = G Vᵀ`,
/// `dS = P ⊙ (dP - rowsum(dP ⊙ P))`, `dQ = dS K · scale`, `dK += dSᵀ Q · scale` while the block
/// is in cache. Needs query, key and value with the batch dims of the output (no broadcast, so
/// each gradient matrix has one writer).
#[allow(clippy::too_many_arguments)]
fn fused_backward_f32(
    g: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    sig: &Sig,
) -> Result<[Tensor; 3]> {
    let (l, s, e, ev) = (sig.l, sig.s, sig.e, sig.ev);
    let shape = |r: usize, c: usize| -> Shape {
        let mut sh = sig.batch.clone();
        sh.extend_from_slice(&[r, c]);
        sh
    };
    let (sq, sk, sv) = (shape(l, e), shape(s, e), shape(s, ev));
    let mut dq = crate::memory::alloc_filled::<f32>(BW_OP, &sq, 0.0)?;
    let mut dk = crate::memory::alloc_filled::<f32>(BW_OP, &sk, 0.0)?;
    let mut dv = crate::memory::alloc_filled::<f32>(BW_OP, &sv, 0.0)?;
    let nb: usize = sig.batch.iter().product();
    if nb > 0 && l > 0 && s > 0 {
        let (lq, lk, lv) =
            (operand(q, &sig.batch, l, e)?, operand(k, &sig.batch, s, e)?, operand(v, &sig.batch, s, ev)?);
        let lg = operand(g, &sig.batch, l, ev)?;
        let lm = mask.map(|m| operand(m, &sig.batch, l, s)).transpose()?;
        let mut tensors: Vec<&Tensor> = vec![q, k, v, g];
        tensors.extend(mask);
        let (guards, which) = read_guards(BW_OP, &tensors)?;
        let (fmask, bmask) = mask_views(BW_OP, mask, lm.as_ref(), which.get(4).map(|&i| &*guards[i]))?;
        let sc = Scores {
            q: Mat::new(f32_data(BW_OP, &guards[which[0]])?, &lq),
            k: Mat::new(f32_data(BW_OP, &guards[which[1]])?, &lk),
            fmask,
            bmask,
            s,
            e,
            scale: sig.scale as f32,
            causal: sig.causal,
        };
        let vm = Mat::new(f32_data(BW_OP, &guards[which[2]])?, &lv);
        let gm = Mat::new(f32_data(BW_OP, &guards[which[3]])?, &lg);
        let scale = sig.scale as f32;
        let rows_max = ROWS.min(l);
        let one =
            |bi: usize, dq: &mut [f32], dk: &mut [f32], dv: &mut [f32], buf: &mut (Vec<f32>, Vec<f32>), par: Par| {
                let (p, ds) = buf;
                p.resize(rows_max * s, 0.0);
                ds.resize(rows_max * s, 0.0);
                for r0 in (0..l).step_by(ROWS) {
                    let rows = ROWS.min(l - r0);
                    let first = r0 == 0;
                    sc.block(bi, r0, rows, p, par);
                    // SAFETY (all four products): `p` and `ds` are exclusive rows x S buffers; g's,
                    // q's rows r0..r0+rows and k's and v's S rows of matrix bi are inside their
                    // bounds-checked layouts; dq (L x E), dk (S x E) and dv (S x Ev) are this
                    // matrix's exclusive contiguous chunks of the outputs.
                    unsafe {
                        // dV (+)= Pᵀ G
                        f32::gemm(
                            s,
                            ev,
                            rows,
                            dv.as_mut_ptr(),
                            ev as isize,
                            1,
                            !first,
                            p.as_ptr(),
                            1,
                            s as isize,
                            gm.row(bi, r0),
                            gm.rs,
                            gm.cs,
                            1.0,
                            1.0,
                            par,
                        );
                        // dP = G Vᵀ
                        f32::gemm(
                            rows,
                            s,
                            ev,
                            ds.as_mut_ptr(),
                            s as isize,
                            1,
                            false,
                            gm.row(bi, r0),
                            gm.rs,
                            gm.cs,
                            vm.row(bi, 0),
                            vm.cs,
                            vm.rs,
                            0.0,
                            1.0,
                            par,
                        );
                    }
                    // dS = P ⊙ (dP - rowsum(dP ⊙ P))
                    for (pr, dr) in p[..rows * s].chunks_exact(s).zip(ds[..rows * s].chunks_exact_mut(s)) {
                        let dot: f32 = pr.iter().zip(dr.iter()).map(|(a, b)| a * b).sum();
                        for (d, &pv) in dr.iter_mut().zip(pr) {
                            *d = pv * (*d - dot);
                        }
                    }
                    unsafe {
                        // dQ = dS K · scale
                        f32::gemm(
                            rows,
                            e,
                            s,
                            dq.as_mut_ptr().add(r0 * e),
                            e as isize,
                            1,
                            false,
                            ds.as_ptr(),
                            s as isize,
                            1,
                            sc.k.row(bi, 0),
                            sc.k.rs,
                            sc.k.cs,
                            0.0,
                            scale,
                            par,
                        );
                        // dK (+)= dSᵀ Q · scale
                        f32::gemm(
                            s,
                            e,
                            rows,
                            dk.as_mut_ptr(),
                            e as isize,
                            1,
                            !first,
                            ds.as_ptr(),
                            1,
                            s as isize,
                            sc.q.row(bi, r0),
                            sc.q.rs,
                            sc.q.cs,
                            1.0,
                            scale,
                            par,
                        );
                    }
                }
            };
        if nb > 1 {
            dq.par_chunks_mut(l * e)
                .zip(dk.par_chunks_mut(s * e))
                .zip(dv.par_chunks_mut(s * ev))
                .enumerate()
                .for_each_init(|| (Vec::new(), Vec::new()), |buf, (bi, ((a, b), c))| one(bi, a, b, c, buf, Par::Seq));
        } else {
            one(0, &mut dq, &mut dk, &mut dv, &mut (Vec::new(), Vec::new()), Par::Pool);
        }
        drop(guards);
    }
    Ok([Tensor::from_vec(dq, &sq)?, Tensor::from_vec(dk, &sk)?, Tensor::from_vec(dv, &sv)?])
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

/// The gradients of query, key, value and (with `need[3]`) a float mask, with tensor ops from
/// recomputed probabilities `p`: `dV = pᵀ g`, `dS = p ⊙ (g vᵀ - rowsum(g vᵀ ⊙ p))`,
/// `dQ = dS k · scale`, `dK = dSᵀ q · scale`, `dMask = dS`, each summed back over broadcast
/// batch dims. Differentiable (double backward) when grad mode is on.
#[allow(clippy::too_many_arguments)]
fn tensor_backward(
    g: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    sig: &Sig,
    need: [bool; 4],
) -> Result<[Option<Tensor>; 4]> {
    let p = probabilities(q, k, mask, sig)?;
    let to = |t: Tensor, like: &Tensor| -> Result<Tensor> {
        if t.shape() == like.shape() {
            Ok(t)
        } else {
            t.sum_to_size(&like.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())
        }
    };
    let dv = if need[2] { Some(to(p.transpose(-2, -1)?.matmul(g)?, v)?) } else { None };
    let need_m = need[3] && mask.is_some_and(|m| m.dtype() != DType::Bool);
    let (mut dq, mut dk, mut dm) = (None, None, None);
    if need[0] || need[1] || need_m {
        let dp = g.matmul(&v.transpose(-2, -1)?)?;
        let row = binary::mul(&dp, &p)?.sum_dim(&[-1], true)?;
        let ds = binary::mul(&p, &binary::sub(&dp, &row)?)?;
        if need[0] {
            dq = Some(to(binary::mul(&ds.matmul(k)?, sig.scale)?, q)?);
        }
        if need[1] {
            dk = Some(to(binary::mul(&ds.transpose(-2, -1)?.matmul(q)?, sig.scale)?, k)?);
        }
        if let (true, Some(m)) = (need_m, mask) {
            dm = Some(to(ds, m)?);
        }
    }
    Ok([dq, dk, dv, dm])
}

/// The backward of [`SCALED_DOT_PRODUCT_ATTENTION`]. Without grad mode (an ordinary backward,
/// or a traced one) it calls the fused [`SCALED_DOT_PRODUCT_ATTENTION_BACKWARD`] op; for a
/// double backward (`create_graph`) or a float mask that needs its gradient, the tensor-op
/// formula.
fn backward(ctx: &BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>> {
    let g = ctx.grad(0).ok_or_else(|| Error::autograd(OP, "missing output gradient"))?;
    let sig = check(ctx.args())?;
    let (q, k, v) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let mask = if ctx.is_tensor_arg(3) { Some(ctx.input(3)?) } else { None };
    let need = [ctx.needs_grad(0), ctx.needs_grad(1), ctx.needs_grad(2), mask.is_some() && ctx.needs_grad(3)];
    let mask_grad = need[3] && mask.is_some_and(|m| m.dtype() != DType::Bool);
    let [dq, dk, dv, dm] = if crate::autograd::is_grad_enabled() || mask_grad {
        tensor_backward(g, q, k, v, mask, &sig, need)?
    } else {
        let args =
            [g.into(), q.into(), k.into(), v.into(), mask.into(), Value::Bool(sig.causal), Value::Float(sig.scale)];
        let mut out = dispatch(&SCALED_DOT_PRODUCT_ATTENTION_BACKWARD, CallKind::Function, &args)?.into_iter();
        let mut next = |i: usize| out.next().filter(|_| need[i]);
        [next(0), next(1), next(2), None]
    };
    Ok(vec![dq, dk, dv, dm, None, None, None, None])
}

const BW_OP: &str = "scaled_dot_product_attention_backward";

/// The forward's arguments of a backward call, and its checked shapes.
fn bw_check(args: &[Value]) -> Result<Sig> {
    let fwd = [
        args.get(1).cloned().unwrap_or(Value::None),
        args.get(2).cloned().unwrap_or(Value::None),
        args.get(3).cloned().unwrap_or(Value::None),
        args.get(4).cloned().unwrap_or(Value::None),
        Value::Float(0.0),
        args.get(5).cloned().unwrap_or(Value::Bool(false)),
        args.get(6).cloned().unwrap_or(Value::None),
        Value::Bool(false),
    ];
    let sig = check(&fwd).map_err(|e| Error::shape(BW_OP, e.to_string()))?;
    let g = tensor(BW_OP, args, 0)?;
    let q = tensor(BW_OP, args, 1)?;
    if g.shape() != sig.out_shape().as_slice() || g.dtype() != q.dtype() {
        return Err(Error::shape(
            BW_OP,
            format!(
                "grad_out must be the forward output's shape {:?} and dtype {}, got {:?} {}",
                sig.out_shape(),
                q.dtype(),
                g.shape(),
                g.dtype()
            ),
        ));
    }
    Ok(sig)
}

fn bw_meta(args: &[Value]) -> Result<MetaOutputs> {
    bw_check(args)?;
    let t = |i: usize| tensor(BW_OP, args, i);
    let m = |x: &Tensor| TensorMeta::contiguous(x.shape(), x.dtype());
    Ok(smallvec![m(t(1)?), m(t(2)?), m(t(3)?)])
}

fn bw_kernel(args: &[Value]) -> Result<Outputs> {
    let sig = bw_check(args)?;
    let (g, q, k, v) =
        (tensor(BW_OP, args, 0)?, tensor(BW_OP, args, 1)?, tensor(BW_OP, args, 2)?, tensor(BW_OP, args, 3)?);
    let mask = opt_tensor(BW_OP, args, 4)?;
    let unbroadcast = [q, k, v].iter().all(|t| t.shape()[..t.ndim() - 2] == sig.batch[..]);
    let [dq, dk, dv] = if q.dtype() == DType::F32 && unbroadcast && sig.e > 0 && sig.ev > 0 {
        fused_backward_f32(g, q, k, v, mask, &sig)?
    } else {
        let _g = crate::autograd::no_grad();
        let [dq, dk, dv, _] = tensor_backward(g, q, k, v, mask, &sig, [true, true, true, false])?;
        let some = |t: Option<Tensor>| t.ok_or_else(|| Error::schema(BW_OP, "missing gradient"));
        [kernel::contiguous(&some(dq)?)?, kernel::contiguous(&some(dk)?)?, kernel::contiguous(&some(dv)?)?]
    };
    Ok(smallvec![dq, dk, dv])
}

/// FLOPs: four products per matrix (2·L·S·(E + Ev) twice, the probabilities recomputed) and
/// ~8 per score; bytes: the operands and the three gradients.
fn bw_cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes: u64 = args.iter().filter_map(|a| a.as_tensor()).map(|t| t.meta_nbytes() as u64).sum();
    bytes += outs.iter().map(|o| o.nbytes() as u64).sum::<u64>();
    let flops = match bw_check(args) {
        Ok(sig) => {
            let b: u64 = sig.batch.iter().map(|&d| d as u64).product();
            let (l, s, e, ev) = (sig.l as u64, sig.s as u64, sig.e as u64, sig.ev as u64);
            b * l * s * (6 * e + 4 * ev + 8)
        }
        Err(_) => 0,
    };
    Cost { flops, bytes }
}

/// `scaled_dot_product_attention_backward(grad_out, query, key, value, attn_mask=None,
/// is_causal=False, scale=None) -> (grad_query, grad_key, grad_value)`: the gradients of
/// [`SCALED_DOT_PRODUCT_ATTENTION`] (PyTorch's `_scaled_dot_product_flash_attention_for_cpu_backward`
/// role). float32 runs fused, recomputing the probabilities per block of query rows (never a
/// `[.., L, S]` tensor); broadcast batch dims and other dtypes run the tensor-op formula.
/// Not differentiable itself: a double backward uses the tensor-op formula instead.
pub static SCALED_DOT_PRODUCT_ATTENTION_BACKWARD: OpDef = OpDef {
    name: BW_OP,
    schema: &[
        ArgSpec::req("grad_out", T::Tensor),
        ArgSpec::req("query", T::Tensor),
        ArgSpec::req("key", T::Tensor),
        ArgSpec::req("value", T::Tensor),
        ArgSpec::opt("attn_mask", T::OptTensor, D::None),
        ArgSpec::opt("is_causal", T::Bool, D::Bool(false)),
        ArgSpec::kw("scale", T::OptFloat, D::None),
    ],
    meta: bw_meta,
    kernel: bw_kernel,
    cost: bw_cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: None,
    saves: Saves::NOTHING,
    doc: "The gradients of scaled_dot_product_attention (query, key, value), fused in float32.",
};

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
pub(crate) static OPS: &[&OpDef] = &[&SCALED_DOT_PRODUCT_ATTENTION, &SCALED_DOT_PRODUCT_ATTENTION_BACKWARD];

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
