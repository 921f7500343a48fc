//! The drain of a worker that is stopped on purpose (R-SERVE-4): the
//! decisions only, as a state machine over what the drain helper reports
//! and the clock. No I/O: `drainer.rs` runs the helper and the load
//! balancer's agent-check answer, the node loop feeds this and acts on its
//! steps.
//!
//! The order:
//! 1. the helper asks Ray's GCS to drain this node (nothing new is placed
//!    here; Serve starts a replacement of each replica elsewhere, then
//!    stops the replica here once its requests are done);
//! 2. once another worker's Serve proxy answers (so the load balancer has
//!    another server up, after its rise time), or nothing of Serve is left
//!    here, the load balancer is told `drain`: no new request comes here;
//! 3. once no Serve actor (replica or proxy) is left on this node, nothing
//!    is in flight here: the drain is done and Ray is stopped as before.
//!
//! A drain Ray refuses, a helper that fails, or the timeout end it early;
//! the load balancer is told `drain` in every case before Ray stops.

use std::time::{Duration, Instant};

/// How long another worker's proxy must have answered before the load
/// balancer is trusted to have it up: HAProxy's `rise 2` at `inter 1s`
/// (docker/lb/haproxy.cfg), each check up to its 1 s timeout, and a second
/// of margin. 2.5 s was measured too short: once in a rolling replacement
/// the lb had no server for a second (503 "No server is available").
pub const LB_RISE: Duration = Duration::from_secs(5);

/// How long the load balancer needs to see `drain` (its `agent-inter 1s`,
/// plus the answer's time), when the drain ends without Serve having left
/// this node on its own (refused, failed, timed out).
pub const LB_SEE_DRAIN: Duration = Duration::from_millis(1500);

/// How a drain ended (the `result` label of `argus_drains_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No Serve actor left on the node.
    Drained,
    /// The drain timeout passed first.
    TimedOut,
    /// Ray's GCS refused to drain the node.
    Refused,
    /// The helper failed (it could not reach Ray, or is missing).
    Failed,
    /// Ray ended on its own during the drain (Ray shuts a drained, idle
    /// node down itself).
    RayExited,
    /// No other worker can take this node's replicas: none is alive, or
    /// every other one is being drained too (`compose down` stops them all
    /// at once), so waiting serves no request.
    Nowhere,
}

impl Outcome {
    #[cfg(test)]
    pub const ALL: &[Outcome] = &[
        Outcome::Drained,
        Outcome::TimedOut,
        Outcome::Refused,
        Outcome::Failed,
        Outcome::RayExited,
        Outcome::Nowhere,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Drained => "drained",
            Outcome::TimedOut => "timed_out",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::RayExited => "ray_exited",
            Outcome::Nowhere => "nowhere",
        }
    }
}

/// What the helper (or the node) reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The GCS accepted the drain.
    Accepted,
    /// The GCS refused it, and why.
    Refused(String),
    /// What is on this node and elsewhere now.
    Status {
        /// Serve actors (replicas and the proxy) alive on this node.
        here: u32,
        /// Another worker's Serve proxy answers its health check.
        elsewhere: bool,
        /// Other workers alive, and how many of them Ray drains too
        /// (`None`: not reported).
        others: Option<(u32, u32)>,
    },
    /// The helper failed or ended, and why.
    Failed(String),
    /// Ray ended.
    RayExited,
}

/// What the node does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing until an input comes or this instant passes.
    Wait(Instant),
    /// Tell the load balancer `drain` now (once).
    TellLb,
    /// The drain is over: stop Ray.
    Finish(Outcome),
}

/// One drain.
#[derive(Debug)]
pub struct Drain {
    /// [`LB_RISE`] and [`LB_SEE_DRAIN`], or zero without a load balancer.
    rise: Duration,
    see: Duration,
    started: Instant,
    deadline: Instant,
    accepted: bool,
    here: Option<u32>,
    /// Since when another worker has been serving, without a break.
    elsewhere_since: Option<Instant>,
    lb_told: Option<Instant>,
    /// How the drain ends, once known (after the load balancer saw it).
    ending: Option<Outcome>,
    /// Why it ended early, in words.
    why: Option<String>,
}

impl Drain {
    /// Starts a drain at `now` that may last `timeout`; `lb`: a load
    /// balancer asks this node's agent-check (else there is no one to tell
    /// and nothing to wait for on its side).
    pub fn new(now: Instant, timeout: Duration, lb: bool) -> Self {
        let (rise, see) = if lb {
            (LB_RISE, LB_SEE_DRAIN)
        } else {
            (Duration::ZERO, Duration::ZERO)
        };
        Self {
            rise,
            see,
            started: now,
            deadline: now + timeout,
            accepted: false,
            here: None,
            elsewhere_since: None,
            lb_told: None,
            ending: None,
            why: None,
        }
    }

    /// Takes an input at `now`.
    pub fn on(&mut self, input: Input, now: Instant) {
        match input {
            Input::Accepted => self.accepted = true,
            Input::Refused(why) => self.end(Outcome::Refused, why),
            Input::Status {
                here,
                elsewhere,
                others,
            } => {
                self.here = Some(here);
                if let Some((alive, draining)) = others {
                    if self.accepted && here > 0 && draining >= alive {
                        self.end(
                            Outcome::Nowhere,
                            format!(
                                "no other worker can take the replicas here ({alive} alive, {draining} of them draining)"
                            ),
                        );
                    }
                }
                if !elsewhere {
                    self.elsewhere_since = None;
                } else if self.elsewhere_since.is_none() {
                    self.elsewhere_since = Some(now);
                }
            }
            Input::Failed(why) => self.end(Outcome::Failed, why),
            Input::RayExited => self.end(Outcome::RayExited, "ray ended".into()),
        }
    }

    fn end(&mut self, outcome: Outcome, why: String) {
        if self.ending.is_none() {
            self.ending = Some(outcome);
            self.why = Some(why);
        }
    }

    /// Returns the next step at `now`. [`Step::TellLb`] is returned once;
    /// the caller tells the load balancer and asks again.
    pub fn poll(&mut self, now: Instant) -> Step {
        if self.ending.is_none() && now >= self.deadline {
            self.end(Outcome::TimedOut, "the drain timeout passed".into());
        }
        let nothing_here = self.accepted && self.here == Some(0);
        let others_up = self
            .elsewhere_since
            .is_some_and(|t| now.duration_since(t) >= self.rise);
        if self.lb_told.is_none() && (self.ending.is_some() || nothing_here || others_up) {
            self.lb_told = Some(now);
            return Step::TellLb;
        }
        if let Some(outcome) = self.ending {
            // Ray gone: nothing here can take a request any more.
            let lb_saw = outcome == Outcome::RayExited
                || self
                    .lb_told
                    .is_some_and(|t| now.duration_since(t) >= self.see);
            return match (lb_saw, self.lb_told) {
                (true, _) | (false, None) => Step::Finish(outcome),
                (false, Some(t)) => Step::Wait(t + self.see),
            };
        }
        if nothing_here && self.lb_told.is_some() {
            self.ending = Some(Outcome::Drained);
            return Step::Finish(Outcome::Drained);
        }
        let mut at = self.deadline;
        if let (None, Some(t)) = (self.lb_told, self.elsewhere_since) {
            at = at.min(t + self.rise);
        }
        Step::Wait(at)
    }

    /// When the drain started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// When the load balancer was told, if it was.
    pub fn lb_told(&self) -> Option<Instant> {
        self.lb_told
    }

    /// Why the drain ended early, if it did.
    pub fn why(&self) -> Option<&str> {
        self.why.as_deref()
    }

    /// Serve actors left on this node at the last report.
    pub fn here(&self) -> Option<u32> {
        self.here
    }
}

/// What this node's Serve proxy answered its health check
/// (`GET /-/healthz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHealth {
    /// 200: it routes to running replicas.
    Serving,
    /// 503 "This node is being drained.": Serve drains the proxy of a node
    /// that holds no replica any more, and removes it once it has had no
    /// request for 30 s (Ray's `RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S`).
    Draining,
    /// Anything else: no proxy, or one not ready yet.
    Down,
}

/// How long the agent-check keeps answering `ready` after it first saw
/// Serve draining this node's proxy. Serve drains it once the node holds no
/// replica; the replicas it had moved start-first, so another worker's
/// proxy answered 200 just before, and the lb marks that one up after its
/// `rise 2` at `inter 1s` (2 s, each check up to its 1 s timeout): telling
/// `drain` sooner can leave the lb without a server for a second.
pub const SERVE_DRAIN_GRACE: Duration = Duration::from_secs(4);

/// The agent-check looks at the proxy again, after an answer, once its last
/// look is this old while the proxy is draining (so that it answers
/// `ready` again soon after it stops draining) ...
pub const LB_LOOK_DRAINING: Duration = Duration::from_secs(1);
/// ... and this old otherwise. The lb is told `drain` at most
/// [`LB_LOOK`] + [`SERVE_DRAIN_GRACE`] + its `agent-inter` (1 s) after
/// Serve began draining the proxy: 7 s, inside the time Serve keeps a
/// draining proxy (`RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S`: the compose
/// file's 15 s, Ray's default 30 s).
pub const LB_LOOK: Duration = Duration::from_secs(2);

/// The least time Serve keeps a draining proxy that the agent-check allows
/// for (docker-compose.yaml's `RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S`; the
/// tests hold the two together).
#[cfg(test)]
const SERVE_PROXY_MIN_DRAINING: Duration = Duration::from_secs(15);

/// The load balancer's agent-check answer: `drain` once a stop's drain
/// told it (no new request comes here), or while Serve has been draining
/// this node's proxy for [`SERVE_DRAIN_GRACE`] (`proxy_draining_since`):
/// the lb kept sending requests to a proxy that Serve drains, and Serve
/// removed it while the requests it had just been sent were in flight (a
/// stream cut mid-answer). Else `ready` (a proxy that is down is the
/// health check's to take out).
pub fn lb_answer(
    stop_drain: bool,
    proxy_draining_since: Option<Instant>,
    now: Instant,
) -> &'static str {
    let serve_drains =
        proxy_draining_since.is_some_and(|t| now.duration_since(t) >= SERVE_DRAIN_GRACE);
    if stop_drain || serve_drains {
        "drain"
    } else {
        "ready"
    }
}

/// Whether the agent-check looks at the proxy again now, its last look
/// having been at `last` and found `health` ([`LB_LOOK_DRAINING`],
/// [`LB_LOOK`]).
pub fn lb_look_due(last: Option<(Instant, ProxyHealth)>, now: Instant) -> bool {
    match last {
        None => true,
        Some((at, ProxyHealth::Draining)) => now.duration_since(at) >= LB_LOOK_DRAINING,
        Some((at, _)) => now.duration_since(at) >= LB_LOOK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(120);

    fn s(here: u32, elsewhere: bool) -> Input {
        Input::Status {
            here,
            elsewhere,
            others: Some((1, 0)),
        }
    }

    #[test]
    fn the_lb_is_told_drain_while_serve_drains_the_proxy_past_the_grace_or_on_a_stop() {
        let t0 = Instant::now();
        assert_eq!(lb_answer(false, None, t0), "ready");
        assert_eq!(lb_answer(true, None, t0), "drain", "a stop's drain");
        let later = t0 + SERVE_DRAIN_GRACE;
        assert_eq!(
            lb_answer(false, Some(t0), later - Duration::from_millis(1)),
            "ready",
            "the other worker may not be up in the lb yet"
        );
        assert_eq!(lb_answer(false, Some(t0), later), "drain");
        assert_eq!(lb_answer(true, Some(later), later), "drain");
        // Told within the look, the grace and HAProxy's agent-inter (1 s),
        // with time to spare before Serve may remove the proxy.
        let told = LB_LOOK + SERVE_DRAIN_GRACE + Duration::from_secs(1);
        assert!(told + Duration::from_secs(5) <= SERVE_PROXY_MIN_DRAINING);
        let compose = include_str!("../../docker-compose.yaml");
        assert!(
            compose.contains(&format!(
                "RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S:-{}}}",
                SERVE_PROXY_MIN_DRAINING.as_secs()
            )),
            "docker-compose.yaml keeps draining proxies for another time"
        );
    }

    #[test]
    fn the_agent_check_looks_at_the_proxy_often_only_while_serve_drains_it() {
        let t0 = Instant::now();
        assert!(lb_look_due(None, t0));
        for h in [ProxyHealth::Serving, ProxyHealth::Down] {
            assert!(!lb_look_due(
                Some((t0, h)),
                t0 + LB_LOOK - Duration::from_millis(1)
            ));
            assert!(lb_look_due(Some((t0, h)), t0 + LB_LOOK));
        }
        let d = Some((t0, ProxyHealth::Draining));
        assert!(!lb_look_due(d, t0 + Duration::from_millis(500)));
        assert!(lb_look_due(d, t0 + LB_LOOK_DRAINING));
    }

    #[test]
    fn waits_for_another_server_before_the_lb_and_for_nothing_here_before_the_end() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, T, true);
        assert_eq!(d.poll(t0), Step::Wait(t0 + T));
        d.on(Input::Accepted, t0);
        d.on(s(3, false), t0);
        assert_eq!(d.poll(t0), Step::Wait(t0 + T), "no other server yet");
        let t1 = t0 + Duration::from_secs(20);
        d.on(s(3, true), t1);
        assert_eq!(
            d.poll(t1),
            Step::Wait(t1 + LB_RISE),
            "the lb needs its rise time"
        );
        // A break in the other server's health restarts the rise.
        d.on(s(3, false), t1 + Duration::from_secs(1));
        let t2 = t1 + Duration::from_secs(2);
        d.on(s(3, true), t2);
        assert_eq!(
            d.poll(t2 + Duration::from_secs(1)),
            Step::Wait(t2 + LB_RISE)
        );
        assert_eq!(d.poll(t2 + LB_RISE), Step::TellLb);
        assert_eq!(d.lb_told(), Some(t2 + LB_RISE));
        // Told once; then the replicas and the proxy leave.
        let t3 = t2 + Duration::from_secs(10);
        d.on(s(1, true), t3);
        assert_eq!(d.poll(t3), Step::Wait(t0 + T));
        d.on(s(0, true), t3);
        assert_eq!(d.poll(t3), Step::Finish(Outcome::Drained));
    }

    #[test]
    fn a_node_without_serve_tells_the_lb_and_ends_at_once() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, T, true);
        d.on(s(0, false), t0);
        assert_eq!(
            d.poll(t0),
            Step::Wait(t0 + T),
            "nothing here means nothing before Ray accepted the drain"
        );
        d.on(Input::Accepted, t0);
        assert_eq!(d.poll(t0), Step::TellLb);
        assert_eq!(d.poll(t0), Step::Finish(Outcome::Drained));
    }

    #[test]
    fn the_timeout_tells_the_lb_and_gives_it_time_to_see_it() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, T, true);
        d.on(Input::Accepted, t0);
        d.on(s(2, false), t0);
        let end = t0 + T;
        assert_eq!(d.poll(end), Step::TellLb);
        assert_eq!(d.poll(end), Step::Wait(end + LB_SEE_DRAIN));
        assert_eq!(d.poll(end + LB_SEE_DRAIN), Step::Finish(Outcome::TimedOut));
        assert_eq!(d.why(), Some("the drain timeout passed"));
    }

    #[test]
    fn a_refused_or_failed_drain_ends_after_the_lb_saw_it() {
        for (input, outcome) in [
            (Input::Refused("head node".into()), Outcome::Refused),
            (Input::Failed("no ray".into()), Outcome::Failed),
        ] {
            let t0 = Instant::now();
            let mut d = Drain::new(t0, T, true);
            d.on(input, t0);
            assert_eq!(d.poll(t0), Step::TellLb);
            assert_eq!(d.poll(t0), Step::Wait(t0 + LB_SEE_DRAIN));
            assert_eq!(d.poll(t0 + LB_SEE_DRAIN), Step::Finish(outcome));
        }
    }

    #[test]
    fn without_a_load_balancer_nothing_waits_on_its_side() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, T, false);
        d.on(Input::Failed("no helper".into()), t0);
        assert_eq!(d.poll(t0), Step::TellLb);
        assert_eq!(d.poll(t0), Step::Finish(Outcome::Failed));
        let mut d = Drain::new(t0, T, false);
        d.on(Input::Accepted, t0);
        d.on(s(2, true), t0);
        assert_eq!(d.poll(t0), Step::TellLb, "no rise time to wait for");
        assert_eq!(d.poll(t0), Step::Wait(t0 + T));
    }

    #[test]
    fn when_no_other_worker_can_take_the_replicas_the_drain_ends() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, T, true);
        d.on(Input::Accepted, t0);
        let st = |others| Input::Status {
            here: 2,
            elsewhere: false,
            others,
        };
        d.on(st(Some((1, 0))), t0);
        d.on(st(None), t0);
        d.on(st(Some((2, 1))), t0);
        assert_eq!(d.poll(t0), Step::Wait(t0 + T), "one worker can take them");
        d.on(st(Some((2, 2))), t0);
        assert_eq!(d.poll(t0), Step::TellLb);
        assert_eq!(d.poll(t0 + LB_SEE_DRAIN), Step::Finish(Outcome::Nowhere));
        // None alive at all (the last worker of a `compose down`).
        let mut d = Drain::new(t0, T, true);
        d.on(Input::Accepted, t0);
        d.on(st(Some((0, 0))), t0);
        assert_eq!(d.poll(t0), Step::TellLb);
        assert_eq!(d.poll(t0 + LB_SEE_DRAIN), Step::Finish(Outcome::Nowhere));
    }

    #[test]
    fn every_outcome_is_a_metrics_label() {
        let mut names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        // The node's own: a drain given up at the stop (node/drainer.rs).
        names.push("skipped");
        assert_eq!(names, argus_telemetry::metrics::DRAIN_RESULTS);
    }

    #[test]
    fn ray_ending_ends_the_drain_at_once_and_the_first_ending_is_kept() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, T, true);
        d.on(Input::Accepted, t0);
        d.on(s(1, true), t0);
        d.on(Input::RayExited, t0);
        d.on(Input::Failed("helper lost its ray".into()), t0);
        assert_eq!(d.poll(t0), Step::TellLb);
        assert_eq!(d.poll(t0), Step::Finish(Outcome::RayExited));
        assert_eq!(d.why(), Some("ray ended"));
    }
}
