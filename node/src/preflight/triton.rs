//! Check 5: the unversioned `libcuda.so` that Triton links with (`gcc …
//! -lcuda`). `ld -lcuda` looks for `libcuda.so`, never `libcuda.so.1`, so a
//! host that ships only the soname passes `cuInit` but fails Triton's JIT
//! with `cannot find -lcuda`. When `libcuda.so.1` initialises, this is a
//! configuration finding with an automatic fix: a private folder holding
//! `libcuda.so` (and `libcuda.so.1`) pointing at the loaded library, exported
//! to Ray as `TRITON_LIBCUDA_PATH` (which Triton then searches instead of
//! `ldconfig -p`).

use std::path::Path;

use super::{Check, Class, Evidence, Status};

/// The name of this check.
pub const NAME: &str = "libcuda-unversioned";

/// Checks for `libcuda.so` next to `libcuda_so1` (the file `libcuda.so.1`
/// was loaded from) or in an already set `TRITON_LIBCUDA_PATH`; otherwise
/// makes the fix in `fix_dir`.
pub fn check(libcuda_so1: &Path, triton_path: Option<&Path>, fix_dir: &Path) -> Check {
    if let Some(dir) = triton_path {
        if dir.join("libcuda.so").exists() {
            return Check::pass(
                NAME,
                format!("TRITON_LIBCUDA_PATH={} has libcuda.so", dir.display()),
            )
            .with(Evidence::of(format!(
                "test -e {}/libcuda.so",
                dir.display()
            )));
        }
    }
    let dir = libcuda_so1.parent().unwrap_or(Path::new("/"));
    let unversioned = dir.join("libcuda.so");
    let ev = Evidence::of(format!("test -e {}", unversioned.display()));
    if unversioned.exists() && triton_path.is_none() {
        return Check::pass(NAME, format!("{} present", unversioned.display())).with(ev);
    }
    let target = std::fs::canonicalize(libcuda_so1).unwrap_or_else(|_| libcuda_so1.to_path_buf());
    match make_fix(&target, fix_dir) {
        Ok(()) => Check::finding(
            NAME,
            Status::Fixed,
            "libcuda-unversioned-missing",
            format!(
                "no libcuda.so next to {} (Triton would fail with `cannot find -lcuda`); linked {}/libcuda.so -> {} and exported TRITON_LIBCUDA_PATH",
                libcuda_so1.display(),
                fix_dir.display(),
                target.display()
            ),
        )
        .with(ev.clone()),
        Err(e) => Check::fail(
            NAME,
            Class::Configuration,
            "libcuda-unversioned-missing",
            format!(
                "no libcuda.so next to {} and the automatic fix failed: cannot create {}/libcuda.so: {e}",
                libcuda_so1.display(),
                fix_dir.display()
            ),
        )
        .with(Evidence {
            stderr: Some(e.to_string()),
            ..ev
        }),
    }
}

/// Creates `fix_dir/{libcuda.so,libcuda.so.1} -> target`, replacing stale
/// links atomically (link under a temporary name, then rename).
pub fn make_fix(target: &Path, fix_dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(fix_dir)?;
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = fix_dir.join(name);
        if std::fs::read_link(&link).is_ok_and(|t| t == target) {
            continue;
        }
        let tmp = fix_dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(())
}
