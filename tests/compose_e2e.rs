//! End-to-end tests of the images and docker-compose.yaml on this machine's
//! Docker Engine (issue 5): a head and two workers from the real node image,
//! checked with Ray's Python API from inside the head, then broken on
//! purpose (seeds/002 §5.3) and expected to heal.
//!
//! The images are built from the registry-free Ray base
//! (scripts/build-base-image.sh, cached) and the agent binary cargo built for
//! this test, so no registry and no Rust image are needed. Docker missing or
//! unreachable is a test FAILURE, never a skip.
//!
//! Each test runs its own compose project (`argus-e2e-<pid>-<n>`) with its
//! own volumes, model-cache directory and dashboard port, and tears it down
//! on drop.
//! Settings: ARGUS_E2E_COMPOSE ("docker compose" or "docker-compose") picks
//! the compose tool; ARGUS_E2E_KEEP=1 leaves the cluster up for inspection.
//! The cluster and image helpers live in tests/support/compose.rs (shared
//! with tests/ray_compat.rs).

#[path = "support/compose.rs"]
mod compose;
#[path = "support/scenario.rs"]
mod scenario;

use std::io::{BufRead, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use compose::*;
use scenario::Scenario;
use serde_json::Value;

/// The plain cluster (head and two workers, no GCS FT): three checks that
/// were tests of their own, one cluster (tests/support/scenario.rs). The
/// last phase stops both workers, so it goes last.
#[test]
fn compose_plain_cluster_scenario() {
    elapsed_since_start();
    let mut s = Scenario::new(
        "compose_e2e",
        "compose_plain_cluster_scenario",
        &[
            "compose_cluster_comes_up_and_heals_from_node_faults",
            "compose_worker_stops_cleanly_on_docker_stop",
            "runtime_env_container_jobs_run_in_sibling_engine_containers",
        ],
        || {
            require_docker();
            build_images(true);
            Cluster::up(&[])
        },
        plain_gate,
    );
    s.phase(
        "compose_cluster_comes_up_and_heals_from_node_faults",
        compose_cluster_comes_up_and_heals_from_node_faults,
    );
    s.phase(
        "compose_worker_stops_cleanly_on_docker_stop",
        compose_worker_stops_cleanly_on_docker_stop,
    );
    s.phase(
        "runtime_env_container_jobs_run_in_sibling_engine_containers",
        runtime_env_container_jobs_run_in_sibling_engine_containers,
    );
    s.finish();
}

/// Between two phases of a scenario: every node container running again
/// (a phase may have stopped one: `compose up -d` starts it), three Ray
/// nodes alive, and no engine container of any node left.
fn plain_gate(c: &Cluster) -> Result<(), String> {
    let mut up = vec!["up", "-d", "--no-build"];
    up.extend(SERVICES);
    c.compose_run(&up);
    c.wait_nodes("gate: three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    engines_left(c)
}

/// Err naming the engine containers (running or not) the nodes' shims made
/// that are still there.
fn engines_left(c: &Cluster) -> Result<(), String> {
    let mut left = Vec::new();
    for w in SERVICES {
        let id = c.container(w);
        let all = run(Command::new("docker").args([
            "ps",
            "-a",
            "--format",
            "{{.ID}} {{.Image}} {{.Status}}",
            "--filter",
            &format!("label=io.argus.shim.owner={id}"),
        ]));
        left.extend(all.lines().map(|l| format!("{w}: {l}")));
    }
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("engine containers left: {left:?}"))
    }
}

/// Issue 5 §1 and §2: compose up gives three alive Ray nodes and healthy
/// containers; the cluster heals from a killed worker raylet, a killed head
/// Ray, and a replaced head container.
fn compose_cluster_comes_up_and_heals_from_node_faults(c: &Cluster) {
    // 1. three alive Ray nodes, every container healthy.
    let up = Instant::now();
    let nodes = c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    log(&format!(
        "compose up -> 3 nodes alive: {:.1}s",
        up.elapsed().as_secs_f64()
    ));
    c.wait_healthy(Duration::from_secs(120));

    // 2a. kill a worker's raylet: the agent restarts Ray, the node rejoins.
    let w1_ip = c.ip("worker-1");
    let w1_old: Vec<String> = nodes
        .iter()
        .filter(|n| n.ip == w1_ip)
        .map(|n| n.id.clone())
        .collect();
    assert_eq!(
        w1_old.len(),
        1,
        "worker-1 ({w1_ip}) not among {}",
        fmt_nodes(&nodes)
    );
    log("fault: SIGKILL worker-1's raylet");
    run(Command::new("docker").args([
        "exec",
        &c.container("worker-1"),
        "pkill",
        "-9",
        "-x",
        "raylet",
    ]));
    c.wait_nodes(
        "worker-1 rejoined after its raylet died",
        Duration::from_secs(180),
        |n| n.len() == 3 && n.iter().any(|x| x.ip == w1_ip && !w1_old.contains(&x.id)),
    );

    // 2b. kill the head's Ray (its GCS): the head restarts Ray, workers rejoin.
    let before = ids(&c.wait_nodes("three nodes", Duration::from_secs(60), |n| n.len() == 3));
    log("fault: SIGKILL the head's gcs_server");
    run(Command::new("docker").args([
        "exec",
        &c.container("head"),
        "pkill",
        "-9",
        "-x",
        "gcs_server",
    ]));
    c.wait_nodes(
        "all nodes rejoined a restarted head Ray",
        Duration::from_secs(240),
        |n| n.len() == 3 && n.iter().all(|x| !before.contains(&x.id)),
    );

    // 2c. docker kill the head container, bring up a new one.
    let before = ids(&c.wait_nodes("three nodes", Duration::from_secs(60), |n| n.len() == 3));
    let old_head = c.container("head");
    log("fault: docker kill the head container, then a new head container");
    run(Command::new("docker").args(["kill", &old_head]));
    let replaced = Instant::now();
    c.compose_run(&[
        "up",
        "-d",
        "--no-build",
        "--no-deps",
        "--force-recreate",
        "head",
    ]);
    assert_ne!(
        c.container("head"),
        old_head,
        "compose did not create a new head container"
    );
    c.wait_nodes(
        "all workers rejoined the new head container",
        Duration::from_secs(240),
        |n| n.len() == 3 && n.iter().all(|x| !before.contains(&x.id)),
    );
    log(&format!(
        "head replaced -> all workers rejoined: {:.1}s",
        replaced.elapsed().as_secs_f64()
    ));
    c.wait_healthy(Duration::from_secs(120));
}

/// Issue 5 §2, last item: `docker stop` of a worker exits 0 within 10 s and
/// leaves nothing behind.
fn compose_worker_stops_cleanly_on_docker_stop(c: &Cluster) {
    c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    c.wait_healthy(Duration::from_secs(120));
    // docker stop a worker: it drains first (no Serve app here: Ray drains
    // the node and the agent stops it), then exit 0 within the stop
    // timeout (a SIGKILL would be 137), nothing left behind.
    let w2 = c.container("worker-2");
    log("fault: docker stop worker-2");
    let t = Instant::now();
    run(Command::new("docker").args(["stop", &w2]));
    let took = t.elapsed();
    let code = inspect(&w2, "{{.State.ExitCode}}");
    log(&format!(
        "docker stop worker-2: {:.1}s, exit code {code}",
        took.as_secs_f64()
    ));
    assert_eq!(
        code, "0",
        "worker-2 exited {code} on SIGTERM after {took:?}"
    );
    assert_eq!(inspect(&w2, "{{.State.OOMKilled}}"), "false");
    // No container created on worker-2's behalf (the shim labels them with
    // their owner) may outlive it.
    let all = run(Command::new("docker").args(["ps", "-a", "--format", "{{.ID}} {{.Labels}}"]));
    let left: Vec<&str> = all
        .lines()
        .filter(|l| {
            l.split_once(' ')
                .is_some_and(|(id, labels)| labels.contains(&w2) && !w2.starts_with(id))
        })
        .collect();
    assert!(
        left.is_empty(),
        "containers left behind by worker-2: {left:?}"
    );
}

/// Issue 5 §3 and §4: Ray jobs whose tasks use runtime_env containers run in
/// sibling engine containers through the podman shim, two engine images at
/// once, a host model cache readable in the engine, a SIGKILLed Ray worker
/// takes its engine container with it, and a stopped node leaves none behind.
fn runtime_env_container_jobs_run_in_sibling_engine_containers(c: &Cluster) {
    c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    let mount = "/home/ray/.neutree/models-cache/default";
    let cache = c.model_cache.display().to_string();

    // Two jobs at the same time, each with its own engine image.
    let jobs: Vec<_> = ["stub-a", "stub-b"]
        .iter()
        .map(|v| {
            let script = job_script(&engine_image(v), &cache, mount, "probe");
            let child = Command::new("docker")
                .args([
                    "exec",
                    "-u",
                    "ray",
                    "-i",
                    &c.container("head"),
                    "timeout",
                    "600",
                    "python",
                    "-c",
                    &script,
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("docker exec");
            (v.to_string(), child)
        })
        .collect();
    for (v, child) in jobs {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "job with engine {v} failed\n--- stdout\n{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.lines().last().unwrap_or_default();
        let r: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        log(&format!("job with engine {v}: {r}"));
        assert_eq!(r["answer"], 42);
        assert_eq!(
            r["version"],
            v.as_str(),
            "task did not run in engine image {v}"
        );
        assert_eq!(r["ray"], RAY_VERSION);
        assert_eq!(
            r["model"], "weights-v1\n",
            "model cache not readable in the engine"
        );
    }

    // The image_uri form (no run_options, so no model cache) under the
    // shim's default policy.
    let script = job_script(&engine_image("stub-b"), &cache, mount, "uri");
    let out = output(Command::new("docker").args([
        "exec",
        "-u",
        "ray",
        &c.container("head"),
        "timeout",
        "600",
        "python",
        "-c",
        &script,
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "image_uri job failed\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    log(&format!("image_uri job with engine stub-b: {r}"));
    assert_eq!(
        (r["answer"].as_i64(), r["version"].as_str()),
        (Some(42), Some("stub-b"))
    );

    ray_starts_engines_while_a_job_holds_every_podman_place(c, &engine_image("stub-b"));

    jobs_reach_no_docker_daemon(c, &engine_image("stub-b"));

    // SIGKILL of the Ray worker (the shim process) -> its engine container goes.
    let script = job_script(&engine_image("stub-a"), &cache, mount, "sleep");
    let mut driver = Command::new("docker")
        .args([
            "exec",
            "-u",
            "ray",
            "-i",
            &c.container("head"),
            "python",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker exec");
    // The task's process (titled ray::task) is visible in its node, whose
    // PID namespace the engine container shares (podman --pid=host).
    let start = Instant::now();
    let worker = loop {
        let found = ["worker-1", "worker-2"].into_iter().find(|w| {
            output(Command::new("docker").args([
                "exec",
                &c.container(w),
                "pgrep",
                "-f",
                "^ray::task",
            ]))
            .status
            .success()
        });
        if let Some(w) = found {
            break c.container(w);
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the sleeping task did not start in an engine container"
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let owned = |w: &str| -> Vec<String> {
        run(Command::new("docker").args([
            "ps",
            "-q",
            "--filter",
            &format!("label=io.argus.shim.owner={w}"),
        ]))
        .lines()
        .map(String::from)
        .collect()
    };
    let engines = owned(&worker);
    assert!(
        !engines.is_empty(),
        "no engine container labelled with its owner {worker}"
    );
    // SIGKILL the Ray worker processes as the raylet does: the shims the
    // raylet started (a shim's own helper processes, same command line,
    // are children of a shim and are left alone; all are chosen before any
    // is killed, as a killed shim's helper is re-parented).
    let kill = r#"targets=""
      for p in $(pgrep -f "^podman run"); do
        pp=$(ps -o ppid= -p "$p" | tr -d " ")
        case "$(tr "\0" " " </proc/"$pp"/cmdline 2>/dev/null)" in
          "podman run"*) ;;
          *) targets="$targets $p" ;;
        esac
      done
      [ -n "$targets" ] && kill -9 $targets && echo $targets"#;
    let killed = run(Command::new("docker").args(["exec", &worker, "sh", "-c", kill]));
    log(&format!(
        "SIGKILLed shim processes {:?} owning {engines:?}",
        killed.split_whitespace().collect::<Vec<_>>()
    ));
    assert!(
        !killed.trim().is_empty(),
        "no shim process (podman run) found on {worker}"
    );
    // Gone means removed, not merely stopped (Ray may retry the task in a
    // new container meanwhile; only these containers are checked).
    let exists =
        |id: &str| output(Command::new("docker").args(["inspect", "-f", "{{.State.Status}}", id]));
    let t = Instant::now();
    loop {
        let left: Vec<String> = engines
            .iter()
            .filter_map(|id| {
                let o = exists(id);
                o.status
                    .success()
                    .then(|| format!("{id} ({})", String::from_utf8_lossy(&o.stdout).trim()))
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "engine containers {left:?} still there 15 s after their Ray workers were SIGKILLed"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    log(&format!(
        "engine containers removed {:.1}s after SIGKILL",
        t.elapsed().as_secs_f64()
    ));
    let _ = driver.kill();
    let _ = driver.wait();

    // (stub-b: the sleeping task's job above, whose driver's `docker exec`
    // was killed, not its driver, may still retry its stub-a task.)
    an_engine_whose_worker_is_never_given_work_is_retired(c, &engine_image("stub-b"));

    // A stopped node leaves none of its engine containers behind, running
    // or exited (R-PID-4, R-SHIM-4).
    for w in ["worker-1", "worker-2"] {
        let id = c.container(w);
        run(Command::new("docker").args(["stop", &id]));
        let all = run(Command::new("docker").args([
            "ps",
            "-a",
            "--format",
            "{{.ID}} {{.Status}}",
            "--filter",
            &format!("label=io.argus.shim.owner={id}"),
        ]));
        assert!(
            all.trim().is_empty(),
            "containers left behind by {w} after docker stop:\n{all}"
        );
    }
}

/// An actor killed while its engine container starts leaves a Ray worker
/// that no one will give work: the raylet keeps idle workers of a live job
/// while it has free CPUs, whatever their image, so without the agent the
/// container stays until Ray stops (seen after a rolling replacement: an
/// old version's engine outlived the upgrade). The worker agent retires it
/// (the worker's own Exit, as the raylet retires an idle worker) once it was
/// idle in two rounds 60 s apart; the job stays alive all along.
fn an_engine_whose_worker_is_never_given_work_is_retired(c: &Cluster, image: &str) {
    // The engine containers of `image`'s Ray workers (Ray's image_uri
    // plugin first runs a short probe container, `python -c ...`: not one);
    // the shim creates them from the image's ID, resolved once.
    let id = run(Command::new("docker").args(["image", "inspect", "-f", "{{.Id}}", image]));
    let id = id.trim();
    let owned = |w: &str| -> Vec<String> {
        run(Command::new("docker").args([
            "ps",
            "--no-trunc",
            "--format",
            "{{.ID}} {{.Image}} {{.Command}}",
            "--filter",
            &format!("label=io.argus.shim.owner={w}"),
        ]))
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|i| i == image || i == id)
                && l.contains("default_worker.py")
        })
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
    };
    let workers = [c.container("worker-1"), c.container("worker-2")];
    let before: Vec<String> = workers.iter().flat_map(|w| owned(w)).collect();
    let script = format!(
        r#"
import os, socket, sys, time
import ray
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)

@ray.remote(runtime_env={{"image_uri": "{image}"}}, resources={{"worker_node": 1}})
class Stray:
    def ping(self):
        return 1

a = Stray.remote()
print("created", flush=True)
sys.stdin.readline()
ray.kill(a)
print("killed", flush=True)
sys.stdin.readline()
"#
    );
    let mut driver = Command::new("docker")
        .args([
            "exec",
            "-u",
            "ray",
            "-i",
            &c.container("head"),
            "timeout",
            "600",
        ])
        .args(["python", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker exec");
    let mut stdin = driver.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(driver.stdout.take().unwrap()).lines();
    let said = |lines: &mut std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
                what: &str| {
        let l: String = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(l, what, "the stray-actor driver did not say {what:?}");
    };
    said(&mut lines, "created");
    // Killed as soon as its engine container runs: before the worker in it
    // registers with the raylet (a Python start and `import ray` later).
    let t = Instant::now();
    let (owner, stray) = loop {
        let found = workers.iter().find_map(|w| {
            owned(w)
                .into_iter()
                .find(|id| !before.contains(id))
                .map(|id| (w.clone(), id))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the stray actor's engine container did not start in 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    writeln!(stdin, "kill").unwrap();
    said(&mut lines, "killed");
    let killed_at = Instant::now();
    log(&format!(
        "stray actor killed {:.1}s after its engine {:.12} started on {owner:.12}",
        t.elapsed().as_secs_f64(),
        stray
    ));
    let retired = || {
        let l = output(Command::new("docker").args(["logs", &owner]));
        String::from_utf8_lossy(&l.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&l.stderr).lines())
            .any(|l| l.contains("retired an engine container's ray worker"))
    };
    loop {
        let running = owned(&owner).contains(&stray);
        if !running {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(200),
            "the stray actor's engine container {stray:.12} still runs 200 s after the \
             actor was killed (the job alive): its idle worker was never retired"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let gone_after = killed_at.elapsed().as_secs_f64();
    // The agent logs the retirement once its script has ended, which on a
    // loaded host can be seconds after the worker (and its container) left.
    let t = Instant::now();
    let mut by_agent = retired();
    while !by_agent && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_secs(1));
        by_agent = retired();
    }
    log(&format!(
        "stray engine gone {gone_after:.1}s after the kill; retired by the agent: {by_agent}"
    ));
    // Gone by itself within seconds means the worker registered and its
    // actor was created before the kill: not the case this checks.
    let raylet = output(Command::new("docker").args([
        "exec",
        &owner,
        "sh",
        "-c",
        "grep -h -i -E 'cancel|kill|idle|disconnect|started worker|register' \
         /tmp/ray/session_latest/logs/raylet.out | tail -n 40",
    ]));
    assert!(
        by_agent,
        "the stray engine {stray:.12} ended {gone_after:.1}s after the kill, but not by \
         the agent's retirement (its actor was created before the kill?); its raylet:\n{}",
        String::from_utf8_lossy(&raylet.stdout)
    );
    assert!(
        gone_after >= 55.0,
        "the stray engine was retired {gone_after:.1}s after the kill: before 60 s of idleness"
    );
    let _ = writeln!(stdin, "done");
    let _ = driver.wait();
}

/// Issue 8 §4: `docker kill` + `docker start` of the head container (what a
/// restart policy does after a crash) brings all three nodes back at the
/// default TTL of 60 s without waiting it out: the restarted head finds its
/// own previous record with nothing listening and claims at once (R-HEAD-5).
///
/// The cluster is monitored (docker-compose.monitoring.yaml): Prometheus
/// scrapes every agent and every Ray node (Ray's service-discovery file on
/// the head) before the fault, and after it its HTTP API shows the fault
/// in real values: every agent on the next head generation, the restarted
/// head's takeover counted as `own_previous_life`, the workers' Ray started
/// again, every node's new Ray session scraped, and the
/// ArgusHeadGenerationChanged alert firing.
#[test]
fn compose_head_container_kill_and_start_brings_all_nodes_back() {
    elapsed_since_start();
    require_docker();
    build_images(false);
    build_prometheus_image();
    let c = Cluster::up_with(
        &[("ARGUS_TTL_S", "60"), ("ARGUS_REFRESH_S", "10")],
        &["docker-compose.monitoring.yaml"],
    );
    let before = ids(
        &c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
            n.len() == 3
        }),
    );
    let ips: Vec<String> = SERVICES.iter().map(|s| c.ip(s)).collect();
    let prom_wait = Duration::from_secs(180);
    c.wait_prom(
        "Prometheus scrapes all 3 agents",
        r#"up{job="argus-agent"} == 1"#,
        prom_wait,
        |r| {
            SERVICES
                .iter()
                .all(|s| r.iter().any(|x| x.label("instance") == *s))
        },
    );
    let ray_up = |r: &[PromSample]| {
        ips.iter().all(|ip| {
            r.iter().any(|x| {
                x.label("instance").starts_with(&format!("{ip}:"))
                    && !x.label("instance").ends_with(":44217")
                    && !x.label("instance").ends_with(":44227")
            })
        })
    };
    let targets = c.wait_prom(
        "Prometheus scrapes every Ray node (Ray's service-discovery file)",
        r#"up{job="ray"} == 1"#,
        prom_wait,
        ray_up,
    );
    log(&format!(
        "Ray targets up: {}",
        targets
            .iter()
            .map(|x| x.label("instance"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    // Ray's own per-node metric, to tell this Ray session from the next.
    let sessions = c.wait_prom(
        "every Ray node's metrics in Prometheus",
        "ray_node_cpu_utilization",
        prom_wait,
        |r| ips.iter().all(|ip| r.iter().any(|x| x.label("ip") == ip)),
    );
    let old_session = sessions[0].label("SessionName").to_string();
    let generation = c.wait_prom(
        "the head's generation in Prometheus",
        r#"argus_head_generation{instance="head"}"#,
        prom_wait,
        |r| r.len() == 1 && r[0].value.is_finite(),
    )[0]
    .value;
    let worker_starts = c.prom_query(r#"argus_ray_starts_total{instance=~"worker-.*"}"#);
    assert_eq!(
        worker_starts.len(),
        2,
        "the workers' Ray starts: {worker_starts:?}"
    );
    let head = c.container("head");
    let claims = |logs: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains("claimed head generation"))
            .map(String::from)
            .collect()
    };
    let claims_before = claims(&container_logs(&head)).len();
    log("fault: docker kill + docker start of the head container");
    let t = Instant::now();
    // Prometheus' sample times are this host's clock (the container's).
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    run(Command::new("docker").args(["kill", &head]));
    run(Command::new("docker").args(["start", &head]));
    // Every container has a new Ray node: a count of 3 alone could include
    // a worker's stale registration next to its new one.
    c.wait_nodes(
        "every node back with a new Ray node id after the head container restarted",
        Duration::from_secs(240),
        |n| {
            ips.iter()
                .all(|ip| n.iter().any(|x| &x.ip == ip && !before.contains(&x.id)))
        },
    );
    let took = t.elapsed();
    log(&format!(
        "head container kill+start -> all 3 nodes alive again: {:.1}s (ARGUS_TTL_S=60)",
        took.as_secs_f64()
    ));
    let after = claims(&container_logs(&head));
    let claim = after.get(claims_before).cloned().unwrap_or_default();
    log(&format!("the restarted head: {claim}"));
    assert!(
        claim.contains("previous life"),
        "the restarted head did not claim on its own previous life; claims in its log:\n{}",
        after.join("\n")
    );

    // The same fault as Prometheus saw it (times from the kill).
    let next = generation + 1.0;
    c.wait_prom(
        &format!("every agent on head generation {next} in Prometheus"),
        "argus_head_generation",
        prom_wait,
        |r| {
            r.len() == 3
                && SERVICES.iter().all(|s| {
                    r.iter()
                        .any(|x| x.label("instance") == *s && x.value == next)
                })
        },
    );
    log(&format!(
        "Prometheus: generation {generation} -> {next} on all 3 agents {:.1}s after the kill",
        t.elapsed().as_secs_f64()
    ));
    c.wait_prom(
        "the restarted head's takeover counted as own_previous_life",
        r#"argus_head_takeovers_total{instance="head", rule="own_previous_life"}"#,
        prom_wait,
        |r| r.len() == 1 && r[0].value == 1.0,
    );
    c.wait_prom(
        "both workers' Ray started again",
        r#"argus_ray_starts_total{instance=~"worker-.*"}"#,
        prom_wait,
        |r| {
            worker_starts.iter().all(|w| {
                r.iter()
                    .any(|x| x.label("instance") == w.label("instance") && x.value > w.value)
            })
        },
    );
    c.wait_prom(
        "every node's new Ray session scraped",
        &format!(r#"ray_node_cpu_utilization{{SessionName!="{old_session}"}}"#),
        prom_wait,
        |r| ips.iter().all(|ip| r.iter().any(|x| x.label("ip") == ip)),
    );
    c.wait_prom(
        "every Ray node's target up again",
        r#"up{job="ray"} == 1"#,
        prom_wait,
        ray_up,
    );
    let alert = c.wait_alert("ArgusHeadGenerationChanged", prom_wait);
    log(&format!(
        "Prometheus: ArgusHeadGenerationChanged firing {:.1}s after the kill: {alert}",
        t.elapsed().as_secs_f64()
    ));
    assert_eq!(alert["labels"]["cluster"], "argus-ray", "{alert}");
    // When Prometheus first had each value (scrapes and rule evaluations
    // every 5 s), from its own sample times.
    let first_seen = |q: &str| {
        c.prom_query(&format!("max(min_over_time(timestamp({q})[15m:1s]))"))
            .first()
            .map_or(f64::NAN, |x| x.value - killed_at)
    };
    log(&format!(
        "Prometheus first saw, after the kill: the takeover {:.1}s, generation {next} on all 3 agents {:.1}s, \
         both workers' new Ray runs {:.1}s, ArgusHeadGenerationChanged firing {:.1}s",
        first_seen(r#"argus_head_takeovers_total{instance="head", rule="own_previous_life"} == 1"#),
        first_seen(&format!("argus_head_generation == {next}")),
        first_seen(&format!(
            r#"argus_ray_starts_total{{instance=~"worker-.*"}} > {}"#,
            worker_starts.iter().map(|w| w.value).fold(0.0, f64::max)
        )),
        first_seen(r#"ALERTS{alertname="ArgusHeadGenerationChanged", alertstate="firing"}"#),
    ));
    let rejoins = c.prom_query("sum by (instance) (argus_worker_rejoins_total)");
    log(&format!(
        "worker rejoins counted (a worker whose Ray exited first joins without one): {}",
        rejoins
            .iter()
            .map(|x| format!("{}={}", x.label("instance"), x.value))
            .collect::<Vec<_>>()
            .join(", ")
    ));
}

/// One series of a Prometheus instant query: its labels and value.
#[derive(Debug, Clone)]
struct PromSample {
    labels: serde_json::Map<String, Value>,
    value: f64,
}

impl PromSample {
    fn label(&self, name: &str) -> &str {
        self.labels
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// Percent-encodes a query for a URL.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus of a monitored cluster (docker-compose.monitoring.yaml),
/// through its HTTP API on the published port.
impl Cluster {
    fn prometheus_port(&self) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == "ARGUS_PROMETHEUS_HOST_PORT")
            .map(|(_, v)| v.clone())
            .expect("ARGUS_PROMETHEUS_HOST_PORT in the cluster's environment")
    }

    /// GET `path` of the API; the `data` of a `success` answer.
    fn prom_get(&self, path: &str) -> Result<Value, String> {
        let v = http_get_json(&format!("127.0.0.1:{}", self.prometheus_port()), path)?;
        if v["status"] != "success" {
            return Err(format!("{path}: {v}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's series, or an error text.
    fn try_prom_query(&self, q: &str) -> Result<Vec<PromSample>, String> {
        let data = self.prom_get(&format!("/api/v1/query?query={}", url_encode(q)))?;
        Ok(data["result"]
            .as_array()
            .ok_or_else(|| format!("no result array: {data}"))?
            .iter()
            .map(|r| PromSample {
                labels: r["metric"].as_object().cloned().unwrap_or_default(),
                value: r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN),
            })
            .collect())
    }

    fn prom_query(&self, q: &str) -> Vec<PromSample> {
        self.try_prom_query(q)
            .unwrap_or_else(|e| panic!("Prometheus query {q}: {e}"))
    }

    /// Waits until the query's series satisfy `ok`; returns them.
    fn wait_prom(
        &self,
        what: &str,
        q: &str,
        timeout: Duration,
        ok: impl Fn(&[PromSample]) -> bool,
    ) -> Vec<PromSample> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            match self.try_prom_query(q) {
                Ok(r) if ok(&r) => {
                    log(&format!(
                        "{what}: after {:.1}s",
                        start.elapsed().as_secs_f64()
                    ));
                    return r;
                }
                Ok(r) => last = format!("{r:?}"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        self.dump_logs();
        panic!("{what}: not reached within {timeout:?}; `{q}` last gave: {last}");
    }

    /// Waits until the alert `name` is firing; returns it.
    fn wait_alert(&self, name: &str, timeout: Duration) -> Value {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            match self.prom_get("/api/v1/alerts") {
                Ok(d) => {
                    let alerts = d["alerts"].as_array().cloned().unwrap_or_default();
                    if let Some(a) = alerts
                        .iter()
                        .find(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
                    {
                        return a.clone();
                    }
                    last = format!("{alerts:?}");
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        panic!("alert {name} not firing within {timeout:?}; alerts: {last}");
    }
}

/// The container's output (the agent's log), stdout and stderr together.
fn container_logs(container: &str) -> String {
    let out = output(Command::new("docker").args(["logs", container]));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Issue 8 §3-4 (R-WRK-7): with the Redis service of
/// docker-compose.gcs-ft.yaml, a detached actor on a worker answers after
/// the head container is killed and started again, with its state, and the
/// workers' Ray node ids are unchanged (they rode the restart through).
/// What a Redis client gets from `who`: "NO-ROUTE ..." when it cannot
/// connect, else Redis's answers to `AUTH <password>` (when given) and
/// `PING`, one line each.
const REDIS_PROBE: &str = r#"
import socket, sys
host, password = sys.argv[1], sys.argv[2]
try:
    s = socket.create_connection((host, 6379), timeout=5)
except OSError as e:
    print("NO-ROUTE", type(e).__name__); sys.exit(0)
cmds = (f"AUTH {password}\r\n" if password else "") + "PING\r\n"
s.sendall(cmds.encode())
s.settimeout(5)
got = b""
try:
    while got.count(b"\r\n") < cmds.count("\r\n"):
        b = s.recv(4096)
        if not b: break
        got += b
except OSError:
    pass
print(" ".join(l.decode(errors="replace") for l in got.split(b"\r\n") if l))
"#;

/// Issue 38 item 3: the GCS FT Redis is reachable by the head alone and
/// only with its password. A task's view (the Ray user on a worker), an
/// outsider on the compose network and an engine-like container on it have
/// no route to it; the Ray user on the head (a job's driver) reaches it but
/// is refused without the password; control: with the password, which only
/// root reads from the head's read-only mount, PING answers PONG.
fn redis_reachable_by_the_head_alone(c: &Cluster, head: &str) {
    let worker = c.container("worker-1");
    let probe = |args: &[&str]| -> String {
        let o = output(Command::new("docker").args(args));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let task = probe(&[
        "exec",
        "-u",
        "ray",
        &worker,
        "python",
        "-I",
        "-c",
        REDIS_PROBE,
        "redis",
        "",
    ]);
    assert!(
        task.starts_with("NO-ROUTE"),
        "a task on a worker reached Redis: {task}"
    );
    let net = format!("{}_default", c.project);
    let outsider = probe(&[
        "run",
        "--rm",
        "--network",
        &net,
        "--entrypoint",
        "python",
        &node_image(),
        "-I",
        "-c",
        REDIS_PROBE,
        "redis",
        "",
    ]);
    assert!(
        outsider.starts_with("NO-ROUTE"),
        "a container on the compose network reached Redis: {outsider}"
    );
    let driver = probe(&[
        "exec",
        "-u",
        "ray",
        head,
        "python",
        "-I",
        "-c",
        REDIS_PROBE,
        "redis",
        "",
    ]);
    assert!(
        driver.contains("NOAUTH") && !driver.contains("PONG"),
        "the Ray user on the head got an answer without the password: {driver}"
    );
    let read = output(Command::new("docker").args([
        "exec",
        "-u",
        "ray",
        head,
        "cat",
        "/run/argus-gcs-ft/password",
    ]));
    assert!(
        !read.status.success(),
        "the Ray user read the Redis password"
    );
    let password = probe(&["exec", head, "cat", "/run/argus-gcs-ft/password"]);
    assert_eq!(
        password.len(),
        64,
        "the generated Redis password: {password}"
    );
    let ps = probe(&[
        "exec",
        head,
        "sh",
        "-c",
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
    ]);
    assert!(
        !ps.contains(&password),
        "the Redis password is in a process environment"
    );
    let control = probe(&[
        "exec",
        "-u",
        "ray",
        head,
        "python",
        "-I",
        "-c",
        REDIS_PROBE,
        "redis",
        &password,
    ]);
    assert_eq!(control, "+OK +PONG", "control: with the password");
    log("GCS FT Redis: no route from a task, an outsider; NOAUTH for the Ray user on the head; PONG with the password");
}

fn compose_gcs_ft_detached_actor_rides_through_head_container_restart(c: &Cluster) {
    let nodes = c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    let head = c.container("head");
    let config = run(Command::new("docker").args(["exec", &head, "argus-agent", "config"]));
    assert!(
        config
            .lines()
            .any(|l| l.contains("ARGUS_GCS_FT_REDIS") && l.contains("redis:6379")),
        "the head's config does not show ARGUS_GCS_FT_REDIS=redis:6379:\n{config}"
    );
    let record: Value = serde_json::from_str(&run(Command::new("docker").args([
        "exec",
        &head,
        "argus-agent",
        "head",
        "--json",
    ])))
    .expect("the head record as JSON");
    assert_eq!(record["gcs_ft"], true, "the head record: {record}");
    redis_reachable_by_the_head_alone(c, &head);
    let head_ip = c.ip("head");
    let workers: Vec<String> = nodes
        .iter()
        .filter(|n| n.ip != head_ip)
        .map(|n| n.id.clone())
        .collect();
    assert_eq!(
        workers.len(),
        2,
        "two worker nodes in {}",
        fmt_nodes(&nodes)
    );

    let first = c.actor_call("create", Duration::from_secs(180));
    log(&format!("detached actor before the fault: {first}"));
    assert_eq!(first["n"], 1);
    assert!(
        workers.iter().any(|w| first["node"] == w.as_str()),
        "the actor is not on a worker: {first}"
    );

    log("fault: docker kill + docker start of the head container (GCS FT on)");
    let t = Instant::now();
    run(Command::new("docker").args(["kill", &head]));
    run(Command::new("docker").args(["start", &head]));
    assert_eq!(
        c.ip("head"),
        head_ip,
        "the head came back at another address"
    );
    c.wait_nodes(
        "3 nodes alive, the workers with their old node ids",
        Duration::from_secs(240),
        |n| n.len() == 3 && workers.iter().all(|w| n.iter().any(|x| &x.id == w)),
    );
    log(&format!(
        "head container kill+start (GCS FT) -> 3 nodes alive, same worker node ids: {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    let after = c.actor_call("get", Duration::from_secs(180));
    let took = t.elapsed();
    log(&format!(
        "detached actor after the fault: {after}; head kill+start -> actor answers: {:.1}s",
        took.as_secs_f64()
    ));
    // n >= 2: a retried call may have counted once before its driver failed;
    // a restarted actor would count from 1 again.
    assert!(
        after["n"].as_i64() >= Some(2)
            && after["node"] == first["node"]
            && after["pid"] == first["pid"],
        "the actor lost its state or was restarted: before {first}, after {after}"
    );
}

impl Cluster {
    /// Calls the detached actor `ride-through` (a counter that also reports
    /// its node id and pid) from a driver in the head, creating it on a
    /// worker with `create`, retrying until it answers or `timeout` passes.
    fn actor_call(&self, mode: &str, timeout: Duration) -> Value {
        let start = Instant::now();
        loop {
            let out = output(Command::new("docker").args([
                "exec",
                "-u",
                "ray",
                &self.container("head"),
                "timeout",
                "90",
                "python",
                "-c",
                ACTOR_SCRIPT,
                mode,
            ]));
            let stdout = String::from_utf8_lossy(&out.stdout);
            if out.status.success() {
                if let Ok(v) = serde_json::from_str(stdout.lines().last().unwrap_or_default()) {
                    return v;
                }
            }
            if start.elapsed() > timeout {
                self.dump_logs();
                panic!(
                    "actor call ({mode}) did not answer within {timeout:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }
}

const ACTOR_SCRIPT: &str = r#"
import json, os, socket, sys
import ray
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{ip}:{os.environ.get('ARGUS_RAY_PORT', '6379')}", namespace="argus-e2e", log_to_driver=False)

@ray.remote(num_cpus=0, resources={"worker_node": 1})
class Counter:
    def __init__(self):
        self.n = 0
    def incr(self):
        self.n += 1
        return {"n": self.n, "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

if sys.argv[1] == "create":
    actor = Counter.options(name="ride-through", lifetime="detached").remote()
else:
    actor = ray.get_actor("ride-through")
print(json.dumps(ray.get(actor.incr.remote(), timeout=60)))
"#;

/// Privilege separation from the attacker's side: a driver, a plain task and
/// a task in an engine image (`image_uri` and `container`) each try every
/// route to the Docker daemon (tests/fixtures/attack/reach_docker.py: the
/// socket paths, `/proc/*/root/...`, `/proc/*/fd/*`, ptrace of root's
/// processes, podman with `DOCKER_HOST`/shim settings in its environment,
/// symlinks and `..` in binds); none gets an answer. The control: the same
/// program as root in a worker (`docker exec`) does.
/// R-SEC-5: a Ray job holding every podman place it may have on worker-1
/// (a task there starts 50 `podman logs -f` of its own container: 4
/// follow, as each would hold one of the host's root inotify instances in
/// dockerd, and dockerd's count of them rises by no more; then 600 plain
/// `podman logs` into a pipe it never reads: 124 held, the rest refused)
/// stops neither another job's podman calls there nor another job's
/// `image_uri` task (the raylet's worker start and its runtime_env agent's
/// image probe have Ray's reserve beyond every share). Control: the
/// holding job's own next call is refused at its bound meanwhile, with its
/// job named; a call from outside any job (an operator's exec) still goes
/// through.
fn ray_starts_engines_while_a_job_holds_every_podman_place(c: &Cluster, image: &str) {
    let worker = c.container("worker-1");
    let head = c.container("head");
    let marker = "/tmp/argus-e2e-holder";
    let _ = output(Command::new("docker").args(["exec", &worker, "rm", "-f", marker]));
    // The holding job: a driver on the head (left running: the task's
    // worker, and with it the job's container, lives as long as the job)
    // whose task on worker-1 holds the calls and writes what its own next
    // call got.
    let holder = format!(
        r#"# argus-e2e-holder
import json, os, socket, subprocess, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)
node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == "{ip}")

@ray.remote(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
def hold():
    def write(d):
        with open("{marker}.new", "w") as f:
            json.dump(d, f)
        os.replace("{marker}.new", "{marker}")
    # 20 detached containers at once: the job's own engines are bounded
    # (ARGUS_SHIM_MAX_ENGINES_PER_JOB, 16 by default), under one lock.
    # Each prints more than a pipe holds (78,894 bytes), then sleeps.
    runs = [subprocess.Popen(["podman", "run", "-d", "--entrypoint", "sh", "{image}", "-c",
                              "seq 1 15000; exec sleep 900"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(20)]
    outs = [r.communicate() + (r.returncode,) for r in runs]
    made = [o.strip() for o, _, code in outs if code == 0]
    refused = sorted({{f"{{code}}: {{e.strip()}}" for _, e, code in outs if code != 0}})
    if not made:
        write({{"error": "own containers: " + "; ".join(refused)}})
        return
    target = made[0]
    # 50 follows at once: the node lets a job have a quarter of its 16.
    follows = [subprocess.Popen(["podman", "logs", "-f", target], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for _ in range(50)]
    t0 = time.time()
    while sum(p.poll() is None for p in follows) > 4 and time.time() - t0 < 120:
        time.sleep(0.2)
    following = [p for p in follows if p.poll() is None]
    more = subprocess.run(["podman", "logs", "-f", target], capture_output=True, text=True,
                          timeout=60)
    follow_refusal = f"{{more.returncode}}: {{more.stderr.strip()}}"
    # Then calls that hold without a follower: a plain logs into a pipe
    # that is never read (the first fills it, every one blocks on it).
    r, w = os.pipe()
    held = [subprocess.Popen(["podman", "logs", target], stdout=w,
                             stderr=subprocess.DEVNULL) for _ in range(600)]
    os.close(w)
    seen, t0 = [], time.time()
    while time.time() - t0 < 180:
        o = subprocess.run(["podman", "ps", "-q"], capture_output=True, text=True)
        if o.returncode == 125 and "podman calls of Ray job" in o.stderr:
            gone = sum(p.poll() is not None for p in held)
            write({{"container": target, "refusal": o.stderr.strip(), "took": time.time() - t0,
                   "refused_of_600": gone, "job": os.environ.get("RAY_JOB_ID"),
                   "made": len(made), "engine_refusals": refused,
                   "following": len(following), "follow_refusal": follow_refusal}})
            time.sleep(900)
            return
        seen.append(f"{{time.time() - t0:.0f}}s: {{o.returncode}} {{o.stderr.strip()}}")
        time.sleep(0.5)
    write({{"container": target, "error": "never refused: " + "; ".join(seen[-6:])}})
    time.sleep(900)

ray.get(hold.remote())
"#,
        ip = c.ip("worker-1")
    );
    // dockerd's inotify instances (each json-file follower holds one), when
    // this test sees the daemon's process (root on the daemon's host).
    let dockerd_inotify = || -> Option<usize> {
        let pid = String::from_utf8(output(Command::new("pidof").arg("dockerd")).stdout).ok()?;
        let fds = std::fs::read_dir(format!("/proc/{}/fd", pid.trim())).ok()?;
        Some(
            fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy() == "anon_inode:inotify")
                .count(),
        )
    };
    let inotify_before = dockerd_inotify();
    run(Command::new("docker").args([
        "exec", "-d", "-u", "ray", &head, "timeout", "1200", "python", "-c", &holder,
    ]));
    let t0 = Instant::now();
    let held: Value = loop {
        let o = output(Command::new("docker").args(["exec", &worker, "cat", marker]));
        if o.status.success() {
            break serde_json::from_slice(&o.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "R-SEC-5: the holding job on worker-1 wrote nothing in 300 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let target = held["container"].as_str().unwrap_or_default().to_string();
    // The job PID 1 gave the job's containers (io.argus.shim.job).
    let job = if target.is_empty() {
        String::new()
    } else {
        run(Command::new("docker").args([
            "inspect",
            "-f",
            "{{index .Config.Labels \"io.argus.shim.job\"}}",
            &target,
        ]))
        .trim()
        .to_string()
    };
    let of_job = || -> Vec<String> {
        if job.is_empty() {
            return Vec::new();
        }
        run(Command::new("docker").args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=io.argus.shim.job={job}"),
        ]))
        .split_whitespace()
        .map(str::to_string)
        .collect()
    };
    let end_holder = || {
        let _ = output(Command::new("docker").args([
            "exec",
            &head,
            "pkill",
            "-u",
            "ray",
            "-f",
            "argus-e2e-holder",
        ]));
        let mut all = of_job();
        all.push(target.clone());
        all.retain(|id| !id.is_empty());
        let _ = output(Command::new("docker").args(["rm", "-f"]).args(&all));
    };
    if held.get("error").is_some() {
        end_holder();
        panic!("R-SEC-5 control: the holding job: {held}");
    }
    // R-SEC-9: of 20 detached containers asked at once, the job's bound
    // (16) were made, labelled with the job the raylet gave its worker,
    // and the rest refused by the rule; Docker holds exactly 16.
    let engines = of_job();
    let refusals = held["engine_refusals"].to_string();
    if held["made"] != 16
        || engines.len() != 16
        || job != held["job"].as_str().unwrap_or_default()
        || !refusals.contains("125: ")
        || !refusals.contains("rule engines-per-job")
    {
        end_holder();
        panic!(
            "R-SEC-9: 20 detached containers of one job at once: {} made, {} on the daemon with its job label {job:?} (its worker's RAY_JOB_ID {}); refusals {refusals}",
            held["made"],
            engines.len(),
            held["job"]
        );
    }
    log(&format!(
        "R-SEC-9: 20 detached containers of job {job} at once: 16 made, the rest refused ({refusals})"
    ));
    // R-SEC-5: of 50 follows, the job's four follow; the next is refused
    // by the rule, and dockerd holds no more inotify instances than that.
    let inotify_held = dockerd_inotify();
    let follow_refusal = held["follow_refusal"].as_str().unwrap_or_default();
    let rise = inotify_held
        .zip(inotify_before)
        .map(|(h, b)| h.saturating_sub(b));
    if held["following"] != 4
        || !follow_refusal.starts_with("125: ")
        || !follow_refusal.contains("rule log-follows")
        || rise.is_some_and(|r| r > 8)
    {
        end_holder();
        panic!(
            "R-SEC-5: 50 podman logs -f of one job at once: {} still following (a job's bound is 4); the next: {follow_refusal}; dockerd's inotify instances {inotify_before:?} before, {inotify_held:?} while they followed",
            held["following"]
        );
    }
    log(&format!(
        "R-SEC-5: 50 podman logs -f of one job: 4 follow, dockerd's inotify instances {inotify_before:?} -> {inotify_held:?}; the next: {follow_refusal}"
    ));
    log(&format!(
        "R-SEC-5: a job holds its share after {:.1} s; its next call: {} ({} of 600 refused at once)",
        held["took"].as_f64().unwrap_or(f64::NAN),
        held["refusal"].as_str().unwrap_or_default(),
        held["refused_of_600"]
    ));
    // An operator's call (outside any job) meanwhile: answered.
    let operator = podman_as_ray(&worker, &["ps", "-q"]);
    let script = format!(
        r#"
import json, os, socket, subprocess, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)
node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == "{ip}")
pin = NodeAffinitySchedulingStrategy(node, soft=False)

@ray.remote(scheduling_strategy=pin)
def own_calls():
    t0 = time.time()
    o = subprocess.run(["podman", "ps", "-q"], capture_output=True, text=True)
    took = time.time() - t0
    # Its own engine: its job's count, not the holder's.
    e = subprocess.run(["podman", "run", "--rm", "--entrypoint", "true", "{image}"],
                       capture_output=True, text=True)
    return {{"code": o.returncode, "stderr": o.stderr.strip(), "took": took,
            "engine": e.returncode, "engine_stderr": e.stderr.strip()}}

@ray.remote(runtime_env={{"image_uri": "{image}"}}, scheduling_strategy=pin)
def task():
    from serve.engine_info import engine_info
    return engine_info()

calls = ray.get(own_calls.remote(), timeout=90)
t0 = time.time()
info = ray.get(task.remote(), timeout=90)
info["took"] = time.time() - t0
info["calls"] = calls
print(json.dumps(info))
"#,
        ip = c.ip("worker-1")
    );
    let out = output(Command::new("docker").args([
        "exec", "-u", "ray", &head, "timeout", "150", "python", "-c", &script,
    ]));
    // The held calls end with their job and its container, whatever the
    // verdict.
    end_holder();
    assert!(
        operator.status.success(),
        "R-SEC-5: an operator's podman call on worker-1 was refused while one job held its share: {}",
        String::from_utf8_lossy(&operator.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "R-SEC-5: another job's tasks on worker-1 did not run while a job held its every podman place\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        r["calls"]["code"], 0,
        "R-SEC-5: another job's own podman call on worker-1 was refused while one job held its share: {}",
        r["calls"]
    );
    assert_eq!(
        r["calls"]["engine"], 0,
        "R-SEC-9: another job's own engine on worker-1 was refused while one job had its every engine: {}",
        r["calls"]
    );
    log(&format!(
        "R-SEC-5: beside the held calls, another job's podman ps answered in {:.2} s and its image_uri task in {:.1} s ({})",
        r["calls"]["took"].as_f64().unwrap_or(f64::NAN),
        r["took"].as_f64().unwrap_or(f64::NAN),
        r["version"]
    ));
    let t0 = Instant::now();
    let handlers = || {
        let o = output(Command::new("docker").args([
            "exec",
            &worker,
            "pgrep",
            "-c",
            "-f",
            "__shim-handler",
        ]));
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<usize>()
            .unwrap_or(0)
    };
    while handlers() > 8 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the held calls did not end with their job and container ({} handlers left)",
            handlers()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn jobs_reach_no_docker_daemon(c: &Cluster, image: &str) {
    let attack = include_str!("fixtures/attack/reach_docker.py");
    let report = |o: &Output, who: &str| -> Value {
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{who}: the attack program failed\n--- stdout\n{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{who}: {e}: {stdout}"))
    };
    // Control: root in a worker container reaches the daemon.
    let worker = c.container("worker-1");
    let r = report(
        &with_stdin(&["exec", "-i", &worker, "python", "-"], attack),
        "control",
    );
    log(&format!("attack control (root in a worker): {r}"));
    assert!(
        !r["answers"].as_array().unwrap().is_empty(),
        "the attack program found no daemon even as root: it could not fail: {r}"
    );
    // The attacker: a driver on the head, as the Ray user ...
    let head = c.container("head");
    let r = report(
        &with_stdin(
            &[
                "exec",
                "-u",
                "ray",
                "-e",
                &format!("ATTACK_IMAGE={image}"),
                "-i",
                &head,
                "python",
                "-",
            ],
            attack,
        ),
        "driver",
    );
    log(&format!("attack from a driver: {r}"));
    assert_eq!(
        r["answers"],
        serde_json::json!([]),
        "a driver reached the daemon: {r}"
    );
    assert!(r["tried"].as_u64().unwrap() >= 10, "{r}");
    // ... and tasks: plain, and in the engine image in both forms.
    let driver = format!(
        r#"
import contextlib, io, json, os, socket
import ray
ATTACK = {attack}
IMG = "{image}"
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)
def run_attack():
    import contextlib, io, json, os
    os.environ["ATTACK_IMAGE"] = IMG
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(ATTACK, "reach_docker.py", "exec"), {{"__name__": "__main__"}})
    return json.loads(buf.getvalue().strip().splitlines()[-1])
out = {{}}
for name, env in [("plain", None), ("image_uri", {{"image_uri": IMG}}), ("container", {{"container": {{"image": IMG}}}})]:
    opts = dict(resources={{"worker_node": 1}})
    if env:
        opts["runtime_env"] = env
    out[name] = ray.get(ray.remote(**opts)(run_attack).remote(), timeout=600)
print(json.dumps(out))
"#,
        attack = serde_json::to_string(attack).unwrap()
    );
    let r = report(
        &with_stdin(
            &[
                "exec", "-u", "ray", "-i", &head, "timeout", "900", "python", "-",
            ],
            &driver,
        ),
        "tasks",
    );
    for form in ["plain", "image_uri", "container"] {
        log(&format!("attack from a {form} task: {}", r[form]));
        assert_eq!(
            r[form]["answers"],
            serde_json::json!([]),
            "a {form} task reached the daemon: {}",
            r[form]
        );
        assert!(r[form]["tried"].as_u64().unwrap_or(0) >= 5, "{}", r[form]);
    }
}

/// Returns a driver program (run in the head) with one task in an engine
/// container: `probe` prints engine info, the answer and the model file as
/// JSON; `sleep` sleeps for ten minutes.
fn job_script(image: &str, cache: &str, mount: &str, mode: &str) -> String {
    format!(
        r#"
import json, os, socket, time
import ray
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)
env = {{"image_uri": "{image}"}} if "{mode}" == "uri" else {{"container": {{"image": "{image}", "run_options": ["-v", "{cache}:{mount}:ro"]}}}}

@ray.remote(runtime_env=env, resources={{"worker_node": 1}})
def task(x, mode):
    from serve.engine_info import engine_info
    info = engine_info()
    if mode == "sleep":
        time.sleep(600)
    try:
        info["model"] = open("{mount}/model.txt").read()
    except Exception as e:
        info["model"] = repr(e)
    info["answer"] = x * 7
    return info

print(json.dumps(ray.get(task.remote(6, "{mode}"), timeout=600)))
"#
    )
}

/// The short chaos soak (issue 9.3): `scripts/soak.sh --faults 6 --seed 1` on
/// its own compose project with the images this test binary built; every
/// invariant must hold after every fault (the full soak is `scripts/soak.sh`,
/// docs/soak.md).
#[test]
fn compose_short_chaos_soak_keeps_every_invariant() {
    elapsed_since_start();
    require_docker();
    build_images(true);
    build_redis_image();
    build_lb_image();
    let root = workspace_root();
    let project = format!("argus-soak-e2e-{}", std::process::id());
    log(&format!(
        "scripts/soak.sh --faults 6 --seed 1 (project {project})"
    ));
    // Its stdout (the fault table) is echoed line by line and kept: a
    // failure's message names the broken faults and invariants, so that the
    // one line scripts/test's report keeps of it says which check broke.
    let mut child = Command::new(root.join("scripts/soak.sh"))
        .current_dir(&root)
        .args(["--faults", "6", "--seed", "1", "--no-build"])
        .args(["--node-image", &node_image()])
        .args(["--engine-image", &engine_image("stub-a")])
        // The suite's Redis and lb (soak.sh's own tags are built only when
        // missing: a stale one from an older checkout ran here, a Redis
        // without the password the head now reads).
        .args(["--redis-image", &redis_image()])
        .args(["--lb-image", &lb_image()])
        .args(["--project", &project])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run scripts/soak.sh");
    let mut table = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap())) {
        let line = line.expect("soak.sh's stdout");
        println!("{line}");
        table.push(line);
    }
    let status = child.wait().expect("scripts/soak.sh");
    assert!(
        status.success(),
        "scripts/soak.sh --faults 6 --seed 1 failed ({status}): {}; the table and logs are in the test's output",
        soak_verdict(&table)
    );
}

/// The lines of soak.py's report that say what broke, on one line: the
/// count of faults survived, each BROKEN fault's row, an RSS growth.
fn soak_verdict(table: &[String]) -> String {
    let broken: Vec<&str> = table
        .iter()
        .map(|l| l.trim())
        .filter(|l| {
            l.starts_with("faults survived")
                || l.contains("BROKEN")
                || l.starts_with("agent RSS grew")
        })
        .collect();
    if broken.is_empty() {
        "no table (soak.py stopped before its report)".to_string()
    } else {
        broken.join(" || ")
    }
}

/// The Serve configs of docker/serve/, merged into one deployment by a
/// program in the head (PyYAML comes with Ray): reads {"configs": [yaml
/// text, ...], "replicas": {app: n}} on stdin, keeps the applications named
/// in `replicas` with that many replicas of each deployment (none left:
/// `applications: []`, which deletes them all) and prints the config, which
/// `argus-agent ray-tool serve deploy -` then takes on stdin.
const SERVE_DEPLOY_SCRIPT: &str = r#"
import json, sys, yaml
spec = json.load(sys.stdin)
configs = [yaml.safe_load(t) for t in spec["configs"]]
out = {k: v for k, v in configs[0].items() if k != "applications"}
apps = []
for c in configs:
    for k in ("proxy_location", "http_options"):
        assert c.get(k) == out.get(k), f"the configs differ in {k}"
    for a in c["applications"]:
        n = spec["replicas"].get(a["name"])
        if n is None:
            continue
        for d in a["deployments"]:
            d["num_replicas"] = n
        apps.append(a)
out["applications"] = apps
print(yaml.safe_dump(out))
"#;

/// GETs the URL in argv[1] and prints the answer (JSON); exits non-zero
/// with the reason when it does not answer 200.
const HTTP_GET_SCRIPT: &str = r#"
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=20) as r:
        print(r.read().decode())
except Exception as e:
    sys.exit(f"{sys.argv[1]}: {e!r}")
"#;

/// The Serve application names of docker/serve/engine-image-uri.yaml and
/// engine-container.yaml, and their route prefixes.
const SERVE_URI_APP: (&str, &str) = ("engine-uri", "/uri");
const SERVE_CONTAINER_APP: (&str, &str) = ("engine-container", "/container");

/// A deadline for clean-up conditions: generous, the figure printed is the
/// bound we state.
const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

impl Cluster {
    /// docker/serve/'s two example configs with their placeholders filled:
    /// `image_uri` with `uri_image`, `container` with `container_image`
    /// and this cluster's model cache.
    fn serve_configs(&self, uri_image: &str, container_image: &str) -> Vec<String> {
        let read = |f: &str| {
            let p = workspace_root().join("docker/serve").join(f);
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let cache = self.model_cache.display().to_string();
        let fill = |text: String, image: &str| {
            let out = text
                .replace("${ENGINE_IMAGE}", image)
                .replace("${ARGUS_MODEL_CACHE}", &cache);
            // Only comments may still name a placeholder.
            for l in out.lines().filter(|l| !l.trim_start().starts_with('#')) {
                assert!(!l.contains("${"), "placeholder left in a Serve config: {l}");
            }
            out
        };
        vec![
            fill(read("engine-image-uri.yaml"), uri_image),
            fill(read("engine-container.yaml"), container_image),
        ]
    }

    /// `serve deploy`s the applications of `configs` named in `replicas`
    /// (with that many replicas each); the others are deleted.
    fn serve_deploy(&self, configs: &[String], replicas: &[(&str, u32)]) {
        let spec = serde_json::json!({
            "configs": configs,
            "replicas": replicas.iter().map(|(a, n)| (a.to_string(), Value::from(*n))).collect::<serde_json::Map<_, _>>(),
        });
        log(&format!("serve deploy {replicas:?}"));
        let head = self.container("head");
        let merged = with_stdin(
            &[
                "exec",
                "-u",
                "ray",
                "-i",
                &head,
                "python",
                "-I",
                "-c",
                SERVE_DEPLOY_SCRIPT,
            ],
            &spec.to_string(),
        );
        assert!(
            merged.status.success(),
            "merging the Serve configs: {}",
            String::from_utf8_lossy(&merged.stderr)
        );
        // The documented way (docs/serve.md): the config on stdin.
        let out = with_stdin(
            &[
                "exec",
                "-i",
                &head,
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
            &String::from_utf8_lossy(&merged.stdout),
        );
        if !out.status.success() {
            self.dump_logs();
            panic!(
                "serve deploy {replicas:?} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// GETs `http://<ip of service>:8000<route>` from inside the head (the
    /// compose network), retrying until it answers or `timeout` passes.
    fn serve_get(&self, service: &str, route: &str, timeout: Duration) -> Value {
        let url = format!("http://{}:8000{route}", self.ip(service));
        let start = Instant::now();
        loop {
            let out = output(Command::new("docker").args([
                "exec",
                "-u",
                "ray",
                &self.container("head"),
                "python",
                "-c",
                HTTP_GET_SCRIPT,
                &url,
            ]));
            let stdout = String::from_utf8_lossy(&out.stdout);
            if out.status.success() {
                if let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) {
                    return v;
                }
            }
            if start.elapsed() > timeout {
                self.dump_logs();
                panic!(
                    "{service}'s Serve proxy did not answer {url} within {timeout:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// The engine containers (running or not) the shim of `service`
    /// created, as "id image" lines; only those of `image` when given.
    fn engine_containers(&self, service: &str, image: Option<&str>) -> Vec<String> {
        let mut cmd = Command::new("docker");
        cmd.args(["ps", "-a", "--format", "{{.ID}} {{.Image}} {{.Status}}"])
            .args([
                "--filter",
                &format!("label=io.argus.shim.owner={}", self.container(service)),
            ]);
        // The shim creates engines from the image's full ID, resolved once
        // (docs/security.md), so `docker ps` shows that ID (short), not the
        // name the job gave.
        let id = image.map(|i| {
            run(Command::new("docker").args(["image", "inspect", "-f", "{{.Id}}", i]))
                .trim()
                .trim_start_matches("sha256:")
                .to_string()
        });
        run(&mut cmd)
            .lines()
            .filter(|l| {
                let shown = l.split_whitespace().nth(1).unwrap_or_default();
                image.is_none_or(|i| shown == i)
                    || id.as_deref().is_some_and(|id| {
                        let shown = shown.trim_start_matches("sha256:");
                        shown.len() >= 12 && id.starts_with(shown)
                    })
            })
            .map(String::from)
            .collect()
    }

    /// The processes in `service`'s container (engine containers share its
    /// PID namespace) whose command line starts with `prefix`, as "pid
    /// command" lines.
    fn processes(&self, service: &str, prefix: &str) -> Vec<String> {
        let out = output(Command::new("docker").args([
            "exec",
            &self.container(service),
            "pgrep",
            "-a",
            "-f",
            &format!("^{prefix}"),
        ]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect()
    }

    /// Waits until `what` (a description) holds, polling `check`, which
    /// returns None when it holds or what is still wrong; returns the time
    /// it took.
    fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Option<String>,
    ) -> Duration {
        let start = Instant::now();
        loop {
            match check() {
                None => {
                    let took = start.elapsed();
                    log(&format!("{what}: after {:.1}s", took.as_secs_f64()));
                    return took;
                }
                Some(wrong) if start.elapsed() > timeout => {
                    self.dump_logs();
                    panic!("{what}: not within {timeout:?}; still: {wrong}");
                }
                Some(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// Returns None when the workers run exactly `n` replicas of Serve
    /// application `app` in engine containers of `image` (processes and
    /// containers both), else what they run.
    fn replicas_wrong(&self, app: &str, image: &str, n: usize) -> Option<String> {
        let mut procs = 0;
        let mut containers = 0;
        let mut seen = Vec::new();
        for w in ["worker-1", "worker-2"] {
            let p = self.processes(w, &format!("ray::ServeReplica:{app}:"));
            let c = self.engine_containers(w, Some(image));
            procs += p.len();
            containers += c.len();
            seen.push(format!("{w}: processes {p:?}, containers {c:?}"));
        }
        (procs != n || containers != n).then(|| seen.join("; "))
    }

    /// Returns None when no node runs a Serve replica or an engine
    /// container, else what is left.
    fn serve_leftovers(&self) -> Option<String> {
        let mut left = Vec::new();
        for s in SERVICES {
            let p = self.processes(s, "ray::ServeReplica");
            let c = self.engine_containers(s, None);
            if !p.is_empty() || !c.is_empty() {
                left.push(format!("{s}: processes {p:?}, containers {c:?}"));
            }
        }
        (!left.is_empty()).then(|| left.join("; "))
    }
}

/// Checks an answer of the stand-in engine app (docker/engine/serve/vllm):
/// served from inside engine image `version` with Ray 2.53.0; with
/// `run_options` also the `--env` of the config and the model cache file
/// through the read-only bind.
fn assert_engine_answer(who: &str, r: &Value, version: &str, run_options: bool) {
    assert_eq!(
        (r["version"].as_str(), r["ray"].as_str()),
        (Some(version), Some(RAY_VERSION)),
        "{who} was not served from engine image {version}: {r}"
    );
    if run_options {
        assert_eq!(
            r["env"]["VLLM_LOGGING_LEVEL"], "DEBUG",
            "{who}: the run_options --env did not reach the engine: {r}"
        );
        assert_eq!(
            r["model_files"]["model.txt"], "weights-v1\n",
            "{who}: the model cache is not readable through the run_options bind: {r}"
        );
    }
}

/// Brings up the GCS FT cluster, deploys both example applications with
/// `replicas` each and waits until they run in engine containers.
/// The GCS FT cluster (docker-compose.gcs-ft.yaml: Redis, the head's GCS
/// restored across its restarts): three checks that were tests of their
/// own, one cluster (tests/support/scenario.rs).
#[test]
fn compose_gcs_ft_cluster_scenario() {
    elapsed_since_start();
    let mut s = Scenario::new(
        "compose_e2e",
        "compose_gcs_ft_cluster_scenario",
        &[
            "serve_replicas_run_in_engine_containers_scale_and_leave_nothing_after_delete_and_shutdown",
            "serve_replicas_answer_after_head_failover_and_are_reaped_after_delete_and_shutdown",
            "compose_gcs_ft_detached_actor_rides_through_head_container_restart",
        ],
        || {
            require_docker();
            build_images(true);
            build_redis_image();
            Cluster::up_with(&[], &["docker-compose.gcs-ft.yaml"])
        },
        gcs_ft_gate,
    );
    s.phase(
        "serve_replicas_run_in_engine_containers_scale_and_leave_nothing_after_delete_and_shutdown",
        serve_replicas_run_in_engine_containers_scale_and_leave_nothing_after_delete_and_shutdown,
    );
    s.phase(
        "serve_replicas_answer_after_head_failover_and_are_reaped_after_delete_and_shutdown",
        serve_replicas_answer_after_head_failover_and_are_reaped_after_delete_and_shutdown,
    );
    s.phase(
        "compose_gcs_ft_detached_actor_rides_through_head_container_restart",
        compose_gcs_ft_detached_actor_rides_through_head_container_restart,
    );
    s.finish();
}

/// Between two phases of the GCS FT scenario: the plain gate (every node
/// running, three Ray nodes, no engine container), and no Serve
/// application, replica process or engine container left.
fn gcs_ft_gate(c: &Cluster) -> Result<(), String> {
    plain_gate(c)?;
    match c.serve_status() {
        Ok(v) if v["applications"].as_object().is_none_or(|a| a.is_empty()) => {}
        Ok(v) => return Err(format!("Serve applications left: {v}")),
        Err(e) => return Err(format!("Serve's status: {e}")),
    }
    c.serve_leftovers()
        .map_or(Ok(()), |l| Err(format!("Serve left: {l}")))
}

/// Deploys docker/serve/'s two applications with `replicas` each and waits
/// for them in their engine containers; returns the configs and the nodes.
fn serve_deployed(c: &Cluster, replicas: u32) -> (Vec<String>, Vec<Node>) {
    let nodes = c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    let configs = c.serve_configs(&engine_image("stub-a"), &engine_image("stub-b"));
    let (uri, cont) = (SERVE_URI_APP.0, SERVE_CONTAINER_APP.0);
    let t = Instant::now();
    c.serve_deploy(&configs, &[(uri, replicas), (cont, replicas)]);
    c.wait_serve_running(
        &[(uri, replicas), (cont, replicas)],
        Duration::from_secs(600),
    );
    log(&format!(
        "serve deploy -> both applications RUNNING: {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    c.wait_replicas(replicas, replicas, Duration::from_secs(120));
    (configs, nodes)
}

impl Cluster {
    /// Waits until the workers run `uri` image_uri and `cont` container
    /// replicas, each in an engine container of its image.
    fn wait_replicas(&self, uri: u32, cont: u32, timeout: Duration) -> Duration {
        self.wait_until(
            &format!("{uri} image_uri + {cont} container replicas in engine containers"),
            timeout,
            || {
                self.replicas_wrong(SERVE_URI_APP.0, &engine_image("stub-a"), uri as usize)
                    .or_else(|| {
                        self.replicas_wrong(
                            SERVE_CONTAINER_APP.0,
                            &engine_image("stub-b"),
                            cont as usize,
                        )
                    })
            },
        )
    }

    /// Each worker's Serve proxy answers both routes from inside the
    /// engine images, with the container form's run options.
    fn check_serve_answers(&self, when: &str) {
        for w in ["worker-1", "worker-2"] {
            let (_, route) = SERVE_URI_APP;
            let r = self.serve_get(w, route, Duration::from_secs(120));
            log(&format!("{when}: {w} {route}: {r}"));
            assert_engine_answer(&format!("{w} {route}"), &r, "stub-a", false);
            let (_, route) = SERVE_CONTAINER_APP;
            let r = self.serve_get(w, route, Duration::from_secs(120));
            log(&format!("{when}: {w} {route}: {r}"));
            assert_engine_answer(&format!("{w} {route}"), &r, "stub-b", true);
        }
    }

    /// `serve shutdown -y` as the Ray user in the head.
    fn serve_shutdown(&self) {
        log("serve shutdown -y");
        run(Command::new("docker").args([
            "exec",
            "-u",
            "ray",
            &self.container("head"),
            "serve",
            "shutdown",
            "-y",
            "-a",
            "http://127.0.0.1:8265",
        ]));
    }
}

/// Issue 16: Ray Serve on the compose cluster (GCS FT), deployed with
/// `serve deploy` from docker/serve/'s configs, one application in the
/// `image_uri` form and one in the `container` form (with run_options: an
/// --env and the model cache read-only). Each worker's proxy answers from
/// inside the engine image; scaling a deployment up and down adds and
/// removes engine containers; deleting an application and `serve shutdown`
/// leave no engine container and no replica process on any node.
fn serve_replicas_run_in_engine_containers_scale_and_leave_nothing_after_delete_and_shutdown(
    c: &Cluster,
) {
    let (configs, _) = serve_deployed(c, 2);
    let (uri, cont) = (SERVE_URI_APP.0, SERVE_CONTAINER_APP.0);
    c.check_serve_answers("deployed");

    let t = Instant::now();
    c.serve_deploy(&configs, &[(uri, 4), (cont, 2)]);
    c.wait_serve_running(&[(uri, 4), (cont, 2)], Duration::from_secs(600));
    c.wait_replicas(4, 2, Duration::from_secs(120));
    log(&format!(
        "scale up 2 -> 4: {:.1}s to 4 replicas in engine containers",
        t.elapsed().as_secs_f64()
    ));
    let t = Instant::now();
    c.serve_deploy(&configs, &[(uri, 1), (cont, 2)]);
    let serve = c.wait_serve_running(&[(uri, 1), (cont, 2)], Duration::from_secs(300));
    c.wait_replicas(1, 2, CLEANUP_DEADLINE);
    log(&format!(
        "scale down 4 -> 1: serve status RUNNING at 1 after {:.1}s, the 3 engine containers gone after {:.1}s",
        serve.as_secs_f64(),
        t.elapsed().as_secs_f64()
    ));

    let t = Instant::now();
    c.serve_deploy(&configs, &[(cont, 2)]);
    c.wait_replicas(0, 2, CLEANUP_DEADLINE);
    log(&format!(
        "delete the image_uri application -> its replica and engine container gone: {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    let r = c.serve_get("worker-2", SERVE_CONTAINER_APP.1, Duration::from_secs(60));
    assert_engine_answer("worker-2 after the delete", &r, "stub-b", true);
    let t = Instant::now();
    c.serve_shutdown();
    c.wait_until(
        "serve shutdown: no replica process or engine container on any node",
        CLEANUP_DEADLINE,
        || c.serve_leftovers(),
    );
    log(&format!(
        "serve shutdown -> no replica or engine container left: {:.1}s",
        t.elapsed().as_secs_f64()
    ));
}

/// Issue 16: after a head failover (GCS FT: docker kill + docker start of
/// the head container) each worker's proxy still answers from the engine
/// images; deleting the applications and `serve shutdown` then leave no
/// replica or engine container. Ray 2.53.0 leaves the replicas created
/// before the GCS restart running although it holds them DEAD (its GCS
/// restores no raylet address for them: ray-project/ray#63763); the worker
/// agents, having ridden the restart through, kill them (their dead-actor
/// reaper, docker/ray/reap_dead_actors.py every 30 s). The test prints what
/// they killed and how long it took.
fn serve_replicas_answer_after_head_failover_and_are_reaped_after_delete_and_shutdown(c: &Cluster) {
    let (configs, nodes) = serve_deployed(c, 1);
    let (uri, cont) = (SERVE_URI_APP.0, SERVE_CONTAINER_APP.0);
    c.check_serve_answers("deployed");

    let head = c.container("head");
    let head_ip = c.ip("head");
    let workers: Vec<String> = nodes
        .iter()
        .filter(|n| n.ip != head_ip)
        .map(|n| n.id.clone())
        .collect();
    log("fault: docker kill + docker start of the head container (GCS FT on)");
    let t = Instant::now();
    run(Command::new("docker").args(["kill", &head]));
    run(Command::new("docker").args(["start", &head]));
    c.wait_nodes(
        "3 nodes alive, the workers with their old node ids",
        Duration::from_secs(240),
        |n| n.len() == 3 && workers.iter().all(|w| n.iter().any(|x| &x.id == w)),
    );
    c.wait_serve_running(&[(uri, 1), (cont, 1)], Duration::from_secs(600));
    log(&format!(
        "head kill+start -> Serve RUNNING again: {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    c.check_serve_answers("after the head failover");
    c.wait_replicas(1, 1, Duration::from_secs(120));

    let t = Instant::now();
    c.serve_deploy(&configs, &[(cont, 1)]);
    c.serve_shutdown();
    // Serve is done with them when no application is left; what still runs
    // then is what Ray lost.
    c.wait_until(
        "serve shutdown: no application left",
        CLEANUP_DEADLINE,
        || match c.serve_status() {
            Ok(v) if v["applications"].as_object().is_none_or(|a| a.is_empty()) => None,
            Ok(v) => Some(v.to_string()),
            Err(e) => Some(e),
        },
    );
    log(&format!(
        "delete + serve shutdown -> no application: {:.1}s; left before reaping: {}",
        t.elapsed().as_secs_f64(),
        c.serve_leftovers().unwrap_or_else(|| "nothing".into())
    ));
    c.wait_until(
        "the nodes reap what Ray leaked: no replica process or engine container on any node",
        CLEANUP_DEADLINE,
        || c.serve_leftovers(),
    );
    log(&format!(
        "delete + serve shutdown after a head failover -> nothing left (the workers' reaper): {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    for w in ["worker-1", "worker-2"] {
        for line in container_logs(&c.container(w))
            .lines()
            .filter(|l| l.contains("actors the gcs holds dead"))
        {
            log(&format!("{w}: {line}"));
        }
    }
}

/// Builds the attacker's engine image (issue 26, road 1): the engine image
/// plus, in its /etc/group, a group with the host's Docker socket gid that
/// the Ray user (uid 1000) belongs to, and the attack program. Returns the
/// image and that group's name in it.
/// R-SEC-7 on a base that has sudo: the local Ray base carries sudo with
/// the Ray user's password-less rule, as Ray's official base does. Control:
/// in a plain `docker run` of an image on that base (the attack image, FROM
/// a stand-in engine, FROM the base) the Ray user's `sudo -n id -u` is
/// root. In the node image (setuid bits and the rule stripped) and in an
/// engine container a job starts through the shim (`no-new-privileges`)
/// it is not.
fn sudo_gives_root_to_no_one(worker: &str, attack_img: &str) {
    let sudo_uid = |o: &Output| {
        let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
        (o.status.success(), out)
    };
    let control = output(Command::new("docker").args([
        "run", "--rm", "--user", "1000", attack_img, "sudo", "-n", "id", "-u",
    ]));
    assert_eq!(
        sudo_uid(&control),
        (true, "0".to_string()),
        "control: the base's sudo should make the Ray user root in a plain container: {}",
        String::from_utf8_lossy(&control.stderr)
    );
    let in_node = output(
        Command::new("docker").args(["exec", "-u", "ray", worker, "sudo", "-n", "id", "-u"]),
    );
    let in_engine = podman_as_ray(
        worker,
        &[
            "run", "--rm", "--user", "1000", attack_img, "sudo", "-n", "id", "-u",
        ],
    );
    for (where_, o) in [
        ("the node", &in_node),
        ("a job's engine container", &in_engine),
    ] {
        let (ok, uid) = sudo_uid(o);
        assert!(
            !(ok && uid == "0"),
            "sudo made the Ray user root in {where_}: {uid} {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    log(&format!(
        "sudo: root in a plain container of the base (control); refused in the node ({}) and in a job's engine container ({})",
        String::from_utf8_lossy(&in_node.stderr).trim(),
        String::from_utf8_lossy(&in_engine.stderr).trim()
    ));
}

fn build_attack_image(socket_gid: u32) -> (String, String) {
    let img = format!("localhost/argus-e2e-attack:{}", e2e_version());
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(
        ctx.path().join("reach_docker.py"),
        include_str!("fixtures/attack/reach_docker.py"),
    )
    .unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!(
            "FROM {base}\nUSER root\nRUN g=$(getent group {socket_gid} | cut -d: -f1); \
             if [ -z \"$g\" ]; then groupadd -g {socket_gid} dockerhost; g=dockerhost; fi; \
             usermod -aG \"$g\" $(getent passwd 1000 | cut -d: -f1); echo \"$g\" > /attack-group\n\
             COPY reach_docker.py /attack/reach_docker.py\n",
            base = engine_image("stub-a")
        ),
    )
    .unwrap();
    run(Command::new("docker")
        .args(["build", "-q", "-t", &img])
        .arg(ctx.path()));
    let group = run(Command::new("docker").args(["run", "--rm", &img, "cat", "/attack-group"]));
    (img, group.trim().to_string())
}

/// Containers of `image` on the host (any state).
fn containers_of(image: &str) -> Vec<String> {
    run(Command::new("docker").args(["ps", "-aq", "--filter", &format!("ancestor={image}")]))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The R-SEC-9 phase of the security test: a job's detached container ends
/// with the job (see the call site).
fn job_leaves_no_container_behind(c: &Cluster, head: &str, img: &str) {
    use std::io::{BufRead, BufReader};
    let release = "/tmp/argus-e2e-job-may-end";
    let driver = format!(
        r#"
import json, os, socket, subprocess, time
import ray
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)
@ray.remote(resources={{"worker_node": 1}})
def plant():
    run = subprocess.run(["podman", "run", "-d", "{img}", "sleep", "1005"], capture_output=True, text=True)
    # A double-forked daemon: its parent exits at once, PID 1 adopts it.
    daemon = subprocess.run(["sh", "-c", "setsid sleep 1006 </dev/null >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True).stdout.strip()
    alive = os.path.exists(f"/proc/{{daemon}}") if daemon else False
    return {{"host": socket.gethostname(), "rc": run.returncode, "id": run.stdout.strip(), "err": run.stderr[-400:],
            "daemon": daemon, "daemon_alive": alive}}
print(json.dumps(ray.get(plant.remote(), timeout=300)), flush=True)
t0 = time.time()
while not os.path.exists("{release}") and time.time() - t0 < 300:
    time.sleep(0.2)
"#
    );
    let _ = run(Command::new("docker").args(["exec", head, "rm", "-f", release]));
    let mut child = spawn_with_stdin(
        &[
            "exec", "-u", "ray", "-i", head, "timeout", "600", "python", "-",
        ],
        &driver,
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let Some(planted) = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| serde_json::from_str::<Value>(&l).ok())
    else {
        let out = child.wait_with_output().unwrap();
        panic!(
            "R-SEC-9: the job's task did not report: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let id = planted["id"].as_str().unwrap_or_default().to_string();
    assert!(
        planted["rc"] == 0 && !id.is_empty(),
        "control: a task's detached run: {planted}"
    );
    let host = planted["host"].as_str().unwrap_or_default();
    let running = || {
        run(Command::new("docker").args([
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("id={id}"),
        ]))
        .trim()
        .to_string()
    };
    assert!(
        !running().is_empty(),
        "control: while its job runs, the detached container {id} runs"
    );
    let daemon = planted["daemon"].as_str().unwrap_or_default().to_string();
    assert!(
        planted["daemon_alive"] == true && !daemon.is_empty(),
        "control: a task's double-forked daemon started: {planted}"
    );
    let node = c.container(host.strip_prefix("ray-").unwrap_or(host));
    let daemon_runs = || {
        run(Command::new("docker").args([
            "exec",
            &node,
            "sh",
            "-c",
            &format!("tr '\\0' ' ' < /proc/{daemon}/cmdline 2>/dev/null || true"),
        ]))
        .contains("sleep 1006")
    };
    run(Command::new("docker").args(["exec", head, "touch", release]));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the job's driver: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t0 = Instant::now();
    let gone = |id: &str| {
        !output(Command::new("docker").args(["inspect", "--type", "container", id]))
            .status
            .success()
    };
    while !gone(&id) || daemon_runs() {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "R-SEC-9: 90 s after its job ended, a task's detached container or daemon is still there \
             (container {id}, running: {:?}; daemon pid {daemon} runs: {})",
            running(),
            daemon_runs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    log(&format!(
        "R-SEC-9: a job's detached container and double-forked daemon on {host} were gone {:.1} s after its driver ended",
        t0.elapsed().as_secs_f64()
    ));
}

/// The last line of `o`'s stdout as JSON, or None.
fn last_json(o: &Output) -> Option<Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
}

/// What a job plants in the head (run as the Ray user): socket.py,
/// sitecustomize.py and usercustomize.py and a .pth file in every folder on
/// the image's Python path that the Ray user can write (its user site made
/// first), in its home, /tmp/ray/tmp and /tmp; and the config the old docs
/// wrote to /tmp/ray/tmp/serve.yaml, naming an application "planted". Each
/// planted module, when imported, leaves /tmp/ray/planted-<what>-<uid>-<NoNewPrivs>.
const PLANT_SCRIPT: &str = r#"
import os, site, subprocess, sys
payload = ("import os as _o; _n = [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0]; "
           "open('/tmp/ray/planted-%s-%d-%s' % ({what!r}, _o.getuid(), _n), 'w').close()")
paths = subprocess.run([sys.executable, "-c", "import sys; print(chr(10).join(sys.path))"],
                       capture_output=True, text=True, cwd="/home/ray").stdout.split()
user_site = site.getusersitepackages()
try:
    os.makedirs(user_site, exist_ok=True)
except OSError:
    pass
dirs = sorted(set(p for p in paths + [user_site, "/home/ray", "/tmp/ray/tmp", "/tmp", "/"]
                  if p and os.path.isdir(p) and os.access(p, os.W_OK)))
for d in dirs:
    for mod in ("socket", "sitecustomize", "usercustomize"):
        with open(os.path.join(d, mod + ".py"), "w") as f:
            f.write(payload.format(what=mod) + chr(10))
    with open(os.path.join(d, "argus_planted.pth"), "w") as f:
        f.write(payload.format(what="pth") + chr(10))
with open("/tmp/ray/tmp/serve.yaml", "w") as f:
    f.write("applications:\n- name: planted\n  import_path: planted:app\n  route_prefix: /planted\n")
print(" ".join(dirs))
"#;

/// Issue 38 item 4 (R-SEC-7): every operator command the docs and scripts
/// give (`argus-agent ray-tool nodes`, `serve deploy -` with the config on
/// stdin, `serve status`, `ray job submit`) runs nothing a job planted as
/// root or without no_new_privs, and deploys the config it was given, not
/// one planted where the old docs wrote theirs. Control: a plain `python`
/// of the Ray user in its home runs the planted code without no_new_privs.
fn operator_commands_run_nothing_planted(c: &Cluster, head: &str) {
    let o = with_stdin(
        &[
            "exec",
            "-u",
            "ray",
            "-e",
            "HOME=/home/ray",
            "-i",
            head,
            "python",
            "-I",
            "-",
        ],
        PLANT_SCRIPT,
    );
    assert!(
        o.status.success(),
        "planting: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dirs = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(dirs.contains("/home/ray"), "planted in: {dirs}");
    let markers = || {
        run(Command::new("docker").args([
            "exec",
            head,
            "sh",
            "-c",
            "cd /tmp/ray && ls | grep '^planted-' || true",
        ]))
    };
    let tool = |args: &[&str], stdin: &str| {
        let mut a = vec![
            "exec",
            "-i",
            head,
            "timeout",
            "180",
            "argus-agent",
            "ray-tool",
        ];
        a.extend_from_slice(args);
        let o = with_stdin(&a, stdin);
        assert!(
            o.status.success(),
            "ray-tool {args:?}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let nodes: Value =
        serde_json::from_str(tool(&["nodes"], "").trim()).expect("ray-tool nodes: JSON");
    assert_eq!(nodes["alive"], 3, "{nodes}");
    tool(
        &["serve", "deploy", "-a", "http://127.0.0.1:8265", "-"],
        "applications: []\n",
    );
    tool(&["serve", "status", "-a", "http://127.0.0.1:8265"], "");
    tool(
        &[
            "ray",
            "job",
            "submit",
            "--address",
            "http://127.0.0.1:8265",
            "--",
            "touch",
            "/tmp/ray/tmp/operator-job-ran",
        ],
        "",
    );
    tool(
        &["python"],
        "import ray; ray.init(address='auto'); print(len(ray.nodes()))",
    );
    let apps = c
        .dashboard_get("/api/serve/applications/")
        .expect("Serve's applications");
    assert!(
        apps["applications"].get("planted").is_none(),
        "serve deploy took the planted config: {apps}"
    );
    let ran = markers();
    let bad: Vec<&str> = ran
        .lines()
        .filter(|m| m.contains("-0-") || m.ends_with("-0"))
        .collect();
    assert!(
        bad.is_empty(),
        "planted code ran as root or without no_new_privs under the operator's commands: {bad:?} (all: {ran})"
    );
    // Control: the probe works: the Ray user's own python in its home
    // imports the planted code, without no_new_privs.
    let _ = output(Command::new("docker").args([
        "exec",
        "-u",
        "ray",
        "-w",
        "/home/ray",
        head,
        "python",
        "-c",
        "import socket",
    ]));
    let ran = markers();
    assert!(
        ran.lines()
            .any(|m| m.starts_with("planted-") && m.ends_with("-1000-0")),
        "control: planted code should run under a plain python of the Ray user: {ran}"
    );
    let _ = output(Command::new("docker").args([
        "exec", "-u", "ray", head, "sh", "-c",
        &format!(
            "for d in {dirs}; do rm -f $d/socket.py $d/sitecustomize.py $d/usercustomize.py $d/argus_planted.pth; done; \
             rm -f /tmp/ray/planted-* /tmp/ray/tmp/serve.yaml"
        ),
    ]));
}

/// One HTTP/1.0 request to `addr`: the status code and the body.
fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Ray's token authentication on the compose cluster (issue 38 item 1):
/// from the host through the published dashboard port and from a
/// container on the compose network that is not a node, the Jobs API, the
/// dashboard's API and the GCS refuse a caller without the cluster's token
/// or with a wrong one, and a job submitted so never runs (its marker file
/// stays absent); with the token (the control) the same calls work and the
/// job runs. The dashboard is published on the host's loopback only.
fn token_auth_phase(c: &Cluster, head: &str, node_img: &str) {
    let token = c.auth_token().expect("the head's token copy");
    assert_eq!(token.len(), 64, "the cluster's token: {token}");
    let env = |k: &str, d: &str| {
        c.env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| d.to_string())
    };
    let host_addr = format!("127.0.0.1:{}", c.dashboard_port());
    let bearer = format!("Bearer {token}");
    let wrong = format!("Bearer {}", "0".repeat(64));
    let job =
        |marker: &str| format!(r#"{{"entrypoint": "touch /tmp/ray/tmp/auth-marker-{marker}"}}"#);
    let marker_exists = |marker: &str| {
        output(Command::new("docker").args([
            "exec",
            head,
            "test",
            "-e",
            &format!("/tmp/ray/tmp/auth-marker-{marker}"),
        ]))
        .status
        .success()
    };
    // From the host, through the published port.
    for (who, headers) in [
        ("host-none", vec![]),
        ("host-wrong", vec![("Authorization", wrong.as_str())]),
    ] {
        let (code, body) = http_request(&host_addr, "POST", "/api/jobs/", &headers, &job(who));
        assert!(
            code == 401 || code == 403,
            "{who}: the Jobs API took a job without the token: {code} {body}"
        );
        let (code, _) = http_request(&host_addr, "GET", "/api/v0/nodes", &headers, "");
        assert!(
            code == 401 || code == 403,
            "{who}: the state API answered {code}"
        );
    }
    let (code, body) = http_request(
        &host_addr,
        "POST",
        "/api/jobs/",
        &[("Authorization", bearer.as_str())],
        &job("host-token"),
    );
    assert_eq!(code, 200, "control: a job with the token: {body}");
    // The published port is the host's loopback only.
    let ports = inspect(head, "{{json .NetworkSettings.Ports}}");
    assert!(
        ports.contains("\"HostIp\":\"127.0.0.1\"") && !ports.contains("\"HostIp\":\"0.0.0.0\""),
        "the dashboard must be published on 127.0.0.1 only: {ports}"
    );

    // From a container on the compose network that is not a node.
    let net = inspect(
        head,
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
    );
    let dash = format!("head:{}", env("ARGUS_DASHBOARD_PORT", "8265"));
    let gcs = format!("head:{}", env("ARGUS_RAY_PORT", "6379"));
    let probe = r#"
import json, sys, urllib.request, urllib.error
dash, gcs, header, body = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
req = urllib.request.Request(f"http://{dash}/api/jobs/", data=body.encode(), method="POST",
                             headers={"Content-Type": "application/json", **({"Authorization": header} if header else {})})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        http = r.status
except urllib.error.HTTPError as e:
    http = e.code
import ray._raylet as r
try:
    keys = r.GcsClient(address=gcs).internal_kv_keys(b"", None, timeout=20)
    g = "GCS-OK"
except Exception as e:
    g = "GCS-REFUSED " + type(e).__name__
print(json.dumps({"http": http, "gcs": g}))
"#;
    let outsider = |who: &str, auth_env: &[&str], header: &str| -> Value {
        let mut args = vec![
            "run".to_string(),
            "--rm".into(),
            "--network".into(),
            net.trim().to_string(),
            "--entrypoint".into(),
            "python".into(),
        ];
        for e in auth_env {
            args.extend(["-e".to_string(), e.to_string()]);
        }
        args.extend([
            node_img.to_string(),
            "-I".into(),
            "-c".into(),
            probe.into(),
            dash.clone(),
            gcs.clone(),
            header.into(),
            job(who),
        ]);
        let o = output(Command::new("docker").args(&args));
        last_json(&o).unwrap_or_else(|| {
            panic!(
                "{who}: the outsider's probe printed nothing: {}",
                String::from_utf8_lossy(&o.stderr)
            )
        })
    };
    let wrong_env = format!("RAY_AUTH_TOKEN={}", "0".repeat(64));
    let right_env = format!("RAY_AUTH_TOKEN={token}");
    for (who, auth_env, header) in [
        (
            "net-none",
            vec!["RAY_AUTH_MODE=disabled", "RAY_AUTH_TOKEN_PATH="],
            "",
        ),
        ("net-wrong", vec![wrong_env.as_str()], wrong.as_str()),
    ] {
        let r = outsider(who, &auth_env, header);
        assert!(
            r["http"] == 401 || r["http"] == 403,
            "{who}: the Jobs API took a job from the network without the token: {r}"
        );
        assert!(
            r["gcs"]
                .as_str()
                .is_some_and(|g| g.starts_with("GCS-REFUSED")),
            "{who}: the GCS answered without the token: {r}"
        );
    }
    let r = outsider("net-token", &[right_env.as_str()], &bearer);
    assert_eq!(r["http"], 200, "control: the outsider with the token: {r}");
    assert_eq!(
        r["gcs"], "GCS-OK",
        "control: the outsider with the token: {r}"
    );
    let until = Instant::now() + Duration::from_secs(180);
    while !(marker_exists("host-token") && marker_exists("net-token")) {
        assert!(
            Instant::now() < until,
            "control: the jobs submitted with the token did not run in 180 s: {}",
            c.dashboard_get("/api/jobs/")
                .map_or_else(|e| e, |v| v.to_string())
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    for who in ["host-none", "host-wrong", "net-none", "net-wrong"] {
        assert!(
            !marker_exists(who),
            "{who}: a job submitted without the token ran"
        );
    }
    log("token auth: 4 callers without the token refused (Jobs API, state API, GCS), no job ran; with it: 2 jobs ran, the GCS answered; dashboard on 127.0.0.1 only");
}

/// Issue 26 (SPEC §9b, docs/security.md), tried as the Ray user on a worker
/// of the compose cluster, every road checked on its effect:
/// - road 1: engine containers asked for the Docker socket's group by every
///   spelling (leading zeros, a name, a bare `--user 1000` whose image puts
///   uid 1000 in that group, keep-id) run with no such group, and reach no
///   daemon through `/proc/<pid>/root` of the Ray container's processes;
/// - road 4: a root engine container in the Ray container's PID namespace
///   (ARGUS_SHIM_ALLOWED_USERS=0, which the docs offer) does not start;
/// - road 3: a foreign container (the head's), by ID prefix, upper case, full
///   ID or name, is neither stopped, removed, read nor joined, and a
///   container NAMED like its ID prefix cannot be made;
/// - road 2 and hole 5: every folder and file the agents write as root, or
///   on /private, is renamed away and replaced by links to root-owned
///   canaries where the Ray user can, then the nodes restart: the canaries
///   are unchanged, forged epochs do not move the head, and the cluster
///   comes back.
#[test]
fn compose_a_ray_user_on_a_worker_reaches_neither_the_docker_api_nor_root() {
    use std::os::unix::fs::MetadataExt;
    elapsed_since_start();
    require_docker();
    build_images(true);
    let socket_gid = std::fs::metadata("/var/run/docker.sock").unwrap().gid();
    let (img, group) = build_attack_image(socket_gid);
    log(&format!(
        "attack image {img}: group {group} = gid {socket_gid} holds uid 1000"
    ));
    let c = Cluster::up(&[("ARGUS_SHIM_ALLOWED_USERS", "0")]);
    c.wait_nodes("cluster up", Duration::from_secs(600), |n| n.len() == 3);
    let worker = c.container("worker-1");
    let head = c.container("head");
    let before = containers_of(&img);

    // Road 1: the socket's group by any spelling, and the image's groups.
    let g = socket_gid.to_string();
    let probe = "python -c 'import os, json; print(json.dumps({\"uid\": os.getuid(), \"gid\": os.getgid(), \"groups\": os.getgroups()}))'; python /attack/reach_docker.py";
    let mut variants: Vec<Vec<String>> = Vec::new();
    for spelled in [
        g.clone(),
        format!("0{g}"),
        format!("00{g}"),
        format!("+{g}"),
        group.clone(),
        "0".into(),
        "00".into(),
        "root".into(),
    ] {
        variants.push(vec!["--group-add".into(), spelled.clone()]);
        variants.push(vec!["--user".into(), format!("1000:{spelled}")]);
        variants.push(vec![format!("--userns=keep-id:gid={spelled}")]);
    }
    variants.push(vec!["--user".into(), "1000".into()]);
    variants.push(vec!["--user".into(), "ray".into()]);
    variants.push(vec![]);
    let mut ran = 0;
    for v in &variants {
        let mut args: Vec<&str> = vec!["run", "--rm", "--pid=host"];
        args.extend(v.iter().map(String::as_str));
        args.extend([img.as_str(), "sh", "-c", probe]);
        let o = podman_as_ray(&worker, &args);
        let code = o.status.code();
        if code == Some(125) {
            log(&format!(
                "road 1 {v:?}: refused: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            continue;
        }
        let out = String::from_utf8_lossy(&o.stdout);
        let ids: Value = out
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| {
                panic!(
                    "road 1 {v:?}: no identity line (exit {code:?}): {out} {}",
                    String::from_utf8_lossy(&o.stderr)
                )
            });
        let attack = last_json(&o).unwrap();
        log(&format!("road 1 {v:?}: ran as {ids}; attack {attack}"));
        let groups: Vec<u64> = ids["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert!(
            !groups.contains(&u64::from(socket_gid)) && ids["gid"] != socket_gid,
            "road 1 {v:?}: the engine container runs with the Docker socket's group: {ids}"
        );
        assert!(
            !groups.contains(&0) && ids["gid"] != 0,
            "road 1 {v:?}: root group: {ids}"
        );
        assert_eq!(
            attack["answers"],
            serde_json::json!([]),
            "road 1 {v:?}: reached the daemon: {attack}"
        );
        assert!(attack["tried"].as_u64().unwrap() >= 10, "{attack}");
        ran += 1;
    }
    assert!(ran >= 1, "road 1: every variant was refused, so the probe never ran: the control (no flags) must run");

    // Road 4: root in the Ray container's PID namespace, while root
    // processes of the agent (healthcheck) come and go beside it.
    let control = podman_as_ray(&worker, &["run", "--rm", "-u", "0", &img, "id", "-u"]);
    assert_eq!(
        String::from_utf8_lossy(&control.stdout).trim(),
        "0",
        "control: ARGUS_SHIM_ALLOWED_USERS=0 lets a root engine run (else road 4 could not be tried): {}",
        String::from_utf8_lossy(&control.stderr)
    );
    let root_probe = "for i in $(seq 1 40); do for p in /proc/[0-9]*; do ls $p/root/run/argus-docker/ >/dev/null 2>&1 && echo REACHED $p; done; sleep 0.25; done; echo done";
    let hc = {
        let w = worker.clone();
        std::thread::spawn(move || {
            for _ in 0..20 {
                let _ =
                    output(Command::new("docker").args(["exec", &w, "argus-agent", "healthcheck"]));
            }
        })
    };
    for u in ["0", "00", "0:0", "root", "0000:00"] {
        for pid in [
            "--pid=host".to_string(),
            format!("--pid=container:{worker}"),
        ] {
            let o = podman_as_ray(
                &worker,
                &["run", "--rm", "-u", u, &pid, &img, "sh", "-c", root_probe],
            );
            let out = String::from_utf8_lossy(&o.stdout);
            log(&format!(
                "road 4 -u {u} {pid}: exit {:?} {}",
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            assert!(
                !out.contains("REACHED"),
                "road 4 -u {u} {pid}: a root engine reached the node's socket folder: {out}"
            );
            assert_eq!(o.status.code(), Some(125), "road 4 -u {u} {pid}: a root engine ran in the Ray container's PID namespace: {out}");
        }
    }
    hc.join().unwrap();

    // Road 3: the head's container is foreign to worker-1's shim.
    let head_id = inspect(&head, "{{.Id}}");
    let head_name = inspect(&head, "{{.Name}}")
        .trim_start_matches('/')
        .to_string();
    let mut refs: Vec<String> = [1usize, 4, 12, 20, 64]
        .iter()
        .map(|n| head_id[..*n].to_string())
        .collect();
    refs.push(head_id[..12].to_ascii_uppercase());
    refs.push(head_name.clone());
    // A container named like the head's ID prefix (the two-resolution race
    // needs one): never made.
    let o = podman_as_ray(
        &worker,
        &["run", "-d", "--name", &head_id[..12], &img, "sleep", "300"],
    );
    let named = run(Command::new("docker").args([
        "ps",
        "-aq",
        "--filter",
        &format!("name=^/{}$", &head_id[..12]),
    ]));
    assert!(
        named.trim().is_empty(),
        "road 3: the job made a container named like the head's ID prefix ({}): {}",
        &head_id[..12],
        String::from_utf8_lossy(&o.stderr)
    );
    for r in &refs {
        for cmd in [vec!["inspect", r.as_str()], vec!["logs", r.as_str()]] {
            let o = podman_as_ray(&worker, &cmd);
            assert!(
                !String::from_utf8_lossy(&o.stdout).contains(&head_id[..12]),
                "road 3: podman {cmd:?} showed the head container"
            );
        }
        for ns in ["--network", "--pid", "--ipc"] {
            let flag = format!("{ns}=container:{r}");
            // The head's GCS listens on 6379 (0x18EB) in its network
            // namespace; gcs_server runs in its PID namespace.
            let o = podman_as_ray(
                &worker,
                &[
                    "run",
                    "--rm",
                    &flag,
                    &img,
                    "sh",
                    "-c",
                    "cat /proc/net/tcp; cat /proc/[0-9]*/comm",
                ],
            );
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                !out.contains(":18EB 00000000:0000 0A") && !out.contains("gcs_server"),
                "road 3: {flag} joined the head's namespace: {out}"
            );
        }
        for cmd in [
            vec!["stop", "-t", "1", r.as_str()],
            vec!["kill", r.as_str()],
            vec!["rm", "-f", r.as_str()],
        ] {
            let _ = podman_as_ray(&worker, &cmd);
            assert_eq!(
                inspect(&head, "{{.State.Running}}"),
                "true",
                "road 3: podman {cmd:?} as the Ray user stopped or removed the head"
            );
        }
    }
    log(
        "road 3: the head container was neither read, joined, stopped nor removed by any reference",
    );

    // R-SEC-10: a job squats nothing the node runs. No registry answers
    // here, so a pull fails anyway: the rule's name tells a refusal from
    // a failed pull, and the node image's ID is the effect.
    let node_img = node_image();
    let image_id = |i: &str| {
        run(Command::new("docker").args(["image", "inspect", "-f", "{{.Id}}", i]))
            .trim()
            .to_string()
    };
    let node_id = image_id(&node_img);
    let project = c.project.clone();
    let squats: Vec<Vec<String>> = vec![
        vec!["pull".into(), node_img.clone()],
        vec!["pull".into(), format!("docker.io/{node_img}")],
        vec![
            "run".into(),
            "--rm".into(),
            "--pull=always".into(),
            node_img.clone(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            format!("{project}-head-2"),
            img.clone(),
            "sleep".into(),
            "300".into(),
        ],
        vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            format!("{project}_worker-2_2"),
            img.clone(),
            "sleep".into(),
            "300".into(),
        ],
        vec![
            "run".into(),
            "-d".into(),
            "--label".into(),
            format!("com.docker.compose.project={project}"),
            img.clone(),
            "sleep".into(),
            "300".into(),
        ],
        vec![
            "run".into(),
            "-d".into(),
            "-l".into(),
            "io.argus.cluster=argus-ray".into(),
            img.clone(),
            "sleep".into(),
            "300".into(),
        ],
    ];
    for sq in &squats {
        let args: Vec<&str> = sq.iter().map(String::as_str).collect();
        let o = podman_as_ray(&worker, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.code() == Some(125)
                && (err.contains("no-squatting") || err.contains("no-shim-labels")),
            "squatting {sq:?} was not refused by policy: {:?} {err}",
            o.status.code()
        );
    }
    assert_eq!(
        image_id(&node_img),
        node_id,
        "squatting: the node image changed"
    );
    let squatted = run(Command::new("docker").args([
        "ps",
        "-aq",
        "--filter",
        &format!("name=^/{project}[-_](head-2|worker-2_2)$"),
    ]));
    assert!(
        squatted.trim().is_empty(),
        "squatting: a compose name was taken: {squatted}"
    );
    let labelled = run(Command::new("docker").args([
        "ps",
        "-aq",
        "--filter",
        &format!("ancestor={img}"),
        "--filter",
        "label=com.docker.compose.project",
    ]));
    assert!(
        labelled.trim().is_empty(),
        "squatting: a job's container carries compose's labels: {labelled}"
    );
    // Control: a name of the job's own runs.
    let own = format!("job-{project}-1");
    let o = podman_as_ray(&worker, &["run", "--rm", "--name", &own, &img, "true"]);
    assert!(
        o.status.success(),
        "control: {own} should run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    log(&format!(
        "squatting: {} attempts refused by policy; the node image is unchanged",
        squats.len()
    ));

    // R-SEC-7: the node image holds no setuid or setgid file, and an
    // operator's `docker exec` starts in a folder only root can change,
    // where the documented node listing imports nothing a job planted.
    let suid = run(Command::new("docker").args([
        "run",
        "--rm",
        "--entrypoint",
        "find",
        &node_img,
        "/",
        "-xdev",
        "-perm",
        "/6000",
        "-type",
        "f",
    ]));
    assert!(
        suid.trim().is_empty(),
        "setuid or setgid files in the node image: {suid}"
    );
    sudo_gives_root_to_no_one(&worker, &img);
    assert_eq!(
        inspect(&head, "{{.Config.WorkingDir}}"),
        "/",
        "the node's WORKDIR"
    );
    let owner =
        run(Command::new("docker").args(["exec", &head, "stat", "-c", "%u:%g", "/private"]));
    assert_eq!(
        owner.trim(),
        "990:990",
        "/private must be the agent user's, not root's"
    );
    operator_commands_run_nothing_planted(&c, &head);
    log("R-SEC-7: no setuid file, WORKDIR /, the operator's commands run nothing a job planted");

    token_auth_phase(&c, &head, &node_img);

    // Root's shell in a node reads root's files, not the Ray user's: the
    // Ray user plants shell start-up files in its home, and an operator's
    // `docker exec <node> bash` (root, interactive or login) must not run
    // them (the image's HOME was the Ray user's, inherited from Ray's base).
    let plant = "for f in .bashrc .profile .bash_profile .bash_login; do echo 'touch /home/ray/rc-ran-as-$(id -u)' > /home/ray/$f; done";
    let o = output(Command::new("docker").args(["exec", "-u", "ray", &worker, "sh", "-c", plant]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for shell in [&["bash", "-ic", "true"][..], &["bash", "-lc", "true"]] {
        let _ = output(
            Command::new("docker")
                .args(["exec", "-i", &worker])
                .args(shell),
        );
    }
    let home =
        run(Command::new("docker").args(["exec", &worker, "sh", "-c", "echo $HOME; ls /home/ray"]));
    assert!(
        home.starts_with("/root\n") && !home.contains("rc-ran-as-0"),
        "root's shell ran the Ray user's start-up files: {home}"
    );
    log("root's shell in the node reads /root, not the Ray user's start-up files");

    // Road 2 and hole 5: links in every folder the agents write.
    let cluster = "argus-ray";
    let canary = "canary-26\n";
    for s in SERVICES {
        let id = c.container(s);
        run(Command::new("docker").args([
            "exec", &id, "sh", "-c",
            "printf 'canary-26\\n' > /etc/argus-canary && chmod 644 /etc/argus-canary && mkdir -p -m 700 /var/lib/argus-canary",
        ]));
    }
    let plant = format!(
        r#"
import json, os
done = []
paths = ["/private", "/private/common", "/private/common/logs", "/private/common/logs/preflight",
         "/private/ray", "/private/ray/discovery", "/private/ray/discovery/{cluster}",
         "/private/ray/discovery/{cluster}/epochs", "/private/ray/discovery/{cluster}/.staging",
         "/var/log/argus", "/var/log/argus/preflight", "/run/argus"]
for p in sorted(paths, key=lambda p: -p.count("/")):
    parent = os.path.dirname(p)
    if not os.path.lexists(p) or not os.access(parent, os.W_OK | os.X_OK):
        continue
    try:
        names = os.listdir(p) if os.path.isdir(p) else []
        os.rename(p, p + ".taken")
        os.mkdir(p, 0o777)
        for n in names:
            src = os.path.join(p + ".taken", n)
            dst = "/var/lib/argus-canary" if os.path.isdir(src) else "/etc/argus-canary"
            os.symlink(dst, os.path.join(p, n))
        done.append(p)
    except OSError as e:
        done.append(p + ": " + type(e).__name__)
forged = []
ep = "/private/ray/discovery/{cluster}/epochs"
for n in ["999999999", "18446744073709551615"]:
    try:
        open(os.path.join(ep, n), "w").write("forged")
        forged.append(n)
    except OSError as e:
        pass
print(json.dumps({{"taken": done, "forged": forged}}))
"#
    );
    let gen_before = {
        let s: Value = serde_json::from_str(&run(Command::new("docker").args([
            "exec",
            &head,
            "argus-agent",
            "status",
            "--json",
        ])))
        .unwrap();
        s["head_generation"].clone()
    };
    for s in ["worker-1", "head"] {
        let o = with_stdin(
            &["exec", "-u", "ray", "-i", &c.container(s), "python", "-"],
            &plant,
        );
        log(&format!(
            "road 2 on {s}: {}",
            String::from_utf8_lossy(&o.stdout).trim()
        ));
    }
    // The head must not step down over a forged epoch (it refreshes every
    // 2 s here): look over a few refreshes, then restart every node so each
    // reopens its logs.
    std::thread::sleep(Duration::from_secs(8));
    let s: Value = serde_json::from_str(&run(Command::new("docker").args([
        "exec",
        &head,
        "argus-agent",
        "status",
        "--json",
    ])))
    .unwrap();
    assert_eq!(
        s["head_generation"], gen_before,
        "hole 5: the head's generation moved after the Ray user's forgery: {s}"
    );
    assert_eq!(
        s["state"], "running",
        "hole 5: the head stepped down after the Ray user's forgery: {s}"
    );
    // R-SEC-9: a job's detached container does not outlive the job. A
    // task on a worker starts one (namespaces of its own), then its driver
    // ends: within 90 s it is gone (it carries the task's Ray worker, which
    // Ray ends with the job, and the node's janitor removes it). Control:
    // it runs while the job does.
    job_leaves_no_container_behind(&c, &head, &img);
    // R-SEC-9: no process of the Ray user survives a Ray restart, not only
    // PID 1's descendants: one started beside Ray (a `docker exec`) is gone
    // once the agent restarts Ray after a raylet kill; one adopted by PID 1
    // (a `setsid` daemon whose parent exited) is gone within the janitor's
    // 30 s round, Ray restart or not.
    let beside = |pattern: &str| {
        run(Command::new("docker").args([
            "exec",
            &worker,
            "sh",
            "-c",
            &format!("pgrep -u ray -f '{pattern}' || true"),
        ]))
    };
    // Control for the round's cgroup rule: an engine container in the
    // node's PID namespace (`--pid=host` is the node's) leaves an orphan of
    // the Ray user, which the kernel gives to PID 1 as well; it lives in the
    // engine's cgroup and ends with its container, so no round takes it
    // (a sweep without the rule coincided with replicas answering 500). Started
    // first, so the round that takes the node's adopted process below saw it.
    let orphan = format!("argus-e2e-orphan-{}", std::process::id());
    run(Command::new("docker").args([
        "exec",
        "-d",
        "-u",
        "ray",
        &worker,
        "podman",
        "run",
        "--rm",
        "--name",
        &orphan,
        "--pid=host",
        &img,
        "sh",
        "-c",
        "(setsid sleep 1007 </dev/null >/dev/null 2>&1 &); exec sleep 1008",
    ]));
    let orphan_ppid = || {
        run(Command::new("docker").args([
            "exec",
            &worker,
            "sh",
            "-c",
            "for p in $(pgrep -u ray -x -f 'sleep 1007'); do awk '/^PPid:/ {print $2}' /proc/$p/status; done",
        ]))
        .trim()
        .to_string()
    };
    let t0 = Instant::now();
    while orphan_ppid() != "1" {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "control: an engine's orphan adopted by PID 1 did not start (parent: {:?})",
            orphan_ppid()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    run(Command::new("docker").args(["exec", "-d", "-u", "ray", &worker, "sleep", "1001"]));
    run(Command::new("docker").args([
        "exec",
        "-d",
        "-u",
        "ray",
        &worker,
        "sh",
        "-c",
        "rm -f /tmp/argus-e2e-adopted; setsid sh -c 'touch /tmp/argus-e2e-adopted; exec sleep 1002' & exit 0",
    ]));
    let t0 = Instant::now();
    let adopted_started = || {
        output(Command::new("docker").args([
            "exec",
            &worker,
            "test",
            "-e",
            "/tmp/argus-e2e-adopted",
        ]))
        .status
        .success()
    };
    while beside("^sleep 1001$").trim().is_empty() || !adopted_started() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "control: the Ray user's processes did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // R-SEC-9: a job's container in the node's namespaces dies with its
    // call, so none may be detached (it could hold the Serve proxy's port
    // or signal the node's processes long after its job): refused, and
    // none created. Control: attached it runs, and a detached one with
    // namespaces of its own starts.
    let ours = containers_of(&img);
    for shared in [
        &["--network=host"][..],
        &["--pid=host"],
        &["--ipc=host"],
        &["--network", "host", "--pid", "host"],
    ] {
        let mut args = vec!["run", "-d"];
        args.extend(shared);
        args.extend([img.as_str(), "sleep", "1003"]);
        let o = podman_as_ray(&worker, &args);
        assert_eq!(
            o.status.code(),
            Some(125),
            "R-SEC-9: a detached container in the node's namespaces {shared:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(
        containers_of(&img),
        ours,
        "R-SEC-9: a refused detached run left a container"
    );
    let attached = podman_as_ray(
        &worker,
        &["run", "--rm", "--network=host", "--pid=host", &img, "true"],
    );
    assert_eq!(
        attached.status.code(),
        Some(0),
        "control: an attached run in the node's namespaces: {}",
        String::from_utf8_lossy(&attached.stderr)
    );
    let own = podman_as_ray(&worker, &["run", "-d", &img, "sleep", "1004"]);
    let own_id = String::from_utf8_lossy(&own.stdout).trim().to_string();
    assert!(
        own.status.success() && !own_id.is_empty(),
        "control: a detached run in namespaces of its own: {}",
        String::from_utf8_lossy(&own.stderr)
    );
    let rm = podman_as_ray(&worker, &["rm", "-f", &own_id]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    log("R-SEC-9: detached runs in the node's namespaces refused (4 spellings), none created; attached and private-namespace controls ran");
    while !beside("^sleep 1002$").trim().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(75),
            "R-SEC-9: a process of the Ray user adopted by PID 1 still runs {:.0} s after it started",
            t0.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        !beside("^sleep 1001$").trim().is_empty(),
        "control: the exec'd process of the Ray user (not adopted) is taken only at Ray's restart"
    );
    assert_eq!(
        orphan_ppid(),
        "1",
        "R-SEC-9: the round took an engine container's orphan (its cgroup is the engine's)"
    );
    log(&format!(
        "R-SEC-9: a process of the Ray user adopted by PID 1 was gone {:.1} s after it started; the exec'd one and an engine container's orphan (also PID 1's) still ran",
        t0.elapsed().as_secs_f64()
    ));
    let rm = podman_as_ray(&worker, &["rm", "-f", &orphan]);
    assert!(
        rm.status.success(),
        "removing the orphan's engine: {}",
        String::from_utf8_lossy(&rm.stderr)
    );
    run(Command::new("docker").args(["exec", &worker, "pkill", "-KILL", "-x", "raylet"]));
    let t0 = Instant::now();
    while !beside("^sleep 100[12]$").trim().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "R-SEC-9: processes of the Ray user outlived Ray's restart: {}",
            beside("^sleep 100[12]$")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    log(&format!(
        "R-SEC-9: the Ray user's processes beside Ray were gone {:.1} s after a raylet kill",
        t0.elapsed().as_secs_f64()
    ));
    for svc in ["worker-1", "head"] {
        run(Command::new("docker").args(["restart", "-t", "10", &c.container(svc)]));
    }
    c.wait_nodes("after the restarts", Duration::from_secs(600), |n| {
        n.len() == 3
    });
    for svc in SERVICES {
        let id = c.container(svc);
        let got = run(Command::new("docker").args(["exec", &id, "cat", "/etc/argus-canary"]));
        assert_eq!(
            got, canary,
            "road 2: root wrote through a link into {svc}'s /etc/argus-canary"
        );
        let dir =
            run(Command::new("docker").args(["exec", &id, "ls", "-A", "/var/lib/argus-canary"]));
        assert!(
            dir.trim().is_empty(),
            "road 2: root wrote into {svc}'s root-only /var/lib/argus-canary: {dir}"
        );
    }
    let after = containers_of(&img);
    assert_eq!(after, before, "engine containers left behind");
    log("road 2: canaries unchanged on every node after the restarts; the cluster is back");
}
