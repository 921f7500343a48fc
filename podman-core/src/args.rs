//! Parsing of podman command lines into plain data.
//!
//! Pure functions: no environment, files or sockets. Flags stop at the first
//! positional (pflag `SetInterspersed(false)`), repeated string flags keep the
//! last value, list flags accumulate. Ray's worker prefix reaches us either
//! through `bash -c "exec podman …"` (quotes already removed) or, once Ray
//! execs podman directly, with the quotes still on (`K='V'`): both parse to
//! the same values (see [`unquote`]).

/// Errors of argument parsing. Each names the offending flag or word.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("unknown flag: {0}")]
    UnknownFlag(String),
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("invalid value {value:?} for flag {flag}")]
    BadValue { flag: String, value: String },
    #[error("flag {0} does not take a value")]
    UnexpectedValue(String),
    #[error("unknown command {0:?}: {hint}", hint = command_hint(.0))]
    UnknownCommand(String),
    #[error("`{0}` requires at least one argument")]
    MissingArgument(String),
    #[error("podman-only value {value:?} of {flag} has no Docker equivalent")]
    Unsupported { flag: String, value: String },
    #[error("unknown option {option:?} of {flag}")]
    UnknownOption { flag: String, option: String },
    #[error("option {option:?} of {flag} is not supported by the shim: {why}")]
    NotSupported {
        flag: String,
        option: String,
        why: &'static str,
    },
    #[error("image {reference:?}: {why}")]
    Transport {
        reference: String,
        why: &'static str,
    },
}

/// What the shim serves: the podman commands Ray's container plugins call,
/// and the read-only ones people use to look at them.
pub const SERVED: &str = "run, pull, images, image inspect|exists|pull|ls, inspect, \
                          container exists|inspect|ps|rm|kill|stop|logs, ps, rm, kill, stop, logs, \
                          version, info";

/// One line for a command the shim does not serve: what it serves, and
/// what to do instead of the command asked for.
fn command_hint(command: &str) -> String {
    let word = command.rsplit(' ').next().unwrap_or(command);
    let instead = match word {
        "create" => "to start a container in the background use `podman run -d`",
        "cp" | "commit" | "build" | "buildx" | "push" | "tag" | "save" | "load" | "import"
        | "export" | "manifest" | "image-build" => {
            "engine images are made on the host: `docker build` there, then name the image in the job"
        }
        "exec" | "attach" | "start" | "restart" | "pause" | "unpause" | "wait" | "top"
        | "port" | "stats" => {
            "engine containers live as long as their `podman run`: start a new one with `podman run`"
        }
        _ => "other work goes to the host's `docker` CLI",
    };
    format!("the node's podman shim serves only what Ray's container plugins call ({SERVED}); {instead}")
}

/// Where an image reference says its image comes from: podman's transport
/// prefix, taken off the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// No prefix: the daemon's image, pulled when missing (`--pull`).
    #[default]
    Default,
    /// `docker-daemon:X`: X in the Docker daemon, never pulled.
    Daemon,
    /// `docker://X`: X from its registry.
    Registry,
}

/// Podman's transports that name a store this node does not have, with why.
const FOREIGN_TRANSPORTS: &[(&str, &str)] = &[
    (
        "containers-storage:",
        "containers-storage: is podman's own image store, which this node does not have; \
         its images are the host Docker daemon's (write docker-daemon:IMAGE or IMAGE)",
    ),
    (
        "oci:",
        "an OCI layout folder is not served; load it into the host's Docker daemon (docker load) and name the image",
    ),
    (
        "oci-archive:",
        "an OCI archive is not served; load it into the host's Docker daemon (docker load) and name the image",
    ),
    (
        "docker-archive:",
        "an image archive is not served; load it into the host's Docker daemon (docker load) and name the image",
    ),
    (
        "dir:",
        "an image folder is not served; load it into the host's Docker daemon and name the image",
    ),
];

/// Splits podman's transport prefix off `reference`: `docker-daemon:X` and
/// `docker://X` give X and where it comes from; a transport naming a store
/// this node does not have (`containers-storage:`, `oci:`, …) is an error
/// saying what to write instead; anything else is the reference itself.
pub fn split_transport(reference: &str) -> Result<(Source, &str), ArgsError> {
    let refused = |why| ArgsError::Transport {
        reference: reference.to_string(),
        why,
    };
    let (source, rest) = if let Some(x) = reference.strip_prefix("docker-daemon:") {
        (Source::Daemon, x)
    } else if let Some(x) = reference.strip_prefix("docker://") {
        (Source::Registry, x)
    } else if let Some((_, why)) = FOREIGN_TRANSPORTS
        .iter()
        .find(|(t, _)| reference.starts_with(t))
    {
        return Err(refused(why));
    } else {
        return Ok((Source::Default, reference));
    };
    if rest.is_empty() || rest.contains("://") {
        return Err(refused("the transport names no image"));
    }
    Ok((source, rest))
}

/// Whether and when `run` pulls the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullPolicy {
    #[default]
    Missing,
    Always,
    Never,
}

/// One `-v SRC:DST[:OPTS]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub source: String,
    pub target: String,
    /// Options other than the SELinux relabel ones, which are dropped.
    pub options: Vec<String>,
}

impl Volume {
    /// Returns true if and only if the volume is mounted read-only.
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }

    /// Returns true if and only if the source is a path (not a named
    /// volume): absolute, or relative (`./x`, `x/y`), which Docker would not
    /// take for a volume name.
    pub fn is_path(&self) -> bool {
        self.source.starts_with('/') || self.source.starts_with('.') || self.source.contains('/')
    }
}

/// `podman run` options, after parsing and before any translation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunOpts {
    pub image: String,
    pub command: Vec<String>,
    pub rm: bool,
    pub detach: bool,
    pub interactive: bool,
    pub tty: bool,
    pub name: Option<String>,
    pub replace: bool,
    /// `-e` values in order, `K=V` or `K` (copy from the caller).
    pub env: Vec<String>,
    pub env_files: Vec<String>,
    pub env_host: bool,
    pub http_proxy: bool,
    pub volumes: Vec<Volume>,
    pub tmpfs: Vec<String>,
    pub network: Option<String>,
    pub pid: Option<String>,
    pub ipc: Option<String>,
    pub uts: Option<String>,
    pub userns: Option<String>,
    pub user: Option<String>,
    pub group_add: Vec<String>,
    pub runtime: Option<String>,
    pub gpus: Option<String>,
    pub devices: Vec<String>,
    pub entrypoint: Option<String>,
    pub workdir: Option<String>,
    pub labels: Vec<String>,
    pub privileged: bool,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub security_opt: Vec<String>,
    pub shm_size: Option<String>,
    pub init: bool,
    pub hostname: Option<String>,
    pub read_only: bool,
    pub memory: Option<String>,
    pub cpus: Option<String>,
    pub pids_limit: Option<String>,
    pub stop_signal: Option<String>,
    pub stop_timeout: Option<String>,
    pub publish: Vec<String>,
    pub add_host: Vec<String>,
    pub dns: Vec<String>,
    pub pull: PullPolicy,
    pub quiet: bool,
    pub sig_proxy: bool,
    pub platform: Option<String>,
    pub cidfile: Option<String>,
    pub ulimits: Vec<String>,
    pub restart: Option<String>,
    pub cgroupns: Option<String>,
    pub cgroup_parent: Option<String>,
    pub cpuset_cpus: Option<String>,
    pub log_driver: Option<String>,
    pub log_opts: Vec<String>,
    pub detach_keys: Option<String>,
    /// Podman's global flags that were accepted without effect (their
    /// names, from [`IGNORED_GLOBALS`] and [`IGNORED_GLOBAL_BOOLS`]).
    pub ignored: Vec<&'static str>,
    /// Where the image comes from (its transport prefix, taken off
    /// [`RunOpts::image`]).
    pub source: Source,
    /// Long names of the [`RUN_FLAGS`] in effect (the last of a repeated
    /// flag; a boolean only when true), for the policy.
    pub given: Vec<&'static str>,
}

/// Options of the commands that list or show things.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShowOpts {
    pub format: Option<String>,
    pub quiet: bool,
    pub all: bool,
    pub filters: Vec<String>,
}

/// A parsed podman invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(Box<RunOpts>),
    Pull {
        quiet: bool,
        image: String,
        /// Where the image comes from (its transport prefix, taken off
        /// `image`).
        source: Source,
    },
    Images(ShowOpts),
    ImageInspect {
        format: Option<String>,
        names: Vec<String>,
    },
    ImageExists(String),
    Inspect {
        format: Option<String>,
        kind: Option<String>,
        names: Vec<String>,
    },
    ContainerExists(String),
    Ps(ShowOpts),
    Rm {
        force: bool,
        ignore: bool,
        volumes: bool,
        names: Vec<String>,
    },
    Kill {
        signal: String,
        ignore: bool,
        names: Vec<String>,
    },
    Stop {
        timeout: Option<i32>,
        ignore: bool,
        names: Vec<String>,
    },
    Logs {
        follow: bool,
        tail: Option<String>,
        timestamps: bool,
        name: String,
    },
    Version {
        format: Option<String>,
    },
    ShortVersion,
    Info {
        format: Option<String>,
    },
    Help,
}

/// Removes one pair of shell quotes around a whole value (`'v'` or `"v"`),
/// and around the value part of `K='V'`. Ray builds `--env K='V'`; when the
/// string is not given to a shell the quotes reach us intact.
pub fn unquote(s: &str) -> String {
    fn strip(v: &str) -> Option<&str> {
        for q in ['\'', '"'] {
            if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
                let inner = &v[1..v.len() - 1];
                if !inner.contains(q) {
                    return Some(inner);
                }
            }
        }
        None
    }
    if let Some(inner) = strip(s) {
        return inner.to_string();
    }
    if let Some((k, v)) = s.split_once('=') {
        if !k.is_empty() && !k.contains(['\'', '"', ' ']) {
            if let Some(inner) = strip(v) {
                return format!("{k}={inner}");
            }
        }
    }
    s.to_string()
}

/// Returns the name `N` if `v` is exactly `$N` or `${N}` with `N` a `RAY_`
/// variable: the form Ray leaves unexpanded without a shell (`RAY_JOB_ID`).
pub fn unexpanded_ray_var(v: &str) -> Option<&str> {
    let name = v
        .strip_prefix("${")
        .and_then(|r| r.strip_suffix('}'))
        .or_else(|| v.strip_prefix('$'))?;
    (name.starts_with("RAY_") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(name)
}

/// Global flags podman accepts before (or, being persistent, after) the
/// subcommand and that have no meaning on Docker.
const IGNORED_GLOBALS: &[&str] = &[
    "cgroup-manager",
    "log-level",
    "root",
    "runroot",
    "storage-driver",
    "storage-opt",
    "events-backend",
    "tmpdir",
    "url",
    "connection",
    "identity",
    "runtime-flag",
    "conmon",
    "network-cmd-path",
    "network-config-dir",
    "hooks-dir",
    "module",
];
const IGNORED_GLOBAL_BOOLS: &[&str] = &["syslog", "remote", "noout", "log-driver-syslog"];

/// The global flags Ray's own container plugins always pass
/// (`ray/_private/runtime_env/image_uri.py`: `--cgroup-manager=cgroupfs`):
/// accepted without a word, since nobody chose them.
pub const RAY_OWN_GLOBALS: &[&str] = &["cgroup-manager"];

/// Every global flag the shim accepts and ignores, in a fixed order (a
/// report names a set of them by their positions here).
pub fn all_ignored_globals() -> impl Iterator<Item = &'static str> {
    IGNORED_GLOBALS.iter().chain(IGNORED_GLOBAL_BOOLS).copied()
}

/// Returns the table's own spelling of the ignored global flag `name`.
pub fn ignored_global(name: &str) -> Option<&'static str> {
    all_ignored_globals().find(|g| *g == name)
}

/// Returns the ignored global flags given before the subcommand of `args`
/// (none when they do not parse).
pub fn leading_ignored_globals(args: &[String]) -> Vec<&'static str> {
    split_flags(args, &global_kind, &global_short)
        .map(|(flags, _)| {
            flags
                .iter()
                .filter_map(|f| ignored_global(&f.name))
                .collect()
        })
        .unwrap_or_default()
}

/// Kinds of flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Value,
}

/// A flag as it appeared: canonical long name plus its value.
struct Flag {
    name: String,
    shown: String,
    value: Option<String>,
}

/// Splits the flags off the front of `args` (stopping at the first
/// positional or `--`) using `kind_of` to know which flags take values.
/// Returns the flags and the index of the first positional.
fn split_flags(
    args: &[String],
    kind_of: &dyn Fn(&str) -> Option<Kind>,
    short: &dyn Fn(char) -> Option<&'static str>,
) -> Result<(Vec<Flag>, usize), ArgsError> {
    let mut flags = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            return Ok((flags, i + 1));
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let kind = kind_of(name).ok_or_else(|| ArgsError::UnknownFlag(format!("--{name}")))?;
            let value = match (kind, inline) {
                (_, Some(v)) => Some(v),
                (Kind::Bool, None) => None,
                (Kind::Value, None) => {
                    i += 1;
                    Some(
                        args.get(i)
                            .cloned()
                            .ok_or_else(|| ArgsError::MissingValue(format!("--{name}")))?,
                    )
                }
            };
            flags.push(Flag {
                name: name.to_string(),
                shown: format!("--{name}"),
                value,
            });
        } else if a.len() > 1 && a.starts_with('-') {
            let chars: Vec<char> = a[1..].chars().collect();
            let mut j = 0;
            while j < chars.len() {
                let c = chars[j];
                let name = short(c).ok_or_else(|| ArgsError::UnknownFlag(format!("-{c}")))?;
                let kind = kind_of(name).ok_or_else(|| ArgsError::UnknownFlag(format!("-{c}")))?;
                if kind == Kind::Value {
                    let rest: String = chars[j + 1..].iter().collect();
                    let value = if !rest.is_empty() {
                        rest.strip_prefix('=').unwrap_or(&rest).to_string()
                    } else {
                        i += 1;
                        args.get(i)
                            .cloned()
                            .ok_or_else(|| ArgsError::MissingValue(format!("-{c}")))?
                    };
                    flags.push(Flag {
                        name: name.to_string(),
                        shown: format!("-{c}"),
                        value: Some(value),
                    });
                    break;
                }
                flags.push(Flag {
                    name: name.to_string(),
                    shown: format!("-{c}"),
                    value: None,
                });
                j += 1;
            }
        } else {
            return Ok((flags, i));
        }
        i += 1;
    }
    Ok((flags, args.len()))
}

fn bool_value(f: &Flag) -> Result<bool, ArgsError> {
    match f.value.as_deref() {
        None | Some("true") | Some("1") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some(v) => Err(ArgsError::BadValue {
            flag: f.shown.clone(),
            value: v.to_string(),
        }),
    }
}

fn value(f: &Flag) -> Result<String, ArgsError> {
    f.value
        .clone()
        .ok_or_else(|| ArgsError::MissingValue(f.shown.clone()))
}

fn global_kind(n: &str) -> Option<Kind> {
    if IGNORED_GLOBALS.contains(&n) {
        Some(Kind::Value)
    } else if IGNORED_GLOBAL_BOOLS.contains(&n) || n == "version" || n == "help" {
        Some(Kind::Bool)
    } else {
        None
    }
}

fn global_short(c: char) -> Option<&'static str> {
    match c {
        'v' => Some("version"),
        'h' => Some("help"),
        _ => None,
    }
}

/// Returns the podman command of `args` as [`parse`] sees it: the first
/// argument after the global flags (`version` for `--version`). None when
/// there is none (`--help`, nothing) or the global flags do not parse.
/// What it returns is the caller's text: map it onto a fixed set before
/// using it as a label (`argus_telemetry::metrics::shim_command_label`).
pub fn command_word(args: &[String]) -> Option<&str> {
    let (flags, first) = split_flags(args, &global_kind, &global_short).ok()?;
    if flags.iter().any(|f| f.name == "version") {
        return Some("version");
    }
    if flags.iter().any(|f| f.name == "help") {
        return None;
    }
    args.get(first).map(String::as_str)
}

/// Parses the arguments after `podman`.
pub fn parse(args: &[String]) -> Result<Command, ArgsError> {
    let (flags, first) = split_flags(args, &global_kind, &global_short)?;
    if flags.iter().any(|f| f.name == "version") {
        return Ok(Command::ShortVersion);
    }
    if flags.iter().any(|f| f.name == "help") {
        return Ok(Command::Help);
    }
    let Some(sub) = args.get(first) else {
        return Ok(Command::Help);
    };
    let rest = &args[first + 1..];
    match sub.as_str() {
        "run" => parse_run(rest).map(|o| Command::Run(Box::new(o))),
        "container" => match rest.first().map(String::as_str) {
            Some("run") => parse_run(&rest[1..]).map(|o| Command::Run(Box::new(o))),
            Some("exists") => {
                one_name("container exists", &rest[1..]).map(Command::ContainerExists)
            }
            Some("inspect") => parse_inspect(&rest[1..], Some("container".into())),
            Some("ps") | Some("list") | Some("ls") => parse_show(&rest[1..]).map(Command::Ps),
            Some("rm") => parse_rm(&rest[1..]),
            Some("kill") => parse_kill(&rest[1..]),
            Some("stop") => parse_stop(&rest[1..]),
            Some("logs") => parse_logs(&rest[1..]),
            Some(other) => Err(ArgsError::UnknownCommand(format!("container {other}"))),
            None => Err(ArgsError::MissingArgument("container".into())),
        },
        "image" => match rest.first().map(String::as_str) {
            Some("inspect") => parse_inspect(&rest[1..], Some("image".into())),
            Some("exists") => one_name("image exists", &rest[1..]).map(Command::ImageExists),
            Some("pull") => parse_pull(&rest[1..]),
            Some("ls") | Some("list") => parse_show(&rest[1..]).map(Command::Images),
            Some(other) => Err(ArgsError::UnknownCommand(format!("image {other}"))),
            None => Err(ArgsError::MissingArgument("image".into())),
        },
        "pull" => parse_pull(rest),
        "images" => parse_show(rest).map(Command::Images),
        "inspect" => parse_inspect(rest, None),
        "ps" => parse_show(rest).map(Command::Ps),
        "rm" => parse_rm(rest),
        "kill" => parse_kill(rest),
        "stop" => parse_stop(rest),
        "logs" => parse_logs(rest),
        "version" => {
            let (flags, _) = split_flags(rest, &format_kind, &format_short)?;
            Ok(Command::Version {
                format: last_value(&flags, "format")?,
            })
        }
        "info" => {
            let (flags, _) = split_flags(rest, &format_kind, &format_short)?;
            Ok(Command::Info {
                format: last_value(&flags, "format")?,
            })
        }
        "help" => Ok(Command::Help),
        other => Err(ArgsError::UnknownCommand(other.to_string())),
    }
}

fn format_kind(n: &str) -> Option<Kind> {
    match n {
        "format" | "filter" | "type" | "size" | "sort" => Some(Kind::Value),
        "quiet" | "all" | "noheading" | "no-trunc" | "digests" | "latest" | "external" | "last"
        | "namespace" | "ns" | "sync" => Some(Kind::Bool),
        _ => None,
    }
}

fn format_short(c: char) -> Option<&'static str> {
    match c {
        'f' => Some("format"),
        'q' => Some("quiet"),
        'a' => Some("all"),
        'n' => Some("noheading"),
        's' => Some("size"),
        't' => Some("type"),
        'l' => Some("latest"),
        _ => None,
    }
}

fn last_value(flags: &[Flag], name: &str) -> Result<Option<String>, ArgsError> {
    match flags.iter().rev().find(|f| f.name == name) {
        Some(f) => value(f).map(Some),
        None => Ok(None),
    }
}

fn has(flags: &[Flag], name: &str) -> Result<bool, ArgsError> {
    match flags.iter().rev().find(|f| f.name == name) {
        Some(f) => bool_value(f),
        None => Ok(false),
    }
}

fn one_name(cmd: &str, rest: &[String]) -> Result<String, ArgsError> {
    let (_, first) = split_flags(rest, &|_| None, &|_| None)?;
    rest.get(first)
        .cloned()
        .ok_or_else(|| ArgsError::MissingArgument(cmd.into()))
}

fn parse_show(rest: &[String]) -> Result<ShowOpts, ArgsError> {
    let (flags, first) = split_flags(rest, &format_kind, &format_short)?;
    if let Some(extra) = rest.get(first) {
        return Err(ArgsError::UnknownCommand(extra.clone()));
    }
    Ok(ShowOpts {
        format: last_value(&flags, "format")?,
        quiet: has(&flags, "quiet")?,
        all: has(&flags, "all")?,
        filters: flags
            .iter()
            .filter(|f| f.name == "filter")
            .map(value)
            .collect::<Result<_, _>>()?,
    })
}

fn parse_inspect(rest: &[String], kind: Option<String>) -> Result<Command, ArgsError> {
    let (flags, first) = split_flags(rest, &format_kind, &format_short)?;
    let names = rest[first..].to_vec();
    if names.is_empty() {
        return Err(ArgsError::MissingArgument("inspect".into()));
    }
    let format = last_value(&flags, "format")?;
    let kind = last_value(&flags, "type")?.or(kind);
    Ok(match kind.as_deref() {
        Some("image") => Command::ImageInspect { format, names },
        _ => Command::Inspect {
            format,
            kind,
            names,
        },
    })
}

fn parse_pull(rest: &[String]) -> Result<Command, ArgsError> {
    let kind = |n: &str| match n {
        "quiet" | "all-tags" | "tls-verify" => Some(Kind::Bool),
        "platform" | "arch" | "os" | "authfile" | "creds" | "retry" | "retry-delay" => {
            Some(Kind::Value)
        }
        _ => None,
    };
    let short = |c: char| if c == 'q' { Some("quiet") } else { None };
    let (flags, first) = split_flags(rest, &kind, &short)?;
    let image = rest
        .get(first)
        .ok_or_else(|| ArgsError::MissingArgument("pull".into()))?;
    let (source, image) = split_transport(image)?;
    Ok(Command::Pull {
        quiet: has(&flags, "quiet")?,
        image: image.to_string(),
        source,
    })
}

fn names_after(cmd: &str, rest: &[String], first: usize) -> Result<Vec<String>, ArgsError> {
    let names = rest[first..].to_vec();
    if names.is_empty() {
        return Err(ArgsError::MissingArgument(cmd.into()));
    }
    Ok(names)
}

fn parse_rm(rest: &[String]) -> Result<Command, ArgsError> {
    let kind = |n: &str| match n {
        "force" | "ignore" | "volumes" | "all" | "depend" => Some(Kind::Bool),
        "time" => Some(Kind::Value),
        _ => None,
    };
    let short = |c: char| match c {
        'f' => Some("force"),
        'i' => Some("ignore"),
        'v' => Some("volumes"),
        't' => Some("time"),
        _ => None,
    };
    let (flags, first) = split_flags(rest, &kind, &short)?;
    Ok(Command::Rm {
        force: has(&flags, "force")?,
        ignore: has(&flags, "ignore")?,
        volumes: has(&flags, "volumes")?,
        names: names_after("rm", rest, first)?,
    })
}

fn parse_kill(rest: &[String]) -> Result<Command, ArgsError> {
    let kind = |n: &str| match n {
        "signal" => Some(Kind::Value),
        "ignore" => Some(Kind::Bool),
        _ => None,
    };
    let short = |c: char| match c {
        's' => Some("signal"),
        'i' => Some("ignore"),
        _ => None,
    };
    let (flags, first) = split_flags(rest, &kind, &short)?;
    Ok(Command::Kill {
        signal: last_value(&flags, "signal")?.unwrap_or_else(|| "KILL".into()),
        ignore: has(&flags, "ignore")?,
        names: names_after("kill", rest, first)?,
    })
}

fn parse_stop(rest: &[String]) -> Result<Command, ArgsError> {
    let kind = |n: &str| match n {
        "time" | "timeout" => Some(Kind::Value),
        "ignore" => Some(Kind::Bool),
        _ => None,
    };
    let short = |c: char| match c {
        't' => Some("time"),
        'i' => Some("ignore"),
        _ => None,
    };
    let (flags, first) = split_flags(rest, &kind, &short)?;
    let timeout = match flags
        .iter()
        .rev()
        .find(|f| f.name == "time" || f.name == "timeout")
    {
        Some(f) => {
            let v = value(f)?;
            Some(v.parse().map_err(|_| ArgsError::BadValue {
                flag: f.shown.clone(),
                value: v,
            })?)
        }
        None => None,
    };
    Ok(Command::Stop {
        timeout,
        ignore: has(&flags, "ignore")?,
        names: names_after("stop", rest, first)?,
    })
}

fn parse_logs(rest: &[String]) -> Result<Command, ArgsError> {
    let kind = |n: &str| match n {
        "follow" | "timestamps" | "names" => Some(Kind::Bool),
        "tail" | "since" | "until" => Some(Kind::Value),
        _ => None,
    };
    let short = |c: char| match c {
        'f' => Some("follow"),
        't' => Some("timestamps"),
        'n' => Some("names"),
        _ => None,
    };
    let (flags, first) = split_flags(rest, &kind, &short)?;
    let name = rest
        .get(first)
        .cloned()
        .ok_or_else(|| ArgsError::MissingArgument("logs".into()))?;
    Ok(Command::Logs {
        follow: has(&flags, "follow")?,
        tail: last_value(&flags, "tail")?,
        timestamps: has(&flags, "timestamps")?,
        name,
    })
}

/// How the shim and its policy treat a `run` flag (docs/shim.md's flag
/// table lists the same, and a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Passed on with the meaning podman and Docker share.
    Allowed,
    /// Translated to keep podman's meaning on Docker.
    Mapped,
    /// Allowed only in the forms the named policy rule permits.
    Checked(&'static str),
    /// Refused by the default policy (the named rule).
    Refused(&'static str),
    /// Always refused: podman-only, no Docker equivalent.
    Unsupported,
}

impl Rule {
    /// Returns the rule as docs/shim.md's flag table spells it.
    pub fn describe(self) -> String {
        match self {
            Rule::Allowed => "allowed".into(),
            Rule::Mapped => "mapped".into(),
            Rule::Checked(r) => format!("checked ({r})"),
            Rule::Refused(r) => format!("refused ({r})"),
            Rule::Unsupported => "refused (unsupported)".into(),
        }
    }
}

/// Stores one occurrence of a flag in [`RunOpts`], or refuses it.
type Setter = fn(&mut RunOpts, &Flag) -> Result<(), ArgsError>;

/// One `podman run` flag: its names, whether it takes a value, its rule,
/// and what it sets.
#[derive(Debug, Clone, Copy)]
pub struct FlagDef {
    pub long: &'static str,
    /// Other long spellings (`--net` for `--network`).
    pub alias: Option<&'static str>,
    pub short: Option<char>,
    pub kind: Kind,
    pub rule: Rule,
    /// Called for each occurrence, in order: a repeated flag sees them all.
    set: Setter,
}

const fn flag(
    long: &'static str,
    short: Option<char>,
    kind: Kind,
    rule: Rule,
    set: Setter,
) -> FlagDef {
    FlagDef {
        long,
        alias: None,
        short,
        kind,
        rule,
        set,
    }
}

/// A setter storing a boolean flag in `o.$field`.
macro_rules! set_bool {
    ($field:ident) => {
        |o, f| {
            o.$field = bool_value(f)?;
            Ok(())
        }
    };
}

/// A setter storing a flag's value in `o.$field` (the last one wins),
/// read with `$get` ([`value`] unless given).
macro_rules! set_value {
    ($field:ident) => {
        set_value!($field, value)
    };
    ($field:ident, $get:ident) => {
        |o, f| {
            o.$field = Some($get(f)?);
            Ok(())
        }
    };
}

/// A setter appending a flag's value to the list `o.$field`, read with
/// `$get` ([`value`] unless given).
macro_rules! push_value {
    ($field:ident) => {
        push_value!($field, value)
    };
    ($field:ident, $get:ident) => {
        |o, f| {
            o.$field.push($get(f)?);
            Ok(())
        }
    };
}

/// Every `podman run` flag the shim knows: the one definition the parser,
/// the policy and the documentation read. Podman's global flags (see
/// [`IGNORED_GLOBALS`]) are accepted besides, and ignored.
pub const RUN_FLAGS: &[FlagDef] = {
    use Kind::{Bool as B, Value as V};
    use Rule::*;
    &[
        flag("rm", None, B, Mapped, set_bool!(rm)),
        flag("detach", Some('d'), B, Allowed, set_bool!(detach)),
        flag("interactive", Some('i'), B, Allowed, set_bool!(interactive)),
        flag("tty", Some('t'), B, Allowed, set_bool!(tty)),
        flag("name", None, V, Allowed, set_value!(name)),
        flag(
            "replace",
            None,
            B,
            Checked("owned-containers-only"),
            set_bool!(replace),
        ),
        flag(
            "env",
            Some('e'),
            V,
            Checked("no-job-policy"),
            push_value!(env, unquoted),
        ),
        flag(
            "env-file",
            None,
            V,
            Checked("no-job-policy"),
            push_value!(env_files),
        ),
        flag("env-host", None, B, Mapped, set_bool!(env_host)),
        flag("http-proxy", None, B, Mapped, set_bool!(http_proxy)),
        flag("tz", None, V, Mapped, set_tz),
        flag("volume", Some('v'), V, Checked("binds"), set_volume),
        flag("mount", None, V, Checked("binds"), set_mount),
        flag("tmpfs", None, V, Checked("tmpfs"), push_value!(tmpfs)),
        FlagDef {
            alias: Some("net"),
            ..flag(
                "network",
                None,
                V,
                Checked("namespaces"),
                set_value!(network),
            )
        },
        flag("pid", None, V, Checked("namespaces"), set_value!(pid)),
        flag("ipc", None, V, Checked("namespaces"), set_value!(ipc)),
        flag("uts", None, V, Checked("namespaces"), set_value!(uts)),
        flag(
            "cgroupns",
            None,
            V,
            Checked("namespaces"),
            set_value!(cgroupns),
        ),
        flag("userns", None, V, Checked("userns"), set_value!(userns)),
        flag("user", Some('u'), V, Checked("users"), set_value!(user)),
        flag(
            "group-add",
            None,
            V,
            Checked("groups"),
            push_value!(group_add),
        ),
        flag(
            "privileged",
            None,
            B,
            Refused("no-privileged"),
            set_bool!(privileged),
        ),
        flag("cap-add", None, V, Checked("capabilities"), set_cap_add),
        flag("cap-drop", None, V, Allowed, set_cap_drop),
        flag(
            "security-opt",
            None,
            V,
            Checked("security-opt"),
            push_value!(security_opt),
        ),
        flag("device", None, V, Checked("devices"), push_value!(devices)),
        flag("gpus", None, V, Checked("gpus"), set_value!(gpus)),
        flag("runtime", None, V, Mapped, set_value!(runtime)),
        flag(
            "cgroup-parent",
            None,
            V,
            Refused("no-cgroup-parent"),
            set_value!(cgroup_parent),
        ),
        flag(
            "label",
            Some('l'),
            V,
            Checked("no-shim-labels"),
            push_value!(labels, unquoted),
        ),
        flag(
            "entrypoint",
            None,
            V,
            Allowed,
            set_value!(entrypoint, unquoted),
        ),
        flag("workdir", Some('w'), V, Allowed, set_value!(workdir)),
        flag("hostname", Some('h'), V, Mapped, set_value!(hostname)),
        flag("publish", Some('p'), V, Mapped, push_value!(publish)),
        flag("publish-all", Some('P'), B, Mapped, set_publish_all),
        flag("add-host", None, V, Mapped, push_value!(add_host)),
        flag("dns", None, V, Mapped, push_value!(dns)),
        flag(
            "shm-size",
            None,
            V,
            Checked("resources"),
            set_value!(shm_size),
        ),
        flag(
            "memory",
            Some('m'),
            V,
            Checked("resources"),
            set_value!(memory),
        ),
        flag("cpus", None, V, Checked("resources"), set_value!(cpus)),
        flag(
            "cpuset-cpus",
            None,
            V,
            Checked("resources"),
            set_value!(cpuset_cpus),
        ),
        flag(
            "pids-limit",
            None,
            V,
            Checked("resources"),
            set_value!(pids_limit),
        ),
        flag("ulimit", None, V, Checked("ulimits"), push_value!(ulimits)),
        flag("init", None, B, Allowed, set_bool!(init)),
        flag("read-only", None, B, Allowed, set_bool!(read_only)),
        flag("restart", None, V, Checked("restart"), set_value!(restart)),
        flag("stop-signal", None, V, Allowed, set_value!(stop_signal)),
        flag("stop-timeout", None, V, Allowed, set_value!(stop_timeout)),
        flag(
            "log-driver",
            None,
            V,
            Checked("log-driver"),
            set_value!(log_driver),
        ),
        flag(
            "log-opt",
            None,
            V,
            Checked("log-driver"),
            push_value!(log_opts),
        ),
        flag("pull", None, V, Mapped, set_pull),
        flag("quiet", Some('q'), B, Allowed, set_bool!(quiet)),
        flag("sig-proxy", None, B, Mapped, set_bool!(sig_proxy)),
        flag("platform", None, V, Allowed, set_value!(platform)),
        flag("cidfile", None, V, Allowed, set_value!(cidfile)),
        flag("detach-keys", None, V, Allowed, set_value!(detach_keys)),
        flag("systemd", None, V, Unsupported, refuse_unsupported),
        flag("no-hosts", None, B, Unsupported, refuse_unsupported),
        flag("rmi", None, B, Unsupported, refuse_unsupported),
        flag("pod", None, V, Unsupported, refuse_unsupported),
        flag("sdnotify", None, V, Unsupported, refuse_unsupported),
        flag("help", None, B, Unsupported, refuse_help),
    ]
};

/// Returns the flag's value with one pair of shell quotes removed
/// (see [`unquote`]).
fn unquoted(f: &Flag) -> Result<String, ArgsError> {
    Ok(unquote(&value(f)?))
}

/// Sets `--tz`: podman's shorthand for the container's `TZ`.
fn set_tz(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    o.env.push(format!("TZ={}", value(f)?));
    Ok(())
}

/// Sets `-v` (see [`parse_volume`]).
fn set_volume(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    o.volumes.push(parse_volume(&unquoted(f)?)?);
    Ok(())
}

/// Sets `--mount` as the `-v` or `--tmpfs` it amounts to.
fn set_mount(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    match parse_mount(&unquoted(f)?)? {
        Mount::Volume(v) => o.volumes.push(v),
        Mount::Tmpfs(t) => o.tmpfs.push(t),
    }
    Ok(())
}

/// Sets `--cap-add`, which takes a comma-separated list.
fn set_cap_add(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    o.cap_add.extend(value(f)?.split(',').map(str::to_string));
    Ok(())
}

/// Sets `--cap-drop`, which takes a comma-separated list.
fn set_cap_drop(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    o.cap_drop.extend(value(f)?.split(',').map(str::to_string));
    Ok(())
}

/// Sets `-P` as the publish entry `all`.
fn set_publish_all(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    if bool_value(f)? {
        o.publish.push("all".into());
    }
    Ok(())
}

/// Sets `--pull`; podman's `newer` pulls always, as Docker has no such policy.
fn set_pull(o: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    let v = value(f)?;
    o.pull = match v.as_str() {
        "missing" => PullPolicy::Missing,
        "always" | "newer" => PullPolicy::Always,
        "never" => PullPolicy::Never,
        _ => {
            return Err(ArgsError::BadValue {
                flag: f.shown.clone(),
                value: v,
            })
        }
    };
    Ok(())
}

/// Refuses a podman-only flag, whatever its value.
fn refuse_unsupported(_: &mut RunOpts, f: &Flag) -> Result<(), ArgsError> {
    Err(ArgsError::Unsupported {
        flag: f.shown.clone(),
        value: f.value.clone().unwrap_or_default(),
    })
}

/// Refuses `--help` after `run`, as an unknown flag.
fn refuse_help(_: &mut RunOpts, _: &Flag) -> Result<(), ArgsError> {
    Err(ArgsError::UnknownFlag("--help".into()))
}

/// Returns the definition of the `run` flag `name` (long name or alias).
pub fn run_flag(name: &str) -> Option<&'static FlagDef> {
    RUN_FLAGS
        .iter()
        .find(|f| f.long == name || f.alias == Some(name))
}

/// Long names of the `run` flags and whether they take a value.
fn run_kind(n: &str) -> Option<Kind> {
    if let Some(f) = run_flag(n) {
        return Some(f.kind);
    }
    if IGNORED_GLOBALS.contains(&n) {
        Some(Kind::Value)
    } else if IGNORED_GLOBAL_BOOLS.contains(&n) {
        Some(Kind::Bool)
    } else {
        None
    }
}

fn run_short(c: char) -> Option<&'static str> {
    RUN_FLAGS
        .iter()
        .find(|f| f.short == Some(c))
        .map(|f| f.long)
}

/// Parses `-v SRC:DST[:OPTS]`.
pub fn parse_volume(spec: &str) -> Result<Volume, ArgsError> {
    let bad = || ArgsError::BadValue {
        flag: "--volume".into(),
        value: spec.into(),
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let (source, target, opts) = match parts.as_slice() {
        [t] => (String::new(), t.to_string(), ""),
        [s, t] => (s.to_string(), t.to_string(), ""),
        [s, t, o] => (s.to_string(), t.to_string(), *o),
        _ => return Err(bad()),
    };
    if !target.starts_with('/') {
        return Err(bad());
    }
    let mut options = Vec::new();
    for o in opts.split(',').filter(|o| !o.is_empty()) {
        match o {
            "z" | "Z" => {}
            "ro" | "rw" | "nocopy" | "shared" | "rshared" | "slave" | "rslave" | "private"
            | "rprivate" | "consistent" | "cached" | "delegated" => options.push(o.to_string()),
            "U" | "O" | "idmap" | "noexec" | "exec" | "nosuid" | "suid" | "nodev" | "dev"
            | "copy" | "nocopy-up" => {
                return Err(ArgsError::Unsupported {
                    flag: "--volume".into(),
                    value: o.into(),
                })
            }
            _ => return Err(bad()),
        }
    }
    // Both would leave the mode to whoever reads the list last.
    if options.iter().any(|o| o == "ro") && options.iter().any(|o| o == "rw") {
        return Err(bad());
    }
    Ok(Volume {
        source,
        target,
        options,
    })
}

/// Bind propagation modes (the policy refuses the ones that propagate
/// mounts out of the container).
pub const PROPAGATIONS: &[&str] = &[
    "private", "rprivate", "shared", "rshared", "slave", "rslave",
];

/// Parses a boolean as Go's `strconv.ParseBool` does (Docker's CLI reads
/// `--mount` booleans with it).
pub fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// What one `--mount` adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A bind or a named (or anonymous) volume, as `-v` would give it.
    Volume(Volume),
    /// A tmpfs, as `--tmpfs DST[:OPTS]` would give it.
    Tmpfs(String),
}

/// Parses `--mount type=bind|volume|tmpfs,source=…,target=…,…` into what
/// `-v` or `--tmpfs` would give, so that both go through the same
/// translation and policy.
pub fn parse_mount(spec: &str) -> Result<Mount, ArgsError> {
    let bad = || ArgsError::BadValue {
        flag: "--mount".into(),
        value: spec.into(),
    };
    let unsupported = |k: &str| ArgsError::Unsupported {
        flag: "--mount".into(),
        value: k.into(),
    };
    let mut kind = None;
    let (mut source, mut target) = (String::new(), None);
    let mut options = Vec::new();
    let mut tmpfs = Vec::new();
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (kv, None),
        };
        match (k, v) {
            ("type", Some(t)) => kind = Some(t.to_string()),
            ("source" | "src", Some(v)) => source = v.to_string(),
            ("target" | "dst" | "destination", Some(v)) => target = Some(v.to_string()),
            // Docker's CLI reads these with Go's `strconv.ParseBool`.
            ("readonly" | "ro", v) => match v.map_or(Some(true), go_bool) {
                Some(true) => options.push("ro".to_string()),
                Some(false) => options.push("rw".to_string()),
                None => return Err(bad()),
            },
            ("bind-propagation", Some(p)) if PROPAGATIONS.contains(&p) => {
                options.push(p.to_string())
            }
            ("volume-nocopy", v) => match v.map_or(Some(true), go_bool) {
                Some(true) => options.push("nocopy".to_string()),
                Some(false) => {}
                None => return Err(bad()),
            },
            ("relabel", Some(_)) | ("z" | "Z", None) | ("consistency", Some(_)) => {}
            ("tmpfs-size", Some(v)) => tmpfs.push(format!("size={v}")),
            ("tmpfs-mode", Some(v)) => tmpfs.push(format!("mode={v}")),
            ("volume-driver" | "volume-opt" | "volume-label" | "volume-subpath", _) => {
                return Err(ArgsError::NotSupported {
                    flag: "--mount".into(),
                    option: k.into(),
                    why: "a volume's driver and options are set when it is created (they can mount any host path); name an existing volume with source=",
                })
            }
            ("bind-recursive" | "bind-nonrecursive" | "bind-create-mountpoint", _) => {
                return Err(ArgsError::NotSupported {
                    flag: "--mount".into(),
                    option: k.into(),
                    why: "binds are recursive and their source must exist",
                })
            }
            (
                "U" | "idmap" | "chown" | "copy" | "nocopy" | "tmpcopyup" | "notmpcopyup"
                | "tmpfs-options",
                _,
            ) => return Err(unsupported(k)),
            (
                "type" | "source" | "src" | "target" | "dst" | "destination" | "bind-propagation"
                | "relabel" | "consistency" | "tmpfs-size" | "tmpfs-mode",
                _,
            ) => return Err(bad()),
            _ => {
                return Err(ArgsError::UnknownOption {
                    flag: "--mount".into(),
                    option: k.into(),
                })
            }
        }
    }
    // A `:` would be read by Docker as the start of options
    // (`target=/x:rshared`).
    let target = target
        .filter(|t| t.starts_with('/') && !t.contains(':'))
        .ok_or_else(bad)?;
    if source.contains(':') {
        return Err(bad());
    }
    if options.iter().any(|o| o == "ro") && options.iter().any(|o| o == "rw") {
        return Err(bad());
    }
    options.retain(|o| o != "rw");
    match kind.as_deref() {
        Some("bind") if !source.is_empty() => {
            if !source.starts_with('/') && !source.starts_with('.') {
                source = format!("./{source}");
            }
        }
        Some("volume") if !source.contains('/') && !source.starts_with('.') => {}
        Some("tmpfs") if source.is_empty() && options.is_empty() => {
            return Ok(Mount::Tmpfs(if tmpfs.is_empty() {
                target
            } else {
                format!("{target}:{}", tmpfs.join(","))
            }));
        }
        Some(t @ ("bind" | "volume" | "tmpfs")) => {
            return Err(ArgsError::BadValue {
                flag: format!("--mount type={t}"),
                value: spec.into(),
            })
        }
        Some(other) => return Err(unsupported(&format!("type={other}"))),
        None => return Err(bad()),
    }
    if !tmpfs.is_empty() {
        return Err(bad());
    }
    Ok(Mount::Volume(Volume {
        source,
        target,
        options,
    }))
}

/// Parses the arguments after `podman run`.
pub fn parse_run(args: &[String]) -> Result<RunOpts, ArgsError> {
    let (flags, first) = split_flags(args, &run_kind, &run_short)?;
    let mut o = RunOpts {
        http_proxy: true,
        sig_proxy: true,
        ..Default::default()
    };
    for f in &flags {
        match run_flag(&f.name) {
            Some(def) => (def.set)(&mut o, f)?,
            // Podman global flags (e.g. Ray's --cgroup-manager=cgroupfs):
            // they configure podman itself and mean nothing on Docker.
            None => o.ignored.extend(ignored_global(&f.name)),
        }
    }
    let mut seen = std::collections::HashSet::new();
    for f in flags.iter().rev() {
        if let Some(def) = run_flag(&f.name) {
            if seen.insert(def.long) && (def.kind == Kind::Value || bool_value(f)?) {
                o.given.push(def.long);
            }
        }
    }
    let positional = &args[first..];
    let image = positional
        .first()
        .ok_or_else(|| ArgsError::MissingArgument("run".into()))?;
    let image = unquote(image);
    let (source, name) = split_transport(&image)?;
    if source == Source::Daemon {
        // The daemon's own image: podman never pulls for this transport.
        o.pull = PullPolicy::Never;
    }
    o.source = source;
    o.image = name.to_string();
    o.command = positional[1..].to_vec();
    Ok(o)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// Ray 2.53's worker command (ray.md §1, Call B) as the shim receives it
    /// after `bash -c "exec podman run …"`.
    pub(crate) fn ray_worker_argv() -> Vec<String> {
        s(&[
            "run",
            "-v",
            "/tmp/ray:/tmp/ray",
            "--cgroup-manager=cgroupfs",
            "--network=host",
            "--pid=host",
            "--ipc=host",
            "--userns=keep-id",
            "--env",
            "RAY_CLIENT_MODE=0",
            "--env",
            "RAY_LD_PRELOAD_ON_WORKERS=0",
            "--env",
            "RAY_NODE_ID=0876abc",
            "--env",
            "RAY_RAYLET_PID=18293",
            "--env",
            "RAY_USAGE_STATS_ENABLED=0",
            "--env",
            "RAY_enable_pipe_based_agent_to_parent_health_check=1",
            "--env",
            "FOO=a b $HOME",
            "--env",
            "RAY_JOB_ID=01000000",
            "--entrypoint",
            "python",
            "fake.registry/ray:2.53.0",
            "/venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py",
            "--node-ip-address=127.0.0.2",
            "--startup-token=1",
            "--runtime-env-hash=-277573333",
        ])
    }

    #[test]
    fn ray_worker_command_parses_with_podman_meaning() {
        let Command::Run(o) = parse(&ray_worker_argv()).unwrap() else {
            panic!()
        };
        assert_eq!(o.image, "fake.registry/ray:2.53.0");
        assert_eq!(o.entrypoint.as_deref(), Some("python"));
        assert_eq!(o.network.as_deref(), Some("host"));
        assert_eq!(o.pid.as_deref(), Some("host"));
        assert_eq!(o.ipc.as_deref(), Some("host"));
        assert_eq!(o.userns.as_deref(), Some("keep-id"));
        assert_eq!(o.ignored, vec!["cgroup-manager"]);
        assert_eq!(
            o.volumes,
            vec![Volume {
                source: "/tmp/ray".into(),
                target: "/tmp/ray".into(),
                options: vec![]
            }]
        );
        assert!(o.env.contains(&"FOO=a b $HOME".to_string()));
        assert_eq!(o.env.last().unwrap(), "RAY_JOB_ID=01000000");
        assert_eq!(
            o.command[0],
            "/venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py"
        );
        assert_eq!(o.command[3], "--runtime-env-hash=-277573333");
        assert!(!o.rm && !o.detach);
    }

    #[test]
    fn ray_worker_command_without_shell_keeps_values_equal() {
        // Ray PR #65366 would exec podman without bash: quotes stay on.
        let mut argv = ray_worker_argv();
        for a in argv.iter_mut() {
            if a == "FOO=a b $HOME" {
                *a = "FOO='a b $HOME'".into();
            }
            if a == "RAY_JOB_ID=01000000" {
                *a = "RAY_JOB_ID=$RAY_JOB_ID".into();
            }
        }
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        assert!(o.env.contains(&"FOO=a b $HOME".to_string()));
        // Expansion of $RAY_JOB_ID happens at translation (it needs the env).
        assert_eq!(o.env.last().unwrap(), "RAY_JOB_ID=$RAY_JOB_ID");
        assert_eq!(unexpanded_ray_var("$RAY_JOB_ID"), Some("RAY_JOB_ID"));
        assert_eq!(unexpanded_ray_var("${RAY_JOB_ID}"), Some("RAY_JOB_ID"));
        assert_eq!(unexpanded_ray_var("$HOME"), None);
    }

    #[test]
    fn ray_probe_command_parses() {
        let script = "\nimport ray._private.workers.default_worker as dw\nwith open('/shared/worker_path.txt', 'w') as f:\n    f.write(dw.__file__)\n";
        let argv = s(&[
            "run",
            "--rm",
            "-v",
            "/tmp/tmpe9l02fnh:/shared:Z",
            "img:1",
            "python",
            "-c",
            script,
        ]);
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        assert!(o.rm);
        assert_eq!(
            o.volumes[0],
            Volume {
                source: "/tmp/tmpe9l02fnh".into(),
                target: "/shared".into(),
                options: vec![]
            }
        );
        assert_eq!(o.command, s(&["python", "-c", script]));
    }

    #[test]
    fn short_flags_cluster_and_take_values() {
        let Command::Run(o) = parse(&s(&[
            "run",
            "-it",
            "-eA=1",
            "-e",
            "B",
            "-vX:/y:ro,z",
            "img",
            "-d",
        ]))
        .unwrap() else {
            panic!()
        };
        assert!(o.interactive && o.tty && !o.detach);
        assert_eq!(o.env, s(&["A=1", "B"]));
        assert_eq!(o.volumes[0].options, s(&["ro"]));
        assert_eq!(o.command, s(&["-d"]));
    }

    #[test]
    fn repeated_string_flag_keeps_last() {
        let Command::Run(o) =
            parse(&s(&["run", "--network=host", "--network", "bridge", "img"])).unwrap()
        else {
            panic!()
        };
        assert_eq!(o.network.as_deref(), Some("bridge"));
    }

    #[test]
    fn unknown_flag_is_named() {
        assert_eq!(
            parse(&s(&["run", "--frobnicate", "img"])),
            Err(ArgsError::UnknownFlag("--frobnicate".into()))
        );
        assert_eq!(
            parse(&s(&["run", "-X", "img"])),
            Err(ArgsError::UnknownFlag("-X".into()))
        );
        assert_eq!(
            parse(&s(&["run", "--name"])),
            Err(ArgsError::MissingValue("--name".into()))
        );
        assert_eq!(
            parse(&s(&["run"])),
            Err(ArgsError::MissingArgument("run".into()))
        );
        assert!(matches!(
            parse(&s(&["run", "--systemd=always", "i"])),
            Err(ArgsError::Unsupported { .. })
        ));
        assert!(matches!(
            parse(&s(&["run", "-v", "/a:/b:U", "i"])),
            Err(ArgsError::Unsupported { .. })
        ));
        assert!(matches!(
            parse(&s(&["frob"])),
            Err(ArgsError::UnknownCommand(_))
        ));
    }

    /// Each `--mount` option the shim does not take is refused naming it,
    /// and says why: unknown, podman-only, or Docker's but not the shim's
    /// (volume driver options can mount any host path).
    #[test]
    fn mount_options_the_shim_does_not_take_are_named() {
        let m = |spec: &str| parse_mount(spec);
        assert_eq!(
            m("type=bind,src=/a,dst=/b,sorce=/c"),
            Err(ArgsError::UnknownOption {
                flag: "--mount".into(),
                option: "sorce".into()
            })
        );
        assert!(matches!(
            m("type=volume,src=v,dst=/x,volume-opt=device=/etc"),
            Err(ArgsError::NotSupported { option, .. }) if option == "volume-opt"
        ));
        assert!(matches!(
            m("type=volume,src=v,dst=/x,volume-driver=local"),
            Err(ArgsError::NotSupported { option, .. }) if option == "volume-driver"
        ));
        assert!(matches!(
            m("type=bind,src=/a,dst=/b,U"),
            Err(ArgsError::Unsupported { value, .. }) if value == "U"
        ));
        assert!(matches!(
            m("type=bind,src=/a,dst=/b,readonly=maybe"),
            Err(ArgsError::BadValue { .. })
        ));
        let e = m("type=volume,src=v,dst=/x,volume-opt=o=bind").unwrap_err();
        assert!(e.to_string().contains("volume-opt"), "{e}");
        assert_eq!(
            m("type=bind,source=/a,target=/b,readonly,bind-propagation=rprivate"),
            Ok(Mount::Volume(Volume {
                source: "/a".into(),
                target: "/b".into(),
                options: vec!["ro".into(), "rprivate".into()],
            }))
        );
    }

    #[test]
    fn global_flags_before_subcommand_are_ignored() {
        let c = parse(&s(&[
            "--cgroup-manager",
            "cgroupfs",
            "--log-level=debug",
            "images",
            "--format",
            "json",
        ]))
        .unwrap();
        assert_eq!(
            c,
            Command::Images(ShowOpts {
                format: Some("json".into()),
                ..Default::default()
            })
        );
        assert_eq!(parse(&s(&["--version"])).unwrap(), Command::ShortVersion);
    }

    #[test]
    fn subcommands_parse() {
        assert_eq!(
            parse(&s(&["image", "exists", "x"])).unwrap(),
            Command::ImageExists("x".into())
        );
        assert_eq!(
            parse(&s(&["container", "exists", "c"])).unwrap(),
            Command::ContainerExists("c".into())
        );
        assert_eq!(
            parse(&s(&["rm", "-fv", "a", "b"])).unwrap(),
            Command::Rm {
                force: true,
                ignore: false,
                volumes: true,
                names: s(&["a", "b"])
            }
        );
        assert_eq!(
            parse(&s(&["kill", "-s", "TERM", "a"])).unwrap(),
            Command::Kill {
                signal: "TERM".into(),
                ignore: false,
                names: s(&["a"])
            }
        );
        assert_eq!(
            parse(&s(&["stop", "-t", "3", "a"])).unwrap(),
            Command::Stop {
                timeout: Some(3),
                ignore: false,
                names: s(&["a"])
            }
        );
        assert_eq!(
            parse(&s(&["image", "inspect", "--format", "{{.Id}}", "x"])).unwrap(),
            Command::ImageInspect {
                format: Some("{{.Id}}".into()),
                names: s(&["x"])
            }
        );
        assert_eq!(
            parse(&s(&["pull", "-q", "x"])).unwrap(),
            Command::Pull {
                quiet: true,
                image: "x".into(),
                source: Source::Default,
            }
        );
    }

    #[test]
    fn transports_name_the_daemon_a_registry_or_a_store_this_node_lacks() {
        let pull = |r: &str| parse(&s(&["pull", r]));
        assert_eq!(
            pull("docker-daemon:argus/engine:1").unwrap(),
            Command::Pull {
                quiet: false,
                image: "argus/engine:1".into(),
                source: Source::Daemon,
            }
        );
        assert_eq!(
            pull("docker://registry.example/x/y@sha256:00").unwrap(),
            Command::Pull {
                quiet: false,
                image: "registry.example/x/y@sha256:00".into(),
                source: Source::Registry,
            }
        );
        // A registry host with a port is no transport.
        assert_eq!(
            pull("localhost:5000/x").unwrap(),
            Command::Pull {
                quiet: false,
                image: "localhost:5000/x".into(),
                source: Source::Default,
            }
        );
        for bad in [
            "containers-storage:x",
            "containers-storage:[overlay@/var/lib]x",
            "oci:/tmp/layout",
            "oci-archive:/tmp/a.tar",
            "docker-archive:/tmp/a.tar",
            "dir:/tmp/x",
            "docker-daemon:",
            "docker://",
            "docker-daemon:docker://x",
        ] {
            let e = pull(bad).unwrap_err();
            assert!(matches!(e, ArgsError::Transport { .. }), "{bad}: {e:?}");
            let line = e.to_string();
            assert!(line.contains(bad) && !line.contains('\n'), "{line}");
        }
        assert!(pull("containers-storage:x")
            .unwrap_err()
            .to_string()
            .contains("docker-daemon:"));
        // run: the daemon's image is never pulled, whatever --pull says.
        let Command::Run(o) =
            parse(&s(&["run", "--pull=always", "docker-daemon:img:1", "true"])).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (o.image.as_str(), o.source, o.pull),
            ("img:1", Source::Daemon, PullPolicy::Never)
        );
        let Command::Run(o) = parse(&s(&["run", "docker://img", "true"])).unwrap() else {
            panic!()
        };
        assert_eq!(
            (o.image.as_str(), o.source, o.pull),
            ("img", Source::Registry, PullPolicy::Missing)
        );
        assert!(matches!(
            parse(&s(&["run", "containers-storage:img", "true"])),
            Err(ArgsError::Transport { .. })
        ));
    }

    #[test]
    fn unserved_commands_say_what_is_served_and_what_to_do_instead() {
        for (cmd, instead) in [
            (&["create", "img"][..], "podman run -d"),
            (&["cp", "a:/x", "/y"], "docker build"),
            (&["commit", "a"], "docker build"),
            (&["container", "commit", "a"], "docker build"),
            (&["image", "build", "."], "docker build"),
            (&["exec", "a", "true"], "podman run"),
            (&["system", "prune"], "docker"),
        ] {
            let e = parse(&s(cmd)).unwrap_err();
            let line = e.to_string();
            assert!(matches!(e, ArgsError::UnknownCommand(_)), "{cmd:?}");
            assert!(
                line.contains(instead) && line.contains("run, pull") && !line.contains('\n'),
                "{cmd:?}: {line}"
            );
        }
    }

    #[test]
    fn only_known_global_flags_are_noted_as_ignored() {
        assert_eq!(
            leading_ignored_globals(&s(&["--cgroup-manager", "cgroupfs", "--syslog", "ps"])),
            vec!["cgroup-manager", "syslog"]
        );
        assert_eq!(ignored_global("cgroup-manager"), Some("cgroup-manager"));
        assert_eq!(ignored_global("volume"), None);
        assert!(RAY_OWN_GLOBALS.iter().all(|g| ignored_global(g).is_some()));
    }

    #[test]
    fn unquote_strips_one_pair_only() {
        assert_eq!(unquote("'a b'"), "a b");
        assert_eq!(unquote("K='a b $HOME'"), "K=a b $HOME");
        assert_eq!(unquote("K=\"v\""), "K=v");
        assert_eq!(unquote("K=it's"), "K=it's");
        assert_eq!(unquote("'"), "'");
        assert_eq!(unquote("K='a'b'"), "K='a'b'");
    }

    /// docs/shim.md's flag table lists exactly [`RUN_FLAGS`], each with its
    /// rule and its short form.
    #[test]
    fn docs_flag_table_matches_the_flag_definitions() {
        let path = format!("{}/../docs/shim.md", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let section = text
            .split("## Flags of `podman run`")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/shim.md has a section 'Flags of `podman run`'");
        let mut documented = std::collections::BTreeMap::new();
        for line in section.lines().filter(|l| l.starts_with("| `-")) {
            let cells: Vec<&str> = line.split(" | ").collect();
            let names: Vec<&str> = cells[0]
                .trim_start_matches("| ")
                .split(", ")
                .map(|n| n.trim_matches('`'))
                .collect();
            documented.insert(
                names[0].to_string(),
                (names[1..].join(","), cells[1].to_string()),
            );
        }
        let defined: std::collections::BTreeMap<String, (String, String)> = RUN_FLAGS
            .iter()
            .map(|f| {
                let mut other: Vec<String> = f.alias.iter().map(|a| format!("--{a}")).collect();
                other.extend(f.short.map(|c| format!("-{c}")));
                (
                    format!("--{}", f.long),
                    (other.join(","), f.rule.describe()),
                )
            })
            .collect();
        assert_eq!(
            documented, defined,
            "docs/shim.md's flag table and RUN_FLAGS differ"
        );
    }

    /// Each [`RUN_FLAGS`] row's setter works: given a sample value, the flag
    /// changes [`RunOpts`] (besides `given`, which the table fills), or, for
    /// a podman-only flag, it is refused. A row added without a working
    /// setter fails here.
    #[test]
    fn every_run_flag_sets_its_option_or_is_refused() {
        let base = parse_run(&s(&["img"])).unwrap();
        for def in RUN_FLAGS {
            let long = format!("--{}", def.long);
            // Booleans try both values: some default to true.
            let values: &[&str] = match (def.long, def.kind) {
                ("volume", _) => &["/a:/b"],
                ("mount", _) => &["type=bind,src=/a,dst=/b"],
                ("pull", _) => &["never"],
                (_, Kind::Value) => &["x"],
                (_, Kind::Bool) => &["true", "false"],
            };
            let mut changed = false;
            for v in values {
                let got = parse_run(&s(&[&format!("{long}={v}"), "img"]));
                match (def.rule, def.long) {
                    (Rule::Unsupported, "help") => {
                        assert_eq!(got, Err(ArgsError::UnknownFlag(long.clone())))
                    }
                    (Rule::Unsupported, _) => assert_eq!(
                        got,
                        Err(ArgsError::Unsupported {
                            flag: long.clone(),
                            value: v.to_string()
                        })
                    ),
                    _ => {
                        let o = got.unwrap_or_else(|e| panic!("{long}={v}: {e}"));
                        changed |= RunOpts { given: vec![], ..o } != base;
                    }
                }
            }
            assert!(
                changed || def.rule == Rule::Unsupported,
                "{long} with {values:?} leaves RunOpts as it was: its setter sets nothing"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_argv_never_panics(argv in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::string::string_regex("-{0,2}[a-zA-Z=:,/'$ -]{0,12}").unwrap(),
                proptest::sample::select(vec![
                    "run".to_string(), "-v".into(), "--rm".into(), "-it".into(), "--env".into(),
                    "image".into(), "inspect".into(), "--format".into(), "container".into(), "--".into(),
                    "-e".into(), "--network=host".into(), "--pull".into(), "ps".into(), "rm".into(),
                    "--gpus".into(), "device=0,x".into(), "--userns=keep-id:uid=".into(), "--shm-size".into(),
                    "1.5g".into(), "--entrypoint".into(), "[\"a\"".into(), "--ipc=host".into(), "--device".into(),
                    "/a:/b:c:d".into(), "--tmpfs".into(), "/t:size=1m".into(), "--cpus".into(), "NaN".into(),
                    "--mount".into(), "type=bind,src=x,dst=/y,ro".into(), "type=tmpfs,tmpfs-size=1m".into(),
                ]),
            ],
            0..12,
        )) {
            // Parsing, translation and the policy only ever return errors.
            if let Ok(Command::Run(o)) = parse(&argv) {
                let ctx = crate::translate::Context { env: vec![("RAY_JOB_ID".into(), "1".into())], ..Default::default() };
                if let Ok(plan) = crate::translate::translate(&o, &ctx) {
                    let _ = crate::policy::Policy::default().check_run(&o, &plan);
                }
            }
        }
    }
}
