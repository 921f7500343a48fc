//! The podman shim (issue 4).
