//! `argus-agent status`.

/// Prints this node's status.
pub fn run(_json: bool) -> u8 {
    1
}

/// Exits 0 if healthy.
pub fn healthcheck() -> u8 {
    1
}
