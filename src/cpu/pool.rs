//! A small persistent worker pool for the CPU kernels: the calling thread (MLX's stream
//! thread) and `workers` helpers take jobs from one atomic counter. Helpers spin briefly
//! between kernels (a decode step is tens of microseconds) and then park. Also what the kernels
//! split their work with: `jobs` sizes the jobs, `SharedMut` carries an output to them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How long an idle helper spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type Job = dyn Fn(usize) + Sync;

/// The published batch closure. Its true lifetime is `run`'s borrow; `run` waits for every
/// helper to finish before returning, so helpers never use it afterwards.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the closure is `Sync`, and the pointer is only dereferenced while `run` is live.
unsafe impl Send for JobPtr {}

struct Shared {
    /// Incremented for every batch; helpers wait for it to change.
    epoch: AtomicU64,
    /// The batch: a pointer to the caller's closure (valid until `pending` reaches 0).
    job: Mutex<Option<JobPtr>>,
    next: AtomicUsize,
    count: AtomicUsize,
    pending: AtomicUsize,
    panicked: AtomicBool,
    parked: Mutex<usize>,
    wake: Condvar,
}

pub struct Pool {
    shared: &'static Shared,
    workers: usize,
    /// One batch at a time (kernels run on MLX's stream threads).
    batch: Mutex<()>,
}

fn threads_wanted() -> usize {
    if let Some(n) = std::env::var("MLXK_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        return n.clamp(1, 64);
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
}

static POOL: LazyLock<Pool> = LazyLock::new(|| {
    let shared: &'static Shared = Box::leak(Box::new(Shared {
        epoch: AtomicU64::new(0),
        job: Mutex::new(None),
        next: AtomicUsize::new(0),
        count: AtomicUsize::new(0),
        pending: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        parked: Mutex::new(0),
        wake: Condvar::new(),
    }));
    let mut workers = 0;
    for i in 1..threads_wanted() {
        let spawned = std::thread::Builder::new()
            .name(format!("mlxkern-cpu-{i}"))
            .spawn(move || worker(shared));
        if spawned.is_ok() {
            workers += 1;
        }
    }
    Pool {
        shared,
        workers,
        batch: Mutex::new(()),
    }
});

fn take_jobs(shared: &Shared, job: &(dyn Fn(usize) + Sync + '_)) {
    loop {
        let i = shared.next.fetch_add(1, Ordering::AcqRel);
        if i >= shared.count.load(Ordering::Acquire) {
            break;
        }
        if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
            shared.panicked.store(true, Ordering::Release);
        }
    }
}

fn worker(shared: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut epoch = shared.epoch.load(Ordering::Acquire);
        while epoch == seen {
            if start.elapsed() > SPIN {
                let mut parked = shared.parked.lock().unwrap_or_else(|e| e.into_inner());
                *parked += 1;
                while shared.epoch.load(Ordering::Acquire) == seen {
                    parked = shared.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
                }
                *parked -= 1;
            } else {
                std::hint::spin_loop();
            }
            epoch = shared.epoch.load(Ordering::Acquire);
        }
        seen = epoch;
        let batch = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(JobPtr(job)) = batch {
            // SAFETY: published by `run`, which waits for `pending` to reach zero before the
            // closure goes out of scope.
            take_jobs(shared, unsafe { &*job });
        }
        shared.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `job(0..count)` across the pool and the calling thread; returns when all are done.
/// A panic in any job is re-raised here (after every job has finished).
pub fn run(count: usize, job: &(dyn Fn(usize) + Sync)) {
    let pool = &*POOL;
    if count <= 1 || pool.workers == 0 {
        for i in 0..count {
            job(i);
        }
        return;
    }
    let _batch = pool.batch.lock().unwrap_or_else(|e| e.into_inner());
    let shared = pool.shared;
    // SAFETY: erases the closure's lifetime for the helpers; we wait for them below.
    let raw = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job) };
    *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(raw));
    shared.next.store(0, Ordering::Release);
    shared.count.store(count, Ordering::Release);
    shared.panicked.store(false, Ordering::Release);
    shared.pending.store(pool.workers, Ordering::Release);
    shared.epoch.fetch_add(1, Ordering::AcqRel);
    if *shared.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        shared.wake.notify_all();
    }
    take_jobs(shared, job);
    while shared.pending.load(Ordering::Acquire) != 0 {
        std::hint::spin_loop();
    }
    *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    if shared.panicked.load(Ordering::Acquire) {
        panic!("a CPU kernel job panicked");
    }
}

/// Threads a batch uses (the caller plus helpers).
pub fn threads() -> usize {
    POOL.workers + 1
}

/// Splits `units` items into jobs of about `min_work` work each (`work_per_unit` per item):
/// returns (jobs, items per job).
pub fn jobs(units: usize, work_per_unit: usize, min_work: usize) -> (usize, usize) {
    if units == 0 {
        return (0, 1);
    }
    let total = units.saturating_mul(work_per_unit.max(1));
    let jobs = (total / min_work.max(1)).clamp(1, units);
    let per_job = units.div_ceil(jobs);
    (units.div_ceil(per_job), per_job)
}

/// A raw output pointer shared by the jobs of one call, each writing a disjoint part.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(pub *mut T);
// SAFETY: jobs write disjoint elements; the pool joins before the buffer's borrow ends.
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}
