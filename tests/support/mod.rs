//! Helpers for black-box tests of the `argus-agent` binary: a sandbox with
//! shared storage, state and log folders, the fake `ray`, and a handle on a
//! running agent that panics loudly with its log when something is off.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod fakehead;

pub const BIN: &str = env!("CARGO_BIN_EXE_argus-agent");

/// Returns the repository's top folder.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The cluster's Ray token in every sandbox (see [`Sandbox::token_file`]).
pub const SANDBOX_TOKEN: &str = "sandbox-token-0123456789abcdef0123456789abcdef";

/// A temporary world for one or more agents.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("argus-test-")
            .tempdir()
            .unwrap();
        let s = Self { dir };
        std::fs::create_dir_all(s.shared()).unwrap();
        std::fs::create_dir_all(s.bindir()).unwrap();
        for name in ["raylet", "gcs_server"] {
            std::fs::copy("/bin/sleep", s.bindir().join(name)).unwrap();
        }
        s
    }

    /// Writes the cluster's Ray token ([`SANDBOX_TOKEN`], mode 0600) as a
    /// head would have made it: for workers joining a head that a test
    /// writes by hand ([`fakehead::FakeHead`] does it).
    pub fn write_cluster_token(&self) {
        let token = self.token_file();
        if token.exists() {
            return;
        }
        std::fs::create_dir_all(token.parent().unwrap()).unwrap();
        std::fs::write(&token, format!("{SANDBOX_TOKEN}\n")).unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// The cluster's Ray token file, beside the head record.
    pub fn token_file(&self) -> PathBuf {
        self.head_file().with_file_name("auth_token")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn shared(&self) -> PathBuf {
        self.path().join("shared")
    }
    pub fn bindir(&self) -> PathBuf {
        self.path().join("bin")
    }
    pub fn head_file(&self) -> PathBuf {
        self.shared().join("ray/discovery/argus-ray/head.json")
    }

    /// Returns the environment for an agent named `name` using the fake ray.
    pub fn env(&self, name: &str, role: &str) -> BTreeMap<String, String> {
        let mut e = BTreeMap::new();
        let p = |s: &str| self.path().join(s).display().to_string();
        e.insert("ARGUS_ROLE".into(), role.into());
        e.insert(
            "ARGUS_SHARED_ROOT".into(),
            self.shared().display().to_string(),
        );
        e.insert("ARGUS_STATE_DIR".into(), p(&format!("state-{name}")));
        e.insert("ARGUS_LOG_DIR".into(), p(&format!("logs-{name}")));
        e.insert("ARGUS_LOG_LEVEL".into(), "debug".into());
        e.insert(
            "ARGUS_RAY_BIN".into(),
            repo().join("tests/fixtures/fake-ray").display().to_string(),
        );
        e.insert("FAKE_RAY_LOG".into(), p(&format!("ray-{name}.jsonl")));
        e.insert(
            "FAKE_RAY_BINDIR".into(),
            self.bindir().display().to_string(),
        );
        e.insert("ARGUS_NODE_IP".into(), "127.0.0.1".into());
        e.insert("RAY_TMPDIR".into(), p(&format!("raytmp-{name}")));
        e.insert("ARGUS_PREFLIGHT".into(), "skip".into());
        e.insert("ARGUS_DISABLE_PRESTART".into(), "1".into());
        e.insert("ARGUS_TTL_S".into(), "3".into());
        e.insert("ARGUS_REFRESH_S".into(), "0.5".into());
        e.insert("ARGUS_POLL_S".into(), "0.5".into());
        e.insert("ARGUS_RESTART_BACKOFF_MIN_S".into(), "0.2".into());
        e.insert("ARGUS_RESTART_BACKOFF_MAX_S".into(), "1".into());
        e.insert("ARGUS_RAY_PORT".into(), free_port().to_string());
        e.insert("ARGUS_DASHBOARD_PORT".into(), free_port().to_string());
        // Ray's fixed defaults (52365, 10001) are checked free at start;
        // a real Ray of a test running beside this one (host networking)
        // may hold them, so no agent here depends on them.
        for v in [
            "ARGUS_RAY_DASHBOARD_AGENT_LISTEN_PORT",
            "ARGUS_RAY_CLIENT_SERVER_PORT",
        ] {
            e.insert(v.into(), free_port().to_string());
        }
        e
    }

    /// Events the fake ray of agent `name` logged.
    pub fn ray_events(&self, name: &str) -> Vec<Value> {
        std::fs::read_to_string(self.path().join(format!("ray-{name}.jsonl")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Whether the fake ray of agent `name` has installed its signal
    /// handlers (its `ready` event): a signal sent before that takes the
    /// default action and kills it, so a test that signals waits for this.
    pub fn ray_ready(&self, name: &str) -> bool {
        self.ray_events(name).iter().any(|e| e["event"] == "ready")
    }

    pub fn ray_starts(&self, name: &str) -> Vec<Value> {
        self.ray_events(name)
            .into_iter()
            .filter(|e| e["event"] == "start")
            .collect()
    }

    /// Reads the head record as JSON, if present and valid JSON.
    pub fn record(&self) -> Option<Value> {
        serde_json::from_slice(&std::fs::read(self.head_file()).ok()?).ok()
    }

    /// Lists every file under `dir`, recursively.
    pub fn files_under(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    out.extend(Self::files_under(&p));
                } else {
                    out.push(p);
                }
            }
        }
        out
    }
}

/// A running agent.
pub struct Agent {
    pub name: String,
    pub child: Child,
    pub state_dir: PathBuf,
    pub stderr_path: PathBuf,
    pub exit: Option<ExitStatus>,
}

impl Agent {
    /// Starts `argus-agent run` (or `prefix... argus-agent run`).
    pub fn start(sb: &Sandbox, name: &str, env: &BTreeMap<String, String>) -> Self {
        Self::start_with(sb, name, env, &[])
    }

    pub fn start_with(
        sb: &Sandbox,
        name: &str,
        env: &BTreeMap<String, String>,
        prefix: &[&str],
    ) -> Self {
        let stderr_path = sb.path().join(format!("agent-{name}.stderr"));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .process_group(0);
        let child = cmd.spawn().expect("spawn argus-agent");
        Self {
            name: name.into(),
            child,
            state_dir: PathBuf::from(&env["ARGUS_STATE_DIR"]),
            stderr_path,
            exit: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Describes the agent's threads for a failure message: each thread's
    /// name, state and kernel wait channel from /proc, and the user-space
    /// stacks from gdb when it is installed. What a hang leaves to look at.
    pub fn threads(&self) -> String {
        let pid = self.pid();
        let mut out = String::new();
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in rd.flatten() {
                let p = t.path();
                let read = |f: &str| {
                    std::fs::read_to_string(p.join(f))
                        .unwrap_or_default()
                        .trim()
                        .to_string()
                };
                let stat = read("stat");
                let state = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .next()
                    .unwrap_or("?")
                    .to_string();
                out.push_str(&format!(
                    "tid {} {:<16} state {} wchan {} syscall {}\n",
                    t.file_name().to_string_lossy(),
                    read("comm"),
                    state,
                    read("wchan"),
                    read("syscall").split_whitespace().next().unwrap_or("")
                ));
            }
        }
        // gdb waits for every thread to stop, and a thread waiting on a
        // frozen FUSE mount (request_wait_answer: uninterruptible once gdb
        // signals it) never does: gdb then hung the test for good,
        // ignoring timeout's TERM (a run beside a busy loop, hung_storage).
        // Skipped then, and killed if it outlives its 30 s.
        if out.contains(" state D ") || out.contains(" wchan request_wait_answer ") {
            out.push_str("(no gdb stacks: a thread waits uninterruptibly)\n");
            return out;
        }
        let gdb = Command::new("timeout")
            .args([
                "-k",
                "5",
                "30",
                "gdb",
                "-p",
                &pid.to_string(),
                "-batch",
                "-nx",
            ])
            .args(["-ex", "thread apply all bt 30"])
            .stdin(Stdio::null())
            .output();
        if let Ok(o) = gdb {
            let text = String::from_utf8_lossy(&o.stdout);
            out.extend(
                text.lines()
                    .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
                    .map(|l| format!("{l}\n")),
            );
        }
        out
    }

    pub fn status(&self) -> Option<Value> {
        serde_json::from_slice(&std::fs::read(self.state_dir.join("status.json")).ok()?).ok()
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits until `cond` holds, panicking with the agent's log on timeout.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut(&mut Self) -> bool,
    ) {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if cond(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "timed out after {timeout:?} waiting for {what}\n--- status of {} ---\n{:?}\n--- log ---\n{}\n--- threads ---\n{}",
            self.name,
            self.status(),
            self.log(),
            self.threads()
        );
    }

    /// Waits for the agent to exit, returning its status and how long it took.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<(ExitStatus, Duration)> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Some(st) = self.child.try_wait().unwrap() {
                self.exit = Some(st);
                return Some((st, t0.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn state(&self) -> String {
        self.status()
            .and_then(|s| s["state"].as_str().map(String::from))
            .unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.exit.is_none() && self.child.try_wait().ok().flatten().is_none() {
            // A graceful stop first, so the agent cleans up its Ray.
            self.signal(libc::SIGTERM);
            if self.wait_exit(Duration::from_secs(15)).is_none() {
                unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
                let _ = self.child.wait();
            }
        }
    }
}

/// Returns true if and only if `pid` exists and is not a zombie.
pub fn alive(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Returns the pids of processes whose parent is `ppid`.
pub fn children_of(ppid: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map(|(_, n)| n).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(ppid) {
            out.push((pid, name.to_string()));
        }
    }
    out
}

/// Runs the binary to completion with `args` and `env` only.
pub fn run_bin(args: &[&str], env: &BTreeMap<String, String>) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .output()
        .unwrap()
}

/// Returns a TCP port that was free on 127.0.0.1 a moment ago and that
/// this process has not handed out before: the kernel may give the port
/// of a listener just closed straight back, and one test's agent then got
/// its client-server port equal to its dashboard port (seen in CI).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}
