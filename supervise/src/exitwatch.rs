//! Waits for processes that are not our children to exit, by pidfd.
//!
//! Why: the raylet and the GCS server are children of `ray start`, not of
//! the agent, so their exit raises no SIGCHLD here. Scanning `/proc` every
//! second finds it, but costs a few hundred microseconds of CPU per scan (on
//! a thousand nodes, most of the agents' steady-state CPU). Once the
//! daemons are known, one thread blocks in `poll(2)` on their pidfds
//! (readable when the process exits, zombie or not) and reports the first
//! exit; the loop then scans once to confirm. Kernels without `pidfd_open`
//! (before 5.3) return an error and the caller keeps scanning.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Watches a few processes; dropping it ends the watch.
pub struct ExitWatch {
    /// A byte written here (drop) wakes the thread.
    cancel: OwnedFd,
    /// Set on drop, before the wake: an exit the thread sees after it is
    /// not reported. (The pipe alone is not enough: a child forked
    /// elsewhere in the process holds the write end until it execs.)
    cancelled: Arc<AtomicBool>,
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&self.cancel, b"x");
    }
}

impl std::fmt::Debug for ExitWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExitWatch").finish_non_exhaustive()
    }
}

/// Returns a pidfd for `pid`.
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Returns the command name of `pid` (`/proc/PID/comm`), if it is alive.
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

impl ExitWatch {
    /// Starts watching `procs` (name and pid, as a process scan found
    /// them); calls `on_exit(name, pid)` once, for the first that exits,
    /// unless the watch was dropped first. Fails if a pidfd cannot be
    /// opened or a process is no longer the one named (its pid was reused).
    pub fn start(
        procs: &[(&'static str, u32)],
        on_exit: impl FnOnce(&'static str, u32) + Send + 'static,
    ) -> io::Result<Self> {
        let mut fds = Vec::with_capacity(procs.len());
        for &(name, pid) in procs {
            let fd = pidfd_open(pid)?;
            // The pidfd pins this pid from now on; check it is still ours.
            if comm(pid).as_deref() != Some(name) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("process {pid} is no longer {name}"),
                ));
            }
            fds.push((name, pid, fd));
        }
        let (woken, cancel) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = cancelled.clone();
        std::thread::Builder::new()
            .name("exit-watch".into())
            .spawn(move || {
                if let Some((name, pid)) = wait_first(&fds, &woken) {
                    if !flag.load(Ordering::SeqCst) {
                        on_exit(name, pid);
                    }
                }
            })?;
        Ok(Self { cancel, cancelled })
    }
}

/// Blocks until one of `fds` exits (returns it) or `cancelled` is readable.
fn wait_first(
    fds: &[(&'static str, u32, OwnedFd)],
    cancelled: &OwnedFd,
) -> Option<(&'static str, u32)> {
    loop {
        let mut polled: Vec<PollFd<'_>> = fds
            .iter()
            .map(|(_, _, fd)| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        polled.push(PollFd::new(cancelled.as_fd(), PollFlags::POLLIN));
        match poll(&mut polled, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "cannot wait for ray daemons; the scan takes over");
                return None;
            }
        }
        let ready = |p: &PollFd<'_>| p.revents().is_some_and(|r| !r.is_empty());
        if ready(&polled[fds.len()]) {
            return None;
        }
        if let Some(i) = polled[..fds.len()].iter().position(ready) {
            let (name, pid, fd) = &fds[i];
            tracing::debug!(name, pid, fd = fd.as_raw_fd(), "watched ray daemon exited");
            return Some((name, *pid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// Spawns `sleep 600` and waits until the child has exec'd (its
    /// `comm` is `sleep`): between fork and exec it still carries the test
    /// binary's name, and `start` would rightly refuse it.
    fn sleep_child() -> std::process::Child {
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while comm(child.id()).as_deref() != Some("sleep") {
            assert!(Instant::now() < deadline, "sleep never exec'd");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    #[test]
    fn reports_the_exit_of_a_watched_process_and_nothing_after_a_drop() {
        let mut a = sleep_child();
        let mut b = sleep_child();
        let (tx, rx) = mpsc::channel();
        let tx2 = tx.clone();
        let w = ExitWatch::start(&[("sleep", a.id()), ("sleep", b.id())], move |n, p| {
            tx.send((n, p)).unwrap()
        })
        .unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        b.kill().unwrap();
        // Reported while still a zombie (not yet waited for).
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            ("sleep", b.id())
        );
        drop(w);
        b.wait().unwrap();

        let w =
            ExitWatch::start(&[("sleep", a.id())], move |n, p| tx2.send((n, p)).unwrap()).unwrap();
        drop(w);
        a.kill().unwrap();
        a.wait().unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a dropped watch reports nothing"
        );
    }

    #[test]
    fn refuses_a_pid_that_is_not_the_named_process() {
        let mut c = sleep_child();
        let e = ExitWatch::start(&[("raylet", c.id())], |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("no longer raylet"), "{e}");
        c.kill().unwrap();
        c.wait().unwrap();
    }
}
