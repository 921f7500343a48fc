//! Check 1: the device nodes `/dev/nvidiactl`, `/dev/nvidia-uvm` and
//! `/dev/nvidiaN` against what `NVIDIA_VISIBLE_DEVICES` asks for.
//!
//! Nodes are looked up under a root directory (`/` in production; the
//! test-only `ARGUS_PREFLIGHT_DEV_ROOT` in tests), where they may be regular
//! files: only presence and access are checked, never opened.

use std::path::Path;

use nix::unistd::{access, AccessFlags};

use super::{Check, Class, Evidence, Requested};

/// The name of this check.
pub const NAME: &str = "device-nodes";

/// The signature of a container without any GPU device node.
pub const NOT_INJECTED: &str = "gpu-devices-not-injected";

/// Returns the sorted minor numbers `N` of the `nvidiaN` entries of `dev`.
pub fn gpu_nodes(dev: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dev) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let digits = name.to_str()?.strip_prefix("nvidia")?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// Runs the device node check under `root`.
pub fn check(root: &Path, requested: Requested) -> Check {
    let dev = root.join("dev");
    let minors = gpu_nodes(&dev);
    let ctl = dev.join("nvidiactl");
    let uvm = dev.join("nvidia-uvm");
    let has_ctl = ctl.exists();
    let has_uvm = uvm.exists();
    let listing = format!(
        "gpu nodes [{}], nvidiactl {}, nvidia-uvm {}",
        minors
            .iter()
            .map(|m| format!("nvidia{m}"))
            .collect::<Vec<_>>()
            .join(" "),
        if has_ctl { "present" } else { "missing" },
        if has_uvm { "present" } else { "missing" },
    );
    let ev = Evidence::of(format!("ls {}/nvidia*", dev.display())).note(listing.clone());

    if minors.is_empty() && !has_ctl {
        let why = match requested {
            Requested::Nothing => "no /dev/nvidia* in the container and NVIDIA_VISIBLE_DEVICES names no device".to_string(),
            r => format!("NVIDIA_VISIBLE_DEVICES asks for {r:?} but there is no /dev/nvidia* in the container"),
        };
        return Check::fail(
            NAME,
            Class::Configuration,
            NOT_INJECTED,
            format!("{why}: start the container with GPUs (--gpus, the nvidia runtime or CDI)"),
        )
        .with(ev);
    }
    if !has_ctl {
        return Check::fail(
            NAME,
            Class::InfrastructureFatal,
            "nvidiactl-missing",
            format!("{} is missing while GPU nodes exist: the container runtime injected an incomplete device set", ctl.display()),
        )
        .with(ev);
    }
    if !has_uvm {
        return Check::fail(
            NAME,
            Class::InfrastructureFatal,
            "nvidia-uvm-missing",
            format!(
                "{} is missing: CUDA cannot initialise (nvidia_uvm not loaded on the host?)",
                uvm.display()
            ),
        )
        .with(ev);
    }
    let wanted = match requested {
        Requested::Count(n) => n,
        Requested::All | Requested::Nothing => 1,
    };
    if minors.len() < wanted {
        return Check::fail(
            NAME,
            Class::InfrastructureFatal,
            "gpu-count-mismatch",
            format!(
                "{} /dev/nvidiaN node(s) present, {wanted} expected (NVIDIA_VISIBLE_DEVICES {requested:?})",
                minors.len()
            ),
        )
        .with(ev);
    }
    let mut denied = Vec::new();
    let nodes = minors
        .iter()
        .map(|m| dev.join(format!("nvidia{m}")))
        .chain([ctl, uvm]);
    for p in nodes {
        if let Err(e) = access(&p, AccessFlags::R_OK | AccessFlags::W_OK) {
            denied.push(format!("{}: {e}", p.display()));
        }
    }
    if !denied.is_empty() {
        return Check::fail(
            NAME,
            Class::Configuration,
            "device-node-permission",
            format!("cannot read and write {}", denied.join(", ")),
        )
        .with(ev);
    }
    Check::pass(NAME, listing).with(ev)
}
