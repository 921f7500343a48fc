//! Users and privileges: `--userns=keep-id` runs as the caller's uid:gid;
//! `--group-add keep-groups` keeps the caller's groups; capabilities and
//! security options pass through (the policy checks them).

use bollard::models::HostConfig;

use super::{Context, Plan, TranslateError};
use crate::shim::args::RunOpts;

/// Translates the user, groups, privileges and security options.
pub fn apply_user(
    o: &RunOpts,
    ctx: &Context,
    hc: &mut HostConfig,
    plan: &mut Plan,
) -> Result<(), TranslateError> {
    let user = &mut plan.body.user;
    if let Some(ns) = o.userns.as_deref() {
        if let Some(rest) = ns.strip_prefix("keep-id") {
            let mut uid = ctx.uid.to_string();
            let mut gid = ctx.gid.to_string();
            for kv in rest
                .trim_start_matches(':')
                .split(',')
                .filter(|s| !s.is_empty())
            {
                match kv.split_once('=') {
                    Some(("uid", v)) => uid = v.into(),
                    Some(("gid", v)) => gid = v.into(),
                    _ => {
                        return Err(TranslateError::BadValue {
                            flag: "--userns".into(),
                            value: ns.into(),
                        })
                    }
                }
            }
            if user.is_none() {
                *user = Some(format!("{uid}:{gid}"));
            }
        } else {
            match ns {
                "host" => hc.userns_mode = Some("host".into()),
                "" => {}
                _ => {
                    return Err(TranslateError::Unsupported {
                        flag: "--userns".into(),
                        value: ns.into(),
                    })
                }
            }
        }
    }
    // An engine container runs as its caller (the Ray user) unless a
    // `--user` says otherwise (the policy's `users` rule decides which).
    if user.is_none() {
        *user = Some(format!("{}:{}", ctx.uid, ctx.gid));
    }
    if !o.group_add.is_empty() {
        let mut groups = Vec::new();
        for g in &o.group_add {
            if g == "keep-groups" {
                groups.extend(ctx.groups.iter().map(u32::to_string));
            } else {
                groups.push(g.clone());
            }
        }
        hc.group_add = Some(groups);
    }
    hc.privileged = Some(o.privileged);
    if !o.cap_add.is_empty() {
        hc.cap_add = Some(o.cap_add.clone());
    }
    if !o.cap_drop.is_empty() {
        hc.cap_drop = Some(o.cap_drop.clone());
    }
    let mut sec = Vec::new();
    for s in &o.security_opt {
        if s.starts_with("mask=")
            || s.starts_with("unmask=")
            || s.starts_with("proc-opts=")
            || s == "label=nested"
        {
            plan.warnings
                .push(format!("--security-opt {s} is podman-only and ignored"));
        } else {
            sec.push(s.clone());
        }
    }
    // Nothing in an engine container gains privileges through setuid files
    // unless the job says so (and the policy allows it).
    if !sec.iter().any(|s| s.starts_with("no-new-privileges")) {
        sec.push("no-new-privileges".into());
    }
    hc.security_opt = Some(sec);
    Ok(())
}
