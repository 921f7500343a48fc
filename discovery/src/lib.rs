//! Head discovery on shared storage.
