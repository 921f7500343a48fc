//! The janitor (SPEC R-SHIM-4): removes the containers the shim created when
//! their shim is gone, and all of them when the node stops.
//!
//! A sweep removes only containers this node's shim created, by full ID, as
//! recorded in the node's root-owned state folder ([`record_created`],
//! `$ARGUS_STATE_DIR/shim-created/<full id>`): by PID 1's broker from a
//! handler's report, or by a standalone shim that runs as root. Labels
//! alone prove nothing (issue 26, hole 7): an image can ship
//! `io.argus.shim.owner`, and every container made from it, anywhere,
//! inherits it. So a container that merely carries this node's owner label
//! survives every sweep, and so do other nodes' containers, whatever their
//! labels say (a Ray container removed without its stop sweep leaves its
//! engines, stopped with its PID namespace, for the operator).
//!
//! Every container also carries the owner (this node's id, see
//! `super::owner`) and, unless detached, the shim's pid and process start
//! time, so a reused pid is not taken for a live shim. The node agent calls
//! [`sweep_blocking`]; each `podman run` also sweeps at its start, and a
//! per-run watchdog (`super::watchdog`) removes the container of a shim
//! that was SIGKILLed.

use argus_podman_core::docker_host::DockerHost;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptionsBuilder;
use bollard::Docker;
use tokio_util::sync::CancellationToken;

use super::docker::{self, remove, running_process_start, Removal};
use super::owner;
use crate::error::ShimError;
use argus_podman_core::labels::{LABEL_OWNER, LABEL_PID, LABEL_RM, LABEL_START};

/// What a sweep removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JanitorScope {
    /// Containers of this owner whose shim process is gone (running or
    /// not; detached containers have no shim and are kept), and containers
    /// of any owner whose Ray container is gone (removed; a stopped one keeps them).
    DeadShims,
    /// Every container of this owner (the node stops).
    AllOwned,
}

/// A container as the janitor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub id: String,
    pub pid: Option<u32>,
    pub start: Option<u64>,
    pub rm: bool,
    pub exited: bool,
}

impl Seen {
    fn from_labels(id: String, labels: &HashMap<String, String>, exited: bool) -> Seen {
        Seen {
            id,
            pid: labels.get(LABEL_PID).and_then(|p| p.parse().ok()),
            start: labels.get(LABEL_START).and_then(|p| p.parse().ok()),
            rm: labels.get(LABEL_RM).is_some_and(|v| v == "1"),
            exited,
        }
    }
}

/// Returns true if and only if the sweep must remove `c`. `alive(pid,
/// start)` tells whether that shim process still runs.
pub fn doomed(scope: JanitorScope, c: &Seen, alive: impl Fn(u32, Option<u64>) -> bool) -> bool {
    match scope {
        JanitorScope::AllOwned => true,
        // Also exited containers of a finished run without `--rm`: Ray's
        // worker command has no `--rm`, and nothing reads them afterwards.
        // Detached containers carry no pid and are kept.
        JanitorScope::DeadShims => c.pid.is_some_and(|pid| !alive(pid, c.start)),
    }
}

/// Returns true if and only if process `pid` runs (a zombie does not) and
/// started at `start`.
pub fn shim_alive(pid: u32, start: Option<u64>) -> bool {
    match (running_process_start(pid), start) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(s), Some(want)) => s == want,
    }
}

/// The folder, in the state folder, of the record of the containers this
/// node's shim created: one empty file per full container ID.
pub const CREATED_DIR: &str = "shim-created";

/// Opens folder `name` relative to `dir` (`AT_FDCWD`: `name` as is)
/// without following a symlink at its last component, and checks that it
/// is root's and writable by no one else: a record another user could
/// change proves nothing.
fn open_trusted_dir(dir: RawFd, name: &std::ffi::CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: openat with a NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor this process just opened.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat into a zeroed stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "owner {} mode {:o}: not root's alone",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

fn cstring(p: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Opens the record folder of state folder `state`, creating it (0755)
/// when `create`.
fn open_record(state: &Path, create: bool) -> std::io::Result<OwnedFd> {
    let dir = open_trusted_dir(libc::AT_FDCWD, &cstring(state)?)?;
    let name = cstring(Path::new(CREATED_DIR))?;
    if create {
        // SAFETY: mkdirat relative to a folder this process holds.
        let r = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
    }
    open_trusted_dir(dir.as_raw_fd(), &name)
}

/// Records that this node's shim created container `id` (a full ID) in
/// the record of state folder `state`. Only root can (the folder is
/// root's): PID 1's broker, or a standalone shim run by root.
pub fn record_in(state: &Path, id: &str) -> std::io::Result<()> {
    if !docker::is_full_id(id) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{id:?} is not a full container ID"),
        ));
    }
    let dir = open_record(state, true)?;
    let name = cstring(Path::new(id))?;
    // SAFETY: openat relative to the record folder, no symlink followed.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor this process just opened.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// Records container `id` as created by this node's shim, when this
/// process may (see [`record_in`]); a handler running as the Ray user may
/// not: its broker records what it reports.
pub fn record_created(id: &str) {
    if nix::unistd::geteuid().is_root() {
        if let Err(e) = record_in(&crate::settings::state_dir(), id) {
            tracing::warn!(id, error = %e, "cannot record the container this shim created");
        }
    }
}

/// Returns the full IDs recorded in the record of state folder `state`
/// (none when there is no trusted record).
pub fn recorded(state: &Path) -> HashSet<String> {
    let Ok(dir) = open_record(state, false) else {
        return HashSet::new();
    };
    let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| docker::is_full_id(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Forgets container `id` (gone) in the record of `state`; root only.
pub fn forget_in(state: &Path, id: &str) {
    if !docker::is_full_id(id) {
        return;
    }
    let (Ok(dir), Ok(name)) = (open_record(state, false), cstring(Path::new(id))) else {
        return;
    };
    // SAFETY: unlinkat relative to the record folder.
    unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
}

/// A labelled container: its id, owner and what the janitor judges it by.
struct Labelled {
    owner: String,
    seen: Seen,
}

/// Lists every container (running or not) that has the label filter
/// `label` (`key` or `key=value`): the one Docker call of a sweep.
async fn list(docker: &Docker, label: String) -> Result<Vec<Labelled>, ShimError> {
    let filters = HashMap::from([("label".to_string(), vec![label])]);
    let opts = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let list = docker
        .list_containers(Some(opts))
        .await
        .map_err(ShimError::docker("list containers"))?;
    Ok(list
        .into_iter()
        .map(|c| {
            let exited = matches!(
                c.state,
                Some(ContainerSummaryStateEnum::EXITED) | Some(ContainerSummaryStateEnum::DEAD)
            );
            let labels = c.labels.unwrap_or_default();
            Labelled {
                owner: labels.get(LABEL_OWNER).cloned().unwrap_or_default(),
                seen: Seen::from_labels(c.id.unwrap_or_default(), &labels, exited),
            }
        })
        .collect())
}

/// Sweeps the containers of `owner` that this node's shim created (as
/// recorded in state folder `state`, see [`record_in`]); returns how many
/// it removed (itself: not those another remover got to first). A
/// container that only carries the owner label is never touched. A root
/// sweep also forgets the record of containers that are gone.
///
/// Once `stop` is cancelled the sweep ends early: a pending list or inspect
/// is dropped, a removal under way is finished, and no other one begins.
pub async fn sweep(
    docker: &Docker,
    state: &Path,
    owner: &str,
    scope: JanitorScope,
    stop: &CancellationToken,
) -> Result<usize, ShimError> {
    let created = recorded(state);
    let Some(all) = stop
        .run_until_cancelled(list(docker, format!("{LABEL_OWNER}={owner}")))
        .await
    else {
        return Ok(0);
    };
    let all = all?;
    let root = nix::unistd::geteuid().is_root();
    if root {
        let listed: HashSet<&str> = all.iter().map(|c| c.seen.id.as_str()).collect();
        for gone in created.iter().filter(|id| !listed.contains(id.as_str())) {
            forget_in(state, gone);
        }
    }
    let mut n = 0;
    for c in all {
        if c.owner != owner {
            continue;
        }
        // Not in the record: the record lives in the state folder, a
        // tmpfs the container loses when it restarts (compose's
        // `restart: unless-stopped`), while its engines outlive it. Such a
        // container is still this node's when its owner label was set on
        // the container itself, not inherited from its image (the shim
        // refuses images that carry its labels, and jobs cannot set them):
        // only this node's shim made it.
        if !created.contains(&c.seen.id) && !set_by_shim(docker, &c.seen.id, owner).await {
            continue;
        }
        if doomed(scope, &c.seen, shim_alive) {
            if stop.is_cancelled() {
                tracing::debug!(removed = n, "janitor sweep stopped");
                return Ok(n);
            }
            let c = c.seen;
            tracing::info!(id = %c.id, pid = ?c.pid, ?scope, "removing container of the podman shim");
            let k = removed(docker, &c.id).await;
            if root && k > 0 {
                forget_in(state, &c.id);
            }
            n += k;
        }
    }
    Ok(n)
}

/// Returns true if and only if container `id`'s owner label is `owner` and
/// was set on the container, not inherited from its image.
async fn set_by_shim(docker: &Docker, id: &str, owner: &str) -> bool {
    matches!(
        docker::resolve_container(docker, id).await,
        Ok(Some(r)) if r.id == id && r.owner.as_deref() == Some(owner)
    )
}

/// Removes container `id` for a sweep; returns 1 if and only if this call
/// removed it (not one already gone or being removed by another remover),
/// and counts it: in this process's metrics (PID 1's janitor thread: the
/// agent serves them) and in its report (a `podman run`'s sweep in a
/// handler process: the broker adds it to the agent's metrics).
async fn removed(docker: &Docker, id: &str) -> usize {
    if docker::remove_container(docker, id).await != Removal::Removed {
        return 0;
    }
    super::report::note_removed();
    argus_telemetry::metrics::janitor_removed(1);
    1
}

/// Removes the containers of the shim `pid` that started at `start` (the
/// watchdog's sweep after that shim died): those labelled with that pid,
/// start and this node's `owner`, whose labels were set by the shim (the
/// image carries none of the shim's labels, so none was inherited, see
/// [`docker::resolve_container`]).
pub async fn sweep_shim(
    docker: &Docker,
    owner: &str,
    pid: u32,
    start: u64,
) -> Result<usize, ShimError> {
    let mut n = 0;
    for Labelled { seen: c, owner: o } in list(docker, format!("{LABEL_PID}={pid}")).await? {
        if c.start != Some(start) || o != owner {
            continue;
        }
        match docker::resolve_container(docker, &c.id).await? {
            Some(r) if r.id == c.id && r.owner.as_deref() == Some(owner) => {
                remove(docker, &r.id).await;
                n += 1;
            }
            _ => {}
        }
    }
    Ok(n)
}

/// Sweeps from synchronous code (the node agent), until done or `stop` is
/// cancelled (no removal starts after that). Returns Ok(0) at once when the
/// daemon's unix socket does not exist: nodes without Docker must not fail.
pub fn sweep_blocking(scope: JanitorScope, stop: &CancellationToken) -> anyhow::Result<usize> {
    sweep_until(
        docker::host().address(),
        &crate::settings::state_dir(),
        None,
        scope,
        stop,
    )
}

/// [`sweep_blocking`] against the daemon at `addr`, never cut short.
pub fn sweep_blocking_at(addr: &str, scope: JanitorScope) -> anyhow::Result<usize> {
    sweep_owner_blocking(addr, &crate::settings::state_dir(), None, scope)
}

/// Sweeps the containers of `owner` (default: this node's, see
/// [`owner::node_owner`]) recorded in state folder `state`, at `addr`,
/// never cut short; Ok(0) at once when the unix socket does not exist.
pub fn sweep_owner_blocking(
    addr: &str,
    state: &Path,
    owner: Option<&str>,
    scope: JanitorScope,
) -> anyhow::Result<usize> {
    sweep_until(addr, state, owner, scope, &CancellationToken::new())
}

fn sweep_until(
    addr: &str,
    state: &Path,
    owner: Option<&str>,
    scope: JanitorScope,
    stop: &CancellationToken,
) -> anyhow::Result<usize> {
    let host = DockerHost::parse(Some(addr));
    if let Some(path) = host.socket_path() {
        if !Path::new(path).exists() {
            return Ok(0);
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start a runtime for the janitor")?;
    rt.block_on(async {
        let work = async {
            let docker = docker::connect_to(&host).await?;
            let owner = match owner {
                Some(o) => o.to_string(),
                None => owner::node_owner(docker::whoami(&docker).await?.as_ref())?,
            };
            sweep(&docker, state, &owner, scope, stop).await
        };
        tokio::time::timeout(Duration::from_secs(30), work)
            .await
            .with_context(|| format!("janitor sweep of {addr} timed out"))?
            .with_context(|| format!("janitor sweep of {addr} failed"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pid: Option<u32>, rm: bool, exited: bool) -> Seen {
        Seen {
            id: "c".into(),
            pid,
            start: Some(1),
            rm,
            exited,
        }
    }

    #[test]
    fn dead_shims_lose_their_containers_detached_ones_stay() {
        let dead = |_: u32, _: Option<u64>| false;
        let live = |_: u32, _: Option<u64>| true;
        let s = JanitorScope::DeadShims;
        assert!(doomed(s, &seen(Some(1), false, false), dead));
        assert!(doomed(s, &seen(Some(1), true, true), dead));
        assert!(
            doomed(s, &seen(Some(1), false, true), dead),
            "a finished worker without --rm goes too"
        );
        assert!(!doomed(s, &seen(Some(1), true, false), live));
        assert!(
            !doomed(s, &seen(None, true, false), dead),
            "detached containers have no shim"
        );
        assert!(doomed(
            JanitorScope::AllOwned,
            &seen(None, false, true),
            live
        ));
    }

    #[test]
    fn the_record_holds_full_ids_only_in_a_folder_only_root_writes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let id = "ab".repeat(32);
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        record_in(dir.path(), &id).unwrap();
        assert!(record_in(dir.path(), &id[..12]).is_err());
        assert!(record_in(dir.path(), "../../etc/x").is_err());
        assert_eq!(recorded(dir.path()), HashSet::from([id.clone()]));
        forget_in(dir.path(), &id);
        assert!(recorded(dir.path()).is_empty());
        // A record folder another user may write proves nothing.
        record_in(dir.path(), &id).unwrap();
        let rec = dir.path().join(CREATED_DIR);
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(recorded(dir.path()).is_empty());
        assert!(record_in(dir.path(), &id).is_err());
        // Nor one reached through a symlink.
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o755)).unwrap();
        let other = tempfile::tempdir().unwrap();
        std::fs::rename(&rec, other.path().join(CREATED_DIR)).unwrap();
        std::os::unix::fs::symlink(other.path().join(CREATED_DIR), &rec).unwrap();
        assert!(recorded(dir.path()).is_empty());
        assert!(record_in(dir.path(), &id).is_err());
    }

    #[test]
    fn reused_pid_is_not_a_live_shim() {
        let me = std::process::id();
        let start = docker::process_start(me);
        assert!(shim_alive(me, start));
        assert!(!shim_alive(me, start.map(|s| s + 1)));
        assert!(!shim_alive(u32::MAX, None));
    }

    #[test]
    fn no_socket_means_nothing_to_sweep() {
        let t = std::time::Instant::now();
        let n =
            sweep_blocking_at("unix:///nonexistent/docker.sock", JanitorScope::AllOwned).unwrap();
        assert_eq!(n, 0);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
