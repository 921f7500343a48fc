//! The labels the shim puts on every container it creates (SPEC R-SHIM-4):
//! the janitor, the watchdog and the subcommands find its containers by them.

/// Label keys on every container the shim creates (R-SHIM-4).
pub const LABEL_OWNER: &str = "io.argus.shim.owner";
pub const LABEL_PID: &str = "io.argus.shim.pid";
pub const LABEL_START: &str = "io.argus.shim.pid-start";
pub const LABEL_RM: &str = "io.argus.shim.rm";
/// The Ray job (eight hex digits) whose own code started the container
/// (not Ray's worker starts), as PID 1 decided it: what the per-job bound
/// on live engine containers counts (`ARGUS_SHIM_MAX_ENGINES_PER_JOB`).
pub const LABEL_JOB: &str = "io.argus.shim.job";

/// The prefix of every label above.
pub const LABEL_PREFIX: &str = "io.argus.shim.";

/// Label prefixes no job may set on a container, nor run an image that
/// carries (R-SEC-10): the shim's and the project's own (`io.argus.`), and
/// compose's (`com.docker.compose.`), by which `docker compose` adopts a
/// container as one of its services at the next `up`.
pub const RESERVED_PREFIXES: &[&str] = &["io.argus.", "com.docker.compose."];

/// Whether `label` (`KEY` or `KEY=VALUE`) is under a reserved prefix. Docker
/// keeps label keys as given, so the comparison is exact.
pub fn is_reserved(label: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| label.starts_with(p))
}

/// The label holding a compose service's project name.
pub const COMPOSE_PROJECT: &str = "com.docker.compose.project";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_labels_are_the_projects_and_composes_exactly() {
        for l in [
            "io.argus.shim.owner=x",
            "io.argus.cluster=argus-ray",
            "com.docker.compose.project=argus",
            "com.docker.compose.service",
        ] {
            assert!(is_reserved(l), "{l}");
        }
        for l in [
            "io.argusx=1",
            "com.docker.composer=1",
            "app=vllm",
            "IO.ARGUS.x=1",
        ] {
            assert!(!is_reserved(l), "{l}");
        }
    }
}
