//! The Docker connection and the shim's idea of where it runs.

use bollard::errors::Error as BollardError;
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use bollard::Docker;

use crate::error::ShimError;
use argus_podman_core::docker_host::DockerHost;
use argus_podman_core::selfid;
use argus_podman_core::selfid::SelfContainer;

/// Returns the daemon this shim process talks to: its `DOCKER_HOST` (the
/// node's, once the node's settings are in force), else the default socket.
pub fn host() -> DockerHost {
    DockerHost::parse(std::env::var("DOCKER_HOST").ok().as_deref())
}

/// The node's Docker socket as the handler opened it while still root:
/// its path and an `O_PATH` descriptor of it. The socket sits in a folder
/// only root can enter (SPEC R-SEC-4), so the handler, once it runs as its
/// caller (with the socket's group), reaches it only through this
/// descriptor (`/proc/self/fd/N`: the kernel follows that link to the
/// socket without searching the folder, and still checks the socket's own
/// permission at `connect`). A process-wide value the handler sets once,
/// never the caller's environment.
static HELD_SOCKET: std::sync::OnceLock<(String, std::os::fd::OwnedFd)> =
    std::sync::OnceLock::new();

/// Opens the socket at `path` with `O_PATH` and keeps it for every later
/// connection to that path by this process and its forks (the watchdog).
pub fn hold_socket(path: &str) -> std::io::Result<()> {
    use nix::fcntl::{open, OFlag};
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let _ = HELD_SOCKET.set((path.to_string(), fd));
    Ok(())
}

/// Returns the held socket's descriptor, if any (a fork that closes what it
/// inherited keeps this one: the watchdog reaches the daemon through it).
pub fn held_socket_fd() -> Option<std::os::fd::RawFd> {
    use std::os::fd::AsRawFd;
    HELD_SOCKET.get().map(|(_, fd)| fd.as_raw_fd())
}

/// Returns the path to connect to for the socket `path`: the held
/// descriptor's link when `path` is the held socket.
fn connect_path(path: &str) -> String {
    use std::os::fd::AsRawFd;
    match HELD_SOCKET.get() {
        Some((held, fd)) if held == path => format!("/proc/self/fd/{}", fd.as_raw_fd()),
        _ => path.to_string(),
    }
}

/// Connects to `addr` and negotiates the API version down to the daemon's
/// (bollard speaks 1.49; this machine's 20.10 daemon speaks 1.41).
pub async fn connect_to(host: &DockerHost) -> Result<Docker, ShimError> {
    let addr = host.address();
    let err = |source| ShimError::Connect {
        addr: addr.to_string(),
        source,
    };
    let docker = if let Some(path) = host.socket_path() {
        Docker::connect_with_unix(&connect_path(path), 120, bollard::API_DEFAULT_VERSION)
            .map_err(err)?
    } else if addr.starts_with("tcp://") || addr.starts_with("http://") {
        Docker::connect_with_http(addr, 120, bollard::API_DEFAULT_VERSION).map_err(err)?
    } else {
        return Err(err(BollardError::UnsupportedURISchemeError {
            uri: addr.to_string(),
        }));
    };
    docker.negotiate_version().await.map_err(err)
}

/// Connects to the daemon at [`host`].
pub async fn connect() -> Result<Docker, ShimError> {
    connect_to(&host()).await
}

/// Returns true if and only if `e` is the daemon's 404.
pub fn is_not_found(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Returns true if and only if `e` says the daemon could not resolve a
/// reference to one object: a redirect or a bad request (a reference it
/// does not take), or several IDs with that prefix.
fn unresolvable(e: &BollardError) -> bool {
    match e {
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => {
            matches!(status_code, 301 | 400)
                || message.contains("Multiple IDs found")
                || message.contains("multiple IDs found")
        }
        _ => false,
    }
}

/// Returns true if and only if `e` says the container is already being
/// removed (409 "removal of container … is already in progress"): another
/// remover got there first, which is as good as removing it.
pub fn is_removal_in_progress(e: &BollardError) -> bool {
    match e {
        BollardError::DockerResponseServerError {
            status_code: 409,
            message,
        } => message.contains("already in progress"),
        _ => false,
    }
}

/// Removes container `id` (force, with its anonymous volumes). A container
/// already gone (404) or already being removed (409) counts as removed,
/// silently: the shim's `--rm`, the watchdog and the janitors may race for
/// the same container. Returns false, with a warning, on any other failure.
pub async fn remove(docker: &Docker, id: &str) -> bool {
    remove_container(docker, id).await != Removal::Failed
}

/// How a removal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// This call removed the container.
    Removed,
    /// It was already gone, or another remover was removing it.
    Gone,
    /// The daemon refused or failed (logged as a warning).
    Failed,
}

/// [`remove`], telling whether this call removed the container (the
/// janitor's metrics count only those).
pub async fn remove_container(docker: &Docker, id: &str) -> Removal {
    let opts = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(id, Some(opts)).await {
        Ok(()) => Removal::Removed,
        Err(e) if is_not_found(&e) || is_removal_in_progress(&e) => Removal::Gone,
        Err(e) => {
            tracing::warn!(id, error = %message(&e), "failed to remove container");
            Removal::Failed
        }
    }
}

/// Returns true if and only if `s` (a container name or reference, with
/// or without the leading `/` Docker accepts) reads as a container ID or
/// ID prefix: 1 to 64 hex digits, in either case. The daemon looks a
/// reference up as a full ID, then a name, then an ID prefix, so such a
/// name, once its container is gone, names another container (R-SEC-3).
pub fn looks_like_id(s: &str) -> bool {
    let s = s.strip_prefix('/').unwrap_or(s);
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Returns true if and only if `s` is a full container ID as the daemon
/// returns it: 64 lowercase hex digits.
pub fn is_full_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A container reference resolved once (R-SEC-3): the daemon's full ID
/// and what ownership is judged by, from the same inspect.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The full ID: the only thing passed on to later daemon calls.
    pub id: String,
    /// The name, without the leading `/`.
    pub name: String,
    /// The owner label's value, when it was set on the container itself
    /// (not inherited from its image, see [`resolve_container`]).
    pub owner: Option<String>,
    /// The inspect itself (for `podman inspect`).
    pub inspect: bollard::models::ContainerInspectResponse,
}

/// Resolves `reference` to one container, once: `Ok(None)` when the
/// daemon knows none. The owner label counts only when the container's
/// image does not carry it too: a label an image ships is inherited by
/// every container made from it, so it proves nothing.
pub async fn resolve_container(
    docker: &Docker,
    reference: &str,
) -> Result<Option<Resolved>, ShimError> {
    use argus_podman_core::labels::LABEL_OWNER;
    let i = match docker
        .inspect_container(
            reference,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
    {
        Ok(i) => i,
        // No one container: none, an ambiguous ID prefix, or what the
        // daemon does not take as a reference (`/name`: a redirect).
        Err(e) if is_not_found(&e) || unresolvable(&e) => return Ok(None),
        Err(e) => {
            return Err(ShimError::docker(format!("inspect container {reference}"))(
                e,
            ))
        }
    };
    let Some(id) = i.id.clone().filter(|id| is_full_id(id)) else {
        return Ok(None);
    };
    let label = i
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(LABEL_OWNER))
        .cloned();
    let owner = match (label, i.image.as_deref()) {
        (Some(l), Some(image)) => match docker.inspect_image(image).await {
            Ok(img) => {
                let inherited = img.config.and_then(|c| c.labels).is_some_and(|l| {
                    l.keys()
                        .any(|k| k.starts_with(argus_podman_core::labels::LABEL_PREFIX))
                });
                (!inherited).then_some(l)
            }
            // The image is gone: whether it carried the label is unknown.
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(ShimError::docker(format!("inspect image {image}"))(e)),
        },
        (l, _) => l,
    };
    Ok(Some(Resolved {
        id,
        name: i
            .name
            .clone()
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string(),
        owner,
        inspect: i,
    }))
}

/// Returns the daemon's message of `e`, or its display.
pub fn message(e: &BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Finds and inspects the container the shim runs in. `Ok(None)` means the
/// shim runs on the host (no candidate id at all, or the override `host`).
pub async fn whoami(docker: &Docker) -> Result<Option<SelfContainer>, ShimError> {
    let override_id = std::env::var("ARGUS_SHIM_SELF_ID").ok();
    if override_id.as_deref() == Some("host") {
        return Ok(None);
    }
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let hostname = read("/etc/hostname");
    let candidates = selfid::candidates(
        override_id.as_deref(),
        &read("/proc/self/mountinfo"),
        &read("/proc/self/cgroup"),
        &hostname,
    );
    if candidates.is_empty() {
        return Ok(None);
    }
    for c in &candidates {
        match docker
            .inspect_container(
                c,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Ok(i) => {
                let me = SelfContainer::from_inspect(&i);
                // A hostname-derived short id must really be us.
                let hostname_ok = i
                    .hostname_path
                    .as_deref()
                    .is_none_or(|p| p.contains(&me.id));
                if me.id.starts_with(c.as_str()) && hostname_ok {
                    tracing::debug!(id = %me.id, "found own container");
                    return Ok(Some(me));
                }
            }
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(ShimError::docker(format!("inspect own container {c}"))(e)),
        }
    }
    // A candidate only from the hostname is weak evidence: a 12-hex host
    // name is possible outside a container (and in a container of another
    // daemon, where mountinfo would have named it).
    if candidates.len() == 1 && candidates[0] == hostname.trim() && override_id.is_none() {
        return Ok(None);
    }
    Err(ShimError::NoSelf {
        candidates,
        addr: host().to_string(),
    })
}

/// Returns the stop timeout of the container this process runs in, in
/// seconds: `Some(None)` when it has none of its own (Docker's default,
/// 10 s), `None` when it cannot be told (no container, no daemon).
pub fn own_stop_timeout_blocking() -> Option<Option<i64>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let work = async {
            let docker = connect().await.ok()?;
            let me = whoami(&docker).await.ok()??;
            let i = docker
                .inspect_container(
                    &me.id,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
                .ok()?;
            Some(i.config.and_then(|c| c.stop_timeout))
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), work)
            .await
            .ok()?
    })
}

/// Returns the start time of process `pid` in clock ticks since boot (field
/// 22 of `/proc/<pid>/stat`), to tell a live shim from a reused pid.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// Like [`process_start`], but `None` for a process that has exited and
/// not been reaped yet (a zombie, state `Z` or `X`): its pid is still
/// taken, but it runs no code. A shim killed with its node can stay a
/// zombie under an init that does not reap.
pub fn running_process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let mut fields = after.split(' ');
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_start_is_readable_and_stable() {
        let me = std::process::id();
        let a = process_start(me).unwrap();
        assert_eq!(process_start(me), Some(a));
        assert_eq!(process_start(u32::MAX), None);
        assert_eq!(running_process_start(me), Some(a));
    }

    #[test]
    fn a_zombie_has_a_start_but_is_not_running() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for: once it exits it stays a zombie until `wait`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while running_process_start(pid).is_some() {
            assert!(std::time::Instant::now() < deadline, "true never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            process_start(pid).is_some(),
            "the zombie's pid is still taken"
        );
        child.wait().unwrap();
        assert_eq!(process_start(pid), None);
    }

    #[test]
    fn id_like_names_and_full_ids() {
        for s in [
            "a",
            "0",
            "ab",
            "0123456789ab",
            "ABCDEF",
            "/deadbeef",
            &"f".repeat(64),
        ] {
            assert!(looks_like_id(s), "{s}");
        }
        for s in ["", "/", "g", "abc-1", "my-engine", "x0123", &"a".repeat(65)] {
            assert!(!looks_like_id(s), "{s}");
        }
        assert!(is_full_id(&"0a".repeat(32)));
        assert!(!is_full_id(&"0A".repeat(32)));
        assert!(!is_full_id(&"0a".repeat(31)));
    }
}
