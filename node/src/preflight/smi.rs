//! Check 2: `nvidia-smi --query-gpu=… --format=csv,noheader,nounits` under a
//! timeout (it hangs on wedged GPUs), through the single reaper.
//!
//! The CSV form is used because plain `nvidia-smi` output is not a stable
//! interface. Note that `nvidia-smi` prints its own failures (driver not
//! loaded, version mismatch) on stdout, so both streams are kept as evidence.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{excerpt, Check, Class, Evidence, Gpu, Status};
use argus_supervise::{spawn_captured, Exit, Stop};

/// The name of this check.
pub const NAME: &str = "nvidia-smi";

/// The fields queried, in order.
pub const FIELDS: &str = "index,uuid,name,driver_version,memory.total,memory.used,ecc.errors.uncorrected.volatile.total,retired_pages.pending";

/// The fields every driver knows, used when a driver rejects [`FIELDS`]
/// (exit 2, "is not a valid field to query").
pub const BASIC_FIELDS: &str = "index,uuid,name,driver_version,memory.total,memory.used";

/// Returns the absolute path of `nvidia-smi` in the first folder of `path`
/// (a PATH value) that holds it and that no user but root (or this
/// process's own user) can change, nor any folder above it (a sticky folder
/// such as /tmp counts when what is below it is trusted). The agent runs it
/// as root: a folder the Ray user can write (the Ray base image puts some on
/// PATH) would let a job choose what root runs (SPEC R-SEC-2). Without one,
/// the bare name, which [`run`] reports as not found without running it.
pub fn locate(path: Option<&std::ffi::OsStr>) -> std::path::PathBuf {
    let me = nix::unistd::geteuid().as_raw();
    path.map(std::env::split_paths)
        .into_iter()
        .flatten()
        .filter(|d| d.is_absolute())
        .map(|d| d.join(NAME))
        .find(|p| p.is_file() && argus_supervise::privs::only_trusted_can_change(p, me))
        .unwrap_or_else(|| std::path::PathBuf::from(NAME))
}

/// The check and the GPUs it listed, if the query succeeded.
#[derive(Debug, Clone)]
pub struct SmiResult {
    pub check: Check,
    pub gpus: Option<Vec<Gpu>>,
}

/// Runs the query with `program` and classifies the result.
/// A stop request kills the query (the result is then meaningless).
pub fn run(program: &Path, timeout: Duration, stop: &Stop) -> SmiResult {
    // Never a lookup on PATH here: [`locate`] chose the folder.
    let first = if program.is_absolute() {
        query(program, FIELDS, timeout, stop)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "not in a folder on PATH that only root can change",
        ))
    };
    let (fields, out) = match &first {
        Ok(c) if c.exit == Some(Exit::Code(2)) && text(c).contains("not a valid field") => {
            (BASIC_FIELDS, query(program, BASIC_FIELDS, timeout, stop))
        }
        _ => (FIELDS, first),
    };
    let command = command_line(program, fields);
    let cap = match out {
        Ok(c) => c,
        Err(e) => {
            let ev = Evidence {
                command,
                stderr: Some(e.to_string()),
                ..Default::default()
            };
            let check = if e.kind() == std::io::ErrorKind::NotFound {
                Check::fail(
                    NAME,
                    Class::Configuration,
                    "nvidia-smi-not-found",
                    format!("{} is not on PATH in a folder only root can change: the container lacks the driver utilities (NVIDIA_DRIVER_CAPABILITIES without `utility`?)", program.display()),
                )
            } else {
                Check::fail(
                    NAME,
                    Class::Configuration,
                    "nvidia-smi-not-runnable",
                    format!("cannot run {}: {e}", program.display()),
                )
            };
            return SmiResult {
                check: check.with(ev),
                gpus: None,
            };
        }
    };
    let ev = Evidence {
        command,
        exit_code: cap.exit.map(Exit::code),
        code_name: None,
        stdout: None,
        stderr: excerpt(&cap.stderr),
        note: None,
    };
    if cap.timed_out {
        let ev = Evidence {
            stdout: excerpt(&cap.stdout),
            note: Some(format!(
                "no answer within {timeout:?}; process group killed"
            )),
            ..ev
        };
        return SmiResult {
            check: Check::fail(
                NAME,
                Class::Transient,
                "nvidia-smi-timeout",
                format!("nvidia-smi did not answer within {timeout:?} (wedged GPU or driver?); retry, drain if it persists"),
            )
            .with(ev),
            gpus: None,
        };
    }
    let all = text(&cap);
    let code = cap.exit.map_or(-1, Exit::code);
    if code != 0 || all.contains("version mismatch") {
        let (class, signature, meaning) = classify_exit(code, &all);
        let ev = Evidence {
            code_name: Some(meaning.to_string()),
            stdout: excerpt(&cap.stdout),
            ..ev
        };
        let first_line = all
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string();
        return SmiResult {
            check: Check::fail(
                NAME,
                class,
                signature,
                format!("nvidia-smi exited {code} ({meaning}): {first_line}"),
            )
            .with(ev),
            gpus: None,
        };
    }
    let stdout = String::from_utf8_lossy(&cap.stdout);
    let gpus = match parse_csv(&stdout, fields) {
        Ok(g) => g,
        Err(why) => {
            let ev = Evidence {
                stdout: excerpt(&cap.stdout),
                ..ev
            };
            return SmiResult {
                check: Check::fail(
                    NAME,
                    Class::Transient,
                    "nvidia-smi-unparseable",
                    format!("cannot parse nvidia-smi output: {why}"),
                )
                .with(ev),
                gpus: None,
            };
        }
    };
    let check = judge(&gpus).with(Evidence {
        stdout: excerpt(&cap.stdout),
        ..ev
    });
    SmiResult {
        check,
        gpus: Some(gpus),
    }
}

fn query(
    program: &Path,
    fields: &str,
    timeout: Duration,
    stop: &Stop,
) -> std::io::Result<argus_supervise::Captured> {
    let mut cmd = Command::new(program);
    cmd.arg(format!("--query-gpu={fields}"))
        .arg("--format=csv,noheader,nounits");
    spawn_captured(&mut cmd, timeout, stop)
}

fn command_line(program: &Path, fields: &str) -> String {
    format!(
        "{} --query-gpu={fields} --format=csv,noheader,nounits",
        program.display()
    )
}

fn text(c: &argus_supervise::Captured) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&c.stderr)
    )
}

/// Classifies a failing `nvidia-smi` exit code (with its output, for the
/// version mismatch that some drivers report with other codes).
pub fn classify_exit(code: i32, output: &str) -> (Class, &'static str, &'static str) {
    if output.contains("Driver/library version mismatch") || code == 18 {
        return (
            Class::InfrastructureFatal,
            "driver-library-version-mismatch",
            "driver/library version mismatch: reboot or reload the kernel module",
        );
    }
    if output.contains("No devices were found") {
        return (
            Class::InfrastructureFatal,
            "no-gpus-found",
            "no devices were found",
        );
    }
    match code {
        9 => (
            Class::InfrastructureFatal,
            "driver-not-loaded",
            "NVIDIA driver not loaded",
        ),
        12 => (
            Class::InfrastructureFatal,
            "nvml-library-not-found",
            "NVML library not found",
        ),
        14 => (
            Class::InfrastructureFatal,
            "inforom-corrupted",
            "infoROM corrupted",
        ),
        15 => (
            Class::InfrastructureFatal,
            "gpu-lost",
            "GPU has fallen off the bus",
        ),
        4 => (Class::Configuration, "gpu-no-permission", "no permission"),
        8 => (
            Class::InfrastructureFatal,
            "gpu-power-cables",
            "external power cables not attached",
        ),
        126 | 127 => (
            Class::Configuration,
            "nvidia-smi-not-runnable",
            "cannot execute nvidia-smi",
        ),
        _ => (
            Class::Transient,
            "nvidia-smi-failed",
            "query failed (may pass on retry)",
        ),
    }
}

/// Returns the GPU-health verdict of a successful query: uncorrected ECC
/// errors are fatal (the GPU needs a reset); pending retired pages warn.
pub fn judge(gpus: &[Gpu]) -> Check {
    let ecc: Vec<String> = gpus
        .iter()
        .filter(|g| g.ecc_uncorrected_volatile.is_some_and(|n| n > 0))
        .map(|g| {
            format!(
                "gpu {} ({}): {}",
                g.index,
                g.uuid,
                g.ecc_uncorrected_volatile.unwrap_or(0)
            )
        })
        .collect();
    if !ecc.is_empty() {
        return Check::fail(
            NAME,
            Class::InfrastructureFatal,
            "ecc-uncorrectable-errors",
            format!(
                "volatile uncorrected ECC errors: {}; reset the GPU or reboot",
                ecc.join(", ")
            ),
        );
    }
    let pending: Vec<String> = gpus
        .iter()
        .filter(|g| g.retired_pages_pending == Some(true))
        .map(|g| format!("gpu {}", g.index))
        .collect();
    let summary = format!(
        "{} GPU(s): {}",
        gpus.len(),
        gpus.iter()
            .map(|g| format!("{} {}", g.index, g.name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !pending.is_empty() {
        return Check::finding(
            NAME,
            Status::Warn,
            "retired-pages-pending",
            format!(
                "{summary}; retired pages pending a reset on {} (drain at a convenient time)",
                pending.join(", ")
            ),
        );
    }
    Check::pass(NAME, summary)
}

/// Parses `--format=csv,noheader,nounits` output of `fields`.
pub fn parse_csv(out: &str, fields: &str) -> Result<Vec<Gpu>, String> {
    let names: Vec<&str> = fields.split(',').collect();
    let mut gpus = Vec::new();
    for (n, line) in out.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        if cols.len() != names.len() {
            return Err(format!(
                "line {} has {} fields, expected {}: {line:?}",
                n + 1,
                cols.len(),
                names.len()
            ));
        }
        let get = |name: &str| names.iter().position(|f| *f == name).map(|i| cols[i]);
        let index = get("index")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("line {}: bad index in {line:?}", n + 1))?;
        gpus.push(Gpu {
            index,
            uuid: get("uuid").unwrap_or("").to_string(),
            name: get("name").unwrap_or("").to_string(),
            driver_version: get("driver_version").unwrap_or("").to_string(),
            memory_total_mib: get("memory.total").and_then(number),
            memory_used_mib: get("memory.used").and_then(number),
            ecc_uncorrected_volatile: get("ecc.errors.uncorrected.volatile.total").and_then(number),
            retired_pages_pending: get("retired_pages.pending").and_then(|v| match v {
                "Yes" | "yes" => Some(true),
                "No" | "no" => Some(false),
                _ => None,
            }),
        });
    }
    Ok(gpus)
}

/// Parses a counter; `[N/A]`, `[Not Supported]` and the like are `None`.
fn number(v: &str) -> Option<u64> {
    v.trim().parse().ok()
}
