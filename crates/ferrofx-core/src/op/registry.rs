//! The global op registry: every op by name.

use crate::error::{Error, Result};
use crate::op::def::OpDef;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

/// FNV-1a: op names are short, trusted keys, and every `op::call` hashes one.
#[derive(Default)]
struct NameHasher(u64);
impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}
type Table = HashMap<&'static str, &'static OpDef, BuildHasherDefault<NameHasher>>;

fn table() -> &'static RwLock<Table> {
    static TABLE: OnceLock<RwLock<Table>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut map = Table::default();
        for op in crate::ops::builtin_ops() {
            let prev = map.insert(op.name, *op);
            debug_assert!(prev.is_none(), "duplicate builtin op {}", op.name);
        }
        RwLock::new(map)
    })
}

/// Looks an op up by name.
///
/// ```
/// let add = ferrofx_core::op::lookup("add").unwrap();
/// assert_eq!(add.name, "add");
/// assert!(add.is_pure());
/// assert!(ferrofx_core::op::lookup("no_such_op").is_none());
/// ```
pub fn lookup(name: &str) -> Option<&'static OpDef> {
    table().read().get(name).copied()
}

/// Looks an op up by name, or explains that it does not exist.
pub fn require(name: &str) -> Result<&'static OpDef> {
    lookup(name).ok_or_else(|| {
        Error::schema(
            name,
            format!("no op named '{name}' is registered; register custom ops with ferrofx_core::op::register"),
        )
    })
}

/// Every registered op, sorted by name.
pub fn all_ops() -> Vec<&'static OpDef> {
    let mut v: Vec<_> = table().read().values().copied().collect();
    v.sort_by_key(|o| o.name);
    v
}

/// Registers a user op; it becomes first-class: callable by name, traceable, serialisable by
/// name, and differentiable if it has a backward formula. Names must be unique.
///
/// The definition is leaked to get a `'static` lifetime: ops live for the whole program, like
/// PyTorch's `torch.library` registrations.
pub fn register(op: OpDef) -> Result<&'static OpDef> {
    let mut t = table().write();
    if t.contains_key(op.name) {
        return Err(Error::schema(op.name, format!("an op named '{}' is already registered", op.name)));
    }
    if op.name.is_empty() || !op.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == ':') {
        return Err(Error::schema(
            op.name,
            "op names must be non-empty and use only ASCII letters, digits, '_', '.' and ':'",
        ));
    }
    let leaked: &'static OpDef = Box::leak(Box::new(op));
    t.insert(leaked.name, leaked);
    Ok(leaked)
}
