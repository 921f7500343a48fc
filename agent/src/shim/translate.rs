//! Translation of parsed `podman run` options into a Docker create request.
//!
//! Pure: the caller passes what it learnt at the edges (its own container,
//! its uid, its environment, the daemon's runtimes) in [`Context`]. The
//! podman meaning is kept on Docker: `host` namespaces are the *Ray
//! container's* (the caller's) namespaces, bind sources are paths inside the
//! Ray container and are mapped to the host through its own mounts, and GPUs
//! are limited to the ones the Ray container has (SPEC R-SHIM-2, R-SHIM-3).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, DeviceMapping, DeviceRequest, HostConfig,
    MountPointTypeEnum,
};

use super::args::{unexpanded_ray_var, RunOpts};

/// Label keys on every container the shim creates (R-SHIM-4).
pub const LABEL_OWNER: &str = "io.argus.shim.owner";
pub const LABEL_PID: &str = "io.argus.shim.pid";
pub const LABEL_START: &str = "io.argus.shim.pid-start";
pub const LABEL_RM: &str = "io.argus.shim.rm";

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
    #[error("--env-file {path}: {reason}")]
    EnvFile { path: String, reason: String },
}

/// A mount of the Ray container, from its inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfMount {
    pub kind: MountKind,
    pub source: String,
    pub destination: String,
    pub rw: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    Bind,
    Volume,
    Other,
}

/// The GPUs the caller has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// Every GPU of the host (the shim runs on the host, or the Ray container
    /// got `--gpus all`).
    All,
    /// These device ids (indices or UUIDs), in the order the caller sees them.
    List(Vec<String>),
}

/// The Ray container the shim runs in, as far as translation needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfContainer {
    pub id: String,
    pub network_mode: String,
    pub pid_mode: String,
    pub ipc_mode: String,
    pub uts_mode: String,
    pub hostname: String,
    pub mounts: Vec<SelfMount>,
    pub gpus: Gpus,
}

impl SelfContainer {
    /// Extracts what translation needs from `GET /containers/{id}/json`.
    pub fn from_inspect(i: &ContainerInspectResponse) -> SelfContainer {
        let hc = i.host_config.clone().unwrap_or_default();
        let cfg = i.config.clone().unwrap_or_default();
        let mounts = i
            .mounts
            .iter()
            .flatten()
            .map(|m| SelfMount {
                kind: match m.typ {
                    Some(MountPointTypeEnum::BIND) => MountKind::Bind,
                    Some(MountPointTypeEnum::VOLUME) => MountKind::Volume,
                    _ => MountKind::Other,
                },
                source: m.source.clone().unwrap_or_default(),
                destination: m.destination.clone().unwrap_or_default(),
                rw: m.rw.unwrap_or(false),
            })
            .collect();
        let env_gpus = cfg.env.iter().flatten().find_map(|e| {
            e.strip_prefix("NVIDIA_VISIBLE_DEVICES=")
                .map(str::to_string)
        });
        let mut gpus = Gpus::List(vec![]);
        for r in hc.device_requests.iter().flatten() {
            let is_gpu = r
                .driver
                .as_deref()
                .is_none_or(|d| d.is_empty() || d == "nvidia")
                || r.capabilities
                    .iter()
                    .flatten()
                    .flatten()
                    .any(|c| c == "gpu");
            if !is_gpu {
                continue;
            }
            if r.count == Some(-1) {
                gpus = Gpus::All;
            } else if let Some(ids) = &r.device_ids {
                if let Gpus::List(l) = &mut gpus {
                    l.extend(ids.iter().flat_map(|s| s.split(',')).map(str::to_string));
                }
            } else if let Some(n) = r.count {
                if let Gpus::List(l) = &mut gpus {
                    l.extend((0..n).map(|i| i.to_string()));
                }
            }
        }
        if gpus == Gpus::List(vec![]) && (hc.runtime.as_deref() == Some("nvidia")) {
            gpus = match env_gpus.as_deref() {
                Some("all") => Gpus::All,
                Some("none") | Some("void") | Some("") | None => Gpus::List(vec![]),
                Some(list) => Gpus::List(list.split(',').map(str::to_string).collect()),
            };
        }
        SelfContainer {
            id: i.id.clone().unwrap_or_default(),
            network_mode: hc.network_mode.unwrap_or_default(),
            pid_mode: hc.pid_mode.unwrap_or_default(),
            ipc_mode: hc.ipc_mode.unwrap_or_default(),
            uts_mode: hc.uts_mode.unwrap_or_default(),
            hostname: cfg.hostname.unwrap_or_default(),
            mounts,
            gpus,
        }
    }
}

/// Where a caller path lives on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPath {
    /// At this host path; `read_only` when the Ray container's mount is.
    At {
        path: String,
        read_only: bool,
        via_volume: bool,
    },
    /// Nowhere: the path is on the Ray container's own file system or tmpfs.
    NotVisible,
}

/// Returns true if and only if `prefix` is `path` or a path-component
/// prefix of it (`/data` is a prefix of `/data/x`, not of `/database`).
fn is_path_prefix(prefix: &Path, path: &Path) -> bool {
    path.starts_with(prefix)
}

/// Lexically normalises an absolute path (`.` and `..`), for paths that do
/// not exist yet and so cannot be canonicalised.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Maps a caller path (already canonical) to the host through `me`'s mounts:
/// the mount with the longest destination that is a path prefix wins.
pub fn to_host(me: Option<&SelfContainer>, path: &Path) -> HostPath {
    let Some(me) = me else {
        return HostPath::At {
            path: path.display().to_string(),
            read_only: false,
            via_volume: false,
        };
    };
    let best = me
        .mounts
        .iter()
        .filter(|m| is_path_prefix(Path::new(&m.destination), path))
        .max_by_key(|m| Path::new(&m.destination).components().count());
    match best {
        Some(m) if m.kind != MountKind::Other && !m.source.is_empty() => {
            let suffix = path.strip_prefix(&m.destination).unwrap_or(Path::new(""));
            let host = if suffix.as_os_str().is_empty() {
                PathBuf::from(&m.source)
            } else {
                Path::new(&m.source).join(suffix)
            };
            HostPath::At {
                path: host.display().to_string(),
                read_only: !m.rw,
                via_volume: m.kind == MountKind::Volume,
            }
        }
        _ => HostPath::NotVisible,
    }
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
pub struct Copy {
    pub source: String,
    pub target: String,
}

/// The outcome of translation.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub body: ContainerCreateBody,
    /// Host-side bind sources, for the policy (path in caller, on host, via volume).
    pub bind_sources: Vec<(String, String, bool)>,
    pub copies: Vec<Copy>,
    pub warnings: Vec<String>,
}

/// Maps podman's `host` namespace to the caller's namespace on Docker.
fn caller_ns(me: Option<&SelfContainer>, self_mode: impl Fn(&SelfContainer) -> &str) -> String {
    match me {
        None => "host".into(),
        Some(m) if self_mode(m) == "host" => "host".into(),
        Some(m) => format!("container:{}", m.id),
    }
}

fn gpu_ids(flag: &str, value: &str, have: &Gpus) -> Result<Option<Vec<String>>, TranslateError> {
    // None = all host GPUs; Some(list) = exactly these.
    let list = match have {
        Gpus::All => None,
        Gpus::List(l) => Some(l.clone()),
    };
    let value_s = value.trim_matches('"');
    if value_s == "all" {
        return match list {
            Some(l) if l.is_empty() => Err(TranslateError::NoGpus(value.into())),
            other => Ok(other),
        };
    }
    if let Some(devs) = value_s.strip_prefix("device=") {
        let wanted: Vec<&str> = devs.split(',').collect();
        let Some(l) = list else {
            return Ok(Some(wanted.iter().map(|s| s.to_string()).collect()));
        };
        let mut out = Vec::new();
        for w in wanted {
            // Indices are the caller's (0..n inside the Ray container).
            let id = match w.parse::<usize>() {
                Ok(i) => l.get(i).cloned(),
                Err(_) => l.iter().find(|x| *x == w).cloned(),
            };
            out.push(id.ok_or_else(|| TranslateError::TooManyGpus {
                value: value.into(),
                have: l.len(),
                list: l.join(","),
            })?);
        }
        return Ok(Some(out));
    }
    let n: usize = value_s.parse().map_err(|_| TranslateError::BadValue {
        flag: flag.into(),
        value: value.into(),
    })?;
    match list {
        None => Ok(Some((0..n).map(|i| i.to_string()).collect())),
        Some(l) if n <= l.len() && n > 0 => Ok(Some(l[..n].to_vec())),
        Some(l) if l.is_empty() => Err(TranslateError::NoGpus(value.into())),
        Some(l) => Err(TranslateError::TooManyGpus {
            value: value.into(),
            have: l.len(),
            list: l.join(","),
        }),
    }
}

fn parse_size(flag: &str, v: &str) -> Result<i64, TranslateError> {
    let bad = || TranslateError::BadValue {
        flag: flag.into(),
        value: v.into(),
    };
    let lower = v.to_ascii_lowercase();
    let t = lower.trim_end_matches('b');
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1024i64),
        Some('m') => (&t[..t.len() - 1], 1024 * 1024),
        Some('g') => (&t[..t.len() - 1], 1024 * 1024 * 1024),
        _ => (t, 1),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    if n < 0.0 {
        return Err(bad());
    }
    Ok((n * mult as f64) as i64)
}

/// Parses a `KEY=VALUE` env file the way podman does (comments, blank
/// lines, bare `KEY` copies from the caller).
pub fn parse_env_file(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Translates `o` into a create request. `o` must have been parsed; the
/// policy is checked separately on the returned plan.
pub fn translate(o: &RunOpts, ctx: &Context) -> Result<Plan, TranslateError> {
    let me = ctx.me.as_ref();
    let mut plan = Plan::default();
    for f in &o.ignored {
        plan.warnings
            .push(format!("{f} has no meaning on Docker and is ignored"));
    }

    // Environment: --env-host, proxies, env files, then -e (last wins).
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: &str, v: &str| {
        env.retain(|(n, _)| n != k);
        env.push((k.to_string(), v.to_string()));
    };
    if o.env_host {
        for (k, v) in &ctx.env {
            set(&mut env, k, v);
        }
    }
    if o.http_proxy {
        for k in [
            "http_proxy",
            "https_proxy",
            "ftp_proxy",
            "no_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "FTP_PROXY",
            "NO_PROXY",
        ] {
            if let Some(v) = ctx.getenv(k) {
                set(&mut env, k, v);
            }
        }
    }
    let mut entries: Vec<String> = Vec::new();
    for path in &o.env_files {
        let text = ctx
            .env_files
            .get(path)
            .ok_or_else(|| TranslateError::EnvFile {
                path: path.clone(),
                reason: "cannot be read".into(),
            })?;
        entries.extend(parse_env_file(text));
    }
    entries.extend(o.env.iter().cloned());
    for e in entries {
        match e.split_once('=') {
            Some((k, v)) => {
                let v = match unexpanded_ray_var(v) {
                    Some(name) => ctx.getenv(name).unwrap_or(v).to_string(),
                    None => v.to_string(),
                };
                set(&mut env, k, &v);
            }
            None => {
                if let Some(prefix) = e.strip_suffix('*') {
                    for (k, v) in ctx.env.iter().filter(|(k, _)| k.starts_with(prefix)) {
                        set(&mut env, k, v);
                    }
                } else if let Some(v) = ctx.getenv(&e) {
                    set(&mut env, &e, v);
                }
            }
        }
    }

    let mut hc = HostConfig::default();

    // Binds, translated through the Ray container's mounts.
    let mut binds = Vec::new();
    for v in &o.volumes {
        if v.source.is_empty() || !v.is_path() {
            // Anonymous or named volume: a name on the host daemon.
            let mut spec = if v.source.is_empty() {
                v.target.clone()
            } else {
                format!("{}:{}", v.source, v.target)
            };
            if !v.options.is_empty() {
                spec = format!("{spec}:{}", v.options.join(","));
            }
            binds.push(spec);
            continue;
        }
        let canonical = ctx
            .canonical
            .get(&v.source)
            .cloned()
            .unwrap_or_else(|| normalize(Path::new(&v.source)).display().to_string());
        match to_host(me, Path::new(&canonical)) {
            HostPath::At {
                path,
                read_only,
                via_volume,
            } => {
                let mut opts: Vec<String> = v
                    .options
                    .iter()
                    .filter(|o| *o != "ro" && *o != "rw")
                    .cloned()
                    .collect();
                if read_only || v.read_only() {
                    opts.insert(0, "ro".into());
                }
                plan.bind_sources
                    .push((canonical.clone(), path.clone(), via_volume));
                binds.push(if opts.is_empty() {
                    format!("{path}:{}", v.target)
                } else {
                    format!("{path}:{}:{}", v.target, opts.join(","))
                });
            }
            HostPath::NotVisible => {
                if o.rm && !o.detach {
                    plan.copies.push(Copy {
                        source: canonical,
                        target: v.target.clone(),
                    });
                } else {
                    return Err(TranslateError::NotHostVisible {
                        path: v.source.clone(),
                        target: v.target.clone(),
                    });
                }
            }
        }
    }
    if !binds.is_empty() {
        hc.binds = Some(binds);
    }
    if !o.tmpfs.is_empty() {
        hc.tmpfs = Some(
            o.tmpfs
                .iter()
                .map(|t| match t.split_once(':') {
                    Some((d, opts)) => (d.to_string(), opts.to_string()),
                    None => (t.clone(), String::new()),
                })
                .collect(),
        );
    }

    // Namespaces: `host` is the caller's (the Ray container's) namespace.
    let mut hostname = o.hostname.clone();
    let mut shared_net = false;
    if let Some(n) = o.network.as_deref() {
        hc.network_mode = Some(match n {
            "host" => {
                let m = caller_ns(me, |m| &m.network_mode);
                shared_net = true;
                m
            }
            "slirp4netns" | "pasta" | "private" | "bridge" => "bridge".into(),
            "none" => "none".into(),
            n if n.starts_with("ns:")
                || n.starts_with("slirp4netns:")
                || n.starts_with("pasta:") =>
            {
                return Err(TranslateError::Unsupported {
                    flag: "--network".into(),
                    value: n.into(),
                })
            }
            n => {
                shared_net = n.starts_with("container:");
                n.to_string()
            }
        });
    }
    if shared_net {
        // Docker refuses these with a shared network namespace; podman with
        // --network=host ignores them, so they are dropped with a warning.
        if hostname.take().is_some() {
            plan.warnings
                .push("--hostname is ignored with a shared network namespace".into());
        }
        for (flag, set) in [
            ("--publish", &o.publish),
            ("--add-host", &o.add_host),
            ("--dns", &o.dns),
        ] {
            if !set.is_empty() {
                plan.warnings
                    .push(format!("{flag} is ignored with a shared network namespace"));
            }
        }
    } else {
        if !o.add_host.is_empty() {
            hc.extra_hosts = Some(o.add_host.clone());
        }
        if !o.dns.is_empty() {
            hc.dns = Some(o.dns.clone());
        }
        if !o.publish.is_empty() {
            return Err(TranslateError::Unsupported {
                flag: "--publish".into(),
                value: o.publish.join(","),
            });
        }
    }
    if let Some(p) = o.pid.as_deref() {
        hc.pid_mode = Some(match p {
            "host" => caller_ns(me, |m| &m.pid_mode),
            "private" | "" => String::new(),
            p if p.starts_with("container:") => p.into(),
            p => {
                return Err(TranslateError::Unsupported {
                    flag: "--pid".into(),
                    value: p.into(),
                })
            }
        });
    }
    if let Some(i) = o.ipc.as_deref() {
        hc.ipc_mode = Some(match (i, me) {
            ("host", None) => "host".into(),
            ("host", Some(m)) if m.ipc_mode == "host" => "host".into(),
            ("host", Some(m)) if m.ipc_mode == "shareable" => format!("container:{}", m.id),
            ("host", Some(m)) => {
                plan.warnings.push(format!(
                    "--ipc=host: this container's IPC namespace is {:?}, not shareable; using a private one (run the Ray container with --ipc=shareable to share it)",
                    m.ipc_mode
                ));
                "private".into()
            }
            ("private" | "shareable" | "none", _) => i.into(),
            (i, _) if i.starts_with("container:") => i.into(),
            (i, _) => {
                return Err(TranslateError::Unsupported {
                    flag: "--ipc".into(),
                    value: i.into(),
                })
            }
        });
    }
    if let Some(u) = o.uts.as_deref() {
        match (u, me) {
            ("host", None) => hc.uts_mode = Some("host".into()),
            ("host", Some(m)) if m.uts_mode == "host" => hc.uts_mode = Some("host".into()),
            ("host", Some(m)) => {
                if !hc
                    .network_mode
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("container:")
                {
                    hostname = Some(m.hostname.clone());
                }
            }
            ("private" | "", _) => {}
            (u, _) => {
                return Err(TranslateError::Unsupported {
                    flag: "--uts".into(),
                    value: u.into(),
                })
            }
        }
    }

    // Users: --userns=keep-id runs as the caller's uid:gid.
    let mut user = o.user.clone();
    if let Some(ns) = o.userns.as_deref() {
        if let Some(rest) = ns.strip_prefix("keep-id") {
            let mut uid = ctx.uid.to_string();
            let mut gid = ctx.gid.to_string();
            for kv in rest
                .trim_start_matches(':')
                .split(',')
                .filter(|s| !s.is_empty())
            {
                match kv.split_once('=') {
                    Some(("uid", v)) => uid = v.into(),
                    Some(("gid", v)) => gid = v.into(),
                    _ => {
                        return Err(TranslateError::BadValue {
                            flag: "--userns".into(),
                            value: ns.into(),
                        })
                    }
                }
            }
            if user.is_none() {
                user = Some(format!("{uid}:{gid}"));
            }
        } else {
            match ns {
                "host" => hc.userns_mode = Some("host".into()),
                "" => {}
                _ => {
                    return Err(TranslateError::Unsupported {
                        flag: "--userns".into(),
                        value: ns.into(),
                    })
                }
            }
        }
    }
    if !o.group_add.is_empty() {
        let mut groups = Vec::new();
        for g in &o.group_add {
            if g == "keep-groups" {
                groups.extend(ctx.groups.iter().map(u32::to_string));
            } else {
                groups.push(g.clone());
            }
        }
        hc.group_add = Some(groups);
    }
    for u in &o.ulimits {
        let bad = || TranslateError::BadValue {
            flag: "--ulimit".into(),
            value: u.clone(),
        };
        let (name, limits) = u.split_once('=').ok_or_else(bad)?;
        let (soft, hard) = match limits.split_once(':') {
            Some((s, h)) => (s, h),
            None => (limits, limits),
        };
        let parse = |v: &str| {
            if v == "-1" || v == "unlimited" {
                Ok(-1)
            } else {
                v.parse::<i64>().map_err(|_| bad())
            }
        };
        hc.ulimits
            .get_or_insert_with(Vec::new)
            .push(bollard::models::ResourcesUlimits {
                name: Some(name.into()),
                soft: Some(parse(soft)?),
                hard: Some(parse(hard)?),
            });
    }
    if let Some(r) = &o.restart {
        if o.rm {
            return Err(TranslateError::BadValue {
                flag: "--restart".into(),
                value: format!("{r} (conflicts with --rm)"),
            });
        }
        let (name, count) = r.split_once(':').unwrap_or((r.as_str(), ""));
        let name = match name {
            "no" => bollard::models::RestartPolicyNameEnum::NO,
            "always" => bollard::models::RestartPolicyNameEnum::ALWAYS,
            "unless-stopped" => bollard::models::RestartPolicyNameEnum::UNLESS_STOPPED,
            "on-failure" => bollard::models::RestartPolicyNameEnum::ON_FAILURE,
            _ => {
                return Err(TranslateError::BadValue {
                    flag: "--restart".into(),
                    value: r.clone(),
                })
            }
        };
        let retries = if count.is_empty() {
            None
        } else {
            Some(count.parse().map_err(|_| TranslateError::BadValue {
                flag: "--restart".into(),
                value: r.clone(),
            })?)
        };
        hc.restart_policy = Some(bollard::models::RestartPolicy {
            name: Some(name),
            maximum_retry_count: retries,
        });
    }
    if let Some(c) = &o.cgroupns {
        hc.cgroupns_mode = Some(match c.as_str() {
            "host" => bollard::models::HostConfigCgroupnsModeEnum::HOST,
            "private" => bollard::models::HostConfigCgroupnsModeEnum::PRIVATE,
            _ => {
                return Err(TranslateError::Unsupported {
                    flag: "--cgroupns".into(),
                    value: c.clone(),
                })
            }
        });
    }
    hc.cgroup_parent = o.cgroup_parent.clone();
    hc.cpuset_cpus = o.cpuset_cpus.clone();
    if o.log_driver.is_some() || !o.log_opts.is_empty() {
        hc.log_config = Some(bollard::models::HostConfigLogConfig {
            typ: o.log_driver.clone(),
            config: Some(
                o.log_opts
                    .iter()
                    .map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.into(), v.into()))
                            .unwrap_or((kv.clone(), String::new()))
                    })
                    .collect(),
            ),
        });
    }

    // GPUs, limited to the caller's.
    let have = me.map(|m| m.gpus.clone()).unwrap_or(Gpus::All);
    let mut limited: Option<Option<Vec<String>>> = None;
    if let Some(g) = o.gpus.as_deref() {
        let ids = gpu_ids("--gpus", g, &have)?;
        hc.device_requests = Some(vec![DeviceRequest {
            driver: Some(String::new()),
            count: if ids.is_none() { Some(-1) } else { None },
            device_ids: ids.clone(),
            capabilities: Some(vec![vec!["gpu".into()]]),
            options: None,
        }]);
        limited = Some(ids);
    }
    if let Some(r) = o.runtime.as_deref() {
        let name = Path::new(r)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(rts) = &ctx.runtimes {
            if !rts.contains(&name) {
                return Err(TranslateError::NoRuntime(r.into(), rts.join(", ")));
            }
        }
        hc.runtime = Some(name);
    }
    let nvidia_runtime = hc.runtime.as_deref() == Some("nvidia");
    let env_all = env
        .iter()
        .any(|(k, v)| k == "NVIDIA_VISIBLE_DEVICES" && v == "all");
    if let (Gpus::List(l), true) = (&have, nvidia_runtime || env_all) {
        // The nvidia runtime would otherwise expose every host GPU (CUDA
        // images set NVIDIA_VISIBLE_DEVICES=all).
        let ids = match &limited {
            Some(Some(ids)) => ids.clone(),
            _ => l.clone(),
        };
        let v = if ids.is_empty() {
            "void".to_string()
        } else {
            ids.join(",")
        };
        set(&mut env, "NVIDIA_VISIBLE_DEVICES", &v);
    }
    if !o.devices.is_empty() {
        let mut devs = Vec::new();
        let mut cdi = Vec::new();
        for d in &o.devices {
            if d.contains('=') && !d.starts_with('/') {
                cdi.push(d.clone());
                continue;
            }
            let parts: Vec<&str> = d.split(':').collect();
            let (host, cont, perms) = match parts.as_slice() {
                [h] => (*h, *h, "rwm"),
                [h, c] if c.starts_with('/') => (*h, *c, "rwm"),
                [h, p] => (*h, *h, *p),
                [h, c, p] => (*h, *c, *p),
                _ => {
                    return Err(TranslateError::BadValue {
                        flag: "--device".into(),
                        value: d.clone(),
                    })
                }
            };
            devs.push(DeviceMapping {
                path_on_host: Some(host.into()),
                path_in_container: Some(cont.into()),
                cgroup_permissions: Some(perms.into()),
            });
        }
        if !devs.is_empty() {
            hc.devices = Some(devs);
        }
        if !cdi.is_empty() {
            hc.device_requests
                .get_or_insert_with(Vec::new)
                .push(DeviceRequest {
                    driver: Some("cdi".into()),
                    device_ids: Some(cdi),
                    ..Default::default()
                });
        }
    }

    hc.privileged = Some(o.privileged);
    if !o.cap_add.is_empty() {
        hc.cap_add = Some(o.cap_add.clone());
    }
    if !o.cap_drop.is_empty() {
        hc.cap_drop = Some(o.cap_drop.clone());
    }
    let mut sec = Vec::new();
    for s in &o.security_opt {
        if s.starts_with("mask=")
            || s.starts_with("unmask=")
            || s.starts_with("proc-opts=")
            || s == "label=nested"
        {
            plan.warnings
                .push(format!("--security-opt {s} is podman-only and ignored"));
        } else {
            sec.push(s.clone());
        }
    }
    if !sec.is_empty() {
        hc.security_opt = Some(sec);
    }
    if let Some(s) = &o.shm_size {
        hc.shm_size = Some(parse_size("--shm-size", s)?);
    }
    if let Some(m) = &o.memory {
        hc.memory = Some(parse_size("--memory", m)?);
    }
    if let Some(c) = &o.cpus {
        let n: f64 = c.parse().map_err(|_| TranslateError::BadValue {
            flag: "--cpus".into(),
            value: c.clone(),
        })?;
        hc.nano_cpus = Some((n * 1e9) as i64);
    }
    if let Some(p) = &o.pids_limit {
        hc.pids_limit = Some(p.parse().map_err(|_| TranslateError::BadValue {
            flag: "--pids-limit".into(),
            value: p.clone(),
        })?);
    }
    if o.init {
        hc.init = Some(true);
    }
    if o.read_only {
        hc.readonly_rootfs = Some(true);
    }
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
    if !o.detach {
        // A detached container outlives its shim on purpose: it carries no
        // pid, so only the node-stop sweep removes it.
        labels.insert(LABEL_PID.into(), ctx.shim_pid.to_string());
        labels.insert(LABEL_START.into(), ctx.shim_start.to_string());
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
        env: Some(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(labels),
        user,
        working_dir: o.workdir.clone(),
        hostname,
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
    use super::*;
    use crate::shim::args::{parse, Command};

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
                via_volume: false
            }
        );
        assert_eq!(
            to_host(Some(&me), Path::new("/tmp/tmpabc")),
            HostPath::At {
                path: "/var/lib/docker/volumes/raytmp/_data/tmpabc".into(),
                read_only: false,
                via_volume: true
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
                via_volume: false
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
        let argv = crate::shim::args::tests::ray_worker_argv();
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
        assert!(plan.warnings.iter().any(|w| w.contains("--cgroup-manager")));
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
            vec![Copy {
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
            "--group-add",
            "keep-groups",
            "--group-add",
            "video",
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
        assert_eq!(hc.group_add.unwrap(), vec!["27", "100", "video"]);
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
}
