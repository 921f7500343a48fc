//! The wire between the `podman` client (run by Ray, as the Ray user) and
//! the node agent, over a unix stream socket.
//!
//! 1. The client sends one byte carrying its standard streams (descriptors
//!    0, 1 and 2, `SCM_RIGHTS`), so the container's output goes straight to
//!    whatever Ray gave it (a pipe, a file, a TTY).
//! 2. Then frames: a 4-byte big-endian length and that much JSON. The first
//!    is the [`Request`]; then [`ToAgent`] messages (signals it got).
//! 3. The agent's side answers with one [`ToClient`] frame: the exit code.
//!
//! Nothing here trusts the peer: frames are bounded ([`MAX_FRAME`]), a
//! descriptor count other than three is refused, and the peer's identity
//! comes from the kernel (`SO_PEERCRED`), never from a message.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

/// The largest frame either side accepts (argv and environment included).
pub const MAX_FRAME: usize = 1 << 20;

/// What the client asks: its command line after `podman`, its working
/// directory and environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub args: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
}

/// Messages of the client after the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToAgent {
    /// The client received this signal: the agent's side forwards it.
    Signal(i32),
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToClient {
    pub code: u8,
    /// A one-line error to print (the agent refused the call itself).
    pub error: Option<String>,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("frame of {0} bytes is larger than {MAX_FRAME}")]
    TooLarge(usize),
    #[error("expected 3 standard streams, got {0} descriptors")]
    Descriptors(usize),
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Sends the standard streams `fds` with one byte.
pub fn send_fds(sock: &UnixStream, fds: &[RawFd; 3]) -> io::Result<()> {
    let iov = [IoSlice::new(b"F")];
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)?;
    Ok(())
}

/// Receives the standard streams sent by [`send_fds`]: exactly three.
pub fn recv_fds(sock: &UnixStream) -> Result<[OwnedFd; 3], TransportError> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    if msg.bytes == 0 {
        return Err(TransportError::Closed);
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel just installed these descriptors for us.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let n = fds.len();
    fds.try_into().map_err(|_| TransportError::Descriptors(n))
}

/// Writes `msg` as one frame.
pub fn send<T: Serialize>(mut sock: &UnixStream, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    sock.write_all(&frame)
}

/// Reads one frame, at most [`MAX_FRAME`] bytes (checked before anything is
/// allocated).
pub fn recv<T: for<'de> Deserialize<'de>>(mut sock: &UnixStream) -> Result<T, TransportError> {
    let mut len = [0u8; 4];
    match sock.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(TransportError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(TransportError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => TransportError::Closed,
        _ => TransportError::Io(e),
    })?;
    Ok(serde_json::from_slice(&body)?)
}

/// The peer's pid, uid and gid, from the kernel.
pub fn peer(sock: &UnixStream) -> io::Result<(i32, u32, u32)> {
    let c = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok((c.pid(), c.uid(), c.gid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_requests_and_answers_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        send_fds(&a, &[null.as_raw_fd(), w.as_raw_fd(), w.as_raw_fd()]).unwrap();
        let req = Request {
            args: vec!["run".into(), "--rm".into(), "img".into()],
            cwd: "/tmp".into(),
            env: vec![("A".into(), "1".into())],
        };
        send(&a, &req).unwrap();
        send(&a, &ToAgent::Signal(15)).unwrap();
        let fds = recv_fds(&b).unwrap();
        assert_eq!(recv::<Request>(&b).unwrap(), req);
        assert_eq!(recv::<ToAgent>(&b).unwrap(), ToAgent::Signal(15));
        // The received stdout is the client's pipe.
        nix::unistd::write(&fds[1], b"out").unwrap();
        drop(fds);
        drop(w);
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "out");
        let answer = ToClient {
            code: 3,
            error: None,
        };
        send(&b, &answer).unwrap();
        assert_eq!(recv::<ToClient>(&a).unwrap(), answer);
        let (pid, uid, _) = peer(&a).unwrap();
        assert_eq!(pid, std::process::id() as i32);
        assert_eq!(uid, nix::unistd::getuid().as_raw());
        drop(a);
        assert!(matches!(recv::<ToAgent>(&b), Err(TransportError::Closed)));
    }

    #[test]
    fn hostile_peers_get_errors_not_allocations() {
        // A length of 4 GiB is refused before anything is read.
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(
            recv::<Request>(&b),
            Err(TransportError::TooLarge(n)) if n == u32::MAX as usize
        ));
        // Garbage JSON.
        (&a).write_all(&5u32.to_be_bytes()).unwrap();
        (&a).write_all(b"{oops").unwrap();
        assert!(matches!(
            recv::<Request>(&b),
            Err(TransportError::Malformed(_))
        ));
        // A truncated frame, then the peer leaves.
        (&a).write_all(&100u32.to_be_bytes()).unwrap();
        (&a).write_all(b"{").unwrap();
        drop(a);
        assert!(matches!(recv::<Request>(&b), Err(TransportError::Closed)));
        // Descriptors: one instead of three, and none.
        let (a, b) = UnixStream::pair().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let iov = [IoSlice::new(b"F")];
        let one = [null.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&one)];
        sendmsg::<()>(a.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
        assert!(matches!(recv_fds(&b), Err(TransportError::Descriptors(1))));
        (&a).write_all(b"F").unwrap();
        assert!(matches!(recv_fds(&b), Err(TransportError::Descriptors(0))));
    }
}
