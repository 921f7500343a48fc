//! GPUs and devices, limited to the ones the Ray container has (SPEC
//! R-SHIM-3): `--gpus`, `--runtime`, `NVIDIA_VISIBLE_DEVICES` and
//! `--device`.

use std::path::Path;

use bollard::models::{DeviceMapping, DeviceRequest, HostConfig};

use super::{set_env, Context, Plan, TranslateError};
use crate::args::RunOpts;
use crate::selfid::Gpus;

/// The most GPUs or devices one container may ask for: checked before any
/// list is built from a count (`--gpus 18446744073709551615`).
pub const MAX_DEVICES: usize = 256;

/// Translates `--gpus`, `--runtime` and `--device`.
pub fn apply_gpus(
    o: &RunOpts,
    ctx: &Context,
    hc: &mut HostConfig,
    plan: &mut Plan,
) -> Result<(), TranslateError> {
    let me = ctx.me.as_ref();
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
    // NVIDIA's runtime hook gives a container the GPUs its
    // NVIDIA_VISIBLE_DEVICES names, from the create body or from the
    // image (CUDA images set `all`), whenever the runtime is nvidia, also
    // as the daemon's default. So a Ray container with some GPUs always
    // names them: the `--gpus` ones, the job's own list (the policy checks
    // it is a subset), or all of the Ray container's.
    if let Gpus::List(l) = &have {
        let asked = plan
            .env
            .iter()
            .find(|(k, _)| k == "NVIDIA_VISIBLE_DEVICES")
            .map(|(_, v)| v.clone());
        let ids = match (&limited, asked.as_deref()) {
            (Some(Some(ids)), _) => ids.join(","),
            (_, Some(v)) if v != "all" => v.to_string(),
            _ => l.join(","),
        };
        let v = if ids.is_empty() {
            "void".to_string()
        } else {
            ids
        };
        set_env(&mut plan.env, "NVIDIA_VISIBLE_DEVICES", &v);
    }
    if o.devices.len() > MAX_DEVICES {
        return Err(TranslateError::BadValue {
            flag: "--device".into(),
            value: format!("{} devices (at most {MAX_DEVICES})", o.devices.len()),
        });
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

    Ok(())
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
        if devs.split(',').count() > MAX_DEVICES {
            return Err(TranslateError::BadValue {
                flag: flag.into(),
                value: format!("{value} (more than {MAX_DEVICES} devices)"),
            });
        }
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
    let n: usize = match value_s.parse() {
        Ok(n) if n <= MAX_DEVICES => n,
        Ok(_) => {
            return Err(TranslateError::BadValue {
                flag: flag.into(),
                value: format!("{value} (at most {MAX_DEVICES})"),
            })
        }
        Err(_) => {
            return Err(TranslateError::BadValue {
                flag: flag.into(),
                value: value.into(),
            })
        }
    };
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
