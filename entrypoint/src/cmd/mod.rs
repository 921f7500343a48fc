//! One file per subcommand. Each returns the exit code of a normal outcome
//! (a node that stopped, a preflight verdict, an unhealthy node) or an
//! [`Error`] that `main` prints once and exits with.

pub mod config;
pub mod flags;
pub mod head;
pub mod podman;
pub mod preflight;
pub mod raytool;
pub mod run;
pub mod status;

use std::path::PathBuf;

use argus_config::ConfigError;
use argus_node::hook::HookError;
use argus_node::preflight::PreflightFailure;

/// Exit code for bad configuration (sysexits EX_CONFIG).
pub const EX_CONFIG: u8 = 78;

/// Why a subcommand failed; each variant knows its exit code (SPEC §11).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    #[error("configuration error: {0}")]
    NodeIp(#[from] argus_supervise::netinfo::NoNodeIp),
    #[error(transparent)]
    Preflight(#[from] PreflightFailure),
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error("cannot create the state folder {} (ARGUS_STATE_DIR): {source}", .path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Status(#[from] argus_telemetry::status::StatusError),
    #[error(transparent)]
    ShimSettings(#[from] argus_podman::settings::SettingsError),
    #[error(transparent)]
    Record(#[from] argus_discovery::ReadError),
    #[error("cannot serve metrics on port {port} (ARGUS_METRICS_PORT): {source}; pick a free port or unset it")]
    MetricsPort {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("configuration error: {0}")]
    DockerSocket(String),
    /// R-SEC-2: a path the agent writes breaks the trusted-path rule.
    #[error("configuration error: {0}")]
    Untrusted(String),
    #[error("failed to set up signal handling: {0}")]
    Signals(#[source] std::io::Error),
    #[error("failed to serialise the output: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// Returns the process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_)
            | Error::NodeIp(_)
            | Error::MetricsPort { .. }
            | Error::DockerSocket(_)
            | Error::Untrusted(_) => EX_CONFIG,
            Error::Preflight(e) => e.exit_code(),
            Error::Hook(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// What a subcommand returns: the exit code of a normal outcome.
pub type Outcome = Result<u8, Error>;
