//! Replays the committed fuzz corpus (fuzz/corpus/<target>/*) and the crash reproducers
//! (fuzz/regressions/<target>/*) through the fuzz harness, as ordinary tests: same decoding,
//! same checks as `cargo fuzz run <target>`, in the dev profile, without sanitizers.
//! `MLXK_FUZZ_REPLAY=<file>` replays one file (its target is the name of its folder).

#[path = "../fuzz/harness/mod.rs"]
mod harness;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use harness::Target;

/// The harness is not reentrant (process-wide memory limit and live-handle count): one input
/// at a time in this binary.
static SERIAL: Mutex<()> = Mutex::new(());

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

fn replay_one(target: Target, path: &Path) {
    let data = std::fs::read(path).unwrap();
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| harness::run(target, &data))) {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!(
            "fuzz input {} ({} bytes) fails: {msg}",
            path.display(),
            data.len()
        );
    }
}

fn replay(target: Target, min_corpus: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let corpus = files(&root.join("corpus").join(target.name()));
    let regressions = files(&root.join("regressions").join(target.name()));
    assert!(
        corpus.len() >= min_corpus,
        "fuzz/corpus/{} holds {} files; expected at least {min_corpus} (scripts/test/fuzz.sh grows it)",
        target.name(),
        corpus.len()
    );
    harness::take_stats();
    let start = Instant::now();
    for path in regressions.iter().chain(&corpus) {
        replay_one(target, path);
    }
    eprintln!(
        "fuzz corpus {}: {} inputs and {} regression files replayed in {:.2} s; statuses:{}",
        target.name(),
        corpus.len(),
        regressions.len(),
        start.elapsed().as_secs_f64(),
        harness::format_stats(&harness::take_stats())
    );
}

/// One test per target: its regression files and corpus replayed (at most 50 corpus inputs).
macro_rules! corpus_tests {
    ($($name:ident: $target:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                replay(Target::$target, 50);
            }
        )*
    };
}

corpus_tests! {
    corpus_array: Array,
    corpus_gated_delta: GatedDelta,
    corpus_norms: Norms,
    corpus_norms_vjp: NormsVjp,
    corpus_gated_delta_vjp: GatedDeltaVjp,
    corpus_glm52: Glm52,
    corpus_pool: Pool,
}

#[test]
fn corpus_tree() {
    replay(Target::Tree, 50);
}

/// Replays one file given by MLXK_FUZZ_REPLAY (for debugging a crash artifact).
#[test]
fn replay_file_from_env() {
    let Ok(path) = std::env::var("MLXK_FUZZ_REPLAY") else {
        return;
    };
    let path = PathBuf::from(path);
    let folder = path
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let target = Target::ALL
        .into_iter()
        .find(|t| {
            folder
                .as_deref()
                .is_some_and(|f| f == t.name() || f.starts_with(t.name()))
        })
        .or_else(|| {
            std::env::var("MLXK_FUZZ_TARGET")
                .ok()
                .and_then(|n| Target::ALL.into_iter().find(|t| t.name() == n))
        })
        .expect("name the target: a folder named after it, or MLXK_FUZZ_TARGET");
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    replay_one(target, &path);
}
