//! Privileges shrink down the process tree.
//!
//! PID 1 may hold what only it needs (the right to open the Docker socket:
//! root in the container) and is not dumpable, so nothing it starts can
//! ptrace it or open its `/proc/1/{root,fd,mem}`. What it starts (`ray
//! start` and its whole tree, the pre-start hook) runs as the Ray user
//! (`ARGUS_RAY_USER`) with no supplementary groups, no capabilities, and
//! `no_new_privs`, so a setuid file planted through a shared folder gives
//! nothing.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// The user Ray's tree runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayUser {
    pub uid: u32,
    pub gid: u32,
    /// From the passwd entry, when there is one: `HOME`, `USER`, `LOGNAME`.
    pub name: Option<String>,
    pub home: Option<PathBuf>,
}

impl RayUser {
    /// Parses `name`, `uid`, `uid:gid` or `name:group` (the group by name
    /// or id); a name is looked up in the passwd/group files. Returns why not.
    pub fn parse(spec: &str) -> Result<RayUser, String> {
        use nix::unistd::{Group, Uid, User};
        let (u, g) = match spec.split_once(':') {
            Some((u, g)) => (u.trim(), Some(g.trim())),
            None => (spec.trim(), None),
        };
        if u.is_empty() || g.is_some_and(str::is_empty) {
            return Err("expected user, uid, uid:gid or user:group".into());
        }
        let entry = match u.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)).ok().flatten(),
            Err(_) => Some(
                User::from_name(u)
                    .map_err(|e| format!("cannot read the user database: {e}"))?
                    .ok_or_else(|| format!("no user {u:?} in this image"))?,
            ),
        };
        let uid = match (u.parse::<u32>(), &entry) {
            (Ok(uid), _) => uid,
            (Err(_), Some(e)) => e.uid.as_raw(),
            (Err(_), None) => return Err(format!("no user {u:?} in this image")),
        };
        let gid = match (g, &entry) {
            (Some(g), _) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => Group::from_name(g)
                    .map_err(|e| format!("cannot read the group database: {e}"))?
                    .ok_or_else(|| format!("no group {g:?} in this image"))?
                    .gid
                    .as_raw(),
            },
            (None, Some(e)) => e.gid.as_raw(),
            (None, None) => {
                return Err(format!(
                    "uid {uid} has no passwd entry: give its group as {uid}:GID"
                ))
            }
        };
        Ok(RayUser {
            uid,
            gid,
            name: entry.as_ref().map(|e| e.name.clone()),
            home: entry.map(|e| e.dir),
        })
    }

    /// Returns true if and only if this is the agent's own user (nothing to
    /// drop).
    pub fn is_current(&self) -> bool {
        self.uid == nix::unistd::geteuid().as_raw() && self.gid == nix::unistd::getegid().as_raw()
    }
}

/// Returns this process's effective uid and gid.
pub fn current_ids() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// Makes the child of `cmd` run as `user` (when given and not the agent's
/// own) with no supplementary groups, and with `no_new_privs` in any case.
/// Sets `HOME`, `USER` and `LOGNAME` from the user's passwd entry, and
/// starts the child in that home when it is a folder.
pub fn confine(cmd: &mut Command, user: Option<&RayUser>) {
    let drop_to = user.filter(|u| !u.is_current()).map(|u| (u.uid, u.gid));
    if let Some(u) = user.filter(|u| !u.is_current()) {
        if let Some(home) = &u.home {
            cmd.env("HOME", home);
            // Ray's processes start in the Ray user's home, as on Ray's own
            // images, though PID 1 (and every `docker exec`) starts in `/`.
            if home.is_dir() {
                cmd.current_dir(home);
            }
        }
        if let Some(name) = &u.name {
            cmd.env("USER", name).env("LOGNAME", name);
        }
    }
    // SAFETY: the closure calls only setgroups, setresgid, setresuid and
    // prctl, which are async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = drop_to {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(gid, gid, gid) != 0
                    || libc::setresuid(uid, uid, uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit
/// (R-SEC-5: PID 1 holds a connection per podman call and per scrape; a
/// default soft limit of 1,024 would be the first thing a flood reaches).
/// Returns the soft limit before and after. Children inherit the raised
/// limit (Ray raises its own to the hard limit anyway).
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let (soft, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, hard))
}

/// Makes this process non-dumpable: processes of other users, and of its
/// own user without `CAP_SYS_PTRACE`, can neither ptrace it nor open its
/// `/proc/<pid>/{root,fd,mem,environ}`.
pub fn make_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl with these arguments only changes a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes this process non-dumpable when it runs as root (euid 0); a
/// process of another user is left as it is (its own user's tools, such as
/// Ray's, may read its `/proc` files).
pub fn make_non_dumpable_if_root() -> io::Result<()> {
    if nix::unistd::geteuid().is_root() {
        make_non_dumpable()?;
    }
    Ok(())
}

/// Returns true if and only if no user but root and `uid` can change what
/// `path` names: the file and every folder above it are owned by root or
/// `uid` and not writable by group or others, except a sticky folder (such
/// as /tmp), where others cannot rename or remove what they do not own.
/// Links are followed, and the folders of their targets checked too (the
/// kernel follows them the same way when the path is opened or run).
pub fn only_trusted_can_change(path: &std::path::Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    let mut links = path.to_path_buf();
    // Every link on the way is a name another user could have changed.
    loop {
        match std::fs::symlink_metadata(&links) {
            Ok(m) if m.file_type().is_symlink() => {
                if !(m.uid() == 0 || m.uid() == uid) {
                    return false;
                }
                let Some(parent) = links.parent() else { break };
                if !only_trusted_can_change(parent, uid) {
                    return false;
                }
                match std::fs::read_link(&links) {
                    Ok(t) => links = parent.join(t),
                    Err(_) => return false,
                }
            }
            _ => break,
        }
    }
    let chain: Vec<&std::path::Path> = real.ancestors().collect();
    // From / down: each owned by root or `uid`; a folder others may write
    // lets them rename what is in it, unless it is sticky (then only the
    // entry's owner may, and that owner is checked next); the last one
    // (the file) must not be writable by others at all.
    let mut parent_open_unsticky = false;
    for (i, p) in chain.iter().rev().enumerate() {
        let Ok(m) = std::fs::metadata(p) else {
            return false;
        };
        if parent_open_unsticky || !(m.uid() == 0 || m.uid() == uid) {
            return false;
        }
        let open = m.mode() & 0o022 != 0;
        if i + 1 == chain.len() && open {
            return false;
        }
        parent_open_unsticky = open && m.mode() & 0o1000 == 0;
    }
    true
}

/// What a user may do with a unix socket file, judged from its owner, group
/// and mode (the kernel's rule for `connect`: write permission).
pub fn can_connect(meta: &std::fs::Metadata, uid: u32, gids: &[u32]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode();
    if uid == 0 {
        return true;
    }
    if meta.uid() == uid {
        return mode & 0o200 != 0;
    }
    if gids.contains(&meta.gid()) {
        return mode & 0o020 != 0;
    }
    mode & 0o002 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_specs_parse_by_id_and_name() {
        assert_eq!(
            RayUser::parse("1000:100").map(|u| (u.uid, u.gid)),
            Ok((1000, 100))
        );
        let root = RayUser::parse("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(root.home, Some(PathBuf::from("/root")));
        assert_eq!(RayUser::parse("0").map(|u| u.gid), Ok(0));
        assert!(RayUser::parse("no-such-user-argus").is_err());
        assert!(RayUser::parse("root:no-such-group-argus").is_err());
        assert!(RayUser::parse(":1").is_err());
        assert!(RayUser::parse("4242").unwrap_err().contains("4242:GID"));
    }

    #[test]
    fn socket_access_follows_owner_group_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("s");
        std::fs::write(&f, "").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o660)).unwrap();
        let meta = std::fs::metadata(&f).unwrap();
        use std::os::unix::fs::MetadataExt;
        let (owner, group) = (meta.uid(), meta.gid());
        assert!(can_connect(&meta, 0, &[]));
        assert!(can_connect(&meta, owner, &[]) || owner == 0);
        assert!(can_connect(&meta, 4242, &[group]));
        assert!(!can_connect(&meta, 4242, &[4243]));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(can_connect(&std::fs::metadata(&f).unwrap(), 4242, &[]));
    }
}

#[cfg(test)]
mod trusted_tests {
    use super::only_trusted_can_change;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &std::path::Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    /// The rule: no user but root and the caller can change the file or a
    /// folder above it; links count as names on the way.
    #[test]
    fn only_folders_root_alone_can_change_are_trusted() {
        let me = nix::unistd::geteuid().as_raw();
        let other = 1000;
        // Under /tmp (sticky, open): a folder of ours, 0755.
        let top = tempfile::tempdir().unwrap();
        let bin = top.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let exe = bin.join("nvidia-smi");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        mode(top.path(), 0o755);
        mode(&bin, 0o755);
        mode(&exe, 0o755);
        assert!(only_trusted_can_change(&exe, me));
        // Writable by others: the folder, then the file itself.
        mode(&bin, 0o777);
        assert!(!only_trusted_can_change(&exe, me));
        mode(&bin, 0o775);
        assert!(!only_trusted_can_change(&exe, me));
        // A folder of another user (the Ray user's), however closed.
        mode(&bin, 0o755);
        if me == 0 {
            nix::unistd::chown(&bin, Some(nix::unistd::Uid::from_raw(other)), None).unwrap();
            assert!(!only_trusted_can_change(&exe, me), "owner not trusted");
            nix::unistd::chown(&bin, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
        }
        mode(&exe, 0o757);
        assert!(!only_trusted_can_change(&exe, me));
        mode(&exe, 0o755);
        // A folder above, open without sticky.
        mode(top.path(), 0o777);
        assert!(!only_trusted_can_change(&exe, me));
        mode(top.path(), 0o755);
        // A link from a trusted folder into an untrusted one.
        let open = top.path().join("open");
        std::fs::create_dir(&open).unwrap();
        mode(&open, 0o777);
        let real = open.join("nvidia-smi");
        std::fs::write(&real, "#!/bin/sh\n").unwrap();
        mode(&real, 0o755);
        std::fs::remove_file(&exe).unwrap();
        std::os::unix::fs::symlink(&real, &exe).unwrap();
        assert!(!only_trusted_can_change(&exe, me));
        // A link in an untrusted folder to a trusted file.
        let good = bin.join("real-smi");
        std::fs::write(&good, "#!/bin/sh\n").unwrap();
        mode(&good, 0o755);
        let via = open.join("smi");
        std::os::unix::fs::symlink(&good, &via).unwrap();
        assert!(!only_trusted_can_change(&via, me));
        // Missing: not trusted.
        assert!(!only_trusted_can_change(&bin.join("missing"), me));
    }
}

#[cfg(test)]
mod nofile_tests {
    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(256), hard).unwrap();
        let (before, after) = super::raise_nofile_limit().unwrap();
        assert_eq!(before, hard.min(256));
        assert_eq!(after, hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
    }
}
