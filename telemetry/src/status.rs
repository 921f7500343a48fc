//! This node's status (R-OPS-1), written atomically to
//! `ARGUS_STATE_DIR/status.json` on every change and every few seconds, and
//! read back by `argus-agent status` and `argus-agent healthcheck`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// How often the running agent rewrites its status even without changes
/// (a third of [`STALE_AFTER`]: two missed beats are still healthy). The
/// rewrite rides on whatever wakes the agent once the status is this old
/// (a worker's record reads come every poll period); the agent wakes for it
/// alone only at [`HEARTBEAT_LATEST`].
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// The oldest the status gets before the agent wakes just to rewrite it.
pub const HEARTBEAT_LATEST: Duration = Duration::from_secs(15);

/// A status older than this means the agent is hung or gone.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// What the node is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Starting,
    /// Head: another live head holds the record.
    Standby,
    /// Worker: no fresh head record to join.
    WaitingForHead,
    /// Ray started, not yet serving (head: GCS not accepting yet).
    RayStarting,
    Running,
    /// Ray exited; waiting out the restart backoff.
    Backoff,
    /// Worker: stopped on purpose, draining before Ray stops (R-SERVE-4).
    Draining,
    Stopping,
    Stopped,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = serde_json::to_value(self).ok();
        f.write_str(s.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
    }
}

/// The status document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub role: String,
    pub state: NodeState,
    /// Why the node is in this state, in words.
    pub reason: String,
    pub state_since: String,
    pub agent_pid: u32,
    pub node_ip: String,
    pub node_ip_source: String,
    pub head_address: Option<String>,
    pub head_instance_id: Option<String>,
    pub head_generation: Option<u64>,
    /// Seconds since this node last saw the head record change.
    pub head_record_age_s: Option<f64>,
    pub ray_pid: Option<u32>,
    pub ray_started_at: Option<String>,
    pub restarts: u64,
    pub consecutive_failures: u32,
    pub crash_loop: bool,
    pub last_exit: Option<String>,
    pub next_restart_in_s: Option<f64>,
    /// Head: the rule that decided the last takeover or standby
    /// (R-HEAD-5), with its evidence.
    #[serde(default)]
    pub takeover: Option<String>,
    /// Worker: what the last probes of the head's GCS found when the record
    /// stopped changing (e.g. "refusing connections for 12 s").
    #[serde(default)]
    pub head_gcs: Option<String>,
    /// GCS fault tolerance (R-WRK-7) is on in the record this node follows
    /// or publishes.
    #[serde(default)]
    pub gcs_ft: bool,
    /// Worker file events: `on`, `off`, or `degraded to polling: <why>`
    /// (inotify limits reached; polling alone).
    #[serde(default)]
    pub file_events: String,
    /// Worker: `serving` while this node's Ray Serve proxy answers its
    /// health check (the load balancer can send it requests), else
    /// `not_serving`; absent on a head or before the first check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_proxy: Option<String>,
    /// Whether engine containers can start on this node: `available`, or
    /// `unavailable: <why and the fix>` (the Docker socket DOCKER_HOST names
    /// is missing or the agent cannot open it, found at start); absent when
    /// the agent did not check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_containers: Option<String>,
    pub updated_at: String,
}

/// Returns the status file path under `state_dir`.
pub fn status_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATUS_FILE)
}

/// The status file's name in the state folder.
pub const STATUS_FILE: &str = "status.json";

/// Writes `status` atomically (readers never see a torn file), without
/// fsync: the state folder is node-local (tmpfs in the image) and the file
/// is rewritten every [`HEARTBEAT`].
pub fn write(
    state_dir: &mut argus_discovery::VolatileDir,
    status: &Status,
) -> Result<(), argus_discovery::PublishError> {
    let mut bytes = serde_json::to_vec_pretty(status).expect("status serialises");
    bytes.push(b'\n');
    state_dir.publish(STATUS_FILE, &bytes)
}

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{path}: cannot read ({source}); is the agent running with this ARGUS_STATE_DIR?")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a status document: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the status file.
pub fn read(state_dir: &Path) -> Result<Status, StatusError> {
    let path = status_path(state_dir);
    let bytes = std::fs::read(&path).map_err(|source| StatusError::Read {
        path: path.clone(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| StatusError::Parse { path, source })
}

/// Returns `Ok(())` if and only if the node is healthy, else why not.
pub fn health(status: &Status, now: SystemTime) -> Result<(), String> {
    let updated = humantime::parse_rfc3339(&status.updated_at)
        .map_err(|_| format!("bad updated_at {:?}", status.updated_at))?;
    let age = now.duration_since(updated).unwrap_or_default();
    if age > STALE_AFTER {
        return Err(format!("status not updated for {}s", age.as_secs()));
    }
    let alive =
        |pid: u32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
    if !alive(status.agent_pid) {
        return Err(format!("agent pid {} is gone", status.agent_pid));
    }
    match status.state {
        NodeState::Running | NodeState::Draining => match status.ray_pid {
            Some(pid) if alive(pid) => Ok(()),
            Some(pid) => Err(format!("ray pid {pid} is gone")),
            None => Err("running without a ray pid".into()),
        },
        NodeState::Standby => Ok(()),
        other => Err(format!("state {other}: {}", status.reason)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(engine_containers: Option<&str>, updated: SystemTime) -> Status {
        let me = std::process::id();
        Status {
            role: "worker".into(),
            state: NodeState::Running,
            reason: "ray runs".into(),
            state_since: humantime::format_rfc3339(updated).to_string(),
            agent_pid: me,
            node_ip: "10.0.0.2".into(),
            node_ip_source: "test".into(),
            head_address: None,
            head_instance_id: None,
            head_generation: None,
            head_record_age_s: None,
            ray_pid: Some(me),
            ray_started_at: None,
            restarts: 0,
            consecutive_failures: 0,
            crash_loop: false,
            last_exit: None,
            next_restart_in_s: None,
            takeover: None,
            head_gcs: None,
            gcs_ft: false,
            file_events: "on".into(),
            serve_proxy: None,
            engine_containers: engine_containers.map(str::to_string),
            updated_at: humantime::format_rfc3339(updated).to_string(),
        }
    }

    #[test]
    fn a_node_without_its_docker_socket_stays_healthy_and_a_stale_one_does_not() {
        // Ray serves without engine containers: a missing Docker socket is
        // said in the status and the metrics, never by the healthcheck
        // (a restart would not bring the socket back).
        let now = SystemTime::now();
        let missing = "unavailable: the Docker socket /run/argus-docker/docker.sock (DOCKER_HOST) cannot be used";
        for e in [None, Some("available"), Some(missing)] {
            assert_eq!(health(&running(e, now), now), Ok(()), "{e:?}");
        }
        let stale = running(Some(missing), now - STALE_AFTER - Duration::from_secs(1));
        assert!(health(&stale, now).unwrap_err().contains("not updated"));
    }
}
