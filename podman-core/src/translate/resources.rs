//! Resources and lifecycle: ulimits, restart, cgroups, logging, memory,
//! CPUs, pids, init and a read-only root.

use bollard::models::HostConfig;

use super::{Context, Plan, TranslateError};
use crate::args::RunOpts;

/// Translates the resource and lifecycle flags.
pub fn apply_resources(
    o: &RunOpts,
    ctx: &Context,
    hc: &mut HostConfig,
    _plan: &mut Plan,
) -> Result<(), TranslateError> {
    for u in &o.ulimits {
        let bad = || TranslateError::BadValue {
            flag: "--ulimit".into(),
            value: u.clone(),
        };
        let (name, limits) = u.split_once('=').ok_or_else(bad)?;
        let (soft, hard) = match limits.split_once(':') {
            Some((s, h)) => (s, h),
            None => (limits, limits),
        };
        let parse = |v: &str| {
            if v == "-1" || v == "unlimited" {
                Ok(-1)
            } else {
                v.parse::<i64>().map_err(|_| bad())
            }
        };
        hc.ulimits
            .get_or_insert_with(Vec::new)
            .push(bollard::models::ResourcesUlimits {
                name: Some(name.into()),
                soft: Some(parse(soft)?),
                hard: Some(parse(hard)?),
            });
    }
    if let Some(r) = &o.restart {
        if o.rm {
            return Err(TranslateError::BadValue {
                flag: "--restart".into(),
                value: format!("{r} (conflicts with --rm)"),
            });
        }
        let (name, count) = r.split_once(':').unwrap_or((r.as_str(), ""));
        let name = match name {
            "no" => bollard::models::RestartPolicyNameEnum::NO,
            "always" => bollard::models::RestartPolicyNameEnum::ALWAYS,
            "unless-stopped" => bollard::models::RestartPolicyNameEnum::UNLESS_STOPPED,
            "on-failure" => bollard::models::RestartPolicyNameEnum::ON_FAILURE,
            _ => {
                return Err(TranslateError::BadValue {
                    flag: "--restart".into(),
                    value: r.clone(),
                })
            }
        };
        let retries = if count.is_empty() {
            None
        } else {
            Some(count.parse().map_err(|_| TranslateError::BadValue {
                flag: "--restart".into(),
                value: r.clone(),
            })?)
        };
        hc.restart_policy = Some(bollard::models::RestartPolicy {
            name: Some(name),
            maximum_retry_count: retries,
        });
    }
    if let Some(c) = &o.cgroupns {
        hc.cgroupns_mode = Some(match c.as_str() {
            "host" => bollard::models::HostConfigCgroupnsModeEnum::HOST,
            "private" => bollard::models::HostConfigCgroupnsModeEnum::PRIVATE,
            _ => {
                return Err(TranslateError::Unsupported {
                    flag: "--cgroupns".into(),
                    value: c.clone(),
                })
            }
        });
    }
    hc.cgroup_parent = o.cgroup_parent.clone();
    hc.cpuset_cpus = o.cpuset_cpus.clone();
    if o.log_driver.is_some() || !o.log_opts.is_empty() {
        hc.log_config = Some(bollard::models::HostConfigLogConfig {
            typ: o.log_driver.clone(),
            config: Some(
                o.log_opts
                    .iter()
                    .map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.into(), v.into()))
                            .unwrap_or((kv.clone(), String::new()))
                    })
                    .collect(),
            ),
        });
    }

    if let Some(s) = &o.shm_size {
        hc.shm_size = Some(parse_size("--shm-size", s)?);
    }
    if let Some(m) = &o.memory {
        hc.memory = Some(parse_size("--memory", m)?);
    }
    if let Some(c) = &o.cpus {
        let n: f64 = c.parse().map_err(|_| TranslateError::BadValue {
            flag: "--cpus".into(),
            value: c.clone(),
        })?;
        hc.nano_cpus = Some((n * 1e9) as i64);
    }
    if let Some(p) = &o.pids_limit {
        hc.pids_limit = Some(p.parse().map_err(|_| TranslateError::BadValue {
            flag: "--pids-limit".into(),
            value: p.clone(),
        })?);
    }
    // An engine container does the Ray container's work: it gets at most
    // the Ray container's limits, and those when it names none.
    if let Some(me) = &ctx.me {
        let l = &me.limits;
        if l.memory > 0 && hc.memory.is_none() {
            hc.memory = Some(l.memory);
        }
        if l.nano_cpus > 0 && hc.nano_cpus.is_none() {
            hc.nano_cpus = Some(l.nano_cpus);
        }
        if l.pids > 0 && hc.pids_limit.is_none() {
            hc.pids_limit = Some(l.pids);
        }
        if !l.cpuset_cpus.is_empty() && hc.cpuset_cpus.is_none() {
            hc.cpuset_cpus = Some(l.cpuset_cpus.clone());
        }
    }
    if o.init {
        hc.init = Some(true);
    }
    if o.read_only {
        hc.readonly_rootfs = Some(true);
    }
    Ok(())
}

fn parse_size(flag: &str, v: &str) -> Result<i64, TranslateError> {
    let bad = || TranslateError::BadValue {
        flag: flag.into(),
        value: v.into(),
    };
    let lower = v.to_ascii_lowercase();
    let t = lower.trim_end_matches('b');
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1024i64),
        Some('m') => (&t[..t.len() - 1], 1024 * 1024),
        Some('g') => (&t[..t.len() - 1], 1024 * 1024 * 1024),
        _ => (t, 1),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    if n < 0.0 {
        return Err(bad());
    }
    Ok((n * mult as f64) as i64)
}
