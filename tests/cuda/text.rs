//! The kernel text MLX CUDA compiles: `cuda::strip_comments` removes the `//` comments of the
//! CUDA header and of every kernel file (MLX rebuilds that string on every launch), and must
//! leave exactly the code the C preprocessor leaves once it has removed comments. Compared token
//! for token with `c++ -fpreprocessed -dD -E -P` (directives kept, nothing expanded) on each text
//! and its stripped form (docs/DESIGN.md §3 "MLX CUDA", Caches).

use std::path::Path;
use std::process::Command;

use mlxkern::cuda::{strip_comments, GATES_HEADER, METAL_COMPAT_HEADER};
use mlxkern::metal;

/// The text as the preprocessor leaves it without comments, as whitespace-separated tokens.
fn preprocessed(dir: &Path, name: &str, text: &str) -> Vec<String> {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-fpreprocessed", "-dD", "-E", "-P", "-x", "c++"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{cxx} (set CXX): {e}"));
    assert!(
        out.status.success(),
        "{cxx} on {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn stripped_kernel_texts_keep_every_token() {
    let dir = std::env::temp_dir().join(format!("mlxkern-cuda-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let texts = [
        ("metal_compat.cuh", METAL_COMPAT_HEADER),
        ("gates.cuh", GATES_HEADER),
        ("gated_delta.metal", metal::gated_delta::GATED_DELTA_SOURCE),
        (
            "gated_delta_state.metal",
            metal::gated_delta::GATED_DELTA_STATE_SOURCE,
        ),
        (
            "gated_delta_backward.metal",
            metal::gated_delta::GATED_DELTA_BACKWARD_SOURCE,
        ),
        (
            "silu_rms_heads.metal",
            metal::silu_rms_heads::SILU_RMS_HEADS_SOURCE,
        ),
        (
            "gated_rms_norm.metal",
            metal::gated_rms_norm::GATED_RMS_NORM_SOURCE,
        ),
        (
            "gated_delta_chunked_prep.metal",
            metal::gated_delta::chunked::GATED_DELTA_CHUNKED_PREP_SOURCE,
        ),
        (
            "gated_delta_chunked_state.metal",
            metal::gated_delta::chunked::GATED_DELTA_CHUNKED_STATE_SOURCE,
        ),
        (
            "gated_delta_chunked_out.metal",
            metal::gated_delta::chunked::GATED_DELTA_CHUNKED_OUT_SOURCE,
        ),
    ];
    for (name, text) in texts {
        let stripped = strip_comments(text);
        assert!(stripped.len() < text.len(), "{name}: nothing stripped");
        assert!(!stripped.contains("//"), "{name}: a comment is left");
        let original = preprocessed(&dir, name, text);
        assert!(original.len() > 20, "{name}: too few tokens");
        assert_eq!(
            preprocessed(&dir, &format!("stripped-{name}"), &stripped),
            original,
            "{name}: the stripped text differs in code"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
