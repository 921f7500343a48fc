//! The node agent removes the engine containers it owns when it stops
//! (R-PID-4, R-SHIM-4), against the real Docker daemon. A running stand-in
//! plays the Ray container (ARGUS_SHIM_SELF_ID), so the sweep cannot touch
//! containers of other tests.

mod shim_support;
mod support;

use std::time::Duration;

use support::{Agent, Sandbox};

#[test]
fn node_stop_removes_the_engine_containers_it_owns() {
    stop_removes_engines(false);
}

/// SPEC §11: with the default grace (8 s) and a Ray that ignores SIGTERM,
/// the whole stop, engine containers included, still ends inside
/// `docker stop`'s 10 s.
#[test]
fn stop_with_a_term_ignoring_ray_and_a_running_engine_fits_in_docker_timeout() {
    stop_removes_engines(true);
}

/// A container standing in for the Ray node (the agent's
/// ARGUS_SHIM_SELF_ID), sleeping `secs`, under a fresh label made from
/// `name`: (label, container id).
fn stand_in_node(name: &str, secs: u32) -> (String, String) {
    shim_support::require_docker();
    let label = shim_support::unique(name);
    let secs = secs.to_string();
    let o = shim_support::docker(&[
        "run",
        "-d",
        "--label",
        &label,
        shim_support::image(),
        "/bin/tool",
        "sleep",
        &secs,
    ]);
    assert!(o.status.success(), "{}", shim_support::show(&o));
    (label, shim_support::stdout(&o).trim().to_string())
}

fn stop_removes_engines(ray_ignores_term: bool) {
    let (label, ray_container) = stand_in_node("node-janitor", 120);

    let sb = Sandbox::new();
    let mut env = sb.env("n", "head");
    env.insert("ARGUS_SHIM_SELF_ID".into(), ray_container.clone());
    if ray_ignores_term {
        env.insert("FAKE_RAY_IGNORE_TERM".into(), "1".into());
        env.insert("ARGUS_STOP_GRACE_S".into(), "8".into());
    }
    let mut a = Agent::start(&sb, "n", &env);
    a.wait_for("running and ray ready", Duration::from_secs(30), |a| {
        a.state() == "running" && sb.ray_ready("n")
    });

    // An engine container started through the shim, detached (no shim
    // process stays to watch it: only the node-stop sweep removes it).
    let engine_label = format!("{label}-engine");
    let run_detached = |label: &str| {
        shim_support::output(
            shim_support::podman(&[
                "run",
                "-d",
                "--label",
                label,
                shim_support::image(),
                "/bin/tool",
                "sleep",
                "120",
            ])
            .env("ARGUS_SHIM_SELF_ID", &ray_container)
            // The node's state folder: the shim records what it created
            // there, and the agent's janitor removes only that.
            .env("ARGUS_STATE_DIR", &env["ARGUS_STATE_DIR"]),
        )
    };
    let o = run_detached(&engine_label);
    assert!(o.status.success(), "{}", shim_support::show(&o));
    assert_eq!(shim_support::containers_with(&engine_label).len(), 1);

    // A call under way at the stop (connected, its request not sent yet:
    // Ray's retry of a task, caught mid-way in CI), which creates its
    // engine after the stop's first removal listed the node's containers.
    let late_label = format!("{label}-late");
    let late = ray_ignores_term.then(|| {
        let sock = std::os::unix::net::UnixStream::connect(
            std::path::Path::new(&env["ARGUS_STATE_DIR"]).join("shim.sock"),
        )
        .expect("the broker's socket");
        // Admitted before the stop: its handler runs (a connection the
        // broker takes only after the stop is refused, as it should be).
        let agent = a.pid();
        let t = std::time::Instant::now();
        while !children_of_agent_run_a_handler(agent) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the broker started no handler for the connection"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (sock, late_label.clone())
    });

    a.signal(libc::SIGTERM);
    let mut late_answer = None;
    let mut refused = None;
    if let Some((sock, late_label)) = late {
        // Ray's grace (8 s) is the window: once the first removal took the
        // engine above, the late call goes on, and a new call comes.
        let t = std::time::Instant::now();
        while !shim_support::containers_with(&engine_label).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(6),
                "the stop's first removal did not come\n{}",
                a.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        argus_podman::transport::send_fds(&sock, &[0, 1, 2]).unwrap();
        let request = argus_podman::transport::Request {
            args: [
                "run",
                "-d",
                "--label",
                &late_label,
                shim_support::image(),
                "/bin/tool",
                "sleep",
                "120",
            ]
            .map(String::from)
            .to_vec(),
            cwd: "/".into(),
            env: vec![("ARGUS_SHIM_SELF_ID".into(), ray_container.clone())],
        };
        argus_podman::transport::send(&sock, &request).unwrap();
        late_answer = Some(argus_podman::transport::recv::<
            argus_podman::transport::ToClient,
        >(&sock));
        // A call that comes during the stop.
        refused = Some(run_detached(&format!("{late_label}-new")));
    }
    let (st, took) = a
        .wait_exit(Duration::from_secs(15))
        .expect("agent did not exit");
    assert_eq!(st.code(), Some(0), "{}", a.log());
    let mut left = shim_support::containers_with(&engine_label);
    if ray_ignores_term {
        left.extend(shim_support::containers_with(&late_label));
        left.extend(shim_support::containers_with(&format!("{late_label}-new")));
    }
    shim_support::force_remove(&left);
    shim_support::force_remove(&[ray_container]);
    assert!(
        left.is_empty(),
        "engine containers left after the node stopped: {left:?} (a call under way at the stop: {late_answer:?}; a call during the stop: {})\n{}",
        refused.as_ref().map(shim_support::show).unwrap_or_default(),
        a.log()
    );
    eprintln!("stop took {took:?} (ray ignores SIGTERM: {ray_ignores_term})");
    assert!(
        took < Duration::from_secs(10),
        "stop took {took:?}\n{}",
        a.log()
    );
    if ray_ignores_term {
        assert!(
            took >= Duration::from_secs(7),
            "{took:?}: Ray's grace was not given\n{}",
            a.log()
        );
    }
}

/// A node killed outright (`docker kill`, a host that vanished) leaves the
/// engine containers of its attached `podman run`s behind: their shims died
/// with it. The next agent of that node removes them when it starts, not
/// only at its first periodic sweep (30 s later).
#[test]
fn a_restarted_node_removes_the_engines_its_killed_run_left() {
    let (label, ray_container) = stand_in_node("node-janitor-restart", 300);

    let sb = Sandbox::new();
    let mut env = sb.env("n", "head");
    env.insert("ARGUS_SHIM_SELF_ID".into(), ray_container.clone());
    let mut first = Agent::start(&sb, "n", &env);
    first.wait_for("running", Duration::from_secs(10), |a| {
        a.state() == "running"
    });

    // An attached run, as Ray's container plugin makes: its shim stays and
    // watches the container.
    let engine_label = format!("{label}-engine");
    let mut shim = shim_support::podman(&[
        "run",
        "--label",
        &engine_label,
        shim_support::image(),
        "/bin/tool",
        "sleep",
        "300",
    ])
    .env("ARGUS_SHIM_SELF_ID", &ray_container)
    .env("ARGUS_STATE_DIR", &env["ARGUS_STATE_DIR"])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while shim_support::containers_with(&engine_label).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The node dies whole: the agent, the podman handler and watchdog it
    // forked (the watchdog would otherwise remove the container) and the
    // shim; no stop sweep runs.
    let mut doomed = descendants(first.pid());
    doomed.extend(descendants(shim.id() as i32));
    doomed.push(first.pid());
    for pid in &doomed {
        // SAFETY: kill(2) on processes this test started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    first
        .wait_exit(Duration::from_secs(10))
        .expect("agent killed");
    shim.kill().unwrap();
    shim.wait().unwrap();
    assert_eq!(shim_support::containers_with(&engine_label).len(), 1);

    let started = std::time::Instant::now();
    let mut second = Agent::start(&sb, "n", &env);
    // Well inside the 30 s of the periodic sweep.
    let deadline = started + Duration::from_secs(25);
    let mut left = shim_support::containers_with(&engine_label);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left = shim_support::containers_with(&engine_label);
    }
    let took = started.elapsed();
    second.signal(libc::SIGTERM);
    second.wait_exit(Duration::from_secs(15));
    shim_support::force_remove(&left);
    shim_support::force_remove(&[ray_container]);
    assert!(
        left.is_empty(),
        "the killed run's engine is still there {took:?} after the node restarted\n{}",
        second.log()
    );
    eprintln!("the killed run's engine was removed {took:?} after the restart");
}

/// Whether a child of `agent` is a podman handler (`__shim-handler`).
fn children_of_agent_run_a_handler(agent: i32) -> bool {
    support::children_of(agent).iter().any(|(pid, _)| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"__shim-handler"))
    })
}

/// Every descendant of `pid`, found now.
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for (c, _) in support::children_of(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}
