//! R-SEC-2 and issue 26 (road 2, hole 5), written from the rule: no root
//! process writes through a path another user can change; shared state is
//! written by the agent's own identity (ARGUS_AGENT_USER), which has no
//! root override for files; forged discovery state moves neither the head
//! nor the workers.
//!
//! The effects checked are files' owners and contents, root-owned canaries
//! (content and mtime), the fake ray's starts and stops, the exit code.
//! Needs root (CI runs tests as root): the attacker is uid 1000 (gid 100,
//! no groups), the Ray user of the node image; the writer is uid 4242.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::{publish, HeadRecord};
use support::{Agent, Sandbox};

const AGENT: (u32, u32) = (4242, 4243);
const RAY: (u32, u32) = (1000, 100);

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

macro_rules! need_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

fn chown(p: &Path, (u, g): (u32, u32)) {
    std::os::unix::fs::chown(p, Some(u), Some(g)).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A sandbox every uid can traverse (tempdirs are 0700).
fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    chmod(sb.path(), 0o755);
    sb
}

/// Runs `script` with sh as the Ray user (uid 1000, gid 100, no groups);
/// returns whether it exited 0.
fn as_ray_user(script: &str) -> bool {
    Command::new("/bin/sh")
        .args(["-c", script])
        .uid(RAY.0)
        .gid(RAY.1)
        .status()
        .unwrap()
        .success()
}

/// Root-owned canaries: a folder with one file, and a file.
struct Canary {
    dir: PathBuf,
    file: PathBuf,
    before: Vec<(PathBuf, Vec<u8>, i64, i64)>,
}

impl Canary {
    fn new(sb: &Sandbox) -> Self {
        let dir = sb.path().join("canary-dir");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("keep.txt"), b"root's own\n").unwrap();
        let file = sb.path().join("canary-file");
        std::fs::write(&file, b"root's canary\n").unwrap();
        let mut c = Canary {
            dir,
            file,
            before: Vec::new(),
        };
        c.before = c.snapshot();
        c
    }

    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>, i64, i64)> {
        let mut out = Vec::new();
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        paths.push(self.file.clone());
        paths.push(self.dir.clone());
        paths.sort();
        for p in paths {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let bytes = if m.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            out.push((p, bytes, m.mtime(), m.mtime_nsec()));
        }
        out
    }

    fn changed(&self) -> bool {
        self.snapshot() != self.before
    }
}

fn head_env(sb: &Sandbox, name: &str) -> std::collections::BTreeMap<String, String> {
    let mut env = sb.env(name, "head");
    env.insert(
        "ARGUS_AGENT_USER".into(),
        format!("{}:{}", AGENT.0, AGENT.1),
    );
    env
}

/// The agent as root, writing as ARGUS_AGENT_USER=4242 into a discovery
/// folder that uid owns: it publishes, and every file and folder it made
/// there is owned by 4242 (a writer without CAP_DAC_OVERRIDE: the same uid
/// an NFS server with root squash would see).
#[test]
fn the_agent_writes_discovery_state_as_its_writer_identity() {
    need_root!();
    let sb = sandbox();
    let ray = sb.shared().join("ray");
    std::fs::create_dir(&ray).unwrap();
    chown(&ray, AGENT);
    // The opt-in copy of the log on the share, in a folder of the agent's.
    let logs = sb.shared().join("logs");
    std::fs::create_dir(&logs).unwrap();
    chown(&logs, AGENT);
    let mut env = head_env(&sb, "h");
    env.insert("ARGUS_LOG_DIR".into(), logs.display().to_string());
    let mut a = Agent::start(&sb, "h", &env);
    a.wait_for("record", Duration::from_secs(20), |_| sb.record().is_some());
    let log_file = logs.join(log_file_name("head"));
    let m = std::fs::symlink_metadata(&log_file)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", log_file.display(), a.log()));
    assert_eq!((m.uid(), m.gid()), AGENT, "the log copy's owner");
    assert!(std::fs::read_to_string(&log_file)
        .unwrap()
        .contains("node agent started"));
    let disc = sb.head_file().parent().unwrap().to_path_buf();
    let mut made = Sandbox::files_under(&ray);
    made.extend([
        ray.join("discovery"),
        disc.clone(),
        disc.join("epochs"),
        disc.join(".staging"),
    ]);
    assert!(made.contains(&sb.head_file()) && made.contains(&disc.join("epochs/1")));
    for p in &made {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            AGENT,
            "{} is not owned by the writer identity",
            p.display()
        );
    }
    // The reader side (`argus-agent head`) takes the record it wrote.
    let out = support::run_bin(&["head", "--json"], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.signal(libc::SIGTERM);
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)).unwrap().0.code(),
        Some(0)
    );
}

/// A discovery folder (or a folder above it) owned by another uid, or
/// writable by others, is exit 78 naming it; nothing is written under it.
#[test]
fn a_discovery_path_another_user_controls_is_exit_78_with_nothing_written() {
    need_root!();
    for (case, owner, mode) in [
        ("ray owned by uid 5555", (5555, 5555), 0o755),
        ("ray owned by the Ray user", RAY, 0o755),
        ("ray root's but world-writable", (0, 0), 0o777),
        ("ray the agent's but group-writable", AGENT, 0o775),
    ] {
        let sb = sandbox();
        let ray = sb.shared().join("ray");
        std::fs::create_dir(&ray).unwrap();
        chown(&ray, owner);
        chmod(&ray, mode);
        let env = head_env(&sb, "h");
        let mut a = Agent::start(&sb, "h", &env);
        let (status, _) = a
            .wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{case}: the agent did not exit\n{}", a.log()));
        let log = a.log();
        assert_eq!(status.code(), Some(78), "{case}\n{log}");
        assert!(
            log.contains(&format!("{} is owned by uid {}", ray.display(), owner.0)),
            "{case}: the error names the folder and its owner\n{log}"
        );
        assert_eq!(
            Sandbox::files_under(&ray),
            Vec::<PathBuf>::new(),
            "{case}: something was written"
        );
        assert_eq!(std::fs::read_dir(&ray).unwrap().count(), 0, "{case}");
    }
    // An agent that is not root cannot write as another uid: refused.
    let sb = sandbox();
    let mut env = head_env(&sb, "h");
    env.insert("ARGUS_AGENT_USER".into(), "4242:4243".into());
    let mut a = Agent::start_with(
        &sb,
        "h",
        &env,
        &[
            "setpriv",
            "--reuid",
            "1000",
            "--regid",
            "100",
            "--clear-groups",
        ],
    );
    let (status, _) = a.wait_exit(Duration::from_secs(20)).unwrap();
    assert_eq!(status.code(), Some(78), "{}", a.log());
    assert!(
        a.log().contains("ARGUS_AGENT_USER 4242:4243"),
        "{}",
        a.log()
    );
    // The head cannot make its folders in a root-owned 0755 /private: a
    // writer without root's override is refused (78), nothing appears.
    let sb = sandbox();
    let mut a = Agent::start(&sb, "h", &head_env(&sb, "h"));
    let (status, _) = a.wait_exit(Duration::from_secs(20)).unwrap();
    assert_eq!(status.code(), Some(78), "{}", a.log());
    assert_eq!(std::fs::read_dir(sb.shared()).unwrap().count(), 0);
}

/// Today's log file name of agent `role` (UTC date, as the agent names it).
fn log_file_name(role: &str) -> String {
    let host = hostname();
    let day = argus_discovery::record::rfc3339(SystemTime::now())[..10].to_string();
    format!("argus-agent-{host}-{role}.log.{day}")
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Road 2, from the rule: the shared root laid out as before the fix
/// (`/private` the Ray user's, the agent's folders root's inside it, logs
/// and preflight reports under it). For every component of the discovery,
/// log and preflight-report paths, the Ray user renames the real one away
/// and plants, in a folder it owns, a symlink to a root-owned canary (a
/// folder, or a file for the last component), then the agent restarts
/// (a real restart). The canaries must stay as they were, and the agent
/// must refuse (78) or write only to its own trusted place.
#[test]
fn planted_links_at_every_component_are_never_written_through_after_a_restart() {
    need_root!();
    // (path under the shared root, is the last component a file)
    let disc = "ray/discovery/argus-ray";
    let log = log_file_name("head");
    let paths: Vec<(Vec<String>, bool)> = vec![
        (split(&format!("{disc}/head.json")), true),
        (split(&format!("{disc}/epochs")), false),
        (split(&format!("{disc}/.staging")), false),
        (split(&format!("common/logs/{log}")), true),
        (split("common/logs/preflight"), false),
    ];
    let mut cases = Vec::new();
    for (comps, last_is_file) in &paths {
        for k in 0..comps.len() {
            let to_file = *last_is_file && k == comps.len() - 1;
            let case = (comps[..=k].to_vec(), to_file);
            if !cases.contains(&case) {
                cases.push(case);
            }
        }
    }
    let mut failures = Vec::new();
    for (comps, to_file) in cases {
        let case = comps.join("/");
        let sb = sandbox();
        let shared = sb.shared();
        let canary = Canary::new(&sb);
        let mut env = sb.env("h", "head");
        env.insert(
            "ARGUS_LOG_DIR".into(),
            shared.join("common/logs").display().to_string(),
        );
        // First run, as before: the agent makes its folders (root's).
        for d in ["ray", "common/logs/preflight"] {
            std::fs::create_dir_all(shared.join(d)).unwrap();
        }
        let mut a = Agent::start(&sb, "h", &env);
        a.wait_for("record", Duration::from_secs(20), |_| sb.record().is_some());
        a.signal(libc::SIGTERM);
        a.wait_exit(Duration::from_secs(10)).unwrap();
        // The image before the fix: /private is the Ray user's.
        chown(&shared, RAY);
        // The Ray user's move: its own copy of the folders above the
        // component (the real top folder renamed away: /private is its),
        // and the component a link to the canary.
        let target = if to_file { &canary.file } else { &canary.dir };
        let top = &comps[0];
        let mut script = format!(
            "set -e; cd '{}'; mv '{top}' '{top}.away'; ",
            shared.display()
        );
        let parent = comps[..comps.len() - 1].join("/");
        if !parent.is_empty() {
            script.push_str(&format!("mkdir -p '{parent}'; "));
        }
        script.push_str(&format!(
            "ln -s '{}' '{}'",
            target.display(),
            comps.join("/")
        ));
        assert!(as_ray_user(&script), "{case}: the Ray user could not plant");
        // The restart.
        let mut a = Agent::start(&sb, "h", &env);
        let exited = a.wait_exit(Duration::from_secs(6));
        let log = a.log();
        if exited.is_none() {
            a.signal(libc::SIGTERM);
            a.wait_exit(Duration::from_secs(10));
        }
        if canary.changed() {
            failures.push(format!("{case}: run wrote through the link"));
        }
        // The shared root is the Ray user's: the agent must refuse it.
        let code = exited.and_then(|(s, _)| s.code());
        if code != Some(78) {
            failures.push(format!("{case}: run not refused (exit {code:?})"));
        }
        // The preflight alone writes its report under ARGUS_LOG_DIR.
        let ran_clean = !canary.changed();
        let out = support::run_bin(&["preflight", "--json"], &env);
        if ran_clean && canary.changed() {
            failures.push(format!("{case}: preflight wrote through the link"));
        }
        if out.status.code() != Some(78) {
            failures.push(format!(
                "{case}: preflight not refused (exit {:?})",
                out.status.code()
            ));
        }
        if !failures.is_empty() && log.contains("panicked") {
            failures.push(format!("{case}: {log}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn split(p: &str) -> Vec<String> {
    p.split('/').map(String::from).collect()
}

/// The fixed layout (the image's /private: root's 0755, ray/ the agent
/// user's): the Ray user can rename or plant nothing on the way to the
/// discovery folder, and the agent runs.
#[test]
fn in_the_fixed_layout_the_ray_user_can_plant_nothing() {
    need_root!();
    let sb = sandbox();
    let ray = sb.shared().join("ray");
    std::fs::create_dir(&ray).unwrap();
    chown(&ray, AGENT);
    let env = head_env(&sb, "h");
    let mut a = Agent::start(&sb, "h", &env);
    a.wait_for("record", Duration::from_secs(20), |_| sb.record().is_some());
    let disc = sb.head_file().parent().unwrap().to_path_buf();
    let s = sb.shared().display().to_string();
    for script in [
        format!("mv {s}/ray {s}/ray.away"),
        format!("mkdir {s}/x"),
        format!("mv {0}/ray/discovery {0}/ray/d2", s),
        format!("ln -s /etc {}/evil", disc.display()),
        format!("echo x > {}/epochs/999999999", disc.display()),
        format!("echo x > {}/head.json", disc.display()),
        format!("rm -f {}/head.json", disc.display()),
    ] {
        assert!(!as_ray_user(&script), "the Ray user could: {script}");
    }
    assert!(
        a.status().is_some_and(|s| s["state"] == "running"),
        "{}",
        a.log()
    );
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(10));
}

/// A forged record (instance "forged", holder "attacker").
fn record(ip: &str, port: u16, generation: u64, seq: u64) -> HeadRecord {
    HeadRecord {
        holder_id: "attacker".into(),
        ..support::fakehead::record(ip, port, "forged", generation, seq)
    }
}

/// Hole 5: forged generation claims (a huge one, the one that wrapped
/// `highest + 1` to 0, leading zeros, another owner) never make the live
/// head step down, and it keeps refreshing its own generation. They are
/// planted as root and given to uid 1000 (in the fixed layout uid 1000
/// cannot plant them at all: the test above).
#[test]
fn forged_epochs_do_not_make_the_live_head_step_down() {
    need_root!();
    let sb = sandbox();
    let mut a = Agent::start(&sb, "h", &sb.env("h", "head"));
    a.wait_for("record", Duration::from_secs(20), |_| sb.record().is_some());
    let gen = sb.record().unwrap()["generation"].as_u64().unwrap();
    let epochs = sb.head_file().parent().unwrap().join("epochs");
    for (name, owner) in [
        ("999999999", RAY),
        ("18446744073709551615", RAY),
        ("18446744073709551615", (0, 0)),
        ("0999999999", (0, 0)),
        ("281474976710657", (0, 0)),
    ] {
        let p = epochs.join(name);
        std::fs::write(&p, "attacker\n").unwrap();
        chown(&p, owner);
        let seq = sb.record().unwrap()["seq"].as_u64().unwrap();
        a.wait_for("three more refreshes", Duration::from_secs(10), |_| {
            sb.record()
                .is_some_and(|r| r["seq"].as_u64().unwrap() >= seq + 3)
        });
        let r = sb.record().unwrap();
        assert_eq!(r["generation"].as_u64(), Some(gen), "{name}: {}", a.log());
        assert_eq!(r["state"], "running", "{name}");
        assert!(
            !sb.ray_events("h").iter().any(|e| e["event"] == "stop"),
            "{name} ({owner:?}): the head stopped Ray\n{}",
            a.log()
        );
        assert!(
            a.log().contains("ignoring entries in epochs/"),
            "{}",
            a.log()
        );
        std::fs::remove_file(&p).unwrap();
    }
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(10));
}

/// Hole 5: a forged head.json (another owner; or the agent's owner with
/// an absurd generation) never makes a worker follow it, nor poisons its
/// memory of the highest generation: the real head's record is followed
/// again at once.
#[test]
fn a_forged_head_record_does_not_move_a_worker() {
    need_root!();
    let sb = sandbox();
    let real = |seq| record("127.0.0.5", 4000, 3, seq);
    let file = sb.head_file();
    publish(&file, &real(1).to_bytes()).unwrap();
    sb.write_cluster_token();
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    let mut seq = 1;
    let start = Instant::now();
    while sb.ray_starts("w").is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "{}", w.log());
        seq += 1;
        publish(&file, &real(seq).to_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let forged = [
        (record("127.0.0.66", 4000, 999_999_999, 1), RAY),
        (record("127.0.0.67", 4000, u64::MAX, 1), (0, 0)),
    ];
    for (rec, owner) in forged {
        // Forged bytes, refreshed so they look alive, for 3 s.
        let until = Instant::now() + Duration::from_secs(3);
        let mut s = rec.seq;
        while Instant::now() < until {
            let mut r = rec.clone();
            r.seq = s;
            s += 1;
            let tmp = file.with_extension("forged");
            std::fs::write(&tmp, r.to_bytes()).unwrap();
            chown(&tmp, owner);
            std::fs::rename(&tmp, &file).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
        let starts = sb.ray_starts("w");
        assert_eq!(
            starts.len(),
            1,
            "{}: the worker followed a forged record\n{}",
            rec.head_ip,
            w.log()
        );
        // The real head again: taken (not "older than generation seen").
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            seq += 1;
            publish(&file, &real(seq).to_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
        let st = w.status().unwrap();
        assert_eq!(st["head_generation"].as_u64(), Some(3), "{st}\n{}", w.log());
        assert!(
            !w.log().contains("older than generation 999999999")
                && !w
                    .log()
                    .contains("older than generation 18446744073709551615"),
            "the worker's memory was poisoned\n{}",
            w.log()
        );
    }
    assert_eq!(sb.ray_starts("w").len(), 1, "{}", w.log());
    w.signal(libc::SIGTERM);
    w.wait_exit(Duration::from_secs(10));
}
