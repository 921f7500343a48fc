//! Users and privileges. An engine container's identity is numbers the
//! shim decides (SPEC R-SEC-1): its create body always carries
//! `User: "UID:GID"` in decimal and an empty supplementary group list, so
//! neither the image's `/etc/passwd` nor its `/etc/group` decides anything.
//!
//! Why no supplementary groups at all: Docker resolves each `GroupAdd`
//! entry against the IMAGE's `/etc/group` by name before it reads it as a
//! number (an image with a group *named* `44` whose gid is the Docker
//! socket's turns `--group-add 44` into the socket's group: seen on Docker
//! 20.10.24), and a `User` without a gid takes the user's groups from the
//! image's `/etc/group` (`--user 1000` joins every group that lists uid
//! 1000's name there). With `User: "UID:GID"` and no `GroupAdd`, the
//! process has exactly `GID` and nothing else. So `--group-add`, in every
//! spelling including `keep-groups`, is refused (rule `groups`).
//!
//! `--user`, `--userns=keep-id:uid=,gid=` values are parsed as numbers
//! ([`parse_id`]): `0105` is 105; names, signs, blanks, hex and overflow
//! are refused (rule `users`); a bare `--user N` gets the caller's gid.
//! Which numbers are allowed is the policy's (`check_body`).

use bollard::models::HostConfig;

use super::{Context, Plan, TranslateError};
use crate::args::RunOpts;

/// Parses a uid or gid the way the shim takes them: ASCII decimal digits
/// only (leading zeros allowed: `0105` is 105), at most `u32::MAX - 1`
/// (`-1` is "no change" to the kernel). None for anything else: names,
/// `+5`, ` 5`, `0x5`, `-1`, overflow, the empty string.
pub fn parse_id(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Leading zeros could make a valid number longer than u32's digits.
    let digits = s.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if digits.len() > 10 {
        return None;
    }
    digits.parse::<u32>().ok().filter(|&n| n != u32::MAX)
}

/// Returns `UID:GID` as the create body carries it.
pub fn user_spec(uid: u32, gid: u32) -> String {
    format!("{uid}:{gid}")
}

/// Translates the user, groups, privileges and security options.
pub fn apply_user(
    o: &RunOpts,
    ctx: &Context,
    hc: &mut HostConfig,
    plan: &mut Plan,
) -> Result<(), TranslateError> {
    let refuse_user = |flag: &str, value: &str| TranslateError::Refused {
        flag: flag.into(),
        value: value.into(),
        rule: "users",
        why: "users are decimal numbers (UID or UID:GID), never names",
    };
    let mut ids: Option<(u32, u32)> = None;
    if let Some(u) = o.user.as_deref() {
        let (uid, gid) = match u.split_once(':') {
            Some((uid, gid)) => (parse_id(uid), parse_id(gid)),
            // A bare `--user N`: the caller's gid (never the image's).
            None => (parse_id(u), Some(ctx.gid)),
        };
        match (uid, gid) {
            (Some(uid), Some(gid)) => ids = Some((uid, gid)),
            _ => return Err(refuse_user("--user", u)),
        }
    }
    if let Some(ns) = o.userns.as_deref() {
        if let Some(rest) = ns.strip_prefix("keep-id") {
            if !(rest.is_empty() || rest.starts_with(':')) {
                return Err(TranslateError::Unsupported {
                    flag: "--userns".into(),
                    value: ns.into(),
                });
            }
            let (mut uid, mut gid) = (ctx.uid, ctx.gid);
            for kv in rest
                .trim_start_matches(':')
                .split(',')
                .filter(|s| !s.is_empty())
            {
                match kv.split_once('=') {
                    Some(("uid", v)) => {
                        uid = parse_id(v).ok_or_else(|| refuse_user("--userns", ns))?
                    }
                    Some(("gid", v)) => {
                        gid = parse_id(v).ok_or_else(|| refuse_user("--userns", ns))?
                    }
                    _ => {
                        return Err(TranslateError::BadValue {
                            flag: "--userns".into(),
                            value: ns.into(),
                        })
                    }
                }
            }
            // `--user` wins over keep-id, as in podman.
            ids.get_or_insert((uid, gid));
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
    let (uid, gid) = ids.unwrap_or((ctx.uid, ctx.gid));
    plan.body.user = Some(user_spec(uid, gid));
    if let Some(g) = o.group_add.first() {
        return Err(TranslateError::Refused {
            flag: "--group-add".into(),
            value: g.clone(),
            rule: "groups",
            why: "an engine container has no supplementary group: Docker would look each one up by name in the image's /etc/group",
        });
    }
    // Explicit: no supplementary group besides the primary gid.
    hc.group_add = Some(Vec::new());
    hc.privileged = Some(o.privileged);
    if !o.cap_add.is_empty() {
        hc.cap_add = Some(o.cap_add.clone());
    }
    if !o.cap_drop.is_empty() {
        hc.cap_drop = Some(o.cap_drop.clone());
    }
    // Root in an engine a non-root caller asked for (uid 0 needs
    // ARGUS_SHIM_ALLOWED_USERS=0) holds no capability but those the job
    // adds and the policy allows (ARGUS_SHIM_ALLOWED_CAPS): without
    // CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETUID and the rest, uid 0 is an
    // ordinary owner for files, so a writable bind of the shared root does
    // not let it rewrite the agent's discovery files in place or become the
    // agent's identity; without CAP_NET_RAW it cannot spoof or sniff on the
    // node's network.
    if uid == 0 && ctx.uid != 0 {
        let drop = hc.cap_drop.get_or_insert_with(Vec::new);
        if !drop.iter().any(|c| c.eq_ignore_ascii_case("ALL")) {
            drop.insert(0, "ALL".into());
        }
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

/// Spellings of `n` an attacker tries, with whether the shim takes them
/// (as the number `n`).
#[cfg(test)]
pub fn spellings(n: u32) -> Vec<(String, bool)> {
    vec![
        (format!("{n}"), true),
        (format!("0{n}"), true),
        (format!("00{n}"), true),
        (format!("+{n}"), false),
        (format!("-{n}"), false),
        (format!(" {n}"), false),
        (format!("{n} "), false),
        (format!("{n}\n"), false),
        (format!("0x{n:x}"), false),
        (format!("{n:#o}"), false),
        (format!("{n}:{n}"), false),
        (format!("{n}.0"), false),
        (format!("{n}_"), false),
        (format!("\u{0661}{n}"), false), // an Arabic-Indic digit
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_decimal_numbers_and_nothing_else() {
        for n in [0, 105, 999, 1000, 65534] {
            for (s, ok) in spellings(n) {
                assert_eq!(parse_id(&s), ok.then_some(n), "{s:?}");
            }
        }
        for name in [
            "root", "docker", "ray", "users", "nobody", "wheel", "sudo", "", "-", "_", "NaN",
        ] {
            assert_eq!(parse_id(name), None, "{name:?}");
        }
        assert_eq!(parse_id("4294967294"), Some(u32::MAX - 1));
        assert_eq!(parse_id("0004294967294"), Some(u32::MAX - 1));
        // -1 to the kernel, and overflow.
        assert_eq!(parse_id("4294967295"), None);
        assert_eq!(parse_id("4294967296"), None);
        assert_eq!(parse_id("18446744073709551616"), None);
        assert_eq!(parse_id("-1"), None);
        assert_eq!(parse_id("000"), Some(0));
    }
}
