//! `argus-agent`: PID 1 of the Ray node image.
//!
//! Thin glue: argv[0] dispatch (`podman` -> shim), the clap CLI, logging
//! setup, and the mapping of errors to the exit codes of SPEC §11. This is
//! the only crate that exits: each subcommand returns its exit code or a
//! typed error, which `main` prints once.

mod cmd;
mod logging;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cmd::flags::Flags;

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
    ///
    /// Every setting is an environment variable and, equally, a flag of
    /// this command (`--role worker` is ARGUS_ROLE=worker; a flag wins).
    /// `argus-agent config` shows the values in force.
    Run(Flags),
    /// Print the effective configuration (value and source) and check it as
    /// `run` would; exit 78 when it is bad.
    Config {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        flags: Flags,
    },
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
    /// Print this node's metrics in Prometheus' text format: live from
    /// ARGUS_METRICS_PORT when set, else the agent's last snapshot.
    Metrics {
        /// List every metric the agent can export (name, type, help), one
        /// a line, instead.
        #[arg(long)]
        catalogue: bool,
    },
    /// Read and show the discovery record with its age.
    Head {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run an operator's Ray command in this node as the Ray user, confined
    /// as Ray is (no groups, no capabilities, no_new_privs), from `/`, with
    /// Python isolated: `nodes`, `ray ARGS`, `serve ARGS` (`serve deploy -`
    /// takes the config on stdin), `python` (a script on stdin). Use it
    /// instead of running the image's Python in a `docker exec`.
    #[command(name = "ray-tool", disable_help_flag = true)]
    RayTool {
        /// nodes, ray, serve or python.
        #[arg(value_enum)]
        tool: cmd::raytool::Tool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// The podman shim: forward podman calls to the Docker daemon.
    #[command(disable_help_flag = true)]
    Podman {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    // First thing, before anything is read: a root process of this binary
    // (PID 1, and `healthcheck`/`status`/`metrics` that Docker and
    // operators exec beside Ray) is not dumpable, so a root process in an
    // engine container that shares this PID namespace cannot open its
    // `/proc/<pid>/root` (SPEC R-SEC-4; docs/security.md). The kernel makes
    // every exec'd process dumpable again, so each invocation does it.
    if let Err(e) = argus_supervise::privs::make_non_dumpable_if_root() {
        eprintln!("argus-agent: cannot make this root process non-dumpable: {e}");
        return ExitCode::from(1);
    }
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
    // The agent's side of one podman call (spawned by the node's broker).
    if argv
        .get(1)
        .is_some_and(|a| a == argus_podman::broker::HANDLER_COMMAND)
    {
        return ExitCode::from(cmd::podman::handle(
            argv.get(2).cloned().unwrap_or_default(),
            argv.get(3).and_then(|a| a.to_str()).map(str::to_string),
            argv.get(4).and_then(|a| a.to_str()).map(str::to_string),
        ));
    }

    // An operator's Ray command: before run() sets up the node's signal
    // handling and child reaper, which would take the child's exit.
    if argv.get(1).is_some_and(|a| a == "ray-tool") {
        if let Some(Command::RayTool { tool, args }) = Cli::parse().command {
            return ExitCode::from(cmd::raytool::run(tool, args));
        }
    }

    let code = match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // Once: into the log when the node set logging up, else stderr.
            if tracing::dispatcher::has_been_set() {
                tracing::error!("{e}");
            } else {
                eprintln!("argus-agent: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    };
    logging::flush();
    code
}

fn run() -> cmd::Outcome {
    // Signals are blocked before any thread exists (clap and logging create
    // none), so every thread inherits the mask.
    argus_supervise::reaper::init().map_err(cmd::Error::Signals)?;
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run(Flags::default())) {
        Command::Run(flags) => cmd::run::run(&flags),
        Command::Config { json, flags } => cmd::config::run(&flags, json),
        Command::Preflight { json } => cmd::preflight::run(json),
        Command::Status { json } => cmd::status::run(json),
        Command::Healthcheck => cmd::status::healthcheck(),
        Command::Metrics { catalogue } => cmd::status::metrics(catalogue),
        Command::Head { json } => cmd::head::run(json),
        Command::RayTool { tool, args } => Ok(cmd::raytool::run(tool, args)),
        Command::Podman { .. } => unreachable!("dispatched above"),
    }
}
