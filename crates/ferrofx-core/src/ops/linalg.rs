//! Matrix products: `matmul` (PyTorch's full semantics: dot, mm, mv, batched with broadcast
//! batch dims), `mm`, `bmm`, `addmm` and `linear`.
//!
//! f32/f64 run on the `gemm` crate with the operands' strides passed straight through, so
//! transposed or sliced views need no copy; f16/bf16 compute in f32 and round back; integer
//! dtypes use a plain (wrapping) loop; bool is rejected as in PyTorch. Batched products either
//! fold the batch into the rows of one GEMM (when the right operand is shared and the left one's
//! strides allow it, e.g. `linear` on `[B, T, F]`), run the batch in parallel with
//! single-threaded GEMMs (many small matrices), or run a parallel GEMM per batch (large ones).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, Layout, Shape, StridedIter};
use crate::op::args::{opt_tensor, scalar, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, MetaOutputs, OpDef, Outputs, Saves,
};
use crate::ops::kernel;
use crate::scalar::Scalar;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

// ---------------------------------------------------------------------------------------------
// GEMM building block shared with conv.rs
// ---------------------------------------------------------------------------------------------

/// Whether a GEMM may use the rayon pool. Inside a rayon worker (batch-parallel loops) GEMMs run
/// single-threaded so the pool is not oversubscribed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Par {
    /// Single-threaded.
    Seq,
    /// May split across the rayon pool (decided by the GEMM itself for small sizes).
    Pool,
}

impl Par {
    /// The threads a GEMM may use here: the team's (`team::threads`: the pool's size, or one
    /// inside a rayon worker or a team helper, where jobs run serially).
    fn threads(self) -> usize {
        if self == Par::Seq {
            1
        } else {
            super::team::threads()
        }
    }

    fn to_gemm(self) -> gemm::Parallelism {
        let n = rayon::current_num_threads();
        if self == Par::Seq || n <= 1 || rayon::current_thread_index().is_some() {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(n)
        }
    }
}

/// A raw pointer handed to the threads of a split GEMM (each writes a disjoint block).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used by `MatElem::gemm`'s split, whose blocks never overlap.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// Products smaller than this many multiply-adds run on one thread (a fork-join costs a few
/// microseconds; this is about ten on one core).
const SPLIT_MIN_MACS: usize = 1 << 21;

/// `threads` blocks `(start, len)` of the output's columns (`true`) or, for a tall output,
/// rows (`false`). Column blocks are multiples of 32 (two AVX-512 registers of f32) so every
/// block but the last runs full micro-kernel tiles; row blocks multiples of 8.
fn split_blocks(m: usize, n: usize, threads: usize) -> (Vec<(usize, usize)>, bool) {
    let by_cols = n >= 64 && n * 2 >= m;
    let (len, align) = if by_cols { (n, 32) } else { (m, 8) };
    let per = len.div_ceil(threads).div_ceil(align) * align;
    let blocks = (0..len).step_by(per.max(1)).map(|s| (s, per.min(len - s))).collect();
    (blocks, by_cols)
}

/// Element types with a matrix product: f32/f64 through the `gemm` crate, integers through a
/// wrapping loop.
pub(crate) trait MatElem: Element {
    /// `dst = (read_dst ? dst_coef * dst : 0) + prod_coef * (a @ b)` for an `m x k` matrix `a`
    /// and a `k x n` matrix `b`, all addressed by element strides.
    ///
    /// # Safety
    /// Every index `i*rs + j*cs` for `i < rows`, `j < cols` of each operand must be in bounds of
    /// the allocation its pointer points into; `dst` must not overlap `a` or `b`, and nothing
    /// else may access `dst` during the call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        dst: *mut Self,
        dst_rs: isize,
        dst_cs: isize,
        read_dst: bool,
        a: *const Self,
        a_rs: isize,
        a_cs: isize,
        b: *const Self,
        b_rs: isize,
        b_cs: isize,
        dst_coef: Self,
        prod_coef: Self,
        par: Par,
    );
    /// `self + other` (wrapping for integers).
    fn add_wrapping(self, other: Self) -> Self;
}

macro_rules! add_impl {
    ($a:expr, $b:expr) => {
        Addable::add_w($a, $b)
    };
}

trait Addable {
    fn add_w(self, o: Self) -> Self;
}
impl Addable for f32 {
    #[inline(always)]
    fn add_w(self, o: Self) -> Self {
        self + o
    }
}
impl Addable for f64 {
    #[inline(always)]
    fn add_w(self, o: Self) -> Self {
        self + o
    }
}
macro_rules! addable_int {
    ($($t:ty),*) => {$(
        impl Addable for $t {
            #[inline(always)]
            fn add_w(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
        }
    )*};
}
addable_int!(u8, i8, i16, i32, i64);

macro_rules! float_mat {
    ($t:ty) => {
        impl MatElem for $t {
            #[inline(always)]
            fn add_wrapping(self, other: Self) -> Self {
                add_impl!(self, other)
            }
            unsafe fn gemm(
                m: usize,
                n: usize,
                k: usize,
                dst: *mut Self,
                dst_rs: isize,
                dst_cs: isize,
                read_dst: bool,
                a: *const Self,
                a_rs: isize,
                a_cs: isize,
                b: *const Self,
                b_rs: isize,
                b_cs: isize,
                dst_coef: Self,
                prod_coef: Self,
                par: Par,
            ) {
                if m == 0 || n == 0 {
                    return;
                }
                if k == 0 {
                    // An empty inner dimension: the product is zero.
                    for i in 0..m as isize {
                        for j in 0..n as isize {
                            let p = dst.offset(i * dst_rs + j * dst_cs);
                            *p = if read_dst { dst_coef * *p } else { 0.0 };
                        }
                    }
                    return;
                }
                // a row vector times a matrix (a classifier at batch 1): bound by reading the
                // matrix, streamed by its own kernel (see `gemv`)
                if m == 1
                    && <Self as super::gemv::RowGemv>::row_gemv(
                        n,
                        k,
                        dst,
                        dst_cs,
                        read_dst,
                        a,
                        a_cs,
                        b,
                        b_rs,
                        b_cs,
                        dst_coef,
                        prod_coef,
                        par.threads(),
                    )
                {
                    return;
                }
                // one `gemm` call on an `bm x bn` block whose operands start at `d`, `aa`, `bb`
                let call = |bm: usize, bn: usize, d: *mut Self, aa: *const Self, bb: *const Self, p| {
                    // SAFETY: every caller passes a block of the operands this function's
                    // contract covers; gemm reads `aa`/`bb` and writes `d` only at the strided
                    // indices of the block.
                    unsafe {
                        gemm::gemm(
                            bm, bn, k, d, dst_cs, dst_rs, read_dst, aa, a_cs, a_rs, bb, b_cs, b_rs, dst_coef,
                            prod_coef, false, false, false, p,
                        )
                    }
                };
                let threads = par.threads();
                let macs = m.saturating_mul(n).saturating_mul(k);
                // a matrix-vector product (m or n at most 4) is bound by reading the matrix,
                // which both cores read at twice one core's speed: split from 1 MiB of it on
                let gemv = m.min(n) <= 4 && macs >= SPLIT_MIN_MACS / 8;
                if threads > 1 && (macs >= SPLIT_MIN_MACS || gemv) {
                    // One block of output columns (or rows, when the output is tall) per
                    // thread, each a single-threaded GEMM: both cores stay busy on the
                    // 128-row products of a transformer, which the crate's own split leaves
                    // on one core (see `split_blocks`).
                    let (blocks, by_cols) = split_blocks(m, n, threads);
                    let (dst, a, b) = (SendPtr(dst), SendPtr(a as *mut Self), SendPtr(b as *mut Self));
                    super::team::for_each(blocks.len(), |bi| {
                        let (start, len) = blocks[bi];
                        let (dst, a, b) = (dst, a, b);
                        let s = start as isize;
                        // SAFETY: the blocks are disjoint ranges of the output's rows or
                        // columns, so each call writes its own part of `dst`; the offsets stay
                        // inside the operands.
                        unsafe {
                            if by_cols {
                                call(
                                    m,
                                    len,
                                    dst.0.offset(s * dst_cs),
                                    a.0,
                                    b.0.offset(s * b_cs),
                                    gemm::Parallelism::None,
                                )
                            } else {
                                call(
                                    len,
                                    n,
                                    dst.0.offset(s * dst_rs),
                                    a.0.offset(s * a_rs),
                                    b.0,
                                    gemm::Parallelism::None,
                                )
                            }
                        }
                    });
                    return;
                }
                call(m, n, dst, a, b, par.to_gemm())
            }
        }
    };
}
float_mat!(f32);
float_mat!(f64);

macro_rules! int_mat {
    ($t:ty) => {
        impl MatElem for $t {
            #[inline(always)]
            fn add_wrapping(self, other: Self) -> Self {
                add_impl!(self, other)
            }
            unsafe fn gemm(
                m: usize,
                n: usize,
                k: usize,
                dst: *mut Self,
                dst_rs: isize,
                dst_cs: isize,
                read_dst: bool,
                a: *const Self,
                a_rs: isize,
                a_cs: isize,
                b: *const Self,
                b_rs: isize,
                b_cs: isize,
                dst_coef: Self,
                prod_coef: Self,
                _par: Par,
            ) {
                for i in 0..m as isize {
                    for j in 0..n as isize {
                        let mut acc: $t = 0;
                        for p in 0..k as isize {
                            // SAFETY: indices within the shapes, per the contract.
                            let x = *a.offset(i * a_rs + p * a_cs);
                            let y = *b.offset(p * b_rs + j * b_cs);
                            acc = acc.wrapping_add(x.wrapping_mul(y));
                        }
                        let d = dst.offset(i * dst_rs + j * dst_cs);
                        let prod = prod_coef.wrapping_mul(acc);
                        *d = if read_dst { dst_coef.wrapping_mul(*d).wrapping_add(prod) } else { prod };
                    }
                }
            }
        }
    };
}
int_mat!(u8);
int_mat!(i8);
int_mat!(i16);
int_mat!(i32);
int_mat!(i64);

/// Runs `$body` with `$T` bound to the compute type of a matrix dtype (f32, f64, integers).
/// f16/bf16 and bool must be handled by the caller before.
macro_rules! match_mat_dtype {
    ($op:expr, $dt:expr, $T:ident => $body:expr) => {
        match $dt {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I16 => {
                type $T = i16;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            other => Err(Error::dtype($op, format!("\"{}\" not implemented for '{}'", $op, dtype_title(other)))),
        }
    };
}
pub(crate) use match_mat_dtype;

/// PyTorch's capitalised dtype names used in "not implemented for 'Float'" messages.
pub(crate) fn dtype_title(d: DType) -> &'static str {
    match d {
        DType::Bool => "Bool",
        DType::U8 => "Byte",
        DType::I8 => "Char",
        DType::I16 => "Short",
        DType::I32 => "Int",
        DType::I64 => "Long",
        DType::F16 => "Half",
        DType::BF16 => "BFloat16",
        DType::F32 => "Float",
        DType::F64 => "Double",
    }
}

/// PyTorch's C-style dtype names (`float`, `double`, `long int`) used in mm's messages.
fn dtype_c(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short int",
        DType::I32 => "int",
        DType::I64 => "long int",
        DType::F16 => "c10::Half",
        DType::BF16 => "c10::BFloat16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// `true` for f16/bf16, which compute in f32 and round back.
pub(crate) fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Reads two tensors' buffers as `T` under read locks (one lock when they share storage).
pub(crate) fn read2<T: Element, R>(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    f: impl FnOnce(&[T], &[T]) -> Result<R>,
) -> Result<R> {
    let (sa, _) = a.concrete(op)?;
    let (sb, _) = b.concrete(op)?;
    let ga = sa.read();
    let da = ga
        .as_slice::<T>()
        .ok_or_else(|| Error::dtype(op, format!("expected {} input, got {}", T::DTYPE, ga.dtype())))?;
    if sa.same(sb) {
        return f(da, da);
    }
    let gb = sb.read();
    let db = gb
        .as_slice::<T>()
        .ok_or_else(|| Error::dtype(op, format!("expected {} input, got {}", T::DTYPE, gb.dtype())))?;
    f(da, db)
}

/// A matrix (or batch of matrices) inside a buffer: shape `[batch.., rows, cols]` with strides.
struct MatView<'a> {
    l: &'a Layout,
}

impl MatView<'_> {
    fn rs(&self) -> isize {
        self.l.strides()[self.l.ndim() - 2] as isize
    }
    fn cs(&self) -> isize {
        self.l.strides()[self.l.ndim() - 1] as isize
    }
    /// Storage offsets of each matrix of the batch, in row-major batch order.
    fn batch_offsets(&self) -> Vec<usize> {
        let n = self.l.ndim();
        let bl = Layout::from_parts(self.l.shape()[..n - 2].into(), self.l.strides()[..n - 2].into(), self.l.offset());
        StridedIter::new(&bl).collect()
    }
}

/// Above this many multiply-adds per matrix, a batch runs matrix by matrix with parallel GEMMs;
/// below it, the batch itself is split across threads.
const PAR_BATCH_WORK: usize = 96 * 96 * 96;

/// The batched product `out[b] = dst_coef*out[b] + prod_coef * a[b] @ b[b]` where `la`, `lb` are
/// layouts already broadcast to `[batch.., m, k]` and `[batch.., k, n]`, and `out` is contiguous
/// `[batch.., m, n]` (prefilled when `read_dst`).
#[allow(clippy::too_many_arguments)]
fn batched_gemm<T: MatElem>(
    da: &[T],
    la: &Layout,
    db: &[T],
    lb: &Layout,
    out: &mut [T],
    read_dst: bool,
    dst_coef: T,
    prod_coef: T,
) {
    let nd = la.ndim();
    let (m, k, n) = (la.shape()[nd - 2], la.shape()[nd - 1], lb.shape()[nd - 1]);
    if out.is_empty() {
        return;
    }
    let (va, vb) = (MatView { l: la }, MatView { l: lb });
    let batch: usize = la.shape()[..nd - 2].iter().product();
    // Fold the batch into the rows of one GEMM: b shared by all batches and a's [batch.., m]
    // dims mergeable into one strided dim.
    let b_shared = lb.strides()[..nd - 2].iter().zip(&lb.shape()[..nd - 2]).all(|(&s, &d)| s == 0 || d == 1);
    if batch > 1 && b_shared {
        let merged = Layout::from_parts(la.shape()[..nd - 1].into(), la.strides()[..nd - 1].into(), la.offset())
            .view_as(&[batch * m]);
        if let Some(ml) = merged {
            let rs = ml.strides()[0] as isize;
            // SAFETY: the folded layout addresses exactly the elements of `la` (view_as keeps the
            // element set), which lie inside `da` (tensor layouts are bounds-checked on creation);
            // `lb`'s first matrix lies inside `db`; `out` has batch*m*n elements, written once.
            unsafe {
                T::gemm(
                    batch * m,
                    n,
                    k,
                    out.as_mut_ptr(),
                    n as isize,
                    1,
                    read_dst,
                    da.as_ptr().add(ml.offset()),
                    rs,
                    va.cs(),
                    db.as_ptr().add(lb.offset()),
                    vb.rs(),
                    vb.cs(),
                    dst_coef,
                    prod_coef,
                    Par::Pool,
                );
            }
            return;
        }
    }
    let oa = va.batch_offsets();
    let ob = vb.batch_offsets();
    let (ars, acs, brs, bcs) = (va.rs(), va.cs(), vb.rs(), vb.cs());
    let one = |o: &mut [T], offa: usize, offb: usize, par: Par| {
        // SAFETY: offa/offb are storage offsets of matrices of bounds-checked layouts, so every
        // strided index of an m x k (k x n) matrix from there is inside da (db); `o` is an
        // exclusive chunk of m*n contiguous elements.
        unsafe {
            T::gemm(
                m,
                n,
                k,
                o.as_mut_ptr(),
                n as isize,
                1,
                read_dst,
                da.as_ptr().add(offa),
                ars,
                acs,
                db.as_ptr().add(offb),
                brs,
                bcs,
                dst_coef,
                prod_coef,
                par,
            )
        }
    };
    let chunk = m * n;
    if batch > 1 && m * n * k < PAR_BATCH_WORK && batch * m * n * k >= 32 * 32 * 32 {
        super::team::chunks_mut(out, chunk, |i, o| one(o, oa[i], ob[i], Par::Seq));
    } else {
        for ((o, &x), &y) in out.chunks_mut(chunk).zip(&oa).zip(&ob) {
            one(o, x, y, Par::Pool);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shape logic (shared by meta and kernels)
// ---------------------------------------------------------------------------------------------

fn check_same_dtype(op: &str, a: DType, b: DType) -> Result<()> {
    if a != b {
        return Err(Error::dtype(
            op,
            format!("expected m1 and m2 to have the same dtype, but got: {} != {}", dtype_c(a), dtype_c(b)),
        ));
    }
    if a == DType::Bool {
        return Err(Error::dtype(op, "\"addmm_impl_cpu_\" not implemented for 'Bool'"));
    }
    Ok(())
}

fn mm_mismatch(op: &str, a: &[usize], b: &[usize]) -> Error {
    Error::shape(op, format!("mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})", a[0], a[1], b[0], b[1]))
}

/// The plan of a matmul: operand shapes as `[batch.., m, k]` / `[batch.., k, n]` (1-D operands
/// get a size-1 dim), the broadcast batch, and the final output shape.
struct MatmulPlan {
    a_shape: Shape,
    b_shape: Shape,
    batch: Shape,
    m: usize,
    k: usize,
    n: usize,
    out_shape: Shape,
    a_1d: bool,
    b_1d: bool,
}

fn matmul_plan(op: &str, a: &[usize], b: &[usize]) -> Result<MatmulPlan> {
    let (na, nb) = (a.len(), b.len());
    if na == 0 || nb == 0 {
        return Err(Error::shape(
            op,
            format!("both arguments to matmul need to be at least 1D, but they are {na}D and {nb}D"),
        ));
    }
    if na == 1 && nb == 1 && a[0] != b[0] {
        return Err(Error::shape(
            op,
            format!(
                "inconsistent tensor size, expected tensor [{}] and src [{}] to have the same number of elements, but got {} and {} elements respectively",
                a[0], b[0], a[0], b[0]
            ),
        ));
    }
    let a_1d = na == 1;
    let b_1d = nb == 1;
    let a_shape: Shape = if a_1d { smallvec![1, a[0]] } else { a.into() };
    let b_shape: Shape = if b_1d { smallvec![b[0], 1] } else { b.into() };
    let (m, k) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let (k2, n) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
    if k != k2 {
        if b_1d && na == 2 {
            return Err(Error::shape(op, format!("size mismatch, got input ({m}), mat ({m}x{k}), vec ({k2})")));
        }
        let rows: usize = a_shape[..a_shape.len() - 1].iter().fold(1usize, |r, &d| r.saturating_mul(d));
        return Err(mm_mismatch(op, &[if nb == 2 || b_1d { rows } else { m }, k], &[k2, n]));
    }
    let batch = broadcast_shapes(op, &a_shape[..a_shape.len() - 2], &b_shape[..b_shape.len() - 2])?;
    let mut out_shape: Shape = batch.clone();
    if !a_1d {
        out_shape.push(m);
    }
    if !b_1d {
        out_shape.push(n);
    }
    Ok(MatmulPlan { a_shape, b_shape, batch, m, k, n, out_shape, a_1d, b_1d })
}

/// Result dtype of a matrix op after its dtype checks.
fn mat_dtype(op: &str, a: &Tensor, b: &Tensor) -> Result<DType> {
    check_same_dtype(op, a.dtype(), b.dtype())?;
    Ok(a.dtype())
}

/// Layout of `t` seen as `shape` (1-D operands unsqueezed) and broadcast to `[batch.., r, c]`.
fn operand_layout(op: &str, t: &Tensor, unsq: Option<i64>, batch: &[usize]) -> Result<Layout> {
    let (_, l) = t.concrete(op)?;
    let l = match unsq {
        Some(d) => l.unsqueeze(op, d)?,
        None => l.clone(),
    };
    let nd = l.ndim();
    let mut target: Shape = batch.into();
    target.extend_from_slice(&l.shape()[nd - 2..]);
    l.broadcast_to(op, &target)
}

/// Runs a planned matmul on `a` and `b` (same dtype, not half/bool) into a contiguous buffer,
/// optionally starting from `init` (scaled by `dst_coef`).
fn run_matmul<T: MatElem>(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    plan: &MatmulPlan,
    init: Option<Vec<T>>,
    dst_coef: T,
    prod_coef: T,
) -> Result<Vec<T>> {
    let la = operand_layout(op, a, plan.a_1d.then_some(0), &plan.batch)?;
    let lb = operand_layout(op, b, plan.b_1d.then_some(1), &plan.batch)?;
    let mut full: Shape = plan.batch.clone();
    full.extend_from_slice(&[plan.m, plan.n]);
    let total = crate::memory::check_alloc(op, &full, T::DTYPE)?;
    let read_dst = init.is_some();
    let mut out = match init {
        Some(v) => v,
        None => crate::memory::alloc_filled(op, &full, T::default())?,
    };
    debug_assert_eq!(out.len(), total);
    let _ = (&plan.a_shape, &plan.b_shape, plan.k);
    if total == 0 {
        // nothing to compute (and the batch may still be huge: [2^40, 0, k] @ [k, n])
        return Ok(out);
    }
    read2::<T, _>(op, a, b, |da, db| {
        batched_gemm(da, &la, db, &lb, &mut out, read_dst, dst_coef, prod_coef);
        Ok(())
    })?;
    Ok(out)
}

/// Casts f16/bf16 to f32 (other dtypes unchanged).
fn widen(t: &Tensor) -> Result<Tensor> {
    if is_half(t.dtype()) {
        kernel::cast(t, DType::F32)
    } else {
        Ok(t.clone())
    }
}

/// `matmul` on concrete tensors (also used by `linear` without bias).
fn matmul_kernel(op: &str, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let dt = mat_dtype(op, a, b)?;
    let plan = matmul_plan(op, a.shape(), b.shape())?;
    if is_half(dt) {
        let r = matmul_kernel(op, &widen(a)?, &widen(b)?)?;
        return kernel::cast(&r, dt);
    }
    match_mat_dtype!(op, dt, E => {
        let v = run_matmul::<E>(op, a, b, &plan, None, E::from_i64(0), E::from_i64(1))?;
        Tensor::from_vec(v, &plan.out_shape)
    })
}

/// FLOPs of a matrix product: 2 × output elements × inner dimension, the inner dimension
/// being the last dim of the left operand (argument `left`).
fn product_cost(args: &[Value], outs: &[TensorMeta], left: usize) -> Cost {
    let mut bytes = 0u64;
    for a in args {
        if let Value::Tensor(t) = a {
            bytes = bytes.saturating_add(t.meta_nbytes() as u64);
        }
    }
    let k = match args.get(left) {
        Some(Value::Tensor(t)) => t.meta_shape().and_then(|s| s.last().copied()).unwrap_or(1) as u64,
        _ => 1,
    };
    let out_numel: u64 = outs.iter().fold(0u64, |n, o| n.saturating_add(o.numel() as u64));
    bytes = outs.iter().fold(bytes, |b, o| b.saturating_add(o.nbytes() as u64));
    Cost { flops: out_numel.saturating_mul(k).saturating_mul(2), bytes }
}

/// `matmul`, `mm`, `bmm`, `linear`: the left operand is argument 0.
fn matmul_cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    product_cost(args, outs, 0)
}

/// `addmm(input, mat1, mat2)`: the left operand is argument 1.
fn addmm_cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    product_cost(args, outs, 1)
}

// ---------------------------------------------------------------------------------------------
// Op definitions
// ---------------------------------------------------------------------------------------------

fn meta1(shape: &[usize], dtype: DType) -> MetaOutputs {
    smallvec![TensorMeta::contiguous(shape, dtype)]
}

/// `matmul(input, other)`: dot (1-D·1-D), mm, mv, vector-matrix, and batched products with
/// broadcast batch dims.
pub static MATMUL: OpDef = OpDef {
    name: "matmul",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("other", T::Tensor)],
    meta: |args| {
        let (a, b) = (tensor("matmul", args, 0)?, tensor("matmul", args, 1)?);
        let dt = mat_dtype("matmul", a, b)?;
        let plan = matmul_plan("matmul", a.shape(), b.shape())?;
        Ok(meta1(&plan.out_shape, dt))
    },
    kernel: |args| Ok(smallvec![matmul_kernel("matmul", tensor("matmul", args, 0)?, tensor("matmul", args, 1)?)?]),
    cost: matmul_cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: Some(crate::autograd::formulas::nn::matmul_backward),
    saves: Saves { inputs: 3, outputs: 0 },
    doc: "Matrix product with PyTorch's matmul semantics (dot, mv, mm, batched with broadcasting).",
};

fn mm_check(op: &str, a: &Tensor, b: &Tensor) -> Result<DType> {
    if a.ndim() != 2 {
        return Err(Error::shape(op, format!("self must be a matrix, got {}-D tensor", a.ndim())));
    }
    if b.ndim() != 2 {
        return Err(Error::shape(op, format!("mat2 must be a matrix, got {}-D tensor", b.ndim())));
    }
    if a.shape()[1] != b.shape()[0] {
        return Err(mm_mismatch(op, a.shape(), b.shape()));
    }
    mat_dtype(op, a, b)
}

/// `mm(input, mat2)`: product of two matrices.
pub static MM: OpDef = OpDef {
    name: "mm",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("mat2", T::Tensor)],
    meta: |args| {
        let (a, b) = (tensor("mm", args, 0)?, tensor("mm", args, 1)?);
        let dt = mm_check("mm", a, b)?;
        Ok(meta1(&[a.shape()[0], b.shape()[1]], dt))
    },
    kernel: |args| {
        let (a, b) = (tensor("mm", args, 0)?, tensor("mm", args, 1)?);
        mm_check("mm", a, b)?;
        Ok(smallvec![matmul_kernel("mm", a, b)?])
    },
    cost: matmul_cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: Some(crate::autograd::formulas::nn::mm_backward),
    saves: Saves { inputs: 3, outputs: 0 },
    doc: "Matrix product of two 2-D tensors.",
};

fn bmm_check(op: &str, a: &Tensor, b: &Tensor) -> Result<DType> {
    if a.ndim() != 3 {
        return Err(Error::shape(op, format!("batch1 must be a 3D tensor, got shape {:?}", a.shape())));
    }
    if b.ndim() != 3 {
        return Err(Error::shape(op, format!("batch2 must be a 3D tensor, got shape {:?}", b.shape())));
    }
    let (sa, sb) = (a.shape(), b.shape());
    if sb[0] != sa[0] || sb[1] != sa[2] {
        return Err(Error::shape(
            op,
            format!(
                "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: [{}, {}].",
                sa[0], sa[2], sb[0], sb[1]
            ),
        ));
    }
    mat_dtype(op, a, b)
}

/// `bmm(input, mat2)`: batched product of `[B, n, m]` and `[B, m, p]` (no broadcasting).
pub static BMM: OpDef = OpDef {
    name: "bmm",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("mat2", T::Tensor)],
    meta: |args| {
        let (a, b) = (tensor("bmm", args, 0)?, tensor("bmm", args, 1)?);
        let dt = bmm_check("bmm", a, b)?;
        Ok(meta1(&[a.shape()[0], a.shape()[1], b.shape()[2]], dt))
    },
    kernel: |args| {
        let (a, b) = (tensor("bmm", args, 0)?, tensor("bmm", args, 1)?);
        bmm_check("bmm", a, b)?;
        Ok(smallvec![matmul_kernel("bmm", a, b)?])
    },
    cost: matmul_cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: Some(crate::autograd::formulas::nn::bmm_backward),
    saves: Saves { inputs: 3, outputs: 0 },
    doc: "Batched matrix product of two 3-D tensors with equal batch sizes.",
};

/// Fills a contiguous `[rows.., n]` buffer with `bias` broadcast to `out_shape` (as `T`).
fn broadcast_fill<T: Element>(op: &str, bias: &Tensor, out_shape: &[usize]) -> Result<Vec<T>> {
    let b = kernel::cast(bias, T::DTYPE)?;
    let l = b.concrete(op)?.1.broadcast_to(op, out_shape).map_err(|_| {
        let target: Vec<usize> = out_shape.to_vec();
        Error::shape(
            op,
            format!(
                "The expanded size of the tensor ({}) must match the existing size ({}) at non-singleton dimension {}.  Target sizes: {target:?}.  Tensor sizes: {:?}",
                out_shape.last().copied().unwrap_or(0),
                bias.shape().last().copied().unwrap_or(0),
                out_shape.len().saturating_sub(1),
                bias.shape()
            ),
        )
    })?;
    b.with_data::<T, _>(op, |d, _| -> Result<Vec<T>> {
        // A bias row repeated over the leading dims (the `linear` case): copy whole rows.
        let st = l.strides();
        let n = out_shape.last().copied().unwrap_or(1);
        if !st.is_empty() && n > 0 && st[st.len() - 1] == 1 && st[..st.len() - 1].iter().all(|&s| s == 0) {
            let row = &d[l.offset()..l.offset() + n];
            let rows = l.numel() / n;
            let mut v: Vec<T> = crate::memory::alloc_uninit(op, out_shape)?;
            for _ in 0..rows {
                v.extend_from_slice(row);
            }
            return Ok(v);
        }
        crate::memory::collect(op, out_shape, StridedIter::new(&l).map(|i| d[i]))
    })?
}

fn addmm_check(op: &str, input: &Tensor, a: &Tensor, b: &Tensor) -> Result<DType> {
    let dt = mm_check(op, a, b)?;
    if input.dtype() != dt {
        return Err(Error::dtype(
            op,
            format!(
                "self and mat2 must have the same dtype, but got {} and {}",
                dtype_title(input.dtype()),
                dtype_title(dt)
            ),
        ));
    }
    let out = [a.shape()[0], b.shape()[1]];
    if broadcast_shapes(op, input.shape(), &out).map(|s| s.as_slice() != out).unwrap_or(true) {
        return Err(Error::shape(
            op,
            format!(
                "The expanded size of the tensor ({}) must match the existing size ({}) at non-singleton dimension {}.  Target sizes: {out:?}.  Tensor sizes: {:?}",
                out[1],
                input.shape().last().copied().unwrap_or(0),
                1,
                input.shape()
            ),
        ));
    }
    Ok(dt)
}

/// `beta * input + alpha * (a @ b)` where `input` broadcasts to the product's shape.
fn addmm_like(op: &str, input: Option<&Tensor>, a: &Tensor, b: &Tensor, beta: Scalar, alpha: Scalar) -> Result<Tensor> {
    let dt = mat_dtype(op, a, b)?;
    if is_half(dt) {
        let inp = input.map(widen).transpose()?;
        let r = addmm_like(op, inp.as_ref(), &widen(a)?, &widen(b)?, beta, alpha)?;
        return kernel::cast(&r, dt);
    }
    let plan = matmul_plan(op, a.shape(), b.shape())?;
    match_mat_dtype!(op, dt, E => {
        let conv = |s: Scalar| if dt.is_floating_point() { E::from_f64(s.to_f64()) } else { E::from_i64(s.to_i64()) };
        let use_input = input.is_some() && beta.to_f64() != 0.0;
        let init = match input {
            Some(inp) if use_input => Some(broadcast_fill::<E>(op, inp, &plan.out_shape)?),
            _ => None,
        };
        let v = run_matmul::<E>(op, a, b, &plan, init, conv(beta), conv(alpha))?;
        Tensor::from_vec(v, &plan.out_shape)
    })
}

/// `addmm(input, mat1, mat2, *, beta=1, alpha=1)`: `beta * input + alpha * (mat1 @ mat2)`.
pub static ADDMM: OpDef = OpDef {
    name: "addmm",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("mat1", T::Tensor),
        ArgSpec::req("mat2", T::Tensor),
        ArgSpec::kw("beta", T::Scalar, D::Int(1)),
        ArgSpec::kw("alpha", T::Scalar, D::Int(1)),
    ],
    meta: |args| {
        let (i, a, b) = (tensor("addmm", args, 0)?, tensor("addmm", args, 1)?, tensor("addmm", args, 2)?);
        let dt = addmm_check("addmm", i, a, b)?;
        Ok(meta1(&[a.shape()[0], b.shape()[1]], dt))
    },
    kernel: |args| {
        let (i, a, b) = (tensor("addmm", args, 0)?, tensor("addmm", args, 1)?, tensor("addmm", args, 2)?);
        addmm_check("addmm", i, a, b)?;
        let (beta, alpha) = (scalar("addmm", args, 3)?, scalar("addmm", args, 4)?);
        Ok(smallvec![addmm_like("addmm", Some(i), a, b, beta, alpha)?])
    },
    cost: addmm_cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: Some(crate::autograd::formulas::nn::addmm_backward),
    saves: Saves { inputs: 6, outputs: 0 },
    doc: "beta * input + alpha * (mat1 @ mat2).",
};

/// Shape checks of `linear`; returns (dtype, output shape).
fn linear_check(op: &str, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<(DType, Shape)> {
    check_same_dtype(op, x.dtype(), w.dtype())?;
    if w.ndim() == 0 || w.ndim() > 2 {
        return Err(Error::shape(op, format!("weight must be 1-D or 2-D, got shape {:?}", w.shape())));
    }
    if x.ndim() == 0 {
        return Err(Error::shape(op, "input must be at least 1-D, got a 0-dim tensor"));
    }
    let in_f = *x.shape().last().unwrap_or(&0);
    let w_in = *w.shape().last().unwrap_or(&0);
    if in_f != w_in {
        let rows: usize = x.shape()[..x.ndim() - 1].iter().product();
        let (o, i) = if w.ndim() == 2 { (w.shape()[0], w.shape()[1]) } else { (1, w.shape()[0]) };
        return Err(mm_mismatch(op, &[rows, in_f], &[i, o]));
    }
    let mut out: Shape = x.shape()[..x.ndim() - 1].into();
    if w.ndim() == 2 {
        out.push(w.shape()[0]);
    }
    if let Some(b) = bias {
        if b.dtype() != x.dtype() {
            return Err(Error::dtype(
                op,
                format!("bias must have the same dtype as input ({}), got {}", x.dtype(), b.dtype()),
            ));
        }
        match broadcast_shapes(op, b.shape(), &out) {
            Ok(s) if s == out => {}
            _ => {
                return Err(Error::shape(
                    op,
                    format!(
                        "The expanded size of the tensor ({}) must match the existing size ({}) at non-singleton dimension {}.  Target sizes: {:?}.  Tensor sizes: {:?}",
                        out.last().copied().unwrap_or(0),
                        b.shape().last().copied().unwrap_or(0),
                        out.len().saturating_sub(1),
                        out.as_slice(),
                        b.shape()
                    ),
                ))
            }
        }
    }
    Ok((x.dtype(), out))
}

/// `linear(input, weight, bias=None)`: `input @ weight.T + bias`. The bias seeds the GEMM's
/// output, so it costs no extra pass.
pub static LINEAR: OpDef = OpDef {
    name: "linear",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::opt("bias", T::OptTensor, D::None),
    ],
    meta: |args| {
        let (x, w, b) = (tensor("linear", args, 0)?, tensor("linear", args, 1)?, opt_tensor("linear", args, 2)?);
        let (dt, out) = linear_check("linear", x, w, b)?;
        Ok(meta1(&out, dt))
    },
    kernel: |args| {
        let op = "linear";
        let (x, w, b) = (tensor(op, args, 0)?, tensor(op, args, 1)?, opt_tensor(op, args, 2)?);
        linear_check(op, x, w, b)?;
        let wt =
            if w.ndim() == 2 { w.view_with_layout(op, w.concrete(op)?.1.transpose(op, 0, 1)?)? } else { w.clone() };
        let one = Scalar::Int(1);
        Ok(smallvec![addmm_like(op, b, x, &wt, one, one)?])
    },
    cost: matmul_cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: Some(crate::autograd::formulas::nn::linear_backward),
    saves: Saves { inputs: 3, outputs: 0 },
    doc: "Affine map input @ weight.T + bias.",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&MATMUL, &MM, &BMM, &ADDMM, &LINEAR];

// ---------------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------------

#[inline]
fn one(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Tensor> {
    let mut out: Outputs = dispatch(op, kind, args)?;
    out.pop().ok_or_else(|| Error::schema(op.name, "op returned no output"))
}

/// `torch.matmul(input, other)`.
pub fn matmul(input: &Tensor, other: &Tensor) -> Result<Tensor> {
    one(&MATMUL, CallKind::Function, &[input.into(), other.into()])
}
/// `torch.mm(input, mat2)`.
pub fn mm(input: &Tensor, mat2: &Tensor) -> Result<Tensor> {
    one(&MM, CallKind::Function, &[input.into(), mat2.into()])
}
/// `torch.bmm(input, mat2)`.
pub fn bmm(input: &Tensor, mat2: &Tensor) -> Result<Tensor> {
    one(&BMM, CallKind::Function, &[input.into(), mat2.into()])
}
/// `torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)`.
pub fn addmm(
    input: &Tensor,
    mat1: &Tensor,
    mat2: &Tensor,
    beta: impl Into<Scalar>,
    alpha: impl Into<Scalar>,
) -> Result<Tensor> {
    one(&ADDMM, CallKind::Function, &[input.into(), mat1.into(), mat2.into(), beta.into().into(), alpha.into().into()])
}
/// `torch.nn.functional.linear(input, weight, bias)`.
pub fn linear(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    one(&LINEAR, CallKind::Function, &[input.into(), weight.into(), bias.into()])
}

impl Tensor {
    /// `x.matmul(other)`.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        one(&MATMUL, CallKind::Method, &[self.into(), other.into()])
    }
    /// `x.mm(mat2)`.
    pub fn mm(&self, mat2: &Tensor) -> Result<Tensor> {
        one(&MM, CallKind::Method, &[self.into(), mat2.into()])
    }
    /// `x.bmm(mat2)`.
    pub fn bmm(&self, mat2: &Tensor) -> Result<Tensor> {
        one(&BMM, CallKind::Method, &[self.into(), mat2.into()])
    }
    /// `x.addmm(mat1, mat2, beta=beta, alpha=alpha)`.
    pub fn addmm(
        &self,
        mat1: &Tensor,
        mat2: &Tensor,
        beta: impl Into<Scalar>,
        alpha: impl Into<Scalar>,
    ) -> Result<Tensor> {
        one(&ADDMM, CallKind::Method, &[self.into(), mat1.into(), mat2.into(), beta.into().into(), alpha.into().into()])
    }
}
