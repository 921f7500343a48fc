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
//!
//! The same thread retires engine containers whose Ray worker was never
//! given work. Ray's raylet keeps idle workers while there are fewer of them
//! than free CPUs, whatever their runtime_env, so a worker it started for a
//! lease no one uses any more (a Serve replica stopped while its engine
//! container was starting; a lease granted to a GCS that then restarted)
//! keeps its engine container until Ray stops: after a rolling replacement
//! an old version's engine outlived the upgrade of its endpoint. While Ray
//! runs, every 30 s the thread lists the engine containers' workers titled
//! idle (`ray::IDLE`) in the node's PID namespace (from `/proc`, see
//! [`tree::idle_engine_workers`]); those it has not yet seen given work it
//! asks about with the same script, as the Ray user (`--idle-engines`: the
//! worker's id from its own log, its stats over gRPC), and one that was
//! idle in two rounds [`IDLE_FOR`] apart is asked to exit the way the
//! raylet retires an idle worker. A worker once given work is not asked
//! about again, and a node whose engines all serve runs no Python.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use argus_supervise::privs::{confine, RayUser};
use argus_supervise::tree::{self, EngineWorker};
use argus_supervise::{reaper, Stop};

/// Where the node image puts the script (Dockerfile.node).
pub(super) const SCRIPT: &str = "/opt/argus/reap_dead_actors.py";
/// How often it runs while armed.
const EVERY: Duration = Duration::from_secs(30);
/// A run that takes longer is killed (the GCS may be down again).
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long an engine's worker must have been seen idle, never given work,
/// before it is asked to exit (a worker the raylet just started for a lease
/// is given its task within a second of registering).
pub(super) const IDLE_FOR: Duration = Duration::from_secs(60);

/// What the reaper thread is told.
enum Msg {
    /// Reap dead actors against this GCS every [`EVERY`] (`None`: not).
    Arm(Option<String>),
    /// This node's Ray runs against this GCS (`None`: no Ray): watch its
    /// engines' idle workers every [`EVERY`].
    Joined(Option<String>),
    Stop,
}

/// A handle to the reaper thread.
pub(super) struct ActorReaper {
    tx: mpsc::Sender<Msg>,
    /// The GCS address it was last armed with.
    armed: Mutex<Option<String>>,
    /// The GCS it was last told this node's Ray runs against.
    joined: Mutex<Option<String>>,
}

/// What is known of each engine worker's use (pure: the thread's state).
#[derive(Debug, Default)]
pub(super) struct IdleWatch {
    seen: HashMap<EngineWorker, Seen>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Given work once: never asked about again.
    Used,
    /// Never given work, first seen so at this instant.
    Idle(Instant),
}

impl IdleWatch {
    /// The workers to ask about now, among those `present`, each with
    /// whether it may be asked to exit (idle since [`IDLE_FOR`] or more);
    /// forgets the workers that are gone.
    pub(super) fn asks(
        &mut self,
        now: Instant,
        present: &[EngineWorker],
    ) -> Vec<(EngineWorker, bool)> {
        self.seen.retain(|w, _| present.contains(w));
        present
            .iter()
            .filter_map(|w| match self.seen.get(w) {
                Some(Seen::Used) => None,
                Some(Seen::Idle(t)) => Some((*w, now.duration_since(*t) >= IDLE_FOR)),
                None => Some((*w, false)),
            })
            .collect()
    }

    /// Records what the script said of `w` ("used", "idle", "exited";
    /// anything else changes nothing).
    pub(super) fn record(&mut self, now: Instant, w: EngineWorker, state: &str) {
        match state {
            "used" => {
                self.seen.insert(w, Seen::Used);
            }
            "idle" => {
                self.seen.entry(w).or_insert(Seen::Idle(now));
            }
            "exited" => {
                self.seen.remove(&w);
            }
            _ => {}
        }
    }
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
                let mut joined: Option<String> = None;
                let mut watch = IdleWatch::default();
                // Engines' workers are told apart only from inside a node:
                // PID 1 of its own PID namespace, Ray as a user of its own
                // (elsewhere /proc is a host's, with other nodes' engines).
                let engines_uid = user
                    .as_ref()
                    .filter(|u| std::process::id() == 1 && !u.is_current())
                    .map(|u| u.uid);
                // One deadline for both duties, so that a message (an arm,
                // a rejoin) does not put the next round off.
                let mut next = Instant::now() + EVERY;
                loop {
                    let msg = if gcs.is_some() || joined.is_some() {
                        rx.recv_timeout(next.saturating_duration_since(Instant::now()))
                    } else {
                        rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    };
                    match msg {
                        Ok(Msg::Arm(a)) => gcs = a,
                        Ok(Msg::Joined(a)) => joined = a.filter(|_| engines_uid.is_some()),
                        Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                        Err(RecvTimeoutError::Timeout) => {
                            next = Instant::now() + EVERY;
                            if let Some(a) = &gcs {
                                reap_once(Path::new(SCRIPT), a, user.as_ref(), &env, &stop);
                            }
                            if let (Some(a), Some(uid)) = (&joined, engines_uid) {
                                let present = tree::idle_engine_workers(uid);
                                let asks = watch.asks(Instant::now(), &present);
                                if !asks.is_empty() {
                                    idle_round(
                                        Path::new(SCRIPT),
                                        a,
                                        &asks,
                                        &mut watch,
                                        user.as_ref(),
                                        &env,
                                        &stop,
                                    );
                                }
                            }
                        }
                    }
                    if gcs.is_none() && joined.is_none() {
                        next = Instant::now() + EVERY;
                    }
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the dead-actor reaper");
        }
        Self {
            tx,
            armed: Mutex::new(None),
            joined: Mutex::new(None),
        }
    }

    /// Watches the engines' idle workers of a Ray that runs against the GCS
    /// at `address` (`None`: this node runs no Ray).
    pub(super) fn joined(&self, address: Option<&str>) {
        let mut joined = self.joined.lock().unwrap_or_else(|e| e.into_inner());
        if joined.as_deref() != address {
            *joined = address.map(String::from);
            let _ = self.tx.send(Msg::Joined(joined.clone()));
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

/// How a run of the script went.
enum Run {
    /// It printed this JSON object last.
    Said(serde_json::Value),
    /// It failed: its exit, whether it timed out, its last stderr line.
    Failed(String),
    /// It is not there (outside the node image).
    Missing,
}

/// Runs `python <script> <args>` as the Ray user, with `env`, at most
/// [`TIMEOUT`].
fn run_script(
    script: &Path,
    args: &[String],
    user: Option<&RayUser>,
    env: &[(String, String)],
    stop: &Stop,
) -> Run {
    if !script.exists() {
        return Run::Missing;
    }
    let mut cmd = Command::new("python");
    cmd.arg(script).args(args);
    confine(&mut cmd, user);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    match reaper::spawn_captured(&mut cmd, TIMEOUT, stop) {
        Ok(c) if c.exit.is_some_and(|e| e.success()) => {
            let out = String::from_utf8_lossy(&c.stdout);
            let line = out.lines().last().unwrap_or_default();
            Run::Said(serde_json::from_str(line).unwrap_or_default())
        }
        Ok(c) => {
            let err = String::from_utf8_lossy(&c.stderr);
            Run::Failed(format!(
                "exit {:?}, timed out {}: {}",
                c.exit,
                c.timed_out,
                err.lines().last().unwrap_or_default()
            ))
        }
        Err(e) => Run::Failed(format!("cannot run {}: {e}", script.display())),
    }
}

/// Runs the dead-actor reaper once; logs what it killed or why it failed.
fn reap_once(
    script: &Path,
    gcs: &str,
    user: Option<&RayUser>,
    env: &[(String, String)],
    stop: &Stop,
) {
    match run_script(script, &[gcs.to_string()], user, env, stop) {
        Run::Said(v) => {
            let killed = v["killed"].as_array().cloned().unwrap_or_default();
            if killed.is_empty() {
                debug!(gcs, "no worker of a dead actor left on this node");
            } else {
                info!(gcs, killed = %serde_json::Value::Array(killed),
                    "killed workers of actors the gcs holds dead (ray-project/ray#63763)");
            }
        }
        Run::Failed(why) => {
            warn!(gcs, %why, "the dead-actor reaper failed; trying again in 30 s");
        }
        Run::Missing => {}
    }
}

/// Asks the script about `asks` once; records its answers in `watch` and
/// logs the workers it retired.
fn idle_round(
    script: &Path,
    gcs: &str,
    asks: &[(EngineWorker, bool)],
    watch: &mut IdleWatch,
    user: Option<&RayUser>,
    env: &[(String, String)],
    stop: &Stop,
) {
    let mut args = vec!["--idle-engines".to_string(), gcs.to_string()];
    args.extend(
        asks.iter()
            .map(|(w, may_exit)| format!("{}:{}", w.pid, u8::from(*may_exit))),
    );
    match run_script(script, &args, user, env, stop) {
        Run::Said(v) => {
            let now = Instant::now();
            for r in v["workers"].as_array().into_iter().flatten() {
                // Only the processes asked about (by pid) are recorded.
                let Some(w) = asks
                    .iter()
                    .map(|(w, _)| *w)
                    .find(|w| r["pid"].as_u64() == Some(u64::from(w.pid)))
                else {
                    continue;
                };
                let state = r["state"].as_str().unwrap_or_default();
                watch.record(now, w, state);
                if state == "exited" {
                    info!(
                        gcs,
                        pid = w.pid,
                        worker_id = r["worker_id"].as_str().unwrap_or_default(),
                        idle_s = IDLE_FOR.as_secs(),
                        "retired an engine container's ray worker that was never given work"
                    );
                }
            }
        }
        // The GCS may be down (a head restart): the next round asks again.
        Run::Failed(why) => debug!(gcs, %why, "the idle engine check failed; trying again in 30 s"),
        Run::Missing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(pid: u32, start: u64) -> EngineWorker {
        EngineWorker { pid, start }
    }

    #[test]
    fn an_engine_worker_exits_only_after_two_idle_answers_idle_for_apart() {
        let t0 = Instant::now();
        let mut watch = IdleWatch::default();
        let (a, b) = (w(10, 100), w(11, 100));
        let present = [a, b];
        // First sight: asked, never told to exit.
        assert_eq!(watch.asks(t0, &present), vec![(a, false), (b, false)]);
        watch.record(t0, a, "idle");
        watch.record(t0, b, "used");
        // b was given work: not asked again; a not yet idle long enough.
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(watch.asks(t1, &present), vec![(a, false)]);
        watch.record(t1, a, "idle");
        // Idle since t0, not since t1: the first idle answer counts.
        let t2 = t0 + IDLE_FOR;
        assert_eq!(watch.asks(t2, &present), vec![(a, true)]);
        // Given work meanwhile: not asked again.
        watch.record(t2, a, "used");
        assert_eq!(watch.asks(t2 + IDLE_FOR, &present), vec![]);
    }

    #[test]
    fn an_unknown_answer_or_another_process_starts_no_clock() {
        let t0 = Instant::now();
        let later = t0 + IDLE_FOR * 2;
        let mut watch = IdleWatch::default();
        // The GCS did not answer: still never seen idle.
        watch.record(t0, w(10, 100), "unknown");
        assert_eq!(watch.asks(later, &[w(10, 100)]), vec![(w(10, 100), false)]);
        // The same pid with another start time is another process.
        watch.record(t0, w(10, 100), "idle");
        assert_eq!(watch.asks(later, &[w(10, 200)]), vec![(w(10, 200), false)]);
        // The first was forgotten once gone.
        assert_eq!(watch.asks(later, &[w(10, 100)]), vec![(w(10, 100), false)]);
        // One that exited is forgotten too.
        watch.record(later, w(10, 100), "idle");
        watch.record(later, w(10, 100), "exited");
        assert_eq!(
            watch.asks(later + IDLE_FOR, &[w(10, 100)]),
            vec![(w(10, 100), false)]
        );
    }
}
