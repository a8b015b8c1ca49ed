//! Misuse of the C ABI, through the C ABI: double free and use after free of a handle in every
//! handle argument of every entry point, pointers that are not handles (stack, heap, dangling,
//! a pointer to the handle variable, forged tokens), a handle freed on another thread, NULL
//! out-parameters everywhere, NaN/Inf inputs (propagated exactly where the arithmetic puts
//! them, never past a masked token), B = 0 and T = 0 for every kernel, dims whose products
//! overflow, results above 2^31-1 elements, the memory limit for every constructor and kernel,
//! and a failing call made while the calling thread is being torn down.
//!
//! Every refusal must come with its status, a message naming the function and the argument,
//! untouched out-parameters and no new live handle. The tests share process-wide state (the
//! memory limit, the live-handle count), so they run one at a time.

mod common;
use common::*;

use std::ptr::{null, null_mut};
use std::sync::{Mutex, MutexGuard};

use mlxkern::capi::gated_rms_norm::{mlxk_gated_rms_norm, mlxk_gated_rms_norm_vjp};
use mlxkern::capi::live_handles;
use mlxkern::capi::silu_rms_heads::{mlxk_silu_rms_heads, mlxk_silu_rms_heads_vjp};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A value no out-parameter holds unless the library wrote it.
const SENTINEL: usize = 0x5E57_1000_0007;

fn sentinel() -> H {
    SENTINEL as H
}

/// Checks a refusal: status, message naming `function` and every needle, and no handle made.
#[track_caller]
fn refused(
    status: mlxk_status,
    want: mlxk_status,
    function: &str,
    needles: &[&str],
    live_before: usize,
) {
    let msg = last_error();
    assert_eq!(
        status,
        want,
        "{function}: expected {} got {} ({msg})",
        name(want),
        name(status)
    );
    assert!(
        msg.starts_with(&format!("{function}: ")),
        "message does not name {function}: {msg:?}"
    );
    for n in needles {
        assert!(msg.contains(n), "{function}: message {msg:?} lacks {n:?}");
    }
    assert_eq!(
        live_handles(),
        live_before,
        "{function}: a refused call left a live handle"
    );
}

// ---------------------------------------------------------------------------------------------
// A fixture with valid arguments for every entry point.

struct Fixture {
    arr: H,
    rec: Recurrence,
    x: H,
    gate: H,
    weight: H,
    sx: H,
    q_scale: H,
    k_scale: H,
    /// Cotangents of the head split's q (and k), v.
    dqk: H,
    dv: H,
}

/// Head split fixture: Hk 1, Hv 2, Dk 4, Dv 3: x [2, 3, 2*1*4 + 2*3 = 14].
const SPLIT: [i32; 3] = [1, 2, 3];

impl Fixture {
    fn new() -> Self {
        let mut rng = Rng::fresh();
        Fixture {
            arr: new_f32(&rng.vec(6, 1.0), &[2, 3]),
            rec: Recurrence::random(&mut rng, [2, 3, 1, 2, 32, 4], true, true),
            x: new_bf16(&rng.vec(48, 1.0), &[2, 3, 8]),
            gate: new_bf16(&rng.vec(48, 1.0), &[2, 3, 8]),
            weight: new_bf16(&rng.vec(8, 1.0), &[8]),
            sx: new_bf16(&rng.vec(84, 1.0), &[2, 3, 14]),
            q_scale: new_bf16(&[0.25; 4], &[4]),
            k_scale: new_bf16(&[0.5; 4], &[4]),
            dqk: new_bf16(&rng.vec(24, 1.0), &[2, 3, 1, 4]),
            dv: new_f32(&rng.vec(36, 1.0), &[2, 3, 2, 3]),
        }
    }

    fn free(self) {
        for h in [
            self.arr,
            self.x,
            self.gate,
            self.weight,
            self.sx,
            self.q_scale,
            self.k_scale,
            self.dqk,
            self.dv,
        ] {
            free(h);
        }
        self.rec.free();
    }

    /// Every entry point that takes handles, with its valid handle arguments and a call that
    /// returns (status, out-parameters as returned).
    fn entries(&self) -> Vec<Entry> {
        let r = &self.rec;
        vec![
            Entry::new("mlxk_array_ndim", &[("array", self.arr)], |h| {
                let mut nd = SENTINEL;
                let st = unsafe { mlxk_array_ndim(h[0], &mut nd) };
                (st, vec![], nd == SENTINEL)
            }),
            Entry::new("mlxk_array_shape", &[("array", self.arr)], |h| {
                let mut dims = [-7i32; 4];
                let st = unsafe { mlxk_array_shape(h[0], dims.as_mut_ptr(), 4) };
                (st, vec![], dims == [-7; 4])
            }),
            Entry::new("mlxk_array_dtype", &[("array", self.arr)], |h| {
                let mut d = -99;
                let st = unsafe { mlxk_array_dtype(h[0], &mut d) };
                (st, vec![], d == -99)
            }),
            Entry::new("mlxk_array_nbytes", &[("array", self.arr)], |h| {
                let mut n = SENTINEL;
                let st = unsafe { mlxk_array_nbytes(h[0], &mut n) };
                (st, vec![], n == SENTINEL)
            }),
            Entry::new("mlxk_array_eval", &[("array", self.arr)], |h| {
                (mlxk_array_eval(h[0]), vec![], true)
            }),
            Entry::new("mlxk_array_read", &[("array", self.arr)], |h| {
                let mut buf = [0xA5u8; 24];
                let st = unsafe { mlxk_array_read(h[0], buf.as_mut_ptr().cast(), 24) };
                (st, vec![], buf == [0xA5; 24])
            }),
            Entry::new("mlxk_array_astype", &[("array", self.arr)], |h| {
                let mut out = sentinel();
                let st = unsafe { mlxk_array_astype(h[0], MLXK_DTYPE_BFLOAT16, &mut out) };
                (st, vec![out], out == sentinel())
            }),
            Entry::new("mlxk_array_to_mlx", &[("array", self.arr)], |h| {
                let mut host = SENTINEL as *mut std::ffi::c_void;
                let st = unsafe { mlxk_array_to_mlx(h[0], &mut host) };
                let untouched = host == SENTINEL as *mut std::ffi::c_void;
                if st == MLXK_OK {
                    assert_eq!(unsafe { mlxk_mlx_array_free(host) }, MLXK_OK);
                }
                (st, vec![], untouched)
            }),
            Entry::new(
                "mlxk_compute_g",
                &[("a_log", r.a_log), ("a", r.a), ("dt_bias", r.dt_bias)],
                |h| {
                    let mut g = sentinel();
                    let st = unsafe { mlxk_compute_g(h[0], h[1], h[2], &mut g) };
                    (st, vec![g], g == sentinel())
                },
            ),
            Entry::new(
                "mlxk_gated_delta_update",
                &[
                    ("q", r.q),
                    ("k", r.k),
                    ("v", r.v),
                    ("a", r.a),
                    ("b", r.b),
                    ("a_log", r.a_log),
                    ("dt_bias", r.dt_bias),
                    ("state", r.state.unwrap()),
                    ("mask", r.mask.unwrap()),
                ],
                |h| {
                    let (mut y, mut s) = (sentinel(), sentinel());
                    let st = unsafe {
                        mlxk_gated_delta_update(
                            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], &mut y, &mut s,
                        )
                    };
                    (st, vec![y, s], y == sentinel() && s == sentinel())
                },
            )
            .optional(&["state", "mask"]),
            Entry::new(
                "mlxk_gated_delta_update_vjp",
                &[
                    ("q", r.q),
                    ("k", r.k),
                    ("v", r.v),
                    ("a", r.a),
                    ("b", r.b),
                    ("a_log", r.a_log),
                    ("dt_bias", r.dt_bias),
                    ("state", r.state.unwrap()),
                    ("mask", r.mask.unwrap()),
                    ("dy", r.v),
                    ("dstate_out", r.state.unwrap()),
                ],
                |h| {
                    let mut g = [sentinel(); 8];
                    let [g0, g1, g2, g3, g4, g5, g6, g7] = &mut g;
                    let st = unsafe {
                        mlxk_gated_delta_update_vjp(
                            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], g0,
                            g1, g2, g3, g4, g5, g6, g7,
                        )
                    };
                    (st, g.to_vec(), g.iter().all(|&x| x == sentinel()))
                },
            )
            .optional(&["state", "mask", "dy", "dstate_out"]),
            Entry::new(
                "mlxk_gated_delta_state",
                &[
                    ("k", r.k),
                    ("v", r.v),
                    ("a", r.a),
                    ("b", r.b),
                    ("a_log", r.a_log),
                    ("dt_bias", r.dt_bias),
                    ("state", r.state.unwrap()),
                ],
                |h| {
                    let mut s = sentinel();
                    let lengths = [3i32, 1];
                    let st = unsafe {
                        mlxk_gated_delta_state(
                            h[0],
                            h[1],
                            h[2],
                            h[3],
                            h[4],
                            h[5],
                            h[6],
                            lengths.as_ptr(),
                            2,
                            &mut s,
                        )
                    };
                    (st, vec![s], s == sentinel())
                },
            )
            .optional(&["state"]),
            Entry::new(
                "mlxk_silu_rms_heads",
                &[
                    ("x", self.sx),
                    ("q_scale", self.q_scale),
                    ("k_scale", self.k_scale),
                ],
                |h| {
                    let (mut q, mut k, mut v) = (sentinel(), sentinel(), sentinel());
                    let [hk, hv, dv] = SPLIT;
                    let st = unsafe {
                        mlxk_silu_rms_heads(
                            h[0], h[1], h[2], hk, hv, dv, 1e-6, &mut q, &mut k, &mut v,
                        )
                    };
                    (st, vec![q, k, v], [q, k, v] == [sentinel(); 3])
                },
            ),
            Entry::new(
                "mlxk_silu_rms_heads_vjp",
                &[
                    ("x", self.sx),
                    ("q_scale", self.q_scale),
                    ("k_scale", self.k_scale),
                    ("dq", self.dqk),
                    ("dk", self.dqk),
                    ("dv", self.dv),
                ],
                |h| {
                    let mut g = [sentinel(); 3];
                    let [g0, g1, g2] = &mut g;
                    let [hk, hv, dv] = SPLIT;
                    let st = unsafe {
                        mlxk_silu_rms_heads_vjp(
                            h[0], h[1], h[2], hk, hv, dv, 1e-6, h[3], h[4], h[5], g0, g1, g2,
                        )
                    };
                    (st, g.to_vec(), g == [sentinel(); 3])
                },
            )
            .optional(&["dq", "dk", "dv"]),
            Entry::new(
                "mlxk_gated_rms_norm",
                &[("x", self.x), ("gate", self.gate), ("weight", self.weight)],
                |h| {
                    let mut out = sentinel();
                    let st = unsafe { mlxk_gated_rms_norm(h[0], h[1], h[2], 1e-6, &mut out) };
                    (st, vec![out], out == sentinel())
                },
            ),
            Entry::new(
                "mlxk_gated_rms_norm_vjp",
                &[
                    ("x", self.x),
                    ("gate", self.gate),
                    ("weight", self.weight),
                    ("dout", self.gate),
                ],
                |h| {
                    let mut g = [sentinel(); 3];
                    let [g0, g1, g2] = &mut g;
                    let st = unsafe {
                        mlxk_gated_rms_norm_vjp(h[0], h[1], h[2], 1e-6, h[3], g0, g1, g2)
                    };
                    (st, g.to_vec(), g == [sentinel(); 3])
                },
            )
            .optional(&["dout"]),
        ]
    }
}

type Call = Box<dyn Fn(&[H]) -> (mlxk_status, Vec<H>, bool)>;

struct Entry {
    function: &'static str,
    args: Vec<(&'static str, H)>,
    optional: Vec<&'static str>,
    /// Returns the status, the out-parameter handles, and whether every out-parameter is
    /// untouched.
    call: Call,
}

impl Entry {
    fn new(
        function: &'static str,
        args: &[(&'static str, H)],
        call: impl Fn(&[H]) -> (mlxk_status, Vec<H>, bool) + 'static,
    ) -> Entry {
        Entry {
            function,
            args: args.to_vec(),
            optional: vec![],
            call: Box::new(call),
        }
    }

    fn optional(mut self, names: &[&'static str]) -> Entry {
        self.optional = names.to_vec();
        self
    }

    fn handles(&self) -> Vec<H> {
        self.args.iter().map(|a| a.1).collect()
    }

    /// Calls with all arguments valid: must succeed; frees what it made.
    #[track_caller]
    fn succeeds(&self) {
        let before = live_handles();
        let (st, outs, _) = (self.call)(&self.handles());
        assert_eq!(st, MLXK_OK, "{}: {}", self.function, last_error());
        for h in outs {
            free(h);
        }
        assert_eq!(live_handles(), before);
    }

    /// Calls with argument `i` replaced by `bad`: must be refused with `want`, naming it.
    #[track_caller]
    fn refuses(&self, i: usize, bad: H, want: mlxk_status, what: &str) {
        let before = live_handles();
        let mut h = self.handles();
        h[i] = bad;
        let (st, _, untouched) = (self.call)(&h);
        let arg = self.args[i].0;
        let msg = last_error();
        assert_eq!(
            st,
            want,
            "{} with {what} as {arg}: expected {} got {} ({msg})",
            self.function,
            name(want),
            name(st)
        );
        assert!(msg.starts_with(&format!("{}: ", self.function)), "{msg:?}");
        assert!(
            msg.contains(arg),
            "{} with {what} as {arg}: message {msg:?} does not name it",
            self.function
        );
        assert!(
            untouched,
            "{} with {what} as {arg}: an out-parameter was written",
            self.function
        );
        assert_eq!(
            live_handles(),
            before,
            "{} with {what} as {arg}: a handle was made",
            self.function
        );
    }
}

/// Pointers that were never handles. None is ever dereferenced by the library (the C stress
/// test and the fuzz targets check that under AddressSanitizer).
fn foreign_pointers(live: H) -> Vec<(String, H)> {
    let local = 0u64;
    let heap = Box::new([0u64; 8]);
    let gone = Box::new([0u64; 8]);
    let dangling = &*gone as *const [u64; 8] as usize;
    drop(gone);
    let handle_var = live;
    let host = vec![1.0f32; 4];
    let out = vec![
        ("a stack address".to_string(), &local as *const u64 as H),
        ("a heap address".to_string(), &*heap as *const [u64; 8] as H),
        ("a dangling heap address".to_string(), dangling as H),
        (
            "the address of a handle variable (&h for h)".to_string(),
            &handle_var as *const H as H,
        ),
        ("a host data pointer".to_string(), host.as_ptr() as H),
        ("an odd address".to_string(), 0x1001 as H),
        ("a small integer".to_string(), 8 as H),
        ("the highest address".to_string(), usize::MAX as H),
        (
            "a forged token never handed out".to_string(),
            (live as usize + 8 * 1_000_000_000) as H,
        ),
    ];
    // The addresses stay meaningful (stack frame gone, heap box leaked on purpose is not
    // needed): the library compares values only.
    std::mem::forget(heap);
    out
}

#[test]
fn every_handle_argument_refuses_freed_foreign_and_null_handles() {
    let _s = serial();
    let fx = Fixture::new();
    // A freed handle, and one freed on another thread.
    let freed = new_f32(&[1.0], &[1]);
    free(freed);
    let freed_elsewhere = new_f32(&[1.0], &[1]) as usize;
    std::thread::spawn(move || free(freed_elsewhere as H))
        .join()
        .unwrap();
    let mut cases: Vec<(String, H)> = vec![
        ("a freed handle".into(), freed),
        (
            "a handle freed on another thread".into(),
            freed_elsewhere as H,
        ),
    ];
    cases.extend(foreign_pointers(fx.arr));
    let mut checked = 0;
    for e in fx.entries() {
        e.succeeds();
        for i in 0..e.args.len() {
            for (what, bad) in &cases {
                e.refuses(i, *bad, MLXK_ERR_INVALID_HANDLE, what);
                checked += 1;
            }
            if e.optional.contains(&e.args[i].0) {
                // NULL means absent: still a success.
                let mut h = e.handles();
                h[i] = null_mut();
                let (st, outs, _) = (e.call)(&h);
                assert_eq!(
                    st,
                    MLXK_OK,
                    "{} with NULL {}: {}",
                    e.function,
                    e.args[i].0,
                    last_error()
                );
                outs.into_iter().for_each(free);
            } else {
                e.refuses(i, null_mut(), MLXK_ERR_NULL_POINTER, "NULL");
            }
            checked += 1;
        }
        // The valid arguments still work after all that.
        e.succeeds();
    }
    eprintln!("{checked} refused handle arguments checked");
    fx.free();
}

#[test]
fn double_free_and_free_of_foreign_pointers() {
    let _s = serial();
    let a = new_f32(&[1.0, 2.0], &[2]);
    let before = live_handles();
    ok(mlxk_array_free(a));
    assert_eq!(live_handles(), before - 1);
    for _ in 0..3 {
        refused(
            mlxk_array_free(a),
            MLXK_ERR_INVALID_HANDLE,
            "mlxk_array_free",
            &["array", "not a live"],
            before - 1,
        );
    }
    for (what, p) in foreign_pointers(a) {
        let n = live_handles();
        let st = mlxk_array_free(p);
        assert_eq!(st, MLXK_ERR_INVALID_HANDLE, "freeing {what}");
        assert_eq!(live_handles(), n);
    }
    ok(mlxk_array_free(null_mut()));
    // A handle freed on another thread is dead here, and freeing it again here is refused.
    let b = new_f32(&[3.0], &[1]) as usize;
    std::thread::spawn(move || ok(mlxk_array_free(b as H)))
        .join()
        .unwrap();
    let n = live_handles();
    refused(
        mlxk_array_free(b as H),
        MLXK_ERR_INVALID_HANDLE,
        "mlxk_array_free",
        &["array"],
        n,
    );
    refused(
        mlxk_array_eval(b as H),
        MLXK_ERR_INVALID_HANDLE,
        "mlxk_array_eval",
        &["array"],
        n,
    );
    // A handle made on one thread works on another.
    let c = new_f32(&[4.0, 5.0], &[2]) as usize;
    let read = std::thread::spawn(move || read_f32(c as H)).join().unwrap();
    assert_eq!(read, vec![4.0, 5.0]);
    free(c as H);
}

#[test]
fn lazy_results_outlive_their_freed_inputs() {
    let _s = serial();
    let a = new_f32(&[1.5, -2.25, 3.0], &[3]);
    let mut b = null_mut();
    ok(unsafe { mlxk_array_astype(a, MLXK_DTYPE_BFLOAT16, &mut b) });
    free(a);
    assert_eq!(read_bf16(b), vec![1.5, -2.25, 3.0]);
    free(b);
}

#[test]
fn null_out_parameters_everywhere() {
    let _s = serial();
    let fx = Fixture::new();
    let r = &fx.rec;
    let n = live_handles();
    let shape = [2i32, 3];
    let data = [0f32; 6];
    let f = "mlxk_array_to_mlx";
    refused(
        unsafe { mlxk_array_to_mlx(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["mlx_array_out"],
        n,
    );
    let mut host = null_mut();
    assert_eq!(unsafe { mlxk_array_to_mlx(fx.arr, &mut host) }, MLXK_OK);
    let f = "mlxk_array_from_mlx";
    refused(
        unsafe { mlxk_array_from_mlx(host, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["out"],
        n,
    );
    let mut out = sentinel();
    refused(
        unsafe { mlxk_array_from_mlx(std::ptr::null(), &mut out) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["mlx_array"],
        n,
    );
    assert_eq!(
        out,
        sentinel(),
        "{f}: a refused call wrote its out-parameter"
    );
    assert_eq!(unsafe { mlxk_mlx_array_free(host) }, MLXK_OK);
    let f = "mlxk_array_new";
    refused(
        unsafe {
            mlxk_array_new(
                data.as_ptr().cast(),
                shape.as_ptr(),
                2,
                MLXK_DTYPE_FLOAT32,
                null_mut(),
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["out"],
        n,
    );
    refused(
        unsafe {
            mlxk_array_new(
                null(),
                shape.as_ptr(),
                2,
                MLXK_DTYPE_FLOAT32,
                &mut null_mut(),
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["data"],
        n,
    );
    refused(
        unsafe {
            mlxk_array_new(
                data.as_ptr().cast(),
                null(),
                2,
                MLXK_DTYPE_FLOAT32,
                &mut null_mut(),
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["shape"],
        n,
    );
    refused(
        unsafe { mlxk_array_zeros(shape.as_ptr(), 2, MLXK_DTYPE_FLOAT32, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_zeros",
        &["out"],
        n,
    );
    refused(
        unsafe { mlxk_array_zeros(null(), 2, MLXK_DTYPE_FLOAT32, &mut null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_zeros",
        &["shape"],
        n,
    );
    refused(
        unsafe { mlxk_array_ndim(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_ndim",
        &["ndim"],
        n,
    );
    refused(
        unsafe { mlxk_array_shape(fx.arr, null_mut(), 2) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_shape",
        &["dims"],
        n,
    );
    refused(
        unsafe { mlxk_array_dtype(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_dtype",
        &["dtype"],
        n,
    );
    refused(
        unsafe { mlxk_array_nbytes(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_nbytes",
        &["nbytes"],
        n,
    );
    refused(
        unsafe { mlxk_array_read(fx.arr, null_mut(), 24) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_read",
        &["dst"],
        n,
    );
    refused(
        unsafe { mlxk_array_astype(fx.arr, MLXK_DTYPE_FLOAT16, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_astype",
        &["out"],
        n,
    );
    refused(
        unsafe { mlxk_get_memory_limit(null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_get_memory_limit",
        &["bytes"],
        n,
    );
    refused(
        unsafe { mlxk_compute_g(r.a_log, r.a, r.dt_bias, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_compute_g",
        &["g"],
        n,
    );
    let [q, k, v, a, b, al, dt, s, m] = r.args();
    let mut h = sentinel();
    let f = "mlxk_gated_delta_update";
    refused(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, null_mut(), &mut h) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["y"],
        n,
    );
    refused(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut h, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["state_out"],
        n,
    );
    assert_eq!(h, sentinel());
    let same: *mut H = &mut h;
    refused(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, same, same) },
        MLXK_ERR_INVALID_ARGUMENT,
        f,
        &["y and state_out"],
        n,
    );
    assert_eq!(h, sentinel());
    let lengths = [1i32, 2];
    let f = "mlxk_gated_delta_state";
    refused(
        unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, s, lengths.as_ptr(), 2, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["state_out"],
        n,
    );
    refused(
        unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, s, null(), 2, &mut h) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["accepted_lengths"],
        n,
    );
    let [hk, hv, dv] = SPLIT;
    let (mut o1, mut o2) = (sentinel(), sentinel());
    let f = "mlxk_silu_rms_heads";
    let (x, qs, ks) = (fx.sx, fx.q_scale, fx.k_scale);
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, null_mut(), &mut o1, &mut o2) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["q"],
        n,
    );
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut o1, null_mut(), &mut o2) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["k"],
        n,
    );
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut o1, &mut o2, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["v"],
        n,
    );
    let p1: *mut H = &mut o1;
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, p1, &mut o2, p1) },
        MLXK_ERR_INVALID_ARGUMENT,
        f,
        &["different"],
        n,
    );
    assert_eq!((o1, o2), (sentinel(), sentinel()));
    refused(
        unsafe { mlxk_gated_rms_norm(fx.x, fx.gate, fx.weight, 1e-6, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_gated_rms_norm",
        &["out"],
        n,
    );
    // The backward passes: each out-parameter NULL in turn, then two at one place.
    let (dqk, dvc) = (fx.dqk, fx.dv);
    for (slot, name) in ["dx", "dq_scale", "dk_scale"].into_iter().enumerate() {
        let mut o = [sentinel(); 3];
        let [a, b, c] = &mut o;
        let ptrs = [a as *mut H, b as *mut H, c as *mut H];
        let mut args = ptrs;
        args[slot] = null_mut();
        refused(
            unsafe {
                mlxk_silu_rms_heads_vjp(
                    x, qs, ks, hk, hv, dv, 1e-6, dqk, dqk, dvc, args[0], args[1], args[2],
                )
            },
            MLXK_ERR_NULL_POINTER,
            "mlxk_silu_rms_heads_vjp",
            &[name],
            n,
        );
        args = ptrs;
        args[(slot + 1) % 3] = args[slot];
        refused(
            unsafe {
                mlxk_silu_rms_heads_vjp(
                    x, qs, ks, hk, hv, dv, 1e-6, dqk, dqk, dvc, args[0], args[1], args[2],
                )
            },
            MLXK_ERR_INVALID_ARGUMENT,
            "mlxk_silu_rms_heads_vjp",
            &["same place"],
            n,
        );
        assert_eq!(o, [sentinel(); 3]);
    }
    for (slot, name) in ["dx", "dgate", "dweight"].into_iter().enumerate() {
        let mut o = [sentinel(); 3];
        let [a, b, c] = &mut o;
        let ptrs = [a as *mut H, b as *mut H, c as *mut H];
        let mut args = ptrs;
        args[slot] = null_mut();
        let (x, g, w) = (fx.x, fx.gate, fx.weight);
        refused(
            unsafe { mlxk_gated_rms_norm_vjp(x, g, w, 1e-6, g, args[0], args[1], args[2]) },
            MLXK_ERR_NULL_POINTER,
            "mlxk_gated_rms_norm_vjp",
            &[name],
            n,
        );
        args = ptrs;
        args[(slot + 1) % 3] = args[slot];
        refused(
            unsafe { mlxk_gated_rms_norm_vjp(x, g, w, 1e-6, g, args[0], args[1], args[2]) },
            MLXK_ERR_INVALID_ARGUMENT,
            "mlxk_gated_rms_norm_vjp",
            &["same place"],
            n,
        );
        assert_eq!(o, [sentinel(); 3]);
    }
    let f = "mlxk_glm52_layout_canonical";
    refused(
        unsafe { mlxkern::capi::glm52::mlxk_glm52_layout_canonical(6144, 2048, 4, 64, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["out"],
        n,
    );
    let f = "mlxk_glm52_layout_validate";
    refused(
        unsafe { mlxkern::capi::glm52::mlxk_glm52_layout_validate(null(), 4, 64) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["layout"],
        n,
    );
    fx.free();
}

// ---------------------------------------------------------------------------------------------
// NaN and Inf

/// f32 recurrence inputs with host copies, for exact NaN bookkeeping.
struct F32Rec {
    dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    state: Vec<f32>,
    mask: Vec<bool>,
}

impl F32Rec {
    fn new(rng: &mut Rng, dims: [usize; 6]) -> Self {
        let [b, t, hk, hv, dk, dv] = dims;
        F32Rec {
            dims,
            q: rng.vec(b * t * hk * dk, 0.2),
            k: rng.vec(b * t * hk * dk, 0.2),
            v: rng.vec(b * t * hv * dv, 1.0),
            a: rng.vec(b * t * hv, 1.0),
            b: rng.vec(b * t * hv, 1.0),
            a_log: rng.vec(hv, 0.5),
            dt_bias: rng.vec(hv, 0.5),
            state: rng.vec(b * hv * dv * dk, 0.5),
            mask: vec![true; b * t],
        }
    }

    /// Runs update; returns (y, state_out) as f32.
    fn update(&self) -> (Vec<f32>, Vec<f32>) {
        let [b, t, hk, hv, dk, dv] = self.dims.map(|d| d as i32);
        let hs = [
            new_f32(&self.q, &[b, t, hk, dk]),
            new_f32(&self.k, &[b, t, hk, dk]),
            new_f32(&self.v, &[b, t, hv, dv]),
            new_f32(&self.a, &[b, t, hv]),
            new_f32(&self.b, &[b, t, hv]),
            new_f32(&self.a_log, &[hv]),
            new_f32(&self.dt_bias, &[hv]),
            new_f32(&self.state, &[b, hv, dv, dk]),
            new_bool(&self.mask, &[b, t]),
        ];
        let (mut y, mut s) = (null_mut(), null_mut());
        ok(unsafe {
            mlxk_gated_delta_update(
                hs[0], hs[1], hs[2], hs[3], hs[4], hs[5], hs[6], hs[7], hs[8], &mut y, &mut s,
            )
        });
        let out = (read_f32(y), read_f32(s));
        hs.into_iter().chain([y, s]).for_each(free);
        out
    }

    fn replay(&self, lengths: &[i32]) -> Vec<f32> {
        let [b, t, hk, hv, dk, dv] = self.dims.map(|d| d as i32);
        let hs = [
            new_f32(&self.k, &[b, t, hk, dk]),
            new_f32(&self.v, &[b, t, hv, dv]),
            new_f32(&self.a, &[b, t, hv]),
            new_f32(&self.b, &[b, t, hv]),
            new_f32(&self.a_log, &[hv]),
            new_f32(&self.dt_bias, &[hv]),
            new_f32(&self.state, &[b, hv, dv, dk]),
        ];
        let mut s = null_mut();
        ok(unsafe {
            mlxk_gated_delta_state(
                hs[0],
                hs[1],
                hs[2],
                hs[3],
                hs[4],
                hs[5],
                hs[6],
                lengths.as_ptr(),
                lengths.len(),
                &mut s,
            )
        });
        let out = read_f32(s);
        hs.into_iter().chain([s]).for_each(free);
        out
    }
}

/// Asserts `x[i]` is NaN exactly where `nan(i)` says, and finite elsewhere.
#[track_caller]
fn nan_exactly(what: &str, x: &[f32], nan: impl Fn(usize) -> bool) {
    for (i, v) in x.iter().enumerate() {
        if nan(i) {
            assert!(v.is_nan(), "{what}[{i}] = {v}, expected NaN");
        } else {
            assert!(v.is_finite(), "{what}[{i}] = {v}, expected finite");
        }
    }
}

#[test]
fn nan_and_inf_in_the_recurrence_propagate_exactly_and_never_past_a_mask() {
    let _s = serial();
    let mut rng = Rng::fresh();
    let dims = [2usize, 4, 1, 2, 32, 3];
    let [_, t, _, hv, dk, dv] = dims;
    let y_index = |b: usize, tt: usize, h: usize, d: usize| ((b * t + tt) * hv + h) * dv + d;
    let s_row = |i: usize| i / dk; // flat state index -> (b, h, dv) row
    let base = F32Rec::new(&mut rng, dims);
    let (y0, s0) = base.update();
    nan_exactly("y", &y0, |_| false);
    nan_exactly("state_out", &s0, |_| false);

    // NaN in v[b=1, t=1, h=0, dv=2]: row dv=2 of head 0 in batch 1, from token 1 on.
    let mut r = F32Rec {
        v: base.v.clone(),
        ..F32Rec::new(&mut rng, dims)
    };
    r.v[y_index(1, 1, 0, 2)] = f32::NAN;
    let (y, s) = r.update();
    nan_exactly("y (NaN in v)", &y, |i| {
        (0..t).any(|tt| tt >= 1 && i == y_index(1, tt, 0, 2))
    });
    nan_exactly("state_out (NaN in v)", &s, |i| {
        s_row(i) == (hv + 0) * dv + 2
    });
    // The same token masked: no NaN anywhere, y 0 there, and the replay over the prefix
    // before it is finite while the one including it is not.
    r.mask[t + 1] = false;
    let (y, s) = r.update();
    nan_exactly("y (NaN in a masked v)", &y, |_| false);
    assert!((0..hv * dv).all(|j| y[y_index(1, 1, 0, 0) + j] == 0.0));
    nan_exactly("state_out (NaN in a masked v)", &s, |_| false);
    r.mask[t + 1] = true;
    nan_exactly("replay before the NaN token", &r.replay(&[4, 1]), |_| false);
    nan_exactly("replay over the NaN token", &r.replay(&[0, 2]), |i| {
        s_row(i) == (hv + 0) * dv + 2
    });

    // NaN in the gate a[b=0, t=2, h=1]: every row of head 1 in batch 0 from token 2 on.
    let mut r = F32Rec::new(&mut rng, dims);
    r.a[2 * hv + 1] = f32::NAN;
    let (y, s) = r.update();
    nan_exactly("y (NaN in a)", &y, |i| {
        let (b, tt, h) = (i / (t * hv * dv), i / (hv * dv) % t, i / dv % hv);
        b == 0 && h == 1 && tt >= 2
    });
    nan_exactly("state_out (NaN in a)", &s, |i| s_row(i) / dv == 1); // (b 0, h 1)
                                                                     // NaN in b (beta) behaves the same.
    let mut r = F32Rec::new(&mut rng, dims);
    r.b[2 * hv + 1] = f32::NAN;
    let (_, s) = r.update();
    nan_exactly("state_out (NaN in b)", &s, |i| s_row(i) / dv == 1);

    // NaN in a_log[0]: head 0 everywhere; with every token masked, nothing at all.
    let mut r = F32Rec::new(&mut rng, dims);
    r.a_log[0] = f32::NAN;
    let (y, s) = r.update();
    nan_exactly("y (NaN in a_log)", &y, |i| i / dv % hv == 0);
    nan_exactly("state_out (NaN in a_log)", &s, |i| s_row(i) / dv % hv == 0);
    r.mask = vec![false; dims[0] * t];
    let (y, s) = r.update();
    assert!(y.iter().all(|&v| v == 0.0), "masked tokens give y = 0");
    assert_eq!(
        bits(&s),
        bits(&r.state),
        "all tokens masked: the state is returned untouched"
    );

    // +Inf in q[b=0, t=1, key head 0]: y at that token is not finite (both value heads read key
    // head 0); the state never sees q.
    let mut r = F32Rec::new(&mut rng, dims);
    r.q[dk + 5] = f32::INFINITY;
    let (y, s) = r.update();
    for (i, v) in y.iter().enumerate() {
        let (b, tt) = (i / (t * hv * dv), i / (hv * dv) % t);
        assert_eq!(v.is_finite(), !(b == 0 && tt == 1), "y[{i}] = {v}");
    }
    nan_exactly("state_out (Inf in q)", &s, |_| false);
    // Huge finite values overflow to Inf/NaN without crashing.
    let mut r = F32Rec::new(&mut rng, dims);
    r.v.iter_mut().for_each(|x| *x *= f32::MAX);
    r.k.iter_mut().for_each(|x| *x = f32::MAX);
    let _ = r.update();
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn nan_and_inf_in_compute_g() {
    let _s = serial();
    let hv = 4;
    let mut a = vec![0.3f32; 3 * hv];
    a[hv + 2] = f32::NAN;
    a[1] = f32::INFINITY;
    a[2 * hv + 3] = f32::NEG_INFINITY;
    let mut a_log = vec![0.1f32; hv];
    a_log[0] = f32::NAN;
    let ha = new_f32(&a, &[3, hv as i32]);
    let hl = new_f32(&a_log, &[hv as i32]);
    let hd = new_f32(&[0.0; 4], &[hv as i32]);
    let mut g = null_mut();
    ok(unsafe { mlxk_compute_g(hl, ha, hd, &mut g) });
    let g = {
        let v = read_f32(g);
        free(g);
        v
    };
    for (i, &x) in g.iter().enumerate() {
        match i {
            _ if i % hv == 0 => assert!(x.is_nan(), "g[{i}] = {x}: a_log NaN"),
            6 => assert!(x.is_nan(), "g[{i}] = {x}: a NaN"),
            1 => assert_eq!(x, 0.0, "a = +Inf gives g = 0"),
            11 => assert_eq!(x, 1.0, "a = -Inf gives g = 1"),
            _ => assert!(x > 0.0 && x < 1.0, "g[{i}] = {x}"),
        }
    }
    for h in [ha, hl, hd] {
        free(h);
    }
}

#[test]
fn nan_and_inf_in_the_norms() {
    let _s = serial();
    // Head split: Hk 2, Dk 4, Hv 2, Dv 3: channels q 0..8, k 8..16, v 16..22.
    let (hk, dk, hv, dv) = (2usize, 4usize, 2usize, 3usize);
    let c = 2 * hk * dk + hv * dv;
    let mut rng = Rng::fresh();
    let mut x = rng.vec(2 * c, 1.0);
    x[c + 5] = f32::NAN; // s 1, q head 1
    x[9] = f32::INFINITY; // s 0, k head 0, element 1
    x[16 + 4] = f32::NAN; // s 0, v head 1, element 1
    let hx = new_f32(&x, &[1, 2, c as i32]);
    let qs = new_f32(&[0.5; 4], &[4]);
    let ks = new_f32(&[0.5; 4], &[4]);
    let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
    ok(unsafe {
        mlxk_silu_rms_heads(
            hx, qs, ks, hk as i32, hv as i32, dv as i32, 1e-6, &mut q, &mut k, &mut v,
        )
    });
    let (qv, kv, vv) = (read_f32(q), read_f32(k), read_f32(v));
    nan_exactly("q", &qv, |i| i / dk == hk + 1); // (s 1, head 1)
                                                 // +Inf in one k element: mean(silu^2) is Inf, rsqrt 0: that element NaN (Inf * 0), the
                                                 // rest of the head 0.
    for (i, &val) in kv.iter().enumerate() {
        match i {
            1 => assert!(val.is_nan(), "k[1] = {val}"),
            0 | 2 | 3 => assert_eq!(val, 0.0, "k[{i}]"),
            _ => assert!(val.is_finite(), "k[{i}] = {val}"),
        }
    }
    nan_exactly("v", &vv, |i| i == dv + 1);
    for h in [hx, qs, ks, q, k, v] {
        free(h);
    }

    // Gated norm, x [3, 8]: NaN in x row 1 -> row 1 NaN; +Inf in x row 2 -> that element NaN,
    // the rest of row 2 zero; NaN in the gate at row 0 -> that element only.
    let mut x = rng.vec(24, 1.0);
    let mut gate = rng.vec(24, 1.0);
    x[8 + 2] = f32::NAN;
    x[16 + 5] = f32::INFINITY;
    gate[3] = f32::NAN;
    let (hx, hg, hw) = (
        new_f32(&x, &[3, 8]),
        new_f32(&gate, &[3, 8]),
        new_f32(&rng.vec(8, 1.0), &[8]),
    );
    let mut out = null_mut();
    ok(unsafe { mlxk_gated_rms_norm(hx, hg, hw, 1e-6, &mut out) });
    let o = read_f32(out);
    for (i, &val) in o.iter().enumerate() {
        match i {
            3 | 8..=15 | 21 => assert!(val.is_nan(), "out[{i}] = {val}"),
            16..=23 => assert_eq!(val, 0.0, "out[{i}]"),
            _ => assert!(val.is_finite(), "out[{i}] = {val}"),
        }
    }
    for h in [hx, hg, hw, out] {
        free(h);
    }
}

// ---------------------------------------------------------------------------------------------
// Empty batches and sequences

#[test]
fn empty_batches_and_sequences_for_every_kernel() {
    let _s = serial();
    let mut rng = Rng::fresh();
    // Recurrence: B = 0, and T = 0 (state returned bit for bit).
    for dims in [
        [0usize, 3, 1, 2, 32, 4],
        [2, 0, 1, 2, 32, 4],
        [0, 0, 2, 4, 64, 8],
    ] {
        let [b, t, _, hv, dk, dv] = dims;
        let r = Recurrence::random(&mut rng, dims, true, true);
        let (st, y, s) = r.run();
        ok(st);
        assert_eq!(shape_of(y), [b, t, hv, dv].map(|d| d as i32));
        assert_eq!(shape_of(s), [b, hv, dv, dk].map(|d| d as i32));
        assert!(read_bytes(y).is_empty());
        assert_eq!(
            read_bytes(s),
            read_bytes(r.state.unwrap()),
            "T = 0 or B = 0: state unchanged"
        );
        free(y);
        free(s);
        // compute_g on the empty a.
        let mut g = null_mut();
        ok(unsafe { mlxk_compute_g(r.a_log, r.a, r.dt_bias, &mut g) });
        assert_eq!(shape_of(g), [b, t, hv].map(|d| d as i32));
        free(g);
        // Replay: lengths all 0 (the only valid ones when T = 0; none when B = 0).
        let lengths = vec![0i32; b];
        let (st, s) = r.replay(&lengths);
        ok(st);
        assert_eq!(read_bytes(s), read_bytes(r.state.unwrap()));
        free(s);
        if b > 0 && t == 0 {
            let n = live_handles();
            let (st, _) = r.replay(&vec![1; b]);
            refused(
                st,
                MLXK_ERR_INVALID_ARGUMENT,
                "mlxk_gated_delta_state",
                &["accepted_lengths[0]", "T (0)"],
                n,
            );
        }
        if b == 0 {
            // n_lengths 0 with a NULL pointer is allowed.
            let [_, k, v, a, bb, al, dt, st_h, _] = r.args();
            let mut s = null_mut();
            ok(unsafe { mlxk_gated_delta_state(k, v, a, bb, al, dt, st_h, null(), 0, &mut s) });
            free(s);
        }
        r.free();
    }
    // Head split with B = 0 and S = 0.
    for (b, s) in [(0, 3), (2, 0)] {
        let x = new_bf16(&[], &[b, s, 14]);
        let qs = new_bf16(&[0.25; 4], &[4]);
        let ks = new_bf16(&[0.5; 4], &[4]);
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        let [hk, hv, dv] = SPLIT;
        ok(unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut q, &mut k, &mut v) });
        assert_eq!(shape_of(q), [b, s, 1, 4]);
        assert_eq!(shape_of(v), [b, s, 2, 3]);
        assert!(read_bytes(k).is_empty());
        for h in [x, qs, ks, q, k, v] {
            free(h);
        }
    }
    // Gated norm with no rows is fine; a zero width D is a clear error.
    for shape in [vec![0, 8], vec![3, 0, 8]] {
        let x = new_bf16(&[], &shape);
        let g = new_bf16(&[], &shape);
        let w = new_bf16(&[1.0; 8], &[8]);
        let mut out = null_mut();
        ok(unsafe { mlxk_gated_rms_norm(x, g, w, 1e-6, &mut out) });
        assert_eq!(shape_of(out), shape);
        assert!(read_bytes(out).is_empty());
        for h in [x, g, w, out] {
            free(h);
        }
    }
    let x = new_bf16(&[], &[3, 0]);
    let w = new_bf16(&[], &[0]);
    let n = live_handles();
    let mut out = sentinel();
    refused(
        unsafe { mlxk_gated_rms_norm(x, x, w, 1e-6, &mut out) },
        MLXK_ERR_SHAPE,
        "mlxk_gated_rms_norm",
        &["x", "(D) is 0"],
        n,
    );
    assert_eq!(out, sentinel());
    free(x);
    free(w);
    // Empty arrays: NULL data, zero-length reads into NULL, casts.
    let mut e = null_mut();
    ok(unsafe { mlxk_array_new(null(), [0i32, 5].as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut e) });
    ok(unsafe { mlxk_array_read(e, null_mut(), 0) });
    let mut c = null_mut();
    ok(unsafe { mlxk_array_astype(e, MLXK_DTYPE_INT8, &mut c) });
    assert_eq!(shape_of(c), [0, 5]);
    free(c);
    free(e);
}

// ---------------------------------------------------------------------------------------------
// Sizes: overflowing dims, > 2^31-1 elements, the memory limit

#[test]
fn overflowing_dims_and_oversized_arrays_are_refused_before_allocating() {
    let _s = serial();
    let n = live_handles();
    let one = [0u8; 16]; // never read: the shape is refused first
    let max = i32::MAX;
    let cases: Vec<(Vec<i32>, mlxk_dtype, mlxk_status, &str)> = vec![
        (
            vec![max, max, max],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^93
        (
            vec![max, max, max, max, 2],
            MLXK_DTYPE_UINT8,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // > 2^64
        (
            vec![65536, 65536],
            MLXK_DTYPE_BOOL,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^32
        (
            vec![46341, 46341],
            MLXK_DTYPE_INT8,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^31 + 9
        (
            vec![1 << 16, 1 << 15],
            MLXK_DTYPE_UINT8,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^31
        (
            vec![-1, 4],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_SHAPE,
            "dimension 0 is -1",
        ),
        (
            vec![4, i32::MIN],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_SHAPE,
            "dimension 1",
        ),
        (
            vec![1; 17],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_SHAPE,
            "MLXK_MAX_NDIM",
        ),
    ];
    for (shape, dtype, want, needle) in &cases {
        let arg = if shape.len() > 16 { "ndim" } else { "shape" };
        let mut out = sentinel();
        let st = unsafe {
            mlxk_array_new(
                one.as_ptr().cast(),
                shape.as_ptr(),
                shape.len(),
                *dtype,
                &mut out,
            )
        };
        refused(st, *want, "mlxk_array_new", &[arg, needle], n);
        assert_eq!(out, sentinel());
        let st = unsafe { mlxk_array_zeros(shape.as_ptr(), shape.len(), *dtype, &mut out) };
        refused(st, *want, "mlxk_array_zeros", &[arg, needle], n);
    }
    // Exactly 2^31-1 elements is within the element cap; 2 GiB of bool is then refused by a
    // 1 GiB memory limit (and would be allocated under the default one: not done here).
    ok(mlxk_set_memory_limit(1 << 30));
    let mut out = sentinel();
    let st = unsafe { mlxk_array_zeros([max].as_ptr(), 1, MLXK_DTYPE_BOOL, &mut out) };
    ok(mlxk_set_memory_limit(0));
    refused(
        st,
        MLXK_ERR_OUT_OF_MEMORY,
        "mlxk_array_zeros",
        &["2147483647 bytes", "memory limit"],
        n,
    );

    // Empty arrays may carry huge dims (their products overflow i64 on the way); every kernel
    // takes them and gives empty results.
    let huge = [max, max, max, 0];
    let z = |shape: &[i32], dtype| {
        let mut h = null_mut();
        ok(unsafe { mlxk_array_zeros(shape.as_ptr(), shape.len(), dtype, &mut h) });
        h
    };
    let x = z(&[huge.as_slice(), &[8]].concat(), MLXK_DTYPE_BFLOAT16);
    let w = z(&[8], MLXK_DTYPE_BFLOAT16);
    let mut out = null_mut();
    ok(unsafe { mlxk_gated_rms_norm(x, x, w, 1e-6, &mut out) });
    assert_eq!(shape_of(out), [max, max, max, 0, 8]);
    assert!(read_bytes(out).is_empty());
    free(out);
    let a_log = z(&[8], MLXK_DTYPE_FLOAT32);
    let mut g = null_mut();
    ok(unsafe { mlxk_compute_g(a_log, x, w, &mut g) });
    assert_eq!(shape_of(g), [max, max, max, 0, 8]);
    free(g);
    let sx = z(&[0, max, 14], MLXK_DTYPE_BFLOAT16);
    let sc = z(&[4], MLXK_DTYPE_BFLOAT16);
    let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
    let [hk, hv, dv] = SPLIT;
    ok(unsafe { mlxk_silu_rms_heads(sx, sc, sc, hk, hv, dv, 1e-6, &mut q, &mut k, &mut v) });
    assert_eq!(shape_of(v), [0, max, 2, 3]);
    for h in [q, k, v, sx, sc, x, w, a_log] {
        free(h);
    }
    // Recurrence with B = 0 and huge T, Hk, Dv.
    let (b, t, hk, hv, dk, dv) = (0, max, 4096, 8192, 32, max);
    let q = z(&[b, t, hk, dk], MLXK_DTYPE_BFLOAT16);
    let v = z(&[b, t, hv, dv], MLXK_DTYPE_BFLOAT16);
    let a = z(&[b, t, hv], MLXK_DTYPE_BFLOAT16);
    let al = z(&[hv], MLXK_DTYPE_FLOAT32);
    let dt = z(&[hv], MLXK_DTYPE_BFLOAT16);
    let (mut y, mut s) = (null_mut(), null_mut());
    ok(unsafe { mlxk_gated_delta_update(q, q, v, a, a, al, dt, null(), null(), &mut y, &mut s) });
    assert_eq!(shape_of(y), [b, t, hv, dv]);
    assert_eq!(shape_of(s), [b, hv, dv, dk]);
    assert!(read_bytes(s).is_empty());
    free(y);
    free(s);
    ok(unsafe { mlxk_gated_delta_state(q, v, a, a, al, dt, null(), null(), 0, &mut s) });
    assert!(read_bytes(s).is_empty());
    free(s);
    for h in [q, v, a, al, dt] {
        free(h);
    }

    // Small inputs whose result would hold more than 2^31-1 elements: B = 1, T = 0,
    // Hv = Dv = 65536 makes a state of 2^37 elements (512 GiB). Refused before anything is
    // built: neither MLX nor the OS is ever asked for it.
    let (b, t, hk, hv, dk, dv) = (1, 0, 1, 65536, 32, 65536);
    let q = z(&[b, t, hk, dk], MLXK_DTYPE_BFLOAT16);
    let v = z(&[b, t, hv, dv], MLXK_DTYPE_BFLOAT16);
    let a = z(&[b, t, hv], MLXK_DTYPE_BFLOAT16);
    let al = z(&[hv], MLXK_DTYPE_FLOAT32);
    let dt = z(&[hv], MLXK_DTYPE_BFLOAT16);
    let n = live_handles();
    let (mut y, mut s) = (sentinel(), sentinel());
    let st =
        unsafe { mlxk_gated_delta_update(q, q, v, a, a, al, dt, null(), null(), &mut y, &mut s) };
    refused(
        st,
        MLXK_ERR_INVALID_ARGUMENT,
        "mlxk_gated_delta_update",
        &["state_out", "2^31-1 elements"],
        n,
    );
    assert_eq!((y, s), (sentinel(), sentinel()));
    let lengths = [0i32];
    let st =
        unsafe { mlxk_gated_delta_state(q, v, a, a, al, dt, null(), lengths.as_ptr(), 1, &mut s) };
    refused(
        st,
        MLXK_ERR_INVALID_ARGUMENT,
        "mlxk_gated_delta_state",
        &["state_out", "2^31-1 elements"],
        n,
    );
    for h in [q, v, a, al, dt] {
        free(h);
    }
}

#[test]
fn every_constructor_and_kernel_refuses_results_above_the_memory_limit() {
    let _s = serial();
    let fx = Fixture::new();
    // Every result of the fixture is more than 8 bytes.
    let entries = fx.entries();
    let makers = [
        "mlxk_array_astype",
        "mlxk_compute_g",
        "mlxk_gated_delta_update",
        "mlxk_gated_delta_state",
        "mlxk_silu_rms_heads",
        "mlxk_gated_rms_norm",
        "mlxk_gated_delta_update_vjp",
        "mlxk_silu_rms_heads_vjp",
        "mlxk_gated_rms_norm_vjp",
    ];
    ok(mlxk_set_memory_limit(8));
    let mut refused_count = 0;
    for e in entries.iter().filter(|e| makers.contains(&e.function)) {
        let n = live_handles();
        let (st, _, untouched) = (e.call)(&e.handles());
        refused(
            st,
            MLXK_ERR_OUT_OF_MEMORY,
            e.function,
            &["memory limit", "8 bytes"],
            n,
        );
        assert!(untouched, "{}: out-parameter written", e.function);
        refused_count += 1;
    }
    let shape = [2i32, 3];
    let data = [0f32; 6];
    let n = live_handles();
    let mut out = sentinel();
    refused(
        unsafe {
            mlxk_array_new(
                data.as_ptr().cast(),
                shape.as_ptr(),
                2,
                MLXK_DTYPE_FLOAT32,
                &mut out,
            )
        },
        MLXK_ERR_OUT_OF_MEMORY,
        "mlxk_array_new",
        &["24 bytes"],
        n,
    );
    refused(
        unsafe { mlxk_array_zeros(shape.as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut out) },
        MLXK_ERR_OUT_OF_MEMORY,
        "mlxk_array_zeros",
        &["24 bytes"],
        n,
    );
    assert_eq!(out, sentinel());
    // Reading, evaluating and inspecting existing arrays is not limited.
    ok(mlxk_array_eval(fx.arr));
    assert_eq!(read_f32(fx.arr).len(), 6);
    ok(mlxk_set_memory_limit(0));
    for e in entries.iter().filter(|e| makers.contains(&e.function)) {
        e.succeeds();
    }
    eprintln!(
        "{} kernels + 2 constructors refused above the limit, then succeeded",
        refused_count
    );
    fx.free();
}

// ---------------------------------------------------------------------------------------------
// Thread teardown

/// A thread-local whose destructor makes a failing call. Registered before the library's own
/// thread-local message is first touched on that thread, it is destroyed after it: the call
/// then runs while the library's per-thread state is gone.
struct CallOnExit;

impl Drop for CallOnExit {
    fn drop(&mut self) {
        let st = mlxk_array_free(16 as H);
        assert_eq!(st, MLXK_ERR_INVALID_HANDLE);
        let _ = mlxk_last_error();
        std::process::exit(0); // reached: the process is intact
    }
}

thread_local! {
    static ON_EXIT: CallOnExit = const { CallOnExit };
}

/// Child process for `failing_call_during_thread_teardown_is_not_fatal`.
#[test]
fn teardown_child() {
    if std::env::var("MLXK_MISUSE_TEARDOWN_CHILD").is_err() {
        return;
    }
    std::thread::spawn(|| {
        ON_EXIT.with(|_| {});
        // Now the library's message slot: registered after ON_EXIT, destroyed before it.
        let st = mlxk_array_free(8 as H);
        assert_eq!(st, MLXK_ERR_INVALID_HANDLE);
    })
    .join()
    .ok();
    // The destructor did not run (or did not exit): report it.
    std::process::exit(3);
}

#[test]
fn failing_call_during_thread_teardown_is_not_fatal() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "teardown_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MLXK_MISUSE_TEARDOWN_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a failing mlxk_ call from a thread-local destructor killed the process ({:?}):\n{stderr}",
        out.status
    );
}
