//! Who called: the caller's hard limits and supplementary groups. The
//! agent's handler reads them from the caller's process before it takes
//! the caller's identity; a standalone shim is its own caller. The policy
//! gets them as values ([`argus_podman_core::policy::Policy::caller_ulimits`]).

use std::collections::HashMap;

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

/// The caller's hard limits, when the caller is another process: the
/// agent's handler reads them from `/proc/<caller pid>/limits` (the pid from
/// `SO_PEERCRED`) before it takes the caller's identity.
pub(crate) static CALLER_LIMITS: std::sync::OnceLock<HashMap<String, i64>> =
    std::sync::OnceLock::new();

/// Returns the caller's hard limits by Docker's ulimit name (-1:
/// unlimited): those the handler read from the caller's process
/// (`CALLER_LIMITS`), else this process's own (a standalone shim is its
/// caller).
pub fn caller_ulimits() -> HashMap<String, i64> {
    if let Some(l) = CALLER_LIMITS.get() {
        return l.clone();
    }
    own_ulimits()
}

/// Returns this process's hard limits by Docker's ulimit name.
pub(crate) fn own_ulimits() -> HashMap<String, i64> {
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

/// The caller's supplementary groups, when they are not this process's
/// (the agent's handler runs with the Docker socket's group instead).
pub(crate) static CALLER_GROUPS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// Returns the caller's supplementary groups (for `--group-add keep-groups`).
pub fn caller_groups() -> Vec<u32> {
    match CALLER_GROUPS.get() {
        Some(g) => g.clone(),
        None => nix::unistd::getgroups()
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default(),
    }
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
}
