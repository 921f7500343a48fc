//! Atomic publish (R-HEAD-2): a uniquely named temp file on the same file
//! system (the target's folder, or a staging subfolder of it), fsync, rename
//! over the target, fsync the directory. A reader sees the old bytes or the
//! new bytes, never a mix. A writer killed before the rename leaves its temp
//! file behind; [`prune_stale_temps`] removes such leftovers.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::trust;

/// What failed while publishing, and where.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write temp file in {dir}: {source}")]
    Write {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot rename temp file over {path}: {source}")]
    Rename {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no parent directory")]
    NoParent { path: PathBuf },
}

/// Atomically replaces `path` with `bytes`, creating the directory if needed.
/// Every folder on the way is checked and nothing is followed through a
/// link ([`crate::trust`]).
pub fn publish(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    replace(path, bytes, true, false)
}

/// The folder, next to a watched file, where [`publish_watched`] writes its
/// temp files.
pub const STAGING_DIR: &str = ".staging";

/// Like [`publish`], for a file whose folder is watched for changes (the
/// head record, which every worker watches with inotify): the temp file is
/// written in a [`STAGING_DIR`] subfolder and renamed into place, so the
/// watched folder sees one event per publish (the rename onto the file)
/// instead of four (the temp file's create, close-after-write and move
/// out, then the move in), each waking every watcher. Falls back to the
/// same folder if the subfolder cannot be created or is not a trusted
/// folder (a symlink to another file system is never followed).
pub fn publish_watched(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    replace(path, bytes, true, true)
}

/// How much older than the record a temp file left in [`STAGING_DIR`] (or
/// next to the record) must be before [`prune_stale_temps`] removes it. A
/// publish holds its temp file for milliseconds; a head killed between
/// writing it and the rename leaves it for good.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(600);

fn mtime(st: &libc::stat) -> SystemTime {
    let secs = Duration::new(
        st.st_mtime.max(0) as u64,
        st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
    );
    SystemTime::UNIX_EPOCH + secs
}

/// Removes the temp files that earlier publishes of `path` left behind (a
/// head killed mid-publish), in [`STAGING_DIR`] and in `path`'s own folder:
/// only regular files named as [`publish`] names them, and only those whose
/// modification time is at least `older_than` before `path`'s own. Both
/// times come from the file server's clock, so the nodes' clocks need not
/// agree. Call it right after publishing `path`. Returns how many were
/// removed. Folders are opened through [`crate::trust`]; names are removed
/// relative to them, never through a link.
pub fn prune_stale_temps(path: &Path, older_than: Duration) -> std::io::Result<usize> {
    let (dir, name) = trust::split(path)?;
    let dir_fd = trust::open_dir(dir, false)?;
    let reference = mtime(&trust::lstat_at(dir_fd.as_raw_fd(), name)?);
    let prefix = format!(".{}.", name.to_string_lossy());
    let staging = match trust::open_dir(&dir.join(STAGING_DIR), false) {
        Ok(fd) => Some(fd),
        Err(e) if e.is_missing() || e.is_breach() => None,
        Err(e) => return Err(e.into()),
    };
    let mut removed = 0;
    for folder in staging.iter().chain(std::iter::once(&dir_fd)) {
        let fd = folder.as_raw_fd();
        for n in trust::list(fd)? {
            let s = n.to_string_lossy();
            if !(s.starts_with(&prefix) && s.ends_with(".tmp")) {
                continue;
            }
            let Ok(st) = trust::lstat_at(fd, &n) else {
                continue;
            };
            let stale = st.st_mode & libc::S_IFMT == libc::S_IFREG
                && reference
                    .duration_since(mtime(&st))
                    .is_ok_and(|age| age >= older_than);
            if stale {
                match trust::unlink_at(fd, &n) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(removed)
}

/// Atomically replaces `path` with `bytes` without fsync: readers see the
/// old or the new bytes, but a power cut may lose the write. For node-local
/// state rewritten every few seconds (the status file on tmpfs), where an
/// fsync is pure cost.
pub fn publish_volatile(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    replace(path, bytes, false, false)
}

/// How long a [`VolatileDir`] holds its folder before walking it again.
pub const VOLATILE_REWALK: Duration = Duration::from_secs(60);

/// A node-local folder whose files are replaced every few seconds (the
/// state folder: the status file and the metrics snapshot, each heartbeat),
/// held open between writes: walking its path through trusted components
/// costs an open, an fstat and a close per component, a good part of an
/// idle agent's system calls. The folder is walked (and made when missing)
/// at the first write, again after [`VOLATILE_REWALK`], and again at once
/// when a write through the held folder fails. Writes are as
/// [`publish_volatile`]'s: temp file and rename, no fsync.
pub struct VolatileDir {
    path: PathBuf,
    held: Option<(std::os::fd::OwnedFd, std::time::Instant)>,
}

impl VolatileDir {
    pub fn new(path: PathBuf) -> Self {
        Self { path, held: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Atomically replaces the file `name` of the folder with `bytes`.
    pub fn publish(&mut self, name: &str, bytes: &[u8]) -> Result<(), PublishError> {
        let now = std::time::Instant::now();
        let target = self.path.join(name);
        let dir = &self.path;
        let write = |fd: &std::os::fd::OwnedFd| {
            let fd = fd.as_raw_fd();
            replace_in(fd, dir, fd, &target, OsStr::new(name), bytes, false)
        };
        if let Some((fd, at)) = &self.held {
            if now.saturating_duration_since(*at) < VOLATILE_REWALK && write(fd).is_ok() {
                return Ok(());
            }
        }
        self.held = None;
        let fd = trust::open_dir(dir, true).map_err(|e| PublishError::CreateDir {
            path: dir.clone(),
            source: e.into(),
        })?;
        write(&fd)?;
        self.held = Some((fd, now));
        Ok(())
    }
}

/// A temp file name no other writer picks: `.<name>.<random>.tmp`.
fn temp_name(name: &OsStr) -> OsString {
    let mut r = [0u8; 8];
    // SAFETY: r is a valid buffer of its length.
    let got = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    let n = if got == r.len() as isize {
        u64::from_ne_bytes(r)
    } else {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    };
    let mut s = OsString::from(".");
    s.push(name);
    s.push(format!(".{n:016x}.tmp"));
    s
}

/// Writes `bytes` to a temp file (in a [`STAGING_DIR`] subfolder when
/// `staged`, else `path`'s folder) and renames it over `path`, all
/// relative to verified folder descriptors.
fn replace(path: &Path, bytes: &[u8], durable: bool, staged: bool) -> Result<(), PublishError> {
    let (dir, name) = trust::split(path).map_err(|_| PublishError::NoParent {
        path: path.to_path_buf(),
    })?;
    let dir_fd = trust::open_dir(dir, true).map_err(|e| PublishError::CreateDir {
        path: dir.to_path_buf(),
        source: e.into(),
    })?;
    let staging = staged
        .then(|| trust::open_dir(&dir.join(STAGING_DIR), true).ok())
        .flatten();
    let tmp_fd = staging.as_ref().unwrap_or(&dir_fd).as_raw_fd();
    let tmp_dir = if staging.is_some() {
        dir.join(STAGING_DIR)
    } else {
        dir.to_path_buf()
    };
    replace_in(
        tmp_fd,
        &tmp_dir,
        dir_fd.as_raw_fd(),
        path,
        name,
        bytes,
        durable,
    )?;
    if durable {
        let _ = std::fs::File::from(dir_fd).sync_all();
    }
    Ok(())
}

/// Writes `bytes` to a temp file in the verified folder `tmp_fd` (the
/// folder `tmp_dir`, for messages) and renames it over `name` in the
/// verified folder `dir_fd` (the file `path`).
fn replace_in(
    tmp_fd: std::os::fd::RawFd,
    tmp_dir: &Path,
    dir_fd: std::os::fd::RawFd,
    path: &Path,
    name: &OsStr,
    bytes: &[u8],
    durable: bool,
) -> Result<(), PublishError> {
    let write_err = |source| PublishError::Write {
        dir: tmp_dir.to_path_buf(),
        source,
    };
    let tmp = temp_name(name);
    let fd = trust::open_at(
        tmp_fd,
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    )
    .map_err(write_err)?;
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(bytes)
        .and_then(|_| if durable { file.sync_all() } else { Ok(()) })
        // Readable by workers running as other users, whatever the umask.
        .and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o644))
        });
    // Closed before the rename: a close after it would raise a second
    // file event (IN_CLOSE_WRITE) under the record's name, and every
    // watching worker would read the record twice per publish.
    drop(file);
    if let Err(e) = written {
        let _ = trust::unlink_at(tmp_fd, &tmp);
        return Err(write_err(e));
    }
    if let Err(source) = trust::rename_at(tmp_fd, &tmp, dir_fd, name) {
        let _ = trust::unlink_at(tmp_fd, &tmp);
        return Err(PublishError::Rename {
            path: path.to_path_buf(),
            source,
        });
    }
    Ok(())
}

/// Fsyncs a directory so a rename in it is durable; some file systems
/// refuse (EINVAL), which is harmless: their renames are synchronous.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = trust::open_dir(dir, false) {
        let _ = std::fs::File::from(d).sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::sample;
    use crate::record::HeadRecord;

    /// The folder is made at the first write and held; when it goes away
    /// the next write walks the path again and makes it anew.
    #[test]
    fn a_volatile_dir_is_made_held_and_made_again_when_removed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state/node");
        let mut v = VolatileDir::new(dir.clone());
        v.publish("status.json", b"one").unwrap();
        v.publish("metrics.txt", b"m").unwrap();
        assert_eq!(std::fs::read(dir.join("status.json")).unwrap(), b"one");
        std::fs::remove_dir_all(&dir).unwrap();
        v.publish("status.json", b"two").unwrap();
        assert_eq!(std::fs::read(dir.join("status.json")).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["status.json"], "no temp file left");
    }

    #[test]
    fn publish_replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/head.json");
        let mut r = sample();
        publish(&path, &r.to_bytes()).unwrap();
        r.seq += 1;
        publish(&path, &r.to_bytes()).unwrap();
        assert_eq!(
            HeadRecord::parse(&std::fs::read(&path).unwrap())
                .unwrap()
                .seq,
            8
        );
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("head.json")]);
    }

    #[test]
    fn publish_watched_stages_in_a_subfolder_and_leaves_it_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.json");
        publish_watched(&path, &sample().to_bytes()).unwrap();
        publish_watched(&path, &sample().to_bytes()).unwrap();
        assert_eq!(
            HeadRecord::parse(&std::fs::read(&path).unwrap()).unwrap(),
            sample()
        );
        let staging = dir.path().join(STAGING_DIR);
        assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
        // A folder where the subfolder cannot be made: same-folder temp.
        std::fs::remove_dir(&staging).unwrap();
        std::fs::write(&staging, b"not a folder").unwrap();
        publish_watched(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
    }

    /// A head killed between writing its temp file and the rename leaves
    /// the temp file; the next head's first publish removes it, and only
    /// such leftovers: fresh temp files (a publish in flight) and other
    /// files stay.
    #[test]
    fn prune_removes_only_old_leftover_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.json");
        publish_watched(&path, &sample().to_bytes()).unwrap();
        let staging = dir.path().join(STAGING_DIR);
        let record_time = std::fs::metadata(&path).unwrap().modified().unwrap();
        let make = |p: &Path, age: Duration| {
            std::fs::write(p, b"{").unwrap();
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(record_time - age).unwrap();
        };
        let hour = Duration::from_secs(3600);
        let old_staged = staging.join(".head.json.aB3xYz.tmp");
        let old_beside = dir.path().join(".head.json.Qw9rT1.tmp");
        let fresh = staging.join(".head.json.fresh1.tmp");
        let other_file = staging.join(".other.json.aB3xYz.tmp");
        let notes = dir.path().join("notes.txt");
        make(&old_staged, hour);
        make(&old_beside, hour);
        make(&fresh, Duration::from_secs(1));
        make(&other_file, hour);
        make(&notes, hour);
        std::fs::create_dir(staging.join(".head.json.dir.tmp")).unwrap();
        assert_eq!(prune_stale_temps(&path, STALE_TEMP_AGE).unwrap(), 2);
        assert!(!old_staged.exists() && !old_beside.exists());
        assert!(fresh.exists() && other_file.exists() && notes.exists());
        assert!(staging.join(".head.json.dir.tmp").is_dir());
        assert!(HeadRecord::parse(&std::fs::read(&path).unwrap()).is_ok());
        // Nothing left to remove; no record, nothing to compare with.
        assert_eq!(prune_stale_temps(&path, STALE_TEMP_AGE).unwrap(), 0);
        assert!(prune_stale_temps(&dir.path().join("none.json"), STALE_TEMP_AGE).is_err());
    }

    /// R-SEC-2: a symlink planted as `.staging`, as the record's folder
    /// or as a folder above it is never written through.
    #[test]
    fn links_planted_in_place_of_a_folder_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("canary");
        std::fs::create_dir(&canary).unwrap();
        let d = dir.path().join("disc");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(&canary, d.join(STAGING_DIR)).unwrap();
        publish_watched(&d.join("head.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(d.join("head.json")).unwrap(), b"{}");
        std::os::unix::fs::symlink(&canary, dir.path().join("linked")).unwrap();
        let e = publish(&dir.path().join("linked/head.json"), b"x").unwrap_err();
        assert!(e.to_string().contains("linked is a symlink"), "{e}");
        let e = publish(&dir.path().join("linked/sub/head.json"), b"x").unwrap_err();
        assert!(e.to_string().contains("linked is a symlink"), "{e}");
        assert_eq!(std::fs::read_dir(&canary).unwrap().count(), 0);
        // The record itself a link to a file: replaced, never written through.
        let file = dir.path().join("canary.txt");
        std::fs::write(&file, b"orig").unwrap();
        std::os::unix::fs::symlink(&file, d.join("x.json")).unwrap();
        publish(&d.join("x.json"), b"new").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"orig");
        assert!(std::fs::symlink_metadata(d.join("x.json"))
            .unwrap()
            .is_file());
    }

    #[test]
    fn publish_into_unwritable_place_names_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plainfile");
        std::fs::write(&file, b"x").unwrap();
        let e = publish(&file.join("head.json"), b"{}").unwrap_err();
        assert!(e.to_string().contains("plainfile"), "{e}");
    }
}
