//! `argus-agent podman …` or the binary invoked as `podman`: the shim.

use std::ffi::OsString;

/// Runs the shim with the arguments after `podman`; returns podman's exit
/// code (the container's for `run`, 125 for the shim's own failures).
pub fn run(args: Vec<OsString>) -> u8 {
    crate::logging::init_shim();
    argus::shim::run(args)
}
