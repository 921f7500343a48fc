//! Head discovery through a TTL record on shared storage (NFS, GPFS).
//!
//! The head publishes `head.json` atomically; workers read it with a fresh
//! `open` + `read` on every poll (never `stat`: attributes are cached on
//! NFS) and judge liveness by their own monotonic clock from observed
//! changes of the bytes, as Kubernetes' leader election does, so the head's
//! and the workers' clocks need not agree. A second head claims a higher
//! generation (fencing token) by exclusive create; readers ignore records of
//! a lower generation than they have seen.
//!
//! This crate has no process or Docker code; it is pure logic plus file I/O.

pub mod claim;
pub mod lease;
pub mod publish;
pub mod read;
pub mod record;
pub mod token;
pub mod trust;

pub use claim::{claim_generation, highest_generation, scan_generations, ClaimError, Scan};
pub use lease::Lease;
pub use publish::{
    prune_stale_temps, publish, publish_volatile, publish_watched, PublishError, VolatileDir,
    STAGING_DIR, STALE_TEMP_AGE,
};
pub use read::{read_record, ReadError, RecordFile};
pub use record::{HeadRecord, HeadState, RecordError, MAX_RECORD_BYTES, SCHEMA_VERSION};
