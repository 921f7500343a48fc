//! The head role: standby, generation claims and takeover (R-HEAD-5),
//! publishing, refreshing and withdrawing the record.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::claim::{self, epochs_dir};
use argus_discovery::record::rfc3339;
use argus_discovery::{read_record, HeadRecord, HeadState, Lease, ReadError, SCHEMA_VERSION};
use tracing::{debug, error, info, warn};

use argus_telemetry::status::NodeState;

pub(super) use super::probe::Probe;
use super::probe::{Probed, Purpose};
use super::reader::ReadResult;
use super::{Node, RoleLoop, RoleStatus, Target, HEAD_RAYLET_WAIT, STORAGE_BOUND};
use argus_supervise::watch::WatchState;

/// Bound of one connection attempt to a GCS address.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Bound of one probe of our own GCS while Ray starts.
const SERVING_PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Pause between probes of our own GCS while Ray starts.
pub(super) const SERVING_CHECK_EVERY: Duration = Duration::from_millis(200);
/// Refused probes needed before another head's GCS counts as dead ...
const REFUSALS_FOR_DEAD: u32 = 4;
/// ... spread over at least this long (R-HEAD-5: "about a second").
const REFUSALS_SPAN: Duration = Duration::from_millis(900);
/// Pause between probes of a holder whose GCS accepts connections.
const LIVE_PROBE_EVERY: Duration = Duration::from_secs(1);
/// Pause between probes while refusals accumulate.
const PROBE_EVERY: Duration = Duration::from_millis(300);

#[derive(Default)]
pub(super) struct HeadRole {
    /// The generation this head holds, once claimed.
    pub(super) generation: Option<u64>,
    pub(super) seq: u64,
    pub(super) next_refresh: Option<Instant>,
    /// A record with our generation was published and not yet withdrawn.
    pub(super) published: bool,
    /// When this head last wrote its record (the head's record age).
    pub(super) published_at: Option<Instant>,
    /// The temp files earlier heads left were looked for (once per run,
    /// after the first publish).
    pub(super) pruned: bool,
    /// Standby: what probes of the holder's GCS found so far.
    pub(super) probes: Probes,
    /// Standby: the last record read that parsed, to judge its holder when
    /// the file is missing or unreadable for a while.
    pub(super) last_good: Option<HeadRecord>,
    /// The rule that decided the last standby or claim (status, logs).
    pub(super) rule: Option<String>,
    /// Entries of `epochs/` last found not to be the agent's (logged once).
    pub(super) ignored_claims: Vec<String>,
    /// A claim of this generation timed out ([`STORAGE_BOUND`]) and may
    /// still have been made, as ours, after the bound: the next standby
    /// read asks who holds it ([`adopts_claim`]).
    pub(super) unsure_claim: Option<(u64, &'static str)>,
}

/// Returns the generation to take as ours without a new claim: the one
/// whose claim timed out (`unsure`) when it is still the highest claim
/// (`highest`) and its holder (`holder`, read from the claim) is this
/// agent (`ours`). A claim that finished after its bound is ours as surely
/// as one that finished within it; without this, a head on a slow mount
/// found its own claim, read it as another head's, and waited a TTL for a
/// record that it alone would write.
pub(super) fn adopts_claim(
    unsure: Option<u64>,
    highest: u64,
    holder: Option<&str>,
    ours: &str,
) -> Option<u64> {
    unsure.filter(|g| *g == highest && holder == Some(ours))
}

/// Removes the temp files an earlier head killed mid-publish left next to
/// `path` (see [`argus_discovery::prune_stale_temps`]); a failure is only
/// logged: the record itself was written.
fn prune_stale_temps(path: &std::path::Path) {
    match argus_discovery::prune_stale_temps(path, argus_discovery::STALE_TEMP_AGE) {
        Ok(0) => {}
        Ok(removed) => info!(
            removed,
            path = %path.display(),
            "removed temp files an earlier head left mid-publish"
        ),
        Err(e) => warn!(error = %e, path = %path.display(), "cannot prune old temp files"),
    }
}

/// A higher generation than ours exists: a newer head holds the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fenced(pub(super) u64);

/// Probe results for one GCS address, since it was first probed.
#[derive(Debug, Clone, Default)]
pub(super) struct Probes {
    addr: Option<SocketAddr>,
    /// Consecutive refusals and when the first of them happened.
    refused: u32,
    first_refused: Option<Instant>,
    last: Option<Probe>,
    last_at: Option<Instant>,
}

impl Probes {
    /// Adds the result of a probe of `addr` at `now`; a new address starts
    /// over, and anything but a refusal ends a run of refusals.
    pub(super) fn add(&mut self, addr: SocketAddr, p: Probe, now: Instant) {
        if self.addr != Some(addr) {
            *self = Probes {
                addr: Some(addr),
                ..Probes::default()
            };
        }
        match p {
            Probe::Refused => {
                self.refused += 1;
                self.first_refused.get_or_insert(now);
            }
            _ => {
                self.refused = 0;
                self.first_refused = None;
            }
        }
        self.last = Some(p);
        self.last_at = Some(now);
    }

    /// Returns the summary of the probes of `addr` up to `now`.
    pub(super) fn verdict(&self, addr: SocketAddr, now: Instant) -> GcsVerdict {
        if self.addr != Some(addr) {
            return GcsVerdict::Unknown;
        }
        match self.last {
            None => GcsVerdict::Unknown,
            Some(Probe::Accepts) => GcsVerdict::Accepts,
            Some(Probe::Inconclusive) => GcsVerdict::Inconclusive,
            Some(Probe::Refused) => {
                let span = self
                    .first_refused
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                if self.refused >= REFUSALS_FOR_DEAD && span >= REFUSALS_SPAN {
                    GcsVerdict::Refuses {
                        times: self.refused,
                        over: span,
                    }
                } else {
                    GcsVerdict::Refusing {
                        times: self.refused,
                    }
                }
            }
        }
    }

    /// Returns true if and only if `addr` should be probed again at `now`.
    pub(super) fn due(&self, addr: SocketAddr, now: Instant) -> bool {
        self.addr != Some(addr)
            || self
                .last_at
                .is_none_or(|t| now.saturating_duration_since(t) >= PROBE_EVERY)
    }
}

/// What the probes of a GCS address say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum GcsVerdict {
    /// Not probed yet.
    Unknown,
    Accepts,
    /// Refused, but not yet often or long enough to call it dead.
    Refusing {
        times: u32,
    },
    /// Refused on repeated probes over about a second.
    Refuses {
        times: u32,
        over: Duration,
    },
    Inconclusive,
}

/// What a standby head knows about the current holder.
#[derive(Debug, Clone)]
pub(super) struct Evidence<'a> {
    /// The record as read now.
    pub record: RecordSeen<'a>,
    /// The last good record seen, when the file is now missing or bad.
    pub last_good: Option<&'a HeadRecord>,
    /// Any generation was ever claimed in `epochs/`.
    pub claimed_before: bool,
    /// This node's own GCS address.
    pub own_gcs: SocketAddr,
    /// How long the record's bytes have stood unchanged (local clock).
    pub unchanged_for: Duration,
    pub ttl: Duration,
    /// The probes of the holder's GCS address (the one [`to_probe`] names).
    pub gcs: GcsVerdict,
}

/// The record file as the standby read it.
#[derive(Debug, Clone, Copy)]
pub(super) enum RecordSeen<'a> {
    Missing,
    /// Present but not a valid record (garbage, a newer schema...).
    Unreadable,
    Valid(&'a HeadRecord),
}

/// Why a standby claims or waits (shown in logs and status).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Rule {
    /// No record and no generation ever claimed: the first head.
    FirstHead,
    /// The holder withdrew its record (state stopped).
    Withdrawn,
    /// The record names this node's own GCS address and nothing listens:
    /// a previous life of this node.
    OwnPreviousLife,
    /// The holder's GCS refused repeated probes: host up, no GCS.
    Refused { times: u32, over: Duration },
    /// The holder's GCS accepts connections: never usurp it.
    Live,
    /// Refusals so far, not yet enough to call it dead.
    Probing { times: u32 },
    /// Probes cannot tell (timeouts, no route): wait for the record to
    /// stop changing for a TTL.
    WaitingTtl {
        inconclusive: bool,
        unchanged: Duration,
    },
    /// The record stood unchanged for a TTL with inconclusive probes.
    Expired { unchanged: Duration },
}

impl Rule {
    /// Returns the rule's `argus_head_takeovers_total` label (claims only;
    /// the standby rules are never counted).
    pub(super) fn label(&self) -> &'static str {
        match self {
            Rule::FirstHead => "first_head",
            Rule::Withdrawn => "withdrawn",
            Rule::OwnPreviousLife => "own_previous_life",
            Rule::Refused { .. } => "refused",
            Rule::Expired { .. } => "expired",
            // Standby rules: `acquire` never claims on them.
            Rule::Live | Rule::Probing { .. } | Rule::WaitingTtl { .. } => "expired",
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::FirstHead => write!(f, "first head: no record and no generation claimed yet"),
            Rule::Withdrawn => write!(f, "the holder withdrew its record"),
            Rule::OwnPreviousLife => write!(
                f,
                "the record names this node's own GCS address and nothing listens there (a previous life of this node)"
            ),
            Rule::Refused { times, over } => write!(
                f,
                "the holder's GCS refused {times} probes over {:.1}s (host up, no GCS)",
                over.as_secs_f64()
            ),
            Rule::Live => write!(f, "the holder's GCS accepts connections"),
            Rule::Probing { times } => {
                write!(f, "the holder's GCS refused {times} probe(s); probing again")
            }
            Rule::WaitingTtl { inconclusive, unchanged } => write!(
                f,
                "{}; waiting for the record to stand unchanged for a TTL ({:.0}s so far)",
                if *inconclusive {
                    "probes of the holder's GCS are inconclusive (timeouts: a partition?)"
                } else {
                    "no GCS address to probe"
                },
                unchanged.as_secs_f64()
            ),
            Rule::Expired { unchanged } => write!(
                f,
                "the record stood unchanged for {:.0}s (a TTL) and probes could not reach the holder",
                unchanged.as_secs_f64()
            ),
        }
    }
}

/// What a standby head does.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decision {
    Claim(Rule),
    Standby(Rule),
}

/// Returns the GCS address whose probes decide, if any: the record's, or,
/// while the file is missing or unreadable, the last good record's.
pub(super) fn to_probe(ev: &Evidence<'_>) -> Option<SocketAddr> {
    let rec = match ev.record {
        RecordSeen::Valid(r) if r.state == HeadState::Running => Some(r),
        RecordSeen::Valid(_) => None,
        RecordSeen::Missing | RecordSeen::Unreadable => {
            ev.last_good.filter(|r| r.state == HeadState::Running)
        }
    }?;
    let ip: IpAddr = rec.head_ip.parse().ok()?;
    Some(SocketAddr::new(ip, rec.gcs_port))
}

/// Decides, from its evidence alone, whether a standby head claims the
/// next generation (R-HEAD-5). Missing or unreadable is never evidence of
/// death by itself: the last known holder is probed like any other.
pub(super) fn acquire(ev: &Evidence<'_>) -> Decision {
    match ev.record {
        RecordSeen::Missing if !ev.claimed_before => return Decision::Claim(Rule::FirstHead),
        RecordSeen::Valid(r) if r.state == HeadState::Stopped => {
            return Decision::Claim(Rule::Withdrawn)
        }
        _ => {}
    }
    let addr = to_probe(ev);
    let unchanged = ev.unchanged_for;
    let by_ttl = |inconclusive| {
        if unchanged >= ev.ttl {
            Decision::Claim(Rule::Expired { unchanged })
        } else {
            Decision::Standby(Rule::WaitingTtl {
                inconclusive,
                unchanged,
            })
        }
    };
    let Some(addr) = addr else {
        return by_ttl(false);
    };
    match ev.gcs {
        GcsVerdict::Accepts => Decision::Standby(Rule::Live),
        GcsVerdict::Refusing { .. } | GcsVerdict::Refuses { .. } if addr == ev.own_gcs => {
            Decision::Claim(Rule::OwnPreviousLife)
        }
        GcsVerdict::Refuses { times, over } => Decision::Claim(Rule::Refused { times, over }),
        GcsVerdict::Refusing { times } => Decision::Standby(Rule::Probing { times }),
        GcsVerdict::Unknown => Decision::Standby(Rule::Probing { times: 0 }),
        GcsVerdict::Inconclusive => by_ttl(true),
    }
}

impl RoleLoop for HeadRole {
    const DRAINS: bool = false;

    fn start(_: &mut Node<Self>) -> Result<(), i32> {
        Ok(())
    }

    fn tick(node: &mut Node<Self>) {
        node.head_tick();
    }

    fn wake(node: &Node<Self>, at: &mut Instant) {
        let mut by = |t: Instant| *at = (*at).min(t);
        if let Some(r) = &node.ray {
            if !r.serving {
                by(r.next_check);
            }
        }
        match (node.role.generation, &node.ray) {
            (None, _) => by(node.next_poll),
            (Some(_), None) => by(node.start_after),
            (Some(_), Some(_)) => {
                if let Some(t) = node.role.next_refresh {
                    by(t)
                }
            }
        }
    }

    fn on_record(_: &mut Node<Self>, _: ReadResult) {
        // A head reads the record itself when it decides; it runs no reader.
    }

    fn on_file_events(_: &mut Node<Self>, _: WatchState) {}

    fn on_probed(node: &mut Node<Self>, a: &Probed) {
        match a.purpose {
            Purpose::Serving => node.on_serving_probe(a),
            Purpose::Holder => node.on_holder_probe(a),
            // A head joins no one.
            Purpose::Joined => {}
        }
    }

    fn on_ray_ended(_: &mut Node<Self>, _: Option<Target>) {}

    fn withdraw_within(node: &mut Node<Self>, bound: Duration) {
        node.withdraw_within(bound);
    }

    fn status(node: &Node<Self>) -> RoleStatus {
        RoleStatus {
            generation: node.role.generation,
            head_address: Some(SocketAddr::new(node.ip, node.cfg.ray_port).to_string()),
            head_instance: node.ray.as_ref().map(|r| r.instance_id.clone()),
            takeover: node.role.rule.clone(),
            head_gcs: None,
            gcs_ft: node.cfg.gcs_ft_redis.is_some(),
            record_changed_at: node.role.published_at,
        }
    }
}

impl Node<HeadRole> {
    // ---- head ------------------------------------------------------------

    pub(super) fn head_tick(&mut self) {
        let now = Instant::now();
        if self.role.generation.is_none() {
            if now >= self.next_poll {
                self.next_poll = now + self.cfg.poll;
                self.try_acquire();
            }
            return;
        }
        if self.ray.is_none() {
            if now >= self.start_after {
                self.start_ray(None);
            }
            return;
        }
        let serving = self.ray.as_ref().is_some_and(|r| r.serving);
        if !serving {
            let addr = SocketAddr::new(self.ip, self.cfg.ray_port);
            let sockets = self.ray_temp_dir().join("session_latest/sockets");
            let Some(r) = self.ray.as_mut() else { return };
            let waited = r.started.elapsed() >= HEAD_RAYLET_WAIT;
            if !(r.gcs_accepts && (r.raylet_up || waited)) {
                if now >= r.next_check
                    && self
                        .prober
                        .serving(addr, SERVING_PROBE_TIMEOUT, sockets, r.started_wall)
                {
                    r.next_check = now + SERVING_CHECK_EVERY;
                }
                return;
            }
            r.serving = true;
            if r.raylet_up {
                info!(%addr, "gcs accepts connections and the head's raylet is up; publishing head record");
            } else {
                warn!(%addr, waited_s = HEAD_RAYLET_WAIT.as_secs(), "gcs accepts connections but the head's raylet socket was not seen; publishing head record anyway");
            }
            match self.publish(HeadState::Running) {
                Err(Fenced(higher)) => self.step_down(higher),
                Ok(()) => self.set_state(NodeState::Running, format!("serving at {addr}")),
            }
            return;
        }
        if self.role.next_refresh.is_some_and(|t| now >= t) {
            if let Err(Fenced(higher)) = self.publish(HeadState::Running) {
                self.step_down(higher);
            }
        }
    }

    /// Logs the entries of `epochs/` that are not the agent's claims, once
    /// per change of that set (they are ignored: hole 5).
    fn note_ignored_claims(&mut self, ignored: &[String]) {
        let h = &mut self.role;
        if h.ignored_claims.as_slice() != ignored {
            h.ignored_claims = ignored.to_vec();
            if !ignored.is_empty() {
                warn!(entries = ?ignored, "ignoring entries in epochs/ the agent did not write");
            }
        }
    }

    /// Stops Ray and goes back to standby: a newer head holds `higher`.
    fn step_down(&mut self, higher: u64) {
        error!(
            higher,
            "another head claimed a higher generation; stepping down to standby"
        );
        self.stop_ray_now("fenced by a newer head");
        let h = &mut self.role;
        h.generation = None;
        h.published = false;
        h.probes = Probes::default();
        self.lease = Lease::new(Instant::now());
        self.set_state(NodeState::Standby, format!("fenced by generation {higher}"));
    }

    /// Head: notes what a probe of our own GCS (and raylet) found for the
    /// Ray run that is starting.
    pub(super) fn on_serving_probe(&mut self, a: &Probed) {
        let Some(r) = self.ray.as_mut() else { return };
        if r.serving || a.asked < r.started || a.probe != Probe::Accepts {
            return;
        }
        let first = !r.gcs_accepts;
        r.gcs_accepts = true;
        r.raylet_up |= a.raylet;
        if first && !r.raylet_up {
            // The status says what is awaited now (a slow `ray start` can
            // take long to start its raylet after the GCS).
            self.set_state(
                NodeState::RayStarting,
                "the GCS accepts connections; waiting for the head's raylet".into(),
            );
        }
    }

    /// Standby: adds a probe of the holder's GCS to the evidence; a refusal
    /// or an inconclusive answer is judged at once (with a fresh read), a
    /// live holder at the next poll.
    pub(super) fn on_holder_probe(&mut self, a: &Probed) {
        let h = &mut self.role;
        if h.generation.is_some() {
            return;
        }
        h.probes.add(a.addr, a.probe, a.at);
        if a.probe != Probe::Accepts {
            self.next_poll = Instant::now();
        }
    }

    /// Standby: reads the record, probes its holder's GCS and claims the
    /// next generation when the evidence says the holder is dead (R-HEAD-5).
    pub(super) fn try_acquire(&mut self) {
        let path = self.cfg.head_file.clone();
        let dir = epochs_dir(&path);
        let (p, d) = (path.clone(), dir.clone());
        let unsure = self.role.unsure_claim.map(|(g, _)| g);
        let (read, highest, unsure_holder) =
            match self
                .storage
                .run("read head record", STORAGE_BOUND, move || {
                    (
                        read_record(&p),
                        claim::scan_generations(&d),
                        unsure.and_then(|g| claim::holder_of(&d, g)),
                    )
                }) {
                Ok(out) => {
                    self.storage_ok();
                    out
                }
                Err(e) => {
                    self.storage_failed(&e);
                    self.set_state(NodeState::Standby, format!("{e}"));
                    return;
                }
            };
        let now = Instant::now();
        let current = match read {
            Ok((rec, raw)) => {
                self.lease.observe(&raw, now);
                Some(rec)
            }
            Err(ReadError::Bad { raw, source, .. }) => {
                self.lease.observe(&raw, now);
                debug!(path = %path.display(), error = %source, "head record is not valid; judging its last holder");
                None
            }
            Err(e) if e.is_missing() => {
                self.lease.observe_missing(now);
                None
            }
            Err(ReadError::Untrusted(why)) => {
                // Forged (or left by another writer): logged, never acted
                // on; the lease judges the last trusted record.
                warn!(error = %why, "ignoring a head record the agent did not write");
                None
            }
            Err(e) => {
                warn!(error = %e, "cannot read head record; staying in standby");
                self.set_state(NodeState::Standby, format!("cannot read head record: {e}"));
                return;
            }
        };
        let highest = match highest {
            Ok(scan) => {
                self.note_ignored_claims(&scan.ignored);
                scan.highest
            }
            Err(e) => {
                warn!(error = %e, "cannot list generation claims");
                self.set_state(NodeState::Standby, format!("{e}"));
                return;
            }
        };
        if let Some((g, label)) = self.role.unsure_claim.take() {
            if adopts_claim(Some(g), highest, unsure_holder.as_deref(), &self.holder_id).is_some() {
                info!(
                    generation = g,
                    "the claim that timed out was made, as ours: holding the generation"
                );
                argus_telemetry::metrics::takeover(label);
                let prev_seq = current
                    .as_ref()
                    .or(self.role.last_good.as_ref())
                    .map_or(0, |r| r.seq);
                let h = &mut self.role;
                h.generation = Some(g);
                h.seq = prev_seq;
                h.probes = Probes::default();
                h.rule = Some(format!(
                    "claimed generation {g} (the claim outlasted its bound)"
                ));
                return;
            }
        }
        let own_gcs = SocketAddr::new(self.ip, self.cfg.ray_port);
        let (ttl, unchanged_for, missing) = (
            self.cfg.ttl,
            self.lease.unchanged_for(now),
            self.lease.is_missing(),
        );
        let h = &mut self.role;
        if let Some(rec) = &current {
            h.last_good = Some(rec.clone());
        }
        let mut ev = Evidence {
            record: match &current {
                Some(r) => RecordSeen::Valid(r),
                None if missing => RecordSeen::Missing,
                None => RecordSeen::Unreadable,
            },
            last_good: h.last_good.as_ref(),
            claimed_before: highest > 0,
            own_gcs,
            unchanged_for,
            ttl,
            gcs: GcsVerdict::Unknown,
        };
        if let Some(addr) = to_probe(&ev) {
            ev.gcs = h.probes.verdict(addr, now);
            // The answer comes back as an event (probe.rs); the decision
            // below uses the probes answered so far.
            if h.probes.due(addr, now) {
                self.prober.gcs(Purpose::Holder, addr, PROBE_TIMEOUT);
            }
        }
        let decision = acquire(&ev);
        let (prev_gen, prev_seq) = current
            .as_ref()
            .or(h.last_good.as_ref())
            .map_or((0, 0), |r| (r.generation, r.seq));
        let rule = match decision {
            Decision::Standby(rule) => {
                // Refusals are confirmed quickly; a live holder is watched
                // every second, so its death is noticed within about one.
                match rule {
                    Rule::Probing { .. } => self.next_poll = Instant::now() + PROBE_EVERY,
                    Rule::Live => {
                        self.next_poll = Instant::now() + self.cfg.poll.min(LIVE_PROBE_EVERY)
                    }
                    _ => {}
                }
                let why = rule.to_string();
                if self.state != NodeState::Standby || self.role.rule.as_deref() != Some(&why) {
                    info!(rule = %why, "standby: not taking over");
                }
                self.role.rule = Some(why.clone());
                self.set_state(NodeState::Standby, why);
                return;
            }
            Decision::Claim(rule) => rule,
        };
        let Some(next) = claim::next_generation(highest, prev_gen) else {
            error!(
                highest,
                prev_gen, "no generation left to claim (at the bound); staying in standby"
            );
            self.set_state(NodeState::Standby, "no generation left to claim".into());
            return;
        };
        let holder = self.holder_id.clone();
        let claimed = self
            .storage
            .run("claim a head generation", STORAGE_BOUND, move || {
                let won = claim::claim_generation(&dir, next, &holder)?;
                if won {
                    // Keeps `epochs/` (listed by every claim and fencing
                    // check) small; bounded like the claim itself.
                    claim::prune_claims(&dir, next);
                }
                Ok::<_, claim::ClaimError>(won)
            })
            .map_err(|e| {
                if matches!(e, argus_supervise::storage::StorageError::TimedOut { .. }) {
                    // It may still be made, as ours: the next read asks.
                    self.role.unsure_claim = Some((next, rule.label()));
                }
                e.to_string()
            })
            .and_then(|r| r.map_err(|e| e.to_string()));
        match claimed {
            Ok(true) => {
                info!(generation = next, rule = %rule, "claimed head generation");
                argus_telemetry::metrics::takeover(rule.label());
                let h = &mut self.role;
                h.generation = Some(next);
                h.seq = prev_seq;
                h.probes = Probes::default();
                h.rule = Some(format!("claimed generation {next}: {rule}"));
            }
            Ok(false) => {
                info!(
                    generation = next,
                    "another head claimed the generation first; standby"
                );
                self.lease = Lease::new(now);
                self.set_state(
                    NodeState::Standby,
                    format!("generation {next} claimed by another head"),
                );
            }
            Err(e) => {
                warn!(error = %e, "cannot claim a head generation");
                self.set_state(NodeState::Standby, e.clone());
            }
        }
    }

    /// Writes the record with our generation, on the storage thread within
    /// [`STORAGE_BOUND`]; refuses (without writing) when a higher
    /// generation was claimed or published, so a fenced head never
    /// overwrites (nor withdraws) a newer head's record.
    pub(super) fn publish(&mut self, state: HeadState) -> Result<(), Fenced> {
        self.publish_within(state, STORAGE_BOUND)
    }

    fn publish_within(&mut self, state: HeadState, bound: Duration) -> Result<(), Fenced> {
        let (ip, cfg_ttl, refresh) = (self.ip, self.cfg.ttl, self.cfg.refresh);
        let instance_id = self
            .ray
            .as_ref()
            .map(|r| r.instance_id.clone())
            .or_else(|| self.record.as_ref().map(|r| r.instance_id.clone()))
            .unwrap_or_else(|| "none".into());
        let holder_id = self.holder_id.clone();
        let (cluster, gport, dport) = (
            self.cfg.cluster_name.clone(),
            self.cfg.ray_port,
            self.cfg.dashboard_port,
        );
        let path = self.cfg.head_file.clone();
        let gcs_ft = self.cfg.gcs_ft_redis.is_some();
        let h = &mut self.role;
        let Some(generation) = h.generation else {
            return Ok(());
        };
        h.seq += 1;
        let now = SystemTime::now();
        let rec = HeadRecord {
            schema_version: SCHEMA_VERSION,
            cluster_name: cluster,
            head_ip: ip.to_string(),
            gcs_port: gport,
            dashboard_port: dport,
            job_server_url: match ip {
                IpAddr::V6(_) => format!("http://[{ip}]:{dport}"),
                IpAddr::V4(_) => format!("http://{ip}:{dport}"),
            },
            updated_at: rfc3339(now),
            expires_at: rfc3339(now + cfg_ttl),
            instance_id,
            holder_id,
            generation,
            seq: h.seq,
            state,
            ttl_s: cfg_ttl.as_secs_f64(),
            gcs_ft,
        };
        h.next_refresh = Some(Instant::now() + refresh);
        let prune = !h.pruned;
        let bytes = rec.to_bytes();
        let written = self.storage.run("publish head record", bound, move || {
            let dir = epochs_dir(&path);
            // Only claims and records the agent wrote count: a forged one
            // is no reason to step down (hole 5).
            let scan = claim::scan_generations(&dir).unwrap_or_default();
            let published = read_record(&path).map_or(0, |(r, _)| r.generation);
            let higher = scan.highest.max(published);
            if higher > generation {
                argus_telemetry::metrics::fencing_refusal();
                return Err(Fenced(higher));
            }
            let written = argus_discovery::publish_watched(&path, &bytes);
            if prune && written.is_ok() {
                prune_stale_temps(&path);
            }
            Ok((written, scan.ignored))
        });
        let written = match written {
            Ok(w) => {
                self.storage_ok();
                let (written, ignored) = w?;
                self.note_ignored_claims(&ignored);
                written
            }
            Err(e) => {
                self.storage_failed(&e);
                return Ok(());
            }
        };
        let h = &mut self.role;
        match written {
            Ok(()) => {
                h.pruned = true;
                h.published = state == HeadState::Running;
                h.published_at = Some(Instant::now());
                debug!(seq = rec.seq, ?state, "published head record");
                if state == HeadState::Stopped {
                    info!(generation, "withdrew head record (state stopped)");
                }
                self.record = Some(rec);
            }
            Err(e) => {
                argus_telemetry::metrics::storage_error("io");
                warn!(error = %e, "failed to publish head record; will retry")
            }
        }
        Ok(())
    }

    /// Marks the record stopped at once (R-HEAD-4), waiting for the
    /// storage at most `bound`.
    pub(super) fn withdraw_within(&mut self, bound: Duration) {
        let h = &mut self.role;
        {
            if h.published {
                h.next_refresh = None;
                h.published = false;
                if let Err(Fenced(higher)) = self.publish_within(HeadState::Stopped, bound) {
                    info!(
                        higher,
                        "not withdrawing: a newer head's record must stay as it is"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    /// Regression: a head whose claim outlasted the storage bound on a
    /// starved CPU read its own claim as another head's and waited a TTL
    /// (preflight_run, under a busy loop).
    #[test]
    fn a_claim_that_timed_out_is_adopted_only_when_it_is_ours_and_still_highest() {
        let me = "host/7/abc";
        assert_eq!(adopts_claim(Some(3), 3, Some(me), me), Some(3));
        assert_eq!(
            adopts_claim(Some(3), 3, Some("host/8/def"), me),
            None,
            "another head's"
        );
        assert_eq!(
            adopts_claim(Some(3), 4, Some(me), me),
            None,
            "a newer claim exists"
        );
        assert_eq!(
            adopts_claim(Some(3), 3, None, me),
            None,
            "never made (or unreadable)"
        );
        assert_eq!(
            adopts_claim(None, 3, Some(me), me),
            None,
            "no claim timed out"
        );
        assert_eq!(
            adopts_claim(Some(3), 3, Some("host/7/ab"), me),
            None,
            "a prefix is not ours"
        );
    }

    fn own() -> SocketAddr {
        "10.0.0.9:6379".parse().unwrap()
    }

    fn rec(ip: &str, state: HeadState) -> HeadRecord {
        HeadRecord {
            schema_version: SCHEMA_VERSION,
            cluster_name: "argus-ray".into(),
            head_ip: ip.into(),
            gcs_port: 6379,
            dashboard_port: 8265,
            job_server_url: format!("http://{ip}:8265"),
            updated_at: "2026-11-22T00:00:00Z".into(),
            expires_at: "2026-11-22T00:01:00Z".into(),
            instance_id: "i1".into(),
            holder_id: "h1".into(),
            generation: 3,
            seq: 7,
            state,
            ttl_s: 60.0,
            gcs_ft: false,
        }
    }

    fn ev<'a>(record: RecordSeen<'a>, gcs: GcsVerdict, unchanged_s: u64) -> Evidence<'a> {
        Evidence {
            record,
            last_good: None,
            claimed_before: true,
            own_gcs: own(),
            unchanged_for: Duration::from_secs(unchanged_s),
            ttl: TTL,
            gcs,
        }
    }

    const REFUSES: GcsVerdict = GcsVerdict::Refuses {
        times: 4,
        over: Duration::from_millis(950),
    };

    #[test]
    fn the_first_head_claims_when_there_is_no_record_and_no_claim() {
        let mut e = ev(RecordSeen::Missing, GcsVerdict::Unknown, 0);
        e.claimed_before = false;
        assert_eq!(acquire(&e), Decision::Claim(Rule::FirstHead));
    }

    #[test]
    fn a_withdrawn_record_is_claimed_at_once() {
        let r = rec("10.0.0.5", HeadState::Stopped);
        let e = ev(RecordSeen::Valid(&r), GcsVerdict::Unknown, 0);
        assert_eq!(acquire(&e), Decision::Claim(Rule::Withdrawn));
    }

    #[test]
    fn a_live_gcs_is_never_usurped_even_when_its_record_is_old() {
        let r = rec("10.0.0.5", HeadState::Running);
        let e = ev(RecordSeen::Valid(&r), GcsVerdict::Accepts, 600);
        assert_eq!(acquire(&e), Decision::Standby(Rule::Live));
    }

    #[test]
    fn own_previous_life_is_dead_at_the_first_refusal() {
        let r = rec("10.0.0.9", HeadState::Running);
        let e = ev(RecordSeen::Valid(&r), GcsVerdict::Refusing { times: 1 }, 0);
        assert_eq!(acquire(&e), Decision::Claim(Rule::OwnPreviousLife));
    }

    #[test]
    fn another_address_needs_refusals_over_about_a_second() {
        let r = rec("10.0.0.5", HeadState::Running);
        let e = ev(RecordSeen::Valid(&r), GcsVerdict::Refusing { times: 2 }, 0);
        assert_eq!(acquire(&e), Decision::Standby(Rule::Probing { times: 2 }));
        let e = ev(RecordSeen::Valid(&r), REFUSES, 0);
        assert!(matches!(
            acquire(&e),
            Decision::Claim(Rule::Refused { times: 4, .. })
        ));
    }

    #[test]
    fn inconclusive_probes_wait_for_a_ttl_of_no_change() {
        let r = rec("10.0.0.5", HeadState::Running);
        let e = ev(RecordSeen::Valid(&r), GcsVerdict::Inconclusive, 59);
        assert!(matches!(
            acquire(&e),
            Decision::Standby(Rule::WaitingTtl {
                inconclusive: true,
                ..
            })
        ));
        let e = ev(RecordSeen::Valid(&r), GcsVerdict::Inconclusive, 60);
        assert!(matches!(acquire(&e), Decision::Claim(Rule::Expired { .. })));
    }

    #[test]
    fn missing_or_unreadable_is_not_evidence_of_death() {
        // Regression: a standby used to claim at once when the record was
        // missing (an NFS flap) or unparseable (a newer schema).
        let last = rec("10.0.0.5", HeadState::Running);
        for seen in [RecordSeen::Missing, RecordSeen::Unreadable] {
            let mut e = ev(seen, GcsVerdict::Accepts, 0);
            e.last_good = Some(&last);
            assert_eq!(acquire(&e), Decision::Standby(Rule::Live), "{seen:?}");
            assert_eq!(to_probe(&e), Some("10.0.0.5:6379".parse().unwrap()));
            // Never seen a good record: only a TTL without change decides.
            let e = ev(seen, GcsVerdict::Unknown, 5);
            assert!(
                matches!(
                    acquire(&e),
                    Decision::Standby(Rule::WaitingTtl {
                        inconclusive: false,
                        ..
                    })
                ),
                "{seen:?}"
            );
            let e = ev(seen, GcsVerdict::Unknown, 60);
            assert!(
                matches!(acquire(&e), Decision::Claim(Rule::Expired { .. })),
                "{seen:?}"
            );
        }
    }

    #[test]
    fn probes_call_a_gcs_dead_after_four_refusals_over_900_ms() {
        let a: SocketAddr = "10.0.0.5:6379".parse().unwrap();
        let t0 = Instant::now();
        let mut p = Probes::default();
        assert_eq!(p.verdict(a, t0), GcsVerdict::Unknown);
        for i in 0..4u64 {
            p.add(a, Probe::Refused, t0 + Duration::from_millis(300 * i));
        }
        assert!(matches!(
            p.verdict(a, t0 + Duration::from_millis(900)),
            GcsVerdict::Refuses { times: 4, .. }
        ));
        // One acceptance ends the run; another address starts over.
        p.add(a, Probe::Accepts, t0 + Duration::from_millis(1000));
        assert_eq!(
            p.verdict(a, t0 + Duration::from_millis(1000)),
            GcsVerdict::Accepts
        );
        let b: SocketAddr = "10.0.0.6:6379".parse().unwrap();
        assert_eq!(p.verdict(b, t0), GcsVerdict::Unknown);
        assert!(p.due(b, t0));
    }
}
