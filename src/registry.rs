//! The registry of live array handles, which is also the process-wide MLX lock.
//!
//! A handle given to C is not an address: it is a token (a never-reused number) that maps to
//! an MLX array here. Looking a token up never reads through the caller's pointer, so a freed,
//! double-freed or foreign pointer is reported as `MLXK_ERR_INVALID_HANDLE`, and a token is
//! never handed out twice, so a stale handle cannot alias a newer array.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{LazyLock, Mutex, MutexGuard};

use cxx::UniquePtr;

use crate::bridge::Array;
use crate::error::{Error, Result};
use crate::handle::mlxk_array;

// SAFETY: an MLX array is a reference-counted node (atomic shared_ptr); every use of one goes
// through the lock below, so moving the owning pointer between threads is sound.
unsafe impl Send for Array {}

/// Tokens start here and step by 8: they look like aligned pointers, and sit far below any
/// address a heap or stack pointer has on the platforms MLX supports.
const FIRST_TOKEN: usize = 0x1000;
const TOKEN_STEP: usize = 8;

pub(crate) struct Mlx {
    next_token: usize,
    arrays: HashMap<usize, Entry, TokenHash>,
}

/// The registry's hash: tokens are distinct multiples of 8 handed out in order, so one odd
/// multiplication (Fibonacci hashing) spreads them over the hash's high and low bits alike.
/// std's default SipHash, built to withstand chosen keys, costs more per lookup than the
/// rest of a handle's lookup, and every call looks up each of its arguments.
#[derive(Clone, Copy, Default)]
struct TokenHash;

impl std::hash::BuildHasher for TokenHash {
    type Hasher = TokenHasher;
    fn build_hasher(&self) -> TokenHasher {
        TokenHasher(0)
    }
}

struct TokenHasher(u64);

impl std::hash::Hasher for TokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only usize keys are hashed; this keeps any other use correct.
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Capacity the table keeps when the last handle goes: a decode loop that frees every handle
/// each step then does not regrow it every step; a larger table is given back.
const KEPT_CAPACITY: usize = 64;

struct Entry {
    array: UniquePtr<Array>,
    /// Set when evaluating this array failed: MLX may then hold unfinished data for it, so
    /// every later use reports the failure again instead of reading that data.
    failure: Option<String>,
    /// A pool call's result: the `array_id` of the pool it was given (0: not one). A failed
    /// evaluation leaves the handle on the pool as given instead of failing it
    /// (docs/serving.md, "Faults").
    given_pool: usize,
    /// The other result of the same pool call (its y for the new pool, and the other way
    /// round; 0: none): a failure of one is the failure of the call, reported by both.
    step: usize,
}

static MLX: LazyLock<Mutex<Mlx>> = LazyLock::new(|| {
    // A host's graph may hold nodes whose code is in this library (lazy outputs handed over
    // with mlxk_array_to_mlx): keep the library mapped even if the host dlcloses it.
    crate::bridge::pin_library();
    // The environment's settings, read once before the first graph is built.
    crate::config::get();
    Mutex::new(Mlx {
        next_token: FIRST_TOKEN,
        arrays: HashMap::with_hasher(TokenHash),
    })
});

thread_local! {
    /// The lock a host took with mlxk_mlx_lock() on this thread, and how many times.
    static HELD: RefCell<Option<(MutexGuard<'static, Mlx>, usize)>> = const { RefCell::new(None) };
    /// Whether a `Guard::Held` of this thread is alive (calls never nest; this checks it).
    static HELD_IN_USE: Cell<bool> = const { Cell::new(false) };
}

/// Access to the registry under the MLX lock: this call's own lock, or the one the calling
/// thread holds through mlxk_mlx_lock().
pub(crate) enum Guard {
    Own(MutexGuard<'static, Mlx>),
    /// Points into the guard parked in `HELD`, which outlives this value (only
    /// mlxk_mlx_unlock, a call of its own, releases it).
    Held(NonNull<Mlx>),
}

impl Deref for Guard {
    type Target = Mlx;
    fn deref(&self) -> &Mlx {
        match self {
            Guard::Own(g) => g,
            // SAFETY: see `Guard::Held`; `HELD_IN_USE` keeps it the only reference.
            Guard::Held(p) => unsafe { p.as_ref() },
        }
    }
}

impl DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Mlx {
        match self {
            Guard::Own(g) => g,
            // SAFETY: as in `deref`.
            Guard::Held(p) => unsafe { p.as_mut() },
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Guard::Held(_) = self {
            let _ = HELD_IN_USE.try_with(|u| u.set(false));
        }
    }
}

/// Takes the process-wide MLX lock (or uses the one this thread holds through
/// mlxk_mlx_lock()). A panic caught at the C boundary may have poisoned it; the map stays
/// consistent (each operation on it is a single insert or remove), so carry on.
pub(crate) fn lock() -> Guard {
    // During thread teardown the thread-locals may be gone (a call from another thread-local's
    // destructor): such a thread holds no host lock, so it takes the lock itself.
    let held = HELD
        .try_with(|h| {
            h.borrow_mut()
                .as_mut()
                .map(|(guard, _)| NonNull::from(&mut **guard))
        })
        .ok()
        .flatten();
    match held {
        Some(p) => {
            assert!(
                !HELD_IN_USE.with(|u| u.replace(true)),
                "the MLX lock is already in use on this thread"
            );
            Guard::Held(p)
        }
        None => Guard::Own(MLX.lock().unwrap_or_else(|poisoned| poisoned.into_inner())),
    }
}

/// mlxk_mlx_lock(): the calling thread takes the MLX lock (again, if it holds it already) and
/// keeps it across calls until as many mlxk_mlx_unlock() calls.
pub(crate) fn host_lock() {
    let already = HELD.with(|h| match h.borrow_mut().as_mut() {
        Some((_, depth)) => {
            *depth += 1;
            true
        }
        None => false,
    });
    if !already {
        let guard = MLX.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        HELD.with(|h| *h.borrow_mut() = Some((guard, 1)));
    }
}

/// mlxk_mlx_unlock(): undoes one mlxk_mlx_lock() of the calling thread.
pub(crate) fn host_unlock() -> Result<()> {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        match h.as_mut() {
            Some((_, depth)) if *depth > 1 => {
                *depth -= 1;
                Ok(())
            }
            Some(_) => {
                *h = None;
                Ok(())
            }
            None => Err(Error::InvalidArgument(
                "mlxk_mlx_unlock: the calling thread does not hold the MLX lock (take it with \
                 mlxk_mlx_lock first, on the same thread)"
                    .into(),
            )),
        }
    })
}

impl Mlx {
    /// The array behind `handle`, argument `arg` of the calling function.
    pub(crate) fn get(&self, handle: *const mlxk_array, arg: &str) -> Result<&Array> {
        if handle.is_null() {
            return Err(Error::NullPointer(format!(
                "{arg} is NULL (expected an mlxk_array handle)"
            )));
        }
        let entry = self.arrays.get(&(handle as usize)).ok_or_else(|| {
            Error::InvalidHandle(format!(
                "{arg} ({handle:p}) is not a live mlxk_array handle (freed, or never made by \
                 this library)"
            ))
        })?;
        if let Some(failure) = &entry.failure {
            return Err(Error::Backend(format!(
                "{arg}: computing this array failed earlier, its contents are undefined ({failure})"
            )));
        }
        entry
            .array
            .as_ref()
            .ok_or_else(|| Error::InvalidHandle(format!("{arg} is empty")))
    }

    /// An optional argument: NULL is `None`, anything else must be live.
    pub(crate) fn get_opt(&self, handle: *const mlxk_array, arg: &str) -> Result<Option<&Array>> {
        if handle.is_null() {
            Ok(None)
        } else {
            self.get(handle, arg).map(Some)
        }
    }

    /// Registers a new array and returns its handle.
    pub(crate) fn insert(&mut self, array: UniquePtr<Array>) -> *mut mlxk_array {
        let token = self.next_token;
        self.next_token += TOKEN_STEP;
        self.arrays.insert(
            token,
            Entry {
                array,
                failure: None,
                given_pool: 0,
                step: 0,
            },
        );
        token as *mut mlxk_array
    }

    /// Registers the results of a pool call that writes states: its y (None: the replay has
    /// none) and the new pool, made from the pool whose `array_id` is `given`. Returns their
    /// handles.
    pub(crate) fn insert_pool_step(
        &mut self,
        y: Option<UniquePtr<Array>>,
        pool: UniquePtr<Array>,
        given: usize,
    ) -> (Option<*mut mlxk_array>, *mut mlxk_array) {
        let y = y.map(|y| self.insert(y));
        let pool = self.insert(pool);
        let step = |h: Option<*mut mlxk_array>| h.map_or(0, |h| h as usize);
        if let Some(entry) = self.arrays.get_mut(&(pool as usize)) {
            entry.given_pool = given;
            entry.step = step(y);
        }
        if let Some(y) = y {
            if let Some(entry) = self.arrays.get_mut(&(y as usize)) {
                entry.step = pool as usize;
            }
        }
        (y, pool)
    }

    /// Drops the array behind `handle`.
    pub(crate) fn remove(&mut self, handle: *mut mlxk_array, arg: &str) -> Result<()> {
        match self.arrays.remove(&(handle as usize)) {
            Some(array) => {
                drop(array);
                if self.arrays.is_empty() && self.arrays.capacity() > KEPT_CAPACITY {
                    // Give a large table back when the last handle goes.
                    self.arrays.shrink_to(KEPT_CAPACITY);
                }
                Ok(())
            }
            None => Err(Error::InvalidHandle(format!(
                "{arg} ({handle:p}) is not a live mlxk_array handle (already freed, or never made \
                 by this library)"
            ))),
        }
    }

    /// Records that evaluating `handle` failed with `error`: the handle reports the failure
    /// from now on, unless it is a pool call's new pool, which then holds the pool as given.
    /// The other result of the same pool call follows.
    pub(crate) fn mark_failed(&mut self, handle: *const mlxk_array, error: &Error) {
        let step = self.fail_one(handle as usize, error);
        if step != 0 {
            self.fail_one(step, error);
        }
    }

    /// `mark_failed` for one handle; returns the other result of its pool call (0: none).
    fn fail_one(&mut self, token: usize, error: &Error) -> usize {
        let Some(entry) = self.arrays.get_mut(&token) else {
            return 0;
        };
        let step = std::mem::take(&mut entry.step);
        // A panic inside a kernel (a defect) may have stopped it halfway: its outputs are
        // undefined, a new pool included.
        let restored = entry.given_pool != 0 && !matches!(error, Error::Panic(_));
        match (&entry.array.as_ref(), restored) {
            (Some(array), true) => {
                entry.array = crate::bridge::array_as_given(array, entry.given_pool);
                entry.given_pool = 0;
            }
            _ => entry.failure = Some(error.to_string()),
        }
        step
    }

    /// Number of live handles (tests use it to find leaks).
    pub(crate) fn live(&self) -> usize {
        self.arrays.len()
    }
}
