//! `argus-agent preflight [--json]`.

/// Runs the GPU preflight and prints the verdict.
pub fn run(_json: bool) -> u8 {
    eprintln!("argus-agent: preflight is not built yet");
    1
}
