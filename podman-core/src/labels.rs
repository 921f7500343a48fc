//! The labels the shim puts on every container it creates (SPEC R-SHIM-4):
//! the janitor, the watchdog and the subcommands find its containers by them.

/// Label keys on every container the shim creates (R-SHIM-4).
pub const LABEL_OWNER: &str = "io.argus.shim.owner";
pub const LABEL_PID: &str = "io.argus.shim.pid";
pub const LABEL_START: &str = "io.argus.shim.pid-start";
pub const LABEL_RM: &str = "io.argus.shim.rm";

/// The prefix of every label above; a job may not set labels under it.
pub const LABEL_PREFIX: &str = "io.argus.shim.";
