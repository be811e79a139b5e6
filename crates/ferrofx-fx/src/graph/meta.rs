//! Node metadata: typed fields for the common FX keys plus free-form entries.

use crate::core_api::DType;
use indexmap::IndexMap;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// FX's `TensorMetadata`: what shape propagation records about a node's tensor value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorMetadata {
    /// Sizes.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Strides in elements.
    pub strides: Vec<isize>,
    /// Whether autograd tracks the value.
    pub requires_grad: bool,
}

impl TensorMetadata {
    /// Contiguous (row-major) metadata for `shape`.
    ///
    /// ```
    /// use ferrofx_fx::{core_api::DType, TensorMetadata};
    /// let m = TensorMetadata::contiguous(vec![2, 3, 4], DType::F32);
    /// assert_eq!(m.strides, vec![12, 4, 1]);
    /// ```
    pub fn contiguous(shape: Vec<usize>, dtype: DType) -> TensorMetadata {
        let mut strides = vec![0isize; shape.len()];
        let mut acc = 1isize;
        for (s, &d) in strides.iter_mut().zip(&shape).rev() {
            *s = acc;
            acc = acc.saturating_mul(d.max(1) as isize);
        }
        TensorMetadata { shape, dtype, strides, requires_grad: false }
    }
}

/// One frame of `nn_module_stack`: the module path and its type name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModuleStackEntry {
    /// Key FX uses (usually the module path, unique per frame).
    pub key: String,
    /// Qualified module path (`layers.0`).
    pub path: String,
    /// Module type name (`Linear`).
    pub type_name: String,
}

/// A node's `meta`: typed `tensor_meta`, `stack_trace`, `nn_module_stack`, and free-form entries
/// holding any `Send + Sync` value (cloning the meta shares them, like FX's shallow copy).
///
/// ```
/// use ferrofx_fx::Meta;
/// let mut m = Meta::default();
/// assert!(m.is_empty());
/// m.insert("val", 42u32);
/// assert_eq!(m.get::<u32>("val"), Some(&42));
/// assert_eq!(m.get::<i64>("val"), None);
/// assert!(!m.is_empty());
/// ```
#[derive(Clone, Default)]
pub struct Meta {
    /// Shape/dtype/stride of the node's value, when known.
    pub tensor_meta: Option<TensorMetadata>,
    /// The user source location that produced the node.
    pub stack_trace: Option<String>,
    /// The module hierarchy the node was traced in, outermost first. Shared: nodes traced in
    /// the same module (and copies of a node) point at one stack instead of copying it.
    pub nn_module_stack: Arc<[ModuleStackEntry]>,
    extra: IndexMap<String, Arc<dyn Any + Send + Sync>>,
}

impl Meta {
    /// A shared empty meta (what nodes without meta report).
    pub fn empty() -> &'static Meta {
        static EMPTY: std::sync::OnceLock<Meta> = std::sync::OnceLock::new();
        EMPTY.get_or_init(Meta::default)
    }

    /// Whether no field is set and there is no free-form entry.
    pub fn is_empty(&self) -> bool {
        self.tensor_meta.is_none()
            && self.stack_trace.is_none()
            && self.nn_module_stack.is_empty()
            && self.extra.is_empty()
    }

    /// Sets a free-form entry.
    pub fn insert<T: Any + Send + Sync>(&mut self, key: impl Into<String>, value: T) {
        self.extra.insert(key.into(), Arc::new(value));
    }

    /// Sets a free-form entry from a shared value.
    pub fn insert_shared(&mut self, key: impl Into<String>, value: Arc<dyn Any + Send + Sync>) {
        self.extra.insert(key.into(), value);
    }

    /// A free-form entry, if present and of type `T`.
    pub fn get<T: Any>(&self, key: &str) -> Option<&T> {
        self.extra.get(key).and_then(|v| v.downcast_ref::<T>())
    }

    /// A free-form entry of any type.
    pub fn get_shared(&self, key: &str) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.extra.get(key)
    }

    /// Removes a free-form entry; returns whether it existed.
    pub fn remove(&mut self, key: &str) -> bool {
        self.extra.shift_remove(key).is_some()
    }

    /// Whether a free-form entry exists.
    pub fn contains_key(&self, key: &str) -> bool {
        self.extra.contains_key(key)
    }

    /// Free-form keys in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.extra.keys().map(String::as_str)
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meta")
            .field("tensor_meta", &self.tensor_meta)
            .field("stack_trace", &self.stack_trace)
            .field("nn_module_stack", &self.nn_module_stack)
            .field("extra", &self.extra.keys().collect::<Vec<_>>())
            .finish()
    }
}
