//! `argus-agent podman …` or the binary invoked as `podman`: the shim.

use std::ffi::OsString;

/// Runs the shim with the arguments after `podman`; returns podman's exit
/// code (the container's for `run`, 125 for the shim's own failures).
pub fn run(args: Vec<OsString>) -> u8 {
    crate::logging::init_shim();
    argus_podman::run(args)
}

/// Serves one podman call for the node's broker (`__shim-handler SETTINGS`,
/// the connection on descriptor 3); returns the call's exit code.
pub fn handle(settings: OsString) -> u8 {
    argus_podman::handler::serve(std::path::Path::new(&settings), crate::logging::init_shim)
}
