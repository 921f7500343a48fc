//! The process tree under the agent, read with sysinfo: watching Ray's
//! raylet and GCS among the descendants of `ray start`, and sweeping every
//! descendant left when the node stops (R-PID-4).
//!
//! Why watch the raylet: `ray start --block` keeps blocking when the raylet
//! exits gracefully (exit 0 or SIGTERM), so the child's own exit is not a
//! reliable signal of the node's death.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid as NixPid;
use sysinfo::{Pid, ProcessRefreshKind, ProcessStatus, ProcessesToUpdate, System};
use tracing::{debug, info};

/// One process seen in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
    pub zombie: bool,
    /// Its real user id, when the scan read it ([`ProcTree::refresh_with_users`]).
    pub uid: Option<u32>,
}

/// A snapshot of the processes on this machine (or PID namespace).
pub struct ProcTree {
    sys: System,
}

impl Default for ProcTree {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcTree {
    /// Creates an empty snapshot; call [`ProcTree::refresh`] before use.
    ///
    /// sysinfo by default keeps each process's `/proc/<pid>/stat` open
    /// between refreshes (up to half the fd limit: hundreds of files in a
    /// Ray node, for the agent's whole life); the tree is scanned only
    /// until the daemons are watched by pidfd, and at sweeps, so the files
    /// are opened per scan instead.
    pub fn new() -> Self {
        static NO_CACHED_FILES: std::sync::Once = std::sync::Once::new();
        NO_CACHED_FILES.call_once(|| {
            sysinfo::set_open_files_limit(0);
        });
        Self { sys: System::new() }
    }

    /// Re-reads the process list (names and parents only), from nothing:
    /// sysinfo reads a known process's name only when it first sees it
    /// (a pid with the same start time keeps its old name), so a daemon
    /// caught between fork and exec (`ray start`'s Popen) would keep its
    /// parent's name for good and never be watched. Every process's
    /// `/proc/<pid>/stat` is read on each scan either way.
    pub fn refresh(&mut self) {
        self.sys = System::new();
        self.sys.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            ProcessRefreshKind::nothing(),
        );
    }

    /// Re-reads the process list with each process's user (from nothing,
    /// as [`ProcTree::refresh`]).
    pub fn refresh_with_users(&mut self) {
        self.sys = System::new();
        self.sys.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            ProcessRefreshKind::nothing().with_user(sysinfo::UpdateKind::Always),
        );
    }

    fn all(&self) -> Vec<ProcInfo> {
        self.sys
            .processes()
            .values()
            .filter(|p| p.thread_kind().is_none())
            .map(|p| ProcInfo {
                pid: p.pid().as_u32(),
                ppid: p.parent().map(Pid::as_u32).unwrap_or(0),
                name: p.name().to_string_lossy().into_owned(),
                zombie: matches!(p.status(), ProcessStatus::Zombie | ProcessStatus::Dead),
                uid: p.user_id().map(|u| **u),
            })
            .collect()
    }

    /// Returns every descendant of `root` (not `root` itself).
    pub fn descendants(&self, root: u32) -> Vec<ProcInfo> {
        descendants_of(&self.all(), root)
    }
}

/// Returns the descendants of `root` among `procs` (pure, for tests).
pub fn descendants_of(procs: &[ProcInfo], root: u32) -> Vec<ProcInfo> {
    let mut children: HashMap<u32, Vec<&ProcInfo>> = HashMap::new();
    for p in procs {
        if p.pid != p.ppid {
            children.entry(p.ppid).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        if let Some(kids) = children.get(&pid) {
            for k in kids {
                if k.pid != root && out.len() < 100_000 {
                    out.push((*k).clone());
                    stack.push(k.pid);
                }
            }
        }
    }
    out
}

/// Watches Ray's essential daemons among the descendants of `ray start`.
#[derive(Debug, Clone)]
pub struct RayWatch {
    /// Process names whose death is the node's death.
    names: Vec<&'static str>,
    seen: HashMap<&'static str, u32>,
}

impl RayWatch {
    /// Watches the raylet, and the gcs_server too on the head.
    pub fn new(head: bool) -> Self {
        let mut names = vec!["raylet"];
        if head {
            names.push("gcs_server");
        }
        Self {
            names,
            seen: HashMap::new(),
        }
    }

    /// Updates from the descendants of `ray start`; returns the name and
    /// pid of a watched daemon that was seen before and is now gone or a
    /// zombie.
    pub fn check(&mut self, descendants: &[ProcInfo]) -> Option<(&'static str, u32)> {
        for name in self.names.clone() {
            // A daemon's own fork before its exec (the raylet starting a
            // worker) carries the daemon's name too: the daemon is the one
            // whose parent is not of that name.
            let forked_by_namesake = |p: &ProcInfo| {
                descendants
                    .iter()
                    .any(|q| q.pid == p.ppid && q.name == name)
            };
            let live = descendants
                .iter()
                .find(|p| p.name == name && !p.zombie && !forked_by_namesake(p));
            if live.is_none() {
                // Died before it was first seen: its zombie still tells.
                if let Some(z) = descendants.iter().find(|p| p.name == name && p.zombie) {
                    return Some((name, z.pid));
                }
            }
            match (live, self.seen.get(name)) {
                (Some(p), Some(&pid)) if p.pid == pid => {}
                (Some(p), _) => {
                    debug!(name, pid = p.pid, "watching ray daemon");
                    self.seen.insert(name, p.pid);
                }
                (None, Some(&pid)) => return Some((name, pid)),
                (None, None) => {}
            }
        }
        None
    }

    /// Returns every watched daemon with its pid, once all were seen.
    pub fn all_seen(&self) -> Option<Vec<(&'static str, u32)>> {
        self.names
            .iter()
            .map(|&n| self.seen.get(n).map(|&pid| (n, pid)))
            .collect()
    }

    /// Returns the pid of a watched daemon once seen.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.seen.get(name).copied()
    }
}

/// Sends SIGKILL to every descendant of this process, repeatedly, until
/// none is left alive or `deadline` passes; returns how many were killed.
/// Zombies are left to the reaper.
pub fn sweep_descendants(tree: &mut ProcTree, deadline: Duration) -> usize {
    sweep(tree, deadline, None)
}

/// [`sweep_descendants`], and also every process of the user `uid` that is
/// not this process's descendant (R-SEC-9: a job's double-forked daemon, a
/// process an engine container sharing this PID namespace left, a `docker
/// exec` of the Ray user), but only when this process is PID 1 of its own
/// PID namespace, where every process is the node's; never for uid 0 or
/// this process's own uid.
pub fn sweep_descendants_and_user(tree: &mut ProcTree, deadline: Duration, uid: u32) -> usize {
    let uid = user_to_sweep(uid, nix::unistd::getuid().as_raw(), std::process::id());
    sweep(tree, deadline, uid)
}

/// Kills, once, every process of the user `uid` that this process adopted
/// and did not start (`own` says which of its children it started), and
/// what each of those started (R-SEC-9: a job's double-forked daemon, a
/// `nohup` an operator's `docker exec -u ray` left: their parent died and
/// the kernel gave them to PID 1; Ray's own processes are all descendants
/// of `ray start`). Only PID 1 of its own PID namespace does, as
/// [`sweep_descendants_and_user`], and only processes in its own cgroup:
/// an engine container that shares the node's PID namespace runs as the
/// Ray user too, and its orphans are PID 1's as well, but they live in the
/// engine's cgroup and end with their container (a sweep without this
/// rule coincided with live Serve replicas answering 500). Returns how
/// many it killed.
pub fn kill_adopted(tree: &mut ProcTree, uid: u32, own: impl Fn(u32) -> bool) -> usize {
    let me = std::process::id();
    let Some(uid) = user_to_sweep(uid, nix::unistd::getuid().as_raw(), me) else {
        return 0;
    };
    // Without our own cgroup nothing can be told apart: take nothing.
    let Some(node) = cgroup_of("self") else {
        return 0;
    };
    let in_node = |pid: u32| cgroup_of(&pid.to_string()).as_deref() == Some(node.as_str());
    tree.refresh_with_users();
    let doomed = adopted(&tree.all(), me, uid, own, in_node);
    for p in &doomed {
        info!(pid = p.pid, ppid = p.ppid, name = %p.name, uid, "killing an adopted process of the ray user");
        let _ = signal::kill(NixPid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
    doomed.len()
}

/// The whole of `/proc/<pid>/cgroup` (every hierarchy's line), or None when
/// it cannot be read (the process is gone).
fn cgroup_of(pid: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
}

/// The live processes of `uid` among `all` that `me` adopted and did not
/// start (`own`), and their descendants of that user, each only if it is in
/// the node's cgroup (`in_node`) (pure, for tests).
pub fn adopted(
    all: &[ProcInfo],
    me: u32,
    uid: u32,
    own: impl Fn(u32) -> bool,
    in_node: impl Fn(u32) -> bool,
) -> Vec<ProcInfo> {
    let mine = |p: &ProcInfo| p.uid == Some(uid) && !p.zombie && in_node(p.pid);
    let mut out: Vec<ProcInfo> = Vec::new();
    for p in all {
        if p.ppid == me && p.pid != me && mine(p) && !own(p.pid) {
            out.push(p.clone());
            out.extend(descendants_of(all, p.pid).into_iter().filter(mine));
        }
    }
    out.sort_by_key(|p| p.pid);
    out.dedup_by_key(|p| p.pid);
    out
}

/// An idle Ray worker process of an engine container: a process of the Ray
/// user in the node's PID namespace but not in the node's cgroup (an engine
/// started with `--pid host` shares the namespace and has its own cgroup)
/// whose title is Ray's idle worker's, `ray::IDLE`. The agent cannot read
/// such a process's open files (root in a node has no CAP_SYS_PTRACE), so
/// which Ray worker it is, and whether it was ever given work, is asked as
/// the Ray user (node/src/actor_reaper.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EngineWorker {
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/<pid>/stat`): a pid
    /// and its start time name one process.
    pub start: u64,
}

/// The idle engine workers in this PID namespace whose processes run as
/// `uid` (none when the agent's own cgroup cannot be read). Reads only
/// world-readable files of `/proc`.
pub fn idle_engine_workers(uid: u32) -> Vec<EngineWorker> {
    use std::os::unix::fs::MetadataExt;
    let Some(node) = cgroup_of("self") else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // The owner of /proc/<pid> is the process's effective user.
        if e.metadata().ok().map(|m| m.uid()) != Some(uid) {
            continue;
        }
        if !std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_idle_title(&c)) {
            continue;
        }
        match cgroup_of(&pid.to_string()) {
            Some(c) if c != node => {}
            _ => continue,
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if let Some(start) = start_time(&stat) {
            out.push(EngineWorker { pid, start });
        }
    }
    out.sort_by_key(|w| w.pid);
    out
}

/// True if `cmdline` (as `/proc/<pid>/cmdline` holds it) is the title Ray
/// gives an idle worker: `ray::IDLE`, then nothing, NULs or spaces (pure).
pub fn is_idle_title(cmdline: &[u8]) -> bool {
    cmdline
        .strip_prefix(b"ray::IDLE")
        .is_some_and(|rest| rest.iter().all(|&b| b == 0 || b == b' '))
}

/// The start time (field 22) of a `/proc/<pid>/stat` line (pure); the
/// command name (field 2, in parentheses) may hold anything, so fields are
/// counted after its last `)`.
pub fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The user a sweep by `uid` may take, for a process of `pid` running as
/// `mine`: only PID 1 of its own namespace sweeps by user (in a node's PID
/// namespace every process is the node's; a node started with `--pid host`
/// is not PID 1, and its host's processes are left alone).
fn user_to_sweep(uid: u32, mine: u32, pid: u32) -> Option<u32> {
    (pid == 1 && uid != 0 && uid != mine).then_some(uid)
}

fn sweep(tree: &mut ProcTree, deadline: Duration, uid: Option<u32>) -> usize {
    let me = std::process::id();
    let until = Instant::now() + deadline;
    let mut killed = std::collections::HashSet::new();
    loop {
        match uid {
            Some(_) => tree.refresh_with_users(),
            None => tree.refresh(),
        }
        let all = tree.all();
        let alive = targets(&all, me, uid);
        if alive.is_empty() || Instant::now() >= until {
            if !alive.is_empty() {
                info!(
                    left = alive.len(),
                    "descendants still alive after sweep deadline"
                );
            }
            return killed.len();
        }
        for p in alive {
            if killed.insert(p.pid) {
                info!(pid = p.pid, name = %p.name, uid = ?p.uid, "killing leftover process");
            }
            let _ = signal::kill(NixPid::from_raw(p.pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live processes a sweep kills: `me`'s descendants, and with `uid`
/// every other process of that user but `me` and PID 1.
fn targets(all: &[ProcInfo], me: u32, uid: Option<u32>) -> Vec<ProcInfo> {
    let mut out: Vec<ProcInfo> = descendants_of(all, me);
    if let Some(uid) = uid {
        for p in all {
            if p.uid == Some(uid)
                && p.pid != me
                && p.pid != 1
                && !out.iter().any(|d| d.pid == p.pid)
            {
                out.push(p.clone());
            }
        }
    }
    out.retain(|p| !p.zombie);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rays_idle_title_counts_as_idle() {
        for idle in [
            &b"ray::IDLE"[..],
            b"ray::IDLE\0",
            b"ray::IDLE   \0\0",
            b"ray::IDLE ",
        ] {
            assert!(is_idle_title(idle), "{idle:?}");
        }
        for busy in [
            &b"ray::ServeReplica:drain:EngineStub"[..],
            b"ray::task",
            b"ray::IDLEX",
            b"ray::IDLE\0--flag",
            b"ray::idle",
            b"python\0ray::IDLE",
            b" ray::IDLE",
            b"",
        ] {
            assert!(!is_idle_title(busy), "{busy:?}");
        }
    }

    #[test]
    fn a_start_time_is_read_after_the_last_parenthesis() {
        let stat =
            "4986 (ray::IDLE) S 1 4986 4986 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 123456 1 2";
        assert_eq!(start_time(stat), Some(123456));
        // A name with spaces and parentheses of its own.
        let stat = "77 (a) b) c (d)) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 9";
        assert_eq!(start_time(stat), Some(42));
        assert_eq!(start_time("77 (x) R 1"), None);
        assert_eq!(start_time(""), None);
    }

    #[test]
    fn an_idle_title_in_the_agents_own_cgroup_is_no_engine_worker() {
        // A child of this test, titled as Ray's idle worker, in this
        // process's (the agent's) cgroup.
        let me = nix::unistd::getuid().as_raw();
        let mut child = std::process::Command::new("bash")
            .args(["-c", "exec -a ray::IDLE cat"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_idle_title(&c)) {
            assert!(Instant::now() < deadline, "the child never took the title");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(idle_engine_workers(me).iter().all(|w| w.pid != pid));
        let _ = child.kill();
        let _ = child.wait();
    }

    fn p(pid: u32, ppid: u32, name: &str, zombie: bool) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            name: name.into(),
            zombie,
            uid: Some(0),
        }
    }

    #[test]
    fn only_adopted_processes_of_the_user_and_what_they_started_are_taken() {
        let with_uid = |pid, ppid, uid| ProcInfo {
            uid: Some(uid),
            ..p(pid, ppid, "x", false)
        };
        // PID 1 (uid 0) started 10 (ray start, uid 1000) and 20 (a podman
        // handler, root); 30 and 40 are the Ray user's and were adopted (a
        // job's daemon, with its child 31; and 41 of another user under
        // 40); 50 is a `docker exec` (parent outside the namespace); 60 is
        // another user's orphan; 70 a zombie orphan.
        let procs = vec![
            with_uid(1, 0, 0),
            with_uid(10, 1, 1000),
            with_uid(11, 10, 1000),
            with_uid(20, 1, 0),
            with_uid(30, 1, 1000),
            with_uid(31, 30, 1000),
            with_uid(40, 1, 1000),
            with_uid(41, 40, 0),
            with_uid(50, 0, 1000),
            with_uid(60, 1, 1001),
            ProcInfo {
                zombie: true,
                ..with_uid(70, 1, 1000)
            },
        ];
        let own = |pid| pid == 10 || pid == 20;
        let everywhere = |_| true;
        let got: Vec<u32> = adopted(&procs, 1, 1000, own, everywhere)
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![30, 31, 40]);
        // Nothing is adopted when every child is one it started.
        assert!(adopted(&procs, 1, 1000, |pid| pid != 1, everywhere).is_empty());
        // 40 and 31 are an engine container's (another cgroup): an
        // orphan of the engine is PID 1's in a shared PID namespace, but
        // it ends with its container and is never taken.
        let node = |pid| pid != 40 && pid != 31;
        let got: Vec<u32> = adopted(&procs, 1, 1000, own, node)
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![30]);
    }

    #[test]
    fn a_sweep_with_a_user_takes_that_users_other_processes_but_never_pid_1_or_itself() {
        let with_uid = |pid, ppid, uid| ProcInfo {
            uid: Some(uid),
            ..p(pid, ppid, "x", false)
        };
        let procs = vec![
            with_uid(1, 0, 1000),
            with_uid(5, 1, 0),
            with_uid(10, 5, 1000),
            with_uid(11, 10, 0),
            with_uid(20, 0, 1000),
            with_uid(21, 20, 1000),
            with_uid(30, 0, 999),
            ProcInfo {
                zombie: true,
                ..with_uid(40, 0, 1000)
            },
        ];
        let pids = |v: Vec<ProcInfo>| {
            let mut v: Vec<u32> = v.iter().map(|p| p.pid).collect();
            v.sort();
            v
        };
        assert_eq!(pids(targets(&procs, 5, None)), vec![10, 11]);
        assert_eq!(pids(targets(&procs, 5, Some(1000))), vec![10, 11, 20, 21]);
        // By user only as PID 1, and never root or itself.
        assert_eq!(user_to_sweep(1000, 0, 1), Some(1000));
        assert_eq!(user_to_sweep(1000, 0, 4242), None);
        assert_eq!(user_to_sweep(0, 0, 1), None);
        assert_eq!(user_to_sweep(990, 990, 1), None);
    }

    #[test]
    fn descendants_follow_the_parent_chain() {
        let procs = vec![
            p(1, 0, "argus", false),
            p(10, 1, "ray", false),
            p(11, 10, "raylet", false),
            p(12, 11, "worker", false),
            p(20, 1, "other", false),
        ];
        let mut d: Vec<u32> = descendants_of(&procs, 10).iter().map(|p| p.pid).collect();
        d.sort();
        assert_eq!(d, vec![11, 12]);
    }

    #[test]
    fn ray_watch_takes_the_daemon_not_its_fork_before_exec() {
        let mut w = RayWatch::new(false);
        // The raylet's child between fork and exec, listed first.
        let forking = vec![p(13, 11, "raylet", false), p(11, 10, "raylet", false)];
        assert_eq!(w.check(&forking), None);
        assert_eq!(w.pid_of("raylet"), Some(11));
        // The child exec'd and exited: the raylet is still the one watched.
        assert_eq!(w.check(&[p(11, 10, "raylet", false)]), None);
        assert_eq!(w.pid_of("raylet"), Some(11));
        // The raylet died, its fork not yet exec'd: that is the death.
        let died = vec![p(13, 11, "raylet", false), p(11, 10, "raylet", true)];
        assert_eq!(w.check(&died), Some(("raylet", 11)));
    }

    #[test]
    fn ray_watch_reports_a_dead_or_zombie_raylet_only_after_seeing_it() {
        let mut w = RayWatch::new(true);
        assert_eq!(w.check(&[]), None, "not yet started is not dead");
        let up = vec![p(11, 10, "raylet", false), p(12, 10, "gcs_server", false)];
        assert_eq!(w.check(&up), None);
        assert_eq!(w.pid_of("gcs_server"), Some(12));
        let zombie = vec![p(11, 10, "raylet", true), p(12, 10, "gcs_server", false)];
        assert_eq!(w.check(&zombie), Some(("raylet", 11)));
        let mut w = RayWatch::new(true);
        w.check(&up);
        assert_eq!(
            w.check(&[p(11, 10, "raylet", false)]),
            Some(("gcs_server", 12))
        );
        let mut w = RayWatch::new(false);
        assert_eq!(w.check(&[p(11, 10, "raylet", false)]), None);
        assert_eq!(w.check(&[]), Some(("raylet", 11)));
    }
}

#[cfg(test)]
mod live_tests {
    use super::*;

    #[test]
    fn tree_sees_a_real_child_and_its_zombie_state() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut t = ProcTree::new();
        t.refresh();
        let d = t.descendants(std::process::id());
        assert!(
            d.iter()
                .any(|p| p.pid == child.id() && p.name == "sleep" && !p.zombie),
            "{d:?}"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A process first seen before its exec is seen under its new name
    /// after it (the raylet, caught by a scan between `ray start`'s fork
    /// and exec, must still be found as `raylet`).
    #[test]
    fn a_process_seen_before_its_exec_is_seen_by_its_new_name_after_it() {
        use std::io::Write;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read go; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let name_in = |t: &ProcTree| {
            t.descendants(std::process::id())
                .into_iter()
                .find(|p| p.pid == pid)
                .map(|p| p.name)
        };
        let mut t = ProcTree::new();
        t.refresh();
        assert_eq!(name_in(&t).as_deref(), Some("sh"));
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
        let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        while comm().trim() != "sleep" {
            assert!(Instant::now() < deadline, "the shell never exec'd sleep");
            std::thread::sleep(Duration::from_millis(5));
        }
        t.refresh();
        assert_eq!(name_in(&t).as_deref(), Some("sleep"));
        t.refresh_with_users();
        assert_eq!(name_in(&t).as_deref(), Some("sleep"));
        let _ = child.kill();
        let _ = child.wait();
    }
}
