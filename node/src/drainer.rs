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
//!   waits on it), checked often only while the answer may change.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tracing::{debug, info, warn};

use std::time::Instant;

use super::drain::{lb_answer, lb_look_due, Drain, Input, ProxyHealth, Step};
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
    /// one line, `ready` or `drain` ([`lb_answer`]), until the process
    /// ends. With `proxy` (this node's Serve proxy), it also looks at the
    /// proxy after an answer, when its last look is old enough
    /// ([`lb_look_due`]): the looks ride on the load balancer's own checks,
    /// no timer of the agent's.
    pub fn start(port: u16, proxy: Option<SocketAddr>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
        let port = listener.local_addr()?.port();
        let draining = Arc::new(AtomicBool::new(false));
        let d = draining.clone();
        std::thread::Builder::new()
            .name("lb-agent".into())
            .spawn(move || {
                let mut look: Option<(Instant, ProxyHealth)> = None;
                let mut serve_drains_since: Option<Instant> = None;
                let mut said = "ready";
                for conn in listener.incoming() {
                    // One line and the connection is closed: no
                    // connection is held. A failed accept (out of
                    // descriptors) pauses rather than spins.
                    let Ok(mut c) = conn else {
                        std::thread::sleep(argus_telemetry::metrics::ACCEPT_BACKOFF);
                        continue;
                    };
                    let stop_drain = d.load(Ordering::SeqCst);
                    let answer = lb_answer(stop_drain, serve_drains_since, Instant::now());
                    if answer != said && !stop_drain {
                        if answer == "drain" {
                            info!(port, "load balancer told: drain (Serve drains this node's proxy: no replica here)");
                        } else {
                            info!(port, proxy = ?look.map(|l| l.1), "load balancer told: ready (Serve no longer drains this node's proxy)");
                        }
                    }
                    said = answer;
                    argus_telemetry::metrics::lb_agent_answer(answer);
                    let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = c.write_all(format!("{answer}\n").as_bytes());
                    drop(c);
                    // The look after the answer: the load balancer never
                    // waits for it (its check times out in a second).
                    let Some(addr) = proxy else { continue };
                    let now = Instant::now();
                    if stop_drain || !lb_look_due(look, now) {
                        continue;
                    }
                    let health = proxy_health(addr);
                    look = Some((Instant::now(), health));
                    serve_drains_since = match health {
                        ProxyHealth::Draining => serve_drains_since.or(Some(now)),
                        _ => None,
                    };
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
    /// Ray's authentication variables ([`crate::auth::client_env`]).
    pub env: &'a [(String, String)],
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
        cmd.envs(a.env.iter().map(|(k, v)| (k, v)));
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
    for line in argus_supervise::lines::bounded_lines(out, argus_supervise::lines::LINE_MAX) {
        let Ok((line, _cut)) = line else { return };
        let line = String::from_utf8_lossy(&line);
        match parse_report(&line) {
            Some(input) => {
                if tx.send(Event::Drain(input)).is_err() {
                    return;
                }
            }
            None => debug!(line = %line, "drain helper"),
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

/// The proxy watch's gap between checks while its answer may change soon:
/// after it changed, after Ray started or stopped, during a drain.
pub const PROXY_FAST: Duration = Duration::from_secs(1);
/// The proxy watch's longest gap: while its answer stays the same the gap
/// doubles from [`PROXY_FAST`] up to this (an idle worker checks twice a
/// minute; issue 41).
pub const PROXY_SLOW: Duration = Duration::from_secs(30);

/// When the proxy watch checks next, after a check that found `up` with
/// `gap` before it; `fresh`: the check followed a change of its answer or
/// news from the node (Ray started or stopped, a drain began). Returns
/// `None` for no check until the node tells something: no Ray runs and the
/// proxy is down, and Serve's proxy cannot come up without Ray.
pub fn next_proxy_check(
    gap: Duration,
    fresh: bool,
    up: bool,
    ray: bool,
    draining: bool,
) -> Option<Duration> {
    if draining {
        Some(PROXY_FAST)
    } else if !ray && !up {
        None
    } else if fresh {
        Some(PROXY_FAST)
    } else {
        Some((gap * 2).clamp(PROXY_FAST, PROXY_SLOW))
    }
}

/// What the node tells the proxy watch.
#[derive(Debug, Default)]
struct WatchNews {
    /// Ray runs on this node.
    ray: bool,
    /// A drain is under way (until the stop).
    draining: bool,
    /// Something above changed since the watch last looked: check now.
    told: bool,
    stopped: bool,
}

/// Why the proxy watch's wait ended.
enum WatchWake {
    Due,
    Told,
    Stopped,
}

/// Watches this node's Serve proxy: `GET /-/healthz` on the serve port of
/// the node's own address; a change reaches the loop as
/// [`Event::ProxyServing`]. Not a fixed tick (issue 41): it checks every
/// [`PROXY_FAST`] while the answer may change soon, backs off to
/// [`PROXY_SLOW`] while it stays the same, does not check while no Ray
/// runs (after one check that found the proxy down), and checks at once
/// when the node tells it that Ray started or stopped or a drain began
/// ([`next_proxy_check`]).
pub struct ProxyWatch {
    news: Arc<(Mutex<WatchNews>, Condvar)>,
}

impl ProxyWatch {
    /// Starts the watch thread (it checks at once); it ends with the stop.
    pub fn start(addr: SocketAddr, tx: Sender<Event>, stop: &Stop) -> Self {
        let news = Arc::new((Mutex::new(WatchNews::default()), Condvar::new()));
        let on_stop = news.clone();
        stop.on_request(move || {
            let (m, cv) = &*on_stop;
            lock(m).stopped = true;
            cv.notify_all();
        });
        let shared = news.clone();
        let spawned = std::thread::Builder::new()
            .name("proxy-watch".into())
            .spawn(move || watch_proxy(addr, &tx, &shared));
        if let Err(e) = spawned {
            warn!(error = %e, "cannot watch the serve proxy");
        }
        Self { news }
    }

    /// Tells the watch whether Ray runs; a change makes it check at once
    /// and then every [`PROXY_FAST`] again (Serve's proxy comes and goes
    /// with Ray). Cheap when nothing changed: the loop calls it every turn.
    pub fn ray(&self, running: bool) {
        self.tell(|n| std::mem::replace(&mut n.ray, running) != running);
    }

    /// A drain began: the watch checks at once and every [`PROXY_FAST`]
    /// until the stop (the node's status and `argus_serve_proxy_up` follow
    /// the proxy as it leaves).
    pub fn draining(&self) {
        self.tell(|n| !std::mem::replace(&mut n.draining, true));
    }

    fn tell(&self, change: impl FnOnce(&mut WatchNews) -> bool) {
        let (m, cv) = &*self.news;
        let mut n = lock(m);
        if change(&mut n) {
            n.told = true;
            cv.notify_all();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The watch thread: a check, then a wait as [`next_proxy_check`] says,
/// until the stop or the loop's end.
fn watch_proxy(addr: SocketAddr, tx: &Sender<Event>, news: &(Mutex<WatchNews>, Condvar)) {
    let (m, cv) = news;
    let mut last = None;
    let mut gap = PROXY_FAST;
    let mut fresh = true;
    loop {
        let up = healthz(addr);
        if last != Some(up) {
            last = Some(up);
            fresh = true;
            if tx.send(Event::ProxyServing(up)).is_err() {
                return;
            }
        }
        let mut n = lock(m);
        let next = next_proxy_check(gap, fresh, up, n.ray, n.draining);
        if let Some(g) = next {
            gap = g;
        }
        let due = next.map(|g| Instant::now() + g);
        let wake = loop {
            if n.stopped {
                break WatchWake::Stopped;
            }
            if std::mem::take(&mut n.told) {
                break WatchWake::Told;
            }
            n = match due {
                None => cv.wait(n).unwrap_or_else(PoisonError::into_inner),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break WatchWake::Due;
                    }
                    cv.wait_timeout(n, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        };
        fresh = match wake {
            WatchWake::Stopped => return,
            WatchWake::Told => true,
            WatchWake::Due => false,
        };
    }
}

/// Returns true if and only if Serve's proxy at `addr` answers its health
/// check with 200 within a second.
pub fn healthz(addr: SocketAddr) -> bool {
    proxy_health(addr) == ProxyHealth::Serving
}

/// What Serve's proxy at `addr` answers its health check within a second:
/// 200, 503 with Serve's draining message, or anything else (no answer).
pub fn proxy_health(addr: SocketAddr) -> ProxyHealth {
    let t = Duration::from_secs(1);
    let Ok(mut c) = TcpStream::connect_timeout(&addr, t) else {
        return ProxyHealth::Down;
    };
    let _ = c.set_read_timeout(Some(t));
    let _ = c.set_write_timeout(Some(t));
    let req = format!("GET /-/healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if c.write_all(req.as_bytes()).is_err() {
        return ProxyHealth::Down;
    }
    // The status line, headers and Serve's short body: 1 KiB is plenty;
    // read until then or the close (`Connection: close`).
    let mut buf = Vec::with_capacity(1024);
    let _ = c.take(1024).read_to_end(&mut buf);
    classify_healthz(&buf)
}

/// Serve's health answer from its first bytes.
pub fn classify_healthz(answer: &[u8]) -> ProxyHealth {
    if !answer.starts_with(b"HTTP/1.") || answer.len() < 12 {
        return ProxyHealth::Down;
    }
    match &answer[9..12] {
        b"200" => ProxyHealth::Serving,
        b"503"
            if answer
                .windows(DRAINING_MESSAGE.len())
                .any(|w| w == DRAINING_MESSAGE) =>
        {
            ProxyHealth::Draining
        }
        _ => ProxyHealth::Down,
    }
}

/// Ray Serve's answer to a health check of a proxy it drains
/// (`ray.serve._private.proxy.DRAINING_MESSAGE`, Ray 2.53).
const DRAINING_MESSAGE: &[u8] = b"This node is being drained.";

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
        let addr = SocketAddr::new(self.ip, self.cfg.drain.serve_port);
        if let Some(port) = self.cfg.drain.lb_agent_port {
            match LbAgent::start(port, Some(addr)) {
                Ok(a) => self.lb_agent = Some(a),
                Err(e) => warn!(port, error = %e, "cannot answer the load balancer's agent-check"),
            }
        }
        self.proxy_watch = Some(ProxyWatch::start(addr, self.tx.clone(), &self.stop));
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
        if let Some(w) = &self.proxy_watch {
            w.draining();
        }
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
                env: &super::auth::client_env(&self.cfg),
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
    fn an_endless_line_of_the_helper_is_dropped_and_the_next_report_still_arrives() {
        // 256 MiB of one line (never held: the reader makes it up), then a
        // report: PID 1 keeps at most one bounded line of it.
        struct Endless(usize, &'static [u8]);
        impl Read for Endless {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0 > 0 {
                    let n = buf.len().min(self.0);
                    buf[..n].fill(b'{');
                    self.0 -= n;
                    return Ok(n);
                }
                let n = buf.len().min(self.1.len());
                buf[..n].copy_from_slice(&self.1[..n]);
                self.1 = &self.1[n..];
                Ok(n)
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        read_reports(
            Endless(256 << 20, b"\n{\"event\":\"drain\",\"accepted\":true}\n"),
            &tx,
        );
        let got: Vec<_> = rx.try_iter().collect();
        assert!(
            matches!(got.as_slice(), [Event::Drain(Input::Accepted)]),
            "{} events",
            got.len()
        );
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

    /// One agent-check, as HAProxy makes it.
    fn ask_agent(port: u16) -> String {
        let mut s = String::new();
        TcpStream::connect(("127.0.0.1", port))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    }

    #[test]
    fn the_lb_agent_answers_ready_then_drain() {
        let a = LbAgent::start(0, None).unwrap();
        let ask = || ask_agent(a.port);
        assert_eq!(ask(), "ready\n");
        a.drain();
        assert_eq!(ask(), "drain\n");
        assert_eq!(ask(), "drain\n");
    }

    #[test]
    fn serves_health_answers_are_told_apart() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nsuccess";
        let drained =
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 27\r\n\r\nThis node is being drained.";
        let empty = b"HTTP/1.1 503 Service Unavailable\r\n\r\nRoute table is not populated yet.";
        assert_eq!(classify_healthz(ok), ProxyHealth::Serving);
        assert_eq!(classify_healthz(drained), ProxyHealth::Draining);
        assert_eq!(classify_healthz(empty), ProxyHealth::Down);
        assert_eq!(classify_healthz(b""), ProxyHealth::Down);
        assert_eq!(classify_healthz(b"HTTP/1.1 20"), ProxyHealth::Down);
        // The message on another status is not Serve's drain.
        assert_eq!(
            classify_healthz(b"HTTP/1.1 500 x\r\n\r\nThis node is being drained."),
            ProxyHealth::Down
        );
    }

    /// A stand-in Serve proxy on 127.0.0.1: answers every health check as
    /// `state` says (0 serving, 1 draining, 2 not ready).
    fn fake_proxy(state: Arc<AtomicU8>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let mut req = [0u8; 512];
                let _ = c.read(&mut req);
                let body: &[u8] = match state.load(Ordering::SeqCst) {
                    0 => b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nsuccess",
                    1 => b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\nThis node is being drained.",
                    _ => b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\nRoute table is not populated yet.",
                };
                let _ = c.write_all(body);
            }
        });
        addr
    }

    #[test]
    fn the_lb_agent_says_drain_while_serve_drains_this_nodes_proxy_and_ready_again_after() {
        let state = Arc::new(AtomicU8::new(0));
        let a = LbAgent::start(0, Some(fake_proxy(state.clone()))).unwrap();
        let ask = || ask_agent(a.port);
        // As HAProxy asks: about once a second (faster here), each answer
        // from what the agent saw at its earlier looks.
        let until = |want: &str, within: Duration| -> Duration {
            let t0 = Instant::now();
            loop {
                if ask() == format!("{want}\n") {
                    return t0.elapsed();
                }
                assert!(t0.elapsed() < within, "no {want:?} within {within:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        assert_eq!(ask(), "ready\n");
        state.store(2, Ordering::SeqCst);
        std::thread::sleep(super::super::drain::LB_LOOK + Duration::from_millis(300));
        for _ in 0..5 {
            assert_eq!(ask(), "ready\n", "a proxy not ready is the health check's");
        }
        // Serve drains the proxy: `drain` after the grace, and before
        // Serve could remove it (30 s without a request).
        state.store(1, Ordering::SeqCst);
        let took = until("drain", Duration::from_secs(20));
        assert!(
            took >= super::super::drain::SERVE_DRAIN_GRACE,
            "drain after {took:?}, before the grace"
        );
        let bound = super::super::drain::LB_LOOK
            + super::super::drain::SERVE_DRAIN_GRACE
            + Duration::from_secs(2);
        assert!(took < bound, "drain only after {took:?}");
        // A replica lands here again: `ready` within about a look.
        state.store(0, Ordering::SeqCst);
        let back = until("ready", Duration::from_secs(5));
        assert!(back < Duration::from_secs(3), "ready again after {back:?}");
        // A stop's drain wins over everything.
        a.drain();
        assert_eq!(ask(), "drain\n");
    }

    #[test]
    fn the_proxy_watch_checks_fast_only_while_its_answer_may_change() {
        let s = Duration::from_secs;
        // After a change (or news), 1 s; then the gap doubles to 30 s.
        let mut gap = next_proxy_check(s(30), true, true, true, false).unwrap();
        let mut gaps = vec![gap];
        for _ in 0..7 {
            gap = next_proxy_check(gap, false, true, true, false).unwrap();
            gaps.push(gap);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 30, 30, 30].map(s));
        assert_eq!(
            next_proxy_check(s(8), false, false, true, false),
            Some(s(16))
        );
        assert_eq!(
            next_proxy_check(s(30), true, false, true, false),
            Some(s(1))
        );
        // No Ray and the proxy down: nothing to check until told.
        assert_eq!(next_proxy_check(s(1), true, false, false, false), None);
        assert_eq!(next_proxy_check(s(4), false, false, false, false), None);
        // No Ray but the proxy still answers: it is going; keep looking.
        assert_eq!(
            next_proxy_check(s(4), false, true, false, false),
            Some(s(8))
        );
        // A drain: every second, whatever else.
        for (fresh, up, ray) in [
            (false, true, true),
            (false, false, false),
            (true, true, false),
        ] {
            assert_eq!(next_proxy_check(s(30), fresh, up, ray, true), Some(s(1)));
        }
    }

    /// A proxy that answers 503 and counts the checks.
    fn counting_proxy() -> (SocketAddr, Arc<AtomicU64>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let n = Arc::new(AtomicU64::new(0));
        let seen = n.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let mut buf = [0u8; 256];
                let _ = c.read(&mut buf);
                let _ = c.write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\n");
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        (addr, n)
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_proxy_watch_sleeps_without_ray_and_wakes_when_told() {
        let (addr, checks) = counting_proxy();
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Stop::new();
        let w = ProxyWatch::start(addr, tx, &stop);
        let first = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(matches!(first, Event::ProxyServing(false)), "{first:?}");
        wait_until("the first check", || checks.load(Ordering::SeqCst) == 1);
        // No Ray, the proxy down: no check until told.
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(checks.load(Ordering::SeqCst), 1, "checked without Ray");
        w.ray(false);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(checks.load(Ordering::SeqCst), 1, "no news, no check");
        // Ray starts: a check at once (the watch was parked).
        w.ray(true);
        wait_until("a check once Ray runs", || {
            checks.load(Ordering::SeqCst) == 2
        });
        // Ray stops: a check at once, then parked again.
        w.ray(false);
        wait_until("a check once Ray stopped", || {
            checks.load(Ordering::SeqCst) == 3
        });
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(checks.load(Ordering::SeqCst), 3, "checked without Ray");
        // A drain: a check at once and then every second, Ray or not.
        w.draining();
        wait_until("fast checks while draining", || {
            checks.load(Ordering::SeqCst) >= 6
        });
        assert!(rx.try_recv().is_err(), "the answer did not change");
        // The stop ends the thread: its sender goes.
        stop.request();
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                _ => assert!(Instant::now() < until, "the watch did not end"),
            }
        }
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
