//! [`Array`]: an MLX array owned by Rust code, and [`Element`], the Rust types its elements
//! can be read and written as.

use std::fmt;
use std::sync::{Arc, OnceLock};

use cxx::UniquePtr;
use half::{bf16, f16};

use super::{call, locked};
use crate::bridge;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::ops::array as ops;

/// An MLX array: the inputs and the results of every kernel.
///
/// An `Array` owns its MLX array and releases it when dropped. Kernels are lazy: their results
/// are graph nodes, computed by [`eval`](Array::eval) or by a read
/// ([`to_vec`](Array::to_vec), [`to_bytes`](Array::to_bytes)), and an error raised by the
/// computation is reported there. Once computing an array has failed, every later use of it
/// reports that failure again (MLX may hold unfinished data for it); a pool call's new pool
/// instead holds the pool the call was given ([`PoolSlots`](crate::PoolSlots), "Faults").
///
/// # Threads
///
/// `Array` is `Send` and `Sync`. MLX is not safe for graph building on several threads at
/// once, so every operation on an `Array` (construction, inspection, kernels, evaluation,
/// reads and drop) takes the library's process-wide MLX lock, the lock the C ABI takes too:
/// calls from several threads are correct, and they run one at a time. A program that also
/// uses MLX directly on other threads holds [`MlxLock`](crate::MlxLock) around that work.
///
/// # Decode loops
///
/// Replace the state with the new one before evaluating it (`state = update.state;` drops the
/// old array): when nothing else holds the old state, the CPU kernel writes the new state into
/// its buffer instead of allocating a new one.
pub struct Array {
    raw: UniquePtr<bridge::Array>,
    /// Set when computing this array failed (the message of that failure).
    failure: OnceLock<String>,
    /// A pool call's result: what the call's results share, and whether this is the new pool.
    step: Option<(Arc<PoolStep>, bool)>,
    /// The new pool once its call failed: the pool as given (`ops::array::as_given`).
    as_given: OnceLock<UniquePtr<bridge::Array>>,
}

/// What the results of one pool call share (docs/serving.md, "Faults"): a failed evaluation
/// of either fails the call; its `y` then reports the failure and its new pool holds the pool
/// it was given.
struct PoolStep {
    /// The id of the pool the call was given (`ops::array::id`).
    given: usize,
    /// The failure's message, and whether a kernel panicked (a defect: the new pool is then
    /// undefined too).
    failure: OnceLock<(String, bool)>,
}

// SAFETY: an MLX array is a reference-counted node (atomic shared_ptr). Every access to the
// one behind an `Array` (reads of its metadata included) and its release happen under the
// process-wide MLX lock (`registry::lock`), so moving an `Array` to another thread or sharing
// `&Array` between threads never lets two threads touch MLX at once. `failure` is a OnceLock.
unsafe impl Send for Array {}
// SAFETY: as for Send.
unsafe impl Sync for Array {}

impl Drop for Array {
    fn drop(&mut self) {
        let as_given = self.as_given.take();
        if self.raw.is_null() && as_given.is_none() {
            return;
        }
        let raw = std::mem::replace(&mut self.raw, UniquePtr::null());
        let _mlx = crate::registry::lock();
        drop(raw);
        drop(as_given);
    }
}

impl Array {
    /// Wraps a new MLX array (made under the lock; wrapping takes no lock).
    pub(crate) fn wrap(raw: UniquePtr<bridge::Array>) -> Array {
        Array {
            raw,
            failure: OnceLock::new(),
            step: None,
            as_given: OnceLock::new(),
        }
    }

    /// Wraps the results of a pool call that writes states: its y (None: the replay has none)
    /// and the new pool, made from the pool whose id is `given`.
    pub(crate) fn pool_step(
        y: Option<UniquePtr<bridge::Array>>,
        pool: UniquePtr<bridge::Array>,
        given: usize,
    ) -> (Option<Array>, Array) {
        let step = Arc::new(PoolStep {
            given,
            failure: OnceLock::new(),
        });
        let with = |raw, is_pool| Array {
            raw,
            failure: OnceLock::new(),
            step: Some((Arc::clone(&step), is_pool)),
            as_given: OnceLock::new(),
        };
        (y.map(|y| with(y, false)), with(pool, true))
    }

    /// The MLX array, as argument `arg` of the calling function: the same checks and message as
    /// a C handle's lookup (an array whose computation failed is refused). Call under the lock.
    pub(crate) fn get(&self, arg: &str) -> Result<&bridge::Array> {
        let failed = |failure: &str| {
            Err(Error::Backend(format!(
                "{arg}: computing this array failed earlier, its contents are undefined ({failure})"
            )))
        };
        if let Some(failure) = self.failure.get() {
            return failed(failure);
        }
        let raw = self
            .raw
            .as_ref()
            .ok_or_else(|| Error::InvalidHandle(format!("{arg} is empty")))?;
        match &self.step {
            Some((step, is_pool)) => match step.failure.get() {
                None => Ok(raw),
                Some((failure, panicked)) if !is_pool || *panicked => failed(failure),
                Some(_) => Ok(self.as_given.get_or_init(|| ops::as_given(raw, step.given))),
            },
            None => Ok(raw),
        }
    }

    /// Records that computing this array failed with `error` (for a pool call's result, that
    /// the call failed, once).
    fn mark_failed(&self, error: &Error) {
        match &self.step {
            Some((step, _)) if step.failure.get().is_none() => {
                let _ = step
                    .failure
                    .set((error.to_string(), matches!(error, Error::Panic(_))));
            }
            _ => {
                let _ = self.failure.set(error.to_string());
            }
        }
    }

    /// Makes an array of `shape` holding a copy of `data` (row-major), with `T`'s dtype.
    ///
    /// ```
    /// # fn main() -> mlxkern::Result<()> {
    /// let a = mlxkern::Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// assert_eq!(a.shape()?, [2, 3]);
    /// assert_eq!(a.dtype()?, mlxkern::Dtype::Float32);
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: [`Error::Shape`] (`data` holds a number of elements other than the shape's
    /// product, more than 16 dimensions), [`Error::InvalidArgument`] (more than 2^31-1
    /// elements), [`Error::OutOfMemory`] (above the [memory limit](crate::set_memory_limit)).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Array> {
        let dims = shape_arg(shape)?;
        let count = memory::element_count(&dims64(&dims), "shape")?;
        if count != data.len() as u64 {
            return Err(Error::Shape(format!(
                "data: {} elements for shape {shape:?}, which holds {count}",
                data.len()
            )));
        }
        Array::from_bytes(T::as_bytes(data), shape, T::DTYPE)
    }

    /// Makes an array of `shape` and `dtype` from its row-major elements as bytes (in the
    /// machine's byte order; bool elements are bytes holding 0 or 1).
    ///
    /// Errors: as [`from_slice`](Array::from_slice); [`Error::InvalidArgument`] also for a bool
    /// byte other than 0 and 1, [`Error::Shape`] for a byte count other than the shape's.
    pub fn from_bytes(bytes: &[u8], shape: &[usize], dtype: Dtype) -> Result<Array> {
        call(|| {
            let dims = shape_arg(shape)?;
            let nbytes = ops::check_new("shape", &dims, dtype)?;
            if bytes.len() != nbytes {
                return Err(Error::Shape(format!(
                    "data: {} bytes for shape {shape:?} of {}, which holds {nbytes}",
                    bytes.len(),
                    dtype.name()
                )));
            }
            if dtype == Dtype::Bool {
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(Error::InvalidArgument(format!(
                        "data: bool element {i} holds byte {} (expected 0 or 1)",
                        bytes[i]
                    )));
                }
            }
            locked(|| ops::from_bytes(bytes, &dims, dtype)).map(Array::wrap)
        })
    }

    /// Makes an array of `shape` and `dtype` filled with zeros.
    ///
    /// Errors: as [`from_slice`](Array::from_slice).
    pub fn zeros(shape: &[usize], dtype: Dtype) -> Result<Array> {
        call(|| {
            let dims = shape_arg(shape)?;
            ops::check_new("shape", &dims, dtype)?;
            locked(|| ops::zeros(&dims, dtype)).map(Array::wrap)
        })
    }

    /// The dimensions. Never computes anything.
    pub fn shape(&self) -> Result<Vec<usize>> {
        locked(|| {
            Ok(ops::shape(self.get("array")?)
                .into_iter()
                .map(|d| d as usize)
                .collect())
        })
    }

    /// The number of dimensions. Never computes anything.
    pub fn ndim(&self) -> Result<usize> {
        locked(|| Ok(ops::ndim(self.get("array")?)))
    }

    /// The number of elements (the product of the dimensions). Never computes anything.
    pub fn size(&self) -> Result<usize> {
        locked(|| Ok(bridge::array_size(self.get("array")?)))
    }

    /// The element type. Never computes anything.
    pub fn dtype(&self) -> Result<Dtype> {
        locked(|| {
            let code = ops::dtype_code(self.get("array")?);
            Dtype::from_code(code).ok_or_else(|| {
                Error::Dtype(format!("array: MLX dtype code {code} has no mlxkern Dtype"))
            })
        })
    }

    /// The size of the data in bytes (elements times the dtype's size). Never computes
    /// anything.
    pub fn nbytes(&self) -> Result<usize> {
        locked(|| Ok(ops::nbytes(self.get("array")?)))
    }

    /// Computes the array (and whatever it depends on) now. Errors raised by the computation,
    /// of this array or of the kernels that produced it, are reported here
    /// ([`Error::Backend`], or [`Error::Panic`] for a kernel that panicked).
    pub fn eval(&self) -> Result<()> {
        call(|| {
            locked(|| {
                let result = ops::eval(self.get("array")?);
                if let Err(error) = &result {
                    self.mark_failed(error);
                }
                result
            })
        })
    }

    /// Computes the array and copies its elements, row-major, into `dst`, whose length must
    /// be the array's element count; `T` must be the array's dtype ([`Error::Dtype`]
    /// otherwise: convert with [`astype`](Array::astype) first).
    pub fn read_into<T: Element>(&self, dst: &mut [T]) -> Result<()> {
        call(|| {
            locked(|| {
                let a = self.get("array")?;
                let code = ops::dtype_code(a);
                if code != T::DTYPE as i32 {
                    let name = Dtype::from_code(code).map_or("unknown", Dtype::name);
                    return Err(Error::Dtype(format!(
                        "dst: elements of dtype {} cannot hold the array's dtype {name} (convert \
                         with astype first)",
                        T::DTYPE.name()
                    )));
                }
                let count = bridge::array_size(a);
                if dst.len() != count {
                    return Err(Error::BufferTooSmall(format!(
                        "dst holds {} elements; the array has {count}",
                        dst.len()
                    )));
                }
                let result = T::read(a, dst);
                if let Err(error) = &result {
                    self.mark_failed(error);
                }
                result
            })
        })
    }

    /// Computes the array and returns its elements, row-major; `T` must be the array's dtype
    /// ([`Error::Dtype`] otherwise: convert with [`astype`](Array::astype) first).
    ///
    /// ```
    /// # fn main() -> mlxkern::Result<()> {
    /// use mlxkern::{Array, Dtype};
    /// let a = Array::from_slice(&[1i32, -2, 3], &[3])?;
    /// assert_eq!(a.to_vec::<i32>()?, [1, -2, 3]);
    /// assert_eq!(a.astype(Dtype::Float32)?.to_vec::<f32>()?, [1.0, -2.0, 3.0]);
    /// assert!(a.to_vec::<f32>().is_err());
    /// # Ok(()) }
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.size()?];
        self.read_into(&mut out)?;
        Ok(out)
    }

    /// Computes the array and returns its elements as bytes (row-major, the machine's byte
    /// order), whatever its dtype.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        call(|| {
            locked(|| {
                let a = self.get("array")?;
                let mut out = vec![0u8; ops::nbytes(a)];
                let result = ops::read(a, &mut out);
                if let Err(error) = &result {
                    self.mark_failed(error);
                }
                result.map(|()| out)
            })
        })
    }

    /// A lazy copy converted to `dtype` (MLX's conversion rules: round to nearest even; float
    /// to integer truncates).
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        call(|| locked(|| ops::astype(self.get("array")?, dtype)).map(Array::wrap))
    }

    /// A second `Array` sharing this one's MLX array (no copy; the data lives while either
    /// holds it). Note that a shared state is not updated in place by the decode loop's
    /// kernels: they write in place only into a buffer nothing else holds.
    pub fn try_clone(&self) -> Result<Array> {
        locked(|| Ok(bridge::array_share(self.get("array")?))).map(Array::wrap)
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.shape(), self.dtype()) {
            (Ok(shape), Ok(dtype)) => write!(f, "Array({shape:?}, {})", dtype.name()),
            _ => write!(f, "Array(failed)"),
        }
    }
}

/// Checks a shape argument: at most 16 dimensions, each at most 2^31-1.
fn shape_arg(shape: &[usize]) -> Result<Vec<i32>> {
    if shape.len() > memory::MAX_NDIM {
        return Err(Error::Shape(format!(
            "ndim is {}; at most MLXK_MAX_NDIM ({}) dimensions are supported",
            shape.len(),
            memory::MAX_NDIM
        )));
    }
    shape
        .iter()
        .enumerate()
        .map(|(axis, &d)| {
            i32::try_from(d).map_err(|_| {
                Error::InvalidArgument(format!(
                    "shape: dimension {axis} is {d}; at most 2^31-1 elements are supported"
                ))
            })
        })
        .collect()
}

fn dims64(dims: &[i32]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type an [`Array`]'s elements can be written from and read into: `bool`, `u8`, `i8`,
/// `i32`, `u32`, [`half::f16`], [`half::bf16`] and `f32`, one per [`Dtype`].
pub trait Element: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The dtype of arrays of this element type.
    const DTYPE: Dtype;

    #[doc(hidden)]
    fn as_bytes(data: &[Self]) -> &[u8];

    #[doc(hidden)]
    /// Reads the array's elements into `dst` (dtype and length checked). Under the lock.
    fn read(array: &bridge::Array, dst: &mut [Self]) -> Result<()>;
}

macro_rules! plain_elements {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$dtype;
            fn as_bytes(data: &[Self]) -> &[u8] {
                // SAFETY: a plain number type (no padding, every byte initialized); the slice
                // covers exactly the same memory.
                unsafe {
                    std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data))
                }
            }
            fn read(array: &bridge::Array, dst: &mut [Self]) -> Result<()> {
                // SAFETY: as in as_bytes; every bit pattern is a valid value of this type.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(
                        dst.as_mut_ptr().cast::<u8>(),
                        std::mem::size_of_val(dst),
                    )
                };
                ops::read(array, bytes)
            }
        }
    )*};
}

plain_elements! {
    u8 => Uint8,
    i8 => Int8,
    i32 => Int32,
    u32 => Uint32,
    f16 => Float16,
    bf16 => Bfloat16,
    f32 => Float32,
}

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
    fn as_bytes(data: &[Self]) -> &[u8] {
        // SAFETY: a bool is one byte holding 0 or 1.
        unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), data.len()) }
    }
    fn read(array: &bridge::Array, dst: &mut [Self]) -> Result<()> {
        // Read as bytes first: a bool may only ever hold 0 or 1.
        let mut bytes = vec![0u8; dst.len()];
        ops::read(array, &mut bytes)?;
        for (d, b) in dst.iter_mut().zip(bytes) {
            *d = b != 0;
        }
        Ok(())
    }
}
