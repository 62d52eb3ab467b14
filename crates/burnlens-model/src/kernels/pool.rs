//! The kernels' own worker threads: fork-join with a short spin before sleeping.
//!
//! Why not rayon's pool: a rayon parallel region started from a thread outside the pool
//! injects a job and wakes a sleeping worker, which on the 2-core virtual machines we measure
//! on costs 30–100 µs (a cross-CPU wake-up is a hypervisor exit), while one kernel of the
//! nanoGPT-sized training step or of a decoding step takes 20–300 µs. Here the calling thread
//! takes part in the work, and helpers spin for [`SPIN`] after each job before parking (as
//! OpenMP's threads do under PyTorch), so the back-to-back kernels of a forward or backward
//! pass find them awake. The number of threads follows rayon's (`RAYON_NUM_THREADS`); called
//! from inside a one-thread rayon pool, from inside a task, or while another thread holds the
//! pool, work runs on the calling thread alone.

use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle helper keeps polling for the next job before it parks.
pub const SPIN: Duration = Duration::from_micros(300);

thread_local! {
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// A job: `f(i)` for every `i < n`. The pointer is only dereferenced while the submitting
/// call is blocked waiting for the job to finish.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Pool {
    helpers: Vec<Thread>,
    sleeping: Vec<AtomicBool>,
    generation: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
    busy_helpers: AtomicUsize,
    panicked: AtomicBool,
    submit: Mutex<()>,
}

// SAFETY: `job` is written only by the thread holding `submit`, while no helper reads it (all
// helpers finished the previous job), and read by helpers only between the generation bump
// that publishes it and their decrement of `busy_helpers`.
unsafe impl Sync for Pool {}
unsafe impl Send for Pool {}

fn noop(_: usize) {}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let n_helpers = rayon::current_num_threads().max(1) - 1;
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            helpers: Vec::new(),
            sleeping: (0..n_helpers).map(|_| AtomicBool::new(false)).collect(),
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(Job { f: &noop as &(dyn Fn(usize) + Sync), n: 0 }),
            next: AtomicUsize::new(0),
            busy_helpers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            submit: Mutex::new(()),
        }));
        let handles: Vec<Thread> = (0..n_helpers)
            .map(|k| {
                thread::Builder::new()
                    .name(format!("burnlens-kernel-{k}"))
                    .spawn(move || helper(pool, k))
                    .expect("starting a kernel thread")
                    .thread()
                    .clone()
            })
            .collect();
        // SAFETY: no helper reads `helpers`; it is set once, before any job is submitted.
        let p = pool as *const Pool as *mut Pool;
        unsafe { (*p).helpers = handles };
        pool
    })
}

fn helper(pool: &'static Pool, k: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park.
        let start = Instant::now();
        loop {
            let g = pool.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if start.elapsed() < SPIN {
                // Give the core away now and then: Burn's own rayon workers may need it.
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                thread::yield_now();
                continue;
            }
            pool.sleeping[k].store(true, Ordering::SeqCst);
            if pool.generation.load(Ordering::SeqCst) == seen {
                thread::park();
            }
            pool.sleeping[k].store(false, Ordering::SeqCst);
        }
        // SAFETY: published by the generation bump above; valid until we decrement.
        let job = unsafe { *pool.job.get() };
        IN_TASK.with(|t| t.set(true));
        let result = catch_unwind(AssertUnwindSafe(|| work(pool, job)));
        IN_TASK.with(|t| t.set(false));
        if result.is_err() {
            pool.panicked.store(true, Ordering::SeqCst);
        }
        pool.busy_helpers.fetch_sub(1, Ordering::AcqRel);
    }
}

fn work(pool: &Pool, job: Job) {
    loop {
        let i = pool.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.n {
            break;
        }
        // SAFETY: the submitter keeps `f` alive until every helper has finished this job.
        unsafe { (*job.f)(i) };
    }
}

/// Threads a kernel may use here: rayon's count (so `RAYON_NUM_THREADS` and an enclosing
/// rayon pool both apply), 1 inside a task.
pub fn threads() -> usize {
    if IN_TASK.with(|t| t.get()) { 1 } else { rayon::current_num_threads().max(1) }
}

/// Run `f(i)` for every `i < n`, spread over the kernel threads (the caller included), and
/// return when all are done. Tasks are handed out one at a time, so uneven tasks balance.
pub fn run(n: usize, f: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    let serial = || (0..n).for_each(&f);
    if n == 1 || threads() <= 1 {
        return serial();
    }
    let pool = pool();
    if pool.helpers.is_empty() {
        return serial();
    }
    let _guard = match pool.submit.try_lock() {
        Ok(g) => g,
        // A job panicked earlier; the pool itself is intact.
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        // Another thread is using the pool: do this job alone rather than wait.
        Err(std::sync::TryLockError::WouldBlock) => return serial(),
    };
    let f_ref: &(dyn Fn(usize) + Sync) = &f;
    // SAFETY: the lifetime is erased only for the duration of this call, which does not
    // return before every helper has stopped using the job (busy_helpers == 0 below).
    let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f_ref as *const (dyn Fn(usize) + Sync + '_)) };
    unsafe { *pool.job.get() = Job { f: f_static, n } };
    pool.next.store(0, Ordering::Relaxed);
    pool.busy_helpers.store(pool.helpers.len(), Ordering::Relaxed);
    pool.generation.fetch_add(1, Ordering::SeqCst);
    for (k, t) in pool.helpers.iter().enumerate() {
        if pool.sleeping[k].load(Ordering::SeqCst) {
            t.unpark();
        }
    }
    IN_TASK.with(|t| t.set(true));
    let mine = catch_unwind(AssertUnwindSafe(|| work(pool, Job { f: f_static, n })));
    IN_TASK.with(|t| t.set(false));
    while pool.busy_helpers.load(Ordering::Acquire) != 0 {
        std::hint::spin_loop();
    }
    let helper_panicked = pool.panicked.swap(false, Ordering::SeqCst);
    if let Err(p) = mine {
        std::panic::resume_unwind(p);
    }
    assert!(!helper_panicked, "a kernel task panicked on a helper thread");
}

/// A raw pointer handed to tasks that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);
// SAFETY: only used to hand disjoint parts of one buffer to tasks of one `run`.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// `f(i, chunk_i)` for the consecutive `chunk`-element pieces of `out` (the last may be
/// shorter), in parallel.
pub fn for_chunks(out: &mut [f32], chunk: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = chunk.max(1);
    let len = out.len();
    let ptr = SendPtr(out.as_mut_ptr());
    run(len.div_ceil(chunk), |i| {
        let p = ptr;
        let start = i * chunk;
        // SAFETY: chunks are disjoint and inside `out`, which outlives the call.
        f(i, unsafe { std::slice::from_raw_parts_mut(p.0.add(start), chunk.min(len - start)) })
    });
}

/// [`for_chunks`] over two outputs split in step: chunk `i` of `a` (`ca` elements each)
/// goes with chunk `i` of `b` (`cb` elements each).
pub fn for_chunks2(a: &mut [f32], ca: usize, b: &mut [f32], cb: usize, f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync) {
    let (ca, cb) = (ca.max(1), cb.max(1));
    let (la, lb) = (a.len(), b.len());
    let n = la.div_ceil(ca);
    assert!(lb.div_ceil(cb) <= n.max(1), "for_chunks2: the second output has more chunks than the first");
    let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
    run(n, |i| {
        let (pa, pb) = (pa, pb);
        let (sa, sb) = (i * ca, (i * cb).min(lb));
        // SAFETY: as in `for_chunks`, for each buffer.
        let (x, y) = unsafe {
            (std::slice::from_raw_parts_mut(pa.0.add(sa), ca.min(la - sa)), std::slice::from_raw_parts_mut(pb.0.add(sb), cb.min(lb - sb)))
        };
        f(i, x, y)
    });
}

/// Elements per task for element-wise kernels: enough that a task outweighs handing it out.
pub const GRAIN: usize = 16 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_exactly_once_also_from_many_threads_and_nested() {
        let outer: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for n in [0usize, 1, 2, 3, 17, 1000] {
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        run(n, |i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                            // Nested calls run inline.
                            run(3, |_| {});
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
                    }
                })
            })
            .collect();
        for t in outer {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_keeps_working() {
        let r = std::panic::catch_unwind(|| run(64, |i| assert!(i != 40, "task 40 fails")));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        run(64, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }
}
