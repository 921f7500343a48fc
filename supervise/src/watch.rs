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
use std::os::fd::{AsFd, BorrowedFd};
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

/// A watch on the folder of one file, read without a thread of its own:
/// the worker's record reader polls [`DirWatch`]'s descriptor together
/// with its poll deadline (`node/reader.rs`), so a change wakes one thread,
/// which reads the record at once.
pub struct DirWatch {
    ino: Inotify,
    name: Option<OsString>,
}

impl DirWatch {
    /// Starts watching `file`'s folder.
    pub fn start(file: &Path) -> Result<Self, WatchError> {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = file.file_name().map(|n| n.to_os_string());
        let ino = Inotify::init().map_err(WatchError::Init)?;
        ino.watches()
            .add(&dir, mask())
            .map_err(|source| WatchError::Add { dir, source })?;
        Ok(Self { ino, name })
    }

    /// Reads every queued event without blocking; returns true if and
    /// only if one named the file.
    pub fn drain(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        let mut ours = false;
        while let Ok(events) = self.ino.read_events(&mut buf) {
            let mut any = false;
            for e in events {
                any = true;
                ours |= e.name.is_some_and(|n| Some(n) == self.name.as_deref());
            }
            if !any {
                break;
            }
        }
        ours
    }
}

impl AsFd for DirWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ino.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to `secs` for the watch's descriptor to become readable.
    fn readable(w: &DirWatch, secs: u16) -> bool {
        use nix::poll::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(w.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, secs * 1000).unwrap() == 1
    }

    #[test]
    fn a_rename_onto_the_file_is_seen_and_other_names_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("head.json");
        std::fs::write(&file, "1").unwrap();
        let mut w = DirWatch::start(&file).unwrap();
        assert!(!w.drain(), "nothing queued yet");
        std::fs::write(dir.path().join("other.json"), "x").unwrap();
        assert!(readable(&w, 10));
        assert!(!w.drain(), "another file's change is not ours");
        let tmp = dir.path().join(".head.json.tmp");
        std::fs::write(&tmp, "2").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        assert!(readable(&w, 10));
        assert!(w.drain(), "the rename onto the record is");
        assert!(!readable(&w, 0), "drained");
    }

    #[test]
    fn one_publish_is_one_event_in_the_watched_folder() {
        // Regressions: the publisher closed its temp file after renaming
        // it (MOVED_TO and CLOSE_WRITE under the record's name: two reads
        // per publish), and wrote its temp file in the watched folder
        // (create, close-after-write and move out of the temp file: three
        // more wake-ups of every watcher per publish).
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("head.json");
        // The first publish makes the staging folder (one event of its own).
        argus_discovery::publish_watched(&file, b"{}").unwrap();
        let mut ino = Inotify::init().unwrap();
        ino.watches().add(dir.path(), mask()).unwrap();
        argus_discovery::publish_watched(&file, b"{}").unwrap();
        std::fs::remove_file(&file).unwrap();
        let mut buf = [0u8; 4096];
        let mut seen = Vec::new();
        'read: loop {
            for e in ino.read_events_blocking(&mut buf).unwrap() {
                let name = e.name.map(|n| n.to_string_lossy().into_owned());
                if name.as_deref() == Some("head.json")
                    && e.mask.contains(inotify::EventMask::DELETE)
                {
                    break 'read;
                }
                seen.push((name, e.mask));
            }
        }
        assert_eq!(
            seen,
            vec![(Some("head.json".to_string()), inotify::EventMask::MOVED_TO)],
            "{seen:?}"
        );
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
        let err = DirWatch::start(&file).err().unwrap();
        assert!(matches!(err, WatchError::Add { .. }), "{err}");
    }
}
