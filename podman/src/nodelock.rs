//! The node's lock file, as one call of the broker sees it: PID 1 opens
//! `shim-create.lock` (root's state folder) for each handler separately
//! and passes that opening on [`CREATE_LOCK_FD`]; the handler takes
//! open-file-description byte-range locks on it (`F_OFD_SETLK`: they
//! belong to the opening, so two calls exclude each other, and they go
//! when the last copy of the opening is closed, the handler's exit at the
//! latest). Which bytes mean what is argus-podman-core's decision
//! ([`argus_podman_core::policy::follow_slots`]); this is the I/O:
//! - byte 0, the create lock: held from the count of a job's engines until
//!   its container exists (`runner::job_slot`);
//! - the follow slots: one of its share's and one of the node's held by a
//!   `podman logs -f` for as long as it follows (R-SEC-5: Docker's
//!   json-file follower holds one of the host's root inotify instances).
//!
//! A standalone shim has no such descriptor: no lock, no bound.

use std::ops::Range;
use std::time::{Duration, Instant};

use argus_podman_core::policy::{follow_slots, follows_per_share, PolicyError};

use crate::error::ShimError;
use crate::handler::CREATE_LOCK_FD;

/// How long a call waits for the create lock before it fails.
pub const CREATE_LOCK_WAIT: Duration = Duration::from_secs(120);

/// A byte-range lock this call holds on the node's lock file, released
/// when dropped.
#[derive(Debug)]
pub struct Held {
    fd: i32,
    byte: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = ofd_lock(self.fd, self.byte, libc::F_UNLCK as libc::c_short);
    }
}

/// Whether the broker passed this call an opening of the lock file.
fn passed() -> bool {
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    unsafe { libc::fcntl(CREATE_LOCK_FD, libc::F_GETFD) >= 0 }
}

/// Sets (`F_WRLCK`) or clears (`F_UNLCK`) the lock on one byte of the
/// opening `fd`, without waiting; `Ok(false)` when another opening holds it.
fn ofd_lock(fd: i32, byte: u64, kind: libc::c_short) -> std::io::Result<bool> {
    // SAFETY: an all-zero flock is a valid value; the fields that matter
    // are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    // l_pid must be 0 for OFD locks.
    // SAFETY: F_OFD_SETLK reads the flock this function owns.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

fn io_error(source: std::io::Error) -> ShimError {
    ShimError::Io {
        path: "shim-create.lock".into(),
        source,
    }
}

/// The first free byte of `range`, now locked by the opening `fd`; None
/// when every one is held.
fn first_free(fd: i32, range: Range<u64>) -> Result<Option<Held>, ShimError> {
    for byte in range {
        if ofd_lock(fd, byte, libc::F_WRLCK as libc::c_short).map_err(io_error)? {
            return Ok(Some(Held { fd, byte }));
        }
    }
    Ok(None)
}

/// Takes the node's create lock once it is free, waiting at most
/// [`CREATE_LOCK_WAIT`]. `None` when the broker passed no lock file (a
/// standalone shim, which has no job).
pub async fn create() -> Result<Option<Held>, ShimError> {
    if !passed() {
        return Ok(None);
    }
    let until = Instant::now() + CREATE_LOCK_WAIT;
    loop {
        if let Some(held) = first_free(CREATE_LOCK_FD, 0..1)? {
            return Ok(Some(held));
        }
        if Instant::now() > until {
            return Err(io_error(std::io::Error::from_raw_os_error(
                libc::EWOULDBLOCK,
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `podman logs -f`'s two slots, held while it follows.
#[derive(Debug)]
pub struct Following {
    _share: Held,
    _node: Held,
}

/// Takes a follow slot of `job`'s share (None: the callers outside any
/// job) and one of the node's `max`, at once or not at all: refused with
/// rule `log-follows` when either is full. `None` when there is no bound
/// (a standalone shim, or `max` 0).
pub fn follow(job: Option<u32>, max: usize) -> Result<Option<Following>, ShimError> {
    if max == 0 || !passed() {
        return Ok(None);
    }
    follow_on(CREATE_LOCK_FD, job, max).map(Some)
}

/// [`follow`] on the opening `fd`.
fn follow_on(fd: i32, job: Option<u32>, max: usize) -> Result<Following, ShimError> {
    let slots = follow_slots(job, max);
    let share = job.map_or_else(
        || "callers outside any Ray job".to_string(),
        |j| format!("Ray job {j:08x}"),
    );
    let refused = |held: usize, share: String| -> ShimError {
        PolicyError::LogFollows {
            share,
            held,
            max: follows_per_share(max),
            node: max,
        }
        .into()
    };
    let Some(own) = first_free(fd, slots.share.clone())? else {
        return Err(refused(slots.share.clone().count(), share));
    };
    // Dropping `own` on the way out gives its slot back.
    let Some(node) = first_free(fd, slots.node.clone())? else {
        return Err(refused(max, "this node's callers".into()));
    };
    Ok(Following {
        _share: own,
        _node: node,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, OwnedFd};

    /// `n` openings of one lock file: `n` calls, as the broker passes them.
    fn openings(dir: &tempfile::TempDir, n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(dir.path().join("shim-create.lock"))
                    .unwrap()
                    .into()
            })
            .collect()
    }

    fn rule(r: Result<Following, ShimError>) -> Option<&'static str> {
        r.err().and_then(|e| crate::error::refusal_rule(&e))
    }

    #[test]
    fn follows_are_bounded_per_job_and_per_node_and_come_back_when_a_call_ends() {
        let dir = tempfile::tempdir().unwrap();
        let calls = openings(&dir, 24);
        let fd = |i: usize| calls[i].as_raw_fd();
        // 16 on the node, 4 per job: job 1 holds four, its fifth is refused.
        let mut held: Vec<Following> = (0..4)
            .map(|i| follow_on(fd(i), Some(1), 16).unwrap())
            .collect();
        assert_eq!(rule(follow_on(fd(4), Some(1), 16)), Some("log_follows"));
        // Jobs 2, 3 and the callers outside any job take the other twelve.
        for (k, job) in [Some(2), Some(3), None].into_iter().enumerate() {
            for i in 0..4 {
                held.push(follow_on(fd(5 + 4 * k + i), job, 16).unwrap());
            }
        }
        // The node is full: job 4, which holds none, is refused.
        assert_eq!(rule(follow_on(fd(17), Some(4), 16)), Some("log_follows"));
        // Its refusal gave its own share's slot back, and one of job 2's
        // ending frees a node slot: job 4 follows, and job 2, below its
        // share now, finds the node full again.
        drop(held.remove(4));
        let j4 = follow_on(fd(17), Some(4), 16).unwrap();
        assert_eq!(rule(follow_on(fd(18), Some(2), 16)), Some("log_follows"));
        // A call's opening closed (its handler gone, however it ended)
        // frees its slots with no unlock: of the two node slots free here,
        // the closed call's is free again.
        drop(j4);
        let closed = openings(&dir, 1).remove(0);
        std::mem::forget(follow_on(closed.as_raw_fd(), Some(5), 16).unwrap());
        drop(closed);
        let _a = follow_on(fd(19), Some(6), 16).unwrap();
        assert_eq!(rule(follow_on(fd(20), Some(7), 16)), Some("log_follows"));
        // The create lock's byte is none of the slots.
        let create = first_free(fd(21), 0..1).unwrap();
        assert!(create.is_some());
        assert!(first_free(fd(22), 0..1).unwrap().is_none());
    }
}
