//! The one signal thread and the one `waitpid` caller.
//!
//! [`init`] must run at the top of `main`, before any other thread exists:
//! it blocks the signals the agent handles so that every later thread
//! inherits the mask, makes the process a child subreaper when it is not
//! PID 1, and starts the thread that waits for signals and reaps children.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::panic::{self, AssertUnwindSafe};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tracing::{debug, info, warn};

use crate::stop::Stop;

/// Signals the agent receives synchronously; all of them are blocked in every
/// thread and reset to unblocked in children before `exec`.
pub const HANDLED: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGCHLD,
];

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Exit {
    /// Returns the shell-style code: the exit code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }

    /// Returns true if and only if the child exited with code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => match Signal::try_from(*s) {
                Ok(sig) => write!(f, "killed by {sig}"),
                Err(_) => write!(f, "killed by signal {s}"),
            },
        }
    }
}

type OnExit = Box<dyn FnOnce(Exit) + Send>;
type SignalSink = Box<dyn Fn(Signal) -> bool + Send>;

struct Reaper {
    /// Children the agent started, by pid. Held while spawning so that the
    /// reaper cannot reap a child before it is registered.
    children: Mutex<HashMap<i32, OnExit>>,
    /// Where signals other than SIGCHLD go; none means "exit 128+signal".
    signals: Mutex<Option<SignalSink>>,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| Reaper {
        children: Mutex::new(HashMap::new()),
        signals: Mutex::new(None),
    })
}

/// Locks `m` even if a thread panicked while holding it: the reaper must
/// keep reaping and routing signals whatever a callback did.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Returns the set of handled signals.
pub fn handled_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in HANDLED {
        set.add(s);
    }
    set
}

static STARTED: OnceLock<()> = OnceLock::new();

/// Blocks the handled signals, registers as child subreaper when not PID 1,
/// and starts the signal/reaper thread. Call first thing in `main`; later
/// calls do nothing. (In-process tests may call it too: the thread also
/// reaps every second, so a SIGCHLD delivered to another thread is not lost.)
pub fn init() -> io::Result<()> {
    if STARTED.set(()).is_err() {
        return Ok(());
    }
    signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&handled_set()), None)
        .map_err(io::Error::from)?;
    if std::process::id() != 1 {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            warn!(
                error = %io::Error::last_os_error(),
                "not PID 1 and cannot become a child subreaper: orphaned Ray processes will not be reaped; run as PID 1 or allow prctl"
            );
        }
    }
    let _ = reaper();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(signal_loop)?;
    Ok(())
}

/// Returns true if and only if `sig` asks the agent to stop (SIGTERM, SIGINT).
pub fn is_stop(sig: Signal) -> bool {
    matches!(sig, Signal::SIGTERM | Signal::SIGINT)
}

/// Routes every received signal except SIGCHLD to `sink` from now on;
/// `sink` returns false when its receiver is gone.
pub fn route_signals(sink: impl Fn(Signal) -> bool + Send + 'static) {
    *lock(&reaper().signals) = Some(Box::new(sink));
}

/// The safety net of the signal wait: after this long it reaps anyway. In
/// the binary every thread blocks the handled signals (`main` blocks them
/// before any thread starts), so a SIGCHLD stays pending until this thread
/// takes it and none is lost; the net can be long, and an idle agent rarely
/// wakes. A unit-test process has threads that do not block SIGCHLD, where
/// one can be discarded, so the net is short there ([`init_in_test`]).
static SIGNAL_WAIT_S: AtomicI64 = AtomicI64::new(if cfg!(test) { 1 } else { 120 });

/// [`init`] for a process whose other threads were started before it and
/// do not block SIGCHLD (a test harness): such a thread may take a SIGCHLD
/// and discard it, so the reaper also reaps every second.
pub fn init_in_test() -> io::Result<()> {
    SIGNAL_WAIT_S.store(1, Ordering::Relaxed);
    init()
}

fn signal_loop() {
    let set = handled_set();
    let raw: libc::sigset_t = *set.as_ref();
    loop {
        let ts = libc::timespec {
            tv_sec: SIGNAL_WAIT_S.load(Ordering::Relaxed),
            tv_nsec: 0,
        };
        // SAFETY: valid pointers to a sigset and a timespec on our stack.
        let sig = unsafe { libc::sigtimedwait(&raw, std::ptr::null_mut(), &ts) };
        if sig < 0 {
            reap_all();
            continue;
        }
        let Ok(sig) = Signal::try_from(sig) else {
            continue;
        };
        if sig == Signal::SIGCHLD {
            reap_all();
            continue;
        }
        let delivered = match lock(&reaper().signals).as_ref() {
            Some(sink) => {
                panic::catch_unwind(AssertUnwindSafe(|| sink(sig))).unwrap_or_else(|_| {
                    warn!(?sig, "the signal receiver panicked");
                    true
                })
            }
            None => false,
        };
        match delivered {
            true => {}
            false => {
                debug!(?sig, "signal with no receiver, exiting");
                std::process::exit(128 + sig as i32);
            }
        }
    }
}

/// Reaps every child that has exited, routing statuses of known children.
fn reap_all() {
    let mut children = lock(&reaper().children);
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => deliver(&mut children, pid, Exit::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                deliver(&mut children, pid, Exit::Signal(sig as i32))
            }
            Ok(WaitStatus::StillAlive) => break,
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(Errno::ECHILD) => break,
            Err(e) => {
                warn!(error = %e, "waitpid failed");
                break;
            }
        }
    }
}

fn deliver(children: &mut HashMap<i32, OnExit>, pid: Pid, exit: Exit) {
    match children.remove(&pid.as_raw()) {
        Some(f) => {
            if panic::catch_unwind(AssertUnwindSafe(|| f(exit))).is_err() {
                warn!(pid = pid.as_raw(), %exit, "a child's exit callback panicked");
            }
        }
        None => debug!(pid = pid.as_raw(), %exit, "reaped orphan"),
    }
}

/// Whether `pid` is a live child this process started through the reaper
/// (`spawn_*`): every child the agent starts is, so a child of the agent
/// that is not was adopted (its parent died and the kernel gave it to PID
/// 1). Asked after a scan of /proc that saw `pid`, the answer holds: a
/// spawn registers its child before the lock this takes is free.
pub fn is_own_child(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| lock(&reaper().children).contains_key(&p))
}

/// Prepares `cmd` so the child starts with an empty signal mask.
fn reset_mask(cmd: &mut Command) {
    // SAFETY: the closure only calls sigprocmask, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let empty = SigSet::empty();
            signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&empty), None)
                .map_err(io::Error::from)
        });
    }
}

/// Spawns `cmd` and calls `on_exit` from the reaper thread when it exits.
/// The child's signal mask is reset. `on_exit` must not block.
pub fn spawn_with(
    cmd: &mut Command,
    on_exit: impl FnOnce(Exit) + Send + 'static,
) -> io::Result<u32> {
    reset_mask(cmd);
    let mut children = lock(&reaper().children);
    let child = cmd.spawn()?;
    let pid = child.id();
    // Dropping a std Child neither waits nor kills; the reaper owns it now.
    drop(child);
    children.insert(pid as i32, Box::new(on_exit));
    Ok(pid)
}

/// Like [`spawn_with`], and returns the child's stdout when `cmd` asked
/// for a pipe there (`Stdio::piped()`): the caller reads it while the
/// reaper owns the child.
pub fn spawn_piped(
    cmd: &mut Command,
    on_exit: impl FnOnce(Exit) + Send + 'static,
) -> io::Result<(u32, Option<std::process::ChildStdout>)> {
    reset_mask(cmd);
    let mut children = lock(&reaper().children);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let stdout = child.stdout.take();
    drop(child);
    children.insert(pid as i32, Box::new(on_exit));
    Ok((pid, stdout))
}

/// How a wait for a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    Exited(Exit),
    /// The timeout passed first.
    TimedOut,
    /// A stop was requested first.
    Stopped,
}

/// A child started through the reaper. Its exit and a stop request arrive
/// on one channel (`None` is the stop).
pub struct ChildProc {
    pid: u32,
    tx: Sender<Option<Exit>>,
    rx: Receiver<Option<Exit>>,
}

/// Spawns `cmd` with its exit status routed through the reaper.
pub fn spawn(cmd: &mut Command) -> io::Result<ChildProc> {
    let (tx, rx) = mpsc::channel();
    let on_exit = tx.clone();
    let pid = spawn_with(cmd, move |exit| {
        let _ = on_exit.send(Some(exit));
    })?;
    Ok(ChildProc { pid, tx, rx })
}

impl ChildProc {
    /// Returns the child's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits up to `timeout` for the child to exit or for `stop`.
    pub fn wait_or_stop(&self, timeout: Duration, stop: &Stop) -> Waited {
        let tx = self.tx.clone();
        stop.on_request(move || {
            let _ = tx.send(None);
        });
        match self.rx.recv_timeout(timeout) {
            Ok(Some(exit)) => Waited::Exited(exit),
            Ok(None) => Waited::Stopped,
            Err(_) => Waited::TimedOut,
        }
    }

    /// Waits up to `timeout` for the child to exit (stop requests ignored).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Exit> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Some(exit)) => return Some(exit),
                Ok(None) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Kills the child's process group (the child must lead one) with
    /// SIGKILL and waits up to `timeout` for the child to exit.
    pub fn kill_group(&self, timeout: Duration) -> Option<Exit> {
        let _ = signal::killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        self.wait_timeout(timeout)
    }
}

/// What a command printed and how it ended, for short-lived helper commands.
#[derive(Debug, Clone)]
pub struct Captured {
    /// How it ended; `None` when it was killed after the timeout.
    pub exit: Option<Exit>,
    /// True if and only if the timeout fired and the child was killed.
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
}

/// Runs `cmd` to completion (stdin null, stdout and stderr captured) with a
/// timeout, through the reaper. On timeout or `stop` the child's process
/// group gets SIGKILL. Output beyond 1 MiB per stream is dropped.
pub fn spawn_captured(cmd: &mut Command, timeout: Duration, stop: &Stop) -> io::Result<Captured> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let (tx, rx) = mpsc::channel();
    let on_exit = tx.clone();
    let (mut out, mut err, pid) = {
        reset_mask(cmd);
        let mut children = lock(&reaper().children);
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let out = child.stdout.take();
        let err = child.stderr.take();
        drop(child);
        children.insert(
            pid as i32,
            Box::new(move |exit| {
                let _ = on_exit.send(Some(exit));
            }),
        );
        (out, err, pid)
    };
    let child = ChildProc { pid, tx, rx };
    let started = Instant::now();
    let read_all = |r: Option<std::process::ChildStdout>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(1 << 20).read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_t = read_all(out.take());
    let err_t = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(r) = err.take() {
            let _ = r.take(1 << 20).read_to_end(&mut buf);
        }
        buf
    });
    let (exit, timed_out) = match child.wait_or_stop(timeout, stop) {
        Waited::Exited(e) => (Some(e), false),
        Waited::TimedOut => {
            child.kill_group(Duration::from_secs(2));
            info!(pid, ?timeout, "command timed out and was killed");
            (None, true)
        }
        Waited::Stopped => {
            child.kill_group(Duration::from_secs(2));
            info!(pid, "command killed: the agent is stopping");
            (None, false)
        }
    };
    // Descendants holding the pipes open must not block us forever.
    let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    Ok(Captured {
        exit,
        timed_out,
        stdout,
        stderr,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reaper_survives_a_panicking_exit_callback_and_a_poisoned_lock() {
        init().unwrap();
        // A callback that panics runs on the reaper thread, under the lock.
        let panicked = spawn_with(&mut Command::new("true"), |_| panic!("callback panics"))
            .expect("spawn true");
        // And a thread that dies holding the lock poisons it.
        let _ = std::thread::spawn(|| {
            let _held = reaper().children.lock();
            panic!("poisons the children lock");
        })
        .join();
        assert!(reaper().children.is_poisoned());
        // The reaper still reaps and delivers exits.
        let c = spawn(&mut Command::new("true")).unwrap();
        assert_eq!(c.wait_timeout(Duration::from_secs(10)), Some(Exit::Code(0)));
        let c = spawn(Command::new("sh").args(["-c", "exit 3"])).unwrap();
        assert_eq!(c.wait_timeout(Duration::from_secs(10)), Some(Exit::Code(3)));
        assert!(!lock(&reaper().children).contains_key(&(panicked as i32)));
    }
}
