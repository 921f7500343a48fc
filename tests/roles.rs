//! Black-box tests of the head and worker roles (R-HEAD-*, R-WRK-*) with
//! the fake `ray`: the test plays the other side through the discovery
//! record on a shared folder.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::{publish, HeadRecord, HeadState, SCHEMA_VERSION};
use support::{alive, Agent, Sandbox};

fn record(ip: &str, port: u16, instance: &str, generation: u64, seq: u64) -> HeadRecord {
    let now = SystemTime::now();
    HeadRecord {
        schema_version: SCHEMA_VERSION,
        cluster_name: "argus-ray".into(),
        head_ip: ip.into(),
        gcs_port: port,
        dashboard_port: 8265,
        job_server_url: format!("http://{ip}:8265"),
        updated_at: argus_discovery::record::rfc3339(now),
        expires_at: argus_discovery::record::rfc3339(now + Duration::from_secs(3)),
        instance_id: instance.into(),
        holder_id: "test-head".into(),
        generation,
        seq,
        state: HeadState::Running,
        ttl_s: 3.0,
    }
}

/// A pretend head refreshing the record every 200 ms until told otherwise.
struct FakeHead {
    current: Arc<Mutex<Option<HeadRecord>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHead {
    fn start(sb: &Sandbox, rec: HeadRecord) -> Self {
        let current = Arc::new(Mutex::new(Some(rec)));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, path) = (current.clone(), stop.clone(), sb.head_file());
        let thread = std::thread::spawn(move || {
            let mut seq = 0;
            while !s.load(Ordering::Relaxed) {
                if let Some(mut r) = c.lock().unwrap().clone() {
                    seq += 1;
                    r.seq = seq;
                    publish(&path, &r.to_bytes()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Self {
            current,
            stop,
            thread: Some(thread),
        }
    }

    /// Replaces what is published (None pauses refreshing: a stale record).
    fn set(&self, rec: Option<HeadRecord>) {
        *self.current.lock().unwrap() = rec;
    }
}

impl Drop for FakeHead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
    a.wait_for("ray start", Duration::from_secs(10), |_| {
        !sb.ray_starts("h").is_empty()
    });
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        sb.record().is_none(),
        "published before the GCS port accepted: {:?}",
        sb.record()
    );
    a.wait_for("record", Duration::from_secs(10), |_| sb.record().is_some());
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

#[test]
fn head_withdraws_at_once_when_ray_dies_and_republishes_a_new_instance() {
    let sb = Sandbox::new();
    let mut a = Agent::start(&sb, "h", &sb.env("h", "head"));
    a.wait_for("record", Duration::from_secs(10), |_| sb.record().is_some());
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
    a.wait_for("head a publishes", Duration::from_secs(10), |_| {
        sb.record().is_some()
    });
    let mut env_b = sb.env("b", "head");
    env_b.insert("ARGUS_NODE_IP".into(), "127.0.0.2".into());
    let mut b = Agent::start(&sb, "b", &env_b);
    b.wait_for("standby", Duration::from_secs(10), |b| {
        b.state() == "standby"
    });
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

#[test]
fn standby_takes_over_a_record_that_stops_changing_for_a_ttl() {
    let sb = Sandbox::new();
    // A crashed head's leftover: running, but nobody refreshes it.
    let stale = record("127.0.0.9", 1234, "dead", 4, 10);
    publish(&sb.head_file(), &stale.to_bytes()).unwrap();
    let t0 = Instant::now();
    let mut b = Agent::start(&sb, "b", &sb.env("b", "head"));
    b.wait_for("takeover", Duration::from_secs(15), |_| {
        sb.record()
            .is_some_and(|r| r["head_ip"] == "127.0.0.1" && r["state"] == "running")
    });
    assert!(
        t0.elapsed() >= Duration::from_secs(3),
        "took over before the TTL: {:?}",
        t0.elapsed()
    );
    assert_eq!(sb.record().unwrap()["generation"], 5);
}

#[test]
fn worker_joins_only_a_record_seen_changing_and_rejoins_on_address_change() {
    let sb = Sandbox::new();
    let stale = record("127.0.0.5", 4000, "i1", 1, 1);
    publish(&sb.head_file(), &stale.to_bytes()).unwrap();
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("waiting", Duration::from_secs(5), |w| {
        w.state() == "waiting_for_head"
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        sb.ray_starts("w").is_empty(),
        "joined a record never seen changing"
    );
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 1, 1));
    w.wait_for("join", Duration::from_secs(5), |_| {
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
    w.wait_for("rejoin", Duration::from_secs(5), |_| {
        sb.ray_starts("w").len() >= 2
    });
    let took = t0.elapsed();
    assert_eq!(addresses(&sb, "w")[1], "127.0.0.6:4001");
    assert!(
        took < Duration::from_millis(2500),
        "rejoin took {took:?} with POLL 0.5 s"
    );
    assert!(!alive(first_pid), "old ray still running");
}

#[test]
fn worker_rejoins_a_restarted_head_at_the_same_address() {
    let sb = Sandbox::new();
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "before", 1, 1));
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("join", Duration::from_secs(5), |_| {
        !sb.ray_starts("w").is_empty()
    });
    head.set(Some(record("127.0.0.5", 4000, "after", 1, 1)));
    w.wait_for("rejoin", Duration::from_secs(5), |_| {
        sb.ray_starts("w").len() >= 2
    });
    assert_eq!(w.status().unwrap()["head_instance_id"], "after");
}

#[test]
fn worker_keeps_ray_through_garbage_stale_and_lower_generation_records() {
    let sb = Sandbox::new();
    let head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 3, 1));
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("join", Duration::from_secs(5), |_| {
        !sb.ray_starts("w").is_empty()
    });
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    // Garbage.
    head.set(None);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(sb.head_file(), b"{\"schema_version\": 1, \"head_ip\": tru").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // Stale: a valid record that stops changing for longer than the TTL.
    publish(
        &sb.head_file(),
        &record("127.0.0.5", 4000, "i1", 3, 99).to_bytes(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert!(w.log().contains("keeping ray running"), "{}", w.log());
    // A fenced old head (lower generation) at another address is ignored.
    head.set(Some(record("127.0.0.7", 4000, "zombie", 2, 1)));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(sb.ray_starts("w").len(), 1, "ray restarted: {}", w.log());
    assert!(alive(pid), "ray died");
    // The real head comes back fresh: still the same Ray, no restart.
    head.set(Some(record("127.0.0.5", 4000, "i1", 3, 1)));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(sb.ray_starts("w").len(), 1);
    assert!(alive(pid));
}

#[test]
fn worker_waits_with_a_reason_and_restarts_ray_when_it_exits() {
    let sb = Sandbox::new();
    let mut w = Agent::start(&sb, "w", &sb.env("w", "worker"));
    w.wait_for("waiting", Duration::from_secs(5), |w| {
        w.state() == "waiting_for_head"
    });
    let st = w.status().unwrap();
    assert!(
        st["reason"].as_str().unwrap().contains("does not exist"),
        "{st}"
    );
    assert!(w.log().contains("waiting for head"), "{}", w.log());
    assert!(!w.log().contains("ERROR"));
    let _head = FakeHead::start(&sb, record("127.0.0.5", 4000, "i1", 1, 1));
    w.wait_for("join", Duration::from_secs(5), |_| {
        !sb.ray_starts("w").is_empty()
    });
    let pid = sb.ray_starts("w")[0]["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    w.wait_for("restart", Duration::from_secs(5), |_| {
        sb.ray_starts("w").len() >= 2
    });
    assert_eq!(w.status().unwrap()["restarts"], 1);
    // Healthy while running.
    w.wait_for("healthy", Duration::from_secs(5), |w| {
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
    a.wait_for("publishes", Duration::from_secs(10), |_| {
        sb.record().is_some()
    });
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
