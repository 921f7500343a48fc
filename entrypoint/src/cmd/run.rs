//! `argus-agent` / `argus-agent run`: the node.

use argus::config::Config;
use argus::node::{Event, Node};
use tracing::{info, warn};

use crate::logging;

/// Exit code for bad configuration (sysexits EX_CONFIG).
pub const EX_CONFIG: u8 = 78;

/// Runs the node; returns the exit code of SPEC §11.
pub fn run() -> u8 {
    // R-CFG-1: validate everything before writing or starting anything.
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("argus-agent: configuration error: {e}");
            return EX_CONFIG;
        }
    };
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "node".into());
    let log_name = format!("argus-agent-{host}-{}.log", cfg.role);
    if let Some(w) = logging::init(
        cfg.log_format,
        &cfg.log_level,
        Some((&cfg.log_dir, &log_name)),
    ) {
        warn!("{w}");
    }
    let (ip, source) = match argus::netinfo::detect(cfg.node_ip) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!("{e}");
            return EX_CONFIG;
        }
    };
    info!(node_ip = %ip, strategy = %source, "node ip chosen");
    if let Err(e) = std::fs::create_dir_all(&cfg.state_dir) {
        tracing::error!(dir = %cfg.state_dir.display(), error = %e, "cannot create the state folder (ARGUS_STATE_DIR)");
        return 1;
    }
    // Signals that arrive during preflight or the hook wait in the node's
    // queue; a SIGTERM then stops the node before Ray ever starts.
    let mut node = Node::new(cfg.clone(), ip, source);
    let events = node.events();
    argus::supervise::reaper::route_signals(move |sig| events.send(Event::Signal(sig)).is_ok());
    let outcome = match argus::preflight::gate(&cfg) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("{e}");
            return e.exit_code();
        }
    };
    if let Err(e) = argus::hook::run_prestart(&cfg) {
        tracing::error!("{e}");
        return e.exit_code();
    }
    node.add_ray_env(outcome.env);
    let code = node.run();
    code.clamp(0, 255) as u8
}
