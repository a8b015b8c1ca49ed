//! Target `array`: mlxk_array_new / zeros / free / ndim / shape / dtype / nbytes / eval /
//! read / astype, the exchange with the host's MLX (to_mlx, then from_mlx), the memory limit and the status names, with random shapes (negative,
//! zero, huge, overflowing, more than MLXK_MAX_NDIM dims), dtype codes, NULLs, buffer
//! lengths, and freed or foreign handles. A model of every live array (shape, dtype,
//! contents) checks each answer.

use std::ptr::null_mut;

use super::*;

/// Memory limits this target switches between (restored to MEMORY_LIMIT at the end).
const LIMITS: [usize; 4] = [4096, 1 << 20, 4 << 20, 4 << 20];
/// The largest data buffer the harness hands to mlxk_array_new (larger requests are over
/// every limit above, so they must be refused before `data` is read).
const MAX_DATA: u128 = 4 << 20;
const MAX_OPS: usize = 48;

struct Slot {
    h: H,
    shape: Vec<i64>,
    dtype: mlxk_dtype,
    /// The contents, when the model knows them.
    bytes: Option<Vec<u8>>,
}

struct State {
    live: Vec<Slot>,
    dead: Vec<H>,
    foreign: Foreign,
    limit: usize,
}

impl State {
    /// A handle argument: (value, kind, index into `live` when live).
    fn pick_handle(&mut self, input: &mut Input) -> (H, Kind, Option<usize>) {
        let kind = match input.u8() % 16 {
            15 => Kind::Null,
            14 => Kind::Dead,
            13 => Kind::Foreign,
            _ if self.live.is_empty() => Kind::Dead,
            _ => Kind::Live,
        };
        if kind == Kind::Live {
            let i = input.below(self.live.len());
            (self.live[i].h, kind, Some(i))
        } else {
            (
                handle_of(kind, null_mut(), &self.dead, &self.foreign, input),
                kind,
                None,
            )
        }
    }
}

fn pick_dtype(input: &mut Input) -> mlxk_dtype {
    match input.u8() % 32 {
        31 => -1,
        30 => 8,
        29 => i32::MIN,
        28 => 255,
        n => (7 - n % 8) as mlxk_dtype,
    }
}

fn pick_shape(input: &mut Input) -> Vec<i64> {
    let ndim = match input.u8() % 16 {
        0 => 0,
        1..=4 => 1,
        5..=8 => 2,
        9..=11 => 3,
        12 => 4,
        13 => 5 + input.below(4),
        14 => 16,
        _ => 17 + input.below(4),
    };
    (0..ndim)
        .map(|_| match input.u8() % 16 {
            0..=9 => input.below(8) as i64,
            10 => 0,
            11 => input.pick(&[-1i64, i32::MIN as i64, -65536]),
            12 => i32::MAX as i64,
            13 => 65536,
            14 => 46341, // 46341^2 > 2^31 - 1
            _ => input.below(300) as i64,
        })
        .collect()
}

/// The rules of mlxk_array_new / mlxk_array_zeros; returns the byte size when the shape is
/// acceptable.
fn expect_new(
    e: &mut Expect,
    shape: &[i64],
    shape_null: bool,
    dtype: mlxk_dtype,
    out_null: bool,
    limit: usize,
) -> Option<u128> {
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "out is NULL");
    }
    if shape.len() > MLXK_MAX_NDIM {
        e.fail(
            MLXK_ERR_SHAPE,
            format!("ndim {} > MLXK_MAX_NDIM", shape.len()),
        );
        return None;
    }
    if shape_null && !shape.is_empty() {
        e.fail(MLXK_ERR_NULL_POINTER, "shape is NULL with ndim > 0");
        return None;
    }
    if !dtype_valid(dtype) {
        e.fail(MLXK_ERR_DTYPE, format!("dtype code {dtype}"));
    }
    let n = match count(shape) {
        None => {
            e.fail(MLXK_ERR_SHAPE, "a negative dim");
            return None;
        }
        Some(n) => n,
    };
    if n > i32::MAX as u128 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("{n} elements > 2^31-1"));
        return None;
    }
    if !dtype_valid(dtype) {
        return None;
    }
    let bytes = n * dtype_size(dtype) as u128;
    if bytes > limit as u128 {
        e.fail(
            MLXK_ERR_OUT_OF_MEMORY,
            format!("{bytes} bytes > limit {limit}"),
        );
        return None;
    }
    Some(bytes)
}

fn op_new(st: &mut State, input: &mut Input, zeros: bool) {
    let shape = pick_shape(input);
    let dtype = pick_dtype(input);
    let shape_null = !shape.is_empty() && input.chance(8) || shape.is_empty() && input.chance(128);
    let out_null = input.chance(8);
    let mut e = Expect::new();
    let nbytes = expect_new(&mut e, &shape, shape_null, dtype, out_null, st.limit);

    // The data: exactly nbytes when the request can be granted, else NULL or a short buffer
    // the library must not read (the request is refused before `data` is looked at).
    let mode = DataMode::pick(input);
    let mut fill = Fill::new(input.u16() as u64);
    let misalign = input.chance(64) as usize;
    let mut backing: Vec<u8> = Vec::new();
    let mut data_null = false;
    let mut contents: Option<Vec<u8>> = None;
    if !zeros {
        match nbytes {
            Some(b) if b <= MAX_DATA => {
                let bytes = make_data(&mut fill, count_usize(&shape), dtype, mode);
                assert_eq!(bytes.len() as u128, b);
                if b > 0 && input.chance(10) {
                    data_null = true;
                    e.fail(MLXK_ERR_NULL_POINTER, "data is NULL for a non-empty array");
                } else {
                    if dtype == MLXK_DTYPE_BOOL {
                        if let Some(i) = bytes.iter().position(|&x| x > 1) {
                            e.fail(
                                MLXK_ERR_INVALID_ARGUMENT,
                                format!("bool byte {} at {i}", bytes[i]),
                            );
                        }
                    }
                    backing = vec![0u8; misalign];
                    backing.extend_from_slice(&bytes);
                    contents = Some(bytes);
                }
            }
            Some(_) => unreachable!("every limit is <= MAX_DATA"),
            None => {
                data_null = input.chance(128);
                if !data_null {
                    backing = vec![0x33u8; 8];
                }
            }
        }
    }
    let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    let shape_ptr = if shape_null {
        std::ptr::null()
    } else {
        dims.as_ptr()
    };
    let mut out: H = sentinel();
    let out_ptr: *mut H = if out_null { null_mut() } else { &mut out };
    let (function, status) = if zeros {
        ("mlxk_array_zeros", unsafe {
            mlxk_array_zeros(shape_ptr, dims.len(), dtype, out_ptr)
        })
    } else {
        let data = if data_null || backing.is_empty() {
            std::ptr::null()
        } else {
            backing[misalign..].as_ptr().cast()
        };
        ("mlxk_array_new", unsafe {
            mlxk_array_new(data, shape_ptr, dims.len(), dtype, out_ptr)
        })
    };
    e.check(function, status);
    if status != MLXK_OK {
        assert_eq!(
            out,
            sentinel(),
            "{function} wrote its out-parameter on failure"
        );
        return;
    }
    let expected = if zeros {
        vec![0u8; nbytes.unwrap() as usize]
    } else {
        contents.expect("granted requests have contents")
    };
    let got = check_result(function, out, &shape, dtype);
    assert!(
        got == expected,
        "{function}: contents read back differ from the data given"
    );
    st.live.push(Slot {
        h: out,
        shape,
        dtype,
        bytes: Some(expected),
    });
}

fn op_free(st: &mut State, input: &mut Input) {
    let (h, kind, index) = st.pick_handle(input);
    let status = mlxk_array_free(h);
    let mut e = Expect::new();
    match kind {
        Kind::Null | Kind::Live => {}
        _ => expect_handle(&mut e, "array", kind, false),
    }
    e.check("mlxk_array_free", status);
    if let Some(i) = index {
        let slot = st.live.swap_remove(i);
        st.dead.push(slot.h);
    }
}

/// ndim, shape, dtype, nbytes of a handle (sometimes with NULL out-parameters).
fn op_query(st: &mut State, input: &mut Input) {
    let (h, kind, index) = st.pick_handle(input);
    let slot = index.map(|i| &st.live[i]);
    let which = input.u8() % 4;
    let out_null = input.chance(12);
    let mut e = Expect::new();
    expect_handle(&mut e, "array", kind, false);
    match which {
        0 => {
            if out_null {
                e.fail(MLXK_ERR_NULL_POINTER, "ndim is NULL");
            }
            let mut nd = usize::MAX;
            let p: *mut usize = if out_null { null_mut() } else { &mut nd };
            let status = unsafe { mlxk_array_ndim(h, p) };
            e.check("mlxk_array_ndim", status);
            match slot {
                Some(s) if status == MLXK_OK => assert_eq!(nd, s.shape.len()),
                _ => assert_eq!(nd, usize::MAX, "mlxk_array_ndim wrote on failure"),
            }
        }
        1 => {
            let capacity = match input.u8() % 4 {
                3 => 0,
                2 => slot.map_or(1, |s| s.shape.len().saturating_sub(1)),
                1 => input.below(21),
                _ => slot.map_or(2, |s| s.shape.len()),
            };
            let dims_null = input.chance(16);
            let ndim = slot.map(|s| s.shape.len());
            if let Some(nd) = ndim {
                if capacity < nd {
                    e.fail(
                        MLXK_ERR_BUFFER_TOO_SMALL,
                        format!("capacity {capacity} < ndim {nd}"),
                    );
                } else if dims_null && nd > 0 {
                    e.fail(MLXK_ERR_NULL_POINTER, "dims is NULL");
                }
            }
            if dims_null && capacity > 0 {
                e.maybe(MLXK_ERR_NULL_POINTER, "dims is NULL with capacity > 0");
            }
            let mut dims = vec![-7i32; capacity];
            let p = if dims_null {
                null_mut()
            } else {
                dims.as_mut_ptr()
            };
            let status = unsafe { mlxk_array_shape(h, p, capacity) };
            e.check("mlxk_array_shape", status);
            let nd = match (slot, status) {
                (Some(s), MLXK_OK) if !dims_null => {
                    let want: Vec<i32> = s.shape.iter().map(|&d| d as i32).collect();
                    assert_eq!(&dims[..want.len()], &want[..], "mlxk_array_shape dims");
                    want.len()
                }
                _ => 0,
            };
            assert!(
                dims[nd..].iter().all(|&d| d == -7),
                "mlxk_array_shape wrote past ndim or on failure"
            );
        }
        2 => {
            if out_null {
                e.fail(MLXK_ERR_NULL_POINTER, "dtype is NULL");
            }
            let mut dt = -99;
            let p: *mut mlxk_dtype = if out_null { null_mut() } else { &mut dt };
            let status = unsafe { mlxk_array_dtype(h, p) };
            e.check("mlxk_array_dtype", status);
            match slot {
                Some(s) if status == MLXK_OK => assert_eq!(dt, s.dtype),
                _ => assert_eq!(dt, -99, "mlxk_array_dtype wrote on failure"),
            }
        }
        _ => {
            if out_null {
                e.fail(MLXK_ERR_NULL_POINTER, "nbytes is NULL");
            }
            let mut nb = usize::MAX;
            let p: *mut usize = if out_null { null_mut() } else { &mut nb };
            let status = unsafe { mlxk_array_nbytes(h, p) };
            e.check("mlxk_array_nbytes", status);
            match slot {
                Some(s) if status == MLXK_OK => {
                    assert_eq!(nb, count_usize(&s.shape) * dtype_size(s.dtype))
                }
                _ => assert_eq!(nb, usize::MAX, "mlxk_array_nbytes wrote on failure"),
            }
        }
    }
}

fn op_read(st: &mut State, input: &mut Input) {
    let (h, kind, index) = st.pick_handle(input);
    let nbytes = index.map(|i| count_usize(&st.live[i].shape) * dtype_size(st.live[i].dtype));
    let n = nbytes.unwrap_or(16);
    let dst_bytes = match input.u8() % 6 {
        5 => n.saturating_sub(1),
        4 => 0,
        3 => n + input.below(9),
        2 => input.below(n + 1),
        _ => n,
    };
    let dst_null = input.chance(10);
    let mut e = Expect::new();
    expect_handle(&mut e, "array", kind, false);
    if let Some(nb) = nbytes {
        if dst_bytes < nb {
            e.fail(
                MLXK_ERR_BUFFER_TOO_SMALL,
                format!("dst_bytes {dst_bytes} < {nb}"),
            );
        } else if dst_null && nb > 0 {
            e.fail(MLXK_ERR_NULL_POINTER, "dst is NULL");
        }
    } else if dst_null && dst_bytes > 0 {
        e.maybe(MLXK_ERR_NULL_POINTER, "dst is NULL");
    }
    // With a NULL dst only sizes 0 and nbytes are announced (a NULL with a positive size is
    // refused, never written).
    let dst_bytes = if dst_null {
        dst_bytes.min(n)
    } else {
        dst_bytes
    };
    let mut buf = vec![0xA5u8; dst_bytes];
    let p = if dst_null {
        null_mut()
    } else {
        buf.as_mut_ptr()
    };
    let status = unsafe { mlxk_array_read(h, p.cast(), dst_bytes) };
    e.check("mlxk_array_read", status);
    if status == MLXK_OK {
        if let (Some(i), false) = (index, dst_null) {
            let nb = nbytes.unwrap();
            if let Some(want) = &st.live[i].bytes {
                assert!(
                    buf[..nb] == want[..],
                    "mlxk_array_read: contents differ from the model"
                );
            }
            assert!(
                buf[nb..].iter().all(|&b| b == 0xA5),
                "mlxk_array_read wrote past nbytes"
            );
        }
    } else {
        assert!(
            buf.iter().all(|&b| b == 0xA5),
            "mlxk_array_read wrote on failure"
        );
    }
}

fn op_eval(st: &mut State, input: &mut Input) {
    let (h, kind, _) = st.pick_handle(input);
    let mut e = Expect::new();
    expect_handle(&mut e, "array", kind, false);
    e.check("mlxk_array_eval", mlxk_array_eval(h));
}

fn op_astype(st: &mut State, input: &mut Input) {
    let (h, kind, index) = st.pick_handle(input);
    let dtype = pick_dtype(input);
    let out_null = input.chance(10);
    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "out is NULL");
    }
    if !dtype_valid(dtype) {
        e.fail(MLXK_ERR_DTYPE, format!("dtype code {dtype}"));
    }
    expect_handle(&mut e, "array", kind, false);
    if let (Some(i), true) = (index, dtype_valid(dtype)) {
        let bytes = count(&st.live[i].shape).unwrap() * dtype_size(dtype) as u128;
        if bytes > st.limit as u128 {
            e.fail(
                MLXK_ERR_OUT_OF_MEMORY,
                format!("{bytes} bytes > limit {}", st.limit),
            );
        }
    }
    let mut out = sentinel();
    let p: *mut H = if out_null { null_mut() } else { &mut out };
    let status = unsafe { mlxk_array_astype(h, dtype, p) };
    e.check("mlxk_array_astype", status);
    if status != MLXK_OK {
        assert_eq!(
            out,
            sentinel(),
            "mlxk_array_astype wrote its out-parameter on failure"
        );
        return;
    }
    let src = &st.live[index.unwrap()];
    let shape = src.shape.clone();
    let got = check_result("mlxk_array_astype", out, &shape, dtype);
    let same = dtype == src.dtype;
    if same {
        assert!(
            Some(&got) == src.bytes.as_ref(),
            "astype to the same dtype changed the contents"
        );
    }
    st.live.push(Slot {
        h: out,
        shape,
        dtype,
        bytes: Some(got),
    });
}

/// mlxk_array_to_mlx, then mlxk_array_from_mlx on what it gave: a new handle sharing the same
/// array (same contents), and the host array freed with mlxk_mlx_array_free.
fn op_share(st: &mut State, input: &mut Input) {
    let (h, kind, index) = st.pick_handle(input);
    let out_null = input.chance(10);
    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "mlx_array_out is NULL");
    }
    expect_handle(&mut e, "array", kind, false);
    let mut host = sentinel() as *mut std::ffi::c_void;
    let p: *mut *mut std::ffi::c_void = if out_null { null_mut() } else { &mut host };
    let status = unsafe { mlxk_array_to_mlx(h, p) };
    e.check("mlxk_array_to_mlx", status);
    if status != MLXK_OK {
        assert_eq!(
            host,
            sentinel() as *mut std::ffi::c_void,
            "mlxk_array_to_mlx wrote its out-parameter on failure"
        );
        return;
    }
    let mut out = sentinel();
    let status = unsafe { mlxk_array_from_mlx(host, &mut out) };
    assert_eq!(
        status, MLXK_OK,
        "mlxk_array_from_mlx of a shared array failed"
    );
    assert_eq!(unsafe { mlxk_mlx_array_free(host) }, MLXK_OK);
    let src = &st.live[index.unwrap()];
    let (shape, dtype) = (src.shape.clone(), src.dtype);
    let got = check_result("mlxk_array_from_mlx", out, &shape, dtype);
    if let Some(bytes) = &src.bytes {
        assert!(&got == bytes, "a shared array has other contents");
    }
    st.live.push(Slot {
        h: out,
        shape,
        dtype,
        bytes: Some(got),
    });
}

fn op_limits(st: &mut State, input: &mut Input) {
    match input.u8() % 4 {
        0 => {
            let limit = input.pick(&LIMITS);
            let status = mlxk_set_memory_limit(limit);
            Expect::new().check("mlxk_set_memory_limit", status);
            st.limit = limit;
        }
        1 => {
            let mut got = 0usize;
            let null = input.chance(64);
            let status = unsafe { mlxk_get_memory_limit(if null { null_mut() } else { &mut got }) };
            let mut e = Expect::new();
            if null {
                e.fail(MLXK_ERR_NULL_POINTER, "bytes is NULL");
            }
            e.check("mlxk_get_memory_limit", status);
            if !null {
                assert_eq!(got, st.limit);
            }
        }
        2 => {
            let code = input.u32() as i32;
            let name = status_name(code);
            if (MLXK_OK..=MLXK_ERR_INVALID_HANDLE).contains(&code) {
                assert!(name.starts_with("MLXK_") && name != "MLXK_UNKNOWN_STATUS");
            } else {
                assert_eq!(name, "MLXK_UNKNOWN_STATUS");
            }
        }
        _ => {
            let status =
                mlxk_set_default_device(input.pick(&[MLXK_DEVICE_CPU, MLXK_DEVICE_GPU, 2, -1]));
            check_status("mlxk_set_default_device", status);
            assert!(matches!(
                status,
                MLXK_OK | MLXK_ERR_UNSUPPORTED | MLXK_ERR_INVALID_ARGUMENT
            ));
            // Back to the CPU for the rest of the run (a no-op on a CPU-only build).
            assert_eq!(mlxk_set_default_device(MLXK_DEVICE_CPU), MLXK_OK);
        }
    }
}

pub fn run(input: &mut Input) {
    let mut st = State {
        live: Vec::new(),
        dead: Vec::new(),
        foreign: Foreign::new(),
        limit: 4 << 20,
    };
    assert_eq!(mlxk_set_memory_limit(st.limit), MLXK_OK);
    for _ in 0..MAX_OPS {
        if input.exhausted() {
            break;
        }
        match input.u8() % 16 {
            0..=2 => op_new(&mut st, input, false),
            3 => op_new(&mut st, input, true),
            4 | 5 => op_free(&mut st, input),
            6 | 7 => op_query(&mut st, input),
            8 | 9 => op_read(&mut st, input),
            10 => op_eval(&mut st, input),
            11 | 12 => op_astype(&mut st, input),
            15 => op_share(&mut st, input),
            _ => op_limits(&mut st, input),
        }
    }
    for slot in st.live.drain(..) {
        free_ok(slot.h);
    }
    restore_limit();
}
