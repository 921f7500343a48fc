//! `podman` as Ray runs it under a node agent: a client of the agent.
//!
//! Only the agent (PID 1) may open the Docker socket, so the `podman` that
//! Ray starts (as the Ray user) hands the call to it: its argv, working
//! directory, environment and standard streams go over the agent's unix
//! socket ([`super::transport`]); the signals it gets are relayed; it exits
//! with the code the agent's side returns. To Ray it is exactly podman: the
//! process it watches, signals and may SIGKILL (then the agent's side
//! removes the container at once).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};

use super::runner::FORWARDED;
use super::transport::{self, Request, ToAgent, ToClient};
use crate::error::EXIT_SHIM;

/// The agent's socket, in its state folder.
pub const SOCKET: &str = "shim.sock";

/// Returns where this node's agent listens: `$ARGUS_STATE_DIR/shim.sock`
/// (the agent puts `ARGUS_STATE_DIR` in Ray's environment). A job that moves
/// it only talks to a server of its own, which has no Docker socket.
pub fn socket_path() -> PathBuf {
    crate::settings::state_dir().join(SOCKET)
}

/// Runs the call through the node agent and returns its exit code; None
/// when no agent listens here (the standalone shim runs the call itself).
/// Must be called before any other thread exists (it blocks the relayed
/// signals for the whole process).
pub fn run(args: &[String]) -> Option<u8> {
    let path = socket_path();
    std::fs::symlink_metadata(&path).ok()?;
    Some(match call(&path, args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e}");
            EXIT_SHIM
        }
    })
}

fn call(path: &Path, args: &[String]) -> Result<u8, String> {
    let mut set = SigSet::empty();
    for &(num, _) in FORWARDED {
        if let Ok(sig) = Signal::try_from(num) {
            set.add(sig);
        }
    }
    set.add(Signal::SIGWINCH);
    set.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    let sock = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach the node agent at {} ({e}); is argus-agent running as PID 1 of this container?",
            path.display()
        )
    })?;
    exchange(sock, path, args, set)
}

/// Sends the call over `sock` (connected to the agent at `path`), relays
/// the signals of `set`, and returns the agent's exit code.
fn exchange(sock: UnixStream, path: &Path, args: &[String], set: SigSet) -> Result<u8, String> {
    let lost = |e: std::io::Error| format!("lost the node agent at {}: {e}", path.display());
    // The agent may refuse a call without reading it (a bound reached) and
    // close: then sending fails, and its one line waits in the socket.
    let refused = |e: std::io::Error| match transport::recv::<ToClient>(&sock) {
        Ok(ToClient {
            code,
            error: Some(why),
        }) => {
            eprintln!("Error: {why}");
            Ok(code)
        }
        _ => Err(lost(e)),
    };
    if let Err(e) = transport::send_fds(&sock, &[0, 1, 2]) {
        return refused(e);
    }
    let request = Request {
        args: args.to_vec(),
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "/".into()),
        env: std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect(),
    };
    if let Err(e) = transport::send(&sock, &request) {
        return refused(e);
    }
    let relay = sock.try_clone().map_err(lost)?;
    std::thread::spawn(move || {
        while let Ok(sig) = set.wait() {
            if transport::send(&relay, &ToAgent::Signal(sig as i32)).is_err() {
                return;
            }
        }
    });
    match transport::recv::<ToClient>(&sock) {
        Ok(answer) => {
            if let Some(e) = answer.error {
                eprintln!("Error: {e}");
            }
            Ok(answer.code)
        }
        Err(e) => Err(format!(
            "the node agent ended the call without an exit code ({e})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_refused_before_it_was_read_gets_the_refusal_not_a_broken_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let sock = UnixStream::connect(&path).unwrap();
        // The broker at its bound: one line, then the connection closed
        // unread, all before the client sends anything (its first write
        // then fails: EPIPE).
        let (conn, _) = listener.accept().unwrap();
        transport::send(
            &conn,
            &ToClient {
                code: 125,
                error: Some("512 podman calls of uid 1000 are already running".into()),
            },
        )
        .unwrap();
        drop(conn);
        let code = exchange(sock, &path, &["ps".to_string()], SigSet::empty());
        assert_eq!(code, Ok(125));
    }
}
