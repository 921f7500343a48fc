//! The variables table and the reader: every variable's name, default,
//! help line and kind ([`VARIABLES`]), and the one [`Reader`] that takes a
//! value from a flag, then the environment, then the table's default, and
//! records where each came from. The sub-configs in the crate root and
//! [`crate::rayports`] read through it; it imports neither.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// A bad configuration value: which variable, what it held, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {reason}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

impl ConfigError {
    /// Returns the error; a password in a URL value is masked.
    pub fn new(var: &'static str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            var,
            value: redact(value),
            reason: reason.into(),
        }
    }
}

/// Returns `value` with the password of a URL (`scheme://user:password@…`)
/// replaced by `***`, so that `config` output and errors do not show it.
pub fn redact(value: &str) -> String {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return value.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => value.to_string(),
    }
}

/// Which part of the agent a variable configures (the help's headings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    Node,
    Discovery,
    Logging,
    Preflight,
    Hook,
    /// Read by the podman shim (passed to it through Ray's environment).
    Shim,
}

impl Group {
    /// Returns the heading of this group in `run --help`.
    pub fn title(self) -> &'static str {
        match self {
            Group::Node => "Node",
            Group::Discovery => "Discovery",
            Group::Logging => "Logging",
            Group::Preflight => "GPU preflight",
            Group::Hook => "Pre-start hook",
            Group::Shim => "Podman shim",
        }
    }
}

/// What values a variable takes; validation and help text follow from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// One of these words.
    Choice(&'static [&'static str]),
    /// An absolute path without `..` components.
    Path,
    /// A folder name: `[A-Za-z0-9._-]{1,63}`, not `.` or `..`.
    Name,
    /// A TCP port, 1-65535.
    Port,
    /// A range of TCP ports, `MIN-MAX`.
    PortRange,
    /// Seconds (decimals allowed), at least `min`.
    Seconds { min: f64 },
    /// An IP address of this node, or `auto`.
    Ip,
    /// `name=quantity,...`; empty means none.
    Resources,
    /// Shell words.
    Words,
    /// Yes or no: `1/true/yes/on` or `0/false/no/off`.
    Bool,
    /// A program: a path, or a name looked up on PATH.
    Program,
    /// Free text (checked by whoever reads it).
    Text,
}

impl Kind {
    /// Returns the value name shown in `--help`.
    pub fn value_name(self) -> &'static str {
        match self {
            Kind::Choice(_) => "WORD",
            Kind::Path => "PATH",
            Kind::Name => "NAME",
            Kind::Port => "PORT",
            Kind::PortRange => "MIN-MAX",
            Kind::Seconds { .. } => "SECONDS",
            Kind::Ip => "IP",
            Kind::Resources => "K=V,..",
            Kind::Words => "ARGS",
            Kind::Bool => "BOOL",
            Kind::Program => "PROGRAM",
            Kind::Text => "TEXT",
        }
    }

    /// Returns what values are accepted, for `--help`.
    pub fn describe(self) -> String {
        match self {
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
            Kind::Path => "absolute path".into(),
            Kind::Name => "[A-Za-z0-9._-]{1,63}".into(),
            Kind::Port => "1-65535".into(),
            Kind::PortRange => "MIN-MAX, 1024-65535".into(),
            Kind::Seconds { min } => format!("seconds, at least {min}"),
            Kind::Ip => "an address of this node, a network address/prefix, or auto".into(),
            Kind::Resources => "k=v,k2=v2; empty for none".into(),
            Kind::Words => "shell words".into(),
            Kind::Bool => "1/true/yes/on or 0/false/no/off".into(),
            Kind::Program => "path, or a name on PATH".into(),
            Kind::Text => "text".into(),
        }
    }
}

/// A variable's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// No default: the variable must be set.
    Required,
    /// This value, parsed like a given one.
    Value(&'static str),
    /// Computed from other variables, as described.
    Computed(&'static str),
    /// Unset: the reader decides (described).
    Unset(&'static str),
}

impl std::fmt::Display for DefaultValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DefaultValue::Required => f.write_str("(required)"),
            DefaultValue::Value("") => f.write_str("(empty)"),
            DefaultValue::Value(v) | DefaultValue::Computed(v) | DefaultValue::Unset(v) => {
                f.write_str(v)
            }
        }
    }
}

/// One configuration variable: the single source of its name, flag,
/// default, meaning and accepted values.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    pub name: &'static str,
    pub group: Group,
    pub kind: Kind,
    pub default: DefaultValue,
    /// One line of meaning.
    pub help: &'static str,
}

impl Var {
    /// Returns the long flag of `run` for this variable: `ARGUS_RAY_PORT` ->
    /// `ray-port`.
    pub fn flag(&self) -> String {
        self.name
            .trim_start_matches("ARGUS_")
            .to_ascii_lowercase()
            .replace('_', "-")
    }

    /// Returns the help line: meaning, accepted values, variable, default.
    pub fn help_line(&self) -> String {
        format!(
            "{} ({}) [env: {}] [default: {}]",
            self.help,
            self.kind.describe(),
            self.name,
            self.default
        )
    }
}

const fn var(
    name: &'static str,
    group: Group,
    kind: Kind,
    default: DefaultValue,
    help: &'static str,
) -> Var {
    Var {
        name,
        group,
        kind,
        default,
        help,
    }
}

/// The smallest period the discovery loop accepts: below it the head would
/// fsync the shared record (or a worker read it) hundreds of times a second.
pub const MIN_PERIOD_S: f64 = 0.1;

/// What the stop path needs after the grace (SIGKILL, sweep, engine
/// containers, the final record write), for the Docker stop budget warning.
pub const STOP_OVERHEAD: Duration = Duration::from_secs(2);

/// Docker's default `docker stop` timeout.
pub const DOCKER_STOP_TIMEOUT: Duration = Duration::from_secs(10);

use DefaultValue::{Computed, Required, Unset, Value};
use Group::{Discovery as D, Hook as H, Logging as L, Node as N, Preflight as P, Shim as S};

/// Every variable the agent reads (README "Configuration").
#[rustfmt::skip]
pub const VARIABLES: &[Var] = &[
    var("ARGUS_ROLE", N, Kind::Choice(&["head", "worker"]), Required, "which node this is"),
    var("ARGUS_SHARED_ROOT", D, Kind::Path, Value("/private"), "shared storage root"),
    var("ARGUS_CLUSTER_NAME", D, Kind::Name, Value("argus-ray"), "cluster name; several clusters may share one root"),
    var("ARGUS_HEAD_IP_FILE", D, Kind::Path, Computed("${ARGUS_SHARED_ROOT}/ray/discovery/${ARGUS_CLUSTER_NAME}/head.json"), "the discovery record"),
    var("ARGUS_AGENT_USER", D, Kind::Text, Unset("(the agent's own uid:gid; the node image: 990:990)"), "numeric `uid:gid` that writes discovery state on shared storage (works with NFS root squash); not root in the image, never the Ray user"),
    var("ARGUS_RAY_PORT", N, Kind::Port, Value("6379"), "GCS port"),
    var("ARGUS_DASHBOARD_PORT", N, Kind::Port, Value("8265"), "dashboard / job server port"),
    var("ARGUS_RAY_NODE_MANAGER_PORT", N, Kind::Port, Unset("(Ray's: random)"), "`ray start --node-manager-port` (the raylet)"),
    var("ARGUS_RAY_OBJECT_MANAGER_PORT", N, Kind::Port, Unset("(Ray's: random)"), "`ray start --object-manager-port`"),
    var("ARGUS_RAY_RUNTIME_ENV_AGENT_PORT", N, Kind::Port, Unset("(Ray's: random)"), "`ray start --runtime-env-agent-port`"),
    var("ARGUS_RAY_DASHBOARD_AGENT_GRPC_PORT", N, Kind::Port, Unset("(Ray's: random)"), "`ray start --dashboard-agent-grpc-port`"),
    var("ARGUS_RAY_DASHBOARD_AGENT_LISTEN_PORT", N, Kind::Port, Unset("(Ray's: 52365)"), "`ray start --dashboard-agent-listen-port` (also bound on 127.0.0.1)"),
    var("ARGUS_RAY_METRICS_EXPORT_PORT", N, Kind::Port, Unset("(Ray's: random)"), "`ray start --metrics-export-port` (Ray's Prometheus metrics)"),
    var("ARGUS_RAY_CLIENT_SERVER_PORT", N, Kind::Port, Unset("(Ray's: 10001)"), "head: `ray start --ray-client-server-port`"),
    var("ARGUS_RAY_WORKER_PORTS", N, Kind::PortRange, Unset("(Ray's: 10002-19999)"), "`ray start --min-worker-port`/`--max-worker-port`, the ports of Ray's worker processes"),
    var("ARGUS_TTL_S", D, Kind::Seconds { min: 1.0 }, Value("60"), "head record lifetime"),
    var("ARGUS_REFRESH_S", D, Kind::Seconds { min: MIN_PERIOD_S }, Value("10"), "head refresh period, less than the TTL"),
    var("ARGUS_POLL_S", D, Kind::Seconds { min: MIN_PERIOD_S }, Value("5"), "worker poll period, less than the TTL"),
    var("ARGUS_NODE_IP", N, Kind::Ip, Value("auto"), "override node IP detection: this address, or this node's address in a network (CIDR)"),
    var("ARGUS_WORKER_RESOURCES_KV", N, Kind::Resources, Value("worker_node=100"), "a worker's `ray start --resources`"),
    var("ARGUS_RAY_EXTRA_ARGS", N, Kind::Words, Value(""), "extra `ray start` arguments (not the agent's own)"),
    var("ARGUS_LOG_DIR", L, Kind::Path, Value("/var/log/argus"), "folder of the agent log file and preflight reports, in the node; every folder on its path owned by root or ARGUS_AGENT_USER and not writable by others (else exit 78)"),
    var("ARGUS_LOG_FORMAT", L, Kind::Choice(&["text", "json"]), Value("text"), "log line format"),
    var("ARGUS_LOG_LEVEL", L, Kind::Choice(&["error", "warn", "info", "debug", "trace"]), Value("info"), "log level (`preflight` alone: warn)"),
    var("ARGUS_PREFLIGHT", P, Kind::Choice(&["auto", "require", "skip"]), Value("auto"), "GPU checks: when GPUs are expected, always, or never"),
    var("ARGUS_PREFLIGHT_DEV_ROOT", P, Kind::Path, Value("/"), "test-only: root under which /dev/nvidia* are looked up"),
    var("ARGUS_PREFLIGHT_TIMEOUT_S", P, Kind::Seconds { min: 0.1 }, Value("10"), "bound of each preflight command"),
    var("ARGUS_PRESTART_HOOK", H, Kind::Path, Value("/opt/argus/ray-prestart"), "run once before Ray first starts, if present"),
    var("ARGUS_PRESTART_TIMEOUT_S", H, Kind::Seconds { min: 0.1 }, Value("300"), "hook timeout"),
    var("ARGUS_DISABLE_PRESTART", H, Kind::Bool, Value("no"), "skip the hook"),
    var("ARGUS_PRESTART_AS_ROOT", H, Kind::Bool, Value("no"), "run the hook with the agent's rights instead of as ARGUS_RAY_USER"),
    var("ARGUS_STOP_GRACE_S", N, Kind::Seconds { min: 0.1 }, Value("8"), "SIGTERM-to-SIGKILL grace for Ray on stop"),
    var("ARGUS_DRAIN", N, Kind::Bool, Value("on"), "a worker stopped on purpose (SIGTERM) drains first: Serve's replicas move, the load balancer stops sending, then Ray stops; a second SIGTERM or SIGINT skips it"),
    var("ARGUS_DRAIN_TIMEOUT_S", N, Kind::Seconds { min: 1.0 }, Value("120"), "bound of a worker's drain; the container's stop timeout must exceed it plus ARGUS_STOP_GRACE_S and 2 s"),
    var("ARGUS_SERVE_STOP_FIRST_AFTER_S", N, Kind::Seconds { min: 1.0 }, Unset("(never: an upgrade waits for room)"), "head: a start-first Serve upgrade whose new replica has not run for this long stops an old replica first (no room for both); read by the Serve controller"),
    var("ARGUS_DRAIN_HELPER", N, Kind::Path, Value("/opt/argus/drain_node.py"), "the program that drains this node in Ray and reports what Serve has left on it (the node image's); run as ARGUS_RAY_USER"),
    var("ARGUS_LB_AGENT_PORT", N, Kind::Port, Unset("(off)"), "answer the load balancer's agent-check (HAProxy `agent-check`) on this port: `ready`, or `drain` while the node drains (the compose file uses 9479)"),
    var("ARGUS_SERVE_PORT", N, Kind::Port, Value("8000"), "the port of Ray Serve's HTTP proxy on each node (the node's status says whether its proxy serves)"),
    var("ARGUS_METRICS_PORT", N, Kind::Port, Unset("(off)"), "serve Prometheus metrics on this port, all interfaces (`/metrics`; the node image's compose file uses 9478)"),
    var("ARGUS_METRICS_LINGER_S", N, Kind::Seconds { min: 0.1 }, Value("30"), "with ARGUS_METRICS_PORT: how long a failed preflight keeps serving its metrics before the agent exits"),
    var("ARGUS_RAY_BIN", N, Kind::Program, Value("ray"), "the Ray CLI"),
    var("ARGUS_RAY_USER", N, Kind::Text, Unset("(the agent's user)"), "user Ray's tree and the pre-start hook run as (`user`, `uid`, `uid:gid`, `user:group`); the agent must be root to use another"),
    var("ARGUS_STATE_DIR", N, Kind::Path, Value(DEFAULT_STATE_DIR), "where status.json lives (local, not shared)"),
    var("ARGUS_RESTART_BACKOFF_MIN_S", N, Kind::Seconds { min: 0.1 }, Value("1"), "first restart delay"),
    var("ARGUS_RESTART_BACKOFF_MAX_S", N, Kind::Seconds { min: 0.1 }, Value("60"), "restart delay cap"),
    var("ARGUS_STABLE_RUN_S", N, Kind::Seconds { min: 0.1 }, Value("60"), "a run this long resets the backoff"),
    var("ARGUS_FILE_EVENTS", D, Kind::Bool, Value("on"), "use inotify besides polling"),
    var("ARGUS_GCS_FT_REDIS", N, Kind::Text, Unset("(off)"), "GCS fault tolerance: external Redis, host:port or redis://[[user]:password@]host:port"),
    var("ARGUS_GCS_FT_REDIS_PASSWORD_FILE", N, Kind::Path, Unset("(none)"), "with GCS FT: a file holding the Redis password (read by the head at every Ray start), instead of one in ARGUS_GCS_FT_REDIS"),
    var("ARGUS_GCS_FT_ZOMBIE_S", N, Kind::Seconds { min: 10.0 }, Value("300"), "with GCS FT: a worker cut off from the GCS this long rejoins; also Ray's GCS reconnect timeout"),
    var("RAY_AUTH_MODE", N, Kind::Choice(&["token", "disabled"]), Value("token"), "Ray's token authentication on the dashboard, the Jobs API and the GCS (Ray's own variable): `token`, the cluster's token from RAY_AUTH_TOKEN or made by the first head; `disabled` is unsafe: whoever reaches the dashboard runs code"),
    var("ARGUS_SHIM_POLICY", S, Kind::Text, Unset("default"), "`default` or `relaxed` (lifts every shim rule but the image allow-list)"),
    var("ARGUS_SHIM_ALLOWED_IMAGES", S, Kind::Text, Unset("(any)"), "comma-separated image patterns the shim may run"),
    var("ARGUS_SHIM_LOG", S, Kind::Text, Unset("warn"), "the shim's log filter"),
    var("ARGUS_SHIM_SELF_ID", S, Kind::Text, Unset("(found)"), "id of the Ray container when the shim cannot find it"),
    var("ARGUS_SHIM_ALLOWED_BINDS", S, Kind::Text, Unset("(Ray temp dirs, shared root, model cache)"), "colon-separated folders (paths in the Ray container) engine containers may bind"),
    var("ARGUS_MODEL_CACHE", S, Kind::Text, Unset("(/tmp/argus-models)"), "model cache folder, mounted at the same path as on the host; in the default bind allow-list"),
    var("ARGUS_SHIM_ALLOWED_VOLUMES", S, Kind::Text, Unset("(the Ray container's own)"), "comma-separated named volumes engine containers may mount besides the Ray container's own (`prefix*` allowed)"),
    var("ARGUS_SHIM_ALLOWED_USERS", S, Kind::Text, Unset("(the caller only)"), "comma-separated uids (decimal) engine containers may run as besides their caller; `0` only when listed, `*` any but 0"),
    var("ARGUS_SHIM_ALLOWED_CAPS", S, Kind::Text, Unset("(none)"), "comma-separated capabilities `--cap-add` may add"),
    var("ARGUS_SHIM_MAX_ENGINES_PER_JOB", S, Kind::Text, Unset("16"), "live engine containers one Ray job's own code may have on this node (1-4096; Ray's own worker starts do not count)"),
    var("ARGUS_SHIM_MAX_LOG_FOLLOWS", S, Kind::Text, Unset("16"), "`podman logs -f` calls following at once on this node, a quarter of them per Ray job (1-1024; each holds one of the host's inotify instances in dockerd, `fs.inotify.max_user_instances` for all of root)"),
    var("ARGUS_SHIM_OWNER", S, Kind::Text, Unset("(Ray container id, or host-<id> in ARGUS_STATE_DIR)"), "owner label of this node's engine containers"),
];

/// Returns the table row of `name`.
///
/// # Panics
/// If `name` is not in [`VARIABLES`] (a programming error).
pub fn lookup_var(name: &str) -> &'static Var {
    VARIABLES
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("{name} is not in config::VARIABLES"))
}

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Flag,
    Environment,
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Flag => "flag",
            Source::Environment => "environment",
            Source::Default => "default",
        })
    }
}

/// One effective value, as `argus-agent config` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Setting {
    pub name: &'static str,
    pub group: Group,
    /// The value in force; `None` when unset and without a default value.
    pub value: Option<String>,
    pub source: Source,
}

type Lookup<'a> = Box<dyn Fn(&str) -> Option<(OsString, Source)> + 'a>;

/// Reads variables (flag, then environment, then default) and records what
/// it read, for `argus-agent config`.
pub struct Reader<'a> {
    lookup: Lookup<'a>,
    pub(crate) settings: Vec<Setting>,
}

impl<'a> Reader<'a> {
    /// Returns a reader over the process environment and `flags` (variable
    /// name -> value given on the command line; a flag wins).
    pub fn new(flags: &'a BTreeMap<&'static str, OsString>) -> Self {
        Self::with(move |k| match flags.get(k) {
            Some(v) => Some((v.clone(), Source::Flag)),
            None => std::env::var_os(k).map(|v| (v, Source::Environment)),
        })
    }

    /// Returns a reader over `lookup` (tests).
    pub fn with(lookup: impl Fn(&str) -> Option<(OsString, Source)> + 'a) -> Self {
        Self {
            lookup: Box::new(lookup),
            settings: Vec::new(),
        }
    }

    /// Returns the values read so far, in table order.
    pub fn into_settings(self) -> Vec<Setting> {
        let mut s = self.settings;
        s.sort_by_key(|s| VARIABLES.iter().position(|v| v.name == s.name));
        s
    }

    fn record(&mut self, var: &'static Var, value: Option<String>, source: Source) {
        self.settings.retain(|s| s.name != var.name);
        self.settings.push(Setting {
            name: var.name,
            group: var.group,
            value: value.as_deref().map(redact),
            source,
        });
    }

    /// Returns the given value of `name` (an empty value counts as unset,
    /// except for resources, where empty means none), or an error when it
    /// is not UTF-8. Records it.
    fn given(&mut self, name: &str) -> Result<Option<(String, Source)>, ConfigError> {
        let var = lookup_var(name);
        let Some((raw, source)) = (self.lookup)(name) else {
            return Ok(None);
        };
        let value = raw.into_string().map_err(|raw| {
            ConfigError::new(var.name, &raw.to_string_lossy(), "is not valid UTF-8")
        })?;
        if value.is_empty() && var.kind != Kind::Resources {
            return Ok(None);
        }
        self.record(var, Some(value.clone()), source);
        Ok(Some((value, source)))
    }

    /// Returns the value of `name`: given, else the table's default value.
    /// `None` for a `Computed` or `Unset` default; an error for a missing
    /// required one.
    pub(crate) fn value(&mut self, name: &str) -> Result<Option<String>, ConfigError> {
        if let Some((v, _)) = self.given(name)? {
            return Ok(Some(v));
        }
        let var = lookup_var(name);
        match var.default {
            DefaultValue::Required => Err(ConfigError::new(
                var.name,
                "",
                format!("required: set it ({})", var.kind.describe()),
            )),
            DefaultValue::Value(v) => {
                self.record(var, Some(v.to_string()), Source::Default);
                Ok(Some(v.to_string()))
            }
            DefaultValue::Computed(_) | DefaultValue::Unset(_) => {
                self.record(var, None, Source::Default);
                Ok(None)
            }
        }
    }

    /// Returns the text of `name`, or `None` (shim variables, read here
    /// only to show them).
    pub fn text(&mut self, name: &'static str) -> Result<Option<String>, ConfigError> {
        self.value(name)
    }

    /// Returns the word of a `Choice` variable.
    pub fn choice(&mut self, name: &'static str) -> Result<&'static str, ConfigError> {
        let var = lookup_var(name);
        let Kind::Choice(words) = var.kind else {
            panic!("{name} is not a choice");
        };
        let v = self.value(name)?.unwrap_or_default();
        words
            .iter()
            .find(|w| **w == v.trim())
            .copied()
            .ok_or_else(|| {
                ConfigError::new(var.name, &v, format!("must be {}", var.kind.describe()))
            })
    }

    /// Returns an absolute path without `..`; `computed` gives the default of
    /// a `Computed` variable (recorded as its value).
    pub fn path(
        &mut self,
        name: &'static str,
        computed: impl FnOnce() -> PathBuf,
    ) -> Result<PathBuf, ConfigError> {
        let var = lookup_var(name);
        let p = match self.value(name)? {
            Some(v) => PathBuf::from(v),
            None => {
                let p = computed();
                self.record(var, Some(p.display().to_string()), Source::Default);
                p
            }
        };
        check_path(var.name, &p)?;
        Ok(p)
    }

    /// Returns a folder name (`ARGUS_CLUSTER_NAME`).
    pub fn name(&mut self, name: &'static str) -> Result<String, ConfigError> {
        let v = self.value(name)?.unwrap_or_default();
        let ok = !v.is_empty()
            && v.len() <= 63
            && v != "."
            && v != ".."
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
        if ok {
            Ok(v)
        } else {
            Err(ConfigError::new(
                lookup_var(name).name,
                &v,
                "must be 1-63 characters of letters, digits, `-`, `_` or `.` (it names a folder)",
            ))
        }
    }

    /// Returns a port.
    pub fn port(&mut self, name: &'static str) -> Result<u16, ConfigError> {
        let var = lookup_var(name);
        let v = self.value(name)?.unwrap_or_default();
        match v.trim().parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
            Ok(_) => Err(ConfigError::new(var.name, &v, "port out of range 1-65535")),
            Err(_) => Err(ConfigError::new(var.name, &v, "not a port number")),
        }
    }

    /// Returns a port, or `None` when the variable is unset or empty.
    pub fn opt_port(&mut self, name: &'static str) -> Result<Option<u16>, ConfigError> {
        let var = lookup_var(name);
        match self.value(name)? {
            None => Ok(None),
            Some(v) => match v.trim().parse::<u32>() {
                Ok(p) if (1..=65535).contains(&p) => Ok(Some(p as u16)),
                Ok(_) => Err(ConfigError::new(var.name, &v, "port out of range 1-65535")),
                Err(_) => Err(ConfigError::new(var.name, &v, "not a port number")),
            },
        }
    }

    /// Returns a number of seconds as [`Reader::seconds`] does, or `None`
    /// when the variable is unset or empty.
    pub fn opt_seconds(&mut self, name: &'static str) -> Result<Option<Duration>, ConfigError> {
        match self.value(name)? {
            Some(v) if !v.trim().is_empty() => self.seconds(name).map(Some),
            _ => Ok(None),
        }
    }

    /// Returns a finite number of seconds of at least the table's floor.
    pub fn seconds(&mut self, name: &'static str) -> Result<Duration, ConfigError> {
        let var = lookup_var(name);
        let Kind::Seconds { min } = var.kind else {
            panic!("{name} is not in seconds");
        };
        let v = self.value(name)?.unwrap_or_default();
        let n: f64 = v
            .trim()
            .parse()
            .map_err(|_| ConfigError::new(var.name, &v, "not a number of seconds"))?;
        if !n.is_finite() || n <= 0.0 {
            return Err(ConfigError::new(
                var.name,
                &v,
                "must be a positive number of seconds",
            ));
        }
        if n < min {
            return Err(ConfigError::new(
                var.name,
                &v,
                format!("must be at least {min} seconds"),
            ));
        }
        if n > 86_400.0 * 365.0 {
            return Err(ConfigError::new(
                var.name,
                &v,
                "unreasonably large (over a year)",
            ));
        }
        Ok(Duration::from_secs_f64(n))
    }

    /// Returns a yes/no value.
    pub fn flag(&mut self, name: &'static str) -> Result<bool, ConfigError> {
        let v = self.value(name)?.unwrap_or_default();
        parse_bool(&v).ok_or_else(|| {
            ConfigError::new(
                lookup_var(name).name,
                &v,
                format!("must be {}", Kind::Bool.describe()),
            )
        })
    }

    /// Returns the node IP override; `None` for `auto`.
    pub fn ip(&mut self, name: &'static str) -> Result<Option<IpAddr>, ConfigError> {
        let var = lookup_var(name);
        let v = self.value(name)?.unwrap_or_default();
        if v.trim() == "auto" {
            return Ok(None);
        }
        let ip: IpAddr = v
            .trim()
            .parse()
            .map_err(|_| ConfigError::new(var.name, &v, "not an IP address (or `auto`)"))?;
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(ConfigError::new(
                var.name,
                &v,
                "must be a unicast address other than 0.0.0.0/::",
            ));
        }
        Ok(Some(ip))
    }
}

/// Parses the one yes/no vocabulary: `1/true/yes/on`, `0/false/no/off`
/// (any case).
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

pub(crate) fn check_path(var: &'static str, p: &Path) -> Result<(), ConfigError> {
    let shown = p.display().to_string();
    if !p.is_absolute() {
        return Err(ConfigError::new(var, &shown, "must be an absolute path"));
    }
    if shown.contains('\0') {
        return Err(ConfigError::new(var, &shown, "contains a NUL byte"));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(ConfigError::new(
            var,
            &shown,
            "must not contain `..` (it would escape its folder)",
        ));
    }
    Ok(())
}

/// Which node this agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Head,
    Worker,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Head => "head",
            Role::Worker => "worker",
        })
    }
}

/// The node's local state folder when `ARGUS_STATE_DIR` is unset.
pub const DEFAULT_STATE_DIR: &str = "/run/argus";

/// Returns the state folder that the value of `ARGUS_STATE_DIR` names, for
/// a process that has no [`Reader`] and must not fail on it (the `podman`
/// shim, which finds its node's agent there): an absolute path, else
/// [`DEFAULT_STATE_DIR`]. The agent itself reads the variable through the
/// reader, which refuses a relative path (exit 78).
pub fn state_dir_or_default(value: Option<&str>) -> std::path::PathBuf {
    value
        .filter(|v| v.starts_with('/'))
        .unwrap_or(DEFAULT_STATE_DIR)
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shims_state_folder_is_an_absolute_value_or_the_default() {
        assert_eq!(state_dir_or_default(Some("/run/a")), Path::new("/run/a"));
        for v in [None, Some(""), Some("run/a"), Some("./x")] {
            assert_eq!(
                state_dir_or_default(v),
                Path::new(DEFAULT_STATE_DIR),
                "{v:?}"
            );
        }
        assert_eq!(
            lookup_var("ARGUS_STATE_DIR").default.to_string(),
            DEFAULT_STATE_DIR
        );
    }
}
