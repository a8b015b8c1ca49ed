//! Kernel texts on disk for NVRTC (docs/DESIGN.md §3, "MLX CUDA", Caches).
//!
//! MLX CUDA hashes a custom kernel's whole text on every evaluation of one of its nodes (the
//! module name is `std::hash` of the text), and the library's texts are 5-10 KB: bench-cuda's
//! dispatch rows put 10 KB of text at 1.9-2.4 µs a node on an H200 host. So a CUDA launch hands
//! MLX two `#include` lines instead of its header and body, for files named by a hash of their
//! content in a folder of the temporary directory that only this user may use, checked (and
//! written where missing or different) for every new launch; NVRTC reads them when MLX first
//! compiles the launch's kernel. Whatever goes wrong here (no temporary directory, the folder
//! another user's or open to others, a failed write, a path an `#include` cannot carry) leaves
//! the text inline, as before; so does `MLXK_CUDA_INLINE_TEXT=1` (any value but empty or 0).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The `#include` lines that stand for `header` and `body`, or `None` to keep them inline.
/// `input_names`: the kernel's inputs; MLX passes `<name>_shape` / `_strides` / `_ndim` only
/// where its source names them, so the body's line names those it uses in a comment.
pub fn include_lines(header: &str, body: &str, input_names: &[String]) -> Option<(String, String)> {
    if crate::config::get().cuda_inline_text {
        return None;
    }
    let dir = folder()?;
    let header_line = include(&write(dir, "h", header)?)?;
    let mut body_line = include(&write(dir, "k", body)?)?;
    let used: Vec<String> = input_names
        .iter()
        .flat_map(|n| ["_shape", "_strides", "_ndim"].map(|s| format!("{n}{s}")))
        .filter(|p| body.contains(p.as_str()))
        .collect();
    if !used.is_empty() {
        body_line.push_str(&format!("// uses {}\n", used.join(" ")));
    }
    Some((header_line, body_line))
}

/// `#include "<path>"` for a path the directive can carry as it is.
fn include(path: &Path) -> Option<String> {
    let text = path.to_str()?;
    let plain = path.is_absolute()
        && !text
            .chars()
            .any(|c| c == '"' || c == '\\' || c.is_control());
    plain.then(|| format!("#include \"{text}\"\n"))
}

/// `<temp>/mlxkern-cuda-<uid>`, made with mode 0700, or an existing one that is a folder (not a
/// link) of this user that no one else may read or write; `None` otherwise. Decided once.
fn folder() -> Option<&'static Path> {
    static FOLDER: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOLDER.get_or_init(own_folder).as_deref()
}

fn own_folder() -> Option<PathBuf> {
    private_folder(&std::env::temp_dir())
}

/// `base/mlxkern-cuda-<uid>` if it is (or is now made) private to this user.
#[cfg(unix)]
fn private_folder(base: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = unsafe { libc::geteuid() };
    let dir = base.join(format!("mlxkern-cuda-{uid}"));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    let meta = fs::symlink_metadata(&dir).ok()?;
    let private = meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0;
    private.then_some(dir)
}

#[cfg(not(unix))]
fn private_folder(_: &Path) -> Option<PathBuf> {
    None
}

/// The file `<kind>-<hash>-<length>.cuh` in `dir` holding exactly `text` (`ensure`). Checked
/// for every new launch (`cuda::launch` runs once per launch): a file removed since (a cleaner
/// of the temporary directory) is written again before MLX compiles a kernel that reads it.
fn write(dir: &Path, kind: &str, text: &str) -> Option<PathBuf> {
    let path = dir.join(format!("{kind}-{:016x}-{}.cuh", fnv1a(text), text.len()));
    ensure(&path, text)?;
    Some(path)
}

/// `path` holds exactly `text`: found so (and its time set to now), or written under a
/// temporary name and renamed (no reader sees part of it).
fn ensure(path: &Path, text: &str) -> Option<()> {
    if fs::read(path).ok().as_deref() == Some(text.as_bytes()) {
        // In use again: new to a cleaner that removes old files.
        if let Ok(f) = fs::File::options().append(true).open(path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        return Some(());
    }
    // A name of this writer's own (process and call), so writers never share a temporary file.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let temporary = path.with_extension(format!("{}-{n}.tmp", std::process::id()));
    let written = create_private(&temporary)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| fs::rename(&temporary, path));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
        return None;
    }
    Some(())
}

#[cfg(unix)]
fn create_private(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> std::io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// 64-bit FNV-1a: names the files (with the length beside it); the content is compared anyway.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_go_to_private_files_and_lines_name_the_shapes_used() {
        let names = ["q".to_string(), "k".to_string()];
        let body = "const int T = k_shape[1];\nq[0] = T;\n";
        let (h, b) = include_lines("#define X 1\n", body, &names).expect("a private folder");
        let path = |line: &str| PathBuf::from(line.split('"').nth(1).unwrap());
        assert_eq!(fs::read_to_string(path(&h)).unwrap(), "#define X 1\n");
        assert_eq!(fs::read_to_string(path(&b)).unwrap(), body);
        assert!(b.ends_with("// uses k_shape\n"), "{b}");
        assert!(!b.contains("q_shape"));
        // The same texts give the same lines; another text another file.
        assert_eq!(include_lines("#define X 1\n", body, &names).unwrap().0, h);
        assert_ne!(include_lines("#define X 2\n", body, &names).unwrap().0, h);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let dir = folder().unwrap();
            assert_eq!(
                fs::metadata(dir).unwrap().permissions().mode() & 0o777,
                0o700
            );
            let mode = fs::metadata(path(&b)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
    }

    #[test]
    fn a_changed_or_removed_file_is_written_again() {
        let text = "int rewrite_check;\n";
        let dir = folder().expect("a private folder");
        let path = write(dir, "t", text).unwrap();
        fs::write(&path, "int tampered;\n").unwrap();
        assert_eq!(write(dir, "t", text).unwrap(), path);
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        fs::remove_file(&path).unwrap();
        assert_eq!(write(dir, "t", text).unwrap(), path);
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn writers_at_once_leave_one_whole_file() {
        let text = format!("int concurrent_{};\n", std::process::id()).repeat(2000);
        let dir = folder().expect("a private folder");
        let paths: Vec<PathBuf> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| write(dir, "c", &text).expect("written")))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(paths.iter().all(|p| *p == paths[0]));
        assert_eq!(fs::read_to_string(&paths[0]).unwrap(), text);
        let strays = fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("c-") && name.ends_with(".tmp")
            })
            .count();
        assert_eq!(strays, 0, "temporary files left behind");
        fs::remove_file(&paths[0]).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_folder_open_to_others_or_a_link_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let uid = unsafe { libc::geteuid() };
        let base = std::env::temp_dir().join(format!("mlxkern-files-test-{}", std::process::id()));
        let dir = base.join(format!("mlxkern-cuda-{uid}"));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(private_folder(&base), None);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(private_folder(&base), Some(dir.clone()));
        fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(std::env::temp_dir(), &dir).unwrap();
        assert_eq!(private_folder(&base), None);
        fs::remove_file(&dir).unwrap();
        // No folder can be made under a file: None, and the texts stay inline.
        let file = base.join("a-file");
        fs::write(&file, "").unwrap();
        assert_eq!(private_folder(&file), None);
        fs::remove_file(&file).unwrap();
        assert_eq!(private_folder(&base), Some(dir.clone()));
        let mode = fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn paths_an_include_cannot_carry_are_refused() {
        assert!(include(Path::new("/tmp/a\"b.cuh")).is_none());
        assert!(include(Path::new("/tmp/a\nb.cuh")).is_none());
        assert!(include(Path::new("relative.cuh")).is_none());
        assert_eq!(
            include(Path::new("/tmp/x.cuh")).unwrap(),
            "#include \"/tmp/x.cuh\"\n"
        );
    }
}
