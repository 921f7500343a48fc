//! Configuration (SPEC §2), validated in full before anything starts
//! (R-CFG-1): a bad value is one [`ConfigError`] naming the variable, and the
//! caller exits 78 without writing or starting anything.
//!
//! Why one table: [`VARIABLES`] is the only list of names, defaults, help
//! lines and value kinds. The command line (`argus-agent run --help`, one
//! flag per variable), `argus-agent config` and the validation all come from
//! it, so a variable cannot be documented one way and parsed another.
//! Adding a variable is one row here plus the line that reads it into the
//! sub-config that uses it.
//!
//! Every subcommand reads through one [`Reader`] (flag, then environment,
//! then the table's default) into the sub-configs it needs: [`Discovery`]
//! (`head`), [`Logging`], [`PreflightConfig`] (`preflight`), [`HookConfig`],
//! the state folder (`status`), or all of them as [`Config`] (`run`,
//! `config`).
//!
//! The table and the reader are in `table.rs`; [`rayports`] reads Ray's
//! ports through the same reader. Nothing here starts a process or opens a
//! socket: a value is read, checked and handed down.
//!
//! May import: argus-discovery, argus-supervise (the Ray user's record),
//! argus-podman-core (the shim's settings are checked by the shim's own
//! parser at start). Must never import: argus-telemetry, argus-podman,
//! argus-node, argus-agent.

pub mod rayports;
mod table;

pub use table::*;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// When GPU preflight runs on the node start path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PreflightMode {
    /// Only when GPUs are expected.
    Auto,
    Require,
    Skip,
}

/// Log line format on stderr and in the log file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Where the discovery record lives (`argus-agent head`, and the node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub shared_root: PathBuf,
    pub cluster_name: String,
    pub head_file: PathBuf,
    /// The identity that writes (and owns) discovery state.
    pub agent_user: argus_discovery::trust::Identity,
}

/// Parses ARGUS_AGENT_USER: numbers only, `uid:gid` (`0990` is 990).
pub fn parse_agent_user(v: &str) -> Result<argus_discovery::trust::Identity, String> {
    let num = |s: &str| -> Result<u32, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err("must be numeric `uid:gid` (names are refused)".into());
        }
        s.parse::<u32>()
            .ok()
            .filter(|n| *n != u32::MAX)
            .ok_or_else(|| "uid or gid out of range".to_string())
    };
    let (u, g) = v
        .split_once(':')
        .ok_or_else(|| "must be numeric `uid:gid` (both)".to_string())?;
    Ok(argus_discovery::trust::Identity {
        uid: num(u)?,
        gid: num(g)?,
    })
}

impl Discovery {
    /// Reads the discovery variables.
    pub fn read(r: &mut Reader) -> Result<Self, ConfigError> {
        let shared_root = r.path("ARGUS_SHARED_ROOT", PathBuf::new)?;
        let cluster_name = r.name("ARGUS_CLUSTER_NAME")?;
        let head_file = r.path("ARGUS_HEAD_IP_FILE", || {
            shared_root
                .join("ray/discovery")
                .join(&cluster_name)
                .join("head.json")
        })?;
        if head_file.file_name().is_none() {
            return Err(ConfigError::new(
                "ARGUS_HEAD_IP_FILE",
                &head_file.display().to_string(),
                "must name a file",
            ));
        }
        let agent_user = match r.text("ARGUS_AGENT_USER")? {
            Some(v) => {
                parse_agent_user(&v).map_err(|why| ConfigError::new("ARGUS_AGENT_USER", &v, why))?
            }
            None => argus_discovery::trust::Identity::current(),
        };
        Ok(Self {
            shared_root,
            cluster_name,
            head_file,
            agent_user,
        })
    }
}

/// Where and how the agent logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logging {
    pub dir: PathBuf,
    pub format: LogFormat,
    pub level: String,
    /// True if and only if the level was given (not the default).
    pub level_given: bool,
}

impl Logging {
    /// Reads the logging variables; the log folder defaults under
    /// `shared_root`.
    pub fn read(r: &mut Reader, shared_root: &Path) -> Result<Self, ConfigError> {
        let _ = shared_root;
        let dir = r.path("ARGUS_LOG_DIR", || PathBuf::from("/var/log/argus"))?;
        let format = match r.choice("ARGUS_LOG_FORMAT")? {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        let level = r.choice("ARGUS_LOG_LEVEL")?.to_string();
        let level_given = r
            .settings
            .iter()
            .any(|s| s.name == "ARGUS_LOG_LEVEL" && s.source != Source::Default);
        Ok(Self {
            dir,
            format,
            level,
            level_given,
        })
    }
}

/// The GPU preflight's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightConfig {
    pub mode: PreflightMode,
    /// Test-only root under which `/dev/nvidia*` are looked up.
    pub dev_root: PathBuf,
    pub timeout: Duration,
}

impl PreflightConfig {
    /// Reads the preflight variables.
    pub fn read(r: &mut Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            mode: match r.choice("ARGUS_PREFLIGHT")? {
                "require" => PreflightMode::Require,
                "skip" => PreflightMode::Skip,
                _ => PreflightMode::Auto,
            },
            dev_root: r.path("ARGUS_PREFLIGHT_DEV_ROOT", PathBuf::new)?,
            timeout: r.seconds("ARGUS_PREFLIGHT_TIMEOUT_S")?,
        })
    }
}

/// The pre-start hook's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    pub path: PathBuf,
    pub disabled: bool,
    pub timeout: Duration,
    /// Run the hook with the agent's rights, not as the Ray user.
    pub as_root: bool,
    /// The user it runs as (the Ray user, unless `as_root`).
    pub run_as: Option<argus_supervise::privs::RayUser>,
}

impl HookConfig {
    /// Reads the hook variables.
    pub fn read(r: &mut Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            path: r.path("ARGUS_PRESTART_HOOK", PathBuf::new)?,
            disabled: r.flag("ARGUS_DISABLE_PRESTART")?,
            timeout: r.seconds("ARGUS_PRESTART_TIMEOUT_S")?,
            as_root: r.flag("ARGUS_PRESTART_AS_ROOT")?,
            run_as: None,
        })
    }
}

/// The podman shim's variables, read here to show and to pass on: the shim
/// itself reads and checks them from its environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShimConfig {
    /// Variable -> value, for those that are set.
    pub vars: BTreeMap<&'static str, String>,
}

impl ShimConfig {
    /// Reads every shim variable of the table.
    pub fn read(r: &mut Reader) -> Result<Self, ConfigError> {
        let mut vars = BTreeMap::new();
        for v in VARIABLES.iter().filter(|v| v.group == Group::Shim) {
            if let Some(value) = r.text(v.name)? {
                vars.insert(v.name, value);
            }
        }
        // The shim checks its settings the same way at every call; a value
        // it would refuse fails the node's start instead of every engine.
        if let Err(argus_podman_core::policy::PolicyError::Setting { name, value, why }) =
            argus_podman_core::policy::Policy::from_env(|k| vars.get(k).cloned())
        {
            return Err(ConfigError::new(name, &value, why));
        }
        Ok(Self { vars })
    }
}

/// Reads `ARGUS_RAY_USER`: a user of this image, and another than the
/// agent's only when the agent is root.
pub fn read_ray_user(
    r: &mut Reader,
) -> Result<Option<argus_supervise::privs::RayUser>, ConfigError> {
    let Some(spec) = r.text("ARGUS_RAY_USER")?.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let user = argus_supervise::privs::RayUser::parse(&spec)
        .map_err(|why| ConfigError::new("ARGUS_RAY_USER", &spec, why))?;
    if !user.is_current() && !nix::unistd::geteuid().is_root() {
        return Err(ConfigError::new(
            "ARGUS_RAY_USER",
            &spec,
            "the agent is not root, so it cannot run Ray as another user (run the container as root, the node image's default)",
        ));
    }
    Ok(Some(user))
}

/// Reads the node's local state folder (`status`, `healthcheck`, `run`).
pub fn read_state_dir(r: &mut Reader) -> Result<PathBuf, ConfigError> {
    r.path("ARGUS_STATE_DIR", PathBuf::new)
}

/// Everything `run` reads: the node's own settings (flat, as the node uses
/// them) and the sub-configs of the parts it runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub role: Role,
    pub shared_root: PathBuf,
    pub cluster_name: String,
    pub head_file: PathBuf,
    /// ARGUS_AGENT_USER: who writes discovery state.
    pub agent_user: argus_discovery::trust::Identity,
    pub ray_port: u16,
    pub dashboard_port: u16,
    pub ttl: Duration,
    pub refresh: Duration,
    pub poll: Duration,
    pub node_ip: Option<IpAddr>,
    /// `ARGUS_NODE_IP` as a network: the node's address in it.
    pub node_net: Option<argus_supervise::netinfo::Network>,
    /// `ray start --resources` for workers; empty means no flag.
    pub worker_resources: BTreeMap<String, f64>,
    pub ray_extra_args: Vec<String>,
    /// Ray's other ports, where set (`ARGUS_RAY_*_PORT(S)`).
    pub ray_ports: crate::rayports::RayPorts,
    pub stop_grace: Duration,
    /// The drain of a worker stopped on purpose (R-SERVE-4).
    pub drain: DrainConfig,
    /// Serve metrics on this port (`ARGUS_METRICS_PORT`); None: off.
    pub metrics_port: Option<u16>,
    /// How long a failed preflight keeps serving metrics before the exit.
    pub metrics_linger: Duration,
    pub ray_bin: String,
    /// The user Ray's tree runs as; None: the agent's own.
    pub ray_user: Option<argus_supervise::privs::RayUser>,
    /// Where this node's status file lives (not on shared storage).
    pub state_dir: PathBuf,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub stable_run: Duration,
    /// Use file events (inotify) to react faster; polling stays primary.
    pub file_events: bool,
    /// GCS fault tolerance (R-WRK-7): the external Redis, if configured.
    pub gcs_ft_redis: Option<RedisAddr>,
    /// With GCS FT: the file the Redis password is read from at each start.
    pub gcs_ft_password_file: Option<PathBuf>,
    /// With GCS FT: how long a worker may stay cut off from the GCS before
    /// it rejoins (the zombie-worker guard).
    pub gcs_ft_zombie: Duration,
    /// Ray's token authentication (`RAY_AUTH_MODE=token`); false: disabled.
    pub ray_auth: bool,
    pub log: Logging,
    pub preflight: PreflightConfig,
    pub hook: HookConfig,
    pub shim: ShimConfig,
    /// The effective values and where each came from.
    pub settings: Vec<Setting>,
}

/// A worker's drain on SIGTERM (`ARGUS_DRAIN*`, `ARGUS_LB_AGENT_PORT`,
/// `ARGUS_SERVE_PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainConfig {
    pub enabled: bool,
    pub timeout: Duration,
    pub helper: PathBuf,
    pub lb_agent_port: Option<u16>,
    pub serve_port: u16,
    /// `ARGUS_SERVE_STOP_FIRST_AFTER_S`: read by the Serve controller on the
    /// head (it reaches it through Ray's environment); checked here so a bad
    /// value stops the agent at start instead of being ignored.
    pub serve_stop_first_after: Option<Duration>,
}

impl DrainConfig {
    /// Reads the drain variables (`ARGUS_DRAIN`, `ARGUS_DRAIN_TIMEOUT_S`,
    /// `ARGUS_DRAIN_HELPER`, `ARGUS_LB_AGENT_PORT`, `ARGUS_SERVE_PORT`,
    /// `ARGUS_SERVE_STOP_FIRST_AFTER_S`), in that order.
    fn read(r: &mut Reader) -> Result<Self, ConfigError> {
        Ok(Self {
            enabled: r.flag("ARGUS_DRAIN")?,
            timeout: r.seconds("ARGUS_DRAIN_TIMEOUT_S")?,
            helper: r.path("ARGUS_DRAIN_HELPER", PathBuf::new)?,
            lb_agent_port: r.opt_port("ARGUS_LB_AGENT_PORT")?,
            serve_port: r.port("ARGUS_SERVE_PORT")?,
            serve_stop_first_after: r.opt_seconds("ARGUS_SERVE_STOP_FIRST_AFTER_S")?,
        })
    }
}

/// The external Redis of GCS fault tolerance (`ARGUS_GCS_FT_REDIS`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisAddr {
    /// `host:port`, as Ray's `RAY_REDIS_ADDRESS` takes it.
    pub address: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for RedisAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisAddr")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl RedisAddr {
    /// Parses `host:port` or `redis://[[user]:password@]host:port[/]`.
    pub fn parse(v: &str) -> Result<Self, String> {
        let v = v.trim();
        let (userinfo, hostport) = match v.split_once("://") {
            Some(("redis", rest)) => {
                let rest = rest.strip_suffix('/').unwrap_or(rest);
                if rest.contains('/') {
                    return Err("a database number is not supported (Ray uses database 0)".into());
                }
                match rest.rsplit_once('@') {
                    Some((u, h)) => (Some(u), h),
                    None => (None, rest),
                }
            }
            Some((scheme, _)) => {
                return Err(format!(
                    "scheme {scheme}:// is not supported (redis:// or host:port; Ray 2.53's rediss:// TLS needs certificates the agent does not configure)"
                ))
            }
            None => (None, v),
        };
        let (host, port) = hostport
            .rsplit_once(':')
            .ok_or("expected host:port or redis://[[user]:password@]host:port")?;
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_[]:".contains(c));
        if !host_ok {
            return Err(format!("{host:?} is not a host name or address"));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("port {port:?} is not 1-65535")),
        }
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((user, pass)) => (
                    (!user.is_empty()).then(|| user.to_string()),
                    Some(pass.to_string()),
                ),
                None => (Some(u.to_string()), None),
            },
        };
        if password.as_deref() == Some("") {
            return Err("the password after ':' is empty".into());
        }
        Ok(Self {
            address: format!("{host}:{port}"),
            username,
            password,
        })
    }
}

/// `ray start` flags the agent sets itself.
const AGENT_RAY_FLAGS: &[&str] = &[
    "--head",
    "--block",
    "--address",
    "--port",
    "--node-ip-address",
    "--dashboard-port",
];

/// Reads `ARGUS_ROLE`: which node this agent runs (the table allows only
/// `head` and `worker`).
fn read_role(r: &mut Reader) -> Result<Role, ConfigError> {
    Ok(match r.choice("ARGUS_ROLE")? {
        "head" => Role::Head,
        _ => Role::Worker,
    })
}

/// Reads Ray's GCS and dashboard ports (`ARGUS_RAY_PORT`,
/// `ARGUS_DASHBOARD_PORT`), which must differ: both listen on the head.
fn read_main_ports(r: &mut Reader) -> Result<(u16, u16), ConfigError> {
    let ray_port = r.port("ARGUS_RAY_PORT")?;
    let dashboard_port = r.port("ARGUS_DASHBOARD_PORT")?;
    if ray_port == dashboard_port {
        return Err(ConfigError::new(
            "ARGUS_DASHBOARD_PORT",
            &dashboard_port.to_string(),
            "must differ from ARGUS_RAY_PORT",
        ));
    }
    Ok((ray_port, dashboard_port))
}

/// Reads the discovery timings: the record's lifetime (`ARGUS_TTL_S`), then
/// the head's refresh and the worker's poll periods, each of which must be
/// shorter than that lifetime (a live head rewrites its record, and a worker
/// looks at it, before it can expire).
fn read_discovery_timings(r: &mut Reader) -> Result<(Duration, Duration, Duration), ConfigError> {
    let ttl = r.seconds("ARGUS_TTL_S")?;
    let below_ttl = |name: &'static str, period: Duration| {
        if period < ttl {
            return Ok(period);
        }
        Err(ConfigError::new(
            name,
            &period.as_secs_f64().to_string(),
            format!("must be less than ARGUS_TTL_S ({})", ttl.as_secs_f64()),
        ))
    };
    let refresh = below_ttl("ARGUS_REFRESH_S", r.seconds("ARGUS_REFRESH_S")?)?;
    let poll = below_ttl("ARGUS_POLL_S", r.seconds("ARGUS_POLL_S")?)?;
    Ok((ttl, refresh, poll))
}

/// Reads `ARGUS_NODE_IP`: an address, or a network (address/prefix) in
/// which this node's address is found when the node starts (issue 18: one
/// setting for hosts with several interfaces).
fn read_node_ip(
    r: &mut Reader,
) -> Result<(Option<IpAddr>, Option<argus_supervise::netinfo::Network>), ConfigError> {
    Ok(match r.text("ARGUS_NODE_IP")? {
        Some(v) if v.contains('/') => {
            let net = argus_supervise::netinfo::Network::parse(&v)
                .map_err(|why| ConfigError::new("ARGUS_NODE_IP", &v, why))?;
            (None, Some(net))
        }
        _ => (r.ip("ARGUS_NODE_IP")?, None),
    })
}

/// Reads `ARGUS_WORKER_RESOURCES_KV`, the `ray start --resources` of a
/// worker (empty: no flag).
fn read_worker_resources(r: &mut Reader) -> Result<BTreeMap<String, f64>, ConfigError> {
    let resources = r.value("ARGUS_WORKER_RESOURCES_KV")?.unwrap_or_default();
    parse_resources(&resources)
        .map_err(|reason| ConfigError::new("ARGUS_WORKER_RESOURCES_KV", &resources, reason))
}

/// Reads `ARGUS_RAY_EXTRA_ARGS` split into words as a shell would, and
/// refuses the `ray start` flags the agent sets itself: a second value
/// would fight the agent's own.
fn read_ray_extra_args(r: &mut Reader) -> Result<Vec<String>, ConfigError> {
    let extra = r.value("ARGUS_RAY_EXTRA_ARGS")?.unwrap_or_default();
    let ray_extra_args = shlex::split(&extra).ok_or_else(|| {
        ConfigError::new(
            "ARGUS_RAY_EXTRA_ARGS",
            &extra,
            "cannot be split into words (unbalanced quote or trailing backslash)",
        )
    })?;
    for a in &ray_extra_args {
        let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
        if AGENT_RAY_FLAGS.contains(&flag) {
            return Err(ConfigError::new(
                "ARGUS_RAY_EXTRA_ARGS",
                a,
                format!("the agent sets {} itself", AGENT_RAY_FLAGS.join(", ")),
            ));
        }
    }
    Ok(ray_extra_args)
}

/// Checks R-SEC-2: the Ray user must not own discovery state it reads, so
/// `ARGUS_AGENT_USER` may not be the Ray user (unless both are the agent's
/// own user, when no other user is involved).
fn check_agent_user_is_not_ray_user(
    agent_user: &argus_discovery::trust::Identity,
    ray_user: Option<&argus_supervise::privs::RayUser>,
) -> Result<(), ConfigError> {
    if let Some(u) = ray_user {
        let own = argus_discovery::trust::Identity::current();
        if u.uid == agent_user.uid && u.uid != own.uid {
            return Err(ConfigError::new(
                "ARGUS_AGENT_USER",
                &format!("{}:{}", agent_user.uid, agent_user.gid),
                "must not be the Ray user (ARGUS_RAY_USER): the Ray user must not write discovery state",
            ));
        }
    }
    Ok(())
}

/// Reads the bounds of the delay between Ray restarts
/// (`ARGUS_RESTART_BACKOFF_MIN_S`, `ARGUS_RESTART_BACKOFF_MAX_S`); the
/// maximum may not be below the minimum.
fn read_restart_backoff(r: &mut Reader) -> Result<(Duration, Duration), ConfigError> {
    let backoff_min = r.seconds("ARGUS_RESTART_BACKOFF_MIN_S")?;
    let backoff_max = r.seconds("ARGUS_RESTART_BACKOFF_MAX_S")?;
    if backoff_max < backoff_min {
        return Err(ConfigError::new(
            "ARGUS_RESTART_BACKOFF_MAX_S",
            &backoff_max.as_secs_f64().to_string(),
            "must not be less than ARGUS_RESTART_BACKOFF_MIN_S",
        ));
    }
    Ok((backoff_min, backoff_max))
}

/// Reads `ARGUS_GCS_FT_REDIS`, the external Redis of GCS fault tolerance;
/// unset or blank turns it off.
fn read_gcs_ft_redis(r: &mut Reader) -> Result<Option<RedisAddr>, ConfigError> {
    r.text("ARGUS_GCS_FT_REDIS")?
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            RedisAddr::parse(&v).map_err(|why| ConfigError::new("ARGUS_GCS_FT_REDIS", &v, why))
        })
        .transpose()
}

impl Config {
    /// Reads and validates configuration from `get` (variable -> value).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::read(Reader::with(|k| {
            get(k).map(|v| (OsString::from(v), Source::Environment))
        }))
    }

    /// Reads and validates every variable through `r`. The order of the
    /// reads and checks is the order in which a bad environment's first
    /// error is found, and the order of [`Config::settings`].
    pub fn read(mut r: Reader) -> Result<Self, ConfigError> {
        let role = read_role(&mut r)?;
        let Discovery {
            shared_root,
            cluster_name,
            head_file,
            agent_user,
        } = Discovery::read(&mut r)?;
        let (ray_port, dashboard_port) = read_main_ports(&mut r)?;
        let (ttl, refresh, poll) = read_discovery_timings(&mut r)?;
        let (node_ip, node_net) = read_node_ip(&mut r)?;
        let worker_resources = read_worker_resources(&mut r)?;
        let ray_extra_args = read_ray_extra_args(&mut r)?;
        let ray_ports = crate::rayports::RayPorts::read(
            &mut r,
            role,
            ray_port,
            dashboard_port,
            &ray_extra_args,
        )?;
        let log = Logging::read(&mut r, &shared_root)?;
        let preflight = PreflightConfig::read(&mut r)?;
        let mut hook = HookConfig::read(&mut r)?;
        let stop_grace = r.seconds("ARGUS_STOP_GRACE_S")?;
        let drain = DrainConfig::read(&mut r)?;
        let metrics_port = r.opt_port("ARGUS_METRICS_PORT")?;
        let metrics_linger = r.seconds("ARGUS_METRICS_LINGER_S")?;
        let ray_bin = r.value("ARGUS_RAY_BIN")?.unwrap_or_default();
        let ray_user = read_ray_user(&mut r)?;
        check_agent_user_is_not_ray_user(&agent_user, ray_user.as_ref())?;
        if !hook.as_root {
            hook.run_as = ray_user.clone();
        }
        let state_dir = read_state_dir(&mut r)?;
        let (backoff_min, backoff_max) = read_restart_backoff(&mut r)?;
        let stable_run = r.seconds("ARGUS_STABLE_RUN_S")?;
        let file_events = r.flag("ARGUS_FILE_EVENTS")?;
        let gcs_ft_redis = read_gcs_ft_redis(&mut r)?;
        let gcs_ft_password_file = match r.value("ARGUS_GCS_FT_REDIS_PASSWORD_FILE")? {
            Some(v) if !v.is_empty() => {
                let p = PathBuf::from(v);
                crate::table::check_path("ARGUS_GCS_FT_REDIS_PASSWORD_FILE", &p)?;
                Some(p)
            }
            _ => None,
        };
        if let (
            Some(f),
            Some(RedisAddr {
                password: Some(_), ..
            }),
        ) = (&gcs_ft_password_file, &gcs_ft_redis)
        {
            return Err(ConfigError::new(
                "ARGUS_GCS_FT_REDIS_PASSWORD_FILE",
                &f.display().to_string(),
                "ARGUS_GCS_FT_REDIS holds a password too: give it in one place",
            ));
        }
        let gcs_ft_zombie = r.seconds("ARGUS_GCS_FT_ZOMBIE_S")?;
        let ray_auth = r.choice("RAY_AUTH_MODE")? == "token";
        let shim = ShimConfig::read(&mut r)?;
        Ok(Config {
            role,
            shared_root,
            cluster_name,
            head_file,
            agent_user,
            ray_port,
            dashboard_port,
            ttl,
            refresh,
            poll,
            node_ip,
            node_net,
            worker_resources,
            ray_extra_args,
            ray_ports,
            stop_grace,
            drain,
            metrics_port,
            metrics_linger,
            ray_bin,
            ray_user,
            state_dir,
            backoff_min,
            backoff_max,
            stable_run,
            file_events,
            gcs_ft_redis,
            gcs_ft_password_file,
            gcs_ft_zombie,
            ray_auth,
            log,
            preflight,
            hook,
            shim,
            settings: r.into_settings(),
        })
    }

    /// Returns the `--resources` JSON for `ray start`, if any.
    pub fn worker_resources_json(&self) -> Option<String> {
        if self.worker_resources.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&self.worker_resources).expect("map of f64 serialises"))
        }
    }

    /// Checks what depends on this machine (run by `run` and `config`
    /// alike): the Ray CLI can be executed, and a head's `ARGUS_NODE_IP` is
    /// an address of this node. Returns warnings to log (a stop grace that
    /// does not fit in Docker's default stop timeout).
    pub fn check_host(&self) -> Result<Vec<String>, ConfigError> {
        find_program(&self.ray_bin)
            .map_err(|reason| ConfigError::new("ARGUS_RAY_BIN", &self.ray_bin, reason))?;
        if let (Role::Head, Some(ip)) = (self.role, self.node_ip) {
            if !argus_supervise::netinfo::is_local(ip) {
                return Err(ConfigError::new(
                    "ARGUS_NODE_IP",
                    &ip.to_string(),
                    "is not an address of this node (a head must listen on its own address)",
                ));
            }
        }
        let mut warnings = Vec::new();
        let needed = self.stop_grace + STOP_OVERHEAD;
        if needed > DOCKER_STOP_TIMEOUT {
            warnings.push(format!(
                "ARGUS_STOP_GRACE_S={} plus about {}s to clean up exceeds docker stop's default {}s: \
                 raise the container's stop timeout to at least {}s (compose `stop_grace_period`, \
                 `docker stop -t`, `docker run --stop-timeout`) or Docker kills the node mid-stop",
                self.stop_grace.as_secs_f64(),
                STOP_OVERHEAD.as_secs(),
                DOCKER_STOP_TIMEOUT.as_secs(),
                needed.as_secs_f64().ceil()
            ));
        }
        Ok(warnings)
    }
}

/// Returns the path of `program` (a path, or a name looked up on PATH) if it
/// is an executable file; else why not.
pub fn find_program(program: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| -> Result<(), String> {
        let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if meta.is_dir() {
            return Err(format!("{} is a folder", p.display()));
        }
        if meta.permissions().mode() & 0o111 == 0
            || nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_err()
        {
            return Err(format!(
                "{} is not executable (mode {:o})",
                p.display(),
                meta.permissions().mode() & 0o7777
            ));
        }
        Ok(())
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        executable(&p)?;
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p).is_ok())
        .ok_or_else(|| "not found as an executable on PATH".to_string())
}

/// Parses `k=v,k2=v2` into resource quantities. An empty string is no
/// resources.
pub fn parse_resources(s: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for item in s.split(',') {
        let item = item.trim();
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("`{item}` is not of the form name=quantity"));
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.:/".contains(c))
        {
            return Err(format!(
                "resource name `{k}` must be letters, digits or `_-.:/`"
            ));
        }
        if ["CPU", "GPU", "memory", "object_store_memory"].contains(&k) {
            return Err(format!(
                "`{k}` is a built-in resource; use --num-cpus/--num-gpus in ARGUS_RAY_EXTRA_ARGS"
            ));
        }
        let q: f64 = v
            .parse()
            .map_err(|_| format!("quantity `{v}` of `{k}` is not a number"))?;
        if !q.is_finite() || q < 0.0 {
            return Err(format!("quantity of `{k}` must be a non-negative number"));
        }
        if out.insert(k.to_string(), q).is_some() {
            return Err(format!("resource `{k}` given twice"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn gcs_ft_redis_takes_host_port_or_a_redis_url() {
        let a = RedisAddr::parse("redis.example:6379").unwrap();
        assert_eq!(
            (a.address.as_str(), a.username, a.password),
            ("redis.example:6379", None, None)
        );
        let a = RedisAddr::parse("redis://:pw@10.0.0.7:6380/").unwrap();
        assert_eq!(a.address, "10.0.0.7:6380");
        assert_eq!(a.password.as_deref(), Some("pw"));
        assert_eq!(a.username, None);
        let a = RedisAddr::parse("redis://ray:pw@r:1").unwrap();
        assert_eq!(a.username.as_deref(), Some("ray"));
        assert!(!format!("{a:?}").contains("pw"), "Debug shows the password");
        for bad in [
            "redis",
            "r:0",
            "r:99999",
            "http://r:1",
            "redis://r:1/2",
            "redis://:@r:1",
            ":6379",
            "a b:1",
        ] {
            assert!(RedisAddr::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_bad_gcs_ft_setting_names_the_variable() {
        let e = Config::from_lookup(|k| match k {
            "ARGUS_ROLE" => Some("head".into()),
            "ARGUS_GCS_FT_REDIS" => Some("redis://:secret@host".into()),
            _ => None,
        })
        .unwrap_err();
        assert_eq!(e.var, "ARGUS_GCS_FT_REDIS");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = Config::from_lookup(|k| match k {
            "ARGUS_ROLE" => Some("worker".into()),
            "ARGUS_GCS_FT_ZOMBIE_S" => Some("1".into()),
            _ => None,
        })
        .unwrap_err();
        assert_eq!(e.var, "ARGUS_GCS_FT_ZOMBIE_S");
    }

    use super::*;

    #[test]
    fn node_ip_may_be_a_network() {
        let n = argus_supervise::netinfo::Network::parse("10.1.0.0/16").unwrap();
        // As ARGUS_NODE_IP: a network, checked like every value.
        let cfg = |v: &str| {
            let v = v.to_string();
            Config::from_lookup(move |k| match k {
                "ARGUS_ROLE" => Some("head".into()),
                "ARGUS_NODE_IP" => Some(v.clone()),
                _ => None,
            })
        };
        let c = cfg("10.1.0.0/16").unwrap();
        assert_eq!((c.node_ip, c.node_net), (None, Some(n)));
        assert_eq!(cfg("10.1.0.0/40").unwrap_err().var, "ARGUS_NODE_IP");
        assert_eq!(cfg("10.1.0.7").unwrap().node_net, None);
    }

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> ConfigError {
        cfg(pairs).expect_err("expected a config error")
    }

    /// ARGUS_AGENT_USER is numbers (R-SEC-1 style): `0990` is 990, names
    /// and half values refused; it may not be the Ray user.
    #[test]
    fn the_agent_user_is_numeric_uid_gid_and_not_the_ray_user() {
        let id = |u, g| argus_discovery::trust::Identity { uid: u, gid: g };
        assert_eq!(parse_agent_user("990:990"), Ok(id(990, 990)));
        assert_eq!(parse_agent_user("0990:00990"), Ok(id(990, 990)));
        for bad in [
            "argus",
            "990",
            "990:",
            ":990",
            "argus:990",
            "990:argus",
            "-1:0",
            "+990:990",
            "990:990:1",
            "4294967295:0",
            "99999999999:0",
            " 990:990",
        ] {
            assert!(parse_agent_user(bad).is_err(), "{bad}");
        }
        if argus_discovery::trust::Identity::current().uid == 0 {
            let e = Config::from_lookup(|k| match k {
                "ARGUS_ROLE" => Some("worker".into()),
                "ARGUS_RAY_USER" => Some("1000:100".into()),
                "ARGUS_AGENT_USER" => Some("01000:100".into()),
                _ => None,
            })
            .unwrap_err();
            assert_eq!(e.var, "ARGUS_AGENT_USER", "{e}");
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = cfg(&[("ARGUS_ROLE", "worker")]).unwrap();
        assert_eq!(c.role, Role::Worker);
        assert_eq!(c.shared_root, PathBuf::from("/private"));
        assert_eq!(c.cluster_name, "argus-ray");
        assert_eq!(
            c.head_file,
            PathBuf::from("/private/ray/discovery/argus-ray/head.json")
        );
        assert_eq!((c.ray_port, c.dashboard_port), (6379, 8265));
        assert_eq!(c.ttl, Duration::from_secs(60));
        assert_eq!(c.refresh, Duration::from_secs(10));
        assert_eq!(c.poll, Duration::from_secs(5));
        assert_eq!(c.node_ip, None);
        assert_eq!(
            c.worker_resources_json().as_deref(),
            Some(r#"{"worker_node":100.0}"#)
        );
        assert!(c.ray_extra_args.is_empty());
        assert_eq!(c.log.dir, PathBuf::from("/var/log/argus"));
        assert_eq!(c.preflight.mode, PreflightMode::Auto);
        assert_eq!(c.hook.path, PathBuf::from("/opt/argus/ray-prestart"));
        assert!(!c.hook.disabled);
        assert_eq!(c.stop_grace, Duration::from_secs(8));
        assert_eq!(c.ray_bin, "ray");
    }

    #[test]
    fn every_variable_is_read() {
        let c = cfg(&[
            ("ARGUS_ROLE", "head"),
            ("ARGUS_SHARED_ROOT", "/shared"),
            ("ARGUS_CLUSTER_NAME", "c1"),
            ("ARGUS_RAY_PORT", "7000"),
            ("ARGUS_DASHBOARD_PORT", "7001"),
            ("ARGUS_TTL_S", "30"),
            ("ARGUS_REFRESH_S", "2.5"),
            ("ARGUS_POLL_S", "1"),
            ("ARGUS_NODE_IP", "10.0.0.7"),
            ("ARGUS_WORKER_RESOURCES_KV", "a=1, b=2.5"),
            ("ARGUS_RAY_EXTRA_ARGS", "--num-cpus=2 --labels='x=1 y'"),
            ("ARGUS_LOG_FORMAT", "json"),
            ("ARGUS_PREFLIGHT", "require"),
            ("ARGUS_PRESTART_HOOK", "/hook"),
            ("ARGUS_DISABLE_PRESTART", "true"),
            ("ARGUS_STOP_GRACE_S", "3"),
            ("ARGUS_RAY_BIN", "/venv/bin/ray"),
        ])
        .unwrap();
        assert_eq!(c.role, Role::Head);
        assert_eq!(
            c.head_file,
            PathBuf::from("/shared/ray/discovery/c1/head.json")
        );
        assert_eq!(c.log.dir, PathBuf::from("/var/log/argus"));
        assert_eq!((c.ray_port, c.dashboard_port), (7000, 7001));
        assert_eq!(c.refresh, Duration::from_millis(2500));
        assert_eq!(c.node_ip, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(
            c.worker_resources_json().as_deref(),
            Some(r#"{"a":1.0,"b":2.5}"#)
        );
        assert_eq!(c.ray_extra_args, vec!["--num-cpus=2", "--labels=x=1 y"]);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.preflight.mode, PreflightMode::Require);
        assert!(c.hook.disabled);
        assert_eq!(c.stop_grace, Duration::from_secs(3));
        assert_eq!(c.ray_bin, "/venv/bin/ray");
        let c = cfg(&[
            ("ARGUS_ROLE", "worker"),
            ("ARGUS_HEAD_IP_FILE", "/x/h.json"),
        ])
        .unwrap();
        assert_eq!(c.head_file, PathBuf::from("/x/h.json"));
        let c = cfg(&[("ARGUS_ROLE", "worker"), ("ARGUS_WORKER_RESOURCES_KV", "")]).unwrap();
        assert_eq!(c.worker_resources_json(), None);
    }

    #[test]
    fn every_bad_form_names_its_variable() {
        let w = ("ARGUS_ROLE", "worker");
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (vec![], "ARGUS_ROLE"),
            (vec![("ARGUS_ROLE", "boss")], "ARGUS_ROLE"),
            (
                vec![w, ("ARGUS_SHARED_ROOT", "relative/dir")],
                "ARGUS_SHARED_ROOT",
            ),
            (vec![w, ("ARGUS_CLUSTER_NAME", "a/b")], "ARGUS_CLUSTER_NAME"),
            (vec![w, ("ARGUS_CLUSTER_NAME", "..")], "ARGUS_CLUSTER_NAME"),
            (
                vec![w, ("ARGUS_HEAD_IP_FILE", "head.json")],
                "ARGUS_HEAD_IP_FILE",
            ),
            (vec![w, ("ARGUS_RAY_PORT", "abc")], "ARGUS_RAY_PORT"),
            (vec![w, ("ARGUS_RAY_PORT", "0")], "ARGUS_RAY_PORT"),
            (vec![w, ("ARGUS_RAY_PORT", "70000")], "ARGUS_RAY_PORT"),
            (
                vec![w, ("ARGUS_DASHBOARD_PORT", "-1")],
                "ARGUS_DASHBOARD_PORT",
            ),
            (
                vec![w, ("ARGUS_DASHBOARD_PORT", "6379")],
                "ARGUS_DASHBOARD_PORT",
            ),
            (vec![w, ("ARGUS_TTL_S", "sixty")], "ARGUS_TTL_S"),
            (vec![w, ("ARGUS_TTL_S", "0")], "ARGUS_TTL_S"),
            (vec![w, ("ARGUS_TTL_S", "NaN")], "ARGUS_TTL_S"),
            (vec![w, ("ARGUS_TTL_S", "inf")], "ARGUS_TTL_S"),
            (vec![w, ("ARGUS_REFRESH_S", "60")], "ARGUS_REFRESH_S"),
            (vec![w, ("ARGUS_REFRESH_S", "-2")], "ARGUS_REFRESH_S"),
            (vec![w, ("ARGUS_POLL_S", "x")], "ARGUS_POLL_S"),
            (vec![w, ("ARGUS_POLL_S", "61")], "ARGUS_POLL_S"),
            (vec![w, ("ARGUS_NODE_IP", "10.0.0")], "ARGUS_NODE_IP"),
            (vec![w, ("ARGUS_NODE_IP", "0.0.0.0")], "ARGUS_NODE_IP"),
            (
                vec![w, ("ARGUS_WORKER_RESOURCES_KV", "a")],
                "ARGUS_WORKER_RESOURCES_KV",
            ),
            (
                vec![w, ("ARGUS_WORKER_RESOURCES_KV", "a=x")],
                "ARGUS_WORKER_RESOURCES_KV",
            ),
            (
                vec![w, ("ARGUS_WORKER_RESOURCES_KV", "a=-1")],
                "ARGUS_WORKER_RESOURCES_KV",
            ),
            (
                vec![w, ("ARGUS_WORKER_RESOURCES_KV", "a=1,a=2")],
                "ARGUS_WORKER_RESOURCES_KV",
            ),
            (
                vec![w, ("ARGUS_WORKER_RESOURCES_KV", "=1")],
                "ARGUS_WORKER_RESOURCES_KV",
            ),
            (
                vec![w, ("ARGUS_WORKER_RESOURCES_KV", "GPU=1")],
                "ARGUS_WORKER_RESOURCES_KV",
            ),
            (
                vec![w, ("ARGUS_RAY_EXTRA_ARGS", "--x='unbalanced")],
                "ARGUS_RAY_EXTRA_ARGS",
            ),
            (
                vec![w, ("ARGUS_RAY_EXTRA_ARGS", "--block")],
                "ARGUS_RAY_EXTRA_ARGS",
            ),
            (vec![w, ("ARGUS_LOG_DIR", "logs")], "ARGUS_LOG_DIR"),
            (vec![w, ("ARGUS_LOG_FORMAT", "xml")], "ARGUS_LOG_FORMAT"),
            (vec![w, ("ARGUS_LOG_LEVEL", "loud")], "ARGUS_LOG_LEVEL"),
            (vec![w, ("ARGUS_PREFLIGHT", "maybe")], "ARGUS_PREFLIGHT"),
            (
                vec![w, ("ARGUS_PRESTART_HOOK", "hook.sh")],
                "ARGUS_PRESTART_HOOK",
            ),
            (
                vec![w, ("ARGUS_DISABLE_PRESTART", "maybe")],
                "ARGUS_DISABLE_PRESTART",
            ),
            (
                vec![w, ("ARGUS_PRESTART_TIMEOUT_S", "0")],
                "ARGUS_PRESTART_TIMEOUT_S",
            ),
            (
                vec![w, ("ARGUS_STOP_GRACE_S", "soon")],
                "ARGUS_STOP_GRACE_S",
            ),
            (vec![w, ("ARGUS_STATE_DIR", "run")], "ARGUS_STATE_DIR"),
            (vec![w, ("ARGUS_FILE_EVENTS", "maybe")], "ARGUS_FILE_EVENTS"),
            (
                vec![
                    w,
                    ("ARGUS_RESTART_BACKOFF_MIN_S", "5"),
                    ("ARGUS_RESTART_BACKOFF_MAX_S", "1"),
                ],
                "ARGUS_RESTART_BACKOFF_MAX_S",
            ),
        ];
        for (pairs, var) in cases {
            let e = err(&pairs);
            assert_eq!(e.var, var, "{pairs:?} -> {e}");
            let line = e.to_string();
            assert!(line.starts_with(var) && !line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn durations_below_their_floor_are_refused() {
        let w = ("ARGUS_ROLE", "worker");
        for (var, value) in [
            ("ARGUS_REFRESH_S", "1e-9"),
            ("ARGUS_POLL_S", "0.05"),
            ("ARGUS_TTL_S", "0.9"),
            ("ARGUS_STOP_GRACE_S", "0.01"),
            ("ARGUS_RESTART_BACKOFF_MIN_S", "0.001"),
        ] {
            let e = err(&[w, (var, value)]);
            assert_eq!(e.var, var, "{e}");
            assert!(e.reason.contains("at least"), "{e}");
        }
        let c = cfg(&[
            w,
            ("ARGUS_REFRESH_S", "0.1"),
            ("ARGUS_POLL_S", "0.1"),
            ("ARGUS_TTL_S", "1"),
        ]);
        assert!(c.is_ok(), "{c:?}");
    }

    #[test]
    fn extra_args_may_not_carry_the_agents_own_flags() {
        let w = ("ARGUS_ROLE", "worker");
        for flag in AGENT_RAY_FLAGS {
            for arg in [flag.to_string(), format!("{flag}=1")] {
                let e = err(&[w, ("ARGUS_RAY_EXTRA_ARGS", &format!("--num-cpus=2 {arg}"))]);
                assert_eq!(
                    (e.var, e.value.as_str()),
                    ("ARGUS_RAY_EXTRA_ARGS", arg.as_str())
                );
            }
        }
        // Flags that only start like the agent's are the user's.
        let c = cfg(&[
            w,
            (
                "ARGUS_RAY_EXTRA_ARGS",
                "--port-retries=3 --dashboard-host=0.0.0.0",
            ),
        ]);
        assert!(c.is_ok(), "{c:?}");
    }

    #[test]
    fn paths_with_parent_components_are_refused() {
        let w = ("ARGUS_ROLE", "worker");
        for var in [
            "ARGUS_STATE_DIR",
            "ARGUS_SHARED_ROOT",
            "ARGUS_LOG_DIR",
            "ARGUS_HEAD_IP_FILE",
        ] {
            let e = err(&[w, (var, "/a/../b")]);
            assert_eq!(e.var, var, "{e}");
        }
    }

    #[test]
    fn one_yes_no_vocabulary_for_every_switch() {
        for (v, want) in [
            ("1", true),
            ("true", true),
            ("yes", true),
            ("on", true),
            ("ON", true),
            ("0", false),
            ("false", false),
            ("no", false),
            ("off", false),
            ("No", false),
        ] {
            for var in ["ARGUS_DISABLE_PRESTART", "ARGUS_FILE_EVENTS"] {
                let c = cfg(&[("ARGUS_ROLE", "worker"), (var, v)]).unwrap();
                let got = if var == "ARGUS_FILE_EVENTS" {
                    c.file_events
                } else {
                    c.hook.disabled
                };
                assert_eq!(got, want, "{var}={v}");
            }
        }
    }

    #[test]
    fn a_value_that_is_not_utf8_is_an_error_not_unset() {
        use std::os::unix::ffi::OsStringExt;
        let r = Reader::with(|k| match k {
            "ARGUS_ROLE" => Some(("worker".into(), Source::Environment)),
            "ARGUS_CLUSTER_NAME" => {
                Some((OsString::from_vec(b"c\xff".to_vec()), Source::Environment))
            }
            _ => None,
        });
        let e = Config::read(r).unwrap_err();
        assert_eq!(e.var, "ARGUS_CLUSTER_NAME");
        assert!(e.reason.contains("UTF-8"), "{e}");
    }

    #[test]
    fn settings_say_where_each_value_came_from() {
        let flags = BTreeMap::from([("ARGUS_TTL_S", OsString::from("20"))]);
        let r = Reader::with(|k| match flags.get(k) {
            Some(v) => Some((v.clone(), Source::Flag)),
            None => match k {
                "ARGUS_ROLE" => Some(("worker".into(), Source::Environment)),
                "ARGUS_TTL_S" => Some(("30".into(), Source::Environment)),
                _ => None,
            },
        });
        let c = Config::read(r).unwrap();
        assert_eq!(c.ttl, Duration::from_secs(20));
        let find = |n: &str| c.settings.iter().find(|s| s.name == n).unwrap().clone();
        assert_eq!(find("ARGUS_TTL_S").source, Source::Flag);
        assert_eq!(find("ARGUS_ROLE").source, Source::Environment);
        assert_eq!(find("ARGUS_RAY_PORT").value.as_deref(), Some("6379"));
        assert_eq!(find("ARGUS_RAY_PORT").source, Source::Default);
        assert_eq!(
            find("ARGUS_LOG_DIR").value.as_deref(),
            Some("/var/log/argus")
        );
        // Every variable of the table is read (and so shown) by `run`.
        let names: Vec<&str> = c.settings.iter().map(|s| s.name).collect();
        let table: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        assert_eq!(names, table);
    }

    #[test]
    fn every_default_of_the_table_is_valid() {
        let c = cfg(&[("ARGUS_ROLE", "head")]).unwrap();
        assert_eq!(c.settings.len(), VARIABLES.len());
        for v in VARIABLES {
            // Ray's own name where the setting is Ray's (its CLI and
            // drivers read the same variable).
            assert!(
                v.name.starts_with("ARGUS_") || v.name == "RAY_AUTH_MODE",
                "{}",
                v.name
            );
            assert!(!v.help.is_empty() && !v.help.contains('\n'), "{}", v.name);
        }
    }

    #[test]
    fn host_checks_find_the_ray_cli_and_a_heads_own_address() {
        let ok = |k: &str, extra: &[(&str, &str)]| {
            let mut pairs = vec![("ARGUS_ROLE", k), ("ARGUS_RAY_BIN", "/bin/sh")];
            pairs.extend_from_slice(extra);
            cfg(&pairs).unwrap().check_host()
        };
        assert_eq!(ok("head", &[("ARGUS_NODE_IP", "127.0.3.4")]), Ok(vec![]));
        let e = ok("head", &[("ARGUS_NODE_IP", "203.0.113.77")]).unwrap_err();
        assert_eq!(e.var, "ARGUS_NODE_IP");
        // A worker's address is not checked here.
        assert!(ok("worker", &[("ARGUS_NODE_IP", "203.0.113.77")]).is_ok());
        let e = ok("worker", &[("ARGUS_RAY_BIN", "/nonexistent/ray")]).unwrap_err();
        assert_eq!(e.var, "ARGUS_RAY_BIN");
        let e = ok("worker", &[("ARGUS_RAY_BIN", "/etc/passwd")]).unwrap_err();
        assert!(e.reason.contains("not executable"), "{e}");
        let e = ok("worker", &[("ARGUS_RAY_BIN", "/")]).unwrap_err();
        assert!(e.reason.contains("folder"), "{e}");
        let e = ok("worker", &[("ARGUS_RAY_BIN", "no-such-program-anywhere")]).unwrap_err();
        assert!(e.reason.contains("PATH"), "{e}");
        assert!(find_program("sh").is_ok_and(|p| p.is_absolute()));
        let w = ok("worker", &[("ARGUS_STOP_GRACE_S", "8.5")]).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("stop_grace_period") && w[0].contains("docker stop -t"),
            "{w:?}"
        );
    }

    #[test]
    fn url_passwords_are_masked_in_settings_and_errors() {
        assert_eq!(
            redact("redis://:s3cret@10.0.0.5:6379"),
            "redis://:***@10.0.0.5:6379"
        );
        assert_eq!(redact("redis://u:p@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("10.0.0.5:6379"), "10.0.0.5:6379");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("http://h/a:b@c"), "http://h/a:b@c");
        let e = ConfigError::new("ARGUS_X", "redis://:pw@h:1", "bad");
        assert!(!e.to_string().contains("pw"), "{e}");
    }
}
