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
        _ => (
            404,
            json!({"message": format!("fake: no route {} {}", req.method, req.path)}),
        ),
    }
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
    // detached so the fake needs no attach.
    let o = fake.podman(&[
        "run",
        "-d",
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
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        stdout(&o).trim(),
        CREATED_ID,
        "-d prints the full id: {}",
        show(&o)
    );
    assert!(
        stderr(&o).contains("--cgroup-manager has no meaning on Docker"),
        "{}",
        show(&o)
    );

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
    assert_eq!(body["Image"], "fake.registry/ray:2.53.0");
    let env: Vec<String> = serde_json::from_value(body["Env"].clone()).unwrap();
    assert!(env.contains(&"FOO=a b $HOME".to_string()), "{env:?}");
    assert!(env.contains(&"RAY_JOB_ID=05000000".to_string()), "{env:?}");
    assert_eq!(body["Labels"]["io.argus.shim.owner"], id);
    assert!(
        body["Labels"].get("io.argus.shim.pid").is_none(),
        "detached runs carry no shim pid"
    );
    assert_eq!(body["AttachStdout"], false);
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.path == format!("/containers/{CREATED_ID}/start")));
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
            vec!["run", "-d", "-v", "/home/ray/x:/x", "img"],
            "/home/ray/x is not backed by a host mount",
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

/// Flag groups for the property test: what Ray and engine jobs use, and
/// every escape of issue 11 in its spellings (`-v`, `--mount`, `..`,
/// relative paths, `container:` of a foreign container).
const FLAG_POOL: &[&[&str]] = &[
    &["-v", "/tmp/ray:/tmp/ray"],
    &["-v", "named:/n"],
    &["--tmpfs", "/t:size=1m"],
    &["--network=host"],
    &["--pid=host"],
    &["--ipc=host"],
    &["--uts=host"],
    &["--userns=keep-id"],
    &["--cap-drop", "ALL"],
    &["--security-opt", "no-new-privileges"],
    &["--security-opt", "label=disable"],
    &["--device", "/dev/nvidia0"],
    &["--device", "nvidia.com/gpu=0"],
    &["--mount", "type=bind,src=/tmp/ray/x,dst=/x,readonly"],
    &["--mount", "type=volume,src=v,dst=/v"],
    &["--gpus", "1"],
    &["-e", "A=1"],
    &["--label", "a=b"],
    &["--privileged"],
    &["--cap-add", "SYS_ADMIN"],
    &["--cap-add", "ALL"],
    &["--cap-add", "cap_sys_ptrace"],
    &["--security-opt", "seccomp=unconfined"],
    &["--security-opt", "apparmor=unconfined"],
    &["--userns=host"],
    &["--device", "/dev/vda"],
    &["--device", "/dev/nvidia0/../vda:/dev/x"],
    &["--device", "vendor.example/x=1"],
    &["-v", "/var/lib:/vl"],
    &["-v", "/:/h"],
    &["-v", "/data:/d"],
    &["-v", "/tmp/ray/../../etc:/e"],
    &["-v", "tmp/../../var/lib:/r"],
    &["-v", "/var/run/docker.sock:/s"],
    &["--mount", "type=bind,src=/var/lib,dst=/vl"],
    &[
        "--mount",
        "type=bind,source=/tmp/ray,target=/x,bind-propagation=rshared",
    ],
    &["-v", "/tmp/ray:/x:shared"],
    &["--network", "container:abc"],
    &["--pid", "container:abc"],
    &["--ipc", "container:abc"],
    &["--network", "othernet"],
    &["--cgroupns", "host"],
    &["--cgroup-parent", "/x"],
    &["--label", "io.argus.shim.owner=x"],
    &["-e", "ARGUS_SHIM_POLICY=relaxed"],
];

/// Returns what in a create body lies outside the default policy, judged
/// from the body alone (not with the shim's own policy code).
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
        if !(s.starts_with("label") || s.starts_with("no-new-privileges")) {
            bad.push(format!("SecurityOpt {s}"));
        }
    }
    if hc["UsernsMode"].as_str().is_some_and(|u| !u.is_empty()) {
        bad.push(format!("UsernsMode {}", hc["UsernsMode"]));
    }
    for d in hc["Devices"].as_array().into_iter().flatten() {
        let p = d["PathOnHost"].as_str().unwrap_or("");
        if p.contains("..") || !(p.starts_with("/dev/nvidia") || p.starts_with("/dev/dri/")) {
            bad.push(format!("Device {p}"));
        }
    }
    for r in hc["DeviceRequests"].as_array().into_iter().flatten() {
        if r["Driver"] == "cdi"
            && strs(&r["DeviceIDs"])
                .iter()
                .any(|d| !d.starts_with("nvidia.com/gpu="))
        {
            bad.push(format!("CDI {}", r["DeviceIDs"]));
        }
    }
    // The fixture's Ray temp dir and TMPDIR (/tmp, a volume) on the host.
    let roots = [
        "/tmp/argus-shim-fixture/ray-tmp",
        "/var/lib/docker/volumes/raytmp/_data",
    ];
    for b in strs(&hc["Binds"]) {
        let parts: Vec<&str> = b.split(':').collect();
        if parts[0].starts_with('/')
            && !roots
                .iter()
                .any(|r| std::path::Path::new(parts[0]).starts_with(r))
        {
            bad.push(format!("Bind {b}"));
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
    let joinable = format!("container:{my_id}");
    for key in ["NetworkMode", "PidMode", "IpcMode", "UTSMode"] {
        let m = hc[key].as_str().unwrap_or("");
        if ![
            "",
            "host",
            "bridge",
            "none",
            "private",
            "shareable",
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
    let env = strs(&body["Env"]);
    if let Some(e) = env.iter().find(|e| e.starts_with("ARGUS_SHIM_")) {
        bad.push(format!("Env {e}"));
    }
    bad
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..Default::default()
    })]

    /// Issue 11: whatever flags a job combines, nothing outside the default
    /// policy reaches a create call.
    #[test]
    fn nothing_outside_the_policy_reaches_a_create_call(
        picks in proptest::collection::vec(proptest::sample::select(FLAG_POOL), 1..6)
    ) {
        let fake = FakeDocker::start();
        let my_id = fixture_inspect()["Id"].as_str().unwrap().to_string();
        let mut args = vec!["run", "-d"];
        for p in &picks {
            args.extend(p.iter().copied());
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
/// (so the property above is not won by refusing everything).
#[test]
fn allowed_flags_together_reach_a_create_call_inside_the_policy() {
    let fake = FakeDocker::start();
    let my_id = fixture_inspect()["Id"].as_str().unwrap().to_string();
    let mut args = vec!["run", "-d"];
    for p in &FLAG_POOL[..18] {
        args.extend(p.iter().copied());
    }
    args.push("img");
    let o = fake.podman(&args);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let creates = fake.creates();
    assert_eq!(creates.len(), 1, "{}", show(&o));
    assert_eq!(
        outside_policy(&creates[0].body, &my_id),
        Vec::<String>::new()
    );
}
