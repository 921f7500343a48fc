//! The node's one container-janitor thread (R-SHIM-4): every 30 s it
//! removes engine containers whose shim died; when the stop handle fires
//! it removes every container this node owns, while Ray is being stopped,
//! and once more when the node asks, after every podman handler is gone:
//! a call under way at the stop may create its container after the first
//! removal listed the node's containers (seen in CI: a task's retry
//! started an engine 2 s before its node stopped, and it outlived it).
//!
//! Every 30 s it also kills the Ray user's processes that PID 1 adopted
//! and did not start (R-SEC-9: a job's double-forked daemon): its parent
//! died, so no job or Ray process owns it any more.
//!
//! One thread, fed by a channel: a sweep that hangs on the Docker daemon
//! delays the next one instead of piling up threads.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use argus_podman::janitor::{self, JanitorScope};
use argus_supervise::reaper;
use argus_supervise::tree::{self, ProcTree};
use argus_supervise::Stop;

/// How often dead shims' containers are swept.
const EVERY: Duration = Duration::from_secs(30);

type Outcome = Result<usize, String>;

/// A handle to the janitor thread.
pub(super) struct Janitor {
    /// The outcomes of the removals at stop.
    removed: Option<Receiver<Outcome>>,
    /// Asks for the last removal.
    last: Option<mpsc::Sender<()>>,
}

impl Janitor {
    /// Starts the thread; it sweeps dead shims' containers at once (those
    /// a previous run of this node left when it was killed: their shims
    /// died with it) and then every 30 s. When
    /// `stop` is requested it removes every container this node owns at
    /// once, while the node stops Ray, and ends.
    /// `ray_uid`: the Ray user, when it is not the agent's own (its
    /// adopted processes are killed at each round).
    pub(super) fn start(stop: &Stop, ray_uid: Option<u32>) -> Self {
        let (wake, woken) = mpsc::channel::<()>();
        let last = wake.clone();
        let (done, removed) = mpsc::sync_channel(2);
        // Cuts a periodic sweep short at the stop, so that the removal of
        // everything owned starts at once.
        let cut = CancellationToken::new();
        let cut_short = cut.clone();
        let spawned = std::thread::Builder::new()
            .name("janitor".into())
            .spawn(move || run(woken, done, cut, ray_uid));
        match spawned {
            Ok(_) => {
                stop.on_request(move || {
                    cut_short.cancel();
                    let _ = wake.send(());
                });
                Self {
                    removed: Some(removed),
                    last: Some(last),
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot start the container janitor");
                Self {
                    removed: None,
                    last: None,
                }
            }
        }
    }

    /// Waits at most `timeout` for the removal at stop; returns false if
    /// and only if it was not confirmed in time.
    pub(super) fn wait_removed(&self, timeout: Duration) -> bool {
        self.removed
            .as_ref()
            .is_none_or(|rx| rx.recv_timeout(timeout).is_ok())
    }

    /// Removes every container this node owns once more, after the stop
    /// sweep ended every podman handler (none can create one any more);
    /// waits at most `timeout`, as [`Janitor::wait_removed`] (call it
    /// after that: the outcomes come in order).
    pub(super) fn remove_last(&self, timeout: Duration) -> bool {
        if let Some(last) = &self.last {
            let _ = last.send(());
        }
        self.wait_removed(timeout)
    }
}

/// The thread: a sweep of dead shims every [`EVERY`] until the stop (a
/// message on `woken`), then one removal of everything owned, and one more
/// on the next message (the last, once no handler is left).
fn run(
    woken: Receiver<()>,
    done: SyncSender<Outcome>,
    cut: CancellationToken,
    ray_uid: Option<u32>,
) {
    let mut tree = ProcTree::new();
    let _ = sweep(JanitorScope::DeadShims, &cut);
    loop {
        match woken.recv_timeout(EVERY) {
            Ok(()) => {
                let all = sweep(JanitorScope::AllOwned, &CancellationToken::new());
                let _ = done.try_send(all);
                if woken.recv().is_ok() {
                    let last = sweep(JanitorScope::AllOwned, &CancellationToken::new());
                    let _ = done.try_send(last);
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(uid) = ray_uid {
                    let killed = tree::kill_adopted(&mut tree, uid, reaper::is_own_child);
                    if killed > 0 {
                        info!(
                            killed,
                            "killed the ray user's processes that no job owns any more"
                        );
                    }
                }
                let _ = sweep(JanitorScope::DeadShims, &cut);
            }
            // The stop handle is gone without a stop: nothing to remove.
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
fn sweep(scope: JanitorScope, cut: &CancellationToken) -> Outcome {
    match janitor::sweep_blocking(scope, cut) {
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
