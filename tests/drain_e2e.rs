//! Nodes taken out on purpose lose no request, a crashed one only the
//! requests in flight on it (R-SERVE-4, R-SERVE-5), on the README's compose
//! cluster with its lb, the way users run an endpoint: a Serve application
//! in an engine image (the stand-in engine, whose POST answers take 1.5 s,
//! 4 replicas in engine containers), POST and GET clients calling it through
//! the lb in a loop with no retries (tests/fixtures/serve_load.py). Phases:
//! - steady: the baseline;
//! - crash: `docker kill` of a worker, then `docker start`: only requests in
//!   flight on it may fail, with a status a client can retry (while the
//!   replicas are spread over both workers and the lb routes to both: a
//!   node holding every replica, or the only proxy in the lb's rotation,
//!   takes the endpoint down with it, drain or not);
//! - stop+start worker-1, then worker-2: `docker stop` (the agent drains:
//!   Serve's replicas move to the other worker first), `docker start` (the
//!   roll below drains each worker once more);
//! - stop+start head: `docker stop` + `docker start` of the head (GCS fault
//!   tolerance: the workers' proxies and replicas ride it through, and the
//!   actor reaper kills nothing that serves);
//! - roll: scripts/roll-cluster.sh replaces both workers and then the head
//!   with a new image tag, one at a time; each drain moved the replicas to
//!   the other worker, and the roll must end with them spread over both
//!   again (R-SERVE-8), saying so ("balanced: ...");
//! - upgrade: `serve deploy` of the endpoint in another engine image whose
//!   replicas take 8 s to start (a cold start); the node image's Serve rolls
//!   it start-first (R-SERVE-7: a new replica runs before an old one stops),
//!   so no POST waits for a cold start (none longer than twice the steady
//!   p99 or its own 1.5 s plus half the 8 s cold start, whichever is
//!   longer); spread afterwards;
//! - crash worker-2 after the roll: `docker kill`, then `docker start`: with
//!   the replicas spread again, only what was in flight on it may fail;
//! - after: the baseline again.
//!
//! Every request is counted; the stop, roll, upgrade and after phases must
//! have 0 failed. Figures (per phase: sent, failed by status, p50, p99; each
//! drain's duration) are printed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/compose.rs"]
mod compose;

use compose::{
    build_images, build_lb_image, build_redis_image, engine_image, free_port, inspect, log,
    node_image, output, require_docker, run, with_stdin, workspace_root, Cluster,
};
use serde_json::Value;

const APP: &str = "drain";
const REPLICAS: u32 = 4;
const POST_DELAY_S: f64 = 1.5;
/// The upgraded version's cold start.
const UPGRADE_START_DELAY_S: f64 = 8.0;

fn serve_config(c: &Cluster, engine: &str, start_delay_s: f64, replicas: u32) -> String {
    format!(
        r#"proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: 8000
applications:
  - name: {APP}
    route_prefix: /{APP}
    import_path: serve.vllm.app:app_builder
    runtime_env:
      container:
        image: {image}
        run_options: ["-v", "{cache}:/models:ro"]
    args:
      model: stub
      model_path: /models
      post_delay_s: {POST_DELAY_S}
      start_delay_s: {start_delay_s}
    deployments:
      - name: EngineStub
        num_replicas: {replicas}
        graceful_shutdown_timeout_s: 30
        ray_actor_options:
          num_cpus: 0.1
          resources:
            worker_node: 1
"#,
        image = engine_image(engine),
        cache = c.model_cache.display(),
    )
}

fn deploy(c: &Cluster, engine: &str, start_delay_s: f64) {
    deploy_n(c, engine, start_delay_s, REPLICAS);
}

fn deploy_n(c: &Cluster, engine: &str, start_delay_s: f64, replicas: u32) {
    let out = with_stdin(
        &[
            "exec",
            "-i",
            &c.container("head"),
            "timeout",
            "120",
            "argus-agent",
            "ray-tool",
            "serve",
            "deploy",
            "-a",
            "http://127.0.0.1:8265",
            "-",
        ],
        &serve_config(c, engine, start_delay_s, replicas),
    );
    assert!(
        out.status.success(),
        "serve deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The load clients' container; removed on drop.
struct Load(String);

impl Drop for Load {
    fn drop(&mut self) {
        let _ = output(Command::new("docker").args(["rm", "-f", &self.0]));
    }
}

fn set_phase(work: &Path, phase: &str) {
    let tmp = work.join("phase.tmp");
    std::fs::write(&tmp, phase).unwrap();
    std::fs::rename(&tmp, work.join("phase")).unwrap();
    log(&format!("phase: {phase}"));
}

fn progress(work: &Path) -> Value {
    std::fs::read_to_string(work.join("progress.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

/// Waits until the clients sent `n` more POSTs (each takes 1.5 s).
fn wait_answers(work: &Path, n: u64, timeout: Duration) {
    let total = |v: &Value| v["posts"].as_u64().unwrap_or(0);
    let from = total(&progress(work));
    let start = Instant::now();
    while total(&progress(work)) < from + n {
        assert!(
            start.elapsed() < timeout,
            "the clients answered fewer than {n} requests in {timeout:?}: {}",
            progress(work)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until Ray sees `n` nodes alive and Serve runs every replica.
fn wait_whole(c: &Cluster, what: &str) {
    c.wait_nodes(what, Duration::from_secs(300), |n| n.len() == 3);
    c.wait_serve_running(&[(APP, REPLICAS)], Duration::from_secs(300));
}

/// Waits until the lb answers 3 GETs in a row with 200 (Serve's RUNNING
/// comes before the lb's health checks mark a worker up).
fn wait_lb_serves(port: &str) {
    use std::io::{Read, Write};
    let start = Instant::now();
    let mut ok = 0;
    while ok < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the lb did not serve /{APP} within 120 s"
        );
        let answered = std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap()))
            .and_then(|mut c| {
                c.set_read_timeout(Some(Duration::from_secs(10)))?;
                write!(
                    c,
                    "GET /{APP} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n"
                )?;
                let mut head = [0u8; 12];
                c.read_exact(&mut head)?;
                Ok(&head[9..12] == b"200")
            })
            .unwrap_or(false);
        ok = if answered { ok + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(200));
    }
    log(&format!(
        "the lb serves /{APP} after {:.1} s",
        start.elapsed().as_secs_f64()
    ));
}

/// Starts, from a driver on `svc`, a detached actor pinned there whose
/// class is named like a Serve replica's, in the "serve" namespace.
fn plant_impostor(c: &Cluster, svc: &str) {
    const IMPOSTOR: &str = r#"
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto", namespace="serve")
here = ray.get_runtime_context().get_node_id()
Fake = type("ServeReplica:drain:Impostor", (), {"node": lambda self: ray.get_runtime_context().get_node_id()})
a = ray.remote(num_cpus=0)(Fake).options(
    name="SERVE_REPLICA::impostor", lifetime="detached",
    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
assert ray.get(a.node.remote()) == here
print("impostor on", here)
"#;
    let out = with_stdin(
        &[
            "exec",
            "-u",
            "ray",
            "-i",
            &c.container(svc),
            "timeout",
            "120",
            "python",
            "-I",
            "-",
        ],
        IMPOSTOR,
    );
    assert!(
        out.status.success(),
        "planting the impostor actor: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    log(&format!(
        "{svc}: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    ));
}

/// `docker stop` of `svc`'s container, which must exit 0 (not killed at
/// the stop timeout); returns the container id, when the stop began (epoch
/// seconds, for `docker logs --since`) and how long it took.
fn stop_cleanly(c: &Cluster, svc: &str) -> (String, String, f64) {
    let id = c.container(svc);
    let since = format!("{}", now_epoch() as u64);
    let t = Instant::now();
    run(Command::new("docker").args(["stop", &id]));
    let took = t.elapsed().as_secs_f64();
    let code = inspect(&id, "{{.State.ExitCode}}");
    log(&format!("docker stop {svc}: {took:.1} s, exit code {code}"));
    assert_eq!(code, "0", "{svc} was killed on stop (exit {code})");
    (id, since, took)
}

/// [`stop_cleanly`] of a worker, whose agent must have drained.
fn docker_stop(c: &Cluster, svc: &str) -> f64 {
    let (id, since, took) = stop_cleanly(c, svc);
    // This stop's lines only (a restarted container keeps its earlier log).
    let logs = output(Command::new("docker").args(["logs", "--since", &since, &id]));
    let text =
        String::from_utf8_lossy(&logs.stdout).to_string() + &String::from_utf8_lossy(&logs.stderr);
    let done = text
        .lines()
        .filter(|l| l.contains("drain done") || l.contains("drain ended early"))
        .collect::<Vec<_>>();
    log(&format!("{svc} drain: {done:?}"));
    assert!(
        done.iter().any(|l| l.contains("drain done")),
        "{svc} did not drain:\n{text}"
    );
    took
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn stops_restarts_and_a_rolling_replacement_lose_no_request_and_a_crash_only_its_own() {
    require_docker();
    build_images(true);
    build_lb_image();
    build_redis_image();
    let serve_port = free_port().to_string();
    let since_start = format!("{}", now_epoch() as u64);
    // As the README brings it up: GCS fault tolerance on.
    let c = Cluster::up_with_lb(&serve_port, &[], &["docker-compose.gcs-ft.yaml"]);
    c.wait_nodes("three nodes alive", Duration::from_secs(300), |n| {
        n.len() == 3
    });
    deploy(&c, "stub-a", 0.0);
    c.wait_serve_running(&[(APP, REPLICAS)], Duration::from_secs(400));
    wait_lb_serves(&serve_port);

    let work = c.tmpdir.join("drain-load");
    std::fs::create_dir_all(&work).unwrap();
    run(Command::new("chmod").args(["0777"]).arg(&work));
    let fixtures = format!(
        "{}:/fixtures:ro",
        workspace_root().join("tests/fixtures").display()
    );
    let name = format!("{}-load", c.project);
    let _load = Load(name.clone());
    run(Command::new("docker").args([
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        &format!("{}_default", c.project),
        "-v",
        &fixtures,
        "-v",
        &format!("{}:/work", work.display()),
        &engine_image("stub-a"),
        "python",
        "/fixtures/serve_load.py",
        "/work",
        &format!("http://lb:8000/{APP}"),
    ]));
    set_phase(&work, "steady");
    wait_answers(&work, 40, Duration::from_secs(300));

    // A crash first, while the replicas are spread over both workers:
    // docker kill, then start. The spread is waited for, not assumed: on a
    // loaded machine Serve placed the first replicas before the second
    // worker could take any, and the crash of the one that held them all
    // failed every request until Serve had started them again (an outage
    // the phase does not test; R-SERVE-8 spreads them within seconds).
    log(&format!(
        "before worker-1's crash: {}",
        wait_spread(&c, "before worker-1's crash")
    ));
    set_phase(&work, "crash worker-1");
    let mut kills = vec![crash_and_restart(&c, &work, "worker-1")];
    wait_whole(&c, "worker-1 back after the crash");
    // A job's actor that calls itself a Serve replica, in Serve's namespace,
    // on worker-1: the drain counts only the actors Serve's controller made,
    // so it must not wait for this one (its deadline is 120 s; the stop
    // below asserts "drain done", not a drain that ran out).
    plant_impostor(&c, "worker-1");
    let mut drains = BTreeMap::new();
    // Once each (the roll below drains both workers once more, under the
    // same checks: the second round this loop used to make).
    for w in ["worker-1", "worker-2"] {
        // Each drain starts from the same health: both workers serving
        // (a worker back from a crash or a restart holds no replica until
        // Serve spreads them again, and its proxy is then leaving the lb).
        log(&format!(
            "before {w}'s stop: {}",
            wait_spread(&c, &format!("before {w}'s stop"))
        ));
        set_phase(&work, &format!("stop+start {w}"));
        drains.insert(format!("stop {w}"), docker_stop(&c, w));
        wait_answers(&work, 10, Duration::from_secs(120));
        run(Command::new("docker").args(["start", &c.container(w)]));
        wait_whole(&c, &format!("{w} back"));
        wait_answers(&work, 10, Duration::from_secs(120));
    }

    // The head: no drain (it holds no replica and is not behind the lb);
    // with GCS FT the workers ride its restart through.
    set_phase(&work, "stop+start head");
    let head_ip = c.ip("head");
    let (head, _, took) = stop_cleanly(&c, "head");
    drains.insert("stop head".into(), took);
    wait_answers(&work, 10, Duration::from_secs(120));
    run(Command::new("docker").args(["start", &head]));
    assert_eq!(
        c.ip("head"),
        head_ip,
        "the head came back at another address"
    );
    wait_whole(&c, "head back");
    wait_answers(&work, 20, Duration::from_secs(120));

    // The rolling replacement to a new tag of the node image.
    let rolled = format!("{}-rolled", node_image());
    run(Command::new("docker").args(["tag", &node_image(), &rolled]));
    set_phase(&work, "roll");
    let mut roll = Command::new(workspace_root().join("scripts/roll-cluster.sh"));
    roll.current_dir(workspace_root())
        .args(["--image", &rolled, "--"])
        .args(c.project_args());
    for (k, v) in &c.env {
        if k != "ARGUS_NODE_IMAGE" {
            roll.env(k, v);
        }
    }
    let t = Instant::now();
    let out = run(&mut roll);
    log(&format!(
        "roll-cluster.sh took {:.1} s:\n{out}",
        t.elapsed().as_secs_f64()
    ));
    for w in ["worker-1", "worker-2", "head"] {
        let img = inspect(&c.container(w), "{{.Config.Image}}");
        assert_eq!(img, rolled, "{w} runs {img} after the roll");
    }
    // R-SERVE-8: the drains moved the replicas together; the roll ends
    // with them spread again, and says so.
    assert!(
        out.contains("roll: ") && out.contains(" balanced: "),
        "the roll did not end balanced:\n{out}"
    );
    wait_whole(&c, "after the roll");
    log(&format!(
        "after the roll: {}",
        wait_spread(&c, "after the roll")
    ));
    wait_answers(&work, 10, Duration::from_secs(120));

    // A start-first upgrade to another engine image with a cold start.
    set_phase(&work, "upgrade");
    let t = Instant::now();
    deploy(&c, "stub-b", UPGRADE_START_DELAY_S);
    wait_engines_of(&c, &engine_image("stub-b"), &engine_image("stub-a"));
    wait_whole(&c, "after the upgrade");
    log(&format!(
        "upgrade to stub-b ({REPLICAS} replicas, {UPGRADE_START_DELAY_S} s cold start each) took {:.1} s; {}",
        t.elapsed().as_secs_f64(),
        wait_spread(&c, "after the upgrade")
    ));
    wait_answers(&work, 10, Duration::from_secs(120));

    // A worker left without replicas (scaled down to one): Serve drains its
    // proxy and removes it once it has had no request for 30 s, while the
    // lb would still send it requests; its agent tells the lb `drain`
    // first, so the removal cuts nothing (failures here fail the test).
    set_phase(&work, "scale to one");
    let since = format!("{}", now_epoch() as u64);
    let removed = removed_proxies(&c);
    deploy_n(&c, "stub-b", UPGRADE_START_DELAY_S, 1);
    c.wait_serve_running(&[(APP, 1)], Duration::from_secs(300));
    let empty = wait_log(
        &c,
        &since,
        "load balancer told: drain (Serve drains this node's proxy",
        Duration::from_secs(120),
    );
    assert_eq!(
        removed_proxies(&c),
        removed,
        "Serve removed {empty}'s proxy before its agent told the lb `drain`"
    );
    assert_eq!(
        agent_check(&c, empty),
        "drain",
        "{empty}'s agent-check, as HAProxy asks it"
    );
    let t = Instant::now();
    while removed_proxies(&c) == removed {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "Serve did not remove {empty}'s drained proxy within 120 s of the lb's drain"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let removed_after = t.elapsed();
    // The removal must end the proxy's process. Both workers rode the
    // head's restart (the roll's last step) through, and Ray 2.53's restarted
    // GCS kills nothing on a `ray.kill` of an actor started before it
    // (ray-project/ray#63763; the agent's reaper catches such workers only
    // every 30 s): the old proxy then kept listening beside the next one on
    // the node's port (SO_REUSEPORT), and in the scale-back below every
    // request it took failed with a 500 (docker/ray/patch_serve.py, 4).
    // Bounded here; how it ended is checked after the scale-back.
    let t = Instant::now();
    let mut left = proxy_pids(&c, empty);
    while !left.is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{empty}'s removed Serve proxy still runs 15 s after Serve removed it (pids {left:?}): \
             its kill was not delivered"
        );
        std::thread::sleep(Duration::from_millis(250));
        left = proxy_pids(&c, empty);
    }
    log(&format!(
        "{empty} held no replica: its agent told the lb drain, Serve removed its proxy {:.1} s later, \
         and its process was gone {:.1} s after that",
        removed_after.as_secs_f64(),
        t.elapsed().as_secs_f64()
    ));
    wait_answers(&work, 10, Duration::from_secs(120));
    set_phase(&work, "scale back");
    deploy(&c, "stub-b", UPGRADE_START_DELAY_S);
    wait_whole(&c, "after scaling back");
    log(&format!(
        "scaled back: {}",
        wait_spread(&c, "after scaling back")
    ));
    // Back in the lb's rotation once its proxy serves again.
    let t = Instant::now();
    while agent_check(&c, empty) != "ready" {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{empty}'s agent-check still says drain 60 s after its replicas came back"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    wait_answers(&work, 10, Duration::from_secs(120));
    // And it ended by its own exit, not by the agent's reaper (which kills,
    // every 30 s, the workers of actors the GCS holds dead but never
    // killed, and logs their class): without the patch the reaper killed
    // it 13.5 s after its removal in a run where the 15 s bound above held.
    let out = output(Command::new("docker").args(["logs", "--since", &since, &c.container(empty)]));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let reaped: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("killed workers of actors the gcs holds dead") && l.contains("ProxyActor")
        })
        .collect();
    assert!(
        reaped.is_empty(),
        "{empty}'s removed Serve proxy did not exit when Serve killed it; the reaper killed it later:\n{}",
        reaped.join("\n")
    );

    // A crash after the roll and the upgrade: with the replicas spread
    // again, only what was in flight on the killed worker fails.
    set_phase(&work, "crash worker-2 after the roll");
    kills.push(crash_and_restart(&c, &work, "worker-2"));
    wait_whole(&c, "worker-2 back after the crash");

    set_phase(&work, "after");
    wait_answers(&work, 40, Duration::from_secs(300));
    std::fs::write(work.join("stop"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !work.join("result.json").exists() {
        assert!(Instant::now() < deadline, "the load clients did not stop");
        std::thread::sleep(Duration::from_millis(500));
    }
    let records: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(work.join("result.json")).unwrap()).unwrap();

    // Figures per phase, and the failures.
    let mut phases: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for r in &records {
        phases
            .entry(r[0].as_str().unwrap_or("?").to_string())
            .or_default()
            .push(r);
    }
    let mut bad = Vec::new();
    let steady_p99 = percentile(
        phases
            .get("steady")
            .map(|v| {
                v.iter()
                    .filter(|r| r[1] == "POST" && r[4] == 200)
                    .filter_map(|r| r[3].as_f64())
                    .collect()
            })
            .unwrap_or_default(),
        0.99,
    );
    // R-SERVE-7: the upgrade keeps a replica serving in every slot, so no
    // POST waits for a cold start. A POST that did would wait its own
    // 1.5 s plus up to the new version's 8 s; a busy machine adds path
    // overhead to any POST, upgrade or not (a cold run beside a one-core
    // loop: 3.54 and 3.56 s in the upgrade, p99 3.62 s in phases with no
    // replica change, against a steady p99 of 1.73 s). So the bound is the
    // larger of twice the steady p99 and the POST's own time plus half a
    // cold start: a stall of a cold start crosses it, load alone does not.
    let stall_bound = (2.0 * steady_p99).max(POST_DELAY_S + UPGRADE_START_DELAY_S / 2.0);
    if let Some(rs) = phases.get("upgrade") {
        for r in rs.iter().filter(|r| r[1] == "POST" && r[4] == 200) {
            let took = r[3].as_f64().unwrap_or(0.0);
            if took > stall_bound {
                bad.push(format!(
                    "upgrade: a POST waited {took:.2} s, over {stall_bound:.2} s (twice the steady p99, {steady_p99:.2} s, or its own {POST_DELAY_S} s plus half the {UPGRADE_START_DELAY_S} s cold start): {r}"
                ));
            }
        }
    }
    for (phase, rs) in &phases {
        let mut failed: BTreeMap<String, usize> = BTreeMap::new();
        for r in rs.iter().filter(|r| r[4] != 200) {
            *failed.entry(format!("{} {}", r[1], r[4])).or_default() += 1;
        }
        let posts: Vec<f64> = rs
            .iter()
            .filter(|r| r[1] == "POST" && r[4] == 200)
            .filter_map(|r| r[3].as_f64())
            .collect();
        log(&format!(
            "{phase}: sent {} ({} POST), failed {failed:?}, POST p50 {:.2} s p99 {:.2} s",
            rs.len(),
            rs.iter().filter(|r| r[1] == "POST").count(),
            percentile(posts.clone(), 0.5),
            percentile(posts, 0.99)
        ));
        for r in rs.iter().filter(|r| r[4] != 200) {
            // In flight on the killed node: sent before the lb could
            // notice (2 failed checks, about 2 s) and not answered before
            // the kill; whatever phase it was sent in.
            let (start, took) = (r[2].as_f64().unwrap_or(0.0), r[3].as_f64().unwrap_or(0.0));
            let in_flight_at_crash = kills.iter().any(|&k| start <= k + 2.5 && start + took >= k)
                && matches!(r[4].as_i64(), Some(502 | 503 | 0));
            if !in_flight_at_crash {
                bad.push(format!("{phase}: {r}"));
            }
        }
    }
    log(&format!(
        "drains (docker stop, s): {drains:?}; steady POST p99 {steady_p99:.2} s"
    ));
    if !bad.is_empty() {
        eprintln!("{}", failure_evidence(&c, &since_start));
    }
    assert!(
        bad.is_empty(),
        "{} failed requests outside what was in flight on the crashed node (the first 40):\n{}",
        bad.len(),
        bad.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The lb's view of each worker's proxy (`serve_workers` in HAProxy's
/// stats CSV on port 8404, read over the compose network): server name ->
/// status (`UP`, `DOWN`, `DRAIN` when its agent said drain, `UP 1/2` while
/// going down, `DOWN 1/2` while coming up, `MAINT`, `no check`).
fn lb_servers(c: &Cluster) -> Result<BTreeMap<String, String>, String> {
    use std::io::{Read, Write};
    let ip: std::net::IpAddr = c
        .ip("lb")
        .parse()
        .map_err(|e| format!("the lb's address: {e}"))?;
    let mut t = std::net::TcpStream::connect_timeout(&(ip, 8404).into(), Duration::from_secs(2))
        .map_err(|e| format!("the lb's stats port: {e}"))?;
    t.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        t,
        "GET /stats;csv HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("the lb's stats: {e}"))?;
    let mut text = String::new();
    t.read_to_string(&mut text)
        .map_err(|e| format!("the lb's stats: {e}"))?;
    let (head, raw) = text.split_once("\r\n\r\n").unwrap_or(("", ""));
    // HAProxy sends its stats page chunked, whatever the request's version.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(raw)
    } else {
        raw.to_string()
    };
    let mut lines = body.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or("")
        .trim_start_matches("# ")
        .split(',')
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(px), Some(sv), Some(st)) = (col("pxname"), col("svname"), col("status")) else {
        return Err(format!("not HAProxy's stats CSV: {:.200}", text));
    };
    Ok(lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.get(px) == Some(&"serve_workers"))
        .filter_map(|f| Some((f.get(sv)?.to_string(), f.get(st)?.to_string())))
        .collect())
}

/// An HTTP/1.1 chunked body's data (hex size line, data, CRLF; a 0 size
/// ends it).
fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        let (Some(data), Some(next)) = (rest.get(..n), rest.get(n..)) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(data);
        raw = next.strip_prefix("\r\n").unwrap_or(next);
    }
    out
}

/// Waits until the lb sends requests to both workers' proxies (each `UP`
/// in its health and agent checks): Serve's placement says where replicas
/// run, not that a worker's proxy is back in the lb's rotation. After a
/// scale-back a worker whose proxy Serve had removed holds replicas again
/// seconds before Serve's new proxy there answers and the lb's checks rise
/// it (CI: worker-2 killed 2 s after the spread, and every request got 503
/// "No server is available" for as long as worker-1 was not up).
fn wait_lb_routes_to_both(c: &Cluster, what: &str) -> String {
    let t = Instant::now();
    loop {
        let servers = lb_servers(c);
        if let Ok(s) = &servers {
            if ["worker-1", "worker-2"]
                .iter()
                .all(|w| s.get(*w).map(String::as_str) == Some("UP"))
            {
                return format!(
                    "the lb routes to both workers after {:.1} s",
                    t.elapsed().as_secs_f64()
                );
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{what}: the lb does not route to both workers 120 s after Serve spread the replicas: {servers:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `docker kill` of `svc`, then `docker start` once the clients answered
/// 20 more, and waits for its new Ray node (the killed node stays ALIVE in
/// the GCS until its health checks fail: back means that node gone and a
/// new one alive). Returns when the kill was sent (epoch seconds).
fn crash_and_restart(c: &Cluster, work: &Path, svc: &str) -> f64 {
    let id = c.container(svc);
    let ip = c.ip(svc);
    let killed: Vec<String> = c
        .wait_nodes(
            &format!("three nodes before {svc}'s crash"),
            Duration::from_secs(60),
            |n| n.len() == 3,
        )
        .into_iter()
        .filter(|n| n.ip == ip)
        .map(|n| n.id)
        .collect();
    let at = now_epoch();
    run(Command::new("docker").args(["kill", &id]));
    wait_answers(work, 20, Duration::from_secs(120));
    run(Command::new("docker").args(["start", &id]));
    c.wait_nodes(
        &format!("{svc} back after the crash: its killed node gone, a new one alive"),
        Duration::from_secs(300),
        |n| n.len() == 3 && n.iter().all(|x| !killed.contains(&x.id)),
    );
    at
}

/// Waits until Serve runs every deployment of two or more replicas on two
/// nodes at least (docker/tools/serve_placement.py, as scripts/roll-cluster.sh
/// runs it), and returns where they run.
fn wait_spread(c: &Cluster, what: &str) -> String {
    let script = std::fs::read_to_string(workspace_root().join("docker/tools/serve_placement.py"))
        .expect("docker/tools/serve_placement.py");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let out = with_stdin(
            &[
                "exec",
                "-i",
                &c.container("head"),
                "timeout",
                "60",
                "argus-agent",
                "ray-tool",
                "python",
            ],
            &script,
        );
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let v: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        if v["spread"] == Value::Bool(true) {
            let lb = wait_lb_routes_to_both(c, what);
            return format!("replicas per node: {}; {lb}", v["deployments"]);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: Serve's replicas are not spread over two workers after 180 s (R-SERVE-8): \
             {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Waits until the shim runs REPLICAS engine containers of `new` and none
/// of `old` (the load clients' container is not the shim's).
fn wait_engines_of(c: &Cluster, new: &str, old: &str) {
    let engines = |image: &str| {
        run(Command::new("docker").args([
            "ps",
            "-q",
            "--filter",
            &format!("ancestor={image}"),
            "--filter",
            "label=io.argus.shim.owner",
        ]))
        .split_whitespace()
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    // An image's tag alone (stub-b-ray2.53.0): the failure's first line is
    // short, and CI keeps about 300 characters of it.
    let tag = |image: &str| image.rsplit(':').next().unwrap_or(image).to_string();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (n, o) = (engines(new), engines(old));
        if n.len() == REPLICAS as usize && o.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            // What Serve and the shim say of the engines left over, the
            // short facts first (CI keeps the first line of a failure):
            // Serve's replicas by state, and what the workers' dead-actor
            // reapers said (a replica that rode the roll's head restart is
            // killed only by them, ray-project/ray#63763).
            let left: Vec<String> = o
                .iter()
                .map(|id| {
                    inspect(
                        id,
                        "{{.Name}} {{.State.Status}} started {{.State.StartedAt}} owner {{index .Config.Labels \"io.argus.shim.owner\"}} shim pid {{index .Config.Labels \"io.argus.shim.pid\"}}",
                    )
                })
                .map(|l| {
                    // Whether its shim (the Ray worker process the raylet
                    // started) still runs in the owner node: a live shim is
                    // a replica Ray never killed; a dead one, a janitor
                    // that did not sweep.
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let (owner, pid) = (f.get(5).copied(), f.get(8).copied());
                    let shim = match (owner, pid) {
                        (Some(o), Some(p)) => {
                            let st = output(Command::new("docker").args([
                                "exec",
                                o,
                                "sh",
                                "-c",
                                &format!("cut -d' ' -f2,3 /proc/{p}/stat 2>&1 | head -c 80"),
                            ]));
                            String::from_utf8_lossy(&st.stdout).trim().to_string()
                        }
                        _ => "?".into(),
                    };
                    format!("{l} (shim: {shim})")
                })
                .collect();
            // Every Serve replica actor the GCS knows: its state, node and
            // pid (an old-version replica ALIVE here that Serve does not
            // list is an orphan; DEAD with a live worker, #63763's leak).
            let actors: Vec<String> = c
                .dashboard_get("/api/v0/actors?detail=1&limit=200")
                .map(|v| {
                    v["data"]["result"]["result"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|a| {
                            a["class_name"]
                                .as_str()
                                .is_some_and(|c| c.starts_with("ServeReplica:"))
                        })
                        .map(|a| {
                            format!(
                                "{} {} node {:.8} pid {}",
                                a["actor_id"]
                                    .as_str()
                                    .unwrap_or("?")
                                    .chars()
                                    .take(8)
                                    .collect::<String>(),
                                a["state"].as_str().unwrap_or("?"),
                                a["node_id"].as_str().unwrap_or("?"),
                                a["pid"]
                            )
                        })
                        .collect()
                })
                .unwrap_or_else(|e| vec![format!("actor list failed: {e}")]);
            let replicas: Vec<String> = match c.serve_status() {
                Ok(v) => v["applications"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .flat_map(|(_, a)| a["deployments"].as_object().into_iter().flatten())
                    .map(|(d, x)| format!("{d} {} {}", x["status"], x["replica_states"]))
                    .collect(),
                Err(e) => vec![format!("serve status failed: {e}")],
            };
            let reaper: Vec<String> = ["worker-1", "worker-2"]
                .iter()
                .flat_map(|w| {
                    let l = output(Command::new("docker").args(["logs", &c.container(w)]));
                    String::from_utf8_lossy(&l.stdout)
                        .lines()
                        .chain(String::from_utf8_lossy(&l.stderr).lines())
                        .filter(|l| {
                            l.contains("dead-actor reaper")
                                || l.contains("actors the gcs holds dead")
                        })
                        .map(|l| format!("{w}: {}", l.chars().take(240).collect::<String>()))
                        .collect::<Vec<_>>()
                })
                .collect();
            let controller = output(Command::new("docker").args([
                "exec",
                &c.container("head"),
                "sh",
                "-c",
                "grep -h -E 'argus|Stopping|Adding|Migrat|Replica|replica' \
                 /tmp/ray/session_latest/logs/serve/controller_*.log 2>/dev/null | tail -n 60",
            ]));
            panic!(
                "the upgrade did not end in 300 s: {} engines of {}, {} of {}; Serve: {replicas:?}; \
                 reaper lines: {}; left: {left:?}\nreplica actors in the GCS: {actors:#?}\n\
                 workers' reaper lines: {reaper:#?}\n\
                 Serve's controller (last lines):\n{}",
                n.len(),
                tag(new),
                o.len(),
                tag(old),
                reaper.len(),
                String::from_utf8_lossy(&controller.stdout)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The pids (on the host) of the Serve proxy processes in `svc`'s
/// container, from `docker top` (Ray titles the process `ray::ProxyActor`).
fn proxy_pids(c: &Cluster, svc: &str) -> Vec<String> {
    let out = output(Command::new("docker").args(["top", &c.container(svc), "-eo", "pid,args"]));
    assert!(
        out.status.success(),
        "docker top {svc}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (pid, args) = l.trim().split_once(char::is_whitespace)?;
            args.trim_start()
                .starts_with("ray::ProxyActor")
                .then(|| pid.to_string())
        })
        .collect()
}

/// How many drained proxies Serve's controller has removed in this Ray
/// session of the head (its log line, Ray 2.53's proxy_state.py).
fn removed_proxies(c: &Cluster) -> usize {
    let out = output(Command::new("docker").args([
        "exec",
        &c.container("head"),
        "sh",
        "-c",
        "cat /tmp/ray/session_latest/logs/serve/controller_*.log 2>/dev/null",
    ]));
    String::from_utf8_lossy(&out.stdout)
        .matches("Removing drained proxy on node")
        .count()
}

/// What the lb and the workers' Serve proxies logged about failed
/// requests since `since` (printed before the assertion, so that CI's tail
/// says which hop answered them): the lb's lines of answers that were not
/// 2xx (the server, the timers, the termination state), and the error lines
/// of the proxies' logs (every Ray session: the workers restarted).
fn failure_evidence(c: &Cluster, since: &str) -> String {
    let lb = output(Command::new("docker").args([
        "logs",
        "--timestamps",
        "--since",
        since,
        &c.container("lb"),
    ]));
    // Docker's timestamp first on every line: stdout (the requests) and
    // stderr (the servers' state changes) merge back into one time order.
    let mut lines: Vec<String> = String::from_utf8_lossy(&lb.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&lb.stderr).lines())
        .map(str::to_string)
        .collect();
    lines.sort();
    // httplog (raw), after the timestamp: client [date] frontend
    // backend/server timers status ...
    let status = |l: &str| l.split_whitespace().nth(6).map(str::to_string);
    let request = |l: &str| status(l).is_some_and(|st| st.len() == 3 && st.parse::<u16>().is_ok());
    let bad: Vec<&String> = lines
        .iter()
        .filter(|l| request(l) && !status(l).unwrap_or_default().starts_with('2'))
        .collect();
    // HAProxy's own lines: a server down or up and why, no server left.
    let states: Vec<&String> = lines.iter().filter(|l| !request(l)).collect();
    let mut out = format!(
        "--- evidence: the lb's answers that were not 2xx ({}, last 30)\n{}\n\
         --- the lb's server states and alerts ({}, last 30)\n{}\n",
        bad.len(),
        bad[bad.len().saturating_sub(30)..]
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        states.len(),
        states[states.len().saturating_sub(30)..]
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for w in ["worker-1", "worker-2"] {
        let o = output(Command::new("docker").args([
            "exec",
            &c.container(w),
            "sh",
            "-c",
            "grep -h -E 'ERROR|Traceback|rror:' /tmp/ray/session_*/logs/serve/proxy_*.log \
             /tmp/ray/session_*/logs/serve/replica_*.log 2>/dev/null | tail -n 25",
        ]));
        out.push_str(&format!(
            "--- {w}: Serve's proxy and replica errors (last 25)\n{}\n",
            String::from_utf8_lossy(&o.stdout).trim_end()
        ));
        // The first failed request whole: its traceback's last lines say
        // what failed (an exception without "Error:" in its name, such as
        // a cancellation, matches none of the patterns above).
        let first = output(Command::new("docker").args([
            "exec",
            &c.container(w),
            "sh",
            "-c",
            "grep -h -A 30 -m 1 'Request failed' /tmp/ray/session_*/logs/serve/replica_*.log \
             2>/dev/null | head -n 30",
        ]));
        out.push_str(&format!(
            "--- {w}: the first failed request in a replica's log\n{}\n",
            String::from_utf8_lossy(&first.stdout).trim_end()
        ));
    }
    out
}

/// The answer of `svc`'s agent-check (ARGUS_LB_AGENT_PORT, 9479 in the
/// compose file), asked as HAProxy asks it.
fn agent_check(c: &Cluster, svc: &str) -> String {
    use std::io::Read;
    let ip: std::net::IpAddr = c.ip(svc).parse().expect("a container address");
    let mut s = String::new();
    std::net::TcpStream::connect_timeout(&(ip, 9479).into(), Duration::from_secs(2))
        .and_then(|mut t| {
            t.set_read_timeout(Some(Duration::from_secs(2)))?;
            t.read_to_string(&mut s)
        })
        .unwrap_or_else(|e| panic!("{svc}'s agent-check: {e}"));
    s.trim().to_string()
}

/// Waits until a worker's agent logged `line` since `since` (epoch
/// seconds); returns that worker.
fn wait_log(c: &Cluster, since: &str, line: &str, timeout: Duration) -> &'static str {
    let t = Instant::now();
    loop {
        for w in ["worker-1", "worker-2"] {
            let out =
                output(Command::new("docker").args(["logs", "--since", since, &c.container(w)]));
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            if text.contains(line) {
                return w;
            }
        }
        assert!(
            t.elapsed() < timeout,
            "no worker's agent logged {line:?} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn now_epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
