//! `argus-agent preflight [--json]`: the GPU preflight alone. Prints the
//! verdict (JSON with `--json`, else text), writes it to
//! `ARGUS_LOG_DIR/preflight/<node>.json`, and exits 0, 69, 75 or 78 by its
//! class (SPEC §11). Works without ARGUS_ROLE.
//!
//! With `ARGUS_PREFLIGHT_PROBE=libraries` it is instead the library probe
//! that the preflight runs in a child process (internal).

use argus::preflight::{self, libs, PreflightOptions};

/// Runs the GPU preflight and prints the verdict; returns the exit code.
pub fn run(json: bool) -> u8 {
    if std::env::var(preflight::PROBE_ENV).as_deref() == Ok("libraries") {
        return probe();
    }
    init_logging();
    let opts = match PreflightOptions::from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("argus-agent: {e}");
            return 78;
        }
    };
    let verdict = preflight::evaluate(&opts);
    if let Err(e) = preflight::write_verdict(&opts.log_dir, &verdict) {
        tracing::warn!(dir = %opts.log_dir.display(), error = %e, "failed to write preflight verdict");
    }
    preflight::log_summary(&verdict);
    if json {
        match serde_json::to_string_pretty(&verdict) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("argus-agent: failed to serialise the verdict: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", verdict.to_text());
    }
    verdict.exit_code
}

/// The child side of the library probe: load the libraries, print the
/// report, exit 0 (the report carries the findings).
fn probe() -> u8 {
    let report = libs::probe();
    match serde_json::to_string(&report) {
        Ok(s) => {
            println!("{s}");
            0
        }
        Err(e) => {
            eprintln!("argus-agent: failed to serialise the library report: {e}");
            1
        }
    }
}

/// Logs to stderr at ARGUS_LOG_LEVEL (default warn, so that stdout and
/// stderr stay readable); does nothing if logging is already set up.
fn init_logging() {
    let level = std::env::var("ARGUS_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
