//! The node agent library: supervision of Ray as PID 1, the head and worker
//! roles, node IP detection, status, GPU preflight, the pre-start hook and
//! the podman shim. Processes, files and sockets stay at the edges; parsers
//! and state machines are plain functions with tests beside them.

pub mod config;
pub mod hook;
pub mod metrics;
pub mod netinfo;
pub mod node;
pub mod preflight;
pub mod rayports;
pub mod shim;
pub mod status;
pub mod storage;
pub mod supervise;
pub mod watch;
