//! Logging setup.
