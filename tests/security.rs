//! Trust boundaries on this machine, from the attacker's side (SPEC §9b,
//! docs/security.md), for the rules that need no cluster:
//!
//! - R-SEC-4: a root process of argus-agent that a job can see (Docker's
//!   `healthcheck`, an operator's `status`) is not dumpable, so a root
//!   process WITHOUT `CAP_SYS_PTRACE` (a root engine container has Docker's
//!   default capabilities, which lack it) cannot open its `/proc/<pid>/root`
//!   and reach the files of the node container (the Docker socket) through
//!   it. Checked on the effect: the prober's listing of `/proc/<pid>/root/`,
//!   with a control that the same prober does list it for a dumpable root
//!   process.

mod shim_support;
mod support;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shim_support::{image, BIN};
use support::{Agent, Sandbox};

/// The capabilities of root in a Docker container, as far as this test
/// needs them: everything but CAP_SYS_PTRACE (Docker's default set lacks
/// it). Both the target and the prober run so, as in a node container and
/// a root engine container beside it (the kernel lets a process without
/// CAP_SYS_PTRACE reach another of its uid only when it holds every
/// capability the other holds, and the other is dumpable).
fn as_docker_root() -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-sys_ptrace",
        "--",
    ]);
    c
}

/// Runs `ls /proc/<pid>/root/` as root without CAP_SYS_PTRACE; returns
/// whether it listed the folder.
fn root_without_ptrace_opens(pid: u32) -> bool {
    let probe = |what: &str| -> bool {
        let o = as_docker_root()
            .args(["sh", "-c", what])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("setpriv (util-linux)");
        o.success()
    };
    probe(&format!("ls /proc/{pid}/root/ >/dev/null"))
}

/// A child process killed and reaped when dropped.
struct Held(std::process::Child);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `argus-agent ARGS` as root, held in its read of a FIFO that stands
/// for its state file, and waits until it blocks there.
fn blocked_agent(state: &Path, args: &[&str]) -> Held {
    let child = as_docker_root()
        .arg(BIN)
        .args(args)
        .env("ARGUS_STATE_DIR", state)
        .env("ARGUS_ROLE", "worker")
        .env("ARGUS_SHARED_ROOT", state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Held)
        .unwrap();
    let start = Instant::now();
    // Blocked in open(2) of the FIFO: its wchan names the pipe wait.
    loop {
        let wchan =
            std::fs::read_to_string(format!("/proc/{}/wchan", child.0.id())).unwrap_or_default();
        if wchan.contains("fifo") || wchan.contains("pipe") || wchan == "wait_for_partner" {
            return child;
        }
        if start.elapsed() > Duration::from_secs(30) {
            panic!("argus-agent {args:?} never blocked on the state FIFO (wchan {wchan:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn root_argus_agent_processes_are_not_dumpable() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (CI runs as root): it compares root processes"
    );
    // Control: a dumpable root process (sleep) IS open to the prober, so
    // the probe can fail.
    let control = as_docker_root()
        .args(["sleep", "60"])
        .spawn()
        .map(Held)
        .unwrap();
    // Past setpriv's exec (before it, the process still holds
    // CAP_SYS_PTRACE, and a prober without it is refused for that reason).
    let start = Instant::now();
    while std::fs::read_to_string(format!("/proc/{}/comm", control.0.id()))
        .is_ok_and(|c| c.trim() != "sleep")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "sleep never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let opened = root_without_ptrace_opens(control.0.id());
    drop(control);
    assert!(
        opened,
        "control: root without CAP_SYS_PTRACE could not list a dumpable root process's /proc/<pid>/root, so this test could never fail"
    );
    for args in [&["status"][..], &["status", "--json"], &["healthcheck"]] {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("status.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        let agent = blocked_agent(dir.path(), args);
        let opened = root_without_ptrace_opens(agent.0.id());
        drop(agent);
        assert!(
            !opened,
            "argus-agent {args:?} (root) is dumpable: a root process without CAP_SYS_PTRACE listed its /proc/<pid>/root"
        );
    }
}

/// The host's Docker socket bind-mounted into a fresh root-only folder
/// (the node image's layout); unmounted on drop.
struct SocketInRootOnlyFolder {
    dir: tempfile::TempDir,
}

impl SocketInRootOnlyFolder {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let sock = dir.path().join("docker.sock");
        std::fs::write(&sock, "").unwrap();
        let host = std::fs::canonicalize("/var/run/docker.sock").unwrap();
        let o = Command::new("mount")
            .arg("--bind")
            .arg(&host)
            .arg(&sock)
            .output()
            .unwrap();
        assert!(o.status.success(), "mount --bind {host:?} {sock:?}: {o:?}");
        Self { dir }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("docker.sock")
    }
}

impl Drop for SocketInRootOnlyFolder {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.path()).status();
    }
}

#[test]
fn podman_works_through_the_agent_with_the_socket_in_a_root_only_folder() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (CI runs as root): it runs the agent as root"
    );
    let img = image();
    let sb = Sandbox::new();
    for d in [sb.path().to_path_buf(), sb.shared(), sb.bindir()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let bindir = sb.path().join("podman-bin");
    std::fs::create_dir_all(&bindir).unwrap();
    std::os::unix::fs::symlink(BIN, bindir.join("podman")).unwrap();
    let sock = SocketInRootOnlyFolder::new();
    let script = sb.path().join("worker.py");
    std::fs::write(
        &script,
        r#"
import json, os, socket, subprocess
out = {}
def attempt(f):
    try:
        f()
        return "ok"
    except Exception as e:
        return type(e).__name__
out["socket"] = attempt(lambda: socket.socket(socket.AF_UNIX).connect(os.environ["SOCK"]))
out["stat"] = attempt(lambda: os.stat(os.environ["SOCK"]))
r = subprocess.run([os.environ["PODMAN"], "run", "--rm", os.environ["IMG"], "/bin/tool", "id"], capture_output=True, text=True)
out["podman"] = {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
# A worker the raylet SIGKILLs: its engine must go (the watchdog, which
# reaches the daemon only through the socket its handler opened as root).
import time
lbl = "argus-sec-kill=%d" % os.getpid()
p = subprocess.Popen([os.environ["PODMAN"], "run", "--label", lbl, os.environ["IMG"], "/bin/tool", "sleep", "120"])
def listed():
    r = subprocess.run([os.environ["PODMAN"], "ps", "-a", "-q", "--filter", "label=" + lbl], capture_output=True, text=True)
    return r.stdout.split()
t0 = time.monotonic()
while not listed() and time.monotonic() - t0 < 60:
    time.sleep(0.2)
out["engine_before_kill"] = listed()
p.kill()
p.wait()
t0 = time.monotonic()
while listed() and time.monotonic() - t0 < 60:
    time.sleep(0.5)
out["engine_after_kill"] = listed()
out["engine_gone_after_s"] = round(time.monotonic() - t0, 1)
print(json.dumps(out))
"#,
    )
    .unwrap();
    let out = sb.path().join("worker.json");
    let mut env = sb.env("head", "head");
    env.insert("ARGUS_RAY_USER".into(), "65534:65534".into());
    env.insert(
        "DOCKER_HOST".into(),
        format!("unix://{}", sock.path().display()),
    );
    env.insert("SOCK".into(), sock.path().display().to_string());
    env.insert(
        "FAKE_RAY_RUN".into(),
        format!("python3 {}", script.display()),
    );
    env.insert("FAKE_RAY_RUN_OUT".into(), out.display().to_string());
    env.insert("PODMAN".into(), bindir.join("podman").display().to_string());
    env.insert("IMG".into(), img.to_string());
    let mut agent = Agent::start(&sb, "head", &env);
    agent.wait_for("the worker's report", Duration::from_secs(120), |_| {
        out.exists()
    });
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let w: Value = serde_json::from_str(r["stdout"].as_str().unwrap_or("null"))
        .unwrap_or_else(|e| panic!("{e}: worker said {r}"));
    eprintln!("worker: {w}");
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(30));
    assert_eq!(w["socket"], "PermissionError", "{w}");
    assert_eq!(w["stat"], "PermissionError", "{w}");
    assert_eq!(
        w["podman"]["code"], 0,
        "podman through the agent failed: {w}"
    );
    assert_eq!(w["podman"]["stdout"], "65534:65534\n", "{w}");
    assert_eq!(
        w["engine_before_kill"].as_array().map(Vec::len),
        Some(1),
        "the engine never showed: {w}"
    );
    assert_eq!(
        w["engine_after_kill"],
        serde_json::json!([]),
        "the engine of a SIGKILLed podman stayed (its watchdog could not reach the socket): {w}"
    );
    // The watchdog removes it at once; PID 1's janitor (every 30 s) is the
    // fallback, and would take 30 s: the bound tells the two apart (the
    // compose test allows 15 s for the same).
    let gone = w["engine_gone_after_s"].as_f64().unwrap();
    assert!(
        gone < 15.0,
        "the engine went only after {gone} s: the janitor removed it, not the watchdog: {w}"
    );
}
