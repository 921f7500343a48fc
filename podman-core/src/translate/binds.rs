//! Binds, translated through the Ray container's mounts: a bind source is
//! a path inside the Ray container, mapped to the host through its own
//! mounts; one that is on the container's own file system is copied in and
//! back for an attached `--rm`, else refused.

use std::path::Path;

use bollard::models::HostConfig;

use super::{BindCopy, Context, Plan, TranslateError};
use crate::args::RunOpts;
use crate::selfid::{to_host, HostPath};

/// The refusal of a path that holds a `:` (see [`apply_binds`]).
fn smuggled(path: &str) -> TranslateError {
    TranslateError::Refused {
        flag: "--volume/--mount".into(),
        value: path.into(),
        rule: "binds",
        why:
            "a `:` in a bind's source or target would be read by Docker as the start of its options",
    }
}

/// Translates `-v` and `--tmpfs` into binds and tmpfs mounts.
pub fn apply_binds(
    o: &RunOpts,
    ctx: &Context,
    hc: &mut HostConfig,
    plan: &mut Plan,
) -> Result<(), TranslateError> {
    let me = ctx.me.as_ref();
    let mut binds = Vec::new();
    for v in &o.volumes {
        // Docker splits a bind on `:`: one in a source or target would
        // smuggle options (`target=/x:rshared`, `:z`) past the checks.
        for p in [&v.source, &v.target] {
            if p.contains(':') {
                return Err(smuggled(p));
            }
        }
        if v.source.is_empty() || !v.is_path() {
            // Anonymous or named volume: a name on the host daemon.
            let mut spec = if v.source.is_empty() {
                v.target.clone()
            } else {
                format!("{}:{}", v.source, v.target)
            };
            if !v.options.is_empty() {
                spec = format!("{spec}:{}", v.options.join(","));
            }
            binds.push(spec);
            continue;
        }
        // Resolved at the edge (`shim::resolve`): never guessed here.
        let canonical =
            ctx.canonical
                .get(&v.source)
                .cloned()
                .ok_or_else(|| TranslateError::Unresolved {
                    path: v.source.clone(),
                })?;
        let host = to_host(me, Path::new(&canonical));
        if let HostPath::At {
            read_only: false,
            inside: Some(root),
            ..
        } = &host
        {
            // Strictly inside a folder Ray or an engine container can
            // write: the daemon would resolve the path again when it mounts
            // it, after a job had the chance to swap a component for a link.
            if o.rm && !o.detach {
                plan.copies.push(BindCopy {
                    source: canonical,
                    target: v.target.clone(),
                    read_only: v.read_only(),
                });
                continue;
            }
            return Err(TranslateError::RacySubfolder {
                path: v.source.clone(),
                target: v.target.clone(),
                root: root.clone(),
            });
        }
        match host {
            HostPath::At {
                path,
                read_only,
                via_volume,
                ..
            } => {
                if path.contains(':') {
                    return Err(smuggled(&path));
                }
                let mut opts: Vec<String> = v
                    .options
                    .iter()
                    .filter(|o| *o != "ro" && *o != "rw")
                    .cloned()
                    .collect();
                if read_only || v.read_only() {
                    opts.insert(0, "ro".into());
                }
                plan.bind_sources
                    .push((canonical.clone(), path.clone(), via_volume));
                binds.push(if opts.is_empty() {
                    format!("{path}:{}", v.target)
                } else {
                    format!("{path}:{}:{}", v.target, opts.join(","))
                });
            }
            HostPath::NotVisible => {
                if o.rm && !o.detach {
                    plan.copies.push(BindCopy {
                        source: canonical,
                        target: v.target.clone(),
                        read_only: v.read_only(),
                    });
                } else {
                    return Err(TranslateError::NotHostVisible {
                        path: v.source.clone(),
                        target: v.target.clone(),
                    });
                }
            }
        }
    }
    if !binds.is_empty() {
        hc.binds = Some(binds);
    }
    if !o.tmpfs.is_empty() {
        hc.tmpfs = Some(
            o.tmpfs
                .iter()
                .map(|t| match t.split_once(':') {
                    Some((d, opts)) => (d.to_string(), opts.to_string()),
                    None => (t.clone(), String::new()),
                })
                .collect(),
        );
    }
    Ok(())
}
