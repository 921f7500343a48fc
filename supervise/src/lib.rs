//! Process supervision for PID 1: one signal thread, one reaper, children in
//! their own process groups, restart backoff, and the process tree of Ray.
//!
//! Why it looks like this: a global `waitpid(-1)` steals exit statuses from
//! `std::process::Child::wait`, so every child the agent starts is spawned
//! through [`reaper::spawn`] and its status is routed back from the single
//! reaping thread. Signals are blocked in every thread (before any thread is
//! created) and received synchronously by that same thread.
//!
//! Beside the processes, the node's other mechanics that know nothing of
//! Ray or Docker: shared-storage I/O on a thread of its own with a bound
//! ([`storage`]), file watching with a polling fallback ([`watch`]), and
//! the node's IP address ([`netinfo`]).
//!
//! May import: argus-discovery (the writer identity of shared paths).
//! Must never import: argus-config, argus-telemetry, argus-podman-core,
//! argus-podman, argus-node (it is below all of them).

pub mod backoff;
pub mod exitwatch;
pub mod lines;
pub mod netinfo;
pub mod privs;
pub mod reaper;
pub mod stop;
pub mod storage;
pub mod tree;
pub mod watch;

pub use reaper::{spawn, spawn_captured, Captured, ChildProc, Exit, Waited};
pub use stop::{Stop, Stopped};
