//! The serving soak: simulated servers on state pools, driven from several threads for a set
//! time through the C ABI, every pool call checked against the dense per-sequence calls.
//!
//! - Two threads each own a server (its own pool; float32 and bfloat16 inputs).
//! - Two threads share one server under a mutex, as an engine's scheduler and a second worker
//!   would, each running whole rounds while holding it.
//!
//! Each round is an admission (one packed prefill, exact or chunked, of new sequences into free
//! slots and continuations of live ones), an eviction, a decode step over random live slots
//! (masks, padding rows, now and then a few tokens in the chunked form) or a verify of a draft
//! window followed by a commit of a random accepted prefix per row. After each pool call every
//! slot of the pool is compared bit for bit with its reference (see server.rs).
//!
//! At the end: zero live handles, and resident memory after warm-up, as a least-squares slope
//! against pool calls (bytes per 10^5 calls).
//!
//! Settings (environment): `SOAK_SECONDS` (default 300), `SOAK_SEED` (decimal or 0x hex; default
//! from the clock, printed), `SOAK_RSS_LIMIT_MIB` (the growth per 10^5 pool calls above which
//! the run fails; default 16), `SOAK_DEVICE` (`cpu`, the default, or `gpu`: every call, the
//! references included, on the GPU), `SOAK_CHUNKED` (`1`, the default, or `0`: exact calls only,
//! for a GPU whose backend refuses the chunked pool calls). Run: `make soak` (default time), `make test-soak` (45 s),
//! `SOAK_SECONDS=14400 make soak` for hours.

mod capi;
mod exact;
mod server;
// The tree calls and draft-tree paths of the Rust suites.
#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use capi::{rss_bytes, Elem, Rng};
use server::{Dims, Server, Stats, KINDS};

/// Whether rounds may take the chunked form (`SOAK_CHUNKED`, read once).
pub fn chunked_forms() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| env_number("SOAK_CHUNKED", 1) != 0)
}

/// The device every call runs on (`SOAK_DEVICE`: `cpu` or `gpu`).
fn set_device() {
    let device = match std::env::var("SOAK_DEVICE").as_deref() {
        Err(_) | Ok("cpu") => mlxkern::capi::device::MLXK_DEVICE_CPU,
        Ok("gpu") => mlxkern::capi::device::MLXK_DEVICE_GPU,
        Ok(other) => panic!("SOAK_DEVICE={other}: expected cpu or gpu"),
    };
    let status = mlxkern::capi::device::mlxk_set_default_device(device);
    assert_eq!(
        status,
        mlxkern::capi::status::MLXK_OK,
        "mlxk_set_default_device({device})"
    );
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={text}: expected a number"))
        }
        Err(_) => default,
    }
}

/// What the threads share: the clock, the first failure and the count of pool calls.
struct Shared {
    deadline: Instant,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    calls: AtomicU64,
}

impl Shared {
    fn running(&self) -> bool {
        !self.failed.load(Ordering::Relaxed) && Instant::now() < self.deadline
    }
    fn fail(&self, msg: String) {
        let mut first = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(msg);
        }
        self.failed.store(true, Ordering::Relaxed);
    }
}

/// One round on `server`; counts its pool calls into `shared`.
fn one_round(server: &mut Server, rng: &mut Rng, shared: &Shared) -> bool {
    let before = server.stats.pool_calls;
    let kind = server.pick(rng);
    if let Err(e) = server.round(rng, kind) {
        shared.fail(e);
        return false;
    }
    shared
        .calls
        .fetch_add(server.stats.pool_calls - before, Ordering::Relaxed);
    true
}

fn main() {
    let seconds = env_number("SOAK_SECONDS", 300);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let seed = env_number("SOAK_SEED", clock);
    let rss_limit_mib = env_number("SOAK_RSS_LIMIT_MIB", 16);
    set_device();
    println!(
        "soak: {seconds} s on the {}, chunked forms {}, seed {seed:#x} (SOAK_SEED replays each own pool's rounds; the \
         shared pool's interleaving varies)",
        if std::env::var("SOAK_DEVICE").as_deref() == Ok("gpu") { "GPU" } else { "CPU" },
        if chunked_forms() { "on" } else { "off" }
    );

    let shared = Arc::new(Shared {
        deadline: Instant::now() + Duration::from_secs(seconds),
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
        calls: AtomicU64::new(0),
    });
    let mut seeder = Rng::seeded(seed);
    let own = [
        (
            "own-f32",
            Dims {
                hk: 1,
                hv: 2,
                dk: 32,
                dv: 8,
            },
            Elem::F32,
            8,
        ),
        (
            "own-bf16",
            Dims {
                hk: 2,
                hv: 4,
                dk: 64,
                dv: 16,
            },
            Elem::Bf16,
            12,
        ),
    ];
    let mut handles = Vec::new();
    for (name, d, elem, n) in own {
        let mut rng = Rng::seeded(seeder.next_u64());
        let shared = Arc::clone(&shared);
        handles.push(thread::spawn(move || -> Stats {
            let mut server = match Server::new(name, d, elem, n, &mut rng) {
                Ok(mut s) => match s.self_test(&mut rng) {
                    Ok(()) => s,
                    Err(e) => {
                        shared.fail(e);
                        return Stats::default();
                    }
                },
                Err(e) => {
                    shared.fail(format!("{name}: {e}"));
                    return Stats::default();
                }
            };
            while shared.running() && one_round(&mut server, &mut rng, &shared) {}
            server.stats.clone()
        }));
    }
    let shared_server = {
        let mut rng = Rng::seeded(seeder.next_u64());
        let d = Dims {
            hk: 1,
            hv: 2,
            dk: 32,
            dv: 16,
        };
        match Server::new("shared-bf16", d, Elem::Bf16, 16, &mut rng) {
            Ok(mut s) => {
                s.self_test(&mut rng).unwrap_or_else(|e| panic!("{e}"));
                Arc::new(Mutex::new(s))
            }
            Err(e) => panic!("shared-bf16: {e}"),
        }
    };
    let mut shared_rounds = Vec::new();
    for _ in 0..2 {
        let mut rng = Rng::seeded(seeder.next_u64());
        let shared = Arc::clone(&shared);
        let server = Arc::clone(&shared_server);
        shared_rounds.push(thread::spawn(move || -> u64 {
            let mut rounds = 0;
            while shared.running() {
                let mut s = server.lock().unwrap_or_else(|p| p.into_inner());
                if !one_round(&mut s, &mut rng, &shared) {
                    break;
                }
                rounds += 1;
                drop(s);
                thread::yield_now();
            }
            rounds
        }));
    }

    // Resident memory against pool calls, every half second.
    let start = Instant::now();
    let warm_up = Duration::from_secs_f64((seconds as f64 * 0.25).clamp(10.0, 120.0));
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut rss_first = 0usize;
    let mut rss_max = 0usize;
    let mut last_print = Instant::now();
    while shared.running() {
        thread::sleep(Duration::from_millis(500));
        let rss = rss_bytes();
        let calls = shared.calls.load(Ordering::Relaxed);
        if rss_first == 0 {
            rss_first = rss;
        }
        rss_max = rss_max.max(rss);
        if start.elapsed() >= warm_up {
            samples.push((calls as f64, rss as f64));
        }
        if last_print.elapsed() >= Duration::from_secs(30) {
            println!(
                "  {:>5.0} s: {calls} pool calls, RSS {:.1} MiB, {} live handles",
                start.elapsed().as_secs_f64(),
                rss as f64 / (1 << 20) as f64,
                mlxkern::capi::live_handles()
            );
            last_print = Instant::now();
        }
    }
    let mut total = Stats::default();
    for h in handles {
        match h.join() {
            Ok(s) => total.add(&s),
            Err(_) => shared.fail("a server thread panicked".into()),
        }
    }
    let mut per_thread = Vec::new();
    for h in shared_rounds {
        match h.join() {
            Ok(r) => per_thread.push(r),
            Err(_) => shared.fail("a shared-pool thread panicked".into()),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    {
        let s = Arc::try_unwrap(shared_server)
            .ok()
            .expect("the shared server's threads have ended")
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        total.add(&s.stats);
    }
    let live = mlxkern::capi::live_handles();
    let rss_end = rss_bytes();

    println!(
        "soak: {elapsed:.1} s, {} pool calls ({:.0}/s), {} tokens",
        total.pool_calls,
        total.pool_calls as f64 / elapsed,
        total.tokens
    );
    for (kind, n) in KINDS.iter().zip(total.rounds) {
        println!("  {kind:?} rounds: {n}");
    }
    println!(
        "  chunked calls {}, dense reference calls {}, slot states compared {}, sequences \
         admitted {} / evicted {}",
        total.chunked_calls, total.ref_calls, total.slots_compared, total.admitted, total.evicted
    );
    println!("  shared pool: rounds per thread {per_thread:?}");
    println!(
        "  decode steps failed on purpose at evaluation: {}, each leaving every slot as it was",
        total.faults
    );
    let writes = total.pool_calls - total.verify_calls;
    let in_place = mlxkern::testing::in_place_updates() as u64;
    println!(
        "  pool writes in place (the old pool's buffer taken over): {in_place} of {writes} \
         writing calls"
    );
    println!("  drift: none (every slot bit-equal to its dense reference after every call)");
    println!(
        "  float32 pool against float64: largest |state - exact| {:.3e} (largest |value| then \
         {:.3e}; bound {:.0e} x max(1, that)), sequences followed up to {} tokens",
        total.drift,
        total.drift_scale,
        server::DRIFT_BOUND,
        total.longest
    );
    println!(
        "  RSS: {:.1} MiB at first sample, {:.1} MiB peak, {:.1} MiB at the end",
        rss_first as f64 / (1 << 20) as f64,
        rss_max as f64 / (1 << 20) as f64,
        rss_end as f64 / (1 << 20) as f64
    );
    let growth = slope(&samples).map(|s| s * 1e5);
    match growth {
        Some(g) => println!(
            "  RSS growth after {:.0} s of warm-up: {:.3} MiB per 10^5 pool calls ({} samples)",
            warm_up.as_secs_f64(),
            g / (1 << 20) as f64,
            samples.len()
        ),
        None => println!("  RSS growth: too few samples after warm-up"),
    }
    println!("  live handles at the end: {live}");

    let mut failures = Vec::new();
    if let Some(f) = shared
        .failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        failures.push(f);
    }
    if live != 0 {
        failures.push(format!(
            "{live} handles still live after every server freed its arrays"
        ));
    }
    if let Some(g) = growth {
        if g > (rss_limit_mib << 20) as f64 {
            failures.push(format!(
                "resident memory grew {:.2} MiB per 10^5 pool calls (limit {rss_limit_mib} MiB)",
                g / (1 << 20) as f64
            ));
        }
    }
    // The dense reference calls keep their input state, so only the pool calls write in place.
    if in_place < writes {
        failures.push(format!(
            "{} of {writes} pool calls that write states copied the pool instead of writing in \
             place",
            writes - in_place
        ));
    }
    if total.pool_calls == 0 {
        failures.push("no pool call ran".into());
    }
    if failures.is_empty() {
        println!("soak: ok");
    } else {
        for f in &failures {
            eprintln!("soak FAILED: {f}");
        }
        eprintln!("replay: SOAK_SEED={seed:#x}");
        std::process::exit(1);
    }
}

/// Least-squares slope of y against x; None with fewer than 4 points or no spread in x.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 4 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}
