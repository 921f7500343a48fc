//! The agent's side of one `podman` call: a process the broker starts per
//! connection (`argus-agent __shim-handler SETTINGS`, the connection on
//! descriptor 3), so PID 1 never reads from a client and never blocks on
//! one.
//!
//! It receives the client's standard streams, request and signals, takes
//! the client's identity from the kernel (`SO_PEERCRED`, its groups from
//! `/proc`), and then becomes the client for everything but the Docker
//! socket: the client's uid and gid, the socket's group as its only
//! supplementary group, the client's working directory; its environment is
//! this node's shim settings alone, the client's being data for the
//! container (R-SEC-8). Changing credentials leaves it
//! non-dumpable, so the Ray user can neither ptrace it nor open its
//! `/proc/<pid>/fd`. Then it runs the shim exactly as the standalone
//! `podman` would and sends back the exit code. A client that vanishes
//! (the raylet SIGKILLs workers) closes the connection: the handler kills
//! itself, and the watchdog it forked removes the container at once.
//!
//! Its report to the broker (command, exit code, refusal rule, containers
//! created and swept) goes on descriptor 4 ([`report::REPORT_FD`]), once,
//! at the end of the call or just before it kills itself.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::report;
use super::runner::FORWARDED;
use super::settings::NodeSettings;
use super::transport::{self, Request, ToAgent, ToClient};
use crate::call::Caller;
use crate::error::EXIT_SHIM;
use argus_podman_core::docker_host::DockerHost;
use argus_supervise::privs;

/// The descriptor the broker passes the connection on.
pub const CONNECTION_FD: i32 = 3;

/// The descriptor the broker passes this call's own opening of the node's
/// lock file on (`shim-create.lock` in the state folder, root's; see
/// [`super::nodelock`]): a call that counts its job's engine containers and
/// creates one holds its create lock meanwhile (`runner::job_slot`), so two
/// calls of one job cannot both take the last place, and a `logs -f` holds
/// two follow slots while it follows. An opening of its own per call: the
/// locks belong to openings, not processes.
pub const CREATE_LOCK_FD: i32 = 5;

/// How long a client may take to send its whole request (R-SEC-5): a
/// deadline for all reads together, not per read, so a client that sends
/// one byte now and then is dropped all the same.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(3);

/// Serves the call on [`CONNECTION_FD`]; `init_log` installs the log
/// subscriber once stderr is the client's. Returns the exit code.
/// `lifetime` is the broker's `PID:START` of the process a detached
/// container of this call lives as long as (`broker::lifetime_owner`);
/// `job` the broker's eight hex digits of the Ray job whose own code made
/// the call (`broker::share_of`; `-` or absent: none).
pub fn serve(
    settings: &Path,
    lifetime: Option<&str>,
    job: Option<&str>,
    init_log: impl FnOnce(),
) -> u8 {
    let _ = privs::make_non_dumpable();
    report::take_fd();
    // The create lock stays this process's alone: no program it runs
    // inherits it (a lock held by an opening lasts while any copy of it
    // is open).
    // SAFETY: F_SETFD on a descriptor number; harmless when it is not open.
    unsafe { libc::fcntl(CREATE_LOCK_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the broker passes the connection on this descriptor, and
    // nothing else in this process owns it.
    let sock = unsafe { UnixStream::from_raw_fd(CONNECTION_FD) };
    let (args, mut caller) = match become_client(&sock, settings) {
        Ok(args) => args,
        Err(e) => {
            let _ = transport::send(
                &sock,
                &ToClient {
                    code: EXIT_SHIM,
                    error: Some(e),
                },
            );
            report::send(EXIT_SHIM);
            return EXIT_SHIM;
        }
    };
    caller.lifetime = lifetime.and_then(parse_lifetime);
    caller.job = job.and_then(parse_job);
    init_log();
    let done = Arc::new(AtomicBool::new(false));
    let code = super::run_here(&args, caller, || relay_signals(&sock, done.clone()));
    done.store(true, Ordering::SeqCst);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let _ = transport::send(&sock, &ToClient { code, error: None });
    // After the answer: the broker reads the report once this process
    // has exited, so it costs the client nothing.
    report::send(code);
    code
}

/// Reads the broker's job: exactly eight hex digits, as a number.
fn parse_job(s: &str) -> Option<u32> {
    (s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(s, 16).ok())?
}

/// Reads the broker's `PID:START` (decimal numbers) of a call's lifetime
/// owner.
fn parse_lifetime(s: &str) -> Option<(u32, u64)> {
    let (pid, start) = s.split_once(':')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// Reads the request and takes on the client's identity; returns its
/// podman arguments, or the error to send back.
fn become_client(sock: &UnixStream, settings: &Path) -> Result<(Vec<String>, Caller), String> {
    let (pid, uid, gid) = transport::peer(sock).map_err(|e| format!("no peer credentials: {e}"))?;
    let (fds, req) = read_request(sock)?;
    let groups = groups_of(pid, uid)?;
    // The caller's own limits bound its `--ulimit`s (not this process's,
    // which are PID 1's).
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .map_err(|e| format!("cannot read the caller's limits: {e}"))?;
    let ulimits = argus_podman_core::policy::parse_proc_limits(&limits);
    let node = NodeSettings::read(settings).map_err(|e| e.to_string())?;
    if nix::unistd::geteuid().is_root() && uid != 0 {
        let socket_gid = docker_socket_gid(&node);
        // While still root: the socket's folder is root's alone.
        if let Some(path) = node_docker_host(&node).socket_path() {
            if let Err(e) = super::docker::hold_socket(path) {
                return Err(format!("cannot open the Docker socket {path}: {e}"));
            }
        }
        // SAFETY: plain credential system calls on this process; the only
        // other thread that may exist is none (the handler is new).
        let ok = unsafe {
            let list: Vec<libc::gid_t> = socket_gid.into_iter().collect();
            libc::setgroups(list.len(), list.as_ptr()) == 0
                && libc::setresgid(gid, gid, gid) == 0
                && libc::setresuid(uid, uid, uid) == 0
        };
        if !ok {
            return Err(format!(
                "cannot take the caller's identity {uid}:{gid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let _ = privs::make_non_dumpable();
    }
    std::env::set_current_dir(&req.cwd)
        .map_err(|e| format!("cannot enter the caller's folder {}: {e}", req.cwd))?;
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: dup2 onto the standard descriptors.
        if unsafe { libc::dup2(fd.as_raw_fd(), i as i32) } < 0 {
            return Err(format!("dup2: {}", std::io::Error::last_os_error()));
        }
    }
    drop(fds);
    let env = caller_env(req.env);
    // This process's environment is the node's settings and a fixed PATH,
    // nothing of the caller's (R-SEC-8): a caller's `ARGUS_SHIM_LOG`,
    // `RUST_LOG` or `DOCKER_HOST` steers nothing here. Its variables stay
    // data for the container (`-e NAME`, `--env-host`).
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    std::env::set_var("PATH", HANDLER_PATH);
    super::settings::apply(&node);
    for name in node.differences(|k| var_of(&env, k)) {
        if var_of(&env, name).is_some() {
            // Logged once the subscriber exists; the variable names are enough.
            eprintln!(
                "WARN the caller's {name} is ignored: the shim uses this node's settings ({})",
                settings.display()
            );
        }
    }
    Ok((
        req.args,
        Caller {
            groups,
            ulimits,
            env,
            lifetime: None,
            job: None,
        },
    ))
}

/// The handler's `PATH`: the system's folders, never the caller's.
const HANDLER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The caller's environment as the request carried it, less entries no
/// environment can hold (an empty name, `=` in a name, a NUL anywhere).
fn caller_env(env: Vec<(String, String)>) -> Vec<(String, String)> {
    env.into_iter()
        .filter(|(k, v)| {
            !k.is_empty() && !k.contains('=') && !k.contains('\0') && !v.contains('\0')
        })
        .collect()
}

/// The value of `name` in `env` (the last, as a process's environment
/// would hold it).
fn var_of(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// Reads the client's descriptors and request within [`REQUEST_DEADLINE`]:
/// a timer thread shuts the socket's reading side at the deadline, which
/// ends any read under way. The thread is joined before this returns (the
/// handler forks its watchdog later, with no other thread).
fn read_request(sock: &UnixStream) -> Result<([std::os::fd::OwnedFd; 3], Request), String> {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let timer_sock = sock.try_clone().map_err(|e| e.to_string())?;
    let timer = std::thread::spawn(move || {
        let expired = matches!(
            wait.recv_timeout(REQUEST_DEADLINE),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        );
        if expired {
            let _ = timer_sock.shutdown(std::net::Shutdown::Read);
        }
        expired
    });
    // Also per read, in case the shutdown comes too late for a read.
    let _ = sock.set_read_timeout(Some(REQUEST_DEADLINE));
    let got = transport::recv_fds(sock).and_then(|fds| Ok((fds, transport::recv(sock)?)));
    let _ = done.send(());
    let expired = timer.join().unwrap_or(true);
    sock.set_read_timeout(None).map_err(|e| e.to_string())?;
    match got {
        Ok(r) if !expired => Ok(r),
        Ok(_) => Err(format!(
            "no request within {} s",
            REQUEST_DEADLINE.as_secs()
        )),
        Err(_) if expired => Err(format!(
            "no request within {} s",
            REQUEST_DEADLINE.as_secs()
        )),
        Err(e) => Err(format!("bad request: {e}")),
    }
}

/// Returns the supplementary groups of process `pid`, checking that it
/// runs as `uid` (the pid comes from the kernel, so only a reused pid could
/// differ).
fn groups_of(pid: i32, uid: u32) -> Result<Vec<u32>, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read the caller's groups: {e}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .unwrap_or_default()
    };
    if field("Uid:").first() != Some(&uid) {
        return Err(format!("the caller (pid {pid}) changed while connecting"));
    }
    Ok(field("Groups:"))
}

/// Returns the group of this node's Docker socket (from its settings).
pub fn docker_socket_gid(node: &NodeSettings) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let path = node_docker_host(node).socket_path()?.to_string();
    std::fs::metadata(path).ok().map(|m| m.gid())
}

/// Returns the node's daemon, from its settings.
fn node_docker_host(node: &NodeSettings) -> DockerHost {
    DockerHost::parse(node.values.get("DOCKER_HOST").map(String::as_str))
}

/// Relays the client's signals to this process (the shim forwards them to
/// the container); when the client vanishes, kills this process so the
/// watchdog removes the container.
fn relay_signals(sock: &UnixStream, done: Arc<AtomicBool>) {
    let Ok(sock) = sock.try_clone() else {
        return;
    };
    std::thread::spawn(move || loop {
        match transport::recv::<ToAgent>(&sock) {
            Ok(ToAgent::Signal(n)) => {
                let known = n == libc::SIGWINCH || FORWARDED.iter().any(|&(f, _)| f == n);
                if known {
                    // SAFETY: a signal to this process.
                    unsafe { libc::kill(libc::getpid(), n) };
                }
            }
            Err(_) => {
                if !done.load(Ordering::SeqCst) {
                    // The call ends here, as a SIGKILLed podman's would.
                    report::send(128 + libc::SIGKILL as u8);
                    // SAFETY: ends this process; the watchdog sees it.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_environment_is_kept_as_data_less_what_no_environment_holds() {
        let pairs = |l: &[(&str, &str)]| {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let env = caller_env(pairs(&[
            ("RAY_RAYLET_PID", "12"),
            ("", "x"),
            ("A=B", "x"),
            ("NUL\0", "x"),
            ("V", "a\0b"),
            ("ARGUS_SHIM_LOG", "trace"),
            ("RAY_RAYLET_PID", "13"),
        ]));
        assert_eq!(
            env,
            pairs(&[
                ("RAY_RAYLET_PID", "12"),
                ("ARGUS_SHIM_LOG", "trace"),
                ("RAY_RAYLET_PID", "13"),
            ])
        );
        assert_eq!(var_of(&env, "RAY_RAYLET_PID").as_deref(), Some("13"));
        assert_eq!(var_of(&env, "PATH"), None);
    }
}
