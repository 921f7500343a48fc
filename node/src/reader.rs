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
    ///
    /// A read that finds the same bytes as the last one sent is sent only
    /// once the record has been unchanged for `quiet_after` (see
    /// [`Forward`]): until then it tells the loop nothing new.
    pub(super) fn start(
        path: PathBuf,
        every: Duration,
        quiet_after: Duration,
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
                let mut forward = Forward::new(quiet_after);
                loop {
                    match wait(&cancelled, watch.as_mut(), next) {
                        Wake::Cancelled => return,
                        Wake::Changed | Wake::Due => {}
                        Wake::Nothing => continue,
                    }
                    let started = Instant::now();
                    *busy.lock().unwrap_or_else(PoisonError::into_inner) = Some(started);
                    let read = record.read();
                    // The folder's stat and the watch's setup touch the
                    // storage too: a hang there is a hung read as well (a
                    // run beside a busy loop froze the mount between the
                    // read and the stat, and the loop never saw it).
                    let mut watched = None;
                    if !watch_tried && path.parent().is_some_and(|d| d.is_dir()) {
                        watch_tried = true;
                        watched = Some(match DirWatch::start(&path) {
                            Ok(w) => {
                                watch = Some(w);
                                WatchState::Active
                            }
                            Err(e) => WatchState::Degraded(e.to_string()),
                        });
                    }
                    *busy.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    next = Instant::now() + every;
                    if let Some(state) = watched {
                        if events.send(Event::FileEvents(state)).is_err() {
                            return;
                        }
                    }
                    // A read the loop may have judged hung (STORAGE_BOUND)
                    // is news whatever it found: it ends the "hung" state.
                    let slow = started.elapsed() >= crate::STORAGE_BOUND;
                    if !forward.wants(&read, Instant::now()) && !slow {
                        continue;
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

/// Which reads the loop hears of. An idle worker's reads mostly find the
/// bytes the last one found (a poll between two refreshes of the head),
/// and each one sent wakes the loop: half of an idle worker's wake-ups
/// (docs/operations.md, "The cost of idle agents"). Sent: every failed
/// read, every change, the first success after a failure (the loop marks
/// the storage healthy again), and, once the record has not changed for
/// `quiet_after`, every read again: from then on the loop judges a quiet
/// record (it probes the head's GCS after `max(poll, TTL/4)` of quiet, the
/// worker passes that; the lease expires after the TTL).
struct Forward {
    quiet_after: Duration,
    last: Option<Vec<u8>>,
    changed_at: Instant,
}

impl Forward {
    fn new(quiet_after: Duration) -> Self {
        Self {
            quiet_after,
            last: None,
            changed_at: Instant::now(),
        }
    }

    /// Whether the loop is told of `read`, made at `now`.
    fn wants(&mut self, read: &ReadResult, now: Instant) -> bool {
        match read {
            Err(_) => {
                self.last = None;
                true
            }
            Ok((_, raw)) if self.last.as_deref() != Some(raw.as_slice()) => {
                self.last = Some(raw.clone());
                self.changed_at = now;
                true
            }
            Ok(_) => now.saturating_duration_since(self.changed_at) >= self.quiet_after,
        }
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

    /// The loop hears of changes and failures at once, of the same bytes
    /// again only once they have been quiet for `quiet_after`.
    #[test]
    fn the_same_bytes_again_are_sent_only_once_the_record_is_quiet() {
        use argus_discovery::ReadError;
        let rec = |seq: u64| {
            let now = std::time::SystemTime::now();
            let r = HeadRecord {
                gcs_ft: false,
                schema_version: argus_discovery::SCHEMA_VERSION,
                cluster_name: "argus-ray".into(),
                head_ip: "10.0.0.1".into(),
                gcs_port: 6379,
                dashboard_port: 8265,
                job_server_url: "http://10.0.0.1:8265".into(),
                updated_at: argus_discovery::record::rfc3339(now),
                expires_at: argus_discovery::record::rfc3339(now),
                instance_id: "i1".into(),
                holder_id: "h".into(),
                generation: 1,
                seq,
                state: argus_discovery::HeadState::Running,
                ttl_s: 60.0,
            };
            let raw = r.to_bytes();
            Ok((r, raw)) as ReadResult
        };
        let missing = || -> ReadResult {
            Err(ReadError::Missing {
                path: PathBuf::from("/x/head.json"),
            })
        };
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut f = Forward::new(Duration::from_secs(15));
        assert!(f.wants(&rec(1), at(0)), "the first read");
        assert!(!f.wants(&rec(1), at(5_000)), "a poll between refreshes");
        assert!(f.wants(&rec(2), at(10_000)), "a refresh");
        assert!(!f.wants(&rec(2), at(24_999)), "quiet, not long enough");
        assert!(f.wants(&rec(2), at(25_000)), "quiet for 15 s");
        assert!(f.wants(&rec(2), at(30_000)), "and every read after");
        assert!(f.wants(&missing(), at(35_000)), "a failure");
        assert!(
            f.wants(&rec(2), at(40_000)),
            "the same bytes after a failure"
        );
        assert!(!f.wants(&rec(2), at(45_000)));
    }

    #[test]
    fn reads_at_once_on_a_change_and_every_period() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("head.json");
        let (tx, rx) = mpsc::channel();
        let r = RecordReader::start(
            file.clone(),
            Duration::from_secs(3600),
            Duration::ZERO,
            true,
            tx,
        )
        .unwrap();
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
            Duration::ZERO,
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
