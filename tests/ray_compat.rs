//! Ray 2.53's own runtime_env container tests, run against the compose
//! cluster (docs/ray-compat.md).
//!
//! Ray tests its `container` and `image_uri` runtime_env plugins with
//! scripts under python/ray/tests/runtime_env_container/ of its repository,
//! run by python/ray/tests/test_runtime_env_container.py in a container
//! that has real podman. Here `podman` is the node image's shim, which
//! starts each such Ray worker in a sibling engine container on the host's
//! Docker. The cases are rewritten from those scripts' assertions in
//! tests/fixtures/ray_compat/ (each file names its upstream script and the
//! adaptations it needed) and run as drivers connected to one compose
//! cluster, as the Ray user, in both runtime_env forms where Ray
//! parametrizes both, with an engine image built FROM the stand-in engine
//! image (tests/fixtures/ray_compat/Dockerfile: numpy, file.txt, the Serve
//! application module).
//!
//! Besides each case's own assertions, no driver's console may show a
//! `WARNING: ` line from the shim: Ray copies a worker command's stderr to
//! every driver as `(raylet, ip=...) WARNING: ...`, and the shim's notes on
//! ignored podman flags are not the job's business.
//!
//! Cluster adaptations (the cluster outlives each case, unlike upstream's
//! Ray): the workers are started with `--num-cpus=1`, as upstream's
//! `ray.init(num_cpus=1)` for its idle-worker case; every node has
//! RAY_TEST_ABC=1 and TEST_ABC=1 in its environment, as upstream's cluster
//! container; the head reports usage telemetry every second to its Serve
//! proxy (upstream's telemetry case starts a head with these settings).
//!
//! ARGUS_COMPAT_CASES=name,... runs only the cases named (fixture names).

#[path = "support/compose.rs"]
mod compose;

use std::process::Command;
use std::time::{Duration, Instant};

use compose::*;

/// The part of every case script: argv, the runtime_env form, connecting.
const COMMON: &str = include_str!("fixtures/ray_compat/common.py");

/// A case: its script, and whether Ray runs it in both runtime_env forms.
struct Case {
    name: &'static str,
    script: &'static str,
    /// The node whose container runs the driver.
    service: &'static str,
    /// The forms to run: `image_uri` and/or `container`.
    forms: &'static [Form],
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    ImageUri,
    Container,
    /// The script runs both forms itself.
    Both,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::ImageUri => "image_uri",
            Form::Container => "container",
            Form::Both => "both",
        }
    }
}

const BOTH: &[Form] = &[Form::ImageUri, Form::Container];

macro_rules! case {
    ($name:literal, $service:literal, $forms:expr) => {
        Case {
            name: $name,
            script: include_str!(concat!("fixtures/ray_compat/", $name, ".py")),
            service: $service,
            forms: $forms,
        }
    };
}

/// In run order: cheap ones first, Serve last (it leaves a controller).
const CASES: &[Case] = &[
    // Upstream's test class is parametrized over both forms.
    case!("validation", "head", &[Form::Both]),
    case!("ray_env_vars", "head", BOTH),
    // Upstream runs only the `container` form.
    case!("with_env_vars", "head", &[Form::Container]),
    case!("put_get", "head", BOTH),
    case!("shared_memory", "head", BOTH),
    // On a worker: the task's log files are on the node that ran it.
    case!("log_file_exists", "worker-1", BOTH),
    // Upstream runs only the `container` form.
    case!("job", "head", &[Form::Container]),
    case!("worker_exit", "head", BOTH),
    case!("serve_basic", "head", BOTH),
    case!("serve_telemetry", "head", BOTH),
];

/// The engine image of these cases, built FROM the stand-in engine image.
fn compat_image() -> String {
    format!("localhost/argus-ray-compat-engine:{}", e2e_version())
}

/// Builds [`compat_image`] from tests/fixtures/ray_compat/Dockerfile with the
/// host's CA bundle in the build context as host-ca.crt (pip behind a TLS
/// proxy), as scripts/build-base-image.sh trusts it.
fn build_compat_image() {
    let fixtures = workspace_root().join("tests/fixtures/ray_compat");
    let ctx = tempfile::tempdir().unwrap();
    for f in ["Dockerfile", "serve_application.py"] {
        std::fs::copy(fixtures.join(f), ctx.path().join(f)).unwrap();
    }
    let ca = std::env::var("PIP_CERT")
        .or_else(|_| std::env::var("SSL_CERT_FILE"))
        .unwrap_or_else(|_| "/etc/ssl/certs/ca-certificates.crt".into());
    std::fs::copy(&ca, ctx.path().join("host-ca.crt"))
        .unwrap_or_else(|e| panic!("cannot copy the CA bundle {ca}: {e}"));
    log(&format!("building {}", compat_image()));
    let mut cmd = Command::new("docker");
    // As scripts/build-images.sh: the legacy builder when buildx is missing.
    let buildx = output(Command::new("docker").args(["buildx", "version"]));
    if !buildx.status.success() && std::env::var_os("DOCKER_BUILDKIT").is_none() {
        cmd.env("DOCKER_BUILDKIT", "0");
    }
    run(cmd
        .args(["build", "-q", "-t", &compat_image()])
        .args([
            "--build-arg",
            &format!("ENGINE_IMAGE={}", engine_image("stub-a")),
        ])
        .arg(ctx.path()));
}

/// Returns the lines of `text` that are `WARNING: ` lines as Ray shows a
/// worker command's stderr to a driver (`(raylet, ip=...) WARNING: ...`,
/// colours stripped) or as printed bare.
fn shim_warnings(text: &str) -> Vec<String> {
    let plain = strip_ansi(text);
    plain
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            let rest = match l.strip_prefix('(') {
                Some(r) => r.split_once(')').map_or("", |(_, r)| r).trim_start(),
                None => l,
            };
            rest.starts_with("WARNING: ")
        })
        .map(str::to_string)
        .collect()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn shim_warning_lines_are_recognised() {
    let ray = "\u{1b}[36m(raylet, ip=172.18.0.3)\u{1b}[0m WARNING: --cgroup-manager has no meaning on Docker and is ignored\n";
    assert_eq!(shim_warnings(ray).len(), 1);
    assert_eq!(shim_warnings("WARNING: x\n").len(), 1);
    let ray_own =
        "2026-01-01 10:00:00,000\tWARNING worker.py:1 -- something\n(pid=12) UserWarning: y\n";
    assert!(shim_warnings(ray_own).is_empty());
}

/// Runs one case in one form; returns a failure description, if any.
fn run_case(c: &Cluster, case: &Case, form: Form) -> Result<(), String> {
    let mut args = vec![
        "exec".to_string(),
        "-u".into(),
        "ray".into(),
        "-e".into(),
        "HOME=/home/ray".into(),
        "-i".into(),
        c.container(case.service),
        "timeout".into(),
        "900".into(),
        "python".into(),
        "-".into(),
        "--image".into(),
        compat_image(),
    ];
    if form == Form::ImageUri {
        args.push("--use-image-uri-api".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let script = format!("{COMMON}\n{}", case.script);
    let out = with_stdin(&args, &script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    let mut why = Vec::new();
    if !out.status.success() {
        why.push(format!("driver exited {}", out.status));
    }
    let ok = format!("CASE-OK {} ", case.name);
    if !stdout.lines().any(|l| l.starts_with(&ok)) {
        why.push("no CASE-OK line".to_string());
    }
    let warnings: Vec<String> = shim_warnings(&stdout)
        .into_iter()
        .chain(shim_warnings(&stderr))
        .collect();
    if !warnings.is_empty() {
        why.push(format!(
            "WARNING lines reached the driver's console:\n  {}",
            warnings.join("\n  ")
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\n--- stdout (tail)\n{}\n--- stderr (tail)\n{}",
            why.join("; "),
            tail(&stdout),
            tail(&stderr)
        ))
    }
}

/// Every case of Ray's runtime_env container tests, in both forms, on one
/// compose cluster; one report of every case, then a failure listing the
/// failed ones.
#[test]
fn ray_container_test_cases_pass_on_the_compose_cluster() {
    elapsed_since_start();
    require_docker();
    build_images(true);
    build_compat_image();
    let node_env = [("RAY_TEST_ABC", "1"), ("TEST_ABC", "1")];
    let mut service_env: Vec<(&str, &str, &str)> = Vec::new();
    for s in SERVICES {
        for (k, v) in node_env {
            service_env.push((s, k, v));
        }
    }
    for w in ["worker-1", "worker-2"] {
        service_env.push((
            w,
            "ARGUS_RAY_EXTRA_ARGS",
            "--num-cpus=1 --object-store-memory=1000000000",
        ));
    }
    service_env.push((
        "head",
        "RAY_USAGE_STATS_REPORT_URL",
        "http://127.0.0.1:8000/telemetry",
    ));
    service_env.push(("head", "RAY_USAGE_STATS_REPORT_INTERVAL_S", "1"));
    let c = Cluster::up_full(
        &[("ARGUS_SHM_SIZE", "2g"), ("RAY_USAGE_STATS_ENABLED", "1")],
        &[],
        &service_env,
    );
    c.wait_nodes("three nodes alive", Duration::from_secs(240), |n| {
        n.len() == 3
    });

    let start = Instant::now();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    // ARGUS_COMPAT_CASES=a,b runs only those cases (to debug one).
    let only = std::env::var("ARGUS_COMPAT_CASES").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|c| c == name))
    };
    for case in CASES.iter().filter(|c| wanted(c.name)) {
        for &form in case.forms {
            let t = Instant::now();
            let label = format!("{} ({})", case.name, form.name());
            let mut r = run_case(&c, case, form);
            // Ray 2.53's own crash, not the case's: a Ray worker (seen: a
            // ProxyActor) killed by SIGSEGV in glibc's getenv, racing a
            // setenv on another thread (ray-project/ray#61034, fixed after
            // 2.53). Run once more, and say so; any other failure stands.
            if let Err(e) = &r {
                if e.contains("SIGSEGV received") && e.contains("getenv") {
                    eprintln!("--- {label}: a Ray worker crashed in getenv (Ray's setenv race, not the case); once more:\n{e}");
                    r = run_case(&c, case, form);
                }
            }
            let secs = t.elapsed().as_secs_f64();
            log(&format!(
                "{label}: {} in {secs:.1}s",
                if r.is_ok() { "passed" } else { "FAILED" }
            ));
            report.push(format!(
                "{label:<34} {:<6} {secs:>6.1}s",
                if r.is_ok() { "ok" } else { "FAILED" }
            ));
            if let Err(e) = r {
                eprintln!("--- {label} failed: {e}");
                failures.push(label);
            }
        }
    }
    log(&format!(
        "cases took {:.1}s:\n{}",
        start.elapsed().as_secs_f64(),
        report.join("\n")
    ));
    if !failures.is_empty() {
        c.dump_logs();
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed: {}",
        failures.len(),
        report.len(),
        failures.join(", ")
    );
}
