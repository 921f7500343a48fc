//! The I/O of a worker's drain (the decisions are `drain.rs`'s):
//! - [`DrainGate`]: tells the signal route whether a SIGTERM starts a
//!   drain (the first one while a worker's Ray runs) or stops at once;
//! - [`LbAgent`]: the load balancer's agent-check (HAProxy `agent-check`):
//!   a TCP port that answers `ready` or, once the drain tells it, `drain`;
//! - [`Helper`]: the drain helper (`ARGUS_DRAIN_HELPER`, the node image's
//!   /opt/argus/drain_node.py) run as the Ray user; it drains this node in
//!   Ray's GCS and reports, one JSON line at a time, what Serve has left on
//!   this node and whether another worker's proxy serves. Its lines reach
//!   the node loop as [`Event::Drain`] inputs.
//! - [`ProxyWatch`]: whether this node's Serve proxy answers its health
//!   check (the node's status and metrics say so; the rolling replacement
//!   waits on it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tracing::{debug, info, warn};

use std::time::Instant;

use super::drain::{Drain, Input, Step};
use super::{Event, Node};
use argus_supervise::privs::{confine, RayUser};
use argus_supervise::{reaper, Stop};
use argus_telemetry::status::NodeState;

/// A drain shorter than this is not started (the helper alone needs a
/// few seconds to reach Ray).
pub const MIN_DRAIN: Duration = Duration::from_secs(5);

const GATE_OFF: u8 = 0;
const GATE_ARMED: u8 = 1;
const GATE_DEFERRED: u8 = 2;

/// Shared by the node loop and the signal route: whether the next SIGTERM
/// starts a drain instead of the stop, and how long a drain may last given
/// the container's stop timeout, once known.
#[derive(Clone, Debug, Default)]
pub struct DrainGate(Arc<AtomicU8>, Arc<AtomicU64>);

impl DrainGate {
    /// Arms (a worker's Ray runs and drains are on) or disarms the gate;
    /// a SIGTERM already deferred stays so.
    pub fn arm(&self, on: bool) {
        let (from, to) = if on {
            (GATE_OFF, GATE_ARMED)
        } else {
            (GATE_ARMED, GATE_OFF)
        };
        let _ = self
            .0
            .compare_exchange(from, to, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Called by the signal route: returns true if and only if `sig` is the
    /// first SIGTERM while armed, which starts a drain instead of the stop.
    /// A second SIGTERM, and SIGINT, stop at once.
    pub fn defer(&self, sig: Signal) -> bool {
        sig == Signal::SIGTERM
            && self
                .0
                .compare_exchange(
                    GATE_ARMED,
                    GATE_DEFERRED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
    }

    /// Returns true if and only if a SIGTERM was deferred (a drain is due).
    pub fn deferred(&self) -> bool {
        self.0.load(Ordering::SeqCst) == GATE_DEFERRED
    }

    /// Bounds every drain to `limit`: what the container's stop timeout
    /// leaves after Ray's stop grace and the cleanup (Docker kills a node
    /// that outlives it, engine containers and all).
    pub fn set_limit(&self, limit: Duration) {
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX - 1);
        self.1.store(ms + 1, Ordering::SeqCst);
    }

    /// The bound set by [`DrainGate::set_limit`], if any.
    pub fn limit(&self) -> Option<Duration> {
        match self.1.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(Duration::from_millis(ms - 1)),
        }
    }
}

/// The answer of HAProxy's agent-check on this node.
pub struct LbAgent {
    draining: Arc<AtomicBool>,
    port: u16,
}

impl LbAgent {
    /// Listens on `port` (all addresses) and answers every connection with
    /// one line, `ready` or `drain`, until the process ends.
    pub fn start(port: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
        let port = listener.local_addr()?.port();
        let draining = Arc::new(AtomicBool::new(false));
        let d = draining.clone();
        std::thread::Builder::new()
            .name("lb-agent".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut c) = conn else { continue };
                    let answer = if d.load(Ordering::SeqCst) {
                        "drain"
                    } else {
                        "ready"
                    };
                    argus_telemetry::metrics::lb_agent_answer(answer);
                    let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = c.write_all(format!("{answer}\n").as_bytes());
                }
            })?;
        info!(port, "answering the load balancer's agent-check");
        Ok(Self { draining, port })
    }

    /// From now on answers `drain`: the load balancer sends no new request.
    pub fn drain(&self) {
        if !self.draining.swap(true, Ordering::SeqCst) {
            info!(port = self.port, "load balancer told: drain");
        }
    }
}

/// The running drain helper.
pub struct Helper {
    pid: u32,
}

/// What the helper is given.
pub struct HelperArgs<'a> {
    pub program: &'a str,
    pub gcs: &'a str,
    pub node_ip: std::net::IpAddr,
    pub serve_port: u16,
    pub deadline: Duration,
    pub user: Option<&'a RayUser>,
}

impl Helper {
    /// Starts the helper; its reports (and its end) arrive as
    /// [`Event::Drain`] on `tx`.
    pub fn start(a: HelperArgs<'_>, tx: Sender<Event>) -> std::io::Result<Self> {
        let mut cmd = Command::new(a.program);
        cmd.arg("--gcs")
            .arg(a.gcs)
            .arg("--node-ip")
            .arg(a.node_ip.to_string())
            .arg("--serve-port")
            .arg(a.serve_port.to_string())
            .arg("--deadline-s")
            .arg(a.deadline.as_secs().max(1).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0);
        confine(&mut cmd, a.user);
        let ended = tx.clone();
        let (pid, stdout) = reaper::spawn_piped(&mut cmd, move |exit| {
            let _ = ended.send(Event::Drain(Input::Failed(format!(
                "the drain helper ended ({exit})"
            ))));
        })?;
        if let Some(out) = stdout {
            std::thread::Builder::new()
                .name("drain-helper".into())
                .spawn(move || read_reports(out, &tx))?;
        }
        Ok(Self { pid })
    }

    /// Ends the helper (its group).
    pub fn kill(&self) {
        let _ = signal::killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Turns the helper's lines into inputs until its stdout closes.
fn read_reports(out: impl Read, tx: &Sender<Event>) {
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { return };
        match parse_report(&line) {
            Some(input) => {
                if tx.send(Event::Drain(input)).is_err() {
                    return;
                }
            }
            None => debug!(line, "drain helper"),
        }
    }
}

/// One helper line as an input; `None` for a line that is not a report.
///
/// The lines: `{"event":"drain","accepted":true}` or with `false` and a
/// `"message"`; `{"event":"status","here":N,"elsewhere":B}`;
/// `{"event":"error","message":"..."}`.
pub fn parse_report(line: &str) -> Option<Input> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let message = || v["message"].as_str().unwrap_or("").to_string();
    match v["event"].as_str()? {
        "drain" => Some(match v["accepted"].as_bool()? {
            true => Input::Accepted,
            false => Input::Refused(message()),
        }),
        "status" => Some(Input::Status {
            here: u32::try_from(v["here"].as_u64()?).ok()?,
            elsewhere: v["elsewhere"].as_bool()?,
            others: match (v["others"].as_u64(), v["others_draining"].as_u64()) {
                (Some(a), Some(d)) => Some((u32::try_from(a).ok()?, u32::try_from(d).ok()?)),
                _ => None,
            },
        }),
        "error" => Some(Input::Failed(message())),
        _ => None,
    }
}

/// Watches this node's Serve proxy: `GET /-/healthz` on the serve port of
/// the node's own address every second; a change reaches the loop as
/// [`Event::ProxyServing`].
pub struct ProxyWatch;

impl ProxyWatch {
    /// Starts the watch thread; it ends with the stop.
    pub fn start(addr: SocketAddr, tx: Sender<Event>, stop: &Stop) {
        let stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("proxy-watch".into())
            .spawn(move || {
                let mut last = None;
                while !stop.is_requested() {
                    let up = healthz(addr);
                    if last != Some(up) {
                        last = Some(up);
                        if tx.send(Event::ProxyServing(up)).is_err() {
                            return;
                        }
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot watch the serve proxy");
        }
    }
}

/// Returns true if and only if Serve's proxy at `addr` answers its health
/// check with 200 within a second.
pub fn healthz(addr: SocketAddr) -> bool {
    let t = Duration::from_secs(1);
    let Ok(mut c) = TcpStream::connect_timeout(&addr, t) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(t));
    let _ = c.set_write_timeout(Some(t));
    let req = format!("GET /-/healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if c.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

impl<R: super::RoleLoop> Node<R> {
    /// At the stop: a drain still under way (a second SIGTERM, SIGINT) is
    /// given up, and counted as skipped.
    pub(super) fn skip_drain(&mut self) {
        if let Some(d) = self.drain.take() {
            let took = d.started().elapsed();
            argus_telemetry::metrics::drain("skipped", &[("done", took)]);
            warn!(
                after_s = took.as_secs_f64(),
                serve_actors_here = ?d.here(),
                "drain skipped: stopping now"
            );
            self.helper = None;
            self.drain_wake = None;
        }
    }

    /// Worker: starts the load balancer's agent-check (when a port is
    /// set) and the watch of this node's Serve proxy.
    pub(super) fn start_serve_watch(&mut self) {
        if let Some(port) = self.cfg.drain.lb_agent_port {
            match LbAgent::start(port) {
                Ok(a) => self.lb_agent = Some(a),
                Err(e) => warn!(port, error = %e, "cannot answer the load balancer's agent-check"),
            }
        }
        let addr = SocketAddr::new(self.ip, self.cfg.drain.serve_port);
        ProxyWatch::start(addr, self.tx.clone(), &self.stop);
    }

    /// The first SIGTERM of a worker whose Ray runs: drains before the
    /// stop (R-SERVE-4). Without Ray there is nothing to drain.
    pub(super) fn begin_drain(&mut self) {
        let Some(gcs) = self
            .ray
            .as_ref()
            .and_then(|r| r.target.as_ref())
            .map(|t| t.address.clone())
        else {
            info!("stop requested");
            self.stop.request();
            return;
        };
        let now = Instant::now();
        let mut timeout = self.cfg.drain.timeout;
        if let Some(limit) = self.drain_gate.limit().filter(|l| *l < timeout) {
            if limit < MIN_DRAIN {
                warn!(
                    drain_s = limit.as_secs_f64(),
                    "stop requested: no drain (the container's stop timeout leaves no time for one)"
                );
                self.stop.request();
                return;
            }
            timeout = limit;
        }
        info!(
            timeout_s = timeout.as_secs_f64(),
            "stop requested: draining first (a second SIGTERM skips the drain)"
        );
        self.set_state(
            NodeState::Draining,
            "stop requested; moving Serve's replicas off this node".into(),
        );
        let mut d = Drain::new(now, timeout, self.lb_agent.is_some());
        let helper = self.cfg.drain.helper.clone();
        let started = Helper::start(
            HelperArgs {
                program: &helper.to_string_lossy(),
                gcs: &gcs,
                node_ip: self.ip,
                serve_port: self.cfg.drain.serve_port,
                deadline: timeout,
                user: self.cfg.ray_user.as_ref(),
            },
            self.tx.clone(),
        );
        match started {
            Ok(h) => self.helper = Some(h),
            Err(e) => d.on(
                Input::Failed(format!("cannot run {}: {e}", helper.display())),
                now,
            ),
        }
        self.drain = Some(d);
        self.drain_step();
    }

    /// Acts on the drain's next step: tells the load balancer, or ends the
    /// drain and requests the stop.
    pub(super) fn drain_step(&mut self) {
        let Some(d) = self.drain.as_mut() else { return };
        loop {
            let now = Instant::now();
            match d.poll(now) {
                Step::Wait(at) => {
                    self.drain_wake = Some(at);
                    return;
                }
                Step::TellLb => {
                    if let Some(lb) = &self.lb_agent {
                        lb.drain();
                    }
                    info!(
                        after_s = now.duration_since(d.started()).as_secs_f64(),
                        serve_actors_here = ?d.here(),
                        "drain: no new request comes here from now on"
                    );
                }
                Step::Finish(outcome) => {
                    let took = now.duration_since(d.started());
                    let mut steps = vec![("done", took)];
                    if let Some(t) = d.lb_told() {
                        steps.push(("lb_told", t.duration_since(d.started())));
                    }
                    argus_telemetry::metrics::drain(outcome.as_str(), &steps);
                    let why = d.why().unwrap_or("no Serve actor left on this node");
                    if matches!(
                        outcome,
                        super::drain::Outcome::Drained
                            | super::drain::Outcome::RayExited
                            | super::drain::Outcome::Nowhere
                    ) {
                        info!(
                            result = outcome.as_str(),
                            took_s = took.as_secs_f64(),
                            why,
                            "drain done; stopping"
                        );
                    } else {
                        warn!(
                            result = outcome.as_str(),
                            took_s = took.as_secs_f64(),
                            why,
                            "drain ended early; stopping"
                        );
                    }
                    self.helper = None;
                    self.drain_wake = None;
                    self.drain = None;
                    self.stop.request();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_defers_the_first_sigterm_only_while_armed() {
        let g = DrainGate::default();
        assert!(!g.defer(Signal::SIGTERM), "not armed: stop at once");
        g.arm(true);
        assert!(!g.defer(Signal::SIGINT), "SIGINT always stops");
        assert!(g.defer(Signal::SIGTERM));
        assert!(g.deferred());
        assert!(!g.defer(Signal::SIGTERM), "the second SIGTERM stops");
        g.arm(false);
        assert!(g.deferred(), "a deferred SIGTERM stays deferred");
        let g = DrainGate::default();
        g.arm(true);
        g.arm(false);
        assert!(!g.defer(Signal::SIGTERM), "disarmed: stop at once");
        assert_eq!(g.limit(), None);
        g.clone().set_limit(Duration::ZERO);
        assert_eq!(g.limit(), Some(Duration::ZERO));
        g.set_limit(Duration::from_secs(120));
        assert_eq!(g.limit(), Some(Duration::from_secs(120)));
    }

    #[test]
    fn helper_lines_become_inputs_and_anything_else_is_ignored() {
        assert_eq!(
            parse_report(r#"{"event":"drain","accepted":true}"#),
            Some(Input::Accepted)
        );
        assert_eq!(
            parse_report(r#"{"event":"drain","accepted":false,"message":"head"}"#),
            Some(Input::Refused("head".into()))
        );
        assert_eq!(
            parse_report(r#"{"event":"status","here":3,"elsewhere":true}"#),
            Some(Input::Status {
                here: 3,
                elsewhere: true,
                others: None,
            })
        );
        assert_eq!(
            parse_report(
                r#"{"event":"status","here":1,"elsewhere":false,"others":2,"others_draining":1,"serving":[]}"#
            ),
            Some(Input::Status {
                here: 1,
                elsewhere: false,
                others: Some((2, 1)),
            })
        );
        assert_eq!(
            parse_report(r#"{"event":"error","message":"no gcs"}"#),
            Some(Input::Failed("no gcs".into()))
        );
        for junk in [
            "",
            "2026-11-26 INFO something",
            r#"{"event":"status","here":-1,"elsewhere":true}"#,
            r#"{"event":"status","here":1}"#,
            r#"{"event":"drain"}"#,
            r#"{"event":"other"}"#,
            "[1,2]",
        ] {
            assert_eq!(parse_report(junk), None, "{junk}");
        }
    }

    #[test]
    fn the_lb_agent_answers_ready_then_drain() {
        let a = LbAgent::start(0).unwrap();
        let ask = || {
            let mut s = String::new();
            TcpStream::connect(("127.0.0.1", a.port))
                .unwrap()
                .read_to_string(&mut s)
                .unwrap();
            s
        };
        assert_eq!(ask(), "ready\n");
        a.drain();
        assert_eq!(ask(), "drain\n");
        assert_eq!(ask(), "drain\n");
    }

    #[test]
    fn healthz_is_up_only_on_a_200() {
        let serve = |status: &'static str| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 256];
                let _ = c.read(&mut buf);
                let _ = c.write_all(format!("HTTP/1.1 {status}\r\n\r\nx").as_bytes());
            });
            addr
        };
        assert!(healthz(serve("200 OK")));
        assert!(!healthz(serve("503 Service Unavailable")));
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(!healthz(closed));
    }
}
