//! Connection probes off the node's event loop (issue 9.6).
//!
//! Why: a probe of a partitioned head waits its whole timeout, and a raylet
//! that stopped accepting can block a connect on its socket; meanwhile the
//! loop must keep handling signals and the stop. One thread runs the probes
//! one at a time and answers each with [`Event::Probed`]; the loop asks for
//! a probe, goes on, and decides when the answer arrives.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant, SystemTime};

use super::Event;

/// What one connection attempt to a GCS address found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Something accepted the connection: the GCS is up.
    Accepts,
    /// ECONNREFUSED / RST: the host is up and nothing listens.
    Refused,
    /// A timeout, no route, or another error: cannot tell (a partition?).
    Inconclusive,
}

/// Returns what a connection to `addr` finds within `timeout`.
pub(super) fn probe(addr: SocketAddr, timeout: Duration) -> Probe {
    match TcpStream::connect_timeout(&addr, timeout) {
        Ok(_) => Probe::Accepts,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Probe::Refused,
        Err(_) => Probe::Inconclusive,
    }
}

/// Why a probe was asked for; at most one of each is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// Head: does our own GCS accept, and is our raylet up (publish)?
    Serving,
    /// Standby head: the record holder's GCS (R-HEAD-5 evidence).
    Holder,
    /// Worker: the joined head's GCS, once its record stopped changing.
    Joined,
}

impl Purpose {
    fn bit(self) -> u8 {
        match self {
            Purpose::Serving => 1,
            Purpose::Holder => 2,
            Purpose::Joined => 4,
        }
    }
}

/// The answer to one probe.
#[derive(Debug, Clone)]
pub struct Probed {
    pub(super) purpose: Purpose,
    pub(super) addr: SocketAddr,
    pub(super) probe: Probe,
    /// [`Purpose::Serving`]: a `raylet*` socket created by this start
    /// accepts (only looked at when the GCS accepts).
    pub(super) raylet: bool,
    /// When the probe was asked for (an answer older than the state it
    /// was asked about is ignored).
    pub(super) asked: Instant,
    /// When the connection attempt ended.
    pub(super) at: Instant,
}

/// What the probe thread does for one request.
enum Job {
    Gcs {
        addr: SocketAddr,
        timeout: Duration,
    },
    Serving {
        addr: SocketAddr,
        timeout: Duration,
        sockets: PathBuf,
        started_wall: SystemTime,
    },
}

/// A handle to the probe thread.
pub(super) struct Prober {
    jobs: Option<Sender<(Purpose, Instant, Job)>>,
    events: Sender<Event>,
    in_flight: u8,
}

impl Prober {
    /// Starts the probe thread; answers go to `events`.
    pub(super) fn start(events: Sender<Event>) -> Self {
        let (tx, rx) = mpsc::channel::<(Purpose, Instant, Job)>();
        let answers = events.clone();
        let spawned = std::thread::Builder::new()
            .name("probes".into())
            .spawn(move || {
                for (purpose, asked, job) in rx {
                    if answers
                        .send(Event::Probed(run(purpose, asked, job)))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        let jobs = match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the probe thread; probing on the loop");
                None
            }
        };
        Self {
            jobs,
            events,
            in_flight: 0,
        }
    }

    /// Returns true if and only if a probe for `purpose` is under way.
    pub(super) fn busy(&self, purpose: Purpose) -> bool {
        self.in_flight & purpose.bit() != 0
    }

    /// Notes that the answer for `purpose` arrived.
    pub(super) fn answered(&mut self, purpose: Purpose) {
        self.in_flight &= !purpose.bit();
    }

    /// Asks for a connection probe of `addr`, unless one for `purpose` is
    /// under way; returns true if and only if one was asked for.
    pub(super) fn gcs(&mut self, purpose: Purpose, addr: SocketAddr, timeout: Duration) -> bool {
        self.ask(purpose, Job::Gcs { addr, timeout })
    }

    /// Head: asks whether our GCS at `addr` accepts and, if it does,
    /// whether a raylet socket in `sockets` created by the start at
    /// `started_wall` accepts.
    pub(super) fn serving(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
        sockets: PathBuf,
        started_wall: SystemTime,
    ) -> bool {
        self.ask(
            Purpose::Serving,
            Job::Serving {
                addr,
                timeout,
                sockets,
                started_wall,
            },
        )
    }

    fn ask(&mut self, purpose: Purpose, job: Job) -> bool {
        if self.busy(purpose) {
            return false;
        }
        self.in_flight |= purpose.bit();
        let asked = Instant::now();
        let job = match &self.jobs {
            Some(tx) => match tx.send((purpose, asked, job)) {
                Ok(()) => return true,
                Err(mpsc::SendError((_, _, job))) => job,
            },
            None => job,
        };
        // No probe thread: probe here rather than never.
        let _ = self.events.send(Event::Probed(run(purpose, asked, job)));
        true
    }
}

fn run(purpose: Purpose, asked: Instant, job: Job) -> Probed {
    let (addr, probe, raylet) = match job {
        Job::Gcs { addr, timeout } => (addr, probe(addr, timeout), false),
        Job::Serving {
            addr,
            timeout,
            sockets,
            started_wall,
        } => {
            let p = probe(addr, timeout);
            let raylet = p == Probe::Accepts && raylet_accepts(&sockets, started_wall);
            (addr, p, raylet)
        }
    };
    Probed {
        purpose,
        addr,
        probe,
        raylet,
        asked,
        at: Instant::now(),
    }
}

/// Returns true if and only if a `raylet*` socket in `sockets` created by
/// the start at `started_wall` accepts a connection.
///
/// Why the head waits for it: nodes that share a session folder (several
/// nodes on one machine) pick socket names by racing on file existence; a
/// worker joining while the head's raylet is still starting can take the
/// name `sockets/raylet` first and crash the head's raylet (research/ray.md
/// §4). Across machines it only means workers join a head that is up.
///
/// With GCS fault tolerance a restarted head reuses its session (the
/// session name lives in Redis), where the dead raylet's socket may still
/// hold the name `raylet`: any `raylet*` socket created by this start
/// counts.
pub(super) fn raylet_accepts(sockets: &std::path::Path, started_wall: SystemTime) -> bool {
    let Ok(entries) = std::fs::read_dir(sockets) else {
        return false;
    };
    entries.flatten().any(|e| {
        let sock = e.path();
        let named = e.file_name().to_string_lossy().starts_with("raylet");
        let fresh = std::fs::metadata(&sock)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t + Duration::from_secs(2) >= started_wall);
        named && fresh && std::os::unix::net::UnixStream::connect(&sock).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn probe_tells_refused_from_accepted_on_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap();
        assert_eq!(probe(open, Duration::from_millis(300)), Probe::Accepts);
        drop(l);
        assert_eq!(probe(open, Duration::from_millis(300)), Probe::Refused);
    }

    #[test]
    fn one_probe_per_purpose_is_in_flight_and_its_answer_arrives_as_an_event() {
        let (tx, rx) = mpsc::channel();
        let mut p = Prober::start(tx);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        assert!(p.gcs(Purpose::Holder, addr, Duration::from_millis(300)));
        assert!(p.busy(Purpose::Holder));
        assert!(!p.gcs(Purpose::Holder, addr, Duration::from_millis(300)));
        assert!(!p.busy(Purpose::Joined));
        let Event::Probed(a) = rx.recv_timeout(Duration::from_secs(30)).unwrap() else {
            panic!("expected a probe answer")
        };
        assert_eq!(
            (a.purpose, a.addr, a.probe),
            (Purpose::Holder, addr, Probe::Accepts)
        );
        p.answered(Purpose::Holder);
        assert!(!p.busy(Purpose::Holder));
    }

    #[test]
    fn serving_needs_a_fresh_raylet_socket_that_accepts() {
        let d = tempfile::tempdir().unwrap();
        let before = SystemTime::now() - Duration::from_secs(60);
        assert!(!raylet_accepts(d.path(), before));
        let sock = d.path().join("raylet.1");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(raylet_accepts(d.path(), before));
        let later = SystemTime::now() + Duration::from_secs(60);
        assert!(
            !raylet_accepts(d.path(), later),
            "a socket older than the start does not count"
        );
    }
}
