//! The shim's policy (SPEC R-SHIM-5): requests that would hand a Ray job the
//! host are refused by default. Access to the Docker socket is root on the
//! host, so the shim is the only place where a job's `podman run` can be
//! checked.
//!
//! `ARGUS_SHIM_POLICY=relaxed` lifts the privilege and bind rules;
//! `ARGUS_SHIM_ALLOWED_IMAGES` (comma separated, `*` at the end matches any
//! rest) is enforced whenever it is set. Both are read from the shim's
//! environment, which Ray's runtime_env `env_vars` also reach; a `run` that
//! tries to set an `ARGUS_SHIM_*` variable is refused for that reason.

use std::path::Path;

use super::args::RunOpts;
use super::translate::Plan;

/// A refusal; the message names the rule.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error(
        "policy: --privileged is refused (rule no-privileged; ARGUS_SHIM_POLICY=relaxed lifts it)"
    )]
    Privileged,
    #[error("policy: --cap-add {0} is refused (rule no-cap-add-all; ARGUS_SHIM_POLICY=relaxed lifts it)")]
    CapAll(String),
    #[error("policy: binding {path} (host {host}) is refused (rule no-{rule}-bind; ARGUS_SHIM_POLICY=relaxed lifts it)")]
    Bind {
        path: String,
        host: String,
        rule: &'static str,
    },
    #[error("policy: image {image} is not in ARGUS_SHIM_ALLOWED_IMAGES (rule allowed-images)")]
    Image { image: String },
    #[error("policy: a job may not set {name} (rule no-job-policy)")]
    JobPolicy { name: String },
    #[error("policy: container {name} is not owned by this shim's Ray container (rule owned-containers-only)")]
    NotOwned { name: String },
}

/// The policy in force.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub relaxed: bool,
    /// None: every image is allowed.
    pub allowed_images: Option<Vec<String>>,
    /// Host paths of the Docker socket, besides the usual ones.
    pub docker_sockets: Vec<String>,
}

impl Policy {
    /// Reads the policy from environment values.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Policy {
        let relaxed = matches!(get("ARGUS_SHIM_POLICY").as_deref(), Some("relaxed"));
        let allowed_images = get("ARGUS_SHIM_ALLOWED_IMAGES")
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            });
        let mut docker_sockets = vec![
            "/var/run/docker.sock".to_string(),
            "/run/docker.sock".to_string(),
        ];
        if let Some(h) =
            get("DOCKER_HOST").and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        {
            docker_sockets.push(h);
        }
        Policy {
            relaxed,
            allowed_images,
            docker_sockets,
        }
    }

    /// Returns true if and only if `image` matches the allow-list (or there
    /// is none). Short names also match in their docker.io forms.
    pub fn image_allowed(&self, image: &str) -> bool {
        let Some(list) = &self.allowed_images else {
            return true;
        };
        let forms = image_forms(image);
        let full = canonical(image);
        list.iter().any(|pat| match pat.strip_suffix('*') {
            Some(prefix) => forms.iter().any(|f| f.starts_with(prefix)),
            None => canonical(pat) == full,
        })
    }

    /// Checks a `run` request after translation.
    pub fn check_run(&self, o: &RunOpts, plan: &Plan) -> Result<(), PolicyError> {
        for e in &o.env {
            let name = e.split_once('=').map(|(k, _)| k).unwrap_or(e);
            if name.starts_with("ARGUS_SHIM_") {
                return Err(PolicyError::JobPolicy { name: name.into() });
            }
        }
        if !self.image_allowed(&o.image) {
            return Err(PolicyError::Image {
                image: o.image.clone(),
            });
        }
        if self.relaxed {
            return Ok(());
        }
        if o.privileged {
            return Err(PolicyError::Privileged);
        }
        if let Some(c) = o
            .cap_add
            .iter()
            .find(|c| c.eq_ignore_ascii_case("all") || c.eq_ignore_ascii_case("CAP_ALL"))
        {
            return Err(PolicyError::CapAll(c.clone()));
        }
        for (caller, host, via_volume) in &plan.bind_sources {
            if let Some(rule) = self.bad_bind(caller, host, *via_volume) {
                return Err(PolicyError::Bind {
                    path: caller.clone(),
                    host: host.clone(),
                    rule,
                });
            }
        }
        for c in &plan.copies {
            if let Some(rule) = self.bad_bind(&c.source, &c.source, false) {
                return Err(PolicyError::Bind {
                    path: c.source.clone(),
                    host: c.source.clone(),
                    rule,
                });
            }
        }
        Ok(())
    }

    /// Returns the rule a bind breaks, if any.
    fn bad_bind(&self, caller: &str, host: &str, via_volume: bool) -> Option<&'static str> {
        let under = |p: &str, dir: &str| Path::new(p).starts_with(dir);
        for p in [caller, host] {
            if self.docker_sockets.iter().any(|s| p == s) || p.ends_with("/docker.sock") {
                return Some("docker-socket");
            }
            // A parent of the socket exposes it too.
            if self
                .docker_sockets
                .iter()
                .any(|s| Path::new(s).starts_with(p) && p != "/")
                && p != "/"
            {
                return Some("docker-socket");
            }
            if p == "/" {
                return Some("host-root");
            }
            for (dir, rule) in [("/etc", "etc"), ("/proc", "proc"), ("/sys", "sys")] {
                if under(p, dir) {
                    return Some(rule);
                }
            }
        }
        // Volumes live under the daemon's data root: that is their nature,
        // not a bind of it.
        if under(caller, "/var/lib/docker") || (under(host, "/var/lib/docker") && !via_volume) {
            return Some("docker-data");
        }
        None
    }
}

/// Returns the fully qualified form of an image reference, with the
/// registry and the default `latest` tag (`ubuntu` ->
/// `docker.io/library/ubuntu:latest`).
pub fn canonical(image: &str) -> String {
    let full = image_forms(image).pop().unwrap_or_default();
    let last = full.rsplit('/').next().unwrap_or("");
    if full.contains('@') || last.contains(':') {
        full
    } else {
        format!("{full}:latest")
    }
}

/// Returns the spellings of an image reference: as given, and normalised the
/// way Docker does (`ubuntu` -> `docker.io/library/ubuntu`).
pub fn image_forms(image: &str) -> Vec<String> {
    let mut forms = vec![image.to_string()];
    let first = image.split('/').next().unwrap_or("");
    let has_registry =
        image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if !has_registry {
        if image.contains('/') {
            forms.push(format!("docker.io/{image}"));
        } else {
            forms.push(format!("docker.io/library/{image}"));
        }
    }
    forms
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::args::{parse, Command};
    use crate::shim::translate::{translate, Context};

    fn check(policy: &Policy, argv: &[&str]) -> Result<(), PolicyError> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let Command::Run(o) = parse(&argv).unwrap() else {
            panic!()
        };
        let plan = translate(&o, &Context::default()).unwrap();
        policy.check_run(&o, &plan)
    }

    fn strict() -> Policy {
        Policy::from_env(|_| None)
    }

    #[test]
    fn each_rule_refuses() {
        let p = strict();
        assert_eq!(
            check(&p, &["run", "--privileged", "i"]),
            Err(PolicyError::Privileged)
        );
        assert_eq!(
            check(&p, &["run", "--cap-add", "all", "i"]),
            Err(PolicyError::CapAll("all".into()))
        );
        assert!(check(&p, &["run", "--cap-add", "NET_ADMIN", "i"]).is_ok());
        for (path, rule) in [
            ("/var/run/docker.sock", "docker-socket"),
            ("/run/docker.sock", "docker-socket"),
            ("/var/run", "docker-socket"),
            ("/", "host-root"),
            ("/etc", "etc"),
            ("/etc/shadow", "etc"),
            ("/proc", "proc"),
            ("/sys/fs", "sys"),
            ("/var/lib/docker", "docker-data"),
        ] {
            let v = format!("{path}:/x");
            match check(&p, &["run", "-v", &v, "i"]) {
                Err(PolicyError::Bind { rule: r, .. }) => assert_eq!(r, rule, "{path}"),
                other => panic!("{path}: {other:?}"),
            }
        }
        assert!(check(
            &p,
            &["run", "-v", "/srv/data:/x", "-v", "/etcetera:/y", "i"]
        )
        .is_ok());
        assert_eq!(
            check(&p, &["run", "-e", "ARGUS_SHIM_POLICY=relaxed", "i"]),
            Err(PolicyError::JobPolicy {
                name: "ARGUS_SHIM_POLICY".into()
            })
        );
    }

    #[test]
    fn relaxed_lifts_rules_but_not_the_allow_list() {
        let p = Policy::from_env(|k| match k {
            "ARGUS_SHIM_POLICY" => Some("relaxed".into()),
            "ARGUS_SHIM_ALLOWED_IMAGES" => Some("registry.local/ray/*, ubuntu".into()),
            _ => None,
        });
        assert!(check(
            &p,
            &[
                "run",
                "--privileged",
                "-v",
                "/:/host",
                "registry.local/ray/x:1"
            ]
        )
        .is_ok());
        assert!(check(&p, &["run", "ubuntu"]).is_ok());
        assert!(check(&p, &["run", "docker.io/library/ubuntu:latest"]).is_ok());
        assert_eq!(
            check(&p, &["run", "evil/ubuntu"]),
            Err(PolicyError::Image {
                image: "evil/ubuntu".into()
            })
        );
    }

    #[test]
    fn volume_sources_under_docker_data_root_are_allowed() {
        let p = strict();
        assert_eq!(
            p.bad_bind("/tmp/x", "/var/lib/docker/volumes/v/_data/x", true),
            None
        );
        assert_eq!(
            p.bad_bind("/mnt/d", "/var/lib/docker/overlay2", false),
            Some("docker-data")
        );
        assert_eq!(p.bad_bind("/host", "/", false), Some("host-root"));
    }
}
