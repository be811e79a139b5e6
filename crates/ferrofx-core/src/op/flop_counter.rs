//! [`FlopCounterMode`]: counts the floating point operations of the ops that run on this thread,
//! PyTorch's `torch.utils.flop_counter.FlopCounterMode`.
//!
//! While a counter is alive, every kernel run on the creating thread (eager calls, autograd's
//! forward calls, Interpreter nodes) adds its op's [`Cost`](super::Cost)`::flops` (computed by
//! the op's registry cost function from the arguments and the outputs' metadata: a multiply-add
//! counts as 2) to the counter, total and per op. Counters nest: an inner counter's ops count
//! in the outer one too. Work that kernels hand to other threads is counted once, on the
//! thread that called the op. Tracing records nodes instead of running kernels, so nothing is
//! counted while tracing.
//!
//! ```
//! use ferrofx_core::op::FlopCounterMode;
//! use ferrofx_core::Tensor;
//! let a = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
//! let b = Tensor::from_vec(vec![1.0f32; 12], &[3, 4]).unwrap();
//! let counter = FlopCounterMode::start();
//! let c = a.matmul(&b).unwrap();
//! let _ = c.relu().unwrap();
//! assert_eq!(counter.flops_of("matmul"), 2 * 2 * 3 * 4); // 2·M·K·N
//! assert_eq!(counter.flops_of("relu"), 8);
//! assert_eq!(counter.total_flops(), 48 + 8);
//! ```

use super::def::{OpDef, Outputs};
use crate::value::Value;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// Totals of one counter.
#[derive(Debug, Default)]
struct Counts {
    total: u64,
    by_op: BTreeMap<&'static str, u64>,
}

thread_local! {
    /// The live counters of this thread, outermost first.
    static ACTIVE: RefCell<Vec<Rc<RefCell<Counts>>>> = const { RefCell::new(Vec::new()) };
}

/// A live FLOP counter; counting stops when it is dropped (see the module documentation).
#[derive(Debug)]
pub struct FlopCounterMode {
    counts: Rc<RefCell<Counts>>,
}

impl FlopCounterMode {
    /// Starts counting the ops run on this thread.
    pub fn start() -> FlopCounterMode {
        let counts = Rc::new(RefCell::new(Counts::default()));
        ACTIVE.with(|a| a.borrow_mut().push(counts.clone()));
        FlopCounterMode { counts }
    }

    /// FLOPs counted so far.
    pub fn total_flops(&self) -> u64 {
        self.counts.borrow().total
    }

    /// FLOPs counted so far for the op named `name` (0 if it did not run).
    pub fn flops_of(&self, name: &str) -> u64 {
        self.counts.borrow().by_op.get(name).copied().unwrap_or(0)
    }

    /// FLOPs per op name, for the ops that ran.
    pub fn flops_by_op(&self) -> BTreeMap<&'static str, u64> {
        self.counts.borrow().by_op.clone()
    }
}

impl Drop for FlopCounterMode {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.borrow_mut().retain(|c| !Rc::ptr_eq(c, &self.counts)));
    }
}

/// Adds one kernel call to the live counters (called by `run_kernel`; a thread-local check
/// when no counter is live).
#[inline]
pub(crate) fn record(op: &'static OpDef, args: &[Value], out: &Outputs) {
    if ACTIVE.with(|a| a.borrow().is_empty()) {
        return;
    }
    let metas: Vec<_> = out.iter().filter_map(|t| t.meta()).collect();
    let flops = (op.cost)(args, &metas).flops;
    ACTIVE.with(|a| {
        for c in a.borrow().iter() {
            let mut c = c.borrow_mut();
            c.total = c.total.saturating_add(flops);
            let e = c.by_op.entry(op.name).or_insert(0);
            *e = e.saturating_add(flops);
        }
    });
}
