//! The worker's reads of the head record, on their own thread.
//!
//! Why a thread of its own: the read must never block the loop (a hung NFS
//! mount, issue 9.6), and an idle worker's CPU is mostly wake-ups (on a
//! thousand nodes, docs/scale.md). The reader keeps the poll timer and the
//! file-event watch itself: it blocks in one `poll(2)` on the inotify
//! descriptor with the next poll's deadline as timeout, so a poll or a
//! change costs the reader's wake-up and one event to the loop, nothing
//! else.
//!
//! File events are set up here too, after a read (while the storage
//! answers) once the record's folder exists; when the host is out of
//! inotify instances or watches the reader polls alone and says so once
//! ([`Event::FileEvents`]).
//!
//! A read that hangs keeps the thread (it is stuck in the kernel); the loop
//! sees it with [`RecordReader::reading_since`] and treats it as a
//! transient error (R-WRK-4). When the read returns, polling goes on.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use argus_discovery::{HeadRecord, ReadError, RecordFile};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::Event;
use argus_supervise::watch::{DirWatch, WatchState};

/// What one read of the record gave: the record and its bytes, or why not.
pub type ReadResult = Result<(HeadRecord, Vec<u8>), ReadError>;

/// A handle to the reader thread; dropping it ends the thread.
pub(super) struct RecordReader {
    /// Closing it (drop) wakes the thread with POLLHUP on the read end.
    _cancel: OwnedFd,
    in_flight: Arc<Mutex<Option<Instant>>>,
}

impl RecordReader {
    /// Starts reading `path` at once and then every `every`, and, when
    /// `file_events`, whenever the file changes; each result goes to
    /// `events` as [`Event::Record`].
    pub(super) fn start(
        path: PathBuf,
        every: Duration,
        file_events: bool,
        events: Sender<Event>,
    ) -> std::io::Result<Self> {
        let in_flight = Arc::new(Mutex::new(None));
        let busy = in_flight.clone();
        let (cancelled, cancel) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        std::thread::Builder::new()
            .name("record-reader".into())
            .spawn(move || {
                // Reads as the agent's writer identity, like the storage
                // thread (the files it trusts are that identity's).
                if let Err(e) =
                    argus_discovery::trust::become_identity(argus_discovery::trust::agent())
                {
                    tracing::error!(error = %e, "the record reader cannot take the agent's identity");
                    return;
                }
                let mut watch: Option<DirWatch> = None;
                // Set up once: after a failure the reader polls alone.
                let mut watch_tried = !file_events;
                let mut next = Instant::now();
                let mut record = RecordFile::new(path.clone());
                loop {
                    match wait(&cancelled, watch.as_mut(), next) {
                        Wake::Cancelled => return,
                        Wake::Changed | Wake::Due => {}
                        Wake::Nothing => continue,
                    }
                    *busy.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                    let read = record.read();
                    *busy.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    next = Instant::now() + every;
                    if !watch_tried && path.parent().is_some_and(|d| d.is_dir()) {
                        watch_tried = true;
                        let state = match DirWatch::start(&path) {
                            Ok(w) => {
                                watch = Some(w);
                                WatchState::Active
                            }
                            Err(e) => WatchState::Degraded(e.to_string()),
                        };
                        if events.send(Event::FileEvents(state)).is_err() {
                            return;
                        }
                    }
                    if events.send(Event::Record(Box::new(read))).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            _cancel: cancel,
            in_flight,
        })
    }

    /// Returns since when the read under way has been running, if one is.
    pub(super) fn reading_since(&self) -> Option<Instant> {
        *self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why the reader woke.
enum Wake {
    Cancelled,
    /// The record's folder reported a change of the record.
    Changed,
    /// The poll deadline passed.
    Due,
    /// Events about other files, or an interrupted wait: wait again.
    Nothing,
}

/// Blocks until `next`, a change of the record (when watched), or the
/// handle's drop.
fn wait(cancelled: &OwnedFd, watch: Option<&mut DirWatch>, next: Instant) -> Wake {
    let left = next.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Wake::Due;
    }
    // Round up: a timeout that ends a little early would wake twice.
    let ms = left.as_micros().div_ceil(1000);
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    let mut fds = vec![PollFd::new(cancelled.as_fd(), PollFlags::POLLIN)];
    if let Some(w) = &watch {
        fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
    }
    match poll(&mut fds, timeout) {
        Ok(0) => return Wake::Nothing,
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Wake::Nothing,
        Err(e) => {
            // Never seen; without a working poll, sleep to the deadline.
            tracing::warn!(error = %e, "the record reader's poll failed; sleeping instead");
            std::thread::sleep(left);
            return Wake::Due;
        }
    }
    let ready = |p: &PollFd<'_>| p.revents().is_some_and(|r| !r.is_empty());
    if ready(&fds[0]) {
        return Wake::Cancelled;
    }
    let changed = fds.get(1).is_some_and(ready);
    drop(fds);
    match watch {
        Some(w) if changed => {
            if w.drain() {
                Wake::Changed
            } else {
                Wake::Nothing
            }
        }
        _ => Wake::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn next_read(rx: &mpsc::Receiver<Event>) -> ReadResult {
        loop {
            match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
                Event::Record(read) => return *read,
                Event::FileEvents(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn reads_at_once_on_a_change_and_every_period() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("head.json");
        let (tx, rx) = mpsc::channel();
        let r = RecordReader::start(file.clone(), Duration::from_secs(3600), true, tx).unwrap();
        assert!(
            next_read(&rx).unwrap_err().is_missing(),
            "the first read is at once"
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "then not before the period"
        );
        std::fs::write(d.path().join("other.json"), b"x").unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "another file's change reads nothing"
        );
        argus_discovery::publish(&file, b"garbage").unwrap();
        assert!(
            matches!(next_read(&rx), Err(ReadError::Bad { .. })),
            "a change of the record reads at once"
        );
        assert_eq!(r.reading_since(), None);
    }

    #[test]
    fn without_file_events_it_polls_on_its_timer_and_ends_on_drop() {
        let d = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let r = RecordReader::start(
            d.path().join("head.json"),
            Duration::from_millis(50),
            false,
            tx,
        )
        .unwrap();
        for _ in 0..3 {
            assert!(next_read(&rx).unwrap_err().is_missing());
        }
        drop(r);
        // The thread ends: its sender is dropped and the channel closes.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                _ if Instant::now() > until => panic!("the reader did not end"),
                _ => {}
            }
        }
    }
}
