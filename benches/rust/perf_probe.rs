//! Quick timing probe (not a benchmark: `make bench` is). Run with
//! `cargo bench --bench perf_probe [-- NAME...]` (probe, subnormals_in_probe_state,
//! prefill_only; all without a name).

#[path = "../../tests/support/mod.rs"]
mod support;
use std::ptr::{null, null_mut};
use std::time::Instant;
use support::*;

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn probe() {
    let mut rng = Rng::seeded(7);
    let dims = [1, 1, 16, 32, 128, 128];
    let r = Recurrence::random(&mut rng, dims, true, false);
    let mut state = r.state.unwrap();
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
    let p = Recurrence::random(&mut rng, [1, t, 16, 32, 128, 128], false, false);
    for round in 0..2 {
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let (status, y, s) = p.run();
        ok(status);
        ok(mlxk_array_eval(s));
        println!(
            "prefill T={t} round {round}: {:.0} tok/s wall, {:.0} tok/s per cpu-second",
            t as f64 / t0.elapsed().as_secs_f64(),
            t as f64 / (cpu_seconds() - c0)
        );
        free(y);
        free(s);
    }
}

fn subnormals_in_probe_state() {
    let mut rng = Rng::seeded(7);
    let r = Recurrence::random(&mut rng, [1, 64, 16, 32, 128, 128], false, false);
    let (status, y, s) = r.run();
    ok(status);
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
}

fn prefill_only() {
    let mut rng = Rng::seeded(9);
    let t: usize = std::env::var("PROBE_T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let p = Recurrence::random(&mut rng, [1, t, 16, 32, 128, 128], false, false);
    let (status, y, s) = p.run();
    ok(status);
    ok(mlxk_array_eval(s));
    free(y);
    free(s);
}

/// Runs the probes whose names contain one of the arguments (all without one); `cargo bench`
/// passes `--bench`, which is not a name.
fn main() {
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let probes: [(&str, fn()); 3] = [
        ("probe", probe),
        ("subnormals_in_probe_state", subnormals_in_probe_state),
        ("prefill_only", prefill_only),
    ];
    for (name, probe) in probes {
        if names.is_empty() || names.iter().any(|n| name.contains(n.as_str())) {
            println!("== {name}");
            probe();
        }
    }
}
