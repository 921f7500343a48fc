//! Shared-storage I/O off the node's event loop.
//!
//! Why: the discovery record lives on NFS/GPFS, where an `open`, `read`,
//! `rename` or `fsync` can block for minutes when the server hangs. The
//! node's one event loop also handles signals and the stop, so it must never
//! wait on storage without a bound. Every storage operation runs on one
//! dedicated thread; the loop waits for it at most a given time.
//!
//! A timed-out operation keeps the thread (it is stuck in the kernel and
//! cannot be cancelled); while it is stuck, further calls fail at once with
//! [`StorageError::Busy`] instead of queueing behind it, so a hung mount
//! costs the loop one timeout, not one per tick. When the stuck call
//! returns, the thread serves again.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why a storage operation gave no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StorageError {
    /// This call waited its whole bound.
    #[error("{op} did not finish within {after:?} (shared storage hung?)")]
    TimedOut { op: &'static str, after: Duration },
    /// An earlier call is still stuck, so this one was not started.
    #[error("{op} not started: {stuck} has been stuck for {for_s:.1} s (shared storage hung?)")]
    Busy {
        op: &'static str,
        stuck: &'static str,
        for_s: f64,
    },
    /// The storage thread could not be started or died.
    #[error("{op} not started: the storage thread is gone")]
    Gone { op: &'static str },
}

/// The operation running now, if any, and since when.
type InFlight = Arc<Mutex<Option<(&'static str, Instant)>>>;

/// A handle to the storage thread; cheap to clone.
#[derive(Clone)]
pub struct Storage {
    tx: Option<Sender<Job>>,
    in_flight: InFlight,
}

impl Storage {
    /// Starts the storage thread.
    pub fn start() -> Self {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("storage".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        let tx = match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the storage thread");
                None
            }
        };
        Self {
            tx,
            in_flight: Arc::new(Mutex::new(None)),
        }
    }

    /// Runs `f` on the storage thread and waits at most `timeout` for its
    /// result. `op` names the operation in errors and logs.
    pub fn run<T, F>(&self, op: &'static str, timeout: Duration, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let Some(tx) = &self.tx else {
            return Err(StorageError::Gone { op });
        };
        {
            let mut slot = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((stuck, since)) = *slot {
                return Err(StorageError::Busy {
                    op,
                    stuck,
                    for_s: since.elapsed().as_secs_f64(),
                });
            }
            *slot = Some((op, Instant::now()));
        }
        let (done_tx, done_rx): (SyncSender<T>, Receiver<T>) = mpsc::sync_channel(1);
        let in_flight = self.in_flight.clone();
        let job: Job = Box::new(move || {
            let out = f();
            *in_flight.lock().unwrap_or_else(|e| e.into_inner()) = None;
            // The caller may have given up: then the result is dropped.
            let _ = done_tx.try_send(out);
        });
        if tx.send(job).is_err() {
            *self.in_flight.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Err(StorageError::Gone { op });
        }
        match done_rx.recv_timeout(timeout) {
            Ok(out) => Ok(out),
            Err(RecvTimeoutError::Timeout) => Err(StorageError::TimedOut { op, after: timeout }),
            Err(RecvTimeoutError::Disconnected) => Err(StorageError::Gone { op }),
        }
    }

    /// Returns the operation stuck on the thread and for how long, if any
    /// has run longer than `longer_than`.
    pub fn stuck(&self, longer_than: Duration) -> Option<(&'static str, Duration)> {
        let slot = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        slot.and_then(|(op, since)| {
            let d = since.elapsed();
            (d > longer_than).then_some((op, d))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn returns_the_result_of_a_quick_operation() {
        let s = Storage::start();
        assert_eq!(s.run("add", Duration::from_secs(5), || 2 + 2), Ok(4));
        assert_eq!(s.stuck(Duration::ZERO), None);
    }

    #[test]
    fn a_hung_operation_times_out_then_later_calls_fail_fast_until_it_returns() {
        let s = Storage::start();
        let release = Arc::new(AtomicBool::new(false));
        let r = release.clone();
        let err = s
            .run("hang", Duration::from_millis(50), move || {
                while !r.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
            .unwrap_err();
        assert!(
            matches!(err, StorageError::TimedOut { op: "hang", .. }),
            "{err}"
        );

        let started = Instant::now();
        let err = s.run("next", Duration::from_secs(30), || 1).unwrap_err();
        assert!(
            matches!(
                err,
                StorageError::Busy {
                    op: "next",
                    stuck: "hang",
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a busy call must not wait"
        );
        assert_eq!(s.stuck(Duration::ZERO).map(|(op, _)| op), Some("hang"));

        release.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.stuck(Duration::ZERO).is_some() {
            assert!(
                Instant::now() < deadline,
                "the released operation never finished"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(s.run("after", Duration::from_secs(30), || 7), Ok(7));
    }

    #[test]
    fn errors_name_the_operation() {
        let e = StorageError::Busy {
            op: "publish head record",
            stuck: "read head record",
            for_s: 3.0,
        };
        assert_eq!(
            e.to_string(),
            "publish head record not started: read head record has been stuck for 3.0 s (shared storage hung?)"
        );
    }
}
