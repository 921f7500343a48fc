//! The shim's errors and exit codes (podman's): each error is one line,
//! and the refusals name the rule that refused them.

use crate::settings;
use argus_podman_core::{args, policy, translate};

/// Exit code of the shim's own failures (podman's).
pub const EXIT_SHIM: u8 = 125;
/// Exit code when the container command cannot be invoked.
pub const EXIT_CANNOT_INVOKE: u8 = 126;
/// Exit code when the container command is not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// Errors of the shim. Each one is printed as one line and exits 125.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error(transparent)]
    Args(#[from] args::ArgsError),
    #[error(transparent)]
    Translate(#[from] translate::TranslateError),
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error("cannot connect to the Docker daemon at {addr}: {source}")]
    Connect {
        addr: String,
        source: bollard::errors::Error,
    },
    #[error("{what}: {source}")]
    Docker {
        what: String,
        source: bollard::errors::Error,
    },
    #[error("cannot confirm which container this shim runs in (candidates {candidates:?} are unknown to the daemon at {addr}); set ARGUS_SHIM_SELF_ID to the container id, or to `host`")]
    NoSelf {
        candidates: Vec<String>,
        addr: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{image}: image not known locally and --pull=never")]
    ImageMissing { image: String },
    #[error("{image}: no such image in the host's Docker daemon (docker-daemon: never pulls)")]
    NotInDaemon { image: String },
    #[error("no container with name or ID {0:?} found: no such container")]
    NoSuchContainer(String),
    #[error("failed to start the tokio runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Settings(#[from] settings::SettingsError),
}

impl ShimError {
    /// Wraps a Docker API error with what the shim was doing.
    pub fn docker(what: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> ShimError {
        let what = what.into();
        move |source| ShimError::Docker { what, source }
    }
}

/// Returns the rule, as a label of [`policy::REFUSAL_RULES`], that refused the call
/// failing with `e`: the policy's rules, the translation's
/// `no-writable-subfolder-bind` and podman-only modes, and the flag
/// table's refusals (unknown, unsupported). None when `e` is no refusal
/// (a malformed call, the daemon, a setting).
pub fn refusal_rule(e: &ShimError) -> Option<&'static str> {
    use argus_podman_core::args::ArgsError;
    use argus_podman_core::policy::refusal_label;
    use argus_podman_core::translate::TranslateError;
    match e {
        ShimError::Policy(p) => p.rule(),
        ShimError::Translate(TranslateError::RacySubfolder { .. }) => {
            Some(refusal_label("no-writable-subfolder-bind"))
        }
        ShimError::Translate(TranslateError::Refused { rule, .. }) => Some(refusal_label(rule)),
        ShimError::Translate(TranslateError::Unsupported { .. })
        | ShimError::Args(ArgsError::Unsupported { .. })
        | ShimError::Args(ArgsError::NotSupported { .. }) => Some("unsupported"),
        ShimError::Args(ArgsError::UnknownFlag(_))
        | ShimError::Args(ArgsError::UnknownOption { .. }) => Some("unknown_flag"),
        ShimError::Args(ArgsError::UnknownCommand(_)) => Some("unknown_command"),
        _ => None,
    }
}
