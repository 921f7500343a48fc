//! The node: one event loop that supervises `ray start --block` for either
//! role, publishes (head) or follows (worker) the discovery record, and
//! stops cleanly on request.
//!
//! Events (signals from the signal thread, Ray's exit from the reaper,
//! file-change hints from notify) arrive on one channel; everything else is
//! driven by deadlines checked on each wake-up, so nothing busy-loops and
//! nothing sleeps blindly.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::claim::{self, epochs_dir};
use argus_discovery::record::rfc3339;
use argus_discovery::{read_record, HeadRecord, HeadState, Lease, ReadError, SCHEMA_VERSION};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, error, info, warn};

use crate::config::{Config, Role};
use crate::netinfo::IpSource;
use crate::shim::janitor::{self, JanitorScope};
use crate::status::{self, NodeState, Status};
use crate::supervise::backoff::Backoff;
use crate::supervise::reaper::{self, Exit};
use crate::supervise::tree::{self, ProcTree, RayWatch};

/// How often the loop wakes up when nothing happens.
const TICK: Duration = Duration::from_millis(200);
/// How often the process tree is scanned for the raylet and GCS.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How often a waiting node repeats why it waits.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(30);
/// How long the head waits for its raylet before publishing anyway.
const HEAD_RAYLET_WAIT: Duration = Duration::from_secs(60);
/// Consecutive failures from which a crash loop is reported.
const CRASH_LOOP_AFTER: u32 = 3;

/// Something the loop reacts to.
#[derive(Debug)]
pub enum Event {
    Signal(Signal),
    RayExited { run: u64, exit: Exit },
    FileChanged,
}

/// Which head a worker is (or should be) joined to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    generation: u64,
    instance_id: String,
    address: String,
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

/// The running `ray start --block`.
struct RayRun {
    run: u64,
    pid: u32,
    started: Instant,
    started_wall: SystemTime,
    watch: RayWatch,
    /// Head: this start's instance id. Worker: the head's.
    instance_id: String,
    /// Worker: the head joined.
    target: Option<Target>,
    /// Head: the GCS accepted a connection and the record is published.
    serving: bool,
    /// The agent is stopping it on purpose (not a failure).
    stopping: bool,
}

#[derive(Default)]
struct HeadRole {
    /// The generation this head holds, once claimed.
    generation: Option<u64>,
    seq: u64,
    next_refresh: Option<Instant>,
    /// A record with our generation was published and not yet withdrawn.
    published: bool,
}

#[derive(Default)]
struct WorkerRole {
    max_generation: u64,
    /// The head the next start will join.
    desired: Option<Target>,
    /// The last target that a start was scheduled for (jitter applied once).
    scheduled: Option<Target>,
}

enum RoleState {
    Head(HeadRole),
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
    watcher: Option<notify::RecommendedWatcher>,
    /// A file-event hint is queued and not yet handled.
    event_pending: Arc<AtomicBool>,
    role: RoleState,
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
            Role::Head => RoleState::Head(HeadRole::default()),
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
            event_pending: Arc::new(AtomicBool::new(false)),
            role,
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
        reaper::route_signals(move |sig| tx.send(Event::Signal(sig)).is_ok());
        info!(
            role = %self.cfg.role,
            node_ip = %self.ip,
            ip_source = %self.ip_source,
            holder = %self.holder_id,
            head_file = %self.cfg.head_file.display(),
            "node agent started"
        );
        self.write_status();
        start_janitor();
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

    // ---- Ray child -------------------------------------------------------

    fn ray_args(&self, target: Option<&Target>) -> Vec<String> {
        let mut args = vec!["start".to_string()];
        let has = |flag: &str| {
            self.cfg
                .ray_extra_args
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        match target {
            None => {
                args.push("--head".into());
                args.push(format!("--node-ip-address={}", self.ip));
                args.push(format!("--port={}", self.cfg.ray_port));
                args.push("--dashboard-host=0.0.0.0".into());
                args.push(format!("--dashboard-port={}", self.cfg.dashboard_port));
                // seeds/004 §5.4: the head schedules no work by default.
                if !has("--num-cpus") {
                    args.push("--num-cpus=0".into());
                }
                if !has("--num-gpus") {
                    args.push("--num-gpus=0".into());
                }
            }
            Some(t) => {
                args.push(format!("--address={}", t.address));
                args.push(format!("--node-ip-address={}", self.ip));
                if let Some(json) = self.cfg.worker_resources_json() {
                    if !has("--resources") {
                        args.push(format!("--resources={json}"));
                    }
                }
            }
        }
        args.push("--block".into());
        args.extend(self.cfg.ray_extra_args.iter().cloned());
        args
    }

    /// The head's Ray temp dir (`--temp-dir` or Ray's default).
    fn ray_temp_dir(&self) -> PathBuf {
        let args = &self.cfg.ray_extra_args;
        for (i, a) in args.iter().enumerate() {
            if let Some(v) = a.strip_prefix("--temp-dir=") {
                return PathBuf::from(v);
            }
            if a == "--temp-dir" {
                if let Some(v) = args.get(i + 1) {
                    return PathBuf::from(v);
                }
            }
        }
        PathBuf::from(std::env::var("RAY_TMPDIR").unwrap_or_else(|_| "/tmp".into())).join("ray")
    }

    fn start_ray(&mut self, target: Option<Target>) {
        if target.is_none() {
            // `ray start --head` refuses to start when ray_current_cluster
            // names its address and some local process still carries that
            // --gcs-address (our previous, dead GCS's workers on a shared
            // box). This agent stopped its previous Ray, so the file is stale.
            let _ = std::fs::remove_file(self.ray_temp_dir().join("ray_current_cluster"));
        }
        let args = self.ray_args(target.as_ref());
        self.runs += 1;
        let run = self.runs;
        let mut cmd = Command::new(&self.cfg.ray_bin);
        cmd.args(&args).process_group(0);
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        let tx = self.tx.clone();
        let instance_id = match &target {
            Some(t) => t.instance_id.clone(),
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        match reaper::spawn_with(&mut cmd, move |exit| {
            let _ = tx.send(Event::RayExited { run, exit });
        }) {
            Ok(pid) => {
                info!(pid, run, ray = %self.cfg.ray_bin, args = ?args, "started ray");
                let head = target.is_none();
                self.ray = Some(RayRun {
                    run,
                    pid,
                    started: Instant::now(),
                    started_wall: SystemTime::now(),
                    watch: RayWatch::new(head),
                    instance_id,
                    target: target.clone(),
                    serving: false,
                    stopping: false,
                });
                let reason = match &target {
                    Some(t) => format!("joining head {t}"),
                    None => "waiting for the GCS port to accept connections".into(),
                };
                if head {
                    self.set_state(NodeState::RayStarting, reason);
                } else {
                    self.set_state(NodeState::Running, reason);
                }
            }
            Err(e) => {
                let code = match e.kind() {
                    io::ErrorKind::NotFound => 127,
                    _ => 126,
                };
                error!(ray = %self.cfg.ray_bin, error = %e, code, "cannot run ray");
                self.after_ray_ended(Exit::Code(code), Duration::ZERO, false);
            }
        }
    }

    fn on_ray_exit(&mut self, run: u64, exit: Exit) {
        let Some(r) = self.ray.as_ref().filter(|r| r.run == run) else {
            debug!(run, %exit, "exit of a ray run already handled");
            return;
        };
        let (pid, ran, on_purpose) = (r.pid, r.started.elapsed(), r.stopping);
        self.ray = None;
        // Ray's own children may outlive `ray start` (agents, idle workers).
        let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let swept = tree::sweep_descendants(&mut self.tree, Duration::from_secs(2));
        if on_purpose {
            info!(pid, %exit, swept, "ray stopped");
            return;
        }
        warn!(pid, %exit, ran_s = ran.as_secs_f64(), swept, "ray exited unexpectedly");
        self.after_ray_ended(exit, ran, true);
    }

    /// Withdraws (head) and schedules the restart with backoff.
    fn after_ray_ended(&mut self, exit: Exit, ran: Duration, count: bool) {
        self.withdraw();
        let delay = self.backoff.next_delay(ran, &mut self.rng);
        self.start_after = Instant::now() + delay;
        if count {
            self.restarts += 1;
        }
        self.last_exit = Some(format!("{exit} after {:.1}s", ran.as_secs_f64()));
        let failures = self.backoff.failures();
        if failures >= CRASH_LOOP_AFTER {
            warn!(failures, delay_s = delay.as_secs_f64(), last_exit = %exit, "ray is crash-looping; backing off");
        } else {
            info!(
                delay_s = delay.as_secs_f64(),
                failures, "restarting ray after backoff"
            );
        }
        self.set_state(
            NodeState::Backoff,
            format!("ray ended ({exit}); restart in {:.1}s", delay.as_secs_f64()),
        );
    }

    /// Stops Ray at once (SIGKILL to its group) and waits for its exit.
    fn stop_ray_now(&mut self, why: &str) {
        let Some(r) = self.ray.as_mut() else { return };
        r.stopping = true;
        let (pid, run) = (r.pid, r.run);
        info!(pid, why, "stopping ray");
        let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        self.wait_ray_exit(run, Duration::from_secs(3));
    }

    /// Waits for run `run` to exit, keeping other events for later.
    fn wait_ray_exit(&mut self, run: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.ray.as_ref().is_some_and(|r| r.run == run) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.rx.recv_timeout(left) {
                Ok(Event::RayExited { run: r, exit }) => self.on_ray_exit(r, exit),
                Ok(Event::Signal(sig @ (Signal::SIGTERM | Signal::SIGINT)))
                    if self.stop_requested =>
                {
                    info!(?sig, "second stop request: killing ray now");
                    if let Some(r) = &self.ray {
                        let _ = signal::killpg(Pid::from_raw(r.pid as i32), Signal::SIGKILL);
                    }
                }
                Ok(ev) => self.pending.push_back(ev),
                Err(_) => {}
            }
        }
        true
    }

    fn watch_ray(&mut self) {
        let Some(r) = self.ray.as_mut() else { return };
        self.tree.refresh();
        let desc = self.tree.descendants(r.pid);
        if let Some((name, pid)) = r.watch.check(&desc) {
            warn!(
                name,
                pid, "ray daemon died; treating it as the node's death"
            );
            let (rpid, run) = (r.pid, r.run);
            // Give `ray start` no chance to block on: kill the group.
            let _ = signal::killpg(Pid::from_raw(rpid as i32), Signal::SIGKILL);
            self.wait_ray_exit(run, Duration::from_secs(3));
        }
    }

    // ---- head ------------------------------------------------------------

    fn head(&mut self) -> &mut HeadRole {
        match &mut self.role {
            RoleState::Head(h) => h,
            RoleState::Worker(_) => unreachable!("head state on a worker"),
        }
    }

    fn head_tick(&mut self) {
        let now = Instant::now();
        if self.head().generation.is_none() {
            if now >= self.next_poll {
                self.next_poll = now + self.cfg.poll;
                self.try_acquire();
            }
            return;
        }
        if self.ray.is_none() {
            if now >= self.start_after {
                self.start_ray(None);
            }
            return;
        }
        let serving = self.ray.as_ref().is_some_and(|r| r.serving);
        if !serving {
            let addr = SocketAddr::new(self.ip, self.cfg.ray_port);
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                return;
            }
            let Some((started, started_wall)) =
                self.ray.as_ref().map(|r| (r.started, r.started_wall))
            else {
                return;
            };
            let raylet = self.head_raylet_ready(started_wall);
            if !raylet && started.elapsed() < HEAD_RAYLET_WAIT {
                return;
            }
            if let Some(r) = self.ray.as_mut() {
                r.serving = true;
            }
            if raylet {
                info!(%addr, "gcs accepts connections and the head's raylet is up; publishing head record");
            } else {
                warn!(%addr, waited_s = HEAD_RAYLET_WAIT.as_secs(), "gcs accepts connections but the head's raylet socket was not seen; publishing head record anyway");
            }
            self.publish(HeadState::Running);
            self.set_state(NodeState::Running, format!("serving at {addr}"));
            return;
        }
        if self.head().next_refresh.is_some_and(|t| now >= t) {
            if let Some(higher) = self.fenced() {
                error!(
                    higher,
                    "another head claimed a higher generation; stepping down to standby"
                );
                self.stop_ray_now("fenced by a newer head");
                let h = self.head();
                h.generation = None;
                h.published = false;
                self.lease = Lease::new(Instant::now());
                self.set_state(NodeState::Standby, format!("fenced by generation {higher}"));
                return;
            }
            self.publish(HeadState::Running);
        }
    }

    /// Returns true if and only if this start's raylet accepts connections on
    /// its socket in the current session (`<temp>/session_latest`).
    ///
    /// Why wait for it: nodes that share a session folder (several nodes on
    /// one machine) pick socket names by racing on file existence; a worker
    /// joining while the head's raylet is still starting can take the name
    /// `sockets/raylet` first and crash the head's raylet (research/ray.md
    /// §4). Across machines it only means workers join a head that is up.
    fn head_raylet_ready(&self, started_wall: SystemTime) -> bool {
        let sock = self.ray_temp_dir().join("session_latest/sockets/raylet");
        let fresh = std::fs::metadata(&sock)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t + Duration::from_secs(2) >= started_wall);
        fresh && std::os::unix::net::UnixStream::connect(&sock).is_ok()
    }

    /// Returns a generation higher than ours if one was claimed.
    fn fenced(&mut self) -> Option<u64> {
        let mine = self.head().generation?;
        let claimed = claim::highest_generation(&epochs_dir(&self.cfg.head_file)).unwrap_or(0);
        let published = read_record(&self.cfg.head_file)
            .map(|(r, _)| r.generation)
            .unwrap_or(0);
        let higher = claimed.max(published);
        (higher > mine).then_some(higher)
    }

    /// Standby: reads the record and claims the next generation when no
    /// other live head holds it (R-HEAD-5).
    fn try_acquire(&mut self) {
        let now = Instant::now();
        let path = self.cfg.head_file.clone();
        let (prev_gen, prev_seq, blocker) = match read_record(&path) {
            Ok((rec, raw)) => {
                self.lease.observe(&raw, now);
                let g = (rec.generation, rec.seq);
                let live_other = rec.state == HeadState::Running
                    && rec.holder_id != self.holder_id
                    && self.lease.unchanged_for(now) < self.cfg.ttl;
                let blocker = live_other.then(|| {
                    format!(
                        "head {} ({}) holds generation {} and its record changed {:.0}s ago",
                        rec.head_ip,
                        rec.holder_id,
                        rec.generation,
                        self.lease.unchanged_for(now).as_secs_f64()
                    )
                });
                (g.0, g.1, blocker)
            }
            Err(ReadError::Bad { raw, source, .. }) => {
                self.lease.observe(&raw, now);
                warn!(path = %path.display(), error = %source, "head record is invalid; it will be replaced");
                (0, 0, None)
            }
            Err(e) if e.is_missing() => (0, 0, None),
            Err(e) => {
                warn!(error = %e, "cannot read head record; staying in standby");
                self.set_state(NodeState::Standby, format!("cannot read head record: {e}"));
                return;
            }
        };
        if let Some(why) = blocker {
            if self.state != NodeState::Standby {
                info!(reason = %why, "standby: another head is live");
            }
            self.set_state(NodeState::Standby, why);
            return;
        }
        let dir = epochs_dir(&path);
        let next = match claim::highest_generation(&dir) {
            Ok(h) => h.max(prev_gen) + 1,
            Err(e) => {
                warn!(error = %e, "cannot list generation claims");
                self.set_state(NodeState::Standby, format!("{e}"));
                return;
            }
        };
        match claim::claim_generation(&dir, next, &self.holder_id) {
            Ok(true) => {
                info!(generation = next, "claimed head generation");
                let h = self.head();
                h.generation = Some(next);
                h.seq = prev_seq;
            }
            Ok(false) => {
                info!(
                    generation = next,
                    "another head claimed the generation first; standby"
                );
                self.lease = Lease::new(now);
                self.set_state(
                    NodeState::Standby,
                    format!("generation {next} claimed by another head"),
                );
            }
            Err(e) => {
                warn!(error = %e, "cannot claim a head generation");
                self.set_state(NodeState::Standby, format!("{e}"));
            }
        }
    }

    fn publish(&mut self, state: HeadState) {
        let (ip, cfg_ttl, refresh) = (self.ip, self.cfg.ttl, self.cfg.refresh);
        let instance_id = self
            .ray
            .as_ref()
            .map(|r| r.instance_id.clone())
            .or_else(|| self.record.as_ref().map(|r| r.instance_id.clone()))
            .unwrap_or_else(|| "none".into());
        let holder_id = self.holder_id.clone();
        let (cluster, gport, dport) = (
            self.cfg.cluster_name.clone(),
            self.cfg.ray_port,
            self.cfg.dashboard_port,
        );
        let path = self.cfg.head_file.clone();
        let h = self.head();
        let Some(generation) = h.generation else {
            return;
        };
        h.seq += 1;
        let now = SystemTime::now();
        let rec = HeadRecord {
            schema_version: SCHEMA_VERSION,
            cluster_name: cluster,
            head_ip: ip.to_string(),
            gcs_port: gport,
            dashboard_port: dport,
            job_server_url: match ip {
                IpAddr::V6(_) => format!("http://[{ip}]:{dport}"),
                IpAddr::V4(_) => format!("http://{ip}:{dport}"),
            },
            updated_at: rfc3339(now),
            expires_at: rfc3339(now + cfg_ttl),
            instance_id,
            holder_id,
            generation,
            seq: h.seq,
            state,
            ttl_s: cfg_ttl.as_secs_f64(),
        };
        h.next_refresh = Some(Instant::now() + refresh);
        match argus_discovery::publish(&path, &rec.to_bytes()) {
            Ok(()) => {
                h.published = state == HeadState::Running;
                debug!(seq = rec.seq, ?state, "published head record");
                if state == HeadState::Stopped {
                    info!(generation, "withdrew head record (state stopped)");
                }
                self.record = Some(rec);
            }
            Err(e) => warn!(error = %e, "failed to publish head record; will retry"),
        }
    }

    /// Head: marks the record stopped at once (R-HEAD-4).
    fn withdraw(&mut self) {
        if let RoleState::Head(h) = &mut self.role {
            if h.published {
                h.next_refresh = None;
                self.publish(HeadState::Stopped);
            }
        }
    }

    // ---- worker ----------------------------------------------------------

    fn worker(&mut self) -> &mut WorkerRole {
        match &mut self.role {
            RoleState::Worker(w) => w,
            RoleState::Head(_) => unreachable!("worker state on a head"),
        }
    }

    fn ensure_watch(&mut self) {
        if self.watcher.is_some() || !self.cfg.file_events {
            return;
        }
        use notify::Watcher;
        let Some(dir) = self.cfg.head_file.parent().map(|d| d.to_path_buf()) else {
            return;
        };
        if !dir.is_dir() {
            return;
        }
        let name = self.cfg.head_file.file_name().map(|n| n.to_os_string());
        let tx = self.tx.clone();
        let pending = self.event_pending.clone();
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            // Our own reads raise open/access events: reacting to them would
            // be a feedback loop that floods the event queue.
            if matches!(ev.kind, notify::EventKind::Access(_)) {
                return;
            }
            let ours = ev
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == name);
            // At most one hint waits in the queue, however many events come.
            if ours && !pending.swap(true, Ordering::AcqRel) {
                let _ = tx.send(Event::FileChanged);
            }
        };
        match notify::recommended_watcher(handler) {
            Ok(mut w) => match w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    debug!(dir = %dir.display(), "watching for file events (a shortcut; polling is primary)");
                    self.watcher = Some(w);
                }
                Err(e) => debug!(error = %e, "no file events; polling only"),
            },
            Err(e) => debug!(error = %e, "no file events; polling only"),
        }
    }

    /// Reads the record and updates what the worker should be joined to.
    fn worker_poll(&mut self) {
        let now = Instant::now();
        self.ensure_watch();
        let path = self.cfg.head_file.clone();
        match read_record(&path) {
            Ok((rec, raw)) => {
                self.lease.observe(&raw, now);
                self.record_error = None;
                let max = self.worker().max_generation;
                if rec.generation < max {
                    self.record_error = Some(format!(
                        "record of generation {} is older than generation {max} already seen (a fenced head?)",
                        rec.generation
                    ));
                } else {
                    self.worker().max_generation = rec.generation;
                    if let Some(skew) = rec.wall_age(SystemTime::now()) {
                        if skew.abs() > 30.0 + rec.ttl_s {
                            debug!(skew_s = skew, "head's clock and ours disagree (harmless: freshness uses our monotonic clock)");
                        }
                    }
                    self.record = Some(rec);
                }
            }
            Err(ReadError::Bad { raw, source, .. }) => {
                self.lease.observe(&raw, now);
                self.record_error = Some(format!("malformed head record: {source}"));
            }
            Err(e) if e.is_missing() => {
                self.lease.observe_missing(now);
                self.record = None;
                self.record_error = Some(format!("{} does not exist yet", path.display()));
            }
            Err(e) => self.record_error = Some(format!("unreadable head record: {e}")),
        }
        let fresh = self.lease.is_fresh(self.cfg.ttl, now);
        let desired = match (&self.record, &self.record_error) {
            (Some(r), None) if r.state == HeadState::Running && fresh => Some(Target {
                generation: r.generation,
                instance_id: r.instance_id.clone(),
                address: r.gcs_address(),
            }),
            _ => None,
        };
        if desired.is_none() && self.record_error.is_none() {
            self.record_error = Some(match &self.record {
                Some(r) if r.state == HeadState::Stopped => "the head withdrew its record (state stopped)".into(),
                Some(_) if self.lease.changed_at().is_none() => {
                    "head record has not changed since this agent started (waiting to see it refreshed)".into()
                }
                _ => format!(
                    "head record expired: unchanged for {:.0}s (TTL {:.0}s)",
                    self.lease.unchanged_for(now).as_secs_f64(),
                    self.cfg.ttl.as_secs_f64()
                ),
            });
        }
        self.worker().desired = desired;
    }

    fn worker_tick(&mut self) {
        let now = Instant::now();
        if now >= self.next_poll {
            self.next_poll = now + self.cfg.poll;
            self.worker_poll();
        }
        let desired = self.worker().desired.clone();
        let joined = self.ray.as_ref().and_then(|r| r.target.clone());
        if self.ray.is_some() {
            match &desired {
                Some(t) if Some(t) != joined.as_ref() => {
                    info!(from = ?joined.as_ref().map(|j| j.to_string()), to = %t, "head changed; rejoining");
                    self.stop_ray_now("head changed");
                    self.schedule_join(t.clone());
                }
                Some(_) => {}
                None => {
                    // R-WRK-4: a stale or unreadable record never tears down
                    // a Ray that may still be connected.
                    if self
                        .last_wait_log
                        .is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY)
                    {
                        self.last_wait_log = Some(now);
                        warn!(reason = ?self.record_error, "head record not fresh; keeping ray running");
                    }
                }
            }
            return;
        }
        match desired {
            Some(t) => {
                if self.worker().scheduled.as_ref() != Some(&t) {
                    self.schedule_join(t.clone());
                }
                if Instant::now() >= self.start_after {
                    self.last_wait_log = None;
                    self.start_ray(Some(t));
                }
            }
            None => {
                let why = self
                    .record_error
                    .clone()
                    .unwrap_or_else(|| "no head record".into());
                if self.state != NodeState::Backoff || now >= self.start_after {
                    if self.state != NodeState::WaitingForHead {
                        self.last_wait_log = None;
                    }
                    if self
                        .last_wait_log
                        .is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY)
                    {
                        self.last_wait_log = Some(now);
                        let waited = match self.state {
                            NodeState::WaitingForHead => {
                                self.state_since.elapsed().unwrap_or_default()
                            }
                            _ => Duration::ZERO,
                        };
                        info!(reason = %why, waited_s = waited.as_secs(), "waiting for head");
                    }
                    self.set_state(NodeState::WaitingForHead, why);
                }
            }
        }
    }

    /// Delays the join to a new head by a random jitter (R-WRK-6) so many
    /// workers do not stampede it; at most half a poll period.
    fn schedule_join(&mut self, t: Target) {
        let max = (self.cfg.poll / 2).min(Duration::from_secs(5));
        let jitter = max.mul_f64(self.rng.random_range(0.0..=1.0));
        let at = Instant::now() + jitter;
        if at > self.start_after {
            self.start_after = at;
        }
        debug!(target = %t, jitter_ms = jitter.as_millis() as u64, "join scheduled");
        self.worker().scheduled = Some(t);
    }

    // ---- stop and status -------------------------------------------------

    fn shutdown(mut self) -> i32 {
        self.set_state(NodeState::Stopping, "stop requested".into());
        self.withdraw();
        if let Some(r) = self.ray.as_mut() {
            r.stopping = true;
            let (pid, run) = (r.pid, r.run);
            info!(
                pid,
                grace_s = self.cfg.stop_grace.as_secs_f64(),
                "sending SIGTERM to ray"
            );
            let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            if !self.wait_ray_exit(run, self.cfg.stop_grace) {
                warn!(
                    pid,
                    "ray did not stop within the grace period; killing its process group"
                );
                let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                self.wait_ray_exit(run, Duration::from_secs(1));
            }
        }
        let swept = tree::sweep_descendants(&mut self.tree, Duration::from_millis(800));
        if swept > 0 {
            info!(swept, "killed leftover processes");
        }
        // R-PID-4 / R-SHIM-4: no engine container outlives the node.
        sweep_containers(JanitorScope::AllOwned, Duration::from_secs(3));
        self.set_state(NodeState::Stopped, "stopped on request".into());
        info!("node agent stopped");
        0
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
            updated_at: rfc3339(SystemTime::now()),
        };
        if let Err(e) = status::write(&self.cfg.state_dir, &st) {
            warn!(error = %e, "cannot write status file");
        }
    }
}

/// How often the janitor removes containers whose shim died.
const JANITOR_EVERY: Duration = Duration::from_secs(30);

/// Starts the thread that removes engine containers whose shim process is
/// gone (the raylet SIGKILLs Ray workers, and the shim is the worker).
fn start_janitor() {
    let spawned = std::thread::Builder::new()
        .name("janitor".into())
        .spawn(|| loop {
            sweep_containers(JanitorScope::DeadShims, JANITOR_EVERY);
            std::thread::sleep(JANITOR_EVERY);
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the container janitor");
    }
}

/// Runs one janitor sweep, waiting at most `timeout` for the daemon.
fn sweep_containers(scope: JanitorScope, timeout: Duration) {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("janitor-sweep".into())
        .spawn(move || {
            let _ = tx.send(janitor::sweep_blocking(scope));
        });
    if spawned.is_err() {
        return;
    }
    match rx.recv_timeout(timeout) {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => info!(removed = n, ?scope, "removed engine containers"),
        Ok(Err(e)) => warn!(error = %format!("{e:#}"), ?scope, "container janitor failed"),
        Err(_) => warn!(?scope, "container janitor did not finish in time"),
    }
}

fn short_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id[..8].to_string()
}
