//! Shared helpers of the preflight and hook black-box tests: a fake GPU node
//! (a device root, the stand-in `nvidia-smi` on PATH, and stand-in
//! `libcuda.so.1` / `libnvidia-ml.so.1` compiled from tests/fixtures/gpu/*.c
//! and found by the dynamic loader through LD_LIBRARY_PATH, exactly as the
//! real ones are), and a command runner that panics loudly.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub const BIN: &str = env!("CARGO_BIN_EXE_argus-agent");

/// Returns the fixtures folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gpu")
}

/// Compiles the stand-in libraries once per test binary; returns the folder
/// holding `libcuda.so.1` and `libnvidia-ml.so.1`.
pub fn built_libs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("argus-fake-gpu-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (src, soname) in [
            ("libcuda.c", "libcuda.so.1"),
            ("libnvidia-ml.c", "libnvidia-ml.so.1"),
        ] {
            let out = Command::new("gcc")
                .args(["-shared", "-fPIC", "-O1"])
                .arg(format!("-Wl,-soname,{soname}"))
                .arg("-o")
                .arg(dir.join(soname))
                .arg(fixtures().join(src))
                .output()
                .expect("gcc is needed to build the stand-in GPU libraries");
            assert!(
                out.status.success(),
                "gcc failed for {src}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

/// A fake GPU node in a temporary folder.
pub struct FakeNode {
    pub tmp: tempfile::TempDir,
    pub env: Vec<(String, String)>,
}

impl FakeNode {
    /// Returns a healthy node with `gpus` GPUs: device nodes, nvidia-smi on
    /// PATH, both libraries (only `libcuda.so.1`, no unversioned link).
    pub fn healthy(gpus: usize) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for d in ["root/dev", "bin", "lib", "logs", "state"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
            std::fs::write(root.join("root/dev").join(n), "").unwrap();
        }
        for i in 0..gpus {
            std::fs::write(root.join(format!("root/dev/nvidia{i}")), "").unwrap();
        }
        std::fs::copy(fixtures().join("nvidia-smi"), root.join("bin/nvidia-smi")).unwrap();
        for l in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            std::fs::copy(built_libs().join(l), root.join("lib").join(l)).unwrap();
        }
        let p = |s: &str| root.join(s).display().to_string();
        let env = vec![
            ("PATH".into(), format!("{}:/usr/bin:/bin", p("bin"))),
            ("LD_LIBRARY_PATH".into(), p("lib")),
            ("ARGUS_PREFLIGHT".into(), "require".into()),
            ("ARGUS_PREFLIGHT_DEV_ROOT".into(), p("root")),
            ("ARGUS_LOG_DIR".into(), p("logs")),
            ("ARGUS_STATE_DIR".into(), p("state")),
            ("ARGUS_PREFLIGHT_TIMEOUT_S".into(), "5".into()),
            ("FAKE_SMI_GPUS".into(), gpus.to_string()),
            ("FAKE_NVML_COUNT".into(), gpus.to_string()),
            ("FAKE_CUDA_COUNT".into(), gpus.to_string()),
            ("NVIDIA_VISIBLE_DEVICES".into(), "all".into()),
        ];
        FakeNode { tmp, env }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// Sets (or replaces) a variable.
    pub fn set(&mut self, k: &str, v: &str) -> &mut Self {
        self.env.retain(|(kk, _)| kk != k);
        self.env.push((k.into(), v.into()));
        self
    }

    /// Removes a variable.
    pub fn unset(&mut self, k: &str) -> &mut Self {
        self.env.retain(|(kk, _)| kk != k);
        self
    }

    /// Returns `argus-agent ARGS` with exactly this node's environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args).env_clear();
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs `argus-agent preflight --json`; returns the exit code, the
    /// parsed verdict and the output.
    pub fn preflight_json(&self) -> (i32, serde_json::Value, Output) {
        let out = self.command(&["preflight", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not a JSON verdict ({e}); exit {:?}\nstdout:\n{}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), v, out)
    }
}

/// Returns the check named `name` of a verdict.
pub fn check<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .expect("checks is a list")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {v:#}"))
}

/// Asserts the exit code, class and signature of a failed verdict.
pub fn assert_failed(
    code: i32,
    v: &serde_json::Value,
    out: &Output,
    want_code: i32,
    class: &str,
    signature: &str,
) {
    let ctx = format!(
        "verdict:\n{v:#}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(code, want_code, "exit code\n{ctx}");
    assert_eq!(v["ok"], false, "{ctx}");
    assert_eq!(v["exit_code"], want_code, "{ctx}");
    assert_eq!(v["class"], class, "{ctx}");
    assert_eq!(v["signature"], signature, "{ctx}");
}
