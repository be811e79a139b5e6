//! A small fork-join team for the kernels of a model's nodes (the convolutions, float and int8, and the int8 ops around them): the calling thread and
//! `rayon::current_num_threads() - 1` helper threads that **spin** for a while after a job
//! before they park, as ONNX Runtime's and OpenMP's pools do.
//!
//! Why not rayon here: a rayon parallel loop started from a thread outside the pool injects
//! its job and puts the caller to sleep until a worker finishes it, and rayon's workers park
//! after a few microseconds without work. A compiled model at batch 1 runs ~50-150 nodes of
//! 10-500 µs each, one after the other, so every node paid for waking a parked worker and for
//! waking the caller again (600-900 context switches per ResNet-18 batch-1 forward, measured
//! by `ferrofx-bench`'s per-case counters), and that latency varied with the machine's state
//! from one process to the next. Here the caller runs tasks itself (it never sleeps waiting
//! for a helper to start), tasks are taken dynamically from a shared counter (a helper that is
//! still parked when a short job starts simply gets no task), and a helper stays awake for
//! [`SPIN`] after its last task, so the next node's job starts on both cores at once.
//!
//! One job runs at a time; a second thread that starts a job while one runs (two models run
//! from two threads, the parallel test harness) falls back to rayon. Called from a rayon worker,
//! from a helper or from a task of the caller's own job, a job runs serially on the calling
//! thread (no nested parallelism).

use rayon::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper stays awake after its last task: spinning (a `pause` per check) for
/// the first [`SPIN_HOT`], then yielding its core to any other runnable thread between checks.
const SPIN: Duration = Duration::from_micros(300);
/// The part of [`SPIN`] spent spinning without yielding.
const SPIN_HOT: Duration = Duration::from_micros(30);

/// One parallel loop `f(0..tasks)`, on the stack of the thread that runs it.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    tasks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
}

impl Job<'_> {
    /// Takes and runs tasks until none is left.
    fn work(&self) {
        loop {
            let t = self.next.fetch_add(1, SeqCst);
            if t >= self.tasks {
                return;
            }
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.f)(t))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
}

struct Team {
    helpers: usize,
    /// Taken by the thread whose job runs.
    busy: AtomicBool,
    /// The running job (null between jobs), type-erased.
    job: AtomicPtr<Job<'static>>,
    /// Bumped when a job is published.
    epoch: AtomicUsize,
    /// Helpers between taking a reference to `job` and dropping it.
    refs: AtomicUsize,
    /// Parked helpers wait here for the next epoch.
    parked: Mutex<usize>,
    wake: Condvar,
}

thread_local! {
    static IN_HELPER: Cell<bool> = const { Cell::new(false) };
}

fn team() -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let team: &'static Team = Box::leak(Box::new(Team {
            helpers: rayon::current_num_threads().saturating_sub(1),
            busy: AtomicBool::new(false),
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            refs: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
        }));
        for i in 0..team.helpers {
            let spawned = std::thread::Builder::new().name(format!("ferrofx-team-{i}")).spawn(move || helper(team));
            if spawned.is_err() {
                // no helper: jobs still complete, on the caller (tasks are taken dynamically)
                break;
            }
        }
        team
    })
}

fn helper(team: &'static Team) {
    IN_HELPER.with(|h| h.set(true));
    let mut seen = team.epoch.load(SeqCst);
    loop {
        // wait for a new epoch: spin, then yield, then park
        let start = Instant::now();
        let mut spins = 0u32;
        while team.epoch.load(SeqCst) == seen {
            spins += 1;
            if spins.is_multiple_of(64) {
                let waited = start.elapsed();
                if waited >= SPIN {
                    let mut parked = team.parked.lock().unwrap_or_else(|e| e.into_inner());
                    *parked += 1;
                    while team.epoch.load(SeqCst) == seen {
                        parked = team.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
                    }
                    *parked -= 1;
                    break;
                }
                if waited >= SPIN_HOT {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        seen = team.epoch.load(SeqCst);
        team.refs.fetch_add(1, SeqCst);
        let p = team.job.load(SeqCst);
        if !p.is_null() {
            // SAFETY: a non-null `job` points to a live Job: its owner clears `job` and then
            // waits until `refs` is 0 before the Job goes out of scope, and this reference
            // was counted in `refs` before `job` was read.
            unsafe { (*p).work() };
        }
        team.refs.fetch_sub(1, SeqCst);
    }
}

/// Whether a job started here would run on more than one thread.
pub(crate) fn parallel() -> bool {
    rayon::current_num_threads() > 1 && rayon::current_thread_index().is_none() && !IN_HELPER.with(|h| h.get())
}

/// The number of threads a job started here runs on (1 when [`parallel`] is false).
pub(crate) fn threads() -> usize {
    if parallel() {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// Runs `f(t)` for every `t` in `0..tasks`, on the calling thread and the team's helpers
/// (see the module docs); returns when every task has run. A panic in `f` is re-raised here.
pub(crate) fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    if tasks == 0 {
        return;
    }
    if tasks == 1 || !parallel() {
        (0..tasks).for_each(f);
        return;
    }
    let team = team();
    if team.helpers == 0 {
        (0..tasks).for_each(f);
        return;
    }
    if team.busy.compare_exchange(false, true, SeqCst, SeqCst).is_err() {
        // another thread's job is running: rayon's pool, as before the team existed
        (0..tasks).into_par_iter().for_each(&f);
        return;
    }
    let job =
        Job { f: &f, tasks, next: AtomicUsize::new(0), done: AtomicUsize::new(0), panicked: AtomicBool::new(false) };
    // SAFETY (of the lifetime erasure): the pointer is cleared and every helper's reference
    // dropped (refs == 0) below, before `job` goes out of scope.
    team.job.store((&job as *const Job<'_>).cast_mut().cast::<Job<'static>>(), SeqCst);
    team.epoch.fetch_add(1, SeqCst);
    if *team.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        team.wake.notify_all();
    }
    // a task that starts a loop of its own runs it serially here, as on a helper (the team is
    // busy with this job: it would otherwise go to rayon's pool, two more threads on the cores)
    let nested = IN_HELPER.with(|h| h.replace(true));
    job.work();
    IN_HELPER.with(|h| h.set(nested));
    // the helpers' last tasks (a helper descheduled by a busy machine: yield to it)
    wait_until(|| job.done.load(SeqCst) >= tasks);
    team.job.store(std::ptr::null_mut(), SeqCst);
    wait_until(|| team.refs.load(SeqCst) == 0);
    team.busy.store(false, SeqCst);
    if job.panicked.load(SeqCst) {
        panic!("a task of a parallel kernel panicked");
    }
}

/// Runs `f(i, chunk)` over `buf` cut into chunks of `chunk` elements (the last may be
/// shorter), as [`for_each`] runs its tasks.
pub(crate) fn chunks_mut<T: Send>(buf: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if chunk == 0 || buf.is_empty() {
        return;
    }
    // the address as an integer: `buf`'s elements are `Send`, and each task gets its own chunk
    let (len, base) = (buf.len(), buf.as_mut_ptr() as usize);
    for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        // SAFETY: chunk i is elements start..min(start + chunk, len) of `buf`, which is
        // exclusively borrowed for this call; chunks are disjoint and each task gets one.
        let c = unsafe { std::slice::from_raw_parts_mut((base as *mut T).add(start), chunk.min(len - start)) };
        f(i, c)
    });
}

/// Runs `f(key, slice)` for every `(key, slice)` of `parts`, each pair one task of one job (as
/// [`for_each`] runs its tasks): any set of disjoint slices, each with what its task needs to
/// know about it (an image and row index, say).
pub(crate) fn slices_mut<K: Sync, T: Send>(parts: Vec<(K, &mut [T])>, f: impl Fn(&K, &mut [T]) + Sync) {
    // the addresses as integers: the slices are distinct exclusive borrows (so disjoint), their
    // elements are `Send`, and each task gets its own slice
    let parts: Vec<(K, usize, usize)> = parts.into_iter().map(|(k, s)| (k, s.as_mut_ptr() as usize, s.len())).collect();
    for_each(parts.len(), |i| {
        let (key, base, len) = &parts[i];
        // SAFETY: slice i was borrowed exclusively for this call (the borrow lives as long as
        // `parts`' lifetime, which covers the call) and no other task gets index i
        let s = unsafe { std::slice::from_raw_parts_mut(*base as *mut T, *len) };
        f(key, s)
    });
}

/// An empty list for [`slices_mut`] with room for `n` parts, reserved fallibly: an `Err`
/// naming `op` when the allocator refuses, not an abort.
pub(crate) fn reserve_parts<'a, K, T>(op: &str, n: usize) -> crate::error::Result<Vec<(K, &'a mut [T])>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        crate::error::Error::limit(
            op,
            format!("the allocator refused a list of {n} parallel tasks; use smaller inputs"),
        )
    })?;
    Ok(v)
}

/// Runs `f(range)` over `0..n` cut into at most `tasks` contiguous ranges of (nearly) equal
/// length, as [`for_each`] runs its tasks: for loops whose tasks want a scratch buffer each,
/// made once per range.
pub(crate) fn ranges(n: usize, tasks: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    if n == 0 {
        return;
    }
    let per = n.div_ceil(tasks.clamp(1, n));
    for_each(n.div_ceil(per), |t| f(t * per..((t + 1) * per).min(n)));
}

/// Spins until `ready()`, yielding the core between checks after the first few.
fn wait_until(ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        spins = spins.wrapping_add(1);
        if spins > 256 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many times each task ran.
    fn counts(n: usize, run: impl FnOnce(&(dyn Fn(usize) + Sync))) -> Vec<usize> {
        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        run(&|t| {
            hits[t].fetch_add(1, SeqCst);
        });
        hits.iter().map(|h| h.load(SeqCst)).collect()
    }

    #[test]
    fn every_task_runs_once() {
        for n in [0, 1, 2, 3, 5, 17, 1000] {
            for _ in 0..20 {
                let c = counts(n, |f| for_each(n, f));
                assert!(c.iter().all(|&k| k == 1), "tasks {n}: {c:?}");
            }
        }
    }

    #[test]
    fn chunks_and_ranges_cover_everything_once_with_tails() {
        for (len, chunk) in [(0, 4), (1, 4), (7, 3), (16, 4), (1001, 64), (5, 100)] {
            let mut buf = vec![0usize; len];
            chunks_mut(&mut buf, chunk, |i, c| {
                assert!(c.len() == chunk || (i + 1) * chunk >= len, "chunk {i} of {len}/{chunk}: {} long", c.len());
                for (k, v) in c.iter_mut().enumerate() {
                    *v += i * chunk + k + 1;
                }
            });
            assert!(buf.iter().enumerate().all(|(k, &v)| v == k + 1), "{len}/{chunk}: {buf:?}");
        }
        for n in [0, 1, 2, 9, 100] {
            for tasks in [0, 1, 2, 3, 4, 64, 1000] {
                let c = counts(n, |f| ranges(n, tasks, |r| r.for_each(f)));
                assert!(c.iter().all(|&k| k == 1), "ranges({n}, {tasks}): {c:?}");
            }
        }
    }

    #[test]
    fn concurrent_and_nested_callers_complete() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        // nested: the inner loop runs serially inside a task
                        let c = counts(8, |f| for_each(4, |i| (2 * i..2 * i + 2).for_each(|t| for_each(1, |_| f(t)))));
                        assert!(c.iter().all(|&k| k == 1), "{c:?}");
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_team_keeps_working() {
        let r = std::panic::catch_unwind(|| {
            for_each(8, |t| {
                if t == 5 {
                    panic!("task 5");
                }
            })
        });
        assert!(r.is_err());
        let c = counts(64, |f| for_each(64, f));
        assert!(c.iter().all(|&k| k == 1));
    }
}
