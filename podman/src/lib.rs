//! The podman shim (SPEC §9, issue 4): answers Ray's `podman …` calls with
//! the host Docker Engine API over its unix socket.
//!
//! Ray's `image_uri` runtime_env runs `podman run …` twice: once to probe the
//! worker path (`--rm -v <tmpdir>:/shared`), and once per worker through
//! `bash -c "exec podman run …"`, so the shim process *is* the worker the
//! raylet signals and may SIGKILL. Hence: signals are forwarded to the
//! container, a watchdog process removes the container when the shim dies
//! without cleaning up, and every container is labelled with its owner so
//! the node agent's janitor can sweep what is left (R-SHIM-4).
//!
//! Layout, in the order a call goes through it: [`client`] (the `podman`
//! Ray runs, under a node agent) -> [`transport`] (the agent's unix socket:
//! streams, request, signals, exit code) -> [`broker`] (PID 1 accepts and
//! spawns) -> [`handler`] (one process per call, with the caller's
//! identity) -> [`args`] parses -> [`settings`] (the node's, not the
//! caller's) -> [`resolve`] (bind sources, link by link) -> [`translate`]
//! maps podman meaning onto Docker (one submodule per group of flags) ->
//! [`policy`] refuses dangerous requests -> [`runner`] drives `run`,
//! [`cmds`] the other subcommands, over [`docker`]. Beside them:
//! [`argus_podman_core::selfid`] finds the Ray container and maps its paths to the host,
//! [`argus_podman_core::labels`] and [`owner`] name the containers, [`janitor`] sweeps,
//! [`watchdog`] outlives a killed handler, [`report`] tells the broker how
//! a call went (for the agent's metrics). Without a node agent (tests, a
//! person on a host) the shim runs the call in-process from `args` on.
//!
//! This crate is the shim's I/O edge: sockets, processes, the Docker API,
//! the node's settings file. Every decision (what a flag means, what the
//! policy refuses, the create body) is argus-podman-core's, which gets
//! values from here and returns values.
//!
//! May import: argus-podman-core, argus-config, argus-supervise,
//! argus-telemetry. Must never import: argus-node, argus-agent.

pub mod broker;
pub mod call;
pub mod client;
pub mod cmds;
pub mod docker;
pub mod error;
pub mod handler;
pub mod janitor;
pub mod nodelock;
pub mod owner;
pub mod report;
pub mod resolve;
pub mod runner;
pub mod settings;
pub mod transport;
pub mod watchdog;

use std::ffi::OsString;

use argus_podman_core::args;

pub use janitor::{sweep_blocking, JanitorScope};

pub use error::{refusal_rule, ShimError, EXIT_CANNOT_INVOKE, EXIT_NOT_FOUND, EXIT_SHIM};

/// Runs the shim with the arguments after `podman` and returns the exit
/// code. Must be called before any other thread exists: an attached `run`
/// forks its watchdog first. The caller installs the log subscriber (the
/// shim logs at `ARGUS_SHIM_LOG`, [`LOG_ENV`]).
pub fn run(args: Vec<OsString>) -> u8 {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // Under a node agent that brokers podman calls, this process is only
    // its client: the agent's side holds the Docker socket.
    if let Some(code) = client::run(&args) {
        return code;
    }
    if let Err(e) = use_node_settings(None) {
        return fail(&e);
    }
    run_here(&args, call::Caller::this_process(), || {})
}

/// Runs the shim in this process (the standalone shim, or the agent's
/// handler of one client call) for `caller`, with the node's settings in
/// this process's environment; `on_ready` runs once the watchdog is forked
/// and before any thread of the shim exists.
pub fn run_here(args: &[String], caller: call::Caller, on_ready: impl FnOnce()) -> u8 {
    report::note_command(argus_telemetry::metrics::shim_command_label(
        args::command_word(args).unwrap_or(""),
    ));
    let command = match args::parse(args) {
        Ok(c) => c,
        Err(e) => return fail(&ShimError::from(e)),
    };
    let mut ignored = args::leading_ignored_globals(args);
    if let args::Command::Run(o) = &command {
        ignored.extend(&o.ignored);
    }
    report::note_ignored(ignored);
    if let args::Command::Run(o) = &command {
        if !o.detach {
            watchdog::spawn();
        }
    }
    on_ready();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&ShimError::Runtime(e)),
    };
    let call = call::Call::new(caller);
    let result = rt.block_on(async move {
        match command {
            args::Command::Run(o) => runner::run(*o, &call).await,
            other => cmds::run(other, &call).await,
        }
    });
    let code = match result {
        Ok(code) => code,
        Err(e) => fail(&e),
    };
    watchdog::disarm();
    // Blocking stdin readers must not keep the process alive.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

/// Makes the node's settings the ones in force (see [`settings`]): the
/// caller's environment may hold a job's `env_vars`.
fn use_node_settings(file: Option<&std::path::Path>) -> Result<(), ShimError> {
    let file = match file {
        Some(f) => f.to_path_buf(),
        None => match settings::locate() {
            settings::Source::Agent { file, .. } | settings::Source::StateDir(file) => file,
            settings::Source::Environment => return Ok(()),
        },
    };
    let node = settings::NodeSettings::read(&file)?;
    for name in settings::apply(&node) {
        tracing::warn!(
            variable = name,
            file = %file.display(),
            "the caller's value is ignored: the shim uses this node's settings"
        );
    }
    Ok(())
}

/// Prints `e` as podman does and returns its exit code; notes the rule
/// when `e` is a refusal (for the broker's report, see [`report`]).
fn fail(e: &ShimError) -> u8 {
    if let Some(rule) = refusal_rule(e) {
        report::note_refusal(rule);
    }
    eprintln!("Error: {e}");
    EXIT_SHIM
}

/// The variable that holds the shim's log filter (tracing syntax; the
/// binary's default is `warn`, so the worker's log files only get warnings
/// and errors).
pub const LOG_ENV: &str = "ARGUS_SHIM_LOG";

#[cfg(test)]
mod tests {
    use super::*;
    use argus_podman_core::args::ArgsError;

    #[test]
    fn refusals_of_the_parser_have_rules_and_other_errors_none() {
        // Refusals of the parser, and errors that are no refusal.
        let args = |e| refusal_rule(&ShimError::Args(e));
        assert_eq!(
            args(ArgsError::UnknownFlag("--x".into())),
            Some("unknown_flag")
        );
        assert_eq!(
            args(ArgsError::UnknownCommand("x".into())),
            Some("unknown_command")
        );
        assert_eq!(
            args(ArgsError::Unsupported {
                flag: "--pod".into(),
                value: "p".into()
            }),
            Some("unsupported")
        );
        assert_eq!(args(ArgsError::MissingValue("--name".into())), None);
        assert_eq!(refusal_rule(&ShimError::NoSuchContainer("c".into())), None);
    }
}
