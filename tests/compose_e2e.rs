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

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

const RAY_VERSION: &str = "2.53.0";
/// The node image tag's version part: `ARGUS_E2E_VERSION` (default `e2e`), so
/// two checkouts testing on one daemon do not overwrite each other's image.
fn e2e_version() -> String {
    std::env::var("ARGUS_E2E_VERSION").unwrap_or_else(|_| "e2e".to_string())
}

fn node_image() -> String {
    format!("argus/argus-ray-node:{}", e2e_version())
}
const SERVICES: [&str; 3] = ["head", "worker-1", "worker-2"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("entrypoint/ has a parent")
        .to_path_buf()
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd`, panicking with its stdout and stderr unless it exits 0.
fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    if !out.status.success() {
        panic!(
            "command failed ({}): {}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            describe(cmd),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` and returns its output whatever the exit status; panics only
/// when the program cannot be started.
fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", describe(cmd)))
}

fn log(msg: &str) {
    eprintln!("[compose_e2e {:>7.1}s] {msg}", elapsed_since_start());
}

fn elapsed_since_start() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Fails the test loudly when Docker is not usable: these tests must never
/// pass by doing nothing.
fn require_docker() {
    let out = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            log(&format!(
                "docker engine {}",
                String::from_utf8_lossy(&o.stdout).trim()
            ));
        }
        Ok(o) => panic!(
            "compose_e2e needs a reachable Docker Engine; `docker version` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("compose_e2e needs the docker CLI and a Docker Engine: {e}"),
    }
}

fn compose_tool() -> Vec<String> {
    if let Ok(t) = std::env::var("ARGUS_E2E_COMPOSE") {
        return t.split_whitespace().map(String::from).collect();
    }
    let v2 = Command::new("docker")
        .args(["compose", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if v2.is_ok_and(|s| s.success()) {
        return vec!["docker".into(), "compose".into()];
    }
    let v1 = Command::new("docker-compose")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if v1.is_ok_and(|s| s.success()) {
        return vec!["docker-compose".into()];
    }
    panic!("compose_e2e needs `docker compose` (v2) or `docker-compose` (v1); neither works");
}

/// Builds the base image (cached), the node image from this test's agent
/// binary, and, when asked, two stand-in engine images. Once per process.
fn build_images(engines: bool) {
    use std::sync::Mutex;
    static BUILT: Mutex<(bool, bool)> = Mutex::new((false, false));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let root = workspace_root();
    if !built.0 {
        log("building the Ray base image (cached after the first run)");
        run(Command::new(root.join("scripts/build-base-image.sh")).current_dir(&root));
        // The build context only lets target/e2e/argus-agent through
        // (.dockerignore); cargo put the binary wherever CARGO_TARGET_DIR is.
        let staged = root.join("target/e2e/argus-agent");
        std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
        std::fs::copy(env!("CARGO_BIN_EXE_argus-agent"), &staged)
            .unwrap_or_else(|e| panic!("cannot stage the agent binary at {staged:?}: {e}"));
        log("building the node image");
        run(Command::new(root.join("scripts/build-images.sh"))
            .current_dir(&root)
            .env("ARGUS_VERSION", e2e_version())
            .args(["node", "--prebuilt", "--local-base"])
            .args(["--agent-binary", "target/e2e/argus-agent"]));
        built.0 = true;
    }
    if engines && !built.1 {
        for v in ["stub-a", "stub-b"] {
            log(&format!("building engine image {}", engine_image(v)));
            run(Command::new(root.join("scripts/build-images.sh"))
                .current_dir(&root)
                .args(["engine", "--local-base", "--no-vllm"])
                .args(["--engine-version", v]));
        }
        built.1 = true;
    }
}

fn redis_image() -> String {
    format!("argus/argus-redis:{}", e2e_version())
}

/// Builds the GCS FT Redis image (Dockerfile.redis) on the registry-free
/// base. Once per process; Docker's layer cache makes a rebuild quick.
fn build_redis_image() {
    use std::sync::Once;
    static BUILT: Once = Once::new();
    BUILT.call_once(|| {
        log(&format!("building {}", redis_image()));
        let root = workspace_root();
        run(Command::new(root.join("scripts/build-images.sh"))
            .current_dir(&root)
            .env("ARGUS_VERSION", e2e_version())
            .args(["redis", "--local-base"]));
    });
}

fn engine_image(version: &str) -> String {
    format!("localhost/neutree/engine-vllm:{version}-ray{RAY_VERSION}")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

/// One compose project: head + two workers, torn down on drop.
struct Cluster {
    compose: Vec<String>,
    project: String,
    /// Product compose files on top of docker-compose.yaml (the GCS FT one).
    extra_files: Vec<PathBuf>,
    override_file: PathBuf,
    tmpdir: PathBuf,
    model_cache: PathBuf,
    env: Vec<(String, String)>,
}

impl Cluster {
    fn up(extra_env: &[(&str, &str)]) -> Cluster {
        Cluster::up_with(extra_env, &[])
    }

    /// `up` with more of the product's compose files (e.g.
    /// docker-compose.gcs-ft.yaml), given relative to the workspace root.
    fn up_with(extra_env: &[(&str, &str)], extra_files: &[&str]) -> Cluster {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let project = format!("argus-e2e-{}-{n}", std::process::id());
        // Holds the compose override and the model cache (a host path).
        let tmpdir = PathBuf::from(format!("/tmp/{project}"));
        let model_cache = tmpdir.join("models");
        std::fs::create_dir_all(&model_cache).unwrap();
        set_mode(&tmpdir, 0o755);
        set_mode(&model_cache, 0o755);
        std::fs::write(model_cache.join("model.txt"), "weights-v1\n").unwrap();
        let override_file = tmpdir.join("compose.e2e.yaml");
        // Fast health checks for the test; everything else from the product file.
        let hc = "    healthcheck:\n      interval: 2s\n      timeout: 5s\n      retries: 3\n      start_period: 120s\n";
        let mut y = String::from("version: \"2.4\"\nservices:\n");
        for s in SERVICES {
            y.push_str(&format!("  {s}:\n{hc}"));
        }
        std::fs::write(&override_file, y).unwrap();
        let mut env: Vec<(String, String)> = [
            ("ARGUS_NODE_IMAGE", node_image()),
            ("ARGUS_REDIS_IMAGE", redis_image()),
            ("ARGUS_MODEL_CACHE", model_cache.display().to_string()),
            ("ARGUS_DASHBOARD_HOST_PORT", free_port().to_string()),
            ("ARGUS_TTL_S", "6".into()),
            ("ARGUS_REFRESH_S", "2".into()),
            ("ARGUS_POLL_S", "1".into()),
            ("ARGUS_SHM_SIZE", "512m".into()),
            (
                "ARGUS_RAY_EXTRA_ARGS",
                "--object-store-memory=100000000".into(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra_env {
            env.push((k.to_string(), v.to_string()));
        }
        let c = Cluster {
            compose: compose_tool(),
            project,
            extra_files: extra_files
                .iter()
                .map(|f| workspace_root().join(f))
                .collect(),
            override_file,
            tmpdir,
            model_cache,
            env,
        };
        log(&format!("compose up -d (project {})", c.project));
        c.compose_run(&["up", "-d", "--no-build"]);
        c
    }

    fn compose_cmd(&self, args: &[&str]) -> Command {
        let root = workspace_root();
        let mut cmd = Command::new(&self.compose[0]);
        cmd.args(&self.compose[1..])
            .current_dir(&root)
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(root.join("docker-compose.yaml"));
        for f in &self.extra_files {
            cmd.arg("-f").arg(f);
        }
        cmd.arg("-f").arg(&self.override_file).args(args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn compose_run(&self, args: &[&str]) -> String {
        run(&mut self.compose_cmd(args))
    }

    /// Returns the id of the service's (one) container.
    fn container(&self, service: &str) -> String {
        let id = self.compose_run(&["ps", "-q", service]).trim().to_string();
        assert!(!id.is_empty(), "no container for service {service}");
        id
    }

    fn ip(&self, service: &str) -> String {
        inspect(
            &self.container(service),
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        )
    }

    /// Returns Ray's view of the cluster, or an error text.
    fn ray_nodes(&self) -> Result<Value, String> {
        let script = workspace_root().join("docker/tools/ray_nodes.py");
        let head = self.container("head");
        let out = Command::new("docker")
            .args([
                "exec", "-u", "ray", "-i", &head, "timeout", "60", "python", "-",
            ])
            .stdin(std::fs::File::open(script).unwrap())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// Waits until `ok` holds for the alive nodes, returning them.
    fn wait_nodes(&self, what: &str, timeout: Duration, ok: impl Fn(&[Node]) -> bool) -> Vec<Node> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            match self.ray_nodes() {
                Ok(v) => {
                    let alive = alive_nodes(&v);
                    if ok(&alive) {
                        log(&format!(
                            "{what}: after {:.1}s: {}",
                            start.elapsed().as_secs_f64(),
                            fmt_nodes(&alive)
                        ));
                        return alive;
                    }
                    last = fmt_nodes(&alive);
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        self.dump_logs();
        panic!("{what}: not reached within {timeout:?}; last view: {last}");
    }

    fn wait_healthy(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let states: Vec<(String, String)> = SERVICES
                .iter()
                .map(|s| {
                    (
                        s.to_string(),
                        inspect(&self.container(s), "{{.State.Health.Status}}"),
                    )
                })
                .collect();
            if states.iter().all(|(_, h)| h == "healthy") {
                log(&format!(
                    "all containers healthy after {:.1}s",
                    start.elapsed().as_secs_f64()
                ));
                return;
            }
            if start.elapsed() > timeout {
                self.dump_logs();
                panic!("containers not healthy within {timeout:?}: {states:?}");
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    fn dump_logs(&self) {
        let out = output(&mut self.compose_cmd(&["logs", "--no-color", "--tail", "60"]));
        eprintln!(
            "--- compose logs (last lines)\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var("ARGUS_E2E_KEEP").as_deref() == Ok("1") {
            log(&format!(
                "ARGUS_E2E_KEEP=1: leaving project {} up",
                self.project
            ));
            return;
        }
        let _ = output(&mut self.compose_cmd(&["down", "-v", "--remove-orphans", "-t", "10"]));
        let _ = std::fs::remove_dir_all(&self.tmpdir);
    }
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn inspect(container: &str, format: &str) -> String {
    run(Command::new("docker").args(["inspect", "-f", format, container]))
        .trim()
        .to_string()
}

#[derive(Debug, Clone)]
struct Node {
    id: String,
    ip: String,
}

fn alive_nodes(v: &Value) -> Vec<Node> {
    v["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|n| n["alive"].as_bool() == Some(true))
                .map(|n| Node {
                    id: n["id"].as_str().unwrap_or_default().to_string(),
                    ip: n["ip"].as_str().unwrap_or_default().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fmt_nodes(nodes: &[Node]) -> String {
    let v: Vec<String> = nodes
        .iter()
        .map(|n| format!("{}@{}", &n.id[..n.id.len().min(8)], n.ip))
        .collect();
    format!("{} alive [{}]", nodes.len(), v.join(", "))
}

fn ids(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.id.clone()).collect()
}

/// Issue 5 §1 and §2: compose up gives three alive Ray nodes and healthy
/// containers; the cluster heals from a killed worker raylet, a killed head
/// Ray, and a replaced head container.
#[test]
fn compose_cluster_comes_up_and_heals_from_node_faults() {
    elapsed_since_start();
    require_docker();
    build_images(false);
    let c = Cluster::up(&[]);

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
#[test]
fn compose_worker_stops_cleanly_on_docker_stop() {
    elapsed_since_start();
    require_docker();
    build_images(false);
    let c = Cluster::up(&[]);
    c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });
    c.wait_healthy(Duration::from_secs(120));
    // docker stop a worker: exit 0 in under 10 s, nothing left behind.
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
    assert!(
        took < Duration::from_secs(10),
        "docker stop took {took:?} (SIGKILL after 10 s?)"
    );
    assert_eq!(code, "0", "worker-2 exited {code} on SIGTERM");
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
#[test]
fn runtime_env_container_jobs_run_in_sibling_engine_containers() {
    elapsed_since_start();
    require_docker();
    build_images(true);
    let c = Cluster::up(&[]);
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

    jobs_reach_no_docker_daemon(&c, &engine_image("stub-b"));

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

/// Issue 8 §4: `docker kill` + `docker start` of the head container (what a
/// restart policy does after a crash) brings all three nodes back at the
/// default TTL of 60 s without waiting it out: the restarted head finds its
/// own previous record with nothing listening and claims at once (R-HEAD-5).
#[test]
fn compose_head_container_kill_and_start_brings_all_nodes_back() {
    elapsed_since_start();
    require_docker();
    build_images(false);
    let c = Cluster::up(&[("ARGUS_TTL_S", "60"), ("ARGUS_REFRESH_S", "10")]);
    let before = ids(
        &c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
            n.len() == 3
        }),
    );
    let ips: Vec<String> = SERVICES.iter().map(|s| c.ip(s)).collect();
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
#[test]
fn compose_gcs_ft_detached_actor_rides_through_head_container_restart() {
    elapsed_since_start();
    require_docker();
    build_images(false);
    build_redis_image();
    let c = Cluster::up_with(&[], &["docker-compose.gcs-ft.yaml"]);
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

/// Runs `docker ARGS` with `input` on its stdin; returns its output.
fn with_stdin(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
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
    let root = workspace_root();
    let project = format!("argus-soak-e2e-{}", std::process::id());
    log(&format!(
        "scripts/soak.sh --faults 6 --seed 1 (project {project})"
    ));
    let status = Command::new(root.join("scripts/soak.sh"))
        .current_dir(&root)
        .args(["--faults", "6", "--seed", "1", "--no-build"])
        .args(["--node-image", &node_image()])
        .args(["--engine-image", &engine_image("stub-a")])
        .args(["--project", &project])
        .stdin(Stdio::null())
        .status()
        .expect("cannot run scripts/soak.sh");
    assert!(
        status.success(),
        "scripts/soak.sh --faults 6 --seed 1 failed ({status}); its table and logs are above"
    );
}
