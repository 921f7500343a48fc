//! Generation claims (R-HEAD-5): a head takes generation N by creating
//! `epochs/N` with O_CREAT|O_EXCL, which exactly one creator wins on local
//! file systems, NFSv3+ and GPFS. There is no stale-lock breaking: a claim
//! is never released. Only claims far below the newest are pruned
//! ([`prune_claims`]), so that `epochs/` (scanned by every claim and every
//! fencing check) stays small however many heads came and went.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::trust;

/// What failed while claiming or listing generations.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list {path}: {source}")]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Returns the folder of generation claims beside the record.
pub fn epochs_dir(head_file: &Path) -> PathBuf {
    head_file
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("epochs")
}

/// The highest generation a claim or a record may carry. Each takeover
/// adds one, so no real cluster comes near it; a larger number is forged
/// (or corrupt) and is ignored, and the next generation is checked
/// arithmetic that never wraps ([`next_generation`]).
pub const MAX_GENERATION: u64 = 1 << 48;

/// Parses a claim's file name: decimal digits only, no sign, no leading
/// zero, 1 to [`MAX_GENERATION`].
pub fn parse_generation(name: &str) -> Option<u64> {
    let plain =
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) && !name.starts_with('0');
    plain
        .then(|| name.parse::<u64>().ok())
        .flatten()
        .filter(|g| (1..=MAX_GENERATION).contains(g))
}

/// The generation after `highest` and `prev`, if it stays within
/// [`MAX_GENERATION`].
pub fn next_generation(highest: u64, prev: u64) -> Option<u64> {
    highest
        .max(prev)
        .checked_add(1)
        .filter(|g| *g <= MAX_GENERATION)
}

/// Tries to claim `generation` for `holder`; returns true if and only if
/// this call created the claim. The folder is opened through trusted
/// components ([`crate::trust`]) and the claim created in it with
/// `O_CREAT | O_EXCL | O_NOFOLLOW`.
pub fn claim_generation(dir: &Path, generation: u64, holder: &str) -> Result<bool, ClaimError> {
    let path = dir.join(generation.to_string());
    if parse_generation(&generation.to_string()).is_none() {
        return Err(ClaimError::Create {
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("generation {generation} is out of range 1-{MAX_GENERATION}"),
            ),
        });
    }
    let dir_fd = trust::open_dir(dir, true).map_err(|e| ClaimError::Create {
        path: dir.to_path_buf(),
        source: e.into(),
    })?;
    match trust::open_at(
        dir_fd.as_raw_fd(),
        std::ffi::OsStr::new(&generation.to_string()),
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    ) {
        Ok(fd) => {
            let mut f = std::fs::File::from(fd);
            let res = f
                .write_all(format!("{holder}\n").as_bytes())
                .and_then(|_| f.sync_all());
            res.map_err(|source| ClaimError::Create {
                path: path.clone(),
                source,
            })?;
            let _ = std::fs::File::from(dir_fd).sync_all();
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(ClaimError::Create { path, source }),
    }
}

/// What a listing of `epochs/` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// The highest valid claim (0 when none).
    pub highest: u64,
    /// Entries that look like claims but are not the agent's: a wrong
    /// owner, not a regular file, a number out of range or spelled with
    /// leading zeros. Each is `name: why`; they count for nothing.
    pub ignored: Vec<String>,
}

/// Lists the claims in `dir` (0 and nothing ignored when it does not
/// exist). Only regular files owned by the agent identity
/// ([`trust::agent`]) whose name is a valid generation count.
pub fn scan_generations(dir: &Path) -> Result<Scan, ClaimError> {
    let list_err = |source| ClaimError::List {
        path: dir.to_path_buf(),
        source,
    };
    let dir_fd = match trust::open_dir(dir, false) {
        Ok(fd) => fd,
        Err(e) if e.is_missing() => return Ok(Scan::default()),
        Err(e) => return Err(list_err(e.into())),
    };
    let fd = dir_fd.as_raw_fd();
    let agent = trust::agent().uid;
    let mut scan = Scan::default();
    for n in trust::list(fd).map_err(list_err)? {
        let name = n.to_string_lossy();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some(g) = parse_generation(&name) else {
            scan.ignored
                .push(format!("{name}: not a generation in 1-{MAX_GENERATION}"));
            continue;
        };
        match trust::lstat_at(fd, &n) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == agent => {
                scan.highest = scan.highest.max(g)
            }
            Ok(st) => scan.ignored.push(format!(
                "{name}: owned by uid {} (the agent is {agent}) or not a regular file",
                st.st_uid
            )),
            Err(_) => {}
        }
    }
    Ok(scan)
}

/// Returns the highest claimed generation (0 when none); see
/// [`scan_generations`].
pub fn highest_generation(dir: &Path) -> Result<u64, ClaimError> {
    scan_generations(dir).map(|s| s.highest)
}

/// How many of the newest claims [`prune_claims`] keeps.
pub const KEEP_CLAIMS: u64 = 16;

/// Removes the claims of generations more than [`KEEP_CLAIMS`] below
/// `newest` (which the caller holds); returns how many it removed. The
/// highest claims are never touched, so [`highest_generation`] stays
/// right; a head that listed the folder before the last 16 claims were
/// made cannot win an old number back either, since its publish re-checks
/// fencing. Errors are ignored: pruning is housekeeping.
pub fn prune_claims(dir: &Path, newest: u64) -> usize {
    let Some(below) = newest.checked_sub(KEEP_CLAIMS) else {
        return 0;
    };
    let Ok(dir_fd) = trust::open_dir(dir, false) else {
        return 0;
    };
    let fd = dir_fd.as_raw_fd();
    let Ok(names) = trust::list(fd) else {
        return 0;
    };
    names
        .into_iter()
        .filter(|n| {
            n.to_str()
                .and_then(parse_generation)
                .is_some_and(|g| g <= below)
        })
        .filter(|n| {
            trust::lstat_at(fd, n).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
        })
        .filter(|n| trust::unlink_at(fd, n).is_ok())
        .count()
}

/// Returns who claimed `generation`, if anyone (a claim the agent wrote).
pub fn holder_of(dir: &Path, generation: u64) -> Option<String> {
    let dir_fd = trust::open_dir(dir, false).ok()?;
    let name = generation.to_string();
    let fd = trust::open_at(
        dir_fd.as_raw_fd(),
        std::ffi::OsStr::new(&name),
        libc::O_RDONLY,
        0,
    )
    .ok()?;
    let st = trust::fstat(fd.as_raw_fd()).ok()?;
    trust::check_file(&dir.join(&name), &st).ok()?;
    let mut s = String::new();
    std::io::Read::take(std::fs::File::from(fd), 4096)
        .read_to_string(&mut s)
        .ok()?;
    Some(s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_claimant_wins_each_generation() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("epochs");
        assert_eq!(highest_generation(&d).unwrap(), 0);
        let winners: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let d = &d;
                    s.spawn(move || claim_generation(d, 1, &format!("h{i}")).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(winners.iter().filter(|w| **w).count(), 1);
        assert!(claim_generation(&d, 2, "b").unwrap());
        assert_eq!(highest_generation(&d).unwrap(), 2);
        assert_eq!(holder_of(&d, 2).as_deref(), Some("b"));
    }

    #[test]
    fn pruning_keeps_the_newest_claims_and_the_highest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("epochs");
        for g in 1..=40 {
            assert!(claim_generation(&d, g, "h").unwrap());
        }
        std::fs::write(d.join("notes.txt"), "x").unwrap();
        assert_eq!(prune_claims(&d, 40), 24);
        assert_eq!(highest_generation(&d).unwrap(), 40);
        let mut left: Vec<u64> = std::fs::read_dir(&d)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok())
            .collect();
        left.sort();
        assert_eq!(left, (25..=40).collect::<Vec<_>>());
        assert!(d.join("notes.txt").exists(), "only claims are pruned");
        // A generation already pruned cannot be claimed below the newest
        // by listing: the next claim is still above the highest.
        assert_eq!(prune_claims(&d, 10), 0);
        assert!(claim_generation(&d, highest_generation(&d).unwrap() + 1, "x").unwrap());
    }

    /// Hole 5: forged or absurd claims count for nothing, and the next
    /// generation never wraps.
    #[test]
    fn forged_and_absurd_claims_are_ignored_and_nothing_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("epochs");
        assert!(claim_generation(&d, 3, "h").unwrap());
        for name in [
            "18446744073709551615",
            "18446744073709551616",
            "0",
            "007",
            "281474976710657",
        ] {
            std::fs::write(d.join(name), "forged\n").unwrap();
        }
        std::os::unix::fs::symlink(d.join("3"), d.join("9")).unwrap();
        let scan = scan_generations(&d).unwrap();
        assert_eq!(scan.highest, 3, "{scan:?}");
        assert_eq!(scan.ignored.len(), 6, "{scan:?}");
        assert_eq!(next_generation(u64::MAX, 0), None);
        assert_eq!(next_generation(MAX_GENERATION, 0), None);
        assert_eq!(next_generation(3, 7), Some(8));
        assert!(claim_generation(&d, u64::MAX, "x").is_err());
        assert!(claim_generation(&d, 0, "x").is_err());
        if trust::Identity::current().uid == 0 {
            // A claim another uid wrote (as far as it could plant one).
            std::fs::write(d.join("999999999"), "forged\n").unwrap();
            std::os::unix::fs::chown(d.join("999999999"), Some(1000), Some(100)).unwrap();
            let scan = scan_generations(&d).unwrap();
            assert_eq!(scan.highest, 3, "{scan:?}");
            assert!(scan
                .ignored
                .iter()
                .any(|i| i.starts_with("999999999: owned by uid 1000")));
            assert_eq!(holder_of(&d, 999999999), None);
        }
        assert_eq!(holder_of(&d, 3).as_deref(), Some("h"));
    }
}
