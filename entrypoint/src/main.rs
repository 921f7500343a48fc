//! `argus-agent`: PID 1 of the Ray node image.
//!
//! Thin glue: argv[0] dispatch (`podman` -> shim), the clap CLI, logging
//! setup, and the mapping of errors to the exit codes of SPEC §11. This is
//! the only crate that exits.

mod cmd;
mod logging;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The node agent for GPU Ray clusters in containers.
#[derive(Debug, Parser)]
#[command(name = "argus-agent", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node (head or worker, from ARGUS_ROLE). The default.
    Run,
    /// Run the GPU preflight checks only and print the verdict.
    Preflight {
        /// Print the verdict as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show this node's state.
    Status {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 if and only if this node is healthy (for Docker HEALTHCHECK).
    Healthcheck,
    /// Read and show the discovery record with its age.
    Head {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The podman shim: forward podman calls to the Docker daemon.
    #[command(disable_help_flag = true)]
    Podman {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked_as == "podman" {
        return ExitCode::from(cmd::podman::run(argv.into_iter().skip(1).collect()));
    }
    if argv.get(1).is_some_and(|a| a == "podman") {
        return ExitCode::from(cmd::podman::run(argv.into_iter().skip(2).collect()));
    }

    // Signals are blocked before any thread exists (clap and logging create
    // none), so every thread inherits the mask.
    if let Err(e) = argus::supervise::reaper::init() {
        eprintln!("argus-agent: failed to set up signal handling: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    let code = match cli.command.unwrap_or(Command::Run) {
        Command::Run => cmd::run::run(),
        Command::Preflight { json } => cmd::preflight::run(json),
        Command::Status { json } => cmd::status::run(json),
        Command::Healthcheck => cmd::status::healthcheck(),
        Command::Head { json } => cmd::head::run(json),
        Command::Podman { .. } => unreachable!("dispatched above"),
    };
    ExitCode::from(code)
}
