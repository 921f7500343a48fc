//! GPU preflight (SPEC §7): checks that a node's GPUs are usable before Ray
//! starts, and classifies each failure so that a platform can act on the
//! exit code and the JSON verdict without reading logs.
//!
//! The checks run in this order, each bounded and each recording evidence:
//! device nodes, the `nvidia-smi` CSV query, `dlopen` + init of
//! `libnvidia-ml.so.1` and `libcuda.so.1`, agreement of the GPU counts, and
//! the unversioned `libcuda.so` that Triton links with (fixed automatically).
//!
//! Why the libraries are loaded in a child process: `cuInit` can hang on a
//! wedged GPU and cannot be interrupted, and a process that has initialised
//! CUDA keeps `/dev/nvidiactl` open, which would stop an operator resetting
//! the GPU while the agent (PID 1) lives. So the node path re-executes the
//! agent binary (`argus-agent preflight` with [`PROBE_ENV`] set) under a
//! timeout; see [`libs`].

pub mod devices;
pub mod libs;
pub mod smi;
pub mod triton;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use argus_config::{Config, PreflightConfig, PreflightMode};
use argus_supervise::{Stop, Stopped};

pub use libs::PROBE_ENV;

/// How a failure should be handled by whoever runs the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// Image, environment or launch error: fix the job; the host is fine.
    Configuration,
    /// May pass on retry on the same host (with backoff).
    Transient,
    /// The host or its driver is broken: drain it, do not retry here.
    InfrastructureFatal,
}

impl Class {
    /// Returns the exit code of SPEC §11 for this class.
    pub fn exit_code(self) -> u8 {
        match self {
            Class::InfrastructureFatal => 69,
            Class::Transient => 75,
            Class::Configuration => 78,
        }
    }

    /// Returns the name used in the JSON verdict.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::InfrastructureFatal => "infrastructure-fatal",
            Class::Transient => "transient",
            Class::Configuration => "configuration",
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    /// Passed, with something worth a look (e.g. retired pages pending).
    Warn,
    /// A configuration finding the agent fixed itself.
    Fixed,
    Fail,
    /// Not run, because an earlier result makes it meaningless.
    Skipped,
}

impl Status {
    /// Returns the status as the verdict's JSON and the metrics spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fixed => "fixed",
            Status::Fail => "fail",
            Status::Skipped => "skipped",
        }
    }
}

/// Records the verdict in the agent's metrics: one series per check.
fn record_metrics(v: &Verdict) {
    argus_telemetry::metrics::preflight(
        v.ok,
        v.checks
            .iter()
            .map(|c| argus_telemetry::metrics::CheckOutcome {
                check: &c.name,
                status: c.status.as_str(),
                class: c.class.map_or("", |c| c.as_str()),
            }),
    );
}

/// What a check ran and what came back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The command line, library call or file looked at.
    pub command: String,
    /// The process exit code or the library's return code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The symbolic name of the return code, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Evidence {
    /// Returns evidence naming `command` only.
    pub fn of(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Default::default()
        }
    }

    fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    /// Set if and only if `status` is `fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    /// A stable identifier of what was found, e.g. `driver-not-loaded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    pub message: String,
    pub elapsed_ms: u64,
    pub evidence: Vec<Evidence>,
}

impl Check {
    fn new(name: &str, status: Status, message: impl Into<String>) -> Self {
        Self {
            name: name.to_string(),
            status,
            class: None,
            signature: None,
            message: one_line(&message.into()),
            elapsed_ms: 0,
            evidence: Vec::new(),
        }
    }

    /// Returns a passing check.
    pub fn pass(name: &str, message: impl Into<String>) -> Self {
        Self::new(name, Status::Pass, message)
    }

    /// Returns a skipped check.
    pub fn skipped(name: &str, message: impl Into<String>) -> Self {
        Self::new(name, Status::Skipped, message)
    }

    /// Returns a failed check of `class` with `signature`.
    pub fn fail(name: &str, class: Class, signature: &str, message: impl Into<String>) -> Self {
        let mut c = Self::new(name, Status::Fail, message);
        c.class = Some(class);
        c.signature = Some(signature.to_string());
        c
    }

    /// Returns a check with a non-failing finding (`warn` or `fixed`).
    pub fn finding(
        name: &str,
        status: Status,
        signature: &str,
        message: impl Into<String>,
    ) -> Self {
        let mut c = Self::new(name, status, message);
        c.signature = Some(signature.to_string());
        c
    }

    fn with(mut self, e: Evidence) -> Self {
        self.evidence.push(e);
        self
    }

    fn timed(mut self, started: Instant) -> Self {
        self.elapsed_ms = started.elapsed().as_millis() as u64;
        self
    }
}

/// What `NVIDIA_VISIBLE_DEVICES` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "count")]
pub enum Requested {
    /// Unset, empty, `void` or `none`: no GPU device requested.
    Nothing,
    /// `all`: every GPU of the host, at least one.
    All,
    /// A list of indexes or UUIDs: exactly this many.
    Count(usize),
}

impl Requested {
    /// Parses the value of `NVIDIA_VISIBLE_DEVICES`.
    pub fn parse(v: Option<&str>) -> Self {
        let Some(v) = v.map(str::trim) else {
            return Requested::Nothing;
        };
        match v {
            "" | "void" | "none" => Requested::Nothing,
            "all" => Requested::All,
            list => Requested::Count(list.split(',').filter(|s| !s.trim().is_empty()).count()),
        }
    }
}

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub driver_version: String,
    pub memory_total_mib: Option<u64>,
    pub memory_used_mib: Option<u64>,
    /// Volatile uncorrected ECC errors; `None` where not supported.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Retired pages pending a reset; `None` where not reported.
    pub retired_pages_pending: Option<bool>,
}

/// The preflight report, printed by `argus-agent preflight --json` and
/// written to `<log_dir>/preflight/<node>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Format version of this document.
    pub version: u32,
    pub host: String,
    /// RFC 3339, UTC.
    pub time: String,
    pub mode: String,
    /// False when the mode (skip, or auto without GPUs) did not run checks.
    pub ran: bool,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    pub exit_code: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    pub message: String,
    pub requested: Requested,
    pub gpus: Vec<Gpu>,
    pub checks: Vec<Check>,
    /// Variables added to Ray's environment (e.g. `TRITON_LIBCUDA_PATH`).
    pub env: BTreeMap<String, String>,
    pub elapsed_ms: u64,
}

impl Verdict {
    /// Returns the one-line summary used in the log and in errors.
    pub fn summary(&self) -> String {
        match self.class {
            Some(class) => format!(
                "gpu preflight failed: {class} (exit {}): {}: {}",
                class.exit_code(),
                self.signature.as_deref().unwrap_or("unknown"),
                self.message
            ),
            None if !self.ran => format!("gpu preflight not run: {}", self.message),
            None => format!("gpu preflight passed: {}", self.message),
        }
    }

    /// Returns the human-readable report of `argus-agent preflight`.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{}\nhost {}  mode {}  {} ms\n",
            self.summary(),
            self.host,
            self.mode,
            self.elapsed_ms
        );
        for c in &self.checks {
            let status = match (c.status, c.class) {
                (Status::Fail, Some(class)) => format!("FAIL {class}"),
                (st, _) => format!("{st:?}").to_lowercase(),
            };
            s.push_str(&format!("  {:<20} {:<26} {}\n", c.name, status, c.message));
            if c.status == Status::Fail {
                for e in &c.evidence {
                    s.push_str(&format!("      $ {}", e.command));
                    if let Some(code) = e.exit_code {
                        s.push_str(&format!("  -> {code}"));
                    }
                    if let Some(n) = &e.code_name {
                        s.push_str(&format!(" ({n})"));
                    }
                    s.push('\n');
                    for out in [&e.stdout, &e.stderr, &e.note].into_iter().flatten() {
                        for line in out.lines().take(5) {
                            s.push_str(&format!("        {line}\n"));
                        }
                    }
                }
            }
        }
        for g in &self.gpus {
            s.push_str(&format!(
                "  gpu {} {} {} driver {} memory {}/{} MiB\n",
                g.index,
                g.uuid,
                g.name,
                g.driver_version,
                g.memory_used_mib.map_or("?".into(), |m| m.to_string()),
                g.memory_total_mib.map_or("?".into(), |m| m.to_string()),
            ));
        }
        for (k, v) in &self.env {
            s.push_str(&format!("  export {k}={v}\n"));
        }
        s
    }
}

/// How the library checks are run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibProbe {
    /// Re-execute this binary (`<exe> preflight` with [`PROBE_ENV`] set)
    /// under the timeout. What the agent does.
    Exec(PathBuf),
    /// Load the libraries in this process (unit tests).
    InProcess,
}

/// What the preflight needs to know; see [`PreflightOptions::new`].
#[derive(Debug, Clone)]
pub struct PreflightOptions {
    pub mode: PreflightMode,
    /// Test-only root under which `dev/nvidia*` are looked up (default `/`).
    pub dev_root: PathBuf,
    /// Bound of each check that runs a command or loads a library.
    pub timeout: Duration,
    /// The verdict goes to `<log_dir>/preflight/<node>.json`.
    pub log_dir: PathBuf,
    /// Where the private `libcuda.so` symlink of the Triton fix is made.
    pub fix_dir: PathBuf,
    /// The `nvidia-smi` program: an absolute path found on PATH in a folder
    /// only root can change ([`smi::locate`]), else the bare name (then the
    /// check reports it missing).
    pub nvidia_smi: PathBuf,
    /// `NVIDIA_VISIBLE_DEVICES`.
    pub visible_devices: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` (CUDA may see fewer GPUs than NVML).
    pub cuda_visible_devices: Option<String>,
    /// `TRITON_LIBCUDA_PATH` as already set.
    pub triton_libcuda_path: Option<PathBuf>,
    pub lib_probe: LibProbe,
}

impl PreflightOptions {
    /// Returns the options of the node start path.
    pub fn from_config(cfg: &Config) -> Self {
        Self::new(&cfg.preflight, &cfg.log.dir, &cfg.state_dir)
    }

    /// Returns the options from the preflight's settings, the log folder
    /// (the verdict goes there) and the state folder (the Triton fix goes
    /// there); the GPU variables come from the environment.
    pub fn new(pf: &PreflightConfig, log_dir: &Path, state_dir: &Path) -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            mode: pf.mode,
            dev_root: pf.dev_root.clone(),
            timeout: pf.timeout,
            log_dir: log_dir.to_path_buf(),
            fix_dir: state_dir.join("libcuda"),
            nvidia_smi: smi::locate(std::env::var_os("PATH").as_deref()),
            visible_devices: std::env::var("NVIDIA_VISIBLE_DEVICES").ok(),
            cuda_visible_devices: env("CUDA_VISIBLE_DEVICES"),
            triton_libcuda_path: env("TRITON_LIBCUDA_PATH").map(PathBuf::from),
            lib_probe: match std::env::current_exe() {
                Ok(exe) => LibProbe::Exec(exe),
                Err(_) => LibProbe::InProcess,
            },
        }
    }

    fn requested(&self) -> Requested {
        Requested::parse(self.visible_devices.as_deref())
    }

    /// Returns true if and only if GPUs are expected on this node:
    /// `NVIDIA_VISIBLE_DEVICES` names devices, or a `/dev/nvidiaN` exists.
    pub fn gpus_expected(&self) -> bool {
        self.requested() != Requested::Nothing
            || !devices::gpu_nodes(&self.dev_root.join("dev")).is_empty()
    }
}

/// A passed (or not required) preflight, for the node start path.
#[derive(Debug, Clone)]
pub struct PreflightOutcome {
    pub verdict: Verdict,
    /// Variables to add to Ray's environment.
    pub env: Vec<(String, String)>,
}

/// A failed preflight: the node must exit with [`Self::exit_code`] without
/// starting Ray.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .verdict.summary())]
pub struct PreflightFailure {
    pub verdict: Box<Verdict>,
}

impl PreflightFailure {
    /// Returns 69, 75 or 78 by the class of the failure (SPEC §11).
    pub fn exit_code(&self) -> u8 {
        self.verdict.exit_code
    }

    /// Returns the class of the failure.
    pub fn class(&self) -> Class {
        self.verdict.class.unwrap_or(Class::Transient)
    }
}

/// Why the node start path does not go on after the preflight.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Failed(#[from] PreflightFailure),
    /// A stop was requested; the running check was killed.
    #[error("stopped on request during the GPU preflight")]
    Stopped(#[from] Stopped),
}

/// Runs the preflight on the node start path per `cfg.preflight`, writes the
/// verdict and logs one summary line; `stop` ends it early.
pub fn gate(cfg: &Config, stop: &Stop) -> Result<PreflightOutcome, GateError> {
    gate_with(&PreflightOptions::from_config(cfg), stop)
}

/// [`gate`] with explicit options.
pub fn gate_with(opts: &PreflightOptions, stop: &Stop) -> Result<PreflightOutcome, GateError> {
    let verdict = evaluate(opts, stop)?;
    match write_verdict(&opts.log_dir, &verdict) {
        Ok(path) => tracing::debug!(path = %path.display(), "wrote preflight verdict"),
        Err(e) => {
            warn!(dir = %opts.log_dir.display(), error = %e, "failed to write preflight verdict")
        }
    }
    log_summary(&verdict);
    record_metrics(&verdict);
    if verdict.ok {
        let env = verdict
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(PreflightOutcome { verdict, env })
    } else {
        Err(PreflightFailure {
            verdict: Box::new(verdict),
        }
        .into())
    }
}

/// Logs the one summary line of a verdict.
pub fn log_summary(v: &Verdict) {
    let class = v.class.map_or("", Class::as_str);
    let signature = v.signature.as_deref().unwrap_or("");
    if v.ok {
        info!(ran = v.ran, gpus = v.gpus.len(), elapsed_ms = v.elapsed_ms, summary = %v.summary(), "gpu preflight");
    } else {
        tracing::error!(class, signature, exit_code = v.exit_code, elapsed_ms = v.elapsed_ms, summary = %v.summary(), "gpu preflight");
    }
}

/// Runs the preflight per `opts.mode` and returns the verdict; writes
/// nothing except the Triton fix directory. A stop request kills the
/// running check and returns [`Stopped`].
pub fn evaluate(opts: &PreflightOptions, stop: &Stop) -> Result<Verdict, Stopped> {
    let started = Instant::now();
    let mode = match opts.mode {
        PreflightMode::Auto => "auto",
        PreflightMode::Require => "require",
        PreflightMode::Skip => "skip",
    };
    let requested = opts.requested();
    let mut v = Verdict {
        version: 1,
        host: host_name(),
        time: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        mode: mode.into(),
        ran: false,
        ok: true,
        class: None,
        exit_code: 0,
        signature: None,
        message: String::new(),
        requested,
        gpus: Vec::new(),
        checks: Vec::new(),
        env: BTreeMap::new(),
        elapsed_ms: 0,
    };
    match opts.mode {
        PreflightMode::Skip => {
            v.message = "ARGUS_PREFLIGHT=skip".into();
            return Ok(v);
        }
        PreflightMode::Auto if !opts.gpus_expected() => {
            v.message =
                "no GPUs expected (NVIDIA_VISIBLE_DEVICES names none, no /dev/nvidiaN)".into();
            return Ok(v);
        }
        _ => {}
    }
    v.ran = true;

    let t = Instant::now();
    let dev = devices::check(&opts.dev_root, requested).timed(t);
    let t = Instant::now();
    let smi = smi::run(&opts.nvidia_smi, opts.timeout, stop);
    if stop.is_requested() {
        return Err(Stopped);
    }
    let smi_check = smi.check.clone().timed(t);
    let libs = libs::run(&opts.lib_probe, opts.timeout, stop);
    if stop.is_requested() {
        return Err(Stopped);
    }
    let nvml = libs.nvml.clone();
    let cuda = libs.cuda.clone();

    let counts = Counts {
        requested,
        device_nodes: dev_count(&opts.dev_root),
        nvidia_smi: smi.gpus.as_ref().map(|g| g.len()),
        nvml: libs.nvml_count.map(|n| n as usize),
        cuda: libs.cuda_count.map(|n| n as usize),
        cuda_visible_devices: opts.cuda_visible_devices.clone(),
    };
    let count_check = counts.check();
    let triton = match (&libs.libcuda_path, cuda.status) {
        (Some(path), Status::Pass) => {
            triton::check(path, opts.triton_libcuda_path.as_deref(), &opts.fix_dir)
        }
        _ => Check::skipped(triton::NAME, "libcuda.so.1 did not initialise"),
    };
    if triton.status == Status::Fixed {
        v.env.insert(
            "TRITON_LIBCUDA_PATH".into(),
            opts.fix_dir.display().to_string(),
        );
    }
    v.gpus = smi.gpus.unwrap_or_default();
    v.checks = vec![dev, smi_check, nvml, cuda, count_check, triton];
    conclude(&mut v);
    v.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(v)
}

/// Sets the overall class, exit code, signature and message from the checks:
/// the most severe failed class wins; among equals, the earliest check.
///
/// One exception: when the container has no GPU device at all
/// (`gpu-devices-not-injected`), every later failure is a consequence of
/// how it was launched, so the verdict is that configuration finding and
/// a healthy host is not drained for it.
pub fn conclude(v: &mut Verdict) {
    let root_cause = v
        .checks
        .iter()
        .find(|c| c.signature.as_deref() == Some(devices::NOT_INJECTED))
        .map(|c| (c.class.unwrap_or(Class::Configuration), c));
    let worst = root_cause.or_else(|| {
        v.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .filter_map(|c| c.class.map(|k| (k, c)))
            .fold(None::<(Class, &Check)>, |acc, (k, c)| match acc {
                Some((ak, _)) if ak >= k => acc,
                _ => Some((k, c)),
            })
    });
    match worst {
        Some((class, c)) => {
            v.ok = false;
            v.class = Some(class);
            v.exit_code = class.exit_code();
            v.signature = c.signature.clone();
            v.message = format!("{}: {}", c.name, c.message);
        }
        None => {
            v.ok = true;
            v.class = None;
            v.exit_code = 0;
            v.signature = None;
            let notes: Vec<String> = v
                .checks
                .iter()
                .filter(|c| matches!(c.status, Status::Warn | Status::Fixed))
                .map(|c| format!("{} {}", c.name, c.signature.as_deref().unwrap_or("")))
                .collect();
            v.message = if notes.is_empty() {
                format!("{} GPU(s) usable", v.gpus.len())
            } else {
                format!("{} GPU(s) usable; {}", v.gpus.len(), notes.join(", "))
            };
        }
    }
}

fn dev_count(dev_root: &Path) -> usize {
    devices::gpu_nodes(&dev_root.join("dev")).len()
}

/// The GPU counts each source reports.
#[derive(Debug, Clone)]
pub struct Counts {
    pub requested: Requested,
    pub device_nodes: usize,
    pub nvidia_smi: Option<usize>,
    pub nvml: Option<usize>,
    pub cuda: Option<usize>,
    pub cuda_visible_devices: Option<String>,
}

/// The name of the count agreement check.
pub const COUNT_CHECK: &str = "gpu-count";

impl Counts {
    /// Returns the agreement check: nvidia-smi, NVML and CUDA agree, there is
    /// a device node per GPU, and at least what NVIDIA_VISIBLE_DEVICES asks.
    pub fn check(&self) -> Check {
        let summary = format!(
            "requested {:?}, device nodes {}, nvidia-smi {}, nvml {}, cuda {}{}",
            self.requested,
            self.device_nodes,
            opt(self.nvidia_smi),
            opt(self.nvml),
            opt(self.cuda),
            self.cuda_visible_devices
                .as_deref()
                .map(|c| format!(" (CUDA_VISIBLE_DEVICES={c})"))
                .unwrap_or_default()
        );
        let ev = Evidence::of("compare GPU counts").note(summary.clone());
        let known: Vec<(&str, usize)> = [("nvidia-smi", self.nvidia_smi), ("nvml", self.nvml)]
            .into_iter()
            .chain(
                // CUDA_VISIBLE_DEVICES legitimately hides GPUs from CUDA.
                (self.cuda_visible_devices.is_none()).then_some(("cuda", self.cuda)),
            )
            .filter_map(|(n, c)| c.map(|c| (n, c)))
            .collect();
        let Some(&(_, reference)) = known.iter().max_by_key(|(_, c)| *c) else {
            return Check::skipped(COUNT_CHECK, "no source reported a GPU count").with(ev);
        };
        let low: Vec<String> = known
            .iter()
            .filter(|(_, c)| *c != reference)
            .map(|(n, c)| format!("{n} sees {c}"))
            .collect();
        if !low.is_empty() {
            return Check::fail(
                COUNT_CHECK,
                Class::InfrastructureFatal,
                "gpu-count-mismatch",
                format!("GPU counts disagree: {} of {reference}", low.join(", ")),
            )
            .with(ev);
        }
        if reference == 0 {
            return Check::fail(
                COUNT_CHECK,
                Class::InfrastructureFatal,
                "no-gpus-found",
                "GPUs are expected but the driver reports none",
            )
            .with(ev);
        }
        if self.device_nodes < reference {
            return Check::fail(
                COUNT_CHECK,
                Class::InfrastructureFatal,
                "gpu-count-mismatch",
                format!(
                    "{reference} GPUs reported but {} /dev/nvidiaN nodes",
                    self.device_nodes
                ),
            )
            .with(ev);
        }
        if let Requested::Count(n) = self.requested {
            if reference < n {
                return Check::fail(
                    COUNT_CHECK,
                    Class::InfrastructureFatal,
                    "gpu-count-mismatch",
                    format!(
                        "NVIDIA_VISIBLE_DEVICES asks for {n} GPUs, the driver reports {reference}"
                    ),
                )
                .with(ev);
            }
        }
        Check::pass(COUNT_CHECK, format!("{reference} GPU(s): {summary}")).with(ev)
    }
}

fn opt(n: Option<usize>) -> String {
    n.map_or("-".into(), |n| n.to_string())
}

/// Returns this node's name for the verdict file: the host name with
/// characters outside `[A-Za-z0-9._-]` replaced by `_`.
pub fn host_name() -> String {
    let h = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    let h: String = h
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if h.is_empty() || h == "." || h == ".." {
        "unknown-host".into()
    } else {
        h
    }
}

/// Writes `v` to `<log_dir>/preflight/<host>.json` atomically (tempfile in
/// the same folder, fsync, rename, fsync of the folder); returns the path.
pub fn write_verdict(log_dir: &Path, v: &Verdict) -> io::Result<PathBuf> {
    let path = log_dir.join("preflight").join(format!("{}.json", v.host));
    let mut bytes = serde_json::to_vec_pretty(v)?;
    bytes.push(b'\n');
    argus_discovery::publish(&path, &bytes).map_err(io::Error::other)?;
    Ok(path)
}

/// Returns `s` on one line (newlines and tabs become spaces, trimmed).
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Returns at most the first 1000 characters of `bytes`, trimmed; `None`
/// when empty.
pub fn excerpt(bytes: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut out: String = s.chars().take(1000).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    Some(out)
}

#[cfg(test)]
mod tests;
