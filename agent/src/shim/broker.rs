//! The agent's podman broker: a unix socket in the node's state folder
//! (`shim.sock`) that only the Ray user (and the agent's own user) may use,
//! checked with `SO_PEERCRED`. Each connection is handed, unread, to a
//! handler process of its own ([`super::handler`]); PID 1 only accepts and
//! spawns, on a thread of its own, so a garbage, huge, slow or silent client
//! costs it nothing but a process slot, and at most [`MAX_CALLS`] calls run
//! at once (beyond that a client gets an error at once).
//!
//! Each handler gets a pipe of its own on descriptor 4 for its report (see
//! [`super::report`]); when the handler exits, the reaper's thread reads
//! it without blocking and records the call in the agent's metrics
//! (`argus_shim_*`, [`crate::metrics`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::client::SOCKET;
use super::handler::CONNECTION_FD;
use super::report::{self, REPORT_FD};
use super::transport::{self, ToClient};
use super::EXIT_SHIM;
use crate::metrics;
use crate::supervise::reaper;

/// The hidden subcommand a handler process runs.
pub const HANDLER_COMMAND: &str = "__shim-handler";

/// How many podman calls may run at once on one node.
pub const MAX_CALLS: usize = 256;

/// Where the broker listens, who may call, and what handlers run.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub state_dir: PathBuf,
    /// This node's shim settings file, passed to every handler.
    pub settings: PathBuf,
    /// The uids that may connect (the Ray user's, the agent's).
    pub allowed_uids: Vec<u32>,
    /// The owner the socket file gets (the Ray user), when the agent is
    /// root.
    pub owner: Option<(u32, u32)>,
}

/// Binds the broker's socket and serves it on a thread; returns its path.
pub fn start(cfg: BrokerConfig) -> io::Result<PathBuf> {
    let path = cfg.state_dir.join(SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    if let Some((uid, gid)) = cfg.owner {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let exe = std::env::current_exe()?;
    let live = Arc::new(AtomicUsize::new(0));
    info!(socket = %path.display(), "podman broker listening");
    std::thread::Builder::new()
        .name("shim-broker".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(conn) => accept(conn, &cfg, &exe, &live),
                    Err(e) => {
                        warn!(error = %e, "podman broker: accept failed");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                }
            }
        })?;
    Ok(path)
}

/// Refuses `conn` with a one-line error.
fn refuse(conn: &UnixStream, why: String) {
    let _ = transport::send(
        conn,
        &ToClient {
            code: EXIT_SHIM,
            error: Some(why),
        },
    );
}

fn accept(conn: UnixStream, cfg: &BrokerConfig, exe: &Path, live: &Arc<AtomicUsize>) {
    let (pid, uid, _) = match transport::peer(&conn) {
        Ok(p) => p,
        Err(e) => {
            debug!(error = %e, "podman broker: no peer credentials");
            return;
        }
    };
    if !cfg.allowed_uids.contains(&uid) {
        warn!(
            pid,
            uid, "podman broker: refused a caller that is not the Ray user"
        );
        refuse(&conn, format!("uid {uid} may not use this node's podman"));
        return;
    }
    if live.fetch_add(1, Ordering::SeqCst) >= MAX_CALLS {
        live.fetch_sub(1, Ordering::SeqCst);
        warn!(pid, "podman broker: too many calls at once");
        refuse(
            &conn,
            format!("{MAX_CALLS} podman calls are already running on this node"),
        );
        return;
    }
    let fd = conn.as_raw_fd();
    let (report_rx, report_tx) = match report_pipe() {
        Ok(p) => p,
        Err(e) => {
            live.fetch_sub(1, Ordering::SeqCst);
            warn!(error = %e, "podman broker: cannot create a report pipe");
            refuse(&conn, format!("the node agent cannot start a handler: {e}"));
            return;
        }
    };
    let tx = report_tx.as_raw_fd();
    let mut cmd = Command::new(exe);
    cmd.arg(HANDLER_COMMAND)
        .arg(&cfg.settings)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe. The report's write
    // end is above REPORT_FD (see `report_pipe`), so placing the connection
    // cannot overwrite it; dup2 leaves both targets inherited.
    unsafe {
        cmd.pre_exec(move || {
            if fd == CONNECTION_FD {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, CONNECTION_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::dup2(tx, REPORT_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let done = live.clone();
    let started = Instant::now();
    let spawned = reaper::spawn_with(&mut cmd, move |exit| {
        done.fetch_sub(1, Ordering::SeqCst);
        let took = started.elapsed();
        // The handler has exited: what it wrote is in the pipe.
        let r = report::read(report_rx.as_fd());
        record(&r, took);
        debug!(pid, %exit, command = r.command, code = ?r.code, refusal = ?r.refusal, ?took, "podman call ended");
    });
    // Only the handler holds the write end now: a handler that dies
    // without writing leaves an empty pipe.
    drop(report_tx);
    match spawned {
        Ok(handler) => debug!(pid, uid, handler, "podman call accepted"),
        Err(e) => {
            live.fetch_sub(1, Ordering::SeqCst);
            warn!(error = %e, "podman broker: cannot start a handler");
            refuse(&conn, format!("the node agent cannot start a handler: {e}"));
        }
    }
}

/// Creates a call's report pipe: the read end non-blocking (the broker
/// reads it from the reaper's thread once the handler exited), both ends
/// close-on-exec (no other child of PID 1 inherits them; the handler gets
/// the write end on [`REPORT_FD`] by dup2), and the write end numbered
/// above [`REPORT_FD`] and [`CONNECTION_FD`].
fn report_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(&rx, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let high = fcntl(&tx, FcntlArg::F_DUPFD_CLOEXEC(REPORT_FD + 1))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor this process owns.
    let tx = unsafe { OwnedFd::from_raw_fd(high) };
    Ok((rx, tx))
}

/// Records a call's report (or its absence) in the agent's metrics.
fn record(r: &report::Checked, took: Duration) {
    metrics::shim_call(r.command, took);
    if let Some(rule) = r.refusal {
        metrics::shim_refusal(rule);
    }
    if r.created > 0 {
        metrics::shim_created(r.created);
    }
    if r.removed > 0 {
        metrics::janitor_removed(r.removed);
    }
}

/// Returns the warnings about this node's Docker socket: the agent cannot
/// open it, or Ray's user can (then any Ray task is root on the host).
pub fn socket_warnings(docker_host: Option<&str>, ray_uid: u32, ray_gid: u32) -> Vec<String> {
    let path = match docker_host {
        Some(h) => match h.strip_prefix("unix://") {
            Some(p) => p.to_string(),
            None => {
                return vec![format!(
                    "DOCKER_HOST={h} is not a unix socket: anything that can reach that address can use the daemon, Ray's user included"
                )]
            }
        },
        None => "/var/run/docker.sock".into(),
    };
    let Ok(meta) = std::fs::metadata(&path) else {
        return vec![];
    };
    let mut out = Vec::new();
    if let Err(e) = UnixStream::connect(&path) {
        out.push(format!(
            "the agent cannot open the Docker socket {path} ({e}): engine containers will fail; run the node container as root (the node image's default)"
        ));
    }
    if crate::supervise::privs::can_connect(&meta, ray_uid, &[ray_gid]) {
        use std::os::unix::fs::MetadataExt;
        out.push(format!(
            "Ray's user (uid {ray_uid}, gid {ray_gid}) can open the Docker socket {path} (owner {}, group {}, mode {:o}): any Ray task is root on the host; set ARGUS_RAY_USER to a user without the socket's group (compose: no group_add)",
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        ));
    }
    out
}
