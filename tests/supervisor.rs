//! Black-box tests of the PID-1 duties (R-PID-1..4, R-CFG-1) with the fake
//! `ray` (tests/fixtures/fake-ray).

mod support;

use std::time::Duration;

use support::{alive, children_of, run_bin, Agent, Sandbox};

#[test]
fn bad_env_exits_78_with_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    let cases: &[(&str, &str)] = &[
        ("ARGUS_ROLE", "boss"),
        ("ARGUS_TTL_S", "abc"),
        ("ARGUS_REFRESH_S", "90"),
        ("ARGUS_RAY_PORT", "99999"),
        ("ARGUS_WORKER_RESOURCES_KV", "gpu_slots"),
        ("ARGUS_NODE_IP", "300.1.1.1"),
        ("ARGUS_RAY_EXTRA_ARGS", "--labels='a"),
        ("ARGUS_PREFLIGHT", "sometimes"),
    ];
    for (var, value) in cases {
        let mut env = sb.env("bad", "worker");
        env.insert(var.to_string(), value.to_string());
        let out = run_bin(&["run"], &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{var}={value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
        assert!(stderr.contains(var), "message must name {var}: {stderr}");
    }
    let mut env = sb.env("bad", "worker");
    env.remove("ARGUS_ROLE");
    let out = run_bin(&["run"], &env);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ARGUS_ROLE"));
    assert!(
        Sandbox::files_under(&sb.shared()).is_empty(),
        "shared storage was written"
    );
    assert!(sb.ray_starts("bad").is_empty(), "ray was started");
    assert!(
        !sb.path().join("logs-bad").exists(),
        "log folder created on shared storage"
    );
}

#[test]
fn ray_runs_in_its_own_group_with_an_empty_signal_mask() {
    let sb = Sandbox::new();
    let env = sb.env("w", "head");
    let sb_port = env["ARGUS_RAY_PORT"].clone();
    let mut a = Agent::start(&sb, "w", &env);
    a.wait_for("ray start", Duration::from_secs(30), |_| {
        !sb.ray_starts("w").is_empty()
    });
    let start = &sb.ray_starts("w")[0];
    assert_eq!(
        start["pgid"], start["pid"],
        "ray must lead its own process group"
    );
    assert_eq!(
        start["sigmask"], "0000000000000000",
        "ray inherited a blocked signal mask"
    );
    let argv: Vec<String> = serde_json::from_value(start["argv"].clone()).unwrap();
    let port = format!("--port={}", sb_port);
    for want in [
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        port.as_str(),
        "--dashboard-host=0.0.0.0",
    ] {
        assert!(
            argv.iter().any(|a| a == want),
            "{want} missing from {argv:?}"
        );
    }
}

#[test]
fn orphans_are_reaped_as_subreaper() {
    let sb = Sandbox::new();
    let mut env = sb.env("o", "head");
    env.insert("FAKE_RAY_ORPHANS".into(), "5".into());
    let mut a = Agent::start(&sb, "o", &env);
    // The five orphans exit 0.3 s after being re-parented: wait until the
    // agent logged reaping each of them.
    a.wait_for("five orphans reaped", Duration::from_secs(60), |a| {
        a.log().matches("reaped orphan").count() >= 5
    });
    let zombies: Vec<_> = children_of(a.pid())
        .into_iter()
        .filter(|(pid, _)| !alive(*pid as i64))
        .collect();
    assert!(
        zombies.is_empty(),
        "zombies left under the agent: {zombies:?}"
    );
}

#[test]
fn orphans_are_reaped_as_pid_1() {
    let sb = Sandbox::new();
    let mut env = sb.env("p1", "head");
    env.insert("FAKE_RAY_ORPHANS".into(), "5".into());
    let mut a = Agent::start_with(
        &sb,
        "p1",
        &env,
        &["unshare", "--pid", "--fork", "--mount-proc"],
    );
    // The five orphans exit 0.3 s after being re-parented: wait until the
    // agent logged reaping each of them.
    a.wait_for("five orphans reaped", Duration::from_secs(60), |a| {
        a.log().matches("reaped orphan").count() >= 5
    });
    // Inside the namespace the agent is PID 1; its status says so.
    a.wait_for("status", Duration::from_secs(30), |a| a.status().is_some());
    assert_eq!(a.status().unwrap()["agent_pid"], 1, "agent is not PID 1");
    // Count zombies anywhere in the machine whose parent is the namespace's
    // init, seen from outside: the unshare child is the agent.
    let agent_host_pid = children_of(a.pid())
        .into_iter()
        .find(|(_, name)| name.contains("argus-agent"))
        .map(|(p, _)| p)
        .unwrap_or_else(|| panic!("agent under unshare: {:?}", children_of(a.pid())));
    let zombies: Vec<_> = children_of(agent_host_pid)
        .into_iter()
        .filter(|(pid, _)| !alive(*pid as i64))
        .collect();
    assert!(zombies.is_empty(), "zombies left under PID 1: {zombies:?}");
    assert!(a.log().contains("reaped orphan"), "{}", a.log());
    unsafe { libc::kill(agent_host_pid, libc::SIGTERM) };
    let (st, _) = a.wait_exit(Duration::from_secs(10)).expect("exit");
    assert_eq!(st.code(), Some(0), "{}", a.log());
}

#[test]
fn signals_are_forwarded_to_ray() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "s", &sb.env("s", "head"));
    // Signals sent before the fake ray installs its handlers would kill it.
    a.wait_for("ray ready", Duration::from_secs(60), |_| sb.ray_ready("s"));
    let kids = child_pids(&sb, "s");
    for sig in [libc::SIGUSR1, libc::SIGHUP, libc::SIGUSR2] {
        a.signal(sig);
    }
    a.wait_for("forwarded signals", Duration::from_secs(30), |_| {
        let got: Vec<String> = sb
            .ray_events("s")
            .iter()
            .filter(|e| e["event"] == "signal")
            .map(|e| e["sig"].as_str().unwrap().to_string())
            .collect();
        ["SIGUSR1", "SIGHUP", "SIGUSR2"]
            .iter()
            .all(|s| got.iter().any(|g| g == s))
    });
    // Ray and its daemons are all still there (nothing for the agent to
    // restart), and the agent still reports the same single run.
    for k in &kids {
        assert!(alive(*k), "ray's daemon {k} died of a forwarded signal");
    }
    assert_eq!(
        sb.ray_starts("s").len(),
        1,
        "forwarding must not restart ray: {}",
        a.log()
    );
    assert_eq!(a.status().unwrap()["restarts"], 0, "{}", a.log());
}

/// The pids of the raylet (and gcs_server) the fake ray of `name` started.
fn child_pids(sb: &Sandbox, name: &str) -> Vec<i64> {
    sb.ray_events(name)
        .iter()
        .find(|e| e["event"] == "children")
        .expect("fake ray logged no children")["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap())
        .collect()
}

#[test]
fn sigterm_stops_ray_gracefully_and_exits_0() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "g", &sb.env("g", "head"));
    a.wait_for("running and ray ready", Duration::from_secs(30), |a| {
        a.state() == "running" && sb.ray_ready("g")
    });
    let ray_pid = sb.ray_starts("g")[0]["pid"].as_i64().unwrap();
    a.signal(libc::SIGTERM);
    let (st, took) = a
        .wait_exit(Duration::from_secs(10))
        .expect("agent did not exit");
    assert_eq!(st.code(), Some(0), "{}", a.log());
    // How fast is a benchmark's question (scripts/bench-node.py); here:
    // Ray got SIGTERM and stopped on it, within the 10 s of `docker stop`.
    eprintln!("graceful stop took {took:?}");
    assert!(
        sb.ray_events("g").iter().any(|e| e["event"] == "term"),
        "ray never got SIGTERM"
    );
    assert!(
        !a.log().contains("did not stop within its grace"),
        "a ray that stops on SIGTERM was killed:\n{}",
        a.log()
    );
    assert!(!alive(ray_pid));
}

#[test]
fn sigterm_escalates_to_sigkill_when_ray_ignores_term() {
    let sb = Sandbox::new();
    let mut env = sb.env("k", "head");
    env.insert("FAKE_RAY_IGNORE_TERM".into(), "1".into());
    env.insert("ARGUS_STOP_GRACE_S".into(), "2".into());
    let mut a = Agent::start(&sb, "k", &env);
    // Ray ignores SIGTERM only once its handlers are in: a SIGTERM before
    // that kills it at once (CI hit this: "exit took 40ms").
    a.wait_for("running and ray ready", Duration::from_secs(30), |a| {
        a.state() == "running" && sb.ray_ready("k")
    });
    let ray_pid = sb.ray_starts("k")[0]["pid"].as_i64().unwrap();
    let kids: Vec<i64> = sb
        .ray_events("k")
        .iter()
        .find(|e| e["event"] == "children")
        .unwrap()["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap())
        .collect();
    a.signal(libc::SIGTERM);
    let (st, took) = a
        .wait_exit(Duration::from_secs(10))
        .expect("agent did not exit");
    assert_eq!(st.code(), Some(0), "{}", a.log());
    // The grace was honoured (a lower bound holds under any load), then
    // the group was killed; the whole stop within `docker stop`'s 10 s
    // (wait_exit above).
    eprintln!("exit took {took:?} with a 2 s grace");
    assert!(
        took >= Duration::from_secs(2),
        "exit took {took:?}: grace not honoured"
    );
    assert!(
        a.log()
            .contains("did not stop within its grace; killing its process group"),
        "no escalation to SIGKILL in the log:\n{}",
        a.log()
    );
    for pid in std::iter::once(ray_pid).chain(kids) {
        assert!(!alive(pid), "pid {pid} left behind");
    }
}

/// A second stop signal during the stop cuts Ray's grace short: the
/// operator insists (a second `docker stop`, Ctrl-C twice). The first
/// signal's own event, which may reach the loop after its stop began,
/// is not one (the test above).
#[test]
fn a_second_sigterm_during_the_stop_kills_ray_at_once() {
    let sb = Sandbox::new();
    let mut env = sb.env("k2", "head");
    env.insert("FAKE_RAY_IGNORE_TERM".into(), "1".into());
    env.insert("ARGUS_STOP_GRACE_S".into(), "8".into());
    let mut a = Agent::start(&sb, "k2", &env);
    a.wait_for("running and ray ready", Duration::from_secs(30), |a| {
        a.state() == "running" && sb.ray_ready("k2")
    });
    let ray_pid = sb.ray_starts("k2")[0]["pid"].as_i64().unwrap();
    a.signal(libc::SIGTERM);
    a.wait_for("stopping", Duration::from_secs(10), |a| {
        a.state() == "stopping"
    });
    let t = std::time::Instant::now();
    a.signal(libc::SIGTERM);
    let (st, _) = a
        .wait_exit(Duration::from_secs(15))
        .expect("agent did not exit");
    let took = t.elapsed();
    assert_eq!(st.code(), Some(0), "{}", a.log());
    assert!(!alive(ray_pid), "ray left behind");
    // Killed, not waited for: the grace (8 s) was cut short.
    assert!(
        took < Duration::from_secs(7),
        "exit took {took:?} after the second SIGTERM: the 8 s grace was not cut short\n{}",
        a.log()
    );
}

#[test]
fn crash_loop_backs_off_exponentially_and_shows_in_status() {
    let sb = Sandbox::new();
    let mut env = sb.env("c", "head");
    env.insert("FAKE_RAY_EXIT_AFTER".into(), "0.05".into());
    env.insert("ARGUS_RESTART_BACKOFF_MIN_S".into(), "0.2".into());
    env.insert("ARGUS_RESTART_BACKOFF_MAX_S".into(), "1.6".into());
    let mut a = Agent::start(&sb, "c", &env);
    a.wait_for("6 starts", Duration::from_secs(60), |_| {
        sb.ray_starts("c").len() >= 6
    });
    let st = a.status().unwrap();
    assert_eq!(st["crash_loop"], true, "{st}");
    assert!(st["restarts"].as_u64().unwrap() >= 5, "{st}");
    assert!(a.log().contains("crash-looping"), "{}", a.log());
    // The delays the agent chose: in [base/2, base] for base 0.2, 0.4,
    // 0.8, 1.6, then capped at 1.6.
    let delays: Vec<f64> = a
        .log()
        .lines()
        .filter(|l| l.contains("delay_s="))
        .filter_map(|l| {
            l.split("delay_s=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(delays.len() >= 5, "{delays:?}");
    for (i, d) in delays.iter().enumerate() {
        let base = (0.2 * 2f64.powi(i as i32)).min(1.6);
        assert!(
            *d >= base / 2.0 - 1e-6 && *d <= base + 1e-6,
            "delay {i} = {d}, base {base}: {delays:?}"
        );
    }
}

#[test]
fn a_raylet_that_exits_gracefully_is_the_nodes_death() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "r", &sb.env("r", "head"));
    a.wait_for("running", Duration::from_secs(30), |a| {
        a.state() == "running"
    });
    let kids = sb
        .ray_events("r")
        .iter()
        .find(|e| e["event"] == "children")
        .unwrap()["pids"]
        .clone();
    let raylet = kids[0].as_i64().unwrap();
    // The raylet exits on SIGTERM while `ray start --block` keeps blocking.
    unsafe { libc::kill(raylet as i32, libc::SIGTERM) };
    a.wait_for("ray restarted", Duration::from_secs(30), |_| {
        sb.ray_starts("r").len() >= 2
    });
    assert!(a.log().contains("ray daemon died"), "{}", a.log());
}

/// Returns how many of `pid`'s open files are under /proc.
fn proc_files_open(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.starts_with("/proc/"))
                .count()
        })
        .unwrap_or(0)
}

/// Regression: sysinfo kept one /proc/<pid>/stat open for every process on
/// the machine after a scan of Ray's tree (331 of PID 1's 342 files in a
/// soak node), for the agent's whole life, though it scans only until the
/// daemons are watched by pidfd.
#[test]
fn scanning_rays_process_tree_leaves_no_proc_files_open() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "p", &sb.env("p", "head"));
    a.wait_for("daemons watched by pidfd", Duration::from_secs(30), |a| {
        a.log()
            .contains("waiting for the ray daemons' exit by pidfd")
    });
    let open = proc_files_open(a.pid());
    assert!(
        open <= 2,
        "{open} files under /proc open after the scans (host has {} processes)",
        std::fs::read_dir("/proc")
            .unwrap()
            .filter(|e| e.as_ref().is_ok_and(|e| e
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())))
            .count()
    );
    a.signal(libc::SIGTERM);
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)).unwrap().0.code(),
        Some(0)
    );
}

#[test]
fn a_missing_ray_binary_exits_78_naming_it_instead_of_a_crash_loop() {
    let sb = Sandbox::new();
    let mut env = sb.env("m", "head");
    env.insert("ARGUS_RAY_BIN".into(), "/nonexistent/ray".into());
    let out = run_bin(&["run"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(
        stderr.contains("ARGUS_RAY_BIN") && stderr.contains("/nonexistent/ray"),
        "{stderr}"
    );
    assert!(Sandbox::files_under(&sb.shared()).is_empty());
}

#[test]
fn json_logs_go_to_stderr_and_the_log_folder_and_status_shows_the_node() {
    let sb = Sandbox::new();
    let mut env = sb.env("j", "head");
    env.insert("ARGUS_LOG_FORMAT".into(), "json".into());
    let mut a = Agent::start(&sb, "j", &env);
    a.wait_for("running", Duration::from_secs(30), |a| {
        a.state() == "running"
    });
    let log = a.log();
    let first = log.lines().next().expect("a log line");
    let v: serde_json::Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert!(v["fields"]["message"].is_string(), "{v}");
    // One file, rotated daily (`argus-agent-<host>-head.log.<date>`), written
    // by its own thread: wait for the line to land.
    let log_files = || -> Vec<_> {
        Sandbox::files_under(&sb.path().join("logs-j"))
            .into_iter()
            .filter(|f| f.to_string_lossy().contains("-head.log"))
            .collect()
    };
    a.wait_for("the log file", Duration::from_secs(30), |_| {
        log_files()
            .iter()
            .any(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains("node agent started")))
    });
    assert_eq!(log_files().len(), 1, "{:?}", log_files());
    let mut q = std::collections::BTreeMap::new();
    q.insert(
        "ARGUS_STATE_DIR".to_string(),
        env["ARGUS_STATE_DIR"].clone(),
    );
    let out = run_bin(&["status", "--json"], &q);
    assert!(out.status.success());
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["role"], "head");
    assert_eq!(st["node_ip_source"], "ARGUS_NODE_IP");
    assert!(st["ray_pid"].as_u64().is_some());
    let text = run_bin(&["status"], &q);
    assert!(String::from_utf8_lossy(&text.stdout).contains("state:         running"));
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(10)).unwrap();
    assert_eq!(
        run_bin(&["healthcheck"], &q).status.code(),
        Some(1),
        "stopped node reported healthy"
    );
}
