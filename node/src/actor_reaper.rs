//! Reaps the workers of actors that Ray 2.53's GCS holds dead but never
//! killed (ray-project/ray#63763, fixed upstream after 2.53 by PR #63764).
//!
//! A GCS restarted with fault tolerance restores the actors that were alive
//! from Redis but not the address of the raylet each one runs on. A later
//! `ray.kill` of such an actor (Serve kills a replica on every scale-down,
//! deleted application and `serve shutdown`) marks it DEAD and sends its
//! node nothing ("Not sending KillLocalActorRequest because Actor has not
//! been assigned a lease" in the GCS log): the worker process runs on for
//! good, holding its resources in the raylet, and for a replica in an engine
//! image its engine container (with a real vLLM: a GPU) stays too.
//!
//! So a worker whose Ray rode a head restart through runs
//! `/opt/argus/reap_dead_actors.py <gcs address>` every 30 s, as the Ray
//! user, on its own thread: one GCS call lists the DEAD actors, and those
//! whose worker still runs on this node (checked by the worker's own log file
//! and process title) get SIGKILL; the raylet frees their resources and the
//! podman broker removes their engine containers. It stops when this node's
//! Ray is restarted (a new Ray has no such actors) and does nothing where
//! the script is missing (outside the node image).

use std::path::Path;
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{debug, info, warn};

use argus_supervise::privs::{confine, RayUser};
use argus_supervise::{reaper, Stop};

/// Where the node image puts the script (Dockerfile.node).
pub(super) const SCRIPT: &str = "/opt/argus/reap_dead_actors.py";
/// How often it runs while armed.
const EVERY: Duration = Duration::from_secs(30);
/// A run that takes longer is killed (the GCS may be down again).
const TIMEOUT: Duration = Duration::from_secs(30);

/// What the reaper thread is told.
enum Msg {
    /// Reap against this GCS every [`EVERY`] (`None`: stay idle).
    Arm(Option<String>),
    Stop,
}

/// A handle to the reaper thread.
pub(super) struct ActorReaper {
    tx: mpsc::Sender<Msg>,
    /// The GCS address it was last armed with.
    armed: Mutex<Option<String>>,
}

impl ActorReaper {
    /// Starts the thread (asleep until [`ActorReaper::arm`]: a disarmed
    /// reaper never wakes); it ends when `stop` is requested.
    pub(super) fn start(user: Option<RayUser>, env: Vec<(String, String)>, stop: &Stop) -> Self {
        let (tx, rx) = mpsc::channel::<Msg>();
        let on_stop = tx.clone();
        stop.on_request(move || {
            let _ = on_stop.send(Msg::Stop);
        });
        let stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("actor-reaper".into())
            .spawn(move || {
                let mut gcs: Option<String> = None;
                loop {
                    let msg = match &gcs {
                        Some(_) => rx.recv_timeout(EVERY),
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match msg {
                        Ok(Msg::Arm(a)) => gcs = a,
                        Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                        Err(RecvTimeoutError::Timeout) => {
                            if let Some(a) = &gcs {
                                reap_once(Path::new(SCRIPT), a, user.as_ref(), &env, &stop);
                            }
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the dead-actor reaper");
        }
        Self {
            tx,
            armed: Mutex::new(None),
        }
    }

    /// Runs the reaper every 30 s against the GCS at `address` (after a
    /// ride-through), or stops it (`None`: a new Ray).
    pub(super) fn arm(&self, address: Option<&str>) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if armed.as_deref() != address {
            debug!(?address, "dead-actor reaper armed for this gcs (None: off)");
            *armed = address.map(String::from);
            let _ = self.tx.send(Msg::Arm(armed.clone()));
        }
    }
}

/// Runs the script once; logs what it killed or why it failed.
fn reap_once(
    script: &Path,
    gcs: &str,
    user: Option<&RayUser>,
    env: &[(String, String)],
    stop: &Stop,
) {
    if !script.exists() {
        return;
    }
    let mut cmd = Command::new("python");
    cmd.arg(script).arg(gcs);
    confine(&mut cmd, user);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    match reaper::spawn_captured(&mut cmd, TIMEOUT, stop) {
        Ok(c) if c.exit.is_some_and(|e| e.success()) => {
            let out = String::from_utf8_lossy(&c.stdout);
            let line = out.lines().last().unwrap_or_default();
            let killed = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["killed"].as_array().cloned())
                .unwrap_or_default();
            if killed.is_empty() {
                debug!(gcs, "no worker of a dead actor left on this node");
            } else {
                info!(gcs, killed = %serde_json::Value::Array(killed),
                    "killed workers of actors the gcs holds dead (ray-project/ray#63763)");
            }
        }
        Ok(c) => {
            let err = String::from_utf8_lossy(&c.stderr);
            warn!(gcs, exit = ?c.exit, timed_out = c.timed_out,
                stderr = err.lines().last().unwrap_or_default(),
                "the dead-actor reaper failed; trying again in 30 s");
        }
        Err(e) => warn!(error = %e, script = %script.display(), "cannot run the dead-actor reaper"),
    }
}
