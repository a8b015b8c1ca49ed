//! The committed include/mlxkern.h must equal the header this build generates.
//! `make header` (MLXK_UPDATE_HEADER=1) rewrites the committed copy instead of failing.

use std::path::Path;

#[test]
fn committed_header_matches_generated() {
    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/mlxkern.h");
    let generated = mlxkern::GENERATED_HEADER;
    if std::env::var_os("MLXK_UPDATE_HEADER").is_some() {
        std::fs::write(&committed_path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/mlxkern.h differs from the generated header: run `make header` and commit it"
    );
}

#[test]
fn version_macros_follow_cargo_toml() {
    let h = mlxkern::GENERATED_HEADER;
    for define in [
        format!("MLXK_VERSION \"{}\"", env!("CARGO_PKG_VERSION")),
        format!("MLXK_VERSION_MAJOR {}", env!("CARGO_PKG_VERSION_MAJOR")),
        format!("MLXK_VERSION_MINOR {}", env!("CARGO_PKG_VERSION_MINOR")),
        format!("MLXK_VERSION_PATCH {}", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        assert!(h.contains(&format!("#define {define}")), "{define}");
    }
    let abi = mlxkern::capi::status::mlxk_abi_version();
    assert!(h.contains(&format!("#define MLXK_ABI_VERSION {abi}")));
    let toml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    assert!(toml.contains(&format!("abi-version = {abi}")));
}
