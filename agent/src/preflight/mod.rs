//! GPU preflight (issue 3).
