//! The podman shim's decisions, pure: a podman argv is parsed against the
//! flag table ([`args`]), mapped onto a Docker create body ([`translate`],
//! one submodule per group of flags) and checked against the node's rules
//! ([`policy`]); the answer is that body or a refusal naming its rule.
//! [`selfid`] describes the Ray container (from its inspect) and maps its
//! paths to the host; [`labels`] names the labels every container gets.
//!
//! Input is values only: the argv, the caller (uid, groups, limits) and the
//! node's facts (its mounts, GPUs, allow-lists). No socket, no file, no
//! environment variable, no static: the I/O edge (`argus-podman`) gathers
//! those and passes them in, which is why the property tests and the
//! security rules' tests live here.
//!
//! Must never import: argus-podman, argus-node, argus-supervise,
//! argus-telemetry, argus-config.

pub mod args;
pub mod docker_host;
pub mod labels;
pub mod policy;
pub mod selfid;
pub mod translate;
