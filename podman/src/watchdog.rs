//! A process that outlives a SIGKILLed shim and removes its container.
//!
//! The raylet SIGKILLs workers, and the shim is the worker: nothing of the
//! shim runs after that, and dockerd keeps the container running when its
//! client goes away. So each attached `run` forks this watchdog before the
//! tokio runtime exists. It holds the read end of a pipe whose write end
//! only the shim holds, and learns from it:
//! - `c`: a create request is about to be sent;
//! - `d`: the shim finished and cleaned up itself.
//!
//! EOF after `c` without `d` means the shim died with a container (or a
//! create in flight): the watchdog removes the containers labelled with the
//! shim's pid and start time, retrying until one is found or 30 s passed.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{docker, janitor};

static PIPE: OnceLock<OwnedFd> = OnceLock::new();

/// Forks the watchdog. Must run before any other thread exists. A failure
/// is a warning: the janitor sweeps remain.
pub fn spawn() {
    let (read, write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create the watchdog pipe");
            return;
        }
    };
    let pid = std::process::id();
    let start = docker::process_start(pid).unwrap_or(0);
    // SAFETY: the caller guarantees no other thread exists, so the child
    // may allocate and build a runtime of its own.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(write);
            // A handler's node lock file is the handler's alone: a copy
            // here would keep the handler's locks after a SIGKILL until
            // this watchdog ends. (In a standalone shim that number may be
            // anything, even this pipe: then it stays.)
            if read.as_raw_fd() != crate::handler::CREATE_LOCK_FD {
                // SAFETY: closes a descriptor number this process does not
                // use.
                unsafe { libc::close(crate::handler::CREATE_LOCK_FD) };
            }
            main(read, pid, start)
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            let _ = PIPE.set(write);
        }
        Err(e) => tracing::warn!(error = %e, "cannot fork the watchdog"),
    }
}

fn send(byte: u8) {
    if let Some(fd) = PIPE.get() {
        let _ = nix::unistd::write(fd, &[byte]);
    }
}

/// Tells the watchdog a create request is about to be sent.
pub fn note_create() {
    send(b'c');
}

/// Tells the watchdog the shim cleaned up after itself.
pub fn disarm() {
    send(b'd');
}

fn main(read: OwnedFd, shim_pid: u32, shim_start: u64) -> ! {
    let _ = nix::unistd::setsid();
    // Hold none of the shim's descriptors: Ray reads the probe's stdout and
    // stderr pipes to EOF.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let keep = read.as_raw_fd();
    // The Docker socket the handler opened while root (its folder is
    // root's alone, so this process cannot reach it by path).
    let socket = docker::held_socket_fd();
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        let fds: Vec<i32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        for fd in fds
            .into_iter()
            .filter(|&fd| fd > 2 && fd != keep && Some(fd) != socket)
        {
            // SAFETY: closing descriptors this fresh child does not use.
            unsafe { libc::close(fd) };
        }
    }
    let (mut created, mut done) = (false, false);
    let mut buf = [0u8; 64];
    loop {
        match nix::unistd::read(&read, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                created |= buf[..n].contains(&b'c');
                done |= buf[..n].contains(&b'd');
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    if created && !done {
        cleanup(shim_pid, shim_start);
    }
    // SAFETY: leave without running the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}

fn cleanup(shim_pid: u32, shim_start: u64) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    rt.block_on(async {
        let Ok(docker) = docker::connect().await else {
            return;
        };
        // Only this node's containers (the shim's labels, not an image's).
        let me = docker::whoami(&docker).await.ok().flatten();
        let Ok(owner) = super::owner::node_owner(me.as_ref()) else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(n) = janitor::sweep_shim(&docker, &owner, shim_pid, shim_start).await {
                if n > 0 {
                    // One more pass for a create that raced the first.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let _ = janitor::sweep_shim(&docker, &owner, shim_pid, shim_start).await;
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}
