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
