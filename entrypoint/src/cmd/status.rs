//! `argus-agent status [--json]` and `argus-agent healthcheck` (R-OPS-1).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use argus_config::{read_state_dir, ConfigError, Reader};
use argus_telemetry::status;

use super::Outcome;

fn state_dir() -> Result<PathBuf, ConfigError> {
    read_state_dir(&mut Reader::new(&BTreeMap::new()))
}

/// Prints this node's status; exit 1 when there is none.
pub fn run(json: bool) -> Outcome {
    let st = status::read(&state_dir()?)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(0);
    }
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!("role:          {}", st.role);
    println!(
        "state:         {} ({}) since {}",
        st.state, st.reason, st.state_since
    );
    println!("node ip:       {} ({})", st.node_ip, st.node_ip_source);
    println!(
        "head:          {} instance {} generation {}",
        opt(st.head_address.clone()),
        opt(st.head_instance_id.clone()),
        opt(st.head_generation.map(|g| g.to_string()))
    );
    println!(
        "head age:      {}",
        opt(st
            .head_record_age_s
            .map(|a| format!("{a:.1}s since the record last changed")))
    );
    if let Some(t) = &st.takeover {
        println!("takeover:      {t}");
    }
    if let Some(g) = &st.head_gcs {
        println!("head gcs:      {g}");
    }
    if st.gcs_ft {
        println!("gcs ft:        on (external Redis; workers ride head restarts through)");
    }
    if st.role == "worker" && !st.file_events.is_empty() {
        println!("file events:   {}", st.file_events);
    }
    println!("ray pid:       {}", opt(st.ray_pid.map(|p| p.to_string())));
    println!(
        "restarts:      {} (consecutive failures {}{})",
        st.restarts,
        st.consecutive_failures,
        if st.crash_loop { ", CRASH LOOP" } else { "" }
    );
    println!("last exit:     {}", opt(st.last_exit.clone()));
    if let Some(s) = st.next_restart_in_s {
        println!("next restart:  in {s:.1}s");
    }
    if let Some(e) = &st.engine_containers {
        println!("engine containers: {e}");
    }
    println!("updated at:    {}", st.updated_at);
    Ok(0)
}

/// Prints this node's metrics: from the agent's port when ARGUS_METRICS_PORT
/// is set (as in the container's environment), else from the snapshot the
/// agent writes with its status (at most [`status::HEARTBEAT_LATEST`] old).
/// Exit 1 when neither answers.
pub fn metrics(catalogue: bool) -> Outcome {
    if catalogue {
        for d in argus_telemetry::metrics::catalogue() {
            println!("{} {} {}", d.name, d.kind, d.help);
        }
        return Ok(0);
    }
    let port = std::env::var("ARGUS_METRICS_PORT")
        .ok()
        .and_then(|p| p.trim().parse::<u16>().ok());
    if let Some(port) = port {
        match live_metrics(port) {
            Ok(text) => {
                print!("{text}");
                return Ok(0);
            }
            Err(e) => eprintln!(
                "argus-agent metrics: 127.0.0.1:{port} (ARGUS_METRICS_PORT) did not answer ({e}); showing the last snapshot"
            ),
        }
    }
    let path = argus_telemetry::metrics::snapshot_path(&state_dir()?);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            print!("{text}");
            Ok(0)
        }
        Err(e) => {
            eprintln!(
                "argus-agent metrics: {}: cannot read ({e}); is the agent running with this ARGUS_STATE_DIR?",
                path.display()
            );
            Ok(1)
        }
    }
}

/// Fetches `/metrics` from the agent on this host (HTTP/1.0: the server
/// closes the connection after the answer).
fn live_metrics(port: u16) -> std::io::Result<String> {
    use std::io::{Error, Read, Write};
    let timeout = Some(std::time::Duration::from_secs(5));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(timeout)?;
    s.set_write_timeout(timeout)?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::other("no HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(Error::other(format!("answered {status:?}")));
    }
    Ok(body.to_string())
}

/// Exits 0 if and only if the node is healthy (1 when not, 78 when
/// ARGUS_STATE_DIR is bad).
pub fn healthcheck() -> Outcome {
    let dir = state_dir()?;
    match status::read(&dir)
        .map_err(|e| e.to_string())
        .and_then(|s| status::health(&s, SystemTime::now()))
    {
        Ok(()) => {
            println!("healthy");
            Ok(0)
        }
        Err(why) => {
            println!("unhealthy: {why}");
            Ok(1)
        }
    }
}
