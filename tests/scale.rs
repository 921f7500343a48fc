//! Scale (issue 10): file events degrade to polling at the host's inotify
//! limits, and a small run of scripts/bench-scale.py holds its invariants
//! (every worker rejoins a new head exactly once, no agent dies).
//!
//! Needs root: the limits are lowered inside a user namespace of the test
//! (`/proc/sys/user/max_inotify_*`, which counts against the host's limits
//! but lowers nobody else's), and the benchmark runs each agent in its own
//! PID namespace.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{repo, Agent, Sandbox, BIN};

/// The fake ray's `--address=` of each start of agent `name`.
fn joined(sb: &Sandbox, name: &str) -> Vec<String> {
    sb.ray_starts(name)
        .iter()
        .filter_map(|e| {
            let argv = e["argv"].as_array()?;
            argv.iter()
                .find_map(|a| a.as_str()?.strip_prefix("--address=").map(String::from))
        })
        .collect()
}

fn head_env(sb: &Sandbox, name: &str, ip: &str) -> BTreeMap<String, String> {
    let mut env = sb.env(name, "head");
    env.insert("ARGUS_NODE_IP".into(), ip.into());
    env
}

fn head_ip(sb: &Sandbox) -> Option<String> {
    let rec = sb.record()?;
    (rec["state"] == "running").then(|| rec["head_ip"].as_str().map(String::from))?
}

/// Runs a worker whose user namespace allows no inotify instances (or no
/// watches), follows a head change, and checks that it said so once.
fn degrades_when(limit: &str, reason: &str) {
    let sb = Sandbox::new();
    let mut head = Agent::start(&sb, "head-a", &head_env(&sb, "head-a", "127.9.200.1"));
    head.wait_for("the first head's record", Duration::from_secs(60), |_| {
        head_ip(&sb).as_deref() == Some("127.9.200.1")
    });
    let mut env = sb.env("w", "worker");
    env.insert("ARGUS_NODE_IP".into(), "127.9.200.2".into());
    let script = format!("echo 0 > /proc/sys/user/{limit} && exec \"$@\"");
    let prefix = [
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        &script,
        "sh",
    ];
    let mut w = Agent::start_with(&sb, "w", &env, &prefix);
    w.wait_for(
        "the worker to join by polling",
        Duration::from_secs(60),
        |_| {
            joined(&sb, "w")
                .iter()
                .any(|a| a.starts_with("127.9.200.1:"))
        },
    );
    let status = w.status().expect("worker status");
    let events = status["file_events"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        events.starts_with("degraded to polling") && events.contains(reason),
        "status file_events: {events:?}"
    );

    // A head change is still followed, by polling alone.
    head.signal(libc::SIGTERM);
    assert!(
        head.wait_exit(Duration::from_secs(30)).is_some(),
        "head A did not stop"
    );
    let mut head_b = Agent::start(&sb, "head-b", &head_env(&sb, "head-b", "127.9.200.3"));
    head_b.wait_for("the new head's record", Duration::from_secs(60), |_| {
        head_ip(&sb).as_deref() == Some("127.9.200.3")
    });
    w.wait_for(
        "the worker to rejoin by polling",
        Duration::from_secs(60),
        |_| {
            joined(&sb, "w")
                .iter()
                .any(|a| a.starts_with("127.9.200.3:"))
        },
    );
    let said = w.log().matches("no file events; polling alone").count();
    assert_eq!(said, 1, "logged once, not per poll:\n{}", w.log());
    let out = support::run_bin(&["status"], &env);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("file events:   degraded to polling"),
        "`status` shows it:\n{text}"
    );
}

#[test]
fn file_events_degrade_to_polling_without_inotify_instances() {
    degrades_when("max_inotify_instances", "inotify_init failed");
}

#[test]
fn file_events_degrade_to_polling_without_inotify_watches() {
    degrades_when("max_inotify_watches", "cannot watch");
}

/// The benchmark's small version: N = 50, file events on and off.
#[test]
fn fifty_workers_rejoin_a_new_head_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = std::process::Command::new(repo().join("scripts/bench-scale.py"))
        .args(["--n", "50", "--poll", "2", "--steady", "4", "--check"])
        .arg("--bin")
        .arg(BIN)
        .arg("--json")
        .arg(&json)
        .arg("--tmp")
        .arg(dir.path())
        .output()
        .expect("run scripts/bench-scale.py");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "bench-scale --check failed:\n{text}");
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let results = raw["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{text}");
    for r in results {
        assert_eq!(r["rejoin"]["exactly_once"], 50, "{text}");
        assert_eq!(r["dead_agents"].as_array().map(Vec::len), Some(0), "{text}");
    }
}
