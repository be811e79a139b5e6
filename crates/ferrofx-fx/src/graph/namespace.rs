//! Unique node names (FX's `_Namespace.create_name`).

use crate::graph::hash::{FxHashMap, FxHashSet};

/// Python keywords, Python builtins, FX's custom builtins and Rust keywords: never used as
/// node names, so generated code stays valid in both languages.
const RESERVED: &[&str] = &[
    // Python keywords
    "False",
    "None",
    "True",
    "and",
    "as",
    "assert",
    "async",
    "await",
    "break",
    "class",
    "continue",
    "def",
    "del",
    "elif",
    "else",
    "except",
    "finally",
    "for",
    "from",
    "global",
    "if",
    "import",
    "in",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "return",
    "try",
    "while",
    "with",
    "yield",
    // Python builtins
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BaseException",
    "Ellipsis",
    "Exception",
    "IndexError",
    "KeyError",
    "NotImplemented",
    "RuntimeError",
    "TypeError",
    "ValueError",
    "abs",
    "aiter",
    "all",
    "anext",
    "any",
    "ascii",
    "bin",
    "bool",
    "breakpoint",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "classmethod",
    "compile",
    "complex",
    "copyright",
    "credits",
    "delattr",
    "dict",
    "dir",
    "divmod",
    "enumerate",
    "eval",
    "exec",
    "exit",
    "filter",
    "float",
    "format",
    "frozenset",
    "getattr",
    "globals",
    "hasattr",
    "hash",
    "help",
    "hex",
    "id",
    "input",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "license",
    "list",
    "locals",
    "map",
    "max",
    "memoryview",
    "min",
    "next",
    "object",
    "oct",
    "open",
    "ord",
    "pow",
    "print",
    "property",
    "quit",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "setattr",
    "slice",
    "sorted",
    "staticmethod",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "vars",
    "zip",
    // FX's custom builtins and names used by generated code
    "inf",
    "nan",
    "NoneType",
    "torch",
    "device",
    "ops",
    "self",
    // Rust keywords (strict and reserved)
    "Self",
    "abstract",
    "become",
    "box",
    "const",
    "crate",
    "do",
    "dyn",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "gen",
    "impl",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "pub",
    "ref",
    "static",
    "struct",
    "trait",
    "true",
    "typeof",
    "union",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
];

/// The interned name of a node: an index into its graph's [`Namespace`] arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct NameId(pub(crate) u32);

impl NameId {
    /// Placeholder for the sentinel slot.
    pub(crate) const NONE: NameId = NameId(u32::MAX);
}

/// Key of a name without a numeric suffix.
const NO_NUM: u64 = u64::MAX;
/// Packed key: no numeric suffix.
const KEY_NONE: u32 = u32::MAX;
/// Packed key: a suffix too large for a `u32`, kept on the side.
const KEY_BIG: u32 = u32::MAX - 1;

/// Hands out unique identifiers: sanitised (`layers.0` → `layers_0`), never a keyword or
/// builtin, made unique with `_1`, `_2` ... suffixes. Names are never handed out twice, even
/// after their node is erased (as in FX).
///
/// Names are interned: every handed-out name is stored once in a string arena and has a `u32`
/// id, and uniqueness is tracked on `(base id, numeric suffix)` pairs, so creating `add_7` hashes
/// the short base `add` once and then only integers.
///
/// ```
/// use ferrofx_fx::Namespace;
/// let mut ns = Namespace::new();
/// assert_eq!(ns.create_name("add"), "add");
/// assert_eq!(ns.create_name("add"), "add_1");
/// assert_eq!(ns.create_name("add_1"), "add_2");
/// assert_eq!(ns.create_name("layers.0"), "layers_0");
/// assert_eq!(ns.create_name("sum"), "sum_1");
/// assert_eq!(ns.create_name("fn"), "fn_1");
/// assert_eq!(ns.create_name("0x"), "_0x");
/// assert_eq!(ns.create_name(""), "_unnamed");
/// ```
#[derive(Debug, Clone)]
pub struct Namespace {
    /// Every handed-out name, concatenated.
    text: String,
    /// Name id → end of its text in `text` (it starts where the previous name ends).
    ends: Vec<u32>,
    /// Name id → (base id, suffix), the suffix packed as [`KEY_NONE`], [`KEY_BIG`] (the value is
    /// in `big_keys`) or the number itself (8 bytes per name).
    keys: Vec<(u32, u32)>,
    /// Suffixes of `KEY_BIG` names, by name id.
    big_keys: FxHashMap<u32, u64>,
    /// Base string → base id.
    base_ids: FxHashMap<Box<str>, u32>,
    /// Per base id: FX's `_base_count` and whether the bare base is a reserved word.
    bases: Vec<BaseInfo>,
    /// `(base id, suffix)` of names handed out or reserved whose suffix is too large for the
    /// base's bitset.
    sparse: FxHashSet<(u32, u64)>,
    /// The last few candidates that were plain identifiers without a numeric suffix, with their
    /// base ids: consecutive nodes usually derive their names from a few targets (`add`, `mul`,
    /// `add`, ...), and such a candidate needs no sanitising, splitting or base lookup.
    recent: [Option<(Box<str>, u32)>; 4],
    /// The entry of `recent` replaced next.
    next_recent: usize,
}

/// Per base: FX's `_base_count`, whether the bare base is reserved or used, and a bitset of
/// the suffixes used, so the common `add_1`, `add_2`, ... sequence never hashes.
#[derive(Debug, Clone, Default)]
struct BaseInfo {
    count: u64,
    names: u64,
    reserved: bool,
    bare_used: bool,
    /// Some suffix of this base is in the sparse set.
    has_sparse: bool,
    bits: Vec<u64>,
}

impl BaseInfo {
    /// Whether suffix `num` is tracked by the bitset (bounded by the names of this base, so
    /// the bitsets take O(names) memory in total).
    fn in_bits(&self, num: u64) -> bool {
        num < 1024 + 8 * self.names
    }
}

fn reserved() -> &'static FxHashSet<&'static str> {
    static SET: std::sync::OnceLock<FxHashSet<&'static str>> = std::sync::OnceLock::new();
    SET.get_or_init(|| RESERVED.iter().copied().collect())
}

impl Default for Namespace {
    fn default() -> Namespace {
        Namespace::new()
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `s` is a valid identifier (`[A-Za-z_][A-Za-z0-9_]*`).
pub(crate) fn is_identifier(s: &str) -> bool {
    // Bytes suffice: every byte of a non-ASCII character is >= 0x80, never an identifier byte.
    let b = s.as_bytes();
    !b.is_empty() && !b[0].is_ascii_digit() && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// FX's sanitising: runs of characters that are not `[0-9a-zA-Z_]` become one `_`; an empty
/// result is `_unnamed`; a leading digit gets a `_` prefix.
pub(crate) fn sanitize(candidate: &str) -> std::borrow::Cow<'_, str> {
    if is_identifier(candidate) {
        return std::borrow::Cow::Borrowed(candidate);
    }
    let mut out = String::with_capacity(candidate.len() + 1);
    let mut in_bad_run = false;
    for c in candidate.chars() {
        if is_ident_char(c) {
            out.push(c);
            in_bad_run = false;
        } else if !in_bad_run {
            out.push('_');
            in_bad_run = true;
        }
    }
    if out.is_empty() {
        out.push_str("_unnamed");
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    std::borrow::Cow::Owned(out)
}

/// Splits `base_123` into (`base`, Some(123)) like FX's `(.*)_(\d+)$`.
fn split_suffix(name: &str) -> (&str, Option<u64>) {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits >= name.len() {
        return (name, None);
    }
    let (head, tail) = name.split_at(name.len() - digits);
    match (head.strip_suffix('_'), tail.parse::<u64>()) {
        (Some(base), Ok(num)) if num != NO_NUM => (base, Some(num)),
        _ => (name, None),
    }
}

/// The two-digit decimal strings `00` ... `99`, concatenated.
const PAIRS: &str = "00010203040506070809101112131415161718192021222324252627282930313233343536373839\
40414243444546474849505152535455565758596061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Appends the decimal digits of `n` (no formatting machinery: this is on the node creation
/// path), two at a time from a table.
fn push_u64(out: &mut String, n: u64) {
    if n < 10 {
        out.push(char::from(b'0' + n as u8));
        return;
    }
    // Split into two-digit groups, most significant first (at most 10 groups for a u64).
    let mut groups = [0u8; 10];
    let mut k = 0;
    let mut m = n;
    while m >= 100 {
        groups[k] = (m % 100) as u8;
        m /= 100;
        k += 1;
    }
    if m >= 10 {
        out.push_str(&PAIRS[2 * m as usize..2 * m as usize + 2]);
    } else {
        out.push(char::from(b'0' + m as u8));
    }
    for &g in groups[..k].iter().rev() {
        out.push_str(&PAIRS[2 * g as usize..2 * g as usize + 2]);
    }
}

impl Namespace {
    /// An empty namespace.
    pub fn new() -> Namespace {
        Namespace {
            text: String::new(),
            ends: Vec::new(),
            keys: Vec::new(),
            big_keys: FxHashMap::default(),
            base_ids: FxHashMap::default(),
            bases: Vec::new(),
            sparse: FxHashSet::default(),
            recent: Default::default(),
            next_recent: 0,
        }
    }

    /// Whether `name` is a keyword or builtin that is never handed out.
    pub fn is_reserved(&self, name: &str) -> bool {
        reserved().contains(name)
    }

    /// Whether `name` was handed out (or reserved for a global such as a user function).
    pub fn is_used(&self, name: &str) -> bool {
        let (base, num) = split_suffix(name);
        match self.base_ids.get(base) {
            Some(&b) => self.is_key_used(b, num.unwrap_or(NO_NUM)),
            None => false,
        }
    }

    fn is_key_used(&self, b: u32, key: u64) -> bool {
        let info = &self.bases[b as usize];
        if key == NO_NUM {
            return info.bare_used;
        }
        let (w, bit) = ((key / 64) as usize, key % 64);
        info.bits.get(w).is_some_and(|x| x & (1 << bit) != 0) || (info.has_sparse && self.sparse.contains(&(b, key)))
    }

    /// Marks a key used; returns whether it was free.
    fn use_key(&mut self, b: u32, key: u64) -> bool {
        if self.is_key_used(b, key) {
            return false;
        }
        let info = &mut self.bases[b as usize];
        if key == NO_NUM {
            info.bare_used = true;
        } else if info.in_bits(key) {
            let (w, bit) = ((key / 64) as usize, key % 64);
            if info.bits.len() <= w {
                info.bits.resize((w + 1).next_power_of_two(), 0);
            }
            info.bits[w] |= 1 << bit;
        } else {
            info.has_sparse = true;
            self.sparse.insert((b, key));
        }
        true
    }

    /// A namespace sharing `src`'s name arena (so name ids stay valid) but with no name marked
    /// used: the start of a whole-graph copy, which then [`marks`](Namespace::mark) the names
    /// of the nodes it copies, reaching the state node-by-node creation would.
    /// `headroom` names can be added before the arena grows.
    pub(crate) fn arena_copy(src: &Namespace, headroom: usize) -> Namespace {
        fn with_room<T: Clone>(v: &[T], extra: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(v.len() + extra);
            out.extend_from_slice(v);
            out
        }
        let mut text = String::with_capacity(src.text.len() + 16 * headroom);
        text.push_str(&src.text);
        Namespace {
            text,
            ends: with_room(&src.ends, headroom),
            keys: with_room(&src.keys, headroom),
            big_keys: src.big_keys.clone(),
            base_ids: src.base_ids.clone(),
            bases: src.bases.iter().map(|b| BaseInfo { reserved: b.reserved, ..BaseInfo::default() }).collect(),
            sparse: FxHashSet::default(),
            recent: Default::default(),
            next_recent: 0,
        }
    }

    /// Room for `additional` more names without growing (names are ~8 bytes on average; the
    /// text grows further by itself when they are longer).
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.ends.reserve(additional);
        self.keys.reserve(additional);
        self.text.reserve(additional.saturating_mul(8));
    }

    /// Marks an arena name used as [`Namespace::create`] would when asked for exactly this
    /// (free) name.
    pub(crate) fn mark(&mut self, id: NameId) {
        let (b, key) = self.key_of(id);
        self.use_key(b, key);
        let info = &mut self.bases[b as usize];
        if key != NO_NUM {
            info.count = key;
        }
        info.names += 1;
    }

    fn base_id(&mut self, base: &str) -> u32 {
        if let Some(&b) = self.base_ids.get(base) {
            return b;
        }
        let b = self.bases.len() as u32;
        self.bases.push(BaseInfo { reserved: reserved().contains(base), ..BaseInfo::default() });
        self.base_ids.insert(base.into(), b);
        b
    }

    /// A fresh unique name derived from `candidate`.
    pub fn create_name(&mut self, candidate: &str) -> String {
        let id = self.create(candidate);
        self.get(id).to_string()
    }

    /// The first suffix worth trying for a fresh `base_N` name (after FX's base counter).
    pub(crate) fn next_suffix(&self, base: &str) -> u64 {
        match self.base_ids.get(base) {
            Some(&b) => self.bases[b as usize].count.saturating_add(1),
            None => 1,
        }
    }

    /// [`Namespace::create_name`], returning the interned id.
    pub(crate) fn create(&mut self, candidate: &str) -> NameId {
        let hit = self.recent.iter().flatten().find(|(c, _)| **c == *candidate).map(|&(_, b)| b);
        let sanitized;
        let (b, base, num) = match hit {
            Some(b) => (b, candidate, None),
            None => {
                sanitized = sanitize(candidate);
                let (base, num) = split_suffix(&sanitized);
                let b = self.base_id(base);
                if num.is_none() && matches!(sanitized, std::borrow::Cow::Borrowed(_)) {
                    self.recent[self.next_recent % 4] = Some((candidate.into(), b));
                    self.next_recent = self.next_recent.wrapping_add(1);
                }
                (b, base, num)
            }
        };
        let mut key = num.unwrap_or(NO_NUM);
        let mut count = match num {
            Some(n) if n != 0 => n,
            _ => self.bases[b as usize].count,
        };
        let info = &self.bases[b as usize];
        if key == NO_NUM && (info.reserved || info.bare_used) {
            // The bare base is taken: go straight to the suffixes.
            count += 1;
            key = count;
        }
        let reserved = info.reserved;
        while (key == NO_NUM && reserved) || !self.use_key(b, key) {
            count += 1;
            key = count;
        }
        let info = &mut self.bases[b as usize];
        info.count = count;
        info.names += 1;
        self.text.push_str(base);
        if key != NO_NUM {
            self.text.push('_');
            push_u64(&mut self.text, key);
        }
        let id = NameId(self.ends.len() as u32);
        self.ends.push(self.text.len() as u32);
        let packed = match key {
            NO_NUM => KEY_NONE,
            k if k < u64::from(KEY_BIG) => k as u32,
            k => {
                self.big_keys.insert(id.0, k);
                KEY_BIG
            }
        };
        self.keys.push((b, packed));
        id
    }

    /// The (base id, suffix or `NO_NUM`) of a name.
    fn key_of(&self, id: NameId) -> (u32, u64) {
        let (b, packed) = self.keys[id.0 as usize];
        let key = match packed {
            KEY_NONE => NO_NUM,
            KEY_BIG => self.big_keys.get(&id.0).copied().unwrap_or(NO_NUM),
            k => u64::from(k),
        };
        (b, key)
    }

    /// The text of an interned name.
    #[inline]
    pub(crate) fn get(&self, id: NameId) -> &str {
        let i = id.0 as usize;
        match self.ends.get(i) {
            Some(&e) => {
                let s = if i == 0 { 0 } else { self.ends[i - 1] };
                &self.text[s as usize..e as usize]
            }
            None => "",
        }
    }

    /// Number of names handed out (ids are `0..count`).
    pub(crate) fn count(&self) -> usize {
        self.ends.len()
    }
}

#[cfg(test)]
mod tests {
    use super::push_u64;

    #[test]
    fn push_u64_matches_display() {
        let mut values = vec![0u64, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 12345, 100_000, 9_999_999, u64::MAX];
        values.extend((0..64).map(|s| 1u64 << s));
        values.extend((0..64).map(|s| (1u64 << s) - 1));
        for v in values {
            let mut out = String::from("x_");
            push_u64(&mut out, v);
            assert_eq!(out, format!("x_{v}"));
        }
    }

    /// Names and their packed (base, suffix) keys survive an arena copy, including suffixes
    /// beyond `u32` (kept on the side), so marking them reaches the same state.
    #[test]
    fn packed_keys_round_trip() {
        use super::{NameId, Namespace};
        let mut ns = Namespace::new();
        let names = ["add", "add", "x_4294967294", "x_4294967295", "y_18446744073709551614", "z_7"];
        let ids: Vec<NameId> = names.iter().map(|n| ns.create(n)).collect();
        let texts: Vec<&str> = ids.iter().map(|&i| ns.get(i)).collect();
        assert_eq!(texts, ["add", "add_1", "x_4294967294", "x_4294967295", "y_18446744073709551614", "z_7"]);
        let mut copy = Namespace::arena_copy(&ns, 4);
        for &i in &ids {
            copy.mark(i);
            assert_eq!(copy.get(i), ns.get(i));
        }
        for n in ["add", "x_4294967295", "y_18446744073709551614", "z_7"] {
            assert!(copy.is_used(n), "{n}");
            assert_eq!(copy.create_name(n), ns.create_name(n));
        }
    }
}
