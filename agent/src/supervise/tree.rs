//! The process tree under the agent, read with sysinfo.
