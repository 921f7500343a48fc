//! The container the shim runs in (the Ray container): finding its id,
//! what translation needs from its inspect, and how its paths map to the
//! host.
//!
//! Candidates come from, in order: `ARGUS_SHIM_SELF_ID`, the bind mounts of
//! `/etc/hostname` & co. in `/proc/self/mountinfo` (cgroup v1 and v2), the
//! cgroup path (v1 only) and the hostname (a 12-hex short id, wrong with
//! `--network=host`). The caller confirms each with an inspect.

use std::path::{Component, Path, PathBuf};

use bollard::models::{ContainerInspectResponse, MountPointTypeEnum};

/// A mount of the Ray container, from its inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfMount {
    pub kind: MountKind,
    /// The volume's name, for a volume mount.
    pub name: Option<String>,
    pub source: String,
    pub destination: String,
    pub rw: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    Bind,
    Volume,
    Other,
}

/// The GPUs the caller has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// Every GPU of the host (the shim runs on the host, or the Ray container
    /// got `--gpus all`).
    All,
    /// These device ids (indices or UUIDs), in the order the caller sees them.
    List(Vec<String>),
}

/// Every GPU: what a shim on the host itself has.
impl Default for Gpus {
    fn default() -> Gpus {
        Gpus::All
    }
}

/// The Ray container the shim runs in, as far as translation needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfContainer {
    pub id: String,
    pub network_mode: String,
    pub pid_mode: String,
    pub ipc_mode: String,
    pub uts_mode: String,
    pub hostname: String,
    pub mounts: Vec<SelfMount>,
    pub gpus: Gpus,
    /// Host paths of the devices it was given (`--device`).
    pub devices: Vec<String>,
    /// The networks it is attached to (`bridge`, a compose network, …).
    pub networks: Vec<String>,
    /// Its resource limits; 0 (or empty) when it has none.
    pub limits: Limits,
    /// The compose project it belongs to (its `com.docker.compose.project`
    /// label), when compose started it.
    pub compose_project: Option<String>,
}

/// The resource limits of the Ray container, which bound its engine
/// containers' (from `HostConfig`; 0 means none).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits {
    /// Bytes.
    pub memory: i64,
    /// CPUs in units of 10^-9 (also from `CpuQuota / CpuPeriod`).
    pub nano_cpus: i64,
    pub pids: i64,
    /// A cpuset list (`0-3,6`); empty: every CPU.
    pub cpuset_cpus: String,
}

impl SelfContainer {
    /// Extracts what translation needs from `GET /containers/{id}/json`.
    pub fn from_inspect(i: &ContainerInspectResponse) -> SelfContainer {
        let hc = i.host_config.clone().unwrap_or_default();
        let limits = Limits::of(&hc);
        let cfg = i.config.clone().unwrap_or_default();
        let mounts = i
            .mounts
            .iter()
            .flatten()
            .map(|m| SelfMount {
                kind: match m.typ {
                    Some(MountPointTypeEnum::BIND) => MountKind::Bind,
                    Some(MountPointTypeEnum::VOLUME) => MountKind::Volume,
                    _ => MountKind::Other,
                },
                name: m.name.clone().filter(|n| !n.is_empty()),
                source: m.source.clone().unwrap_or_default(),
                destination: m.destination.clone().unwrap_or_default(),
                rw: m.rw.unwrap_or(false),
            })
            .collect();
        let env_gpus = cfg.env.iter().flatten().find_map(|e| {
            e.strip_prefix("NVIDIA_VISIBLE_DEVICES=")
                .map(str::to_string)
        });
        let mut gpus = Gpus::List(vec![]);
        for r in hc.device_requests.iter().flatten() {
            let is_gpu = r
                .driver
                .as_deref()
                .is_none_or(|d| d.is_empty() || d == "nvidia")
                || r.capabilities
                    .iter()
                    .flatten()
                    .flatten()
                    .any(|c| c == "gpu");
            if !is_gpu {
                continue;
            }
            if r.count == Some(-1) {
                gpus = Gpus::All;
            } else if let Some(ids) = &r.device_ids {
                if let Gpus::List(l) = &mut gpus {
                    l.extend(ids.iter().flat_map(|s| s.split(',')).map(str::to_string));
                }
            } else if let Some(n) = r.count {
                if let Gpus::List(l) = &mut gpus {
                    l.extend((0..n).map(|i| i.to_string()));
                }
            }
        }
        if gpus == Gpus::List(vec![]) && (hc.runtime.as_deref() == Some("nvidia")) {
            gpus = match env_gpus.as_deref() {
                Some("all") => Gpus::All,
                Some("none") | Some("void") | Some("") | None => Gpus::List(vec![]),
                Some(list) => Gpus::List(list.split(',').map(str::to_string).collect()),
            };
        }
        let compose_project = cfg
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::labels::COMPOSE_PROJECT))
            .filter(|p| !p.is_empty())
            .cloned();
        SelfContainer {
            compose_project,
            id: i.id.clone().unwrap_or_default(),
            network_mode: hc.network_mode.unwrap_or_default(),
            pid_mode: hc.pid_mode.unwrap_or_default(),
            ipc_mode: hc.ipc_mode.unwrap_or_default(),
            uts_mode: hc.uts_mode.unwrap_or_default(),
            hostname: cfg.hostname.unwrap_or_default(),
            mounts,
            gpus,
            devices: hc
                .devices
                .iter()
                .flatten()
                .filter_map(|d| d.path_on_host.clone())
                .collect(),
            networks: i
                .network_settings
                .as_ref()
                .and_then(|n| n.networks.as_ref())
                .map(|n| n.keys().cloned().collect())
                .unwrap_or_default(),
            limits,
        }
    }
}

impl Limits {
    /// A container's limits from its `HostConfig` (0: none).
    pub fn of(hc: &bollard::models::HostConfig) -> Limits {
        Limits {
            memory: hc.memory.unwrap_or(0).max(0),
            nano_cpus: match (hc.nano_cpus, hc.cpu_quota, hc.cpu_period) {
                (Some(n), _, _) if n > 0 => n,
                (_, Some(q), Some(p)) if q > 0 && p > 0 => q.saturating_mul(1_000_000_000) / p,
                (_, Some(q), _) if q > 0 => q.saturating_mul(10_000), // default period 100 ms
                _ => 0,
            },
            pids: hc.pids_limit.unwrap_or(0).max(0),
            cpuset_cpus: hc.cpuset_cpus.clone().unwrap_or_default(),
        }
    }
}

/// Where a caller path lives on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPath {
    /// At this host path; `read_only` when the Ray container's mount is.
    /// `inside` is the mount's destination when the path lies strictly
    /// inside it (None: the path is the mount itself, or the shim runs on
    /// the host).
    At {
        path: String,
        read_only: bool,
        via_volume: bool,
        inside: Option<String>,
    },
    /// Nowhere: the path is on the Ray container's own file system or tmpfs.
    NotVisible,
}

/// Returns true if and only if `prefix` is `path` or a path-component
/// prefix of it (`/data` is a prefix of `/data/x`, not of `/database`).
fn is_path_prefix(prefix: &Path, path: &Path) -> bool {
    path.starts_with(prefix)
}

/// Lexically normalises an absolute path (`.` and `..`), for paths that do
/// not exist yet and so cannot be canonicalised.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Maps a caller path (already canonical) to the host through `me`'s mounts:
/// the mount with the longest destination that is a path prefix wins.
pub fn to_host(me: Option<&SelfContainer>, path: &Path) -> HostPath {
    let Some(me) = me else {
        return HostPath::At {
            path: path.display().to_string(),
            read_only: false,
            via_volume: false,
            // On the host itself no mount tells what a job can write; the
            // host's own permissions decide (docs/shim.md).
            inside: None,
        };
    };
    let best = me
        .mounts
        .iter()
        .filter(|m| is_path_prefix(Path::new(&m.destination), path))
        .max_by_key(|m| Path::new(&m.destination).components().count());
    match best {
        Some(m) if m.kind != MountKind::Other && !m.source.is_empty() => {
            let suffix = path.strip_prefix(&m.destination).unwrap_or(Path::new(""));
            let host = if suffix.as_os_str().is_empty() {
                PathBuf::from(&m.source)
            } else {
                Path::new(&m.source).join(suffix)
            };
            HostPath::At {
                path: host.display().to_string(),
                read_only: !m.rw,
                via_volume: m.kind == MountKind::Volume,
                inside: (!suffix.as_os_str().is_empty()).then(|| m.destination.clone()),
            }
        }
        _ => HostPath::NotVisible,
    }
}

/// Returns true if and only if `s` is `n` lowercase hex digits.
fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Finds 64-hex ids after `/containers/` in the root field of mountinfo,
/// the `/etc/hostname` line first.
pub fn from_mountinfo(text: &str) -> Vec<String> {
    let mut preferred = Vec::new();
    let mut others = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(root), Some(mount_point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let Some(pos) = root.find("/containers/") else {
            continue;
        };
        let rest = &root[pos + "/containers/".len()..];
        let id = rest.split('/').next().unwrap_or("");
        if !is_hex(id, 64) {
            continue;
        }
        let list = if *mount_point == "/etc/hostname" {
            &mut preferred
        } else {
            &mut others
        };
        if !list.iter().any(|x| x == id) {
            list.push(id.to_string());
        }
    }
    others.retain(|id| !preferred.contains(id));
    preferred.extend(others);
    preferred
}

/// Finds a 64-hex id in a cgroup v1 path (`/docker/<id>`,
/// `docker-<id>.scope`, `cri-containerd-<id>`, `crio-<id>`).
pub fn from_cgroup(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        for part in path.split('/') {
            let part = part.strip_suffix(".scope").unwrap_or(part);
            let id = part.rsplit(['-', ':']).next().unwrap_or("");
            if is_hex(id, 64) && !out.iter().any(|x| x == id) {
                out.push(id.to_string());
            }
        }
    }
    out
}

/// Returns every candidate id or id prefix, best first.
pub fn candidates(
    override_id: Option<&str>,
    mountinfo: &str,
    cgroup: &str,
    hostname: &str,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(o) = override_id.filter(|o| !o.is_empty()) {
        out.push(o.to_string());
    }
    for c in from_mountinfo(mountinfo)
        .into_iter()
        .chain(from_cgroup(cgroup))
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    let h = hostname.trim();
    if is_hex(h, 12) && !out.iter().any(|c| c.starts_with(h)) {
        out.push(h.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0f3c1e2d4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    #[test]
    fn mountinfo_prefers_the_hostname_bind() {
        let other = "1111111111111111111111111111111111111111111111111111111111111111";
        let text = format!(
            "612 590 0:52 / / rw,relatime - overlay overlay rw\n\
             630 612 259:1 /var/lib/docker/containers/{other}/resolv.conf /mnt/x rw - ext4 /dev/root rw\n\
             631 612 259:1 /var/lib/docker/containers/{ID}/hostname /etc/hostname rw,relatime - ext4 /dev/root rw\n\
             632 612 259:1 /var/lib/docker/containers/{ID}/hosts /etc/hosts rw - ext4 /dev/root rw\n"
        );
        assert_eq!(
            from_mountinfo(&text),
            vec![ID.to_string(), other.to_string()]
        );
        // A separate /var/lib/docker file system shows /containers/<id>/… .
        let text =
            format!("631 612 8:1 /containers/{ID}/hostname /etc/hostname rw - ext4 /dev/sdb rw\n");
        assert_eq!(from_mountinfo(&text), vec![ID.to_string()]);
        assert!(from_mountinfo("25 1 0:23 / /sys rw - sysfs sysfs rw\n").is_empty());
    }

    #[test]
    fn cgroup_v1_paths_and_v2_root() {
        assert_eq!(
            from_cgroup(&format!("12:memory:/docker/{ID}\n")),
            vec![ID.to_string()]
        );
        assert_eq!(
            from_cgroup(&format!("1:name=systemd:/system.slice/docker-{ID}.scope\n")),
            vec![ID.to_string()]
        );
        assert!(from_cgroup("0::/\n").is_empty());
    }

    #[test]
    fn override_first_then_hostname_prefix() {
        let c = candidates(Some("abc"), "", "0::/\n", "0f3c1e2d4b5a\n");
        assert_eq!(c, vec!["abc".to_string(), "0f3c1e2d4b5a".to_string()]);
        assert!(candidates(None, "", "", "ray-head").is_empty());
    }
}
