//! File events on the head record's folder: a shortcut that makes workers
//! react before their next poll. Polling stays primary, so a host out of
//! inotify instances or watches (EMFILE / ENOSPC) degrades to polling
//! alone: logged once, shown in `status`, never fatal.
//!
//! Only changes are watched (close-after-write, renames in and out,
//! create, delete): never opens or reads. Every worker on a shared folder
//! reads the same record, and a watch for opens would wake all N watchers
//! on each of the N workers' reads (N² events per poll period).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use inotify::{Inotify, WatchMask};

/// Why file events are unavailable.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("inotify_init failed: {0} (fs.inotify.max_user_instances reached?)")]
    Init(#[source] std::io::Error),
    #[error("cannot watch {dir}: {source} (fs.inotify.max_user_watches reached?)")]
    Add {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the file-event thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// What file events this node uses (status `file_events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchState {
    /// Not wanted (ARGUS_FILE_EVENTS=off) or not tried yet.
    Off,
    Active,
    /// Wanted but unavailable: polling alone, with why.
    Degraded(String),
}

impl std::fmt::Display for WatchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchState::Off => f.write_str("off"),
            WatchState::Active => f.write_str("on"),
            WatchState::Degraded(why) => write!(f, "degraded to polling: {why}"),
        }
    }
}

/// The events that mean the watched file may have changed.
fn mask() -> WatchMask {
    WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::CREATE
        | WatchMask::DELETE
}

/// The event thread needs little: a read buffer and a callback.
const THREAD_STACK: usize = 64 * 1024;

/// A watch on the folder of one file; `on_change` runs on the watch's own
/// thread for every event naming the file. The thread ends at the first
/// event after `on_change` returns false.
pub struct FileWatch {
    _thread: std::thread::JoinHandle<()>,
}

impl FileWatch {
    /// Starts watching `file`'s folder.
    pub fn start<F>(file: &Path, mut on_change: F) -> Result<Self, WatchError>
    where
        F: FnMut() -> bool + Send + 'static,
    {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name: Option<OsString> = file.file_name().map(|n| n.to_os_string());
        let mut ino = Inotify::init().map_err(WatchError::Init)?;
        ino.watches()
            .add(&dir, mask())
            .map_err(|source| WatchError::Add { dir, source })?;
        let thread = std::thread::Builder::new()
            .name("file-events".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(events) = ino.read_events_blocking(&mut buf) else {
                        return;
                    };
                    let ours = events
                        .into_iter()
                        .any(|e| e.name.map(|n| n.to_os_string()) == name);
                    if ours && !on_change() {
                        return;
                    }
                }
            })
            .map_err(WatchError::Thread)?;
        Ok(Self { _thread: thread })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_rename_onto_the_file_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("head.json");
        std::fs::write(&file, "1").unwrap();
        let (tx, rx) = mpsc::channel();
        let _w = FileWatch::start(&file, move || tx.send(()).is_ok()).unwrap();
        let tmp = dir.path().join(".head.json.tmp");
        std::fs::write(&tmp, "2").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn one_publish_is_one_event_under_the_records_name() {
        // Regression: the publisher closed its temp file after renaming it,
        // so each publish raised MOVED_TO and CLOSE_WRITE under the
        // record's name, and every watching worker read the record twice.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("head.json");
        let mut ino = Inotify::init().unwrap();
        ino.watches().add(dir.path(), mask()).unwrap();
        argus_discovery::publish(&file, b"{}").unwrap();
        std::fs::remove_file(&file).unwrap();
        let mut buf = [0u8; 4096];
        let mut named = Vec::new();
        'read: loop {
            for e in ino.read_events_blocking(&mut buf).unwrap() {
                if e.name == Some(std::ffi::OsStr::new("head.json")) {
                    if e.mask.contains(inotify::EventMask::DELETE) {
                        break 'read;
                    }
                    named.push(e.mask);
                }
            }
        }
        assert_eq!(named, vec![inotify::EventMask::MOVED_TO], "{named:?}");
    }

    #[test]
    fn opens_and_reads_are_not_watched() {
        // Every worker reads the shared record: watching reads would wake
        // all N watchers on each read.
        assert!(!mask().intersects(WatchMask::OPEN | WatchMask::ACCESS | WatchMask::CLOSE_NOWRITE));
    }

    #[test]
    fn a_missing_folder_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nope").join("head.json");
        let err = FileWatch::start(&file, || true).err().unwrap();
        assert!(matches!(err, WatchError::Add { .. }), "{err}");
    }
}
