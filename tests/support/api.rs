//! Helpers of the safe-API suites (tests/api_*.rs): inputs made once and held both as a safe
//! `mlxkern::Array` and as a C handle with the same bits, and comparisons of a safe call with
//! the C call on the same inputs (results bit for bit; errors by status and message).
#![allow(dead_code)]

use std::ptr::null_mut;

use super::*;
use mlxkern::{Array, Dtype, Error};

/// One input held twice: as a C handle and as a safe array, with the same bytes.
pub struct Twin {
    pub c: H,
    pub r: Array,
}

impl Drop for Twin {
    fn drop(&mut self) {
        free(self.c);
    }
}

impl Twin {
    /// `data` rounded to `dtype` (through the C ABI), then the same bytes as a safe array.
    pub fn new(data: &[f32], shape: &[usize], dtype: Dtype) -> Twin {
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let c = typed(data, &dims, dtype as i32);
        let r = Array::from_bytes(&read_bytes(c), shape, dtype).unwrap();
        Twin { c, r }
    }

    pub fn random(rng: &mut Rng, shape: &[usize], scale: f32, dtype: Dtype) -> Twin {
        let n = shape.iter().product();
        Twin::new(&rng.vec(n, scale), shape, dtype)
    }

    /// Query or key heads `[B, T, Hk, Dk]` as `heads` makes them, each row scaled by `scale`.
    pub fn heads(rng: &mut Rng, shape: [usize; 4], scale: f32, dtype: Dtype) -> Twin {
        let [b, t, hk, dk] = shape;
        Twin::new(&heads(rng, b * t * hk * dk, dk, scale), &shape, dtype)
    }

    pub fn bools(data: &[bool], shape: &[usize]) -> Twin {
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let c = new_bool(data, &dims);
        Twin {
            c,
            r: Array::from_slice(data, shape).unwrap(),
        }
    }
}

/// The C handle of an optional twin (NULL for None).
pub fn c_opt(t: &Option<Twin>) -> *const mlxk_array {
    t.as_ref().map_or(null_mut(), |t| t.c) as *const mlxk_array
}

/// The C handles of the update's inputs (q, k, v, a, b, a_log, dt_bias) and of its optional
/// ones (NULL where None: state, mask, then the cotangents dy, dstate_out).
pub fn c_args(x: [&Twin; 7], opt: [&Option<Twin>; 4]) -> [*const mlxk_array; 11] {
    let mut out = [std::ptr::null(); 11];
    for (o, t) in out.iter_mut().zip(x) {
        *o = t.c;
    }
    for (o, t) in out[7..].iter_mut().zip(opt) {
        *o = c_opt(t);
    }
    out
}

/// The safe update on twins: q, k, v, a, b, a_log, dt_bias, then the optional state and mask.
pub fn safe_update<'a>(
    x: [&'a Twin; 7],
    state: &'a Option<Twin>,
    mask: &'a Option<Twin>,
) -> mlxkern::GatedDelta<'a> {
    let [q, k, v, a, b, a_log, dt_bias] = x.map(|t| &t.r);
    mlxkern::GatedDelta {
        q,
        k,
        v,
        a,
        b,
        a_log,
        dt_bias,
        state: r_opt(state),
        mask: r_opt(mask),
    }
}

pub fn r_opt(t: &Option<Twin>) -> Option<&Array> {
    t.as_ref().map(|t| &t.r)
}

/// The C call's results (`status` OK) equal the safe call's bit for bit; frees the handles.
#[track_caller]
pub fn same_results(what: &str, c: &[H], r: &[&Array]) {
    assert_eq!(c.len(), r.len());
    for (i, (&h, a)) in c.iter().zip(r).enumerate() {
        let c_bytes = read_bytes(h);
        let r_bytes = a.to_bytes().unwrap();
        assert_eq!(
            shape_of(h),
            a.shape()
                .unwrap()
                .iter()
                .map(|&d| d as i32)
                .collect::<Vec<_>>()
        );
        assert_eq!(
            dtype_of(h),
            a.dtype().unwrap() as i32,
            "{what}: result {i}'s dtype"
        );
        assert!(!r_bytes.is_empty() || c_bytes.is_empty());
        assert!(
            c_bytes == r_bytes,
            "{what}: result {i} differs from the C ABI's"
        );
        free(h);
    }
}

/// The C call failed with the safe call's error: the same status, and the C message is the
/// safe message behind the C function's name. Returns the message.
#[track_caller]
pub fn same_error(function: &str, status: mlxk_status, err: Error) -> String {
    assert_ne!(
        status, MLXK_OK,
        "{function} succeeded; the safe call failed with {err}"
    );
    assert_eq!(
        status,
        err.status(),
        "{function}: {} vs {err}",
        last_error()
    );
    assert_eq!(last_error(), format!("{function}: {err}"));
    err.to_string()
}

/// A safe call and the C call on the same inputs agree: both succeed with the same bits, or
/// both fail with the same status and message. Returns the error message, if any.
#[track_caller]
pub fn agree(
    function: &str,
    status: mlxk_status,
    c: &[H],
    r: mlxkern::Result<Vec<Array>>,
) -> Option<String> {
    match r {
        Ok(arrays) => {
            assert_eq!(
                status,
                MLXK_OK,
                "{function}: C failed ({}), the safe call did not",
                last_error()
            );
            same_results(function, c, &arrays.iter().collect::<Vec<_>>());
            None
        }
        Err(err) => Some(same_error(function, status, err)),
    }
}

/// The update's eight gradients in the C ABI's order.
pub fn grads(g: &mlxkern::GatedDeltaGrads) -> [&Array; 8] {
    [
        &g.dq,
        &g.dk,
        &g.dv,
        &g.da,
        &g.db,
        &g.da_log,
        &g.ddt_bias,
        &g.dstate,
    ]
}

/// A random shape: below `lead` leading dimensions, each in 1..=`dim`, then a last one in
/// 1..=`last`.
pub fn random_shape(rng: &mut Rng, lead: u64, dim: u64, last: u64) -> Vec<usize> {
    let mut shape: Vec<usize> = (0..rng.below(lead))
        .map(|_| 1 + rng.below(dim) as usize)
        .collect();
    shape.push(1 + rng.below(last) as usize);
    shape
}

/// Floats of `n` values, the bits of an array read as float32.
pub fn floats(a: &Array) -> Vec<f32> {
    a.astype(Dtype::Float32).unwrap().to_vec().unwrap()
}

pub const FLOATS: [Dtype; 3] = [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16];

/// A gated norm's random inputs on `shape`, drawn in this order: x's dtype, x (scale
/// `scales[0]`), the gate's dtype, the gate (`scales[1]`), the weight [D] (x's dtype,
/// `scales[2]`). Returns x's dtype and the three.
pub fn norm_twins(rng: &mut Rng, shape: &[usize], scales: [f32; 3]) -> (Dtype, [Twin; 3]) {
    let dtype = rng.pick(&FLOATS);
    let x = Twin::random(rng, shape, scales[0], dtype);
    let gate_dtype = rng.pick(&FLOATS);
    let gate = Twin::random(rng, shape, scales[1], gate_dtype);
    let w = Twin::random(rng, &[*shape.last().unwrap()], scales[2], dtype);
    (dtype, [x, gate, w])
}
