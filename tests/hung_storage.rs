//! A hung shared mount never freezes the node (issue 9.6, SPEC §11): the
//! shared root is a FUSE pass-through (`bindfs`) whose daemon the test
//! SIGSTOPs, so every open, read, rename and fsync on it blocks in the
//! kernel, as on an NFS server that stopped answering. SIGTERM must still
//! stop the node, Ray included, inside Docker's 10 s stop timeout.
//!
//! Needs root, /dev/fuse and `bindfs` (scripts/test installs it). Missing
//! any of them fails the test loudly: it never passes by not running.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{alive, Agent, Sandbox};

/// A bindfs mount of `src` at `mnt`; unfrozen and unmounted on drop.
struct HangableMount {
    mnt: PathBuf,
    daemon: i32,
}

impl HangableMount {
    fn new(src: &Path, mnt: &Path) -> Self {
        std::fs::create_dir_all(src).unwrap();
        std::fs::create_dir_all(mnt).unwrap();
        let out = Command::new("bindfs")
            .args(["--no-allow-other"])
            .arg(src)
            .arg(mnt)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run bindfs ({e}): install it (apt-get install bindfs; scripts/test does)")
            });
        assert!(
            out.status.success(),
            "bindfs {} {} failed (root and /dev/fuse needed): {}",
            src.display(),
            mnt.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let daemon = find_daemon(mnt)
            .unwrap_or_else(|| panic!("no bindfs process found for {}", mnt.display()));
        Self {
            mnt: mnt.to_path_buf(),
            daemon,
        }
    }

    /// Makes every operation on the mount block until [`Self::thaw`].
    fn freeze(&self) {
        unsafe { libc::kill(self.daemon, libc::SIGSTOP) };
    }

    fn thaw(&self) {
        unsafe { libc::kill(self.daemon, libc::SIGCONT) };
    }
}

impl Drop for HangableMount {
    fn drop(&mut self) {
        self.thaw();
        let _ = Command::new("fusermount")
            .arg("-u")
            .arg("-z")
            .arg(&self.mnt)
            .status();
        unsafe { libc::kill(self.daemon, libc::SIGTERM) };
    }
}

/// Returns the pid of the bindfs process serving `mnt`.
fn find_daemon(mnt: &Path) -> Option<i32> {
    let want = mnt.to_string_lossy().to_string();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        if args.first().is_some_and(|a| a.ends_with("bindfs")) && args.contains(&want) {
            return Some(pid);
        }
    }
    None
}

/// Pids of the fake ray's processes that are still alive.
fn ray_pids_alive(sb: &Sandbox, name: &str) -> Vec<i64> {
    let mut pids = Vec::new();
    for ev in sb.ray_events(name) {
        if let Some(p) = ev["pid"].as_i64() {
            pids.push(p);
        }
        for p in ev["pids"].as_array().into_iter().flatten() {
            pids.extend(p.as_i64());
        }
    }
    pids.sort();
    pids.dedup();
    pids.into_iter().filter(|p| alive(*p)).collect()
}

/// Starts an agent whose shared root is a hangable mount, waits until it
/// runs, freezes the mount, sends SIGTERM and checks the stop.
fn stop_with_storage_hung(role: &str) {
    let sb = Sandbox::new();
    let mount = HangableMount::new(&sb.path().join("shared-backing"), &sb.shared());
    let mut env = sb.env(role, role);
    if role == "worker" {
        // A head that never answers: the worker waits on the record.
        env.insert("ARGUS_TTL_S".into(), "3".into());
    }
    let mut agent = Agent::start(&sb, role, &env);
    // Moved to a binding declared after the agent's, so that it is dropped
    // (thawed) first when a check fails: the agent's drop waits for it.
    let mount = mount;
    match role {
        "head" => agent.wait_for("head running and published", Duration::from_secs(30), |a| {
            a.state() == "running" && sb.record().is_some()
        }),
        _ => agent.wait_for(
            "worker waiting on the record",
            Duration::from_secs(30),
            |a| !a.state().is_empty(),
        ),
    }
    mount.freeze();
    // Let the node run into the hang (its next refresh or poll) before the
    // stop: wait until the storage thread reports it, or the log does.
    agent.wait_for(
        "the node to notice the hung storage",
        Duration::from_secs(30),
        |a| a.log().contains("shared storage hung"),
    );
    agent.signal(libc::SIGTERM);
    // The agent has stopped when its main thread has exited (exit_group):
    // reaped, or a zombie leader. A zombie stays unreaped while one of its
    // threads waits in a FUSE request that bindfs had already taken when
    // it was frozen: FUSE waits for such a request uninterruptibly, where
    // NFS's hard-mount waits are killable (CI hit this: the record reader
    // in request_wait_answer, the test blocked for good). So the stop is
    // timed to the exit, then the mount is thawed and the status read.
    let t0 = Instant::now();
    let mut took = None;
    while t0.elapsed() < Duration::from_secs(10) {
        if agent.wait_exit(Duration::ZERO).is_some() || leader_exited(agent.pid()) {
            took = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    mount.thaw();
    let stopped = agent.wait_exit(Duration::from_secs(30));
    let log = agent.log();
    let took = took.unwrap_or_else(|| {
        panic!("{role} did not stop within 10 s of SIGTERM with the shared storage hung\n--- log ---\n{log}")
    });
    let (status, _) = stopped.unwrap_or_else(|| {
        panic!(
            "{role} exited but was not reaped 30 s after the mount was thawed\n--- log ---\n{log}"
        )
    });
    assert_eq!(
        status.code(),
        Some(0),
        "{role} exit status {status:?}\n{log}"
    );
    assert!(
        ray_pids_alive(&sb, role).is_empty(),
        "{role} left Ray processes behind: {:?}\n{log}",
        ray_pids_alive(&sb, role)
    );
    eprintln!("{role}: stopped {took:?} after SIGTERM with the shared storage hung");
    drop(mount);
}

/// Whether the thread group leader `pid` has exited (a zombie, or gone).
fn leader_exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

#[test]
fn head_stops_within_docker_timeout_while_shared_storage_hangs() {
    stop_with_storage_hung("head");
}

#[test]
fn worker_stops_within_docker_timeout_while_shared_storage_hangs() {
    stop_with_storage_hung("worker");
}
