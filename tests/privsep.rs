//! Privilege separation, from the attacker's side, on this machine: an
//! agent running as root with `ARGUS_RAY_USER` runs Ray's tree (the fake
//! ray and its "worker") as that user, with no groups, no capabilities and
//! `no_new_privs`; the worker cannot open the Docker socket, ptrace or read
//! the agent's `/proc` files, nor gain root from a setuid file planted in a
//! shared folder; and its `podman` still works, through the agent.

mod shim_support;
mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::Value;
use shim_support::{image, BIN};
use support::{Agent, Sandbox};

/// The Ray user of these tests: `nobody`, which has no access to the
/// Docker socket (root:docker 0660 on this machine).
const RAY_USER: &str = "65534:65534";

/// What the worker tries, as a Python program printing one JSON object.
const WORKER: &str = r#"
import json, os, socket, subprocess, sys
out = {}
st = open("/proc/self/status").read()
field = lambda n: [l.split(":", 1)[1].split() for l in st.splitlines() if l.startswith(n + ":")][0]
out["uid"] = field("Uid")[0]
out["groups"] = field("Groups")
out["no_new_privs"] = field("NoNewPrivs")[0]
out["cap_eff"] = field("CapEff")[0]
def attempt(f):
    try:
        f()
        return "ok"
    except Exception as e:
        return type(e).__name__
out["docker_socket"] = attempt(lambda: socket.socket(socket.AF_UNIX).connect("/var/run/docker.sock"))
def parent(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])
agent = parent(os.getpid())
while not open(f"/proc/{agent}/cmdline").read().split("\0")[0].endswith("argus-agent"):
    agent = parent(agent)
out["agent_pid"] = agent
out["agent_environ"] = attempt(lambda: open(f"/proc/{agent}/environ").read())
out["agent_root"] = attempt(lambda: os.listdir(f"/proc/{agent}/root/"))
out["agent_fd"] = attempt(lambda: os.listdir(f"/proc/{agent}/fd"))
r = subprocess.run([os.environ["PLANTED"], "-u"], capture_output=True, text=True)
out["setuid_euid"] = r.stdout.strip()
r = subprocess.run([os.environ["PODMAN"], "run", "--rm", os.environ["IMG"], "/bin/tool", "id"], capture_output=True, text=True)
out["podman"] = {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
# R-SEC-8: a container of the host that is not this node's, read by every
# spelling, with each logging or runtime variable a caller could set.
victim, name = os.environ["VICTIM_ID"], os.environ["VICTIM_NAME"]
refs = [victim, victim[:12], victim[:4], name]
calls = [[c, r] for c in ("inspect", "logs", "container inspect") for r in refs]
calls += [["ps", "-a", "--no-trunc"], ["images"], ["info"]]
probes = []
for extra in [{}, {"ARGUS_SHIM_LOG": "debug"}, {"ARGUS_SHIM_LOG": "trace"},
              {"RUST_LOG": "trace"}, {"RUST_BACKTRACE": "full"}]:
    for c in calls:
        argv = [os.environ["PODMAN"]] + c[0].split() + c[1:]
        r = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **extra))
        probes.append({"call": c, "env": extra, "code": r.returncode, "out": r.stdout + r.stderr})
out["probes"] = probes
print(json.dumps(out))
"#;

#[test]
fn rays_tree_is_confined_and_podman_goes_through_the_agent() {
    let img = image();
    let sb = Sandbox::new();
    // The fake ray and its worker run as nobody: let them write here.
    for d in [sb.path().to_path_buf(), sb.shared(), sb.bindir()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let bindir = sb.path().join("podman-bin");
    std::fs::create_dir_all(&bindir).unwrap();
    std::os::unix::fs::symlink(BIN, bindir.join("podman")).unwrap();
    // What an engine container running as root can leave in a shared
    // folder: a setuid-root copy of `id`.
    let planted = sb.shared().join("rs");
    std::fs::copy("/usr/bin/id", &planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Control: without no_new_privs the planted file does give root.
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&planted)
        .arg("-u")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "0",
        "the planted setuid file should give euid 0 without no_new_privs: {o:?}"
    );
    // A container of the host that no node of this test owns, with a
    // secret in its environment.
    let secret = format!("VICTIM_SECRET={}", shim_support::unique("secret"));
    let victim_name = shim_support::unique("victim");
    let o = shim_support::docker(&[
        "run",
        "-d",
        "--name",
        &victim_name,
        "--label",
        "argus-test-victim=1",
        "-e",
        &secret,
        img,
        "/bin/tool",
        "sleep",
        "600",
    ]);
    assert!(o.status.success(), "{}", shim_support::show(&o));
    let victim = shim_support::stdout(&o).trim().to_string();
    let _victim_gone = Removes(vec![victim.clone()]);
    // Control: the probe's secret is there to be read, by the host.
    let o = shim_support::docker(&["inspect", &victim]);
    assert!(
        shim_support::stdout(&o).contains(&secret),
        "{}",
        shim_support::show(&o)
    );
    let script = sb.path().join("worker.py");
    std::fs::write(&script, WORKER).unwrap();
    let out = sb.path().join("worker.json");
    let mut env = sb.env("head", "head");
    env.insert("ARGUS_RAY_USER".into(), RAY_USER.into());
    env.insert(
        "FAKE_RAY_RUN".into(),
        format!("python3 {}", script.display()),
    );
    env.insert("FAKE_RAY_RUN_OUT".into(), out.display().to_string());
    env.insert("PLANTED".into(), planted.display().to_string());
    env.insert("PODMAN".into(), bindir.join("podman").display().to_string());
    env.insert("IMG".into(), img.to_string());
    env.insert("VICTIM_ID".into(), victim.clone());
    env.insert("VICTIM_NAME".into(), victim_name.clone());
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
    assert_eq!(w["agent_pid"], agent.pid(), "{w}");
    assert_eq!(w["uid"], "65534", "{w}");
    assert_eq!(w["groups"], serde_json::json!([]), "{w}");
    assert_eq!(w["no_new_privs"], "1", "{w}");
    assert_eq!(w["cap_eff"], "0000000000000000", "{w}");
    assert_eq!(w["docker_socket"], "PermissionError", "{w}");
    for f in ["agent_environ", "agent_root", "agent_fd"] {
        assert_eq!(w[f], "PermissionError", "{f}: {w}");
    }
    assert_eq!(
        w["setuid_euid"], "65534",
        "the planted setuid file gave root: {w}"
    );
    // Through the agent, podman works, and the engine runs as the caller.
    assert_eq!(w["podman"]["code"], 0, "{w}");
    assert_eq!(w["podman"]["stdout"], "65534:65534\n", "{w}");
    // No spelling, log filter or runtime variable of the caller shows the
    // other container's secret (R-SEC-8): each answer is "no such".
    let probes = w["probes"].as_array().expect("probes");
    assert_eq!(probes.len(), 5 * 15, "{w}");
    for p in probes {
        let out = p["out"].as_str().unwrap_or_default();
        let by_ref = p["call"].as_array().map_or(0, |c| c.len()) == 2 && p["call"][0] != "ps";
        let full_id_asked = p["call"][1] == victim.as_str();
        assert!(
            !out.contains(&secret) && (full_id_asked || !out.contains(&victim)),
            "a podman call showed a container of the host that is not the node's: {p}"
        );
        if by_ref {
            assert_ne!(p["code"], 0, "a call on another's container succeeded: {p}");
        }
    }
}

/// Removes containers when dropped (the test's own, even when it fails).
struct Removes(Vec<String>);

impl Drop for Removes {
    fn drop(&mut self) {
        shim_support::force_remove(&self.0);
    }
}

#[test]
fn ray_user_settings_are_checked_before_anything_starts() {
    let sb = Sandbox::new();
    let env = sb.env("head", "head");
    for (user, as_nobody, why) in [
        ("no-such-user-argus", false, "no user"),
        ("4242", false, "4242:GID"),
        ("root:no-such-group-argus", false, "no group"),
        // An agent that is not root cannot run Ray as another user.
        ("0", true, "not root"),
    ] {
        let mut cmd = if as_nobody {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
            c
        } else {
            std::process::Command::new(BIN)
        };
        let o = cmd
            .arg("config")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&env)
            .env("ARGUS_RAY_USER", user)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(78), "{user}: {err}");
        assert!(
            err.contains("ARGUS_RAY_USER") && err.contains(why),
            "{user}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{user}: {err}");
    }
}

/// Returns the resident memory of process `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn a_flood_of_silent_and_garbage_clients_costs_the_agent_nothing_lasting() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let sb = Sandbox::new();
    let env = sb.env("head", "head");
    let mut agent = Agent::start(&sb, "head", &env);
    let sock = agent.state_dir.join("shim.sock");
    agent.wait_for("the broker's socket", Duration::from_secs(60), |_| {
        sock.exists()
    });
    let idle = rss_kib(agent.pid());
    // 300 clients that connect and never send: each gets a handler that
    // waits for its request (at most the request deadline, R-SEC-5), and
    // none is refused (384 calls from outside any Ray job, 512 per uid).
    let silent: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    let refused = 0;
    let flooded = rss_kib(agent.pid());
    eprintln!(
        "agent RSS: {idle} KiB idle, {flooded} KiB with 256 calls pending and {refused} refused"
    );
    assert!(
        flooded < idle + 8 * 1024,
        "the agent grew from {idle} to {flooded} KiB under a flood"
    );
    // Garbage and an oversized frame from the pending ones.
    let mut silent = silent;
    silent[0].write_all(b"garbage, not a descriptor").unwrap();
    silent[1].write_all(&u32::MAX.to_be_bytes()).unwrap();
    drop(silent);
    // Once they are gone, a real call goes through.
    let bindir = sb.path().join("podman-bin");
    std::fs::create_dir_all(&bindir).unwrap();
    std::os::unix::fs::symlink(BIN, bindir.join("podman")).unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let o = std::process::Command::new(bindir.join("podman"))
            .arg("version")
            .env("ARGUS_STATE_DIR", &agent.state_dir)
            .output()
            .unwrap();
        if o.status.success() {
            assert!(String::from_utf8_lossy(&o.stdout).contains("Podman Engine"));
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "no call went through after the flood: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(agent.status().is_some(), "the agent stopped answering");
    agent.signal(libc::SIGTERM);
    let (status, _) = agent
        .wait_exit(Duration::from_secs(30))
        .expect("agent exit");
    assert_eq!(status.code(), Some(0));
}

/// R-SEC-5: 256 clients that send their streams and one byte of their
/// request, then stall, hold no call of anyone else: a real `podman
/// version` through the broker answers at once, and each stalled client is
/// dropped within the request deadline (3 s), not kept by a per-read
/// timeout that every byte renews.
#[test]
fn stalled_clients_never_block_a_real_call_and_are_dropped_in_time() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    let sb = Sandbox::new();
    let env = sb.env("head", "head");
    let mut agent = Agent::start(&sb, "head", &env);
    let sock = agent.state_dir.join("shim.sock");
    agent.wait_for("the broker's socket", Duration::from_secs(60), |_| {
        sock.exists()
    });
    let null = std::fs::File::open("/dev/null").unwrap();
    let fd = null.as_raw_fd();
    let bindir = sb.path().join("podman-bin");
    std::fs::create_dir_all(&bindir).unwrap();
    std::os::unix::fs::symlink(BIN, bindir.join("podman")).unwrap();
    let call = || {
        let t = std::time::Instant::now();
        let o = std::process::Command::new(bindir.join("podman"))
            .arg("version")
            .env("ARGUS_STATE_DIR", &agent.state_dir)
            .output()
            .unwrap();
        (o, t.elapsed())
    };
    // The same call alone, for comparison.
    let (_, alone) = call();
    let t0 = std::time::Instant::now();
    let mut stalled: Vec<UnixStream> = (0..256)
        .map(|_| {
            let mut s = UnixStream::connect(&sock).unwrap();
            let iov = [std::io::IoSlice::new(b"F")];
            let fds = [fd, fd, fd];
            let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            nix::sys::socket::sendmsg::<()>(
                s.as_raw_fd(),
                &iov,
                &cmsg,
                nix::sys::socket::MsgFlags::empty(),
                None,
            )
            .unwrap();
            // One byte of the frame's length, and no more.
            s.write_all(&[0]).unwrap();
            s
        })
        .collect();
    eprintln!("256 stalled clients connected in {:?}", t0.elapsed());
    let (o, took) = call();
    let handlers = std::process::Command::new("pgrep")
        .args(["-c", "-f", "__shim-handler"])
        .output()
        .unwrap();
    eprintln!(
        "a real call beside them took {took:?} (alone: {alone:?}; handlers now: {})",
        String::from_utf8_lossy(&handlers.stdout).trim()
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("Podman Engine"),
        "the real call did not go through: {:?} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    // It did not wait for the stalled clients to go: most are still held
    // (the broker starts about 50 handlers a second on 2 cores with a
    // debug build, so the call queues behind their starts, not their
    // deadlines).
    let held = stalled
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            let open = matches!(
                nix::sys::socket::recv(s.as_raw_fd(), &mut b, nix::sys::socket::MsgFlags::MSG_PEEK),
                Err(nix::errno::Errno::EAGAIN)
            );
            s.set_nonblocking(false).unwrap();
            open
        })
        .count();
    eprintln!("{held} stalled clients still held when the real call answered");
    assert!(
        held > 0,
        "the real call came only after every stalled client was dropped"
    );
    assert!(
        took < Duration::from_secs(15),
        "the real call waited {took:?}"
    );
    // Each stalled client is dropped (an error frame, then EOF) within the
    // deadline, counted from when the last one connected.
    let dropped_by = std::time::Instant::now() + Duration::from_secs(6);
    let mut late = 0;
    for s in &mut stalled {
        let left = dropped_by.saturating_duration_since(std::time::Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = Vec::new();
        if s.read_to_end(&mut buf).is_err() {
            late += 1;
        }
    }
    eprintln!(
        "stalled clients dropped after {:?}; {late} still held",
        t0.elapsed()
    );
    drop(stalled);
    assert_eq!(
        late, 0,
        "{late} stalled clients were still held after the deadline"
    );
    agent.signal(libc::SIGTERM);
    let (status, _) = agent
        .wait_exit(Duration::from_secs(30))
        .expect("agent exit");
    assert_eq!(status.code(), Some(0));
}

/// Through the broker: a detached run by the Ray user (no root, no socket)
/// is recorded by PID 1 under its full ID, from the handler's report, and
/// the node-stop sweep removes exactly it. Meanwhile R-SEC-5's bound on
/// `logs -f` (each holds one of the host's root inotify instances in
/// dockerd): with `ARGUS_SHIM_MAX_LOG_FOLLOWS=4`, the callers outside any
/// job have one follow; a second is refused while it follows, a plain
/// `logs` is not, and a follow whose client is SIGKILLed gives its place
/// back.
#[test]
fn pid1_records_what_a_brokered_run_created_and_the_stop_sweep_removes_it() {
    let img = image();
    let sb = Sandbox::new();
    // The fake ray runs as nobody and writes here (a Ray that fails would
    // end the node's calls with it).
    std::fs::set_permissions(sb.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mut env = sb.env("head", "head");
    env.insert("ARGUS_RAY_USER".into(), RAY_USER.into());
    env.insert("ARGUS_SHIM_MAX_LOG_FOLLOWS".into(), "4".into());
    let mut agent = Agent::start(&sb, "head", &env);
    let sock = agent.state_dir.join("shim.sock");
    agent.wait_for("the broker's socket", Duration::from_secs(60), |_| {
        sock.exists()
    });
    let bindir = sb.path().join("podman-bin");
    std::fs::create_dir_all(&bindir).unwrap();
    std::os::unix::fs::symlink(BIN, bindir.join("podman")).unwrap();
    let label = shim_support::unique("recorded");
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bindir.join("podman"))
        .args(["run", "-d", "--label", &label, img, "/bin/tool", "trap"])
        .env("ARGUS_STATE_DIR", &agent.state_dir)
        .current_dir("/")
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(
        o.status.success() && id.len() == 64,
        "{o:?}\n{}",
        agent.log()
    );
    let record = agent.state_dir.join("shim-created").join(&id);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !record.exists() {
        assert!(
            std::time::Instant::now() < until,
            "PID 1 did not record {id}:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let meta = std::fs::symlink_metadata(&record).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid(), 0, "the record is root's");
    let podman = |args: &[&str]| {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bindir.join("podman"))
            .args(args)
            .env("ARGUS_STATE_DIR", &agent.state_dir)
            .current_dir("/")
            .stdin(std::process::Stdio::null());
        c
    };
    // A follow that holds: it prints the container's "ready" and goes on.
    let follow = || {
        let mut child = podman(&["logs", "-f", &id])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        use std::io::BufRead;
        let _ = out.read_line(&mut line);
        (child, line)
    };
    let (mut first, line) = follow();
    assert_eq!(line.trim(), "ready", "{}", agent.log());
    // Ended within 30 s, or killed: a follow that held would block here.
    let ended = |mut c: std::process::Command| {
        let mut child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        child.wait_with_output().unwrap()
    };
    let second = ended(podman(&["logs", "-f", &id]));
    assert!(
        second.status.code() == Some(125)
            && second.stdout.is_empty()
            && String::from_utf8_lossy(&second.stderr).contains("rule log-follows"),
        "a second follow of the callers outside any job: {second:?}"
    );
    let plain = ended(podman(&["logs", &id]));
    assert!(
        plain.status.success() && String::from_utf8_lossy(&plain.stdout).trim() == "ready",
        "a plain logs beside a full share of follows: {plain:?}"
    );
    // The client SIGKILLed: its handler ends and its place comes back.
    first.kill().unwrap();
    first.wait().unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let mut again = loop {
        let (mut child, line) = follow();
        if line.trim() == "ready" {
            break child;
        }
        let _ = child.wait();
        assert!(
            std::time::Instant::now() < until,
            "no follow holds 30 s after the first one's client was killed:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    again.kill().unwrap();
    again.wait().unwrap();
    agent.signal(libc::SIGTERM);
    agent
        .wait_exit(Duration::from_secs(30))
        .expect("agent exit");
    let left = shim_support::containers_with(&label);
    shim_support::force_remove(&left);
    assert!(
        left.is_empty(),
        "the node-stop sweep left {left:?}\n{}",
        agent.log()
    );
}
