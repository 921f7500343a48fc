//! The node's one container-janitor thread (R-SHIM-4): every 30 s it
//! removes engine containers whose shim died; at stop it removes every
//! container this node owns, on request, while Ray is being stopped.
//!
//! One thread, fed by a channel: a sweep that hangs on the Docker daemon
//! delays the next one instead of piling up threads.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::time::Duration;

use tracing::{info, warn};

use crate::shim::janitor::{self, JanitorScope};

/// How often dead shims' containers are swept.
const EVERY: Duration = Duration::from_secs(30);

type Outcome = Result<usize, String>;

/// A handle to the janitor thread.
pub(super) struct Janitor {
    tx: Option<Sender<SyncSender<Outcome>>>,
}

impl Janitor {
    /// Starts the thread; its first sweep of dead shims is after 30 s.
    pub(super) fn start() -> Self {
        let (tx, rx) = mpsc::channel::<SyncSender<Outcome>>();
        let spawned = std::thread::Builder::new()
            .name("janitor".into())
            .spawn(move || run(rx));
        match spawned {
            Ok(_) => Self { tx: Some(tx) },
            Err(e) => {
                warn!(error = %e, "cannot start the container janitor");
                Self { tx: None }
            }
        }
    }

    /// Asks for the removal of every container this node owns; the answer
    /// arrives on the returned receiver (the caller bounds the wait).
    pub(super) fn remove_all(&self) -> Option<Receiver<Outcome>> {
        let (done, rx) = mpsc::sync_channel(1);
        self.tx.as_ref()?.send(done).ok()?;
        Some(rx)
    }
}

fn run(rx: Receiver<SyncSender<Outcome>>) {
    loop {
        match rx.recv_timeout(EVERY) {
            Ok(done) => {
                let out = sweep(JanitorScope::AllOwned);
                let _ = done.try_send(out);
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = sweep(JanitorScope::DeadShims);
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn sweep(scope: JanitorScope) -> Outcome {
    match janitor::sweep_blocking(scope) {
        Ok(0) => Ok(0),
        Ok(n) => {
            info!(removed = n, ?scope, "removed engine containers");
            Ok(n)
        }
        Err(e) => {
            let e = format!("{e:#}");
            warn!(error = %e, ?scope, "container janitor failed");
            Err(e)
        }
    }
}
