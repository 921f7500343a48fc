//! Black-box tests of the head and worker roles (R-HEAD-*, R-WRK-*) with
//! the fake `ray`: the test plays the other side through the discovery
//! record on a shared folder.

mod support;

use std::time::{Duration, Instant};

use argus_discovery::{publish, HeadRecord, HeadState};
use support::fakehead::{record, FakeHead};
use support::{alive, Agent, Sandbox};

/// The bound of a wait for an agent and its fake Ray to start (a Python
/// process that opens its ports): what these tests check comes after it,
/// and in a run beside two clusters and a one-core busy loop (run queue
/// about 20) the fake Ray of a head took more than 10 s to open its GCS
/// port. The waits that check the agent's own timing keep their bounds.
const START: Duration = Duration::from_secs(30);

fn addresses(sb: &Sandbox, name: &str) -> Vec<String> {
    sb.ray_starts(name)
        .iter()
        .filter_map(|e| {
            e["argv"]
                .as_array()?
                .iter()
                .find_map(|a| a.as_str()?.strip_prefix("--address=").map(String::from))
        })
        .collect()
}

#[test]
fn head_publishes_only_once_gcs_accepts_then_refreshes() {
    let sb = Sandbox::new();
    let mut env = sb.env("h", "head");
    env.insert("FAKE_RAY_LISTEN_AFTER".into(), "1.5".into());
    let mut a = Agent::start(&sb, "h", &env);
    a.wait_for("ray start", START, |_| !sb.ray_starts("h").is_empty());
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        sb.record().is_none(),
        "published before the GCS port accepted: {:?}",
        sb.record()
    );
    a.wait_for("record", START, |_| sb.record().is_some());
    let r1 = HeadRecord::parse(&std::fs::read(sb.head_file()).unwrap()).unwrap();
    assert_eq!(r1.state, HeadState::Running);
    assert_eq!(r1.head_ip, "127.0.0.1");
    assert_eq!(r1.gcs_port.to_string(), env["ARGUS_RAY_PORT"]);
    assert_eq!(r1.generation, 1);
    a.wait_for("two refreshes", Duration::from_secs(5), |_| {
        sb.record()
            .is_some_and(|r| r["seq"].as_u64().unwrap() >= r1.seq + 2)
    });
    let r2 = HeadRecord::parse(&std::fs::read(sb.head_file()).unwrap()).unwrap();
    assert_eq!(
        r2.instance_id, r1.instance_id,
        "instance changed without a restart"
    );
    // `argus-agent head` shows it.
    let out = support::run_bin(&["head", "--json"], &env);
    assert!(out.status.success());
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["instance_id"], r1.instance_id.as_str());
    // Stop: the record is withdrawn, not deleted.
    a.signal(libc::SIGTERM);
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)).unwrap().0.code(),
        Some(0)
    );
    let r3 = HeadRecord::parse(&std::fs::read(sb.head_file()).unwrap()).unwrap();
    assert_eq!(r3.state, HeadState::Stopped);
    assert!(r3.seq > r2.seq);
}

/// A head killed between writing its temp file and the rename leaves the
/// temp file on shared storage; the next head's first publish removes it
/// (and leaves a fresh one, which may be a publish in flight).
#[test]
fn a_head_removes_the_temp_files_an_earlier_head_left_mid_publish() {
    let sb = Sandbox::new();
    let staging = sb
        .head_file()
        .parent()
        .unwrap()
        .join(argus_discovery::STAGING_DIR);
    std::fs::create_dir_all(&staging).unwrap();
    let old = staging.join(".head.json.k1LLed.tmp");
    let fresh = staging.join(".head.json.n0wOn3.tmp");
    for p in [&old, &fresh] {
        std::fs::write(p, b"{\"schema_version\":").unwrap();
    }
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    let env = sb.env("h", "head");
    let mut a = Agent::start(&sb, "h", &env);
    a.wait_for("record", START, |_| sb.record().is_some());
    a.wait_for("old temp file removed", Duration::from_secs(10), |_| {
        !old.exists()
    });
    assert!(fresh.exists(), "a fresh temp file was removed too");
    assert!(
        a.log().contains("removed temp files an earlier head left"),
        "{}",
        a.log()
    );
    a.signal(libc::SIGTERM);
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)).unwrap().0.code(),
        Some(0)
    );
}

#[test]
fn head_withdraws_at_once_when_ray_dies_and_republishes_a_new_instance() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "h", &sb.env("h", "head"));
    a.wait_for("record", START, |_| sb.record().is_some());
    let first = sb.record().unwrap();
    let ray_pid = sb.ray_starts("h")[0]["pid"].as_i64().unwrap();
    let t0 = Instant::now();
    unsafe { libc::kill(ray_pid as i32, libc::SIGKILL) };
    a.wait_for("withdrawn", Duration::from_secs(5), |_| {
        sb.record().is_some_and(|r| r["state"] == "stopped")
    });
    let withdrawn_after = t0.elapsed();
    assert!(
        withdrawn_after < Duration::from_secs(2),
        "withdraw took {withdrawn_after:?}"
    );
    a.wait_for("republished", Duration::from_secs(10), |_| {
        sb.record()
            .is_some_and(|r| r["state"] == "running" && r["instance_id"] != first["instance_id"])
    });
    let again = sb.record().unwrap();
    assert_eq!(
        again["generation"], first["generation"],
        "a restart keeps the generation"
    );
}

#[test]
fn standby_head_takes_over_only_after_the_first_stops() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "a", &sb.env("a", "head"));
    a.wait_for("head a publishes", START, |_| sb.record().is_some());
    let mut env_b = sb.env("b", "head");
    env_b.insert("ARGUS_NODE_IP".into(), "127.0.0.2".into());
    let mut b = Agent::start(&sb, "b", &env_b);
    b.wait_for("standby", START, |b| b.state() == "standby");
    // Longer than the TTL (3 s): a live head keeps the standby waiting.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(b.state(), "standby", "{}", b.log());
    assert!(sb.ray_starts("b").is_empty(), "standby started ray");
    assert_eq!(sb.record().unwrap()["head_ip"], "127.0.0.1");
    a.signal(libc::SIGTERM);
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)).unwrap().0.code(),
        Some(0)
    );
    b.wait_for("takeover", Duration::from_secs(10), |_| {
        sb.record()
            .is_some_and(|r| r["head_ip"] == "127.0.0.2" && r["state"] == "running")
    });
    let r = sb.record().unwrap();
    assert_eq!(
        r["generation"], 2,
        "takeover must claim a higher generation: {r}"
    );
    assert!(sb
        .shared()
        .join("ray/discovery/argus-ray/epochs/2")
        .exists());
}

/// Kills an agent and its fake Ray with SIGKILL: no withdraw, no cleanup,
/// as when a container is killed or the machine dies.
///
/// Returns once every killed process is gone (dead, or a zombie: its
/// sockets closed), as a container's restart does: SIGKILL is delivered
/// asynchronously, and on a loaded machine the fake Ray still held its port
/// when the next agent checked it, which then refused to start ("port ...
/// already in use").
fn kill_hard(sb: &Sandbox, a: &mut Agent) {
    unsafe { libc::kill(-a.pid(), libc::SIGKILL) };
    let _ = a.child.wait();
    a.exit = a.child.try_wait().ok().flatten();
    let mut killed = Vec::new();
    for ev in sb.ray_events(&a.name) {
        let pids = ev["pids"].as_array().cloned().unwrap_or_default();
        for p in ev["pid"]
            .as_i64()
            .into_iter()
            .chain(pids.iter().filter_map(|p| p.as_i64()))
        {
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
            killed.push(p);
        }
    }
    let t = Instant::now();
    while let Some(p) = killed.iter().find(|p| alive(**p)) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "pid {p} still runs 30 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sandbox's settings with the default TTL of 60 s: anything that
/// happens within seconds did not wait for a TTL.
fn env_ttl_60(sb: &Sandbox, name: &str, role: &str) -> std::collections::BTreeMap<String, String> {
    let mut env = sb.env(name, role);
    env.insert("ARGUS_TTL_S".into(), "60".into());
    env
}

#[test]
fn standby_takes_over_at_once_when_the_recorded_gcs_refuses() {
    let sb = Sandbox::new();
    // A crashed head's leftover: running, nobody refreshes it, and nothing
    // listens at its GCS address (connections are refused).
    let port = support::free_port();
    let stale = record("127.0.0.9", port, "dead", 4, 10);
    sb.write_cluster_token();
    publish(&sb.head_file(), &stale.to_bytes()).unwrap();
    let t0 = Instant::now();
    let mut b = Agent::start(&sb, "b", &env_ttl_60(&sb, "b", "head"));
    b.wait_for("takeover", Duration::from_secs(20), |_| {
        sb.record()
            .is_some_and(|r| r["head_ip"] == "127.0.0.1" && r["state"] == "running")
    });
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "waited {:?}: a refused GCS needs no TTL (60 s)",
        t0.elapsed()
    );
    assert_eq!(sb.record().unwrap()["generation"], 5);
    let st = b.status().unwrap();
    assert!(
        st["takeover"].as_str().unwrap_or("").contains("refused"),
        "status names the rule: {st}"
    );
}

#[test]
fn a_head_killed_with_its_ray_serves_again_at_once_at_the_same_address() {
    let sb = Sandbox::new();
    let head_env = env_ttl_60(&sb, "h", "head");
    let mut h = Agent::start(&sb, "h", &head_env);
    let mut w = Agent::start(&sb, "w", &env_ttl_60(&sb, "w", "worker"));
    w.wait_for("worker joined", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    let first = sb.record().unwrap();
    kill_hard(&sb, &mut h);
    assert_eq!(sb.record().unwrap()["state"], "running", "nobody withdrew");
    // The container restarts: same address, same port, a new agent.
    let t0 = Instant::now();
    let mut h2 = Agent::start(&sb, "h2", &head_env);
    h2.wait_for("served again", Duration::from_secs(60), |_| {
        sb.record()
            .is_some_and(|r| r["state"] == "running" && r["instance_id"] != first["instance_id"])
    });
    let served = t0.elapsed();
    w.wait_for("worker rejoined", Duration::from_secs(60), |_| {
        sb.ray_starts("w").len() == 2
    });
    let rejoined = t0.elapsed();
    eprintln!("served again after {served:?}, worker rejoined after {rejoined:?}");
    // Well under the TTL (60 s); the figure on a calm machine is ~1 s
    // (scripts/bench-failover.py), the bound leaves room for a loaded CI.
    assert!(
        rejoined < Duration::from_secs(30),
        "{rejoined:?}: the restarted head must not wait for the TTL (60 s)"
    );
    let r = sb.record().unwrap();
    assert_eq!(r["generation"], first["generation"].as_u64().unwrap() + 1);
    let st = h2.status().unwrap();
    assert!(
        st["takeover"]
            .as_str()
            .unwrap_or("")
            .contains("previous life"),
        "status names the rule: {st}"
    );
}

#[test]
fn a_standby_on_another_address_takes_over_when_the_holders_gcs_refuses() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "a", &env_ttl_60(&sb, "a", "head"));
    a.wait_for("head a publishes", Duration::from_secs(20), |_| {
        sb.record().is_some_and(|r| r["state"] == "running")
    });
    let mut env_b = env_ttl_60(&sb, "b", "head");
    env_b.insert("ARGUS_NODE_IP".into(), "127.0.0.2".into());
    let mut b = Agent::start(&sb, "b", &env_b);
    b.wait_for("standby on a live head", Duration::from_secs(20), |b| {
        b.state() == "standby"
            && b.status()
                .is_some_and(|s| s["takeover"].as_str().unwrap_or("").contains("accepts"))
    });
    let mut w = Agent::start(&sb, "w", &env_ttl_60(&sb, "w", "worker"));
    w.wait_for("worker joined a", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    kill_hard(&sb, &mut a);
    let t0 = Instant::now();
    w.wait_for("worker follows b", Duration::from_secs(60), |_| {
        addresses(&sb, "w")
            .last()
            .is_some_and(|a| a.starts_with("127.0.0.2:"))
    });
    let took = t0.elapsed();
    eprintln!("worker on the new head {took:?} after the old head was killed");
    assert!(
        took < Duration::from_secs(30),
        "{took:?}: no TTL wait (60 s)"
    );
    assert_eq!(sb.record().unwrap()["generation"], 2);
}

#[test]
fn a_standby_never_takes_the_record_from_a_head_whose_gcs_accepts() {
    let sb = Sandbox::new();
    // The holder's agent is hung (its record stopped changing long ago)
    // but its GCS accepts connections: it is live.
    let gcs = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = gcs.local_addr().unwrap().port();
    let held = record("127.0.0.1", port, "live", 3, 10);
    sb.write_cluster_token();
    publish(&sb.head_file(), &held.to_bytes()).unwrap();
    let before = std::fs::read(sb.head_file()).unwrap();
    let mut env = sb.env("b", "head");
    env.insert("ARGUS_NODE_IP".into(), "127.0.0.2".into());
    let mut b = Agent::start(&sb, "b", &env);
    b.wait_for("standby", Duration::from_secs(20), |b| {
        b.state() == "standby"
    });
    // Hold it well past the TTL (3 s here): nothing may move.
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert_eq!(b.state(), "standby", "{}", b.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read(sb.head_file()).unwrap(),
        before,
        "the record moved"
    );
    assert!(sb.ray_starts("b").is_empty(), "standby started ray");
    assert!(!sb
        .shared()
        .join("ray/discovery/argus-ray/epochs/4")
        .exists());
    drop(gcs);
}

/// A network namespace of the test's own with loopback up, removed on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!("argus-t{}-{}", std::process::id(), support::free_port());
        let run = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run ip (iproute2; root needed for network namespaces): {e}")
                });
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&["netns", "add", &name]);
        let ns = Netns(name);
        run(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }

    fn exec(&self, args: &[&str]) {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {args:?}: {e}"));
        assert!(
            out.status.success(),
            "ip netns exec {} {args:?}: {}",
            self.0,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

#[test]
fn a_standby_waits_the_ttl_when_the_holders_gcs_drops_packets() {
    let sb = Sandbox::new();
    // Inside the test's own network namespace, packets to the holder's GCS
    // address vanish (iptables DROP): probes time out, as in a partition.
    let ns = Netns::new();
    ns.exec(&["iptables", "-A", "OUTPUT", "-d", "127.0.0.9", "-j", "DROP"]);
    let stale = record("127.0.0.9", 4321, "partitioned", 4, 10);
    sb.write_cluster_token();
    publish(&sb.head_file(), &stale.to_bytes()).unwrap();
    let t0 = Instant::now();
    let mut b = Agent::start_with(
        &sb,
        "b",
        &sb.env("b", "head"),
        &["ip", "netns", "exec", &ns.0],
    );
    b.wait_for("inconclusive standby", Duration::from_secs(20), |b| {
        b.status().is_some_and(|s| {
            s["takeover"]
                .as_str()
                .unwrap_or("")
                .contains("inconclusive")
        })
    });
    b.wait_for("takeover after the TTL", Duration::from_secs(30), |_| {
        sb.record()
            .is_some_and(|r| r["head_ip"] == "127.0.0.1" && r["state"] == "running")
    });
    assert!(
        t0.elapsed() >= Duration::from_secs(3),
        "took over before the TTL (3 s) on inconclusive probes: {:?}",
        t0.elapsed()
    );
    assert_eq!(sb.record().unwrap()["generation"], 5);
    drop(b);
}

#[test]
fn worker_joins_only_a_record_seen_changing_and_rejoins_on_address_change() {
    let sb = Sandbox::new();
    let stale = record("127.0.0.5", 4000, "i1", 1, 1);
    sb.write_cluster_token();
    publish(&sb.head_file(), &stale.to_bytes()).unwrap();
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    let from = w.log().len();
    w.wait_for(
        "two polls of the unchanged record",
        Duration::from_secs(30),
        |w| polls_since(w, from, "has not changed since this agent started") >= 2,
    );
    assert!(
        sb.ray_starts("w").is_empty(),
        "joined a record never seen changing"
    );
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 1, 1));
    w.wait_for("join", Duration::from_secs(30), |_| {
        !sb.ray_starts("w").is_empty()
    });
    assert_eq!(addresses(&sb, "w"), vec!["127.0.0.5:4000"]);
    let argv = sb.ray_starts("w")[0]["argv"].to_string();
    assert!(
        argv.contains(r#"--resources={\"worker_node\":100.0}"#),
        "{argv}"
    );
    assert!(
        !argv.contains("--num-gpus"),
        "GPUs must not be hard-coded: {argv}"
    );
    let first_pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    let t0 = Instant::now();
    head.set(Some(record("127.0.0.6", 4001, "i2", 1, 1)));
    // The agent's reaction is counted in its own polls, not in seconds
    // (a busy machine stretches seconds, not the count): it rejoins at the
    // first poll that can see the new record (the second, when the write
    // fell in the middle of a read), where waiting for the TTL (3 s) would
    // take six polls of 0.5 s or more.
    let mut written_at = 0;
    w.wait_for("the new record on disk", Duration::from_secs(30), |w| {
        written_at = w.log().len();
        sb.record().is_some_and(|r| r["gcs_port"] == 4001)
    });
    w.wait_for("rejoin decided", Duration::from_secs(30), |w| {
        w.log().contains("head changed; rejoining")
    });
    let took = t0.elapsed();
    let log = w.log();
    let decided_at = log.find("head changed; rejoining").unwrap();
    let polls = log
        .get(written_at.min(decided_at)..decided_at)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("head record polled"))
        .count();
    eprintln!("rejoin decided {took:?} after the change, {polls} poll(s) after the write");
    w.wait_for("rejoin", Duration::from_secs(30), |_| {
        sb.ray_starts("w").len() >= 2
    });
    assert_eq!(addresses(&sb, "w")[1], "127.0.0.6:4001");
    assert!(
        polls <= 2,
        "the rejoin came {polls} polls after the new record was written ({took:?}), not at the first poll that saw it"
    );
    assert!(!alive(first_pid), "old ray still running");
}

#[test]
fn worker_rejoins_a_restarted_head_at_the_same_address() {
    let sb = Sandbox::new();
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "before", 1, 1));
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("join", Duration::from_secs(30), |_| {
        !sb.ray_starts("w").is_empty()
    });
    head.set(Some(record("127.0.0.5", 4000, "after", 1, 1)));
    w.wait_for("rejoin", Duration::from_secs(30), |_| {
        sb.ray_starts("w").len() >= 2
    });
    assert_eq!(w.status().unwrap()["head_instance_id"], "after");
}

#[test]
fn worker_keeps_ray_through_garbage_stale_and_lower_generation_records() {
    let sb = Sandbox::new();
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 3, 1));
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("join", Duration::from_secs(30), |_| {
        !sb.ray_starts("w").is_empty()
    });
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    let same_ray = |w: &Agent, phase: &str| {
        assert_eq!(
            sb.ray_starts("w").len(),
            1,
            "{phase}: ray restarted: {}",
            w.log()
        );
        assert!(alive(pid), "{phase}: ray died: {}", w.log());
    };
    // Garbage (rewritten until the agent has polled it twice: the fake head
    // may publish once more after it is paused).
    head.set(None);
    let garbage = b"{\"schema_version\": 1, \"head_ip\": tru";
    let from = w.log().len();
    w.wait_for("two polls of garbage", Duration::from_secs(20), |w| {
        if std::fs::read(sb.head_file()).ok().as_deref() != Some(&garbage[..]) {
            std::fs::write(sb.head_file(), garbage).unwrap();
        }
        polls_since(w, from, "malformed head record") >= 2
    });
    same_ray(&w, "garbage");
    // Stale: a valid record that stops changing for longer than the TTL.
    publish(
        &sb.head_file(),
        &record("127.0.0.5", 4000, "i1", 3, 99).to_bytes(),
    )
    .unwrap();
    let from = w.log().len();
    w.wait_for(
        "two polls of an expired record",
        Duration::from_secs(30),
        |w| polls_since(w, from, "head record expired") >= 2,
    );
    assert!(w.log().contains("keeping ray running"), "{}", w.log());
    same_ray(&w, "stale");
    // A fenced old head (lower generation) at another address is ignored.
    head.set(Some(record("127.0.0.7", 4000, "zombie", 2, 1)));
    let from = w.log().len();
    w.wait_for(
        "two polls of a lower generation",
        Duration::from_secs(20),
        |w| polls_since(w, from, "older than generation 3") >= 2,
    );
    same_ray(&w, "lower generation");
    // The real head comes back fresh: still the same Ray, no restart.
    head.set(Some(record("127.0.0.5", 4000, "i1", 3, 1)));
    let from = w.log().len();
    w.wait_for(
        "two polls of the fresh record",
        Duration::from_secs(20),
        |w| polls_since(w, from, "wanted=true") >= 2,
    );
    same_ray(&w, "fresh again");
}

/// How many `head record polled` debug lines containing `what` the agent
/// logged after byte `from` of its log.
fn polls_since(w: &Agent, from: usize, what: &str) -> usize {
    w.log()
        .get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("head record polled") && l.contains(what))
        .count()
}

#[test]
fn worker_waits_with_a_reason_and_restarts_ray_when_it_exits() {
    let sb = Sandbox::new();
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    // The state may say waiting_for_head before the first read of the
    // record gives the reason (seen under load): wait for both, and for the
    // log line of it.
    w.wait_for(
        "waiting: the record does not exist",
        Duration::from_secs(30),
        |w| {
            w.status().is_some_and(|st| {
                st["state"] == "waiting_for_head"
                    && st["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("does not exist"))
            }) && w.log().contains("waiting for head")
        },
    );
    assert!(!w.log().contains("ERROR"), "{}", w.log());
    let _head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 1, 1));
    w.wait_for("join", Duration::from_secs(30), |_| {
        !sb.ray_starts("w").is_empty()
    });
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    w.wait_for("restart", Duration::from_secs(30), |_| {
        sb.ray_starts("w").len() >= 2
    });
    assert_eq!(w.status().unwrap()["restarts"], 1);
    // Healthy while running.
    w.wait_for("healthy", Duration::from_secs(30), |w| {
        let mut env = std::collections::BTreeMap::new();
        env.insert(
            "ARGUS_STATE_DIR".to_string(),
            w.state_dir.display().to_string(),
        );
        support::run_bin(&["healthcheck"], &env).status.success()
    });
}

#[test]
fn head_steps_down_when_a_higher_generation_takes_over() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "a", &sb.env("a", "head"));
    a.wait_for("publishes", START, |_| sb.record().is_some());
    let ray_pid = sb.ray_starts("a")[0]["pid"].as_i64().unwrap();
    // Another head claims generation 2 and publishes.
    let epochs = sb.shared().join("ray/discovery/argus-ray/epochs");
    assert!(argus_discovery::claim_generation(&epochs, 2, "other").unwrap());
    let _other = FakeHead::start(&sb, record("127.0.0.8", 5000, "other", 2, 1));
    a.wait_for("standby", Duration::from_secs(10), |a| {
        a.state() == "standby"
    });
    assert!(!alive(ray_pid), "fenced head kept its ray");
    assert!(a.log().contains("stepping down"), "{}", a.log());
    std::thread::sleep(Duration::from_secs(1));
    let r = sb.record().unwrap();
    assert_eq!(
        r["generation"], 2,
        "fenced head overwrote the new head: {r}"
    );
}

/// CPU time (user + system) of `pid` in seconds.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Regression: the worker's own reads of head.json raised inotify open and
/// access events, each of which triggered another read: a busy loop that
/// flooded the event queue and delayed SIGTERM handling.
#[test]
fn worker_file_events_do_not_feed_back_into_a_busy_loop() {
    let sb = Sandbox::new();
    let _head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 1, 1));
    let mut env = sb.env("w", "worker");
    env.insert("ARGUS_FILE_EVENTS".into(), "on".into());
    let mut w = Agent::start(&sb, "w", &env);
    // The join's bound is not what this test checks: a CI run beside a
    // busy loop took more than 5 s to start the agent and its fake Ray.
    w.wait_for("join", Duration::from_secs(30), |_| {
        !sb.ray_starts("w").is_empty()
    });
    let before = cpu_seconds(w.pid());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_seconds(w.pid()) - before;
    assert!(
        used < 0.5,
        "worker agent used {used:.2}s of CPU in 3 s while idle"
    );
    w.signal(libc::SIGTERM);
    let (st, took) = w.wait_exit(Duration::from_secs(10)).expect("exit");
    assert_eq!(st.code(), Some(0));
    assert!(
        took < Duration::from_secs(3),
        "SIGTERM handled after {took:?}"
    );
}

#[test]
fn a_fenced_head_whose_ray_dies_does_not_withdraw_the_newer_record() {
    // Regression: the withdraw (and the first publish after a restart) did
    // not re-check fencing and wrote `stopped` over a newer head's record.
    let sb = Sandbox::new();
    let mut env = env_ttl_60(&sb, "a", "head");
    // No refresh comes before the Ray death: the withdraw must re-check.
    env.insert("ARGUS_REFRESH_S".into(), "30".into());
    let mut a = Agent::start(&sb, "a", &env);
    a.wait_for("publishes", Duration::from_secs(20), |_| {
        sb.record().is_some_and(|r| r["state"] == "running")
    });
    // A newer head claims generation 2 and writes its record once.
    let epochs = sb.shared().join("ray/discovery/argus-ray/epochs");
    assert!(argus_discovery::claim_generation(&epochs, 2, "other").unwrap());
    let newer = record("127.0.0.8", 5000, "other", 2, 1);
    publish(&sb.head_file(), &newer.to_bytes()).unwrap();
    let before = std::fs::read(sb.head_file()).unwrap();
    // Head a's Ray dies before its next refresh would notice the fence.
    let children = sb.ray_events("a");
    let raylet = children
        .iter()
        .find_map(|e| e["pids"].as_array().and_then(|p| p[0].as_i64()))
        .unwrap();
    unsafe { libc::kill(raylet as i32, libc::SIGKILL) };
    a.wait_for(
        "a notices its ray died and stands by",
        Duration::from_secs(20),
        |a| a.log().contains("ray daemon died") && a.state() == "standby",
    );
    assert_eq!(
        std::fs::read(sb.head_file()).unwrap(),
        before,
        "the fenced head wrote over the newer record:\n{}",
        a.log()
    );
}

#[test]
fn a_new_head_resets_the_backoff_earned_against_the_old_one() {
    let sb = Sandbox::new();
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "dying", 1, 1));
    let mut env = sb.env("w", "worker");
    // Ray keeps failing against this head: the backoff grows to ~8-16 s.
    env.insert("FAKE_RAY_EXIT_AFTER".into(), "0.2".into());
    env.insert("ARGUS_RESTART_BACKOFF_MIN_S".into(), "4".into());
    env.insert("ARGUS_RESTART_BACKOFF_MAX_S".into(), "60".into());
    let mut w = Agent::start(&sb, "w", &env);
    w.wait_for("two failed runs", Duration::from_secs(40), |w| {
        w.status().is_some_and(|s| {
            s["consecutive_failures"].as_u64() >= Some(2) && s["state"] == "backoff"
        })
    });
    let waiting = w.status().unwrap()["next_restart_in_s"]
        .as_f64()
        .unwrap_or(0.0);
    let starts = sb.ray_starts("w").len();
    let t0 = Instant::now();
    head.set(Some(record("127.0.0.6", 4001, "new", 2, 1)));
    w.wait_for("joins the new head", Duration::from_secs(30), |_| {
        sb.ray_starts("w").len() > starts
    });
    let took = t0.elapsed();
    assert_eq!(addresses(&sb, "w").last().unwrap(), "127.0.0.6:4001");
    // Judged on the agent's own clock (its log), not on when the fake Ray
    // wrote its start (a CI run at load 25: 5.8 s, most of it the fake's
    // Python start): the start for the new head came before the pending
    // backoff would have ended, and within the join's jitter (at most
    // half a poll period) plus the loop's own latency of being scheduled.
    let log = w.log();
    let at = |l: &str| log_time(l).unwrap_or_else(|| panic!("no time in {l:?}"));
    let scheduled = log
        .lines()
        .position(|l| l.contains("join scheduled target=127.0.0.6:4001"))
        .unwrap_or_else(|| panic!("the new head's join was never scheduled:\n{log}"));
    let lines: Vec<&str> = log.lines().collect();
    let backoff = lines[..scheduled]
        .iter()
        .rev()
        .find(|l| l.contains("restarting ray after backoff"))
        .unwrap_or_else(|| panic!("no backoff before the new head:\n{log}"));
    let delay: f64 = field(backoff, "delay_s=").parse().unwrap();
    let due = at(backoff) + delay;
    let started = lines[scheduled..]
        .iter()
        .find(|l| l.contains("started ray") && l.contains("--address=127.0.0.6:4001"))
        .unwrap_or_else(|| panic!("no start for the new head:\n{log}"));
    let (sched_at, start_at) = (at(lines[scheduled]), at(started));
    eprintln!(
        "the new head's join: scheduled {:.2} s before the pending backoff's end, started {:.2} s after it was scheduled; {took:?} until the fake Ray wrote its start",
        due - sched_at,
        start_at - sched_at
    );
    assert!(
        start_at < due,
        "the start for the new head waited out the backoff ({waiting:.1}s pending, due {due:.2}, started {start_at:.2}):\n{log}"
    );
    assert!(
        start_at - sched_at < 2.0,
        "the start for the new head came {:.2} s after its join was scheduled (jitter at most 0.25 s):\n{log}",
        start_at - sched_at
    );
}

/// The value after `key` in a tracing line, up to the next space.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let from = line.find(key).map(|i| i + key.len()).unwrap_or(line.len());
    line[from..].split_whitespace().next().unwrap_or("")
}

/// Seconds since the epoch of a tracing line's leading RFC 3339 UTC time
/// (`2026-12-03T00:32:54.562505Z ...`).
fn log_time(line: &str) -> Option<f64> {
    let ts = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, dd) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, mi, sec) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + dd - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3_600.0 + mi * 60.0 + sec)
}

#[test]
fn a_worker_reports_a_refusing_head_gcs_and_keeps_its_ray() {
    let sb = Sandbox::new();
    // The head's record stops changing and nothing listens at its address.
    let port = support::free_port();
    let head = FakeHead::start(&sb, record("127.0.0.5", port, "crashed", 1, 1));
    let mut env = sb.env("w", "worker");
    // Probing starts once the record stood still for TTL/4 (2 s here).
    env.insert("ARGUS_TTL_S".into(), "8".into());
    let mut w = Agent::start(&sb, "w", &env);
    w.wait_for("join", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    head.set(None);
    w.wait_for(
        "the refusing GCS in status and log",
        Duration::from_secs(60),
        |w| {
            w.status().is_some_and(|s| {
                s["head_gcs"]
                    .as_str()
                    .unwrap_or("")
                    .contains("refusing connections for")
            }) && w.log().contains("the head may come back")
        },
    );
    assert_eq!(
        sb.ray_starts("w").len(),
        1,
        "ray was restarted:\n{}",
        w.log()
    );
}

/// Issue 8's note: without GCS fault tolerance a worker started Ray twice
/// after a head crash: once against the crashed head's record when its
/// raylet gave up on the GCS, once more for the new instance. Now a Ray that
/// exits while the joined GCS is down and the record stands still waits for
/// the record to change, and starts once, for the new head.
#[test]
fn a_worker_whose_ray_exits_while_the_head_is_down_starts_once_for_the_new_head() {
    let sb = Sandbox::new();
    let port = support::free_port();
    let head = FakeHead::start(&sb, record("127.0.0.5", port, "crashed", 1, 1));
    let mut env = sb.env("w", "worker");
    // Probing starts once the record stood still for TTL/4 (5 s); the
    // record expires only after 20 s.
    env.insert("ARGUS_TTL_S".into(), "20".into());
    let mut w = Agent::start(&sb, "w", &env);
    w.wait_for("join", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    // The head crashes: its record stops changing, its GCS refuses.
    head.set(None);
    w.wait_for("the refusing GCS in status", Duration::from_secs(30), |w| {
        w.status()
            .is_some_and(|s| s["head_gcs"].as_str().unwrap_or("").contains("refusing"))
    });
    // The raylet gives up on the GCS: Ray exits.
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    w.wait_for("the restart held", Duration::from_secs(30), |w| {
        w.state() == "waiting_for_head"
            && w.status().is_some_and(|s| {
                s["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("waiting for the head to refresh or republish")
            })
    });
    assert_eq!(
        sb.ray_starts("w").len(),
        1,
        "ray was restarted against the crashed head's record:\n{}",
        w.log()
    );
    // The head comes back at the same address with a new instance.
    head.set(Some(record("127.0.0.5", port, "restarted", 2, 1)));
    w.wait_for("join the new head", Duration::from_secs(30), |w| {
        sb.ray_starts("w").len() == 2
            && w.status()
                .is_some_and(|s| s["head_instance_id"] == "restarted")
            && w.state() == "running"
    });
    assert_eq!(sb.ray_starts("w").len(), 2, "{}", w.log());
}

/// A Ray that exits while its head lives (the record keeps changing) is
/// restarted as before, without waiting for anything.
#[test]
fn a_worker_whose_ray_exits_while_the_head_lives_restarts_it_at_once() {
    let sb = Sandbox::new();
    let _head = FakeHead::start(&sb, record("127.0.0.5", 4000, "live", 1, 1));
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("join", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    w.wait_for("restart", Duration::from_secs(30), |_| {
        sb.ray_starts("w").len() == 2
    });
    assert!(
        !w.log().contains("waiting for the head to refresh"),
        "{}",
        w.log()
    );
}

/// A record that stood still for a moment (a loaded machine delays the
/// head's refresh past the probe threshold) and then changed again is a
/// live head: a Ray that exits afterwards is restarted at once, not held
/// as if the head had crashed (a CI run under load held it).
#[test]
fn a_worker_whose_ray_exits_after_its_heads_record_paused_and_resumed_restarts_it_at_once() {
    let sb = Sandbox::new();
    let port = support::free_port();
    let live = record("127.0.0.5", port, "live", 1, 1);
    let head = FakeHead::start(&sb, live.clone());
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("join", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    // The refresh pauses long enough for a probe (nothing listens there).
    head.set(None);
    w.wait_for(
        "a probe finds the GCS refusing",
        Duration::from_secs(30),
        |w| {
            w.status()
                .is_some_and(|s| s["head_gcs"].as_str().unwrap_or("").contains("refusing"))
        },
    );
    // The head refreshes again, and the worker sees it.
    head.set(Some(live));
    w.wait_for("the record changing again", Duration::from_secs(30), |w| {
        w.status()
            .is_some_and(|s| s["head_record_age_s"].as_f64().is_some_and(|a| a < 0.3))
    });
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    w.wait_for("restart", Duration::from_secs(30), |_| {
        sb.ray_starts("w").len() == 2
    });
    assert!(
        !w.log().contains("waiting for the head to refresh"),
        "a live head's worker held its restart:\n{}",
        w.log()
    );
}

#[test]
fn a_worker_rides_a_fault_tolerant_head_restart_at_the_same_address_through() {
    let sb = Sandbox::new();
    let ft = |ip: &str, port: u16, inst: &str, generation: u64| {
        let mut r = record(ip, port, inst, generation, 1);
        r.gcs_ft = true;
        r
    };
    let head = FakeHead::start(&sb, ft("127.0.0.5", 4000, "before", 1));
    let mut env = sb.env("w", "worker");
    env.insert("ARGUS_GCS_FT_ZOMBIE_S".into(), "120".into());
    let mut w = Agent::start(&sb, "w", &env);
    w.wait_for("join", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 1
    });
    let first = &sb.ray_starts("w")[0];
    assert_eq!(
        first["env_reconnect"], "120",
        "Ray's GCS reconnect timeout follows ARGUS_GCS_FT_ZOMBIE_S: {first}"
    );
    // The head restarts at the same address (new instance, new generation).
    head.set(Some(ft("127.0.0.5", 4000, "after", 2)));
    w.wait_for("ride-through", Duration::from_secs(20), |w| {
        w.status().is_some_and(|s| s["head_instance_id"] == "after")
            && w.log().contains("ride-through")
    });
    assert_eq!(
        sb.ray_starts("w").len(),
        1,
        "ray was restarted:\n{}",
        w.log()
    );
    assert_eq!(w.status().unwrap()["gcs_ft"], true);
    // At another address it is followed as in R-WRK-3.
    head.set(Some(ft("127.0.0.6", 4001, "moved", 3)));
    w.wait_for("rejoin", Duration::from_secs(20), |_| {
        sb.ray_starts("w").len() == 2
    });
    assert_eq!(addresses(&sb, "w").last().unwrap(), "127.0.0.6:4001");
}

#[test]
fn a_head_with_gcs_ft_starts_ray_on_the_external_redis_and_says_so_in_the_record() {
    let sb = Sandbox::new();
    let mut env = sb.env("h", "head");
    env.insert(
        "ARGUS_GCS_FT_REDIS".into(),
        "redis://:s3cret@127.0.0.1:6390".into(),
    );
    let mut h = Agent::start(&sb, "h", &env);
    h.wait_for("publishes", Duration::from_secs(20), |_| {
        sb.record().is_some_and(|r| r["state"] == "running")
    });
    assert_eq!(sb.record().unwrap()["gcs_ft"], true);
    let start = &sb.ray_starts("h")[0];
    assert_eq!(start["env_redis"], "127.0.0.1:6390", "{start}");
    assert_eq!(start["env_namespace"], "argus-ray", "{start}");
    let argv: Vec<&str> = start["argv"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(argv.contains(&"--redis-password=s3cret"), "{argv:?}");
    assert!(
        !h.log().contains("s3cret"),
        "the password reached the log:\n{}",
        h.log()
    );
    assert_eq!(h.status().unwrap()["gcs_ft"], true);
    h.signal(libc::SIGTERM);
    h.wait_exit(Duration::from_secs(10));

    // The password from a file (compose's generated one): read at the
    // start, given to Ray, never logged; a missing file starts no Ray.
    let file = sb.path().join("redis-password");
    let mut env = sb.env("h2", "head");
    env.insert("ARGUS_GCS_FT_REDIS".into(), "127.0.0.1:6390".into());
    env.insert(
        "ARGUS_GCS_FT_REDIS_PASSWORD_FILE".into(),
        file.display().to_string(),
    );
    let mut h = Agent::start(&sb, "h2", &env);
    h.wait_for("the error", Duration::from_secs(15), |a| {
        a.log().contains("cannot read the Redis password")
    });
    assert!(
        sb.ray_starts("h2").is_empty(),
        "a Ray started without its password"
    );
    std::fs::write(&file, "f1le-s3cret\n").unwrap();
    h.wait_for("ray start", Duration::from_secs(15), |_| {
        !sb.ray_starts("h2").is_empty()
    });
    let start = &sb.ray_starts("h2")[0];
    assert!(
        start["argv"]
            .to_string()
            .contains("\"--redis-password=f1le-s3cret\""),
        "{start}"
    );
    assert!(
        !h.log().contains("f1le-s3cret"),
        "the password reached the log"
    );
    h.signal(libc::SIGTERM);
    h.wait_exit(Duration::from_secs(10));
    // A password in both places is a configuration error.
    env.insert(
        "ARGUS_GCS_FT_REDIS".into(),
        "redis://:other@127.0.0.1:6390".into(),
    );
    let out = support::run_bin(&["config"], &env);
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ARGUS_GCS_FT_REDIS_PASSWORD_FILE") && !err.contains("other@"),
        "{err}"
    );
}

/// Ray's token authentication: the first head makes the cluster's token
/// beside the record (mode 0600), its Ray gets it in its environment and
/// never in argv; a worker's Ray gets the same one; each node keeps a copy
/// in its state folder; a later head reads the token instead of making a
/// new one. An operator's RAY_AUTH_TOKEN wins, a bad one starts no Ray and
/// names the variable, and RAY_AUTH_MODE=disabled starts Ray without a
/// token, with a warning at the start.
#[test]
fn the_first_head_makes_the_clusters_token_and_every_ray_gets_it_in_its_environment() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    assert!(!sb.token_file().exists());
    let henv = sb.env("h", "head");
    let mut h = Agent::start(&sb, "h", &henv);
    h.wait_for("record", Duration::from_secs(15), |_| sb.record().is_some());
    let token = std::fs::read_to_string(sb.token_file()).unwrap();
    let token = token.trim();
    assert_eq!(token.len(), 64, "{token}");
    let mode = std::fs::metadata(sb.token_file())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("worker's ray", Duration::from_secs(15), |_| {
        !sb.ray_starts("w").is_empty()
    });
    for name in ["h", "w"] {
        let s = &sb.ray_starts(name)[0];
        assert_eq!(s["env_auth_mode"], "token", "{name}: {s}");
        assert_eq!(s["env_auth_token"], token, "{name}: {s}");
        assert!(s["env_auth_token_path"].is_null(), "{name}: {s}");
        assert!(!s["argv"].to_string().contains(token), "{name}: argv {s}");
        let copy = sb.path().join(format!("state-{name}")).join("auth_token");
        assert_eq!(
            std::fs::read_to_string(&copy).unwrap().trim(),
            token,
            "{name}"
        );
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}: no Ray user here, so no group");
    }
    w.signal(libc::SIGTERM);
    w.wait_exit(Duration::from_secs(10));
    h.signal(libc::SIGTERM);
    h.wait_exit(Duration::from_secs(10));

    // A later head reads the cluster's token; an operator's wins.
    let operator = "operator-token-0123456789abcdef0123456789";
    for (name, extra, want) in [
        ("h2", vec![], Some(token)),
        ("h3", vec![("RAY_AUTH_TOKEN", operator)], Some(operator)),
        ("h4", vec![("RAY_AUTH_MODE", "disabled")], None),
    ] {
        let mut env = sb.env(name, "head");
        for (k, v) in &extra {
            env.insert(k.to_string(), v.to_string());
        }
        let mut a = Agent::start(&sb, name, &env);
        a.wait_for("ray start", Duration::from_secs(15), |_| {
            !sb.ray_starts(name).is_empty()
        });
        let s = &sb.ray_starts(name)[0];
        match want {
            Some(t) => {
                assert_eq!(s["env_auth_mode"], "token", "{name}: {s}");
                assert_eq!(s["env_auth_token"], t, "{name}: {s}");
            }
            None => {
                assert_eq!(s["env_auth_mode"], "disabled", "{name}: {s}");
                assert!(s["env_auth_token"].is_null(), "{name}: {s}");
                assert!(
                    a.log().contains("WITHOUT token authentication"),
                    "{name}: no warning\n{}",
                    a.log()
                );
                let copy = sb.path().join(format!("state-{name}")).join("auth_token");
                assert!(!copy.exists(), "{name}: a copy of no token");
            }
        }
        assert_eq!(
            std::fs::read_to_string(sb.token_file()).unwrap().trim(),
            token,
            "{name}: the cluster's token changed"
        );
        a.signal(libc::SIGTERM);
        a.wait_exit(Duration::from_secs(10));
    }

    // A bad operator token: no Ray, the error names the variable.
    let mut env = sb.env("h5", "head");
    env.insert("RAY_AUTH_TOKEN".into(), "short".into());
    let mut a = Agent::start(&sb, "h5", &env);
    a.wait_for("the error", Duration::from_secs(15), |a| {
        a.log().contains("RAY_AUTH_TOKEN: a token has")
    });
    assert!(
        sb.ray_starts("h5").is_empty(),
        "a Ray started with a bad token"
    );
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(10));
}
