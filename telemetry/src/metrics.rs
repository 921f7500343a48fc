//! The agent's metrics in Prometheus' text format (OpenMetrics 1.0):
//! served on `ARGUS_METRICS_PORT` (see [`serve`]) and written next to the
//! status file for `argus-agent metrics` (see [`write_snapshot`]).
//!
//! One registry per process ([`get`]). The node loop, preflight, the hook
//! and the shim's broker record into it through the functions below; the
//! values that are ages (time in the current state, the record's age) are
//! computed when the text is rendered, from the monotonic clock, so a
//! scrape never sees a stale age.
//!
//! Names follow Prometheus' conventions: the `argus_` prefix, base units
//! (seconds), `_total` on counters, and labels whose values come from
//! fixed sets in this file (no ids, addresses or messages as labels, except
//! the node's own address on the info metric).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::status::NodeState;

/// The states [`NodeState`] can take, as label values.
pub const STATES: &[NodeState] = &[
    NodeState::Starting,
    NodeState::Standby,
    NodeState::WaitingForHead,
    NodeState::RayStarting,
    NodeState::Running,
    NodeState::Backoff,
    NodeState::Draining,
    NodeState::Stopping,
    NodeState::Stopped,
];

/// How a Ray run ended, as the `kind` label of `argus_ray_exits_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RayExitKind {
    /// `ray start` exited 0 without being asked to.
    Clean,
    /// It exited with a non-zero code.
    Error,
    /// It was killed by a signal the agent did not send.
    Signal,
    /// It could not be started at all.
    StartFailed,
    /// A Ray daemon the agent watches (raylet; the GCS on the head) died,
    /// and the agent killed the rest of the node's Ray.
    DaemonDied,
    /// The agent stopped it to start it again (head changed, fenced,
    /// zombie-worker guard, a Ray daemon died).
    StoppedByAgent,
}

impl RayExitKind {
    pub const ALL: &[RayExitKind] = &[
        RayExitKind::Clean,
        RayExitKind::Error,
        RayExitKind::Signal,
        RayExitKind::StartFailed,
        RayExitKind::DaemonDied,
        RayExitKind::StoppedByAgent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RayExitKind::Clean => "clean",
            RayExitKind::Error => "error",
            RayExitKind::Signal => "signal",
            RayExitKind::StartFailed => "start_failed",
            RayExitKind::DaemonDied => "daemon_died",
            RayExitKind::StoppedByAgent => "stopped_by_agent",
        }
    }
}

/// Why a head took the record over (R-HEAD-5's rules), as the `rule`
/// label of `argus_head_takeovers_total`.
pub const TAKEOVER_RULES: &[&str] = &[
    "first_head",
    "withdrawn",
    "own_previous_life",
    "refused",
    "expired",
];

/// Why a worker left its head for another, as the `reason` label of
/// `argus_worker_rejoins_total`.
pub const REJOIN_REASONS: &[&str] = &["address", "instance", "generation", "zombie_guard"];

/// How a shared-storage operation failed, as the `kind` label of
/// `argus_storage_errors_total`.
pub const STORAGE_ERROR_KINDS: &[&str] = &["timed_out", "busy", "gone", "io", "malformed"];

/// How a worker's drain ended, as the `result` label of
/// `argus_drains_total`.
/// (`skipped`: a second SIGTERM or a SIGINT stopped the node mid-drain.)
pub const DRAIN_RESULTS: &[&str] = &[
    "drained",
    "timed_out",
    "refused",
    "failed",
    "ray_exited",
    "nowhere",
    "skipped",
];

/// The steps of a drain timed by `argus_drain_step_seconds`: the load
/// balancer told `drain`, and the drain's end (both from its start).
pub const DRAIN_STEPS: &[&str] = &["lb_told", "done"];

/// The answers of the load balancer's agent-check.
pub const LB_AGENT_ANSWERS: &[&str] = &["ready", "drain"];

/// The pre-start hook's results, as the `result` label of
/// `argus_prestart_hook`.
pub const HOOK_RESULTS: &[&str] = &[
    "ok",
    "absent",
    "disabled",
    "failed",
    "timed_out",
    "not_executable",
    "stopped",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    version: String,
    role: String,
    cluster: String,
    node_ip: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabel {
    answer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
    status: String,
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabel {
    command: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The values computed at render time.
#[derive(Debug)]
struct Clocks {
    state: NodeState,
    state_since: Instant,
    record_changed_at: Option<Instant>,
    /// Time spent waiting for a head before the current wait.
    waited: Duration,
}

/// Every metric of the agent.
pub struct Metrics {
    registry: Registry,
    info: Family<InfoLabels, Gauge>,
    node_state: Family<StateLabel, Gauge>,
    node_state_seconds: FloatGauge,
    ttl_seconds: FloatGauge,
    ray_starts: Counter,
    ray_exits: Family<KindLabel, Counter>,
    ray_failures: Gauge,
    ray_crash_loop: Gauge,
    head_generation: FloatGauge,
    record_age: FloatGauge,
    takeovers: Family<RuleLabel, Counter>,
    fencing_refusals: Counter,
    rejoins: Family<ReasonLabel, Counter>,
    head_wait: Counter<f64, AtomicU64>,
    preflight_check: Family<CheckLabels, Gauge>,
    preflight_ok: Gauge,
    hook: Family<ResultLabel, Gauge>,
    shim_calls: Family<CommandLabel, Counter>,
    shim_refusals: Family<RuleLabel, Counter>,
    shim_created: Counter,
    shim_janitor_removed: Counter,
    shim_duration: Family<CommandLabel, Histogram>,
    storage_errors: Family<KindLabel, Counter>,
    drains: Family<ResultLabel, Counter>,
    drain_step: Family<StepLabel, FloatGauge>,
    lb_agent_answers: Family<AnswerLabel, Counter>,
    serve_proxy_up: Gauge,
    docker_socket_usable: Gauge,
    clocks: Mutex<Clocks>,
}

/// The buckets of `argus_shim_call_duration_seconds`: 5 ms to about 10
/// minutes (a `podman run` lasts as long as its engine container).
fn duration_buckets() -> impl Iterator<Item = f64> {
    [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
    ]
    .into_iter()
}

impl Metrics {
    fn new() -> Self {
        let m = Metrics {
            registry: Registry::with_prefix("argus"),
            info: Family::default(),
            node_state: Family::default(),
            node_state_seconds: FloatGauge::default(),
            ttl_seconds: FloatGauge::default(),
            ray_starts: Counter::default(),
            ray_exits: Family::default(),
            ray_failures: Gauge::default(),
            ray_crash_loop: Gauge::default(),
            head_generation: FloatGauge::default(),
            record_age: FloatGauge::default(),
            takeovers: Family::default(),
            fencing_refusals: Counter::default(),
            rejoins: Family::default(),
            head_wait: Counter::default(),
            preflight_check: Family::default(),
            preflight_ok: Gauge::default(),
            hook: Family::default(),
            shim_calls: Family::default(),
            shim_refusals: Family::default(),
            shim_created: Counter::default(),
            shim_janitor_removed: Counter::default(),
            shim_duration: Family::new_with_constructor(|| Histogram::new(duration_buckets())),
            storage_errors: Family::default(),
            drains: Family::default(),
            drain_step: Family::default(),
            lb_agent_answers: Family::default(),
            serve_proxy_up: Gauge::default(),
            docker_socket_usable: Gauge::default(),
            clocks: Mutex::new(Clocks {
                state: NodeState::Starting,
                state_since: Instant::now(),
                record_changed_at: None,
                waited: Duration::ZERO,
            }),
        };
        m.node_state
            .get_or_create(&StateLabel {
                state: NodeState::Starting.to_string(),
            })
            .set(1);
        m.head_generation.set(f64::NAN);
        m.record_age.set(f64::NAN);
        m.preflight_ok.set(1);
        // Every label value of a fixed set is present from the start, so a
        // counter's first increase is seen by `increase()`.
        for k in RayExitKind::ALL {
            let _ = m.ray_exits.get_or_create(&kind(k.as_str()));
        }
        for r in TAKEOVER_RULES {
            let _ = m.takeovers.get_or_create(&rule(r));
        }
        for r in REJOIN_REASONS {
            let _ = m.rejoins.get_or_create(&ReasonLabel {
                reason: r.to_string(),
            });
        }
        // The shim's fixed sets too (not the histogram's: 16 buckets each).
        for c in SHIM_COMMANDS.iter().chain(&["other"]) {
            let _ = m.shim_calls.get_or_create(&CommandLabel {
                command: c.to_string(),
            });
        }
        for k in STORAGE_ERROR_KINDS {
            let _ = m.storage_errors.get_or_create(&kind(k));
        }
        for r in DRAIN_RESULTS {
            let _ = m.drains.get_or_create(&ResultLabel {
                result: r.to_string(),
            });
        }
        for s in DRAIN_STEPS {
            m.drain_step
                .get_or_create(&StepLabel {
                    step: s.to_string(),
                })
                .set(f64::NAN);
        }
        for a in LB_AGENT_ANSWERS {
            let _ = m.lb_agent_answers.get_or_create(&AnswerLabel {
                answer: a.to_string(),
            });
        }
        for s in STATES {
            let _ = m.node_state.get_or_create(&StateLabel {
                state: s.to_string(),
            });
        }
        m
    }

    /// Registers every family with the registry, one group per concern.
    /// The order of the calls is the order of the rendered text and of
    /// [`catalogue`], so a new family goes where its group renders.
    fn register(mut self) -> Self {
        self.register_node_families();
        self.register_ray_families();
        self.register_head_families();
        self.register_start_check_families();
        self.register_shim_families();
        self.register_storage_families();
        self.register_drain_families();
        self
    }

    /// Registers who this node is and where it stands: the info metric, its
    /// state (one series per state, and the time in it) and its record
    /// lifetime.
    fn register_node_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "agent_info",
            "The agent: version, role, cluster and node IP (value 1)",
            self.info.clone(),
        );
        r.register(
            "node_state",
            "1 for the node's current state, 0 for the others",
            self.node_state.clone(),
        );
        r.register_with_unit(
            "node_state",
            "How long the node has been in its current state",
            Unit::Seconds,
            self.node_state_seconds.clone(),
        );
        r.register_with_unit(
            "discovery_ttl",
            "This node's head record lifetime (ARGUS_TTL_S)",
            Unit::Seconds,
            self.ttl_seconds.clone(),
        );
    }

    /// Registers the Ray run families: starts, exits by kind, and the failure
    /// streak that marks a crash loop.
    fn register_ray_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "ray_starts",
            "Ray runs started (`ray start --block`)",
            self.ray_starts.clone(),
        );
        r.register(
            "ray_exits",
            "Ray runs that ended other than by the node's stop, by kind",
            self.ray_exits.clone(),
        );
        r.register(
            "ray_consecutive_failures",
            "Ray runs in a row that ended before a stable run",
            self.ray_failures.clone(),
        );
        r.register(
            "ray_crash_loop",
            "1 while Ray is crash-looping (3 or more failures in a row)",
            self.ray_crash_loop.clone(),
        );
    }

    /// Registers the discovery families: the head generation and the record's
    /// age, a head's takeovers and fencing, and a worker's rejoins and time
    /// waiting for a head.
    fn register_head_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "head_generation",
            "The head generation this node publishes or follows (NaN: none)",
            self.head_generation.clone(),
        );
        r.register_with_unit(
            "head_record_age",
            "Time since this node last saw the head record change, by its own clock (NaN: never)",
            Unit::Seconds,
            self.record_age.clone(),
        );
        r.register(
            "head_takeovers",
            "Head generations this node claimed, by the rule that allowed the claim",
            self.takeovers.clone(),
        );
        r.register(
            "head_fencing_refusals",
            "Record writes refused because a newer head generation exists (this head was fenced)",
            self.fencing_refusals.clone(),
        );
        r.register(
            "worker_rejoins",
            "Worker restarts of Ray to join another head, by what changed",
            self.rejoins.clone(),
        );
        r.register_with_unit(
            "worker_head_wait",
            "Time this worker spent waiting for a head to join",
            Unit::Seconds,
            self.head_wait.clone(),
        );
    }

    /// Registers what gates Ray's start: the GPU preflight's checks and
    /// verdict, and the pre-start hook's result.
    fn register_start_check_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "preflight_check",
            "The last GPU preflight: one series per check with its status and failure class (value 1)",
            self.preflight_check.clone(),
        );
        r.register(
            "preflight_ok",
            "1 when the GPU preflight passed or did not run, 0 when it failed",
            self.preflight_ok.clone(),
        );
        r.register(
            "prestart_hook",
            "The pre-start hook's result (value 1)",
            self.hook.clone(),
        );
    }

    /// Registers the podman shim's families: brokered calls and their
    /// durations, refusals, and the engine containers created and cleaned up.
    fn register_shim_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "docker_socket_usable",
            "1 when the agent could open the Docker socket DOCKER_HOST names at start (engine containers can run here), 0 when it could not",
            self.docker_socket_usable.clone(),
        );
        r.register(
            "shim_calls",
            "podman calls brokered by this agent, by podman command",
            self.shim_calls.clone(),
        );
        r.register(
            "shim_refusals",
            "podman calls the shim refused, by the rule that refused them",
            self.shim_refusals.clone(),
        );
        r.register(
            "shim_containers_created",
            "Engine containers the shim created",
            self.shim_created.clone(),
        );
        r.register(
            "shim_janitor_removed",
            "Engine containers the janitor removed (their owner or caller was gone, or the node stopped)",
            self.shim_janitor_removed.clone(),
        );
        r.register_with_unit(
            "shim_call_duration",
            "How long brokered podman calls took, by podman command",
            Unit::Seconds,
            self.shim_duration.clone(),
        );
    }

    /// Registers the shared-storage failures, by kind.
    fn register_storage_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "storage_errors",
            "Shared-storage operations that failed, by kind",
            self.storage_errors.clone(),
        );
    }

    /// Registers a worker's drain families: how drains ended and their steps'
    /// timings, the load balancer's agent-check answers, and the Serve proxy's
    /// health.
    fn register_drain_families(&mut self) {
        let r = &mut self.registry;
        r.register(
            "drains",
            "Drains of this worker on a stop (R-SERVE-4), by how they ended",
            self.drains.clone(),
        );
        r.register_with_unit(
            "drain_step",
            "The last drain: time from its start to each step (NaN: not reached)",
            Unit::Seconds,
            self.drain_step.clone(),
        );
        r.register(
            "lb_agent_answers",
            "Answers to the load balancer's agent-check, by answer",
            self.lb_agent_answers.clone(),
        );
        r.register(
            "serve_proxy_up",
            "1 while this worker's Ray Serve proxy answers its health check",
            self.serve_proxy_up.clone(),
        );
    }

    /// Renders every metric, the ages computed now.
    pub fn render(&self) -> String {
        {
            let c = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            self.node_state_seconds
                .set(now.duration_since(c.state_since).as_secs_f64());
            self.record_age.set(
                c.record_changed_at
                    .map_or(f64::NAN, |t| now.duration_since(t).as_secs_f64()),
            );
            // The counter holds the finished waits; the current one is added
            // here, so the value never goes back.
            let mut waited = c.waited;
            if c.state == NodeState::WaitingForHead {
                waited += now.duration_since(c.state_since);
            }
            let shown = self.head_wait.get();
            let delta = waited.as_secs_f64() - shown;
            if delta > 0.0 {
                self.head_wait.inc_by(delta);
            }
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// One metric as Prometheus queries it: the sample name (counters with
/// `_total`), its type and its help text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub name: String,
    pub kind: String,
    pub help: String,
}

/// Returns every metric the agent can export, also those with no series
/// yet (a family shows only once it has one): rendered from a registry of
/// its own with one series in each family. `argus-agent metrics
/// --catalogue` prints it; a test checks docs/operations.md against it.
pub fn catalogue() -> Vec<Described> {
    let m = Metrics::new().register();
    let _ = m.info.get_or_create(&InfoLabels {
        version: String::new(),
        role: String::new(),
        cluster: String::new(),
        node_ip: String::new(),
    });
    let _ = m.preflight_check.get_or_create(&CheckLabels {
        check: String::new(),
        status: String::new(),
        class: String::new(),
    });
    let _ = m.hook.get_or_create(&ResultLabel {
        result: String::new(),
    });
    let cmd = CommandLabel {
        command: String::new(),
    };
    let _ = m.shim_calls.get_or_create(&cmd);
    let _ = m.shim_duration.get_or_create(&cmd);
    let _ = m.shim_refusals.get_or_create(&rule(""));
    let text = m.render();
    let mut help = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, h)) = rest.split_once(' ') {
                help.insert(name.to_string(), h.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                let shown = match kind {
                    "counter" => format!("{name}_total"),
                    _ => name.to_string(),
                };
                out.push(Described {
                    name: shown,
                    kind: kind.to_string(),
                    help: help.get(name).cloned().unwrap_or_default(),
                });
            }
        }
    }
    out
}

fn kind(k: &str) -> KindLabel {
    KindLabel {
        kind: k.to_string(),
    }
}

fn rule(r: &str) -> RuleLabel {
    RuleLabel {
        rule: r.to_string(),
    }
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// Returns this process's metrics.
pub fn get() -> &'static Metrics {
    METRICS.get_or_init(|| Metrics::new().register())
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

// ---- recording ------------------------------------------------------------

/// Records who this node is.
pub fn node_started(role: &str, cluster: &str, node_ip: &str, ttl: Duration) {
    let m = get();
    m.info
        .get_or_create(&InfoLabels {
            version: env!("CARGO_PKG_VERSION").to_string(),
            role: role.to_string(),
            cluster: cluster.to_string(),
            node_ip: node_ip.to_string(),
        })
        .set(1);
    m.ttl_seconds.set(ttl.as_secs_f64());
}

/// Records the node's state (called on every change).
pub fn set_state(state: NodeState) {
    let m = get();
    let mut c = m.clocks.lock().unwrap_or_else(|e| e.into_inner());
    if c.state == state {
        return;
    }
    let now = Instant::now();
    if c.state == NodeState::WaitingForHead {
        let waited = now.duration_since(c.state_since);
        c.waited += waited;
    }
    m.node_state
        .get_or_create(&StateLabel {
            state: c.state.to_string(),
        })
        .set(0);
    m.node_state
        .get_or_create(&StateLabel {
            state: state.to_string(),
        })
        .set(1);
    c.state = state;
    c.state_since = now;
}

/// Records a Ray start.
pub fn ray_started() {
    get().ray_starts.inc();
}

/// Records the end of a Ray run.
pub fn ray_exited(kind_: RayExitKind) {
    get().ray_exits.get_or_create(&kind(kind_.as_str())).inc();
}

/// Records the restart backoff's failure count and crash-loop flag.
pub fn set_failures(failures: u32, crash_loop: bool) {
    let m = get();
    m.ray_failures.set(i64::from(failures));
    m.ray_crash_loop.set(i64::from(crash_loop));
}

/// Records the generation this node publishes or follows, and when it last
/// saw the record change.
pub fn set_head(generation: Option<u64>, record_changed_at: Option<Instant>) {
    let m = get();
    m.head_generation
        .set(generation.map_or(f64::NAN, |g| g as f64));
    m.clocks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .record_changed_at = record_changed_at;
}

/// Records a head generation claimed by `rule` (one of [`TAKEOVER_RULES`]).
pub fn takeover(rule_: &'static str) {
    debug_assert!(TAKEOVER_RULES.contains(&rule_), "{rule_}");
    get().takeovers.get_or_create(&rule(rule_)).inc();
}

/// Records a record write refused because a newer generation exists.
pub fn fencing_refusal() {
    get().fencing_refusals.inc();
}

/// Records a worker rejoin for `reason` (one of [`REJOIN_REASONS`]).
pub fn rejoin(reason: &'static str) {
    debug_assert!(REJOIN_REASONS.contains(&reason), "{reason}");
    get()
        .rejoins
        .get_or_create(&ReasonLabel {
            reason: reason.to_string(),
        })
        .inc();
}

/// Records a shared-storage failure of `kind` (one of
/// [`STORAGE_ERROR_KINDS`]).
pub fn storage_error(kind_: &'static str) {
    debug_assert!(STORAGE_ERROR_KINDS.contains(&kind_), "{kind_}");
    get().storage_errors.get_or_create(&kind(kind_)).inc();
}

/// One check of a preflight verdict, as its metric series labels it.
#[derive(Debug, Clone, Copy)]
pub struct CheckOutcome<'a> {
    pub check: &'a str,
    /// `pass`, `fail`, `warn` or `skip`.
    pub status: &'a str,
    /// The failure class, empty when none.
    pub class: &'a str,
}

/// Records the preflight verdict: one series per check.
pub fn preflight<'a>(ok: bool, checks: impl IntoIterator<Item = CheckOutcome<'a>>) {
    let m = get();
    m.preflight_check.clear();
    for c in checks {
        m.preflight_check
            .get_or_create(&CheckLabels {
                check: c.check.to_string(),
                status: c.status.to_string(),
                class: c.class.to_string(),
            })
            .set(1);
    }
    m.preflight_ok.set(i64::from(ok));
}

/// Makes a series at zero for each of the shim's refusal rules (the
/// policy's bounded set of labels) and `other`, so that a rule that never
/// fired reads 0 rather than being absent.
pub fn shim_refusal_rules(rules: &[&str]) {
    let m = get();
    for r in rules.iter().chain(&["other"]) {
        let _ = m.shim_refusals.get_or_create(&rule(r));
    }
}

/// Records the end of a drain (`result` one of [`DRAIN_RESULTS`]) and the
/// time from its start to each step (`step` one of [`DRAIN_STEPS`]).
pub fn drain(result: &'static str, steps: &[(&'static str, Duration)]) {
    debug_assert!(DRAIN_RESULTS.contains(&result), "{result}");
    let m = get();
    m.drains
        .get_or_create(&ResultLabel {
            result: result.to_string(),
        })
        .inc();
    for (step, took) in steps {
        debug_assert!(DRAIN_STEPS.contains(step), "{step}");
        m.drain_step
            .get_or_create(&StepLabel {
                step: step.to_string(),
            })
            .set(took.as_secs_f64());
    }
}

/// Records an answer of the load balancer's agent-check (one of
/// [`LB_AGENT_ANSWERS`]).
pub fn lb_agent_answer(answer: &'static str) {
    debug_assert!(LB_AGENT_ANSWERS.contains(&answer), "{answer}");
    get()
        .lb_agent_answers
        .get_or_create(&AnswerLabel {
            answer: answer.to_string(),
        })
        .inc();
}

/// Records whether this node's Serve proxy answers its health check.
pub fn serve_proxy(up: bool) {
    get().serve_proxy_up.set(i64::from(up));
}

/// Records whether the agent could open the Docker socket at start.
pub fn docker_socket_usable(usable: bool) {
    get().docker_socket_usable.set(i64::from(usable));
}

/// Records the pre-start hook's result (one of [`HOOK_RESULTS`]).
pub fn hook(result: &'static str) {
    debug_assert!(HOOK_RESULTS.contains(&result), "{result}");
    let m = get();
    m.hook.clear();
    m.hook
        .get_or_create(&ResultLabel {
            result: result.to_string(),
        })
        .set(1);
}

/// The podman commands counted by name; any other is counted as `other`.
pub const SHIM_COMMANDS: &[&str] = &[
    "run",
    "create",
    "start",
    "stop",
    "kill",
    "rm",
    "ps",
    "inspect",
    "logs",
    "wait",
    "pull",
    "images",
    "image",
    "version",
    "info",
    "exec",
    "container",
];

/// Returns `command` if it is one of [`SHIM_COMMANDS`], else `other`
/// (labels stay a fixed set whatever a caller sends).
pub fn shim_command_label(command: &str) -> &'static str {
    SHIM_COMMANDS
        .iter()
        .find(|c| **c == command)
        .copied()
        .unwrap_or("other")
}

/// Records one brokered podman call.
pub fn shim_call(command: &str, took: Duration) {
    let m = get();
    let label = CommandLabel {
        command: shim_command_label(command).to_string(),
    };
    m.shim_calls.get_or_create(&label).inc();
    m.shim_duration
        .get_or_create(&label)
        .observe(took.as_secs_f64());
}

/// Records a podman call refused by `rule` (a short snake_case rule name).
pub fn shim_refusal(rule_: &str) {
    get().shim_refusals.get_or_create(&rule(rule_)).inc();
}

/// Records `n` engine containers created by the shim.
pub fn shim_created(n: u64) {
    get().shim_created.inc_by(n);
}

/// Records `n` engine containers removed by the janitor.
pub fn janitor_removed(n: u64) {
    get().shim_janitor_removed.inc_by(n);
}

// ---- serving --------------------------------------------------------------

/// The snapshot file `argus-agent metrics` prints.
pub fn snapshot_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SNAPSHOT_FILE)
}

/// The snapshot's name in the state folder.
pub const SNAPSHOT_FILE: &str = "metrics.txt";

/// Writes the rendered metrics next to the status file (atomically).
pub fn write_snapshot(
    state_dir: &mut argus_discovery::VolatileDir,
) -> Result<(), argus_discovery::PublishError> {
    state_dir.publish(SNAPSHOT_FILE, get().render().as_bytes())
}

/// Connections the metrics listener holds at once; more are closed as
/// they arrive (R-SEC-5: a flood of idle connections costs PID 1 a bounded
/// number of descriptors, and no busy loop).
pub const MAX_CONNECTIONS: usize = 256;

/// Connections one peer address may hold at once, so that one flooding
/// host leaves room for the scraper.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// How long a connection may take to send its request's headers.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long one connection may stay open, whatever it does.
pub const CONNECTION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30);

/// The pause after a failed accept (out of descriptors, most likely).
pub const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Serves `GET /metrics` on `addr` from a thread of its own (a
/// single-threaded tokio runtime with hyper: it sleeps in epoll between
/// scrapes). Returns once the port is bound, or why it could not be.
pub fn serve(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: cannot start the server's runtime");
                    return;
                }
            };
            rt.block_on(http::accept_loop(listener));
        })?;
    Ok(bound)
}

mod http {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::body::{Bytes, Incoming};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper::{header, Method, Request, Response, StatusCode};
    use hyper_util::rt::TokioIo;

    pub(super) async fn accept_loop(listener: std::net::TcpListener) {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot listen");
                return;
            }
        };
        let open = std::sync::Arc::new(std::sync::Mutex::new(Open::default()));
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and its kind: the condition lasts, so no
                    // retry at once (a busy loop), and no log line each.
                    tracing::debug!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(super::ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some(slot) = Open::take(&open, peer.ip()) else {
                // Over the cap: closed at once, before any byte is read.
                continue;
            };
            tokio::spawn(async move {
                let _slot = slot;
                let conn = http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(super::HEADER_READ_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service_fn(answer));
                let whole = tokio::time::timeout(super::CONNECTION_LIFETIME, conn);
                match whole.await {
                    Ok(Err(e)) => tracing::debug!(error = %e, "metrics: connection ended"),
                    Err(_) => tracing::debug!("metrics: connection over its lifetime, closed"),
                    Ok(Ok(())) => {}
                }
            });
        }
    }

    /// The connections open now, in all and by peer address.
    #[derive(Default)]
    pub(super) struct Open {
        all: usize,
        by_peer: std::collections::HashMap<std::net::IpAddr, usize>,
    }

    /// One open connection; frees its place when dropped.
    pub(super) struct Slot {
        open: std::sync::Arc<std::sync::Mutex<Open>>,
        peer: std::net::IpAddr,
    }

    impl Open {
        /// A place for a connection from `peer`, unless the listener is
        /// at [`super::MAX_CONNECTIONS`] or the peer at
        /// [`super::MAX_CONNECTIONS_PER_PEER`].
        pub(super) fn take(
            open: &std::sync::Arc<std::sync::Mutex<Open>>,
            peer: std::net::IpAddr,
        ) -> Option<Slot> {
            let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
            let mine = o.by_peer.get(&peer).copied().unwrap_or(0);
            if o.all >= super::MAX_CONNECTIONS || mine >= super::MAX_CONNECTIONS_PER_PEER {
                return None;
            }
            o.all += 1;
            o.by_peer.insert(peer, mine + 1);
            Some(Slot {
                open: open.clone(),
                peer,
            })
        }
    }

    impl Drop for Slot {
        fn drop(&mut self) {
            let mut o = self.open.lock().unwrap_or_else(|p| p.into_inner());
            o.all -= 1;
            if let Some(n) = o.by_peer.get_mut(&self.peer) {
                *n -= 1;
                if *n == 0 {
                    o.by_peer.remove(&self.peer);
                }
            }
        }
    }

    async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let (status, ctype, body) = match (req.method(), req.uri().path()) {
            (&Method::GET | &Method::HEAD, "/metrics") => {
                (StatusCode::OK, super::CONTENT_TYPE, super::get().render())
            }
            (&Method::GET | &Method::HEAD, "/") => (
                StatusCode::OK,
                "text/plain; charset=utf-8",
                "argus-agent: metrics at /metrics\n".to_string(),
            ),
            (&Method::GET | &Method::HEAD, _) => (
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "not found: the metrics are at /metrics\n".to_string(),
            ),
            _ => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                "only GET and HEAD\n".to_string(),
            ),
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(ctype),
        );
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_label_value_is_rendered_from_the_start() {
        let text = get().render();
        for k in RayExitKind::ALL {
            assert!(
                text.contains(&format!(
                    "argus_ray_exits_total{{kind=\"{}\"}} 0",
                    k.as_str()
                )),
                "{text}"
            );
        }
        for r in TAKEOVER_RULES {
            assert!(text.contains(&format!("argus_head_takeovers_total{{rule=\"{r}\"}}")));
        }
        assert!(text.contains("argus_head_generation NaN"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn the_catalogue_has_every_family_with_its_type() {
        let c = catalogue();
        let find = |n: &str| c.iter().find(|d| d.name == n).map(|d| d.kind.as_str());
        assert_eq!(find("argus_ray_starts_total"), Some("counter"));
        assert_eq!(find("argus_shim_call_duration_seconds"), Some("histogram"));
        assert_eq!(find("argus_preflight_check"), Some("gauge"));
        assert_eq!(find("argus_agent_info"), Some("gauge"));
        assert!(c.iter().all(|d| !d.help.is_empty()), "{c:?}");
    }

    #[test]
    fn shim_commands_outside_the_set_are_other() {
        assert_eq!(shim_command_label("run"), "run");
        assert_eq!(shim_command_label("$(reboot)"), "other");
    }
}
