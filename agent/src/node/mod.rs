//! The node: one event loop that supervises `ray start --block` for either
//! role, publishes (head) or follows (worker) the discovery record, and
//! stops cleanly on request.
//!
//! Events (signals from the signal thread, Ray's exit from the reaper,
//! file-change hints from inotify) arrive on one channel; everything else is
//! driven by deadlines checked on each wake-up, so nothing busy-loops and
//! nothing sleeps blindly.
//!
//! `ray.rs` owns the Ray run (start, stop, wait) and knows no role;
//! `head.rs` and `worker.rs` hold each role's state and decisions.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::record::rfc3339;
use argus_discovery::{HeadRecord, Lease};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tracing::{debug, info, warn};

use crate::config::{Config, Role};
use crate::netinfo::IpSource;
use crate::status::{self, NodeState, Status};
use crate::storage::{Storage, StorageError};
use crate::supervise::backoff::Backoff;
use crate::supervise::reaper::{self, Exit};
use crate::supervise::tree::{self, ProcTree};

/// How often the loop wakes up when nothing happens.
const TICK: Duration = Duration::from_millis(200);
/// How often the process tree is scanned for the raylet and GCS.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How often a waiting node repeats why it waits.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(30);
/// How long the head waits for its raylet before publishing anyway.
const HEAD_RAYLET_WAIT: Duration = Duration::from_secs(60);
/// The whole stop (Ray, its group, engine containers, the withdraw) ends
/// within this long of SIGTERM: inside `docker stop`'s default 10 s.
const STOP_BUDGET: Duration = Duration::from_millis(9500);
/// What the stop keeps after Ray's grace for the SIGKILL and the sweep.
const STOP_RESERVE: Duration = Duration::from_millis(800);
/// Bound of one shared-storage operation on the event loop.
pub(super) const STORAGE_BOUND: Duration = Duration::from_secs(1);
/// Bound of the withdraw at stop.
const WITHDRAW_BOUND: Duration = Duration::from_millis(1000);
/// Consecutive failures from which a crash loop is reported.
const CRASH_LOOP_AFTER: u32 = 3;

mod head;
mod janitor;
mod ray;
mod worker;

use head::HeadRole;
use janitor::Janitor;
use ray::RayRun;
use worker::WorkerRole;

/// Something the loop reacts to.
#[derive(Debug)]
pub enum Event {
    Signal(Signal),
    RayExited { run: u64, exit: Exit },
    FileChanged,
}

/// Which head a worker is (or should be) joined to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) generation: u64,
    pub(super) instance_id: String,
    pub(super) address: String,
    /// The head runs with GCS fault tolerance (R-WRK-7).
    pub(super) gcs_ft: bool,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (instance {}, generation {})",
            self.address, self.instance_id, self.generation
        )
    }
}

enum RoleState {
    Head(Box<HeadRole>),
    Worker(WorkerRole),
}

/// The node agent's state.
pub struct Node {
    cfg: Config,
    ip: IpAddr,
    ip_source: IpSource,
    holder_id: String,
    extra_env: Vec<(String, String)>,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    pending: VecDeque<Event>,
    ray: Option<RayRun>,
    runs: u64,
    backoff: Backoff,
    /// Ray may be (re)started from this instant.
    start_after: Instant,
    restarts: u64,
    last_exit: Option<String>,
    tree: ProcTree,
    last_watch: Instant,
    rng: StdRng,
    state: NodeState,
    reason: String,
    state_since: SystemTime,
    last_status: Option<Instant>,
    last_wait_log: Option<Instant>,
    stop_requested: bool,
    lease: Lease,
    record: Option<HeadRecord>,
    record_error: Option<String>,
    next_poll: Instant,
    watcher: Option<crate::watch::FileWatch>,
    watch_state: crate::watch::WatchState,
    /// A file-event hint is queued and not yet handled.
    event_pending: Arc<AtomicBool>,
    role: RoleState,
    /// Shared-storage I/O runs here, never on the loop itself.
    storage: Storage,
    /// The last storage failure was logged (once per outage).
    storage_hung_logged: bool,
    janitor: Option<Janitor>,
    /// When the first SIGTERM/SIGINT arrived (set by the signal thread).
    stop_at: Arc<OnceLock<Instant>>,
}

impl Node {
    /// Creates the node.
    pub fn new(cfg: Config, ip: IpAddr, ip_source: IpSource) -> Self {
        let (tx, rx) = mpsc::channel();
        let host = hostname::get()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        let holder_id = format!("{host}/{}/{}", std::process::id(), short_id());
        let now = Instant::now();
        let role = match cfg.role {
            Role::Head => RoleState::Head(Box::default()),
            Role::Worker => RoleState::Worker(WorkerRole::default()),
        };
        Self {
            backoff: Backoff::new(cfg.backoff_min, cfg.backoff_max, cfg.stable_run),
            cfg,
            ip,
            ip_source,
            holder_id,
            extra_env: Vec::new(),
            tx,
            rx,
            pending: VecDeque::new(),
            ray: None,
            runs: 0,
            start_after: now,
            restarts: 0,
            last_exit: None,
            tree: ProcTree::new(),
            last_watch: now,
            rng: StdRng::from_os_rng(),
            state: NodeState::Starting,
            reason: "starting".into(),
            state_since: SystemTime::now(),
            last_status: None,
            last_wait_log: None,
            stop_requested: false,
            lease: Lease::new(now),
            record: None,
            record_error: None,
            next_poll: now,
            watcher: None,
            watch_state: crate::watch::WatchState::Off,
            event_pending: Arc::new(AtomicBool::new(false)),
            role,
            storage: Storage::start(),
            storage_hung_logged: false,
            janitor: None,
            stop_at: Arc::new(OnceLock::new()),
        }
    }

    /// Adds variables to Ray's environment (e.g. from preflight).
    pub fn add_ray_env(&mut self, env: Vec<(String, String)>) {
        self.extra_env.extend(env);
    }

    /// Returns a sender for events (tests and the signal route use it).
    pub fn events(&self) -> Sender<Event> {
        self.tx.clone()
    }

    /// Runs until stopped; returns the process exit code.
    pub fn run(mut self) -> i32 {
        let tx = self.tx.clone();
        let stop_at = self.stop_at.clone();
        reaper::route_signals(move |sig| {
            if reaper::is_stop(sig) {
                stop_at.get_or_init(Instant::now);
            }
            tx.send(Event::Signal(sig)).is_ok()
        });
        info!(
            role = %self.cfg.role,
            node_ip = %self.ip,
            ip_source = %self.ip_source,
            holder = %self.holder_id,
            head_file = %self.cfg.head_file.display(),
            "node agent started"
        );
        self.write_status();
        self.janitor = Some(Janitor::start());
        loop {
            let ev = match self.pending.pop_front() {
                Some(ev) => Some(ev),
                None => match self.rx.recv_timeout(TICK) {
                    Ok(ev) => Some(ev),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => None,
                },
            };
            if let Some(ev) = ev {
                self.handle(ev);
            }
            if self.stop_requested {
                return self.shutdown();
            }
            self.tick();
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Signal(sig @ (Signal::SIGTERM | Signal::SIGINT)) => {
                info!(?sig, "stop requested");
                self.stop_requested = true;
            }
            Event::Signal(sig) => match &self.ray {
                Some(r) => {
                    info!(
                        ?sig,
                        pgid = r.pid,
                        "forwarding signal to ray's process group"
                    );
                    if let Err(e) = signal::killpg(Pid::from_raw(r.pid as i32), sig) {
                        warn!(?sig, pgid = r.pid, error = %e, "failed to forward signal");
                    }
                }
                None => debug!(?sig, "no ray child to forward the signal to"),
            },
            Event::RayExited { run, exit } => self.on_ray_exit(run, exit),
            Event::FileChanged => {
                self.event_pending.store(false, Ordering::Release);
                self.next_poll = Instant::now();
            }
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if self.ray.is_some() && now.duration_since(self.last_watch) >= WATCH_EVERY {
            self.last_watch = now;
            self.watch_ray();
        }
        match self.role {
            RoleState::Head(_) => self.head_tick(),
            RoleState::Worker(_) => self.worker_tick(),
        }
        if self
            .last_status
            .is_none_or(|t| t.elapsed() >= status::HEARTBEAT)
        {
            self.write_status();
        }
    }

    // ---- stop and status -------------------------------------------------

    /// Stops the node inside [`STOP_BUDGET`] of the stop signal (SPEC
    /// §11): SIGTERM to Ray first, then, while Ray stops, the withdraw
    /// (bounded: the storage may hang) and the removal of this node's
    /// engine containers; SIGKILL of Ray's group when its grace (cut to fit
    /// the budget) ends; a sweep of every descendant left.
    fn shutdown(mut self) -> i32 {
        let t0 = *self.stop_at.get_or_init(Instant::now);
        let budget_end = t0 + STOP_BUDGET;
        self.set_state(NodeState::Stopping, "stop requested".into());
        let ray = self.ray.as_mut().map(|r| {
            r.stopping = true;
            (r.pid, r.run)
        });
        if let Some((pid, _)) = ray {
            info!(
                pid,
                grace_s = self.cfg.stop_grace.as_secs_f64(),
                "sending SIGTERM to ray"
            );
            let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        // R-PID-4 / R-SHIM-4: no engine container outlives the node.
        let containers = self.janitor.as_ref().and_then(Janitor::remove_all);
        self.withdraw_within(WITHDRAW_BOUND);
        if let Some((pid, run)) = ray {
            let grace_end = (t0 + self.cfg.stop_grace).min(budget_end - STOP_RESERVE);
            let grace = grace_end.saturating_duration_since(Instant::now());
            if !self.wait_ray_exit(run, grace) {
                warn!(
                    pid,
                    grace_s = grace_end.saturating_duration_since(t0).as_secs_f64(),
                    "ray did not stop within its grace; killing its process group"
                );
                let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                self.wait_ray_exit(run, Duration::from_millis(300));
            }
        }
        let sweep = budget_end
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(500));
        let swept = tree::sweep_descendants(&mut self.tree, sweep);
        if swept > 0 {
            info!(swept, "killed leftover processes");
        }
        if let Some(rx) = containers {
            let left = budget_end.saturating_duration_since(Instant::now());
            if rx.recv_timeout(left).is_err() {
                warn!(
                    waited_s = left.as_secs_f64(),
                    "engine containers not confirmed removed within the stop budget"
                );
            }
        }
        self.set_state(NodeState::Stopped, "stopped on request".into());
        info!(took_s = t0.elapsed().as_secs_f64(), "node agent stopped");
        0
    }

    /// Logs a shared-storage failure once per outage (R-WRK-4: it never
    /// tears down Ray by itself).
    pub(super) fn storage_failed(&mut self, e: &StorageError) {
        if !self.storage_hung_logged {
            self.storage_hung_logged = true;
            warn!(error = %e, "shared storage hung or too slow; keeping ray as it is and retrying");
        }
    }

    /// Notes that a shared-storage operation finished again.
    pub(super) fn storage_ok(&mut self) {
        if std::mem::take(&mut self.storage_hung_logged) {
            info!("shared storage answers again");
        }
    }

    fn set_state(&mut self, state: NodeState, reason: String) {
        let changed = state != self.state || reason != self.reason;
        if state != self.state {
            self.state_since = SystemTime::now();
            debug!(%state, %reason, "state changed");
        }
        self.state = state;
        self.reason = reason;
        if changed {
            self.write_status();
        }
    }

    fn write_status(&mut self) {
        self.last_status = Some(Instant::now());
        let now = Instant::now();
        let (generation, head_address, head_instance) = match (&self.role, &self.record) {
            (RoleState::Head(h), _) => (
                h.generation,
                Some(SocketAddr::new(self.ip, self.cfg.ray_port).to_string()),
                self.ray.as_ref().map(|r| r.instance_id.clone()),
            ),
            (RoleState::Worker(_), Some(r)) => (
                Some(r.generation),
                Some(r.gcs_address()),
                Some(r.instance_id.clone()),
            ),
            (RoleState::Worker(_), None) => (None, None, None),
        };
        let st = Status {
            role: self.cfg.role.to_string(),
            state: self.state,
            reason: self.reason.clone(),
            state_since: rfc3339(self.state_since),
            agent_pid: std::process::id(),
            node_ip: self.ip.to_string(),
            node_ip_source: self.ip_source.to_string(),
            head_address,
            head_instance_id: head_instance,
            head_generation: generation,
            head_record_age_s: self
                .lease
                .changed_at()
                .map(|t| now.duration_since(t).as_secs_f64()),
            ray_pid: self.ray.as_ref().map(|r| r.pid),
            ray_started_at: self.ray.as_ref().map(|r| rfc3339(r.started_wall)),
            restarts: self.restarts,
            consecutive_failures: self.backoff.failures(),
            crash_loop: self.backoff.failures() >= CRASH_LOOP_AFTER,
            last_exit: self.last_exit.clone(),
            next_restart_in_s: (self.ray.is_none() && self.start_after > now)
                .then(|| (self.start_after - now).as_secs_f64()),
            takeover: match &self.role {
                RoleState::Head(h) => h.rule.clone(),
                RoleState::Worker(_) => None,
            },
            head_gcs: match &self.role {
                RoleState::Worker(w) => w.gcs_note.clone(),
                RoleState::Head(_) => None,
            },
            gcs_ft: match &self.role {
                RoleState::Head(_) => self.cfg.gcs_ft_redis.is_some(),
                RoleState::Worker(_) => self.record.as_ref().is_some_and(|r| r.gcs_ft),
            },
            file_events: self.watch_state.to_string(),
            updated_at: rfc3339(SystemTime::now()),
        };
        if let Err(e) = status::write(&self.cfg.state_dir, &st) {
            warn!(error = %e, "cannot write status file");
        }
    }
}

fn short_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id[..8].to_string()
}
