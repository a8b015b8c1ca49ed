//! Target `gated_delta`: mlxk_gated_delta_update (and its chunked form), mlxk_compute_g and
//! mlxk_gated_delta_state on small random dims (usually valid, sometimes not: Dk off the multiples of 32, Hv not a
//! multiple of Hk, empty batches and sequences, empty arrays with huge other dims), random
//! dtypes, optional state and mask, perturbed shapes, NULL / freed / foreign handles, random
//! accepted lengths and tight memory limits. Checked properties on success: documented result
//! shapes and dtypes; y is 0 at masked tokens; a call whose tokens are all masked (or T = 0)
//! returns the start state bit for bit; g is NaN or in [0, 1]; the replay over all T tokens
//! equals the update's state and the replay over none the start state.

use std::ptr::null_mut;

use super::*;

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

/// The start state of a call, as bytes of `len`: the given state, zeros when absent, None
/// when the state argument is not usable.
fn start_state(state: &Arg, len: usize) -> Option<Vec<u8>> {
    match state.kind {
        Kind::Live => Some(state.bytes.clone()),
        Kind::Null => Some(vec![0u8; len]),
        _ => None,
    }
}

fn round(ctx: &mut Ctx, input: &mut Input) {
    // Which calls come first, so that short inputs reach every function.
    let mut ops = input.u8();
    let mut r = new_round(ctx, input);

    let mut update_state: Option<Vec<u8>> = None;
    for _ in 0..3 {
        match ops % 4 {
            0 | 3 => update(ctx, input, &mut r, &mut update_state),
            1 => replay(input, &r, update_state.as_deref()),
            _ => compute_g(ctx, input, &r),
        }
        ops /= 4;
    }
    release_round(ctx, &mut r);
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

fn update(ctx: &mut Ctx, input: &mut Input, r: &mut Round, update_state: &mut Option<Vec<u8>>) {
    let mut e = Expect::new();
    let byte = input.u8();
    let outs = byte % 16;
    let (y_null, s_null, same) = (outs == 15, outs == 14, outs == 13);
    // The high bits pick the form: mostly the exact update, else the chunked form with a chunk
    // size valid (0 = default, multiples of 16 up to 128) or not.
    const CHUNKS: [i32; 6] = [0, 16, 32, 128, 8, -16];
    let chunk = (byte / 16 >= 10).then(|| CHUNKS[(byte / 16 - 10) as usize]);
    let function = if chunk.is_some() {
        "mlxk_gated_delta_update_chunked"
    } else {
        "mlxk_gated_delta_update"
    };
    if let Some(c) = chunk {
        if !(c == 0 || ((16..=128).contains(&c) && c % 16 == 0)) {
            e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("chunk_size {c}"));
        }
    }
    if y_null {
        e.fail(MLXK_ERR_NULL_POINTER, "y is NULL");
    }
    if s_null {
        e.fail(MLXK_ERR_NULL_POINTER, "state_out is NULL");
    }
    if same {
        e.fail(
            MLXK_ERR_INVALID_ARGUMENT,
            "y and state_out are the same pointer",
        );
    }
    let tight = tight_limit(input);
    let dims = expect_forward(&mut e, r, &[], tight);
    let state_given = r.state.clone();
    let (mut y, mut s) = (sentinel(), sentinel());
    let y_ptr: *mut H = if y_null { null_mut() } else { &mut y };
    let s_ptr: *mut H = if s_null {
        null_mut()
    } else if same {
        y_ptr
    } else {
        &mut s
    };
    let status = match chunk {
        // SAFETY: handles are tokens (any value is safe to pass); the out-pointers are NULL or
        // point at the locals above.
        None => unsafe {
            mlxk_gated_delta_update(
                r.q.h,
                r.k.h,
                r.v.h,
                r.a.h,
                r.b.h,
                r.a_log.h,
                r.dt_bias.h,
                r.state.h,
                r.mask.h,
                y_ptr,
                s_ptr,
            )
        },
        // SAFETY: as above.
        Some(c) => unsafe {
            mlxk_gated_delta_update_chunked(
                r.q.h,
                r.k.h,
                r.v.h,
                r.a.h,
                r.b.h,
                r.a_log.h,
                r.dt_bias.h,
                r.state.h,
                r.mask.h,
                c,
                y_ptr,
                s_ptr,
            )
        },
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check(function, status);
    if status != MLXK_OK {
        assert!(
            y == sentinel() && s == sentinel(),
            "{function} wrote an out-parameter on failure"
        );
        return;
    }
    let d = dims.expect("a success has valid dims");
    // The decode-loop pattern: free the old state before evaluating the new one.
    if r.state.live() && input.chance(64) {
        ctx.release(&mut r.state);
    }
    let yb = check_result("y", y, &[d.b, d.t, d.hv, d.dv], r.q.dtype);
    let sb = check_result("state_out", s, &[d.b, d.hv, d.dv, d.dk], MLXK_DTYPE_FLOAT32);
    free_ok(y);
    free_ok(s);
    ctx.dead.extend([y, s]);
    let per_token = (d.hv * d.dv) as usize;
    let mut all_masked = d.t == 0;
    let mut none_masked = true;
    if r.mask.live() {
        all_masked = true;
        for (token, &m) in r.mask.bytes.iter().enumerate() {
            if m == 0 {
                none_masked = false;
                for i in token * per_token..(token + 1) * per_token {
                    assert!(
                        is_zero(&yb, r.q.dtype, i),
                        "y is not 0 at masked token {token}"
                    );
                }
            } else {
                all_masked = false;
            }
        }
    }
    if all_masked {
        if let Some(start) = start_state(&state_given, sb.len()) {
            assert!(
                same_floats(&sb, &start, MLXK_DTYPE_FLOAT32),
                "state_out differs from the start state although no token was real"
            );
        }
    }
    // The replay must reproduce the exact update bit for bit (the chunked form only to rounding).
    if none_masked && chunk.is_none() {
        *update_state = Some(sb);
    }
}

fn compute_g(ctx: &mut Ctx, input: &mut Input, r: &Round) {
    // Usually the recurrence's own a [B, T, Hv]; sometimes an a of another rank.
    let mut extra = None;
    let a = if input.chance(64) {
        let hv = r.a_log.shape.first().copied().unwrap_or(1);
        let rank = input.below(4);
        let mut shape: Vec<i64> = (0..rank).map(|_| input.pick(&[0i64, 1, 2, 3])).collect();
        if rank > 0 {
            *shape.last_mut().unwrap() = if input.chance(32) { hv + 1 } else { hv };
        }
        let dtype = input.pick(&FLOATS);
        let arg = ctx.arg(input, "a", shape, dtype, true);
        extra = Some(arg);
        extra.as_ref().unwrap()
    } else {
        &r.a
    };
    let out_null = input.chance(10);
    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "g is NULL");
    }
    let tight = tight_limit(input);
    if expect_handles(&mut e, &[&r.a_log, a, &r.dt_bias], &[]) {
        if a.shape.is_empty() {
            e.fail(MLXK_ERR_SHAPE, "a is a scalar");
        }
        if r.a_log.shape.len() != 1 {
            e.fail(MLXK_ERR_SHAPE, "a_log is not [Hv]");
            e.maybe(MLXK_ERR_SHAPE, "later rules");
            e.maybe(MLXK_ERR_DTYPE, "later rules");
        } else {
            let hv = r.a_log.shape[0];
            if a.shape.last().is_some_and(|&l| l != hv) {
                e.fail(MLXK_ERR_SHAPE, "a's last dim is not Hv");
            }
            want_shape(&mut e, &r.dt_bias, &[hv]);
        }
        if !matches!(r.a_log.dtype, MLXK_DTYPE_FLOAT32 | MLXK_DTYPE_BFLOAT16) {
            e.fail(MLXK_ERR_DTYPE, "a_log is neither float32 nor bfloat16");
        }
        want_float(&mut e, a);
        want_float(&mut e, &r.dt_bias);
        if !e.must_fail() {
            expect_sizes(
                &mut e,
                &[(count(&a.shape).unwrap(), 4)],
                0,
                current_limit(tight),
            );
        }
    }
    let mut g = sentinel();
    let status = unsafe {
        mlxk_compute_g(
            r.a_log.h,
            a.h,
            r.dt_bias.h,
            if out_null { null_mut() } else { &mut g },
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_compute_g", status);
    if status == MLXK_OK {
        let gb = check_result("g", g, &a.shape, MLXK_DTYPE_FLOAT32);
        for i in 0..gb.len() / 4 {
            let x = float_at(&gb, MLXK_DTYPE_FLOAT32, i);
            assert!(
                x.is_nan() || (0.0..=1.0).contains(&x),
                "g[{i}] = {x} is outside [0, 1]"
            );
        }
        free_ok(g);
        ctx.dead.push(g);
    } else {
        assert_eq!(
            g,
            sentinel(),
            "mlxk_compute_g wrote its out-parameter on failure"
        );
    }
    if let Some(mut arg) = extra {
        ctx.release(&mut arg);
    }
}

fn replay(input: &mut Input, r: &Round, update_state: Option<&[u8]>) {
    let bsz = r.k.shape.first().copied().unwrap_or(0).clamp(0, 64) as usize;
    let t = r.k.shape.get(1).copied().unwrap_or(0);
    let ti = t.clamp(0, i32::MAX as i64) as i32;
    let mode = input.u8() % 8;
    let mut lengths: Vec<i32> = match mode {
        0 | 1 => vec![ti; bsz],
        2 => vec![0; bsz],
        _ => (0..bsz)
            .map(|_| input.below(ti as usize + 1) as i32)
            .collect(),
    };
    let mut lengths_null = false;
    match input.u8() % 16 {
        15 if bsz > 0 => {
            let row = input.below(bsz);
            lengths[row] = input.pick(&[-1, ti.saturating_add(1), i32::MAX, i32::MIN]);
        }
        14 => lengths.push(0),
        13 => {
            lengths.pop();
        }
        12 => lengths_null = true,
        _ => {}
    }
    let out_null = input.chance(10);
    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "state_out is NULL");
    }
    if lengths_null && !lengths.is_empty() {
        e.fail(MLXK_ERR_NULL_POINTER, "accepted_lengths is NULL");
    }
    let tight = tight_limit(input);
    let mut dims = None;
    if expect_handles(
        &mut e,
        &[&r.k, &r.v, &r.a, &r.b, &r.a_log, &r.dt_bias],
        &[&r.state],
    ) {
        dims = expect_recurrence(
            &mut e, &r.k, None, &r.v, &r.a, &r.b, &r.a_log, &r.dt_bias, &r.state,
        );
        if let Some(d) = dims {
            if lengths.len() as i64 != d.b {
                e.fail(
                    MLXK_ERR_INVALID_ARGUMENT,
                    format!("n_lengths {} != B {}", lengths.len(), d.b),
                );
            } else if lengths.iter().any(|&l| l < 0 || l as i64 > d.t) {
                e.fail(MLXK_ERR_INVALID_ARGUMENT, "a length outside [0, T]");
            }
            if !e.must_fail() {
                let bt_hv = count(&[d.b, d.t, d.hv]).unwrap();
                expect_sizes(
                    &mut e,
                    &[(count(&[d.b, d.hv, d.dv, d.dk]).unwrap(), 4)],
                    bt_hv * (4 + dtype_size(r.b.dtype) as u128),
                    current_limit(tight),
                );
            }
        }
    }
    let mut s = sentinel();
    let status = unsafe {
        mlxk_gated_delta_state(
            r.k.h,
            r.v.h,
            r.a.h,
            r.b.h,
            r.a_log.h,
            r.dt_bias.h,
            r.state.h,
            if lengths_null {
                std::ptr::null()
            } else {
                lengths.as_ptr()
            },
            lengths.len(),
            if out_null { null_mut() } else { &mut s },
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_gated_delta_state", status);
    if status != MLXK_OK {
        assert_eq!(
            s,
            sentinel(),
            "mlxk_gated_delta_state wrote its out-parameter on failure"
        );
        return;
    }
    let d = dims.expect("a success has valid dims");
    let sb = check_result("state_out", s, &[d.b, d.hv, d.dv, d.dk], MLXK_DTYPE_FLOAT32);
    free_ok(s);
    if lengths.iter().all(|&l| l == 0) {
        if let Some(start) = start_state(&r.state, sb.len()) {
            assert!(
                same_floats(&sb, &start, MLXK_DTYPE_FLOAT32),
                "replay over no token changed the state"
            );
        }
    }
    if lengths.iter().all(|&l| l as i64 == d.t) {
        if let Some(u) = update_state {
            assert!(
                same_floats(&sb, u, MLXK_DTYPE_FLOAT32),
                "replay over all T tokens differs from the update's state"
            );
        }
    }
}

pub fn run(input: &mut Input) {
    let mut ctx = Ctx {
        dead: Vec::new(),
        foreign: Foreign::new(),
    };
    for _ in 0..MAX_ROUNDS {
        if input.exhausted() {
            break;
        }
        round(&mut ctx, input);
    }
}

// ---------------------------------------------------------------------------------------------
// Target `gated_delta_vjp`: mlxk_gated_delta_update_vjp

const VJP: &str = "mlxk_gated_delta_update_vjp";
const GRADS: [&str; 8] = ["dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"];

const ARGS: [&str; 11] = [
    "q",
    "k",
    "v",
    "a",
    "b",
    "a_log",
    "dt_bias",
    "state",
    "mask",
    "dy",
    "dstate_out",
];

/// The argument a failure's message names: "function: argument: what" or "function: argument
/// is NULL (...)".
fn named_argument(msg: &str) -> &str {
    let rest = msg
        .strip_prefix(VJP)
        .unwrap_or(msg)
        .trim_start_matches(": ");
    rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or("")
}

/// The argument a model's reason is about (its first word; the dims rules name the array the
/// dim comes from: Hk and Dk q's, Hv and Dv v's).
fn reason_argument(why: &str) -> &str {
    let word = why
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or("");
    match word {
        "Hk" | "Dk" => "q",
        "Hv" | "Dv" => "v",
        w => w,
    }
}

/// Every live float argument holds finite values of magnitude at most 2 (DataMode::Nice or
/// Zeros): the gradients of a few tokens are then finite.
fn moderate(a: &Arg) -> bool {
    !a.live()
        || !is_float(a.dtype)
        || (0..a.bytes.len() / dtype_size(a.dtype)).all(|i| {
            let x = float_at(&a.bytes, a.dtype, i);
            x.is_finite() && x.abs() <= 2.0
        })
}

fn all_zero(bytes: &[u8], dtype: mlxk_dtype) -> bool {
    (0..bytes.len() / dtype_size(dtype)).all(|i| is_zero(bytes, dtype, i))
}

fn update_vjp(ctx: &mut Ctx, input: &mut Input, r: &mut Round, dy: &Arg, ds: &Arg) {
    let mut e = Expect::new();
    // The reasons naming an argument, by status (for the message's argument).
    let mut named: Vec<(mlxk_status, String)> = Vec::new();
    // Out-parameters: all given, one NULL, or two at the same place.
    let byte = input.u8();
    let (null_out, alias) = match byte % 64 {
        o @ 48..=55 => (Some(o as usize - 48), None),
        o @ 56..=63 => {
            let i = (o - 56) as usize;
            (None, Some((i, (i + 1 + input.below(7)) % 8)))
        }
        _ => (None, None),
    };
    if let Some(i) = null_out {
        e.fail(MLXK_ERR_NULL_POINTER, format!("{} is NULL", GRADS[i]));
        named.push((MLXK_ERR_NULL_POINTER, GRADS[i].to_string()));
    }
    if let Some((i, j)) = alias {
        e.fail(
            MLXK_ERR_INVALID_ARGUMENT,
            format!("{} and {} are the same pointer", GRADS[i], GRADS[j]),
        );
    }
    let tight = tight_limit(input);
    let dims = expect_forward(&mut e, r, &[dy, ds], tight);
    if let Some(d) = dims {
        if dy.live() {
            want_shape(&mut e, dy, &[d.b, d.t, d.hv, d.dv]);
            want_float(&mut e, dy);
        }
        if ds.live() {
            want_shape(&mut e, ds, &[d.b, d.hv, d.dv, d.dk]);
            if ds.dtype != MLXK_DTYPE_FLOAT32 {
                e.fail(MLXK_ERR_DTYPE, "dstate_out is not float32");
            }
        }
        if !e.must_fail() {
            let grads = [
                (
                    count(&[d.b, d.t, d.hk, d.dk]).unwrap(),
                    dtype_size(r.q.dtype),
                ),
                (
                    count(&[d.b, d.t, d.hk, d.dk]).unwrap(),
                    dtype_size(r.q.dtype),
                ),
                (
                    count(&[d.b, d.t, d.hv, d.dv]).unwrap(),
                    dtype_size(r.q.dtype),
                ),
                (count(&[d.b, d.t, d.hv]).unwrap(), dtype_size(r.a.dtype)),
                (count(&[d.b, d.t, d.hv]).unwrap(), dtype_size(r.b.dtype)),
                (d.hv as u128, dtype_size(r.a_log.dtype)),
                (d.hv as u128, dtype_size(r.dt_bias.dtype)),
                (count(&[d.b, d.hv, d.dv, d.dk]).unwrap(), 4),
            ];
            // The backward kernel's float32 working copies are the implementation's (the
            // header does not promise them): they may be refused, never required to be.
            let per_token = (4 * d.hk * d.dk + 3 * d.hv * d.dv + 4 * d.hv) as u128;
            let internal = count(&[d.b, d.t]).unwrap() * per_token;
            if internal > i32::MAX as u128 {
                e.maybe(
                    MLXK_ERR_INVALID_ARGUMENT,
                    "the working copies have over 2^31-1 elements",
                );
            }
            expect_sizes(&mut e, &grads, internal * 4, current_limit(tight));
        }
    }
    for (status, why) in e.reasons() {
        if [MLXK_ERR_INVALID_HANDLE, MLXK_ERR_SHAPE, MLXK_ERR_DTYPE].contains(status) {
            named.push((*status, reason_argument(why).to_string()));
        }
    }

    let mut slots = [sentinel(); 8];
    let mut ptrs: [*mut H; 8] = [null_mut(); 8];
    for (i, p) in ptrs.iter_mut().enumerate() {
        *p = &mut slots[i];
    }
    if let Some(i) = null_out {
        ptrs[i] = null_mut();
    }
    if let Some((i, j)) = alias {
        ptrs[j] = ptrs[i];
    }
    // SAFETY: handles are tokens (any value is safe to pass); each out-pointer is NULL or
    // points into `slots`.
    let status = unsafe {
        mlxk_gated_delta_update_vjp(
            r.q.h,
            r.k.h,
            r.v.h,
            r.a.h,
            r.b.h,
            r.a_log.h,
            r.dt_bias.h,
            r.state.h,
            r.mask.h,
            dy.h,
            ds.h,
            ptrs[0],
            ptrs[1],
            ptrs[2],
            ptrs[3],
            ptrs[4],
            ptrs[5],
            ptrs[6],
            ptrs[7],
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check(VJP, status);
    if status != MLXK_OK {
        assert!(
            slots.iter().all(|&h| h == sentinel()),
            "{VJP} wrote an out-parameter on failure"
        );
        // The message names an argument whose rule is broken (for the rules that name one,
        // unless a rule the model cannot evaluate allows this status too).
        let msg = last_error();
        let arg = named_argument(&msg);
        let listed: Vec<&str> = named
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, a)| a.as_str())
            .collect();
        let known = |a: &str| ARGS.contains(&a) || GRADS.contains(&a);
        if !listed.is_empty() && listed.iter().all(|a| known(a)) {
            assert!(
                listed.contains(&arg),
                "{VJP} returned {} naming {arg:?} ({msg}); the broken rules name {listed:?}",
                status_name(status)
            );
        }
        return;
    }
    let d = dims.expect("a success has valid dims");
    let shapes: [(Vec<i64>, mlxk_dtype); 8] = [
        (vec![d.b, d.t, d.hk, d.dk], r.q.dtype),
        (vec![d.b, d.t, d.hk, d.dk], r.q.dtype),
        (vec![d.b, d.t, d.hv, d.dv], r.q.dtype),
        (vec![d.b, d.t, d.hv], r.a.dtype),
        (vec![d.b, d.t, d.hv], r.b.dtype),
        (vec![d.hv], r.a_log.dtype),
        (vec![d.hv], r.dt_bias.dtype),
        (vec![d.b, d.hv, d.dv, d.dk], MLXK_DTYPE_FLOAT32),
    ];
    let handles = slots;
    let grads: Vec<Vec<u8>> = (0..8)
        .map(|i| check_result(GRADS[i], handles[i], &shapes[i].0, shapes[i].1))
        .collect();
    for h in handles {
        free_ok(h);
        ctx.dead.push(h);
    }
    let args = [
        &r.q, &r.k, &r.v, &r.a, &r.b, &r.a_log, &r.dt_bias, &r.state, dy, ds,
    ];
    let tame = args.iter().all(|a| moderate(a));
    if tame && !dy.live() && !ds.live() {
        for (i, g) in grads.iter().enumerate() {
            assert!(
                all_zero(g, shapes[i].1),
                "{}: not zero without cotangents",
                GRADS[i]
            );
        }
    }
    // A few tokens of moderate inputs: finite gradients (float16's range excepted).
    if tame && d.t <= 3 {
        for (i, g) in grads.iter().enumerate() {
            if shapes[i].1 != MLXK_DTYPE_FLOAT16 {
                assert!(all_finite(g, shapes[i].1), "{}: not finite", GRADS[i]);
            }
        }
    }
    // Masked tokens get zero gradients; with every token masked the state's gradient is
    // dstate_out (zeros without it) and the gates' parameters get none.
    let mut all_masked = d.t == 0;
    if r.mask.live() && tame {
        all_masked = r.mask.bytes.iter().all(|&m| m == 0);
        for (token, &m) in r.mask.bytes.iter().enumerate() {
            if m != 0 {
                continue;
            }
            for (i, per) in [
                (0, d.hk * d.dk),
                (1, d.hk * d.dk),
                (2, d.hv * d.dv),
                (3, d.hv),
                (4, d.hv),
            ] {
                let per = per as usize;
                for j in token * per..(token + 1) * per {
                    assert!(
                        is_zero(&grads[i], shapes[i].1, j),
                        "{}: not 0 at masked token {token}",
                        GRADS[i]
                    );
                }
            }
        }
    }
    if all_masked && tame {
        let want = if ds.live() {
            ds.bytes.clone()
        } else {
            vec![0u8; grads[7].len()]
        };
        assert!(
            same_floats(&grads[7], &want, MLXK_DTYPE_FLOAT32),
            "dstate differs from dstate_out although no token was real"
        );
        for i in [5, 6] {
            assert!(
                all_zero(&grads[i], shapes[i].1),
                "{}: not zero with every token masked",
                GRADS[i]
            );
        }
    }
}

fn round_vjp(ctx: &mut Ctx, input: &mut Input) {
    let calls = 1 + input.u8() % 2;
    let mut r = new_round(ctx, input);
    let b = r.q.shape.first().copied().unwrap_or(1);
    let t = r.q.shape.get(1).copied().unwrap_or(1);
    let dk = r.q.shape.get(3).copied().unwrap_or(32);
    let hv = r.v.shape.get(2).copied().unwrap_or(1);
    let dv = r.v.shape.get(3).copied().unwrap_or(1);
    let (with_dy, with_ds) = (input.chance(170), input.chance(128));
    let dy_dtype = input.pick(&FLOATS);
    let mut dy = ctx.arg(input, "dy", vec![b, t, hv, dv], dy_dtype, with_dy);
    let mut ds = ctx.arg(
        input,
        "dstate_out",
        vec![b, hv, dv, dk],
        MLXK_DTYPE_FLOAT32,
        with_ds,
    );
    for _ in 0..calls {
        update_vjp(ctx, input, &mut r, &dy, &ds);
    }
    ctx.release(&mut dy);
    ctx.release(&mut ds);
    release_round(ctx, &mut r);
}

pub fn run_vjp(input: &mut Input) {
    let mut ctx = Ctx {
        dead: Vec::new(),
        foreign: Foreign::new(),
    };
    for _ in 0..MAX_ROUNDS {
        if input.exhausted() {
            break;
        }
        round_vjp(&mut ctx, input);
    }
}
