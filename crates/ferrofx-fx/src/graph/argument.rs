//! Node arguments: trees of Python-like values whose leaves may reference other nodes.

use crate::core_api::DType;
use crate::graph::node_id::NodeId;
use indexmap::IndexMap;
use std::fmt;

/// Keyword arguments: an insertion-ordered map from name to [`Argument`].
pub type Kwargs = IndexMap<String, Argument>;

/// A device (`torch.device`): a kind such as `cpu` and an optional index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Device {
    /// Device kind (`cpu`, `cuda`, `meta`).
    pub kind: String,
    /// Device index (`cuda:1`), if any.
    pub index: Option<u32>,
}

impl Device {
    /// The CPU device.
    pub fn cpu() -> Device {
        Device { kind: "cpu".to_string(), index: None }
    }

    /// A device of `kind` with an optional index.
    pub fn new(kind: impl Into<String>, index: Option<u32>) -> Device {
        Device { kind: kind.into(), index }
    }
}

impl fmt::Display for Device {
    /// Python's `str(torch.device)`: `cpu`, `cuda:0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}:{}", self.kind, i),
            None => f.write_str(&self.kind),
        }
    }
}

/// A Python `slice(start, stop, step)`; each part is an argument (usually `None` or an int, but
/// FX allows nodes there too).
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// Start.
    pub start: Argument,
    /// Stop.
    pub stop: Argument,
    /// Step.
    pub step: Argument,
}

/// A node argument (FX's `Argument`): a tree of values; [`Argument::Node`] leaves are the
/// use-def edges the graph tracks.
///
/// ```
/// use ferrofx_fx::{Argument, Graph};
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// let y = g.placeholder("y").unwrap();
/// let arg = Argument::tuple([x.into(), Argument::list([y.into(), 2.into(), x.into()])]);
/// let mut seen = vec![];
/// arg.visit_nodes(&mut |n| seen.push(n));
/// assert_eq!(seen, vec![x, y, x]);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Argument {
    /// Python `None`.
    #[default]
    None,
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (a boxed `str`, so that an argument is 24 bytes).
    Str(Box<str>),
    /// A dtype (`torch.float32`).
    DType(DType),
    /// A device (boxed: rare, and it would make every argument larger).
    Device(Box<Device>),
    /// A slice.
    Slice(Box<Slice>),
    /// Python's `...`.
    Ellipsis,
    /// The value of another node of the same graph.
    Node(NodeId),
    /// A list (a boxed slice, so that an argument is 24 bytes; build one with
    /// [`Argument::list`] or from a `Vec`).
    List(Box<[Argument]>),
    /// A tuple (a boxed slice; build one with [`Argument::tuple`]).
    Tuple(Box<[Argument]>),
    /// An insertion-ordered dict with string keys.
    Dict(Box<Kwargs>),
}

impl Argument {
    /// A tuple of the given items.
    pub fn tuple(items: impl IntoIterator<Item = Argument>) -> Argument {
        Argument::Tuple(items.into_iter().collect())
    }

    /// A list of the given items.
    pub fn list(items: impl IntoIterator<Item = Argument>) -> Argument {
        Argument::List(items.into_iter().collect())
    }

    /// A dict of the given entries (insertion order kept).
    pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, Argument)>) -> Argument {
        Argument::Dict(Box::new(items.into_iter().map(|(k, v)| (k.into(), v)).collect()))
    }

    /// A slice.
    pub fn slice(start: Argument, stop: Argument, step: Argument) -> Argument {
        Argument::Slice(Box::new(Slice { start, stop, step }))
    }

    /// The integers of an `Int` (one) or of a list / tuple of `Int`s (a stride, a padding, a
    /// shape); `None` for anything else.
    ///
    /// ```
    /// use ferrofx_fx::Argument;
    /// assert_eq!(Argument::list([1.into(), 2.into()]).as_int_list(), Some(vec![1, 2]));
    /// assert_eq!(Argument::Int(3).as_int_list(), Some(vec![3]));
    /// assert_eq!(Argument::list([1.into(), 2.5.into()]).as_int_list(), None);
    /// ```
    pub fn as_int_list(&self) -> Option<Vec<i64>> {
        match self {
            Argument::Int(i) => Some(vec![*i]),
            Argument::List(v) | Argument::Tuple(v) => v
                .iter()
                .map(|x| match x {
                    Argument::Int(i) => Some(*i),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// The node, if this argument is exactly a node reference.
    pub fn as_node(&self) -> Option<NodeId> {
        match self {
            Argument::Node(n) => Some(*n),
            _ => None,
        }
    }

    /// Calls `f` on every node leaf, depth first, left to right (dict values in order).
    #[inline]
    pub fn visit_nodes(&self, f: &mut impl FnMut(NodeId)) {
        match self {
            Argument::Node(n) => f(*n),
            Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_) => self.visit_nested(f),
            _ => {}
        }
    }

    /// [`Argument::visit_nodes`] on a container (kept out of line: the common node and scalar
    /// cases are handled inline by the caller, without a call).
    fn visit_nested(&self, f: &mut impl FnMut(NodeId)) {
        match self {
            Argument::Node(n) => f(*n),
            Argument::List(items) | Argument::Tuple(items) => {
                for a in items {
                    a.visit_nodes(f);
                }
            }
            Argument::Dict(d) => {
                for a in d.values() {
                    a.visit_nodes(f);
                }
            }
            Argument::Slice(s) => {
                s.start.visit_nodes(f);
                s.stop.visit_nodes(f);
                s.step.visit_nodes(f);
            }
            _ => {}
        }
    }

    /// Whether `node` occurs anywhere in the tree.
    pub fn contains_node(&self, node: NodeId) -> bool {
        let mut found = false;
        self.visit_nodes(&mut |n| found |= n == node);
        found
    }

    /// FX's `map_arg`: a copy with every node leaf replaced by `f(node)`.
    ///
    /// ```
    /// use ferrofx_fx::{Argument, Graph};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let a = Argument::tuple([x.into(), 1.into()]);
    /// assert_eq!(a.map_nodes(&mut |_| Argument::None), Argument::tuple([Argument::None, 1.into()]));
    /// ```
    pub fn map_nodes(&self, f: &mut impl FnMut(NodeId) -> Argument) -> Argument {
        match self {
            Argument::Node(n) => f(*n),
            Argument::List(items) => Argument::List(items.iter().map(|a| a.map_nodes(f)).collect()),
            Argument::Tuple(items) => Argument::Tuple(items.iter().map(|a| a.map_nodes(f)).collect()),
            Argument::Dict(d) => Argument::Dict(Box::new(d.iter().map(|(k, v)| (k.clone(), v.map_nodes(f))).collect())),
            Argument::Slice(s) => Argument::slice(s.start.map_nodes(f), s.stop.map_nodes(f), s.step.map_nodes(f)),
            other => other.clone(),
        }
    }

    /// Fallible [`Argument::map_nodes`]: stops at the first error.
    pub fn try_map_nodes<E>(&self, f: &mut impl FnMut(NodeId) -> Result<Argument, E>) -> Result<Argument, E> {
        Ok(match self {
            Argument::Node(n) => f(*n)?,
            Argument::List(items) => {
                Argument::List(items.iter().map(|a| a.try_map_nodes(f)).collect::<Result<_, E>>()?)
            }
            Argument::Tuple(items) => {
                Argument::Tuple(items.iter().map(|a| a.try_map_nodes(f)).collect::<Result<_, E>>()?)
            }
            Argument::Dict(d) => Argument::Dict(Box::new(
                d.iter().map(|(k, v)| Ok((k.clone(), v.try_map_nodes(f)?))).collect::<Result<_, E>>()?,
            )),
            Argument::Slice(s) => {
                Argument::slice(s.start.try_map_nodes(f)?, s.stop.try_map_nodes(f)?, s.step.try_map_nodes(f)?)
            }
            other => other.clone(),
        })
    }

    /// Replaces every occurrence of `old` by `new` in place; returns whether any was found.
    pub fn replace_node(&mut self, old: NodeId, new: NodeId) -> bool {
        match self {
            Argument::Node(n) if *n == old => {
                *n = new;
                true
            }
            Argument::List(items) | Argument::Tuple(items) => {
                let mut any = false;
                for a in items.iter_mut() {
                    any |= a.replace_node(old, new);
                }
                any
            }
            Argument::Dict(d) => {
                let mut any = false;
                for a in d.values_mut() {
                    any |= a.replace_node(old, new);
                }
                any
            }
            Argument::Slice(s) => {
                let a = s.start.replace_node(old, new);
                let b = s.stop.replace_node(old, new);
                let c = s.step.replace_node(old, new);
                a | b | c
            }
            _ => false,
        }
    }
}

impl From<NodeId> for Argument {
    fn from(n: NodeId) -> Argument {
        Argument::Node(n)
    }
}
impl From<bool> for Argument {
    fn from(v: bool) -> Argument {
        Argument::Bool(v)
    }
}
impl From<i64> for Argument {
    fn from(v: i64) -> Argument {
        Argument::Int(v)
    }
}
impl From<i32> for Argument {
    fn from(v: i32) -> Argument {
        Argument::Int(v as i64)
    }
}
impl From<usize> for Argument {
    fn from(v: usize) -> Argument {
        Argument::Int(v as i64)
    }
}
impl From<f64> for Argument {
    fn from(v: f64) -> Argument {
        Argument::Float(v)
    }
}
impl From<&str> for Argument {
    fn from(v: &str) -> Argument {
        Argument::Str(v.into())
    }
}
impl From<String> for Argument {
    fn from(v: String) -> Argument {
        Argument::Str(v.into_boxed_str())
    }
}
impl From<DType> for Argument {
    fn from(v: DType) -> Argument {
        Argument::DType(v)
    }
}
impl From<Device> for Argument {
    fn from(v: Device) -> Argument {
        Argument::Device(Box::new(v))
    }
}
impl From<Vec<Argument>> for Argument {
    /// A `Vec` becomes a list.
    fn from(v: Vec<Argument>) -> Argument {
        Argument::List(v.into_boxed_slice())
    }
}
impl<T: Into<Argument>> From<Option<T>> for Argument {
    /// `None` becomes [`Argument::None`].
    fn from(v: Option<T>) -> Argument {
        v.map_or(Argument::None, Into::into)
    }
}

// Node arguments are stored inline (two per node); keep them small.
const _: () = assert!(std::mem::size_of::<Argument>() == 24);
