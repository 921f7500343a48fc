//! The janitor the node agent calls (`argus::shim::janitor`), against the
//! real daemon. Its own test binary: AllOwned removes every container of
//! the owner `host`, so no other shim test may run beside it.

mod shim_support;

use argus::shim::janitor::{sweep_blocking, JanitorScope};
use shim_support::*;

/// Creates a running container labelled like the shim's, owned by `host`,
/// for shim `pid` (no start label: only liveness of the pid counts).
fn labelled(label: &str, pid: Option<u32>, rm: bool) -> String {
    let img = image();
    let owner = "io.argus.shim.owner=host".to_string();
    let rm = format!("io.argus.shim.rm={}", u8::from(rm));
    let mut args = vec![
        "run", "-d", "--label", label, "--label", &owner, "--label", &rm,
    ];
    let pid_label = pid.map(|p| format!("io.argus.shim.pid={p}"));
    if let Some(p) = &pid_label {
        args.extend(["--label", p]);
    }
    args.extend([img, "/bin/tool", "sleep", "60"]);
    let o = docker(&args);
    assert!(o.status.success(), "{}", show(&o));
    stdout(&o).trim().to_string()
}

#[test]
fn janitor_removes_dead_shims_containers_then_all_at_node_stop() {
    let label = unique("janitor");
    // A pid that is certainly dead: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let live = std::process::id();
    let of_dead = labelled(&label, Some(dead), false);
    let of_live = labelled(&label, Some(live), true);
    let detached = labelled(&label, None, false);

    let n = sweep_blocking(JanitorScope::DeadShims).unwrap();
    assert!(n >= 1, "removed {n}");
    let left = containers_with(&label);
    assert!(
        !left.contains(&of_dead),
        "the dead shim's container is still there"
    );
    assert!(
        left.contains(&of_live),
        "the live shim's container was removed"
    );
    assert!(left.contains(&detached), "a detached container was removed");

    let n = sweep_blocking(JanitorScope::AllOwned).unwrap();
    assert!(n >= 2, "removed {n}");
    let left = containers_with(&label);
    force_remove(&left);
    assert!(left.is_empty(), "node-stop sweep left {left:?}");
}

#[test]
fn janitor_without_a_docker_socket_returns_zero_at_once() {
    // DOCKER_HOST is read by sweep_blocking; only this test binary's
    // janitor tests run, and the other one does not depend on it.
    let t = std::time::Instant::now();
    let n = argus::shim::janitor::sweep_blocking_at(
        "unix:///nonexistent/docker.sock",
        JanitorScope::AllOwned,
    )
    .unwrap();
    assert_eq!(n, 0);
    assert!(t.elapsed() < std::time::Duration::from_millis(500));
}
