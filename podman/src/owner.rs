//! The owner label (issue 9, item 7): which node's shim created a container.
//!
//! The owner is an id of this node that both the node agent's janitor and
//! the shim processes the raylet starts can compute: the Ray container's id
//! when the node runs in a container (both find it with `whoami`), and, on
//! the host, a random id kept in `$ARGUS_STATE_DIR/shim-owner` (default
//! `/run/argus`), created by whichever of the two comes first. Never a word
//! shared by several nodes: a node's stop sweep removes all containers of its
//! owner, so a shared word would take other nodes' engines with it.
//! `ARGUS_SHIM_OWNER` overrides both (tests, unusual layouts).

use std::io::Write;
use std::path::Path;

use crate::call::Call;
use crate::error::ShimError;
use argus_podman_core::selfid::SelfContainer;

/// The prefix of the owner ids of nodes that run on the host; no container
/// has such an id, so other nodes' janitors never judge them orphans.
pub const HOST_PREFIX: &str = "host-";

/// The file, in the state folder, that holds a host node's owner id.
pub const OWNER_FILE: &str = "shim-owner";

/// Returns the owner id of this node, as this process's environment
/// gives it (the node agent's janitor); see [`owner_of`].
pub fn node_owner(me: Option<&SelfContainer>) -> Result<String, ShimError> {
    owner_of(
        me,
        std::env::var("ARGUS_SHIM_OWNER").ok().as_deref(),
        &crate::settings::state_dir(),
    )
}

/// Returns the owner id of the node of `call`; see [`owner_of`].
pub fn node_owner_in(me: Option<&SelfContainer>, call: &Call) -> Result<String, ShimError> {
    owner_of(me, call.var("ARGUS_SHIM_OWNER").as_deref(), &call.state_dir)
}

/// Returns the owner id of a node: `ARGUS_SHIM_OWNER` (`set`), else the
/// Ray container's id, else the host node's id from the state folder.
fn owner_of(
    me: Option<&SelfContainer>,
    set: Option<&str>,
    state_dir: &Path,
) -> Result<String, ShimError> {
    if let Some(o) = set.map(str::trim).filter(|o| !o.is_empty()) {
        return Ok(o.to_string());
    }
    if let Some(me) = me {
        return Ok(me.id.clone());
    }
    host_owner(state_dir)
}

/// Returns true if and only if `id` is a host node's owner id (or the
/// shared `host` of older shims).
pub fn is_host_owner(id: &str) -> bool {
    id == "host" || id.starts_with(HOST_PREFIX)
}

/// Returns the host node owner id kept in `dir`, creating it (atomically:
/// a racing creator's id wins and is returned to both) when there is none.
pub fn host_owner(dir: &Path) -> Result<String, ShimError> {
    let path = dir.join(OWNER_FILE);
    let io = |source| ShimError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(id) = read_owner(&path) {
        return Ok(id);
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    let id = format!("{HOST_PREFIX}{}", uuid::Uuid::new_v4().simple());
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    writeln!(tmp, "{id}").map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    // Readable by the Ray user's podman calls (the agent may be root).
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io)?;
    }
    match tmp.persist_noclobber(&path) {
        Ok(_) => Ok(id),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
            read_owner(&path).ok_or_else(|| io(e.error))
        }
        Err(e) => Err(io(e.error)),
    }
}

fn read_owner(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let id = text.trim();
    (id.starts_with(HOST_PREFIX) && id.len() > HOST_PREFIX.len()).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_owner_is_created_once_and_differs_between_nodes() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let id = host_owner(a.path()).unwrap();
        assert!(id.starts_with(HOST_PREFIX) && id.len() > 20, "{id}");
        assert_eq!(host_owner(a.path()).unwrap(), id, "stable across calls");
        assert_ne!(host_owner(b.path()).unwrap(), id, "unique per node");
        assert!(is_host_owner(&id) && is_host_owner("host"));
        assert!(!is_host_owner("0f3c1e2d4b5a"));
    }

    #[test]
    fn racing_creators_agree_on_one_id() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| host_owner(dir.path()).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|i| i == &ids[0]), "{ids:?}");
    }

    #[test]
    fn a_missing_state_folder_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("run/argus");
        let id = host_owner(&nested).unwrap();
        assert_eq!(
            std::fs::read_to_string(nested.join(OWNER_FILE))
                .unwrap()
                .trim(),
            id
        );
    }
}
