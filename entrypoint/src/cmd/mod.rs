//! One file per subcommand; each returns the process exit code.

pub mod head;
pub mod podman;
pub mod preflight;
pub mod run;
pub mod status;
