//! Generation claims (R-HEAD-5): a head takes generation N by creating
//! `epochs/N` with O_CREAT|O_EXCL, which exactly one creator wins on local
//! file systems, NFSv3+ and GPFS. There is no stale-lock breaking: a claim
//! is never released. Only claims far below the newest are pruned
//! ([`prune_claims`]), so that `epochs/` (scanned by every claim and every
//! fencing check) stays small however many heads came and went.

use std::io::Write;
use std::path::{Path, PathBuf};

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

/// Tries to claim `generation` for `holder`; returns true if and only if
/// this call created the claim.
pub fn claim_generation(dir: &Path, generation: u64, holder: &str) -> Result<bool, ClaimError> {
    std::fs::create_dir_all(dir).map_err(|source| ClaimError::Create {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(generation.to_string());
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            let res = f
                .write_all(format!("{holder}\n").as_bytes())
                .and_then(|_| f.sync_all());
            res.map_err(|source| ClaimError::Create {
                path: path.clone(),
                source,
            })?;
            crate::publish::sync_dir(dir);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(ClaimError::Create { path, source }),
    }
}

/// Returns the highest claimed generation (0 when none).
pub fn highest_generation(dir: &Path) -> Result<u64, ClaimError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => {
            return Err(ClaimError::List {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    Ok(entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0))
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
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|g| g <= below)
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Returns who claimed `generation`, if anyone.
pub fn holder_of(dir: &Path, generation: u64) -> Option<String> {
    std::fs::read_to_string(dir.join(generation.to_string()))
        .ok()
        .map(|s| s.trim().to_string())
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
}
