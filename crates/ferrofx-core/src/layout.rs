//! Shapes, strides and offsets: how a tensor's elements map onto its storage.
//!
//! A [`Layout`] is independent of storage, so views are new layouts over the same storage.
//! Strides are in elements and never negative (as in PyTorch); a stride of 0 is a broadcast
//! (expanded) dimension.

use crate::error::{Error, Result};
use smallvec::SmallVec;

/// Dimension sizes. Inline for up to 6 dims (no allocation for typical tensors).
pub type Shape = SmallVec<[usize; 6]>;
/// Strides in elements.
pub type Strides = SmallVec<[usize; 6]>;

/// Number of elements of a shape (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    // saturating: a shape from a file or a meta function may describe more elements than a
    // usize counts; the allocator's checked sizes then refuse it (an overflow must not panic)
    shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

/// Row-major (C-contiguous) strides for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Strides {
    if shape.len() == 1 {
        // One dimension (a common small case): no loop.
        return SmallVec::from_slice(&[1]);
    }
    let mut strides: Strides = SmallVec::from_elem(0, shape.len());
    let mut acc = 1usize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    strides
}

/// Normalises a possibly negative dimension index against `ndim` (PyTorch's `maybe_wrap_dim`).
/// A scalar (ndim 0) accepts dims -1 and 0, as in PyTorch.
pub fn wrap_dim(op: &str, dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(Error::index(
            op,
            format!("Dimension out of range (expected to be in range of [{}, {}], but got {dim})", -n, n - 1),
        ));
    }
    Ok(if dim < 0 { (dim + n) as usize } else { dim as usize })
}

/// `torch.broadcast_shapes`: the shape both `a` and `b` broadcast to.
///
/// ```
/// use ferrofx_core::layout::broadcast_shapes;
/// assert_eq!(broadcast_shapes("add", &[3, 1], &[4]).unwrap().as_slice(), &[3, 4]);
/// assert!(broadcast_shapes("add", &[3], &[4]).is_err());
/// ```
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Shape> {
    if a == b {
        return Ok(SmallVec::from_slice(a));
    }
    let n = a.len().max(b.len());
    let mut out: Shape = SmallVec::from_elem(0, n);
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return Err(Error::shape(
                op,
                format!(
                    "shapes {a:?} and {b:?} are not broadcastable: the size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
                ),
            ));
        };
    }
    Ok(out)
}

/// Where a tensor's elements live in its storage.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Shape,
    strides: Strides,
    offset: usize,
}

impl Clone for Layout {
    // By hand: `SmallVec`'s `Clone` goes through a generic `extend`; `from_slice` copies.
    fn clone(&self) -> Self {
        Layout {
            shape: SmallVec::from_slice(&self.shape),
            strides: SmallVec::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

impl Layout {
    /// A contiguous layout of `shape` starting at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout { shape: SmallVec::from_slice(shape), strides: contiguous_strides(shape), offset: 0 }
    }
    /// A layout from raw parts. The caller guarantees all reachable indices are in bounds of the
    /// storage it is used with ([`Layout::max_index`] helps check this).
    pub fn from_parts(shape: Shape, strides: Strides, offset: usize) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        Layout { shape, strides, offset }
    }
    /// Dimension sizes.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of element `[0, 0, ...]` in the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// Largest storage index this layout can touch, or `None` when empty.
    pub fn max_index(&self) -> Option<usize> {
        if self.numel() == 0 {
            return None;
        }
        Some(self.offset + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>())
    }
    /// `true` when elements are laid out row-major without gaps (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for i in (0..self.shape.len()).rev() {
            let d = self.shape[i];
            if d == 1 {
                continue;
            }
            if self.strides[i] != expected {
                return false;
            }
            expected *= d;
        }
        true
    }
    /// The contiguous range of storage covered, when [`Layout::is_contiguous`].
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        if self.is_contiguous() {
            Some(self.offset..self.offset + self.numel())
        } else {
            None
        }
    }

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, op: &str, d0: i64, d1: i64) -> Result<Layout> {
        let n = self.ndim();
        let a = wrap_dim(op, d0, n)?;
        let b = wrap_dim(op, d1, n)?;
        let mut l = self.clone();
        if n > 0 {
            l.shape.swap(a, b);
            l.strides.swap(a, b);
        }
        Ok(l)
    }

    /// Reorders dimensions (a view). `dims` must be a permutation of `0..ndim`.
    pub fn permute(&self, op: &str, dims: &[i64]) -> Result<Layout> {
        let n = self.ndim();
        if dims.len() != n {
            return Err(Error::shape(
                op,
                format!(
                    "number of dims don't match in permute: got {} dims {dims:?} for a tensor of shape {:?}",
                    dims.len(),
                    self.shape
                ),
            ));
        }
        let mut seen = vec![false; n];
        let mut l = self.clone();
        for (i, &d) in dims.iter().enumerate() {
            let d = wrap_dim(op, d, n)?;
            if seen[d] {
                return Err(Error::argument(op, format!("repeated dim {d} in permutation {dims:?}")));
            }
            seen[d] = true;
            l.shape[i] = self.shape[d];
            l.strides[i] = self.strides[d];
        }
        Ok(l)
    }

    /// `narrow(dim, start, length)` (a view).
    pub fn narrow(&self, op: &str, dim: i64, start: i64, length: i64) -> Result<Layout> {
        let d = wrap_dim(op, dim, self.ndim())?;
        if self.ndim() == 0 {
            return Err(Error::index(op, "narrow() cannot be applied to a 0-dim tensor."));
        }
        let size = self.shape[d] as i64;
        let start = if start < 0 { start.saturating_add(size) } else { start };
        if start < 0 || length < 0 || start.checked_add(length).is_none_or(|end| end > size) {
            return Err(Error::index(
                op,
                format!(
                    "start ({start}) + length ({length}) exceeds dimension size ({size}) of dim {d} (shape {:?})",
                    self.shape
                ),
            ));
        }
        let mut l = self.clone();
        l.offset += start as usize * self.strides[d];
        l.shape[d] = length as usize;
        Ok(l)
    }

    /// Slicing `start:end:step` along `dim` with Python's clamping rules (a view).
    pub fn slice(&self, op: &str, dim: i64, start: Option<i64>, end: Option<i64>, step: i64) -> Result<Layout> {
        if self.ndim() == 0 {
            return Err(Error::index(op, "slice() cannot be applied to a 0-dim tensor."));
        }
        let d = wrap_dim(op, dim, self.ndim())?;
        if step <= 0 {
            return Err(Error::argument(op, format!("slice step must be positive, got {step}")));
        }
        let size = self.shape[d] as i64;
        let clamp = |v: i64| -> i64 {
            let v = if v < 0 { v + size } else { v };
            v.clamp(0, size)
        };
        let s = clamp(start.unwrap_or(0));
        let e = clamp(end.unwrap_or(size)).max(s);
        let len = (e - s + step - 1) / step;
        let mut l = self.clone();
        l.offset += s as usize * self.strides[d];
        l.shape[d] = len as usize;
        l.strides[d] *= step as usize;
        Ok(l)
    }

    /// `select(dim, index)`: removes `dim`, keeping element `index` (a view).
    pub fn select(&self, op: &str, dim: i64, index: i64) -> Result<Layout> {
        if self.ndim() == 0 {
            return Err(Error::index(op, "select() cannot be applied to a 0-dim tensor."));
        }
        let d = wrap_dim(op, dim, self.ndim())?;
        let size = self.shape[d] as i64;
        if index < -size || index >= size {
            return Err(Error::index(op, format!("index {index} is out of bounds for dimension {d} with size {size}")));
        }
        let idx = if index < 0 { index + size } else { index } as usize;
        let mut l = self.clone();
        l.offset += idx * self.strides[d];
        l.shape.remove(d);
        l.strides.remove(d);
        Ok(l)
    }

    /// `unsqueeze(dim)` (a view).
    pub fn unsqueeze(&self, op: &str, dim: i64) -> Result<Layout> {
        let n = self.ndim() as i64 + 1;
        if dim < -n || dim >= n {
            return Err(Error::index(
                op,
                format!("Dimension out of range (expected to be in range of [{}, {}], but got {dim})", -n, n - 1),
            ));
        }
        let d = if dim < 0 { dim + n } else { dim } as usize;
        let stride = if d < self.ndim() { self.strides[d] * self.shape[d] } else { 1 };
        let mut l = self.clone();
        l.shape.insert(d, 1);
        l.strides.insert(d, stride);
        Ok(l)
    }

    /// `squeeze(dims)`: removes the listed size-1 dims (all size-1 dims when `None`).
    pub fn squeeze(&self, op: &str, dims: Option<&[i64]>) -> Result<Layout> {
        let n = self.ndim();
        let mut drop = vec![false; n];
        match dims {
            None => {
                for (d, &s) in drop.iter_mut().zip(self.shape.iter()) {
                    *d = s == 1;
                }
            }
            Some(ds) => {
                for &d in ds {
                    let d = wrap_dim(op, d, n)?;
                    if n > 0 && self.shape[d] == 1 {
                        drop[d] = true;
                    }
                }
            }
        }
        let mut l = Layout { shape: Shape::new(), strides: Strides::new(), offset: self.offset };
        for ((&d, &size), &stride) in drop.iter().zip(&self.shape).zip(&self.strides) {
            if !d {
                l.shape.push(size);
                l.strides.push(stride);
            }
        }
        Ok(l)
    }

    /// `expand(sizes)`: broadcasts size-1 dims (stride 0) and prepends new dims; -1 keeps a size.
    pub fn expand(&self, op: &str, sizes: &[i64]) -> Result<Layout> {
        let n = self.ndim();
        if sizes.len() < n {
            return Err(Error::shape(
                op,
                format!(
                    "the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({n}); shape {:?}, sizes {sizes:?}",
                    sizes.len(),
                    self.shape
                ),
            ));
        }
        let lead = sizes.len() - n;
        let mut shape = Shape::with_capacity(sizes.len());
        let mut strides = Strides::with_capacity(sizes.len());
        for (i, &s) in sizes.iter().enumerate() {
            if i < lead {
                if s < 0 {
                    return Err(Error::argument(
                        op,
                        format!("The expanded size of the tensor ({s}) isn't allowed in a leading, non-existing dimension {i}"),
                    ));
                }
                shape.push(s as usize);
                strides.push(0);
            } else {
                let (d, st) = (self.shape[i - lead], self.strides[i - lead]);
                if s == -1 || s as usize == d {
                    shape.push(d);
                    strides.push(st);
                } else if d == 1 && s >= 0 {
                    shape.push(s as usize);
                    strides.push(0);
                } else {
                    return Err(Error::shape(
                        op,
                        format!(
                            "The expanded size of the tensor ({s}) must match the existing size ({d}) at non-singleton dimension {i}. Target sizes: {sizes:?}. Tensor sizes: {:?}",
                            self.shape
                        ),
                    ));
                }
            }
        }
        if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() {
            return Err(Error::limit(
                op,
                format!(
                    "expanding to {sizes:?} describes more elements than any tensor can hold (the count overflows)"
                ),
            ));
        }
        Ok(Layout { shape, strides, offset: self.offset })
    }

    /// The layout broadcast to `shape` (for reading an operand of a broadcasting op).
    pub fn broadcast_to(&self, op: &str, shape: &[usize]) -> Result<Layout> {
        let sizes: SmallVec<[i64; 6]> = shape.iter().map(|&s| s as i64).collect();
        self.expand(op, &sizes)
    }

    /// Computes the view layout for `view(shape)` without copying, if the strides allow it
    /// (PyTorch's `computeStride`). Returns `None` when a copy is required.
    pub fn view_as(&self, new_shape: &[usize]) -> Option<Layout> {
        let old_shape = &self.shape;
        let old_strides = &self.strides;
        if self.numel() == 0 || old_shape.is_empty() {
            return Some(Layout::from_parts(new_shape.into(), contiguous_strides(new_shape), self.offset));
        }
        let mut new_strides: Strides = SmallVec::from_elem(0, new_shape.len());
        let mut view_d = new_shape.len() as isize - 1;
        let mut chunk_base_stride = *old_strides.last()?;
        let mut tensor_numel = 1usize;
        let mut view_numel = 1usize;
        for tensor_d in (0..old_shape.len()).rev() {
            tensor_numel *= old_shape[tensor_d];
            if tensor_d == 0
                || (old_shape[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)
            {
                while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= new_shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = old_strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout::from_parts(new_shape.into(), new_strides, self.offset))
    }
}

/// Resolves a requested shape with at most one `-1` against `numel` (for view/reshape).
pub fn infer_shape(op: &str, sizes: &[i64], numel: usize, from: &[usize]) -> Result<Shape> {
    let mut infer = None;
    let mut known = 1usize;
    for (i, &s) in sizes.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                return Err(Error::argument(op, format!("only one dimension can be inferred, got {sizes:?}")));
            }
            infer = Some(i);
        } else if s < 0 {
            return Err(Error::argument(op, format!("invalid shape dimension {s} in {sizes:?}")));
        } else {
            known = known.saturating_mul(s as usize);
        }
    }
    let mut out: Shape = sizes.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(Error::shape(
                    op,
                    format!("shape '{sizes:?}' is invalid for input of size {numel} (input shape {from:?})"),
                ));
            }
            out[i] = numel / known;
        }
        None => {
            if known != numel {
                return Err(Error::shape(
                    op,
                    format!("shape '{sizes:?}' is invalid for input of size {numel} (input shape {from:?})"),
                ));
            }
        }
    }
    Ok(out)
}

/// Iterates the storage offsets of a layout in row-major logical order, without allocation
/// per element.
pub struct StridedIter<'a> {
    layout: &'a Layout,
    index: Shape,
    pos: usize,
    remaining: usize,
}

impl<'a> StridedIter<'a> {
    /// Starts at the first element.
    pub fn new(layout: &'a Layout) -> Self {
        StridedIter {
            layout,
            index: SmallVec::from_elem(0, layout.ndim()),
            pos: layout.offset,
            remaining: layout.numel(),
        }
    }
}

impl Iterator for StridedIter<'_> {
    type Item = usize;
    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let cur = self.pos;
        self.remaining -= 1;
        if self.remaining > 0 {
            let shape = &self.layout.shape;
            let strides = &self.layout.strides;
            let mut d = shape.len();
            while d > 0 {
                d -= 1;
                self.index[d] += 1;
                self.pos += strides[d];
                if self.index[d] < shape[d] {
                    break;
                }
                self.pos -= strides[d] * shape[d];
                self.index[d] = 0;
            }
        }
        Some(cur)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_iter_transposed() {
        let l = Layout::contiguous(&[2, 3]).transpose("t", 0, 1).unwrap();
        let v: Vec<usize> = StridedIter::new(&l).collect();
        assert_eq!(v, vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn view_of_transposed_needs_copy() {
        let l = Layout::contiguous(&[2, 3]).transpose("t", 0, 1).unwrap();
        assert!(l.view_as(&[6]).is_none());
        assert!(l.view_as(&[3, 2]).is_some());
        let c = Layout::contiguous(&[2, 3, 4]);
        let v = c.view_as(&[6, 4]).unwrap();
        assert_eq!(v.strides(), &[4, 1]);
    }

    #[test]
    fn slicing_with_steps() {
        let l = Layout::contiguous(&[10]).slice("s", 0, Some(1), Some(8), 3).unwrap();
        assert_eq!(StridedIter::new(&l).collect::<Vec<_>>(), vec![1, 4, 7]);
        let l = Layout::contiguous(&[10]).slice("s", 0, Some(-3), None, 1).unwrap();
        assert_eq!(StridedIter::new(&l).collect::<Vec<_>>(), vec![7, 8, 9]);
    }
}
