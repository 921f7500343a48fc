//! The compose cluster of the end-to-end tests (tests/compose_e2e.rs,
//! tests/ray_compat.rs): images built from this checkout, one compose project
//! per `Cluster` (`argus-e2e-<pid>-<n>`) with its own volumes, model-cache
//! directory and dashboard port, torn down on drop, and the commands the
//! tests run against it. Docker missing or unreachable is a test FAILURE,
//! never a skip.
//!
//! Settings: ARGUS_E2E_COMPOSE ("docker compose" or "docker-compose") picks
//! the compose tool; ARGUS_E2E_KEEP=1 leaves the cluster up for inspection;
//! ARGUS_E2E_VERSION (default `e2e`) is the node image tag's version part.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const RAY_VERSION: &str = "2.53.0";
/// The node image tag's version part: `ARGUS_E2E_VERSION` (default `e2e`), so
/// two checkouts testing on one daemon do not overwrite each other's image.
pub fn e2e_version() -> String {
    std::env::var("ARGUS_E2E_VERSION").unwrap_or_else(|_| "e2e".to_string())
}

pub fn node_image() -> String {
    format!("argus/argus-ray-node:{}", e2e_version())
}
pub const SERVICES: [&str; 3] = ["head", "worker-1", "worker-2"];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("entrypoint/ has a parent")
        .to_path_buf()
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd`, panicking with its stdout and stderr unless it exits 0.
pub fn run(cmd: &mut Command) -> String {
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
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", describe(cmd)))
}

pub fn log(msg: &str) {
    eprintln!(
        "[{} {:>7.1}s] {msg}",
        env!("CARGO_CRATE_NAME"),
        elapsed_since_start()
    );
}

pub fn elapsed_since_start() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Fails the test loudly when Docker is not usable: these tests must never
/// pass by doing nothing.
pub fn require_docker() {
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
            "{} needs a reachable Docker Engine; `docker version` failed: {}",
            env!("CARGO_CRATE_NAME"),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "{} needs the docker CLI and a Docker Engine: {e}",
            env!("CARGO_CRATE_NAME")
        ),
    }
}

pub fn compose_tool() -> Vec<String> {
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
    panic!(
        "{} needs `docker compose` (v2) or `docker-compose` (v1); neither works",
        env!("CARGO_CRATE_NAME")
    );
}

/// True when scripts/test built every image of the Docker tests up front
/// (scripts/build-test-images.sh, `ARGUS_E2E_IMAGES=prebuilt`): the tests
/// then check that each is there instead of building it, so that no test
/// builds an image another test's cluster is starting from.
pub fn images_prebuilt() -> bool {
    std::env::var("ARGUS_E2E_IMAGES").is_ok_and(|v| v == "prebuilt")
}

/// Panics unless `tag` is an image of the daemon; scripts/test built it.
pub fn require_image(tag: &str) {
    let o = output(Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", tag]));
    assert!(
        o.status.success(),
        "ARGUS_E2E_IMAGES=prebuilt but the image {tag} is missing: scripts/build-test-images.sh did not build it \
         (unset ARGUS_E2E_IMAGES to let the test build it): {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
}

/// Copies this test's agent binary to target/e2e/argus-agent, the only
/// path the node image's build context lets through (.dockerignore), under a
/// temporary name first: another test process may be building from it.
pub fn stage_agent_binary() {
    let staged = workspace_root().join("target/e2e/argus-agent");
    std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
    let tmp = staged.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::copy(env!("CARGO_BIN_EXE_argus-agent"), &tmp)
        .unwrap_or_else(|e| panic!("cannot stage the agent binary at {tmp:?}: {e}"));
    std::fs::rename(&tmp, &staged)
        .unwrap_or_else(|e| panic!("cannot stage the agent binary at {staged:?}: {e}"));
}

/// Builds the base image (cached), the node image from this test's agent
/// binary, and, when asked, two stand-in engine images. Once per process;
/// under scripts/test only checks that they are there ([`images_prebuilt`]).
pub fn build_images(engines: bool) {
    use std::sync::Mutex;
    static BUILT: Mutex<(bool, bool)> = Mutex::new((false, false));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let root = workspace_root();
    if images_prebuilt() {
        require_image(&node_image());
        if engines {
            for v in ["stub-a", "stub-b"] {
                require_image(&engine_image(v));
            }
        }
        return;
    }
    if !built.0 {
        log("building the Ray base image (cached after the first run)");
        run(Command::new(root.join("scripts/build-base-image.sh")).current_dir(&root));
        stage_agent_binary();
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

pub fn redis_image() -> String {
    format!("argus/argus-redis:{}", e2e_version())
}

pub fn prometheus_image() -> String {
    format!("argus/argus-prometheus:{}", e2e_version())
}

pub fn lb_image() -> String {
    format!("argus/argus-lb:{}", e2e_version())
}

/// Builds the image of one of the compose file's service kinds
/// (`scripts/build-images.sh <kind> --local-base`, tagged with this run's
/// version) on the registry-free base, once per process; Docker's layer
/// cache makes a rebuild quick.
fn build_service_image(kind: &str, tag: String) {
    use std::sync::Mutex;
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if images_prebuilt() {
        return require_image(&tag);
    }
    if built.iter().any(|k| k == kind) {
        return;
    }
    log(&format!("building {tag}"));
    let root = workspace_root();
    run(Command::new(root.join("scripts/build-images.sh"))
        .current_dir(&root)
        .env("ARGUS_VERSION", e2e_version())
        .args([kind, "--local-base"]));
    built.push(kind.to_string());
}

/// The GCS FT Redis image (Dockerfile.redis).
pub fn build_redis_image() {
    build_service_image("redis", redis_image());
}

/// The monitoring Prometheus image (Dockerfile.prometheus, which runs
/// promtool on its config and rules).
pub fn build_prometheus_image() {
    build_service_image("monitoring", prometheus_image());
}

/// The `lb` service's image (Dockerfile.lb: HAProxy, its config checked at
/// build).
pub fn build_lb_image() {
    build_service_image("lb", lb_image());
}

/// The CPU engine image of vLLM `vllm` (e.g. "0.12.0").
pub fn cpu_engine_image(vllm: &str) -> String {
    format!("localhost/neutree/engine-vllm:v{vllm}-ray{RAY_VERSION}-cpu")
}

/// Builds the CPU engine image of vLLM `vllm` (scripts/build-images.sh
/// engine --cpu): a no-op when the image's inputs' hash matches, and waits
/// for a build of the same images already under way (scripts/test starts
/// them beside the tests; the script takes a lock).
pub fn build_cpu_engine_image(vllm: &str) -> String {
    let root = workspace_root();
    log(&format!(
        "building {} (cached by its inputs' hash)",
        cpu_engine_image(vllm)
    ));
    run(Command::new(root.join("scripts/build-images.sh"))
        .current_dir(&root)
        .env("VLLM_VERSION", vllm)
        .args(["engine", "--local-base", "--cpu"])
        .args(["--engine-version", &format!("v{vllm}")])
        .stderr(Stdio::inherit()));
    cpu_engine_image(vllm)
}

pub fn engine_image(version: &str) -> String {
    format!("localhost/neutree/engine-vllm:{version}-ray{RAY_VERSION}")
}

/// A TCP port free on 127.0.0.1 a moment ago and not handed out before by
/// this process (the kernel may hand a just-closed port straight back).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free local port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// One compose project: head + two workers, torn down on drop.
pub struct Cluster {
    pub compose: Vec<String>,
    pub project: String,
    /// Product compose files on top of docker-compose.yaml (the GCS FT one).
    pub extra_files: Vec<PathBuf>,
    pub override_file: PathBuf,
    pub tmpdir: PathBuf,
    pub model_cache: PathBuf,
    pub env: Vec<(String, String)>,
    /// The cluster's Ray token, once read from the head (see
    /// [`Cluster::auth_token`]).
    pub token: std::sync::Mutex<Option<String>>,
}

impl Cluster {
    pub fn up(extra_env: &[(&str, &str)]) -> Cluster {
        Cluster::up_with(extra_env, &[])
    }

    /// `up` plus the `lb` service (its image: [`lb_image`]) published on
    /// the host's `serve_port`; both settings are in the cluster's `env`.
    pub fn up_with_lb(
        serve_port: &str,
        extra_env: &[(&str, &str)],
        extra_files: &[&str],
    ) -> Cluster {
        let lb = lb_image();
        let mut env = vec![
            ("ARGUS_LB_IMAGE", lb.as_str()),
            ("ARGUS_SERVE_HOST_PORT", serve_port),
        ];
        env.extend_from_slice(extra_env);
        let c = Cluster::up_with(&env, extra_files);
        c.compose_run(&["up", "-d", "--no-build", "lb"]);
        c
    }

    /// `up` with more of the product's compose files (e.g.
    /// docker-compose.gcs-ft.yaml), given relative to the workspace root.
    pub fn up_with(extra_env: &[(&str, &str)], extra_files: &[&str]) -> Cluster {
        Cluster::up_full(extra_env, extra_files, &[])
    }

    /// `up_with` plus variables in the environment of some services'
    /// containers (service, name, value), written into the compose override:
    /// what a deployment would put under `environment:`.
    pub fn up_full(
        extra_env: &[(&str, &str)],
        extra_files: &[&str],
        service_env: &[(&str, &str, &str)],
    ) -> Cluster {
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
            if s == "head" {
                // A head restarted on this loaded 2-core machine once lost
                // its dashboard for good (Ray's "Module MetricsHead failed
                // to start. Timeout after 30.0 seconds"; nothing restarts
                // it), and with it `serve deploy`: give its modules longer.
                y.push_str("    environment:\n      RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT: \"180\"\n");
            }
            let vars: Vec<_> = service_env.iter().filter(|(sv, _, _)| *sv == s).collect();
            if !vars.is_empty() {
                if s != "head" {
                    y.push_str("    environment:\n");
                }
                for (_, k, v) in vars {
                    y.push_str(&format!(
                        "      {k}: {}\n",
                        serde_json::to_string(v).unwrap()
                    ));
                }
            }
        }
        std::fs::write(&override_file, y).unwrap();
        let mut env: Vec<(String, String)> = [
            ("ARGUS_NODE_IMAGE", node_image()),
            ("ARGUS_REDIS_IMAGE", redis_image()),
            ("ARGUS_PROMETHEUS_IMAGE", prometheus_image()),
            ("ARGUS_PROMETHEUS_HOST_PORT", free_port().to_string()),
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
            token: std::sync::Mutex::new(None),
        };
        log(&format!("compose up -d (project {})", c.project));
        // The Ray nodes and what they depend on (the GCS FT Redis), not
        // every service of the files: the tests need no other service but
        // Prometheus when they asked for the monitoring file.
        let mut up = vec!["up", "-d", "--no-build"];
        up.extend(SERVICES);
        if c.monitored() {
            up.push("prometheus");
        }
        c.compose_run(&up);
        c
    }

    /// The cluster has docker-compose.monitoring.yaml's Prometheus.
    pub fn monitored(&self) -> bool {
        self.extra_files
            .iter()
            .any(|f| f.ends_with("docker-compose.monitoring.yaml"))
    }

    /// `-p PROJECT -f FILE ...`: what this cluster was brought up with.
    pub fn project_args(&self) -> Vec<String> {
        let mut a = vec!["-p".to_string(), self.project.clone(), "-f".into()];
        a.push(
            workspace_root()
                .join("docker-compose.yaml")
                .display()
                .to_string(),
        );
        for f in &self.extra_files {
            a.extend(["-f".to_string(), f.display().to_string()]);
        }
        a.extend(["-f".to_string(), self.override_file.display().to_string()]);
        a
    }

    pub fn compose_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.compose[0]);
        cmd.args(&self.compose[1..])
            .current_dir(workspace_root())
            .args(self.project_args())
            .args(args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    pub fn compose_run(&self, args: &[&str]) -> String {
        run(&mut self.compose_cmd(args))
    }

    /// Returns the id of the service's (one) container, running or not.
    /// Read from the compose labels with `docker ps` (a few milliseconds)
    /// rather than `compose ps` (the Python docker-compose costs the
    /// loaded machine most of a CPU-second a call, and the waits call this
    /// every 2 s per service); never cached, as tests replace containers.
    pub fn container(&self, service: &str) -> String {
        let out = run(Command::new("docker").args([
            "ps",
            "-a",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
            "--filter",
            &format!("label=com.docker.compose.service={service}"),
            "--filter",
            "label=com.docker.compose.oneoff=False",
        ]));
        // Newest first: while compose replaces a container, the new one.
        let id = out
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        assert!(
            !id.is_empty(),
            "no container for service {service} of project {}",
            self.project
        );
        id
    }

    /// The container's address on the compose network (`<project>_default`;
    /// the GCS FT head is also on the Redis network of its own).
    pub fn ip(&self, service: &str) -> String {
        default_network_ip(&inspect(
            &self.container(service),
            "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}",
        ))
    }

    /// Returns Ray's view of the cluster, or an error text: `{"alive": N,
    /// "nodes": [{"ip", "alive", "id", "resources"}]}`, from the GCS through
    /// the dashboard's state API (about 0.07 CPU-seconds a call); while the
    /// dashboard does not answer (a head restarting), from a Ray driver in
    /// the head (docker/tools/ray_nodes.py, about a CPU-second a call).
    pub fn ray_nodes(&self) -> Result<Value, String> {
        match self.dashboard_get("/api/v0/nodes?limit=10000&detail=false") {
            Ok(v) => {
                let list = v["data"]["result"]["result"]
                    .as_array()
                    .ok_or_else(|| format!("the state API's answer has no node list: {v}"))?;
                let nodes: Vec<Value> = list
                    .iter()
                    .map(|n| {
                        serde_json::json!({
                            "ip": n["node_ip"],
                            "alive": n["state"] == "ALIVE",
                            "id": n["node_id"],
                            "resources": n["resources_total"],
                        })
                    })
                    .collect();
                let alive = nodes.iter().filter(|n| n["alive"] == true).count();
                Ok(serde_json::json!({ "address": "state API", "alive": alive, "nodes": nodes }))
            }
            Err(api) => self
                .ray_nodes_from_a_driver()
                .map_err(|e| format!("{e} (the dashboard's state API: {api})")),
        }
    }

    /// [`Cluster::ray_nodes`] from a Ray driver in the head container: the
    /// documented node listing, `argus-agent ray-tool nodes`.
    pub fn ray_nodes_from_a_driver(&self) -> Result<Value, String> {
        let head = self.container("head");
        let out = Command::new("docker")
            .args([
                "exec",
                &head,
                "timeout",
                "60",
                "argus-agent",
                "ray-tool",
                "nodes",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// The host port the head's dashboard is published on.
    pub fn dashboard_port(&self) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == "ARGUS_DASHBOARD_HOST_PORT")
            .map(|(_, v)| v.clone())
            .expect("ARGUS_DASHBOARD_HOST_PORT in the cluster's environment")
    }

    /// GET `path` of the head's dashboard on its published port: the JSON
    /// body of a 200 answer, or why not.
    pub fn dashboard_get(&self, path: &str) -> Result<Value, String> {
        let token = self.auth_token()?;
        let got = http_get_json_with(
            &format!("127.0.0.1:{}", self.dashboard_port()),
            path,
            &[("Authorization", &format!("Bearer {token}"))],
        );
        if got
            .as_ref()
            .is_err_and(|e| e.contains(" 401 ") || e.contains(" 403 "))
        {
            *self.token.lock().unwrap() = None;
        }
        got
    }

    /// The cluster's Ray token: the head's copy (`/run/argus/auth_token`,
    /// the image's RAY_AUTH_TOKEN_PATH), read once as root, as an operator
    /// reads it to call the dashboard from outside.
    pub fn auth_token(&self) -> Result<String, String> {
        if let Some(t) = self.token.lock().unwrap().clone() {
            return Ok(t);
        }
        let head = self.container("head");
        let o =
            output(Command::new("docker").args(["exec", &head, "cat", "/run/argus/auth_token"]));
        if !o.status.success() {
            return Err(format!(
                "no token from the head yet: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        let t = String::from_utf8_lossy(&o.stdout).trim().to_string();
        *self.token.lock().unwrap() = Some(t.clone());
        Ok(t)
    }

    /// Waits until `ok` holds for the alive nodes, returning them.
    pub fn wait_nodes(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&[Node]) -> bool,
    ) -> Vec<Node> {
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

    pub fn wait_healthy(&self, timeout: Duration) {
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

    pub fn dump_logs(&self) {
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
        // A stop timeout longer than a worker's drain (the compose file's
        // 130 s): a drain cut by a SIGKILL would leave the worker's engine
        // containers behind (the node dies before its janitor runs). All
        // workers stop at once here, so their drains end early (no worker
        // can take the replicas): this is a bound, not a wait.
        let _ = output(&mut self.compose_cmd(&["down", "-v", "--remove-orphans", "-t", "150"]));
        let _ = std::fs::remove_dir_all(&self.tmpdir);
    }
}

pub fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn inspect(container: &str, format: &str) -> String {
    run(Command::new("docker").args(["inspect", "-f", format, container]))
        .trim()
        .to_string()
}

#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub ip: String,
}

pub fn alive_nodes(v: &Value) -> Vec<Node> {
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

pub fn fmt_nodes(nodes: &[Node]) -> String {
    let v: Vec<String> = nodes
        .iter()
        .map(|n| format!("{}@{}", &n.id[..n.id.len().min(8)], n.ip))
        .collect();
    format!("{} alive [{}]", nodes.len(), v.join(", "))
}

pub fn ids(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.id.clone()).collect()
}

/// Runs `docker ARGS` with `input` on its stdin; returns its output.
pub fn with_stdin(args: &[&str], input: &str) -> Output {
    spawn_with_stdin(args, input).wait_with_output().unwrap()
}

/// Starts `docker ARGS` with `input` on its stdin (then closed) and its
/// stdout and stderr piped, without waiting for it.
pub fn spawn_with_stdin(args: &[&str], input: &str) -> std::process::Child {
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
    child
}

/// Runs `podman ARGS` in `container` as the Ray user (the identity of every
/// Ray task there), through the node agent's broker.
pub fn podman_as_ray(container: &str, args: &[&str]) -> Output {
    let mut a = vec!["exec", "-u", "ray", container, "podman"];
    a.extend_from_slice(args);
    output(Command::new("docker").args(&a))
}

/// The address on the network named `*_default` in `name=ip ...` (the
/// only one's when there is one).
pub fn default_network_ip(pairs: &str) -> String {
    let all: Vec<(&str, &str)> = pairs
        .split_whitespace()
        .filter_map(|p| p.split_once('='))
        .collect();
    all.iter()
        .find(|(k, _)| k.ends_with("_default"))
        .or(all.first())
        .map(|(_, v)| v.to_string())
        .unwrap_or_default()
}

/// GET `path` from `addr` (HTTP/1.0, the connection closed by the
/// server): the JSON body of a 200 answer, or why not.
pub fn http_get_json(addr: &str, path: &str) -> Result<Value, String> {
    http_get_json_with(addr, path, &[])
}

/// [`http_get_json`] with these request headers.
pub fn http_get_json_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Value, String> {
    use std::io::{Read, Write};
    let sa: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(5))
        .map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}{path}: no HTTP body: {text}"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!(
            "{addr}{path}: {status}: {}",
            body.chars().take(500).collect::<String>()
        ));
    }
    serde_json::from_str(body).map_err(|e| format!("{addr}{path}: {e}: {body}"))
}

/// `serve status`'s view (applications, their deployments' status and
/// replica counts by state, the proxies) made from Serve's details as the
/// dashboard's REST API gives them: what `serve status` reads and reshapes,
/// without its 4-5 CPU-seconds of Python a call in the head.
pub fn serve_status_of(details: &Value) -> Value {
    use serde_json::{json, Map};
    let mut apps = Map::new();
    for (name, a) in details["applications"].as_object().into_iter().flatten() {
        let mut deployments = Map::new();
        for (dn, d) in a["deployments"].as_object().into_iter().flatten() {
            let mut states: Map<String, Value> = Map::new();
            for r in d["replicas"].as_array().into_iter().flatten() {
                let state = r["state"].as_str().unwrap_or("UNKNOWN").to_string();
                let n = states.get(&state).and_then(Value::as_u64).unwrap_or(0);
                states.insert(state, json!(n + 1));
            }
            deployments.insert(
                dn.clone(),
                json!({
                    "status": d["status"],
                    "status_trigger": d["status_trigger"],
                    "replica_states": states,
                    "message": d["message"],
                }),
            );
        }
        apps.insert(
            name.clone(),
            json!({
                "status": a["status"],
                "message": a["message"],
                "last_deployed_time_s": a["last_deployed_time_s"],
                "deployments": deployments,
            }),
        );
    }
    let proxies: Map<String, Value> = details["proxies"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(node, p)| (node.clone(), p["status"].clone()))
        .collect();
    json!({ "proxies": proxies, "applications": apps, "target_capacity": details["target_capacity"] })
}

impl Cluster {
    /// `serve status` as JSON ([`serve_status_of`] the dashboard's
    /// `/api/serve/applications/`), or why not.
    pub fn serve_status(&self) -> Result<Value, String> {
        self.dashboard_get("/api/serve/applications/")
            .map(|d| serve_status_of(&d))
    }

    /// Waits until `serve status` shows each of `apps` RUNNING with all
    /// its deployments HEALTHY at exactly that many RUNNING replicas (no
    /// replica starting or stopping); returns the time it took. Fails at
    /// once, with Serve's message, when one of them is DEPLOY_FAILED.
    pub fn wait_serve_running(&self, apps: &[(&str, u32)], timeout: Duration) -> Duration {
        let start = Instant::now();
        let mut last = String::new();
        let ok = |v: &Value| {
            apps.iter().all(|(app, n)| {
                let a = &v["applications"][*app];
                a["status"] == "RUNNING"
                    && a["deployments"].as_object().is_some_and(|ds| {
                        !ds.is_empty()
                            && ds.values().all(|d| {
                                d["status"] == "HEALTHY"
                                    && d["replica_states"] == serde_json::json!({ "RUNNING": *n })
                            })
                    })
            })
        };
        while start.elapsed() < timeout {
            match self.serve_status() {
                Ok(v) if ok(&v) => {
                    log(&format!(
                        "serve status {apps:?} RUNNING after {:.1}s",
                        start.elapsed().as_secs_f64()
                    ));
                    return start.elapsed();
                }
                Ok(v) => {
                    // A failed deployment does not heal by waiting: say
                    // Serve's reason now.
                    for (app, _) in apps {
                        if v["applications"][*app]["status"] == "DEPLOY_FAILED" {
                            self.dump_logs();
                            panic!(
                                "serve status: {app} DEPLOY_FAILED: {}",
                                v["applications"][*app]
                            );
                        }
                    }
                    last = v.to_string()
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        self.dump_logs();
        panic!("serve status: {apps:?} not RUNNING within {timeout:?}; last status: {last}");
    }
}
