//! The head role: standby, generation claims and takeover (R-HEAD-5),
//! publishing, refreshing and withdrawing the record.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime};

use argus_discovery::claim::{self, epochs_dir};
use argus_discovery::record::rfc3339;
use argus_discovery::{read_record, HeadRecord, HeadState, Lease, ReadError, SCHEMA_VERSION};
use tracing::{debug, error, info, warn};

use crate::status::NodeState;

use super::{Node, RoleState, HEAD_RAYLET_WAIT};

#[derive(Default)]
pub(super) struct HeadRole {
    /// The generation this head holds, once claimed.
    pub(super) generation: Option<u64>,
    pub(super) seq: u64,
    pub(super) next_refresh: Option<Instant>,
    /// A record with our generation was published and not yet withdrawn.
    pub(super) published: bool,
}

impl Node {
    // ---- head ------------------------------------------------------------

    pub(super) fn head(&mut self) -> &mut HeadRole {
        match &mut self.role {
            RoleState::Head(h) => h,
            RoleState::Worker(_) => unreachable!("head state on a worker"),
        }
    }

    pub(super) fn head_tick(&mut self) {
        let now = Instant::now();
        if self.head().generation.is_none() {
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
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                return;
            }
            let Some((started, started_wall)) =
                self.ray.as_ref().map(|r| (r.started, r.started_wall))
            else {
                return;
            };
            let raylet = self.head_raylet_ready(started_wall);
            if !raylet && started.elapsed() < HEAD_RAYLET_WAIT {
                return;
            }
            if let Some(r) = self.ray.as_mut() {
                r.serving = true;
            }
            if raylet {
                info!(%addr, "gcs accepts connections and the head's raylet is up; publishing head record");
            } else {
                warn!(%addr, waited_s = HEAD_RAYLET_WAIT.as_secs(), "gcs accepts connections but the head's raylet socket was not seen; publishing head record anyway");
            }
            self.publish(HeadState::Running);
            self.set_state(NodeState::Running, format!("serving at {addr}"));
            return;
        }
        if self.head().next_refresh.is_some_and(|t| now >= t) {
            if let Some(higher) = self.fenced() {
                error!(
                    higher,
                    "another head claimed a higher generation; stepping down to standby"
                );
                self.stop_ray_now("fenced by a newer head");
                let h = self.head();
                h.generation = None;
                h.published = false;
                self.lease = Lease::new(Instant::now());
                self.set_state(NodeState::Standby, format!("fenced by generation {higher}"));
                return;
            }
            self.publish(HeadState::Running);
        }
    }

    /// Returns true if and only if this start's raylet accepts connections on
    /// its socket in the current session (`<temp>/session_latest`).
    ///
    /// Why wait for it: nodes that share a session folder (several nodes on
    /// one machine) pick socket names by racing on file existence; a worker
    /// joining while the head's raylet is still starting can take the name
    /// `sockets/raylet` first and crash the head's raylet (research/ray.md
    /// §4). Across machines it only means workers join a head that is up.
    pub(super) fn head_raylet_ready(&self, started_wall: SystemTime) -> bool {
        let sock = self.ray_temp_dir().join("session_latest/sockets/raylet");
        let fresh = std::fs::metadata(&sock)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t + Duration::from_secs(2) >= started_wall);
        fresh && std::os::unix::net::UnixStream::connect(&sock).is_ok()
    }

    /// Returns a generation higher than ours if one was claimed.
    pub(super) fn fenced(&mut self) -> Option<u64> {
        let mine = self.head().generation?;
        let claimed = claim::highest_generation(&epochs_dir(&self.cfg.head_file)).unwrap_or(0);
        let published = read_record(&self.cfg.head_file)
            .map(|(r, _)| r.generation)
            .unwrap_or(0);
        let higher = claimed.max(published);
        (higher > mine).then_some(higher)
    }

    /// Standby: reads the record and claims the next generation when no
    /// other live head holds it (R-HEAD-5).
    pub(super) fn try_acquire(&mut self) {
        let now = Instant::now();
        let path = self.cfg.head_file.clone();
        let (prev_gen, prev_seq, blocker) = match read_record(&path) {
            Ok((rec, raw)) => {
                self.lease.observe(&raw, now);
                let g = (rec.generation, rec.seq);
                let live_other = rec.state == HeadState::Running
                    && rec.holder_id != self.holder_id
                    && self.lease.unchanged_for(now) < self.cfg.ttl;
                let blocker = live_other.then(|| {
                    format!(
                        "head {} ({}) holds generation {} and its record changed {:.0}s ago",
                        rec.head_ip,
                        rec.holder_id,
                        rec.generation,
                        self.lease.unchanged_for(now).as_secs_f64()
                    )
                });
                (g.0, g.1, blocker)
            }
            Err(ReadError::Bad { raw, source, .. }) => {
                self.lease.observe(&raw, now);
                warn!(path = %path.display(), error = %source, "head record is invalid; it will be replaced");
                (0, 0, None)
            }
            Err(e) if e.is_missing() => (0, 0, None),
            Err(e) => {
                warn!(error = %e, "cannot read head record; staying in standby");
                self.set_state(NodeState::Standby, format!("cannot read head record: {e}"));
                return;
            }
        };
        if let Some(why) = blocker {
            if self.state != NodeState::Standby {
                info!(reason = %why, "standby: another head is live");
            }
            self.set_state(NodeState::Standby, why);
            return;
        }
        let dir = epochs_dir(&path);
        let next = match claim::highest_generation(&dir) {
            Ok(h) => h.max(prev_gen) + 1,
            Err(e) => {
                warn!(error = %e, "cannot list generation claims");
                self.set_state(NodeState::Standby, format!("{e}"));
                return;
            }
        };
        match claim::claim_generation(&dir, next, &self.holder_id) {
            Ok(true) => {
                info!(generation = next, "claimed head generation");
                let h = self.head();
                h.generation = Some(next);
                h.seq = prev_seq;
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
                self.set_state(NodeState::Standby, format!("{e}"));
            }
        }
    }

    pub(super) fn publish(&mut self, state: HeadState) {
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
        let h = self.head();
        let Some(generation) = h.generation else {
            return;
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
        };
        h.next_refresh = Some(Instant::now() + refresh);
        match argus_discovery::publish(&path, &rec.to_bytes()) {
            Ok(()) => {
                h.published = state == HeadState::Running;
                debug!(seq = rec.seq, ?state, "published head record");
                if state == HeadState::Stopped {
                    info!(generation, "withdrew head record (state stopped)");
                }
                self.record = Some(rec);
            }
            Err(e) => warn!(error = %e, "failed to publish head record; will retry"),
        }
    }

    /// Head: marks the record stopped at once (R-HEAD-4).
    pub(super) fn withdraw(&mut self) {
        if let RoleState::Head(h) = &mut self.role {
            if h.published {
                h.next_refresh = None;
                self.publish(HeadState::Stopped);
            }
        }
    }
}
