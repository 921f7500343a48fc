//! One podman call's state, built once when the call starts and passed
//! down by reference: who called (groups, hard limits, environment), the
//! settings in force (the node's), the daemon and the state folder.
//! Nothing below reads the process's environment or a static for these: a
//! call is one value.
//!
//! The caller's environment is data for the container only (`-e NAME`,
//! `-e PREFIX*`, `--env-host`, `--http-proxy`, Ray's `$RAY_…` values): no
//! setting, log filter or library variable is ever read from it (R-SEC-8).

use std::collections::HashMap;
use std::path::PathBuf;

use argus_podman_core::docker_host::DockerHost;
use argus_podman_core::policy::{Policy, PolicyError};

/// Who called: the identity the shim runs as is the caller's (the handler
/// took it), but its supplementary groups and hard limits are read from
/// the caller's process first (the handler keeps only the Docker socket's
/// group, and its limits are PID 1's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The caller's supplementary groups (for `--group-add keep-groups`).
    pub groups: Vec<u32>,
    /// The caller's hard limits by Docker's ulimit name (-1: unlimited);
    /// they bound its `--ulimit`s.
    pub ulimits: HashMap<String, i64>,
    /// The caller's environment, in its order: what the container may be
    /// given from it by name, never a setting of the call.
    pub env: Vec<(String, String)>,
    /// The process a detached container of this call lives as long as
    /// (pid, start time in clock ticks), decided by PID 1's broker from
    /// the caller's ancestry (R-SEC-9, `broker::lifetime_owner`); `None`
    /// for a standalone shim, whose detached containers live until removed.
    pub lifetime: Option<(u32, u64)>,
    /// The Ray job whose own code made this call (not a start of Ray's
    /// own), decided by PID 1's broker (`broker::share_of`); `None` for
    /// Ray's starts, callers outside any job and a standalone shim.
    pub job: Option<u32>,
}

impl Caller {
    /// This process as its own caller (a standalone shim).
    pub fn this_process() -> Caller {
        Caller {
            groups: nix::unistd::getgroups()
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
            ulimits: own_ulimits(),
            env: process_env(),
            lifetime: None,
            job: None,
        }
    }
}

/// This process's environment, in its order (lossy UTF-8).
fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

/// One podman call.
#[derive(Debug, Clone)]
pub struct Call {
    pub caller: Caller,
    /// The settings in force for the call: this process's environment,
    /// read once, in its order (the node's settings; a standalone shim's
    /// own environment).
    pub env: Vec<(String, String)>,
    /// The daemon (`DOCKER_HOST` of [`Call::env`]).
    pub docker: DockerHost,
    /// The node's state folder (`ARGUS_STATE_DIR` of [`Call::env`]).
    pub state_dir: PathBuf,
}

impl Call {
    /// Builds the call from `caller` and this process's environment, which
    /// holds the node's settings by now (see [`crate::settings::apply`]).
    pub fn new(caller: Caller) -> Call {
        Call::with_env(caller, process_env())
    }

    /// Builds the call from `caller` and `env`.
    pub fn with_env(caller: Caller, env: Vec<(String, String)>) -> Call {
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let docker = DockerHost::parse(get("DOCKER_HOST"));
        let state_dir = argus_config::state_dir_or_default(get("ARGUS_STATE_DIR"));
        Call {
            caller,
            env,
            docker,
            state_dir,
        }
    }

    /// Returns the value of `name` in the call's environment.
    pub fn var(&self, name: &str) -> Option<String> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// Returns the node's policy as the call's environment sets it, with
    /// the caller's limits.
    pub fn policy(&self) -> Result<Policy, PolicyError> {
        let mut p = Policy::from_env(|k| self.var(k))?;
        p.caller_ulimits = self.caller.ulimits.clone();
        Ok(p)
    }
}

/// `--ulimit` names, as Docker spells them, with their resource.
pub const ULIMITS: &[(&str, libc::__rlimit_resource_t)] = &[
    ("core", libc::RLIMIT_CORE),
    ("cpu", libc::RLIMIT_CPU),
    ("data", libc::RLIMIT_DATA),
    ("fsize", libc::RLIMIT_FSIZE),
    ("locks", libc::RLIMIT_LOCKS),
    ("memlock", libc::RLIMIT_MEMLOCK),
    ("msgqueue", libc::RLIMIT_MSGQUEUE),
    ("nice", libc::RLIMIT_NICE),
    ("nofile", libc::RLIMIT_NOFILE),
    ("nproc", libc::RLIMIT_NPROC),
    ("rss", libc::RLIMIT_RSS),
    ("rtprio", libc::RLIMIT_RTPRIO),
    ("rttime", libc::RLIMIT_RTTIME),
    ("sigpending", libc::RLIMIT_SIGPENDING),
    ("stack", libc::RLIMIT_STACK),
    ("as", libc::RLIMIT_AS),
];

/// Returns this process's hard limits by Docker's ulimit name.
fn own_ulimits() -> HashMap<String, i64> {
    ULIMITS
        .iter()
        .filter_map(|&(name, res)| {
            let mut r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes one rlimit into the pointed-to struct.
            let ok = unsafe { libc::getrlimit(res, &mut r) } == 0;
            ok.then(|| {
                let hard = if r.rlim_max == libc::RLIM_INFINITY {
                    -1
                } else {
                    i64::try_from(r.rlim_max).unwrap_or(-1)
                };
                (name.to_string(), hard)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use argus_podman_core::policy::parse_proc_limits;

    #[test]
    fn own_limits_are_those_of_the_proc_file() {
        let text = std::fs::read_to_string("/proc/self/limits").unwrap();
        let parsed = parse_proc_limits(&text);
        assert_eq!(parsed, own_ulimits());
        assert_eq!(parsed.len(), ULIMITS.len());
    }

    #[test]
    fn the_call_reads_its_settings_from_its_environment_once() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        // The caller's environment names other settings: none is used.
        let caller = Caller {
            groups: vec![7],
            ulimits: [("nofile".to_string(), 1024)].into(),
            env: env(&[
                ("DOCKER_HOST", "unix:///tmp/evil.sock"),
                ("ARGUS_STATE_DIR", "/tmp/evil"),
                ("ARGUS_SHIM_POLICY", "x"),
            ]),
            lifetime: None,
            job: None,
        };
        let c = Call::with_env(
            caller.clone(),
            env(&[
                ("DOCKER_HOST", "unix:///run/argus-docker/docker.sock"),
                ("ARGUS_STATE_DIR", "/run/n1"),
            ]),
        );
        assert_eq!(
            c.docker.socket_path(),
            Some("/run/argus-docker/docker.sock")
        );
        assert_eq!(c.state_dir, PathBuf::from("/run/n1"));
        assert_eq!(c.policy().unwrap().caller_ulimits, caller.ulimits);
        assert_eq!(c.var("ARGUS_SHIM_POLICY"), None);
        let d = Call::with_env(caller.clone(), env(&[("ARGUS_STATE_DIR", "rel")]));
        assert_eq!(d.docker, DockerHost::parse(None));
        assert_eq!(d.state_dir, PathBuf::from(argus_config::DEFAULT_STATE_DIR));
        let bad = Call::with_env(caller, env(&[("ARGUS_SHIM_POLICY", "x")]));
        assert!(bad.policy().is_err());
    }
}
