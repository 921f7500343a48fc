//! The shim's settings are the node's, not the caller's.
//!
//! The shim runs as Ray's worker process (`bash -c "exec podman run …"`),
//! whose environment holds the job's runtime_env `env_vars`. Every variable
//! the policy and the daemon connection read (the allow-lists, and the
//! folders the default bind roots come from: `TMPDIR`, `RAY_TMPDIR`,
//! `ARGUS_SHARED_ROOT`, `ARGUS_MODEL_CACHE`, `DOCKER_HOST`, …) would be the
//! job's to set: `env_vars={"TMPDIR": "/var/lib"}` made `/var/lib` an
//! allowed root. So the node agent (`argus-agent run`) writes its own values
//! of [`VARIABLES`] to `<state dir>/shim-settings.json` at start, and a shim
//! started under that agent takes them from there and nowhere else.
//!
//! The shim finds its agent among its ancestors (a process running the same
//! executable that is not itself a `podman` call), which no environment
//! variable can redirect, and reads the agent's state folder from the
//! agent's own environment or command line. A shim with no agent above it
//! (a person's `docker exec`, a test) uses the settings file of
//! `$ARGUS_STATE_DIR` (default `/run/argus`) when there is one, and its own
//! environment otherwise: that is the standalone shim, configured by
//! whoever runs it.
//!
//! Until the shim becomes a client of PID 1 (privilege separation), code
//! that runs in the Ray container as the Ray user can still rewrite this
//! file or reach the Docker socket itself; this closes the `env_vars` path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the node's state folder.
pub const FILE: &str = "shim-settings.json";

pub use argus_config::DEFAULT_STATE_DIR;

/// Every variable the shim's policy, owner and daemon connection read.
pub const VARIABLES: &[&str] = &[
    "ARGUS_SHIM_POLICY",
    "ARGUS_SHIM_ALLOWED_IMAGES",
    "ARGUS_SHIM_ALLOWED_BINDS",
    "ARGUS_SHIM_ALLOWED_CAPS",
    "ARGUS_SHIM_ALLOWED_VOLUMES",
    "ARGUS_SHIM_ALLOWED_USERS",
    "ARGUS_SHIM_MAX_ENGINES_PER_JOB",
    "ARGUS_SHIM_MAX_LOG_FOLLOWS",
    "ARGUS_SHIM_SELF_ID",
    "ARGUS_SHIM_OWNER",
    "ARGUS_SHIM_LOG",
    "ARGUS_AGENT_USER",
    "ARGUS_STATE_DIR",
    "ARGUS_SHARED_ROOT",
    "ARGUS_MODEL_CACHE",
    "TMPDIR",
    "RAY_TMPDIR",
    "DOCKER_HOST",
];

/// The node's values of [`VARIABLES`] (unset ones absent), and the bind
/// roots the agent resolved from them at its start.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeSettings {
    pub values: BTreeMap<String, String>,
    /// The allowed bind roots (`ARGUS_SHIM_ALLOWED_BINDS` or the defaults)
    /// resolved once, by the agent (root) at its start, to canonical paths
    /// in the Ray container ([`NodeSettings::resolve_bind_roots`]). Every
    /// call compares its binds with these and never resolves the roots
    /// again: a root is, or its folder is, often the Ray user's (`/tmp/ray`,
    /// `/private`), who could otherwise turn it into a link to `/var` at
    /// will. None: settings written by an older agent (each call resolves
    /// the roots itself, as before).
    #[serde(default)]
    pub bind_roots: Option<Vec<PathBuf>>,
}

/// Why the node's settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{path}: cannot read this node's shim settings ({source}); they are written by `argus-agent run` at start")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: this node's shim settings are not valid ({source})")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: cannot write the shim settings: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

impl NodeSettings {
    /// Takes the values of [`VARIABLES`] from `get`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> NodeSettings {
        NodeSettings {
            values: VARIABLES
                .iter()
                .filter_map(|&k| get(k).map(|v| (k.to_string(), v)))
                .collect(),
            bind_roots: None,
        }
    }

    /// Resolves the allowed bind roots of these settings, in this process's
    /// view of the file system (the agent's, at its start, as root): each
    /// root as far as it exists, the missing rest as written
    /// ([`super::resolve::resolve_root`]); a root that cannot be resolved
    /// allows nothing. Settings the policy cannot read leave the roots
    /// unresolved (every call then fails on them, naming the variable).
    pub fn resolve_bind_roots(&mut self) {
        let get = |k: &str| self.values.get(k).cloned();
        self.bind_roots = argus_podman_core::policy::allowed_binds(get).ok().map(|l| {
            l.iter()
                .filter_map(|p| super::resolve::resolve_root(Path::new(p)))
                .collect()
        });
    }

    /// Writes the settings to `dir`/[`FILE`] atomically (a reader never sees
    /// a partial file), readable by all: the Ray user's shims read it.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, SettingsError> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(FILE);
        let err = |source| SettingsError::Write {
            path: path.display().to_string(),
            source,
        };
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
        let text = serde_json::to_vec_pretty(self).map_err(|e| err(e.into()))?;
        tmp.write_all(&text).map_err(err)?;
        tmp.as_file().sync_all().map_err(err)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(err)?;
        tmp.persist(&path).map_err(|e| err(e.error))?;
        Ok(path)
    }

    /// Reads the settings file at `path`.
    pub fn read(path: &Path) -> Result<NodeSettings, SettingsError> {
        let text = std::fs::read(path).map_err(|source| SettingsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_slice(&text).map_err(|source| SettingsError::Parse {
            path: path.display().to_string(),
            source,
        })
    }

    /// Returns the names whose value in `env` differs from the node's.
    pub fn differences(&self, env: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
        VARIABLES
            .iter()
            .copied()
            .filter(|&k| env(k).as_deref() != self.values.get(k).map(String::as_str))
            .collect()
    }
}

/// Where the node's settings come from, for the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The node agent `pid`, an ancestor of the shim: its settings file.
    Agent { pid: i32, file: PathBuf },
    /// No agent above; a settings file in `$ARGUS_STATE_DIR`.
    StateDir(PathBuf),
    /// No agent and no file: the shim's own environment (standalone).
    Environment,
}

/// Returns this node's state folder, as this process's `ARGUS_STATE_DIR`
/// names it (the one reading of that variable in the shim; see
/// [`argus_config::state_dir_or_default`]).
pub fn state_dir() -> PathBuf {
    argus_config::state_dir_or_default(std::env::var("ARGUS_STATE_DIR").ok().as_deref())
}

/// Finds where this shim's settings come from (see the module docs).
pub fn locate() -> Source {
    if let Some((pid, dir)) = agent_ancestor() {
        return Source::Agent {
            pid,
            file: dir.join(FILE),
        };
    }
    let file = state_dir().join(FILE);
    if file.exists() {
        Source::StateDir(file)
    } else {
        Source::Environment
    }
}

/// Makes the node's settings the ones in force for this process: sets (or
/// removes) each of [`VARIABLES`] in its environment to the node's value.
/// Returns the variables the caller had set to another value (a caller
/// without one is simply given the node's).
///
/// Must be called while the process has one thread (the shim's start,
/// before the watchdog and the runtime): the environment is not
/// thread-safe.
pub fn apply(node: &NodeSettings) -> Vec<&'static str> {
    // The roots resolved at the node's start, never the caller's.
    match &node.bind_roots {
        Some(l) => std::env::set_var(
            argus_podman_core::policy::BIND_ROOTS_VAR,
            serde_json::to_string(l).unwrap_or_default(),
        ),
        None => std::env::remove_var(argus_podman_core::policy::BIND_ROOTS_VAR),
    }
    let differ = node.differences(|k| std::env::var(k).ok());
    let mut overridden = Vec::new();
    for &k in &differ {
        if std::env::var_os(k).is_some() {
            overridden.push(k);
        }
        match node.values.get(k) {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
    overridden
}

/// Returns the nearest ancestor that runs this same executable as a node
/// agent (not as `podman`), with its state folder.
fn agent_ancestor() -> Option<(i32, PathBuf)> {
    let me = std::fs::read_link("/proc/self/exe").ok()?;
    let mut pid = nix::unistd::getppid().as_raw();
    for _ in 0..64 {
        if pid < 1 {
            return None;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        if exe.as_deref() == Some(me.as_path()) {
            let argv = nul_split(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?);
            if !is_podman_call(&argv) {
                let environ = nul_split(&std::fs::read(format!("/proc/{pid}/environ")).ok()?);
                return Some((pid, state_dir_of(&argv, &environ)));
            }
        }
        if pid == 1 {
            return None;
        }
        pid = parent_of(pid)?;
    }
    None
}

/// Splits a NUL-separated `/proc` file into its strings.
fn nul_split(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// Returns true if and only if `argv` is a shim call (`podman …` or
/// `argus-agent podman …`).
fn is_podman_call(argv: &[String]) -> bool {
    let base = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a))
        .unwrap_or("");
    base == "podman" || argv.get(1).map(String::as_str) == Some("podman")
}

/// Returns the agent's state folder: its `--state-dir` flag, else its
/// `ARGUS_STATE_DIR`, else the default.
fn state_dir_of(argv: &[String], environ: &[String]) -> PathBuf {
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--state-dir=") {
            return PathBuf::from(v);
        }
        if a == "--state-dir" {
            if let Some(v) = it.next() {
                return PathBuf::from(v);
            }
        }
    }
    argus_config::state_dir_or_default(
        environ
            .iter()
            .find_map(|e| e.strip_prefix("ARGUS_STATE_DIR=")),
    )
}

/// Returns the parent of `pid` from `/proc/<pid>/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields resume
    // after the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_settings_carry_the_bind_roots_resolved() {
        // The node's settings carry them, resolved by the agent.
        let mut node = crate::settings::NodeSettings::from_env(|k| match k {
            "ARGUS_SHIM_ALLOWED_BINDS" => Some("/proc/self/root/tmp:/no-such-argus/ray".into()),
            _ => None,
        });
        node.resolve_bind_roots();
        assert_eq!(
            node.bind_roots,
            Some(vec![
                PathBuf::from("/tmp"),
                PathBuf::from("/no-such-argus/ray")
            ])
        );
    }

    #[test]
    fn settings_round_trip_and_differences_name_the_variables() {
        let d = tempfile::tempdir().unwrap();
        let node = NodeSettings::from_env(|k| match k {
            "TMPDIR" => Some("/tmp/ray/tmp".into()),
            "ARGUS_SHARED_ROOT" => Some("/private".into()),
            "HOME" => Some("/home/ray".into()),
            _ => None,
        });
        assert_eq!(node.values.len(), 2, "only the shim's variables: {node:?}");
        let path = node.write(d.path()).unwrap();
        assert_eq!(NodeSettings::read(&path).unwrap(), node);
        // A job's env_vars: TMPDIR moved, a policy switch added.
        let job = |k: &str| match k {
            "TMPDIR" => Some("/var/lib".to_string()),
            "ARGUS_SHARED_ROOT" => Some("/private".into()),
            "ARGUS_SHIM_POLICY" => Some("relaxed".into()),
            _ => None,
        };
        assert_eq!(node.differences(job), vec!["ARGUS_SHIM_POLICY", "TMPDIR"]);
        std::fs::write(&path, "{garbage").unwrap();
        assert!(matches!(
            NodeSettings::read(&path),
            Err(SettingsError::Parse { .. })
        ));
    }

    #[test]
    fn agent_command_lines_give_the_state_folder() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_podman_call(&argv(&["/usr/bin/podman", "run"])));
        assert!(is_podman_call(&argv(&["argus-agent", "podman", "run"])));
        assert!(!is_podman_call(&argv(&["/usr/local/bin/argus-agent"])));
        assert!(!is_podman_call(&argv(&["argus-agent", "run"])));
        let env = argv(&["ARGUS_STATE_DIR=/run/a"]);
        assert_eq!(
            state_dir_of(&argv(&["argus-agent", "run"]), &env),
            PathBuf::from("/run/a")
        );
        assert_eq!(
            state_dir_of(&argv(&["argus-agent", "run", "--state-dir", "/s"]), &env),
            PathBuf::from("/s")
        );
        assert_eq!(
            state_dir_of(&argv(&["argus-agent", "--state-dir=/t"]), &[]),
            PathBuf::from("/t")
        );
        assert_eq!(
            state_dir_of(&argv(&["argus-agent"]), &[]),
            PathBuf::from(DEFAULT_STATE_DIR)
        );
        // This test process has no agent above it.
        assert_eq!(agent_ancestor(), None);
        assert_eq!(
            parent_of(std::process::id() as i32),
            Some(nix::unistd::getppid().as_raw())
        );
    }
}
