//! Helpers of the shim's black-box tests: the binary, the real Docker
//! daemon (required: a missing daemon fails the test loudly), and a test
//! image built here without a registry (FROM scratch: a static tool compiled
//! from tests/fixtures/shim/tool.rs, plus the host's glibc so the
//! dynamically linked argus-agent can run inside it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub const BIN: &str = env!("CARGO_BIN_EXE_argus-agent");

/// Returns the state folder of this test process's shims: its own, so
/// that their owner id (a host node's, `$ARGUS_STATE_DIR/shim-owner`) is
/// not shared with other test processes or agents on this daemon.
pub fn state_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// Returns `argus-agent podman ARGS…` with a clean shim environment.
pub fn podman(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("podman").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("ARGUS_SHIM_") || k == "DOCKER_HOST" {
            c.env_remove(k);
        }
    }
    c.env("ARGUS_STATE_DIR", state_dir());
    c.stdin(Stdio::null());
    c
}

/// Runs `c` and returns its output, panicking with everything if it cannot
/// be spawned.
pub fn output(c: &mut Command) -> Output {
    c.output()
        .unwrap_or_else(|e| panic!("cannot run {c:?}: {e}"))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Describes `o` for assertion messages.
pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        stdout(o),
        stderr(o)
    )
}

/// Runs the docker CLI (test setup and checks only; the shim never uses it).
pub fn docker(args: &[&str]) -> Output {
    let o = Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("docker CLI: {e}"));
    o
}

/// Fails the test loudly when the real Docker daemon is not usable.
pub fn require_docker() {
    let sock = Path::new("/var/run/docker.sock");
    assert!(
        sock.exists(),
        "REAL-DAEMON TEST CANNOT RUN: /var/run/docker.sock does not exist. These tests need the \
         Docker Engine of the CI machine; they fail rather than pass silently."
    );
    let o = docker(&["version", "--format", "{{.Server.APIVersion}}"]);
    assert!(
        o.status.success(),
        "REAL-DAEMON TEST CANNOT RUN: `docker version` failed:\n{}",
        show(&o)
    );
}

fn fnv(data: &[u8], mut h: u64) -> u64 {
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Returns the shared libraries the argus-agent binary needs (from `ldd`),
/// so the image can run it.
fn libs() -> Vec<String> {
    let o = Command::new("ldd").arg(BIN).output().expect("ldd");
    assert!(o.status.success(), "ldd {BIN}:\n{}", show(&o));
    stdout(&o)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=> ") {
                Some((_, rest)) => rest.split(' ').next()?,
                None => l.split(' ').next()?,
            };
            path.starts_with('/').then(|| path.to_string())
        })
        .collect()
}

/// Returns the tag of the test image, building it once if it is missing.
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        require_docker();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/shim/tool.rs");
        let mut h = fnv(&std::fs::read(&src).expect("tool.rs"), 0xcbf29ce484222325);
        let libs = libs();
        for l in &libs {
            h = fnv(&std::fs::read(l).unwrap_or_else(|e| panic!("{l}: {e}")), h);
        }
        let tag = format!("argus-shim-test:{:012x}", h & 0xffff_ffff_ffff);
        if docker(&["image", "inspect", &tag]).status.success() {
            return tag;
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("shim-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["bin", "usr/bin", "tmp", "lib/x86_64-linux-gnu", "lib64"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let tool = dir.join("bin/tool");
        let o = Command::new("rustc")
            .args([
                "-O",
                "-C",
                "target-feature=+crt-static",
                "-C",
                "strip=symbols",
            ])
            .args(["--target", "x86_64-unknown-linux-gnu", "-o"])
            .arg(&tool)
            .arg(&src)
            .output()
            .expect("rustc");
        assert!(
            o.status.success(),
            "cannot compile the test tool:\n{}",
            show(&o)
        );
        std::fs::copy(&tool, dir.join("usr/bin/python")).unwrap();
        std::fs::copy(&tool, dir.join("bin/true")).unwrap();
        for l in &libs {
            let to = dir.join(l.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(l, &to).unwrap_or_else(|e| panic!("{l}: {e}"));
        }
        std::fs::write(dir.join("Dockerfile"), "FROM scratch\nCOPY . /\n").unwrap();
        let o = Command::new("docker")
            .args(["build", "-q", "-t", &tag])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "cannot build the test image:\n{}",
            show(&o)
        );
        let _ = std::fs::remove_dir_all(&dir);
        tag
    })
}

/// Returns the ids of all containers (any state) carrying `label`.
pub fn containers_with(label: &str) -> Vec<String> {
    let o = docker(&[
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &format!("label={label}"),
    ]);
    assert!(o.status.success(), "{}", show(&o));
    stdout(&o)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// Returns a name unique to this test process and `what`.
pub fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("argus-shim-{what}-{}-{nanos}", std::process::id())
}

/// Removes containers (ignoring errors): test cleanup.
pub fn force_remove(ids: &[String]) {
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f"];
        args.extend(ids.iter().map(String::as_str));
        let _ = docker(&args);
    }
}

/// Waits (up to 60 s) until none of `ids` is left among the containers
/// labelled `label`, and returns those still there: a container that
/// another remover is removing is listed until its removal completes.
pub fn left_after_removal(label: &str, ids: &[String]) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let left: Vec<String> = containers_with(label)
            .into_iter()
            .filter(|c| ids.contains(c))
            .collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Builds image `tag` from the test image with `extra` Dockerfile lines
/// (no context: `docker build -`), and returns its full ID.
pub fn derived_image(tag: &str, extra: &str) -> String {
    use std::io::Write;
    let mut c = Command::new("docker")
        .args(["build", "-q", "-t", tag, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(format!("FROM {}\n{extra}\n", image()).as_bytes())
        .unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "docker build {tag}:\n{}", show(&o));
    let o = docker(&["image", "inspect", "--format", "{{.Id}}", tag]);
    assert!(o.status.success(), "{}", show(&o));
    stdout(&o).trim().to_string()
}
