//! The thread contract, through the C ABI: 8 threads × 1 000 mixed calls (every kernel, the
//! backward passes of the head split and the gated norm, array calls, and calls that fail) run
//! concurrently give bit for bit the results, statuses and messages the same calls give when
//! run on one thread; each thread's mlxk_last_error() is
//! the message of its own last failure, whatever the other threads do; nothing deadlocks (a
//! watchdog ends the process). Then threads free and use the same handles concurrently: every
//! use either completes (with the handle's own data: tokens are never reused) or gets
//! MLXK_ERR_INVALID_HANDLE, and each handle is freed exactly once.

mod support;

use crate::support::pool::update_pool_to;
use crate::support::*;

use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mlxkern::capi::gated_rms_norm::{mlxk_gated_rms_norm, mlxk_gated_rms_norm_vjp};
use mlxkern::capi::glm52::{mlxk_glm52_layout, mlxk_glm52_layout_validate};
use mlxkern::capi::live_handles;
use mlxkern::capi::silu_rms_heads::{mlxk_silu_rms_heads, mlxk_silu_rms_heads_vjp};

const THREADS: usize = 8;
const CALLS_PER_THREAD: usize = 1000;
/// Rounds of the mixed-call comparison, each with a fresh seed.
const ROUNDS: usize = 3;
const WATCHDOG: Duration = Duration::from_secs(120);

/// Runs `f` on its own thread; ends the process if it takes longer than WATCHDOG (a deadlock
/// must fail the run, not hang it).
fn with_watchdog<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(WATCHDOG) {
        Ok(()) => worker.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Ok(_) => unreachable!(),
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            eprintln!("{what}: no progress after {WATCHDOG:?}: deadlock");
            std::process::exit(2);
        }
    }
}

/// Messages name handles by token; tokens differ between runs, so they are masked.
fn normalize(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        out.push_str("0x?");
        rest = rest[i + 2..].trim_start_matches(|c: char| c.is_ascii_hexdigit());
    }
    out.push_str(rest);
    out
}

/// What one call returned, as the comparison sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    step: usize,
    function: &'static str,
    status: mlxk_status,
    /// The normalized message after a failure ("" after a success).
    message: String,
    /// Bytes read back from the call's results.
    data: Vec<u8>,
}

/// The recurrence inputs `[q, k, v, a, b, A_log, dt_bias]` of `[.., state]` as const inputs.
fn inputs(h: [H; 8]) -> [*const mlxk_array; 7] {
    let [q, k, v, a, b, al, dt, _] = h;
    [q, k, v, a, b, al, dt].map(|h| h as *const mlxk_array)
}

fn update(h: [H; 8], y: &mut H, s: &mut H) -> mlxk_status {
    let [q, k, v, a, b, al, dt, s0] = h;
    unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s0, null_mut(), y, s) }
}

fn state(h: [H; 8], lengths: &[i32], out: &mut H) -> mlxk_status {
    let [_, k, v, a, b, al, dt, s0] = h;
    let (l, n) = (lengths.as_ptr(), lengths.len());
    unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, s0, l, n, out) }
}

fn verify_pool(h: [H; 8], slots: &[i32], y: &mut H) -> mlxk_status {
    let [q, k, v, a, b, al, dt, p] = h;
    let (sl, n) = (slots.as_ptr(), slots.len());
    unsafe { mlxk_gated_delta_verify_pool(q, k, v, a, b, al, dt, p, sl, null(), n, null_mut(), y) }
}

fn state_pool(h: [H; 8], slots: &[i32], lengths: &[i32], out: &mut H) -> mlxk_status {
    let [_, k, v, a, b, al, dt, p] = h;
    let (sl, l, n) = (slots.as_ptr(), lengths.as_ptr(), slots.len());
    unsafe { mlxk_gated_delta_state_pool(k, v, a, b, al, dt, p, sl, null(), l, n, out) }
}

fn update_packed(h: [H; 8], cu: &[i32], slots: &[i32], y: &mut H, out: &mut H) -> mlxk_status {
    let [q, k, v, a, b, al, dt, p] = h;
    let (c, nc, sl) = (cu.as_ptr(), cu.len(), slots.as_ptr());
    unsafe { mlxk_gated_delta_update_packed(q, k, v, a, b, al, dt, p, c, nc, sl, null(), y, out) }
}

fn update_pool_chunked(h: [H; 8], slots: &[i32], y: &mut H, out: &mut H) -> mlxk_status {
    let [q, k, v, a, b, al, dt, p] = h;
    let (sl, n, chunk) = (slots.as_ptr(), slots.len(), 16);
    unsafe {
        mlxk_gated_delta_update_pool_chunked(
            q,
            k,
            v,
            a,
            b,
            al,
            dt,
            p,
            sl,
            null(),
            n,
            null_mut(),
            chunk,
            y,
            out,
        )
    }
}

/// One thread's script: deterministic from `(thread, seed)`.
struct Worker {
    thread: usize,
    rng: Rng,
    calls: usize,
    log: Vec<Record>,
    /// The message of this thread's last failure, as read right after it.
    last_failure: Option<String>,
    freed: Vec<usize>,
}

impl Worker {
    fn new(thread: usize, seed: u64) -> Self {
        Worker {
            thread,
            rng: Rng::seeded(seed ^ (thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            calls: 0,
            log: Vec::new(),
            last_failure: None,
            freed: Vec::new(),
        }
    }

    /// Records one call. A failure's message must name `function` and, when given, carry this
    /// thread's marker; it is checked again later, after other threads have failed too.
    fn record(
        &mut self,
        step: usize,
        function: &'static str,
        status: mlxk_status,
        data: Vec<u8>,
        marker: Option<&str>,
    ) {
        self.calls += 1;
        let message = if status == MLXK_OK {
            String::new()
        } else {
            let msg = last_error();
            assert!(
                msg.starts_with(&format!("{function}: ")),
                "thread {}: {msg:?}",
                self.thread
            );
            if let Some(m) = marker {
                assert!(
                    msg.contains(m),
                    "thread {}: message {msg:?} is not this thread's ({m})",
                    self.thread
                );
            }
            self.last_failure = Some(msg.clone());
            normalize(&msg)
        };
        assert_ne!(status, MLXK_ERR_PANIC);
        self.log.push(Record {
            step,
            function,
            status,
            message,
            data,
        });
    }

    /// Records a call with one result, then reads the result back and frees it.
    fn result(&mut self, step: usize, function: &'static str, st: mlxk_status, out: H) {
        self.record(step, function, st, vec![], None);
        self.read(step, out);
        self.free(step, out);
    }

    /// Records a failure whose message must carry `marker`.
    fn failed(&mut self, step: usize, function: &'static str, st: mlxk_status, marker: &str) {
        self.record(step, function, st, vec![], Some(marker));
    }

    /// The message of this thread's last failure is still there (successes do not clear it,
    /// other threads' failures do not replace it).
    fn check_own_message(&self) {
        if let Some(want) = &self.last_failure {
            assert_eq!(
                &last_error(),
                want,
                "thread {}: mlxk_last_error() changed under it",
                self.thread
            );
        }
    }

    fn new_array(&mut self, step: usize, bytes: &[u8], shape: &[i32], dtype: mlxk_dtype) -> H {
        let (st, out) = array_new(bytes, shape, dtype);
        self.record(step, "mlxk_array_new", st, vec![], None);
        assert_eq!(st, MLXK_OK);
        out
    }

    fn f32_array(&mut self, step: usize, n: usize, shape: &[i32]) -> H {
        let v = self.rng.vec(n, 1.0);
        self.new_array(step, as_bytes(&v), shape, MLXK_DTYPE_FLOAT32)
    }

    fn bf16_array(&mut self, step: usize, n: usize, shape: &[i32]) -> H {
        let v: Vec<u16> = self.rng.vec(n, 1.0).into_iter().map(bf16_bits).collect();
        self.new_array(step, as_bytes(&v), shape, MLXK_DTYPE_BFLOAT16)
    }

    fn read(&mut self, step: usize, h: H) -> Vec<u8> {
        let mut n = 0usize;
        let st = unsafe { mlxk_array_nbytes(h, &mut n) };
        self.record(step, "mlxk_array_nbytes", st, vec![], None);
        let mut buf = vec![0u8; n];
        let st = unsafe { mlxk_array_read(h, buf.as_mut_ptr().cast(), n) };
        self.record(step, "mlxk_array_read", st, buf.clone(), None);
        buf
    }

    fn free(&mut self, step: usize, h: H) {
        let st = mlxk_array_free(h);
        self.record(step, "mlxk_array_free", st, vec![], None);
        assert_eq!(st, MLXK_OK);
        self.freed.push(h as usize);
    }

    /// Random valid recurrence inputs (bf16 q, k, v; f32 state).
    fn recurrence(&mut self, step: usize) -> ([H; 8], [i32; 6]) {
        let b = 1 + self.rng.below(2) as i32;
        let t = 1 + self.rng.below(3) as i32;
        let hk = 1 + self.rng.below(2) as i32;
        let hv = hk * (1 + self.rng.below(2) as i32);
        let dk = 32 * (1 + self.rng.below(2) as i32);
        let dv = 1 + self.rng.below(4) as i32;
        let n = |s: &[i32]| s.iter().product::<i32>() as usize;
        let q = self.bf16_array(step, n(&[b, t, hk, dk]), &[b, t, hk, dk]);
        let k = self.bf16_array(step, n(&[b, t, hk, dk]), &[b, t, hk, dk]);
        let v = self.bf16_array(step, n(&[b, t, hv, dv]), &[b, t, hv, dv]);
        let a = self.bf16_array(step, n(&[b, t, hv]), &[b, t, hv]);
        let bb = self.bf16_array(step, n(&[b, t, hv]), &[b, t, hv]);
        let al = self.f32_array(step, hv as usize, &[hv]);
        let dt = self.bf16_array(step, hv as usize, &[hv]);
        let s = self.f32_array(step, n(&[b, hv, dv, dk]), &[b, hv, dv, dk]);
        ([q, k, v, a, bb, al, dt, s], [b, t, hk, hv, dk, dv])
    }

    /// The T tokens of `h` (B = 1) as a random draft tree in slot 0: its verify, the commit of
    /// a random path, and a verify refused for a parent (this thread's marker) after its node.
    fn tree(&mut self, step: usize, h: [H; 8], t: i32, marker_n: i32) {
        let [q, k, v, a, b, al, dt, p] = h;
        let mut parents: Vec<i32> = (0..t)
            .map(|j| self.rng.below(j as u64 + 1) as i32 - 1)
            .collect();
        let cu = [0, t];
        let (slot, fresh) = ([0i32], [self.rng.below(2) as u8]);
        let (c, pp, n) = (cu.as_ptr(), parents.as_ptr(), t as usize);
        let (sp, fp) = (slot.as_ptr(), fresh.as_ptr());
        let mut y = null_mut();
        let st = unsafe {
            mlxk_gated_delta_verify_tree_pool(q, k, v, a, b, al, dt, p, c, 2, pp, n, sp, fp, &mut y)
        };
        self.result(step, "mlxk_gated_delta_verify_tree_pool", st, y);
        let mut path = vec![self.rng.below(t as u64) as i32];
        while parents[*path.last().unwrap() as usize] >= 0 {
            path.push(parents[*path.last().unwrap() as usize]);
        }
        path.reverse();
        let len = [path.len() as i32];
        let mut out = null_mut();
        let st = unsafe {
            mlxk_gated_delta_commit_tree_pool(
                k,
                v,
                a,
                b,
                al,
                dt,
                p,
                c,
                2,
                pp,
                n,
                sp,
                fp,
                len.as_ptr(),
                path.as_ptr(),
                path.len(),
                &mut out,
            )
        };
        self.result(step, "mlxk_gated_delta_commit_tree_pool", st, out);
        parents[0] = marker_n;
        let pp = parents.as_ptr();
        let mut y = null_mut();
        let st = unsafe {
            mlxk_gated_delta_verify_tree_pool(q, k, v, a, b, al, dt, p, c, 2, pp, n, sp, fp, &mut y)
        };
        let marker = format!("parents[0] is {marker_n}");
        self.failed(step, "mlxk_gated_delta_verify_tree_pool", st, &marker);
        assert_eq!(st, MLXK_ERR_INVALID_ARGUMENT);
    }

    /// Random accepted lengths in 0..=t, one a sequence.
    fn lengths(&mut self, b: i32, t: i32) -> Vec<i32> {
        (0..b)
            .map(|_| self.rng.below(t as u64 + 1) as i32)
            .collect()
    }

    fn step(&mut self, step: usize) {
        let marker_n = 1000 + self.thread as i32; // thread-specific values in invalid arguments
        match self.rng.below(16) {
            0 => {
                let n = 1 + self.rng.below(40) as usize;
                let h = self.f32_array(step, n, &[n as i32]);
                self.read(step, h);
                let mut out = null_mut();
                let st = unsafe { mlxk_array_astype(h, MLXK_DTYPE_BFLOAT16, &mut out) };
                self.result(step, "mlxk_array_astype", st, out);
                self.free(step, h);
            }
            1 => {
                let (h, _) = self.recurrence(step);
                let mut g = null_mut();
                let st = unsafe { mlxk_compute_g(h[5], h[3], h[6], &mut g) };
                self.result(step, "mlxk_compute_g", st, g);
                h.into_iter().for_each(|x| self.free(step, x));
            }
            2 | 3 => {
                let (h, _) = self.recurrence(step);
                let (mut y, mut s) = (null_mut(), null_mut());
                let st = update(h, &mut y, &mut s);
                self.record(step, "mlxk_gated_delta_update", st, vec![], None);
                // The decode-loop pattern half the time: free the old state before evaluating.
                if self.rng.below(2) == 0 {
                    self.free(step, h[7]);
                    self.read(step, s);
                    self.read(step, y);
                    h[..7].iter().for_each(|&x| self.free(step, x));
                } else {
                    self.read(step, y);
                    self.read(step, s);
                    h.into_iter().for_each(|x| self.free(step, x));
                }
                self.free(step, y);
                self.free(step, s);
            }
            4 => {
                let (h, d) = self.recurrence(step);
                let lengths = self.lengths(d[0], d[1]);
                let mut s = null_mut();
                let st = state(h, &lengths, &mut s);
                self.result(step, "mlxk_gated_delta_state", st, s);
                h.into_iter().for_each(|x| self.free(step, x));
            }
            5 => {
                let (hk, hv, dk, dv) = (1 + self.rng.below(2) as i32, 2, 8, 4);
                let c = 2 * hk * dk + hv * dv;
                let s = 1 + self.rng.below(3) as i32;
                let x = self.bf16_array(step, (2 * s * c) as usize, &[2, s, c]);
                let qs = self.bf16_array(step, dk as usize, &[dk]);
                let ks = self.bf16_array(step, dk as usize, &[dk]);
                let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
                let st = unsafe {
                    mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut q, &mut k, &mut v)
                };
                self.record(step, "mlxk_silu_rms_heads", st, vec![], None);
                // Half the time the backward pass too, the results as their own cotangents.
                if self.rng.below(2) == 0 {
                    let (mut dx, mut dqs, mut dks) = (null_mut(), null_mut(), null_mut());
                    let st = unsafe {
                        mlxk_silu_rms_heads_vjp(
                            x, qs, ks, hk, hv, dv, 1e-6, q, k, v, &mut dx, &mut dqs, &mut dks,
                        )
                    };
                    self.record(step, "mlxk_silu_rms_heads_vjp", st, vec![], None);
                    for o in [dx, dqs, dks] {
                        self.read(step, o);
                        self.free(step, o);
                    }
                }
                for o in [q, k, v] {
                    self.read(step, o);
                    self.free(step, o);
                }
                [x, qs, ks].into_iter().for_each(|h| self.free(step, h));
            }
            12 => {
                // The head split and the update in one call, on a layer of random dims.
                let (h, [b, t, hk, hv, dk, dv]) = self.recurrence(step);
                let c = 2 * hk * dk + hv * dv;
                let x = self.bf16_array(step, (b * t * c) as usize, &[b, t, c]);
                let qs = self.bf16_array(step, dk as usize, &[dk]);
                let ks = self.bf16_array(step, dk as usize, &[dk]);
                let (mut y, mut s) = (null_mut(), null_mut());
                let st = unsafe {
                    mlxk_gated_delta_update_from_conv(
                        x,
                        qs,
                        ks,
                        hk,
                        hv,
                        dv,
                        1e-6,
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        null_mut(),
                        &mut y,
                        &mut s,
                    )
                };
                self.record(step, "mlxk_gated_delta_update_from_conv", st, vec![], None);
                self.read(step, y);
                self.read(step, s);
                self.free(step, y);
                self.free(step, s);
                [x, qs, ks].into_iter().for_each(|a| self.free(step, a));
                h.into_iter().for_each(|a| self.free(step, a));
            }
            6 => {
                let d = 1 + self.rng.below(64) as i32;
                let rows = 1 + self.rng.below(4) as i32;
                let x = self.bf16_array(step, (rows * d) as usize, &[rows, d]);
                let g = self.f32_array(step, (rows * d) as usize, &[rows, d]);
                let w = self.bf16_array(step, d as usize, &[d]);
                let mut out = null_mut();
                let st = unsafe { mlxk_gated_rms_norm(x, g, w, 1e-6, &mut out) };
                self.record(step, "mlxk_gated_rms_norm", st, vec![], None);
                if self.rng.below(2) == 0 {
                    let (mut dx, mut dg, mut dw) = (null_mut(), null_mut(), null_mut());
                    let st = unsafe {
                        mlxk_gated_rms_norm_vjp(x, g, w, 1e-6, out, &mut dx, &mut dg, &mut dw)
                    };
                    self.record(step, "mlxk_gated_rms_norm_vjp", st, vec![], None);
                    for o in [dx, dg, dw] {
                        self.read(step, o);
                        self.free(step, o);
                    }
                }
                self.read(step, out);
                self.free(step, out);
                [x, g, w].into_iter().for_each(|h| self.free(step, h));
            }
            // Failures, each with a value only this thread uses.
            7 => {
                let (h, d) = self.recurrence(step);
                let [b, t, hk, _, _, _] = d;
                let bad_k = self.bf16_array(
                    step,
                    (b * t * hk * marker_n) as usize,
                    &[b, t, hk, marker_n],
                );
                let (mut y, mut s) = (null_mut(), null_mut());
                let mut x = h;
                x[1] = bad_k;
                let st = update(x, &mut y, &mut s);
                self.failed(
                    step,
                    "mlxk_gated_delta_update",
                    st,
                    &format!("is {marker_n}"),
                );
                assert_eq!(st, MLXK_ERR_SHAPE);
                self.free(step, bad_k);
                h.into_iter().for_each(|x| self.free(step, x));
            }
            8 => {
                let mut out = null_mut();
                let st = unsafe {
                    mlxk_array_new(
                        [0u8; 4].as_ptr().cast(),
                        [1i32].as_ptr(),
                        1,
                        marker_n,
                        &mut out,
                    )
                };
                self.failed(step, "mlxk_array_new", st, &marker_n.to_string());
                assert_eq!(st, MLXK_ERR_DTYPE);
            }
            9 => {
                let x = self.bf16_array(step, 8, &[1, 8]);
                let w = self.bf16_array(step, 8, &[8]);
                let eps = -(marker_n as f32);
                let mut out = null_mut();
                let st = unsafe { mlxk_gated_rms_norm(x, x, w, eps, &mut out) };
                self.failed(step, "mlxk_gated_rms_norm", st, &format!("eps is {eps}"));
                assert_eq!(st, MLXK_ERR_INVALID_ARGUMENT);
                self.free(step, x);
                self.free(step, w);
            }
            10 => {
                // Use after free of one of this thread's own handles.
                let dead = if self.freed.is_empty() {
                    8 as H
                } else {
                    self.freed[self.rng.below(self.freed.len() as u64) as usize] as H
                };
                let mut nd = 0usize;
                let st = unsafe { mlxk_array_ndim(dead, &mut nd) };
                self.failed(step, "mlxk_array_ndim", st, &format!("{dead:p}"));
                assert_eq!(st, MLXK_ERR_INVALID_HANDLE);
                let st = mlxk_array_free(dead);
                self.failed(step, "mlxk_array_free", st, &format!("{dead:p}"));
                assert_eq!(st, MLXK_ERR_INVALID_HANDLE);
            }
            13 => {
                // A pool update in place (the pool freed before the eval), then a call naming
                // one slot twice, which fails with its own message.
                let (h, d) = self.recurrence(step);
                let slots: Vec<i32> = match (d[0], self.rng.below(2)) {
                    (1, 0) => vec![0],
                    (1, _) => vec![-1],
                    (_, 0) => vec![1, 0],
                    _ => vec![-1, 1],
                };
                let fresh: Vec<u8> = slots.iter().map(|_| self.rng.below(2) as u8).collect();
                let (mut y, mut p) = (null_mut(), null_mut());
                let x = inputs(h);
                let st = update_pool_to(x, h[7], &slots, fresh.as_ptr(), null(), &mut y, &mut p);
                self.record(step, "mlxk_gated_delta_update_pool", st, vec![], None);
                self.free(step, h[7]);
                self.read(step, p);
                self.read(step, y);
                self.free(step, y);
                // Two rows naming slot 0 (B = 2), or y and pool_out in one place (B = 1).
                let twice = vec![0; d[0] as usize];
                let (mut y2, mut p2): (H, H) = (null_mut(), null_mut());
                let y2_out: *mut H = &mut y2;
                let p2_out: *mut H = if d[0] > 1 { &mut p2 } else { y2_out };
                let x = inputs(h);
                let st = update_pool_to(x, p, &twice, null(), null(), y2_out, p2_out);
                self.record(step, "mlxk_gated_delta_update_pool", st, vec![], None);
                assert_eq!(st, MLXK_ERR_INVALID_ARGUMENT);
                self.free(step, p);
                h[..7].iter().for_each(|&x| self.free(step, x));
            }
            14 => {
                // A verify on the pool, then the commit of random accepted lengths.
                let (h, d) = self.recurrence(step);
                let slots: Vec<i32> = (0..d[0]).rev().collect();
                let lengths = self.lengths(d[0], d[1]);
                let mut y = null_mut();
                let st = verify_pool(h, &slots, &mut y);
                self.result(step, "mlxk_gated_delta_verify_pool", st, y);
                let mut p = null_mut();
                let st = state_pool(h, &slots, &lengths, &mut p);
                self.record(step, "mlxk_gated_delta_state_pool", st, vec![], None);
                if d[0] == 1 {
                    self.tree(step, h, d[1], marker_n);
                }
                self.free(step, h[7]);
                self.read(step, p);
                self.free(step, p);
                h[..7].iter().for_each(|&x| self.free(step, x));
            }
            15 => {
                // Packed sequences on the pool (B = 1: the T tokens as two sequences), else the
                // chunked form on the pool.
                let (h, d) = self.recurrence(step);
                let (mut y, mut p) = (null_mut(), null_mut());
                let st = if d[0] == 1 {
                    let cut = self.rng.below(d[1] as u64 + 1) as i32;
                    let cu = [0, cut, d[1]];
                    let slots = [0i32, -1];
                    let st = update_packed(h, &cu, &slots, &mut y, &mut p);
                    self.record(step, "mlxk_gated_delta_update_packed", st, vec![], None);
                    st
                } else {
                    let slots: Vec<i32> = (0..d[0]).rev().collect();
                    let st = update_pool_chunked(h, &slots, &mut y, &mut p);
                    self.record(
                        step,
                        "mlxk_gated_delta_update_pool_chunked",
                        st,
                        vec![],
                        None,
                    );
                    st
                };
                assert_eq!(st, MLXK_OK);
                self.free(step, h[7]);
                self.read(step, p);
                self.read(step, y);
                self.free(step, p);
                self.free(step, y);
                h[..7].iter().for_each(|&x| self.free(step, x));
            }
            _ => {
                let layout = mlxk_glm52_layout {
                    slot_bytes: marker_n as u64,
                    ..Default::default()
                };
                let st = unsafe { mlxk_glm52_layout_validate(&layout, 4, 64) };
                self.failed(
                    step,
                    "mlxk_glm52_layout_validate",
                    st,
                    &format!("slot bytes {marker_n}"),
                );
                assert_eq!(st, MLXK_ERR_INVALID_ARGUMENT);
            }
        }
        self.check_own_message();
    }

    fn run(mut self) -> Self {
        let mut step = 0;
        while self.calls < CALLS_PER_THREAD {
            self.step(step);
            step += 1;
            if step % 8 == 0 {
                std::thread::yield_now();
                self.check_own_message();
            }
        }
        self
    }
}

fn compare(thread: usize, alone: &[Record], together: &[Record]) {
    assert_eq!(
        alone.len(),
        together.len(),
        "thread {thread}: call counts differ"
    );
    for (a, b) in alone.iter().zip(together) {
        assert_eq!(
            a, b,
            "thread {thread}: a call gave a different result with 8 threads"
        );
    }
}

#[test]
fn eight_threads_of_mixed_calls_match_one_thread() {
    let _s = serial();
    let live = live_handles();
    for round in 0..ROUNDS {
        let seed = Rng::fresh().next_u64();
        eprintln!("round {round}: seed {seed:#x}");
        mixed_round(seed);
    }
    assert_eq!(live_handles(), live, "every handle freed");
}

fn mixed_round(seed: u64) {
    with_watchdog("8 threads x 1000 mixed calls", move || {
        let start = Instant::now();
        let alone: Vec<Worker> = (0..THREADS).map(|t| Worker::new(t, seed).run()).collect();
        let single = start.elapsed();

        let start = Instant::now();
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    Worker::new(t, seed).run()
                })
            })
            .collect();
        let together: Vec<Worker> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let multi = start.elapsed();

        let mut calls = 0;
        let mut failures = 0;
        for (t, (a, b)) in alone.iter().zip(&together).enumerate() {
            compare(t, &a.log, &b.log);
            calls += b.calls;
            failures += b.log.iter().filter(|r| r.status != MLXK_OK).count();
        }
        assert!(together.iter().all(|w| w.calls >= CALLS_PER_THREAD));
        eprintln!(
            "{THREADS} threads: {calls} calls ({failures} failing) in {:.2} s; the same calls on one thread: {:.2} s; results, statuses and messages equal",
            multi.as_secs_f64(),
            single.as_secs_f64()
        );
    });
}

#[test]
fn freeing_and_using_the_same_handles_concurrently() {
    let _s = serial();
    const HANDLES: usize = 400;
    let live = live_handles();
    with_watchdog("free/use race", move || {
        // Each handle holds its own index, so a use can tell whose data it read.
        let handles: Arc<Vec<usize>> = Arc::new(
            (0..HANDLES)
                .map(|i| new_f32(&[i as f32, -(i as f32), 0.5], &[3]) as usize)
                .collect(),
        );
        let freed: Arc<Vec<AtomicUsize>> =
            Arc::new((0..HANDLES).map(|_| AtomicUsize::new(0)).collect());
        let (uses_ok, uses_dead) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let barrier = Arc::new(Barrier::new(THREADS + 1));
        let mut threads = Vec::new();
        for t in 0..THREADS {
            let (handles, freed, barrier) = (handles.clone(), freed.clone(), barrier.clone());
            let (uses_ok, uses_dead) = (uses_ok.clone(), uses_dead.clone());
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng::seeded(t as u64 + 77);
                barrier.wait();
                for _ in 0..600 {
                    let i = rng.below(HANDLES as u64) as usize;
                    let h = handles[i] as H;
                    if t % 2 == 0 && rng.below(3) == 0 {
                        // Free: exactly one thread may succeed per handle.
                        match mlxk_array_free(h) {
                            MLXK_OK => {
                                freed[i].fetch_add(1, Ordering::SeqCst);
                            }
                            MLXK_ERR_INVALID_HANDLE => assert!(last_error().contains("array")),
                            other => panic!("free raced with use: {}", name(other)),
                        }
                        continue;
                    }
                    // Use: read it, or feed it to a kernel; complete or INVALID_HANDLE.
                    let st = match rng.below(3) {
                        0 => {
                            let mut buf = [0f32; 3];
                            let st = unsafe { mlxk_array_read(h, buf.as_mut_ptr().cast(), 12) };
                            if st == MLXK_OK {
                                assert_eq!(
                                    buf,
                                    [i as f32, -(i as f32), 0.5],
                                    "a stale handle read another array's data"
                                );
                            }
                            st
                        }
                        1 => {
                            let mut dims = [0i32; 2];
                            let st = unsafe { mlxk_array_shape(h, dims.as_mut_ptr(), 2) };
                            if st == MLXK_OK {
                                assert_eq!(dims[0], 3);
                            }
                            st
                        }
                        _ => {
                            // x, gate and weight: the same handle three times, freed meanwhile
                            // perhaps; a result made stays valid after its input is freed.
                            let mut out = null_mut();
                            let st = unsafe { mlxk_gated_rms_norm(h, h, h, 1e-6, &mut out) };
                            if st == MLXK_OK {
                                let v = read_f32(out);
                                assert_eq!(v.len(), 3);
                                free(out);
                            }
                            st
                        }
                    };
                    match st {
                        MLXK_OK => uses_ok.fetch_add(1, Ordering::Relaxed),
                        MLXK_ERR_INVALID_HANDLE => uses_dead.fetch_add(1, Ordering::Relaxed),
                        other => panic!(
                            "a use racing a free returned {} ({})",
                            name(other),
                            last_error()
                        ),
                    };
                }
            }));
        }
        // Meanwhile new arrays are made and freed: a stale handle never reaches them.
        barrier.wait();
        for n in 0..300 {
            let h = new_f32(&[-1.0 - n as f32; 3], &[3]);
            free(h);
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
        let mut freed_by_threads = 0;
        for (i, count) in freed.iter().enumerate() {
            match count.load(Ordering::SeqCst) {
                0 => free(handles[i] as H),
                1 => freed_by_threads += 1,
                n => panic!("handle {i} was freed {n} times"),
            }
        }
        eprintln!(
            "free/use race: {THREADS} threads, {HANDLES} shared handles: {freed_by_threads} freed once by a racing thread, {} uses completed, {} got MLXK_ERR_INVALID_HANDLE",
            uses_ok.load(Ordering::Relaxed),
            uses_dead.load(Ordering::Relaxed)
        );
    });
    assert_eq!(live_handles(), live, "every handle freed exactly once");
}
