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
        assert!(containers_with(&lbl).is_empty(), "{spec} created one");
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
        assert!(containers_with(&lbl).is_empty());
    }
    // Control: without GPU flags it runs.
    let o = in_ray_container(&t, &[], &["run", "--rm", "--label", &lbl, img, "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

/// A node agent (fake ray) whose "worker" runs `podman` with a job's
/// `env_vars` in its environment, like a Ray worker of a job with
/// `runtime_env={"env_vars": {...}}`; returns the worker's result.
fn worker_under_an_agent(job_env: &str, podman_args: &str) -> Value {
    worker_under_an_agent_with(&Sandbox::new(), &[], job_env, podman_args)
}

/// [`worker_under_an_agent`] in `sb`, with `agent_env` added to the
/// agent's environment (the node's settings).
fn worker_under_an_agent_with(
    sb: &Sandbox,
    agent_env: &[(&str, &str)],
    job_env: &str,
    podman_args: &str,
) -> Value {
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
    for (k, v) in agent_env {
        env.insert(k.to_string(), v.to_string());
    }
    let mut agent = Agent::start(sb, "head", &env);
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

/// The group of the host's Docker socket, as a number.
fn socket_gid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/var/run/docker.sock")
        .expect("the Docker socket")
        .gid()
}

/// An image made from the test image whose `/etc/passwd` has uid 1000
/// (`ray`, gid 100) and whose `/etc/group` puts `ray` in the root group and
/// in the socket's group, and names a group `44` with the socket's gid: an
/// image a job names to get the socket's group. Removed on drop.
struct GroupImage(String);

impl GroupImage {
    fn build() -> GroupImage {
        let g = socket_gid();
        let tag = format!("{}:latest", unique("groups"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0::/:/bin/tool\nray:x:1000:100::/:/bin/tool\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            format!("root:x:0:ray\n44:x:{g}:ray\nsock:x:{g}:ray\nusers:x:100:\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("Dockerfile"),
            format!("FROM {}\nCOPY etc /etc\n", image()),
        )
        .unwrap();
        let o = docker(&["build", "-q", "-t", &tag, &dir.path().display().to_string()]);
        assert!(o.status.success(), "{}", show(&o));
        GroupImage(tag)
    }
}

impl Drop for GroupImage {
    fn drop(&mut self) {
        docker(&["image", "rm", "-f", &self.0]);
    }
}

/// Runs `podman ARGV` in a stand-in Ray container as the Ray user would:
/// uid 1000, gid 100, with the socket's group only so that this standalone
/// shim can reach the daemon (the agent's handler does the same), `env`
/// as the node's shim settings.
fn as_ray_user(env: &[&str], argv: &[&str]) -> std::process::Output {
    let g = socket_gid().to_string();
    let mut extra = vec!["-u", "1000:100", "--group-add", &g];
    for e in env {
        extra.extend(["-e", e]);
    }
    let ray_tmp = tempfile::tempdir().unwrap();
    in_ray_container(&ray_tmp.path().display().to_string(), &extra, argv)
}

/// Returns the numbers of the `Groups:` line of a `/proc/<pid>/status`.
fn groups_line(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap_or_else(|| panic!("no Groups: line in {status:?}"))
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect()
}

/// R-SEC-1 (issue 26, road 1 and hole 5(b)): an engine container's groups
/// are numbers the shim decides. Every spelling of the root group's, the
/// socket's or another gid in `--group-add`, every name, and a gid 0 or
/// the socket's in `--user` create no container; an allowed `--user 1000`
/// on an image whose `/etc/group` puts uid 1000's user in the socket's
/// group runs with the caller's gid and nothing else.
#[test]
fn an_engine_gets_no_group_from_the_image_and_no_spelling_of_a_refused_one() {
    let img = GroupImage::build();
    let g = socket_gid();
    let label = unique("escape-groups");
    let mut refused: Vec<(Vec<String>, &str)> = Vec::new();
    for n in [0, g, 105] {
        for s in [format!("{n}"), format!("0{n}"), format!("00{n}")] {
            refused.push((vec!["--group-add".into(), s.clone()], "groups"));
            if n != 105 {
                refused.push((vec!["--user".into(), format!("1000:{s}")], "groups"));
            }
        }
    }
    for name in ["root", "sock", "44", "keep-groups", "users"] {
        refused.push((vec!["--group-add".into(), name.into()], "groups"));
    }
    for u in [
        "root",
        "ray",
        "0",
        "00",
        "1000:sock",
        "1000:root",
        "+1000",
        "0x3e8",
    ] {
        refused.push((vec!["--user".into(), u.into()], "users"));
    }
    // Every case is tried, then all that let a container through (the
    // effect) and all refused under another rule are shown together.
    let (mut escaped, mut misnamed) = (Vec::new(), Vec::new());
    for (flags, rule) in &refused {
        let mut argv = vec!["run", "--rm", "--label", &label];
        argv.extend(flags.iter().map(String::as_str));
        argv.extend([img.0.as_str(), "/bin/tool", "id"]);
        let o = as_ray_user(&[], &argv);
        let created = containers_with(&label);
        if o.status.code() != Some(125) || !created.is_empty() {
            escaped.push(format!(
                "{flags:?}: exit {:?}, ran as {:?}",
                o.status.code(),
                stdout(&o).trim()
            ));
            force_remove(&created);
        } else if !stderr(&o).contains(&format!("rule {rule}")) {
            misnamed.push(format!("{flags:?}: {}", stderr(&o).trim()));
        }
    }
    assert!(escaped.is_empty(), "not refused:\n{}", escaped.join("\n"));
    assert!(
        misnamed.is_empty(),
        "refused under another rule:\n{}",
        misnamed.join("\n")
    );
    // Allowed: the caller's uid, bare; the gid is the caller's, the
    // groups none of the image's.
    for user in ["1000", "01000"] {
        let o = as_ray_user(
            &[],
            &[
                "run",
                "--label",
                &label,
                "--user",
                user,
                &img.0,
                "/bin/tool",
                "read",
                "/proc/self/status",
            ],
        );
        let ids = containers_with(&label);
        struct Rm(Vec<String>);
        impl Drop for Rm {
            fn drop(&mut self) {
                force_remove(&self.0);
            }
        }
        let _rm = Rm(ids.clone());
        assert_eq!(o.status.code(), Some(0), "--user {user}: {}", show(&o));
        assert_eq!(ids.len(), 1, "--user {user}: {ids:?}");
        let inspect: Value = serde_json::from_str(&stdout(&docker(&["inspect", &ids[0]]))).unwrap();
        assert_eq!(inspect[0]["Config"]["User"], "1000:100", "--user {user}");
        let group_add = &inspect[0]["HostConfig"]["GroupAdd"];
        assert!(
            group_add.is_null() || group_add.as_array().is_some_and(|a| a.is_empty()),
            "--user {user}: GroupAdd {group_add}"
        );
        let groups = groups_line(&stdout(&o));
        assert!(
            !groups.contains(&g),
            "--user {user}: the socket's group {g} in {groups:?}"
        );
        assert!(
            !groups.contains(&0),
            "--user {user}: the root group in {groups:?}"
        );
        assert_eq!(groups, vec![100], "--user {user}");
    }
}

/// Road 4: uid 0, in any spelling, never runs in a shared PID namespace
/// for a caller that is not root, whatever `ARGUS_SHIM_ALLOWED_USERS` says.
#[test]
fn root_in_a_shared_pid_namespace_is_refused_whatever_the_allowed_users() {
    let img = image();
    let label = unique("escape-rootpid");
    let allow = "ARGUS_SHIM_ALLOWED_USERS=0";
    for flags in [
        &["-u", "0", "--pid=host"][..],
        &["-u", "00:100", "--pid=host"],
        &["--user", "0:0100", "--pid", "host"],
        &["--userns=keep-id:uid=0,gid=100", "--pid=host"],
    ] {
        let mut argv = vec!["run", "--rm", "--label", &label];
        argv.extend(flags);
        argv.extend([img, "/bin/tool", "id"]);
        let o = as_ray_user(&[allow], &argv);
        assert_refused(&o, "no-root-shared-pid", &format!("{flags:?}"));
        assert!(containers_with(&label).is_empty(), "{flags:?} created one");
    }
    // Control: listed, in a PID namespace of its own, uid 0 runs.
    let o = as_ray_user(
        &[allow],
        &[
            "run",
            "--rm",
            "--label",
            &label,
            "-u",
            "0",
            img,
            "/bin/tool",
            "id",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o).trim(), "0:100");
}

/// Holes 9 and 11: a propagation mode or a relabel smuggled behind a `:`
/// in a `--mount` target or source, and a policy variable in an
/// `--env-file`, create no container.
#[test]
fn options_behind_a_colon_and_policy_in_an_env_file_create_nothing() {
    let img = image();
    let label = unique("escape-smuggle");
    let ray_tmp = tempfile::tempdir().unwrap();
    let t = ray_tmp.path().display().to_string();
    std::fs::write(
        ray_tmp.path().join("job.env"),
        "A=1\nARGUS_SHIM_POLICY=relaxed\n",
    )
    .unwrap();
    std::fs::write(ray_tmp.path().join("gpu.env"), "NVIDIA_VISIBLE_DEVICES=0\n").unwrap();
    let mut escaped = Vec::new();
    for (flags, rule) in [
        (
            &["--mount", "type=bind,src=/tmp/ray,dst=/x:rshared"][..],
            "",
        ),
        (&["--mount", "type=bind,src=/tmp/ray,dst=/x:z"], ""),
        (
            &[
                "--mount",
                "type=bind,src=/tmp/ray,dst=/x,bind-propagation=z",
            ],
            "",
        ),
        (&["--env-file", "/tmp/ray/job.env"], "no-job-policy"),
        (&["--env-file", "/tmp/ray/gpu.env"], "gpus"),
    ] {
        let mut argv = vec!["run", "--rm", "--label", &label];
        argv.extend(flags);
        argv.extend([img, "true"]);
        let o = in_ray_container(&t, &[], &argv);
        let created = containers_with(&label);
        if o.status.code() != Some(125) || !created.is_empty() {
            escaped.push(format!("{flags:?}: exit {:?}", o.status.code()));
            force_remove(&created);
        } else if !stderr(&o).contains(&format!("rule {rule}")) {
            // A malformed mount is refused as a bad value, no rule.
            if !rule.is_empty() {
                escaped.push(format!("{flags:?}: {}", stderr(&o).trim()));
            }
        }
    }
    assert!(escaped.is_empty(), "not refused:\n{}", escaped.join("\n"));
    // Control: the same mount and an env file without them run.
    std::fs::write(ray_tmp.path().join("ok.env"), "A=1\n").unwrap();
    let o = in_ray_container(
        &t,
        &[],
        &[
            "run",
            "--rm",
            "--label",
            &label,
            "--env-file",
            "/tmp/ray/ok.env",
            "--mount",
            "type=bind,src=/tmp/ray,dst=/x,bind-propagation=rprivate",
            img,
            "true",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

/// Hole 10: the allowed bind roots are resolved once, by the agent at its
/// start. A worker that turns a root (a folder it can write, as `/tmp/ray`
/// or one in `/private` is the Ray user's) into a link to `/var/lib` after
/// the agent started gains no bind under `/var/lib`.
#[test]
fn a_bind_root_turned_into_a_link_after_the_start_moves_nothing() {
    let img = image();
    let label = unique("escape-root-link");
    assert!(std::path::Path::new("/var/lib/dpkg").is_dir());
    let sb = Sandbox::new();
    let root = sb.path().join("models");
    std::fs::create_dir(&root).unwrap();
    let root = root.display().to_string();
    // The job, in the worker: the root becomes a link, then podman.
    let job = format!("A=1 true && rm -rf {root} && ln -s /var/lib {root} && env A=1");
    let args = format!("run --rm --label {label} -v {root}/dpkg:/d:ro {img} true");
    let r = worker_under_an_agent_with(&sb, &[("ARGUS_SHIM_ALLOWED_BINDS", &root)], &job, &args);
    assert!(
        std::fs::symlink_metadata(&root)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the worker did not swap the root: {r}"
    );
    assert!(
        containers_with(&label).is_empty(),
        "a container was created: {r}"
    );
    assert_eq!(r["code"], 125, "{r}");
    assert!(
        r["stderr"].as_str().unwrap_or("").contains("rule binds"),
        "{r}"
    );
}

/// R-SEC-2 from an engine's side: the agent's writer identity
/// (`ARGUS_AGENT_USER`, 990:990 in the node image) owns the discovery state
/// on the shared root (`/private/ray`), which readers trust because of that
/// owner, and the shared root is a default bind root. With
/// `ARGUS_SHIM_ALLOWED_USERS=*` (documented as "any uid but 0"), an engine
/// run as that uid, or with its group, and `/private` bound would write
/// there as the agent: the planted record is checked on the shared folder
/// (its owner and content), not on the error text. Spellings: leading
/// zeros, `--userns=keep-id`, the group alone. Control: another uid of
/// `*` runs with the same bind.
#[test]
fn no_engine_writes_the_shared_root_as_the_agents_writer_identity() {
    let img = image();
    let label = unique("escape-agent-user");
    let shared = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ray = shared.path().join("ray");
    std::fs::create_dir(&ray).unwrap();
    std::os::unix::fs::chown(&ray, Some(990), Some(990)).unwrap();
    std::fs::set_permissions(&ray, std::fs::Permissions::from_mode(0o775)).unwrap();
    let g = socket_gid().to_string();
    let bind = format!("{}:/private", shared.path().display());
    let extra = [
        "-u",
        "1000:100",
        "--group-add",
        &g,
        "-e",
        "ARGUS_SHIM_ALLOWED_USERS=*",
        "-e",
        "ARGUS_AGENT_USER=990:990",
        "-v",
        &bind,
    ];
    let ray_tmp = tempfile::tempdir().unwrap();
    let t = ray_tmp.path().display().to_string();
    let planted = ray.join("head.json");
    let mut escaped = Vec::new();
    for who in [
        &["-u", "990:990"][..],
        &["-u", "0990:990"],
        &["-u", "990"],
        &["--userns=keep-id:uid=990,gid=990"],
        &["--userns=keep-id:uid=00990,gid=991"],
        &["-u", "991:990"],
        &["-u", "991:0990"],
    ] {
        let mut argv = vec!["run", "--rm", "--label", &label];
        argv.extend(who);
        argv.extend([
            "-v",
            "/private:/private",
            img,
            "/bin/tool",
            "write",
            "/private/ray/head.json",
            "forged",
        ]);
        let o = in_ray_container(&t, &extra, &argv);
        let created = containers_with(&label);
        force_remove(&created);
        if let Ok(meta) = std::fs::metadata(&planted) {
            use std::os::unix::fs::MetadataExt;
            escaped.push(format!(
                "{who:?}: wrote {} as {}:{} ({:?})",
                planted.display(),
                meta.uid(),
                meta.gid(),
                std::fs::read_to_string(&planted).unwrap_or_default()
            ));
            std::fs::remove_file(&planted).unwrap();
        } else if o.status.code() != Some(125) || !created.is_empty() {
            escaped.push(format!("{who:?}: exit {:?}: {}", o.status.code(), show(&o)));
        } else {
            assert!(
                stderr(&o).contains("rule users") || stderr(&o).contains("rule groups"),
                "{who:?}: {}",
                show(&o)
            );
        }
    }
    assert!(escaped.is_empty(), "not refused:\n{}", escaped.join("\n"));
    // Control: `*` does allow another uid, with the same bind.
    let o = in_ray_container(
        &t,
        &extra,
        &[
            "run",
            "--rm",
            "--label",
            &label,
            "-u",
            "991:991",
            "-v",
            "/private:/private",
            img,
            "/bin/tool",
            "id",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o).trim(), "991:991", "{}", show(&o));
}

/// R-SEC-1 and R-SEC-2 (found beyond issue 26's list): a root engine that
/// the operator allows (`ARGUS_SHIM_ALLOWED_USERS=0`, which docs/shim.md
/// offers) holds no capability, so with a writable bind of the shared root
/// it cannot rewrite the agent identity's discovery file in place (the
/// owner would stay the agent's, and readers trust the owner); checked on
/// the file's content and on the engine's own CapEff line.
#[test]
fn a_root_engine_holds_no_capability_and_cannot_rewrite_the_agents_files() {
    use std::os::unix::fs::PermissionsExt;
    let img = image();
    let label = unique("escape-root-caps");
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ray = shared.path().join("ray");
    std::fs::create_dir(&ray).unwrap();
    let record = ray.join("head.json");
    std::fs::write(&record, "real").unwrap();
    for p in [&ray, &record] {
        std::os::unix::fs::chown(p, Some(990), Some(990)).unwrap();
    }
    std::fs::set_permissions(&ray, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o644)).unwrap();
    let g = socket_gid().to_string();
    let bind = format!("{}:/private", shared.path().display());
    let extra = [
        "-u",
        "1000:100",
        "--group-add",
        &g,
        "-e",
        "ARGUS_SHIM_ALLOWED_USERS=0",
        "-e",
        "ARGUS_AGENT_USER=990:990",
        "-v",
        &bind,
    ];
    let ray_tmp = tempfile::tempdir().unwrap();
    let t = ray_tmp.path().display().to_string();
    let run = |tool: &[&str]| {
        let mut argv = vec![
            "run",
            "--rm",
            "--label",
            &label,
            "-u",
            "0",
            "-v",
            "/private:/private",
            img,
        ];
        argv.push("/bin/tool");
        argv.extend(tool);
        let o = in_ray_container(&t, &extra, &argv);
        force_remove(&containers_with(&label));
        o
    };
    let status = run(&["read", "/proc/self/status"]);
    assert_eq!(status.status.code(), Some(0), "{}", show(&status));
    let cap_eff = stdout(&status)
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no CapEff line: {}", show(&status)));
    assert_eq!(
        cap_eff, "0000000000000000",
        "the root engine holds capabilities"
    );
    let _ = run(&["write", "/private/ray/head.json", "forged"]);
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "real",
        "a root engine rewrote the agent's file on the shared root"
    );
    // R-SEC-2 / issue 39: the shared root is the agent user's (as the node
    // image makes it), so a root engine without capabilities cannot rename
    // the discovery folder away and put a root-owned one in its place.
    std::os::unix::fs::chown(shared.path(), Some(990), Some(990)).unwrap();
    let o = run(&["take-folder", "/private/ray"]);
    assert_eq!(stdout(&o).trim(), "refused", "{}", show(&o));
    assert_eq!(std::fs::read_to_string(&record).unwrap(), "real");
    assert!(!shared.path().join("ray.taken").exists());
    // Control: with a root-owned shared root (the old layout) the same
    // engine, as its owner, does take it.
    std::os::unix::fs::chown(shared.path(), Some(0), Some(0)).unwrap();
    let o = run(&["take-folder", "/private/ray"]);
    assert_eq!(stdout(&o).trim(), "taken", "control: {}", show(&o));
    assert!(shared.path().join("ray.taken").join("head.json").exists());
}
