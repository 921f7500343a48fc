//! Request-shape tests of the podman shim against a fake Docker API on a
//! unix socket (fast, no daemon): what the shim sends for Ray's worker
//! command inside a Ray container, and that refusals send nothing.

mod shim_support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use shim_support::*;

/// One request the fake daemon received.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    /// Path without the `/v1.xx` prefix, with the query.
    path: String,
    version: Option<String>,
    body: Value,
}

/// A fake Docker Engine API on a unix socket in a temporary directory.
struct FakeDocker {
    dir: tempfile::TempDir,
    requests: Arc<Mutex<Vec<Request>>>,
}

const CREATED_ID: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

fn fixture_inspect() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/shim/ray-node-inspect.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v[0].clone()
}

fn respond(req: &Request) -> (u16, Value) {
    let me = fixture_inspect();
    let my_id = me["Id"].as_str().unwrap().to_string();
    let (path, _query) = req.path.split_once('?').unwrap_or((&req.path, ""));
    match (req.method.as_str(), path) {
        ("GET", "/version") => (
            200,
            json!({"ApiVersion": "1.41", "Version": "20.10.24", "Os": "linux", "Arch": "amd64"}),
        ),
        ("GET", "/info") => (200, json!({"Runtimes": {"runc": {"path": "runc"}}})),
        ("GET", "/containers/json") => (200, json!([])),
        ("POST", "/containers/create") => (201, json!({"Id": CREATED_ID, "Warnings": []})),
        ("POST", p) if p.ends_with("/start") => (204, Value::Null),
        ("GET", p) if p.starts_with("/containers/") && p.ends_with("/json") => {
            let id = &p["/containers/".len()..p.len() - "/json".len()];
            if !id.is_empty() && my_id.starts_with(id) {
                (200, me)
            } else {
                (404, json!({"message": format!("No such container: {id}")}))
            }
        }
        // Every image exists, under a full ID of its own (the shim
        // resolves the image once and creates from that ID).
        ("GET", p) if p.starts_with("/images/") && p.ends_with("/json") => {
            let name = &p["/images/".len()..p.len() - "/json".len()];
            (
                200,
                json!({"Id": fake_image_id(name), "RepoTags": [name], "Config": {"Labels": {}}}),
            )
        }
        _ => (
            404,
            json!({"message": format!("fake: no route {} {}", req.method, req.path)}),
        ),
    }
}

/// The full ID the fake daemon gives image `name`.
fn fake_image_id(name: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("sha256:{}", format!("{h:016x}").repeat(4))
}

fn serve(stream: UnixStream, requests: Arc<Mutex<Vec<Request>>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let full = parts.next().unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body).unwrap();
        let (version, path) = match full
            .strip_prefix("/v")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        {
            Some(rest) => {
                let (v, p) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                (Some(v.to_string()), p.to_string())
            }
            None => (None, full.clone()),
        };
        let req = Request {
            method,
            path,
            version,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        };
        let (status, value) = respond(&req);
        requests.lock().unwrap().push(req);
        let payload = if value.is_null() {
            String::new()
        } else {
            value.to_string()
        };
        let reason = match status {
            200 => "OK",
            201 => "Created",
            204 => "No Content",
            _ => "Not Found",
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
            payload.len()
        );
    }
}

impl FakeDocker {
    fn start() -> FakeDocker {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("docker.sock")).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let r = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let r = r.clone();
                std::thread::spawn(move || serve(stream, r));
            }
        });
        FakeDocker { dir, requests }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    /// `argus-agent podman ARGS` against this fake, inside the fixture's
    /// Ray container.
    fn podman(&self, args: &[&str]) -> std::process::Output {
        let me = fixture_inspect();
        output(
            podman(args)
                .env("DOCKER_HOST", self.host())
                .env("ARGUS_SHIM_SELF_ID", me["Id"].as_str().unwrap())
                .env("RAY_JOB_ID", "05000000"),
        )
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    fn creates(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/containers/create"))
            .collect()
    }
}

#[test]
fn ray_worker_command_creates_a_sibling_in_the_ray_containers_namespaces() {
    let fake = FakeDocker::start();
    let me = fixture_inspect();
    let id = me["Id"].as_str().unwrap();
    // Ray's worker prefix, without a shell ($RAY_JOB_ID and quotes intact),
    // attached as Ray runs it: the fake has no attach endpoint, so the call
    // ends after its create (which is what this test reads). Detached, a
    // container in the Ray container's namespaces is refused before any
    // create (R-SEC-9: it would outlive its call).
    let worker_args = [
        "run",
        "-v",
        "/tmp/ray:/tmp/ray",
        "--cgroup-manager=cgroupfs",
        "--network=host",
        "--pid=host",
        "--ipc=host",
        "--userns=keep-id",
        "--env",
        "RAY_NODE_ID=0876",
        "--env",
        "FOO='a b $HOME'",
        "--env",
        "RAY_JOB_ID=$RAY_JOB_ID",
        "--gpus",
        "all",
        "--runtime=runc",
        "--entrypoint",
        "python",
        "fake.registry/ray:2.53.0",
        "/ray/default_worker.py",
        "--startup-token=1",
    ];
    let detached = FakeDocker::start();
    let mut with_d = vec!["run", "-d"];
    with_d.extend(&worker_args[1..]);
    let refused = detached.podman(&with_d);
    assert_eq!(refused.status.code(), Some(125), "{}", show(&refused));
    assert!(detached.creates().is_empty(), "-d reached create");
    let o = fake.podman(&worker_args);
    // Ray's own --cgroup-manager is accepted without a word on the job's
    // stderr (Ray copies it to every driver's console).
    assert!(!stderr(&o).contains("--cgroup-manager"), "{}", show(&o));

    let reqs = fake.requests();
    // Never a version newer than the daemon's 1.41 (bollard 0.19.4 sends
    // unversioned paths, which the daemon serves at its own version).
    assert!(
        reqs.iter()
            .all(|r| r.version.is_none() || r.version.as_deref() == Some("1.41")),
        "API version newer than the daemon's: {reqs:?}"
    );
    let creates = fake.creates();
    assert_eq!(creates.len(), 1, "{reqs:?}");
    let body = &creates[0].body;
    let hc = &body["HostConfig"];
    assert_eq!(hc["NetworkMode"], format!("container:{id}"));
    assert_eq!(hc["PidMode"], format!("container:{id}"));
    assert_eq!(hc["IpcMode"], "private");
    assert_eq!(
        hc["Binds"],
        json!(["/tmp/argus-shim-fixture/ray-tmp:/tmp/ray"])
    );
    assert_eq!(hc["AutoRemove"], false);
    assert_eq!(hc["Runtime"], "runc");
    assert_eq!(
        hc["DeviceRequests"][0]["DeviceIDs"],
        json!(["1", "3"]),
        "GPUs limited to the Ray container's"
    );
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    assert_eq!(body["User"], format!("{uid}:{gid}"));
    assert_eq!(body["Entrypoint"], json!(["python"]));
    assert_eq!(
        body["Cmd"],
        json!(["/ray/default_worker.py", "--startup-token=1"])
    );
    // Created from the image's full ID, resolved once (issue 26, hole 6).
    assert_eq!(body["Image"], fake_image_id("fake.registry/ray:2.53.0"));
    let env: Vec<String> = serde_json::from_value(body["Env"].clone()).unwrap();
    assert!(env.contains(&"FOO=a b $HOME".to_string()), "{env:?}");
    assert!(env.contains(&"RAY_JOB_ID=05000000".to_string()), "{env:?}");
    assert_eq!(body["Labels"]["io.argus.shim.owner"], id);
    assert!(
        body["Labels"].get("io.argus.shim.pid").is_some(),
        "an attached run carries its shim's pid (the janitor's tie to the call)"
    );
    assert_eq!(body["AttachStdout"], true);
    assert!(
        fake.requests().iter().any(|r| r.path == "/info"),
        "--runtime is checked against /info"
    );
}

#[test]
fn refusals_send_no_create() {
    let fake = FakeDocker::start();
    for (args, needle) in [
        (vec!["run", "-d", "--privileged", "img"], "no-privileged"),
        (
            vec!["run", "-d", "-v", "/usr/bin:/x", "img"],
            "/usr/bin is not backed by a host mount",
        ),
        (vec!["run", "-d", "--gpus", "3", "img"], "only 2 GPU(s)"),
        (
            vec!["run", "-d", "--runtime=nvidia", "img"],
            "--runtime nvidia",
        ),
        (vec!["run", "-d", "--userns=auto", "img"], "--userns auto"),
        (vec!["run", "-d", "--frob", "img"], "--frob"),
    ] {
        let o = fake.podman(&args);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", show(&o));
        assert!(
            stderr(&o).contains(needle),
            "{args:?} should say {needle:?}: {}",
            show(&o)
        );
        assert_eq!(
            stderr(&o)
                .lines()
                .filter(|l| l.starts_with("Error:"))
                .count(),
            1,
            "{}",
            show(&o)
        );
    }
    assert!(fake.creates().is_empty(), "{:?}", fake.creates());
}

#[test]
fn unknown_own_container_is_an_error_not_a_wrong_bind() {
    let fake = FakeDocker::start();
    let o = output(
        podman(&["run", "-d", "-v", "/tmp/ray:/tmp/ray", "img"])
            .env("DOCKER_HOST", fake.host())
            .env(
                "ARGUS_SHIM_SELF_ID",
                "deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef",
            ),
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(stderr(&o).contains("ARGUS_SHIM_SELF_ID"), "{}", show(&o));
    assert!(fake.creates().is_empty());
}

#[test]
fn unreachable_daemon_is_125_naming_the_address() {
    let o = output(
        podman(&["run", "--rm", "img", "true"])
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock"),
    );
    assert_eq!(o.status.code(), Some(125), "{}", show(&o));
    assert!(
        stderr(&o).contains("/nonexistent/docker.sock"),
        "{}",
        show(&o)
    );
}

#[test]
fn ps_is_scoped_to_the_owner_label() {
    let fake = FakeDocker::start();
    let o = fake.podman(&["ps", "-a", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o).trim(), "[]");
    let id = fixture_inspect()["Id"].as_str().unwrap().to_string();
    let list = fake
        .requests()
        .into_iter()
        .find(|r| r.path.starts_with("/containers/json"))
        .unwrap();
    let query = list
        .path
        .split_once('?')
        .unwrap()
        .1
        .replace("%3D", "=")
        .replace("%22", "\"");
    assert!(query.contains("all=true"), "{query}");
    assert!(
        query.contains(&format!("io.argus.shim.owner={id}")),
        "{query}"
    );
}

/// The file system the fake tests' shim sees is this machine's, standing in
/// for the fixture's Ray container: Ray's temp dir `/tmp/ray` (a bind of
/// `/tmp/argus-shim-fixture/ray-tmp`) and `/tmp` (the volume `raytmp`).
/// Returns a folder under `/tmp` with the links a job could plant there:
/// `up -> /` (its target's rest missing here), `dangling -> /argus-no-such`,
/// `varlib -> /var/lib`, and a plain folder `ok`; and makes `/tmp/ray/x`.
fn planted() -> &'static str {
    static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        std::fs::create_dir_all("/tmp/ray/x").unwrap();
        // One fixed folder, made afresh by each run (no litter in /tmp).
        let d = std::path::PathBuf::from("/tmp/argus-fake-planted");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink("/", d.join("up")).unwrap();
        std::os::unix::fs::symlink("/argus-no-such", d.join("dangling")).unwrap();
        std::os::unix::fs::symlink("/var/lib", d.join("varlib")).unwrap();
        std::fs::create_dir(d.join("ok")).unwrap();
        d.display().to_string()
    })
}

/// Flag groups for the property test: what Ray and engine jobs use (the
/// first 17 are allowed together), then every escape the policy refuses
/// in its spellings (`-v`, `--mount`, `..`, relative paths, symlinks whose
/// target is missing here, foreign named volumes, log drivers, GPU
/// variables, ulimits, restart policies, tmpfs options, networks).
fn flag_pool() -> Vec<Vec<String>> {
    let t = planted();
    let pool: Vec<Vec<String>> = [
        vec!["-v", "/tmp/ray:/tmp/ray"],
        vec!["-v", "raytmp:/n"],
        vec!["--tmpfs", "/t:size=1m,nosuid"],
        vec!["--network=host"],
        vec!["--pid=host"],
        vec!["--ipc=host"],
        vec!["--uts=host"],
        vec!["--userns=keep-id"],
        vec!["--cap-drop", "ALL"],
        vec!["--security-opt", "no-new-privileges"],
        vec!["--device", "nvidia.com/gpu=3"],
        vec!["--gpus", "1"],
        vec!["-e", "A=1"],
        vec!["--label", "a=b"],
        vec!["--log-driver", "json-file", "--log-opt", "max-size=1m"],
        vec!["-e", "NVIDIA_VISIBLE_DEVICES=all"],
        vec!["--mount", "type=bind,src=/tmp/ray,dst=/r,readonly"],
        // Escapes.
        // A subfolder of a writable root, bound (not copied: detached).
        vec!["-v", "@T@/ok:/ok"],
        vec!["--mount", "type=bind,src=/tmp/ray/x,dst=/x,readonly"],
        vec!["-e", "NVIDIA_VISIBLE_DEVICES=0"],
        vec!["-e", "NVIDIA_VISIBLE_DEVICES=1,2"],
        vec!["--device", "nvidia.com/gpu=all"],
        vec!["--device", "nvidia.com/gpu=0"],
        vec!["--device", "/dev/nvidia0"],
        vec!["--device", "/dev/nvidia-caps/nvidia-cap1"],
        vec!["-v", "@T@/up/var/lib/docker:/d"],
        vec!["-v", "@T@/up/argus-no-such/x:/d"],
        vec!["-v", "@T@/dangling:/d"],
        vec!["-v", "@T@/dangling/x:/d"],
        vec!["-v", "@T@/varlib:/d"],
        vec!["--mount", "type=bind,src=@T@/up/var/lib/docker,dst=/d"],
        vec!["-v", "foreign-volume:/v"],
        vec!["--mount", "type=volume,src=foreign-volume,dst=/v"],
        vec!["--log-driver", "syslog"],
        vec!["--log-opt", "syslog-address=udp://203.0.113.9:514"],
        vec![
            "--log-driver",
            "gelf",
            "--log-opt",
            "gelf-address=udp://203.0.113.9:12201",
        ],
        vec!["--ulimit", "nofile=-1"],
        vec!["--restart", "always"],
        vec!["--tmpfs", "/t:suid,dev"],
        vec!["--security-opt", "label=disable"],
        vec!["--security-opt", "label=type:spc_t"],
        vec!["--network", "othernet"],
        vec!["--privileged"],
        vec!["--cap-add", "SYS_ADMIN"],
        vec!["--cap-add", "ALL"],
        vec!["--cap-add", "cap_sys_ptrace"],
        vec!["--security-opt", "seccomp=unconfined"],
        vec!["--security-opt", "apparmor=unconfined"],
        vec!["--userns=host"],
        vec!["--device", "/dev/vda"],
        vec!["--device", "/dev/nvidia0/../vda:/dev/x"],
        vec!["--device", "vendor.example/x=1"],
        vec!["-v", "/var/lib:/vl"],
        vec!["-v", "/:/h"],
        vec!["-v", "/data:/d"],
        vec!["-v", "/tmp/ray/../../etc:/e"],
        vec!["-v", "tmp/../../var/lib:/r"],
        vec!["-v", "/var/run/docker.sock:/s"],
        vec!["--mount", "type=bind,src=/var/lib,dst=/vl"],
        vec![
            "--mount",
            "type=bind,source=/tmp/ray,target=/x,bind-propagation=rshared",
        ],
        vec!["-v", "/tmp/ray:/x:shared"],
        vec!["--network", "container:abc"],
        vec!["--pid", "container:abc"],
        vec!["--ipc", "container:abc"],
        vec!["--cgroupns", "host"],
        vec!["--cgroup-parent", "/x"],
        vec!["--label", "io.argus.shim.owner=x"],
        vec!["-e", "ARGUS_SHIM_POLICY=relaxed"],
    ]
    .iter()
    .map(|g| g.iter().map(|a| a.replace("@T@", t)).collect())
    .collect();
    pool
}

/// How many groups at the head of [`flag_pool`] are allowed together.
const ALLOWED_GROUPS: usize = 17;

/// Returns what in a create body lies outside the default policy, judged
/// from the body alone and from docs/shim.md's rules, never with the
/// shim's own policy code: a bind source must be link-free (each component
/// checked here with lstat, through the fixture's mounts) and under Ray's
/// temp dir or TMPDIR; named volumes only the fixture's own (`raytmp`);
/// GPUs only the fixture's (1 and 3); local log drivers only; and so on.
fn outside_policy(body: &Value, my_id: &str) -> Vec<String> {
    let hc = &body["HostConfig"];
    let mut bad = Vec::new();
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    if hc["Privileged"] == true {
        bad.push("privileged".into());
    }
    if !strs(&hc["CapAdd"]).is_empty() {
        bad.push(format!("CapAdd {}", hc["CapAdd"]));
    }
    for s in strs(&hc["SecurityOpt"]) {
        let ok = s.starts_with("no-new-privileges") || s.starts_with("label=filetype:");
        if !ok {
            bad.push(format!("SecurityOpt {s}"));
        }
    }
    if hc["UsernsMode"].as_str().is_some_and(|u| !u.is_empty()) {
        bad.push(format!("UsernsMode {}", hc["UsernsMode"]));
    }
    // This machine has no GPU device nodes, so no device may be passed.
    for d in hc["Devices"].as_array().into_iter().flatten() {
        bad.push(format!("Device {}", d["PathOnHost"]));
    }
    // The fixture's GPUs are the host's 1 and 3.
    let gpu_ok = |id: &str| matches!(id.trim_start_matches("nvidia.com/gpu="), "1" | "3");
    for r in hc["DeviceRequests"].as_array().into_iter().flatten() {
        if r["Count"].as_i64() == Some(-1) {
            bad.push("DeviceRequest of every GPU".into());
        }
        for id in strs(&r["DeviceIDs"]) {
            if !gpu_ok(&id) {
                bad.push(format!("DeviceRequest {id}"));
            }
        }
    }
    let env = strs(&body["Env"]);
    match env
        .iter()
        .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
    {
        None => {
            bad.push("no NVIDIA_VISIBLE_DEVICES (the image's or the runtime's would win)".into())
        }
        Some("void") | Some("none") | Some("") => {}
        Some(v) if v.split(',').all(gpu_ok) => {}
        Some(v) => bad.push(format!("NVIDIA_VISIBLE_DEVICES={v}")),
    }
    if let Some(e) = env.iter().find(|e| e.starts_with("ARGUS_SHIM_")) {
        bad.push(format!("Env {e}"));
    }
    // The fixture's mounts, host source -> path in the Ray container (here).
    let mounts = [
        ("/tmp/argus-shim-fixture/ray-tmp", "/tmp/ray"),
        ("/var/lib/docker/volumes/raytmp/_data", "/tmp"),
    ];
    for b in strs(&hc["Binds"]) {
        let parts: Vec<&str> = b.split(':').collect();
        let src = parts[0];
        if !src.starts_with('/') {
            if parts.len() > 1 && src != "raytmp" {
                bad.push(format!("named volume {b}"));
            }
            continue;
        }
        let here = mounts.iter().find_map(|(host, inside)| {
            std::path::Path::new(src)
                .strip_prefix(host)
                .ok()
                .map(|rest| std::path::Path::new(inside).join(rest))
        });
        // Both roots are read-write: only a whole root may be bound (a
        // subfolder could be swapped for a link before the daemon mounts it).
        if !mounts.iter().any(|(host, _)| src == *host) {
            bad.push(format!("Bind {b} is not a whole writable root"));
        }
        match here {
            None => bad.push(format!("Bind {b} outside Ray's temp dir and TMPDIR")),
            Some(p) => {
                // Every prefix must be a real folder (or the file itself),
                // never a link the daemon would follow on the host.
                let mut cur = std::path::PathBuf::new();
                for c in p.components() {
                    cur.push(c);
                    match std::fs::symlink_metadata(&cur) {
                        Ok(m) if m.file_type().is_symlink() => {
                            bad.push(format!("Bind {b}: {} is a symlink", cur.display()));
                            break;
                        }
                        Ok(_) => {}
                        Err(_) => {
                            bad.push(format!("Bind {b}: {} does not exist", cur.display()));
                            break;
                        }
                    }
                }
            }
        }
        if parts.len() > 2
            && parts[2]
                .split(',')
                .any(|o| matches!(o, "shared" | "rshared" | "slave" | "rslave"))
        {
            bad.push(format!("Bind propagation {b}"));
        }
        if b.contains("..") {
            bad.push(format!("Bind with .. {b}"));
        }
    }
    for m in hc["Mounts"].as_array().into_iter().flatten() {
        bad.push(format!("Mount {m}"));
    }
    if let Some(t) = hc["LogConfig"]["Type"].as_str() {
        if !["", "json-file", "local", "none"].contains(&t) {
            bad.push(format!("log driver {t}"));
        }
    }
    for (k, _) in hc["LogConfig"]["Config"].as_object().into_iter().flatten() {
        if ![
            "max-size",
            "max-file",
            "compress",
            "mode",
            "max-buffer-size",
        ]
        .contains(&k.as_str())
        {
            bad.push(format!("log option {k}"));
        }
    }
    if let Some(r) = hc["RestartPolicy"]["Name"].as_str() {
        if !["", "no"].contains(&r) {
            bad.push(format!("restart policy {r}"));
        }
    }
    for (dst, opts) in hc["Tmpfs"].as_object().into_iter().flatten() {
        let opts = opts.as_str().unwrap_or("");
        if opts.split(',').any(|o| o == "suid" || o == "dev") {
            bad.push(format!("tmpfs {dst}:{opts}"));
        }
    }
    let hard_nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(_, h)| h)
        .unwrap_or(0);
    for u in hc["Ulimits"].as_array().into_iter().flatten() {
        let hard = u["Hard"].as_i64().unwrap_or(-1);
        let too_high = u["Name"] != "nofile"
            || (hard_nofile != libc::RLIM_INFINITY && (hard < 0 || hard as u64 > hard_nofile));
        if too_high {
            bad.push(format!("ulimit {u}"));
        }
    }
    let joinable = format!("container:{my_id}");
    let network = hc["NetworkMode"].as_str().unwrap_or("");
    // The fixture is on `bridge`: its own network, or its namespace.
    if !["", "bridge", "none", joinable.as_str()].contains(&network) {
        bad.push(format!("NetworkMode {network}"));
    }
    for key in ["PidMode", "IpcMode", "UTSMode"] {
        let m = hc[key].as_str().unwrap_or("");
        if ![
            "",
            "host",
            "private",
            "shareable",
            "none",
            joinable.as_str(),
        ]
        .contains(&m)
        {
            bad.push(format!("{key} {m}"));
        }
    }
    if hc["CgroupnsMode"] == "host" {
        bad.push("CgroupnsMode host".into());
    }
    if hc["CgroupParent"].as_str().is_some_and(|c| !c.is_empty()) {
        bad.push(format!("CgroupParent {}", hc["CgroupParent"]));
    }
    if body["Labels"]["io.argus.shim.owner"] != my_id {
        bad.push(format!(
            "owner label {}",
            body["Labels"]["io.argus.shim.owner"]
        ));
    }
    bad
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..Default::default()
    })]

    #[test]
    fn nothing_outside_the_policy_reaches_a_create_call(
        picks in proptest::collection::vec(proptest::sample::select(flag_pool()), 1..6)
    ) {
        let fake = FakeDocker::start();
        let my_id = fixture_inspect()["Id"].as_str().unwrap().to_string();
        let mut args = vec!["run", "-d"];
        for p in &picks {
            args.extend(p.iter().map(String::as_str));
        }
        args.push("img");
        let o = fake.podman(&args);
        let creates = fake.creates();
        for c in &creates {
            let bad = outside_policy(&c.body, &my_id);
            proptest::prop_assert!(bad.is_empty(), "{args:?} created {bad:?}: {}", show(&o));
        }
        if creates.is_empty() {
            proptest::prop_assert_eq!(o.status.code(), Some(125), "{}", show(&o));
        }
    }
}

/// The allowed half of the pool, all at once, does reach the create call
/// (so the property above is not won by refusing everything), and each
/// escape alone is refused (so the judge is not won by a pool without
/// escapes).
#[test]
fn allowed_flags_together_reach_a_create_call_inside_the_policy() {
    let fake = FakeDocker::start();
    let my_id = fixture_inspect()["Id"].as_str().unwrap().to_string();
    let pool = flag_pool();
    // Attached: the allowed half shares the Ray container's namespaces,
    // which a detached run may not (R-SEC-9). The fake has no attach
    // endpoint: the call ends after its create, which is what is judged.
    let mut args = vec!["run"];
    for p in &pool[..ALLOWED_GROUPS] {
        args.extend(p.iter().map(String::as_str));
    }
    args.push("img");
    let o = fake.podman(&args);
    let creates = fake.creates();
    assert_eq!(creates.len(), 1, "{}", show(&o));
    assert_eq!(
        outside_policy(&creates[0].body, &my_id),
        Vec::<String>::new()
    );
    for p in &pool[ALLOWED_GROUPS..] {
        let fake = FakeDocker::start();
        let mut args = vec!["run", "-d"];
        args.extend(p.iter().map(String::as_str));
        args.push("img");
        let o = fake.podman(&args);
        assert_eq!(o.status.code(), Some(125), "{p:?}: {}", show(&o));
        assert!(fake.creates().is_empty(), "{p:?} reached create");
    }
}
