//! Configuration from the environment (SPEC §2), validated in full before
//! anything starts (R-CFG-1): a bad value is one [`ConfigError`] naming the
//! variable, and the caller exits 78 without writing or starting anything.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
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
    fn new(var: &'static str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            var,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
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

/// Everything the node reads from its environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub role: Role,
    pub shared_root: PathBuf,
    pub cluster_name: String,
    pub head_file: PathBuf,
    pub ray_port: u16,
    pub dashboard_port: u16,
    pub ttl: Duration,
    pub refresh: Duration,
    pub poll: Duration,
    pub node_ip: Option<IpAddr>,
    /// `ray start --resources` for workers; empty means no flag.
    pub worker_resources: BTreeMap<String, f64>,
    pub ray_extra_args: Vec<String>,
    pub log_dir: PathBuf,
    pub log_format: LogFormat,
    pub log_level: String,
    pub preflight: PreflightMode,
    /// Test-only root under which `/dev/nvidia*` are looked up.
    pub preflight_dev_root: PathBuf,
    pub preflight_timeout: Duration,
    pub prestart_hook: PathBuf,
    pub disable_prestart: bool,
    pub prestart_timeout: Duration,
    pub stop_grace: Duration,
    pub ray_bin: String,
    /// Where this node's status file lives (not on shared storage).
    pub state_dir: PathBuf,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub stable_run: Duration,
    /// Use file events (inotify) to react faster; polling stays primary.
    pub file_events: bool,
}

/// The variables this module reads, for documentation and tests.
pub const VARIABLES: &[&str] = &[
    "ARGUS_ROLE",
    "ARGUS_SHARED_ROOT",
    "ARGUS_CLUSTER_NAME",
    "ARGUS_HEAD_IP_FILE",
    "ARGUS_RAY_PORT",
    "ARGUS_DASHBOARD_PORT",
    "ARGUS_TTL_S",
    "ARGUS_REFRESH_S",
    "ARGUS_POLL_S",
    "ARGUS_NODE_IP",
    "ARGUS_WORKER_RESOURCES_KV",
    "ARGUS_RAY_EXTRA_ARGS",
    "ARGUS_LOG_DIR",
    "ARGUS_LOG_FORMAT",
    "ARGUS_LOG_LEVEL",
    "ARGUS_PREFLIGHT",
    "ARGUS_PREFLIGHT_DEV_ROOT",
    "ARGUS_PREFLIGHT_TIMEOUT_S",
    "ARGUS_PRESTART_HOOK",
    "ARGUS_DISABLE_PRESTART",
    "ARGUS_PRESTART_TIMEOUT_S",
    "ARGUS_STOP_GRACE_S",
    "ARGUS_RAY_BIN",
    "ARGUS_STATE_DIR",
    "ARGUS_RESTART_BACKOFF_MIN_S",
    "ARGUS_RESTART_BACKOFF_MAX_S",
    "ARGUS_STABLE_RUN_S",
    "ARGUS_FILE_EVENTS",
];

impl Config {
    /// Reads and validates the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads and validates configuration from `get` (variable -> value).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        let role = match var("ARGUS_ROLE") {
            None => {
                return Err(ConfigError::new(
                    "ARGUS_ROLE",
                    "",
                    "required: set it to `head` or `worker`",
                ))
            }
            Some(v) => match v.trim() {
                "head" => Role::Head,
                "worker" => Role::Worker,
                _ => {
                    return Err(ConfigError::new(
                        "ARGUS_ROLE",
                        &v,
                        "must be `head` or `worker`",
                    ))
                }
            },
        };
        let shared_root = abs_path("ARGUS_SHARED_ROOT", var("ARGUS_SHARED_ROOT"), "/private")?;
        let cluster_name = var("ARGUS_CLUSTER_NAME").unwrap_or_else(|| "argus-ray".into());
        check_cluster_name(&cluster_name)?;
        let head_file = match var("ARGUS_HEAD_IP_FILE") {
            Some(v) => abs_path("ARGUS_HEAD_IP_FILE", Some(v), "")?,
            None => shared_root
                .join("ray/discovery")
                .join(&cluster_name)
                .join("head.json"),
        };
        if head_file.file_name().is_none() {
            return Err(ConfigError::new(
                "ARGUS_HEAD_IP_FILE",
                &head_file.display().to_string(),
                "must name a file",
            ));
        }
        let ray_port = port("ARGUS_RAY_PORT", var("ARGUS_RAY_PORT"), 6379)?;
        let dashboard_port = port("ARGUS_DASHBOARD_PORT", var("ARGUS_DASHBOARD_PORT"), 8265)?;
        if ray_port == dashboard_port {
            return Err(ConfigError::new(
                "ARGUS_DASHBOARD_PORT",
                &dashboard_port.to_string(),
                "must differ from ARGUS_RAY_PORT",
            ));
        }
        let ttl = seconds("ARGUS_TTL_S", var("ARGUS_TTL_S"), 60.0)?;
        let refresh = seconds("ARGUS_REFRESH_S", var("ARGUS_REFRESH_S"), 10.0)?;
        if refresh >= ttl {
            return Err(ConfigError::new(
                "ARGUS_REFRESH_S",
                &refresh.as_secs_f64().to_string(),
                format!("must be less than ARGUS_TTL_S ({})", ttl.as_secs_f64()),
            ));
        }
        let poll = seconds("ARGUS_POLL_S", var("ARGUS_POLL_S"), 5.0)?;
        if poll >= ttl {
            return Err(ConfigError::new(
                "ARGUS_POLL_S",
                &poll.as_secs_f64().to_string(),
                format!("must be less than ARGUS_TTL_S ({})", ttl.as_secs_f64()),
            ));
        }
        let node_ip = match var("ARGUS_NODE_IP") {
            None => None,
            Some(v) if v.trim() == "auto" => None,
            Some(v) => {
                let ip: IpAddr = v.trim().parse().map_err(|_| {
                    ConfigError::new("ARGUS_NODE_IP", &v, "not an IP address (or `auto`)")
                })?;
                if ip.is_unspecified() || ip.is_multicast() {
                    return Err(ConfigError::new(
                        "ARGUS_NODE_IP",
                        &v,
                        "must be a unicast address other than 0.0.0.0/::",
                    ));
                }
                Some(ip)
            }
        };
        let worker_resources = match get("ARGUS_WORKER_RESOURCES_KV") {
            None => parse_resources("worker_node=100").expect("default parses"),
            Some(v) => parse_resources(&v)
                .map_err(|reason| ConfigError::new("ARGUS_WORKER_RESOURCES_KV", &v, reason))?,
        };
        let ray_extra_args = match var("ARGUS_RAY_EXTRA_ARGS") {
            None => Vec::new(),
            Some(v) => shlex::split(&v).ok_or_else(|| {
                ConfigError::new(
                    "ARGUS_RAY_EXTRA_ARGS",
                    &v,
                    "cannot be split into words (unbalanced quote or trailing backslash)",
                )
            })?,
        };
        for a in &ray_extra_args {
            if a == "--block" || a == "--head" || a.starts_with("--address") {
                return Err(ConfigError::new(
                    "ARGUS_RAY_EXTRA_ARGS",
                    a,
                    "the agent sets --head, --address and --block itself",
                ));
            }
        }
        let log_dir = match var("ARGUS_LOG_DIR") {
            Some(v) => abs_path("ARGUS_LOG_DIR", Some(v), "")?,
            None => shared_root.join("common/logs"),
        };
        let log_format = match var("ARGUS_LOG_FORMAT").as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(v) => {
                return Err(ConfigError::new(
                    "ARGUS_LOG_FORMAT",
                    v,
                    "must be `text` or `json`",
                ))
            }
        };
        let log_level = var("ARGUS_LOG_LEVEL").unwrap_or_else(|| "info".into());
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(ConfigError::new(
                "ARGUS_LOG_LEVEL",
                &log_level,
                "must be one of error, warn, info, debug, trace",
            ));
        }
        let preflight = match var("ARGUS_PREFLIGHT").as_deref() {
            None | Some("auto") => PreflightMode::Auto,
            Some("require") => PreflightMode::Require,
            Some("skip") => PreflightMode::Skip,
            Some(v) => {
                return Err(ConfigError::new(
                    "ARGUS_PREFLIGHT",
                    v,
                    "must be `auto`, `require` or `skip`",
                ))
            }
        };
        let preflight_dev_root = abs_path(
            "ARGUS_PREFLIGHT_DEV_ROOT",
            var("ARGUS_PREFLIGHT_DEV_ROOT"),
            "/",
        )?;
        let preflight_timeout = seconds(
            "ARGUS_PREFLIGHT_TIMEOUT_S",
            var("ARGUS_PREFLIGHT_TIMEOUT_S"),
            10.0,
        )?;
        let prestart_hook = abs_path(
            "ARGUS_PRESTART_HOOK",
            var("ARGUS_PRESTART_HOOK"),
            "/opt/argus/ray-prestart",
        )?;
        let disable_prestart = match var("ARGUS_DISABLE_PRESTART").as_deref() {
            None | Some("0") | Some("false") => false,
            Some("1") | Some("true") => true,
            Some(v) => {
                return Err(ConfigError::new(
                    "ARGUS_DISABLE_PRESTART",
                    v,
                    "must be `1`, `true`, `0` or `false`",
                ))
            }
        };
        let prestart_timeout = seconds(
            "ARGUS_PRESTART_TIMEOUT_S",
            var("ARGUS_PRESTART_TIMEOUT_S"),
            300.0,
        )?;
        let stop_grace = seconds("ARGUS_STOP_GRACE_S", var("ARGUS_STOP_GRACE_S"), 8.0)?;
        let ray_bin = var("ARGUS_RAY_BIN").unwrap_or_else(|| "ray".into());
        let state_dir = abs_path("ARGUS_STATE_DIR", var("ARGUS_STATE_DIR"), "/run/argus")?;
        let backoff_min = seconds(
            "ARGUS_RESTART_BACKOFF_MIN_S",
            var("ARGUS_RESTART_BACKOFF_MIN_S"),
            1.0,
        )?;
        let backoff_max = seconds(
            "ARGUS_RESTART_BACKOFF_MAX_S",
            var("ARGUS_RESTART_BACKOFF_MAX_S"),
            60.0,
        )?;
        if backoff_max < backoff_min {
            return Err(ConfigError::new(
                "ARGUS_RESTART_BACKOFF_MAX_S",
                &backoff_max.as_secs_f64().to_string(),
                "must not be less than ARGUS_RESTART_BACKOFF_MIN_S",
            ));
        }
        let stable_run = seconds("ARGUS_STABLE_RUN_S", var("ARGUS_STABLE_RUN_S"), 60.0)?;
        let file_events = match var("ARGUS_FILE_EVENTS").as_deref() {
            None | Some("on") | Some("1") | Some("true") => true,
            Some("off") | Some("0") | Some("false") => false,
            Some(v) => {
                return Err(ConfigError::new(
                    "ARGUS_FILE_EVENTS",
                    v,
                    "must be `on` or `off`",
                ))
            }
        };
        Ok(Config {
            role,
            shared_root,
            cluster_name,
            head_file,
            ray_port,
            dashboard_port,
            ttl,
            refresh,
            poll,
            node_ip,
            worker_resources,
            ray_extra_args,
            log_dir,
            log_format,
            log_level,
            preflight,
            preflight_dev_root,
            preflight_timeout,
            prestart_hook,
            disable_prestart,
            prestart_timeout,
            stop_grace,
            ray_bin,
            state_dir,
            backoff_min,
            backoff_max,
            stable_run,
            file_events,
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
}

fn check_cluster_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "ARGUS_CLUSTER_NAME",
            name,
            "must be 1-63 characters of letters, digits, `-`, `_` or `.` (it names a folder)",
        ))
    }
}

fn abs_path(var: &'static str, v: Option<String>, default: &str) -> Result<PathBuf, ConfigError> {
    let v = v.unwrap_or_else(|| default.to_string());
    if !v.starts_with('/') {
        return Err(ConfigError::new(var, &v, "must be an absolute path"));
    }
    if v.contains('\0') {
        return Err(ConfigError::new(var, &v, "contains a NUL byte"));
    }
    Ok(PathBuf::from(v))
}

fn port(var: &'static str, v: Option<String>, default: u16) -> Result<u16, ConfigError> {
    match v {
        None => Ok(default),
        Some(v) => match v.trim().parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
            Ok(_) => Err(ConfigError::new(var, &v, "port out of range 1-65535")),
            Err(_) => Err(ConfigError::new(var, &v, "not a port number")),
        },
    }
}

/// Parses a positive, finite number of seconds (decimals allowed).
fn seconds(var: &'static str, v: Option<String>, default: f64) -> Result<Duration, ConfigError> {
    let Some(v) = v else {
        return Ok(Duration::from_secs_f64(default));
    };
    let n: f64 = v
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(var, &v, "not a number of seconds"))?;
    if !n.is_finite() || n <= 0.0 {
        return Err(ConfigError::new(
            var,
            &v,
            "must be a positive number of seconds",
        ));
    }
    if n > 86_400.0 * 365.0 {
        return Err(ConfigError::new(
            var,
            &v,
            "unreasonably large (over a year)",
        ));
    }
    Ok(Duration::from_secs_f64(n))
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
    use super::*;

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
        assert_eq!(c.log_dir, PathBuf::from("/private/common/logs"));
        assert_eq!(c.preflight, PreflightMode::Auto);
        assert_eq!(c.prestart_hook, PathBuf::from("/opt/argus/ray-prestart"));
        assert!(!c.disable_prestart);
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
        assert_eq!(c.log_dir, PathBuf::from("/shared/common/logs"));
        assert_eq!((c.ray_port, c.dashboard_port), (7000, 7001));
        assert_eq!(c.refresh, Duration::from_millis(2500));
        assert_eq!(c.node_ip, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(
            c.worker_resources_json().as_deref(),
            Some(r#"{"a":1.0,"b":2.5}"#)
        );
        assert_eq!(c.ray_extra_args, vec!["--num-cpus=2", "--labels=x=1 y"]);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.preflight, PreflightMode::Require);
        assert!(c.disable_prestart);
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
                vec![w, ("ARGUS_DISABLE_PRESTART", "yes")],
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
}
