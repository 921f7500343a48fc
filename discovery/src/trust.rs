//! Trusted paths (R-SEC-2): nothing this crate writes or reads is reached
//! through a folder another user could change.
//!
//! A path is walked from `/` one component at a time, each opened with
//! `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor and
//! checked with `fstat` on what was opened (never on a name looked up
//! again): it must be owned by root or the agent's writer identity
//! ([`agent`]), and not group- or other-writable unless sticky (then its
//! children must pass the same owner rule, which every child does here).
//! Files are then created, renamed, listed and removed relative to the
//! verified folder's descriptor with `O_NOFOLLOW`, and a file read is
//! trusted only when the file opened is owned by the agent identity.
//!
//! Why: `/private` is a shared mount; when the Ray user (or any job) could
//! rename a folder the agent uses and plant a symlink or its own folder,
//! the agent followed it as root (issue 26, road 2 and hole 5).

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

/// The numeric identity that writes shared state (ARGUS_AGENT_USER).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// The process's own effective uid and gid.
    pub fn current() -> Self {
        // SAFETY: geteuid/getegid cannot fail.
        unsafe {
            Self {
                uid: libc::geteuid(),
                gid: libc::getegid(),
            }
        }
    }
}

static AGENT: OnceLock<Identity> = OnceLock::new();

/// Sets the agent identity for the whole process, once, before any storage
/// I/O; returns false if it was already set to another value.
pub fn set_agent(id: Identity) -> bool {
    *AGENT.get_or_init(|| id) == id
}

/// The agent identity: as set by [`set_agent`], else the process's own.
pub fn agent() -> Identity {
    AGENT.get().copied().unwrap_or_else(Identity::current)
}

/// Switches the calling thread's file-system identity (fsuid, fsgid) to
/// `id`. Both are per thread in the kernel, and a fsuid other than 0
/// drops CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER for file
/// checks: the thread then writes exactly where `id` may, and on NFS with
/// root squash the server sees `id`, not nobody. A no-op when the thread
/// already has that identity.
pub fn become_identity(id: Identity) -> io::Result<()> {
    // SAFETY: setfsgid/setfsuid take plain numbers; each returns the
    // previous value, so calling twice tells whether the first took.
    unsafe {
        libc::setfsgid(id.gid);
        let now = libc::setfsgid(id.gid);
        libc::setfsuid(id.uid);
        let now_uid = libc::setfsuid(id.uid);
        if now as u32 != id.gid || now_uid as u32 != id.uid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "cannot take the file-system identity {}:{} (the agent must be root, or run as that identity)",
                    id.uid, id.gid
                ),
            ));
        }
    }
    Ok(())
}

/// Drops the process's supplementary groups (all threads: glibc applies
/// setgroups to every thread).
pub fn drop_supplementary_groups() -> io::Result<()> {
    // SAFETY: an empty list; the pointer is not read.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return last_err();
    }
    Ok(())
}

/// Why a path is not trusted, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{path}: must be an absolute path without `..`")]
    NotAbsolute { path: PathBuf },
    #[error("{path}: {component} is a symlink (refused: no link is followed)")]
    Symlink { path: PathBuf, component: PathBuf },
    #[error("{path}: {component} is not a folder")]
    NotAFolder { path: PathBuf, component: PathBuf },
    #[error("{path}: {component} is owned by uid {uid} with mode {mode:04o}; it must be owned by root or the agent (uid {agent}) and not group- or other-writable unless sticky")]
    Untrusted {
        path: PathBuf,
        component: PathBuf,
        uid: u32,
        mode: u32,
        agent: u32,
    },
    #[error("{path}: {component} does not exist")]
    Missing { path: PathBuf, component: PathBuf },
    #[error("{path}: cannot open {component}: {source}")]
    Io {
        path: PathBuf,
        component: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl TrustError {
    /// Returns true if and only if a component does not exist (not a
    /// breach: the folder is just not made yet).
    pub fn is_missing(&self) -> bool {
        matches!(self, TrustError::Missing { .. })
    }

    /// Returns true if and only if the path breaks the trust rule (as
    /// opposed to being missing or unreadable).
    pub fn is_breach(&self) -> bool {
        matches!(
            self,
            TrustError::NotAbsolute { .. }
                | TrustError::Symlink { .. }
                | TrustError::Untrusted { .. }
        )
    }
}

impl From<TrustError> for io::Error {
    fn from(e: TrustError) -> Self {
        let kind = match &e {
            TrustError::Missing { .. } => io::ErrorKind::NotFound,
            TrustError::Io { source, .. } => source.kind(),
            _ => io::ErrorKind::PermissionDenied,
        };
        io::Error::new(kind, e.to_string())
    }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn last_err<T>() -> io::Result<T> {
    Err(io::Error::last_os_error())
}

/// `fstat` of an open descriptor.
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return last_err();
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstat_at(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st a valid out pointer.
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return last_err();
    }
    Ok(st)
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, mode)`.
pub fn open_at(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: c is NUL-terminated; the returned fd is owned here.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return last_err();
    }
    // SAFETY: fd was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `renameat(from_dir, from, to_dir, to)`: neither name is resolved
/// through a link (renameat never follows the last component).
pub fn rename_at(from_dir: RawFd, from: &OsStr, to_dir: RawFd, to: &OsStr) -> io::Result<()> {
    let (a, b) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names are NUL-terminated.
    if unsafe { libc::renameat(from_dir, a.as_ptr(), to_dir, b.as_ptr()) } != 0 {
        return last_err();
    }
    Ok(())
}

/// `unlinkat(dir, name, 0)`.
pub fn unlink_at(dir: RawFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is NUL-terminated.
    if unsafe { libc::unlinkat(dir, c.as_ptr(), 0) } != 0 {
        return last_err();
    }
    Ok(())
}

/// The names in an open folder (without `.` and `..`).
pub fn list(dir: RawFd) -> io::Result<Vec<OsString>> {
    // SAFETY: dup gives a descriptor that fdopendir takes over.
    let dup = unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return last_err();
    }
    // SAFETY: dup is a valid directory descriptor.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so dup is still ours.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: d is valid; rewind in case the shared offset moved.
    unsafe { libc::rewinddir(d) };
    let mut names = Vec::new();
    loop {
        // SAFETY: d is a valid DIR*.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            names.push(OsString::from_vec(b.to_vec()));
        }
    }
    // SAFETY: d is valid and closed once.
    unsafe { libc::closedir(d) };
    Ok(names)
}

/// Checks an opened folder's owner and mode against the rule.
fn check_dir(st: &libc::stat) -> Result<(), (u32, u32)> {
    let mode = st.st_mode & 0o7777;
    let owner_ok = st.st_uid == 0 || st.st_uid == agent().uid;
    let writable_by_others = mode & 0o022 != 0;
    let sticky = mode & libc::S_ISVTX != 0;
    if owner_ok && (!writable_by_others || sticky) {
        Ok(())
    } else {
        Err((st.st_uid, mode))
    }
}

/// Opens the folder `path` through trusted components only (see the
/// module doc); with `create`, missing components are made (mode 0755, by
/// the calling thread's file-system identity).
pub fn open_dir(path: &Path, create: bool) -> Result<OwnedFd, TrustError> {
    let err_path = || path.to_path_buf();
    if !path.is_absolute() {
        return Err(TrustError::NotAbsolute { path: err_path() });
    }
    let mut walked = PathBuf::from("/");
    let io_err = |walked: &Path, source| TrustError::Io {
        path: err_path(),
        component: walked.to_path_buf(),
        source,
    };
    let root = open_at(
        libc::AT_FDCWD,
        OsStr::new("/"),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )
    .map_err(|e| io_err(&walked, e))?;
    let check = |fd: &OwnedFd, walked: &Path| -> Result<(), TrustError> {
        let st = fstat(fd.as_raw_fd()).map_err(|e| io_err(walked, e))?;
        check_dir(&st).map_err(|(uid, mode)| TrustError::Untrusted {
            path: err_path(),
            component: walked.to_path_buf(),
            uid,
            mode,
            agent: agent().uid,
        })
    };
    check(&root, &walked)?;
    let mut cur = root;
    for c in path.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(TrustError::NotAbsolute { path: err_path() })
            }
        };
        walked.push(name);
        let open =
            |cur: &OwnedFd| open_at(cur.as_raw_fd(), name, libc::O_RDONLY | libc::O_DIRECTORY, 0);
        let next = match open(&cur) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                let c = cstr(name).map_err(|e| io_err(&walked, e))?;
                // SAFETY: c is NUL-terminated.
                if unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(io_err(&walked, e));
                    }
                }
                open(&cur)
            }
            other => other,
        };
        let next = match next {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(TrustError::Missing {
                    path: err_path(),
                    component: walked,
                })
            }
            Err(e)
                if e.raw_os_error() == Some(libc::ELOOP)
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                // O_NOFOLLOW | O_DIRECTORY on a link gives ELOOP or ENOTDIR
                // by kernel: look at the entry itself to say which.
                let link = lstat_at(cur.as_raw_fd(), name)
                    .map_or(true, |st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
                return Err(if link {
                    TrustError::Symlink {
                        path: err_path(),
                        component: walked,
                    }
                } else {
                    TrustError::NotAFolder {
                        path: err_path(),
                        component: walked,
                    }
                });
            }
            Err(e) => return Err(io_err(&walked, e)),
        };
        check(&next, &walked)?;
        cur = next;
    }
    Ok(cur)
}

/// Splits a file path into its folder and its name.
pub fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(d), Some(n)) if !d.as_os_str().is_empty() => Ok((d, n)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file in a folder", path.display()),
        )),
    }
}

/// Why a file that was opened is not trusted.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path} is owned by uid {uid}, not the agent (uid {agent}), or is not a regular file: ignored"
)]
pub struct UntrustedFile {
    pub path: PathBuf,
    pub uid: u32,
    pub agent: u32,
}

/// Returns Ok if an opened file is a regular file owned by the agent.
pub fn check_file(path: &Path, st: &libc::stat) -> Result<(), UntrustedFile> {
    let agent = agent().uid;
    if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == agent {
        Ok(())
    } else {
        Err(UntrustedFile {
            path: path.to_path_buf(),
            uid: st.st_uid,
            agent,
        })
    }
}

/// Opens (creating, mode 0644) `name` in the verified folder `dir` for
/// appending, without following a link, and checks what was opened: a
/// regular file with one link, owned by the calling thread's file-system
/// identity `owner` (a file another user planted in a sticky folder, or a
/// hard link to someone else's file, is refused).
pub fn open_append(dir: RawFd, name: &OsStr, owner: u32) -> io::Result<std::fs::File> {
    let fd = open_at(
        dir,
        name,
        libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT,
        0o644,
    )?;
    let st = fstat(fd.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != owner || st.st_nlink != 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a regular file of uid {owner} with one link (owner {}, links {}): refused",
                name.to_string_lossy(),
                st.st_uid,
                st.st_nlink
            ),
        ));
    }
    Ok(std::fs::File::from(fd))
}

/// The owner of an open descriptor.
pub fn owner(fd: RawFd) -> io::Result<u32> {
    fstat(fd).map(|st| st.st_uid)
}

/// Returns true if and only if `name` in `dir` is a regular file (not
/// followed if it is a link).
pub fn is_regular_at(dir: RawFd, name: &OsStr) -> bool {
    lstat_at(dir, name).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> bool {
        Identity::current().uid == 0
    }

    #[test]
    fn a_symlink_or_a_foreign_folder_at_any_component_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("a");
        std::fs::create_dir_all(base.join("b/c")).unwrap();
        assert!(open_dir(&base.join("b/c"), false).is_ok());
        // A symlink in place of a component.
        std::fs::rename(base.join("b"), base.join("b.away")).unwrap();
        std::os::unix::fs::symlink(base.join("b.away"), base.join("b")).unwrap();
        let e = open_dir(&base.join("b/c"), true).unwrap_err();
        assert!(matches!(e, TrustError::Symlink { .. }), "{e}");
        assert!(e.is_breach());
        assert!(e.to_string().contains("/a/b is a symlink"), "{e}");
        std::fs::remove_file(base.join("b")).unwrap();
        std::fs::rename(base.join("b.away"), base.join("b")).unwrap();
        // Group- or other-writable without the sticky bit.
        std::fs::set_permissions(base.join("b"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open_dir(&base.join("b/c"), false).unwrap_err();
        assert!(
            matches!(e, TrustError::Untrusted { mode: 0o777, .. }),
            "{e}"
        );
        std::fs::set_permissions(base.join("b"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(open_dir(&base.join("b/c"), false).is_ok());
        std::fs::set_permissions(base.join("b"), std::fs::Permissions::from_mode(0o755)).unwrap();
        // Missing, with and without create.
        assert!(open_dir(&base.join("b/x/y"), false)
            .unwrap_err()
            .is_missing());
        assert!(open_dir(&base.join("b/x/y"), true).is_ok());
        assert!(base.join("b/x/y").is_dir());
        std::fs::write(base.join("file"), b"").unwrap();
        let e = open_dir(&base.join("file/x"), true).unwrap_err();
        assert!(
            matches!(e, TrustError::NotAFolder { .. }) && !e.is_breach(),
            "{e}"
        );
        assert!(open_dir(Path::new("rel/x"), true).unwrap_err().is_breach());
        if root() {
            // Owned by another uid (as root: chown works).
            std::os::unix::fs::chown(base.join("b"), Some(12345), None).unwrap();
            let e = open_dir(&base.join("b/c"), false).unwrap_err();
            assert!(matches!(e, TrustError::Untrusted { uid: 12345, .. }), "{e}");
        }
    }
}
