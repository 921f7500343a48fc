//! Atomic publish (R-HEAD-2): a uniquely named temp file in the same
//! directory, fsync, rename over the target, fsync the directory. A reader
//! sees the old bytes or the new bytes, never a mix.

use std::io::Write;
use std::path::{Path, PathBuf};

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

    #[test]
    fn publish_into_unwritable_place_names_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plainfile");
        std::fs::write(&file, b"x").unwrap();
        let e = publish(&file.join("head.json"), b"{}").unwrap_err();
        assert!(e.to_string().contains("plainfile"), "{e}");
    }
}
