//! The worker role: wait for a fresh record, join, follow the head.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::{read_record, HeadState, ReadError};
use rand::Rng;
use tracing::{debug, info, warn};

use crate::status::NodeState;

use super::{Event, Node, RoleState, Target, WAIT_LOG_EVERY};

#[derive(Default)]
pub(super) struct WorkerRole {
    /// What probes of the joined head's GCS found once its record stopped
    /// changing (status `head_gcs`).
    pub(super) gcs_note: Option<String>,
    pub(super) max_generation: u64,
    /// The head the next start will join.
    pub(super) desired: Option<Target>,
    /// The last target that a start was scheduled for (jitter applied once).
    pub(super) scheduled: Option<Target>,
}

impl Node {
    // ---- worker ----------------------------------------------------------

    pub(super) fn worker(&mut self) -> &mut WorkerRole {
        match &mut self.role {
            RoleState::Worker(w) => w,
            RoleState::Head(_) => unreachable!("worker state on a head"),
        }
    }

    pub(super) fn ensure_watch(&mut self) {
        if self.watcher.is_some() || !self.cfg.file_events {
            return;
        }
        use notify::Watcher;
        let Some(dir) = self.cfg.head_file.parent().map(|d| d.to_path_buf()) else {
            return;
        };
        if !dir.is_dir() {
            return;
        }
        let name = self.cfg.head_file.file_name().map(|n| n.to_os_string());
        let tx = self.tx.clone();
        let pending = self.event_pending.clone();
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            // Our own reads raise open/access events: reacting to them would
            // be a feedback loop that floods the event queue.
            if matches!(ev.kind, notify::EventKind::Access(_)) {
                return;
            }
            let ours = ev
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == name);
            // At most one hint waits in the queue, however many events come.
            if ours && !pending.swap(true, Ordering::AcqRel) {
                let _ = tx.send(Event::FileChanged);
            }
        };
        match notify::recommended_watcher(handler) {
            Ok(mut w) => match w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    debug!(dir = %dir.display(), "watching for file events (a shortcut; polling is primary)");
                    self.watcher = Some(w);
                }
                Err(e) => debug!(error = %e, "no file events; polling only"),
            },
            Err(e) => debug!(error = %e, "no file events; polling only"),
        }
    }

    /// Reads the record and updates what the worker should be joined to.
    pub(super) fn worker_poll(&mut self) {
        let now = Instant::now();
        self.ensure_watch();
        let path = self.cfg.head_file.clone();
        match read_record(&path) {
            Ok((rec, raw)) => {
                self.lease.observe(&raw, now);
                self.record_error = None;
                let max = self.worker().max_generation;
                if rec.generation < max {
                    self.record_error = Some(format!(
                        "record of generation {} is older than generation {max} already seen (a fenced head?)",
                        rec.generation
                    ));
                } else {
                    self.worker().max_generation = rec.generation;
                    if let Some(skew) = rec.wall_age(SystemTime::now()) {
                        if skew.abs() > 30.0 + rec.ttl_s {
                            debug!(skew_s = skew, "head's clock and ours disagree (harmless: freshness uses our monotonic clock)");
                        }
                    }
                    self.record = Some(rec);
                }
            }
            Err(ReadError::Bad { raw, source, .. }) => {
                self.lease.observe(&raw, now);
                self.record_error = Some(format!("malformed head record: {source}"));
            }
            Err(e) if e.is_missing() => {
                self.lease.observe_missing(now);
                self.record = None;
                self.record_error = Some(format!("{} does not exist yet", path.display()));
            }
            Err(e) => self.record_error = Some(format!("unreadable head record: {e}")),
        }
        let fresh = self.lease.is_fresh(self.cfg.ttl, now);
        let desired = match (&self.record, &self.record_error) {
            (Some(r), None) if r.state == HeadState::Running && fresh => Some(Target {
                generation: r.generation,
                instance_id: r.instance_id.clone(),
                address: r.gcs_address(),
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
        self.worker().desired = desired;
    }

    pub(super) fn worker_tick(&mut self) {
        let now = Instant::now();
        if now >= self.next_poll {
            self.next_poll = now + self.cfg.poll;
            self.worker_poll();
        }
        let desired = self.worker().desired.clone();
        let joined = self.ray.as_ref().and_then(|r| r.target.clone());
        if self.ray.is_some() {
            match &desired {
                Some(t) if Some(t) != joined.as_ref() => {
                    info!(from = ?joined.as_ref().map(|j| j.to_string()), to = %t, "head changed; rejoining");
                    self.stop_ray_now("head changed");
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
        match desired {
            Some(t) => {
                if self.worker().scheduled.as_ref() != Some(&t) {
                    self.schedule_join(t.clone());
                }
                if Instant::now() >= self.start_after {
                    self.last_wait_log = None;
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
        self.worker().scheduled = Some(t);
    }
}
