//! Environment: `--env-host`, proxies, env files, then `-e` (last wins).
//! Env-file lines and `-e` values are one list (`Plan::job_env`), so the
//! policy's rules see both the same way.

use bollard::models::HostConfig;

use super::{set_env, Context, Plan, TranslateError};
use crate::args::{unexpanded_ray_var, RunOpts};

/// Builds the container's environment into `plan.env`.
pub fn apply_env(
    o: &RunOpts,
    ctx: &Context,
    _hc: &mut HostConfig,
    plan: &mut Plan,
) -> Result<(), TranslateError> {
    let env = &mut plan.env;
    if o.env_host {
        for (k, v) in &ctx.env {
            set_env(env, k, v);
        }
    }
    if o.http_proxy {
        for k in [
            "http_proxy",
            "https_proxy",
            "ftp_proxy",
            "no_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "FTP_PROXY",
            "NO_PROXY",
        ] {
            if let Some(v) = ctx.getenv(k) {
                set_env(env, k, v);
            }
        }
    }
    let mut entries: Vec<String> = Vec::new();
    for path in &o.env_files {
        let text = ctx
            .env_files
            .get(path)
            .ok_or_else(|| TranslateError::EnvFile {
                path: path.clone(),
                reason: "cannot be read".into(),
            })?;
        entries.extend(parse_env_file(text));
    }
    entries.extend(o.env.iter().cloned());
    for e in &entries {
        match e.split_once('=') {
            Some((k, v)) => {
                let v = match unexpanded_ray_var(v) {
                    Some(name) => ctx.getenv(name).unwrap_or(v).to_string(),
                    None => v.to_string(),
                };
                set_env(env, k, &v);
            }
            None => {
                if let Some(prefix) = e.strip_suffix('*') {
                    for (k, v) in ctx.env.iter().filter(|(k, _)| k.starts_with(prefix)) {
                        set_env(env, k, v);
                    }
                } else if let Some(v) = ctx.getenv(e) {
                    set_env(env, e, v);
                }
            }
        }
    }
    plan.job_env = entries;
    Ok(())
}

/// Parses a `KEY=VALUE` env file the way podman does (comments, blank
/// lines, bare `KEY` copies from the caller).
pub fn parse_env_file(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}
