//! `argus-agent run`.

/// Runs the node.
pub fn run() -> u8 {
    1
}
