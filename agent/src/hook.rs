//! Pre-start hook (issue 3).
