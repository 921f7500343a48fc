//! The Ray run: `ray start --block` as the node's child, its start,
//! stop and exit. Knows no role beyond the arguments each role needs.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tracing::{debug, error, info, warn};

use argus_supervise::exitwatch::ExitWatch;
use argus_supervise::reaper::{self, Exit};
use argus_supervise::tree::RayWatch;
use argus_telemetry::metrics::{self, RayExitKind};
use argus_telemetry::status::NodeState;

use super::{Event, Node, Target, CRASH_LOOP_AFTER};

/// The running `ray start --block`.
pub(super) struct RayRun {
    pub(super) run: u64,
    pub(super) pid: u32,
    pub(super) started: Instant,
    pub(super) started_wall: SystemTime,
    pub(super) watch: RayWatch,
    /// Head: this start's instance id. Worker: the head's.
    pub(super) instance_id: String,
    /// Worker: the head joined.
    pub(super) target: Option<Target>,
    /// Head: the GCS accepted a connection and the record is published.
    pub(super) serving: bool,
    /// Head, while starting: a probe found our GCS accepting ...
    pub(super) gcs_accepts: bool,
    /// ... and a raylet socket of this start accepting.
    pub(super) raylet_up: bool,
    /// Head, while starting: the next probe of our GCS is due.
    pub(super) next_check: Instant,
    /// The agent is stopping it on purpose (not a failure).
    pub(super) stopping: bool,
    /// A watched daemon (raylet, GCS) died and the agent killed the rest.
    pub(super) daemon_died: bool,
    /// Once every watched daemon was seen: waits for their exit by pidfd,
    /// so the process tree is no longer scanned every second.
    pub(super) exit_watch: Option<ExitWatch>,
    /// An exit watch was tried for this run (at most once).
    pub(super) exit_watch_tried: bool,
}

impl RayRun {
    /// Returns true if and only if the process tree must be scanned to see
    /// the daemons die (no pidfd watch).
    pub(super) fn scanned(&self) -> bool {
        self.exit_watch.is_none()
    }
}

impl<R: super::RoleLoop> Node<R> {
    // ---- Ray child -------------------------------------------------------

    pub(super) fn ray_args(&self, target: Option<&Target>) -> Vec<String> {
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
        // Ray's other ports, where ARGUS_RAY_*_PORT(S) set them (issue 18).
        let role = match target {
            None => argus_config::Role::Head,
            Some(_) => argus_config::Role::Worker,
        };
        args.extend(self.cfg.ray_ports.args(role));
        args.push("--block".into());
        args.extend(self.cfg.ray_extra_args.iter().cloned());
        args
    }

    /// The head's Ray temp dir (`--temp-dir` or Ray's default).
    pub(super) fn ray_temp_dir(&self) -> PathBuf {
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

    pub(super) fn start_ray(&mut self, target: Option<Target>) {
        if target.is_none() {
            // `ray start --head` refuses to start when ray_current_cluster
            // names its address and some local process still carries that
            // --gcs-address (our previous, dead GCS's workers on a shared
            // box). This agent stopped its previous Ray, so the file is stale.
            // Ray's temp dir is the Ray user's: the name is removed from
            // that very folder, reached through root's folders without
            // following a link, never through a path the Ray user swapped
            // (R-SEC-2; unlinking an entry in its own folder gives it
            // nothing it could not do itself).
            let _ = remove_in_own_folder(&self.ray_temp_dir(), "ray_current_cluster");
        }
        let token = match self.ray_token(target.is_none()) {
            Ok(t) => t,
            Err(why) => {
                error!(error = %why, "cannot start ray without the cluster's token; retrying");
                metrics::ray_exited(RayExitKind::StartFailed);
                self.after_ray_ended(Exit::Code(78), Duration::ZERO, false);
                return;
            }
        };
        let mut args = self.ray_args(target.as_ref());
        self.runs += 1;
        let run = self.runs;
        let mut cmd = Command::new(&self.cfg.ray_bin);
        cmd.process_group(0);
        // Ray's whole tree: the Ray user, no groups, no capabilities,
        // no_new_privs (setuid files planted in shared folders give nothing).
        argus_supervise::privs::confine(&mut cmd, self.cfg.ray_user.as_ref());
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        // Ray's token in its environment, never argv (Ray forwards RAY_*
        // variables to the Ray workers it starts in engine containers).
        match &token {
            Some(t) => {
                cmd.env("RAY_AUTH_MODE", "token").env("RAY_AUTH_TOKEN", t);
            }
            None => {
                warn!(
                    "RAY_AUTH_MODE=disabled: Ray starts WITHOUT token authentication; anyone who \
                     reaches the dashboard ({}) or the GCS ({}) runs any command on this cluster (unsafe)",
                    self.cfg.dashboard_port, self.cfg.ray_port
                );
                cmd.env("RAY_AUTH_MODE", "disabled")
                    .env_remove("RAY_AUTH_TOKEN");
            }
        }
        cmd.env_remove("RAY_AUTH_TOKEN_PATH");
        let mut secret = None;
        match (&target, &self.cfg.gcs_ft_redis) {
            // R-WRK-7 on the head: the GCS keeps its tables in Redis, under
            // a namespace per cluster so clusters can share one Redis
            // (what KubeRay does for `ray start`).
            (None, Some(redis)) => {
                cmd.env("RAY_REDIS_ADDRESS", &redis.address);
                cmd.env("RAY_external_storage_namespace", &self.cfg.cluster_name);
                if let Some(u) = &redis.username {
                    args.insert(1, format!("--redis-username={u}"));
                }
                let password = match (&redis.password, &self.cfg.gcs_ft_password_file) {
                    (Some(p), _) => Some(p.clone()),
                    (None, Some(f)) => match super::auth::read_secret(f) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            error!(file = %f.display(), error = %e,
                                "cannot read the Redis password (ARGUS_GCS_FT_REDIS_PASSWORD_FILE); retrying");
                            metrics::ray_exited(RayExitKind::StartFailed);
                            self.after_ray_ended(Exit::Code(78), Duration::ZERO, false);
                            return;
                        }
                    },
                    (None, None) => None,
                };
                // Ray 2.53 takes the password on `ray start`'s command line
                // only (and gives it to gcs_server the same way): it is
                // hidden from the agent's logs, not from the head's ps.
                if let Some(p) = password {
                    args.insert(1, format!("--redis-password={p}"));
                    secret = Some(p);
                }
            }
            // A worker of a fault-tolerant head waits for the GCS to come
            // back as long as the zombie guard allows, instead of Ray's
            // default 60 s after which the raylet exits.
            (Some(t), _) if t.gcs_ft => {
                cmd.env(
                    "RAY_gcs_rpc_server_reconnect_timeout_s",
                    self.cfg.gcs_ft_zombie.as_secs().max(1).to_string(),
                );
            }
            _ => {}
        }
        cmd.args(&args);
        let shown: Vec<String> = match &secret {
            Some(p) => args.iter().map(|a| a.replace(p.as_str(), "***")).collect(),
            None => args.clone(),
        };
        let tx = self.tx.clone();
        let instance_id = match &target {
            Some(t) => t.instance_id.clone(),
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        match reaper::spawn_with(&mut cmd, move |exit| {
            let _ = tx.send(Event::RayExited { run, exit });
        }) {
            Ok(pid) => {
                self.ray_pid.store(pid as i32, Ordering::Relaxed);
                info!(pid, run, ray = %self.cfg.ray_bin, args = ?shown, "started ray");
                metrics::ray_started();
                let head = target.is_none();
                let started = Instant::now();
                self.ray = Some(RayRun {
                    run,
                    pid,
                    started,
                    started_wall: SystemTime::now(),
                    watch: RayWatch::new(head),
                    instance_id,
                    target: target.clone(),
                    serving: false,
                    gcs_accepts: false,
                    raylet_up: false,
                    next_check: started,
                    stopping: false,
                    daemon_died: false,
                    exit_watch: None,
                    exit_watch_tried: false,
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
                metrics::ray_exited(RayExitKind::StartFailed);
                self.after_ray_ended(Exit::Code(code), Duration::ZERO, false);
            }
        }
    }

    /// The token this start's Ray runs with (None: authentication is
    /// disabled), the node's copy written; Err: why Ray cannot start now
    /// (a worker before its head made the cluster's token, a refused file).
    fn ray_token(&mut self, head: bool) -> Result<Option<String>, String> {
        use argus_discovery::token;
        let copy = super::auth::state_copy(&self.cfg);
        if !self.cfg.ray_auth {
            super::auth::remove_state_copy(&copy);
            return Ok(None);
        }
        let given = super::auth::given(
            std::env::var("RAY_AUTH_TOKEN").ok().as_deref(),
            std::env::var("RAY_AUTH_TOKEN_PATH").ok().as_deref(),
            &copy,
        );
        let token = match super::auth::operator_token(&given)? {
            Some(t) => t,
            None => {
                let path = token::token_path(&self.cfg.head_file);
                let shown = path.display().to_string();
                let got = self.storage.run(
                    "read the cluster's token",
                    super::STORAGE_BOUND,
                    move || {
                        if head {
                            token::read_or_create_token(&path, token::generate)
                        } else {
                            token::read_token(&path).map(|t| (t, false))
                        }
                    },
                );
                match got {
                    Ok(Ok((t, made))) => {
                        if made {
                            info!(path = %shown, "made the cluster's Ray token");
                        }
                        t
                    }
                    Ok(Err(e)) => return Err(format!("the cluster's Ray token: {e}")),
                    Err(e) => return Err(format!("the cluster's Ray token {shown}: {e}")),
                }
            }
        };
        let gid = self.cfg.ray_user.as_ref().map(|u| u.gid);
        super::auth::write_state_copy(&copy, &token, gid)
            .map_err(|e| format!("cannot write {}: {e}", copy.display()))?;
        Ok(Some(token))
    }

    pub(super) fn on_ray_exit(&mut self, run: u64, exit: Exit) {
        let Some(r) = self.ray.as_ref().filter(|r| r.run == run) else {
            debug!(run, %exit, "exit of a ray run already handled");
            return;
        };
        // During a drain Ray's end is the drain's (Ray shuts a drained,
        // idle node down itself): no restart.
        let (pid, ran, on_purpose, daemon_died) = (
            r.pid,
            r.started.elapsed(),
            r.stopping || self.drain.is_some(),
            r.daemon_died,
        );
        let joined = r.target.clone();
        self.ray = None;
        self.ray_pid.store(0, Ordering::Relaxed);
        // Ray's own children may outlive `ray start` (agents, idle workers).
        let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let swept = self.sweep(Duration::from_secs(2));
        if on_purpose {
            info!(pid, %exit, swept, "ray stopped");
            if let Some(d) = self.drain.as_mut() {
                d.on(super::drain::Input::RayExited, Instant::now());
                self.drain_step();
            }
            return;
        }
        warn!(pid, %exit, ran_s = ran.as_secs_f64(), swept, "ray exited unexpectedly");
        metrics::ray_exited(match exit {
            _ if daemon_died => RayExitKind::DaemonDied,
            Exit::Code(0) => RayExitKind::Clean,
            Exit::Code(_) => RayExitKind::Error,
            Exit::Signal(_) => RayExitKind::Signal,
        });
        self.after_ray_ended(exit, ran, true);
        R::on_ray_ended(self, joined);
    }

    /// Withdraws (head) and schedules the restart with backoff.
    pub(super) fn after_ray_ended(&mut self, exit: Exit, ran: Duration, count: bool) {
        R::withdraw_within(self, super::STORAGE_BOUND);
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
    pub(super) fn stop_ray_now(&mut self, why: &str) {
        let Some(r) = self.ray.as_mut() else { return };
        r.stopping = true;
        let (pid, run) = (r.pid, r.run);
        info!(pid, why, "stopping ray");
        metrics::ray_exited(RayExitKind::StoppedByAgent);
        let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        self.wait_ray_exit(run, Duration::from_secs(3));
    }

    /// Waits for run `run` to exit, keeping other events for later.
    pub(super) fn wait_ray_exit(&mut self, run: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.ray.as_ref().is_some_and(|r| r.run == run) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.rx.recv_timeout(left) {
                Ok(Event::RayExited { run: r, exit }) => self.on_ray_exit(r, exit),
                // Only a repeated request: the first signal's own event
                // may come after the stop began (its request came first).
                Ok(Event::StopAgain(sig)) if self.state == NodeState::Stopping => {
                    info!(?sig, "stop requested twice: killing ray now");
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

    /// Scans Ray's process tree: a watched daemon (raylet; GCS on the head)
    /// that was seen and is gone or a zombie is the node's death. Once all
    /// were seen, their exit is awaited by pidfd instead ([`ExitWatch`]).
    pub(super) fn watch_ray(&mut self) {
        let Some(r) = self.ray.as_mut() else { return };
        self.tree.refresh();
        let desc = self.tree.descendants(r.pid);
        if let Some((name, pid)) = r.watch.check(&desc) {
            warn!(
                name,
                pid, "ray daemon died; treating it as the node's death"
            );
            r.daemon_died = true;
            let (rpid, run) = (r.pid, r.run);
            // Give `ray start` no chance to block on: kill the group.
            let _ = signal::killpg(Pid::from_raw(rpid as i32), Signal::SIGKILL);
            self.wait_ray_exit(run, Duration::from_secs(3));
            return;
        }
        if r.exit_watch_tried {
            return;
        }
        let Some(daemons) = r.watch.all_seen() else {
            return;
        };
        r.exit_watch_tried = true;
        let (tx, run) = (self.tx.clone(), r.run);
        let on_exit = move |name, pid| {
            let _ = tx.send(Event::DaemonExited { run, name, pid });
        };
        match ExitWatch::start(&daemons, on_exit) {
            Ok(w) => {
                debug!(
                    ?daemons,
                    "waiting for the ray daemons' exit by pidfd (no more scans)"
                );
                r.exit_watch = Some(w);
            }
            Err(e) => {
                debug!(error = %e, "cannot wait for the ray daemons by pidfd; scanning every second")
            }
        }
    }

    /// A watched daemon of run `run` exited: scans once to confirm and act.
    pub(super) fn on_daemon_exit(&mut self, run: u64, name: &str, pid: u32) {
        let Some(r) = self.ray.as_mut().filter(|r| r.run == run) else {
            return;
        };
        debug!(name, pid, "a watched ray daemon exited; scanning");
        r.exit_watch = None;
        self.last_watch = Instant::now();
        self.watch_ray();
    }
}

/// Removes `name` from the folder `dir`, opened without following a link:
/// `dir`'s parent through trusted folders only, then `dir` itself with
/// `O_NOFOLLOW` (it may be another user's), then `unlinkat`.
fn remove_in_own_folder(dir: &std::path::Path, name: &str) -> std::io::Result<()> {
    use argus_discovery::trust;
    use std::os::fd::AsRawFd;
    let (parent, last) = trust::split(dir)?;
    let parent = trust::open_dir(parent, false).map_err(std::io::Error::from)?;
    let own = trust::open_at(
        parent.as_raw_fd(),
        last,
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?;
    trust::unlink_at(own.as_raw_fd(), std::ffi::OsStr::new(name))
}

#[cfg(test)]
mod remove_tests {
    use super::remove_in_own_folder;

    /// R-SEC-2: a Ray temp dir swapped for a link to another folder makes
    /// root remove nothing there; the real folder's entry is removed.
    #[test]
    fn a_swapped_ray_temp_dir_is_not_followed() {
        let top = tempfile::tempdir().unwrap();
        let victim = top.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("ray_current_cluster"), "x").unwrap();
        let ray = top.path().join("ray");
        std::os::unix::fs::symlink(&victim, &ray).unwrap();
        assert!(remove_in_own_folder(&ray, "ray_current_cluster").is_err());
        assert!(victim.join("ray_current_cluster").exists());
        std::fs::remove_file(&ray).unwrap();
        std::fs::create_dir(&ray).unwrap();
        std::fs::write(ray.join("ray_current_cluster"), "x").unwrap();
        remove_in_own_folder(&ray, "ray_current_cluster").unwrap();
        assert!(!ray.join("ray_current_cluster").exists());
    }
}
