//! The kernels' own worker threads: fork-join with a short spin before sleeping, robust to
//! a busy machine.
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
//!
//! When other processes compete for the cores, a helper may not run for milliseconds. Three
//! rules keep the caller from waiting for it:
//! - **Tasks are claimed, not assigned**: the caller takes every task no helper has started.
//! - **A helper joins a job only by claiming its seat** (`OFFERED → RUNNING`); once the caller
//!   has run out of tasks it takes back the seats still on offer (`OFFERED → IDLE`), so it
//!   waits only for helpers that are inside a task, never for one that has not started.
//! - **Late helpers send the pool serial for a while**: when, in [`LATE_IN_WINDOW`] of the
//!   last [`WINDOW`] jobs a helper took part in, the caller waited more than [`LATE`] (and
//!   longer than its own share took) for a helper to finish, [`threads`] answers 1 for a
//!   back-off period (10 ms, doubling while the next try is late again, at most 1 s), so
//!   kernels stop splitting work at all; the first job after it probes again. (Counting over
//!   a window rather than a streak: a quiet virtual machine has a late job now and then, 1 to
//!   9 in the ~600 jobs of a `burnlens bench gemm` run on the 2-vCPU machines we measure on,
//!   and two in a row were enough to send the pool serial; a busy neighbour makes most jobs
//!   late, so the window still fills at once there.)

use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle helper keeps polling for the next job before it parks.
pub const SPIN: Duration = Duration::from_micros(300);
/// A wait for a helper longer than this (and than the caller's own share) counts as late.
pub const LATE: Duration = Duration::from_micros(1000);
/// The first serial period after a late helper; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Late jobs among the last [`WINDOW`] that a helper took part in that make the pool serial.
const LATE_IN_WINDOW: u32 = 3;
const WINDOW: u32 = 8;

thread_local! {
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// A job: `f(i)` for every `i < n`. The pointer is only dereferenced by the caller and by
/// helpers holding a `RUNNING` seat, all before the submitting call returns.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

/// A helper's seat in the current job.
const IDLE: u8 = 0;
const OFFERED: u8 = 1;
const RUNNING: u8 = 2;

struct Pool {
    helpers: Vec<Thread>,
    sleeping: Vec<AtomicBool>,
    seats: Vec<AtomicU8>,
    generation: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
    panicked: AtomicBool,
    submit: Mutex<()>,
    /// Contention state: serial until this many ns after `epoch`; the current back-off.
    epoch: Instant,
    serial_until_ns: AtomicU64,
    backoff_ns: AtomicU64,
    /// One bit per recent job a helper took part in, newest lowest: 1 if it was late.
    late_history: AtomicU32,
    /// Counters for tests and the bench: jobs whose helper came late, seats taken back.
    late_jobs: AtomicU64,
    revoked: AtomicU64,
}

// SAFETY: `job` is written only by the thread holding `submit`, while no seat is OFFERED or
// RUNNING (the previous job's helpers all finished or were turned away), and read by a helper
// only after it turned its seat from OFFERED to RUNNING, which the caller waits out.
unsafe impl Sync for Pool {}
unsafe impl Send for Pool {}

fn noop(_: usize) {}

/// The pool, started by the first job that needs it (so [`threads`] never starts it).
static POOL: OnceLock<&'static Pool> = OnceLock::new();

fn start_pool() -> &'static Pool {
    let n_helpers = rayon::current_num_threads().max(1) - 1;
    let pool: &'static Pool = Box::leak(Box::new(Pool {
        helpers: Vec::new(),
        sleeping: (0..n_helpers).map(|_| AtomicBool::new(false)).collect(),
        seats: (0..n_helpers).map(|_| AtomicU8::new(IDLE)).collect(),
        generation: AtomicU64::new(0),
        job: UnsafeCell::new(Job { f: &noop as &(dyn Fn(usize) + Sync), n: 0 }),
        next: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        submit: Mutex::new(()),
        epoch: Instant::now(),
        serial_until_ns: AtomicU64::new(0),
        backoff_ns: AtomicU64::new(BACKOFF_MIN.as_nanos() as u64),
        late_history: AtomicU32::new(0),
        late_jobs: AtomicU64::new(0),
        revoked: AtomicU64::new(0),
    }));
    let handles: Vec<Thread> = (0..n_helpers)
        .map(|k| thread::Builder::new().name(format!("burnlens-kernel-{k}")).spawn(move || helper(pool, k)).expect("starting a kernel thread").thread().clone())
        .collect();
    // SAFETY: no helper reads `helpers`; it is set once, before any job is submitted.
    let p = pool as *const Pool as *mut Pool;
    unsafe { (*p).helpers = handles };
    pool
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
        // Join only if the seat is still on offer: the caller may have finished without us.
        if pool.seats[k].compare_exchange(OFFERED, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            continue;
        }
        // SAFETY: published before the seat was offered; valid until we leave the seat.
        let job = unsafe { *pool.job.get() };
        IN_TASK.with(|t| t.set(true));
        let result = catch_unwind(AssertUnwindSafe(|| work(pool, job)));
        IN_TASK.with(|t| t.set(false));
        if result.is_err() {
            pool.panicked.store(true, Ordering::SeqCst);
        }
        pool.seats[k].store(IDLE, Ordering::Release);
    }
}

fn work(pool: &Pool, job: Job) {
    loop {
        let i = pool.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.n {
            break;
        }
        // SAFETY: the submitter keeps `f` alive until every helper has left its seat.
        unsafe { (*job.f)(i) };
    }
}

impl Pool {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn serial_now(&self) -> bool {
        self.now_ns() < self.serial_until_ns.load(Ordering::Relaxed)
    }

    /// After a job that a helper took part in: a late one with [`LATE_IN_WINDOW`] late jobs
    /// among the last [`WINDOW`] starts (or lengthens) a serial period; an on-time one resets
    /// the back-off. (A late job alone happens on a quiet machine too: an interrupt, the
    /// hypervisor.)
    fn judge(&self, own: Duration, waited: Duration) {
        let late = waited > LATE && waited > own;
        let history = ((self.late_history.load(Ordering::Relaxed) << 1) | u32::from(late)) & ((1 << WINDOW) - 1);
        self.late_history.store(history, Ordering::Relaxed);
        if late {
            self.late_jobs.fetch_add(1, Ordering::Relaxed);
            if history.count_ones() >= LATE_IN_WINDOW {
                let backoff = self.backoff_ns.load(Ordering::Relaxed);
                self.serial_until_ns.store(self.now_ns() + backoff, Ordering::Relaxed);
                self.backoff_ns.store((backoff * 2).min(BACKOFF_MAX.as_nanos() as u64), Ordering::Relaxed);
            }
        } else {
            self.backoff_ns.store(BACKOFF_MIN.as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// Threads a kernel may use here: rayon's count (so `RAYON_NUM_THREADS` and an enclosing
/// rayon pool both apply), 1 inside a task and while the pool is serial after late helpers.
pub fn threads() -> usize {
    if IN_TASK.with(|t| t.get()) {
        return 1;
    }
    let n = rayon::current_num_threads().max(1);
    if n > 1
        && let Some(p) = POOL.get()
        && p.serial_now()
    {
        return 1;
    }
    n
}

/// How the pool has fared: jobs whose helper came late, seats taken back from helpers that
/// had not started, and whether it is serial now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub late_jobs: u64,
    pub revoked_seats: u64,
    pub serial_now: bool,
    /// Late jobs among the last [`WINDOW`] a helper took part in.
    pub late_in_window: u32,
}

pub fn stats() -> PoolStats {
    match POOL.get() {
        None => PoolStats::default(),
        Some(p) => PoolStats {
            late_jobs: p.late_jobs.load(Ordering::Relaxed),
            revoked_seats: p.revoked.load(Ordering::Relaxed),
            serial_now: p.serial_now(),
            late_in_window: p.late_history.load(Ordering::Relaxed).count_ones(),
        },
    }
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
    let pool = *POOL.get_or_init(start_pool);
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
    // return before every helper that took a seat has left it (the wait below).
    let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f_ref as *const (dyn Fn(usize) + Sync + '_)) };
    unsafe { *pool.job.get() = Job { f: f_static, n } };
    pool.next.store(0, Ordering::Relaxed);
    for seat in &pool.seats {
        seat.store(OFFERED, Ordering::Release);
    }
    pool.generation.fetch_add(1, Ordering::SeqCst);
    for (k, t) in pool.helpers.iter().enumerate() {
        if pool.sleeping[k].load(Ordering::SeqCst) {
            t.unpark();
        }
    }
    let start = Instant::now();
    IN_TASK.with(|t| t.set(true));
    let mine = catch_unwind(AssertUnwindSafe(|| work(pool, Job { f: f_static, n })));
    IN_TASK.with(|t| t.set(false));
    let own_done = Instant::now();
    // No task is left to claim: turn away helpers that have not started, wait for the rest.
    let mut joined = false;
    for seat in &pool.seats {
        if seat.compare_exchange(OFFERED, IDLE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            pool.revoked.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        joined = true;
        let mut spins = 0u32;
        while seat.load(Ordering::Acquire) == RUNNING {
            spins += 1;
            if spins < 2048 {
                std::hint::spin_loop();
            } else {
                // The helper may be waiting for this core: let it have it.
                thread::yield_now();
            }
        }
    }
    if joined {
        pool.judge(own_done - start, own_done.elapsed());
    }
    let helper_panicked = pool.panicked.swap(false, Ordering::SeqCst);
    if let Err(p) = mine {
        std::panic::resume_unwind(p);
    }
    assert!(!helper_panicked, "a kernel task panicked on a helper thread");
}

/// A raw pointer handed to tasks that write disjoint parts of one buffer.
pub(crate) struct SendPtr<T = f32>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used to hand disjoint parts of one buffer to tasks of one `run`.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

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
        let (x, y) = unsafe { (std::slice::from_raw_parts_mut(pa.0.add(sa), ca.min(la - sa)), std::slice::from_raw_parts_mut(pb.0.add(sb), cb.min(lb - sb))) };
        f(i, x, y)
    });
}

/// [`for_chunks`] over `N` buffers of one length split in step: `f(i, [chunk i of each])`.
pub fn for_chunks_n<const N: usize>(bufs: [&mut [f32]; N], chunk: usize, f: impl Fn(usize, [&mut [f32]; N]) + Sync) {
    let chunk = chunk.max(1);
    let len = bufs.first().map_or(0, |b| b.len());
    assert!(bufs.iter().all(|b| b.len() == len), "for_chunks_n: the buffers differ in length");
    let ptrs = bufs.map(|b| SendPtr(b.as_mut_ptr()));
    run(len.div_ceil(chunk), |i| {
        let ptrs = ptrs;
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: as in `for_chunks`, for each buffer (distinct `&mut` borrows, so disjoint).
        f(i, ptrs.map(|p| unsafe { std::slice::from_raw_parts_mut(p.0.add(start), n) }))
    });
}

/// Elements per task for element-wise kernels: enough that a task outweighs handing it out.
pub const GRAIN: usize = 16 * 1024;

/// Whole rows of `width` elements per task of a row-wise kernel: about [`GRAIN`] elements,
/// at least one row.
pub fn rows_per_task(width: usize) -> usize {
    (GRAIN / width.max(1)).max(1)
}

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

    /// A helper that stalls inside a task (as one descheduled by a busy neighbour does) makes
    /// the job late; the pool then runs serial for a while and comes back afterwards.
    #[test]
    fn a_late_helper_sends_the_pool_serial_for_a_while() {
        if rayon::current_num_threads() < 2 {
            // One thread: nothing runs in parallel, so nothing can be late.
            assert_eq!(threads(), 1);
            return;
        }
        let on_helper = || thread::current().name().is_some_and(|n| n.starts_with("burnlens-kernel"));
        // Wait out a serial period another test may have started.
        while threads() == 1 {
            thread::sleep(Duration::from_millis(2));
        }
        let before = stats().late_jobs;
        let mut tries = 0;
        while !stats().serial_now {
            tries += 1;
            assert!(tries <= 50, "no helper ever took a task of a 256-task job");
            run(256, |_| {
                if on_helper() {
                    thread::sleep(Duration::from_millis(30));
                } else {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(20) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        // Late jobs of earlier tests may still be in the window: the rule is about the window,
        // and this test's own late helper is what tipped it.
        assert!(stats().late_jobs > before, "serial without a late job of this test");
        assert!(stats().late_in_window >= LATE_IN_WINDOW, "serial with only {} late jobs in the window", stats().late_in_window);
        assert_eq!(threads(), 1, "serial right after a late helper");
        assert!(stats().serial_now);
        // Serial jobs still run every task, on the caller.
        let count = AtomicUsize::new(0);
        run(100, |_| {
            assert!(!on_helper());
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 100);
        // Back to parallel once the back-off has passed without new late jobs (other tests
        // running kernels at the same time may add late jobs of their own: each restarts the
        // clock).
        let (mut t, mut late) = (Instant::now(), stats().late_jobs);
        let start = Instant::now();
        while threads() == 1 {
            if stats().late_jobs != late {
                (t, late) = (Instant::now(), stats().late_jobs);
            }
            assert!(t.elapsed() < BACKOFF_MAX + Duration::from_millis(500), "the pool stayed serial with no new late job");
            assert!(start.elapsed() < Duration::from_secs(60), "the pool never came back from serial");
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// A caller that finishes every task before the helper wakes does not wait for it.
    #[test]
    fn the_caller_does_not_wait_for_a_helper_that_has_not_started() {
        if rayon::current_num_threads() < 2 {
            assert_eq!(threads(), 1);
            return;
        }
        run(2, |_| {}); // start the pool
        let before = stats().revoked_seats;
        // Bounded in time, not tries: another test's late jobs may have sent the pool serial
        // for up to BACKOFF_MAX, when no seat is offered at all (100 tries of ~1 ms failed
        // once that way).
        let start = std::time::Instant::now();
        while stats().revoked_seats == before {
            assert!(start.elapsed() < BACKOFF_MAX * 3, "the helper always joined a job of two empty tasks");
            // Let the helper park (past its spin), so that waking it takes longer than the job.
            thread::sleep(SPIN * 4);
            let count = AtomicUsize::new(0);
            run(2, |_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 2);
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
