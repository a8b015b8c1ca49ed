//! Quick timing probe (not a benchmark: `make bench` is). Run with
//! `cargo bench --bench perf_probe [-- NAME...]` (probe, subnormals_in_probe_state,
//! prefill_only; all without a name).

mod common;
use common::*;
use std::ptr::{null, null_mut};
use std::time::Instant;

const BF16: mlxk_dtype = MLXK_DTYPE_BFLOAT16;

fn probe() {
    let mut rng = Rng::seeded(7);
    let dims = [1, 1, 16, 32, 128, 128];
    let r = Inputs::random(&mut rng, dims, true, BF16);
    let mut state = r.handles[7];
    let [q, k, v, a, b, al, dt, _, _] = r.args();
    println!("cpu threads: {}", mlxkern::testing::cpu_threads());
    let rounds = if std::env::var_os("PROBE_DECODE_ONLY").is_some() {
        40
    } else {
        3
    };
    for round in 0..rounds {
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let in_place = mlxkern::testing::in_place_updates();
        for _ in 0..30 {
            let (mut y, mut next) = (null_mut(), null_mut());
            ok(unsafe {
                mlxk_gated_delta_update(q, k, v, a, b, al, dt, state, null(), &mut y, &mut next)
            });
            free(state);
            free(y);
            state = next;
            if std::env::var_os("PROBE_EVAL_EACH").is_some() {
                ok(mlxk_array_eval(state));
            }
        }
        ok(mlxk_array_eval(state));
        println!(
            "decode hot round {round}: {:.1} us/step wall, {:.1} us/step cpu",
            t0.elapsed().as_secs_f64() * 1e6 / 30.0,
            (cpu_seconds() - c0) * 1e6 / 30.0
        );
        println!(
            "  in-place updates: {}",
            mlxkern::testing::in_place_updates() - in_place
        );
    }
    if std::env::var_os("PROBE_DECODE_ONLY").is_some() {
        return;
    }
    let t = 512;
    let p = Inputs::random(&mut rng, [1, t, 16, 32, 128, 128], false, BF16);
    for round in 0..2 {
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let (y, s) = p.update();
        ok(mlxk_array_eval(s));
        println!(
            "prefill T={t} round {round}: {:.0} tok/s wall, {:.0} tok/s per cpu-second",
            t as f64 / t0.elapsed().as_secs_f64(),
            t as f64 / (cpu_seconds() - c0)
        );
        free(y);
        free(s);
    }
    p.free();
    for h in r.handles[..7].iter().chain([&state]) {
        free(*h);
    }
}

fn subnormals_in_probe_state() {
    let mut rng = Rng::seeded(7);
    let r = Inputs::random(&mut rng, [1, 64, 16, 32, 128, 128], false, BF16);
    let (y, s) = r.update();
    let v = read_f32(s);
    let sub = v.iter().filter(|x| x.is_subnormal()).count();
    let zero = v.iter().filter(|x| **x == 0.0).count();
    let tiny = v.iter().filter(|x| x.abs() < 1e-30 && **x != 0.0).count();
    println!(
        "state: {} values, {sub} subnormal, {zero} zero, {tiny} below 1e-30",
        v.len()
    );
    free(y);
    free(s);
    r.free();
}

fn prefill_only() {
    let mut rng = Rng::seeded(9);
    let t: usize = env_or("PROBE_T", 64);
    let p = Inputs::random(&mut rng, [1, t, 16, 32, 128, 128], false, BF16);
    let (y, s) = p.update();
    ok(mlxk_array_eval(s));
    free(y);
    free(s);
    p.free();
}

fn main() {
    run_probes(&[
        ("probe", probe),
        ("subnormals_in_probe_state", subnormals_in_probe_state),
        ("prefill_only", prefill_only),
    ]);
}
