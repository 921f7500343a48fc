//! The agent's podman broker: a unix socket in the node's state folder
//! (`shim.sock`) that only the Ray user (and the agent's own user) may use,
//! checked with `SO_PEERCRED`. Each connection is handed, unread, to a
//! handler process of its own ([`super::handler`]); PID 1 only accepts and
//! spawns, on a thread of its own, so a garbage, huge, slow or silent client
//! costs it nothing but a process slot for at most the handler's request
//! deadline ([`super::handler::REQUEST_DEADLINE`]), and at most
//! [`MAX_CALLS_PER_JOB`] calls of one Ray job, [`MAX_CALLS_PER_UID`] of
//! one uid and [`MAX_CALLS`] in all run at once (beyond that a client gets
//! a one-line error at once, 125): R-SEC-5.
//!
//! Each handler gets a pipe of its own on descriptor 4 for its report (see
//! [`super::report`]); when the handler exits, the reaper's thread reads
//! it without blocking and records the call in the agent's metrics
//! (`argus_shim_*`, [`argus_telemetry::metrics`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use argus_podman_core::docker_host::DockerHost;

use super::client::SOCKET;
use super::handler::{CONNECTION_FD, CREATE_LOCK_FD};
use super::report::{self, REPORT_FD};
use super::transport::{self, ToClient};
use crate::error::EXIT_SHIM;
use argus_supervise::reaper;
use argus_telemetry::metrics;

/// The hidden subcommand a handler process runs.
pub const HANDLER_COMMAND: &str = "__shim-handler";

/// How many podman calls one uid may have at once on one node, pending
/// (a handler waiting for the request, at most
/// [`super::handler::REQUEST_DEADLINE`]) or running (R-SEC-5). Above
/// 256: that many stalled clients of the Ray user leave room for its real
/// calls, and each is dropped within the deadline.
pub const MAX_CALLS_PER_UID: usize = 512;

/// How many podman calls may run at once on one node, all uids together.
pub const MAX_CALLS: usize = 1024;

/// How many podman calls one Ray job may have at once on one node (its
/// [`Share`]), within its uid's [`MAX_CALLS_PER_UID`]: every job runs as
/// the Ray user, so without it one job holding long calls (`logs -f`,
/// attached runs) would leave the others none. Four jobs at their bound
/// fill the uid's places; Ray's own starts still have [`RAY_RESERVE`].
pub const MAX_CALLS_PER_JOB: usize = 128;

/// How many podman calls of one uid that come from no Ray job (its
/// [`Share::Unattributed`]) may run at once on one node: the uid's bound
/// less one job's, so that they too leave a job its share. An operator's
/// calls and Ray's daemons' come from here; a job's code only by leaving
/// its worker's tree for PID 1, whose janitor ends such a process within
/// its 30 s round.
pub const MAX_CALLS_UNATTRIBUTED: usize = MAX_CALLS_PER_UID - MAX_CALLS_PER_JOB;

/// Whose share of the uid's places a call counts against (R-SEC-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Share {
    /// A Ray job's: the job ID (Ray 2.53's four bytes, as a number) that
    /// this node's raylet gave the Ray worker the call comes from.
    Job(u32),
    /// One share for every other call: an operator's `docker exec`, a Ray
    /// daemon's own call, a process left to PID 1, a worker whose job ID
    /// does not read as one.
    Unattributed,
}

impl Share {
    /// How many calls of one uid this share may have at once on one node.
    pub fn bound(self) -> usize {
        match self {
            Share::Job(_) => MAX_CALLS_PER_JOB,
            Share::Unattributed => MAX_CALLS_UNATTRIBUTED,
        }
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Share::Job(id) => write!(f, "Ray job {id:08x}"),
            Share::Unattributed => f.write_str("callers outside any Ray job"),
        }
    }
}

/// The most of a process's environment [`share_of`] reads.
const MAX_ENVIRON: u64 = 1 << 20;

/// The share of a call whose [`lifetime_owner`] is `owner`: when `owner` is
/// a Ray worker this node's raylet started (its parent is a process named
/// `raylet` whose parent is `ray start`, by pid), the job ID the raylet
/// put in its environment at its start (`RAY_JOB_ID`, exactly eight hex
/// digits, read as a number); otherwise [`Share::Unattributed`]. Only the
/// worker's own environment is read, never the caller's (a task's
/// subprocess may set anything); `environ` gives a pid's environment
/// (NUL-separated, as in /proc/<pid>/environ).
///
/// A job's code runs in that worker and can rewrite its memory, so the
/// share is a fairness bound inside the cluster (one tenant: any job can
/// already kill any other's actors), not a wall between jobs: a job that
/// forges another's ID only moves its own calls into that job's share.
pub fn share_of(
    owner: i32,
    ray: i32,
    stat: impl Fn(i32) -> Option<(i32, String)>,
    environ: impl Fn(i32) -> Option<Vec<u8>>,
) -> Share {
    let worker = ray > 0
        && matches!(stat(owner), Some((parent, _))
            if matches!(stat(parent), Some((up, name)) if up == ray && name == "raylet"));
    if !worker {
        return Share::Unattributed;
    }
    environ(owner)
        .and_then(|env| {
            let value = env
                .split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(b"RAY_JOB_ID="))?;
            (value.len() == 8 && value.iter().all(u8::is_ascii_hexdigit))
                .then(|| u32::from_str_radix(std::str::from_utf8(value).ok()?, 16).ok())?
        })
        .map_or(Share::Unattributed, Share::Job)
}

/// Places kept for the calls this node's Ray makes itself (a direct child
/// of its raylet: a container worker's `podman run`; or of its
/// runtime_env agent: the image probe before such a worker) once their uid is at [`MAX_CALLS_PER_UID`] or the node
/// at [`MAX_CALLS`], at most one per process: a job that holds every
/// ordinary place with its own calls (they all run as the Ray user) does
/// not stop the raylet from starting another job's container workers or
/// Serve replicas. To take this reserve too, a job needs one Ray-started
/// process per place (a worker that execs into a caller).
pub const RAY_RESERVE: usize = 64;

/// Where a call was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Within its share's, the uid's and the node's bounds.
    Shared(Share),
    /// In [`RAY_RESERVE`], by the Ray-started process of this pid.
    Reserved(i32),
}

/// The live calls per share, per uid, and in all.
#[derive(Debug, Default)]
pub struct Calls {
    per_share: std::collections::HashMap<(u32, Share), usize>,
    per_uid: std::collections::HashMap<u32, usize>,
    all: usize,
    /// The Ray-started processes holding a reserved place.
    reserved: std::collections::HashSet<i32>,
}

impl Calls {
    /// Counts a new call of `uid` in `share` and returns where, or returns
    /// the one-line refusal when the share, `uid` or the node is at its
    /// bound and the caller has no reserved place (`ray_started`, asked
    /// only then: the caller's pid when this node's Ray started it).
    pub fn admit(
        &mut self,
        uid: u32,
        share: Share,
        ray_started: impl FnOnce() -> Option<i32>,
    ) -> Result<Place, String> {
        let mine = self.per_uid.get(&uid).copied().unwrap_or(0);
        let ours = self.per_share.get(&(uid, share)).copied().unwrap_or(0);
        let why = if ours >= share.bound() {
            format!(
                "{} podman calls of {share} are already running on this node",
                share.bound()
            )
        } else if mine >= MAX_CALLS_PER_UID {
            format!(
                "{MAX_CALLS_PER_UID} podman calls of uid {uid} are already running on this node"
            )
        } else if self.all >= MAX_CALLS {
            format!("{MAX_CALLS} podman calls are already running on this node")
        } else {
            self.per_uid.insert(uid, mine + 1);
            self.per_share.insert((uid, share), ours + 1);
            self.all += 1;
            return Ok(Place::Shared(share));
        };
        match ray_started() {
            Some(pid) if self.reserved.len() < RAY_RESERVE && self.reserved.insert(pid) => {
                Ok(Place::Reserved(pid))
            }
            _ => Err(why),
        }
    }

    /// Counts the end of a call of `uid` counted at `place`.
    pub fn done(&mut self, uid: u32, place: Place) {
        let share = match place {
            Place::Reserved(pid) => {
                self.reserved.remove(&pid);
                return;
            }
            Place::Shared(share) => share,
        };
        fn down<K: std::hash::Hash + Eq>(map: &mut std::collections::HashMap<K, usize>, key: K) {
            if let Some(n) = map.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        down(&mut self.per_uid, uid);
        down(&mut self.per_share, (uid, share));
        self.all = self.all.saturating_sub(1);
    }
}

/// Whether `pid` is a process this node's Ray started: its parent is a
/// process named `raylet` whose parent is `ray start` (`ray`, by pid: the
/// agent's own child, which no job can make a process a child of; a name
/// alone anyone can take), or its parent is that raylet's runtime_env
/// agent (`is_agent(parent, raylet)`: it holds the agent's port, which
/// Ray's agent does and no job's process can while it runs; the agent runs
/// `podman run --rm` to find the worker in an image before every
/// `image_uri` worker). `stat` gives a pid's parent and name.
pub fn started_by_ray(
    pid: i32,
    ray: i32,
    stat: impl Fn(i32) -> Option<(i32, String)>,
    is_agent: impl Fn(i32, i32) -> bool,
) -> bool {
    let raylet =
        |p: i32| ray > 0 && matches!(stat(p), Some((up, name)) if up == ray && name == "raylet");
    let Some((parent, _)) = stat(pid) else {
        return false;
    };
    if raylet(parent) {
        return true;
    }
    matches!(stat(parent), Some((up, _)) if raylet(up) && is_agent(parent, up))
}

/// How far up a caller's ancestry [`lifetime_owner`] looks.
const MAX_ANCESTRY: usize = 256;

/// The process a detached container of `pid`'s call lives as long as
/// (R-SEC-9: nothing a job starts outlives it): the caller's nearest
/// ancestor whose parent is this run's raylet (the Ray worker running the
/// job's task: Ray ends a job's workers when the job ends) or `ray start`
/// itself (a Ray daemon); for a caller outside Ray's tree, its outermost
/// ancestor in this PID namespace (an operator's `docker exec`: the exec'd
/// process; a process left to PID 1 or to the raylet's subreaper: itself).
/// An ancestor gone during the walk ends it at the last live one (a
/// shorter life, never a longer one). `None` when the caller is gone.
/// `stat` gives a pid's parent and name; `ray` is `ray start`'s pid (0
/// while Ray does not run).
pub fn lifetime_owner(
    pid: i32,
    ray: i32,
    stat: impl Fn(i32) -> Option<(i32, String)>,
) -> Option<i32> {
    let (mut parent, _) = stat(pid)?;
    let mut p = pid;
    for _ in 0..MAX_ANCESTRY {
        if parent <= 1 || (ray > 0 && parent == ray) {
            return Some(p);
        }
        let Some((up, name)) = stat(parent) else {
            return Some(p);
        };
        if ray > 0 && up == ray && name == "raylet" {
            return Some(p);
        }
        p = parent;
        parent = up;
    }
    Some(p)
}

/// The runtime_env agent's port on a raylet's command line
/// (`--runtime_env_agent_port=N`, NUL-separated as in /proc/<pid>/cmdline).
fn agent_port(cmdline: &[u8]) -> Option<u16> {
    cmdline
        .split(|b| *b == 0)
        .find_map(|a| a.strip_prefix(b"--runtime_env_agent_port="))
        .and_then(|p| std::str::from_utf8(p).ok()?.parse().ok())
}

/// The inodes of the sockets listening on `port` in a /proc/net/tcp or
/// tcp6 table.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            (local == port && *f.get(3)? == "0A").then(|| f.get(9).map(|i| i.to_string()))?
        })
        .collect()
}

/// Whether `pid` holds a socket listening on the runtime_env agent port
/// the raylet `raylet` was started with.
fn is_runtime_env_agent(pid: i32, raylet: i32) -> bool {
    let Some(port) = std::fs::read(format!("/proc/{raylet}/cmdline"))
        .ok()
        .and_then(|c| agent_port(&c))
    else {
        return false;
    };
    let inodes: Vec<String> = ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|t| listening_inodes(&t, port))
        .collect();
    if inodes.is_empty() {
        return false;
    }
    socket_inodes_of(pid).is_some_and(|held| held.iter().any(|i| inodes.contains(i)))
}

/// The inodes of the sockets `pid` holds (its descriptor links).
fn socket_inodes_of(pid: i32) -> Option<Vec<String>> {
    as_owner_of(pid, || {
        let links = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        Some(
            links
                .flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_str()?;
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect(),
        )
    })
}

/// `pid`'s environment as it was at its start (/proc/<pid>/environ, at
/// most [`MAX_ENVIRON`] bytes), or `None` if the process changed (another
/// start time after the read: a reused pid) or cannot be read.
fn environ_of(pid: i32) -> Option<Vec<u8>> {
    use std::io::Read;
    let start = crate::docker::process_start(pid as u32)?;
    let env = as_owner_of(pid, || {
        let mut env = Vec::new();
        std::fs::File::open(format!("/proc/{pid}/environ"))
            .ok()?
            .take(MAX_ENVIRON)
            .read_to_end(&mut env)
            .ok()?;
        Some(env)
    })?;
    (crate::docker::process_start(pid as u32)? == start).then_some(env)
}

/// Runs `read` (a read of `pid`'s /proc files) with `pid`'s file-system
/// identity. Reading another user's descriptor links or environment takes
/// CAP_SYS_PTRACE, which the node container does not have, or the same
/// file-system identity as the process: so `read` runs on a thread of its
/// own that takes the process's uid and gid as its fsuid and fsgid (per
/// thread; the thread ends with the read).
fn as_owner_of<T: Send>(pid: i32, read: impl FnOnce() -> Option<T> + Send) -> Option<T> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let id = |key: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let (uid, gid) = (id("Uid:")?, id("Gid:")?);
    std::thread::scope(|s| {
        // A thread that cannot start is no proof: nothing read (never a
        // panic on PID 1's broker thread).
        let reader = std::thread::Builder::new().spawn_scoped(s, || {
            // SAFETY: plain numbers; the identity is this thread's alone.
            unsafe {
                libc::setfsgid(gid);
                libc::setfsuid(uid);
            }
            read()
        });
        reader.ok()?.join().ok()?
    })
}

/// A process's parent pid and name (`comm`), from `/proc/<pid>/stat`.
fn parent_and_name(pid: i32) -> Option<(i32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, name))
}

type Live = Arc<std::sync::Mutex<Calls>>;

fn lock(live: &Live) -> std::sync::MutexGuard<'_, Calls> {
    live.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    /// The pid of this node's `ray start` (0: none), kept by the node:
    /// calls of the processes its raylet started may use [`RAY_RESERVE`].
    pub ray_pid: Arc<std::sync::atomic::AtomicI32>,
    /// The node's stop: once it is requested no new call is served (its
    /// container would outlive the node: the janitor's removals at the stop
    /// run while Ray stops).
    pub stop: argus_supervise::Stop,
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
    let live: Live = Arc::default();
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

fn accept(conn: UnixStream, cfg: &BrokerConfig, exe: &Path, live: &Live) {
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
    if cfg.stop.is_requested() {
        debug!(pid, uid, "podman broker: refused a call during the stop");
        refuse(
            &conn,
            "this node is stopping: it starts no podman call".into(),
        );
        return;
    }
    let ray = cfg.ray_pid.load(std::sync::atomic::Ordering::Relaxed);
    let by_ray = pid > 0 && started_by_ray(pid, ray, parent_and_name, is_runtime_env_agent);
    let ray_started = || by_ray.then_some(pid);
    // Decided here, by PID 1, once: the caller's word is never asked.
    let owner = (pid > 0)
        .then(|| lifetime_owner(pid, ray, parent_and_name))
        .flatten();
    let share = owner.map_or(Share::Unattributed, |o| {
        share_of(o, ray, parent_and_name, environ_of)
    });
    let admitted = lock(live).admit(uid, share, ray_started);
    let place = match admitted {
        Ok(place) => place,
        Err(why) => {
            warn!(pid, uid, %share, "podman broker: too many calls at once");
            refuse(&conn, why);
            return;
        }
    };
    if let Place::Reserved(_) = place {
        info!(
            pid,
            uid, "podman broker: a call of Ray's own took a reserved place"
        );
    }
    let fd = conn.as_raw_fd();
    let (report_rx, report_tx) = match report_pipe() {
        Ok(p) => p,
        Err(e) => {
            lock(live).done(uid, place);
            warn!(error = %e, "podman broker: cannot create a report pipe");
            refuse(&conn, format!("the node agent cannot start a handler: {e}"));
            return;
        }
    };
    let tx = report_tx.as_raw_fd();
    let lifetime = owner.map_or_else(
        || "-".to_string(),
        |owner| {
            // Unreadable: gone already, so its containers go at the next sweep.
            let start = crate::docker::process_start(owner as u32).unwrap_or(0);
            format!("{owner}:{start}")
        },
    );
    // The job whose own engine containers this call's count among
    // (ARGUS_SHIM_MAX_ENGINES_PER_JOB): not for Ray's own worker starts,
    // which Ray's resources bound.
    let job = match share {
        Share::Job(id) if !by_ray => format!("{id:08x}"),
        _ => "-".to_string(),
    };
    let create_lock = match create_lock(&cfg.state_dir) {
        Ok(l) => l,
        Err(e) => {
            lock(live).done(uid, place);
            warn!(error = %e, "podman broker: cannot open the create lock");
            refuse(&conn, format!("the node agent cannot start a handler: {e}"));
            return;
        }
    };
    let lock_fd = create_lock.as_raw_fd();
    let mut cmd = Command::new(exe);
    cmd.arg(HANDLER_COMMAND)
        .arg(&cfg.settings)
        .arg(lifetime)
        .arg(job)
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
            if libc::dup2(lock_fd, CREATE_LOCK_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let done = live.clone();
    let state_dir = cfg.state_dir.clone();
    let started = Instant::now();
    let spawned = reaper::spawn_with(&mut cmd, move |exit| {
        lock(&done).done(uid, place);
        let took = started.elapsed();
        // The handler has exited: what it wrote is in the pipe.
        let (r, created) = report::read_with_ids(report_rx.as_fd());
        record(&r, took);
        // PID 1 keeps the record of this node's containers (the janitor
        // removes only those, by full ID).
        for id in &created {
            if let Err(e) = crate::janitor::record_in(&state_dir, id) {
                warn!(id, error = %e, "cannot record an engine container");
            }
        }
        for flag in r.ignored_flags() {
            if argus_podman_core::args::RAY_OWN_GLOBALS.contains(&flag) {
                debug!(
                    uid,
                    flag, "Ray's podman flag has no meaning on Docker; ignored"
                );
            } else {
                warn!(
                    uid,
                    flag, "a podman call passed --{flag}, which has no meaning on Docker; ignored"
                );
            }
        }
        debug!(pid, %exit, command = r.command, code = ?r.code, refusal = ?r.refusal, ?took, "podman call ended");
    });
    // Only the handler holds the write end now: a handler that dies
    // without writing leaves an empty pipe. PID 1 never takes the lock.
    drop(report_tx);
    drop(create_lock);
    match spawned {
        Ok(handler) => debug!(pid, uid, handler, "podman call accepted"),
        Err(e) => {
            lock(live).done(uid, place);
            warn!(error = %e, "podman broker: cannot start a handler");
            refuse(&conn, format!("the node agent cannot start a handler: {e}"));
        }
    }
}

/// The node's create lock file (`runner::job_slot`), in the state folder.
pub const CREATE_LOCK: &str = "shim-create.lock";

/// Opens the node's lock file for one handler (its create lock and its
/// `logs -f` slots, [`super::nodelock`]): an opening of its own (the
/// handler's byte-range locks belong to the opening, so openings exclude
/// each other), read-write (a write lock needs it; the bytes are never
/// written), created root's and 0600 when missing, no link followed,
/// numbered above [`CREATE_LOCK_FD`] so that placing the connection and the
/// report pipe cannot overwrite it.
fn create_lock(state_dir: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, open, FcntlArg, OFlag};
    use nix::sys::stat::Mode;
    let fd = open(
        &state_dir.join(CREATE_LOCK),
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    let high = fcntl(&fd, FcntlArg::F_DUPFD_CLOEXEC(CREATE_LOCK_FD + 1))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Creates a call's report pipe: the read end non-blocking (the broker
/// reads it from the reaper's thread once the handler exited), both ends
/// close-on-exec (no other child of PID 1 inherits them; the handler gets
/// the write end on [`REPORT_FD`] by dup2), and the write end numbered
/// above [`CREATE_LOCK_FD`], [`REPORT_FD`] and [`CONNECTION_FD`].
fn report_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(&rx, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let high = fcntl(&tx, FcntlArg::F_DUPFD_CLOEXEC(CREATE_LOCK_FD + 1))?;
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

/// The folder the node image keeps the Docker socket in: root's alone
/// (0700), so no other user, and no process with the socket's group that
/// reaches this container's files through `/proc/<pid>/root`, can get to it.
pub const SOCKET_FOLDER: &str = "/run/argus-docker";

/// Why the Docker socket at `docker_host` (a `unix://` address, or the
/// default) is not in a folder only root can enter (SPEC R-SEC-4), if it is
/// not: the folder that really holds it (links resolved) must be root's and
/// give its group and others no search (x) right. `None` when the socket is
/// safe, is not a unix socket, or does not exist (then nothing can reach it).
pub fn socket_folder_problem(docker_host: &DockerHost) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let path = docker_host.socket_path()?;
    let real = std::fs::canonicalize(path).ok()?;
    let folder = real.parent()?;
    let meta = std::fs::metadata(folder).ok()?;
    if meta.uid() == 0 && meta.mode() & 0o011 == 0 {
        return None;
    }
    Some(format!(
        "the Docker socket {path} is in {} (owner {}, mode {:o}), which other users can enter: a process with the socket's group could reach it through /proc/<pid>/root; mount the socket at {SOCKET_FOLDER}/docker.sock (the node image's root-only folder) and set DOCKER_HOST=unix://{SOCKET_FOLDER}/docker.sock",
        folder.display(),
        meta.uid(),
        meta.mode() & 0o7777
    ))
}

/// Where older `docker run` lines, compose files and platform templates
/// mount the host's Docker socket (`-v /var/run/docker.sock:/var/run/docker.sock`).
pub const USUAL_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/docker.sock"];

/// What the agent found of this node's Docker socket at start.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SocketCheck {
    /// Why engine containers will fail on this node (the socket is missing
    /// or the agent cannot open it), with the fix; `None` when the agent
    /// could open it.
    pub unavailable: Option<String>,
    /// Every warning to log, `unavailable` first.
    pub warnings: Vec<String>,
}

/// Checks this node's Docker socket: the agent cannot open it (missing:
/// then, when a socket is at one of `usual` instead, the exact mount that
/// puts it where DOCKER_HOST says), or Ray's user can (then any Ray task is
/// root on the host).
pub fn check_socket(
    docker_host: &DockerHost,
    ray_uid: u32,
    ray_gid: u32,
    usual: &[&str],
) -> SocketCheck {
    let Some(path) = docker_host.socket_path() else {
        return SocketCheck {
            unavailable: None,
            warnings: vec![format!(
                "DOCKER_HOST={docker_host} is not a unix socket: anything that can reach that address can use the daemon, Ray's user included"
            )],
        };
    };
    let mut check = SocketCheck::default();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            let found = usual.iter().find(|p| {
                use std::os::unix::fs::FileTypeExt;
                **p != path && std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
            });
            let fix = match found {
                Some(p) => format!(
                    "a Docker socket is mounted at {p} instead: mount it where the node image expects it, `-v /var/run/docker.sock:{path}` (compose: `- /var/run/docker.sock:{path}` under volumes), in place of the mount at {p}"
                ),
                None => format!(
                    "mount the host's Docker socket there: `-v /var/run/docker.sock:{path}` (compose: `- /var/run/docker.sock:{path}` under volumes)"
                ),
            };
            let why = format!(
                "the Docker socket {path} (DOCKER_HOST) cannot be used ({e}): engine containers (runtime_env container jobs, Serve replicas in engine images) will fail on this node; {fix}"
            );
            check.unavailable = Some(why.clone());
            check.warnings.push(why);
            return check;
        }
    };
    if let Err(e) = UnixStream::connect(path) {
        let why = format!(
            "the agent cannot open the Docker socket {path} ({e}): engine containers will fail; run the node container as root (the node image's default)"
        );
        check.unavailable = Some(why.clone());
        check.warnings.push(why);
    }
    if argus_supervise::privs::can_connect(&meta, ray_uid, &[ray_gid]) {
        use std::os::unix::fs::MetadataExt;
        check.warnings.push(format!(
            "Ray's user (uid {ray_uid}, gid {ray_gid}) can open the Docker socket {path} (owner {}, group {}, mode {:o}): any Ray task is root on the host; set ARGUS_RAY_USER to a user without the socket's group (compose: no group_add)",
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        ));
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 42: a node started with the older mount
    /// (`-v /var/run/docker.sock:/var/run/docker.sock`) says at start that
    /// engine containers will fail and gives the mount that fixes it; with
    /// no socket anywhere, the mount to add; with the socket where
    /// DOCKER_HOST says, nothing.
    #[test]
    fn a_missing_socket_is_unavailable_and_names_the_mount_that_fixes_it() {
        let dir = tempfile::tempdir().unwrap();
        let expected = dir.path().join("argus-docker/docker.sock");
        let old = dir.path().join("var-run-docker.sock");
        let host = DockerHost::parse(Some(&format!("unix://{}", expected.display())));
        let old_s = old.display().to_string();
        let exp_s = expected.display().to_string();

        let none = check_socket(&host, 1000, 100, &[&old_s]);
        let why = none
            .unavailable
            .as_deref()
            .expect("a missing socket is unavailable");
        assert!(
            why.contains(&exp_s) && why.contains("engine containers"),
            "{why}"
        );
        assert!(
            why.contains(&format!("-v /var/run/docker.sock:{exp_s}")),
            "{why}"
        );
        assert!(!why.contains("instead"), "no socket anywhere: {why}");
        assert_eq!(none.warnings, vec![why.to_string()], "one warning");

        let _old = UnixListener::bind(&old).unwrap();
        let moved = check_socket(&host, 1000, 100, &[&old_s]);
        let why = moved.unavailable.as_deref().unwrap();
        assert!(
            why.contains(&format!("mounted at {old_s} instead")),
            "{why}"
        );
        assert!(
            why.contains(&format!("`-v /var/run/docker.sock:{exp_s}`")),
            "{why}"
        );
        assert_eq!(moved.warnings.len(), 1);

        // A plain file at the usual place is no socket.
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").unwrap();
        let f = check_socket(&host, 1000, 100, &[&file.display().to_string()]);
        assert!(!f.unavailable.unwrap().contains("instead"));

        std::fs::create_dir(expected.parent().unwrap()).unwrap();
        let _l = UnixListener::bind(&expected).unwrap();
        let fixed = check_socket(&host, 1000, 100, &[&old_s]);
        assert_eq!(fixed.unavailable, None, "{:?}", fixed.warnings);
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;

    /// The rule (SPEC R-SEC-4): the socket's real folder is root's and no
    /// one else may search it; a link to the socket from a safe folder does
    /// not make an unsafe socket safe.
    #[test]
    fn socket_folder_must_be_roots_alone_after_links() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root to own and chown the folders (CI runs as root)"
        );
        let top = tempfile::tempdir().unwrap();
        let folder = top.path().join("sock");
        std::fs::create_dir(&folder).unwrap();
        let sock = folder.join("docker.sock");
        let _l = UnixListener::bind(&sock).unwrap();
        let host = format!("unix://{}", sock.display());
        for (mode, safe) in [
            (0o700, true),
            (0o755, false),
            (0o710, false),
            (0o701, false),
            (0o744, true),
        ] {
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                socket_folder_problem(&DockerHost::parse(Some(host.as_str()))).is_none(),
                safe,
                "mode {mode:o}"
            );
        }
        // A link in a root-only folder to the socket in an open one.
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let safe = top.path().join("safe");
        std::fs::create_dir(&safe).unwrap();
        std::fs::set_permissions(&safe, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&sock, safe.join("docker.sock")).unwrap();
        let via_link = format!("unix://{}/docker.sock", safe.display());
        assert!(socket_folder_problem(&DockerHost::parse(Some(via_link.as_str()))).is_some());
        // A folder of another owner, even 0700, is not root's alone.
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(&folder, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
        assert!(socket_folder_problem(&DockerHost::parse(Some(host.as_str()))).is_some());
        // Not a unix socket, or missing: nothing to say here.
        assert!(socket_folder_problem(&DockerHost::parse(Some("tcp://127.0.0.1:2375"))).is_none());
        assert!(
            socket_folder_problem(&DockerHost::parse(Some("unix:///nonexistent/docker.sock")))
                .is_none()
        );
    }

    const NONE: Share = Share::Unattributed;

    /// `n` calls of `uid`, each in a share of its own (so that no job's
    /// bound is what refuses).
    fn fill(c: &mut Calls, uid: u32, n: usize) {
        for job in 0..n as u32 {
            let share = Share::Job(job);
            assert_eq!(c.admit(uid, share, || None), Ok(Place::Shared(share)));
        }
    }

    #[test]
    fn calls_are_bounded_per_uid_and_in_all() {
        let mut c = Calls::default();
        fill(&mut c, 1000, MAX_CALLS_PER_UID);
        let why = c.admit(1000, Share::Job(u32::MAX), || None).unwrap_err();
        assert!(why.contains("uid 1000") && !why.contains('\n'), "{why}");
        // Another uid still gets in; one call ended makes room again.
        assert_eq!(c.admit(0, NONE, || None), Ok(Place::Shared(NONE)));
        c.done(1000, Place::Shared(Share::Job(0)));
        assert_eq!(
            c.admit(1000, Share::Job(0), || None),
            Ok(Place::Shared(Share::Job(0)))
        );
        // The node's bound holds over all uids.
        let mut c = Calls::default();
        for uid in 0..MAX_CALLS as u32 {
            assert_eq!(c.admit(uid, NONE, || None), Ok(Place::Shared(NONE)));
        }
        assert!(c
            .admit(u32::MAX, NONE, || None)
            .unwrap_err()
            .contains("already running"));
        for uid in 0..MAX_CALLS as u32 {
            c.done(uid, Place::Shared(NONE));
        }
        assert_eq!((c.all, c.per_uid.len(), c.per_share.len()), (0, 0, 0));
    }

    #[test]
    fn a_job_at_its_bound_leaves_room_for_the_other_jobs() {
        let mut c = Calls::default();
        let (greedy, other) = (Share::Job(0x0300_0000), Share::Job(0x0400_0000));
        for _ in 0..MAX_CALLS_PER_JOB {
            assert_eq!(c.admit(1000, greedy, || None), Ok(Place::Shared(greedy)));
        }
        let why = c.admit(1000, greedy, || None).unwrap_err();
        assert!(
            why.contains("Ray job 03000000") && !why.contains('\n'),
            "{why}"
        );
        // Another job and the callers outside any job still get in, up to
        // their own bound each.
        assert_eq!(c.admit(1000, other, || None), Ok(Place::Shared(other)));
        c.done(1000, Place::Shared(other));
        for _ in 0..MAX_CALLS_UNATTRIBUTED {
            assert_eq!(c.admit(1000, NONE, || None), Ok(Place::Shared(NONE)));
        }
        assert!(c
            .admit(1000, NONE, || None)
            .unwrap_err()
            .contains("outside any Ray job"));
        // Now the uid is full: the callers outside jobs left the greedy
        // job's share to it, and no more. The same job number under
        // another uid is another share.
        assert!(c.admit(1000, Share::Job(5), || None).is_err());
        assert_eq!(c.admit(0, greedy, || None), Ok(Place::Shared(greedy)));
        // One of the greedy job's calls ends: it gets one place back.
        c.done(1000, Place::Shared(greedy));
        assert_eq!(c.admit(1000, greedy, || None), Ok(Place::Shared(greedy)));
        assert!(c.admit(1000, greedy, || None).is_err());
        // A job at its bound still has Ray's reserve for its worker starts.
        assert_eq!(c.admit(1000, greedy, || Some(77)), Ok(Place::Reserved(77)));
    }

    #[test]
    fn rays_own_calls_have_a_reserve_a_job_at_its_bound_cannot_take() {
        let mut c = Calls::default();
        fill(&mut c, 1000, MAX_CALLS_PER_UID);
        let late = Share::Job(u32::MAX);
        // A job's call at the bound: refused. The raylet's child: reserved.
        assert!(c.admit(1000, late, || None).is_err());
        assert_eq!(c.admit(1000, late, || Some(77)), Ok(Place::Reserved(77)));
        // One place per Ray-started process: its second call is refused.
        assert!(c.admit(1000, late, || Some(77)).is_err());
        for pid in 1..RAY_RESERVE as i32 {
            assert_eq!(
                c.admit(1000, late, || Some(1000 + pid)),
                Ok(Place::Reserved(1000 + pid))
            );
        }
        assert!(
            c.admit(1000, late, || Some(5000)).is_err(),
            "the reserve is bounded"
        );
        // A reserved call that ends frees its place, not a shared one.
        c.done(1000, Place::Reserved(77));
        assert_eq!(c.per_uid[&1000], MAX_CALLS_PER_UID);
        assert!(c.admit(1000, late, || None).is_err());
        assert_eq!(c.admit(1000, late, || Some(78)), Ok(Place::Reserved(78)));
        // Below the bound a Ray-started call takes a shared place.
        let mut c = Calls::default();
        assert_eq!(c.admit(1000, late, || Some(77)), Ok(Place::Shared(late)));
    }

    #[test]
    fn a_calls_job_is_the_one_the_raylet_gave_its_worker_by_number() {
        // pid -> (parent, name): ray start 10, its raylet 11, workers 12..19
        // (the raylet's children), a process named raylet under the
        // worker 12 (20) and its child 21, a raylet of no ray start (30)
        // and its child 31, an operator's exec 40.
        let table = |pid: i32| -> Option<(i32, String)> {
            let (parent, name) = match pid {
                10 => (1, "ray"),
                11 => (10, "raylet"),
                12..=19 => (11, "default_worker"),
                20 => (12, "raylet"),
                21 => (20, "default_worker"),
                30 => (1, "raylet"),
                31 => (30, "default_worker"),
                40 => (0, "bash"),
                _ => return None,
            };
            Some((parent, name.to_string()))
        };
        let env = |pid: i32| -> Option<Vec<u8>> {
            let job: &[u8] = match pid {
                12 | 21 | 31 | 40 => b"RAY_JOB_ID=03000000",
                13 => b"RAY_JOB_ID=0300000A",
                14 => b"RAY_JOB_ID=3000000",
                15 => b"RAY_JOB_ID=003000000",
                16 => b"RAY_JOB_ID=0x300000",
                17 => b"RAY_JOB_ID=+3000000",
                18 => b"NOT_RAY_JOB_ID=03000000",
                19 => return None,
                _ => return None,
            };
            Some([b"PATH=/bin\0".as_slice(), job, b"\0HOME=/x\0"].concat())
        };
        let share = |pid| share_of(pid, 10, table, env);
        assert_eq!(share(12), Share::Job(0x0300_0000));
        // A number, whatever the case of its digits.
        assert_eq!(share(13), Share::Job(0x0300_000a));
        // Not eight hex digits, another variable's value, no environment
        // (gone, or another process under the pid): no job's.
        for pid in 14..=19 {
            assert_eq!(share(pid), Share::Unattributed, "{pid}");
        }
        // Not a child of this run's raylet (a name is not a raylet; a
        // raylet of no ray start; an operator's exec), whatever its
        // environment says.
        for pid in [21, 31, 40, 99] {
            assert_eq!(share(pid), Share::Unattributed, "{pid}");
        }
        // No Ray running: nobody's.
        assert_eq!(share_of(12, 0, table, env), Share::Unattributed);
    }

    #[test]
    fn a_workers_environment_is_read_as_it_started_and_only_while_it_lives() {
        let mut child = Command::new("sleep")
            .arg("30")
            .env_clear()
            .env("RAY_JOB_ID", "0a000000")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let env = environ_of(pid).expect("a live child's environment");
        assert!(
            env.split(|b| *b == 0)
                .any(|kv| kv == b"RAY_JOB_ID=0a000000"),
            "{}",
            String::from_utf8_lossy(&env)
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(environ_of(pid), None, "a reaped child");
    }

    #[test]
    fn a_detached_containers_life_is_its_jobs_worker_or_the_outermost_exec() {
        // pid -> (parent, name): ray start 10, its raylet 11, a job's worker
        // 12, the task's shell 13 and its podman 14; a process the job
        // named raylet (20, the worker's child) and its podman 21; an
        // operator's `docker exec` 40 (parent 0: outside this namespace)
        // and its podman 41; an orphan left to the raylet (50) or to PID 1
        // (60) calling podman itself; 70's parent 69 is gone.
        let table = |pid: i32| -> Option<(i32, String)> {
            let (parent, name) = match pid {
                10 => (1, "ray"),
                11 => (10, "raylet"),
                12 => (11, "default_worker"),
                13 => (12, "sh"),
                14 => (13, "podman"),
                20 => (12, "raylet"),
                21 => (20, "podman"),
                40 => (0, "bash"),
                41 => (40, "podman"),
                50 => (11, "daemon"),
                60 => (1, "daemon"),
                70 => (69, "podman"),
                _ => return None,
            };
            Some((parent, name.to_string()))
        };
        // The job's worker, however deep the call and whatever its
        // processes call themselves.
        for caller in [12, 13, 14, 20, 21] {
            assert_eq!(lifetime_owner(caller, 10, table), Some(12), "{caller}");
        }
        assert_eq!(lifetime_owner(41, 10, table), Some(40));
        assert_eq!(lifetime_owner(50, 10, table), Some(50));
        assert_eq!(lifetime_owner(60, 10, table), Some(60));
        // A parent gone mid-walk: the last live one, never further up.
        assert_eq!(lifetime_owner(70, 10, table), Some(70));
        assert_eq!(lifetime_owner(99, 10, table), None);
        // No Ray running: a name is no raylet; the outermost ancestor.
        assert_eq!(lifetime_owner(14, 0, table), Some(10));
        // A Ray daemon's own call (the raylet's): the raylet's life.
        assert_eq!(lifetime_owner(11, 10, table), Some(11));
    }

    #[test]
    fn only_a_child_of_this_runs_raylet_is_started_by_ray() {
        // pid -> (parent, name): ray start 10, its raylet 11, a worker
        // 12 (the raylet's child), a task's child 13, a process named
        // raylet that a job made (20, a child of the worker) and its child
        // 21, and an orphan named raylet under PID 1 (30) with a child 31.
        let table = |pid: i32| -> Option<(i32, String)> {
            let (parent, name) = match pid {
                10 => (1, "ray"),
                11 => (10, "raylet"),
                12 => (11, "podman"),
                13 => (12, "podman"),
                20 => (12, "raylet"),
                21 => (20, "podman"),
                30 => (1, "raylet"),
                31 => (30, "podman"),
                _ => return None,
            };
            Some((parent, name.to_string()))
        };
        let no_agent = |_, _| false;
        assert!(started_by_ray(12, 10, table, no_agent));
        // The runtime_env agent's child (the agent is 12 here, the
        // raylet's child holding the agent's port): Ray's. A worker's
        // child (13, its parent 12 holds no such port): not.
        let agent = |p: i32, raylet: i32| p == 12 && raylet == 11;
        assert!(started_by_ray(13, 10, table, agent));
        assert!(!started_by_ray(13, 10, table, no_agent));
        // A port-holder that is no raylet's child lends nothing (21's
        // parent 20 is named raylet but is the worker's child).
        assert!(!started_by_ray(21, 10, table, |_, _| true));
        for pid in [10, 11, 13, 21, 31, 99] {
            assert!(!started_by_ray(pid, 10, table, no_agent), "{pid}");
        }
        // No Ray running: nothing is Ray's.
        assert!(!started_by_ray(12, 0, table, no_agent));
        // The real /proc: this test's process is not Ray's.
        let me = std::process::id() as i32;
        let (parent, _) = parent_and_name(me).unwrap();
        assert_eq!(parent, nix::unistd::getppid().as_raw());
        assert!(!started_by_ray(
            me,
            parent,
            parent_and_name,
            is_runtime_env_agent
        ));
    }

    #[test]
    fn the_agents_port_comes_from_the_raylets_command_line_and_the_listening_table() {
        let cmdline = b"/x/raylet\0--node_ip_address=1.2.3.4\0--runtime_env_agent_port=54725\0--runtime_env_agent_command=python main.py --runtime-env-agent-port=1\0";
        assert_eq!(agent_port(cmdline), Some(54725));
        assert_eq!(agent_port(b"/x/raylet\0--runtime_env_agent_port=x\0"), None);
        assert_eq!(agent_port(b"/x/raylet\0"), None);
        // 54725 = 0xD5C5: listening (0A) on it, and an established
        // connection from it (01) that is not a listener.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0500A8C0:D5C5 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0
   1: 0500A8C0:D5C5 0600A8C0:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0 100 0 0 10 0
   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4444 1 0 100 0 0 10 0
";
        assert_eq!(listening_inodes(table, 54725), vec!["4242".to_string()]);
        assert_eq!(listening_inodes(table, 8080), vec!["4444".to_string()]);
        assert!(listening_inodes(table, 1).is_empty());
        // A process holding a listener on the port named by a raylet's
        // command line is the agent; this test's own process is not.
        let me = std::process::id() as i32;
        assert!(!is_runtime_env_agent(me, me));
        // For real: a stand-in raylet whose command line names the port
        // this process listens on; then the listener is gone.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // The shell waits in its own `read` (no child of its own that would
        // outlive the kill and hold the test's output open).
        let mut raylet = std::process::Command::new("sh")
            .args(["-c", "read -r _", "raylet"])
            .arg(format!("--runtime_env_agent_port={port}"))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let r = raylet.id() as i32;
        // Until the child has exec'd, its command line is this test's.
        let t0 = std::time::Instant::now();
        while std::fs::read(format!("/proc/{r}/cmdline"))
            .ok()
            .and_then(|c| agent_port(&c))
            .is_none()
        {
            assert!(t0.elapsed() < Duration::from_secs(10), "sh did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(is_runtime_env_agent(me, r));
        drop(l);
        assert!(!is_runtime_env_agent(me, r));
        let _ = raylet.kill();
        let _ = raylet.wait();
    }
}
