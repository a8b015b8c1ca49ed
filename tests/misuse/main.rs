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

#[path = "../support/mod.rs"]
mod support;

use crate::support::vjp_case::vjp;
use crate::support::*;

mod empty;
mod handles;
mod names;
mod nan_inf;
mod null_out;
mod pool;
mod pool_errors;
mod sizes;
mod tree;

use std::ptr::{null, null_mut};

use mlxkern::capi::gated_rms_norm::{mlxk_gated_rms_norm, mlxk_gated_rms_norm_vjp};
use mlxkern::capi::live_handles;
use mlxkern::capi::silu_rms_heads::{mlxk_silu_rms_heads, mlxk_silu_rms_heads_vjp};

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
    names::names_only_its_parameters(function, &msg);
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
        entries.extend(tree::entries(&self.packed, self.rec.state.unwrap()));
        entries
    }

    fn base_entries(&self) -> Vec<Entry> {
        let r = &self.rec;
        let state = r.state.unwrap();
        let with_mask = update_args(r, &[("state", state), ("mask", r.mask.unwrap())]);
        let vjp_args = [&with_mask[..], &[("dy", r.v), ("dstate_out", state)]].concat();
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
                outs(|h, [g]| unsafe { mlxk_compute_g(h[0], h[1], h[2], g) }),
            ),
            Entry::new(
                "mlxk_gated_delta_update",
                &with_mask,
                outs(|h, [y, s]| unsafe {
                    let [q, k, v, a, b, al, dt, st, m] = h9(h);
                    mlxk_gated_delta_update(q, k, v, a, b, al, dt, st, m, y, s)
                }),
            )
            .optional(&["state", "mask"]),
            Entry::new(
                "mlxk_gated_delta_update_vjp",
                &vjp_args,
                outs(|h, g| vjp(h11(h), None, g)),
            )
            .optional(&["state", "mask", "dy", "dstate_out"]),
            Entry::new(
                "mlxk_gated_delta_update_chunked_vjp",
                &vjp_args,
                outs(|h, g| vjp(h11(h), Some(16), g)),
            )
            .optional(&["state", "mask", "dy", "dstate_out"]),
            Entry::new(
                "mlxk_gated_delta_state",
                &with_mask[1..8],
                outs(|h, [s]| unsafe {
                    let [k, v, a, b, al, dt, st] = h[..7].try_into().unwrap();
                    let lengths = [3i32, 1];
                    mlxk_gated_delta_state(k, v, a, b, al, dt, st, lengths.as_ptr(), 2, s)
                }),
            )
            .optional(&["state"]),
            Entry::new(
                "mlxk_silu_rms_heads",
                &[
                    ("x", self.sx),
                    ("q_scale", self.q_scale),
                    ("k_scale", self.k_scale),
                ],
                outs(|h, [q, k, v]| unsafe {
                    let [hk, hv, dv] = SPLIT;
                    mlxk_silu_rms_heads(h[0], h[1], h[2], hk, hv, dv, 1e-6, q, k, v)
                }),
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
                outs(|h, [g0, g1, g2]| unsafe {
                    let [hk, hv, dv] = SPLIT;
                    let [x, qs, ks, dq, dk, dv_in] = h[..6].try_into().unwrap();
                    mlxk_silu_rms_heads_vjp(x, qs, ks, hk, hv, dv, 1e-6, dq, dk, dv_in, g0, g1, g2)
                }),
            )
            .optional(&["dq", "dk", "dv"]),
            Entry::new(
                "mlxk_gated_rms_norm",
                &[("x", self.x), ("gate", self.gate), ("weight", self.weight)],
                outs(|h, [out]| unsafe { mlxk_gated_rms_norm(h[0], h[1], h[2], 1e-6, out) }),
            ),
            Entry::new(
                "mlxk_gated_rms_norm_vjp",
                &[
                    ("x", self.x),
                    ("gate", self.gate),
                    ("weight", self.weight),
                    ("dout", self.gate),
                ],
                outs(|h, [g0, g1, g2]| unsafe {
                    mlxk_gated_rms_norm_vjp(h[0], h[1], h[2], 1e-6, h[3], g0, g1, g2)
                }),
            )
            .optional(&["dout"]),
        ]
    }
}

/// `r`'s update arguments by name (q, k, v, a, b, a_log, dt_bias), then `tail`.
fn update_args(r: &Recurrence, tail: &[(&'static str, H)]) -> Vec<(&'static str, H)> {
    let mut args = vec![
        ("q", r.q),
        ("k", r.k),
        ("v", r.v),
        ("a", r.a),
        ("b", r.b),
        ("a_log", r.a_log),
        ("dt_bias", r.dt_bias),
    ];
    args.extend_from_slice(tail);
    args
}

/// An entry's call with `N` handle out-parameters, each the sentinel before the call: returns
/// the status, the out-parameters, and whether every one is still the sentinel.
fn outs<const N: usize>(
    call: impl Fn(&[H], &mut [H; N]) -> mlxk_status + 'static,
) -> impl Fn(&[H]) -> (mlxk_status, Vec<H>, bool) + 'static {
    move |h| {
        let mut out = [sentinel(); N];
        let st = call(h, &mut out);
        (st, out.to_vec(), out.iter().all(|&x| x == sentinel()))
    }
}

/// The first nine handles of an entry's arguments.
fn h9(h: &[H]) -> [H; 9] {
    h[..9].try_into().unwrap()
}

/// The eleven handles of a gradient entry's arguments, as inputs.
fn h11(h: &[H]) -> [*const mlxk_array; 11] {
    <[H; 11]>::try_from(h)
        .unwrap()
        .map(|x| x as *const mlxk_array)
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
        names::names_only_its_parameters(self.function, &msg);
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
