//! Black-box tests of `argus-agent preflight [--json]` on fake GPU nodes:
//! every class and exit code, the Triton fix and each mode. See
//! preflight_support.rs for the fake node.

#[path = "preflight_support.rs"]
mod support;

use std::time::Instant;

use support::{assert_failed, check, FakeNode};

const INFRA: &str = "infrastructure-fatal";
const TRANSIENT: &str = "transient";
const CONFIG: &str = "configuration";

#[test]
fn healthy_node_with_four_gpus_passes_and_writes_the_verdict_file() {
    let node = FakeNode::healthy(4);
    let (code, v, out) = node.preflight_json();
    assert_eq!(code, 0, "{v:#}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(v["ok"], true);
    assert_eq!(v["ran"], true);
    assert_eq!(v["exit_code"], 0);
    assert!(v.get("class").is_none(), "{v:#}");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 4);
    assert_eq!(
        v["gpus"][3]["uuid"],
        "GPU-00000003-1111-2222-3333-444444444443"
    );
    assert_eq!(v["gpus"][0]["memory_total_mib"], 81920);
    assert_eq!(v["gpus"][0]["ecc_uncorrected_volatile"], 0);
    for name in [
        "device-nodes",
        "nvidia-smi",
        "libnvidia-ml",
        "libcuda",
        "gpu-count",
    ] {
        assert_eq!(check(&v, name)["status"], "pass", "{name}: {v:#}");
    }
    assert!(check(&v, "libcuda")["message"]
        .as_str()
        .unwrap()
        .contains(&node.path("lib/libcuda.so.1").display().to_string()));
    // The same verdict is in the log folder, named after the host.
    let host = v["host"].as_str().unwrap();
    let file = node.path(&format!("logs/preflight/{host}.json"));
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(on_disk, v);
    // No temporary file left behind.
    let names: Vec<_> = std::fs::read_dir(node.path("logs/preflight"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn healthy_node_prints_a_human_report_without_json() {
    let node = FakeNode::healthy(2);
    let out = node.command(&["preflight"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with("gpu preflight passed: 2 GPU(s) usable"),
        "{text}"
    );
    assert!(text.contains("nvidia-smi"), "{text}");
    assert!(text.contains("gpu 1 GPU-00000001"), "{text}");
}

/// How long it takes is scripts/bench-preflight.sh's figure; printed here.
#[test]
fn a_healthy_host_with_eight_gpus_passes() {
    let node = FakeNode::healthy(8);
    let t = Instant::now();
    let (code, v, _) = node.preflight_json();
    eprintln!("healthy preflight took {:?}", t.elapsed());
    assert_eq!(code, 0, "{v:#}");
}

fn smi_failure(
    mode: &str,
    code: i32,
    class: &str,
    signature: &str,
    smi_exit: i64,
) -> serde_json::Value {
    let mut node = FakeNode::healthy(2);
    node.set("FAKE_SMI", mode);
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, code, class, signature);
    let smi = check(&v, "nvidia-smi");
    assert_eq!(smi["status"], "fail");
    assert_eq!(smi["evidence"][0]["exit_code"], smi_exit, "{v:#}");
    assert!(smi["evidence"][0]["command"]
        .as_str()
        .unwrap()
        .contains("--format=csv,noheader,nounits"));
    v
}

#[test]
fn nvidia_smi_exit_9_driver_not_loaded_is_infrastructure_fatal() {
    let v = smi_failure("driver-not-loaded", 69, INFRA, "driver-not-loaded", 9);
    let ev = &check(&v, "nvidia-smi")["evidence"][0];
    assert!(
        ev["stdout"]
            .as_str()
            .unwrap()
            .contains("couldn't communicate with the NVIDIA driver"),
        "{ev:#}"
    );
}

#[test]
fn nvidia_smi_exit_12_nvml_missing_is_infrastructure_fatal() {
    smi_failure("nvml-missing", 69, INFRA, "nvml-library-not-found", 12);
}

#[test]
fn nvidia_smi_exit_15_gpu_lost_is_infrastructure_fatal() {
    let v = smi_failure("gpu-lost", 69, INFRA, "gpu-lost", 15);
    assert!(
        v["message"].as_str().unwrap().contains("GPU is lost"),
        "{v:#}"
    );
}

#[test]
fn nvidia_smi_exit_18_version_mismatch_is_infrastructure_fatal() {
    smi_failure("mismatch", 69, INFRA, "driver-library-version-mismatch", 18);
}

#[test]
fn nvidia_smi_unknown_error_is_transient() {
    let v = smi_failure("unknown-error", 75, TRANSIENT, "nvidia-smi-failed", 255);
    let ev = &check(&v, "nvidia-smi")["evidence"][0];
    assert_eq!(ev["stderr"], "Unknown Error");
}

#[test]
fn nvidia_smi_no_devices_found_is_infrastructure_fatal() {
    smi_failure("no-devices", 69, INFRA, "no-gpus-found", 6);
}

#[test]
fn nvidia_smi_hang_is_killed_at_the_timeout_and_transient() {
    let mut node = FakeNode::healthy(2);
    node.set("FAKE_SMI", "hang")
        .set("ARGUS_PREFLIGHT_TIMEOUT_S", "1");
    // The hang is endless: returning at all, with the timeout's verdict, is
    // the behaviour; the figure is printed.
    let t = Instant::now();
    let (c, v, out) = node.preflight_json();
    eprintln!(
        "a hung nvidia-smi with a 1 s timeout: verdict after {:?}",
        t.elapsed()
    );
    assert_failed(c, &v, &out, 75, TRANSIENT, "nvidia-smi-timeout");
    // The libraries were still checked and are fine.
    assert_eq!(check(&v, "libcuda")["status"], "pass", "{v:#}");
}

#[test]
fn uncorrected_ecc_errors_are_infrastructure_fatal() {
    let mut node = FakeNode::healthy(2);
    node.set("FAKE_SMI", "ecc");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "ecc-uncorrectable-errors");
    assert_eq!(v["gpus"][1]["ecc_uncorrected_volatile"], 2);
    assert!(v["message"].as_str().unwrap().contains("gpu 1"), "{v:#}");
}

#[test]
fn retired_pages_pending_warns_but_passes() {
    let mut node = FakeNode::healthy(2);
    node.set("FAKE_SMI", "pending");
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    let smi = check(&v, "nvidia-smi");
    assert_eq!(smi["status"], "warn");
    assert_eq!(smi["signature"], "retired-pages-pending");
}

#[test]
fn unsupported_counters_read_as_absent() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_SMI", "na");
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    assert!(v["gpus"][0]["ecc_uncorrected_volatile"].is_null(), "{v:#}");
}

#[test]
fn driver_without_the_ecc_fields_is_queried_with_the_basic_fields() {
    let mut node = FakeNode::healthy(2);
    let log = node.path("smi.log");
    node.set("FAKE_SMI", "old-driver")
        .set("FAKE_SMI_LOG", &log.display().to_string());
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2);
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls.lines().count(), 2, "{calls}");
}

#[test]
fn unparseable_nvidia_smi_output_is_transient() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_SMI", "garbage");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 75, TRANSIENT, "nvidia-smi-unparseable");
}

#[test]
fn missing_nvidia_smi_is_a_configuration_error() {
    let node = FakeNode::healthy(1);
    std::fs::remove_file(node.path("bin/nvidia-smi")).unwrap();
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "nvidia-smi-not-found");
}

#[test]
fn missing_libcuda_is_infrastructure_fatal() {
    let node = FakeNode::healthy(1);
    std::fs::remove_file(node.path("lib/libcuda.so.1")).unwrap();
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "libcuda-not-loadable");
    let ev = &check(&v, "libcuda")["evidence"][0];
    assert_eq!(ev["command"], "dlopen(libcuda.so.1, RTLD_NOW)");
    assert!(
        ev["stderr"].as_str().unwrap().contains("libcuda.so.1"),
        "{ev:#}"
    );
    assert_eq!(check(&v, "libnvidia-ml")["status"], "pass");
}

#[test]
fn missing_libnvidia_ml_is_infrastructure_fatal() {
    let node = FakeNode::healthy(1);
    std::fs::remove_file(node.path("lib/libnvidia-ml.so.1")).unwrap();
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "libnvidia-ml-not-loadable");
}

#[test]
fn nvml_version_mismatch_is_infrastructure_fatal() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_NVML_INIT", "18");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "driver-library-version-mismatch");
    let ev = &check(&v, "libnvidia-ml")["evidence"][0];
    assert_eq!(ev["command"], "nvmlInit_v2()");
    assert_eq!(ev["exit_code"], 18);
    assert_eq!(
        ev["code_name"],
        "RM has detected an NVML/RM version mismatch."
    );
}

#[test]
fn cuinit_no_device_is_a_configuration_error() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_CUDA_INIT", "100");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "cuda-no-device");
    let ev = &check(&v, "libcuda")["evidence"][0];
    assert_eq!(ev["exit_code"], 100);
    assert_eq!(ev["code_name"], "CUDA_ERROR_NO_DEVICE");
    // No Triton fix on a library that does not initialise.
    assert_eq!(check(&v, "libcuda-unversioned")["status"], "skipped");
}

#[test]
fn cuda_stub_library_is_a_configuration_error() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_CUDA_INIT", "34");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "cuda-stub-library");
}

#[test]
fn cuinit_unknown_error_is_transient() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_CUDA_INIT", "999");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 75, TRANSIENT, "cuda-init-failed");
}

#[test]
fn cuinit_hang_is_killed_at_the_timeout_and_transient() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_CUDA_HANG", "1")
        .set("ARGUS_PREFLIGHT_TIMEOUT_S", "1");
    let t = Instant::now();
    let (c, v, out) = node.preflight_json();
    eprintln!(
        "a hung cuInit with a 1 s timeout: verdict after {:?}",
        t.elapsed()
    );
    assert_failed(c, &v, &out, 75, TRANSIENT, "library-init-timeout");
}

#[test]
fn crash_inside_the_driver_library_is_contained_and_transient() {
    let mut node = FakeNode::healthy(1);
    node.set("FAKE_CUDA_CRASH", "1");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 75, TRANSIENT, "library-probe-crashed");
    // SIGABRT: 128 + 6.
    assert_eq!(
        check(&v, "libcuda")["evidence"][0]["exit_code"],
        134,
        "{v:#}"
    );
}

#[test]
fn cuda_seeing_fewer_gpus_than_nvidia_smi_is_infrastructure_fatal() {
    let mut node = FakeNode::healthy(4);
    node.set("FAKE_CUDA_COUNT", "3");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "gpu-count-mismatch");
    assert_eq!(check(&v, "gpu-count")["status"], "fail");
    assert!(
        v["message"].as_str().unwrap().contains("cuda sees 3"),
        "{v:#}"
    );
}

#[test]
fn cuda_visible_devices_may_hide_gpus_from_cuda() {
    let mut node = FakeNode::healthy(4);
    node.set("FAKE_CUDA_COUNT", "1")
        .set("CUDA_VISIBLE_DEVICES", "2");
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
}

#[test]
fn fewer_device_nodes_than_requested_gpus_is_infrastructure_fatal() {
    let mut node = FakeNode::healthy(2);
    node.set("NVIDIA_VISIBLE_DEVICES", "0,1,2,3");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "gpu-count-mismatch");
    assert_eq!(check(&v, "device-nodes")["status"], "fail");
    assert_eq!(v["requested"]["count"], 4);
}

#[test]
fn missing_nvidia_uvm_is_infrastructure_fatal() {
    let node = FakeNode::healthy(1);
    std::fs::remove_file(node.path("root/dev/nvidia-uvm")).unwrap();
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "nvidia-uvm-missing");
}

#[test]
fn container_started_without_gpus_is_a_configuration_error() {
    // The launch forgot --gpus: no device nodes, so nothing else works
    // either; the host must not be drained for it.
    let mut node = FakeNode::healthy(0);
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::remove_file(node.path("root/dev").join(n)).unwrap();
    }
    std::fs::remove_file(node.path("lib/libcuda.so.1")).unwrap();
    node.set("FAKE_SMI", "driver-not-loaded");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "gpu-devices-not-injected");
}

#[test]
fn only_libcuda_so_1_is_fixed_for_triton_with_a_private_link() {
    let node = FakeNode::healthy(1);
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    let t = check(&v, "libcuda-unversioned");
    assert_eq!(t["status"], "fixed", "{v:#}");
    assert_eq!(t["signature"], "libcuda-unversioned-missing");
    let fix = node.path("state/libcuda");
    assert_eq!(v["env"]["TRITON_LIBCUDA_PATH"], fix.display().to_string());
    let target = std::fs::read_link(fix.join("libcuda.so")).unwrap();
    assert_eq!(
        target,
        node.path("lib/libcuda.so.1").canonicalize().unwrap()
    );
    // Idempotent: a second run keeps the same link and still passes.
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    assert_eq!(check(&v, "libcuda-unversioned")["status"], "fixed");
}

#[test]
fn unversioned_libcuda_next_to_the_soname_needs_no_fix() {
    let node = FakeNode::healthy(1);
    std::os::unix::fs::symlink("libcuda.so.1", node.path("lib/libcuda.so")).unwrap();
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    assert_eq!(check(&v, "libcuda-unversioned")["status"], "pass", "{v:#}");
    assert!(v["env"].as_object().unwrap().is_empty(), "{v:#}");
    assert!(!node.path("state/libcuda").exists());
}

#[test]
fn triton_fix_that_cannot_be_made_is_a_configuration_error() {
    let mut node = FakeNode::healthy(1);
    std::fs::write(node.path("not-a-dir"), "").unwrap();
    let bad = node.path("not-a-dir/state").display().to_string();
    node.set("ARGUS_STATE_DIR", &bad);
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "libcuda-unversioned-missing");
}

#[test]
fn skip_mode_runs_nothing_even_on_a_broken_node() {
    let mut node = FakeNode::healthy(1);
    let log = node.path("smi.log");
    node.set("ARGUS_PREFLIGHT", "skip")
        .set("FAKE_SMI", "driver-not-loaded")
        .set("FAKE_SMI_LOG", &log.display().to_string());
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    assert_eq!(v["ran"], false);
    assert!(v["checks"].as_array().unwrap().is_empty());
    assert!(!log.exists(), "nvidia-smi ran in skip mode");
}

#[test]
fn auto_mode_without_gpus_runs_nothing() {
    let mut node = FakeNode::healthy(0);
    let log = node.path("smi.log");
    node.set("ARGUS_PREFLIGHT", "auto")
        .unset("NVIDIA_VISIBLE_DEVICES")
        .set("FAKE_SMI", "driver-not-loaded")
        .set("FAKE_SMI_LOG", &log.display().to_string());
    let (c, v, _) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    assert_eq!(v["ran"], false);
    assert!(!log.exists(), "nvidia-smi ran without GPUs in auto mode");
    // `void` and `none` name no device either.
    for val in ["void", "none", ""] {
        node.set("NVIDIA_VISIBLE_DEVICES", val);
        let (c, v, _) = node.preflight_json();
        assert_eq!(
            (c, &v["ran"]),
            (0, &serde_json::Value::Bool(false)),
            "{val:?}: {v:#}"
        );
    }
}

#[test]
fn auto_mode_runs_when_a_gpu_device_node_exists() {
    let mut node = FakeNode::healthy(1);
    node.set("ARGUS_PREFLIGHT", "auto")
        .unset("NVIDIA_VISIBLE_DEVICES")
        .set("FAKE_SMI", "gpu-lost");
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 69, INFRA, "gpu-lost");
    assert_eq!(v["mode"], "auto");
}

#[test]
fn auto_mode_runs_when_nvidia_visible_devices_names_gpus() {
    let mut node = FakeNode::healthy(0);
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::remove_file(node.path("root/dev").join(n)).unwrap();
    }
    node.set("ARGUS_PREFLIGHT", "auto").set(
        "NVIDIA_VISIBLE_DEVICES",
        "GPU-00000000-1111-2222-3333-444444444440",
    );
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "gpu-devices-not-injected");
}

#[test]
fn bad_preflight_mode_is_a_configuration_error_naming_the_variable() {
    let mut node = FakeNode::healthy(1);
    node.set("ARGUS_PREFLIGHT", "sometimes");
    let out = node.command(&["preflight", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ARGUS_PREFLIGHT"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn unwritable_log_folder_does_not_change_the_verdict() {
    let mut node = FakeNode::healthy(1);
    std::fs::write(node.path("file"), "").unwrap();
    let bad = node.path("file/logs").display().to_string();
    node.set("ARGUS_LOG_DIR", &bad);
    let (c, v, out) = node.preflight_json();
    assert_eq!(c, 0, "{v:#}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed to write preflight verdict"), "{err}");
}

/// SPEC R-SEC-2 (docs/security.md): the agent runs `nvidia-smi` as root,
/// so it never takes one from a PATH folder the Ray user can change (the
/// Ray base image puts such folders on PATH): an `nvidia-smi` planted
/// there, first on PATH, is not run (its marker file never appears) and
/// the real one in a root-owned folder further on is; with only the planted
/// one, the check says nvidia-smi is missing, without running it.
#[test]
fn nvidia_smi_in_a_folder_others_can_write_is_never_run() {
    let mut node = FakeNode::healthy(2);
    let planted = node.path("user-bin");
    std::fs::create_dir_all(&planted).unwrap();
    let marker = node.path("planted-ran");
    std::fs::write(
        planted.join("nvidia-smi"),
        format!("#!/bin/sh\ntouch {}\nexit 0\n", marker.display()),
    )
    .unwrap();
    support::set_mode(&planted.join("nvidia-smi"), 0o755);
    // Writable by everyone (no sticky bit): anyone can swap the program.
    support::set_mode(&planted, 0o777);
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        planted.display(),
        node.path("bin").display()
    );
    node.set("PATH", &path);
    let (code, v, out) = node.preflight_json();
    assert_eq!(code, 0, "{v:#}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(check(&v, "nvidia-smi")["status"], "pass", "{v:#}");
    assert!(!marker.exists(), "the planted nvidia-smi ran");
    // Only the planted one on PATH: missing, and still never run.
    node.set("PATH", &format!("{}:/usr/bin:/bin", planted.display()));
    let (c, v, out) = node.preflight_json();
    assert_failed(c, &v, &out, 78, CONFIG, "nvidia-smi-not-found");
    assert!(!marker.exists(), "the planted nvidia-smi ran");
}
