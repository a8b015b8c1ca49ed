//! Build script: locate the pinned pip MLX, compile the C++ bridge with cxx, link libmlx
//! dynamically with an rpath, and generate the C header (with version macros) into OUT_DIR.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());

    let mlx = find_mlx(&manifest_dir);
    let include = mlx.include.clone();

    cxx_build::bridge("src/bridge/mod.rs")
        .file("src/bridge/mlx_bridge.cc")
        .file("src/bridge/host.cc")
        .file("src/bridge/vjp_ops.cc")
        .include(&include)
        .include(&manifest_dir)
        .std("c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .compile("mlxkern_bridge");

    let macos = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos");
    match link_mode(&mlx) {
        Link::Shared(lib) => {
            println!("cargo:rustc-link-search=native={}", lib.display());
            println!("cargo:rustc-link-lib=dylib=mlx");
            // Every artifact of this package (cdylib, tests, examples) finds libmlx without
            // LD_LIBRARY_PATH; a copy of the library shipped next to libmlx finds it too.
            // Dependents get the folder as DEP_MLX_LIB_DIR (docs/hosts/rust.md).
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
            println!("cargo:lib_dir={}", lib.display());
        }
        Link::Host => {
            // Host-MLX mode (docs/DESIGN.md §2.2, "Link modes"): MLX's symbols are left to the
            // program that links this library's static archive (libmlxkern.a) with its own MLX.
            // The cdylib and test binaries of this build cannot run; the archive is the product.
            println!(
                "cargo:warning=mlxkern: no shared libmlx linked (MLXKERN_LINK_MLX=none or none in \
                 {}): MLX's symbols are left to the final link; use libmlxkern.a",
                mlx.root.display()
            );
            if !macos {
                println!("cargo:rustc-cdylib-link-arg=-Wl,--allow-shlib-undefined");
            } else {
                println!("cargo:rustc-cdylib-link-arg=-Wl,-undefined,dynamic_lookup");
            }
        }
    }
    if macos {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,@loader_path");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libmlxkern.dylib");
    } else {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
        set_soname(&manifest_dir, &out_dir);
        // A host's MLX graph may hold nodes whose code is here (lazy results handed over with
        // mlxk_array_to_mlx): a dlclose must not unmap it (macOS: pinned at run time).
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
    println!("cargo:mlx_dir={}", mlx.root.display());
    println!("cargo:include={}", include.display());
    println!("cargo:version={}", mlx.version);
    println!("cargo:rustc-env=MLXK_MLX_DIR={}", mlx.root.display());
    if env::var("OPT_LEVEL").as_deref() == Ok("0") {
        // The kernels are loops over every state element: unoptimized they run about 100x
        // slower. A dependent's dev profile compiles its dependencies at opt-level 0 unless
        // told otherwise (docs/hosts/rust.md).
        println!(
            "cargo:warning=mlxkern is being compiled at opt-level 0, which makes its kernels about \
             100x slower; add to your Cargo.toml: [profile.dev.package.mlxkern] opt-level = 3"
        );
    }

    for path in [
        "src/bridge/mlx_bridge.cc",
        "src/bridge/host.cc",
        "src/bridge/vjp_ops.cc",
        "src/bridge/mlx_bridge.h",
        "src/bridge/mlx_compat.h",
        "cbindgen.toml",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLXKERN_LINK_MLX");

    generate_header(&manifest_dir, &out_dir);
}

/// ELF platforms: the shared library's SONAME carries the C ABI version
/// (`libmlxkern.so.<abi>`), so programs linked against it record that name and a library with
/// an incompatible ABI is never picked up in its place. In the build tree a link of that name
/// next to the built `libmlxkern.so` (in `target/<profile>/`) lets such programs run from
/// there, as installed copies do (`scripts/package/install.sh` installs the file under the SONAME).
fn set_soname(manifest_dir: &Path, out_dir: &Path) {
    let soname = format!("libmlxkern.so.{}", abi_version(manifest_dir));
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // OUT_DIR is target/<profile>/build/mlxkern-<hash>/out.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let link = profile_dir.join(&soname);
        if fs::read_link(&link).ok().as_deref() != Some(Path::new("libmlxkern.so")) {
            let _ = fs::remove_file(&link);
            #[cfg(unix)]
            if let Err(e) = std::os::unix::fs::symlink("libmlxkern.so", &link) {
                println!("cargo:warning=could not create {}: {e}", link.display());
            }
        }
    }
}

/// The MLX this build compiles against.
struct Mlx {
    /// The folder named (a pip package folder, an install prefix or a source tree).
    root: PathBuf,
    /// The folder holding `mlx/mlx.h`.
    include: PathBuf,
    /// "major.minor.patch" from `mlx/version.h`.
    version: String,
}

enum Link {
    /// Link this shared libmlx (the folder holding it).
    Shared(PathBuf),
    /// Leave MLX's symbols to the host's final link.
    Host,
}

/// `MLX_DIR` if set, else the project's `.venv` (made by `scripts/bootstrap.sh`), else the pip
/// `mlx` of the `python3` on `PATH` (`python3 -m mlx --cmake-dir`). `MLX_DIR` may
/// name MLX's pip package folder or its CMake folder (`python3 -m mlx --cmake-dir`), an install
/// prefix (`include/mlx/mlx.h`, `lib/libmlx.*`: a CMake install of MLX, static or shared), or
/// an MLX source tree (`mlx/mlx.h` at its root, as mlx-swift's `Source/Cmlx/mlx` holds it).
fn find_mlx(manifest_dir: &Path) -> Mlx {
    let probe = |dir: &Path| -> Option<Mlx> {
        for (root, include) in [
            (dir.to_path_buf(), dir.join("include")),
            (dir.join("../../.."), dir.join("../../../include")),
            (dir.to_path_buf(), dir.to_path_buf()),
        ] {
            if include.join("mlx/mlx.h").is_file() {
                let include = include.canonicalize().unwrap();
                let version = mlx_version(&include.join("mlx/version.h"));
                return Some(Mlx {
                    root: root.canonicalize().unwrap(),
                    include,
                    version,
                });
            }
        }
        None
    };
    if let Ok(dir) = env::var("MLX_DIR") {
        let dir = PathBuf::from(dir);
        return probe(&dir).unwrap_or_else(|| {
            panic!(
                "MLX_DIR={} holds neither include/mlx/mlx.h (a pip package folder or an install \
                 prefix) nor mlx/mlx.h (a source tree): point it at MLX 0.31.x or 0.32.x \
                 (python3 -m mlx --cmake-dir prints a pip install's folder)",
                dir.display()
            )
        });
    }
    // The repository's .venv, then (for a copy of this crate outside the repository, e.g. from
    // a registry) the pip `mlx` of the python3 on PATH.
    let venv = manifest_dir.join(".venv/bin/python3");
    for python in [venv.as_path(), Path::new("python3")] {
        if python.is_absolute() && !python.is_file() {
            continue;
        }
        if let Ok(out) = Command::new(python)
            .args(["-m", "mlx", "--cmake-dir"])
            .output()
        {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !dir.is_empty() {
                if let Some(mlx) = probe(Path::new(&dir)) {
                    return mlx;
                }
            }
        }
    }
    panic!(
        "MLX not found: set MLX_DIR to the MLX to build against (0.31.x or 0.32.x: a pip package \
         folder, an install prefix or a source tree), or `pip install mlx==0.32.4` (Linux: \
         mlx[cpu]) for the python3 on PATH (`python3 -m mlx --cmake-dir` must print its folder); \
         in the repository, `make bootstrap` creates .venv with it"
    );
}

/// "major.minor.patch" from MLX's `version.h`.
fn mlx_version(path: &Path) -> String {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let part = |name: &str| {
        text.lines()
            .find_map(|line| {
                let rest = line.trim().strip_prefix("#define")?.trim();
                rest.strip_prefix(name)?.trim().parse::<u32>().ok()
            })
            .unwrap_or_else(|| panic!("{} has no {name}", path.display()))
    };
    format!(
        "{}.{}.{}",
        part("MLX_VERSION_MAJOR"),
        part("MLX_VERSION_MINOR"),
        part("MLX_VERSION_PATCH")
    )
}

/// How libmlx is linked: `MLXKERN_LINK_MLX=shared` (link `lib/libmlx.so` / `.dylib` beside
/// the headers: the bundled mode, or a host's shared MLX), `none` (leave MLX's symbols to the
/// host's final link: static archive for a host with its own MLX), or unset: `shared` where
/// the folder has a shared libmlx, `none` otherwise (a source tree, a static MLX install).
fn link_mode(mlx: &Mlx) -> Link {
    let shared = ["libmlx.so", "libmlx.dylib"]
        .iter()
        .any(|name| mlx.root.join("lib").join(name).is_file());
    match env::var("MLXKERN_LINK_MLX").as_deref() {
        Ok("none") => Link::Host,
        Ok("shared") if !shared => panic!(
            "MLXKERN_LINK_MLX=shared but {} has no lib/libmlx.so or lib/libmlx.dylib",
            mlx.root.display()
        ),
        Ok("shared") | Ok("") | Err(_) if shared => Link::Shared(mlx.root.join("lib")),
        Ok("") | Err(_) => Link::Host,
        Ok(other) => panic!("MLXKERN_LINK_MLX={other}: expected shared or none"),
    }
}

/// The ABI version from `[package.metadata.mlxkern] abi-version = N` in Cargo.toml.
fn abi_version(manifest_dir: &Path) -> u32 {
    let text = fs::read_to_string(manifest_dir.join("Cargo.toml")).unwrap();
    text.lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("abi-version")?;
            rest.trim().strip_prefix('=')?.trim().parse().ok()
        })
        .expect("Cargo.toml lacks [package.metadata.mlxkern] abi-version = N")
}

fn generate_header(manifest_dir: &Path, out_dir: &Path) {
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let minor = env::var("CARGO_PKG_VERSION_MINOR").unwrap();
    let patch = env::var("CARGO_PKG_VERSION_PATCH").unwrap();
    let version = env::var("CARGO_PKG_VERSION").unwrap();
    let abi = abi_version(manifest_dir);
    let mut config =
        cbindgen::Config::from_file(manifest_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let versions = format!(
        "\n/** The library version these declarations describe (from Cargo.toml). */\n\
         #define MLXK_VERSION \"{version}\"\n\
         #define MLXK_VERSION_MAJOR {major}\n\
         #define MLXK_VERSION_MINOR {minor}\n\
         #define MLXK_VERSION_PATCH {patch}\n\
         /** Compare with mlxk_abi_version() at load time: a mismatch means the header and the\n \
         * loaded library disagree on the C ABI. */\n\
         #define MLXK_ABI_VERSION {abi}\n"
    );
    config.after_includes = Some(versions);
    println!("cargo:rustc-env=MLXK_ABI_VERSION={abi}");
    // The C surface lives in src/capi/, one file per header group; cbindgen follows the
    // `pub mod` lines of src/capi/mod.rs to the others.
    for entry in fs::read_dir(manifest_dir.join("src/capi")).unwrap() {
        println!("cargo:rerun-if-changed={}", entry.unwrap().path().display());
    }
    // Two items of the header live below src/capi/: the opaque handle (src/handle.rs) and the
    // status codes, which src/error.rs writes once as rows of a macro cbindgen cannot expand.
    let codes = out_dir.join("status_codes.rs");
    fs::write(&codes, status_codes(&manifest_dir.join("src/error.rs"))).unwrap();
    println!("cargo:rerun-if-changed=src/error.rs");
    println!("cargo:rerun-if-changed=src/handle.rs");
    let header = cbindgen::Builder::new()
        .with_config(config)
        .with_src(manifest_dir.join("src/capi/mod.rs"))
        .with_src(manifest_dir.join("src/handle.rs"))
        .with_src(&codes)
        .generate()
        .expect("cbindgen failed to generate include/mlxkern.h");
    header.write_to_file(out_dir.join("mlxkern.h"));
}

/// The status constants as plain Rust items for cbindgen, from the rows of `statuses!` in
/// src/error.rs: each `NAME = code [=> Variant];` with the `///` lines above it.
fn status_codes(error_rs: &Path) -> String {
    let text = fs::read_to_string(error_rs).unwrap();
    let table = text
        .split("\nstatuses! {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("src/error.rs: the `statuses! { ... }` table");
    let mut out = String::from("use crate::capi::status::mlxk_status;\n");
    let mut docs = String::new();
    let mut rows = 0;
    for line in table.lines().map(str::trim) {
        if let Some(doc) = line.strip_prefix("///") {
            docs.push_str(&format!("///{doc}\n"));
        } else if let Some((name, rest)) = line.split_once('=') {
            let code = rest
                .trim_end_matches(';')
                .split("=>")
                .next()
                .unwrap()
                .trim();
            let code: i32 = code.parse().expect("a status code is an integer literal");
            out.push_str(&format!(
                "{docs}pub const {}: mlxk_status = {code};\n",
                name.trim()
            ));
            docs.clear();
            rows += 1;
        }
    }
    assert!(rows > 0, "src/error.rs: no rows in the status table");
    out
}
