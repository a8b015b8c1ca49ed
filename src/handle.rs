//! The opaque array handle the C ABI hands out. It lives at the bottom of the crate because the
//! registry (which maps handles to arrays) and the C ABI both name it; docs/DESIGN.md §5.

/// An MLX array owned by the caller. Opaque: made by the library (mlxk_array_new,
/// mlxk_array_zeros, mlxk_array_astype and every kernel), released with mlxk_array_free().
/// The value is a registry token, not an address: never dereference it.
#[allow(non_camel_case_types)]
pub struct mlxk_array {
    _private: [u8; 0],
}
