//! `argus-agent preflight [--json]`: the GPU preflight alone. Prints the
//! verdict (JSON with `--json`, else text), writes it to
//! `ARGUS_LOG_DIR/preflight/<node>.json`, and exits 0, 69, 75 or 78 by its
//! class (SPEC §11); a signal (SIGTERM, SIGINT, SIGHUP…) kills the running
//! check and exits 128+signal. Works without ARGUS_ROLE: only the variables the preflight
//! uses are read, so a bad value of an unrelated one does not stop it.
//!
//! With `ARGUS_PREFLIGHT_PROBE=libraries` it is instead the library probe
//! that the preflight runs in a child process (internal).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use argus_config::{read_state_dir, Logging, PreflightConfig, Reader};
use argus_node::preflight::{self, libs, PreflightOptions};
use argus_supervise::{reaper, Stop};

use super::Outcome;

/// Runs the GPU preflight and prints the verdict; returns its exit code.
pub fn run(json: bool) -> Outcome {
    if std::env::var(preflight::PROBE_ENV).as_deref() == Ok("libraries") {
        return probe();
    }
    let flags = BTreeMap::new();
    let mut r = Reader::new(&flags);
    let shared_root = r.path("ARGUS_SHARED_ROOT", PathBuf::new)?;
    if let Some(v) = r.text("ARGUS_AGENT_USER")? {
        let id = argus_config::parse_agent_user(&v)
            .map_err(|why| argus_config::ConfigError::new("ARGUS_AGENT_USER", &v, why))?;
        argus_discovery::trust::set_agent(id);
    }
    let log = Logging::read(&mut r, &shared_root)?;
    let settings = PreflightConfig::read(&mut r)?;
    let state_dir = read_state_dir(&mut r)?;
    init_logging(if log.level_given { &log.level } else { "warn" });
    // R-SEC-2: the report folder (ARGUS_LOG_DIR/preflight) is reached
    // through trusted components only; a breach is exit 78, nothing written.
    match argus_discovery::trust::open_dir(&log.dir.join("preflight"), true) {
        Err(e) if e.is_breach() => {
            return Err(super::Error::Untrusted(format!("ARGUS_LOG_DIR: {e}")))
        }
        _ => {}
    }
    let opts = PreflightOptions::new(&settings, &log.dir, &state_dir);

    let stop = Stop::new();
    let signal = Arc::new(AtomicI32::new(0));
    let (on_signal, seen) = (stop.clone(), signal.clone());
    // Any handled signal ends the preflight: the running check's group is
    // killed before the process exits 128+signal.
    reaper::route_signals(move |sig| {
        let _ = seen.compare_exchange(0, sig as i32, Ordering::SeqCst, Ordering::SeqCst);
        on_signal.request();
        true
    });
    let Ok(verdict) = preflight::evaluate(&opts, &stop) else {
        return Ok(128 + signal.load(Ordering::SeqCst) as u8);
    };
    if let Err(e) = preflight::write_verdict(&opts.log_dir, &verdict) {
        tracing::warn!(dir = %opts.log_dir.display(), error = %e, "failed to write preflight verdict");
    }
    preflight::log_summary(&verdict);
    if json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        print!("{}", verdict.to_text());
    }
    Ok(verdict.exit_code)
}

/// The child side of the library probe: load the libraries, print the
/// report, exit 0 (the report carries the findings).
fn probe() -> Outcome {
    let report = libs::probe();
    println!("{}", serde_json::to_string(&report)?);
    Ok(0)
}

/// Logs to stderr at `level`, so that stdout and stderr stay readable.
fn init_logging(level: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(level))
        .with_writer(std::io::stderr)
        .try_init();
}
