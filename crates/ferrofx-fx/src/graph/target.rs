//! Opcodes and targets: what a node does.

use crate::core_api::{self, OpDef};
use crate::graph::error::{GraphError, Result};
use std::any::Any;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The six opcodes of torch.fx (seed 000 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opcode {
    /// A function input; target is the parameter name, `args` is `()` or `(default,)`.
    Placeholder,
    /// Fetches a parameter/buffer from the module hierarchy; target is its dotted path.
    GetAttr,
    /// Calls a free function; target is a callable ([`Target::Op`] or [`Target::Function`]).
    CallFunction,
    /// Calls a method on `args[0]`; target is the method name.
    CallMethod,
    /// Calls a submodule's forward; target is the module's dotted path.
    CallModule,
    /// The return value; target is `"output"`, `args[0]` the returned value.
    Output,
}

impl Opcode {
    /// All six, in FX's documentation order.
    pub const ALL: [Opcode; 6] = [
        Opcode::Placeholder,
        Opcode::GetAttr,
        Opcode::CallFunction,
        Opcode::CallMethod,
        Opcode::CallModule,
        Opcode::Output,
    ];

    /// FX's spelling (`call_function`).
    pub fn as_str(self) -> &'static str {
        match self {
            Opcode::Placeholder => "placeholder",
            Opcode::GetAttr => "get_attr",
            Opcode::CallFunction => "call_function",
            Opcode::CallMethod => "call_method",
            Opcode::CallModule => "call_module",
            Opcode::Output => "output",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Opcode {
    type Err = GraphError;

    /// Parses FX's spelling; anything else is [`GraphError::UnknownOpcode`].
    ///
    /// ```
    /// use ferrofx_fx::{GraphError, Opcode};
    /// assert_eq!("call_module".parse::<Opcode>().unwrap(), Opcode::CallModule);
    /// assert!(matches!("root".parse::<Opcode>(), Err(GraphError::UnknownOpcode(_))));
    /// ```
    fn from_str(s: &str) -> Result<Opcode> {
        Opcode::ALL.iter().copied().find(|op| op.as_str() == s).ok_or_else(|| GraphError::UnknownOpcode(s.to_string()))
    }
}

type Registry = std::sync::Mutex<std::collections::HashMap<String, &'static UserFunction>>;

fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// A user function usable as a `call_function` target (FX's arbitrary Python callables).
///
/// The IR only needs its identity, its name and whether it has side effects; an executor can
/// attach its implementation as an opaque payload and downcast it back.
///
/// Like registry ops (`&'static OpDef`), user functions live for the whole process: the
/// constructors return `&'static UserFunction` (the value is leaked once), so a target is a
/// plain pointer copy: no reference counting (an atomic operation) on every node created,
/// copied or erased. Create functions once (or use [`UserFunction::registered`]), not per node.
pub struct UserFunction {
    name: String,
    impure: bool,
    implementation: Option<Arc<dyn Any + Send + Sync>>,
}

impl UserFunction {
    /// A pure user function called `name`.
    ///
    /// ```
    /// use ferrofx_fx::UserFunction;
    /// let f = UserFunction::new("my_fn");
    /// assert_eq!(f.name(), "my_fn");
    /// assert!(!f.is_impure());
    /// ```
    pub fn new(name: impl Into<String>) -> &'static UserFunction {
        Box::leak(Box::new(UserFunction { name: name.into(), impure: false, implementation: None }))
    }

    /// A user function with side effects: dead code elimination keeps its calls.
    pub fn new_impure(name: impl Into<String>) -> &'static UserFunction {
        Box::leak(Box::new(UserFunction { name: name.into(), impure: true, implementation: None }))
    }

    /// A user function carrying its implementation (e.g. a boxed closure) for executors.
    pub fn with_implementation(
        name: impl Into<String>,
        impure: bool,
        implementation: Arc<dyn Any + Send + Sync>,
    ) -> &'static UserFunction {
        Box::leak(Box::new(UserFunction { name: name.into(), impure, implementation: Some(implementation) }))
    }

    /// The function registered under `name` in the process-wide user function registry,
    /// registering a pure one on first use.
    pub fn registered(name: &str) -> &'static UserFunction {
        let mut map = registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.entry(name.to_string()).or_insert_with(|| UserFunction::new(name))
    }

    /// Registers `function` under its name, replacing any earlier registration; later
    /// [`UserFunction::registered`] calls with that name return it.
    pub fn register(function: &'static UserFunction) -> &'static UserFunction {
        let mut map = registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.insert(function.name.clone(), function);
        function
    }

    /// The function's (qualified) name, used for printing and node naming.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether calls have side effects.
    pub fn is_impure(&self) -> bool {
        self.impure
    }

    /// The attached implementation, if any.
    pub fn implementation(&self) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.implementation.as_ref()
    }
}

impl fmt::Debug for UserFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserFunction({}{})", self.name, if self.impure { ", impure" } else { "" })
    }
}

/// What a node calls or refers to.
///
/// `call_function` nodes need a callable target ([`Target::Op`] or [`Target::Function`]); the
/// other five opcodes need [`Target::Str`] (seed 000 §4.3). The rule is enforced when nodes are
/// created or retargeted.
///
/// Equality: ops and functions compare by identity, strings by value.
#[derive(Clone)]
pub enum Target {
    /// An op of the registry.
    Op(&'static OpDef),
    /// A user function (process-lifetime, like registry ops).
    Function(&'static UserFunction),
    /// A parameter name, attribute path, method name, module path or `"output"`.
    Str(String),
}

impl Target {
    /// The registry op called `name`, or [`GraphError::UnknownOp`].
    ///
    /// ```
    /// use ferrofx_fx::Target;
    /// assert_eq!(Target::op("reshape").unwrap().to_string(), "reshape");
    /// assert!(Target::op("nope").is_err());
    /// ```
    pub fn op(name: &str) -> Result<Target> {
        core_api::lookup(name).map(Target::Op).ok_or_else(|| GraphError::UnknownOp(name.to_string()))
    }

    /// The user function registered under `name`, registering a pure one on first use (the
    /// same name always gives the same function, hence equal targets).
    ///
    /// ```
    /// use ferrofx_fx::Target;
    /// assert_eq!(Target::function("my_fn"), Target::function("my_fn"));
    /// assert_eq!(Target::function("my_fn").to_string(), "my_fn");
    /// ```
    pub fn function(name: &str) -> Target {
        Target::Function(UserFunction::registered(name))
    }

    /// The registry op `name` if there is one, else [`Target::function`]`(name)`.
    pub fn named(name: &str) -> Target {
        match core_api::lookup(name) {
            Some(def) => Target::Op(def),
            None => Target::function(name),
        }
    }

    /// Whether the target is callable (valid for `call_function`).
    pub fn is_callable(&self) -> bool {
        !matches!(self, Target::Str(_))
    }

    /// The name used in printing: op name, function name, or the string itself.
    pub fn name(&self) -> &str {
        match self {
            Target::Op(def) => def.name,
            Target::Function(f) => f.name(),
            Target::Str(s) => s,
        }
    }

    /// The string, when the target is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Target::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The registry op, when the target is one.
    pub fn as_op(&self) -> Option<&'static OpDef> {
        match self {
            Target::Op(def) => Some(def),
            _ => None,
        }
    }
}

impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        match (self, other) {
            (Target::Op(a), Target::Op(b)) => std::ptr::eq(*a, *b),
            (Target::Function(a), Target::Function(b)) => std::ptr::eq(*a, *b),
            (Target::Str(a), Target::Str(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Target {}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Op(def) => write!(f, "Op({})", def.name),
            Target::Function(func) => write!(f, "Function({})", func.name()),
            Target::Str(s) => write!(f, "Str({s:?})"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<&str> for Target {
    fn from(s: &str) -> Target {
        Target::Str(s.to_string())
    }
}

impl From<String> for Target {
    fn from(s: String) -> Target {
        Target::Str(s)
    }
}

impl From<&'static OpDef> for Target {
    fn from(def: &'static OpDef) -> Target {
        Target::Op(def)
    }
}

impl From<&'static UserFunction> for Target {
    fn from(f: &'static UserFunction) -> Target {
        Target::Function(f)
    }
}

/// Enforces the opcode/target rule of seed 000 §4.3.
pub(crate) fn check_target(op: Opcode, target: &Target, node: &str) -> Result<()> {
    match (op, target.is_callable()) {
        (Opcode::CallFunction, false) => {
            Err(GraphError::NotCallable { node: node.to_string(), target: target.name().to_string() })
        }
        (Opcode::CallFunction, true) | (_, false) => Ok(()),
        (op, true) => Err(GraphError::TargetNotString {
            node: node.to_string(),
            op: op.as_str(),
            target: target.name().to_string(),
        }),
    }
}
