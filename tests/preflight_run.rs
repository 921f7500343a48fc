//! Black-box tests of the GPU preflight on the node start path
//! (`argus-agent run` with a fake `ray`): a failed preflight exits with its
//! class's code before Ray starts; a passed one starts Ray with the Triton
//! fix in its environment.

#[path = "preflight_support.rs"]
mod support;

use std::time::Duration;

use support::FakeNode;

const STOP_WITHIN: Duration = Duration::from_secs(20);

fn failing_node(role: &str, var: &str, val: &str) -> FakeNode {
    let mut node = FakeNode::healthy(2);
    node.prepare_run(role).set(var, val);
    node
}

#[test]
fn infrastructure_fatal_preflight_exits_69_without_starting_ray() {
    for role in ["head", "worker"] {
        let node = failing_node(role, "FAKE_SMI", "gpu-lost");
        let (code, err) = node.run_until_exit(STOP_WITHIN);
        assert_eq!(code, 69, "{role}: {err}");
        assert_eq!(node.ray_marker(), None, "{role}: ray started");
        assert!(err.contains("gpu-lost"), "{role}: {err}");
        let verdicts = std::fs::read_dir(node.path("logs/preflight"))
            .unwrap()
            .count();
        assert_eq!(verdicts, 1, "{role}: verdict file not written");
    }
}

#[test]
fn transient_preflight_exits_75_without_starting_ray() {
    for role in ["head", "worker"] {
        let mut node = failing_node(role, "FAKE_SMI", "hang");
        node.set("ARGUS_PREFLIGHT_TIMEOUT_S", "1");
        let (code, err) = node.run_until_exit(STOP_WITHIN);
        assert_eq!(code, 75, "{role}: {err}");
        assert_eq!(node.ray_marker(), None, "{role}: ray started");
    }
}

#[test]
fn configuration_preflight_exits_78_without_starting_ray() {
    for role in ["head", "worker"] {
        let node = failing_node(role, "FAKE_CUDA_INIT", "100");
        let (code, err) = node.run_until_exit(STOP_WITHIN);
        assert_eq!(code, 78, "{role}: {err}");
        assert_eq!(node.ray_marker(), None, "{role}: ray started");
    }
}

#[test]
fn passed_preflight_starts_ray_with_the_triton_fix_in_its_environment() {
    let mut node = FakeNode::healthy(2);
    node.prepare_run("head");
    let (marker, code, err) = node.run_until_ray_starts(STOP_WITHIN);
    let fix = node.path("state/libcuda").display().to_string();
    assert!(
        marker.contains(&format!("TRITON_LIBCUDA_PATH={fix} ")),
        "{marker}\n{err}"
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn skip_mode_starts_ray_on_a_broken_gpu_node() {
    let mut node = failing_node("head", "FAKE_SMI", "driver-not-loaded");
    node.set("ARGUS_PREFLIGHT", "skip");
    let (marker, _, err) = node.run_until_ray_starts(STOP_WITHIN);
    assert!(marker.contains("TRITON_LIBCUDA_PATH= "), "{marker}\n{err}");
}

#[test]
fn auto_mode_starts_ray_on_a_node_without_gpus() {
    let mut node = FakeNode::healthy(0);
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::remove_file(node.path("root/dev").join(n)).unwrap();
    }
    node.prepare_run("head")
        .set("ARGUS_PREFLIGHT", "auto")
        .unset("NVIDIA_VISIBLE_DEVICES")
        .set("FAKE_SMI", "driver-not-loaded");
    node.run_until_ray_starts(STOP_WITHIN);
}

/// With metrics served, a failed preflight stays up for
/// `ARGUS_METRICS_LINGER_S`, so Prometheus scrapes which check failed and
/// its class; SIGTERM ends the wait and the exit code is still the
/// preflight's.
#[test]
fn failed_preflight_serves_its_verdict_as_metrics_until_stopped() {
    let mut node = failing_node("worker", "FAKE_SMI", "gpu-lost");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    node.set("ARGUS_METRICS_PORT", &port)
        .set("ARGUS_METRICS_LINGER_S", "120");
    let err_path = node.path("agent.stderr");
    let mut child = node
        .command(&["run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let agent_err = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let t0 = std::time::Instant::now();
    let text = loop {
        let out = node.command(&["metrics"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("argus_preflight_ok 0") {
            break text;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the agent exited before its metrics were read: {}",
            agent_err()
        );
        assert!(t0.elapsed() < STOP_WITHIN, "no failed verdict in:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "failed preflight in the metrics after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        text.lines().any(|l| l.starts_with("argus_preflight_check{")
            && l.contains("status=\"fail\"")
            && l.contains("class=\"infrastructure-fatal\"")),
        "{text}"
    );
    assert_eq!(node.ray_marker(), None, "ray started");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t1 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t1.elapsed() < STOP_WITHIN, "SIGTERM did not end the linger");
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("exit after SIGTERM in {:.2} s", t1.elapsed().as_secs_f64());
    assert_eq!(status.code(), Some(69), "{}", agent_err());
}
