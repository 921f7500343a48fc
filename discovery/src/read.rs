//! Reading the record: a fresh `open` + `read` every time (NFS close-to-open
//! consistency revalidates on open; `stat` may be a minute stale), a size
//! cap, and one retry on ENOENT/ESTALE within the same poll. A worker's
//! polls hold the record's verified folder open between reads
//! ([`RecordFile`]).

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::trust;

use crate::record::{HeadRecord, RecordError, MAX_RECORD_BYTES};

/// Why the record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: no such file")]
    Missing { path: PathBuf },
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file, or a folder on its way, is not the agent's: a forged
    /// record to log and ignore (R-SEC-2), never to act on.
    #[error("{0}")]
    Untrusted(String),
    #[error("{path}: invalid head record: {source}")]
    Bad {
        path: PathBuf,
        /// The bytes read, so a lease can still observe changes.
        raw: Vec<u8>,
        #[source]
        source: RecordError,
    },
}

impl ReadError {
    /// Returns true if and only if the file does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, ReadError::Missing { .. })
    }
}

/// Opens `path`'s folder through trusted components ([`crate::trust`]).
fn open_folder(path: &Path) -> Result<(OwnedFd, &OsStr), ReadError> {
    let io = |source: std::io::Error| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (dir, name) = trust::split(path).map_err(io)?;
    match trust::open_dir(dir, false) {
        Ok(fd) => Ok((fd, name)),
        Err(e) if e.is_missing() => Err(ReadError::Missing {
            path: path.to_path_buf(),
        }),
        Err(e) if e.is_breach() => Err(ReadError::Untrusted(e.to_string())),
        Err(e) => Err(io(e.into())),
    }
}

/// Reads up to `MAX_RECORD_BYTES + 1` bytes of the file `name` in the
/// verified folder `dir` with a fresh open: `O_NOFOLLOW`, and it must be a
/// regular file owned by the agent identity ([`ReadError::Untrusted`]
/// otherwise). `path` is for messages.
fn read_in(dir: RawFd, name: &OsStr, path: &Path) -> Result<Vec<u8>, ReadError> {
    let io = |source: std::io::Error| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let fd = match trust::open_at(dir, name, libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReadError::Missing {
                path: path.to_path_buf(),
            })
        }
        Err(e)
            if e.raw_os_error() == Some(libc::ELOOP)
                || trust::lstat_at(dir, name)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) =>
        {
            return Err(ReadError::Untrusted(format!(
                "{} is a symlink: ignored",
                path.display()
            )))
        }
        Err(e) => return Err(io(e)),
    };
    let st = trust::fstat(fd.as_raw_fd()).map_err(io)?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        return Err(io(std::io::Error::from_raw_os_error(libc::EISDIR)));
    }
    trust::check_file(path, &st).map_err(|e| ReadError::Untrusted(e.to_string()))?;
    let mut buf = Vec::with_capacity(1024);
    std::fs::File::from(fd)
        .take(MAX_RECORD_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(io)?;
    Ok(buf)
}

/// Whether a failed read is worth one more try within the same poll (a
/// rename under way; NFS's stale handle).
fn retryable(e: &ReadError) -> bool {
    match e {
        ReadError::Missing { .. } => true,
        ReadError::Io { source, .. } => source.raw_os_error() == Some(libc::ESTALE),
        _ => false,
    }
}

/// Reads up to `MAX_RECORD_BYTES + 1` bytes of `path` with a fresh open:
/// its folder is opened through trusted components ([`crate::trust`]),
/// the file with `O_NOFOLLOW`, and it must be a regular file owned by the
/// agent identity ([`ReadError::Untrusted`] otherwise).
pub fn read_raw(path: &Path) -> Result<Vec<u8>, ReadError> {
    let attempt = || {
        let (dir, name) = open_folder(path)?;
        read_in(dir.as_raw_fd(), name, path)
    };
    match attempt() {
        Err(e) if retryable(&e) => attempt(),
        other => other,
    }
}

/// How long a held folder may show the same record before it is walked
/// again: a live head changes the record at every refresh (10 s by
/// default), so a folder of a live head is never walked again; a record
/// unchanged for longer may be in a folder that was replaced (moved away
/// and made again), which a new walk finds well inside any TTL.
pub const REWALK_UNCHANGED: Duration = Duration::from_secs(15);

/// One record file read again and again (a worker's polls), its folder
/// held open between reads: walking `/a/b/.../discovery/<cluster>` through
/// trusted components costs an open, an fstat and a close per component,
/// most of an idle worker's system calls. The folder is walked once,
/// resolved to a descriptor that no later rename can redirect, and walked
/// again after a failed read (a missing or unreadable file, a stale NFS
/// handle) or when the record has not changed for [`REWALK_UNCHANGED`].
/// The file itself is opened afresh every time (NFS close-to-open).
pub struct RecordFile {
    path: PathBuf,
    rewalk: Duration,
    held: Option<OwnedFd>,
    last: Vec<u8>,
    changed_at: Instant,
}

impl RecordFile {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            rewalk: REWALK_UNCHANGED,
            held: None,
            last: Vec::new(),
            changed_at: Instant::now(),
        }
    }

    /// Reads and validates the record, as [`read_record`] does.
    pub fn read(&mut self) -> Result<(HeadRecord, Vec<u8>), ReadError> {
        let raw = self.read_raw()?;
        parse(&self.path, raw)
    }

    fn read_raw(&mut self) -> Result<Vec<u8>, ReadError> {
        let now = Instant::now();
        if now.saturating_duration_since(self.changed_at) >= self.rewalk {
            self.held = None;
        }
        let (_, name) = trust::split(&self.path).map_err(|source| ReadError::Io {
            path: self.path.clone(),
            source,
        })?;
        if let Some(dir) = &self.held {
            if let Ok(raw) = read_in(dir.as_raw_fd(), name, &self.path) {
                self.seen(&raw, now);
                return Ok(raw);
            }
            self.held = None;
        }
        let mut attempt = || {
            let (dir, name) = open_folder(&self.path)?;
            let raw = read_in(dir.as_raw_fd(), name, &self.path);
            if raw.is_ok() {
                self.held = Some(dir);
            }
            raw
        };
        let raw = match attempt() {
            Err(e) if retryable(&e) => attempt(),
            other => other,
        }?;
        self.seen(&raw, now);
        Ok(raw)
    }

    fn seen(&mut self, raw: &[u8], now: Instant) {
        if raw != self.last.as_slice() {
            self.last = raw.to_vec();
            self.changed_at = now;
        }
    }
}

fn parse(path: &Path, raw: Vec<u8>) -> Result<(HeadRecord, Vec<u8>), ReadError> {
    match HeadRecord::parse(&raw) {
        Ok(r) => Ok((r, raw)),
        Err(source) => Err(ReadError::Bad {
            path: path.to_path_buf(),
            raw,
            source,
        }),
    }
}

/// Reads and validates the record at `path`, returning it with its bytes.
pub fn read_record(path: &Path) -> Result<(HeadRecord, Vec<u8>), ReadError> {
    parse(path, read_raw(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::publish;
    use crate::record::tests::sample;

    #[test]
    fn missing_garbage_and_oversize_are_distinguished() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("head.json");
        assert!(read_record(&p).unwrap_err().is_missing());
        std::fs::write(&p, b"garbage").unwrap();
        assert!(matches!(read_record(&p), Err(ReadError::Bad { .. })));
        std::fs::write(&p, vec![b'{'; MAX_RECORD_BYTES * 3]).unwrap();
        match read_record(&p) {
            Err(ReadError::Bad {
                raw,
                source: RecordError::TooLarge { .. },
                ..
            }) => {
                assert_eq!(raw.len(), MAX_RECORD_BYTES + 1)
            }
            other => panic!("{other:?}"),
        }
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let e = read_record(&dir.path().join("d")).unwrap_err();
        assert!(matches!(e, ReadError::Io { .. }), "{e:?}");
        publish(&p, &sample().to_bytes()).unwrap();
        assert_eq!(read_record(&p).unwrap().0, sample());
    }

    /// The held folder is the one walked, whatever is renamed or planted at
    /// its path later, until the record goes unchanged for the rewalk
    /// period or a read through it fails; then the path is walked again
    /// (and a planted symlink on it is refused, as on every walk).
    #[test]
    fn a_record_file_holds_its_folder_and_walks_again_when_stale_or_failing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("discovery");
        std::fs::create_dir(&dir).unwrap();
        let p = dir.join("head.json");
        let mut a = sample();
        a.generation = 1;
        publish(&p, &a.to_bytes()).unwrap();
        let mut f = RecordFile::new(p.clone());
        f.rewalk = Duration::from_secs(3600);
        assert_eq!(f.read().unwrap().0.generation, 1);

        // The folder moved away and made again with another record: the
        // held folder is still read (resolved once), and still changes.
        std::fs::rename(&dir, root.path().join("old")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let mut b = sample();
        b.generation = 2;
        publish(&p, &b.to_bytes()).unwrap();
        assert_eq!(f.read().unwrap().0.generation, 1, "the held folder");
        a.generation = 3;
        publish(&root.path().join("old/head.json"), &a.to_bytes()).unwrap();
        assert_eq!(f.read().unwrap().0.generation, 3, "the held folder's news");

        // A read through the held folder that fails walks the path again.
        std::fs::remove_file(root.path().join("old/head.json")).unwrap();
        assert_eq!(
            f.read().unwrap().0.generation,
            2,
            "walked again after a miss"
        );

        // Unchanged for the rewalk period: walked again, and a symlink
        // planted in place of the folder is refused, not followed.
        std::fs::rename(&dir, root.path().join("other")).unwrap();
        std::os::unix::fs::symlink(root.path().join("other"), &dir).unwrap();
        assert_eq!(f.read().unwrap().0.generation, 2, "still held");
        f.rewalk = Duration::ZERO;
        let e = f.read().unwrap_err();
        assert!(
            matches!(e, ReadError::Untrusted(_) | ReadError::Io { .. }),
            "a symlinked folder must not be read: {e:?}"
        );
    }

    /// Hole 5: a record the agent did not write (another owner, a link)
    /// is never taken, however valid its bytes.
    #[test]
    fn a_record_the_agent_did_not_write_is_untrusted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("head.json");
        let real = dir.path().join("elsewhere.json");
        publish(&real, &sample().to_bytes()).unwrap();
        std::os::unix::fs::symlink(&real, &p).unwrap();
        assert!(matches!(read_record(&p), Err(ReadError::Untrusted(_))));
        std::fs::remove_file(&p).unwrap();
        if crate::trust::Identity::current().uid == 0 {
            publish(&p, &sample().to_bytes()).unwrap();
            std::os::unix::fs::chown(&p, Some(1000), Some(100)).unwrap();
            let e = read_record(&p).unwrap_err();
            assert!(matches!(e, ReadError::Untrusted(_)), "{e}");
            assert!(e.to_string().contains("uid 1000"), "{e}");
        }
    }

    /// A publisher refreshing thousands of times while readers read
    /// continuously never yields a partial or invalid record.
    #[test]
    fn concurrent_readers_never_see_partial_records() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("head.json");
        let mut r = sample();
        // Long records make a torn write likely if the publish were not atomic.
        r.job_server_url = format!("http://10.0.0.5:8265/{}", "x".repeat(400));
        publish(&p, &r.to_bytes()).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let p = p.clone();
                let done = done.clone();
                std::thread::spawn(move || {
                    let (mut reads, mut last_seq) = (0u64, 0u64);
                    while !done.load(Ordering::Relaxed) {
                        let (rec, _) = read_record(&p).unwrap_or_else(|e| panic!("reader saw {e}"));
                        assert!(rec.seq >= last_seq, "seq went backwards");
                        last_seq = rec.seq;
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for seq in r.seq..r.seq + 3000 {
            r.seq = seq;
            publish(&p, &r.to_bytes()).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let total: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(total > 100, "readers barely ran: {total}");
    }
}
