//! Translation of parsed `podman run` options into a Docker create request.
//!
//! Pure: the caller passes what it learnt at the edges (its own container,
//! its uid, its environment, the daemon's runtimes) in [`Context`]. The
//! podman meaning is kept on Docker: `host` namespaces are the *Ray
//! container's* (the caller's) namespaces, bind sources are paths inside the
//! Ray container and are mapped to the host through its own mounts, and GPUs
//! are limited to the ones the Ray container has (SPEC R-SHIM-2, R-SHIM-3).

//!
//! Each `apply_…` function of the submodules translates one group of flags
//! into the [`HostConfig`] and the [`Plan`]; the policy (`super::policy`)
//! checks the same groups on the result.

mod binds;
mod env;
mod gpus;
mod namespaces;
mod resources;
mod user;

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig};

pub use env::parse_env_file;
pub use user::parse_id;
#[cfg(test)]
pub use user::spellings as test_spellings;

use super::args::RunOpts;
use super::labels::{LABEL_JOB, LABEL_OWNER, LABEL_PID, LABEL_RM, LABEL_START};
use super::selfid::SelfContainer;

/// Errors of translation; each names the flag or path it is about.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TranslateError {
    #[error("-v {path}:{target}: {path} is not backed by a host mount of this container (it is on the container's own file system); bind-mount a host directory there (e.g. set TMPDIR under a bind mount), or use --rm without --detach to have it copied in and back")]
    NotHostVisible { path: String, target: String },
    #[error("--gpus {0}: this container has no GPUs to give")]
    NoGpus(String),
    #[error("--gpus {value}: this container has only {have} GPU(s): {list}")]
    TooManyGpus {
        value: String,
        have: usize,
        list: String,
    },
    #[error("invalid value {value:?} for {flag}")]
    BadValue { flag: String, value: String },
    #[error("--runtime {0}: the Docker daemon has no such runtime (it has: {1})")]
    NoRuntime(String, String),
    #[error("{flag} {value}: podman-only mode has no Docker equivalent")]
    Unsupported { flag: String, value: String },
    #[error("-v {path}:{target}: policy: a subfolder of {root}, which Ray and engine containers can write, is refused (rule no-writable-subfolder-bind: a job could swap it for a symlink between the check and the mount); bind the whole folder ({root}), a read-only one such as the model cache, or use --rm without --detach to have it copied in and back")]
    RacySubfolder {
        path: String,
        target: String,
        root: String,
    },
    #[error("-v {path}: the bind source was not resolved before translation")]
    Unresolved { path: String },
    #[error("--env-file {path}: {reason}")]
    EnvFile { path: String, reason: String },
    /// A value no policy setting can allow (the identity rules of R-SEC-1,
    /// a bind the daemon would parse differently): refused under every
    /// policy, naming the rule.
    #[error("policy: {flag} {value} is refused (rule {rule}: {why})")]
    Refused {
        flag: String,
        value: String,
        rule: &'static str,
        why: &'static str,
    },
}

/// What the shim knows about its surroundings.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The Ray container, or None when the shim runs on the host itself.
    pub me: Option<SelfContainer>,
    pub uid: u32,
    pub gid: u32,
    pub env: Vec<(String, String)>,
    /// Runtimes of the daemon (`GET /info`), when a `--runtime` asked for it.
    pub runtimes: Option<Vec<String>>,
    /// Owner label value: the Ray container's id, or `host`.
    pub owner: String,
    pub shim_pid: u32,
    pub shim_start: u64,
    /// The process (pid, start) a detached container lives as long as: the
    /// Ray worker of the calling job, as PID 1 found it (R-SEC-9). `None`:
    /// a detached container lives until removed or the node stops.
    pub lifetime: Option<(u32, u64)>,
    /// The Ray job whose own code asks for the container (PID 1's word):
    /// labelled [`LABEL_JOB`], which the per-job bound counts.
    pub job: Option<u32>,
    /// The caller's supplementary groups, for `--group-add keep-groups`.
    pub groups: Vec<u32>,
    /// Canonical forms of the bind sources (resolved at the edge).
    pub canonical: HashMap<String, String>,
    /// `--env-file` contents, read at the edge.
    pub env_files: HashMap<String, String>,
}

impl Context {
    fn getenv(&self, k: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// A bind whose source is copied in before start and back after exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindCopy {
    pub source: String,
    pub target: String,
    /// Not copied back after the exit.
    pub read_only: bool,
}

/// The outcome of translation.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub body: ContainerCreateBody,
    /// Host-side bind sources, for the policy (path in caller, on host, via volume).
    pub bind_sources: Vec<(String, String, bool)>,
    pub copies: Vec<BindCopy>,
    pub warnings: Vec<String>,
    /// The container's environment as it is built (last set wins).
    pub env: Vec<(String, String)>,
    /// The job's own entries, from `--env-file` lines and `-e` values in
    /// that order, as given (`K=V`, `K` or `PREFIX*`): the policy's
    /// environment rules read these, whichever flag they came from.
    pub job_env: Vec<String>,
}

/// Sets `k=v` in `env`, replacing an earlier value.
fn set_env(env: &mut Vec<(String, String)>, k: &str, v: &str) {
    env.retain(|(n, _)| n != k);
    env.push((k.to_string(), v.to_string()));
}

/// Translates `o` into a create request. `o` must have been parsed; the
/// policy is checked separately on the returned plan.
pub fn translate(o: &RunOpts, ctx: &Context) -> Result<Plan, TranslateError> {
    let mut plan = Plan::default();
    plan.body.hostname = o.hostname.clone();
    let mut hc = HostConfig::default();
    env::apply_env(o, ctx, &mut hc, &mut plan)?;
    binds::apply_binds(o, ctx, &mut hc, &mut plan)?;
    namespaces::apply_namespaces(o, ctx, &mut hc, &mut plan)?;
    user::apply_user(o, ctx, &mut hc, &mut plan)?;
    resources::apply_resources(o, ctx, &mut hc, &mut plan)?;
    gpus::apply_gpus(o, ctx, &mut hc, &mut plan)?;

    // An attached --rm is done by the shim: with AutoRemove a fast
    // container can be gone with its exit code before the wait lands. A
    // detached one has no shim left to do it.
    hc.auto_remove = Some(o.rm && o.detach);

    let mut labels: HashMap<String, String> = HashMap::new();
    for l in &o.labels {
        let (k, v) = l.split_once('=').unwrap_or((l.as_str(), ""));
        labels.insert(k.into(), v.into());
    }
    labels.insert(LABEL_OWNER.into(), ctx.owner.clone());
    labels.insert(LABEL_RM.into(), if o.rm { "1".into() } else { "0".into() });
    // The process whose end removes the container (the janitor's sweep of
    // dead owners): an attached one's shim; a detached one outlives its
    // shim on purpose, but not its job (R-SEC-9): it carries the calling
    // job's Ray worker, and without one only the node-stop sweep removes it.
    let owner = match o.detach {
        false => Some((ctx.shim_pid, ctx.shim_start)),
        true => ctx.lifetime,
    };
    if let Some((pid, start)) = owner {
        labels.insert(LABEL_PID.into(), pid.to_string());
        labels.insert(LABEL_START.into(), start.to_string());
    }
    if let Some(job) = ctx.job {
        labels.insert(LABEL_JOB.into(), format!("{job:08x}"));
    }

    let entrypoint = o.entrypoint.as_ref().map(|e| {
        if e.starts_with('[') {
            serde_json::from_str::<Vec<String>>(e).unwrap_or_else(|_| vec![e.clone()])
        } else {
            vec![e.clone()]
        }
    });
    let attach = !o.detach;
    plan.body = ContainerCreateBody {
        image: Some(o.image.clone()),
        cmd: if o.command.is_empty() {
            None
        } else {
            Some(o.command.clone())
        },
        entrypoint,
        env: Some(
            std::mem::take(&mut plan.env)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        ),
        labels: Some(labels),
        user: plan.body.user.take(),
        working_dir: o.workdir.clone(),
        hostname: plan.body.hostname.take(),
        tty: Some(o.tty),
        open_stdin: Some(o.interactive),
        stdin_once: Some(o.interactive && attach),
        attach_stdin: Some(o.interactive && attach),
        attach_stdout: Some(attach),
        attach_stderr: Some(attach),
        stop_signal: o.stop_signal.clone(),
        stop_timeout: match &o.stop_timeout {
            Some(t) => Some(t.parse().map_err(|_| TranslateError::BadValue {
                flag: "--stop-timeout".into(),
                value: t.clone(),
            })?),
            None => None,
        },
        host_config: Some(hc),
        ..Default::default()
    };
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use bollard::models::ContainerInspectResponse;

    use super::*;
    use crate::args::{parse, Command};
    use crate::selfid::{to_host, Gpus, HostPath};

    fn run_opts(argv: &[&str]) -> RunOpts {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        match parse(&argv).unwrap() {
            Command::Run(o) => *o,
            c => panic!("not run: {c:?}"),
        }
    }

    fn fixture(name: &str) -> SelfContainer {
        let path = format!(
            "{}/../tests/fixtures/shim/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let v: Vec<ContainerInspectResponse> = serde_json::from_str(&text).unwrap();
        SelfContainer::from_inspect(&v[0])
    }

    /// [`super::translate`] with the bind sources of `o` resolved
    /// lexically, as if nothing in these tests' imaginary Ray container
    /// were a symlink (the real resolution is `shim::resolve`'s).
    fn translate(o: &RunOpts, ctx: &Context) -> Result<Plan, TranslateError> {
        let mut ctx = ctx.clone();
        for v in o.volumes.iter().filter(|v| v.is_path()) {
            let c = crate::selfid::normalize(&Path::new("/").join(&v.source));
            ctx.canonical
                .entry(v.source.clone())
                .or_insert_with(|| c.display().to_string());
        }
        super::translate(o, &ctx)
    }

    fn ctx(me: Option<SelfContainer>) -> Context {
        Context {
            me,
            uid: 1000,
            gid: 100,
            env: vec![
                ("RAY_JOB_ID".into(), "02000000".into()),
                ("HOME".into(), "/home/ray".into()),
            ],
            owner: "owner".into(),
            shim_pid: 4242,
            shim_start: 77,
            ..Default::default()
        }
    }

    #[test]
    fn fixture_mounts_map_longest_prefix_bind_and_volume() {
        let me = fixture("ray-node-inspect.json");
        assert_eq!(me.network_mode, "default");
        // /tmp is a volume, /tmp/ray a bind inside it: the longer one wins.
        assert_eq!(
            to_host(Some(&me), Path::new("/tmp/ray/session_1/sockets")),
            HostPath::At {
                path: "/tmp/argus-shim-fixture/ray-tmp/session_1/sockets".into(),
                read_only: false,
                via_volume: false,
                inside: Some("/tmp/ray".into()),
            }
        );
        assert_eq!(
            to_host(Some(&me), Path::new("/tmp/tmpabc")),
            HostPath::At {
                path: "/var/lib/docker/volumes/raytmp/_data/tmpabc".into(),
                read_only: false,
                via_volume: true,
                inside: Some("/tmp".into()),
            }
        );
        // Component-wise: /data is not a prefix of /database.
        assert_eq!(
            to_host(Some(&me), Path::new("/database/x")),
            HostPath::NotVisible
        );
        assert_eq!(
            to_host(Some(&me), Path::new("/data")),
            HostPath::At {
                path: "/tmp/argus-shim-fixture/data".into(),
                read_only: true,
                via_volume: false,
                inside: None,
            }
        );
        // The container's own overlay is not visible.
        assert_eq!(
            to_host(Some(&me), Path::new("/home/ray")),
            HostPath::NotVisible
        );
        // tmpfs is not host-visible.
        assert_eq!(
            to_host(Some(&me), Path::new("/dev/shm/x")),
            HostPath::NotVisible
        );
        assert_eq!(me.gpus, Gpus::List(vec!["1".into(), "3".into()]));
    }

    #[test]
    fn ray_worker_command_translates_to_the_ray_containers_namespaces() {
        let me = fixture("ray-node-inspect.json");
        let id = me.id.clone();
        let argv = crate::args::tests::ray_worker_argv();
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        let plan = translate(&o, &ctx(Some(me))).unwrap();
        let hc = plan.body.host_config.as_ref().unwrap();
        assert_eq!(
            hc.network_mode.as_deref(),
            Some(format!("container:{id}").as_str())
        );
        assert_eq!(
            hc.pid_mode.as_deref(),
            Some(format!("container:{id}").as_str())
        );
        // The fixture's IPC mode is private: cannot be joined.
        assert_eq!(hc.ipc_mode.as_deref(), Some("private"));
        assert!(plan.warnings.iter().any(|w| w.contains("--ipc=host")));
        // Ray's --cgroup-manager is noted for PID 1's log, not warned of
        // on the job's stderr.
        assert!(!plan.warnings.iter().any(|w| w.contains("--cgroup-manager")));
        assert_eq!(
            hc.binds.as_ref().unwrap(),
            &vec!["/tmp/argus-shim-fixture/ray-tmp:/tmp/ray".to_string()]
        );
        assert_eq!(plan.body.user.as_deref(), Some("1000:100"));
        assert_eq!(plan.body.entrypoint, Some(vec!["python".to_string()]));
        let env = plan.body.env.unwrap();
        assert!(env.contains(&"FOO=a b $HOME".to_string()));
        assert!(env.contains(&"RAY_JOB_ID=01000000".to_string()));
        assert_eq!(hc.auto_remove, Some(false));
        let labels = plan.body.labels.unwrap();
        assert_eq!(labels[LABEL_OWNER], "owner");
        assert_eq!(labels[LABEL_PID], "4242");
        assert_eq!(labels[LABEL_RM], "0");
    }

    #[test]
    fn unexpanded_ray_job_id_is_expanded_from_env() {
        let o = run_opts(&[
            "run",
            "--env",
            "RAY_JOB_ID=$RAY_JOB_ID",
            "--env",
            "X=$HOME",
            "img",
        ]);
        let plan = translate(&o, &ctx(None)).unwrap();
        let env = plan.body.env.unwrap();
        assert!(env.contains(&"RAY_JOB_ID=02000000".to_string()));
        assert!(env.contains(&"X=$HOME".to_string()));
    }

    #[test]
    fn on_the_host_host_means_host() {
        let o = run_opts(&[
            "run",
            "--network=host",
            "--pid=host",
            "--ipc=host",
            "-v",
            "/srv/x:/x:Z",
            "img",
        ]);
        let plan = translate(&o, &ctx(None)).unwrap();
        let hc = plan.body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("host"));
        assert_eq!(hc.pid_mode.as_deref(), Some("host"));
        assert_eq!(hc.ipc_mode.as_deref(), Some("host"));
        assert_eq!(hc.binds.unwrap(), vec!["/srv/x:/x".to_string()]);
    }

    #[test]
    fn shareable_ipc_is_joined_and_host_network_drops_hostname() {
        let mut me = fixture("ray-node-inspect.json");
        me.ipc_mode = "shareable".into();
        let id = me.id.clone();
        let o = run_opts(&[
            "run",
            "--ipc=host",
            "--network=host",
            "--hostname",
            "h",
            "img",
        ]);
        let plan = translate(&o, &ctx(Some(me))).unwrap();
        assert_eq!(
            plan.body.host_config.unwrap().ipc_mode.unwrap(),
            format!("container:{id}")
        );
        assert_eq!(plan.body.hostname, None);
    }

    #[test]
    fn not_host_visible_bind_is_copied_for_rm_else_refused() {
        let me = fixture("ray-node-inspect.json");
        let o = run_opts(&["run", "--rm", "-v", "/home/ray/tmpx:/shared:Z", "img"]);
        let plan = translate(&o, &ctx(Some(me.clone()))).unwrap();
        assert_eq!(
            plan.copies,
            vec![BindCopy {
                read_only: false,
                source: "/home/ray/tmpx".into(),
                target: "/shared".into()
            }]
        );
        assert!(plan.body.host_config.unwrap().binds.is_none());
        let o = run_opts(&["run", "-v", "/home/ray/tmpx:/shared", "img"]);
        let err = translate(&o, &ctx(Some(me))).unwrap_err();
        assert!(err.to_string().contains("/home/ray/tmpx"), "{err}");
    }

    #[test]
    fn read_only_mount_of_the_ray_container_stays_read_only() {
        let me = fixture("ray-node-inspect.json");
        let o = run_opts(&["run", "-v", "/data/in:/in", "img"]);
        let plan = translate(&o, &ctx(Some(me))).unwrap();
        assert_eq!(
            plan.body.host_config.unwrap().binds.unwrap(),
            vec!["/tmp/argus-shim-fixture/data/in:/in:ro".to_string()]
        );
    }

    /// Hole 13: every spelling Docker's CLI reads as read-only is read-only
    /// here, every one it reads as writable is writable, and anything else
    /// is refused; never one taken for the other.
    #[test]
    fn read_only_spellings_mean_what_docker_reads() {
        let binds = |argv: &[&str]| -> Result<Vec<String>, String> {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let o = match parse(&argv).map_err(|e| e.to_string())? {
                Command::Run(o) => o,
                _ => panic!(),
            };
            let plan = translate(&o, &ctx(None)).map_err(|e| e.to_string())?;
            Ok(plan.body.host_config.unwrap().binds.unwrap_or_default())
        };
        let mount = |opt: &str| {
            binds(&[
                "run",
                "--mount",
                &format!("type=bind,src=/srv/m,dst=/m{opt}"),
                "i",
            ])
        };
        for opt in [
            ",readonly",
            ",ro",
            ",readonly=true",
            ",readonly=1",
            ",ro=true",
            ",ro=1",
            ",readonly=t",
            ",readonly=T",
            ",readonly=TRUE",
            ",readonly=True",
        ] {
            assert_eq!(mount(opt), Ok(vec!["/srv/m:/m:ro".to_string()]), "{opt}");
        }
        for opt in [
            "",
            ",readonly=false",
            ",readonly=0",
            ",ro=f",
            ",ro=F",
            ",readonly=FALSE",
            ",readonly=False",
        ] {
            assert_eq!(mount(opt), Ok(vec!["/srv/m:/m".to_string()]), "{opt}");
        }
        for opt in [
            ",readonly=yes",
            ",readonly=on",
            ",ro=2",
            ",readonly=",
            ",ro=tRuE",
            ",ro,readonly=false",
            ",ro=false,ro",
        ] {
            assert!(mount(opt).is_err(), "{opt}: {:?}", mount(opt));
        }
        assert_eq!(
            binds(&["run", "-v", "/srv/m:/m:ro", "i"]),
            Ok(vec!["/srv/m:/m:ro".to_string()])
        );
        assert!(binds(&["run", "-v", "/srv/m:/m:ro,rw", "i"]).is_err());
        assert!(binds(&["run", "-v", "/srv/m:/m:readonly", "i"]).is_err());
        // SELinux relabels never reach the daemon (a relabel of a host path
        // is a write to it); Ray's own probe sends `:Z`.
        for spec in ["/srv/m:/m:z", "/srv/m:/m:Z", "/srv/m:/m:ro,Z"] {
            let b = binds(&["run", "-v", spec, "i"]).unwrap();
            assert!(
                b.iter()
                    .all(|b| !b.split(':').nth(2).unwrap_or("").contains(['z', 'Z'])),
                "{spec}: {b:?}"
            );
        }
        for opt in [",z", ",Z", ",relabel=shared", ",relabel=private"] {
            assert_eq!(mount(opt), Ok(vec!["/srv/m:/m".to_string()]), "{opt}");
        }
    }

    /// Hole 9: a `:` in a source or target would be Docker's options
    /// separator; a propagation mode only through its own, checked key.
    #[test]
    fn nothing_is_smuggled_into_a_bind_through_a_colon() {
        let translated = |argv: &[&str]| -> Result<Plan, String> {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let o = match parse(&argv).map_err(|e| e.to_string())? {
                Command::Run(o) => o,
                _ => panic!(),
            };
            translate(&o, &ctx(None)).map_err(|e| e.to_string())
        };
        for spec in [
            "type=bind,src=/srv/m,dst=/x:rshared",
            "type=bind,src=/srv/m,target=/x:shared",
            "type=bind,src=/srv/m,dst=/x:z",
            "type=bind,src=/srv/m,dst=/x:ro:rshared",
            "type=bind,src=/srv/m:/etc,dst=/x",
            "type=bind,src=/srv/m:rshared,dst=/x",
            "type=volume,src=cache,dst=/x:rshared",
            "type=tmpfs,dst=/x:suid",
            "type=bind,src=/srv/m,dst=/x,bind-propagation=z",
            "type=bind,src=/srv/m,dst=/x,bind-propagation=RSHARED",
            "type=bind,src=/srv/m,dst=/x,bind-propagation=ro",
        ] {
            let r = translated(&["run", "--mount", spec, "i"]);
            assert!(r.is_err(), "{spec}: {:?}", r.map(|p| p.body.host_config));
        }
        for spec in ["/srv/m:/x:rshared:z", "/srv/m::/x", "/srv/m:x:ro"] {
            assert!(translated(&["run", "-v", spec, "i"]).is_err(), "{spec}");
        }
        // A canonical source that holds a `:` (a folder named so).
        let argv: Vec<String> = ["run", "-v", "/srv/m:/x", "i"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        let mut c = ctx(None);
        c.canonical
            .insert("/srv/m".into(), "/srv/a:/etc:rshared".into());
        assert!(matches!(
            super::translate(&o, &c),
            Err(TranslateError::Refused { rule: "binds", .. })
        ));
        // The explicit key is kept, for the policy to check.
        let p = translated(&[
            "run",
            "--mount",
            "type=bind,src=/srv/m,dst=/x,bind-propagation=rprivate",
            "i",
        ])
        .unwrap();
        assert_eq!(
            p.body.host_config.unwrap().binds.unwrap(),
            vec!["/srv/m:/x:rprivate".to_string()]
        );
    }

    #[test]
    fn gpus_are_limited_to_the_callers() {
        let me = fixture("ray-node-inspect.json");
        let c = ctx(Some(me));
        let dr = |argv: &[&str]| {
            translate(&run_opts(argv), &c)
                .map(|p| p.body.host_config.unwrap().device_requests.unwrap()[0].clone())
        };
        assert_eq!(
            dr(&["run", "--gpus", "all", "i"]).unwrap().device_ids,
            Some(vec!["1".into(), "3".into()])
        );
        assert_eq!(
            dr(&["run", "--gpus", "1", "i"]).unwrap().device_ids,
            Some(vec!["1".into()])
        );
        assert_eq!(
            dr(&["run", "--gpus", "device=1", "i"]).unwrap().device_ids,
            Some(vec!["3".into()])
        );
        assert!(matches!(
            dr(&["run", "--gpus", "3", "i"]),
            Err(TranslateError::TooManyGpus { .. })
        ));
        assert!(matches!(
            dr(&["run", "--gpus", "x", "i"]),
            Err(TranslateError::BadValue { .. })
        ));
        // Counts are bounded before any list is built (issue 9, item 8).
        let all = ctx(None);
        for v in ["257", "18446744073709551615", "99999999999999999999999"] {
            assert!(
                matches!(
                    translate(&run_opts(&["run", "--gpus", v, "i"]), &all),
                    Err(TranslateError::BadValue { .. })
                ),
                "{v}"
            );
        }
        let many = format!("device={}", vec!["0"; 300].join(","));
        assert!(translate(&run_opts(&["run", "--gpus", &many, "i"]), &all).is_err());
        let plan = translate(
            &run_opts(&["run", "-e", "NVIDIA_VISIBLE_DEVICES=all", "i"]),
            &c,
        )
        .unwrap();
        assert!(plan
            .body
            .env
            .unwrap()
            .contains(&"NVIDIA_VISIBLE_DEVICES=1,3".to_string()));
        // On the host (all GPUs) nothing is limited.
        let plan = translate(&run_opts(&["run", "--gpus", "all", "i"]), &ctx(None)).unwrap();
        assert_eq!(
            plan.body.host_config.unwrap().device_requests.unwrap()[0].count,
            Some(-1)
        );
    }

    #[test]
    fn runtime_is_checked_against_the_daemon() {
        let mut c = ctx(None);
        c.runtimes = Some(vec!["runc".into()]);
        let err = translate(&run_opts(&["run", "--runtime=nvidia", "i"]), &c).unwrap_err();
        assert_eq!(
            err,
            TranslateError::NoRuntime("nvidia".into(), "runc".into())
        );
        let plan = translate(&run_opts(&["run", "--runtime=/usr/bin/runc", "i"]), &c).unwrap();
        assert_eq!(
            plan.body.host_config.unwrap().runtime.as_deref(),
            Some("runc")
        );
    }

    #[test]
    fn resource_and_restart_flags_map_to_host_config() {
        let mut c = ctx(None);
        c.groups = vec![27, 100];
        let o = run_opts(&[
            "run",
            "--ulimit",
            "nofile=1024:2048",
            "--restart",
            "on-failure:3",
            "--cgroupns",
            "host",
            "--cpuset-cpus",
            "0-1",
            "--log-driver",
            "json-file",
            "--log-opt",
            "max-size=1m",
            "i",
        ]);
        let hc = translate(&o, &c).unwrap().body.host_config.unwrap();
        let u = &hc.ulimits.unwrap()[0];
        assert_eq!(
            (u.name.as_deref(), u.soft, u.hard),
            (Some("nofile"), Some(1024), Some(2048))
        );
        assert_eq!(hc.restart_policy.unwrap().maximum_retry_count, Some(3));
        assert_eq!(hc.cpuset_cpus.as_deref(), Some("0-1"));
        // No supplementary group, explicitly (see `user`).
        assert_eq!(hc.group_add.unwrap(), Vec::<String>::new());
        for g in ["keep-groups", "video", "27"] {
            assert!(matches!(
                translate(&run_opts(&["run", "--group-add", g, "i"]), &c),
                Err(TranslateError::Refused { rule: "groups", .. })
            ));
        }
        assert_eq!(hc.log_config.unwrap().config.unwrap()["max-size"], "1m");
        assert!(translate(&run_opts(&["run", "--rm", "--restart", "always", "i"]), &c).is_err());
        assert!(translate(&run_opts(&["run", "--ulimit", "nofile", "i"]), &c).is_err());
    }

    #[test]
    fn userns_keep_id_with_explicit_ids_and_env_host() {
        let o = run_opts(&[
            "run",
            "--userns=keep-id:uid=5,gid=6",
            "--env-host",
            "-e",
            "HOME=/x",
            "i",
        ]);
        let plan = translate(&o, &ctx(None)).unwrap();
        assert_eq!(plan.body.user.as_deref(), Some("5:6"));
        let env = plan.body.env.unwrap();
        assert!(env.contains(&"RAY_JOB_ID=02000000".to_string()));
        assert!(env.contains(&"HOME=/x".to_string()));
        assert!(translate(&run_opts(&["run", "--userns=auto", "i"]), &ctx(None)).is_err());
    }

    #[test]
    fn interactive_and_detached_set_attach_fields() {
        let p = translate(&run_opts(&["run", "-i", "i"]), &ctx(None)).unwrap();
        assert_eq!(
            (p.body.open_stdin, p.body.stdin_once, p.body.attach_stdin),
            (Some(true), Some(true), Some(true))
        );
        let p = translate(&run_opts(&["run", "--rm", "-i", "i"]), &ctx(None)).unwrap();
        assert_eq!(
            p.body.host_config.unwrap().auto_remove,
            Some(false),
            "the shim removes it"
        );
        let p = translate(&run_opts(&["run", "-d", "--rm", "i"]), &ctx(None)).unwrap();
        assert_eq!(
            p.body.host_config.unwrap().auto_remove,
            Some(true),
            "nobody is left to remove it"
        );
        let p = translate(&run_opts(&["run", "-d", "-i", "i"]), &ctx(None)).unwrap();
        assert_eq!(
            (p.body.open_stdin, p.body.stdin_once, p.body.attach_stdout),
            (Some(true), Some(false), Some(false))
        );
        assert!(!p.body.labels.unwrap().contains_key(LABEL_PID));
    }

    #[test]
    fn the_job_label_is_pid_1s_word_never_the_callers_environment() {
        // The caller's environment names job 02000000: no label from it.
        let labels = translate(&run_opts(&["run", "-d", "i"]), &ctx(None))
            .unwrap()
            .body
            .labels
            .unwrap();
        assert!(!labels.contains_key(LABEL_JOB), "{labels:?}");
        let mut c = ctx(None);
        c.job = Some(0x0a);
        for args in [&["run", "-d", "i"][..], &["run", "i"][..]] {
            let labels = translate(&run_opts(args), &c).unwrap().body.labels.unwrap();
            assert_eq!(labels[LABEL_JOB], "0000000a", "{args:?}");
        }
        // A job's own label of that name is refused by the policy's
        // reserved prefixes; here it is overwritten all the same.
        let o = run_opts(&["run", "--label", "io.argus.shim.job=00000001", "i"]);
        let labels = translate(&o, &c).unwrap().body.labels.unwrap();
        assert_eq!(labels[LABEL_JOB], "0000000a");
    }

    #[test]
    fn a_detached_container_carries_its_jobs_worker_never_its_shim() {
        let mut c = ctx(None);
        c.lifetime = Some((77, 9001));
        // Detached: the job's worker, whose end removes it (R-SEC-9).
        let labels = translate(&run_opts(&["run", "-d", "i"]), &c)
            .unwrap()
            .body
            .labels
            .unwrap();
        assert_eq!(
            (&labels[LABEL_PID][..], &labels[LABEL_START][..]),
            ("77", "9001")
        );
        // Attached: its shim, as before, whatever the worker.
        let labels = translate(&run_opts(&["run", "i"]), &c)
            .unwrap()
            .body
            .labels
            .unwrap();
        assert_eq!(labels[LABEL_PID], "4242");
        assert_ne!(labels[LABEL_START], "9001");
    }

    #[test]
    fn subfolders_of_writable_mounts_are_copied_or_refused_never_bound() {
        // The fixture: /tmp/ray a read-write bind, /tmp a read-write volume,
        // /data a read-only bind.
        let c = ctx(Some(fixture("ray-node-inspect.json")));
        // A whole mount is bound, and anything in a read-only one.
        for argv in [
            vec!["run", "-d", "-v", "/tmp/ray:/tmp/ray", "i"],
            vec!["run", "-d", "-v", "/data/models/x:/m", "i"],
        ] {
            let plan = translate(&run_opts(&argv), &c).unwrap();
            assert!(plan.copies.is_empty(), "{argv:?}");
            assert_eq!(plan.body.host_config.unwrap().binds.unwrap().len(), 1);
        }
        // A subfolder of a writable mount: detached, refused naming the
        // rule and the mount.
        let err = translate(&run_opts(&["run", "-d", "-v", "/tmp/ray/x:/x", "i"]), &c).unwrap_err();
        assert!(
            matches!(err, TranslateError::RacySubfolder { ref root, .. } if root == "/tmp/ray")
        );
        assert!(
            err.to_string().contains("rule no-writable-subfolder-bind"),
            "{err}"
        );
        // Attached --rm: copied in, and back unless read-only.
        let plan = translate(
            &run_opts(&[
                "run",
                "--rm",
                "-v",
                "/tmp/ray/x:/x",
                "-v",
                "/tmp/y:/y:ro",
                "i",
            ]),
            &c,
        )
        .unwrap();
        assert_eq!(plan.copies.len(), 2);
        assert!(!plan.copies[0].read_only && plan.copies[1].read_only);
        assert!(plan.body.host_config.unwrap().binds.is_none());
    }
}
