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
//!
//! The shared helpers (the serial lock, the sentinel, `refused`, the fixture with every entry
//! point) are here; the cases are in one module each: `handles` (freed, foreign and NULL
//! handles), `null_out` (NULL out-parameters), `nan_inf`, `empty` (B = 0, T = 0), `sizes`
//! (overflowing dims, the memory limit); the thread-teardown case stays here, at the top
//! level, where its child process finds it by its exact name.

#[path = "../common/mod.rs"]
mod common;
use common::*;

mod empty;
mod handles;
mod nan_inf;
mod null_out;
mod pool;
mod sizes;

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
    /// B = 1, T = 5: packed sequences.
    packed: Recurrence,
    /// The update from the convolution's output on rec's gates and pool: x [2, 3, 2·32 + 2·4],
    /// q_scale, k_scale [32] (Hk 1, Hv 2, Dk 32, Dv 4).
    conv: [H; 3],
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
            packed: Recurrence::random(&mut rng, [1, 5, 1, 2, 32, 4], false, false),
            conv: [
                new_bf16(&rng.vec(2 * 3 * 72, 1.0), &[2, 3, 72]),
                new_bf16(&[0.2; 32], &[32]),
                new_bf16(&[0.3; 32], &[32]),
            ],
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
        self.packed.free();
        for h in self.conv {
            free(h);
        }
    }

    /// Every entry point that takes handles, with its valid handle arguments and a call that
    /// returns (status, out-parameters as returned).
    fn entries(&self) -> Vec<Entry> {
        let mut entries = self.base_entries();
        entries.extend(pool::entries(&self.rec, &self.packed, self.conv));
        entries
    }

    fn base_entries(&self) -> Vec<Entry> {
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
                "mlxk_gated_delta_update_chunked_vjp",
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
                        mlxk_gated_delta_update_chunked_vjp(
                            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], 16, h[9], h[10],
                            g0, g1, g2, g3, g4, g5, g6, g7,
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
