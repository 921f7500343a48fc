//! The janitor (SPEC R-SHIM-4): removes the containers the shim created when
//! their shim is gone, and all of them when the node stops.
//!
//! Every container carries the owner (this node's id, see `super::owner`)
//! and, unless detached, the shim's pid and process start time, so a reused
//! pid is not taken for a live shim. Only the owner's own sweeps judge
//! whether a shim lives: they run on the same node, in the PID namespace of
//! its shims. Other nodes' sweeps remove a container only when its owner,
//! a Ray container, is gone. The node agent calls
//! [`sweep_blocking`]; each `podman run` also sweeps at its start, and a
//! per-run watchdog (`super::watchdog`) removes the container of a shim that
//! was SIGKILLed.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{InspectContainerOptions, ListContainersOptionsBuilder};
use bollard::Docker;
use tokio_util::sync::CancellationToken;

use super::docker::{self, process_start, remove, Removal};
use super::labels::{LABEL_OWNER, LABEL_PID, LABEL_RM, LABEL_START};
use super::owner;
use super::ShimError;

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

/// Returns true if and only if process `pid` runs and started at `start`.
pub fn shim_alive(pid: u32, start: Option<u64>) -> bool {
    match (process_start(pid), start) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(s), Some(want)) => s == want,
    }
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

/// Sweeps the containers of `owner`; returns how many it removed (itself:
/// not those another remover got to first). A
/// `DeadShims` sweep also removes orphans: containers whose owning Ray
/// container is gone (it cannot sweep them itself any more, and with its
/// PID namespace gone they are dead anyway).
///
/// Once `stop` is cancelled the sweep ends early: a pending list or inspect
/// is dropped, a removal under way is finished, and no other one begins.
pub async fn sweep(
    docker: &Docker,
    owner: &str,
    scope: JanitorScope,
    stop: &CancellationToken,
) -> Result<usize, ShimError> {
    let Some(all) = stop
        .run_until_cancelled(list(docker, LABEL_OWNER.to_string()))
        .await
    else {
        return Ok(0);
    };
    let mut n = 0;
    let mut others = Vec::new();
    for c in all? {
        if c.owner != owner {
            others.push(c);
        } else if doomed(scope, &c.seen, shim_alive) {
            if stop.is_cancelled() {
                tracing::debug!(removed = n, "janitor sweep stopped");
                return Ok(n);
            }
            let c = c.seen;
            tracing::info!(id = %c.id, pid = ?c.pid, ?scope, "removing container of the podman shim");
            n += removed(docker, &c.id).await;
        }
    }
    if scope == JanitorScope::DeadShims {
        n += sweep_orphans(docker, others, stop).await?;
    }
    Ok(n)
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
    crate::metrics::janitor_removed(1);
    1
}

/// Returns true if and only if a container whose owner is in `state` (None:
/// no such container; Some(running)) is an orphan: its Ray container is
/// gone. A stopped Ray container may be started again, and its own janitor
/// then judges its engines (their shims are dead by then).
pub fn orphaned(owner_state: Option<bool>) -> bool {
    owner_state.is_none()
}

async fn sweep_orphans(
    docker: &Docker,
    others: Vec<Labelled>,
    stop: &CancellationToken,
) -> Result<usize, ShimError> {
    let mut owners: HashMap<String, Option<bool>> = HashMap::new();
    let mut n = 0;
    for c in others {
        if stop.is_cancelled() {
            tracing::debug!(removed = n, "janitor sweep of orphans stopped");
            return Ok(n);
        }
        let owner = c.owner;
        // A host node's id names no container: only that node judges it.
        if owner::is_host_owner(&owner) {
            continue;
        }
        if !owners.contains_key(&owner) {
            let inspect = docker.inspect_container(&owner, None::<InspectContainerOptions>);
            let Some(inspected) = stop.run_until_cancelled(inspect).await else {
                tracing::debug!(removed = n, "janitor sweep of orphans stopped");
                return Ok(n);
            };
            let state = match inspected {
                Ok(i) => Some(i.state.and_then(|s| s.running).unwrap_or(false)),
                Err(e) if docker::is_not_found(&e) => None,
                Err(e) => {
                    return Err(ShimError::docker(format!(
                        "inspect owner container {owner}"
                    ))(e))
                }
            };
            owners.insert(owner.clone(), state);
        }
        if orphaned(owners[&owner]) {
            let id = c.seen.id;
            tracing::info!(%id, %owner, "removing container whose Ray container is gone");
            n += removed(docker, &id).await;
        }
    }
    Ok(n)
}

/// Removes the containers of the shim `pid` that started at `start` (the
/// watchdog's sweep after that shim died).
pub async fn sweep_shim(docker: &Docker, pid: u32, start: u64) -> Result<usize, ShimError> {
    let mut n = 0;
    for Labelled { seen: c, .. } in list(docker, format!("{LABEL_PID}={pid}")).await? {
        if c.start == Some(start) {
            remove(docker, &c.id).await;
            n += 1;
        }
    }
    Ok(n)
}

/// Sweeps from synchronous code (the node agent), until done or `stop` is
/// cancelled (no removal starts after that). Returns Ok(0) at once when the
/// daemon's unix socket does not exist: nodes without Docker must not fail.
pub fn sweep_blocking(scope: JanitorScope, stop: &CancellationToken) -> anyhow::Result<usize> {
    sweep_until(&docker::address(), None, scope, stop)
}

/// [`sweep_blocking`] against the daemon at `addr`, never cut short.
pub fn sweep_blocking_at(addr: &str, scope: JanitorScope) -> anyhow::Result<usize> {
    sweep_owner_blocking(addr, None, scope)
}

/// Sweeps the containers of `owner` (default: this node's, see
/// [`owner::node_owner`]) at `addr`, never cut short; Ok(0) at once when
/// the unix socket does not exist.
pub fn sweep_owner_blocking(
    addr: &str,
    owner: Option<&str>,
    scope: JanitorScope,
) -> anyhow::Result<usize> {
    sweep_until(addr, owner, scope, &CancellationToken::new())
}

fn sweep_until(
    addr: &str,
    owner: Option<&str>,
    scope: JanitorScope,
    stop: &CancellationToken,
) -> anyhow::Result<usize> {
    if let Some(path) = docker::socket_path(addr) {
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
            let docker = docker::connect_to(addr).await?;
            let owner = match owner {
                Some(o) => o.to_string(),
                None => owner::node_owner(docker::whoami(&docker).await?.as_ref())?,
            };
            sweep(&docker, &owner, scope, stop).await
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
    fn only_containers_of_a_gone_owner_are_orphans() {
        assert!(orphaned(None));
        assert!(
            !orphaned(Some(false)),
            "a stopped Ray container keeps its engines"
        );
        assert!(!orphaned(Some(true)));
    }

    #[test]
    fn reused_pid_is_not_a_live_shim() {
        let me = std::process::id();
        let start = process_start(me);
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
