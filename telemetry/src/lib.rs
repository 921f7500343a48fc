//! Telemetry: the agent's Prometheus metrics ([`metrics`]) and the node's
//! status file ([`status`]). It takes values (a count, a state, a check's
//! outcome as plain fields) and knows no role, no check, no podman rule:
//! the crates above hand it what to record.
//!
//! Must never import: argus-node, argus-podman, argus-podman-core,
//! argus-config.

pub mod metrics;
pub mod status;
