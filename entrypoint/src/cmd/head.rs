//! `argus-agent head`.

/// Shows the discovery record.
pub fn run(_json: bool) -> u8 {
    1
}
