//! Reading the record: a fresh `open` + `read` every time (NFS close-to-open
//! consistency revalidates on open; `stat` may be a minute stale), a size
//! cap, and one retry on ENOENT/ESTALE within the same poll.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

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

/// Reads up to `MAX_RECORD_BYTES + 1` bytes of `path` with a fresh open:
/// its folder is opened through trusted components ([`crate::trust`]),
/// the file with `O_NOFOLLOW`, and it must be a regular file owned by the
/// agent identity ([`ReadError::Untrusted`] otherwise).
pub fn read_raw(path: &Path) -> Result<Vec<u8>, ReadError> {
    let attempt = || -> Result<Vec<u8>, ReadError> {
        let io = |source: std::io::Error| ReadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let missing = || ReadError::Missing {
            path: path.to_path_buf(),
        };
        let (dir, name) = trust::split(path).map_err(io)?;
        let dir_fd = match trust::open_dir(dir, false) {
            Ok(fd) => fd,
            Err(e) if e.is_missing() => return Err(missing()),
            Err(e) if e.is_breach() => return Err(ReadError::Untrusted(e.to_string())),
            Err(e) => return Err(io(e.into())),
        };
        let fd = match trust::open_at(dir_fd.as_raw_fd(), name, libc::O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
            Err(e)
                if e.raw_os_error() == Some(libc::ELOOP)
                    || trust::lstat_at(dir_fd.as_raw_fd(), name)
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
    };
    let retryable = |e: &ReadError| match e {
        ReadError::Missing { .. } => true,
        ReadError::Io { source, .. } => source.raw_os_error() == Some(libc::ESTALE),
        _ => false,
    };
    match attempt() {
        Err(e) if retryable(&e) => attempt(),
        other => other,
    }
}

/// Reads and validates the record at `path`, returning it with its bytes.
pub fn read_record(path: &Path) -> Result<(HeadRecord, Vec<u8>), ReadError> {
    let raw = read_raw(path)?;
    match HeadRecord::parse(&raw) {
        Ok(r) => Ok((r, raw)),
        Err(source) => Err(ReadError::Bad {
            path: path.to_path_buf(),
            raw,
            source,
        }),
    }
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
