//! The array, status, version, device and memory functions of the C ABI, including every
//! error path.

mod support;

use crate::support::*;
use std::ffi::CStr;
use std::ptr::{null, null_mut};

#[test]
fn round_trip_every_dtype_with_random_data() {
    let mut rng = Rng::fresh();
    let sizes = [1usize, 1, 1, 4, 4, 2, 2, 4];
    for dtype in 0..8 {
        for shape in [vec![], vec![5], vec![3, 7], vec![2, 3, 4], vec![0, 3]] {
            let count: usize = shape.iter().product::<i32>() as usize;
            let mut bytes: Vec<u8> = (0..count * sizes[dtype as usize])
                .map(|_| rng.next_u64() as u8)
                .collect();
            if dtype == MLXK_DTYPE_BOOL {
                bytes.iter_mut().for_each(|b| *b &= 1);
            }
            let a = new_bytes(&bytes, &shape, dtype);
            assert_eq!(shape_of(a), shape);
            assert_eq!(dtype_of(a), dtype);
            let mut nbytes = 0;
            ok(unsafe { mlxk_array_nbytes(a, &mut nbytes) });
            assert_eq!(nbytes, bytes.len());
            ok(mlxk_array_eval(a));
            assert_eq!(read_bytes(a), bytes, "dtype {dtype} shape {shape:?}");
            free(a);
        }
    }
}

#[test]
fn zeros_are_zero_and_contiguous() {
    let z = {
        let mut out = null_mut();
        ok(unsafe { mlxk_array_zeros([3, 5].as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut out) });
        out
    };
    assert_eq!(read_f32(z), vec![0.0; 15]);
    free(z);
}

#[test]
fn astype_rounds_like_mlx() {
    let mut rng = Rng::fresh();
    let x = rng.vec(64, 100.0);
    let a = new_f32(&x, &[8, 8]);
    let mut b = null_mut();
    ok(unsafe { mlxk_array_astype(a, MLXK_DTYPE_BFLOAT16, &mut b) });
    assert_eq!(dtype_of(b), MLXK_DTYPE_BFLOAT16);
    let expect: Vec<f32> = x.iter().map(|&v| bf16_to_f32(bf16_bits(v))).collect();
    assert_eq!(read_bf16(b), expect);
    expect_err(
        unsafe { mlxk_array_astype(a, 99, &mut b) },
        MLXK_ERR_DTYPE,
        &["dtype", "99"],
    );
    expect_err(
        unsafe { mlxk_array_astype(a, MLXK_DTYPE_FLOAT16, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["out"],
    );
    free(a);
    free(b);
}

#[test]
fn constructor_errors_name_the_argument() {
    let data = [1.0f32; 4];
    let mut out: H = null_mut();
    let shape = [2i32, 2];
    let s = |st| st;
    expect_err(
        s(array_new_into(
            as_bytes(&data),
            &shape,
            MLXK_DTYPE_FLOAT32,
            null_mut(),
        )),
        MLXK_ERR_NULL_POINTER,
        &["mlxk_array_new", "out"],
    );
    expect_err(
        unsafe { mlxk_array_new(null(), shape.as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut out) },
        MLXK_ERR_NULL_POINTER,
        &["data"],
    );
    expect_err(
        unsafe {
            mlxk_array_new(
                data.as_ptr().cast(),
                null(),
                2,
                MLXK_DTYPE_FLOAT32,
                &mut out,
            )
        },
        MLXK_ERR_NULL_POINTER,
        &["shape"],
    );
    expect_err(
        unsafe { mlxk_array_new(data.as_ptr().cast(), shape.as_ptr(), 2, 8, &mut out) },
        MLXK_ERR_DTYPE,
        &["dtype", "8"],
    );
    expect_err(
        unsafe { mlxk_array_new(data.as_ptr().cast(), shape.as_ptr(), 2, -1, &mut out) },
        MLXK_ERR_DTYPE,
        &["dtype"],
    );
    let negative = [2i32, -3];
    expect_err(
        array_new_into(as_bytes(&data), &negative, MLXK_DTYPE_FLOAT32, &mut out),
        MLXK_ERR_SHAPE,
        &["shape", "-3"],
    );
    let many = [1i32; 17];
    expect_err(
        unsafe { mlxk_array_zeros(many.as_ptr(), 17, MLXK_DTYPE_FLOAT32, &mut out) },
        MLXK_ERR_SHAPE,
        &["ndim", "17"],
    );
    // 2^31 elements: refused before anything is allocated, even as bytes.
    let huge = [65536i32, 32768];
    expect_err(
        unsafe { mlxk_array_zeros(huge.as_ptr(), 2, MLXK_DTYPE_UINT8, &mut out) },
        MLXK_ERR_INVALID_ARGUMENT,
        &["shape", "2^31-1"],
    );
    // Products that overflow 64 bits.
    let overflow = [i32::MAX, i32::MAX, i32::MAX, i32::MAX, i32::MAX];
    expect_err(
        unsafe { mlxk_array_zeros(overflow.as_ptr(), 5, MLXK_DTYPE_FLOAT32, &mut out) },
        MLXK_ERR_INVALID_ARGUMENT,
        &["shape"],
    );
    let bad_bool = [0u8, 1, 7, 0];
    expect_err(
        array_new_into(&bad_bool, &shape, MLXK_DTYPE_BOOL, &mut out),
        MLXK_ERR_INVALID_ARGUMENT,
        &["data", "element 2", "0 or 1"],
    );
    assert!(out.is_null(), "out must stay untouched on failure");
}

#[test]
fn inspection_errors() {
    let a = new_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let mut dims = [0i32; 1];
    expect_err(
        unsafe { mlxk_array_shape(a, dims.as_mut_ptr(), 1) },
        MLXK_ERR_BUFFER_TOO_SMALL,
        &["dims", "capacity 1"],
    );
    expect_err(
        unsafe { mlxk_array_shape(a, null_mut(), 2) },
        MLXK_ERR_NULL_POINTER,
        &["dims"],
    );
    expect_err(
        unsafe { mlxk_array_ndim(a, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["ndim"],
    );
    expect_err(
        unsafe { mlxk_array_dtype(a, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["dtype"],
    );
    expect_err(
        unsafe { mlxk_array_nbytes(a, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["nbytes"],
    );
    let mut small = [0f32; 5];
    expect_err(
        unsafe { mlxk_array_read(a, small.as_mut_ptr().cast(), 20) },
        MLXK_ERR_BUFFER_TOO_SMALL,
        &["dst_bytes is 20", "24"],
    );
    assert_eq!(small, [0.0; 5], "nothing copied on failure");
    expect_err(
        unsafe { mlxk_array_read(a, null_mut(), 24) },
        MLXK_ERR_NULL_POINTER,
        &["dst"],
    );
    // A longer buffer keeps its tail.
    let mut big = [-1f32; 8];
    ok(unsafe { mlxk_array_read(a, big.as_mut_ptr().cast(), 32) });
    assert_eq!(big, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, -1.0]);
    let mut nd = 0usize;
    expect_err(
        unsafe { mlxk_array_ndim(null(), &mut nd) },
        MLXK_ERR_NULL_POINTER,
        &["array"],
    );
    expect_err(mlxk_array_eval(null()), MLXK_ERR_NULL_POINTER, &["array"]);
    free(a);
}

#[test]
fn freed_foreign_and_double_freed_handles_are_refused() {
    let a = new_f32(&[1.0, 2.0], &[2]);
    free(a);
    expect_err(
        mlxk_array_free(a),
        MLXK_ERR_INVALID_HANDLE,
        &["array", "not a live"],
    );
    let mut nd = 0usize;
    expect_err(
        unsafe { mlxk_array_ndim(a, &mut nd) },
        MLXK_ERR_INVALID_HANDLE,
        &["array"],
    );
    expect_err(mlxk_array_eval(a), MLXK_ERR_INVALID_HANDLE, &["array"]);
    let mut buf = [0f32; 2];
    expect_err(
        unsafe { mlxk_array_read(a, buf.as_mut_ptr().cast(), 8) },
        MLXK_ERR_INVALID_HANDLE,
        &["array"],
    );
    // A pointer that is no handle at all: a stack address, and a heap address.
    let local = 0u64;
    let foreign = &local as *const u64 as *mut mlxk_array;
    expect_err(
        mlxk_array_free(foreign),
        MLXK_ERR_INVALID_HANDLE,
        &["array"],
    );
    let boxed = Box::new([0u8; 64]);
    let heap = boxed.as_ptr() as *mut mlxk_array;
    expect_err(
        unsafe { mlxk_array_ndim(heap, &mut nd) },
        MLXK_ERR_INVALID_HANDLE,
        &["array"],
    );
    ok(mlxk_array_free(null_mut()));
    // Handles are never reused: a new array does not revive the freed one.
    let b = new_f32(&[3.0], &[1]);
    assert_ne!(a, b);
    expect_err(mlxk_array_free(a), MLXK_ERR_INVALID_HANDLE, &["array"]);
    free(b);
}

#[test]
fn handle_freed_on_another_thread_is_dead_everywhere() {
    let a = new_f32(&[1.0, 2.0, 3.0], &[3]) as usize;
    std::thread::spawn(move || free(a as H)).join().unwrap();
    expect_err(mlxk_array_eval(a as H), MLXK_ERR_INVALID_HANDLE, &["array"]);
}

#[test]
fn status_names_versions_and_thread_local_errors() {
    let names = [
        "MLXK_OK",
        "MLXK_ERR_NULL_POINTER",
        "MLXK_ERR_INVALID_ARGUMENT",
        "MLXK_ERR_SHAPE",
        "MLXK_ERR_DTYPE",
        "MLXK_ERR_UNSUPPORTED",
        "MLXK_ERR_BACKEND",
        "MLXK_ERR_OUT_OF_MEMORY",
        "MLXK_ERR_BUFFER_TOO_SMALL",
        "MLXK_ERR_PANIC",
        "MLXK_ERR_INVALID_HANDLE",
    ];
    for (code, expected) in names.iter().enumerate() {
        assert_eq!(name(code as i32), *expected);
    }
    assert_eq!(name(11), "MLXK_UNKNOWN_STATUS");
    assert_eq!(name(-1), "MLXK_UNKNOWN_STATUS");
    let version = unsafe { CStr::from_ptr(mlxk_version()) }.to_str().unwrap();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(mlxk_abi_version(), 1);

    // Each thread sees its own last error.
    expect_err(
        mlxk_array_eval(null()),
        MLXK_ERR_NULL_POINTER,
        &["mlxk_array_eval"],
    );
    let other = std::thread::spawn(|| {
        let fresh = last_error();
        let mut out: H = null_mut();
        let st = unsafe { mlxk_array_zeros(null(), 1, MLXK_DTYPE_FLOAT32, &mut out) };
        (fresh, st, last_error())
    })
    .join()
    .unwrap();
    assert_eq!(other.0, "", "a new thread starts with no message");
    assert_eq!(other.1, MLXK_ERR_NULL_POINTER);
    assert!(other.2.contains("mlxk_array_zeros"));
    assert!(
        last_error().contains("mlxk_array_eval"),
        "this thread's message is unchanged"
    );
}

#[test]
fn devices() {
    assert_eq!(
        mlxk_gpu_backend(),
        MLXK_GPU_NONE,
        "the Linux CPU wheel has no GPU backend"
    );
    expect_err(
        mlxk_set_default_device(MLXK_DEVICE_GPU),
        MLXK_ERR_UNSUPPORTED,
        &["GPU", "no GPU backend"],
    );
    expect_err(
        mlxk_set_default_device(7),
        MLXK_ERR_INVALID_ARGUMENT,
        &["device", "7"],
    );
    ok(mlxk_set_default_device(MLXK_DEVICE_CPU));
}

#[test]
fn a_panicking_kernel_is_an_error_at_eval_not_a_crash() {
    let x = new_f32(&[1.0], &[1]);
    let mut node = null_mut();
    ok(unsafe { mlxkern::testing::panic_probe(x, &mut node) });
    expect_err(
        mlxk_array_eval(node),
        MLXK_ERR_PANIC,
        &["panic probe kernel ran"],
    );
    let mut out = [0f32; 1];
    expect_err(
        unsafe { mlxk_array_read(node, out.as_mut_ptr().cast(), 4) },
        MLXK_ERR_BACKEND,
        &["failed earlier", "panic"],
    );
    free(node);
    // The library keeps working.
    let y = new_f32(&[2.0], &[1]);
    assert_eq!(read_f32(y), vec![2.0]);
    free(x);
    free(y);
}

#[test]
fn a_failed_node_stays_failed_and_its_outputs_are_nan() {
    let x = new_f32(&[1.0], &[1]);
    let mut node = null_mut();
    ok(unsafe { mlxkern::testing::panic_probe(x, &mut node) });
    let mut derived = null_mut();
    ok(unsafe { mlxk_array_astype(node, MLXK_DTYPE_FLOAT32, &mut derived) });
    expect_err(mlxk_array_eval(node), MLXK_ERR_PANIC, &["panic probe"]);
    expect_err(mlxk_array_eval(node), MLXK_ERR_BACKEND, &["failed earlier"]);
    let mut again = null_mut();
    expect_err(
        unsafe { mlxk_array_astype(node, MLXK_DTYPE_BFLOAT16, &mut again) },
        MLXK_ERR_BACKEND,
        &["failed earlier"],
    );
    // A node built from it before the failure computes from NaN, never from stale data.
    let v = read_f32(derived);
    assert!(v[0].is_nan(), "{v:?}");
    free(derived);
    free(node);
    free(x);
}
