//! Resolution of bind sources in the Ray container, component by component.
//!
//! Why not `std::fs::canonicalize` with a textual fallback: a path whose
//! last components do not exist in the Ray container cannot be
//! canonicalised, and a lexical clean-up keeps every symlink in it. The
//! daemon then resolves those links *on the host*, where an absolute link
//! (`/tmp/ray/l -> /`, planted by a job in a folder it can write) means the
//! host's root: `-v /tmp/ray/l/var/lib/docker:/d` mounted the host's
//! `/var/lib/docker`. So a bind source is resolved here the way `realpath`
//! does, one component at a time with `lstat` and `readlink`, and what is
//! handed to the daemon is the resolved, link-free path. A component that
//! does not exist or cannot be read is an error: never guess.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// How many symlinks one resolution may follow (Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Why a path could not be resolved; each names the path and the component.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("{path}: {at} does not exist in the Ray container (create it first; the shim binds only paths it can resolve)")]
    Missing { path: String, at: String },
    #[error("{path}: too many levels of symbolic links (at {at})")]
    Loop { path: String, at: String },
    #[error("{path}: {at} is not a directory")]
    NotDir { path: String, at: String },
    #[error("{path}: cannot resolve {at}: {reason}")]
    Io {
        path: String,
        at: String,
        reason: String,
    },
    #[error("{path}: not an absolute path")]
    Relative { path: String },
}

/// Returns `path` (absolute) with every symlink, `.` and `..` resolved in
/// this process's view of the file system, like `realpath(3)`; an error when
/// a component is missing, unreadable, not a directory where one is needed,
/// or the links loop.
pub fn resolve(path: &Path) -> Result<PathBuf, ResolveError> {
    let shown = path.display().to_string();
    if !path.is_absolute() {
        return Err(ResolveError::Relative { path: shown });
    }
    // Components still to walk, in reverse order (the next one last).
    let mut todo: Vec<PathBuf> = components_rev(path);
    let mut out = PathBuf::from("/");
    let mut links = 0;
    while let Some(c) = todo.pop() {
        match c.to_str() {
            Some(".") => continue,
            Some("..") => {
                out.pop();
                continue;
            }
            _ => {}
        }
        let next = out.join(&c);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(m) => m,
            Err(e) => {
                let at = next.display().to_string();
                return Err(match e.kind() {
                    ErrorKind::NotFound => ResolveError::Missing { path: shown, at },
                    _ if e.raw_os_error() == Some(libc::ENOTDIR) => {
                        ResolveError::NotDir { path: shown, at }
                    }
                    _ => ResolveError::Io {
                        path: shown,
                        at,
                        reason: e.to_string(),
                    },
                });
            }
        };
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return Err(ResolveError::Loop {
                    path: shown,
                    at: next.display().to_string(),
                });
            }
            let target = std::fs::read_link(&next).map_err(|e| ResolveError::Io {
                path: shown.clone(),
                at: next.display().to_string(),
                reason: e.to_string(),
            })?;
            if target.is_absolute() {
                out = PathBuf::from("/");
            }
            todo.extend(components_rev(&target));
            continue;
        }
        if !meta.is_dir() && !todo.is_empty() {
            return Err(ResolveError::NotDir {
                path: shown,
                at: next.display().to_string(),
            });
        }
        out = next;
    }
    Ok(out)
}

/// Returns `path` (absolute) resolved like [`resolve`] as far as it
/// exists, with the missing rest appended as it is written: an allowed
/// bind root resolved at the node's start, before Ray has made it
/// (`/tmp/ray`). The rest then names only the real folder that may be made
/// there later: a bind is compared, fully resolved, against this path, so
/// a link put there later leads outside it. None when the missing rest
/// holds `.` or `..` (it cannot be written down without resolving it) or
/// the existing part cannot be resolved.
pub fn resolve_root(path: &Path) -> Option<PathBuf> {
    for base in path.ancestors() {
        match resolve(base) {
            Ok(r) => {
                let rest = path.strip_prefix(base).ok()?;
                let plain = rest.components().all(|c| matches!(c, Component::Normal(_)));
                return plain.then(|| r.join(rest));
            }
            Err(ResolveError::Missing { .. }) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// Returns the components of `p` that name something (`.` and `..` kept,
/// the root dropped), last first.
fn components_rev(p: &Path) -> Vec<PathBuf> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            Component::CurDir => Some(PathBuf::from(".")),
            Component::ParentDir => Some(PathBuf::from("..")),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .rev()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn plain_paths_dots_and_links_resolve_like_realpath() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("a/b")).unwrap();
        symlink("a/b", base.join("rel")).unwrap();
        symlink(base.join("a"), base.join("abs")).unwrap();
        assert_eq!(resolve(&base.join("a/./b/..")).unwrap(), base.join("a"));
        assert_eq!(resolve(&base.join("rel")).unwrap(), base.join("a/b"));
        // `..` after a link leaves the link's target, not the link's folder.
        assert_eq!(resolve(&base.join("rel/..")).unwrap(), base.join("a"));
        assert_eq!(resolve(&base.join("abs/b")).unwrap(), base.join("a/b"));
        assert_eq!(resolve(Path::new("/")).unwrap(), PathBuf::from("/"));
        assert_eq!(resolve(Path::new("/..")).unwrap(), PathBuf::from("/"));
    }

    #[test]
    fn a_link_to_root_with_a_missing_rest_is_an_error_not_a_textual_path() {
        // The escape a review found: `ln -s / l`, then `l/<path missing here>`.
        let d = tempfile::tempdir().unwrap();
        symlink("/", d.path().join("l")).unwrap();
        let p = d.path().join("l/no-such-dir-argus/var/lib/docker");
        match resolve(&p) {
            Err(ResolveError::Missing { at, .. }) => assert_eq!(at, "/no-such-dir-argus"),
            other => panic!("{other:?}"),
        }
        // An existing rest resolves to the real (link-free) path.
        assert_eq!(
            resolve(&d.path().join("l/tmp")).unwrap(),
            PathBuf::from("/tmp")
        );
    }

    #[test]
    fn a_root_resolves_as_far_as_it_exists_and_keeps_the_missing_rest() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        symlink(base.join("real"), base.join("link")).unwrap();
        // Existing: the link resolved, once.
        assert_eq!(resolve_root(&base.join("link")), Some(base.join("real")));
        // Missing below a link: the link resolved, the rest as written.
        assert_eq!(
            resolve_root(&base.join("link/ray/x")),
            Some(base.join("real/ray/x"))
        );
        // A dangling link: its folder resolved, its name kept; what it
        // points at is not followed.
        symlink(base.join("nowhere"), base.join("dangling")).unwrap();
        assert_eq!(
            resolve_root(&base.join("dangling")),
            Some(base.join("dangling"))
        );
        assert_eq!(resolve_root(&base.join("missing/../x")), None);
        assert_eq!(resolve_root(Path::new("/")), Some(PathBuf::from("/")));
    }

    #[test]
    fn loops_dangling_links_and_files_as_folders_are_errors() {
        let d = tempfile::tempdir().unwrap();
        symlink("b", d.path().join("a")).unwrap();
        symlink("a", d.path().join("b")).unwrap();
        symlink("missing", d.path().join("dangling")).unwrap();
        std::fs::write(d.path().join("f"), "x").unwrap();
        assert!(matches!(
            resolve(&d.path().join("a")),
            Err(ResolveError::Loop { .. })
        ));
        assert!(matches!(
            resolve(&d.path().join("dangling")),
            Err(ResolveError::Missing { .. })
        ));
        assert!(matches!(
            resolve(&d.path().join("f/x")),
            Err(ResolveError::NotDir { .. })
        ));
        assert!(matches!(
            resolve(Path::new("rel/x")),
            Err(ResolveError::Relative { .. })
        ));
        // A file itself resolves.
        let f = std::fs::canonicalize(d.path().join("f")).unwrap();
        assert_eq!(resolve(&d.path().join("f")).unwrap(), f);
    }
}
