//! `argus-agent podman …` or the binary invoked as `podman`: the shim.

use std::ffi::OsString;

/// Runs the shim with the arguments after `podman`; returns podman's exit
/// code (the container's for `run`, 125 for the shim's own failures).
pub fn run(args: Vec<OsString>) -> u8 {
    crate::logging::init_shim();
    argus_podman::run(args)
}

/// Serves one podman call for the node's broker (`__shim-handler SETTINGS
/// PID:START JOB`, the connection on descriptor 3; PID:START the process a
/// detached container of the call lives as long as, JOB the Ray job whose
/// own code made the call, `-` for none); returns the call's exit code.
pub fn handle(settings: OsString, lifetime: Option<String>, job: Option<String>) -> u8 {
    argus_podman::handler::serve(
        std::path::Path::new(&settings),
        lifetime.as_deref(),
        job.as_deref(),
        crate::logging::init_shim,
    )
}
