//! The pre-start hook (SPEC §8, R-HOOK-1): an executable that an image may
//! ship at `ARGUS_PRESTART_HOOK` (default `/opt/argus/ray-prestart`) to
//! prepare the node. It runs once, before Ray first starts, with a timeout
//! (`ARGUS_PRESTART_TIMEOUT_S`, default 300 s); `ARGUS_DISABLE_PRESTART=1`
//! skips it. Its output goes to the agent log line by line as it is
//! printed, so a slow hook can be followed.
//!
//! The hook runs in its own process group (a timeout kills the group)
//! through the single reaper; its stdout and stderr share one pipe that is
//! close-on-exec in the agent, so no other child can hold it open.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use tracing::{debug, info, warn};

use argus_config::HookConfig;
use argus_supervise::{spawn, Exit, Stop, Waited};

/// How many of the hook's last output lines an error quotes.
const TAIL_LINES: usize = 5;

/// Why the hook stopped the start.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The hook ran and exited non-zero (or was killed by a signal).
    #[error("pre-start hook {} failed with exit code {}{}{}", .path.display(), .exit.code(), signal_note(.exit), tail(.output_tail))]
    Failed {
        path: PathBuf,
        exit: Exit,
        output_tail: Vec<String>,
    },
    /// The hook did not finish within the timeout and was killed.
    #[error("pre-start hook {} timed out after {}s and was killed (ARGUS_PRESTART_TIMEOUT_S){}", .path.display(), .timeout.as_secs_f64(), tail(.output_tail))]
    TimedOut {
        path: PathBuf,
        timeout: Duration,
        output_tail: Vec<String>,
    },
    /// The path exists but cannot be executed (mode, a folder, bad format).
    #[error("pre-start hook {} exists but is not executable: {reason} (chmod +x it, or set ARGUS_DISABLE_PRESTART=1)", .path.display())]
    NotExecutable { path: PathBuf, reason: String },
    /// A stop was requested while the hook ran; its group was killed.
    #[error("pre-start hook {} stopped on request (its process group was killed)", .path.display())]
    Stopped { path: PathBuf },
    /// The hook could not be started for another reason.
    #[error("pre-start hook {} could not be started: {source}", .path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl HookError {
    /// Returns the agent's exit code: 78 when the hook is not executable
    /// (configuration), 0 when stopped on request, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            HookError::NotExecutable { .. } => 78,
            HookError::Stopped { .. } => 0,
            _ => 1,
        }
    }
}

fn signal_note(exit: &Exit) -> String {
    match exit {
        Exit::Code(_) => String::new(),
        Exit::Signal(_) => format!(" ({exit})"),
    }
}

fn tail(lines: &[String]) -> String {
    match lines.last() {
        Some(l) => format!("; last output: {}", crate::preflight::one_line(l)),
        None => String::new(),
    }
}

/// Runs the pre-start hook per `cfg`: skipped when disabled or absent,
/// an error when it is not executable, fails, times out or `stop` is
/// requested while it runs.
pub fn run_prestart(cfg: &HookConfig, stop: &Stop) -> Result<(), HookError> {
    if cfg.disabled {
        info!(hook = %cfg.path.display(), "prestart hook disabled by ARGUS_DISABLE_PRESTART");
        return Ok(());
    }
    run_hook(&cfg.path, cfg.timeout, cfg.run_as.as_ref(), stop)
}

/// Runs the executable at `path` if it exists, as `user` (with
/// `no_new_privs` in any case), bounded by `timeout`; a stop request kills
/// its process group at once.
pub fn run_hook(
    path: &Path,
    timeout: Duration,
    user: Option<&argus_supervise::privs::RayUser>,
    stop: &Stop,
) -> Result<(), HookError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            debug!(hook = %path.display(), "no prestart hook");
            return Ok(());
        }
        Err(e) => {
            return Err(HookError::NotExecutable {
                path: path.into(),
                reason: format!("cannot stat it: {e}"),
            })
        }
    };
    if meta.is_dir() {
        return Err(HookError::NotExecutable {
            path: path.into(),
            reason: "it is a folder".into(),
        });
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(HookError::NotExecutable {
            path: path.into(),
            reason: format!(
                "mode {:o} has no execute bit",
                meta.permissions().mode() & 0o7777
            ),
        });
    }

    let (read_end, write_end) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| HookError::Spawn {
            path: path.into(),
            source: e.into(),
        })?;
    let write_err = write_end.try_clone().map_err(|e| HookError::Spawn {
        path: path.into(),
        source: e,
    })?;
    let started = Instant::now();
    let child = {
        let mut cmd = Command::new(path);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::from(write_err))
            .process_group(0);
        argus_supervise::privs::confine(&mut cmd, user);
        // `cmd` (holding our copies of the write end) is dropped at the end
        // of this block, so the reader sees EOF when the hook's side closes.
        spawn(&mut cmd)
    };
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            return Err(match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::ENOEXEC) => HookError::NotExecutable {
                    path: path.into(),
                    reason: e.to_string(),
                },
                _ => HookError::Spawn {
                    path: path.into(),
                    source: e,
                },
            })
        }
    };
    let pid = child.pid();
    info!(hook = %path.display(), pid, timeout_s = timeout.as_secs_f64(), "running prestart hook");

    let (tail_tx, tail_rx) = mpsc::channel();
    let hook_name = path.display().to_string();
    std::thread::Builder::new()
        .name("prestart-hook-output".into())
        .spawn(move || {
            let mut tail: Vec<String> = Vec::new();
            let reader = std::fs::File::from(read_end);
            for line in
                argus_supervise::lines::bounded_lines(reader, argus_supervise::lines::LINE_MAX)
            {
                let Ok((line, _cut)) = line else { break };
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                info!(hook = %hook_name, pid, line = %line, "prestart hook output");
                if tail.len() == TAIL_LINES {
                    tail.remove(0);
                }
                tail.push(line);
            }
            let _ = tail_tx.send(tail);
        })
        .map_err(|e| HookError::Spawn {
            path: path.into(),
            source: e,
        })?;

    let waited = child.wait_or_stop(timeout, stop);
    if !matches!(waited, Waited::Exited(_)) {
        // The whole group: a hook's own children must not outlive it.
        child.kill_group(Duration::from_secs(5));
    }
    // Descendants that kept the pipe open must not stall the start forever.
    let output_tail = tail_rx
        .recv_timeout(Duration::from_secs(2))
        .unwrap_or_else(|_| {
            warn!(hook = %path.display(), pid, "prestart hook output still open after it ended (a background child holds it)");
            Vec::new()
        });
    let elapsed_ms = started.elapsed().as_millis() as u64;
    match waited {
        Waited::Stopped => {
            info!(hook = %path.display(), pid, "prestart hook killed: the agent is stopping");
            Err(HookError::Stopped { path: path.into() })
        }
        Waited::TimedOut => {
            warn!(hook = %path.display(), pid, timeout_s = timeout.as_secs_f64(), "prestart hook timed out and was killed");
            Err(HookError::TimedOut {
                path: path.into(),
                timeout,
                output_tail,
            })
        }
        Waited::Exited(e) if e.success() => {
            info!(hook = %path.display(), pid, elapsed_ms, "prestart hook succeeded");
            Ok(())
        }
        Waited::Exited(exit) => {
            warn!(hook = %path.display(), pid, exit_code = exit.code(), elapsed_ms, "prestart hook failed");
            Err(HookError::Failed {
                path: path.into(),
                exit,
                output_tail,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn script(dir: &Path, name: &str, body: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        writeln!(f, "#!/bin/sh\n{body}").unwrap();
        drop(f);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn setup() -> tempfile::TempDir {
        argus_supervise::reaper::init_in_test().unwrap();
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn absent_hook_is_skipped() {
        let d = setup();
        run_hook(
            &d.path().join("nope"),
            Duration::from_secs(5),
            None,
            &Stop::new(),
        )
        .unwrap();
    }

    #[test]
    fn successful_hook_runs_once_and_passes() {
        let d = setup();
        let marker = d.path().join("ran");
        let h = script(
            d.path(),
            "hook",
            &format!("echo out; echo err >&2; echo x >> {}", marker.display()),
            0o755,
        );
        run_hook(&h, Duration::from_secs(10), None, &Stop::new()).unwrap();
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x\n");
    }

    #[test]
    fn failing_hook_names_itself_and_its_exit_code() {
        let d = setup();
        let h = script(
            d.path(),
            "hook",
            "echo 'disk not mounted' >&2; exit 3",
            0o755,
        );
        let e = run_hook(&h, Duration::from_secs(10), None, &Stop::new()).unwrap_err();
        assert!(
            matches!(
                e,
                HookError::Failed {
                    exit: Exit::Code(3),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.exit_code(), 1);
        let line = e.to_string();
        assert!(line.contains(&h.display().to_string()), "{line}");
        assert!(line.contains("exit code 3"), "{line}");
        assert!(line.contains("disk not mounted"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn hanging_hook_is_killed_with_its_children_after_the_timeout() {
        let d = setup();
        let child_pid = d.path().join("child.pid");
        let h = script(
            d.path(),
            "hook",
            &format!("sleep 60 & echo $! > {}; wait", child_pid.display()),
            0o755,
        );
        let t = Instant::now();
        let e = run_hook(&h, Duration::from_millis(500), None, &Stop::new()).unwrap_err();
        assert!(matches!(e, HookError::TimedOut { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 1);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(e.to_string().contains("timed out"), "{e}");
        let pid: i32 = std::fs::read_to_string(&child_pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild is reaped by our reaper (subreaper); give it a moment.
        let gone = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
        });
        assert!(gone, "the hook's child {pid} survived the timeout");
    }

    #[test]
    fn non_executable_hook_is_a_configuration_error() {
        let d = setup();
        let h = script(d.path(), "hook", "exit 0", 0o644);
        let e = run_hook(&h, Duration::from_secs(5), None, &Stop::new()).unwrap_err();
        assert!(matches!(e, HookError::NotExecutable { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 78);
        let e = run_hook(d.path(), Duration::from_secs(5), None, &Stop::new()).unwrap_err();
        assert_eq!(e.exit_code(), 78, "{e}");
    }

    #[test]
    fn hook_killed_by_a_signal_reports_128_plus_signal() {
        let d = setup();
        let h = script(d.path(), "hook", "kill -9 $$", 0o755);
        let e = run_hook(&h, Duration::from_secs(5), None, &Stop::new()).unwrap_err();
        assert!(
            e.to_string().contains("exit code 137 (killed by SIGKILL)"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn disabled_hook_does_not_run() {
        let d = setup();
        let marker = d.path().join("ran");
        let h = script(
            d.path(),
            "hook",
            &format!("touch {}; exit 1", marker.display()),
            0o755,
        );
        let mut cfg = HookConfig {
            path: h,
            disabled: true,
            timeout: Duration::from_secs(10),
            as_root: false,
            run_as: None,
        };
        run_prestart(&cfg, &Stop::new()).unwrap();
        assert!(!marker.exists());
        cfg.disabled = false;
        assert!(run_prestart(&cfg, &Stop::new()).is_err());
        assert!(marker.exists());
    }
}
