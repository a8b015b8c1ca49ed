//! The library's one configuration point: the environment variables it reads, each read once,
//! together, when the first call takes the MLX lock (`registry`), so that no graph is built
//! before them and none reads them while it is built.
//!
//! - `MLXK_NUM_THREADS`: the CPU kernels' threads (1 to 64); unset, min(cores, 8).
//! - `MLXK_CHUNK_STATE_COLUMNS`: 8, 16 or 32, a narrower tile of value columns for the GPU
//!   chunked form's state pass than the launch's own (tuning: more threadgroups, each with
//!   less work; the results do not change beyond rounding). A wider value than the launch's
//!   own is ignored.
//! - `MLXK_CUDA_INLINE_TEXT`: any value but empty or 0 keeps the CUDA kernel texts inline in
//!   the launches instead of in files (`cuda::files`).
//! - `MLXK_CUDA_TILES`: `fma` (the default), `tf32` or `bf16`, the form of the matrix tiles in
//!   MLX CUDA launches (`cuda::TileForm`): float32 fused multiply-adds, or tensor cores on tf32
//!   or bf16 inputs. Any other value is ignored.

use std::sync::OnceLock;

/// The settings the environment gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `MLXK_NUM_THREADS`, clamped to [1, 64]; None when unset or not a number.
    pub num_threads: Option<usize>,
    /// `MLXK_CHUNK_STATE_COLUMNS` when it is 8, 16 or 32.
    pub chunk_state_columns: Option<usize>,
    /// `MLXK_CUDA_INLINE_TEXT` set to something other than empty or 0.
    pub cuda_inline_text: bool,
    /// `MLXK_CUDA_TILES` when it names a form.
    pub cuda_tiles: Option<TileForm>,
}

impl Config {
    fn from_env() -> Config {
        let number = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
        };
        let inline = std::env::var("MLXK_CUDA_INLINE_TEXT");
        Config {
            num_threads: number("MLXK_NUM_THREADS").map(|n| n.clamp(1, 64)),
            chunk_state_columns: number("MLXK_CHUNK_STATE_COLUMNS")
                .filter(|vt| [8, 16, 32].contains(vt)),
            cuda_inline_text: matches!(inline.as_deref(), Ok(v) if !v.is_empty() && v != "0"),
            cuda_tiles: std::env::var("MLXK_CUDA_TILES")
                .ok()
                .and_then(|v| TileForm::from_name(&v)),
        }
    }
}

/// The configuration, read from the environment on the first call.
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::from_env)
}

/// How the matrix tiles multiply on MLX CUDA (`kernels/cuda/tiles.cuh`, `MLXK_TILE_FORM`;
/// `MLXK_CUDA_TILES` names one; `cuda::TileForm::define` writes its header line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileForm {
    /// Float32 fused multiply-adds, no tensor core: the reference form, and the default (its
    /// results keep the float32 bounds of the kernels' tests; tf32 and bf16 have their own).
    Fma,
    /// Tensor cores (`mma.sync` m16n8k8) on inputs rounded to tf32 (10-bit mantissa), float32
    /// accumulation.
    Tf32,
    /// Tensor cores on inputs rounded to bf16 (7-bit mantissa), float32 accumulation.
    Bf16,
}

impl TileForm {
    /// Every form, in the order of `MLXK_TILE_FORM`'s values.
    pub const ALL: [TileForm; 3] = [TileForm::Fma, TileForm::Tf32, TileForm::Bf16];

    /// The form `MLXK_CUDA_TILES` names (`fma`, `tf32`, `bf16`).
    pub fn from_name(name: &str) -> Option<TileForm> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            TileForm::Fma => "fma",
            TileForm::Tf32 => "tf32",
            TileForm::Bf16 => "bf16",
        }
    }
}
