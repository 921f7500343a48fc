//! The worker role: wait for a fresh record, join, follow the head.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::{HeadState, ReadError};
use rand::Rng;
use tracing::{debug, info, warn};

use argus_supervise::storage::StorageError;
use argus_supervise::watch::WatchState;
use argus_telemetry::status::NodeState;

use super::head::{self, Probe};
use super::probe::{Probed, Purpose};
use super::reader::{ReadResult, RecordReader};
use super::{Node, RoleLoop, RoleStatus, Target, STORAGE_BOUND, WAIT_LOG_EVERY};

#[derive(Default)]
pub(super) struct WorkerRole {
    /// Since when the joined head's GCS has not accepted connections.
    pub(super) gcs_down_since: Option<Instant>,
    /// When the last probe that found the joined head's GCS down was asked
    /// for while the record had stood still for the probe threshold: the
    /// evidence of a crashed head (see [`head_looks_crashed`]).
    pub(super) quiet_refusal: Option<Instant>,
    pub(super) next_gcs_probe: Option<Instant>,
    /// The long outage was logged (once per outage).
    pub(super) gcs_reported: bool,
    /// What probes of the joined head's GCS found once its record stopped
    /// changing (status `head_gcs`).
    pub(super) gcs_note: Option<String>,
    pub(super) max_generation: u64,
    /// The head the next start will join.
    pub(super) desired: Option<Target>,
    /// The last target that a start was scheduled for (jitter applied once).
    pub(super) scheduled: Option<Target>,
    /// Ray exited while its head looked crashed: no restart against this
    /// record until it changes (see [`Node::on_worker_ray_exit`]).
    pub(super) held: Option<Held>,
}

/// A restart held back until the head's record changes.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// The head Ray was joined to when it exited.
    pub(super) target: Target,
    /// When the record last changed at the time of the exit.
    pub(super) changed_at: Option<Instant>,
    /// What the worker says while it waits (status reason, log).
    pub(super) why: String,
}

impl RoleLoop for WorkerRole {
    const DRAINS: bool = true;

    fn start(node: &mut Node<Self>) -> Result<(), i32> {
        node.start_worker()
    }

    fn tick(node: &mut Node<Self>) {
        node.worker_tick();
    }

    fn wake(node: &Node<Self>, at: &mut Instant) {
        let mut by = |t: Instant| *at = (*at).min(t);
        // A read under way is judged hung after STORAGE_BOUND.
        if let Some(since) = node.reader.as_ref().and_then(RecordReader::reading_since) {
            by(since + STORAGE_BOUND);
        }
        if node.ray.is_none() && (node.role.desired.is_some() || node.state == NodeState::Backoff) {
            by(node.start_after);
        }
    }

    fn on_record(node: &mut Node<Self>, read: ReadResult) {
        node.on_record(read);
    }

    fn on_file_events(node: &mut Node<Self>, state: WatchState) {
        node.on_file_events(state);
    }

    fn on_probed(node: &mut Node<Self>, a: &Probed) {
        match a.purpose {
            Purpose::Joined => node.on_joined_probe(a),
            // A worker probes only the head it joined.
            Purpose::Serving | Purpose::Holder => {}
        }
    }

    fn on_ray_ended(node: &mut Node<Self>, joined: Option<Target>) {
        node.on_worker_ray_exit(joined);
    }

    fn withdraw_within(_: &mut Node<Self>, _: Duration) {
        // A worker publishes nothing.
    }

    fn status(node: &Node<Self>) -> RoleStatus {
        let record = node.record.as_ref();
        RoleStatus {
            generation: record.map(|r| r.generation),
            head_address: record.map(|r| r.gcs_address()),
            head_instance: record.map(|r| r.instance_id.clone()),
            takeover: None,
            // Only while it still holds: a record that changed after the
            // last quiet refusal was refreshed by a live head.
            head_gcs: node
                .role
                .quiet_refusal
                .filter(|&q| head_looks_crashed(Some(q), node.lease.changed_at()))
                .and(node.role.gcs_note.clone()),
            gcs_ft: record.is_some_and(|r| r.gcs_ft),
            record_changed_at: node.lease.changed_at(),
        }
    }
}

impl Node<WorkerRole> {
    // ---- worker ----------------------------------------------------------

    /// Starts the worker's helpers: the dead-actor reaper, the Serve
    /// proxy's watch and the head record's reader thread.
    fn start_worker(&mut self) -> Result<(), i32> {
        self.actor_reaper = Some(super::actor_reaper::ActorReaper::start(
            self.cfg.ray_user.clone(),
            super::auth::client_env(&self.cfg),
            &self.stop,
        ));
        self.start_serve_watch();
        let path = self.cfg.head_file.clone();
        // The loop judges a quiet record from max(poll, TTL/4) on
        // (check_head_gcs): until then a read of the same bytes is no news.
        let quiet_after = self.cfg.poll.max(self.cfg.ttl / 4);
        match RecordReader::start(
            path,
            self.cfg.poll,
            quiet_after,
            self.cfg.file_events,
            self.tx.clone(),
        ) {
            Ok(r) => self.reader = Some(r),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the head record's reader thread");
                return Err(1);
            }
        }
        Ok(())
    }

    /// Notes what file events the reader set up (status `file_events`).
    pub(super) fn on_file_events(&mut self, state: WatchState) {
        match &state {
            WatchState::Active => {
                debug!("watching for file events (a shortcut; polling is primary)")
            }
            WatchState::Degraded(why) => warn!(error = %why, "no file events; polling alone"),
            WatchState::Off => {}
        }
        self.watch_state = state;
        self.write_status();
    }

    /// Takes a read of the record (from the reader thread) and updates
    /// what the worker should be joined to.
    pub(super) fn on_record(&mut self, read: ReadResult) {
        let path = self.cfg.head_file.clone();
        self.storage_ok();
        let now = Instant::now();
        match read {
            Ok((rec, raw)) => {
                self.lease.observe(&raw, now);
                self.record_error = None;
                let max = self.role.max_generation;
                if rec.generation < max {
                    self.record_error = Some(format!(
                        "record of generation {} is older than generation {max} already seen (a fenced head?)",
                        rec.generation
                    ));
                } else {
                    self.role.max_generation = rec.generation;
                    if let Some(skew) = rec.wall_age(SystemTime::now()) {
                        if skew.abs() > 30.0 + rec.ttl_s {
                            debug!(skew_s = skew, "head's clock and ours disagree (harmless: freshness uses our monotonic clock)");
                        }
                    }
                    self.record = Some(rec);
                }
            }
            Err(ReadError::Untrusted(why)) => {
                // Forged or planted: never followed, never a generation
                // to remember (hole 5); the lease is not fed either.
                argus_telemetry::metrics::storage_error("malformed");
                if self.record_error.as_deref() != Some(why.as_str()) {
                    warn!(error = %why, "ignoring a head record the agent did not write");
                }
                self.record_error = Some(why);
            }
            Err(ReadError::Bad { raw, source, .. }) => {
                self.lease.observe(&raw, now);
                argus_telemetry::metrics::storage_error("malformed");
                self.record_error = Some(format!("malformed head record: {source}"));
            }
            Err(e) if e.is_missing() => {
                self.lease.observe_missing(now);
                self.record = None;
                self.record_error = Some(format!("{} does not exist yet", path.display()));
            }
            Err(e) => {
                argus_telemetry::metrics::storage_error("io");
                self.record_error = Some(format!("unreadable head record: {e}"));
            }
        }
        let fresh = self.lease.is_fresh(self.cfg.ttl, now);
        let desired = match (&self.record, &self.record_error) {
            (Some(r), None) if r.state == HeadState::Running && fresh => Some(Target {
                generation: r.generation,
                instance_id: r.instance_id.clone(),
                address: r.gcs_address(),
                gcs_ft: r.gcs_ft,
            }),
            _ => None,
        };
        if desired.is_none() && self.record_error.is_none() {
            self.record_error = Some(match &self.record {
                Some(r) if r.state == HeadState::Stopped => "the head withdrew its record (state stopped)".into(),
                Some(_) if self.lease.changed_at().is_none() => {
                    "head record has not changed since this agent started (waiting to see it refreshed)".into()
                }
                _ => format!(
                    "head record expired: unchanged for {:.0}s (TTL {:.0}s)",
                    self.lease.unchanged_for(now).as_secs_f64(),
                    self.cfg.ttl.as_secs_f64()
                ),
            });
        }
        // One line per poll: what the worker saw (tests wait on it as
        // evidence that a poll happened).
        debug!(fresh, wanted = desired.is_some(), error = ?self.record_error, "head record polled");
        self.role.desired = desired;
    }

    pub(super) fn worker_tick(&mut self) {
        let now = Instant::now();
        // R-WRK-4: a hung read is a transient error, never a reason to
        // touch Ray; the lease just sees no change.
        let hung = self
            .reader
            .as_ref()
            .and_then(RecordReader::reading_since)
            .is_some_and(|since| now.saturating_duration_since(since) >= STORAGE_BOUND);
        if hung {
            let e = StorageError::TimedOut {
                op: "read head record",
                after: STORAGE_BOUND,
            };
            self.storage_failed(&e);
            self.record_error = Some(format!("cannot read the head record: {e}"));
            self.role.desired = None;
        }
        let desired = self.role.desired.clone();
        let joined = self.ray.as_ref().and_then(|r| r.target.clone());
        if self.ray.is_some() {
            self.check_head_gcs(now, joined.as_ref());
            if self.ray.is_none() {
                return;
            }
            match &desired {
                Some(t) if joined.as_ref().is_some_and(|j| rides_through(j, t)) => {
                    info!(from = ?joined.as_ref().map(|j| j.to_string()), to = %t,
                        "head restarted at the same address with GCS fault tolerance; ray keeps running (ride-through)");
                    if let Some(r) = self.ray.as_mut() {
                        r.target = Some(t.clone());
                    }
                    // The restarted GCS forgets where its restored actors
                    // run: reap what it then kills without telling us.
                    if let Some(a) = &self.actor_reaper {
                        a.arm(Some(&t.address));
                        a.joined(Some(&t.address));
                    }
                    self.role.scheduled = Some(t.clone());
                    self.set_state(
                        NodeState::Running,
                        format!("joined head {t} (rode a head restart through)"),
                    );
                }
                Some(t) if Some(t) != joined.as_ref() => {
                    info!(from = ?joined.as_ref().map(|j| j.to_string()), to = %t, "head changed; rejoining");
                    argus_telemetry::metrics::rejoin(match &joined {
                        Some(j) if j.address != t.address => "address",
                        Some(j) if j.instance_id != t.instance_id => "instance",
                        _ => "generation",
                    });
                    self.stop_ray_now("head changed");
                    // A new head is not the failure we backed off from.
                    self.backoff.reset();
                    self.start_after = Instant::now();
                    self.schedule_join(t.clone());
                }
                Some(_) => {}
                None => {
                    // R-WRK-4: a stale or unreadable record never tears down
                    // a Ray that may still be connected.
                    if self
                        .last_wait_log
                        .is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY)
                    {
                        self.last_wait_log = Some(now);
                        warn!(reason = ?self.record_error, "head record not fresh; keeping ray running");
                    }
                }
            }
            return;
        }
        if let (Some(t), Some(h)) = (&desired, self.role.held.clone()) {
            if &h.target == t && self.lease.changed_at() == h.changed_at {
                if self.state != NodeState::WaitingForHead {
                    info!(reason = %h.why, "waiting for head");
                }
                self.set_state(NodeState::WaitingForHead, h.why);
                return;
            }
            debug!("the head's record changed since ray exited; restart no longer held");
            self.role.held = None;
        }
        match desired {
            Some(t) => {
                if self.role.scheduled.as_ref() != Some(&t) {
                    // A new head instance resets a backoff earned against
                    // the previous one: join within a poll period + jitter.
                    if self.role.scheduled.is_some() {
                        self.backoff.reset();
                        self.start_after = Instant::now();
                    }
                    self.schedule_join(t.clone());
                }
                if Instant::now() >= self.start_after {
                    self.last_wait_log = None;
                    // What probes said of the previous Ray's head is no
                    // evidence about this one.
                    let w = &mut self.role;
                    (w.gcs_down_since, w.next_gcs_probe, w.gcs_reported) = (None, None, false);
                    w.quiet_refusal = None;
                    if let Some(a) = &self.actor_reaper {
                        a.arm(None);
                        a.joined(Some(&t.address));
                    }
                    self.start_ray(Some(t));
                }
            }
            None => {
                let why = self
                    .record_error
                    .clone()
                    .unwrap_or_else(|| "no head record".into());
                if self.state != NodeState::Backoff || now >= self.start_after {
                    if self.state != NodeState::WaitingForHead {
                        self.last_wait_log = None;
                    }
                    if self
                        .last_wait_log
                        .is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY)
                    {
                        self.last_wait_log = Some(now);
                        let waited = match self.state {
                            NodeState::WaitingForHead => {
                                self.state_since.elapsed().unwrap_or_default()
                            }
                            _ => Duration::ZERO,
                        };
                        info!(reason = %why, waited_s = waited.as_secs(), "waiting for head");
                    }
                    self.set_state(NodeState::WaitingForHead, why);
                }
            }
        }
    }

    /// Probes the joined head's GCS once its record has stopped changing
    /// (a crashed head cannot withdraw): reports a GCS that refuses for
    /// longer than [`GCS_REPORT_AFTER`] in logs and status, without
    /// touching Ray (the head may come back at the same address). With GCS
    /// fault tolerance, a worker cut off from the GCS for longer than
    /// `ARGUS_GCS_FT_ZOMBIE_S` is rejoined (the zombie-worker guard).
    fn check_head_gcs(&mut self, now: Instant, joined: Option<&Target>) {
        let Some(j) = joined else { return };
        let quiet = self
            .lease
            .changed_at()
            .map_or(Duration::MAX, |t| now.saturating_duration_since(t));
        let probe_after = self.cfg.poll.max(self.cfg.ttl / 4);
        let w = &mut self.role;
        if quiet < probe_after && w.gcs_down_since.is_none() {
            w.gcs_note = None;
            return;
        }
        if w.next_gcs_probe.is_some_and(|t| now < t) {
            return;
        }
        w.next_gcs_probe = Some(now + Duration::from_secs(1));
        if let Ok(addr) = j.address.parse::<SocketAddr>() {
            // The answer arrives as an event: [`Node::on_joined_probe`].
            self.prober.gcs(Purpose::Joined, addr, head::PROBE_TIMEOUT);
        }
    }

    /// Worker: judges a probe of the joined head's GCS (see
    /// [`Node::check_head_gcs`]).
    pub(super) fn on_joined_probe(&mut self, a: &Probed) {
        let joined = self.ray.as_ref().and_then(|r| r.target.clone());
        let Some(j) = joined.filter(|j| j.address.parse() == Ok(a.addr)) else {
            return;
        };
        let (addr, p, now) = (a.addr, a.probe, a.at);
        let w = &mut self.role;
        if p == Probe::Accepts {
            if let Some(since) = w.gcs_down_since.take() {
                info!(%addr, down_s = since.elapsed().as_secs_f64(), "the head's gcs accepts connections again");
            }
            (w.gcs_note, w.quiet_refusal) = (None, None);
            return;
        }
        let probe_after = self.cfg.poll.max(self.cfg.ttl / 4);
        if asked_while_quiet(a.asked, self.lease.changed_at(), probe_after) {
            self.role.quiet_refusal = Some(a.asked);
        }
        let w = &mut self.role;
        let since = *w.gcs_down_since.get_or_insert(now);
        let down = now.saturating_duration_since(since);
        let what = if p == Probe::Refused {
            "refusing connections"
        } else {
            "not answering (timeouts)"
        };
        let note = format!(
            "the head's GCS at {addr} has been {what} for {:.0}s and its record has not changed",
            down.as_secs_f64()
        );
        if down >= GCS_REPORT_AFTER && !w.gcs_reported {
            w.gcs_reported = true;
            warn!(%addr, down_s = down.as_secs_f64(), "{note}; keeping ray (the head may come back at the same address)");
        }
        if down < GCS_REPORT_AFTER {
            w.gcs_reported = false;
        }
        w.gcs_note = Some(note);
        if j.gcs_ft && down >= self.cfg.gcs_ft_zombie {
            warn!(%addr, down_s = down.as_secs_f64(), zombie_s = self.cfg.gcs_ft_zombie.as_secs_f64(),
                "cut off from the GCS past ARGUS_GCS_FT_ZOMBIE_S; restarting ray to rejoin (zombie-worker guard)");
            let w = &mut self.role;
            (w.gcs_down_since, w.quiet_refusal) = (None, None);
            w.scheduled = None;
            argus_telemetry::metrics::rejoin("zombie_guard");
            self.stop_ray_now("zombie-worker guard");
            self.start_after = Instant::now();
        }
    }

    /// Worker: Ray (joined to `joined`) exited on its own. When the joined
    /// head's GCS has stopped accepting connections and its record has
    /// stopped changing (a crashed head: the raylet gives up on a GCS that
    /// is gone), a restart now would join the old record's address, and
    /// Ray would start a second time once the head republishes a new
    /// instance. The restart waits for the record to change instead: a
    /// refresh (the head lives) or a new instance (join it, once).
    pub(super) fn on_worker_ray_exit(&mut self, joined: Option<Target>) {
        let changed_at = self.lease.changed_at();
        let w = &mut self.role;
        let (Some(target), Some(since)) = (joined, w.gcs_down_since) else {
            return;
        };
        if !head_looks_crashed(w.quiet_refusal, changed_at) {
            // No probe found the GCS down after the record last changed
            // and stood still: the head lives (it refreshed), so this is an
            // ordinary restart.
            return;
        }
        let why = format!(
            "ray exited while the head's GCS at {} was down ({:.0}s) and its record unchanged; \
             waiting for the head to refresh or republish its record",
            target.address,
            since.elapsed().as_secs_f64()
        );
        info!(head = %target, "{why}");
        w.held = Some(Held {
            target,
            changed_at,
            why,
        });
    }

    /// Delays the join to a new head by a random jitter (R-WRK-6) so many
    /// workers do not stampede it; at most half a poll period.
    pub(super) fn schedule_join(&mut self, t: Target) {
        let max = (self.cfg.poll / 2).min(Duration::from_secs(5));
        let jitter = max.mul_f64(self.rng.random_range(0.0..=1.0));
        let at = Instant::now() + jitter;
        if at > self.start_after {
            self.start_after = at;
        }
        debug!(target = %t, jitter_ms = jitter.as_millis() as u64, "join scheduled");
        self.role.scheduled = Some(t);
    }
}

/// Returns true if and only if the joined head looks crashed to a worker
/// whose Ray just exited: a probe asked for while the record stood still
/// found its GCS down (`quiet_refusal`, see [`asked_while_quiet`]), and the
/// record has not changed since (`record_changed_at`). A record that
/// changed after that probe was refreshed by a live head; a refresh that a
/// loaded machine delays past the probe threshold must not hold a restart
/// (seen in CI: a 200 ms refresh delayed past it), and neither may the
/// first refusal of a streak whose head refreshed since (seen in CI: the
/// head's last refresh noticed after the first refused probe).
pub(super) fn head_looks_crashed(
    quiet_refusal: Option<Instant>,
    record_changed_at: Option<Instant>,
) -> bool {
    quiet_refusal.is_some_and(|q| record_changed_at.is_none_or(|c| c <= q))
}

/// Returns true if and only if a probe asked for at `asked` is evidence of
/// a quiet record: the record had not changed for `probe_after` by then
/// (never changed counts as quiet). Probes go on while the GCS stays down,
/// also after the record moved again; those are not evidence.
pub(super) fn asked_while_quiet(
    asked: Instant,
    record_changed_at: Option<Instant>,
    probe_after: Duration,
) -> bool {
    record_changed_at.is_none_or(|c| {
        asked
            .checked_duration_since(c)
            .is_some_and(|quiet| quiet >= probe_after)
    })
}

/// After this long a head GCS that refuses connections is reported.
const GCS_REPORT_AFTER: Duration = Duration::from_secs(10);

/// Returns true if and only if a worker joined to `joined` keeps its Ray
/// when the record moves to `to`: the head came back at the same address
/// and both run with GCS fault tolerance, so the raylet reconnects to the
/// restarted GCS by itself (R-WRK-7).
pub(super) fn rides_through(joined: &Target, to: &Target) -> bool {
    joined.gcs_ft && to.gcs_ft && joined.address == to.address && joined != to
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(addr: &str, instance: &str, generation: u64, gcs_ft: bool) -> Target {
        Target {
            generation,
            instance_id: instance.into(),
            address: addr.into(),
            gcs_ft,
        }
    }

    #[test]
    fn a_head_whose_record_changed_after_its_gcs_went_down_lives() {
        let down = Instant::now();
        let before = down - Duration::from_millis(800);
        let after = down + Duration::from_millis(200);
        assert!(head_looks_crashed(Some(down), Some(before)));
        assert!(head_looks_crashed(Some(down), Some(down)));
        assert!(head_looks_crashed(Some(down), None));
        assert!(!head_looks_crashed(Some(down), Some(after)));
        assert!(!head_looks_crashed(None, Some(before)));
        assert!(!head_looks_crashed(None, None));
    }

    #[test]
    fn only_a_probe_asked_for_after_the_record_stood_still_is_evidence() {
        let threshold = Duration::from_secs(5);
        let changed = Instant::now();
        let at = |ms| changed + Duration::from_millis(ms);
        assert!(asked_while_quiet(at(5_000), Some(changed), threshold));
        assert!(asked_while_quiet(at(9_000), Some(changed), threshold));
        assert!(!asked_while_quiet(at(4_999), Some(changed), threshold));
        assert!(!asked_while_quiet(at(200), Some(changed), threshold));
        // A change noticed after the probe was asked for: not quiet.
        assert!(!asked_while_quiet(changed, Some(at(300)), threshold));
        assert!(asked_while_quiet(changed, None, threshold));
    }

    /// The race of a CI run under load: the head paused, a probe found the
    /// GCS down, the head's last refresh was noticed after it, then the
    /// head crashed. The first refusal is no evidence; the next quiet one is.
    #[test]
    fn a_refusal_before_the_heads_last_refresh_is_replaced_by_a_later_quiet_one() {
        let threshold = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let first_refusal = at(5_000);
        let late_refresh = Some(at(6_000));
        assert!(!head_looks_crashed(Some(first_refusal), late_refresh));
        // Probes go on every second; only one 5 s after the refresh counts.
        assert!(!asked_while_quiet(at(7_000), late_refresh, threshold));
        let quiet = at(11_000);
        assert!(asked_while_quiet(quiet, late_refresh, threshold));
        assert!(head_looks_crashed(Some(quiet), late_refresh));
    }

    #[test]
    fn a_fault_tolerant_head_restarted_at_the_same_address_is_ridden_through() {
        let j = t("10.0.0.5:6379", "a", 1, true);
        assert!(rides_through(&j, &t("10.0.0.5:6379", "b", 1, true)));
        assert!(rides_through(&j, &t("10.0.0.5:6379", "b", 2, true)));
    }

    #[test]
    fn without_gcs_ft_or_at_another_address_the_worker_rejoins() {
        let j = t("10.0.0.5:6379", "a", 1, true);
        assert!(!rides_through(&j, &t("10.0.0.6:6379", "b", 2, true)));
        assert!(!rides_through(&j, &t("10.0.0.5:6379", "b", 2, false)));
        let plain = t("10.0.0.5:6379", "a", 1, false);
        assert!(!rides_through(&plain, &t("10.0.0.5:6379", "b", 1, true)));
    }
}
