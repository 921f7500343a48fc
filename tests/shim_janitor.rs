//! The janitor the node agent calls (`argus_podman::janitor`), against the
//! real daemon. The containers get an owner of their own (a running stand-in
//! for the Ray container), so the node-stop sweep cannot touch the
//! containers of shim tests running elsewhere. A sweep removes only what
//! this node's shim created, by full ID, as recorded in its state folder
//! (issue 26, hole 7): the tests record the containers they make as the
//! shim would, except those that play foreign ones.

mod shim_support;

use argus_podman::janitor::{record_in, JanitorScope};
use shim_support::*;

/// Runs this file's tests one at a time. A dead-shim sweep removes the
/// engine containers of any owner whose Ray container is gone, so one
/// test's sweep could remove another's deliberate orphan between its create
/// and its start ("container is marked for removal and cannot be started",
/// seen once under load). Real shims never race like this: their owner is
/// a live Ray container.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The state folder of this file's node (root's, 0700): its record of
/// created containers.
fn state() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// Sweeps the containers of `owner` recorded in [`state`].
fn sweep_owner_blocking(
    addr: &str,
    owner: Option<&str>,
    scope: JanitorScope,
) -> Result<usize, String> {
    argus_podman::janitor::sweep_owner_blocking(addr, state(), owner, scope)
        .map_err(|e| format!("{e:#}"))
}

/// [`unrecorded`], recorded in [`state`] as this node's shim would.
fn labelled(label: &str, owner: &str, pid: Option<u32>, rm: bool) -> String {
    let id = unrecorded(label, owner, pid, rm);
    record_in(state(), &id).unwrap();
    id
}

/// Creates a running container labelled like the shim's, owned by `owner`,
/// for shim `pid` (no start label: only liveness of the pid counts), as
/// something else than this node's shim would: not recorded.
fn unrecorded(label: &str, owner: &str, pid: Option<u32>, rm: bool) -> String {
    let img = image();
    let owner = format!("io.argus.shim.owner={owner}");
    let rm = format!("io.argus.shim.rm={}", u8::from(rm));
    let mut args = vec![
        "run", "-d", "--label", label, "--label", &owner, "--label", &rm,
    ];
    let pid_label = pid.map(|p| format!("io.argus.shim.pid={p}"));
    if let Some(p) = &pid_label {
        args.extend(["--label", p]);
    }
    args.extend([img, "/bin/tool", "sleep", "60"]);
    let o = docker(&args);
    assert!(o.status.success(), "{}", show(&o));
    stdout(&o).trim().to_string()
}

/// A current-thread runtime and a connection to this machine's daemon,
/// for the tests that call the shim's async Docker functions directly.
fn runtime_and_docker() -> (tokio::runtime::Runtime, bollard::Docker) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let docker = rt
        .block_on(argus_podman::docker::connect_to(
            &argus_podman_core::docker_host::DockerHost::parse(None),
        ))
        .unwrap();
    (rt, docker)
}

/// Starts a running stand-in for a Ray container (labelled `label`, so the
/// test can clean up) and returns its id: the owner of engine containers.
fn stand_in_ray(label: &str) -> String {
    let o = docker(&[
        "run",
        "-d",
        "--label",
        label,
        image(),
        "/bin/tool",
        "sleep",
        "120",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    stdout(&o).trim().to_string()
}

#[test]
fn janitor_removes_dead_shims_containers_then_all_at_node_stop() {
    let _serial = serial();
    let label = unique("janitor");
    // A running stand-in for the Ray container that owns them.
    let owner = stand_in_ray(&label);
    let sweep =
        |scope| sweep_owner_blocking("unix:///var/run/docker.sock", Some(&owner), scope).unwrap();
    // A pid that is certainly dead: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let live = std::process::id();
    let of_dead = labelled(&label, &owner, Some(dead), false);
    let of_live = labelled(&label, &owner, Some(live), true);
    let detached = labelled(&label, &owner, None, false);

    let n = sweep(JanitorScope::DeadShims);
    assert!(n >= 1, "removed {n}");
    let left = containers_with(&label);
    assert!(
        !left.contains(&of_dead),
        "the dead shim's container is still there"
    );
    assert!(
        left.contains(&of_live),
        "the live shim's container was removed"
    );
    assert!(left.contains(&detached), "a detached container was removed");

    let n = sweep(JanitorScope::AllOwned);
    assert_eq!(n, 2);
    let left = containers_with(&label);
    force_remove(&left);
    assert_eq!(
        left,
        vec![owner],
        "node-stop sweep left more than the owner"
    );
}

#[test]
fn janitor_without_a_docker_socket_returns_zero_at_once() {
    let _serial = serial();
    let t = std::time::Instant::now();
    let n = argus_podman::janitor::sweep_blocking_at(
        "unix:///nonexistent/docker.sock",
        JanitorScope::AllOwned,
    )
    .unwrap();
    assert_eq!(n, 0);
    // At once: no retry loop on a missing socket (the figure, not a bound).
    eprintln!("sweep without a daemon returned after {:?}", t.elapsed());
}

/// Issue 26, hole 7: containers of another node, whose Ray container is
/// gone, are not this node's to judge: a label names an owner, it proves
/// nothing (an image can ship it), so they survive this node's sweeps.
#[test]
fn other_nodes_containers_survive_whatever_their_labels_say() {
    let _serial = serial();
    let label = unique("orphan");
    // An owner id that no container has (any more).
    let gone = format!("{:0>64}", format!("{:x}", std::process::id()));
    let orphan = unrecorded(&label, &gone, Some(std::process::id()), false);
    let mine = unique("owner");
    for scope in [JanitorScope::DeadShims, JanitorScope::AllOwned] {
        sweep_owner_blocking("unix:///var/run/docker.sock", Some(&mine), scope).unwrap();
    }
    let still = containers_with(&label);
    force_remove(&still);
    assert_eq!(still, vec![orphan], "another node's container was removed");
}

/// Issue 26, hole 7: an image that ships the shim's labels (this node's
/// owner, a dead shim's pid and start) makes every container made from it
/// carry them; such a container, created outside the shim, survives every
/// sweep: the dead-shim and node-stop sweeps, and the watchdog's.
#[test]
fn a_container_that_inherits_the_owner_label_survives_every_sweep() {
    let _serial = serial();
    let label = unique("inherited");
    let owner = stand_in_ray(&label);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let tag = format!("argus-shim-labelled:{}", std::process::id());
    derived_image(
        &tag,
        &format!(
            "LABEL io.argus.shim.owner={owner} io.argus.shim.pid={dead} io.argus.shim.pid-start=1 io.argus.shim.rm=1"
        ),
    );
    let o = docker(&[
        "run",
        "-d",
        "--label",
        &label,
        &tag,
        "/bin/tool",
        "sleep",
        "60",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    let foreign = stdout(&o).trim().to_string();
    for scope in [JanitorScope::DeadShims, JanitorScope::AllOwned] {
        sweep_owner_blocking("unix:///var/run/docker.sock", Some(&owner), scope).unwrap();
    }
    let (rt, docker) = runtime_and_docker();
    let by_watchdog = rt.block_on(argus_podman::janitor::sweep_shim(&docker, &owner, dead, 1));
    let left = containers_with(&label);
    force_remove(&left);
    let _ = docker_rmi(&tag);
    assert!(
        left.contains(&foreign),
        "a container that only inherited the owner label was removed (watchdog: {by_watchdog:?})"
    );
}

fn docker_rmi(tag: &str) -> std::process::Output {
    docker(&["rmi", "-f", tag])
}

/// Issue 9.10: the shim stops its start-of-run sweep with a token instead
/// of aborting it; once the token is cancelled the sweep begins no removal.
#[test]
fn a_cancelled_sweep_begins_no_removal() {
    let _serial = serial();
    use argus_podman::janitor::sweep;
    use tokio_util::sync::CancellationToken;

    let label = unique("cancelled");
    // A running stand-in for the Ray container, so that no other test's
    // dead-shim sweep takes these containers for orphans.
    let owner = stand_in_ray(&label);
    let doomed = [
        labelled(&label, &owner, None, false),
        labelled(&label, &owner, None, false),
    ];
    let (rt, docker) = runtime_and_docker();
    let stop = CancellationToken::new();
    stop.cancel();
    let cancelled = rt.block_on(sweep(
        &docker,
        state(),
        &owner,
        JanitorScope::AllOwned,
        &stop,
    ));
    let left = containers_with(&label);
    let n = rt.block_on(sweep(
        &docker,
        state(),
        &owner,
        JanitorScope::AllOwned,
        &CancellationToken::new(),
    ));
    let after = containers_with(&label);
    force_remove(&containers_with(&label));
    assert_eq!(cancelled.unwrap(), 0);
    assert!(
        doomed.iter().all(|c| left.contains(c)),
        "a cancelled sweep removed a container"
    );
    assert_eq!(n.unwrap(), 2);
    assert_eq!(after, vec![owner], "the sweep left more than the owner");
}

/// Regression (issue 9, item 1: `shim_docker::run_with_a_tty_merges_stderr_into_stdout`
/// printed "removal of container … is already in progress"): several
/// removers race for one container on purpose. With raw API calls the race
/// shows as 409s; through the shim's `remove` every remover succeeds, and a
/// container already gone is a success too.
#[test]
fn removing_a_container_that_is_being_removed_or_gone_is_success() {
    let _serial = serial();
    use argus_podman::docker::{is_removal_in_progress, remove};
    use bollard::query_parameters::RemoveContainerOptionsBuilder;

    let label = unique("rmrace");
    let (rt, docker) = runtime_and_docker();
    let force = || Some(RemoveContainerOptionsBuilder::new().force(true).build());
    // The race, made on purpose: four force-removes of one running container.
    let mut saw_in_progress = false;
    for _ in 0..20 {
        let id = labelled(&label, "rmrace", None, false);
        let results = rt.block_on(futures_util::future::join_all(
            (0..4).map(|_| docker.remove_container(&id, force())),
        ));
        if results
            .iter()
            .any(|r| r.as_ref().is_err_and(is_removal_in_progress))
        {
            saw_in_progress = true;
            break;
        }
    }
    let left = containers_with(&label);
    force_remove(&left);
    assert!(
        saw_in_progress,
        "20 rounds of concurrent removes never got a 409 'already in progress'"
    );
    // The same race through the shim's remove: every remover succeeds.
    for _ in 0..5 {
        let id = labelled(&label, "rmrace", None, false);
        let results = rt.block_on(futures_util::future::join_all(
            (0..4).map(|_| remove(&docker, &id)),
        ));
        assert_eq!(results, vec![true; 4], "a remover of {id} failed");
        assert!(
            rt.block_on(remove(&docker, &id)),
            "a gone container is removed"
        );
    }
    assert!(containers_with(&label).is_empty());
}

/// Issue 9, item 7: a node on the host owns its containers under an id of
/// its own (kept in its state folder), not the shared word `host`: another
/// host node's stop sweep leaves them alone, its own removes them.
#[test]
fn host_nodes_sweep_only_their_own_containers() {
    let _serial = serial();
    use argus_podman::owner::host_owner;
    let label = unique("hostowner");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let o = output(
        podman(&[
            "run",
            "-d",
            "--label",
            &label,
            image(),
            "/bin/tool",
            "sleep",
            "60",
        ])
        .env("ARGUS_STATE_DIR", b.path())
        .env("ARGUS_SHIM_SELF_ID", "host"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let id = stdout(&o).trim().to_string();
    let owner_b = host_owner(b.path()).unwrap();
    let o = docker(&[
        "inspect",
        "-f",
        "{{index .Config.Labels \"io.argus.shim.owner\"}}",
        &id,
    ]);
    assert_eq!(
        stdout(&o).trim(),
        owner_b,
        "the shim labels with its node's id"
    );
    let owner_a = host_owner(a.path()).unwrap();
    assert_ne!(owner_a, owner_b);
    let sock = "unix:///var/run/docker.sock";
    for scope in [JanitorScope::AllOwned, JanitorScope::DeadShims] {
        argus_podman::janitor::sweep_owner_blocking(sock, a.path(), Some(&owner_a), scope).unwrap();
        assert_eq!(
            containers_with(&label),
            vec![id.clone()],
            "{scope:?} sweep of another host node removed it"
        );
    }
    let n = argus_podman::janitor::sweep_owner_blocking(
        sock,
        b.path(),
        Some(&owner_b),
        JanitorScope::AllOwned,
    )
    .unwrap();
    let left = left_after_removal(&label, &[id]);
    force_remove(&left);
    assert!(
        n >= 1 && left.is_empty(),
        "its own node-stop sweep left {left:?}"
    );
}

/// Issue 9, item 7: a stopped (restartable) Ray container keeps its engine
/// containers; once it is removed, another node's sweep still leaves them
/// (issue 26, hole 7: only their own node, by its record, removes them).
#[test]
fn a_stopped_or_removed_ray_container_keeps_its_engines_from_other_nodes() {
    let _serial = serial();
    let label = unique("stoppedray");
    let ray = stand_in_ray(&label);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let engine = unrecorded(&label, &ray, Some(dead), false);
    let o = docker(&["kill", &ray]);
    assert!(o.status.success(), "{}", show(&o));
    let other = unique("othernode");
    let sock = "unix:///var/run/docker.sock";
    sweep_owner_blocking(sock, Some(&other), JanitorScope::DeadShims).unwrap();
    assert!(
        containers_with(&label).contains(&engine),
        "the engine of a stopped Ray container was removed"
    );
    let o = docker(&["rm", "-f", &ray]);
    assert!(o.status.success(), "{}", show(&o));
    sweep_owner_blocking(sock, Some(&other), JanitorScope::DeadShims).unwrap();
    let left = containers_with(&label);
    force_remove(&left);
    assert_eq!(left, vec![engine], "another node removed the engine");
}

/// R-PID-4 / R-SHIM-4: the record of created containers lives in the state
/// folder, a tmpfs a node container loses when it restarts; its engines
/// outlive it. After a restart (no record), the node's own dead-shim sweep
/// still removes an engine whose owner label was set on the container (by
/// this node's shim), not inherited from its image. (The soak's `engines`
/// invariant failed without it: a restarted node never removed the engines
/// of its dead shims.)
#[test]
fn a_restarted_nodes_sweep_removes_its_dead_shims_engines_without_the_record() {
    let _serial = serial();
    let label = unique("restarted");
    let owner = stand_in_ray(&label);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let engine = unrecorded(&label, &owner, Some(dead), false);
    let fresh_state = tempfile::tempdir().unwrap();
    let n = argus_podman::janitor::sweep_owner_blocking(
        "unix:///var/run/docker.sock",
        fresh_state.path(),
        Some(&owner),
        JanitorScope::DeadShims,
    )
    .map_err(|e| format!("{e:#}"))
    .unwrap();
    let left = containers_with(&label);
    force_remove(&left);
    assert!(
        !left.contains(&engine),
        "the engine of a dead shim stayed after its node lost the record (removed {n})"
    );
}
