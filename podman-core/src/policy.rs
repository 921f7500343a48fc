//! The shim's policy (SPEC R-SHIM-5): default deny. Access to the Docker
//! socket is root on the host, so the shim is the only place where a job's
//! `podman run` can be checked. A container may have what Ray's own calls and
//! ordinary engine jobs need, and nothing else:
//!
//! - binds only from under `ARGUS_SHIM_ALLOWED_BINDS`, compared on the host
//!   path the bind translates to, after symlinks and `..` are resolved; named
//!   volumes and tmpfs; never the Docker socket, `/`, `/etc`, `/proc`,
//!   `/sys` or `/var/lib/docker`, whatever the allow-list says;
//! - devices only NVIDIA's (`/dev/nvidia*`, `/dev/dri/*`, CDI
//!   `nvidia.com/gpu=…`) and those the Ray container has;
//! - no `--privileged`, no `--cap-add` beyond `ARGUS_SHIM_ALLOWED_CAPS`,
//!   `--security-opt` only `label=…`, `mask=…` and `no-new-privileges`,
//!   `--userns` only `keep-id`, namespaces only `host` (the Ray container's)
//!   or the default, or `container:` of a container this shim owns;
//! - named volumes only the Ray container's own and those in
//!   `ARGUS_SHIM_ALLOWED_VOLUMES`; anonymous volumes;
//! - GPUs only the Ray container's (devices, CDI names and
//!   `NVIDIA_VISIBLE_DEVICES`); networks only the Ray container's; memory,
//!   CPUs, pids and cpuset at most the Ray container's, ulimits at most the
//!   caller's; log drivers only the local ones; no restart policy; tmpfs
//!   options that do not allow setuid files or devices;
//! - images from `ARGUS_SHIM_ALLOWED_IMAGES` when it is set.
//!
//! Nothing reaches the create call that no row of the flag table allowed:
//! the options are checked as given ([`Policy::check_run`]) and the create
//! body as translated ([`Policy::check_body`]).
//!
//! `ARGUS_SHIM_POLICY=relaxed` lifts all but the image allow-list and the
//! `no-job-policy` rule, with one log line per container. The settings are
//! the node's (see `super::settings`: a shim started under a node agent
//! takes them from the agent, never from its own environment, which Ray's
//! runtime_env `env_vars` reach); a `run` that sets an `ARGUS_SHIM_*`
//! variable in the container is refused as well.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use bollard::models::{ContainerCreateBody, HostConfig};

use crate::args::{run_flag, Rule, RunOpts, Volume};
use crate::docker_host::DockerHost;
use crate::selfid::{normalize, to_host, Gpus, HostPath, Limits, SelfContainer};
use crate::translate::Plan;

/// A refusal, or a bad policy setting; the message names the rule.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("policy: --{flag} is refused (rule {rule}; ARGUS_SHIM_POLICY=relaxed lifts it)")]
    Refused {
        flag: &'static str,
        rule: &'static str,
    },
    #[error("policy: --cap-add {0} is refused (rule capabilities: only ARGUS_SHIM_ALLOWED_CAPS may be added; ARGUS_SHIM_POLICY=relaxed lifts it)")]
    CapAdd(String),
    #[error("policy: binding {path} (host {host}) is refused (rule {rule}; ARGUS_SHIM_POLICY=relaxed lifts it)")]
    Bind {
        path: String,
        host: String,
        rule: &'static str,
    },
    #[error("policy: {flag} {value} is refused (rule {rule}; ARGUS_SHIM_POLICY=relaxed lifts it)")]
    Flag {
        flag: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("policy: binding {spec} is refused (rule binds: {reason})")]
    Unresolvable { spec: String, reason: String },
    #[error("policy: image {image} is not in ARGUS_SHIM_ALLOWED_IMAGES (rule allowed-images)")]
    Image { image: String },
    #[error("policy: a job may not set {name} (rule no-job-policy)")]
    JobPolicy { name: String },
    #[error("policy: container {name} is not owned by this shim's Ray container (rule owned-containers-only)")]
    NotOwned { name: String },
    #[error("policy: Ray job {job:08x} already has {live} live engine containers of its own on this node (rule engines-per-job: at most ARGUS_SHIM_MAX_ENGINES_PER_JOB={max}; remove one first)")]
    JobEngines { job: u32, live: usize, max: usize },
    #[error("policy: {held} podman logs -f of {share} are already following on this node (rule log-follows: at most {max} per job and ARGUS_SHIM_MAX_LOG_FOLLOWS={node} in all, as each holds one of the host's inotify instances in dockerd; read without -f or end one first)")]
    LogFollows {
        share: String,
        held: usize,
        max: usize,
        node: usize,
    },
    #[error("policy: Ray job {job:08x}'s own engines on this node would hold {total} {what} together, more than this Ray container's {limit} (rule engines-per-job: together at most the Ray container's limits)")]
    JobTotal {
        job: u32,
        what: &'static str,
        total: i64,
        limit: i64,
    },
    #[error("{name}={value:?}: {why}")]
    Setting {
        name: &'static str,
        value: String,
        why: &'static str,
    },
}

/// The rules [`Policy::check_run`] checks flag by flag: each
/// `Rule::Checked` of the flag table names one of these (a test holds the
/// two together); `Rule::Refused` flags are refused from the table itself.
pub const CHECKED_RULES: &[&str] = &[
    "owned-containers-only",
    "no-job-policy",
    "binds",
    "namespaces",
    "userns",
    "capabilities",
    "security-opt",
    "devices",
    "no-shim-labels",
    "gpus",
    "resources",
    "ulimits",
    "restart",
    "log-driver",
    "tmpfs",
    "users",
    "groups",
];

/// The `rule` label values of `argus_shim_refusals_total`: every rule that
/// refuses a call, as the refusal message names it with `_` for `-`
/// (`no-privileged` is `no_privileged`), plus the flag table's own
/// refusals: `unsupported` (podman-only flags and options),
/// `unknown_flag` and `unknown_command`. A fixed set, so the metric's
/// series stay bounded whatever a caller sends; anything else a report
/// names is counted as `other` (see [`refusal_label`]).
pub const REFUSAL_RULES: &[&str] = &[
    "owned_containers_only",
    "no_job_policy",
    "binds",
    "bind_propagation",
    "no_docker_socket_bind",
    "no_host_root_bind",
    "no_etc_bind",
    "no_proc_bind",
    "no_sys_bind",
    "no_docker_data_bind",
    "no_writable_subfolder_bind",
    "namespaces",
    "userns",
    "capabilities",
    "security_opt",
    "devices",
    "no_shim_labels",
    "gpus",
    "resources",
    "ulimits",
    "restart",
    "log_driver",
    "tmpfs",
    "users",
    "groups",
    "no_root_shared_pid",
    "no_privileged",
    "no_cgroup_parent",
    "allowed_images",
    "no_squatting",
    "engines_per_job",
    "log_follows",
    "unsupported",
    "unknown_flag",
    "unknown_command",
];

/// Returns the label of `rule` (a rule name as the messages spell it,
/// `no-privileged`, or already as a label, `no_privileged`; anything after
/// the name, such as `binds (not under …)`, is ignored): one of
/// [`REFUSAL_RULES`], or `other`.
pub fn refusal_label(rule: &str) -> &'static str {
    let name = rule.split(' ').next().unwrap_or("");
    REFUSAL_RULES
        .iter()
        .find(|r| {
            r.len() == name.len()
                && r.bytes()
                    .zip(name.bytes())
                    .all(|(a, b)| a == b || (a == b'_' && b == b'-'))
        })
        .copied()
        .unwrap_or("other")
}

impl PolicyError {
    /// Returns the rule that refused the call, as a label of
    /// [`REFUSAL_RULES`]; None for a bad policy setting (the node's
    /// configuration, not a refusal of the call).
    pub fn rule(&self) -> Option<&'static str> {
        let rule = match self {
            PolicyError::Refused { rule, .. }
            | PolicyError::Bind { rule, .. }
            | PolicyError::Flag { rule, .. } => rule,
            PolicyError::CapAdd(_) => "capabilities",
            PolicyError::Unresolvable { .. } => "binds",
            PolicyError::Image { .. } => "allowed-images",
            PolicyError::JobPolicy { .. } => "no-job-policy",
            PolicyError::NotOwned { .. } => "owned-containers-only",
            PolicyError::JobEngines { .. } | PolicyError::JobTotal { .. } => "engines-per-job",
            PolicyError::LogFollows { .. } => "log-follows",
            PolicyError::Setting { .. } => return None,
        };
        Some(refusal_label(rule))
    }
}

/// Log drivers that keep a container's output on this host.
pub const LOCAL_LOG_DRIVERS: &[&str] = &["json-file", "local", "none"];

/// `--log-opt` keys of the local drivers (none of them sends anything
/// anywhere).
pub const LOG_OPTS: &[&str] = &[
    "max-size",
    "max-file",
    "compress",
    "mode",
    "max-buffer-size",
    "labels",
    "labels-regex",
    "env",
    "env-regex",
    "tag",
];

/// `--tmpfs` options allowed (`suid` and `dev` would let files on the tmpfs
/// carry privileges or be devices).
pub const TMPFS_OPTS: &[&str] = &[
    "size",
    "mode",
    "uid",
    "gid",
    "nr_inodes",
    "exec",
    "noexec",
    "nosuid",
    "nodev",
    "ro",
    "rw",
    "noatime",
    "nodiratime",
    "relatime",
    "strictatime",
];

/// The lines of `/proc/<pid>/limits` by Docker's ulimit name.
const PROC_LIMITS: &[(&str, &str)] = &[
    ("Max cpu time", "cpu"),
    ("Max file size", "fsize"),
    ("Max data size", "data"),
    ("Max stack size", "stack"),
    ("Max core file size", "core"),
    ("Max resident set", "rss"),
    ("Max processes", "nproc"),
    ("Max open files", "nofile"),
    ("Max locked memory", "memlock"),
    ("Max address space", "as"),
    ("Max file locks", "locks"),
    ("Max pending signals", "sigpending"),
    ("Max msgqueue size", "msgqueue"),
    ("Max nice priority", "nice"),
    ("Max realtime priority", "rtprio"),
    ("Max realtime timeout", "rttime"),
];

/// Parses the text of `/proc/<pid>/limits` into hard limits by Docker's
/// ulimit name (-1: unlimited); a line it cannot read is left out (so
/// that limit allows nothing).
pub fn parse_proc_limits(text: &str) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some(&(prefix, name)) = PROC_LIMITS.iter().find(|(p, _)| {
            line.strip_prefix(p)
                .is_some_and(|rest| rest.starts_with("  ") || rest.starts_with(' '))
        }) else {
            continue;
        };
        // After the name: soft, hard, [units].
        let mut fields = line[prefix.len()..].split_whitespace();
        let (Some(_soft), Some(hard)) = (fields.next(), fields.next()) else {
            continue;
        };
        let hard = match hard {
            "unlimited" => -1,
            h => match h.parse::<u64>().ok().and_then(|h| i64::try_from(h).ok()) {
                Some(h) => h,
                None => continue,
            },
        };
        out.insert(name.to_string(), hard);
    }
    out
}

/// Bind sources allowed by default (paths in the Ray container): Ray's temp
/// dir, the probe's temp folders (`TMPDIR`), the shared root and the model
/// cache, each with the variable that moves it.
const DEFAULT_BINDS: &[(&str, &str)] = &[
    ("", "/tmp/ray"),
    ("TMPDIR", "/tmp"),
    ("ARGUS_SHARED_ROOT", "/private"),
    ("ARGUS_MODEL_CACHE", "/tmp/argus-models"),
];

/// The variable through which the node agent's bind roots, resolved once
/// at its start ([`super::settings::NodeSettings::resolve_bind_roots`]),
/// reach each call: a JSON list of canonical paths in the Ray container.
pub const BIND_ROOTS_VAR: &str = "ARGUS_SHIM_BIND_ROOTS";

/// Returns the allowed bind roots as configured (paths in the Ray
/// container, not resolved): `ARGUS_SHIM_ALLOWED_BINDS`, else the defaults
/// moved by their variables.
pub fn allowed_binds(get: impl Fn(&str) -> Option<String>) -> Result<Vec<String>, PolicyError> {
    let list = |name: &str, sep: char| -> Option<Vec<String>> {
        get(name).filter(|v| !v.trim().is_empty()).map(|v| {
            v.split(sep)
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
    };
    Ok(match list("ARGUS_SHIM_ALLOWED_BINDS", ':') {
        Some(l) => {
            if let Some(bad) = l.iter().find(|p| !p.starts_with('/')) {
                return Err(PolicyError::Setting {
                    name: "ARGUS_SHIM_ALLOWED_BINDS",
                    value: bad.clone(),
                    why: "not an absolute path (colon-separated absolute paths expected)",
                });
            }
            l
        }
        None => {
            let mut l: Vec<String> = DEFAULT_BINDS
                .iter()
                .map(|(var, default)| {
                    get(var)
                        .filter(|v| !var.is_empty() && v.starts_with('/'))
                        .unwrap_or_else(|| default.to_string())
                })
                .collect();
            if let Some(t) = get("RAY_TMPDIR").filter(|v| v.starts_with('/')) {
                l.push(format!("{}/ray", t.trim_end_matches('/')));
            }
            l
        }
    })
}

/// An allowed bind root, in the Ray container and on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Root {
    caller: PathBuf,
    host: Option<PathBuf>,
}

/// How many live engine containers one Ray job's own code may have on one
/// node when `ARGUS_SHIM_MAX_ENGINES_PER_JOB` is unset (Ray's own worker
/// starts, `image_uri` workers and Serve replicas, do not count: Ray's
/// resources bound those).
pub const DEFAULT_MAX_ENGINES_PER_JOB: usize = 16;

/// How many `podman logs -f` may follow at once on one node when
/// `ARGUS_SHIM_MAX_LOG_FOLLOWS` is unset. Docker's json-file follower
/// holds an inotify instance of dockerd's for as long as it follows, and
/// every root process of the host shares one budget of them
/// (`fs.inotify.max_user_instances`, 128 by default): 128 follows left
/// the host's other root programs (the node agents' own watchers
/// included) failing with EMFILE. A node's follows stay well under it.
pub const DEFAULT_MAX_LOG_FOLLOWS: usize = 16;

/// The offsets, in the node's lock file, of the byte-range locks that
/// count `logs -f` calls (one lock held per following call, for as long as
/// it follows): a call takes one of its share's slots and one of the
/// node's, or is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowSlots {
    /// The slots of the call's share: at most [`follows_per_share`].
    pub share: std::ops::Range<u64>,
    /// The node's slots: `ARGUS_SHIM_MAX_LOG_FOLLOWS`.
    pub node: std::ops::Range<u64>,
}

/// Where the shares' slots start in the lock file: past the node's slots
/// (at most 1,024) and the create lock (offset 0), far from both.
const SHARE_SLOTS_BASE: u64 = 1 << 20;
/// Room for one share's slots: more than [`follows_per_share`] of the
/// largest node bound.
const SHARE_SLOTS_STRIDE: u64 = 1 << 10;

/// How many `logs -f` one Ray job (or the callers outside any job,
/// together) may have following at once of a node's `node` follows: a
/// quarter, at least one, so one job cannot take them all.
pub fn follows_per_share(node: usize) -> usize {
    (node / 4).max(1)
}

/// The slots a `logs -f` of `job` (None: a caller outside any job, all
/// such callers sharing one set) takes one of each from, for a node bound
/// of `node` follows. Distinct jobs' slots never overlap, and none overlaps
/// the node's or the create lock's byte.
pub fn follow_slots(job: Option<u32>, node: usize) -> FollowSlots {
    let index = job.map_or(0, |j| u64::from(j) + 1);
    let start = SHARE_SLOTS_BASE + index * SHARE_SLOTS_STRIDE;
    FollowSlots {
        share: start..start + follows_per_share(node) as u64,
        node: 1..1 + node as u64,
    }
}

/// The whole number `name` sets, from 1 to `max` (`why` says so; blanks
/// around it ignored), or `default` when it is unset or blank.
fn count_setting(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: usize,
    max: usize,
    why: &'static str,
) -> Result<usize, PolicyError> {
    let Some(v) = get(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
    else {
        return Ok(default);
    };
    match v.bytes().all(|b| b.is_ascii_digit()).then(|| v.parse()) {
        Some(Ok(n)) if (1..=max).contains(&n) => Ok(n),
        _ => Err(PolicyError::Setting {
            name,
            value: v,
            why,
        }),
    }
}

/// The policy in force.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub relaxed: bool,
    /// How many live engine containers one Ray job's own code may have on
    /// this node (0: no bound, only a policy made in code). Not lifted by
    /// `relaxed`: a bound on use, not a rule of what a container may be.
    pub max_engines_per_job: usize,
    /// How many `podman logs -f` may follow at once on this node (0: no
    /// bound, only a policy made in code); a quarter of them per job (see
    /// [`follow_slots`]). Not lifted by `relaxed`.
    pub max_log_follows: usize,
    /// None: every image is allowed.
    pub allowed_images: Option<Vec<String>>,
    /// Allowed bind roots, paths in the Ray container, as configured.
    pub allowed_binds: Vec<String>,
    /// Capabilities `--cap-add` may name (upper case, no `CAP_`).
    pub allowed_caps: Vec<String>,
    /// Host paths of the Docker socket, besides the usual ones.
    pub docker_sockets: Vec<String>,
    /// `allowed_binds` resolved by [`Policy::resolve`].
    roots: Vec<Root>,
    /// Named volumes `-v NAME:…` may name besides the Ray container's own
    /// (an entry ending in `*` is a prefix).
    pub allowed_volumes: Vec<String>,
    /// Host paths of the Ray container's devices.
    ray_devices: Vec<String>,
    /// The Ray container's named volumes, networks, GPUs and limits (on
    /// the host: none, none, all, none).
    own_volumes: Vec<String>,
    networks: Vec<String>,
    gpus: Gpus,
    limits: Limits,
    /// Container references (`container:X`, `--replace --name X`) this
    /// shim owns, as found at the edge.
    pub owned_refs: HashSet<String>,
    /// `--device` paths that are character devices in the Ray container,
    /// as found at the edge.
    pub present_devices: HashSet<String>,
    /// The caller's hard limits by ulimit name (-1: unlimited), as found at
    /// the edge ([`caller_ulimits`]).
    pub caller_ulimits: HashMap<String, i64>,
    /// The caller's uid and gid: what an engine container runs as unless
    /// `ARGUS_SHIM_ALLOWED_USERS` allows another `--user`.
    pub caller: Option<(u32, u32)>,
    /// Uids `--user` may name besides the caller's (numbers only).
    pub allowed_users: Vec<u32>,
    /// `*` in `ARGUS_SHIM_ALLOWED_USERS`: any uid but 0 (0 only when
    /// listed).
    pub any_user: bool,
    /// The bind roots the node agent resolved at its start (canonical
    /// paths in the Ray container), when it did: used instead of resolving
    /// `allowed_binds` again at each call ([`BIND_ROOTS_VAR`]).
    pub start_roots: Option<Vec<PathBuf>>,
    /// The Docker socket's group, which no engine container may join.
    pub socket_gid: Option<u32>,
    /// `ARGUS_AGENT_USER` (uid, gid): the agent's writer identity, which
    /// owns the discovery state on the shared root; no engine container
    /// may run as its uid or with its gid, whatever
    /// `ARGUS_SHIM_ALLOWED_USERS` says (R-SEC-2: readers trust what that
    /// identity owns).
    pub agent_user: Option<(u32, u32)>,
    /// The images the edge resolved (the caller's, by full ID), for
    /// [`Policy::image_allowed`].
    pub images: Vec<ResolvedImage>,
    /// The full IDs the allow-list's entries resolved to on this daemon,
    /// as found at the edge.
    pub listed_image_ids: HashSet<String>,
}

/// An image as the daemon resolved a reference to it, once: its full ID
/// (`sha256:<64 hex>`) and the names the daemon holds for that ID.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResolvedImage {
    pub id: String,
    /// Repo tags and repo digests, as the daemon lists them.
    pub names: Vec<String>,
}

/// Returns true if and only if `s` is a full image ID: `sha256:` and 64
/// lowercase hex digits.
pub fn is_image_id(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// Returns a capability name as Docker compares it (`cap_sys_admin` ->
/// `SYS_ADMIN`).
fn cap_name(c: &str) -> String {
    let up = c.trim().to_ascii_uppercase();
    up.strip_prefix("CAP_").map(str::to_string).unwrap_or(up)
}

impl Policy {
    /// Reads the policy from environment values; a value it cannot use is
    /// an error naming the variable.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Policy, PolicyError> {
        let relaxed = match get("ARGUS_SHIM_POLICY").as_deref().map(str::trim) {
            None | Some("") | Some("default") => false,
            Some("relaxed") => true,
            Some(other) => {
                return Err(PolicyError::Setting {
                    name: "ARGUS_SHIM_POLICY",
                    value: other.into(),
                    why: "unknown policy (use `default` or `relaxed`)",
                })
            }
        };
        let list = |name: &str, sep: char| -> Option<Vec<String>> {
            get(name).filter(|v| !v.trim().is_empty()).map(|v| {
                v.split(sep)
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
        };
        let allowed_images = list("ARGUS_SHIM_ALLOWED_IMAGES", ',');
        let max_engines_per_job = count_setting(
            &get,
            "ARGUS_SHIM_MAX_ENGINES_PER_JOB",
            DEFAULT_MAX_ENGINES_PER_JOB,
            4096,
            "not a whole number from 1 to 4096",
        )?;
        let max_log_follows = count_setting(
            &get,
            "ARGUS_SHIM_MAX_LOG_FOLLOWS",
            DEFAULT_MAX_LOG_FOLLOWS,
            1024,
            "not a whole number from 1 to 1024",
        )?;
        let allowed_binds = allowed_binds(&get)?;
        let start_roots = match get(BIND_ROOTS_VAR).filter(|v| !v.is_empty()) {
            None => None,
            Some(v) => {
                match serde_json::from_str::<Vec<PathBuf>>(&v) {
                    Ok(l) if l.iter().all(|p| p.is_absolute()) => Some(l),
                    _ => return Err(PolicyError::Setting {
                        name: BIND_ROOTS_VAR,
                        value: v,
                        why:
                            "not a JSON list of absolute paths (written by the node agent at start)",
                    }),
                }
            }
        };
        let allowed_volumes = list("ARGUS_SHIM_ALLOWED_VOLUMES", ',').unwrap_or_default();
        if let Some(bad) = allowed_volumes.iter().find(|v| v.contains('/')) {
            return Err(PolicyError::Setting {
                name: "ARGUS_SHIM_ALLOWED_VOLUMES",
                value: bad.clone(),
                why: "not a volume name (comma-separated names expected; paths go in ARGUS_SHIM_ALLOWED_BINDS)",
            });
        }
        let mut any_user = false;
        let mut allowed_users = Vec::new();
        for u in list("ARGUS_SHIM_ALLOWED_USERS", ',').unwrap_or_default() {
            match (u.as_str(), crate::translate::parse_id(&u)) {
                ("*", _) => any_user = true,
                (_, Some(n)) => allowed_users.push(n),
                (_, None) => {
                    return Err(PolicyError::Setting {
                        name: "ARGUS_SHIM_ALLOWED_USERS",
                        value: u,
                        why: "not a uid (comma-separated decimal uids or `*` expected; names are not taken)",
                    })
                }
            }
        }
        let agent_user = match get("ARGUS_AGENT_USER").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(v) => {
                let ids = v.trim().split_once(':').and_then(|(u, g)| {
                    Some((
                        crate::translate::parse_id(u)?,
                        crate::translate::parse_id(g)?,
                    ))
                });
                match ids {
                    Some(ids) => Some(ids),
                    None => {
                        return Err(PolicyError::Setting {
                            name: "ARGUS_AGENT_USER",
                            value: v,
                            why: "not a numeric uid:gid",
                        })
                    }
                }
            }
        };
        let allowed_caps = list("ARGUS_SHIM_ALLOWED_CAPS", ',')
            .unwrap_or_default()
            .iter()
            .map(|c| cap_name(c))
            .collect();
        let mut docker_sockets = vec![
            "/var/run/docker.sock".to_string(),
            "/run/docker.sock".to_string(),
        ];
        if let Some(h) = DockerHost::parse(get("DOCKER_HOST").as_deref()).socket_path() {
            if !docker_sockets.iter().any(|s| s == h) {
                docker_sockets.push(h.to_string());
            }
        }
        Ok(Policy {
            relaxed,
            max_engines_per_job,
            max_log_follows,
            allowed_images,
            allowed_binds,
            allowed_caps,
            allowed_volumes,
            allowed_users,
            any_user,
            agent_user,
            docker_sockets,
            start_roots,
            ..Default::default()
        })
    }

    /// Resolves the allowed bind roots: those the node agent resolved at
    /// start when there are ([`Policy::start_roots`]), else `canon`
    /// resolves symlinks and `..` in the Ray container (None: the root does
    /// not exist there, so it allows nothing); [`to_host`] maps the result
    /// to the host. Also notes
    /// what the Ray container has: devices, volumes, networks, GPUs, limits.
    pub fn resolve(
        &mut self,
        me: Option<&SelfContainer>,
        canon: impl Fn(&Path) -> Option<PathBuf>,
    ) {
        let resolved: Vec<PathBuf> = match &self.start_roots {
            // Resolved once by the node agent at its start: a root that is
            // (or later becomes) a link the Ray user controls is not
            // followed again.
            Some(l) => l.clone(),
            None => self
                .allowed_binds
                .iter()
                .filter_map(|p| canon(Path::new(p)))
                .collect(),
        };
        self.roots = resolved
            .into_iter()
            .map(|caller| {
                let host = match to_host(me, &caller) {
                    HostPath::At { path, .. } => Some(PathBuf::from(path)),
                    HostPath::NotVisible => None,
                };
                Root { caller, host }
            })
            .collect();
        self.ray_devices = me.map(|m| m.devices.clone()).unwrap_or_default();
        self.own_volumes = me
            .map(|m| m.mounts.iter().filter_map(|m| m.name.clone()).collect())
            .unwrap_or_default();
        self.networks = me.map(|m| m.networks.clone()).unwrap_or_default();
        self.gpus = me.map(|m| m.gpus.clone()).unwrap_or(Gpus::All);
        self.limits = me.map(|m| m.limits.clone()).unwrap_or_default();
    }

    /// Returns true if and only if the named volume `name` may be mounted:
    /// one of the Ray container's own, or in `ARGUS_SHIM_ALLOWED_VOLUMES`.
    pub fn volume_allowed(&self, name: &str) -> bool {
        self.own_volumes.iter().any(|v| v == name)
            || self
                .allowed_volumes
                .iter()
                .any(|p| match p.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => p == name,
                })
    }

    /// Returns true if and only if the image `image` may run (or there is
    /// no allow-list). Images are compared by full ID (R-SEC-3, issue 26
    /// hole 6): `image` must be the full ID (`sha256:<64 hex>`) the edge
    /// resolved the caller's reference to, once ([`ResolvedImage`] in
    /// [`Policy::images`]), and it is allowed when an allow-list entry
    /// resolved to that same ID, or when a name the daemon holds for that
    /// ID (a repo tag or digest) matches an entry ([`image_matches`]: for
    /// untagged entries and `*` prefixes). A reference that was not
    /// resolved (a short ID, a prefix, a name of no local image) never
    /// passes, whatever its spelling.
    pub fn image_allowed(&self, image: &str) -> bool {
        let Some(list) = &self.allowed_images else {
            return true;
        };
        let Some(r) = self.images.iter().find(|r| r.id == image) else {
            return false;
        };
        is_image_id(&r.id)
            && (self.listed_image_ids.contains(&r.id)
                || r.names
                    .iter()
                    .any(|n| list.iter().any(|pat| image_matches(pat, n))))
    }

    /// Returns true if and only if the name `image` may be pulled: it
    /// matches the allow-list as written (or there is none). Only a gate
    /// on pulls (disk and registry traffic): what runs is checked by ID
    /// once pulled ([`Policy::image_allowed`]).
    pub fn image_name_allowed(&self, image: &str) -> bool {
        match &self.allowed_images {
            None => true,
            Some(list) => list.iter().any(|pat| image_matches(pat, image)),
        }
    }

    /// Checks a `run` request after translation.
    pub fn check_run(&self, o: &RunOpts, plan: &Plan) -> Result<(), PolicyError> {
        for e in &plan.job_env {
            check_job_env(e)?;
        }
        if !self.image_allowed(&o.image) {
            return Err(PolicyError::Image {
                image: o.image.clone(),
            });
        }
        if self.relaxed {
            return Ok(());
        }
        // The flags the table refuses outright; the checked ones below.
        for name in &o.given {
            if let Some(Rule::Refused(rule)) = run_flag(name).map(|f| f.rule) {
                return Err(PolicyError::Refused { flag: name, rule });
            }
        }
        if let Some(c) = o
            .cap_add
            .iter()
            .find(|c| !self.allowed_caps.contains(&cap_name(c)))
        {
            return Err(PolicyError::CapAdd(c.clone()));
        }
        let refuse = |flag, value: &str, rule| PolicyError::Flag {
            flag,
            value: value.to_string(),
            rule,
        };
        for s in &o.security_opt {
            // SELinux: only podman's file type may be chosen; `disable`,
            // `type:spc_t`, `user:`, `role:` lift the confinement, and
            // `level:` picks the MCS categories, those of another
            // container's files included (issue 26, hole 13).
            let label = s
                .strip_prefix("label=")
                .or_else(|| s.strip_prefix("label:"));
            let ok = label.is_some_and(|l| l.starts_with("filetype:"))
                || s.starts_with("mask=")
                || matches!(
                    s.as_str(),
                    "no-new-privileges" | "no-new-privileges=true" | "no-new-privileges:true"
                );
            if !ok {
                return Err(refuse("--security-opt", s, "security-opt"));
            }
        }
        if let Some(u) = o.userns.as_deref() {
            if !(u.is_empty() || u.starts_with("keep-id")) {
                return Err(refuse("--userns", u, "userns"));
            }
        }
        self.check_namespaces(o)?;
        if let Some(l) = o.labels.iter().find(|l| crate::labels::is_reserved(l)) {
            return Err(refuse("--label", l, "no-shim-labels"));
        }
        if let (true, Some(name)) = (o.replace, &o.name) {
            if !self.owned_refs.contains(name) {
                return Err(PolicyError::NotOwned { name: name.clone() });
            }
        }
        for d in &o.devices {
            if !self.device_allowed(d) {
                return Err(refuse("--device", d, "devices"));
            }
        }
        for v in &o.volumes {
            self.check_volume(v)?;
            if !v.source.is_empty() && !v.is_path() && !self.volume_allowed(&v.source) {
                return Err(PolicyError::Flag {
                    flag: "--volume/--mount",
                    value: format!(
                        "{} (a named volume that is not this Ray container's; ARGUS_SHIM_ALLOWED_VOLUMES names others)",
                        v.source
                    ),
                    rule: "binds",
                });
            }
        }
        self.check_host_config_flags(o)?;
        for (caller, host, via_volume) in &plan.bind_sources {
            self.check_bind(caller, Some(host), *via_volume)?;
        }
        for c in &plan.copies {
            self.check_bind(&c.source, None, false)?;
        }
        Ok(())
    }

    /// Checks the flags that go to the create body's host config as given:
    /// log driver and options, ulimits, restart policy, tmpfs options.
    fn check_host_config_flags(&self, o: &RunOpts) -> Result<(), PolicyError> {
        let refuse = |flag, value: &str, rule| PolicyError::Flag {
            flag,
            value: value.to_string(),
            rule,
        };
        if let Some(d) = o.log_driver.as_deref() {
            if !LOCAL_LOG_DRIVERS.contains(&d) {
                return Err(refuse("--log-driver", d, "log-driver"));
            }
        }
        for opt in &o.log_opts {
            let key = opt.split_once('=').map(|(k, _)| k).unwrap_or(opt);
            if !LOG_OPTS.contains(&key) {
                return Err(refuse("--log-opt", opt, "log-driver"));
            }
        }
        for u in &o.ulimits {
            if !self.ulimit_allowed(u) {
                return Err(refuse("--ulimit", u, "ulimits"));
            }
        }
        if let Some(r) = o.restart.as_deref() {
            if r != "no" {
                return Err(refuse("--restart", r, "restart"));
            }
        }
        for t in &o.tmpfs {
            let opts = t.split_once(':').map(|(_, o)| o).unwrap_or("");
            let bad = opts.split(',').filter(|x| !x.is_empty()).find(|x| {
                let key = x.split_once('=').map(|(k, _)| k).unwrap_or(x);
                !TMPFS_OPTS.contains(&key)
            });
            if let Some(b) = bad {
                return Err(refuse("--tmpfs", &format!("{t} ({b})"), "tmpfs"));
            }
        }
        Ok(())
    }

    /// Returns true if and only if `--ulimit u` (`name=soft[:hard]`) names
    /// a known limit no higher than the caller's own hard limit.
    fn ulimit_allowed(&self, u: &str) -> bool {
        let Some((name, values)) = u.split_once('=') else {
            return false;
        };
        let Some(&have) = self.caller_ulimits.get(name) else {
            return false;
        };
        values.split(':').all(|v| {
            let want = match v {
                "-1" | "unlimited" => -1,
                v => match v.parse::<i64>() {
                    Ok(n) if n >= 0 => n,
                    _ => return false,
                },
            };
            have == -1 || (want != -1 && want <= have)
        })
    }

    /// Checks the create body as translated: what the options mean once
    /// mapped onto the Ray container's resources (GPUs, limits, network).
    /// The checks run in this order, and the first that fails is the
    /// refusal.
    pub fn check_body(&self, body: &ContainerCreateBody) -> Result<(), PolicyError> {
        if self.relaxed {
            return Ok(());
        }
        self.check_gpu_env(body)?;
        self.check_identity(body)?;
        let Some(hc) = &body.host_config else {
            return Ok(());
        };
        self.check_gpu_requests(hc)?;
        self.check_limits(hc)?;
        self.check_cpuset(hc)
    }

    /// Checks `NVIDIA_VISIBLE_DEVICES` in the body's environment (rule
    /// `gpus`): when the Ray container has a list of GPUs, the variable may
    /// only name those (or `""`, `void`, `none`), since the NVIDIA runtime
    /// would otherwise hand the engine GPUs that belong to another job.
    fn check_gpu_env(&self, body: &ContainerCreateBody) -> Result<(), PolicyError> {
        let Gpus::List(have) = &self.gpus else {
            return Ok(());
        };
        for e in body.env.iter().flatten() {
            let Some(v) = e.strip_prefix("NVIDIA_VISIBLE_DEVICES=") else {
                continue;
            };
            let ok = matches!(v, "" | "void" | "none")
                || v.split(',').all(|id| have.iter().any(|h| h == id.trim()));
            if !ok {
                return Err(PolicyError::Flag {
                    flag: "-e NVIDIA_VISIBLE_DEVICES",
                    value: format!("{v} (this container's GPUs: {})", show_list(have)),
                    rule: "gpus",
                });
            }
        }
        Ok(())
    }

    /// Checks the host config's device requests (`--gpus`, CDI
    /// `--device nvidia.com/gpu=…`; rule `gpus`): when the Ray container
    /// has a list of GPUs, each requested ID must be one of them, and
    /// `--gpus all` (a count of -1 with no IDs) is refused, as it would
    /// reach every GPU of the host.
    fn check_gpu_requests(&self, hc: &HostConfig) -> Result<(), PolicyError> {
        let refuse = |flag, value: String| PolicyError::Flag {
            flag,
            value,
            rule: "gpus",
        };
        let Gpus::List(have) = &self.gpus else {
            return Ok(());
        };
        for r in hc.device_requests.iter().flatten() {
            for id in r.device_ids.iter().flatten() {
                let id = id.strip_prefix("nvidia.com/gpu=").unwrap_or(id);
                if !have.iter().any(|h| h == id) {
                    return Err(refuse(
                        "--gpus/--device",
                        format!("{id} (this container's GPUs: {})", show_list(have)),
                    ));
                }
            }
            if r.device_ids.is_none() && r.count.is_some_and(|c| c < 0) {
                return Err(refuse("--gpus", "all".into()));
            }
        }
        Ok(())
    }

    /// Checks memory, shared memory, CPUs and pids against the Ray
    /// container's own limits (rule `resources`), in that order: where the
    /// Ray container is limited, the engine must be too, and no higher,
    /// or a job could use more of the node than Ray was given. `--shm-size`
    /// is only checked when given (it counts against the memory limit).
    fn check_limits(&self, hc: &HostConfig) -> Result<(), PolicyError> {
        let refuse = |flag, value: String| PolicyError::Flag {
            flag,
            value,
            rule: "resources",
        };
        let l = &self.limits;
        if over_limit(hc.memory, l.memory) {
            return Err(refuse(
                "--memory",
                format!(
                    "{:?} (this container's limit: {} bytes)",
                    hc.memory, l.memory
                ),
            ));
        }
        if over_limit(hc.shm_size, l.memory) && hc.shm_size.is_some() {
            return Err(refuse(
                "--shm-size",
                format!(
                    "{:?} (this container's memory: {} bytes)",
                    hc.shm_size, l.memory
                ),
            ));
        }
        if over_limit(hc.nano_cpus, l.nano_cpus) {
            return Err(refuse(
                "--cpus",
                format!(
                    "{:?} (this container's limit: {} CPUs)",
                    hc.nano_cpus.map(|n| n as f64 / 1e9),
                    l.nano_cpus as f64 / 1e9
                ),
            ));
        }
        if over_limit(hc.pids_limit, l.pids) {
            return Err(refuse(
                "--pids-limit",
                format!("{:?} (this container's limit: {})", hc.pids_limit, l.pids),
            ));
        }
        Ok(())
    }

    /// Whether the Ray container has a memory, CPU or pids limit, which a
    /// job's own engines together must stay within
    /// ([`Policy::check_job_total`]); without one there is nothing to sum.
    pub fn bounds_job_totals(&self) -> bool {
        let l = &self.limits;
        l.memory > 0 || l.nano_cpus > 0 || l.pids > 0
    }

    /// Checks that a Ray job's own live engine containers on this node
    /// (`used`, their limits as Docker holds them) and the new one (`new`)
    /// together hold no more memory, CPUs and pids than the Ray container
    /// was given, for each the Ray container is limited in (rule
    /// `engines-per-job`): each engine may have up to the Ray container's
    /// own limit (rule `resources`), so without this sum a job's
    /// [`DEFAULT_MAX_ENGINES_PER_JOB`] engines would hold that many times
    /// the node. An engine with no limit of its own (made under the relaxed
    /// policy) counts as the whole of the Ray container's.
    pub fn check_job_total(
        &self,
        job: u32,
        used: &[Limits],
        new: &Limits,
    ) -> Result<(), PolicyError> {
        let l = &self.limits;
        let sum = |limit: i64, of: fn(&Limits) -> i64| -> i64 {
            let each = |x: &Limits| match of(x) {
                n if n > 0 => n.min(limit),
                _ => limit,
            };
            used.iter()
                .chain([new])
                .map(each)
                .fold(0i64, i64::saturating_add)
        };
        type Of = fn(&Limits) -> i64;
        let checks: [(&'static str, i64, Of); 3] = [
            ("bytes of memory", l.memory, |x| x.memory),
            ("10^-9 CPUs", l.nano_cpus, |x| x.nano_cpus),
            ("pids", l.pids, |x| x.pids),
        ];
        for (what, limit, of) in checks {
            if limit <= 0 {
                continue;
            }
            let total = sum(limit, of);
            if total > limit {
                return Err(PolicyError::JobTotal {
                    job,
                    what,
                    total,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// Checks `--cpuset-cpus` (rule `resources`): when the Ray container is
    /// pinned to a set of CPUs, the engine must be pinned to a non-empty
    /// subset of it, so a job cannot run on CPUs given to another.
    fn check_cpuset(&self, hc: &HostConfig) -> Result<(), PolicyError> {
        let have = &self.limits.cpuset_cpus;
        if have.is_empty() {
            return Ok(());
        }
        let want = hc.cpuset_cpus.as_deref().unwrap_or("");
        let inside = match (cpuset(want), cpuset(have)) {
            (Some(w), Some(h)) => !w.is_empty() && w.is_subset(&h),
            _ => false,
        };
        if inside {
            Ok(())
        } else {
            Err(PolicyError::Flag {
                flag: "--cpuset-cpus",
                value: format!("{want:?} (this container's: {have})"),
                rule: "resources",
            })
        }
    }

    /// Checks the identity the create body gives the container (R-SEC-1):
    /// `User` is `UID:GID` in decimal, no supplementary group; the uid is
    /// the caller's or one `ARGUS_SHIM_ALLOWED_USERS` lists (0 only when
    /// listed by number), the gid the caller's or, for a listed uid, any
    /// but 0 and the Docker socket's; and no uid 0 in a shared PID
    /// namespace unless the caller is root itself (road 4: a root engine
    /// there reaches `/proc/<pid>/root` of the node's root processes).
    fn check_identity(&self, body: &ContainerCreateBody) -> Result<(), PolicyError> {
        let refuse = |flag, value: String, rule| PolicyError::Flag { flag, value, rule };
        let user = body.user.as_deref().unwrap_or("");
        let ids = user.split_once(':').and_then(|(u, g)| {
            let canonical = |s: &str, n: u32| n.to_string() == s;
            let (uid, gid) = (u.parse::<u32>().ok()?, g.parse::<u32>().ok()?);
            (canonical(u, uid) && canonical(g, gid)).then_some((uid, gid))
        });
        let Some((uid, gid)) = ids else {
            return Err(refuse(
                "--user",
                format!("{user:?} (an engine container's user is UID:GID in decimal)"),
                "users",
            ));
        };
        let hc = body.host_config.as_ref();
        if let Some(g) = hc
            .and_then(|h| h.group_add.as_ref())
            .and_then(|g| g.first())
        {
            return Err(refuse(
                "--group-add",
                format!("{g} (engine containers have no supplementary group)"),
                "groups",
            ));
        }
        let (own_uid, own_gid) = match self.caller {
            Some((u, g)) => (Some(u), Some(g)),
            None => (None, None),
        };
        let listed = (self.any_user && uid != 0) || self.allowed_users.contains(&uid);
        if own_uid != Some(uid) && !listed {
            return Err(refuse(
                "--user/--userns",
                format!(
                    "{user} (engine containers run as their caller{}, unless ARGUS_SHIM_ALLOWED_USERS lists the uid)",
                    self.caller.map(|(u, g)| format!(", {u}:{g}")).unwrap_or_default()
                ),
                "users",
            ));
        }
        // The agent's writer identity owns the shared discovery state:
        // an engine with its uid (or its group) and the shared root bound
        // could forge what readers trust as the agent's, so no
        // ARGUS_SHIM_ALLOWED_USERS entry (`*` included) gives it.
        if let Some((agent_uid, _)) = self.agent_user {
            if uid == agent_uid && own_uid != Some(uid) {
                return Err(refuse(
                    "--user/--userns",
                    format!("{user} (ARGUS_AGENT_USER's uid: the agent's writer identity, which owns the shared discovery state)"),
                    "users",
                ));
            }
        }
        if own_gid != Some(gid) {
            let why = if gid == 0 {
                Some("the root group")
            } else if self.socket_gid == Some(gid) {
                Some("the Docker socket's group")
            } else if self.agent_user.is_some_and(|(_, g)| g == gid) {
                Some("ARGUS_AGENT_USER's group, which owns the shared discovery state")
            } else if !listed {
                Some("not the caller's group, and ARGUS_SHIM_ALLOWED_USERS does not list the uid")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(refuse(
                    "--user/--userns",
                    format!("{user} ({why})"),
                    "groups",
                ));
            }
        }
        let pid = hc.and_then(|h| h.pid_mode.as_deref()).unwrap_or("");
        let shared_pid = !(pid.is_empty() || pid == "private");
        if uid == 0 && shared_pid && own_uid != Some(0) {
            return Err(refuse(
                "--user/--pid",
                format!(
                    "{user} with --pid {pid} (a root process in a shared PID namespace reaches the node's root processes through /proc)"
                ),
                "no-root-shared-pid",
            ));
        }
        Ok(())
    }

    fn check_namespaces(&self, o: &RunOpts) -> Result<(), PolicyError> {
        // R-SEC-9: a container in the node's (or another engine's) network,
        // PID or IPC namespace dies with its call. Detached, nothing would
        // end it: it could outlive its job and, in the node's namespaces,
        // take the Serve proxy's port or signal the node's processes.
        if o.detach {
            let shared = [
                ("--network", o.network.as_deref()),
                ("--pid", o.pid.as_deref()),
                ("--ipc", o.ipc.as_deref()),
            ]
            .into_iter()
            .find(|(_, v)| v.is_some_and(|v| v == "host" || v.starts_with("container:")));
            if let Some((flag, Some(v))) = shared {
                return Err(PolicyError::Flag {
                    flag,
                    value: format!(
                        "{v} with --detach (a detached container sharing the node's or another container's namespace would outlive its job: run it attached, and it ends with its call)"
                    ),
                    rule: "namespaces",
                });
            }
        }
        // A network of its own is one the Ray container is attached to
        // (podman's private network kinds are Docker's bridge).
        if let Some(n) = o.network.as_deref() {
            let name = match n {
                "private" | "slirp4netns" | "pasta" => "bridge",
                n => n,
            };
            let ok = matches!(name, "host" | "none")
                || name
                    .strip_prefix("container:")
                    .is_some_and(|c| self.owned_refs.contains(c))
                || self.networks.iter().any(|m| m == name);
            if !ok {
                return Err(PolicyError::Flag {
                    flag: "--network",
                    value: format!(
                        "{n} (this container's networks: {})",
                        show_list(&self.networks)
                    ),
                    rule: "namespaces",
                });
            }
        }
        let flags: [(&'static str, Option<&str>, &[&str]); 4] = [
            ("--pid", o.pid.as_deref(), &["host", "private", ""]),
            (
                "--ipc",
                o.ipc.as_deref(),
                &["host", "private", "shareable", "none", ""],
            ),
            ("--uts", o.uts.as_deref(), &["host", "private", ""]),
            ("--cgroupns", o.cgroupns.as_deref(), &["private"]),
        ];
        for (flag, value, allowed) in flags {
            let Some(v) = value else { continue };
            let ok = allowed.contains(&v)
                || v.strip_prefix("container:")
                    .is_some_and(|c| self.owned_refs.contains(c));
            if !ok {
                return Err(PolicyError::Flag {
                    flag,
                    value: v.into(),
                    rule: "namespaces",
                });
            }
        }
        Ok(())
    }

    /// Returns true if and only if `--device d` may be given: a device the
    /// Ray container was given, or an NVIDIA or DRI device node present in
    /// it (the GPUs it has); CDI names only of its GPUs.
    fn device_allowed(&self, d: &str) -> bool {
        if d.contains('=') && !d.starts_with('/') {
            // CDI: only NVIDIA's GPUs, and only the Ray container's.
            return match (d.strip_prefix("nvidia.com/gpu="), &self.gpus) {
                (Some(_), Gpus::All) => true,
                (Some(id), Gpus::List(l)) => l.iter().any(|h| h == id),
                (None, _) => false,
            };
        }
        let host = d.split(':').next().unwrap_or("");
        if !host.starts_with('/') || host.split('/').any(|c| c == ".." || c == ".") {
            return false;
        }
        let p = normalize(Path::new(host));
        let name = p.strip_prefix("/dev").ok().and_then(|r| r.to_str());
        let gpu_node = name.is_some_and(|n| {
            n.starts_with("nvidia") || (n.starts_with("dri/") && n.len() > "dri/".len())
        });
        (gpu_node && self.present_devices.contains(host))
            || self.ray_devices.iter().any(|r| Path::new(r) == p)
    }

    /// Refuses mount propagation out of the container (a mount made in the
    /// engine would appear on the host).
    fn check_volume(&self, v: &Volume) -> Result<(), PolicyError> {
        match v
            .options
            .iter()
            .find(|o| matches!(o.as_str(), "shared" | "rshared" | "slave" | "rslave"))
        {
            Some(o) => Err(PolicyError::Flag {
                flag: "--volume/--mount propagation",
                value: format!("{}:{}", v.target, o),
                rule: "bind-propagation",
            }),
            None => Ok(()),
        }
    }

    /// Checks one bind: `caller` is the canonical source in the Ray
    /// container, `host` where it is on the host (None: not visible there,
    /// so it is copied in and back).
    fn check_bind(
        &self,
        caller: &str,
        host: Option<&str>,
        via_volume: bool,
    ) -> Result<(), PolicyError> {
        let err = |rule| PolicyError::Bind {
            path: caller.to_string(),
            host: host.unwrap_or("none: copied").to_string(),
            rule,
        };
        if let Some(rule) = self.bad_bind(caller, host.unwrap_or(caller), via_volume) {
            return Err(err(rule));
        }
        let allowed = match host {
            Some(h) => self.roots.iter().any(|r| {
                r.host
                    .as_deref()
                    .is_some_and(|rh| Path::new(h).starts_with(rh))
            }),
            None => self
                .roots
                .iter()
                .any(|r| Path::new(caller).starts_with(&r.caller)),
        };
        if allowed {
            Ok(())
        } else {
            Err(err("binds (not under ARGUS_SHIM_ALLOWED_BINDS)"))
        }
    }

    /// Returns the hard rule a bind breaks, if any: these hold whatever the
    /// allow-list says.
    fn bad_bind(&self, caller: &str, host: &str, via_volume: bool) -> Option<&'static str> {
        let under = |p: &str, dir: &str| Path::new(p).starts_with(dir);
        for p in [caller, host] {
            if self.docker_sockets.iter().any(|s| p == s) || p.ends_with("/docker.sock") {
                return Some("no-docker-socket-bind");
            }
            if p == "/" {
                return Some("no-host-root-bind");
            }
            // A parent of the socket exposes it too.
            if self
                .docker_sockets
                .iter()
                .any(|s| Path::new(s).starts_with(p))
            {
                return Some("no-docker-socket-bind");
            }
            for (dir, rule) in [
                ("/etc", "no-etc-bind"),
                ("/proc", "no-proc-bind"),
                ("/sys", "no-sys-bind"),
            ] {
                if under(p, dir) {
                    return Some(rule);
                }
            }
        }
        // Volumes live under the daemon's data root: that is their nature,
        // not a bind of it.
        if under(caller, "/var/lib/docker") || (under(host, "/var/lib/docker") && !via_volume) {
            return Some("no-docker-data-bind");
        }
        None
    }
}

/// Checks one environment entry the job set (`-e` or an `--env-file`
/// line: `K=V`, `K`, or `PREFIX*`): a job may not set the shim's own
/// variables (rule `no-job-policy`).
pub fn check_job_env(entry: &str) -> Result<(), PolicyError> {
    let name = entry.split_once('=').map(|(k, _)| k).unwrap_or(entry);
    let name = name.trim();
    // `-e 'PREFIX*'` copies every variable of the shim's environment with
    // that prefix: one that covers `ARGUS_SHIM_` sets them too.
    let covers = match name.strip_suffix('*') {
        Some(prefix) => "ARGUS_SHIM_".starts_with(prefix),
        None => false,
    };
    if name.starts_with("ARGUS_SHIM_") || covers {
        return Err(PolicyError::JobPolicy { name: name.into() });
    }
    Ok(())
}

/// Returns true if and only if a wanted limit breaks the Ray container's
/// own (`have`; 0 or less: not limited): where the Ray container is
/// limited, a wanted limit that is unset, 0 or less (unlimited) or higher
/// than `have` would let the engine use more than Ray was given.
fn over_limit(want: Option<i64>, have: i64) -> bool {
    have > 0 && want.is_none_or(|w| w <= 0 || w > have)
}

/// Returns `l` comma-separated, or `none`.
fn show_list(l: &[String]) -> String {
    if l.is_empty() {
        "none".into()
    } else {
        l.join(",")
    }
}

/// Parses a cpuset list (`0-3,6`) into its CPUs; None when malformed or
/// larger than 4,096 CPUs.
pub fn cpuset(s: &str) -> Option<std::collections::BTreeSet<u32>> {
    let mut out = std::collections::BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        if a > b || b >= 4096 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// A parsed image reference, normalised the way Docker does:
/// `ubuntu` -> `docker.io/library/ubuntu`, tag `latest` when there is
/// neither tag nor digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `registry/path`, the registry lower case.
    pub name: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses `image`; None for what Docker would not take as a name
    /// (upper case in the path, empty parts) or takes as an image id.
    pub fn parse(image: &str) -> Option<ImageRef> {
        let (rest, digest) = match image.split_once('@') {
            Some((r, d)) => (r, Some(d.to_string())),
            None => (image, None),
        };
        let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_string()),
            ),
            None => (rest, None),
        };
        let is_id =
            |s: &str| s.len() >= 12 && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if name.is_empty()
            || image.starts_with("sha256:")
            || (digest.is_none() && tag.is_none() && is_id(name))
            || tag.as_deref().is_some_and(str::is_empty)
        {
            return None;
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, p))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_ascii_lowercase(), p.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
            _ => registry,
        };
        if path.is_empty()
            || path.split('/').any(str::is_empty)
            || path.bytes().any(|b| b.is_ascii_uppercase())
        {
            return None;
        }
        let path = if registry == "docker.io" && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Some(ImageRef {
            name: format!("{registry}/{path}"),
            tag,
            digest,
        })
    }
}

/// Returns true if and only if `image` matches the allow-list entry `pat`:
/// - `prefix*`: the normalised name starts with the normalised prefix;
/// - a name without tag or digest: that repository, any tag or digest;
/// - `name:tag`: that tag, without a digest (a digest would override it);
/// - `name@digest` (with or without a tag): exactly that digest.
///
/// Image ids and names Docker would refuse never match.
pub fn image_matches(pat: &str, image: &str) -> bool {
    let Some(img) = ImageRef::parse(image) else {
        return false;
    };
    if let Some(prefix) = pat.strip_suffix('*') {
        let full = match (&img.tag, &img.digest) {
            (_, Some(d)) => format!("{}@{d}", img.name),
            (Some(t), None) => format!("{}:{t}", img.name),
            (None, None) => img.name.clone(),
        };
        return full.starts_with(&normalize_prefix(prefix));
    }
    let explicit_tag = {
        let rest = pat.split('@').next().unwrap_or(pat);
        let last = rest.rsplit('/').next().unwrap_or(rest);
        last.contains(':')
    };
    let Some(p) = ImageRef::parse(pat) else {
        return false;
    };
    if p.name != img.name {
        return false;
    }
    match (&p.digest, explicit_tag) {
        (Some(d), _) => img.digest.as_ref() == Some(d),
        (None, true) => img.digest.is_none() && img.tag == p.tag,
        (None, false) => true,
    }
}

/// Normalises the registry part of an allow-list prefix the way
/// [`ImageRef::parse`] normalises names (`ubuntu:` ->
/// `docker.io/library/ubuntu:`, `Registry.Local/x` -> `registry.local/x`).
fn normalize_prefix(prefix: &str) -> String {
    match prefix.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            let registry = first.to_ascii_lowercase();
            let registry = match registry.as_str() {
                "index.docker.io" | "registry-1.docker.io" => "docker.io",
                r => r,
            };
            if registry == "docker.io" && !rest.contains('/') && !rest.is_empty() {
                format!("docker.io/library/{rest}")
            } else {
                format!("{registry}/{rest}")
            }
        }
        Some(_) => format!("docker.io/{prefix}"),
        None if prefix.is_empty() => String::new(),
        None => format!("docker.io/library/{prefix}"),
    }
}

/// Returns the fully qualified form of an image reference, with the
/// registry and the default `latest` tag (`ubuntu` ->
/// `docker.io/library/ubuntu:latest`); the input when it does not parse.
pub fn canonical(image: &str) -> String {
    match ImageRef::parse(image) {
        Some(r) => match (r.tag, r.digest) {
            (Some(t), Some(d)) => format!("{}:{t}@{d}", r.name),
            (None, Some(d)) => format!("{}@{d}", r.name),
            (Some(t), None) => format!("{}:{t}", r.name),
            (None, None) => r.name,
        },
        None => image.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{parse, Command};
    use crate::translate::{translate, Context, TranslateError};

    /// Resolves a path the way these tests' imaginary Ray container does:
    /// lexically (nothing in it is a symlink). The real resolution is
    /// `shim::resolve`, tested there and against the daemon.
    fn lexical(p: &Path) -> Option<PathBuf> {
        Some(normalize(&Path::new("/").join(p)))
    }

    fn check(policy: &Policy, argv: &[&str]) -> Result<(), PolicyError> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        let (uid, gid) = policy.caller.unwrap_or((1000, 100));
        let mut ctx = Context {
            uid,
            gid,
            ..Default::default()
        };
        for v in o.volumes.iter().filter(|v| v.is_path()) {
            let c = lexical(Path::new(&v.source)).unwrap();
            ctx.canonical
                .insert(v.source.clone(), c.display().to_string());
        }
        let plan = translated(&o, &ctx)?;
        // A policy built without a caller is this context's.
        let mut policy = policy.clone();
        policy.caller.get_or_insert((ctx.uid, ctx.gid));
        policy.check_run(&o, &plan)?;
        policy.check_body(&plan.body)
    }

    /// [`translate`], with its refusals as the policy's (their rule kept).
    fn translated(o: &RunOpts, ctx: &Context) -> Result<Plan, PolicyError> {
        translate(o, ctx).map_err(|e| match e {
            TranslateError::Refused { value, rule, .. } => PolicyError::Flag {
                flag: "translate",
                value,
                rule,
            },
            TranslateError::Unsupported { value, .. } => PolicyError::Flag {
                flag: "translate",
                value,
                rule: "unsupported",
            },
            e => panic!("translate: {e}"),
        })
    }

    /// The default policy for a caller 1000:100 on a node whose Docker
    /// socket's group is 999.
    fn strict() -> Policy {
        let mut p = Policy::from_env(|_| None).unwrap();
        p.resolve(None, lexical);
        p.caller = Some((1000, 100));
        p.socket_gid = Some(999);
        p
    }

    fn rule_of(r: Result<(), PolicyError>) -> String {
        match r {
            Err(PolicyError::Bind { rule, .. }) | Err(PolicyError::Flag { rule, .. }) => {
                rule.to_string()
            }
            Err(PolicyError::Refused { rule, .. }) => rule.into(),
            Err(PolicyError::CapAdd(_)) => "capabilities".into(),
            Err(e) => e.to_string(),
            Ok(()) => "ok".into(),
        }
    }

    #[test]
    fn each_escape_is_refused_by_its_rule() {
        let p = strict();
        for (argv, rule) in [
            (vec!["--privileged"], "no-privileged"),
            (vec!["--cap-add", "all"], "capabilities"),
            (vec!["--cap-add", "SYS_ADMIN"], "capabilities"),
            (vec!["--cap-add", "cap_net_admin"], "capabilities"),
            (vec!["--security-opt", "seccomp=unconfined"], "security-opt"),
            (
                vec!["--security-opt", "apparmor=unconfined"],
                "security-opt",
            ),
            (
                vec!["--security-opt", "systempaths=unconfined"],
                "security-opt",
            ),
            (
                vec!["--security-opt", "label=level:s0:c100,c200"],
                "security-opt",
            ),
            (vec!["--security-opt", "label:level:s0"], "security-opt"),
            (vec!["--userns=host"], "userns"),
            (vec!["--device", "/dev/vda"], "devices"),
            (vec!["--device", "/dev/nvidia0/../vda"], "devices"),
            (vec!["--device", "/dev/dri/../sda:/dev/x"], "devices"),
            (vec!["--device", "vendor.com/x=1"], "devices"),
            (vec!["--network", "container:someone"], "namespaces"),
            (vec!["--pid", "container:someone"], "namespaces"),
            (vec!["--ipc", "container:someone"], "namespaces"),
            (vec!["--network", "mynet"], "namespaces"),
            (vec!["--cgroupns", "host"], "namespaces"),
            (vec!["--cgroup-parent", "/"], "no-cgroup-parent"),
            (vec!["--label", "io.argus.shim.owner=x"], "no-shim-labels"),
            (vec!["--label", "io.argus.cluster=other"], "no-shim-labels"),
            (
                vec!["-l", "com.docker.compose.project=argus"],
                "no-shim-labels",
            ),
            (
                vec!["-v", "/var/lib:/vl"],
                "binds (not under ARGUS_SHIM_ALLOWED_BINDS)",
            ),
            (
                vec!["-v", "/home:/h"],
                "binds (not under ARGUS_SHIM_ALLOWED_BINDS)",
            ),
            (
                vec!["-v", "/tmp/ray/../../var/lib:/vl"],
                "binds (not under ARGUS_SHIM_ALLOWED_BINDS)",
            ),
            (
                vec!["--mount", "type=bind,src=/var/lib,dst=/vl"],
                "binds (not under ARGUS_SHIM_ALLOWED_BINDS)",
            ),
            (
                vec![
                    "--mount",
                    "type=bind,src=/tmp/ray,dst=/x,bind-propagation=rshared",
                ],
                "bind-propagation",
            ),
            (vec!["-v", "/tmp/ray:/x:shared"], "bind-propagation"),
            (
                vec!["-v", "/var/run/docker.sock:/s"],
                "no-docker-socket-bind",
            ),
            (vec!["-v", "/var/run:/s"], "no-docker-socket-bind"),
            (vec!["-v", "/:/host"], "no-host-root-bind"),
            (vec!["-v", "/etc:/x"], "no-etc-bind"),
            (vec!["-v", "/proc:/x"], "no-proc-bind"),
            (vec!["-v", "/sys/fs:/x"], "no-sys-bind"),
            (vec!["-v", "/var/lib/docker:/x"], "no-docker-data-bind"),
            // Named volumes, log drivers, ulimits, restart
            // policies, tmpfs options, SELinux label types, networks.
            (vec!["-v", "someone-elses:/v"], "binds"),
            (
                vec!["--mount", "type=volume,src=someone-elses,dst=/v"],
                "binds",
            ),
            (vec!["--log-driver", "syslog"], "log-driver"),
            (vec!["--log-driver", "gelf"], "log-driver"),
            (
                vec!["--log-opt", "syslog-address=udp://203.0.113.9:514"],
                "log-driver",
            ),
            (vec!["--ulimit", "nofile=1024"], "ulimits"),
            (vec!["--ulimit", "bogus=1"], "ulimits"),
            (vec!["--restart", "always"], "restart"),
            (vec!["--restart", "on-failure:3"], "restart"),
            (vec!["--tmpfs", "/t:suid"], "tmpfs"),
            (vec!["--tmpfs", "/t:exec,dev"], "tmpfs"),
            (vec!["--security-opt", "label=disable"], "security-opt"),
            (vec!["--security-opt", "label=type:spc_t"], "security-opt"),
            (vec!["--security-opt", "label:disable"], "security-opt"),
            (vec!["--network", "bridge"], "namespaces"),
            (vec!["--network", "private"], "namespaces"),
            (vec!["--net", "pasta"], "namespaces"),
            // GPU nodes that are not in the Ray container.
            (vec!["--device", "/dev/nvidia0"], "devices"),
            (vec!["--device", "/dev/nvidia-caps/nvidia-cap1"], "devices"),
        ] {
            let mut full = vec!["run"];
            full.extend(argv.iter().copied());
            full.push("img");
            let refused = check(&p, &full);
            let label = refused.as_ref().err().and_then(PolicyError::rule);
            assert_eq!(label, Some(refusal_label(rule)), "{argv:?}");
            assert_ne!(label, Some("other"), "{argv:?}: {rule}");
            assert_eq!(rule_of(refused), rule, "{argv:?}");
        }
        assert_eq!(
            check(&p, &["run", "-e", "ARGUS_SHIM_POLICY=relaxed", "i"]),
            Err(PolicyError::JobPolicy {
                name: "ARGUS_SHIM_POLICY".into()
            })
        );
    }

    #[test]
    fn every_rule_has_a_bounded_snake_case_label() {
        use crate::args::RUN_FLAGS;
        let labels: HashSet<&str> = REFUSAL_RULES.iter().copied().collect();
        assert_eq!(labels.len(), REFUSAL_RULES.len(), "a label is listed twice");
        for l in REFUSAL_RULES {
            assert!(
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{l}"
            );
            assert_eq!(refusal_label(l), *l);
        }
        // The flag table's rules, the bind rules and the others by name.
        let table = RUN_FLAGS.iter().filter_map(|f| match f.rule {
            Rule::Checked(r) | Rule::Refused(r) => Some(r),
            _ => None,
        });
        let named = [
            "bind-propagation",
            "no-docker-socket-bind",
            "no-host-root-bind",
            "no-etc-bind",
            "no-proc-bind",
            "no-sys-bind",
            "no-docker-data-bind",
            "no-writable-subfolder-bind",
            "allowed-images",
            "binds (not under ARGUS_SHIM_ALLOWED_BINDS)",
        ];
        for r in table.chain(CHECKED_RULES.iter().copied()).chain(named) {
            assert_ne!(refusal_label(r), "other", "{r} has no label");
        }
        // Whatever a caller writes is `other`.
        for junk in ["", "no-privileged-x", "NO_PRIVILEGED", "x\n", "\u{0}"] {
            assert_eq!(refusal_label(junk), "other", "{junk:?}");
        }
        // Every refusal docs/shim.md's policy table names has a label.
        let doc =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/shim.md"))
                .unwrap();
        let table = doc
            .split("## Policy: default deny")
            .nth(1)
            .and_then(|t| t.split("\n\n").nth(2))
            .unwrap();
        let mut seen = 0;
        for row in table.lines().skip(2) {
            let first = row.split('|').nth(1).unwrap_or("");
            for name in first.split('`').skip(1).step_by(2) {
                assert_ne!(refusal_label(name), "other", "docs/shim.md: {name}");
                seen += 1;
            }
        }
        assert!(seen > 20, "{table}");
        // docs/shim.md's list of labels is this one.
        let listed: Vec<&str> = doc
            .split("The whole set:")
            .nth(1)
            .and_then(|t| t.split(" (a unit test").next())
            .unwrap()
            .split('`')
            .skip(1)
            .step_by(2)
            .collect();
        assert_eq!(listed, REFUSAL_RULES, "docs/shim.md, section Metrics");
        let setting = PolicyError::Setting {
            name: "ARGUS_SHIM_POLICY",
            value: "x".into(),
            why: "bad",
        };
        assert_eq!(setting.rule(), None);
        assert_eq!(
            PolicyError::NotOwned { name: "c".into() }.rule(),
            Some("owned_containers_only")
        );
    }

    #[test]
    fn every_checked_rule_of_the_flag_table_is_checked_here() {
        use crate::args::RUN_FLAGS;
        let used: HashSet<&str> = RUN_FLAGS
            .iter()
            .filter_map(|f| match f.rule {
                Rule::Checked(r) => Some(r),
                _ => None,
            })
            .collect();
        let known: HashSet<&str> = CHECKED_RULES.iter().copied().collect();
        assert_eq!(used, known);
        // A refused flag is refused by the table alone, as given.
        let p = strict();
        assert_eq!(
            rule_of(check(&p, &["run", "--privileged=false", "i"])),
            "ok"
        );
        assert_eq!(
            rule_of(check(
                &p,
                &["run", "--privileged", "--privileged=false", "i"]
            )),
            "ok"
        );
        assert_eq!(
            rule_of(check(
                &p,
                &["run", "--privileged=false", "--privileged", "i"]
            )),
            "no-privileged"
        );
    }

    #[test]
    fn allowed_forms_pass() {
        let mut p = Policy::from_env(|k| match k {
            "ARGUS_SHIM_ALLOWED_CAPS" => Some("net_admin, CAP_SYS_PTRACE".into()),
            "ARGUS_SHIM_ALLOWED_BINDS" => Some("/srv/models:/tmp/ray".into()),
            "ARGUS_SHIM_ALLOWED_VOLUMES" => Some("named, cach*".into()),
            _ => None,
        })
        .unwrap();
        p.owned_refs.insert("mine".into());
        p.resolve(None, lexical);
        p.present_devices = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/dri/renderD128"]
            .map(String::from)
            .into();
        p.caller_ulimits = [("nofile".to_string(), 65536), ("memlock".to_string(), -1)].into();
        for argv in [
            vec![
                "--cap-add",
                "NET_ADMIN",
                "--cap-add",
                "sys_ptrace",
                "--cap-drop",
                "ALL",
            ],
            vec![
                "--security-opt",
                "label=filetype:container_file_t",
                "--security-opt",
                "no-new-privileges",
            ],
            vec!["--userns=keep-id:uid=1000,gid=100"],
            vec!["--network=host", "--pid=host", "--ipc=host", "--uts=host"],
            vec!["--network", "container:mine", "--pid", "container:mine"],
            vec!["--network", "none", "--ipc", "private"],
            vec![
                "--device",
                "/dev/nvidia0",
                "--device",
                "/dev/nvidiactl:/dev/nvidiactl:rw",
            ],
            vec![
                "--device",
                "/dev/dri/renderD128",
                "--device",
                "nvidia.com/gpu=0",
            ],
            vec!["-v", "/srv/models/llama:/m:ro", "-v", "/tmp/ray:/tmp/ray"],
            vec!["-v", "named:/data", "-v", "/anon", "--tmpfs", "/t:size=1m"],
            vec!["--mount", "type=bind,source=/srv/models,target=/m,readonly"],
            vec![
                "--mount",
                "type=volume,src=cache,dst=/c",
                "--mount",
                "type=tmpfs,dst=/t,tmpfs-size=1m",
            ],
            vec![
                "--mount",
                "type=bind,src=/tmp/ray,dst=/x,bind-propagation=rprivate",
            ],
            vec!["--label", "app=x"],
            vec!["--log-driver", "json-file", "--log-opt", "max-size=10m"],
            vec!["--log-driver=local", "--log-opt", "max-file=3"],
            vec!["--ulimit", "nofile=1024:65536", "--ulimit", "memlock=-1"],
            vec!["--restart", "no"],
            vec!["--tmpfs", "/t:size=1m,mode=1777,noexec,nosuid,nodev"],
            vec!["--memory", "1g", "--cpus", "2", "--pids-limit", "100"],
        ] {
            let mut full = vec!["run"];
            full.extend(argv.iter().copied());
            full.push("img");
            assert_eq!(rule_of(check(&p, &full)), "ok", "{argv:?}");
        }
        // Ray's own calls, as Ray 2.53 makes them.
        let d = strict();
        assert_eq!(
            rule_of(check(
                &d,
                &["run", "--rm", "-v", "/tmp/tmpe9l02fnh:/shared:Z", "i"]
            )),
            "ok"
        );
        let argv = crate::args::tests::ray_worker_argv();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert_eq!(rule_of(check(&d, &argv)), "ok");
    }

    #[test]
    fn the_ray_containers_own_devices_are_allowed() {
        let mut p = Policy::from_env(|_| None).unwrap();
        let mut me = crate::selfid::SelfContainer {
            id: "x".into(),
            network_mode: String::new(),
            pid_mode: String::new(),
            ipc_mode: String::new(),
            uts_mode: String::new(),
            hostname: String::new(),
            mounts: vec![],
            gpus: crate::selfid::Gpus::All,
            devices: vec!["/dev/fuse".into()],
            networks: vec![],
            limits: Default::default(),
            compose_project: None,
        };
        p.resolve(Some(&me), lexical);
        assert_eq!(
            rule_of(check(&p, &["run", "--device", "/dev/fuse", "i"])),
            "ok"
        );
        me.devices.clear();
        p.resolve(Some(&me), lexical);
        assert_eq!(
            rule_of(check(&p, &["run", "--device", "/dev/fuse", "i"])),
            "devices"
        );
    }

    #[test]
    fn relaxed_lifts_rules_but_not_the_allow_list() {
        let mut p = Policy::from_env(|k| match k {
            "ARGUS_SHIM_POLICY" => Some("relaxed".into()),
            "ARGUS_SHIM_ALLOWED_IMAGES" => Some("registry.local/ray/*, ubuntu".into()),
            _ => None,
        })
        .unwrap();
        // As the edge resolves them: the caller's image by full ID, with
        // the names the daemon holds for it.
        let id = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        p.images = vec![
            ResolvedImage {
                id: id('a'),
                names: vec!["registry.local/ray/x:1".into()],
            },
            ResolvedImage {
                id: id('b'),
                names: vec!["ubuntu:latest".into(), "ubuntu@sha256:feed".into()],
            },
            ResolvedImage {
                id: id('c'),
                names: vec!["evil/ubuntu:latest".into()],
            },
        ];
        assert!(check(
            &p,
            &[
                "run",
                "--privileged",
                "-v",
                "/:/host",
                "--device",
                "/dev/vda",
                &id('a')
            ]
        )
        .is_ok());
        assert!(check(&p, &["run", &id('b')]).is_ok());
        assert_eq!(
            check(&p, &["run", &id('c')]),
            Err(PolicyError::Image { image: id('c') })
        );
        // Names are never enough: only a resolved full ID passes.
        for name in [
            "ubuntu",
            "docker.io/library/ubuntu:latest",
            "registry.local/ray/x:1",
        ] {
            assert!(
                matches!(check(&p, &["run", name]), Err(PolicyError::Image { .. })),
                "{name}"
            );
            assert!(p.image_name_allowed(name), "{name} may be pulled");
        }
        assert!(!p.image_name_allowed("evil/ubuntu"));
    }

    #[test]
    fn images_are_allowed_by_full_id_never_by_spelling() {
        let mut p = Policy::from_env(|k| {
            (k == "ARGUS_SHIM_ALLOWED_IMAGES").then(|| "registry.local/ray/x:1".to_string())
        })
        .unwrap();
        let listed = format!("sha256:{}", "1".repeat(64));
        let other = format!("sha256:{}", "2".repeat(64));
        p.listed_image_ids.insert(listed.clone());
        p.images = vec![
            ResolvedImage {
                id: listed.clone(),
                names: vec![],
            },
            // Another image, whatever names it has, is refused.
            ResolvedImage {
                id: other.clone(),
                names: vec!["registry.local/ray/x:2".into(), "ubuntu:latest".into()],
            },
        ];
        assert!(p.image_allowed(&listed));
        assert!(!p.image_allowed(&other));
        // Unresolved spellings: prefixes, upper case, short IDs, tags.
        let hex = "1".repeat(64);
        for n in 1..64 {
            assert!(!p.image_allowed(&hex[..n]), "{n}");
            assert!(!p.image_allowed(&format!("sha256:{}", &hex[..n])), "{n}");
        }
        assert!(!p.image_allowed(&listed.to_ascii_uppercase()));
        assert!(!p.image_allowed(&hex));
        assert!(!p.image_allowed("registry.local/ray/x:1"));
        // A resolved entry that is not a full ID never counts.
        p.images.push(ResolvedImage {
            id: "registry.local/ray/x:1".into(),
            names: vec!["registry.local/ray/x:1".into()],
        });
        assert!(!p.image_allowed("registry.local/ray/x:1"));
        assert!(is_image_id(&listed) && !is_image_id(&hex) && !is_image_id("sha256:abc"));
    }

    #[test]
    fn bad_settings_name_the_variable() {
        for (k, v) in [
            ("ARGUS_SHIM_POLICY", "relax"),
            ("ARGUS_SHIM_POLICY", "Relaxed"),
            ("ARGUS_SHIM_ALLOWED_BINDS", "/ok:relative"),
            ("ARGUS_SHIM_MAX_ENGINES_PER_JOB", "0"),
            ("ARGUS_SHIM_MAX_LOG_FOLLOWS", "0"),
            ("ARGUS_SHIM_MAX_LOG_FOLLOWS", "1025"),
            ("ARGUS_SHIM_MAX_LOG_FOLLOWS", "-4"),
            ("ARGUS_SHIM_MAX_LOG_FOLLOWS", "0x10"),
            ("ARGUS_SHIM_MAX_LOG_FOLLOWS", "16 "),
        ] {
            let e = Policy::from_env(|n| (n == k).then(|| v.to_string()));
            let e = match (k, v) {
                // Surrounding blanks are trimmed, as for every number.
                (_, "16 ") => {
                    assert_eq!(e.unwrap().max_log_follows, 16);
                    continue;
                }
                _ => e.unwrap_err(),
            };
            assert!(e.to_string().starts_with(k), "{e}");
        }
        let p = Policy::from_env(|_| None).unwrap();
        assert_eq!(p.max_log_follows, DEFAULT_MAX_LOG_FOLLOWS);
        let p = Policy::from_env(|n| (n == "ARGUS_SHIM_MAX_LOG_FOLLOWS").then(|| "1024".into()));
        assert_eq!(p.unwrap().max_log_follows, 1024);
    }

    #[test]
    fn follow_slots_of_jobs_the_node_and_the_create_lock_never_overlap() {
        assert_eq!(follows_per_share(16), 4);
        assert_eq!(follows_per_share(1), 1);
        assert_eq!(follows_per_share(1024), 256);
        let node = follow_slots(None, 1024).node;
        assert!(!node.contains(&0), "byte 0 is the create lock");
        assert_eq!(node.clone().count(), 1024);
        let mut seen = vec![node];
        for job in [None, Some(0), Some(1), Some(0x0500_0000), Some(u32::MAX)] {
            let s = follow_slots(job, 1024);
            assert_eq!(s.share.clone().count(), 256);
            for other in &seen {
                assert!(
                    s.share.end <= other.start || other.end <= s.share.start,
                    "{job:?}: {:?} overlaps {other:?}",
                    s.share
                );
            }
            assert!(!s.share.contains(&0));
            // Far from the end of a 64-bit offset.
            assert!(s.share.end < i64::MAX as u64);
            seen.push(s.share);
        }
    }

    /// A Ray container with GPUs 1 and 3 of the host, 2 GiB, 1.5 CPUs,
    /// 200 pids and CPUs 0-3, on the network `argus_default`.
    fn limited_container() -> SelfContainer {
        SelfContainer {
            id: "ray".into(),
            network_mode: "argus_default".into(),
            pid_mode: String::new(),
            ipc_mode: "shareable".into(),
            uts_mode: String::new(),
            hostname: "ray".into(),
            mounts: vec![],
            gpus: Gpus::List(vec!["1".into(), "3".into()]),
            devices: vec![],
            networks: vec!["argus_default".into()],
            limits: Limits {
                memory: 2 << 30,
                nano_cpus: 1_500_000_000,
                pids: 200,
                cpuset_cpus: "0-3".into(),
            },
            compose_project: Some("argus".into()),
        }
    }

    #[test]
    fn a_jobs_own_engines_together_hold_at_most_the_ray_containers_limits() {
        let me = limited_container();
        let mut p = Policy::from_env(|_| None).unwrap();
        p.resolve(Some(&me), lexical);
        let gib = 1i64 << 30;
        let engine = |memory: i64, nano_cpus: i64, pids: i64| Limits {
            memory,
            nano_cpus,
            pids,
            cpuset_cpus: String::new(),
        };
        // The Ray container: 2 GiB, 1.5 CPUs, 200 pids.
        let half = engine(gib, 500_000_000, 50);
        assert_eq!(p.check_job_total(5, &[], &half), Ok(()));
        assert_eq!(
            p.check_job_total(5, std::slice::from_ref(&half), &half),
            Ok(())
        );
        // A third GiB is one too many; the message names the job and what.
        let err = p
            .check_job_total(5, &[half.clone(), half.clone()], &half)
            .unwrap_err();
        assert_eq!(err.rule(), Some("engines_per_job"));
        let msg = err.to_string();
        assert!(
            msg.contains("Ray job 00000005") && msg.contains("memory") && !msg.contains('\n'),
            "{msg}"
        );
        // CPUs and pids count too, each on its own.
        let cpus = engine(gib / 4, 1_000_000_000, 10);
        assert!(p
            .check_job_total(5, std::slice::from_ref(&cpus), &cpus)
            .unwrap_err()
            .to_string()
            .contains("CPUs"));
        let pids = engine(gib / 4, 100_000_000, 150);
        assert!(p
            .check_job_total(5, std::slice::from_ref(&pids), &pids)
            .unwrap_err()
            .to_string()
            .contains("pids"));
        // An engine with no limit of its own (relaxed policy) is the whole node.
        let unlimited = engine(0, 0, 0);
        assert!(p
            .check_job_total(5, &[unlimited], &engine(1, 1, 1))
            .is_err());
        // A Ray container without limits bounds nothing.
        assert!(p.bounds_job_totals());
        let mut free = Policy::from_env(|_| None).unwrap();
        free.resolve(None, lexical);
        assert!(!free.bounds_job_totals());
        let many = vec![engine(0, 0, 0); 100];
        assert_eq!(free.check_job_total(5, &many, &engine(0, 0, 0)), Ok(()));
    }

    /// Checks `argv` translated for [`limited_container`].
    fn check_in(me: &SelfContainer, argv: &[&str]) -> String {
        let mut p = Policy::from_env(|_| None).unwrap();
        p.resolve(Some(me), lexical);
        p.caller = Some((0, 0));
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        let ctx = Context {
            me: Some(me.clone()),
            ..Default::default()
        };
        let plan = match translate(&o, &ctx) {
            Ok(p) => p,
            Err(e) => return format!("translate: {e}"),
        };
        rule_of(
            p.check_run(&o, &plan)
                .and_then(|()| p.check_body(&plan.body)),
        )
    }

    #[test]
    fn gpus_networks_and_limits_are_the_ray_containers_at_most() {
        let me = limited_container();
        for (argv, want) in [
            (vec![], "ok"),
            (vec!["--gpus", "all"], "ok"),
            (vec!["--gpus", "device=1"], "ok"),
            (vec!["-e", "NVIDIA_VISIBLE_DEVICES=all"], "ok"),
            (vec!["-e", "NVIDIA_VISIBLE_DEVICES=3"], "ok"),
            (vec!["-e", "NVIDIA_VISIBLE_DEVICES=void"], "ok"),
            (vec!["-e", "NVIDIA_VISIBLE_DEVICES=0,1"], "gpus"),
            (vec!["-e", "NVIDIA_VISIBLE_DEVICES=GPU-aaaa"], "gpus"),
            (vec!["--device", "nvidia.com/gpu=3"], "ok"),
            (vec!["--device", "nvidia.com/gpu=0"], "devices"),
            (vec!["--device", "nvidia.com/gpu=all"], "devices"),
            (vec!["--network", "argus_default"], "ok"),
            (vec!["--network", "host"], "ok"),
            (vec!["--network", "bridge"], "namespaces"),
            (vec!["--network", "other_net"], "namespaces"),
            (vec!["--memory", "1g"], "ok"),
            (vec!["--memory", "3g"], "resources"),
            (vec!["--shm-size", "4g"], "resources"),
            (vec!["--cpus", "1.5"], "ok"),
            (vec!["--cpus", "2"], "resources"),
            (vec!["--pids-limit", "100"], "ok"),
            (vec!["--pids-limit", "-1"], "resources"),
            (vec!["--pids-limit", "0"], "resources"),
            (vec!["--cpuset-cpus", "1,3"], "ok"),
            (vec!["--cpuset-cpus", "2-5"], "resources"),
        ] {
            let mut full = vec!["run"];
            full.extend(argv.iter().copied());
            full.push("img");
            assert_eq!(check_in(&me, &full), want, "{argv:?}");
        }
        // What reaches the daemon without any flag: the Ray container's GPUs
        // and limits, not the host's.
        let o = match parse(&["run".to_string(), "img".to_string()]).unwrap() {
            Command::Run(o) => o,
            _ => panic!(),
        };
        let ctx = Context {
            me: Some(me.clone()),
            ..Default::default()
        };
        let body = translate(&o, &ctx).unwrap().body;
        assert!(body
            .env
            .unwrap()
            .contains(&"NVIDIA_VISIBLE_DEVICES=1,3".to_string()));
        let hc = body.host_config.unwrap();
        assert_eq!(
            (
                hc.memory,
                hc.nano_cpus,
                hc.pids_limit,
                hc.cpuset_cpus.as_deref()
            ),
            (Some(2 << 30), Some(1_500_000_000), Some(200), Some("0-3"))
        );
        // A Ray container without GPUs gives none.
        let mut none = limited_container();
        none.gpus = Gpus::List(vec![]);
        assert_eq!(
            check_in(&none, &["run", "-e", "NVIDIA_VISIBLE_DEVICES=0", "img"]),
            "gpus"
        );
        assert!(check_in(&none, &["run", "--gpus", "all", "img"]).starts_with("translate"));
    }

    #[test]
    fn engines_run_as_their_caller_without_privilege_gains() {
        let p = strict();
        let body = |p: &Policy, argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let Command::Run(o) = parse(&argv).unwrap() else {
                panic!()
            };
            let ctx = Context {
                uid: 1000,
                gid: 100,
                ..Default::default()
            };
            let plan = translate(&o, &ctx).unwrap();
            assert_eq!(rule_of(p.check_body(&plan.body)), "ok", "{argv:?}");
            plan.body
        };
        for argv in [
            &["run", "img"][..],
            &["run", "--user", "1000", "img"],
            &["run", "--user", "01000", "img"],
            &["run", "--user", "1000:0100", "img"],
            &["run", "--userns=keep-id", "img"],
            &["run", "--userns=keep-id:uid=1000,gid=100", "img"],
        ] {
            let b = body(&p, argv);
            // Numbers decided here: UID:GID in decimal, no group list.
            assert_eq!(b.user.as_deref(), Some("1000:100"), "{argv:?}");
            let hc = b.host_config.unwrap();
            assert_eq!(hc.group_add, Some(vec![]), "{argv:?}");
            assert!(hc
                .security_opt
                .unwrap()
                .contains(&"no-new-privileges".to_string()));
        }
        for (argv, want) in [
            (vec!["--user", "0"], "users"),
            (vec!["-u", "root"], "users"),
            (vec!["-u", "ray"], "users"),
            (vec!["-u", ""], "users"),
            (vec!["-u", ":100"], "users"),
            (vec!["-u", "1000:"], "users"),
            (vec!["-u", "1000:users"], "users"),
            (vec!["-u", "1000:docker"], "users"),
            (vec!["--userns=keep-id:uid=0,gid=0"], "users"),
            (vec!["--userns=keep-id:uid=root"], "users"),
            (vec!["--userns=keep-idx"], "unsupported"),
            (vec!["--user", "1000:0"], "groups"),
            (vec!["--user", "1000:999"], "groups"),
            (vec!["--user", "1000:44"], "groups"),
            (vec!["--userns=keep-id:gid=999"], "groups"),
            (vec!["--group-add", "keep-groups"], "groups"),
            (vec!["--group-add", "44"], "groups"),
            (
                vec!["--security-opt", "no-new-privileges=false"],
                "security-opt",
            ),
        ] {
            let mut full = vec!["run"];
            full.extend(argv.iter().copied());
            full.push("img");
            let got = match check(&p, &full) {
                Err(e) => rule_of(Err(e)),
                Ok(()) => "ok".into(),
            };
            assert_eq!(got, want, "{argv:?}");
        }
    }

    /// Runs `argv` under `p` and returns the rule (or `ok`), translation
    /// refusals included.
    fn rule(p: &Policy, argv: &[String]) -> String {
        let mut full = vec!["run".to_string()];
        full.extend(argv.iter().cloned());
        full.push("img".into());
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        rule_of(check(p, &full))
    }

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// R-SEC-1 from the attacker's side: for the root group, the socket's
    /// group and an ordinary number, every spelling and every name; the
    /// allowed spellings of a number act as that number.
    #[test]
    fn uids_and_gids_are_numbers_refused_by_number_in_every_spelling() {
        use crate::translate::test_spellings as spellings;
        const SOCKET: u32 = 999;
        let names = [
            "root",
            "docker",
            "ray",
            "users",
            "wheel",
            "sudo",
            "nogroup",
            "0x0",
            "0o0",
            "0b0",
            "-0",
            "+0",
            " ",
            "keep-groups",
            "0,999",
            "999 ",
        ];
        let mut p = strict();
        p.allowed_users = vec![105];
        for n in [0, SOCKET, 105] {
            for (s, is_number) in spellings(n) {
                // --group-add: never, whatever the spelling.
                assert_eq!(rule(&p, &strings(&["--group-add", &s])), "groups", "{s:?}");
                // As a uid: only the listed 105, only as a number.
                let want = if is_number && n == 105 { "ok" } else { "users" };
                if !s.contains(':') {
                    assert_eq!(rule(&p, &strings(&["--user", &s])), want, "--user {s:?}");
                }
                let keep = format!("--userns=keep-id:uid={s}");
                assert_eq!(rule(&p, &strings(&[&keep])), want, "{keep:?}");
                // As the gid of the caller's uid: never 0 nor the socket's;
                // 105 is not the caller's group and 1000 is not listed.
                let want = if is_number { "groups" } else { "users" };
                let u = format!("1000:{s}");
                assert_eq!(rule(&p, &strings(&["--user", &u])), want, "--user {u:?}");
                // As the gid of the listed uid 105: 0 and the socket's
                // are refused, 105 is allowed.
                let u = format!("105:{s}");
                let want = match (is_number, n) {
                    (false, _) => "users",
                    (true, 105) => "ok",
                    (true, _) => "groups",
                };
                assert_eq!(rule(&p, &strings(&["--user", &u])), want, "--user {u:?}");
            }
        }
        for name in names {
            assert_eq!(
                rule(&p, &strings(&["--group-add", name])),
                "groups",
                "{name:?}"
            );
            assert_eq!(rule(&p, &strings(&["--user", name])), "users", "{name:?}");
            let u = format!("1000:{name}");
            assert_eq!(rule(&p, &strings(&["--user", &u])), "users", "{u:?}");
        }
        // A bare uid gets the caller's gid, never the image's groups.
        let argv: Vec<String> = strings(&["run", "--user", "0105", "img"]);
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        let ctx = Context {
            uid: 1000,
            gid: 100,
            ..Default::default()
        };
        let b = translate(&o, &ctx).unwrap().body;
        assert_eq!(b.user.as_deref(), Some("105:100"));
        assert_eq!(b.host_config.unwrap().group_add, Some(vec![]));
        // A body that did not come from the translation: names and other
        // spellings in it are refused too.
        for user in [
            "ray",
            "1000",
            "01000:100",
            "1000:0100",
            "+1000:100",
            "1000:100 ",
        ] {
            let body = ContainerCreateBody {
                user: Some(user.into()),
                ..Default::default()
            };
            assert_eq!(rule_of(p.check_body(&body)), "users", "{user:?}");
        }
        let body = ContainerCreateBody {
            user: Some("1000:100".into()),
            host_config: Some(bollard::models::HostConfig {
                group_add: Some(vec!["44".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(rule_of(p.check_body(&body)), "groups");
    }

    /// R-SEC-2 from the engine's side: the agent's writer identity
    /// (`ARGUS_AGENT_USER`) owns the discovery state on the shared root,
    /// which engines may bind; no `ARGUS_SHIM_ALLOWED_USERS` (`*`, or the
    /// uid listed) lets an engine take its uid or its gid, in any spelling.
    #[test]
    fn no_engine_takes_the_agents_writer_identity_whatever_allowed_users_says() {
        use crate::translate::test_spellings as spellings;
        let with = |users: &str| {
            let mut p = Policy::from_env(|k| match k {
                "ARGUS_SHIM_ALLOWED_USERS" => Some(users.to_string()),
                "ARGUS_AGENT_USER" => Some("990:990".to_string()),
                _ => None,
            })
            .unwrap();
            p.resolve(None, lexical);
            p.caller = Some((1000, 100));
            p.socket_gid = Some(999);
            p
        };
        assert_eq!(with("*").agent_user, Some((990, 990)));
        for users in ["*", "990", "990,991", "*,990"] {
            let p = with(users);
            for (s, is_number) in spellings(990) {
                if s.contains(':') {
                    continue;
                }
                for argv in [
                    vec!["--user".to_string(), s.clone()],
                    vec!["--user".to_string(), format!("{s}:991")],
                    vec![format!("--userns=keep-id:uid={s}")],
                    vec![format!("--userns=keep-id:uid={s},gid=991")],
                ] {
                    assert_eq!(rule(&p, &argv), "users", "{users}: {argv:?}");
                }
                // Its group, with any other uid.
                let u = format!("991:{s}");
                let want = if is_number { "groups" } else { "users" };
                if users != "990" {
                    assert_eq!(rule(&p, &strings(&["--user", &u])), want, "{users}: {u}");
                }
            }
            // Control: another listed uid and group run.
            if users != "990" {
                assert_eq!(rule(&p, &strings(&["--user", "991:991"])), "ok", "{users}");
            }
        }
        // The caller itself is not refused its own identity.
        let mut p = with("*");
        p.caller = Some((990, 990));
        assert_eq!(rule(&p, &strings(&["--user", "990:990"])), "ok");
        for bad in ["agent", "990", "990:x", "-1:990"] {
            let e = Policy::from_env(|k| (k == "ARGUS_AGENT_USER").then(|| bad.to_string()))
                .unwrap_err();
            assert!(e.to_string().starts_with("ARGUS_AGENT_USER"), "{bad}: {e}");
        }
    }

    #[test]
    fn allowed_users_are_numbers_and_root_is_never_in_a_shared_pid_namespace() {
        let with = |users: &str| {
            let mut p =
                Policy::from_env(|k| (k == "ARGUS_SHIM_ALLOWED_USERS").then(|| users.to_string()))
                    .unwrap();
            p.resolve(None, lexical);
            p.caller = Some((1000, 100));
            p.socket_gid = Some(999);
            p
        };
        for bad in ["root", "0x0", "+0", "ray,0", "-1"] {
            let e =
                Policy::from_env(|k| (k == "ARGUS_SHIM_ALLOWED_USERS").then(|| bad.to_string()))
                    .unwrap_err();
            assert!(e.to_string().starts_with("ARGUS_SHIM_ALLOWED_USERS"), "{e}");
        }
        let p = with("0, 5");
        assert_eq!(p.allowed_users, vec![0, 5]);
        for u in ["0", "00", "0:100", "000:0100"] {
            assert_eq!(rule(&p, &strings(&["--user", u])), "ok", "{u}");
            for pid in ["--pid=host", "--pid=container:mine"] {
                let mut q = p.clone();
                q.owned_refs.insert("mine".into());
                assert_eq!(
                    rule(&q, &strings(&["--user", u, pid])),
                    "no-root-shared-pid",
                    "{u} {pid}"
                );
            }
            assert_eq!(
                rule(&p, &strings(&["--user", u, "--pid=private"])),
                "ok",
                "{u}"
            );
        }
        assert_eq!(rule(&p, &strings(&["--user", "0:0"])), "groups");
        assert_eq!(rule(&p, &strings(&["--user", "0:999"])), "groups");
        assert_eq!(rule(&p, &strings(&["--user", "5:44"])), "ok");
        assert_eq!(rule(&p, &strings(&["--user", "5:0"])), "groups");
        assert_eq!(rule(&p, &strings(&["--user", "6"])), "users");
        let keep = "--userns=keep-id:uid=0";
        assert_eq!(
            rule(&p, &strings(&[keep, "--pid=host"])),
            "no-root-shared-pid"
        );
        // `*`: any uid but 0.
        let p = with("*");
        assert_eq!(rule(&p, &strings(&["--user", "5"])), "ok");
        assert_eq!(rule(&p, &strings(&["--user", "0"])), "users");
        // A root caller (the agent's own uid, a standalone shim run as
        // root) is root already: its own identity is allowed, shared
        // namespace or not.
        let mut p = strict();
        p.caller = Some((0, 0));
        assert_eq!(rule(&p, &strings(&["--pid=host"])), "ok");
        assert_eq!(rule(&p, &strings(&["-u", "0", "--pid=host"])), "ok");
        // The Ray worker's own call, as the Ray user.
        let argv = crate::args::tests::ray_worker_argv();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert_eq!(rule_of(check(&strict(), &argv)), "ok");
    }

    #[test]
    fn a_detached_container_never_shares_a_namespace_it_could_outlive_its_job_in() {
        let mut p = strict();
        p.owned_refs.insert("mine".into());
        for shared in [
            "--network=host",
            "--pid=host",
            "--ipc=host",
            "--network=container:mine",
            "--pid=container:mine",
            "--ipc=container:mine",
        ] {
            for detach in ["-d", "--detach", "--detach=true"] {
                assert_eq!(
                    rule(&p, &strings(&[detach, shared])),
                    "namespaces",
                    "{detach} {shared}"
                );
            }
            // Attached, it ends with its call: allowed.
            assert_eq!(rule(&p, &strings(&[shared])), "ok", "{shared}");
            assert_eq!(rule(&p, &strings(&["--detach=false", shared])), "ok");
        }
        let both = strings(&["-d", "--network", "host", "--pid", "host"]);
        assert_eq!(rule(&p, &both), "namespaces");
        // Namespaces of its own: detached is fine.
        for own in [
            "--network=none",
            "--pid=private",
            "--ipc=private",
            "--uts=host",
        ] {
            assert_eq!(rule(&p, &strings(&["-d", own])), "ok", "{own}");
        }
    }

    #[test]
    fn env_file_lines_go_through_the_same_rules_as_env_values() {
        let p = strict();
        let run = |argv: &[&str], file: &str| {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let Command::Run(o) = parse(&argv).unwrap() else {
                panic!()
            };
            let mut ctx = Context {
                uid: 1000,
                gid: 100,
                env: vec![("ARGUS_SHIM_POLICY".into(), "default".into())],
                ..Default::default()
            };
            ctx.env_files.insert("/f".into(), file.into());
            let plan = translate(&o, &ctx).unwrap();
            rule_of(
                p.check_run(&o, &plan)
                    .and_then(|()| p.check_body(&plan.body)),
            )
        };
        for line in [
            "ARGUS_SHIM_POLICY=relaxed",
            "  ARGUS_SHIM_POLICY=relaxed",
            "# c\nARGUS_SHIM_ALLOWED_BINDS=/",
            "ARGUS_SHIM_POLICY",
            "ARGUS_SHIM_*",
            "ARGUS_*",
            "*",
        ] {
            let from_file = run(&["run", "--env-file", "/f", "img"], line);
            assert!(
                from_file.contains("rule no-job-policy"),
                "{line:?}: {from_file}"
            );
            let last = line.lines().last().unwrap().trim().to_string();
            let from_flag = run(&["run", "-e", &last, "img"], "");
            assert_eq!(from_file, from_flag, "{line:?}");
        }
        assert_eq!(
            run(
                &["run", "--env-file", "/f", "img"],
                "NVIDIA_VISIBLE_DEVICES=0"
            ),
            "ok"
        );
        assert_eq!(
            run(&["run", "--env-file", "/f", "img"], "ARGUS_X=1\nA=2"),
            "ok"
        );
        assert_eq!(run(&["run", "--env-file", "/f", "img"], "ARGUS_X=1"), "ok");
    }

    /// Hole 10: the roots the agent resolved at start are the ones each
    /// call uses; what a root resolves to later (a link the Ray user put
    /// there) does not move them.
    #[test]
    fn bind_roots_resolved_at_start_are_not_resolved_again() {
        let roots = r#"["/tmp/ray","/srv/models"]"#;
        let mut p = Policy::from_env(|k| match k {
            BIND_ROOTS_VAR => Some(roots.into()),
            "ARGUS_SHIM_ALLOWED_BINDS" => Some("/tmp/ray:/srv/models".into()),
            _ => None,
        })
        .unwrap();
        // At the call, /tmp/ray has become a link to /var.
        p.resolve(None, |path| {
            Some(if path.starts_with("/tmp/ray") {
                PathBuf::from("/var")
            } else {
                path.to_path_buf()
            })
        });
        p.caller = Some((1000, 100));
        assert_eq!(
            rule(&p, &strings(&["-v", "/var/lib/dpkg:/d"])),
            "binds (not under ARGUS_SHIM_ALLOWED_BINDS)"
        );
        assert_eq!(rule(&p, &strings(&["-v", "/tmp/ray:/d"])), "ok");
        assert_eq!(rule(&p, &strings(&["-v", "/srv/models/m:/d"])), "ok");
        // Without them (a standalone shim), the roots are resolved at the
        // call: the same link then moves the root.
        let mut q = p.clone();
        q.start_roots = None;
        q.resolve(None, |path| {
            Some(if path.starts_with("/tmp/ray") {
                PathBuf::from("/var")
            } else {
                path.to_path_buf()
            })
        });
        assert_eq!(rule(&q, &strings(&["-v", "/var/lib/dpkg:/d"])), "ok");
        for bad in ["[\"relative\"]", "/tmp/ray", "{}"] {
            let e = Policy::from_env(|k| (k == BIND_ROOTS_VAR).then(|| bad.to_string()));
            assert!(e.is_err(), "{bad}");
        }
    }

    #[test]
    fn caller_limits_parsed_from_a_proc_file_bound_ulimits() {
        let other = "Limit                     Soft Limit           Hard Limit           Units\n\
                     Max open files            1024                 4096                 files\n\
                     Max locked memory         unlimited            unlimited            bytes\n\
                     Max processes             bogus                12                   processes\n";
        let l = parse_proc_limits(other);
        assert_eq!(l.get("nofile"), Some(&4096));
        assert_eq!(l.get("memlock"), Some(&-1));
        assert_eq!(l.get("nproc"), Some(&12));
        assert_eq!(l.len(), 3);
        let mut p = strict();
        p.caller_ulimits = l;
        assert_eq!(rule(&p, &strings(&["--ulimit", "nofile=1024:4096"])), "ok");
        assert_eq!(rule(&p, &strings(&["--ulimit", "nofile=8192"])), "ulimits");
        assert_eq!(rule(&p, &strings(&["--ulimit", "stack=1"])), "ulimits");
    }

    #[test]
    fn image_allow_list_sees_through_digests_tags_case_and_aliases() {
        let d = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
        let allowed = |pat: &str, img: &str| image_matches(pat, img);
        // Aliases of the same name.
        for img in [
            "ubuntu",
            "ubuntu:latest",
            "library/ubuntu",
            "docker.io/ubuntu",
            "docker.io/library/ubuntu:latest",
            "index.docker.io/library/ubuntu",
        ] {
            assert!(allowed("ubuntu:latest", img), "{img}");
        }
        // A tagged entry: not another tag, not a digest overriding the tag.
        assert!(!allowed("ubuntu:22.04", "ubuntu:24.04"));
        assert!(!allowed("ubuntu:22.04", &format!("ubuntu:22.04@{d}")));
        assert!(!allowed("ubuntu:22.04", &format!("ubuntu@{d}")));
        // A digest entry: that digest only.
        assert!(allowed(&format!("ubuntu@{d}"), &format!("ubuntu@{d}")));
        assert!(allowed(&format!("ubuntu@{d}"), &format!("ubuntu:x@{d}")));
        assert!(!allowed(&format!("ubuntu@{d}"), "ubuntu"));
        // A bare name: any tag or digest of that repository only.
        assert!(allowed("ubuntu", &format!("ubuntu@{d}")));
        assert!(!allowed("ubuntu", "evil/ubuntu"));
        assert!(!allowed("ubuntu", "ubuntu.evil.io/ubuntu"));
        // Upper case: Docker refuses it in the path; the registry is
        // case-insensitive.
        assert!(!allowed("ubuntu", "UBUNTU"));
        assert!(allowed("registry.local/ray/*", "REGISTRY.LOCAL/ray/x:1"));
        assert!(!allowed("registry.local/ray/*", "registry.local/rayx/x"));
        assert!(!allowed(
            "registry.local/ray/*",
            "registry.local.evil/ray/x"
        ));
        assert!(allowed(
            "registry.local/ray/*",
            &format!("registry.local/ray/x@{d}")
        ));
        // Prefixes of short names.
        assert!(allowed("argus-shim-test:*", "argus-shim-test:abc"));
        assert!(allowed(
            "docker.io/library/argus-shim-test:*",
            "argus-shim-test:abc"
        ));
        assert!(!allowed("argus-shim-test:*", "argus-shim-test2:abc"));
        // Image ids never match a name.
        assert!(!allowed("*", "8ad31b3c75e9"));
        assert!(!allowed("docker.io/*", &d[7..]));
        assert!(!allowed("*", d));
        assert_eq!(canonical("ubuntu"), "docker.io/library/ubuntu:latest");
    }

    #[test]
    fn volume_sources_under_docker_data_root_are_allowed() {
        let p = strict();
        assert_eq!(
            p.bad_bind("/tmp/x", "/var/lib/docker/volumes/v/_data/x", true),
            None
        );
        assert_eq!(
            p.bad_bind("/mnt/d", "/var/lib/docker/overlay2", false),
            Some("no-docker-data-bind")
        );
        assert_eq!(p.bad_bind("/host", "/", false), Some("no-host-root-bind"));
    }
}
