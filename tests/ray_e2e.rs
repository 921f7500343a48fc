//! End to end on real Ray 2.53.0 (installed by scripts/setup-ray-venv.sh
//! into target/ray-venv): a head agent and a worker agent on this machine
//! (node IPs 127.0.0.2 and 127.0.0.3) sharing a temp folder, through the
//! faults of issue 2: raylet killed, GCS killed, both stopped.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{alive, free_port, Agent, Sandbox};

fn venv() -> PathBuf {
    let v = support::repo().join("target/ray-venv");
    assert!(
        v.join("bin/ray").exists(),
        "real-Ray tests need ray==2.53.0 in {}: run scripts/setup-ray-venv.sh (scripts/test does)",
        v.display()
    );
    v
}

/// The environment of one agent running real Ray. Ray's own ports are
/// `base` to `base + 60`: each node of this file has its own block in
/// 31000..31360, below Linux's ephemeral range (32768 and up, where any
/// outgoing connection of a test running beside this one may hold a port)
/// and above tests/hostnet_e2e.rs's blocks (20000..30128).
fn ray_env(
    sb: &Sandbox,
    name: &str,
    role: &str,
    ip: &str,
    gcs: u16,
    base: u16,
) -> BTreeMap<String, String> {
    let v = venv();
    let mut e = sb.env(name, role);
    // Every Ray port comes from ARGUS_RAY_EXTRA_ARGS below (a flag may not
    // also come from its variable).
    e.remove("ARGUS_RAY_DASHBOARD_AGENT_LISTEN_PORT");
    e.remove("ARGUS_RAY_CLIENT_SERVER_PORT");
    e.insert(
        "ARGUS_RAY_BIN".into(),
        v.join("bin/ray").display().to_string(),
    );
    e.insert(
        "PATH".into(),
        format!(
            "{}:{}",
            v.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    );
    e.insert("ARGUS_NODE_IP".into(), ip.into());
    e.insert("ARGUS_RAY_PORT".into(), gcs.to_string());
    e.insert("ARGUS_TTL_S".into(), "6".into());
    e.insert("ARGUS_REFRESH_S".into(), "1".into());
    e.insert("ARGUS_POLL_S".into(), "1".into());
    e.insert("ARGUS_STOP_GRACE_S".into(), "6".into());
    e.insert("ARGUS_RESTART_BACKOFF_MIN_S".into(), "0.5".into());
    e.insert("ARGUS_RESTART_BACKOFF_MAX_S".into(), "4".into());
    e.insert("HOME".into(), sb.path().display().to_string());
    e.insert("RAY_USAGE_STATS_ENABLED".into(), "0".into());
    // Ray's token authentication, with an operator's token so the drivers
    // below can hold it too (the cluster-made token: tests/roles.rs and the
    // compose tests).
    e.insert("RAY_AUTH_TOKEN".into(), RAY_E2E_TOKEN.into());
    let mut extra = format!(
        "--num-cpus=1 --object-store-memory=80000000 --disable-usage-stats \
         --node-manager-port={} --object-manager-port={} --metrics-export-port={} \
         --dashboard-agent-listen-port={} --dashboard-agent-grpc-port={} \
         --runtime-env-agent-port={} --min-worker-port={} --max-worker-port={}",
        base,
        base + 1,
        base + 2,
        base + 3,
        base + 4,
        base + 5,
        base + 10,
        base + 60
    );
    if role == "head" {
        extra.push_str(&format!(
            " --ray-client-server-port={} --temp-dir={}",
            base + 6,
            sb.path().join("ray").display()
        ));
    }
    e.insert("ARGUS_RAY_EXTRA_ARGS".into(), extra);
    e
}

/// The token every agent and driver of these clusters uses.
/// The bound of every wait that spans a start of Ray on a node (the head's
/// publish, a raylet, a worker's join, a new instance after a GCS kill).
/// The head waits up to 60 s for its raylet before it publishes anyway
/// (node/src/lib.rs `HEAD_RAYLET_WAIT`), so a bound must be above that and
/// Ray's own start: in a cold CI run (2026-12-02) beside engine_vllm's two
/// vLLM engines the head's raylet took 75 s to start, a 1 s write to /tmp
/// timed out, and 60 s bounds failed nodes that were starting as designed.
/// A node that never starts still fails, with both agents' logs.
const RAY_START: Duration = Duration::from_secs(150);

const RAY_E2E_TOKEN: &str = "ray-e2e-token-0123456789abcdef0123456789abcdef";

/// How a test asks Ray for its nodes.
#[derive(Clone, Copy, Debug)]
enum Ask {
    /// `GcsClient.get_all_node_info()`: works as soon as the GCS answers.
    Gcs,
    /// A driver: `ray.init(address=…)` then `ray.nodes()`; needs the head's
    /// raylet registered too.
    Driver,
}

/// Asks the cluster for its nodes through Ray's Python API until every IP
/// in `want` has an alive node whose id is not in `old` (a node that
/// rejoined registers under a new id), or `timeout` passes.
fn wait_nodes(
    gcs: &str,
    want: &[&str],
    old: &[String],
    timeout: Duration,
    ask: Ask,
) -> Result<(Vec<Value>, f64), String> {
    wait_nodes_marked(gcs, want, old, timeout, ask, None)
}

/// `wait_nodes`, creating the file `polling` once its query has been
/// answered (or has failed) a first time: evidence that it is watching.
fn wait_nodes_marked(
    gcs: &str,
    want: &[&str],
    old: &[String],
    timeout: Duration,
    ask: Ask,
    polling: Option<&std::path::Path>,
) -> Result<(Vec<Value>, f64), String> {
    let marker = polling.map(|p| p.display().to_string()).unwrap_or_default();
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        let script = format!(
            r#"
import json, sys, time
t0 = time.time()
want, old, mode = set({want:?}), set({old:?}), "{mode:?}"
if mode == "Gcs":
    from ray._raylet import GcsClient
    from ray.core.generated import gcs_pb2
    def nodes():
        info = GcsClient(address="{gcs}").get_all_node_info(timeout=2)
        return [dict(ip=n.node_manager_address, alive=n.state == gcs_pb2.GcsNodeInfo.ALIVE, id=i.hex()) for i, n in info.items()]
else:
    import ray
    ray.init(address="{gcs}", _node_ip_address="127.0.0.2", logging_level="ERROR", log_to_driver=False)
    def nodes():
        return [dict(ip=n["NodeManagerAddress"], alive=n["Alive"], id=n["NodeID"]) for n in ray.nodes()]
while True:
    try:
        ns = nodes()
    except Exception as e:
        ns = []
    if "{marker}":
        open("{marker}", "a").close()
    alive = {{n["ip"] for n in ns if n["alive"] and n["id"] not in old}}
    if want <= alive or time.time() > t0 + {left}:
        print(json.dumps(dict(nodes=ns, t=time.time() - t0, wall=time.time(), ok=want <= alive)))
        break
    time.sleep(0.2)
"#,
            mode = ask,
        );
        let out = Command::new(venv().join("bin/python"))
            .arg("-c")
            .arg(script)
            .env("RAY_USAGE_STATS_ENABLED", "0")
            .env("RAY_AUTH_MODE", "token")
            .env("RAY_AUTH_TOKEN", RAY_E2E_TOKEN)
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<Value>(stdout.lines().last().unwrap_or("")) {
            Ok(v) if v["ok"] == true => {
                let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
                return Ok((nodes, v["wall"].as_f64().unwrap_or(0.0)));
            }
            Ok(v) => last = format!("nodes not alive in time: {}", v["nodes"]),
            Err(_) => {
                last = format!(
                    "{ask:?} query failed: {}\n{}",
                    stdout,
                    String::from_utf8_lossy(&out.stderr)
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    Err(last)
}

fn daemon_pid(agent: &Agent, name: &str) -> Option<i32> {
    let ray_pid = agent.status()?["ray_pid"].as_i64()? as i32;
    let mut stack = vec![ray_pid];
    while let Some(p) = stack.pop() {
        for (c, n) in support::children_of(p) {
            if n == name && alive(c as i64) {
                return Some(c);
            }
            stack.push(c);
        }
    }
    None
}

fn leftovers(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i64>() else {
            continue;
        };
        if !alive(pid) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                out.push(format!("{pid}: {cmd}"));
            }
        }
    }
    out
}

#[test]
fn head_and_worker_on_real_ray_survive_raylet_and_gcs_kills_and_stop_cleanly() {
    let sb = Sandbox::new();
    let gcs_port = free_port();
    let gcs = format!("127.0.0.2:{gcs_port}");
    let head_env = ray_env(&sb, "head", "head", "127.0.0.2", gcs_port, 31000);
    let mut worker_env = ray_env(&sb, "worker", "worker", "127.0.0.3", gcs_port, 31100);
    worker_env.insert("ARGUS_RAY_PORT".into(), free_port().to_string());

    let mut head = Agent::start(&sb, "head", &head_env);
    let published = || sb.record().is_some_and(|r| r["state"] == "running");
    // Above the head's own wait for its raylet (RAY_START): in a cold run
    // beside a busy loop (load 58 on 2 cores) the GCS came up after 11 s
    // and the raylet had not started at 60 s (its log still empty).
    let t0 = std::time::Instant::now();
    while !published() && t0.elapsed() < RAY_START {
        std::thread::sleep(Duration::from_millis(100));
    }
    if !published() {
        // Seen before under load: the agent alive, its probe of the GCS
        // port never answered, or its raylet not started. Ray's own
        // account first.
        let logs = sb.path().join("ray/session_latest/logs");
        for f in ["gcs_server.out", "gcs_server.err", "raylet.out"] {
            let text = std::fs::read_to_string(logs.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            eprintln!("--- {f} (last lines) ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        // The agent's account, and the failure (120 s passed already).
        head.wait_for(
            "head publishes (after RAY_START)",
            Duration::from_secs(1),
            |_| published(),
        );
    }
    // The worker starts after the head (both nodes share one session dir).
    head.wait_for("head raylet", RAY_START, |h| {
        daemon_pid(h, "raylet").is_some()
    });
    let mut worker = Agent::start(&sb, "worker", &worker_env);
    worker.wait_for("worker joins", RAY_START, |w| w.state() == "running");
    // Both nodes alive in ray.nodes() from a driver (panics with both logs).
    let both_alive = |head: &Agent, worker: &Agent| {
        wait_nodes(
            &gcs,
            &["127.0.0.2", "127.0.0.3"],
            &[],
            Duration::from_secs(120),
            Ask::Driver,
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n--- head ---\n{}\n--- worker ---\n{}",
                head.log(),
                worker.log()
            )
        })
    };
    let (nodes, _) = both_alive(&head, &worker);
    eprintln!("both nodes alive: {nodes:?}");

    // 1. SIGKILL the worker's raylet: the worker rejoins.
    let old_worker: Vec<String> = nodes
        .iter()
        .filter(|n| n["ip"] == "127.0.0.3")
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    let raylet = daemon_pid(&worker, "raylet").expect("worker raylet");
    unsafe { libc::kill(raylet, libc::SIGKILL) };
    worker.wait_for("worker restarts ray", Duration::from_secs(30), |w| {
        w.status()
            .is_some_and(|s| s["restarts"].as_u64() >= Some(1) && s["state"] == "running")
    });
    let (nodes, _) = wait_nodes(
        &gcs,
        &["127.0.0.3"],
        &old_worker,
        Duration::from_secs(120),
        Ask::Driver,
    )
    .unwrap_or_else(|e| panic!("{e}\n--- worker ---\n{}", worker.log()));
    eprintln!("worker rejoined after its raylet was killed: {nodes:?}");

    // 2. SIGKILL the head's gcs_server: the head restarts Ray with a new
    //    instance id, the worker rejoins it (back in ray.nodes()).
    let instance = sb.record().unwrap()["instance_id"].clone();
    let before: Vec<String> = nodes
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    let gcs_pid = daemon_pid(&head, "gcs_server").expect("gcs_server");
    // The checker polls the GCS from before the kill, so its own start-up
    // does not count; it reports the wall time it first saw the worker.
    let polling_seen = sb.path().join("checker-polling");
    let checker = {
        let gcs = gcs.clone();
        let polling = polling_seen.clone();
        std::thread::spawn(move || {
            wait_nodes_marked(
                &gcs,
                &["127.0.0.3"],
                &before,
                Duration::from_secs(90),
                Ask::Gcs,
                Some(&polling),
            )
        })
    };
    head.wait_for("the checker polling", Duration::from_secs(60), |_| {
        polling_seen.exists()
    });
    unsafe { libc::kill(gcs_pid, libc::SIGKILL) };
    head.wait_for("new instance published", RAY_START, |_| {
        sb.record()
            .is_some_and(|r| r["state"] == "running" && r["instance_id"] != instance)
    });
    let published = Instant::now();
    let published_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (nodes, seen_wall) = checker.join().unwrap().unwrap_or_else(|e| {
        panic!(
            "{e}\n--- head ---\n{}\n--- worker ---\n{}\n--- worker status ---\n{:?}\n--- worker threads ---\n{}",
            head.log(),
            worker.log(),
            worker.status(),
            worker.threads()
        )
    });
    let back = Duration::from_secs_f64((seen_wall - published_wall).max(0.0));
    eprintln!("worker back in the new GCS {back:?} after the new head record: {nodes:?}");
    // No bound on `back` here: it is mostly Ray's own start-up (a raylet
    // took 10-15 s on a loaded CI machine, the head's as well as the
    // worker's) and figures come from scripts/bench-node.py. The agent's
    // part, detection within a poll period plus the jitter, is bounded in
    // tests/roles.rs with a stand-in Ray; here it must simply rejoin the
    // new instance (checked below; the checker bounds the wait at 90 s).
    // And in ray.nodes() from a driver, once the head's raylet is up too.
    let (nodes, _) = both_alive(&head, &worker);
    eprintln!(
        "driver sees after gcs restart {:?}: {nodes:?}",
        published.elapsed()
    );
    assert_eq!(
        worker.status().unwrap()["head_instance_id"],
        sb.record().unwrap()["instance_id"]
    );

    // 3. SIGTERM both: exit 0 within 10 s, no Ray process left.
    worker.signal(libc::SIGTERM);
    head.signal(libc::SIGTERM);
    let (ws, wt) = worker
        .wait_exit(Duration::from_secs(15))
        .expect("worker did not exit");
    let (hs, ht) = head
        .wait_exit(Duration::from_secs(15))
        .expect("head did not exit");
    eprintln!("stop took worker {wt:?}, head {ht:?}");
    assert_eq!(ws.code(), Some(0), "{}", worker.log());
    assert_eq!(hs.code(), Some(0), "{}", head.log());
    assert!(wt < Duration::from_secs(10) && ht < Duration::from_secs(10));
    // Killed processes may take a moment to be reaped by their parents.
    let markers = [
        sb.path().display().to_string(),
        gcs.clone(),
        "127.0.0.3".into(),
    ];
    let t = Instant::now();
    let left = loop {
        let left: Vec<String> = markers.iter().flat_map(|m| leftovers(m)).collect();
        if left.is_empty() || t.elapsed() > Duration::from_secs(10) {
            break left;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        left.is_empty(),
        "ray processes left behind 10 s after stop: {left:#?}"
    );
    assert_eq!(sb.record().unwrap()["state"], "stopped");
}

/// A real `redis-server` on a loopback port, stopped on drop.
struct Redis {
    child: std::process::Child,
    port: u16,
}

impl Redis {
    fn start(dir: &std::path::Path) -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("GCS FT tests need redis-server (apt-get install redis-server; scripts/test does): {e}")
            });
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < until,
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Redis { child, port }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a Ray driver script against `gcs`; returns its last stdout line
/// parsed as JSON, or the error with the script's output.
fn driver(gcs: &str, body: &str) -> Result<Value, String> {
    let script = format!(
        "import json, ray\nray.init(address=\"{gcs}\", _node_ip_address=\"127.8.0.2\", logging_level=\"ERROR\", log_to_driver=False, namespace=\"ft\")\n{body}\n"
    );
    let out = Command::new(venv().join("bin/python"))
        .arg("-c")
        .arg(&script)
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", RAY_E2E_TOKEN)
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).map_err(|_| {
        format!(
            "driver failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn with_gcs_ft_a_worker_rides_a_head_gcs_crash_through_and_its_detached_actor_survives() {
    let sb = Sandbox::new();
    let redis = Redis::start(sb.path());
    let gcs_port = free_port();
    let gcs = format!("127.8.0.2:{gcs_port}");
    let mut head_env = ray_env(&sb, "head", "head", "127.8.0.2", gcs_port, 31200);
    head_env.insert(
        "ARGUS_GCS_FT_REDIS".into(),
        format!("127.0.0.1:{}", redis.port),
    );
    let mut worker_env = ray_env(&sb, "worker", "worker", "127.8.0.3", gcs_port, 31300);
    worker_env.insert("ARGUS_RAY_PORT".into(), free_port().to_string());

    let mut head = Agent::start(&sb, "head", &head_env);
    head.wait_for("head publishes", RAY_START, |_| {
        sb.record().is_some_and(|r| r["state"] == "running")
    });
    assert_eq!(sb.record().unwrap()["gcs_ft"], true);
    head.wait_for("head raylet", RAY_START, |h| {
        daemon_pid(h, "raylet").is_some()
    });
    let mut worker = Agent::start(&sb, "worker", &worker_env);
    worker.wait_for("worker joins", RAY_START, |w| w.state() == "running");
    let logs = |head: &Agent, worker: &Agent| {
        format!(
            "--- head ---\n{}\n--- worker ---\n{}",
            head.log(),
            worker.log()
        )
    };
    let (nodes, _) = wait_nodes(
        &gcs,
        &["127.8.0.2", "127.8.0.3"],
        &[],
        Duration::from_secs(120),
        Ask::Driver,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&head, &worker)));
    let worker_id = nodes
        .iter()
        .find(|n| n["ip"] == "127.8.0.3" && n["alive"] == true)
        .map(|n| n["id"].clone())
        .unwrap();
    // A detached actor on the worker, created before the fault.
    let made = driver(
        &gcs,
        r#"
@ray.remote(num_cpus=0, resources={"worker_node": 0.01})
class Keeper:
    def __init__(self):
        self.n = 0
    def ping(self):
        self.n += 1
        return [self.n, ray.get_runtime_context().get_node_id()]
k = Keeper.options(name="keeper", lifetime="detached").remote()
print(json.dumps(ray.get(k.ping.remote(), timeout=60)))
"#,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&head, &worker)));
    assert_eq!(made[0], 1);
    // The fault's effect is judged against the state just before it: on a
    // loaded machine the worker's first raylet can give up during start-up
    // (seen in CI under `stress-ng --cpu 2`: killed after 34 s, restarted
    // once, all before the fault), which says nothing about the ride-through.
    let before = worker.status().unwrap();
    let (worker_ray_pid, restarts_before) = (before["ray_pid"].clone(), before["restarts"].clone());
    if restarts_before != 0 {
        eprintln!("note: the worker's Ray restarted before the fault: {before}");
    }

    // SIGKILL the head's gcs_server: the head agent restarts its Ray, whose
    // GCS recovers from Redis at the same address.
    let instance = sb.record().unwrap()["instance_id"].clone();
    let gcs_pid = daemon_pid(&head, "gcs_server").expect("gcs_server");
    let t0 = Instant::now();
    unsafe { libc::kill(gcs_pid, libc::SIGKILL) };
    head.wait_for("new instance published", RAY_START, |_| {
        sb.record()
            .is_some_and(|r| r["state"] == "running" && r["instance_id"] != instance)
    });
    let (nodes, _) = wait_nodes(
        &gcs,
        &["127.8.0.2", "127.8.0.3"],
        &[],
        Duration::from_secs(60),
        Ask::Gcs,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&head, &worker)));
    let back = t0.elapsed();
    eprintln!(
        "gcs ft: both nodes alive {back:?} after the head's gcs_server was killed: {nodes:?}"
    );
    assert!(
        nodes
            .iter()
            .any(|n| n["id"] == worker_id && n["alive"] == true),
        "the worker's node id changed (its Ray restarted): was {worker_id}, now {nodes:?}\n{}",
        logs(&head, &worker)
    );
    let st = worker.status().unwrap();
    assert_eq!(
        st["ray_pid"],
        worker_ray_pid,
        "the worker's Ray was restarted\n{}",
        logs(&head, &worker)
    );
    assert_eq!(st["restarts"], restarts_before, "{st}");
    assert!(worker.log().contains("ride-through"), "{}", worker.log());
    // The actor created before the fault answers after it, with its state.
    let after = driver(
        &gcs,
        r#"
k = ray.get_actor("keeper")
print(json.dumps(ray.get(k.ping.remote(), timeout=60)))
"#,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&head, &worker)));
    assert_eq!(after[0], 2, "the actor lost its state: {after}");
    assert_eq!(after[1], made[1], "the actor moved: {after} vs {made}");
    // The target is 10 s on a calm machine: scripts/bench-failover.py
    // measures it and the figure is printed above; the test holds the
    // behaviour (same worker Ray, same actor state), bounded only by the
    // waits' deadlines (a timed bound failed at 30.9 s under a CPU hog).

    worker.signal(libc::SIGTERM);
    head.signal(libc::SIGTERM);
    assert_eq!(
        worker
            .wait_exit(Duration::from_secs(15))
            .expect("worker exit")
            .0
            .code(),
        Some(0)
    );
    assert_eq!(
        head.wait_exit(Duration::from_secs(15))
            .expect("head exit")
            .0
            .code(),
        Some(0)
    );
    drop(redis);
}

/// The dead-actor reaper kills a process only when it is the dead actor's
/// worker (a live Serve replica may have a dead actor's pid, with that
/// actor's log in the node's session folder): tests/fixtures/
/// reaper_identity.py on a real Ray worker tries a planted log, a symlink,
/// a prefix, another case and another pid, then the right id and pid.
#[test]
fn the_dead_actor_reaper_kills_only_the_worker_it_names() {
    let sb = Sandbox::new();
    let temp = sb.path().join("ray");
    std::fs::create_dir_all(&temp).unwrap();
    let out = Command::new(venv().join("bin/python"))
        .arg(support::repo().join("tests/fixtures/reaper_identity.py"))
        .arg(&temp)
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("HOME", sb.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "no JSON from reaper_identity.py ({e}): {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["failures"], serde_json::json!([]), "{v}");
    assert_eq!(v["tried"].as_array().map(Vec::len), Some(7), "{v}");
    assert!(out.status.success(), "{v}");
}
