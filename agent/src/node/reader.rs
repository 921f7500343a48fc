//! The worker's reads of the head record, on their own thread.
//!
//! Why a thread of its own rather than the storage thread: the read must
//! never block the loop (a hung NFS mount, issue 9.6), and a poll that the
//! loop asks for and then waits on costs three wake-ups (the loop's timer,
//! the storage thread, the loop again) on every node, every poll period.
//! Here the reader keeps the poll timer itself and file events nudge it
//! directly: a poll costs the reader's wake-up and one event to the loop,
//! which is most of an idle worker's CPU on a thousand nodes
//! (docs/scale.md).
//!
//! A read that hangs keeps the thread (it is stuck in the kernel); the loop
//! sees it with [`RecordReader::stuck`] and treats it as a transient error
//! (R-WRK-4). When the read returns, polling goes on.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use argus_discovery::{read_record, HeadRecord, ReadError};

use super::Event;

/// What one read of the record gave: the record and its bytes, or why not.
pub type ReadResult = Result<(HeadRecord, Vec<u8>), ReadError>;

/// A handle to the reader thread; dropping it ends the thread.
pub(super) struct RecordReader {
    nudge: Sender<()>,
    in_flight: Arc<Mutex<Option<Instant>>>,
}

impl RecordReader {
    /// Starts reading `path` at once and then every `every`, and whenever
    /// nudged; each result goes to `events` as [`Event::Record`].
    pub(super) fn start(
        path: PathBuf,
        every: Duration,
        events: Sender<Event>,
    ) -> std::io::Result<Self> {
        let (nudge, nudged) = mpsc::channel::<()>();
        let in_flight = Arc::new(Mutex::new(None));
        let busy = in_flight.clone();
        std::thread::Builder::new()
            .name("record-reader".into())
            .spawn(move || {
                let mut next = Instant::now();
                loop {
                    match nudged.recv_timeout(next.saturating_duration_since(Instant::now())) {
                        // Several nudges (a burst of file events): one read.
                        Ok(()) => while nudged.try_recv().is_ok() {},
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    *busy.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                    let read = read_record(&path);
                    *busy.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    next = Instant::now() + every;
                    if events.send(Event::Record(Box::new(read))).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self { nudge, in_flight })
    }

    /// Returns a handle that asks for a read now (file events use it).
    pub(super) fn nudger(&self) -> Sender<()> {
        self.nudge.clone()
    }

    /// Returns since when the read under way has been running, if one is.
    pub(super) fn reading_since(&self) -> Option<Instant> {
        *self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_at_once_on_a_nudge_and_every_period() {
        let d = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let r =
            RecordReader::start(d.path().join("head.json"), Duration::from_secs(3600), tx).unwrap();
        let next = || match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            Event::Record(read) => read,
            other => panic!("unexpected {other:?}"),
        };
        assert!(
            next().unwrap_err().is_missing(),
            "the first read is at once"
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "then not before the period"
        );
        r.nudger().send(()).unwrap();
        assert!(next().unwrap_err().is_missing(), "a nudge reads at once");
        assert_eq!(r.reading_since(), None);
    }
}
