//! The library's versions, which the C face (`capi::status`) and the Rust face (`api::device`)
//! both report: the package version and the C ABI version (Cargo.toml's
//! `package.metadata.mlxkern.abi-version`, which build.rs passes as `MLXK_ABI_VERSION` and
//! writes into the header).

use std::ffi::CStr;

/// This library's version, e.g. "0.1.0".
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `VERSION` as a C string.
pub const VERSION_C: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("version contains a NUL"),
    };

/// The C ABI version (the header's `MLXK_ABI_VERSION`); 0 if the build passed no number.
pub const ABI_VERSION: u32 = decimal(env!("MLXK_ABI_VERSION"));

const fn decimal(text: &str) -> u32 {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return 0;
    }
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            return 0;
        }
        value = match value.checked_mul(10) {
            Some(v) => match v.checked_add((bytes[i] - b'0') as u32) {
                Some(v) => v,
                None => return 0,
            },
            None => return 0,
        };
        i += 1;
    }
    value
}
