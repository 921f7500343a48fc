//! `argus-agent` / `argus-agent run`: the node.

use std::time::Duration;

use argus_config::{Config, Group, Reader, Source};
use argus_node::preflight::GateError;
use argus_node::{Event, NodeAgent};
use argus_podman_core::docker_host::DockerHost;
use argus_supervise::Stop;
use tracing::{info, warn};

use super::flags::Flags;
use super::{Error, Outcome};
use crate::logging;

/// Reads and checks the whole configuration, as `run` and `config` do:
/// returns it with the warnings to show.
pub fn load(flags: &Flags) -> Result<(Config, Vec<String>), Error> {
    let cfg = Config::read(Reader::new(&flags.0))?;
    let warnings = cfg.check_host()?;
    Ok((cfg, warnings))
}

/// PID 1 as root keeps no supplementary groups: the storage thread's
/// file-system identity (ARGUS_AGENT_USER) must get nothing extra from
/// root's groups, and nothing the agent starts inherits them.
fn drop_supplementary_groups() -> Result<(), Error> {
    if argus_discovery::trust::Identity::current().uid != 0 {
        return Ok(());
    }
    match argus_discovery::trust::drop_supplementary_groups() {
        Ok(()) => Ok(()),
        // A user namespace that denies setgroups (unshare --map-root-user):
        // the groups are the outer user's and cannot be changed there.
        Err(e)
            if e.kind() == std::io::ErrorKind::PermissionDenied
                && std::fs::read_to_string("/proc/self/setgroups")
                    .is_ok_and(|s| s.trim() == "deny") =>
        {
            Ok(())
        }
        Err(e) => Err(Error::Untrusted(format!(
            "cannot drop the agent's supplementary groups: {e}"
        ))),
    }
}

/// R-SEC-2 at start: the discovery folder and `epochs/` (made by the head
/// when missing) are reached through trusted components only, checked as
/// the writer identity. A breach, or a folder the writer may not create,
/// is exit 78 with nothing written; a hung or missing share is not (the
/// node retries, R-WRK-4).
fn check_discovery_paths(cfg: &Config) -> Result<(), Error> {
    use argus_discovery::trust::{open_dir, TrustError};
    let Some(dir) = cfg.head_file.parent().map(|d| d.to_path_buf()) else {
        return Ok(());
    };
    let create = cfg.role == argus_config::Role::Head;
    let storage = argus_supervise::storage::Storage::start_as(cfg.agent_user);
    let checked = storage.run(
        "check the discovery folder",
        std::time::Duration::from_secs(10),
        move || -> Result<(), TrustError> {
            for d in [dir.clone(), dir.join("epochs")] {
                match open_dir(&d, create) {
                    Ok(_) => {}
                    Err(e) if e.is_missing() => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        },
    );
    match checked {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            let denied = matches!(&e, TrustError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied);
            if e.is_breach() || denied {
                Err(Error::Untrusted(format!(
                    "discovery folder (ARGUS_HEAD_IP_FILE, written as ARGUS_AGENT_USER {}:{}): {e}",
                    cfg.agent_user.uid, cfg.agent_user.gid
                )))
            } else {
                warn!(error = %e, "cannot check the discovery folder yet; the node retries");
                Ok(())
            }
        }
        // The thread could not take the identity (the agent is not root
        // and ARGUS_AGENT_USER is not its own): nothing could be written.
        Err(e @ argus_supervise::storage::StorageError::Gone { .. }) => Err(Error::Untrusted(format!(
            "ARGUS_AGENT_USER {}:{}: cannot write as it ({e}); the agent must be root, or run as that uid:gid",
            cfg.agent_user.uid, cfg.agent_user.gid
        ))),
        Err(e) => {
            warn!(error = %e, "cannot check the discovery folder yet; the node retries");
            Ok(())
        }
    }
}

/// Runs the node; returns its exit code (SPEC §11).
pub fn run(flags: &Flags) -> Outcome {
    // R-CFG-1: validate everything before writing or starting anything.
    let (cfg, warnings) = load(flags)?;
    // R-SEC-2: who writes shared state, for every check and thread below.
    argus_discovery::trust::set_agent(cfg.agent_user);
    drop_supplementary_groups()?;
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "node".into());
    let log_name = format!("argus-agent-{host}-{}.log", cfg.role);
    let logged = logging::init(
        cfg.log.format,
        &cfg.log.level,
        Some((&cfg.log.dir, &log_name)),
    )
    .map_err(|e| Error::Untrusted(e.to_string()))?;
    if let Some(w) = logged {
        warn!("{w}");
    }
    check_discovery_paths(&cfg)?;
    for w in warnings {
        warn!("{w}");
    }
    match argus_supervise::privs::raise_nofile_limit() {
        Ok((before, after)) if before < after => {
            info!(
                before,
                after, "open descriptors: soft limit raised to the hard one"
            )
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot raise the soft limit of open descriptors"),
    }
    // Nothing this agent starts may ptrace it or open its /proc/1/{root,fd,mem}.
    if let Err(e) = argus_supervise::privs::make_non_dumpable() {
        warn!(error = %e, "cannot make the agent non-dumpable");
    }
    let (ip, source) = match cfg.node_net {
        Some(net) => argus_supervise::netinfo::detect_in(net)?,
        None => argus_supervise::netinfo::detect(cfg.node_ip)?,
    };
    info!(node_ip = %ip, strategy = %source, "node ip chosen");
    // Issue 18: a fixed port of this node's Ray that another process holds
    // (with --network host, anything on the host) is one line naming its
    // variable now, not an obscure failure of Ray's later. Exit 78.
    argus_config::rayports::check_free(
        ip,
        &cfg.ray_ports
            .fixed(cfg.role, cfg.ray_port, cfg.dashboard_port),
    )?;
    argus_telemetry::metrics::node_started(
        &cfg.role.to_string(),
        &cfg.cluster_name,
        &ip.to_string(),
        cfg.ttl,
    );
    argus_telemetry::metrics::shim_refusal_rules(argus_podman_core::policy::REFUSAL_RULES);
    if let Some(port) = cfg.metrics_port {
        let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
        let bound = argus_telemetry::metrics::serve(addr)
            .map_err(|source| Error::MetricsPort { port, source })?;
        info!(address = %bound, "serving metrics at http://{bound}/metrics");
    }
    std::fs::create_dir_all(&cfg.state_dir).map_err(|source| Error::StateDir {
        path: cfg.state_dir.clone(),
        source,
    })?;
    // One stop handle for the whole run: SIGTERM/SIGINT during preflight or
    // the hook stop them at once (their process groups are killed); later,
    // the node and its threads see the same request.
    let stop = Stop::new();
    let mut node = NodeAgent::new(cfg.clone(), ip, source, stop.clone());
    // The shim (started by the raylet) finds this node's owner id under the
    // same state folder as the agent's janitor, however it was given.
    node.add_ray_env(vec![(
        "ARGUS_STATE_DIR".to_string(),
        cfg.state_dir.display().to_string(),
    )]);
    // The shim takes its settings from this node, never from the caller's
    // environment (which a job's runtime_env env_vars reach).
    let mut shim_settings = argus_podman::settings::NodeSettings::from_env(|k| match k {
        "ARGUS_STATE_DIR" => Some(cfg.state_dir.display().to_string()),
        "ARGUS_SHARED_ROOT" => Some(cfg.shared_root.display().to_string()),
        k => cfg
            .shim
            .vars
            .get(k)
            .cloned()
            .or_else(|| std::env::var(k).ok()),
    });
    // The bind roots are resolved here, once, as this process (root) sees
    // them at start: no call resolves them again (see NodeSettings).
    shim_settings.resolve_bind_roots();
    let path = shim_settings.write(&cfg.state_dir)?;
    // A host node's owner id is created here, by the agent, not by the
    // first podman call (which may run as a user that cannot write here).
    if let Err(e) = argus_podman::owner::host_owner(&cfg.state_dir) {
        warn!(error = %e, "cannot create this node's owner id");
    }
    info!(path = %path.display(), "shim settings written");
    // Only this process may reach Docker: Ray's podman calls come here.
    let me = argus_supervise::privs::current_ids();
    let ray = cfg.ray_user.as_ref().map_or(me, |u| (u.uid, u.gid));
    let docker_host = DockerHost::parse(std::env::var("DOCKER_HOST").ok().as_deref());
    let socket = argus_podman::broker::check_socket(
        &docker_host,
        ray.0,
        ray.1,
        &argus_podman::broker::USUAL_SOCKETS,
    );
    for w in &socket.warnings {
        warn!("{w}");
    }
    argus_telemetry::metrics::docker_socket_usable(socket.unavailable.is_none());
    node.set_engine_containers(socket.unavailable);
    // The socket in a folder other users can enter is a road to the Docker
    // API for any process that gets its group (SPEC R-SEC-4): refused in
    // the node container (the agent is PID 1 there and runs Ray as another
    // user), a warning elsewhere (an agent on a host, in a test's PID
    // namespace, or running Ray as itself, where the host's layout rules).
    if let Some(problem) = argus_podman::broker::socket_folder_problem(&docker_host) {
        if std::process::id() == 1 && ray != me && me.0 == 0 {
            return Err(Error::DockerSocket(problem));
        }
        warn!("{problem}");
    }
    if ray == me && me.0 == 0 {
        warn!("Ray runs as root with the agent's rights: set ARGUS_RAY_USER (the node image does) so that no Ray process can open the Docker socket");
    }
    let broker = argus_podman::broker::start(argus_podman::broker::BrokerConfig {
        state_dir: cfg.state_dir.clone(),
        settings: path,
        allowed_uids: vec![me.0, ray.0],
        owner: (ray != me && me.0 == 0).then_some(ray),
        ray_pid: node.ray_pid(),
        stop: stop.clone(),
    })
    .map_err(|source| Error::StateDir {
        path: cfg.state_dir.join(argus_podman::client::SOCKET),
        source,
    })?;
    info!(socket = %broker.display(), ray_uid = ray.0, "podman calls are brokered by this agent");
    check_stop_timeout(&cfg, node.drain_gate());
    // Shim variables given as flags reach the shim through Ray's environment.
    node.add_ray_env(
        cfg.settings
            .iter()
            .filter(|s| s.group == Group::Shim && s.source == Source::Flag)
            .filter_map(|s| Some((s.name.to_string(), s.value.clone()?)))
            .collect(),
    );
    // Every signal also waits in the node's queue (forwarded to Ray).
    let events = node.events();
    let on_signal = stop.clone();
    // A worker's first SIGTERM drains before the stop (R-SERVE-4): the
    // node requests the stop itself when the drain ends.
    let gate = node.drain_gate();
    // A stop is delivered once it is requested, even when the node is gone
    // by the time it would be queued: the request may itself have ended the
    // run (a failed preflight's linger) and main is then exiting with its
    // code, which "no receiver: exit 128+signal" must not replace.
    argus_supervise::reaper::route_signals(move |sig| {
        let ev = Event::of_signal(sig, &gate, &on_signal);
        events.send(ev).is_ok() || argus_supervise::reaper::is_stop(sig)
    });
    let outcome = match argus_node::preflight::gate(&cfg, &stop) {
        Ok(o) => o,
        Err(GateError::Stopped(_)) => return Ok(stopped("the gpu preflight")),
        Err(GateError::Failed(e)) => {
            linger(&cfg, &stop, &e.to_string());
            return Err(e.into());
        }
    };
    let hook = argus_node::hook::run_prestart(&cfg.hook, &stop);
    argus_telemetry::metrics::hook(hook_result(&cfg.hook, &hook));
    match hook {
        Ok(()) => {}
        Err(argus_node::hook::HookError::Stopped { .. }) => {
            return Ok(stopped("the prestart hook"))
        }
        Err(e) => return Err(e.into()),
    }
    if stop.is_requested() {
        return Ok(stopped("start"));
    }
    node.add_ray_env(outcome.env);
    Ok(node.run().clamp(0, 255) as u8)
}

/// A worker drains before it stops, within its container's stop timeout:
/// reads that timeout (from a thread: it asks the Docker daemon), bounds
/// every drain to what it leaves after Ray's stop grace and the cleanup,
/// and warns when that is less than ARGUS_DRAIN_TIMEOUT_S (Docker would
/// kill the node mid-drain, engine containers and all).
fn check_stop_timeout(cfg: &Config, gate: argus_node::DrainGate) {
    use argus_config::{DOCKER_STOP_TIMEOUT, STOP_OVERHEAD};
    if cfg.role != argus_config::Role::Worker || !cfg.drain.enabled {
        return;
    }
    let (wanted, after) = (cfg.drain.timeout, cfg.stop_grace + STOP_OVERHEAD);
    let _ = std::thread::Builder::new()
        .name("stop-timeout".into())
        .spawn(move || {
            let Some(own) = argus_podman::docker::own_stop_timeout_blocking() else {
                return;
            };
            let have = Duration::from_secs(
                own.map_or(DOCKER_STOP_TIMEOUT.as_secs(), |s| s.max(0) as u64),
            );
            let limit = have.saturating_sub(after);
            gate.set_limit(limit);
            if limit < wanted {
                warn!(
                    container_stop_timeout_s = have.as_secs(),
                    drain_s = limit.as_secs_f64(),
                    "this container's stop timeout leaves {:.0} s of ARGUS_DRAIN_TIMEOUT_S={:.0} after ARGUS_STOP_GRACE_S and 2 s of cleanup: \
                     drains are cut to that (none under 5 s); raise it to {:.0} s (compose `stop_grace_period`, `docker run --stop-timeout`)",
                    limit.as_secs_f64(),
                    wanted.as_secs_f64(),
                    (wanted + after).as_secs_f64().ceil()
                );
            }
        });
}

/// Returns the `argus_prestart_hook` result of the hook's outcome.
fn hook_result(
    cfg: &argus_config::HookConfig,
    r: &Result<(), argus_node::hook::HookError>,
) -> &'static str {
    use argus_node::hook::HookError;
    match r {
        Ok(()) if cfg.disabled => "disabled",
        Ok(()) if !cfg.path.exists() => "absent",
        Ok(()) => "ok",
        Err(HookError::Failed { .. } | HookError::Spawn { .. }) => "failed",
        Err(HookError::TimedOut { .. }) => "timed_out",
        Err(HookError::NotExecutable { .. }) => "not_executable",
        Err(HookError::Stopped { .. }) => "stopped",
    }
}

/// With metrics served, keeps them up for `ARGUS_METRICS_LINGER_S` after a
/// failed preflight (a stop request ends the wait), so that Prometheus
/// scrapes the failure before the agent exits with its code.
fn linger(cfg: &Config, stop: &Stop, why: &str) {
    if cfg.metrics_port.is_none() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    stop.on_request(move || {
        let _ = tx.send(());
    });
    info!(
        linger_s = cfg.metrics_linger.as_secs_f64(),
        why, "preflight failed; serving its metrics before exiting (ARGUS_METRICS_LINGER_S)"
    );
    let _ = rx.recv_timeout(cfg.metrics_linger);
}

/// Logs a stop before Ray started; returns exit code 0.
fn stopped(during: &str) -> u8 {
    info!(during, "stopped on request before ray started");
    0
}
