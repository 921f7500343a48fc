//! Ray's token authentication (`RAY_AUTH_MODE=token`): which token the
//! node's Ray runs with, and how its other Ray clients find it.
//!
//! The token is, in this order: `RAY_AUTH_TOKEN` in the agent's own
//! environment (the operator's); the file `RAY_AUTH_TOKEN_PATH` names when
//! it is not the node's own copy (the operator's secret file); else the
//! cluster's, beside the discovery record ([`argus_discovery::token`]),
//! made by the first head that finds none. Ray gets it in its environment
//! (never argv); the node keeps a copy at `$ARGUS_STATE_DIR/auth_token`
//! (root's, mode 0640 with the Ray user's group), which the drain helper,
//! the actor reaper and `docker exec`'d Ray commands read through
//! `RAY_AUTH_TOKEN_PATH` (the image sets it).

use std::io::Write;
use std::path::{Path, PathBuf};

use argus_config::Config;
use argus_discovery::token;

/// The node's copy of the token, in its state folder.
pub const STATE_COPY: &str = "auth_token";

/// Where the node's copy of the token lives.
pub fn state_copy(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(STATE_COPY)
}

/// The variables every Ray client the agent starts gets (the drain helper,
/// the actor reaper): the mode, and with a token the node's copy.
pub fn client_env(cfg: &Config) -> Vec<(String, String)> {
    if cfg.ray_auth {
        vec![
            ("RAY_AUTH_MODE".into(), "token".into()),
            (
                "RAY_AUTH_TOKEN_PATH".into(),
                state_copy(cfg).to_string_lossy().into_owned(),
            ),
        ]
    } else {
        vec![("RAY_AUTH_MODE".into(), "disabled".into())]
    }
}

/// Where the token comes from when the operator gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// `RAY_AUTH_TOKEN`.
    Env(String),
    /// The file `RAY_AUTH_TOKEN_PATH` names.
    File(PathBuf),
    /// None: the cluster's own.
    Cluster,
}

/// What the operator gave, from the agent's environment values (pure).
pub fn given(env_token: Option<&str>, env_path: Option<&str>, own_copy: &Path) -> Given {
    if let Some(t) = env_token.filter(|t| !t.is_empty()) {
        return Given::Env(t.to_string());
    }
    match env_path.filter(|p| !p.is_empty()) {
        Some(p) if Path::new(p) != own_copy => Given::File(PathBuf::from(p)),
        _ => Given::Cluster,
    }
}

/// The operator's token from `given`, checked; None for the cluster's.
pub fn operator_token(given: &Given) -> Result<Option<String>, String> {
    match given {
        Given::Env(t) => token::validate(t.trim())
            .map(|_| Some(t.trim().to_string()))
            .map_err(|why| format!("RAY_AUTH_TOKEN: {why}")),
        Given::File(p) => {
            let bytes =
                read_bounded(p).map_err(|e| format!("RAY_AUTH_TOKEN_PATH {}: {e}", p.display()))?;
            token::parse(&bytes)
                .map(Some)
                .map_err(|why| format!("RAY_AUTH_TOKEN_PATH {}: {why}", p.display()))
        }
        Given::Cluster => Ok(None),
    }
}

fn read_bounded(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(p)?
        .take(token::MAX_TOKEN_LEN as u64 + 2)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// A secret kept in a file (the GCS FT Redis password): its first line,
/// at most 512 bytes, surrounding whitespace dropped; empty is an error.
pub fn read_secret(p: &Path) -> std::io::Result<String> {
    let bytes = read_bounded(p)?;
    let s = String::from_utf8_lossy(&bytes);
    let line = s.lines().next().unwrap_or_default().trim().to_string();
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "empty",
        ));
    }
    Ok(line)
}

/// Writes the node's copy: root's (the agent's), mode 0640 with group
/// `gid` (the Ray user's) or 0600 without, replaced atomically in the
/// state folder, which only the agent writes.
pub fn write_state_copy(path: &Path, token: &str, gid: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or_else(|| Path::new("/"));
    let mut f = tempfile::Builder::new()
        .prefix(".auth_token.")
        .tempfile_in(dir)?;
    let mode = if gid.is_some() { 0o640 } else { 0o600 };
    f.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    if let Some(g) = gid {
        std::os::unix::fs::fchown(f.as_file(), None, Some(g))?;
    }
    f.write_all(format!("{token}\n").as_bytes())?;
    f.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Removes the node's copy (authentication disabled).
pub fn remove_state_copy(path: &Path) {
    let _ = std::fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn the_operators_token_wins_then_their_file_then_the_clusters() {
        let own = Path::new("/run/argus/auth_token");
        let t = "a".repeat(40);
        assert_eq!(given(Some(&t), Some("/s/tok"), own), Given::Env(t.clone()));
        assert_eq!(
            given(Some(""), Some("/s/tok"), own),
            Given::File("/s/tok".into())
        );
        // The image's RAY_AUTH_TOKEN_PATH names the node's own copy: not
        // an operator's file.
        assert_eq!(
            given(None, Some("/run/argus/auth_token"), own),
            Given::Cluster
        );
        assert_eq!(given(None, Some(""), own), Given::Cluster);
        assert_eq!(given(None, None, own), Given::Cluster);
    }

    #[test]
    fn an_operators_bad_token_names_its_variable() {
        let e = operator_token(&Given::Env("short".into())).unwrap_err();
        assert!(e.starts_with("RAY_AUTH_TOKEN: "), "{e}");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("tok");
        let e = operator_token(&Given::File(p.clone())).unwrap_err();
        assert!(e.starts_with("RAY_AUTH_TOKEN_PATH "), "{e}");
        std::fs::write(&p, format!("{}\n", "b".repeat(48))).unwrap();
        assert_eq!(
            operator_token(&Given::File(p)).unwrap(),
            Some("b".repeat(48))
        );
        assert_eq!(operator_token(&Given::Cluster).unwrap(), None);
    }

    #[test]
    fn the_state_copy_is_replaced_with_its_mode_and_group() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(STATE_COPY);
        let gid = nix::unistd::getegid().as_raw();
        write_state_copy(&p, &"c".repeat(40), Some(gid)).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o640);
        assert_eq!(m.gid(), gid);
        write_state_copy(&p, &"d".repeat(40), None).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o600);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{}\n", "d".repeat(40))
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        remove_state_copy(&p);
        assert!(!p.exists());
    }
}
