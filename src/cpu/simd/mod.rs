//! AVX2 building blocks shared by the CPU kernels: MLX's CPU `exp` and `sigmoid` on eight lanes,
//! exact conversions between f32 and the element types, the 4×4 transpose into "lane layout",
//! the 32-lane xor butterfly, and tables of the SiLUs over every value of a 16-bit type; and
//! AVX-512 counterparts on sixteen lanes (conversions, table lookups by gather, lane layout,
//! butterfly); and NEON ones on four lanes for arm64 (`neon`). Each computes, lane by lane,
//! the bits its scalar counterpart in `math`, `elem` and `reduce` computes (NaN payloads
//! aside: NaNs stay NaN); the tests check the transcendental parts on every 16-bit value and on
//! edge and random f32 values.

/// The element types the kernels read and write; on x86-64 they also load and store eight
/// (`avx2::Lanes`) and sixteen (`avx512::Wide`) at a time.
#[cfg(target_arch = "x86_64")]
pub trait Lanes: avx2::Lanes + avx512::Wide {}
#[cfg(target_arch = "x86_64")]
impl<T: avx2::Lanes + avx512::Wide> Lanes for T {}

/// On arm64 they also load and store four at a time (`neon::Quad`).
#[cfg(target_arch = "aarch64")]
pub trait Lanes: neon::Quad {}
#[cfg(target_arch = "aarch64")]
impl<T: neon::Quad> Lanes for T {}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub trait Lanes: super::elem::Elem {}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl Lanes for f32 {}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl Lanes for half::bf16 {}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl Lanes for half::f16 {}

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "aarch64")]
pub mod neon;
