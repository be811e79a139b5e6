//! [`Tensor`]: a cheap-to-clone handle that is either concrete (storage + layout + autograd
//! meta) or symbolic (a proxy recorded by the active tracer).

use crate::autograd::AutogradMeta;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{contiguous_strides, numel, Layout, Shape, StridedIter, Strides};
use crate::storage::{CpuBuffer, Storage};
use crate::trace::Symbolic;
use std::sync::Arc;

/// Shape, dtype and strides of a tensor, without data: what meta inference produces and what
/// graph nodes record as `tensor_meta`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// Dimension sizes.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// Strides in elements.
    pub strides: Strides,
}

impl Clone for TensorMeta {
    // By hand: `SmallVec`'s `Clone` goes through a generic `extend`; `from_slice` copies.
    fn clone(&self) -> Self {
        TensorMeta {
            shape: smallvec::SmallVec::from_slice(&self.shape),
            dtype: self.dtype,
            strides: smallvec::SmallVec::from_slice(&self.strides),
        }
    }
}

impl TensorMeta {
    /// Metadata of a contiguous tensor.
    pub fn contiguous(shape: &[usize], dtype: DType) -> Self {
        TensorMeta { shape: smallvec::SmallVec::from_slice(shape), dtype, strides: contiguous_strides(shape) }
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// Size in bytes of the elements.
    pub fn nbytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }
}

pub(crate) enum Data {
    Concrete { storage: Storage, layout: Layout, dtype: DType },
    Symbolic(Symbolic),
}

pub(crate) struct TensorImpl {
    pub(crate) data: Data,
    pub(crate) autograd: AutogradMeta,
}

/// An n-dimensional array. Cloning is cheap (a reference count); views share storage.
///
/// Every operation goes through the op registry's single dispatch point, so the same code runs
/// eagerly, records autograd history, or is captured by the tracer.
///
/// ```
/// use ferrofx_core::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// assert_eq!(x.shape(), &[2, 2]);
/// let t = x.transpose(0, 1).unwrap();           // a view: shares storage
/// assert!(!t.is_contiguous());
/// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorImpl>);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0.data {
            Data::Concrete { dtype, layout, .. } => {
                write!(f, "Tensor(shape={:?}, dtype={dtype}", layout.shape())?;
                if layout.numel() <= 16 {
                    if let Ok(v) = self.to_vec_f64() {
                        write!(f, ", data={v:?}")?;
                    }
                }
                write!(f, ")")
            }
            Data::Symbolic(s) => write!(f, "Tensor(symbolic, meta={:?})", s.meta),
        }
    }
}

static EMPTY_SHAPE: [usize; 0] = [];

impl Tensor {
    pub(crate) fn from_impl(data: Data) -> Tensor {
        Tensor(Arc::new(TensorImpl { data, autograd: AutogradMeta::default() }))
    }

    /// A tensor over `storage` with `layout`. Errors if the layout reaches outside the storage.
    pub fn from_storage(storage: Storage, layout: Layout) -> Result<Tensor> {
        let len = storage.len();
        if let Some(max) = layout.max_index() {
            if max >= len {
                return Err(Error::index(
                    "from_storage",
                    format!(
                        "layout (shape {:?}, strides {:?}, offset {}) reaches element {max} of a storage of {len} elements",
                        layout.shape(),
                        layout.strides(),
                        layout.offset()
                    ),
                ));
            }
        }
        let dtype = storage.dtype();
        Ok(Tensor::from_impl(Data::Concrete { storage, layout, dtype }))
    }

    /// A contiguous tensor owning `buf`, with `shape`.
    pub fn from_buffer(buf: CpuBuffer, shape: &[usize]) -> Result<Tensor> {
        if buf.len() != numel(shape) {
            return Err(Error::shape(
                "from_buffer",
                format!("{} elements cannot have shape {shape:?} ({} elements)", buf.len(), numel(shape)),
            ));
        }
        let dtype = buf.dtype();
        Ok(Tensor::from_impl(Data::Concrete { storage: Storage::new(buf), layout: Layout::contiguous(shape), dtype }))
    }

    /// A contiguous tensor from a vector and a shape.
    ///
    /// ```
    /// let t = ferrofx_core::Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    /// assert_eq!(t.dtype(), ferrofx_core::DType::I64);
    /// assert!(ferrofx_core::Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).is_err());
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_buffer(T::into_buffer(data), shape)
    }

    /// A contiguous tensor copied from a slice.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A zero-dimensional tensor holding `v`.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_impl(Data::Concrete {
            storage: Storage::from_vec(vec![v]),
            layout: Layout::contiguous(&[]),
            dtype: T::DTYPE,
        })
    }

    /// A symbolic tensor (used by tracers).
    pub fn symbolic(sym: Symbolic) -> Tensor {
        Tensor::from_impl(Data::Symbolic(sym))
    }

    /// `true` for symbolic (traced) tensors.
    #[inline]
    pub fn is_symbolic(&self) -> bool {
        matches!(self.0.data, Data::Symbolic(_))
    }

    /// The symbolic payload, for tracers.
    pub fn as_symbolic(&self) -> Option<&Symbolic> {
        match &self.0.data {
            Data::Symbolic(s) => Some(s),
            _ => None,
        }
    }

    /// Storage and layout of a concrete tensor; a symbolic tensor gives a trace error naming
    /// `op`.
    #[inline]
    pub fn concrete(&self, op: &str) -> Result<(&Storage, &Layout)> {
        match &self.0.data {
            Data::Concrete { storage, layout, .. } => Ok((storage, layout)),
            Data::Symbolic(_) => Err(Error::trace(
                op,
                "this op needs the data of a symbolic (traced) tensor; data-dependent code cannot be traced symbolically: use concrete_args or trace with example inputs",
            )),
        }
    }

    /// The storage of a concrete tensor.
    pub fn storage(&self) -> Option<&Storage> {
        match &self.0.data {
            Data::Concrete { storage, .. } => Some(storage),
            _ => None,
        }
    }

    /// The layout of a concrete tensor.
    pub fn layout(&self) -> Option<&Layout> {
        match &self.0.data {
            Data::Concrete { layout, .. } => Some(layout),
            _ => None,
        }
    }

    /// Metadata (shape, dtype, strides); `None` for a symbolic tensor traced without example
    /// inputs.
    pub fn meta(&self) -> Option<TensorMeta> {
        match &self.0.data {
            Data::Concrete { layout, dtype, .. } => Some(TensorMeta {
                shape: smallvec::SmallVec::from_slice(layout.shape()),
                dtype: *dtype,
                strides: smallvec::SmallVec::from_slice(layout.strides()),
            }),
            Data::Symbolic(s) => s.meta.clone(),
        }
    }

    /// Dimension sizes.
    ///
    /// On a symbolic tensor whose shape is unknown (symbolic tracing without example inputs)
    /// this records a trace error at the caller's location in the active tracer, which then
    /// fails the trace with an explanation, and returns an empty slice.
    #[track_caller]
    #[inline]
    pub fn shape(&self) -> &[usize] {
        match &self.0.data {
            Data::Concrete { layout, .. } => layout.shape(),
            Data::Symbolic(s) => match &s.meta {
                Some(m) => &m.shape,
                None => {
                    crate::trace::report_concrete_query("shape", std::panic::Location::caller());
                    &EMPTY_SHAPE
                }
            },
        }
    }

    /// Shape if known, without reporting to the tracer (for messages).
    pub fn meta_shape(&self) -> Option<Vec<usize>> {
        self.meta().map(|m| m.shape.to_vec())
    }

    /// Dtype name if known (for messages).
    pub fn meta_dtype_name(&self) -> &'static str {
        self.meta().map(|m| m.dtype.name()).unwrap_or("?")
    }

    /// Bytes of the elements if known, else 0 (for cost estimates).
    pub fn meta_nbytes(&self) -> usize {
        self.meta().map(|m| m.nbytes()).unwrap_or(0)
    }

    /// Element type. Like [`Tensor::shape`], an unknown dtype of a symbolic tensor is reported
    /// to the tracer (and `float32` returned).
    #[track_caller]
    #[inline]
    pub fn dtype(&self) -> DType {
        match &self.0.data {
            Data::Concrete { dtype, .. } => *dtype,
            Data::Symbolic(s) => match &s.meta {
                Some(m) => m.dtype,
                None => {
                    crate::trace::report_concrete_query("dtype", std::panic::Location::caller());
                    DType::F32
                }
            },
        }
    }

    /// Number of dimensions.
    #[track_caller]
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    #[track_caller]
    pub fn numel(&self) -> usize {
        numel(self.shape())
    }

    /// Size of dimension `dim` (negative counts from the end).
    #[track_caller]
    pub fn size(&self, dim: i64) -> Result<usize> {
        let s = self.shape();
        let d = crate::layout::wrap_dim("size", dim, s.len())?;
        if s.is_empty() {
            return Err(Error::index("size", "a 0-dim tensor has no dimensions"));
        }
        Ok(s[d])
    }

    /// Strides in elements (contiguous strides for symbolic tensors).
    pub fn strides(&self) -> Strides {
        match &self.0.data {
            Data::Concrete { layout, .. } => layout.strides().into(),
            Data::Symbolic(s) => s.meta.as_ref().map(|m| m.strides.clone()).unwrap_or_default(),
        }
    }

    /// Offset of the first element in the storage (0 for symbolic tensors).
    pub fn storage_offset(&self) -> usize {
        self.layout().map(|l| l.offset()).unwrap_or(0)
    }

    /// `true` when the elements are row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        match &self.0.data {
            Data::Concrete { layout, .. } => layout.is_contiguous(),
            Data::Symbolic(s) => s
                .meta
                .as_ref()
                .map(|m| Layout::from_parts(m.shape.clone(), m.strides.clone(), 0).is_contiguous())
                .unwrap_or(true),
        }
    }

    /// The version counter of the storage (bumped by every in-place op on any view of it).
    pub fn version(&self) -> u64 {
        self.storage().map(|s| s.version()).unwrap_or(0)
    }

    pub(crate) fn bump_version(&self) {
        if let Some(s) = self.storage() {
            s.bump_version();
        }
    }

    /// `true` when both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        match (self.storage(), other.storage()) {
            (Some(a), Some(b)) => a.same(b),
            _ => false,
        }
    }

    /// `true` when both handles are the same tensor object (not just equal values).
    pub fn same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A stable identity of this tensor object (used to recognise parameters while tracing).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// A new tensor sharing this one's storage with another layout (a view). Autograd and
    /// tracing are the caller's business: this is the raw building block of view kernels.
    pub fn view_with_layout(&self, op: &str, layout: Layout) -> Result<Tensor> {
        let (storage, _) = self.concrete(op)?;
        Tensor::from_storage(storage.clone(), layout)
    }

    /// Reads the elements as `T` (which must be the tensor's dtype) with the layout, under the
    /// storage's read lock.
    pub fn with_data<T: Element, R>(&self, op: &str, f: impl FnOnce(&[T], &Layout) -> R) -> Result<R> {
        let (storage, layout) = self.concrete(op)?;
        let guard = storage.read();
        let data = guard.as_slice::<T>().ok_or_else(|| {
            Error::dtype(op, format!("expected a tensor of dtype {}, got {}", T::DTYPE, guard.dtype()))
        })?;
        Ok(f(data, layout))
    }

    /// Calls `f` with the elements in row-major order: borrowed when contiguous, copied
    /// otherwise.
    pub fn with_contiguous<T: Element, R>(&self, op: &str, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let (storage, layout) = self.concrete(op)?;
        let guard = storage.read();
        let data = guard.as_slice::<T>().ok_or_else(|| {
            Error::dtype(op, format!("expected a tensor of dtype {}, got {}", T::DTYPE, guard.dtype()))
        })?;
        match layout.contiguous_range() {
            Some(r) => Ok(f(&data[r])),
            None => {
                if let Some(v) = channels_last_rows(op, data, layout) {
                    return Ok(f(&v?));
                }
                // a view (an expand to a huge shape) can describe more elements than exist
                let v: Vec<T> = crate::memory::collect(op, layout.shape(), StridedIter::new(layout).map(|i| data[i]))?;
                Ok(f(&v))
            }
        }
    }

    /// The elements in row-major order as `Vec<T>`; `T` must be the tensor's dtype (use
    /// [`Tensor::to_dtype`] to convert first).
    ///
    /// ```
    /// let t = ferrofx_core::Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    /// let err = t.to_vec::<i64>().unwrap_err();
    /// assert!(err.to_string().contains("expected a tensor of dtype int64, got float32"));
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.with_contiguous::<T, _>("to_vec", |s| s.to_vec())
    }

    /// The elements converted to f64 (any dtype).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let (storage, layout) = self.concrete("to_vec_f64")?;
        let guard = storage.read();
        crate::with_buffer!(&*guard, v => crate::memory::collect("to_vec_f64", layout.shape(), StridedIter::new(layout).map(|i| Element::to_f64(v[i]))))
    }

    /// The single element of a one-element tensor, as f64. Symbolic tensors give a trace error
    /// (data-dependent control flow cannot be traced).
    #[track_caller]
    pub fn item(&self) -> Result<f64> {
        if self.is_symbolic() {
            return Err(crate::trace::concrete_query_error("item()", std::panic::Location::caller()));
        }
        let n = self.numel();
        if n != 1 {
            return Err(Error::argument(
                "item",
                format!("a Tensor with {n} elements cannot be converted to Scalar (shape {:?})", self.shape()),
            ));
        }
        Ok(self.to_vec_f64()?[0])
    }

    /// The single element of a one-element tensor as `T` (must be the dtype).
    #[track_caller]
    pub fn item_as<T: Element>(&self) -> Result<T> {
        if self.is_symbolic() {
            return Err(crate::trace::concrete_query_error("item()", std::panic::Location::caller()));
        }
        let v = self.to_vec::<T>()?;
        if v.len() != 1 {
            return Err(Error::argument(
                "item",
                format!("a Tensor with {} elements cannot be converted to Scalar (shape {:?})", v.len(), self.shape()),
            ));
        }
        Ok(v[0])
    }

    pub(crate) fn autograd_meta(&self) -> &AutogradMeta {
        &self.0.autograd
    }
}

fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<Tensor>();
}

/// The row-major elements of a 4-D view laid out channels-last (strides `[h*w*c, 1, w*c, c]`,
/// PyTorch's `channels_last`, which the int8 convolutions write), copied image by image as a
/// transpose instead of element by element through [`StridedIter`] (the digits CNN's int8
/// max-pool spent ~75% of the model's time in that gather); `None` for any other layout or one
/// that reaches past `data`.
fn channels_last_rows<T: Element>(op: &str, data: &[T], layout: &Layout) -> Option<Result<Vec<T>>> {
    let (s, st) = (layout.shape(), layout.strides());
    if s.len() != 4 {
        return None;
    }
    let (c, hw, w) = (s[1], s[2] * s[3], s[3]);
    let image = c * hw;
    let total = s[0] * image;
    let off = layout.offset();
    if total == 0 || st != [image, 1, w * c, c] || off.checked_add(total).is_none_or(|end| end > data.len()) {
        return None;
    }
    let mut v = match crate::memory::alloc_filled(op, s, T::default()) {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    for (out, src) in v.chunks_exact_mut(image).zip(data[off..off + total].chunks_exact(image)) {
        for (p, px) in src.chunks_exact(c).enumerate() {
            for (ch, &x) in px.iter().enumerate() {
                out[ch * hw + p] = x;
            }
        }
    }
    Some(Ok(v))
}
