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
        // Under target/tmp (removed by `cargo clean`), one folder per test
        // process so that concurrent test binaries never share a file.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fake-gpu-libs-{}", std::process::id()));
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

/// The node start path: `argus-agent run` with a fake `ray`.
impl FakeNode {
    /// Installs a fake `ray` that records its arguments, TRITON_LIBCUDA_PATH
    /// and whether the pre-start hook had already run in `ray.marker`, then
    /// sleeps; and sets the variables `argus-agent run` needs for `role`.
    pub fn prepare_run(&mut self, role: &str) -> &mut Self {
        let ray = self.path("bin/ray");
        let marker = self.path("ray.marker");
        let hook_marker = self.path("hook.marker");
        std::fs::write(
            &ray,
            format!(
                "#!/bin/sh\n\
                 if [ -e {hook} ]; then hook=yes; else hook=no; fi\n\
                 echo \"pid=$$ hook_before=$hook TRITON_LIBCUDA_PATH=${{TRITON_LIBCUDA_PATH:-}} args=$*\" >> {marker}\n\
                 exec sleep 120\n",
                hook = hook_marker.display(),
                marker = marker.display()
            ),
        )
        .unwrap();
        set_mode(&ray, 0o755);
        let shared = self.path("shared");
        std::fs::create_dir_all(&shared).unwrap();
        let ray = ray.display().to_string();
        let shared = shared.display().to_string();
        let no_hook = self.path("no-such-hook").display().to_string();
        self.set("ARGUS_ROLE", role)
            .set("ARGUS_SHARED_ROOT", &shared)
            .set("ARGUS_RAY_BIN", &ray)
            .set("ARGUS_NODE_IP", "127.0.0.1")
            .set("ARGUS_PRESTART_HOOK", &no_hook)
            .set("ARGUS_STOP_GRACE_S", "2")
    }

    /// Writes an executable pre-start hook with `body` (after `touch
    /// hook.marker`) and points ARGUS_PRESTART_HOOK at it.
    pub fn hook(&mut self, body: &str, mode: u32) -> PathBuf {
        let hook = self.path("ray-prestart");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\ntouch {}\n{body}\n",
                self.path("hook.marker").display()
            ),
        )
        .unwrap();
        set_mode(&hook, mode);
        let h = hook.display().to_string();
        self.set("ARGUS_PRESTART_HOOK", &h);
        hook
    }

    /// Returns the fake ray's marker, if it ran.
    /// Returns the marker once a whole line is in it (the shell's `>>`
    /// creates the file before it writes: an empty read is not a start yet).
    pub fn ray_marker(&self) -> Option<String> {
        std::fs::read_to_string(self.path("ray.marker"))
            .ok()
            .filter(|m| m.ends_with('\n'))
    }

    /// Runs `argus-agent run` expecting it to stop by itself within
    /// `within`; returns its exit code and stderr.
    pub fn run_until_exit(&self, within: std::time::Duration) -> (i32, String) {
        let mut child = self
            .command(&["run"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return (status.code().unwrap_or(-1), err);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.kill_ray();
                panic!(
                    "argus-agent run did not exit within {within:?}; ray marker: {:?}",
                    self.ray_marker()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Runs `argus-agent run` until the fake ray has started, then stops
    /// the agent with SIGTERM; returns the marker and the agent's exit code.
    pub fn run_until_ray_starts(&self, within: std::time::Duration) -> (String, i32, String) {
        let mut child = self
            .command(&["run"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + within;
        let marker = loop {
            if let Some(m) = self.ray_marker() {
                break Some(m);
            }
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        // SAFETY: kill(2) with a pid we own.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let stop_deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > stop_deadline {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        self.kill_ray();
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let marker = marker.unwrap_or_else(|| {
            panic!("ray did not start within {within:?}; agent exit {status:?}\nstderr:\n{err}")
        });
        (marker, status.code().unwrap_or(-1), err)
    }

    /// Kills a fake ray left behind (its pid is in the marker).
    pub fn kill_ray(&self) {
        if let Some(m) = self.ray_marker() {
            for pid in m.lines().filter_map(|l| {
                l.strip_prefix("pid=")?
                    .split(' ')
                    .next()?
                    .parse::<i32>()
                    .ok()
            }) {
                // SAFETY: kill(2); the pid was written by our fake ray.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

pub fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}
