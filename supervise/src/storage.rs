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
//!
//! The thread writes as the agent's writer identity (ARGUS_AGENT_USER,
//! [`argus_discovery::trust::agent`]): it switches its own fsuid/fsgid
//! first thing, so it has no CAP_DAC_OVERRIDE/CAP_FOWNER for file checks
//! (a folder another user owns is EACCES), and on NFS with root squash the
//! server sees that uid. Every path it opens goes through
//! [`argus_discovery::trust`] (R-SEC-2).

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argus_discovery::trust::Identity;

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
    /// Starts the storage thread as the agent's writer identity.
    pub fn start() -> Self {
        Self::start_as(argus_discovery::trust::agent())
    }

    /// Starts the storage thread with the file-system identity `id`; if
    /// the thread cannot take it, it serves nothing (every call is
    /// [`StorageError::Gone`]): never a write as root instead.
    pub fn start_as(id: Identity) -> Self {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("storage".into())
            .spawn(move || {
                if let Err(e) = argus_discovery::trust::become_identity(id) {
                    tracing::error!(error = %e, "the storage thread cannot take the agent's identity");
                    return;
                }
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

    /// R-SEC-2: the storage thread, started by root with another writer
    /// identity, has no CAP_DAC_OVERRIDE for file checks: it cannot write
    /// a root-owned 0755 folder, and what it writes in its own folder is
    /// owned by it. Needs root (CI runs tests as root).
    #[test]
    fn the_storage_thread_writes_as_the_agent_identity_only() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if Identity::current().uid != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root_owned = t.path().join("root-owned");
        std::fs::create_dir(&root_owned).unwrap();
        std::fs::set_permissions(&root_owned, std::fs::Permissions::from_mode(0o755)).unwrap();
        let own = t.path().join("own");
        std::fs::create_dir(&own).unwrap();
        std::os::unix::fs::chown(&own, Some(4242), Some(4243)).unwrap();
        let s = Storage::start_as(Identity {
            uid: 4242,
            gid: 4243,
        });
        let (a, b) = (root_owned.join("x"), own.join("y"));
        let wrote = s
            .run("write", Duration::from_secs(30), move || {
                (
                    std::fs::write(&a, b"x").map_err(|e| e.kind()),
                    std::fs::write(&b, b"y").map_err(|e| e.kind()),
                )
            })
            .unwrap();
        assert_eq!(wrote.0, Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(wrote.1, Ok(()));
        assert!(!root_owned.join("x").exists());
        let m = std::fs::metadata(own.join("y")).unwrap();
        assert_eq!((m.uid(), m.gid()), (4242, 4243));
        // The caller's own identity is unchanged (per-thread).
        std::fs::write(root_owned.join("z"), b"z").unwrap();
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
