//! The safe API's arrays, devices, limits, versions and the GLM-5.2 layout: construction from
//! every element type, reads, conversions, errors naming the argument, and agreement with the
//! C ABI on the same data.

#[path = "../support/mod.rs"]
mod support;

use crate::support::api::*;
use crate::support::*;
use mlxkern::half::{bf16, f16};
use mlxkern::{Array, Device, Dtype, Element, Error};

fn random_shape(rng: &mut Rng) -> Vec<usize> {
    let ndim = rng.below(5) as usize;
    (0..ndim).map(|_| 1 + rng.below(6) as usize).collect()
}

/// Round trip of random data of element type `T` through `from_slice` and `to_vec`, and the
/// same bytes as the C ABI's array of the same data.
fn round_trip<T: Element + PartialEq + std::fmt::Debug>(rng: &mut Rng, make: impl Fn(f32) -> T) {
    for _ in 0..4 {
        let shape = random_shape(rng);
        let n: usize = shape.iter().product();
        let data: Vec<T> = rng.vec(n, 100.0).into_iter().map(&make).collect();
        let a = Array::from_slice(&data, &shape).unwrap();
        assert_eq!(a.shape().unwrap(), shape);
        assert_eq!(a.ndim().unwrap(), shape.len());
        assert_eq!(a.size().unwrap(), n);
        assert_eq!(a.dtype().unwrap(), T::DTYPE);
        assert_eq!(a.nbytes().unwrap(), n * T::DTYPE.size());
        assert_eq!(a.to_vec::<T>().unwrap(), data);
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let bytes = a.to_bytes().unwrap();
        let c = new_bytes(&bytes, &dims, T::DTYPE as i32);
        assert_eq!(read_bytes(c), bytes);
        assert_eq!(shape_of(c), dims);
        free(c);
    }
}

#[test]
fn every_element_type_round_trips() {
    let mut rng = Rng::fresh();
    round_trip(&mut rng, |x| x);
    round_trip(&mut rng, bf16::from_f32);
    round_trip(&mut rng, f16::from_f32);
    round_trip(&mut rng, |x| x as i32);
    round_trip(&mut rng, |x| (x + 100.0) as u32 * 40_000_000);
    round_trip(&mut rng, |x| x as i8);
    round_trip(&mut rng, |x| (x + 100.0) as u8);
    round_trip(&mut rng, |x| x > 0.0);
}

#[test]
fn zeros_scalars_and_empty_arrays() {
    let mut rng = Rng::fresh();
    for dtype in Dtype::ALL {
        let shape = random_shape(&mut rng);
        let z = Array::zeros(&shape, dtype).unwrap();
        assert_eq!(z.dtype().unwrap(), dtype);
        let bytes = z.to_bytes().unwrap();
        assert_eq!(bytes.len(), shape.iter().product::<usize>() * dtype.size());
        assert!(bytes.iter().all(|&b| b == 0));
    }
    let scalar = Array::from_slice(&[2.5f32], &[]).unwrap();
    assert_eq!(scalar.shape().unwrap(), Vec::<usize>::new());
    assert_eq!(scalar.to_vec::<f32>().unwrap(), [2.5]);
    let empty = Array::from_slice::<f32>(&[], &[3, 0, 2]).unwrap();
    assert_eq!(empty.size().unwrap(), 0);
    assert_eq!(empty.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    assert_eq!(
        empty.astype(Dtype::Bfloat16).unwrap().to_bytes().unwrap(),
        Vec::<u8>::new()
    );
}

#[test]
fn astype_matches_the_c_abi_bit_for_bit() {
    let mut rng = Rng::fresh();
    for from in Dtype::ALL {
        for to in Dtype::ALL {
            let shape = [2 + rng.below(5) as usize, 3];
            let src = Twin::random(&mut rng, &shape, 300.0, from);
            let r = src.r.astype(to).unwrap();
            let mut c = std::ptr::null_mut();
            ok(unsafe { mlxk_array_astype(src.c, to as i32, &mut c) });
            same_results(
                &format!("astype {} -> {}", from.name(), to.name()),
                &[c],
                &[&r],
            );
        }
    }
}

#[test]
fn reads_check_the_element_type_and_length() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let err = a.to_vec::<bf16>().unwrap_err();
    assert!(matches!(err, Error::Dtype(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "dst: elements of dtype bfloat16 cannot hold the array's dtype float32 (convert with \
         astype first)"
    );
    let mut short = [0.0f32; 2];
    let err = a.read_into(&mut short).unwrap_err();
    assert!(matches!(err, Error::BufferTooSmall(_)), "{err}");
    assert!(
        err.to_string()
            .contains("dst holds 2 elements; the array has 3"),
        "{err}"
    );
    let mut exact = [0.0f32; 3];
    a.read_into(&mut exact).unwrap();
    assert_eq!(exact, [1.0, 2.0, 3.0]);
    // A bool array reads back as bools; as bytes it is 0 and 1.
    let m = Array::from_slice(&[true, false, true], &[3]).unwrap();
    assert_eq!(m.to_vec::<bool>().unwrap(), [true, false, true]);
    assert_eq!(m.to_bytes().unwrap(), [1, 0, 1]);
}

#[test]
fn bad_construction_names_the_argument() {
    let err = Array::from_slice(&[1.0f32; 5], &[2, 3]).unwrap_err();
    assert!(matches!(err, Error::Shape(_)));
    assert_eq!(
        err.to_string(),
        "data: 5 elements for shape [2, 3], which holds 6"
    );
    let err = Array::from_bytes(&[0u8; 7], &[2], Dtype::Float32).unwrap_err();
    assert!(matches!(err, Error::Shape(_)));
    assert!(
        err.to_string().starts_with("data: 7 bytes for shape [2]"),
        "{err}"
    );
    let err = Array::from_bytes(&[0, 1, 2], &[3], Dtype::Bool).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    // The C ABI gives the same status and message for the same bool bytes.
    let mut out = std::ptr::null_mut();
    let status = unsafe {
        mlxk_array_new(
            [0u8, 1, 2].as_ptr().cast(),
            [3i32].as_ptr(),
            1,
            MLXK_DTYPE_BOOL,
            &mut out,
        )
    };
    same_error("mlxk_array_new", status, err);
    let err = Array::zeros(&[1; 17], Dtype::Float32).unwrap_err();
    assert!(matches!(err, Error::Shape(_)));
    assert!(
        err.to_string().contains("at most MLXK_MAX_NDIM (16)"),
        "{err}"
    );
    let err = Array::zeros(&[1 << 20, 1 << 20], Dtype::Uint8).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(
        err.to_string()
            .starts_with("shape: shape [1048576, 1048576]"),
        "{err}"
    );
    let err = Array::zeros(&[usize::MAX], Dtype::Uint8).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(
        err.to_string().starts_with("shape: dimension 0 is"),
        "{err}"
    );
}

#[test]
fn arrays_move_between_threads_and_are_shared() {
    let mut rng = Rng::fresh();
    let data = rng.vec(64, 1.0);
    let a = std::sync::Arc::new(Array::from_slice(&data, &[8, 8]).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let a = a.clone();
            std::thread::spawn(move || {
                let b = a.astype(if i % 2 == 0 {
                    Dtype::Bfloat16
                } else {
                    Dtype::Float16
                })?;
                let back = b.astype(Dtype::Float32)?;
                back.to_vec::<f32>()
            })
        })
        .collect();
    for h in handles {
        let back = h.join().unwrap().unwrap();
        for (x, y) in back.iter().zip(&data) {
            assert!((x - y).abs() <= y.abs() * 1e-2 + 1e-3, "{x} vs {y}");
        }
    }
    let shared = a.try_clone().unwrap();
    drop(a);
    assert_eq!(shared.to_vec::<f32>().unwrap(), data);
}

#[test]
fn the_mlx_lock_can_be_held_around_calls() {
    let lock = mlxkern::MlxLock::acquire();
    let again = mlxkern::MlxLock::acquire();
    let a = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    assert_eq!(a.to_vec::<i32>().unwrap(), [1, 2]);
    drop(again);
    drop(a);
    drop(lock);
    // Another thread gets it once released.
    std::thread::spawn(|| {
        Array::zeros(&[2], Dtype::Int8)
            .unwrap()
            .to_vec::<i8>()
            .unwrap()
    })
    .join()
    .unwrap();
}

#[test]
fn memory_limit_refuses_large_requests() {
    // Every other test of this file allocates far less than the limit set here.
    let before = mlxkern::memory_limit();
    assert!(before > 0);
    let previous = mlxkern::set_memory_limit(1 << 20);
    assert_eq!(previous, before);
    assert_eq!(mlxkern::memory_limit(), 1 << 20);
    let err = Array::zeros(&[1 << 19], Dtype::Float32).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    assert_eq!(err.status(), MLXK_ERR_OUT_OF_MEMORY);
    let small = Array::zeros(&[1 << 10], Dtype::Float32).unwrap();
    let err = small.astype(Dtype::Float32).map(|_| ()).err();
    assert!(err.is_none());
    mlxkern::set_memory_limit(0);
    assert_eq!(mlxkern::memory_limit(), before);
    Array::zeros(&[1 << 19], Dtype::Float32).unwrap();
    mlxkern::set_cache_limit(1 << 30);
}

#[test]
fn devices_and_versions() {
    assert_eq!(mlxkern::default_device(), Device::Cpu);
    let backend = mlxkern::gpu_backend();
    assert_eq!(mlxkern::gpu_available(), backend.is_some());
    if backend.is_none() {
        let err = mlxkern::set_default_device(Device::Gpu).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        assert_eq!(mlxkern::default_device(), Device::Cpu);
        let status = mlxk_set_default_device(MLXK_DEVICE_GPU);
        same_error("mlxk_set_default_device", status, err);
    }
    mlxkern::set_default_device(Device::Cpu).unwrap();
    assert_eq!(mlxkern::version(), env!("CARGO_PKG_VERSION"));
    let c_version = unsafe { std::ffi::CStr::from_ptr(mlxk_version()) };
    assert_eq!(c_version.to_str().unwrap(), mlxkern::version());
    assert_eq!(mlxkern::abi_version(), mlxk_abi_version());
    let loaded = mlxkern::mlx_version();
    let c_loaded = unsafe { std::ffi::CStr::from_ptr(mlxk_mlx_version()) };
    assert_eq!(c_loaded.to_str().unwrap(), loaded);
    assert!(loaded.starts_with("0.3"), "{loaded}");
    assert!(
        loaded.starts_with(&mlxkern::mlx_build_version()),
        "{loaded}"
    );
}

#[test]
fn glm52_layout_through_the_safe_api() {
    use mlxkern::glm52::{canonical, validate, Format};
    let q4 = Format::new(4, 64).unwrap();
    let l = canonical(6144, 2048, q4).unwrap();
    assert_eq!(
        [
            l.gate_weight_offset,
            l.up_weight_offset,
            l.down_weight_offset,
            l.slot_bytes
        ],
        [0, 6291456, 12582912, 20054016]
    );
    validate(&l, q4).unwrap();
    let err = Format::new(3, 64).unwrap_err();
    assert_eq!(err.to_string(), "bits is 3 (expected 4 or 8)");
    let mut bad = l;
    bad.down_scale_offset = l.up_scale_offset;
    let err = validate(&bad, q4).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(err.to_string().contains("overlaps"), "{err}");
}
