//! Targets `gated_delta` and `gated_delta_vjp`, their common part: decoding one round's
//! arguments (dims, dtypes, optional state and mask, each possibly perturbed) and the rules of
//! mlxk_gated_delta_update's arguments, which its backward pass shares. Each target's calls
//! and checks: forward.rs (`gated_delta`) and vjp.rs (`gated_delta_vjp`).

use std::ptr::null_mut;

use super::*;

mod forward;
mod vjp;

pub use forward::run;
pub use vjp::run_vjp;

const MAX_ROUNDS: usize = 3;
/// The most elements of one argument array.
const MAX_ELEMENTS: u128 = 1 << 18;

#[derive(Clone)]
struct Arg {
    name: &'static str,
    kind: Kind,
    shape: Vec<i64>,
    dtype: mlxk_dtype,
    h: H,
    bytes: Vec<u8>,
}

impl Arg {
    fn live(&self) -> bool {
        self.kind == Kind::Live
    }
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    b: i64,
    t: i64,
    hk: i64,
    hv: i64,
    dk: i64,
    dv: i64,
}

fn pick_dims(input: &mut Input) -> Dims {
    if input.chance(16) {
        // Empty arrays whose other dims are huge: the products must not overflow anywhere.
        let b = input.pick(&[0i64, 1]);
        let t = if b == 0 {
            input.pick(&[0i64, 1, 65536, i32::MAX as i64])
        } else {
            0
        };
        let hk = input.pick(&[1i64, 4096]);
        let hv = hk * input.pick(&[1i64, 2, 16]);
        let dk = input.pick(&[32i64, 256]);
        // With B = 1 the state [1, Hv, Dv, Dk] is over 2^31-1 elements: refused, not computed.
        let dv = if b == 0 {
            input.pick(&[1i64, 65536, i32::MAX as i64])
        } else {
            input.pick(&[1i64 << 26, i32::MAX as i64])
        };
        return Dims {
            b,
            t,
            hk,
            hv,
            dk,
            dv,
        };
    }
    let b = input.pick(&[1i64, 2, 3, 0, 1, 2]);
    let t = input.pick(&[1i64, 2, 3, 0, 1, 4, 5]);
    let hk = input.pick(&[1i64, 1, 2, 3]);
    let mut hv = hk * input.pick(&[1i64, 2, 3]);
    if input.chance(16) {
        hv = input.pick(&[0i64, hk + 1, 2 * hk - 1, 5]);
    }
    let mut dk = input.pick(&[32i64, 32, 64, 64, 128, 256]);
    if input.chance(16) {
        dk = input.pick(&[0i64, 1, 16, 33, 48, 96, 288, 512]);
    }
    let mut dv = input.pick(&[4i64, 1, 2, 3, 8, 16]);
    if input.chance(16) {
        dv = 0;
    }
    Dims {
        b,
        t,
        hk,
        hv,
        dk,
        dv,
    }
}

/// Possibly perturbs an argument's shape, dtype or handle.
fn perturb(input: &mut Input, shape: &mut Vec<i64>, dtype: &mut mlxk_dtype, kind: &mut Kind) {
    if !input.chance(14) {
        return;
    }
    let (old_shape, old_dtype) = (shape.clone(), *dtype);
    match input.u8() % 7 {
        0 => *dtype = (input.u8() % 8) as mlxk_dtype,
        1 => {
            shape.pop();
        }
        2 => shape.push(input.pick(&[1i64, 2])),
        3 if !shape.is_empty() => {
            let axis = input.below(shape.len());
            let d = shape[axis];
            shape[axis] = (input.pick(&[0i64, 1, 2, 3, d + 1, d * 2, 33])).min(i32::MAX as i64);
        }
        4 => *kind = Kind::Null,
        5 => *kind = Kind::Dead,
        _ => *kind = Kind::Foreign,
    }
    if count(shape).is_none_or(|n| n > MAX_ELEMENTS) {
        *shape = old_shape;
        *dtype = old_dtype;
    }
}

struct Ctx {
    dead: Vec<H>,
    foreign: Foreign,
}

impl Ctx {
    /// Makes one argument (a live array of `shape` and `dtype`, or another kind of handle).
    fn arg(
        &mut self,
        input: &mut Input,
        name: &'static str,
        mut shape: Vec<i64>,
        mut dtype: mlxk_dtype,
        present: bool,
    ) -> Arg {
        let mut kind = if present { Kind::Live } else { Kind::Null };
        if present {
            perturb(input, &mut shape, &mut dtype, &mut kind);
        }
        if kind == Kind::Live && count(&shape).is_none_or(|n| n > MAX_ELEMENTS) {
            // Only empty-with-huge-dims arguments are big; an absent one stands in (state).
            kind = Kind::Null;
        }
        let mut bytes = Vec::new();
        let h = if kind == Kind::Live {
            let mut mode = DataMode::pick(input);
            if dtype == MLXK_DTYPE_BOOL && mode == DataMode::Raw {
                mode = DataMode::Nice;
            }
            let mut fill = Fill::new(input.u16() as u64);
            bytes = make_data(&mut fill, count_usize(&shape), dtype, mode);
            if dtype == MLXK_DTYPE_BOOL && name == "mask" {
                match input.u8() % 4 {
                    3 => bytes.iter_mut().for_each(|b| *b = 0),
                    2 => bytes.iter_mut().for_each(|b| *b = 1),
                    _ => {}
                }
            }
            new_array(&bytes, &shape, dtype)
        } else {
            handle_of(kind, null_mut(), &self.dead, &self.foreign, input)
        };
        Arg {
            name,
            kind,
            shape,
            dtype,
            h,
            bytes,
        }
    }

    fn release(&mut self, arg: &mut Arg) {
        if arg.live() {
            free_ok(arg.h);
            self.dead.push(arg.h);
            arg.kind = Kind::Dead;
        }
    }
}

/// Handle rules for a list of arguments; false when one is unusable (then shape and dtype
/// rules cannot be evaluated by the model, and those statuses are allowed too).
fn expect_handles(e: &mut Expect, required: &[&Arg], optional: &[&Arg]) -> bool {
    let mut usable = true;
    for a in required {
        expect_handle(e, a.name, a.kind, false);
        usable &= a.live();
    }
    for a in optional {
        expect_handle(e, a.name, a.kind, true);
        usable &= matches!(a.kind, Kind::Live | Kind::Null);
    }
    if !usable {
        e.maybe(MLXK_ERR_SHAPE, "rules over an unusable handle");
        e.maybe(MLXK_ERR_DTYPE, "rules over an unusable handle");
    }
    usable
}

fn want_shape(e: &mut Expect, a: &Arg, shape: &[i64]) {
    if a.shape != shape {
        e.fail(
            MLXK_ERR_SHAPE,
            format!("{}: shape {:?}, expected {shape:?}", a.name, a.shape),
        );
    }
}

fn want_float(e: &mut Expect, a: &Arg) {
    if !is_float(a.dtype) {
        e.fail(
            MLXK_ERR_DTYPE,
            format!("{}: dtype {} is not float", a.name, a.dtype),
        );
    }
}

/// Output sizes: > 2^31-1 elements in one output, or bytes above the limit, are refused.
fn expect_sizes(e: &mut Expect, outputs: &[(u128, usize)], internal: u128, limit: u128) {
    let mut bytes: u128 = 0;
    for &(n, size) in outputs {
        if n > i32::MAX as u128 {
            e.fail(
                MLXK_ERR_INVALID_ARGUMENT,
                format!("an output of {n} elements"),
            );
            e.maybe(MLXK_ERR_OUT_OF_MEMORY, "and its bytes");
            return;
        }
        bytes += n * size as u128;
    }
    if bytes > limit {
        e.fail(
            MLXK_ERR_OUT_OF_MEMORY,
            format!("{bytes} bytes of results > limit {limit}"),
        );
    } else if bytes + internal > limit {
        e.maybe(
            MLXK_ERR_OUT_OF_MEMORY,
            "results plus the internal g and beta exceed the limit",
        );
    }
}

/// The recurrence rules shared by update (base q) and replay (base k). Returns the dims when
/// everything holds.
#[allow(clippy::too_many_arguments)]
fn expect_recurrence(
    e: &mut Expect,
    base: &Arg,
    other: Option<&Arg>,
    v: &Arg,
    a: &Arg,
    b: &Arg,
    a_log: &Arg,
    dt_bias: &Arg,
    state: &Arg,
) -> Option<Dims> {
    if base.shape.len() != 4 {
        e.fail(
            MLXK_ERR_SHAPE,
            format!("{}: rank {}", base.name, base.shape.len()),
        );
        e.maybe(MLXK_ERR_SHAPE, "later rules");
        e.maybe(MLXK_ERR_DTYPE, "later rules");
        return None;
    }
    want_float(e, base);
    let (bsz, t, hk, dk) = (base.shape[0], base.shape[1], base.shape[2], base.shape[3]);
    if let Some(k) = other {
        want_shape(e, k, &base.shape);
        if k.dtype != base.dtype {
            e.fail(MLXK_ERR_DTYPE, "k's dtype differs from q's");
        }
    }
    if v.dtype != base.dtype {
        e.fail(MLXK_ERR_DTYPE, "v's dtype differs");
    }
    if v.shape.len() != 4 || v.shape[0] != bsz || v.shape[1] != t {
        e.fail(MLXK_ERR_SHAPE, format!("v: shape {:?}", v.shape));
        if v.shape.len() != 4 {
            e.maybe(MLXK_ERR_SHAPE, "later rules");
            e.maybe(MLXK_ERR_DTYPE, "later rules");
            return None;
        }
    }
    let (hv, dv) = (v.shape[2], v.shape[3]);
    if !(32..=256).contains(&dk) || dk % 32 != 0 {
        e.fail(MLXK_ERR_SHAPE, format!("Dk {dk}"));
    }
    if hk < 1 {
        e.fail(MLXK_ERR_SHAPE, format!("Hk {hk}"));
    } else if hv < 1 || hv % hk != 0 {
        e.fail(MLXK_ERR_SHAPE, format!("Hv {hv} with Hk {hk}"));
    }
    if dv < 1 {
        e.fail(MLXK_ERR_SHAPE, format!("Dv {dv}"));
    }
    for g in [a, b] {
        want_shape(e, g, &[bsz, t, hv]);
        want_float(e, g);
    }
    want_shape(e, a_log, &[hv]);
    if !matches!(a_log.dtype, MLXK_DTYPE_FLOAT32 | MLXK_DTYPE_BFLOAT16) {
        e.fail(MLXK_ERR_DTYPE, "a_log is neither float32 nor bfloat16");
    }
    want_shape(e, dt_bias, &[hv]);
    want_float(e, dt_bias);
    if state.live() {
        want_shape(e, state, &[bsz, hv, dv, dk]);
        if state.dtype != MLXK_DTYPE_FLOAT32 {
            e.fail(MLXK_ERR_DTYPE, "state is not float32");
        }
    }
    Some(Dims {
        b: bsz,
        t,
        hk,
        hv,
        dk,
        dv,
    })
}

fn is_zero(bytes: &[u8], dtype: mlxk_dtype, i: usize) -> bool {
    float_at(bytes, dtype, i) == 0.0
}

struct Round {
    q: Arg,
    k: Arg,
    v: Arg,
    a: Arg,
    b: Arg,
    a_log: Arg,
    dt_bias: Arg,
    state: Arg,
    mask: Arg,
}

/// The arguments of one round: dims, dtypes, optional state and mask, each possibly perturbed.
fn new_round(ctx: &mut Ctx, input: &mut Input) -> Round {
    let d = pick_dims(input);
    let qdt = input.pick(&FLOATS);
    let (b, t, hk, hv, dk, dv) = (d.b, d.t, d.hk, d.hv, d.dk, d.dv);
    let (adt, bdt, dtdt) = (
        input.pick(&FLOATS),
        input.pick(&FLOATS),
        input.pick(&FLOATS),
    );
    let aldt = input.pick(&[MLXK_DTYPE_FLOAT32, MLXK_DTYPE_BFLOAT16]);
    let (with_state, with_mask) = (input.chance(128), input.chance(90));
    Round {
        q: ctx.arg(input, "q", vec![b, t, hk, dk], qdt, true),
        k: ctx.arg(input, "k", vec![b, t, hk, dk], qdt, true),
        v: ctx.arg(input, "v", vec![b, t, hv, dv], qdt, true),
        a: ctx.arg(input, "a", vec![b, t, hv], adt, true),
        b: ctx.arg(input, "b", vec![b, t, hv], bdt, true),
        a_log: ctx.arg(input, "a_log", vec![hv], aldt, true),
        dt_bias: ctx.arg(input, "dt_bias", vec![hv], dtdt, true),
        state: ctx.arg(
            input,
            "state",
            vec![b, hv, dv, dk],
            MLXK_DTYPE_FLOAT32,
            with_state,
        ),
        mask: ctx.arg(input, "mask", vec![b, t], MLXK_DTYPE_BOOL, with_mask),
    }
}

fn release_round(ctx: &mut Ctx, r: &mut Round) {
    for arg in [
        &mut r.q,
        &mut r.k,
        &mut r.v,
        &mut r.a,
        &mut r.b,
        &mut r.a_log,
        &mut r.dt_bias,
        &mut r.state,
        &mut r.mask,
    ] {
        ctx.release(arg);
    }
}

/// The rules of mlxk_gated_delta_update's arguments (handles, recurrence, mask, sizes), shared
/// with its backward pass (whose cotangents `extra` are optional handles). Returns the dims when
/// the recurrence's shapes hold.
fn expect_forward(e: &mut Expect, r: &Round, extra: &[&Arg], tight: Option<usize>) -> Option<Dims> {
    let mut optional = vec![&r.state, &r.mask];
    optional.extend_from_slice(extra);
    let mut dims = None;
    if expect_handles(
        e,
        &[&r.q, &r.k, &r.v, &r.a, &r.b, &r.a_log, &r.dt_bias],
        &optional,
    ) {
        dims = expect_recurrence(
            e,
            &r.q,
            Some(&r.k),
            &r.v,
            &r.a,
            &r.b,
            &r.a_log,
            &r.dt_bias,
            &r.state,
        );
        if let (Some(d), true) = (dims, r.mask.live()) {
            want_shape(e, &r.mask, &[d.b, d.t]);
            if r.mask.dtype != MLXK_DTYPE_BOOL {
                e.fail(MLXK_ERR_DTYPE, "mask is not bool");
            }
        }
        if let (Some(d), false) = (dims, e.must_fail()) {
            let bt_hv = count(&[d.b, d.t, d.hv]).unwrap();
            expect_sizes(
                e,
                &[
                    (
                        count(&[d.b, d.t, d.hv, d.dv]).unwrap(),
                        dtype_size(r.q.dtype),
                    ),
                    (count(&[d.b, d.hv, d.dv, d.dk]).unwrap(), 4),
                ],
                bt_hv * (4 + dtype_size(r.b.dtype) as u128),
                current_limit(tight),
            );
        }
    }
    dims
}
