//! Unique node names (FX's `_Namespace.create_name`).

use crate::graph::hash::{FxHashMap, FxHashSet};
use std::fmt::Write;

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

/// Hands out unique identifiers: sanitised (`layers.0` → `layers_0`), never a keyword or
/// builtin, made unique with `_1`, `_2` ... suffixes. Names are never handed out twice, even
/// after their node is erased (as in FX).
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
    used: FxHashSet<String>,
    base_count: FxHashMap<String, u64>,
    reserved: &'static FxHashSet<&'static str>,
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

/// FX's sanitising: runs of characters that are not `[0-9a-zA-Z_]` become one `_`; an empty
/// result is `_unnamed`; a leading digit gets a `_` prefix.
pub(crate) fn sanitize(candidate: &str) -> std::borrow::Cow<'_, str> {
    let clean = !candidate.is_empty()
        && candidate.chars().all(is_ident_char)
        && !candidate.starts_with(|c: char| c.is_ascii_digit());
    if clean {
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
        (Some(base), Ok(num)) => (base, Some(num)),
        _ => (name, None),
    }
}

impl Namespace {
    /// An empty namespace.
    pub fn new() -> Namespace {
        Namespace { used: FxHashSet::default(), base_count: FxHashMap::default(), reserved: reserved() }
    }

    /// Whether `name` is a keyword or builtin that is never handed out.
    pub fn is_reserved(&self, name: &str) -> bool {
        self.reserved.contains(name)
    }

    /// Whether `name` was handed out.
    pub fn is_used(&self, name: &str) -> bool {
        self.used.contains(name)
    }

    /// A fresh unique name derived from `candidate`.
    pub fn create_name(&mut self, candidate: &str) -> String {
        let sanitized = sanitize(candidate);
        let (base, num) = split_suffix(&sanitized);
        let mut name = match num {
            None => base.to_string(),
            Some(n) => {
                let mut s = String::with_capacity(base.len() + 8);
                let _ = write!(s, "{base}_{n}");
                s
            }
        };
        let mut num = match num {
            Some(n) if n != 0 => n,
            _ => self.base_count.get(base).copied().unwrap_or(0),
        };
        while self.used.contains(name.as_str()) || self.is_reserved(&name) {
            num += 1;
            name.clear();
            let _ = write!(name, "{base}_{num}");
        }
        self.used.insert(name.clone());
        match self.base_count.get_mut(base) {
            Some(c) => *c = num,
            None => {
                self.base_count.insert(base.to_string(), num);
            }
        }
        name
    }
}
