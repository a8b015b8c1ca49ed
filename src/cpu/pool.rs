//! A small persistent worker pool for the CPU kernels: the calling thread (MLX's stream
//! thread) and `workers` helpers take jobs from one counter. Helpers spin briefly between
//! kernels (a decode step is tens of microseconds), yielding the core while they wait, and then
//! park. Also what the kernels split their work with: `jobs` sizes the jobs, `SharedMut`
//! carries an output to them.
//!
//! On a machine whose cores are shared, a helper descheduled in the middle of a job makes the
//! caller wait for it: after such a stalled batch the next `SOLO_BATCHES` batches run on the
//! calling thread alone, then the helpers are tried again.
//!
//! A batch never waits for a helper that has not started: the caller takes jobs itself and
//! returns as soon as every job is done, whoever ran it. On a shared machine a helper may be
//! descheduled for milliseconds; the caller then does its share instead of waiting for it to
//! wake. A helper that arrives late finds the batch closed and claims nothing (the job counter
//! carries the batch number, so a stale claim can never take a job of a later batch).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How long an idle helper spins (yielding the core between looks) before parking.
const SPIN: Duration = Duration::from_micros(200);

/// A batch whose caller, done with its own share, still waited this long (and longer than its
/// share took) for a helper's job: the helper was descheduled mid-job, the cores are shared.
const STALL: Duration = Duration::from_micros(300);

/// Batches run on the calling thread alone after a stalled one, before helpers are tried again.
const SOLO_BATCHES: u32 = 128;

/// Batches left to run on the calling thread alone (see `STALL`).
static SOLO: AtomicU32 = AtomicU32::new(0);

type Job = dyn Fn(usize) + Sync;

/// The published batch closure. Its true lifetime is `run`'s borrow. A helper calls it only
/// for a job it claimed in this batch, and `run` returns only after every job of the batch has
/// finished, so no call outlives the borrow.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the closure is `Sync`, and the pointer is only dereferenced for claimed jobs, which
// finish before `run` returns.
unsafe impl Send for JobPtr {}

/// The batch a helper joins: its number, closure and size.
#[derive(Clone, Copy)]
struct Batch {
    number: u32,
    job: JobPtr,
    count: usize,
}

struct Shared {
    /// Incremented for every batch; helpers wait for it to change.
    epoch: AtomicU64,
    /// The open batch (None once closed).
    batch: Mutex<Option<Batch>>,
    /// The next job to claim: batch number in the high 32 bits, job index in the low 32.
    next: AtomicU64,
    /// Jobs of the open batch that have finished.
    done: AtomicUsize,
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
    if let Some(n) = crate::config::get().num_threads {
        return n;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
}

static POOL: LazyLock<Pool> = LazyLock::new(|| {
    let shared: &'static Shared = Box::leak(Box::new(Shared {
        epoch: AtomicU64::new(0),
        batch: Mutex::new(None),
        next: AtomicU64::new(0),
        done: AtomicUsize::new(0),
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

/// Claims the next job of batch `number` (of `count` jobs), if any is left.
fn claim(shared: &Shared, number: u32, count: usize) -> Option<usize> {
    let mut next = shared.next.load(Ordering::Acquire);
    loop {
        let (batch, index) = ((next >> 32) as u32, (next & 0xFFFF_FFFF) as usize);
        if batch != number || index >= count {
            return None;
        }
        match shared
            .next
            .compare_exchange_weak(next, next + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(index),
            Err(now) => next = now,
        }
    }
}

/// Runs claimed jobs of one batch until none is left.
fn take_jobs(shared: &Shared, number: u32, count: usize, job: &(dyn Fn(usize) + Sync + '_)) {
    while let Some(i) = claim(shared, number, count) {
        if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
            shared.panicked.store(true, Ordering::Release);
        }
        shared.done.fetch_add(1, Ordering::AcqRel);
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
                // Waiting costs a core that a competing process (or the batch's caller, when
                // the machine is shared) may need: give it up between looks.
                std::thread::yield_now();
            }
            epoch = shared.epoch.load(Ordering::Acquire);
        }
        seen = epoch;
        let batch = *shared.batch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Batch { number, job, count }) = batch {
            // SAFETY: only claimed jobs call the closure, and `run` waits for all of them.
            take_jobs(shared, number, count, unsafe { &*job.0 });
        }
    }
}

/// Runs `job(0..count)` across the pool and the calling thread; returns when all are done.
/// A panic in any job is re-raised here (after every job has finished).
pub fn run(count: usize, job: &(dyn Fn(usize) + Sync)) {
    let pool = &*POOL;
    // After a stalled batch the next few run on this thread alone: on a machine whose cores
    // are taken by other processes a helper's job can wait a whole time slice, longer than
    // the work it saves; every SOLO_BATCHES batches the helpers are tried again.
    let solo = SOLO
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok();
    if count <= 1 || pool.workers == 0 || solo {
        for i in 0..count {
            job(i);
        }
        return;
    }
    assert!(count <= u32::MAX as usize, "too many jobs in one batch");
    let _batch = pool.batch.lock().unwrap_or_else(|e| e.into_inner());
    let shared = pool.shared;
    // SAFETY: erases the closure's lifetime for the helpers; see `JobPtr`.
    let raw = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job) };
    let epoch = shared.epoch.load(Ordering::Acquire) + 1;
    let number = epoch as u32;
    shared.done.store(0, Ordering::Release);
    shared.panicked.store(false, Ordering::Release);
    *shared.batch.lock().unwrap_or_else(|e| e.into_inner()) = Some(Batch {
        number,
        job: JobPtr(raw),
        count,
    });
    shared.next.store((number as u64) << 32, Ordering::Release);
    shared.epoch.store(epoch, Ordering::Release);
    if *shared.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        shared.wake.notify_all();
    }
    let started = Instant::now();
    take_jobs(shared, number, count, job);
    // Only jobs a helper is running now remain; wait for those, not for helpers to show up.
    let own_share = started.elapsed();
    let start = Instant::now();
    while shared.done.load(Ordering::Acquire) != count {
        if start.elapsed() > SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let waited = start.elapsed();
    if waited > STALL && waited > own_share {
        SOLO.store(SOLO_BATCHES, Ordering::Release);
    }
    *shared.batch.lock().unwrap_or_else(|e| e.into_inner()) = None;
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
