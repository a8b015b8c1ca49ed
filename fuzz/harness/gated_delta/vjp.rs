//! Target `gated_delta_vjp`: mlxk_gated_delta_update_vjp, and (a quarter of the calls, by the
//! out-parameter byte's top bits) mlxk_gated_delta_update_chunked_vjp with a chunk size from a
//! list of valid and invalid ones; both have the same rules and results apart from chunk_size
//! and the chunked backward's kept states (a memory refusal the model allows under a tight
//! limit).

use std::ptr::null_mut;

use super::*;

const VJP: &str = "mlxk_gated_delta_update_vjp";
const CHUNKED_VJP: &str = "mlxk_gated_delta_update_chunked_vjp";

/// Chunk sizes the chunked call gets: 0 (the default) and multiples of 16 in [16, 128] are
/// valid, the rest refused by name.
const CHUNKS: [i32; 10] = [0, 16, 32, 48, 64, 128, 8, 20, -16, 144];
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
fn named_argument<'a>(msg: &'a str, function: &str) -> &'a str {
    let rest = msg
        .strip_prefix(function)
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
    let chunk = (byte >= 192).then(|| input.pick(&CHUNKS));
    let function = if chunk.is_some() { CHUNKED_VJP } else { VJP };
    if let Some(c) = chunk {
        if !(c == 0 || (16..=128).contains(&c) && c % 16 == 0) {
            e.fail(
                MLXK_ERR_INVALID_ARGUMENT,
                format!("chunk_size {c} is not 0 or a multiple of 16 in [16, 128]"),
            );
            named.push((MLXK_ERR_INVALID_ARGUMENT, "chunk_size".to_string()));
        }
    }
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
        // The message names the pair, either first.
        named.push((MLXK_ERR_INVALID_ARGUMENT, GRADS[i].to_string()));
        named.push((MLXK_ERR_INVALID_ARGUMENT, GRADS[j].to_string()));
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
            if chunk.is_some() && tight.is_some() {
                // The kept states of the running jobs: the implementation's, not promised.
                e.maybe(MLXK_ERR_OUT_OF_MEMORY, "the chunked backward's kept states");
            }
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
        match chunk {
            None => mlxk_gated_delta_update_vjp(
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
            ),
            Some(c) => mlxk_gated_delta_update_chunked_vjp(
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
            ),
        }
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check(function, status);
    if status != MLXK_OK {
        assert!(
            slots.iter().all(|&h| h == sentinel()),
            "{function} wrote an out-parameter on failure"
        );
        // The message names an argument whose rule is broken (for the rules that name one,
        // unless a rule the model cannot evaluate allows this status too).
        let msg = last_error();
        let arg = named_argument(&msg, function);
        let listed: Vec<&str> = named
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, a)| a.as_str())
            .collect();
        let known = |a: &str| ARGS.contains(&a) || GRADS.contains(&a) || a == "chunk_size";
        if !listed.is_empty() && listed.iter().all(|a| known(a)) {
            assert!(
                listed.contains(&arg),
                "{function} returned {} naming {arg:?} ({msg}); the broken rules name {listed:?}",
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
