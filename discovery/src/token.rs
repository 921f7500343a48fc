//! The cluster's Ray token (Ray's token authentication, `RAY_AUTH_MODE=token`)
//! beside the discovery record: made once by the first head that finds none,
//! read by every later head and every worker of the cluster.
//!
//! The file is written as the agent identity with mode 0600 (the Ray user,
//! a job, reads nothing of it on shared storage) through trusted folders
//! ([`crate::trust`]): a temp file is filled and synced, then hard-linked
//! to its name, which fails when the name exists. Two heads starting at
//! once therefore agree on one token, and a reader never sees a half
//! written one. A token file that is not the agent's, not a regular file,
//! or not a valid token is refused, never replaced: replacing it would
//! lock every node of the cluster out of its GCS.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::trust;

/// The token file's name, in the discovery record's folder.
pub const TOKEN_FILE: &str = "auth_token";

/// The shortest token accepted (Ray generates 32 hex digits; ours are 64).
pub const MIN_TOKEN_LEN: usize = 32;

/// The longest token accepted.
pub const MAX_TOKEN_LEN: usize = 512;

/// Why the cluster's token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{path}: no token yet (the head makes it at its first start)")]
    Missing { path: PathBuf },
    #[error("{path}: refused: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl TokenError {
    /// Returns true if and only if no token file exists yet.
    pub fn is_missing(&self) -> bool {
        matches!(self, TokenError::Missing { .. })
    }
}

/// Returns `Err(why)` unless `token` is one Ray accepts in a header and
/// an environment variable: 32 to 512 characters of `[A-Za-z0-9._~+/=-]`.
pub fn validate(token: &str) -> Result<(), String> {
    let n = token.chars().count();
    if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&n) {
        return Err(format!(
            "a token has {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters, this one {n}"
        ));
    }
    if let Some(c) = token
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._~+/=-".contains(*c)))
    {
        return Err(format!(
            "a token has only letters, digits and ._~+/=- ({c:?} found)"
        ));
    }
    Ok(())
}

/// The token in a file's bytes: one line, surrounding whitespace ignored.
pub fn parse(bytes: &[u8]) -> Result<String, String> {
    let s = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let t = s.trim();
    validate(t)?;
    Ok(t.to_string())
}

/// A new token: 64 hex digits from the kernel's random source.
pub fn generate() -> std::io::Result<String> {
    let mut r = [0u8; 32];
    let mut got = 0;
    while got < r.len() {
        // SAFETY: the pointer and length name the unfilled rest of `r`.
        let n = unsafe { libc::getrandom(r[got..].as_mut_ptr().cast(), r.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(r.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token file beside the discovery record `head_file`.
pub fn token_path(head_file: &Path) -> PathBuf {
    head_file
        .parent()
        .unwrap_or_else(|| Path::new("/"))
        .join(TOKEN_FILE)
}

/// Reads the cluster's token at `path` (a regular file of the agent
/// identity, not followed through a link, in trusted folders).
pub fn read_token(path: &Path) -> Result<String, TokenError> {
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (dir, name) = trust::split(path).map_err(io)?;
    let dir_fd = match trust::open_dir(dir, false) {
        Ok(fd) => fd,
        Err(e) if e.is_missing() => {
            return Err(TokenError::Missing {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.is_breach() => {
            return Err(TokenError::Untrusted {
                path: path.to_path_buf(),
                why: e.to_string(),
            })
        }
        Err(e) => return Err(io(e.into())),
    };
    let fd = match trust::open_at(dir_fd.as_raw_fd(), name, libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TokenError::Missing {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(TokenError::Untrusted {
                path: path.to_path_buf(),
                why: "a symlink".into(),
            })
        }
        Err(e) => return Err(io(e)),
    };
    let st = trust::fstat(fd.as_raw_fd()).map_err(io)?;
    trust::check_file(path, &st).map_err(|e| TokenError::Untrusted {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    if st.st_mode & 0o077 != 0 {
        return Err(TokenError::Untrusted {
            path: path.to_path_buf(),
            why: format!(
                "mode {:04o}: others may read it (the agent writes it 0600)",
                st.st_mode & 0o7777
            ),
        });
    }
    let mut buf = Vec::with_capacity(128);
    std::fs::File::from(fd)
        .take(MAX_TOKEN_LEN as u64 + 2)
        .read_to_end(&mut buf)
        .map_err(io)?;
    parse(&buf).map_err(|why| TokenError::Invalid {
        path: path.to_path_buf(),
        why,
    })
}

/// Returns the cluster's token at `path`, making it with `make` when no
/// file exists; the bool is true if and only if this call made it.
pub fn read_or_create_token(
    path: &Path,
    make: impl FnOnce() -> std::io::Result<String>,
) -> Result<(String, bool), TokenError> {
    match read_token(path) {
        Err(e) if e.is_missing() => {}
        other => return other.map(|t| (t, false)),
    }
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let token = make().map_err(io)?;
    validate(&token).map_err(|why| TokenError::Invalid {
        path: path.to_path_buf(),
        why,
    })?;
    let (dir, name) = trust::split(path).map_err(io)?;
    let dir_fd = trust::open_dir(dir, true).map_err(|e| io(e.into()))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.tmp", &generate().map_err(io)?[..16]));
    let fd = trust::open_at(
        dir_fd.as_raw_fd(),
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )
    .map_err(io)?;
    let mut f = std::fs::File::from(fd);
    let written = f
        .write_all(format!("{token}\n").as_bytes())
        .and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
        })
        .and_then(|_| f.sync_all());
    drop(f);
    let linked = written.and_then(|_| link_at(dir_fd.as_raw_fd(), &tmp, name));
    let _ = trust::unlink_at(dir_fd.as_raw_fd(), &tmp);
    match linked {
        Ok(()) => {
            let _ = std::fs::File::from(dir_fd).sync_all();
            Ok((token, true))
        }
        // Another head made it first: its token is the cluster's.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read_token(path).map(|t| (t, false))
        }
        Err(e) => Err(io(e)),
    }
}

/// `linkat(dir, from, dir, to, 0)`: fails with `AlreadyExists` when `to`
/// exists; neither name is followed.
fn link_at(dir: i32, from: &OsStr, to: &OsStr) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |s: &OsStr| {
        std::ffi::CString::new(s.as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (a, b) = (c(from)?, c(to)?);
    // SAFETY: both names are NUL-terminated and live across the call.
    if unsafe { libc::linkat(dir, a.as_ptr(), dir, b.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_checked_for_length_and_characters() {
        assert!(validate(&"a".repeat(31)).is_err());
        assert!(validate(&"a".repeat(32)).is_ok());
        assert!(validate(&"a".repeat(513)).is_err());
        assert!(validate(&format!("{}\n", "a".repeat(40))).is_err());
        assert!(validate(&format!("{} b", "a".repeat(40))).is_err());
        assert!(validate(&format!("{}\"", "a".repeat(40))).is_err());
        assert_eq!(
            parse(format!("  {}\n", "A1-_.".repeat(8)).as_bytes()).unwrap(),
            "A1-_.".repeat(8)
        );
        let g = generate().unwrap();
        assert_eq!(g.len(), 64);
        assert!(validate(&g).is_ok());
        assert_ne!(g, generate().unwrap());
    }

    #[test]
    fn the_first_head_makes_the_token_and_every_later_call_reads_it() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c").join(TOKEN_FILE);
        assert!(read_token(&path).unwrap_err().is_missing());
        let (t, made) = read_or_create_token(&path, generate).unwrap();
        assert!(made);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        let (again, made) = read_or_create_token(&path, || Ok("x".repeat(40))).unwrap();
        assert_eq!((again.as_str(), made), (t.as_str(), false));
        assert_eq!(read_token(&path).unwrap(), t);
        // No temp file is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(TOKEN_FILE)]);
    }

    #[test]
    fn a_bad_or_readable_or_linked_token_file_is_refused_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(TOKEN_FILE);
        std::fs::write(&path, "short\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_or_create_token(&path, generate).unwrap_err();
        assert!(matches!(e, TokenError::Invalid { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short\n");

        std::fs::write(&path, "b".repeat(40)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token(&path).unwrap_err();
        assert!(matches!(e, TokenError::Untrusted { .. }), "{e}");

        std::fs::remove_file(&path).unwrap();
        let other = d.path().join("elsewhere");
        std::fs::write(&other, "c".repeat(40)).unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&other, &path).unwrap();
        let e = read_or_create_token(&path, generate).unwrap_err();
        assert!(matches!(e, TokenError::Untrusted { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "c".repeat(40));
    }

    #[test]
    fn two_heads_at_once_agree_on_one_token() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(TOKEN_FILE);
        let got: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| read_or_create_token(&path, generate).unwrap().0))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got.iter().all(|t| *t == got[0]), "{got:?}");
        assert_eq!(read_token(&path).unwrap(), got[0]);
    }
}
