//! Atomic publish (R-HEAD-2): a uniquely named temp file on the same file
//! system (the target's folder, or a staging subfolder of it), fsync, rename
//! over the target, fsync the directory. A reader sees the old bytes or the
//! new bytes, never a mix. A writer killed before the rename leaves its temp
//! file behind; [`prune_stale_temps`] removes such leftovers.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
pub fn publish(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    replace(path, bytes, true, None)
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
/// same folder if the subfolder cannot be created.
pub fn publish_watched(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    let staging = path.parent().map(|d| d.join(STAGING_DIR));
    let staging = staging.filter(|s| std::fs::create_dir_all(s).is_ok());
    replace(path, bytes, true, staging.as_deref())
}

/// How much older than the record a temp file left in [`STAGING_DIR`] (or
/// next to the record) must be before [`prune_stale_temps`] removes it. A
/// publish holds its temp file for milliseconds; a head killed between
/// writing it and the rename leaves it for good.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(600);

/// Removes the temp files that earlier publishes of `path` left behind (a
/// head killed mid-publish), in [`STAGING_DIR`] and in `path`'s own folder:
/// only files named as [`publish`] names them, and only those whose
/// modification time is at least `older_than` before `path`'s own. Both
/// times come from the file server's clock, so the nodes' clocks need not
/// agree. Call it right after publishing `path`. Returns how many were
/// removed.
pub fn prune_stale_temps(path: &Path, older_than: Duration) -> std::io::Result<usize> {
    let reference = std::fs::metadata(path)?.modified()?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(0);
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let mut removed = 0;
    for folder in [dir.join(STAGING_DIR), dir.to_path_buf()] {
        let entries = match std::fs::read_dir(&folder) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let file_name = entry.file_name();
            let n = file_name.to_string_lossy();
            if !(n.starts_with(&prefix) && n.ends_with(".tmp")) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            let stale = meta.is_file()
                && meta
                    .modified()
                    .ok()
                    .and_then(|m| reference.duration_since(m).ok())
                    .is_some_and(|age| age >= older_than);
            if stale {
                match std::fs::remove_file(entry.path()) {
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
    replace(path, bytes, false, None)
}

/// Writes `bytes` to a temp file in `staging` (default: `path`'s folder, on
/// the same file system) and renames it over `path`.
fn replace(
    path: &Path,
    bytes: &[u8],
    durable: bool,
    staging: Option<&Path>,
) -> Result<(), PublishError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| PublishError::NoParent {
            path: path.to_path_buf(),
        })?;
    std::fs::create_dir_all(dir).map_err(|source| PublishError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp_dir = staging.unwrap_or(dir);
    let write_err = |source| PublishError::Write {
        dir: tmp_dir.to_path_buf(),
        source,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(tmp_dir)
        .map_err(write_err)?;
    tmp.write_all(bytes).map_err(write_err)?;
    if durable {
        tmp.as_file().sync_all().map_err(write_err)?;
    }
    // Readable by workers running as other users.
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    // Closed before the rename: a close after it would raise a second
    // file event (IN_CLOSE_WRITE) under the record's name, and every
    // watching worker would read the record twice per publish.
    let tmp = tmp.into_temp_path();
    tmp.persist(path).map_err(|e| PublishError::Rename {
        path: path.to_path_buf(),
        source: e.error,
    })?;
    if durable {
        sync_dir(dir);
    }
    Ok(())
}

/// Fsyncs a directory so a rename in it is durable; some file systems
/// refuse (EINVAL), which is harmless: their renames are synchronous.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::sample;
    use crate::record::HeadRecord;

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

    #[test]
    fn publish_into_unwritable_place_names_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plainfile");
        std::fs::write(&file, b"x").unwrap();
        let e = publish(&file.join("head.json"), b"{}").unwrap_err();
        assert!(e.to_string().contains("plainfile"), "{e}");
    }
}
