//! Namespaces: podman's `host` is the caller's (the Ray container's)
//! namespace, joined on Docker with `container:<id>`.

use bollard::models::HostConfig;

use super::{Context, Plan, TranslateError};
use crate::args::RunOpts;
use crate::selfid::SelfContainer;

/// Translates `--network`, `--pid`, `--ipc` and `--uts`.
pub fn apply_namespaces(
    o: &RunOpts,
    ctx: &Context,
    hc: &mut HostConfig,
    plan: &mut Plan,
) -> Result<(), TranslateError> {
    let me = ctx.me.as_ref();
    let hostname = &mut plan.body.hostname;
    let mut shared_net = false;
    if let Some(n) = o.network.as_deref() {
        hc.network_mode = Some(match n {
            "host" => {
                let m = caller_ns(me, |m| &m.network_mode);
                shared_net = true;
                m
            }
            "slirp4netns" | "pasta" | "private" | "bridge" => "bridge".into(),
            "none" => "none".into(),
            n if n.starts_with("ns:")
                || n.starts_with("slirp4netns:")
                || n.starts_with("pasta:") =>
            {
                return Err(TranslateError::Unsupported {
                    flag: "--network".into(),
                    value: n.into(),
                })
            }
            n => {
                shared_net = n.starts_with("container:");
                n.to_string()
            }
        });
    }
    if shared_net {
        // Docker refuses these with a shared network namespace; podman with
        // --network=host ignores them, so they are dropped with a warning.
        if hostname.take().is_some() {
            plan.warnings
                .push("--hostname is ignored with a shared network namespace".into());
        }
        for (flag, set) in [
            ("--publish", &o.publish),
            ("--add-host", &o.add_host),
            ("--dns", &o.dns),
        ] {
            if !set.is_empty() {
                plan.warnings
                    .push(format!("{flag} is ignored with a shared network namespace"));
            }
        }
    } else {
        if !o.add_host.is_empty() {
            hc.extra_hosts = Some(o.add_host.clone());
        }
        if !o.dns.is_empty() {
            hc.dns = Some(o.dns.clone());
        }
        if !o.publish.is_empty() {
            return Err(TranslateError::Unsupported {
                flag: "--publish".into(),
                value: o.publish.join(","),
            });
        }
    }
    if let Some(p) = o.pid.as_deref() {
        hc.pid_mode = Some(match p {
            "host" => caller_ns(me, |m| &m.pid_mode),
            "private" | "" => String::new(),
            p if p.starts_with("container:") => p.into(),
            p => {
                return Err(TranslateError::Unsupported {
                    flag: "--pid".into(),
                    value: p.into(),
                })
            }
        });
    }
    if let Some(i) = o.ipc.as_deref() {
        hc.ipc_mode = Some(match (i, me) {
            ("host", None) => "host".into(),
            ("host", Some(m)) if m.ipc_mode == "host" => "host".into(),
            ("host", Some(m)) if m.ipc_mode == "shareable" => format!("container:{}", m.id),
            ("host", Some(m)) => {
                plan.warnings.push(format!(
                    "--ipc=host: this container's IPC namespace is {:?}, not shareable; using a private one (run the Ray container with --ipc=shareable to share it)",
                    m.ipc_mode
                ));
                "private".into()
            }
            ("private" | "shareable" | "none", _) => i.into(),
            (i, _) if i.starts_with("container:") => i.into(),
            (i, _) => {
                return Err(TranslateError::Unsupported {
                    flag: "--ipc".into(),
                    value: i.into(),
                })
            }
        });
    }
    if let Some(u) = o.uts.as_deref() {
        match (u, me) {
            ("host", None) => hc.uts_mode = Some("host".into()),
            ("host", Some(m)) if m.uts_mode == "host" => hc.uts_mode = Some("host".into()),
            ("host", Some(m)) => {
                if !hc
                    .network_mode
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("container:")
                {
                    *hostname = Some(m.hostname.clone());
                }
            }
            ("private" | "", _) => {}
            (u, _) => {
                return Err(TranslateError::Unsupported {
                    flag: "--uts".into(),
                    value: u.into(),
                })
            }
        }
    }

    Ok(())
}

/// Maps podman's `host` namespace to the caller's namespace on Docker.
fn caller_ns(me: Option<&SelfContainer>, self_mode: impl Fn(&SelfContainer) -> &str) -> String {
    match me {
        None => "host".into(),
        Some(m) if self_mode(m) == "host" => "host".into(),
        Some(m) => format!("container:{}", m.id),
    }
}
