//! `argus-agent status [--json]` and `argus-agent healthcheck` (R-OPS-1).

use std::path::PathBuf;
use std::time::SystemTime;

use argus::status;

fn state_dir() -> PathBuf {
    std::env::var_os("ARGUS_STATE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/argus"))
}

/// Prints this node's status; exit 1 when there is none.
pub fn run(json: bool) -> u8 {
    let st = match status::read(&state_dir()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("argus-agent: {e}");
            return 1;
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&st).expect("status serialises")
        );
        return 0;
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
    0
}

/// Exits 0 if and only if the node is healthy.
pub fn healthcheck() -> u8 {
    match status::read(&state_dir())
        .map_err(|e| e.to_string())
        .and_then(|s| status::health(&s, SystemTime::now()))
    {
        Ok(()) => {
            println!("healthy");
            0
        }
        Err(why) => {
            println!("unhealthy: {why}");
            1
        }
    }
}
