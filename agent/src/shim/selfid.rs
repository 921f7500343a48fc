//! Finding the id of the container the shim runs in.
//!
//! Candidates come from, in order: `ARGUS_SHIM_SELF_ID`, the bind mounts of
//! `/etc/hostname` & co. in `/proc/self/mountinfo` (cgroup v1 and v2), the
//! cgroup path (v1 only) and the hostname (a 12-hex short id, wrong with
//! `--network=host`). The caller confirms each with an inspect.

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
