//! The shim's metrics through the real broker, against this machine's
//! Docker daemon: an agent serving ARGUS_METRICS_PORT, podman calls
//! brokered by it (a success, a run, a refused run, an unknown command, a
//! run whose client is SIGKILLed, a run whose janitor sweep finds a dead
//! shim's container), then `argus-agent metrics` (live from the port) must
//! show each counter moved by exactly what the calls did.

mod shim_support;
mod support;

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shim_support::{containers_with, docker, force_remove, image, show, unique, BIN};
use support::{free_port, Agent, Sandbox};

/// `argus-agent podman ARGS…` as a client of the agent whose state folder
/// is `state`.
fn podman(state: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("podman")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ARGUS_STATE_DIR", state)
        .stdin(Stdio::null());
    c
}

fn run(c: &mut Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"))
}

/// The agent's metrics, live from its port (a fallback to the snapshot
/// would print a line on stderr: refused here).
fn metrics(env: &BTreeMap<String, String>) -> String {
    let o = support::run_bin(&["metrics"], env);
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "argus-agent metrics: {}",
        show(&o)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Returns the value of the sample `series` (`name{labels}`), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| {
            v.split_whitespace().next().unwrap().parse().unwrap()
        })
}

/// The series this test moves, with how much each must move.
const EXPECTED: &[(&str, f64)] = &[
    ("argus_shim_calls_total{command=\"version\"}", 1.0),
    ("argus_shim_calls_total{command=\"run\"}", 4.0),
    ("argus_shim_calls_total{command=\"other\"}", 1.0),
    (
        "argus_shim_call_duration_seconds_count{command=\"run\"}",
        4.0,
    ),
    ("argus_shim_refusals_total{rule=\"no_privileged\"}", 1.0),
    ("argus_shim_refusals_total{rule=\"unknown_command\"}", 1.0),
    ("argus_shim_containers_created_total", 3.0),
];
const REMOVED: &str = "argus_shim_janitor_removed_total";

/// Counts the shim containers of other owners that any sweep of this
/// node's would remove right now (their Ray container is gone): on a
/// shared daemon, other tests may have left some.
fn orphans_of_others(mine: &str) -> usize {
    let o = docker(&[
        "ps",
        "-a",
        "--filter",
        "label=io.argus.shim.owner",
        "--format",
        "{{.Label \"io.argus.shim.owner\"}}",
    ]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|owner| *owner != mine && *owner != "host" && !owner.starts_with("host-"))
        .filter(|owner| !docker(&["inspect", owner]).status.success())
        .count()
}

#[test]
fn brokered_calls_move_the_shim_metrics_by_exactly_what_they_did() {
    let img = image();
    let sb = Sandbox::new();
    let mut env = sb.env("head", "head");
    env.insert("ARGUS_METRICS_PORT".into(), free_port().to_string());
    let mut agent = Agent::start(&sb, "head", &env);
    let state = agent.state_dir.clone();
    let sock = state.join("shim.sock");
    agent.wait_for("the broker's socket", Duration::from_secs(60), |_| {
        sock.exists()
    });
    agent.wait_for("the metrics port", Duration::from_secs(30), |_| {
        support::run_bin(&["metrics"], &env).stderr.is_empty()
    });
    let before = metrics(&env);

    // A call that succeeds.
    let o = run(&mut podman(&state, &["version"]));
    assert!(o.status.success(), "{}", show(&o));
    // A run: one container created (and removed by --rm).
    let o = run(&mut podman(&state, &["run", "--rm", img, "true"]));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));

    // A dead shim's container of this node, for the next run's sweep.
    let owner = std::fs::read_to_string(state.join("shim-owner")).unwrap();
    let owner = owner.trim();
    let others = orphans_of_others(owner);
    let dead = unique("metrics-dead");
    let o = docker(&[
        "create",
        "--label",
        &format!("io.argus.shim.owner={owner}"),
        "--label",
        "io.argus.shim.pid=999999999",
        "--label",
        &dead,
        img,
        "true",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    let dead_id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    // Recorded as this node's shim would have (its broker records what a
    // handler created): a sweep removes only recorded containers (issue
    // 26, hole 7).
    argus_podman::janitor::record_in(&state, &dead_id).unwrap();

    // Refused by the policy: no container.
    let o = run(&mut podman(
        &state,
        &["run", "--rm", "--privileged", img, "true"],
    ));
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no-privileged"),
        "{}",
        show(&o)
    );
    // Refused by the parser, counted as `other` (no such command).
    let o = run(&mut podman(&state, &["frobnicate", "now"]));
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    // A run whose sweep removes the dead shim's container (unless the
    // agent's own janitor or the refused run's got there first: either
    // way it is removed once, and counted once).
    let o = run(&mut podman(&state, &["run", "--rm", img, "true"]));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));

    // A run whose client is SIGKILLed once its container exists (as the
    // raylet kills workers): the handler reports before killing itself.
    let killed = unique("metrics-killed");
    let mut child = podman(
        &state,
        &["run", "--label", &killed, img, "/bin/tool", "sleep", "60"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // Killed once its handler has the daemon's answer to the create (the
    // broker recorded the ID): a kill while the create is still in flight
    // leaves the container to the watchdog and the count at 0, which a
    // loaded machine hit when this waited only for the container.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let ids = containers_with(&killed);
        let recorded = argus_podman::janitor::recorded(&state);
        if ids.iter().any(|id| recorded.contains(id)) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the killed run's container {ids:?} was not recorded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // Every call is counted once its handler exits; the dead shim's
    // container is removed by a sweep within 30 s (the agent's janitor).
    let until = Instant::now() + Duration::from_secs(45);
    let moved = |after: &str, series: &str| sample(after, series) - sample(&before, series);
    let after = loop {
        let after = metrics(&env);
        let done =
            EXPECTED.iter().all(|(s, n)| moved(&after, s) >= *n) && moved(&after, REMOVED) >= 1.0;
        if done || Instant::now() > until {
            break after;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "{}",
        after
            .lines()
            .filter(|l| l.starts_with("argus_shim_") && !l.contains("_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let left = containers_with(&dead);
    force_remove(&left);
    force_remove(&containers_with(&killed));
    for (series, n) in EXPECTED {
        assert_eq!(
            moved(&after, series),
            *n,
            "{series}\n--- before\n{before}\n--- after\n{after}\n--- agent log\n{}",
            agent.log()
        );
    }
    assert!(left.is_empty(), "the dead shim's {dead_id} was not swept");
    let removed = moved(&after, REMOVED);
    assert!(
        removed >= 1.0 && removed <= 1.0 + others as f64,
        "{REMOVED} moved by {removed}, expected 1 (+ at most {others} orphans of other tests)\n{after}"
    );
    // Nothing else was refused, and no label outside the fixed sets.
    let refusals: f64 = after
        .lines()
        .filter(|l| l.starts_with("argus_shim_refusals_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(refusals, 2.0, "{after}");
    for l in after
        .lines()
        .filter(|l| l.starts_with("argus_shim_calls_total{"))
    {
        let cmd = l.split('"').nth(1).unwrap();
        assert!(
            argus_telemetry::metrics::SHIM_COMMANDS.contains(&cmd) || cmd == "other",
            "{l}"
        );
    }
    agent.signal(libc::SIGTERM);
    agent
        .wait_exit(Duration::from_secs(30))
        .expect("agent exit");
}

/// Podman's global flags mean nothing on Docker. Ray passes
/// `--cgroup-manager=cgroupfs` on every container worker start, and Ray
/// copies a worker's stderr to every driver's console: so the job's stderr
/// gets no word of them. Ray's own flag is accepted silently; any other is
/// one warning line in PID 1's log, naming the flag.
#[test]
fn ignored_podman_flags_reach_pid_1s_log_and_never_the_jobs_stderr() {
    let img = image();
    let sb = Sandbox::new();
    let env = sb.env("head", "head");
    let mut agent = Agent::start(&sb, "head", &env);
    let state = agent.state_dir.clone();
    let sock = state.join("shim.sock");
    agent.wait_for("the broker's socket", Duration::from_secs(60), |_| {
        sock.exists()
    });
    // Ray's worker start, as image_uri.py spells it.
    let o = run(&mut podman(
        &state,
        &["run", "--rm", "--cgroup-manager=cgroupfs", img, "true"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(o.stderr.is_empty(), "Ray's own flag: {}", show(&o));
    // Other global flags, before the subcommand and after it.
    let o = run(&mut podman(
        &state,
        &["--syslog", "run", "--rm", "--runroot", "/x", img, "true"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(o.stderr.is_empty(), "other flags: {}", show(&o));
    agent.wait_for(
        "the warnings in PID 1's log",
        Duration::from_secs(30),
        |a| {
            let log = a.log();
            log.contains("passed --syslog") && log.contains("passed --runroot")
        },
    );
    let log = agent.log();
    assert!(!log.contains("passed --cgroup-manager"), "{log}");
    assert!(
        !log.contains("/x"),
        "a flag's value is the job's text, never logged: {log}"
    );
    agent.signal(libc::SIGTERM);
    agent
        .wait_exit(Duration::from_secs(30))
        .expect("agent exit");
}
