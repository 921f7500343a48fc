//! Check 3: `dlopen` of `libnvidia-ml.so.1` (`nvmlInit_v2`,
//! `nvmlDeviceGetCount_v2`) and of `libcuda.so.1` (`cuInit(0)`,
//! `cuDeviceGetCount`), by their sonames, so the dynamic loader finds them
//! exactly as CUDA programs do (`LD_LIBRARY_PATH`, the ld.so cache, the
//! container runtime's injected paths).
//!
//! On the node path this runs in a child process (the agent binary again,
//! with [`PROBE_ENV`] set) under a timeout: see the module docs of
//! [`super`]. The child prints a [`LibReport`] as JSON.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use serde::{Deserialize, Serialize};

use super::{excerpt, Check, Class, Evidence, LibProbe};
use argus_supervise::{spawn_captured, Exit, Stop};

/// Set to `libraries` in the environment of `argus-agent preflight` to make
/// it run only the library probe and print a [`LibReport`] (internal).
pub const PROBE_ENV: &str = "ARGUS_PREFLIGHT_PROBE";

/// The names of the two library checks.
pub const NVML: &str = "libnvidia-ml";
pub const CUDA: &str = "libcuda";

/// What the library probe found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibReport {
    pub nvml: Check,
    pub cuda: Check,
    pub nvml_count: Option<u32>,
    pub cuda_count: Option<u32>,
    /// The file `libcuda.so.1` resolved to (from `dladdr` of `cuInit`).
    pub libcuda_path: Option<PathBuf>,
}

impl LibReport {
    fn both_failed(class: Class, signature: &str, message: &str, ev: Evidence) -> Self {
        Self {
            nvml: Check::fail(NVML, class, signature, message).with(ev.clone()),
            cuda: Check::fail(CUDA, class, signature, message).with(ev),
            nvml_count: None,
            cuda_count: None,
            libcuda_path: None,
        }
    }
}

/// Runs the library checks per `how`, bounded by `timeout` (and ended by
/// `stop`) when in a child.
pub fn run(how: &LibProbe, timeout: Duration, stop: &Stop) -> LibReport {
    match how {
        LibProbe::InProcess => probe(),
        LibProbe::Exec(exe) => run_child(exe, timeout, stop),
    }
}

fn run_child(exe: &std::path::Path, timeout: Duration, stop: &Stop) -> LibReport {
    let mut cmd = Command::new(exe);
    cmd.args(["preflight", "--json"])
        .env(PROBE_ENV, "libraries");
    let command = format!("{PROBE_ENV}=libraries {} preflight --json", exe.display());
    let cap = match spawn_captured(&mut cmd, timeout, stop) {
        Ok(c) => c,
        Err(e) => {
            return LibReport::both_failed(
                Class::Transient,
                "library-probe-failed",
                &format!("cannot start the library probe: {e}"),
                Evidence {
                    command,
                    stderr: Some(e.to_string()),
                    ..Default::default()
                },
            )
        }
    };
    let ev = Evidence {
        command,
        exit_code: cap.exit.map(Exit::code),
        stdout: excerpt(&cap.stdout),
        stderr: excerpt(&cap.stderr),
        ..Default::default()
    };
    if cap.timed_out {
        // A whole report means both inits returned: the probe was killed
        // while it exited (a loaded machine: a debug build's probe printed
        // its report and was still tearing down at a 1 s timeout). The
        // timeout is about a wedged init, which a report rules out.
        if let Ok(r) = serde_json::from_slice::<LibReport>(&cap.stdout) {
            return r;
        }
        return LibReport::both_failed(
            Class::Transient,
            "library-init-timeout",
            &format!("cuInit/nvmlInit did not return within {timeout:?} (wedged GPU or driver?); retry, drain if it persists"),
            Evidence {
                note: Some("probe process group killed".into()),
                ..ev
            },
        );
    }
    match serde_json::from_slice::<LibReport>(&cap.stdout) {
        Ok(r) if cap.exit == Some(Exit::Code(0)) => r,
        _ => {
            let how = cap
                .exit
                .map_or("no exit status".to_string(), |e| e.to_string());
            LibReport::both_failed(
                Class::Transient,
                "library-probe-crashed",
                &format!("the library probe ended with {how} without a report (crash in the driver library?)"),
                ev,
            )
        }
    }
}

type NvmlInit = unsafe extern "C" fn() -> c_int;
type NvmlCount = unsafe extern "C" fn(*mut c_uint) -> c_int;
type NvmlErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuErrorName = unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int;

/// Loads both libraries in this process and returns what they report.
/// The libraries stay loaded (unloading libcuda is not supported well).
pub fn probe() -> LibReport {
    let (nvml, nvml_count) = probe_nvml();
    let (cuda, cuda_count, libcuda_path) = probe_cuda();
    LibReport {
        nvml,
        cuda,
        nvml_count,
        cuda_count,
        libcuda_path,
    }
}

fn open(soname: &str) -> Result<Library, String> {
    // SAFETY: loading a driver library runs its initialisers; that is the
    // point of the check, and it happens in a short-lived probe process.
    unsafe { Library::open(Some(soname), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())
}

fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the libraries return NUL-terminated static strings.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

fn probe_nvml() -> (Check, Option<u32>) {
    let t = Instant::now();
    let soname = "libnvidia-ml.so.1";
    let lib = match open(soname) {
        Ok(l) => l,
        Err(e) => {
            let c = Check::fail(
                NVML,
                Class::InfrastructureFatal,
                "libnvidia-ml-not-loadable",
                format!("cannot load {soname}: the driver's user-space libraries are not installed or not injected into the container"),
            )
            .with(Evidence {
                command: format!("dlopen({soname}, RTLD_NOW)"),
                stderr: Some(e),
                ..Default::default()
            });
            return (c.timed(t), None);
        }
    };
    // SAFETY: the signatures are those of nvml.h.
    let r = unsafe {
        (|| -> Result<(Check, Option<u32>), libloading::Error> {
            let init = lib.get::<NvmlInit>(b"nvmlInit_v2\0")?;
            let count = lib.get::<NvmlCount>(b"nvmlDeviceGetCount_v2\0")?;
            let err_s = lib.get::<NvmlErrorString>(b"nvmlErrorString\0").ok();
            let describe = |rc: c_int| err_s.as_ref().and_then(|f| cstr(f(rc)));
            let failed = |call: &str, args: &str, rc: c_int| {
                let (class, sig) = classify_nvml(rc);
                call_failed(
                    NVML,
                    (class, sig),
                    call,
                    args,
                    rc,
                    describe(rc),
                    String::new(),
                )
            };
            let rc = init();
            if rc != 0 {
                return Ok((failed("nvmlInit_v2", "()", rc), None));
            }
            let mut n: c_uint = 0;
            let rc = count(&mut n);
            if rc != 0 {
                return Ok((failed("nvmlDeviceGetCount_v2", "(&n)", rc), None));
            }
            if let Ok(shutdown) = lib.get::<NvmlInit>(b"nvmlShutdown\0") {
                shutdown();
            }
            Ok((
                Check::pass(NVML, format!("nvmlInit_v2 ok, {n} device(s)")).with(Evidence {
                    command: "nvmlInit_v2(); nvmlDeviceGetCount_v2(&n)".into(),
                    exit_code: Some(0),
                    note: Some(format!("n = {n}")),
                    ..Default::default()
                }),
                Some(n),
            ))
        })()
    };
    std::mem::forget(lib);
    let (c, n) = r.unwrap_or_else(|e| {
        (
            Check::fail(
                NVML,
                Class::InfrastructureFatal,
                "libnvidia-ml-not-loadable",
                format!("{soname} lacks an NVML entry point: {e}"),
            )
            .with(Evidence {
                command: format!("dlsym({soname})"),
                stderr: Some(e.to_string()),
                ..Default::default()
            }),
            None,
        )
    });
    (c.timed(t), n)
}

fn probe_cuda() -> (Check, Option<u32>, Option<PathBuf>) {
    let t = Instant::now();
    let soname = "libcuda.so.1";
    let lib = match open(soname) {
        Ok(l) => l,
        Err(e) => {
            let c = Check::fail(
                CUDA,
                Class::InfrastructureFatal,
                "libcuda-not-loadable",
                format!("cannot load {soname}: the driver's CUDA library is not installed or not injected into the container"),
            )
            .with(Evidence {
                command: format!("dlopen({soname}, RTLD_NOW)"),
                stderr: Some(e),
                ..Default::default()
            });
            return (c.timed(t), None, None);
        }
    };
    // SAFETY: the signatures are those of cuda.h.
    let r = unsafe {
        (|| -> Result<(Check, Option<u32>, Option<PathBuf>), libloading::Error> {
            let init = lib.get::<CuInit>(b"cuInit\0")?;
            let count = lib.get::<CuCount>(b"cuDeviceGetCount\0")?;
            let err_name = lib.get::<CuErrorName>(b"cuGetErrorName\0").ok();
            let path = loaded_from(*init as *const c_void);
            let describe = |rc: c_int| {
                err_name.as_ref().and_then(|f| {
                    let mut p: *const c_char = std::ptr::null();
                    (f(rc, &mut p) == 0).then(|| cstr(p)).flatten()
                })
            };
            let at = path
                .as_ref()
                .map(|p| format!(" (loaded from {})", p.display()))
                .unwrap_or_default();
            let failed = |call: &str, args: &str, rc: c_int, at: &str| {
                let (class, sig, hint) = classify_cuda(rc);
                call_failed(
                    CUDA,
                    (class, sig),
                    call,
                    args,
                    rc,
                    describe(rc),
                    format!("{at}: {hint}"),
                )
            };
            let rc = init(0);
            if rc != 0 {
                let mut c = failed("cuInit", "(0)", rc, &at);
                if let (Some(ev), Some(p)) = (c.evidence.last_mut(), path.as_ref()) {
                    ev.note = Some(format!("libcuda.so.1 -> {}", p.display()));
                }
                return Ok((c, None, path));
            }
            let mut n: c_int = 0;
            let rc = count(&mut n);
            if rc != 0 {
                return Ok((failed("cuDeviceGetCount", "(&n)", rc, ""), None, path));
            }
            let n = n.max(0) as u32;
            Ok((
                Check::pass(CUDA, format!("cuInit ok, {n} device(s){at}")).with(Evidence {
                    command: "cuInit(0); cuDeviceGetCount(&n)".into(),
                    exit_code: Some(0),
                    note: Some(format!(
                        "n = {n}{}",
                        path.as_ref()
                            .map(|p| format!(", libcuda.so.1 -> {}", p.display()))
                            .unwrap_or_default()
                    )),
                    ..Default::default()
                }),
                Some(n),
                path,
            ))
        })()
    };
    std::mem::forget(lib);
    let (c, n, p) = r.unwrap_or_else(|e| {
        (
            Check::fail(
                CUDA,
                Class::InfrastructureFatal,
                "libcuda-not-loadable",
                format!("{soname} lacks a CUDA entry point: {e}"),
            )
            .with(Evidence {
                command: format!("dlsym({soname})"),
                stderr: Some(e.to_string()),
                ..Default::default()
            }),
            None,
            None,
        )
    });
    (c.timed(t), n, p)
}

/// Returns the file that the code at `addr` was loaded from.
fn loaded_from(addr: *const c_void) -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let rc = unsafe { libc::dladdr(addr, &mut info) };
    if rc == 0 {
        return None;
    }
    cstr(info.dli_fname).map(PathBuf::from)
}

/// Classifies a failing `nvmlReturn_t`.
/// Returns the failed check for a library call `call` + `args` that
/// returned `rc` (named `name` by the library), with `tail` appended to the
/// message.
fn call_failed(
    check: &str,
    (class, signature): (Class, &'static str),
    call: &str,
    args: &str,
    rc: c_int,
    name: Option<String>,
    tail: String,
) -> Check {
    let message = format!(
        "{call} returned {rc} ({}){tail}",
        name.as_deref().unwrap_or("unknown")
    );
    Check::fail(check, class, signature, message).with(Evidence {
        command: format!("{call}{args}"),
        exit_code: Some(rc),
        code_name: name,
        ..Default::default()
    })
}

pub fn classify_nvml(rc: c_int) -> (Class, &'static str) {
    match rc {
        9 => (Class::InfrastructureFatal, "driver-not-loaded"),
        12 => (Class::InfrastructureFatal, "nvml-library-not-found"),
        14 => (Class::InfrastructureFatal, "inforom-corrupted"),
        15 => (Class::InfrastructureFatal, "gpu-lost"),
        16 => (Class::InfrastructureFatal, "gpu-reset-required"),
        18 => (
            Class::InfrastructureFatal,
            "driver-library-version-mismatch",
        ),
        4 => (Class::Configuration, "gpu-no-permission"),
        17 => (Class::Configuration, "gpu-blocked-by-os"),
        _ => (Class::Transient, "nvml-init-failed"),
    }
}

/// Classifies a failing `CUresult` with a hint for the message.
pub fn classify_cuda(rc: c_int) -> (Class, &'static str, &'static str) {
    match rc {
        100 => (
            Class::Configuration,
            "cuda-no-device",
            "no CUDA-capable device visible: check CUDA_VISIBLE_DEVICES and /dev/nvidia-uvm",
        ),
        101 => (
            Class::Configuration,
            "cuda-invalid-device",
            "check CUDA_VISIBLE_DEVICES",
        ),
        34 => (
            Class::Configuration,
            "cuda-stub-library",
            "a CUDA stub library is on the loader path: remove the stubs directory from LD_LIBRARY_PATH",
        ),
        35 => (
            Class::Configuration,
            "cuda-insufficient-driver",
            "the image's CUDA is newer than the host driver",
        ),
        803 => (
            Class::Configuration,
            "cuda-system-driver-mismatch",
            "the image's CUDA does not match the host driver: pick a host with a newer driver or another image",
        ),
        804 => (
            Class::Configuration,
            "cuda-compat-not-supported",
            "CUDA forward compatibility is not supported on this GPU",
        ),
        46 => (
            Class::Transient,
            "cuda-devices-busy",
            "all CUDA devices are busy or unavailable (exclusive compute mode held by another process?)",
        ),
        _ => (
            Class::Transient,
            "cuda-init-failed",
            "may pass on retry",
        ),
    }
}
