//! The escapes a security review found in the shim's policy, tried against the real Docker daemon the way a
//! job would try them, each with a control that shows the same setup does
//! reach the daemon when the rule allows it (so a test cannot pass by
//! refusing everything):
//!
//! - a symlink to `/` planted in Ray's temp dir, then a bind through it of
//!   a path missing in the Ray container (`/tmp/ray/l/var/lib/docker`): the
//!   host's `/var/lib/docker`, read-write, before the fix;
//! - another project's named volume;
//! - a log driver that ships output off the node;
//! - GPUs the Ray container does not have (devices, CDI, the variable);
//! - a job's `env_vars` moving the bind allow-list (`TMPDIR=/var/lib`),
//!   through a real node agent and a worker-like descendant of it.

mod shim_support;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use shim_support::*;
use support::{Agent, Sandbox};

/// Runs `podman ARGV` as the Ray container would: inside a container of the
/// test image with the Docker socket, the shim as `/usr/bin/podman`, and
/// `ray_tmp` (a host folder) bound at `/tmp/ray`, as compose does.
fn in_ray_container(ray_tmp: &str, extra: &[&str], argv: &[&str]) -> std::process::Output {
    let bind = format!("{ray_tmp}:/tmp/ray");
    let podman = format!("{BIN}:/usr/bin/podman:ro");
    let mut args = vec![
        "run",
        "--rm",
        "-v",
        "/var/run/docker.sock:/var/run/docker.sock",
        "-v",
        &podman,
        "-v",
        &bind,
    ];
    args.extend(extra);
    args.push(image());
    args.push("/usr/bin/podman");
    args.extend(argv);
    docker(&args)
}

/// Asserts `o` is the shim's one-line 125 naming `rule`.
fn assert_refused(o: &std::process::Output, rule: &str, what: &str) {
    assert_eq!(o.status.code(), Some(125), "{what}: {}", show(o));
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: not one line: {}", show(o));
    assert!(
        lines[0].contains(&format!("rule {rule}")),
        "{what}: should name rule {rule}: {}",
        show(o)
    );
}

#[test]
fn a_link_to_root_in_rays_temp_dir_does_not_reach_the_hosts_docker_data() {
    let img = image();
    let label = unique("escape-link");
    let ray_tmp = tempfile::tempdir().unwrap();
    let t = ray_tmp.path().display().to_string();
    // What a job does from a worker or an engine container: a link to / in
    // Ray's temp dir (writable by both).
    std::os::unix::fs::symlink("/", ray_tmp.path().join("l")).unwrap();
    std::fs::create_dir(ray_tmp.path().join("ok")).unwrap();
    std::fs::write(ray_tmp.path().join("ok/marker"), "from-ray-tmp").unwrap();
    let root = stdout(&docker(&["info", "--format", "{{.DockerRootDir}}"]));
    let root = root.trim();
    assert!(
        std::path::Path::new(root).join("containers").is_dir(),
        "the daemon's data root {root} should be on this host"
    );
    let lbl = format!("argus-escape={label}");
    for (src, rule) in [
        // Missing in the Ray container: resolution stops at /var/lib/docker.
        (format!("/tmp/ray/l{root}"), "binds"),
        (format!("/tmp/ray/l{root}/containers"), "binds"),
        // Existing there: resolves to the Ray container's own /usr, which is
        // not under an allowed root.
        ("/tmp/ray/l/usr".to_string(), "binds"),
        ("/tmp/ray/ok/../l/etc".to_string(), "no-etc-bind"),
    ] {
        let spec = format!("{src}:/d");
        let o = in_ray_container(
            &t,
            &[],
            &[
                "run",
                "--rm",
                "-u",
                "0",
                "--label",
                &lbl,
                "-v",
                &spec,
                img,
                "/bin/tool",
                "ls",
                "/d",
            ],
        );
        assert_refused(&o, rule, &spec);
        assert!(
            !stdout(&o).contains("containers"),
            "{spec} listed the daemon's data: {}",
            show(&o)
        );
        assert!(containers_with(&label).is_empty(), "{spec} created one");
    }
    // Control: the same call through a real folder of Ray's temp dir.
    let o = in_ray_container(
        &t,
        &[],
        &[
            "run",
            "--rm",
            "--label",
            &lbl,
            "-v",
            "/tmp/ray/ok:/d",
            img,
            "/bin/tool",
            "read",
            "/d/marker",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), "from-ray-tmp");
}

#[test]
fn a_foreign_named_volume_stays_out_of_reach() {
    let img = image();
    let label = unique("escape-volume");
    let volume = unique("argus-foreign");
    let o = docker(&["volume", "create", &volume]);
    assert!(o.status.success(), "{}", show(&o));
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            docker(&["volume", "rm", "-f", &self.0]);
        }
    }
    let _cleanup = Cleanup(volume.clone());
    let spec = format!("{volume}:/v");
    let o = docker(&[
        "run",
        "--rm",
        "-v",
        &spec,
        img,
        "/bin/tool",
        "write",
        "/v/secret",
        "s3cret",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    let mount = format!("type=volume,src={volume},dst=/v");
    for argv in [["-v", spec.as_str()], ["--mount", mount.as_str()]] {
        let mut args = vec!["run", "--rm", "-u", "0", "--label", &label];
        args.extend(argv);
        args.extend([img, "/bin/tool", "read", "/v/secret"]);
        let o = output(&mut podman(&args));
        assert_refused(&o, "binds", &format!("{argv:?}"));
        assert!(!stdout(&o).contains("s3cret"), "{}", show(&o));
        assert!(containers_with(&label).is_empty());
    }
    // Control: named by the allow-list, the same volume is readable.
    let o = output(
        podman(&[
            "run",
            "--rm",
            "--label",
            &label,
            "-v",
            &spec,
            img,
            "/bin/tool",
            "read",
            "/v/secret",
        ])
        .env("ARGUS_SHIM_ALLOWED_VOLUMES", &volume),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), "s3cret");
}

#[test]
fn log_drivers_that_ship_output_off_the_node_are_refused() {
    let img = image();
    let label = unique("escape-log");
    for argv in [
        vec![
            "--log-driver",
            "syslog",
            "--log-opt",
            "syslog-address=udp://127.0.0.1:9",
        ],
        vec![
            "--log-driver",
            "gelf",
            "--log-opt",
            "gelf-address=udp://127.0.0.1:9",
        ],
        vec!["--log-opt", "syslog-address=udp://127.0.0.1:9"],
    ] {
        let mut args = vec!["run", "--rm", "--label", &label];
        args.extend(argv.iter().copied());
        args.extend([img, "true"]);
        let o = output(&mut podman(&args));
        assert_refused(&o, "log-driver", &format!("{argv:?}"));
        assert!(containers_with(&label).is_empty());
    }
    let o = output(&mut podman(&[
        "run",
        "--rm",
        "--label",
        &label,
        "--log-driver",
        "json-file",
        "--log-opt",
        "max-size=1m",
        img,
        "/bin/tool",
        "echo",
        "kept",
        "",
        "0",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), "kept");
}

#[test]
fn gpus_the_ray_container_does_not_have_are_refused() {
    let img = image();
    let label = unique("escape-gpu");
    let ray_tmp = tempfile::tempdir().unwrap();
    let t = ray_tmp.path().display().to_string();
    let lbl = format!("argus-escape={label}");
    // The stand-in Ray container has no GPU (this machine has none).
    for (argv, rule) in [
        (vec!["-e", "NVIDIA_VISIBLE_DEVICES=0,1"], "gpus"),
        (vec!["-e", "NVIDIA_VISIBLE_DEVICES=GPU-0123"], "gpus"),
        (vec!["--device", "nvidia.com/gpu=all"], "devices"),
        (vec!["--device", "nvidia.com/gpu=0"], "devices"),
        (vec!["--device", "/dev/nvidia0"], "devices"),
        (vec!["--device", "/dev/nvidia-caps/nvidia-cap1"], "devices"),
    ] {
        let mut args = vec!["run", "--rm", "--label", &lbl];
        args.extend(argv.iter().copied());
        args.extend([img, "true"]);
        let o = in_ray_container(&t, &[], &args);
        assert_refused(&o, rule, &format!("{argv:?}"));
        assert!(containers_with(&label).is_empty());
    }
    // Control: without GPU flags it runs.
    let o = in_ray_container(&t, &[], &["run", "--rm", "--label", &lbl, img, "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

/// A node agent (fake ray) whose "worker" runs `podman` with a job's
/// `env_vars` in its environment, like a Ray worker of a job with
/// `runtime_env={"env_vars": {...}}`; returns the worker's result.
fn worker_under_an_agent(job_env: &str, podman_args: &str) -> Value {
    let sb = Sandbox::new();
    let bindir = sb.path().join("podman-bin");
    std::fs::create_dir_all(&bindir).unwrap();
    std::os::unix::fs::symlink(BIN, bindir.join("podman")).unwrap();
    let out = sb.path().join("worker.json");
    let mut env: BTreeMap<String, String> = sb.env("head", "head");
    env.insert(
        "FAKE_RAY_RUN".into(),
        format!("env {job_env} {}/podman {podman_args}", bindir.display()),
    );
    env.insert("FAKE_RAY_RUN_OUT".into(), out.display().to_string());
    let mut agent = Agent::start(&sb, "head", &env);
    agent.wait_for("the worker's podman call", Duration::from_secs(120), |_| {
        out.exists()
    });
    let settings = agent.state_dir.join("shim-settings.json");
    assert!(
        settings.exists(),
        "the agent wrote no {}",
        settings.display()
    );
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(30));
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

#[test]
fn a_jobs_env_vars_do_not_move_the_bind_allow_list() {
    let img = image();
    let label = unique("escape-env");
    // /var/lib/dpkg: a host folder outside every allowed root, harmless to
    // bind read-only for `true`.
    assert!(std::path::Path::new("/var/lib/dpkg").is_dir());
    let job_env = "TMPDIR=/var/lib ARGUS_SHIM_ALLOWED_BINDS=/var/lib ARGUS_MODEL_CACHE=/var/lib";
    let args = format!("run --rm --label {label} -v /var/lib/dpkg:/d:ro {img} true");
    // Control: a standalone shim (no agent above it) is configured by
    // whoever runs it, so these values do allow the bind.
    let direct = output(
        podman(&args.split(' ').collect::<Vec<_>>())
            .env("TMPDIR", "/var/lib")
            .env("ARGUS_SHIM_ALLOWED_BINDS", "/var/lib"),
    );
    assert_eq!(direct.status.code(), Some(0), "{}", show(&direct));
    // Under a node agent, its settings win.
    let r = worker_under_an_agent(job_env, &args);
    assert_eq!(r["code"], 125, "{r}");
    let err = r["stderr"].as_str().unwrap_or("");
    assert!(err.contains("rule binds"), "{r}");
    assert!(err.contains("the shim uses this node's settings"), "{r}");
    assert!(containers_with(&label).is_empty());
}

#[test]
fn pull_is_under_the_image_allow_list() {
    require_docker();
    for argv in [
        &["pull", "evil.example/miner:1"][..],
        &["image", "pull", "evil.example/miner:1"][..],
    ] {
        let o = output(podman(argv).env("ARGUS_SHIM_ALLOWED_IMAGES", "registry.local/*"));
        assert_eq!(o.status.code(), Some(125), "{argv:?}: {}", show(&o));
        assert!(
            stderr(&o).contains("allowed-images"),
            "{argv:?}: {}",
            show(&o)
        );
        assert!(
            !stderr(&o).contains("Trying to pull"),
            "{argv:?} pulled: {}",
            show(&o)
        );
    }
}
