//! `argus-agent status [--json]` and `argus-agent healthcheck` (R-OPS-1).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use argus::config::{read_state_dir, ConfigError, Reader};
use argus::status;

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
    println!("updated at:    {}", st.updated_at);
    Ok(0)
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
