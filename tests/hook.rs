//! Black-box tests of the pre-start hook on the node start path
//! (`argus-agent run` with a fake `ray`): it runs before Ray, and a failing,
//! hanging or non-executable hook stops the start before Ray runs.

#[path = "preflight_support.rs"]
mod support;

use std::time::{Duration, Instant};

use support::FakeNode;

const STOP_WITHIN: Duration = Duration::from_secs(20);

/// A node that needs no GPU preflight, so only the hook decides.
fn node(role: &str) -> FakeNode {
    let mut n = FakeNode::healthy(1);
    n.prepare_run(role).set("ARGUS_PREFLIGHT", "skip");
    n
}

#[test]
fn prestart_hook_runs_before_ray() {
    let mut n = node("head");
    n.hook("echo preparing the node; exit 0", 0o755);
    let (marker, code, err) = n.run_until_ray_starts(STOP_WITHIN);
    assert!(marker.contains("hook_before=yes"), "{marker}\n{err}");
    assert_eq!(marker.lines().count(), 1, "{marker}");
    assert_eq!(code, 0, "{err}");
}

#[test]
fn failing_prestart_hook_stops_the_start_with_exit_1_naming_the_hook() {
    for role in ["head", "worker"] {
        let mut n = node(role);
        let hook = n.hook("echo 'cannot mount models' >&2; exit 7", 0o755);
        let (code, err) = n.run_until_exit(STOP_WITHIN);
        assert_eq!(code, 1, "{role}: {err}");
        assert!(err.contains(&hook.display().to_string()), "{role}: {err}");
        assert!(err.contains("exit code 7"), "{role}: {err}");
        assert_eq!(n.ray_marker(), None, "{role}: ray started");
        assert!(n.path("hook.marker").exists(), "{role}: hook did not run");
    }
}

#[test]
fn hanging_prestart_hook_is_killed_at_the_timeout_and_stops_the_start() {
    let mut n = node("head");
    n.set("ARGUS_PRESTART_TIMEOUT_S", "1");
    n.hook("sleep 60", 0o755);
    let t = Instant::now();
    let (code, err) = n.run_until_exit(STOP_WITHIN);
    assert_eq!(code, 1, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(err.contains("timed out"), "{err}");
    assert_eq!(n.ray_marker(), None, "ray started");
}

#[test]
fn non_executable_prestart_hook_is_a_configuration_error() {
    for role in ["head", "worker"] {
        let mut n = node(role);
        n.hook("exit 0", 0o644);
        let (code, err) = n.run_until_exit(STOP_WITHIN);
        assert_eq!(code, 78, "{role}: {err}");
        assert!(err.contains("not executable"), "{role}: {err}");
        assert_eq!(n.ray_marker(), None, "{role}: ray started");
        assert!(!n.path("hook.marker").exists());
    }
}

#[test]
fn disabled_prestart_hook_is_not_run() {
    for val in ["1", "true"] {
        let mut n = node("head");
        n.hook("exit 9", 0o755);
        n.set("ARGUS_DISABLE_PRESTART", val);
        let (marker, _, err) = n.run_until_ray_starts(STOP_WITHIN);
        assert!(marker.contains("hook_before=no"), "{val}: {marker}\n{err}");
        assert!(!n.path("hook.marker").exists(), "{val}: hook ran");
    }
}

#[test]
fn absent_prestart_hook_lets_ray_start() {
    let n = node("head");
    let (marker, _, err) = n.run_until_ray_starts(STOP_WITHIN);
    assert!(marker.contains("hook_before=no"), "{marker}\n{err}");
}
