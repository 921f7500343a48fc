//! `podman run` with the docker CLI's sequence: create (pulling a missing
//! image), copy in, attach, proxy signals, start, wait, drain, copy back,
//! remove. The shim removes `--rm` containers itself (not AutoRemove), so a
//! fast container's exit code cannot vanish with it.
//!
//! The background tasks (the janitor sweep, the output pump, the stdin
//! feeder, the signal forwarders) all watch one [`CancellationToken`] and
//! return when it is cancelled; the run then waits for them, briefly, on a
//! [`TaskTracker`]. None is aborted, so none stops halfway through a write
//! or a container removal.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::container::{AttachContainerResults, LogOutput};
use bollard::errors::Error as BollardError;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
    DownloadFromContainerOptionsBuilder, KillContainerOptionsBuilder,
    ResizeContainerTTYOptionsBuilder, StartContainerOptions, UploadToContainerOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::docker::{self, is_not_found, message};
use super::janitor::{self, JanitorScope};
use super::owner;
use super::resolve::resolve;
use super::watchdog;
use crate::call::Call;
use crate::error::{ShimError, EXIT_CANNOT_INVOKE, EXIT_NOT_FOUND, EXIT_SHIM};
use argus_podman_core::args::{PullPolicy, RunOpts, Source};
use argus_podman_core::policy::{Policy, PolicyError, ResolvedImage};
use argus_podman_core::selfid::{Limits, SelfContainer};
use argus_podman_core::translate::{self, BindCopy, Context};

/// Signals forwarded to the container by name (the docker CLI forwards all
/// but SIGCHLD, SIGPIPE and the Go runtime's; these are the catchable ones
/// that matter, SIGWINCH resizes a TTY instead).
pub(crate) const FORWARDED: &[(i32, &str)] = &[
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGUSR2, "SIGUSR2"),
    (libc::SIGCONT, "SIGCONT"),
    (libc::SIGALRM, "SIGALRM"),
];

/// How long dockerd may take to flush a container's output after it exits
/// (its copiers get 2 s).
const DRAIN: Duration = Duration::from_secs(2);

/// How long the run waits for its background tasks once told to stop.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Cancels `stop` and waits, at most [`STOP_WAIT`], for the `tasks` that
/// watch it to return.
async fn stop_tasks(stop: &CancellationToken, tasks: &TaskTracker) {
    stop.cancel();
    tasks.close();
    if tokio::time::timeout(STOP_WAIT, tasks.wait()).await.is_err() {
        tracing::debug!(left = tasks.len(), "background tasks did not stop in time");
    }
}

/// Returns the exit code for a failed start, like the docker CLI's
/// `runStartContainerErr`: 127 when the command is missing, 126 when it
/// cannot be run, else 125.
pub fn start_error_code(msg: &str) -> u8 {
    let m = msg.to_ascii_lowercase();
    if m.contains("executable file not found") || m.contains("no such file or directory") {
        EXIT_NOT_FOUND
    } else if m.contains("permission denied")
        || m.contains("is a directory")
        || m.contains("exec format error")
    {
        EXIT_CANNOT_INVOKE
    } else {
        EXIT_SHIM
    }
}

/// Splits an image reference into the `fromImage` and `tag` of a pull
/// (Docker pulls every tag when the tag is empty).
pub fn split_ref(image: &str) -> (String, String) {
    if image.contains('@') {
        return (image.to_string(), String::new());
    }
    let last_slash = image.rfind('/').map(|i| i + 1).unwrap_or(0);
    match image[last_slash..].rfind(':') {
        Some(i) => (
            image[..last_slash + i].to_string(),
            image[last_slash + i + 1..].to_string(),
        ),
        None => (image.to_string(), "latest".to_string()),
    }
}

/// Pulls `image`, with podman-like progress lines on stderr.
pub async fn pull(docker: &Docker, image: &str, quiet: bool) -> Result<(), ShimError> {
    check_not_squatting(docker, image).await?;
    let (name, tag) = split_ref(image);
    if !quiet {
        eprintln!("Trying to pull {image}...");
    }
    let opts = CreateImageOptionsBuilder::new()
        .from_image(&name)
        .tag(&tag)
        .build();
    let mut progress = docker.create_image(Some(opts), None, None);
    while let Some(item) = progress.next().await {
        let info = item.map_err(ShimError::docker(format!("pull {image}")))?;
        if let Some(e) = info.error_detail.and_then(|d| d.message) {
            return Err(ShimError::Docker {
                what: format!("pull {image}"),
                source: BollardError::DockerStreamError { error: e },
            });
        }
    }
    if !quiet {
        eprintln!("Writing manifest to image destination");
    }
    Ok(())
}

async fn create(
    docker: &Docker,
    o: &RunOpts,
    body: ContainerCreateBody,
    shown: &str,
) -> Result<String, ShimError> {
    let mut b = CreateContainerOptionsBuilder::new();
    if let Some(n) = &o.name {
        b = b.name(n);
    }
    if let Some(p) = &o.platform {
        b = b.platform(p);
    }
    watchdog::note_create();
    // The image is the full ID resolved by `resolve_image` (pulled there).
    let id = docker
        .create_container(Some(b.build()), body)
        .await
        .map(|r| r.id)
        .map_err(ShimError::docker(format!("create container from {shown}")))?;
    super::report::note_created();
    super::report::note_created_id(&id);
    janitor::record_created(&id);
    Ok(id)
}

/// Resolves the image of `o` once, to its full ID (issue 26, hole 6),
/// pulling it first as `--pull` says (a pull only of a name the allow-list
/// names); checks that ID against the allow-list, whose entries are
/// resolved on this daemon too; and puts the ID in `o`, so the container
/// is created from exactly the image checked (a retag meanwhile changes
/// nothing). An image that carries the shim's own labels is refused: every
/// container made from it would inherit them.
async fn resolve_image(
    docker: &Docker,
    o: &mut RunOpts,
    policy: &mut Policy,
) -> Result<(), ShimError> {
    let shown = o.image.clone();
    let refused = || {
        ShimError::from(PolicyError::Image {
            image: shown.clone(),
        })
    };
    if o.pull == PullPolicy::Always {
        if !policy.image_name_allowed(&shown) {
            return Err(refused());
        }
        pull(docker, &shown, o.quiet).await?;
    }
    let i = match docker.inspect_image(&shown).await {
        Ok(i) => i,
        Err(e) if is_not_found(&e) => {
            if o.source == Source::Daemon {
                return Err(ShimError::NotInDaemon { image: shown });
            }
            if o.pull == PullPolicy::Never {
                return Err(ShimError::ImageMissing { image: shown });
            }
            if !policy.image_name_allowed(&shown) {
                return Err(refused());
            }
            if !o.quiet {
                eprintln!("Resolving \"{shown}\" (image not known locally)");
            }
            pull(docker, &shown, o.quiet).await?;
            docker
                .inspect_image(&shown)
                .await
                .map_err(ShimError::docker(format!("inspect image {shown}")))?
        }
        Err(e) => return Err(ShimError::docker(format!("inspect image {shown}"))(e)),
    };
    let id = i.id.clone().unwrap_or_default();
    if let Some(l) = i
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.keys().find(|k| argus_podman_core::labels::is_reserved(k)))
    {
        return Err(PolicyError::Flag {
            flag: "--label",
            value: format!("{l} (set by the image {shown}: its containers would inherit it)"),
            rule: "no-shim-labels",
        }
        .into());
    }
    if !image_admitted(docker, policy, i).await? {
        return Err(refused());
    }
    o.image = id;
    Ok(())
}

/// Returns the full IDs the allow-list's entries name on this daemon now
/// (entries with `*` name no one image; entries of no local image, none).
/// Returns true if and only if the inspected image `i` is allowed by the
/// image allow-list, compared by full ID (the allow-list's entries resolved
/// on the daemon, and the names the daemon holds for `i`'s ID); records
/// both in `policy` for the check.
pub async fn image_admitted(
    docker: &Docker,
    policy: &mut Policy,
    i: bollard::models::ImageInspect,
) -> Result<bool, ShimError> {
    let id = i.id.clone().unwrap_or_default();
    policy.listed_image_ids = listed_image_ids(docker, policy).await?;
    let mut names = i.repo_tags.unwrap_or_default();
    names.extend(i.repo_digests.unwrap_or_default());
    policy.images.push(ResolvedImage {
        id: id.clone(),
        names,
    });
    Ok(policy.image_allowed(&id))
}

pub async fn listed_image_ids(
    docker: &Docker,
    policy: &Policy,
) -> Result<HashSet<String>, ShimError> {
    let mut ids = HashSet::new();
    for entry in policy.allowed_images.iter().flatten() {
        if entry.ends_with('*') {
            continue;
        }
        match docker.inspect_image(entry).await {
            Ok(i) => ids.extend(i.id),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(ShimError::docker(format!("inspect image {entry}"))(e)),
        }
    }
    Ok(ids)
}

async fn context(
    docker: &Docker,
    o: &RunOpts,
    me: Option<SelfContainer>,
    call: &Call,
) -> Result<Context, ShimError> {
    let runtimes = match &o.runtime {
        Some(_) => {
            let info = docker
                .info()
                .await
                .map_err(ShimError::docker("read daemon info"))?;
            Some(info.runtimes.unwrap_or_default().into_keys().collect())
        }
        None => None,
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut canonical = HashMap::new();
    for v in o.volumes.iter().filter(|v| v.is_path()) {
        let c = resolve(&cwd.join(&v.source)).map_err(|e| PolicyError::Unresolvable {
            spec: v.source.clone(),
            reason: e.to_string(),
        })?;
        canonical.insert(v.source.clone(), c.display().to_string());
    }
    let mut env_files = HashMap::new();
    for f in &o.env_files {
        let text = std::fs::read_to_string(f).map_err(|source| ShimError::Io {
            path: f.clone(),
            source,
        })?;
        env_files.insert(f.clone(), text);
    }
    let owner = owner::node_owner_in(me.as_ref(), call)?;
    let pid = std::process::id();
    Ok(Context {
        me,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        env: call.caller.env.clone(),
        runtimes,
        owner,
        shim_pid: pid,
        shim_start: docker::process_start(pid).unwrap_or(0),
        lifetime: call.caller.lifetime,
        job: call.caller.job,
        groups: call.caller.groups.clone(),
        canonical,
        env_files,
    })
}

/// What [`resolve_refs`] found: the container references the shim may
/// touch, and the full ID `--replace` removes.
struct Refs {
    /// Full IDs of the containers `container:X` named, when this node
    /// owns them (the options now name them by these IDs), and the
    /// `--replace` name when no container has it or this node's has it.
    owned: HashSet<String>,
    /// The full ID of the container `--replace --name` removes.
    replace: Option<String>,
}

/// Returns true if and only if `r` is a container of `owner` (or any
/// container, under the relaxed policy).
fn owns(r: &docker::Resolved, owner: &str, relaxed: bool) -> bool {
    relaxed || r.owner.as_deref() == Some(owner)
}

/// Resolves the container references of `o` once, to full IDs (R-SEC-3):
/// each `container:X` of `--network`, `--pid` and `--ipc` that names a
/// container of `owner` is rewritten to `container:<full id>`, so the
/// daemon never resolves X again (a name that is another container's ID
/// prefix, once its container is gone, would name that one). A reference
/// that names no container, or one of another owner, is left as it was
/// and not owned: the policy refuses both alike. `--replace --name X`
/// removes the container named X by its full ID.
async fn resolve_refs(
    docker: &Docker,
    o: &mut RunOpts,
    owner: &str,
    relaxed: bool,
) -> Result<Refs, ShimError> {
    let mut refs = Refs {
        owned: HashSet::new(),
        replace: None,
    };
    for mode in [&mut o.network, &mut o.pid, &mut o.ipc]
        .into_iter()
        .flatten()
    {
        let Some(x) = mode.strip_prefix("container:") else {
            continue;
        };
        match docker::resolve_container(docker, x).await? {
            Some(r) if owns(&r, owner, relaxed) => {
                refs.owned.insert(r.id.clone());
                *mode = format!("container:{}", r.id);
            }
            Some(_) | None if relaxed => {
                return Err(ShimError::NoSuchContainer(x.to_string()));
            }
            Some(_) | None => {}
        }
    }
    if let (true, Some(name)) = (o.replace, &o.name) {
        let bare = name.strip_prefix('/').unwrap_or(name);
        match docker::resolve_container(docker, bare).await? {
            None => {
                refs.owned.insert(name.clone());
            }
            // Not hex (refused before): the daemon matched the name.
            Some(r) if r.name == bare && owns(&r, owner, relaxed) => {
                refs.owned.insert(name.clone());
                refs.replace = Some(r.id);
            }
            Some(_) => {}
        }
    }
    Ok(refs)
}

/// Refuses a `--name` that reads as a container ID prefix (R-SEC-3): no
/// job may own a container whose name another container's ID starts
/// with, whatever the policy.
fn check_name(o: &RunOpts) -> Result<(), PolicyError> {
    match &o.name {
        Some(n) if docker::looks_like_id(n) => Err(PolicyError::Flag {
            flag: "--name",
            value: format!("{n} (a name of hex digits reads as another container's ID)"),
            rule: "owned-containers-only",
        }),
        _ => Ok(()),
    }
}

/// Refuses a `--name` that this node's compose project would give one of
/// its own containers (R-SEC-10): compose names them `<project>-<service>-N`
/// (v1: `_`), and a job's container holding such a name stops the next
/// `compose up` from starting that service.
fn check_compose_name(
    o: &RunOpts,
    me: Option<&argus_podman_core::selfid::SelfContainer>,
) -> Result<(), PolicyError> {
    let (Some(name), Some(project)) = (&o.name, me.and_then(|m| m.compose_project.as_deref()))
    else {
        return Ok(());
    };
    if compose_would_adopt(name, project) {
        return Err(PolicyError::Flag {
            flag: "--name",
            value: format!("{name} (the names of compose project {project}'s own containers)"),
            rule: "no-squatting",
        });
    }
    Ok(())
}

/// Whether `name` (a leading `/` aside) is one compose's naming gives a
/// container of `project`: `<project>-…` or `<project>_…`. Docker compares
/// names exactly, so this does too.
fn compose_would_adopt(name: &str, project: &str) -> bool {
    let bare = name.strip_prefix('/').unwrap_or(name);
    bare.strip_prefix(project)
        .is_some_and(|rest| rest.starts_with('-') || rest.starts_with('_'))
}

/// Whether a container in Docker's `state` counts as live for the per-job
/// bound: everything but one that has ended (`exited`, `dead`) or is on its
/// way out (`removing`).
fn counts_as_live(state: &str) -> bool {
    !matches!(state, "exited" | "dead" | "removing")
}

/// For a call of a Ray job's own code (`ctx.job`, PID 1's word): takes the
/// node's create lock, then counts the job's live engine containers of
/// this node and refuses the call at `policy.max_engines_per_job`, or when
/// they and `body` would hold more memory, CPUs or pids together than the
/// Ray container has (`Policy::check_job_total`); otherwise returns the
/// lock, which the caller holds until its container exists, so no two
/// calls of one job take the last place.
async fn job_slot(
    docker: &Docker,
    policy: &Policy,
    ctx: &Context,
    body: &ContainerCreateBody,
) -> Result<Option<crate::nodelock::Held>, ShimError> {
    use argus_podman_core::labels::{LABEL_JOB, LABEL_OWNER};
    let (Some(job), max) = (ctx.job, policy.max_engines_per_job) else {
        return Ok(None);
    };
    if max == 0 {
        return Ok(None);
    }
    let lock = crate::nodelock::create().await?;
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            format!("{LABEL_OWNER}={}", ctx.owner),
            format!("{LABEL_JOB}={job:08x}"),
        ],
    )]);
    let list = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(ShimError::docker("list containers"))?;
    let live: Vec<&str> = list
        .iter()
        // A container whose state Docker did not say counts.
        .filter(|c| c.state.as_ref().is_none_or(|s| counts_as_live(s.as_ref())))
        .filter_map(|c| c.id.as_deref())
        .collect();
    if live.len() >= max {
        return Err(PolicyError::JobEngines {
            job,
            live: live.len(),
            max,
        }
        .into());
    }
    if !policy.bounds_job_totals() {
        return Ok(lock);
    }
    let mut used = Vec::with_capacity(live.len());
    for id in live {
        match docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Ok(i) => used.push(Limits::of(&i.host_config.unwrap_or_default())),
            // Gone since the list: it holds nothing.
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(ShimError::docker(format!("inspect container {id}"))(e)),
        }
    }
    let new = Limits::of(&body.host_config.clone().unwrap_or_default());
    policy.check_job_total(job, &used, &new)?;
    Ok(lock)
}

/// Refuses to pull `image` when a container of this host that no shim
/// created (a node, the lb, the store, another product's) was created from
/// an image of that name (R-SEC-10): the pulled image would take the tag,
/// and that container's next `compose up` or roll would run it, as root
/// with the Docker socket for a node.
async fn check_not_squatting(docker: &Docker, image: &str) -> Result<(), ShimError> {
    use argus_podman_core::labels::LABEL_OWNER;
    use argus_podman_core::policy::canonical;
    let wanted = canonical(image);
    let list = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .build(),
        ))
        .await
        .map_err(ShimError::docker("list containers"))?;
    let taken = list.iter().find(|c| {
        let shims = c
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_OWNER));
        !shims && c.image.as_deref().is_some_and(|i| canonical(i) == wanted)
    });
    match taken {
        Some(c) => Err(PolicyError::Flag {
            flag: "pull",
            value: format!(
                "{image} (the image of container {}, which no job started)",
                c.names
                    .as_ref()
                    .and_then(|n| n.first())
                    .map_or("?", |n| n.trim_start_matches('/'))
            ),
            rule: "no-squatting",
        }
        .into()),
        None => Ok(()),
    }
}

/// Returns the `--device` paths of `o` that are character devices here,
/// in the Ray container (not followed through a symlink).
fn present_devices(o: &RunOpts) -> HashSet<String> {
    use std::os::unix::fs::FileTypeExt;
    o.devices
        .iter()
        .filter_map(|d| d.split(':').next())
        .filter(|p| p.starts_with('/'))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device()))
        .map(str::to_string)
        .collect()
}

/// Runs `podman run` and returns its exit code.
pub async fn run(mut o: RunOpts, call: &Call) -> Result<u8, ShimError> {
    check_name(&o)?;
    let mut policy = call.policy()?;
    let docker = docker::connect_to(&call.docker).await?;
    let me = docker::whoami(&docker).await?;
    check_compose_name(&o, me.as_ref())?;
    policy.resolve(me.as_ref(), |p| resolve(p).ok());
    policy.present_devices = present_devices(&o);
    policy.caller = Some((
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    ));
    policy.socket_gid = call.docker.socket_path().and_then(|p| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| m.gid())
    });
    // The caller's spelling, for messages; `o.image` becomes the full ID.
    let shown = o.image.clone();
    resolve_image(&docker, &mut o, &mut policy).await?;
    let ctx = context(&docker, &o, me, call).await?;
    let refs = resolve_refs(&docker, &mut o, &ctx.owner, policy.relaxed).await?;
    policy.owned_refs = refs.owned;
    // The janitor runs at each shim start, beside the real work, and stops
    // with it.
    let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
    {
        let (docker, owner, stop) = (docker.clone(), ctx.owner.clone(), stop.clone());
        let state_dir = call.state_dir.clone();
        tasks.spawn(async move {
            let scope = JanitorScope::DeadShims;
            if let Err(e) = janitor::sweep(&docker, &state_dir, &owner, scope, &stop).await {
                tracing::debug!(error = %e, "janitor sweep failed");
            }
        });
    }
    let code = checked_run(&docker, &policy, &o, &ctx, refs.replace.as_deref(), &shown).await;
    stop_tasks(&stop, &tasks).await;
    code
}

/// Translates `o`, checks it against `policy`, then creates and runs the
/// container and removes it for `--rm`.
async fn checked_run(
    docker: &Docker,
    policy: &Policy,
    o: &RunOpts,
    ctx: &Context,
    replace: Option<&str>,
    shown: &str,
) -> Result<u8, ShimError> {
    let plan = translate::translate(o, ctx)?;
    for w in &plan.warnings {
        eprintln!("WARNING: {w}");
    }
    policy.check_run(o, &plan)?;
    policy.check_body(&plan.body)?;
    if policy.relaxed {
        tracing::warn!(
            image = %shown,
            "ARGUS_SHIM_POLICY=relaxed: this container is not checked against the default policy"
        );
    }
    // By the full ID resolved above, never by the name again.
    if let Some(id) = replace {
        docker::remove(docker, id).await;
    }
    // Held from the count to the create: released when dropped.
    let slot = job_slot(docker, policy, ctx, &plan.body).await?;
    let id = create(docker, o, plan.body.clone(), shown).await?;
    drop(slot);
    let code = run_created(docker, o, &plan.copies, &id).await;
    // Detached --rm is Docker's AutoRemove, unless the start failed.
    if o.rm && (!o.detach || !matches!(code, Ok(0))) {
        docker::remove(docker, &id).await;
    }
    code
}

async fn run_created(
    docker: &Docker,
    o: &RunOpts,
    copies: &[BindCopy],
    id: &str,
) -> Result<u8, ShimError> {
    if let Some(f) = &o.cidfile {
        std::fs::write(f, id).map_err(|source| ShimError::Io {
            path: f.clone(),
            source,
        })?;
    }
    for c in copies {
        copy_in(docker, id, c).await?;
    }
    if o.detach {
        if let Err(e) = docker
            .start_container(id, None::<StartContainerOptions>)
            .await
        {
            eprintln!("Error: {}", message(&e));
            return Ok(start_error_code(&message(&e)));
        }
        println!("{id}");
        return Ok(0);
    }
    let mut attach = AttachContainerOptionsBuilder::new();
    if let Some(k) = &o.detach_keys {
        attach = attach.detach_keys(k);
    }
    let attach = attach
        .stream(true)
        .stdout(true)
        .stderr(true)
        .stdin(o.interactive)
        .build();
    let AttachContainerResults { output, input } = docker
        .attach_container(id, Some(attach))
        .await
        .map_err(ShimError::docker(format!("attach to container {id}")))?;
    let _raw = if o.tty && o.interactive {
        RawTerminal::enable()
    } else {
        None
    };
    let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
    if o.sig_proxy {
        forward_signals(&tasks, &stop, docker, id, o.tty);
    }
    let pump = tasks.spawn(pump_output(output, stop.clone()));
    tasks.spawn(feed_input(input, o.interactive, stop.clone()));
    if let Err(e) = docker
        .start_container(id, None::<StartContainerOptions>)
        .await
    {
        let msg = message(&e);
        eprintln!("Error: {msg}");
        stop_tasks(&stop, &tasks).await;
        return Ok(start_error_code(&msg));
    }
    if o.tty {
        resize(docker, id).await;
    }
    let exit = wait_exit(docker, id).await;
    if exit.is_ok() {
        // The output stream ends by itself once dockerd has flushed it.
        let _ = tokio::time::timeout(DRAIN, pump).await;
    }
    stop_tasks(&stop, &tasks).await;
    let code = exit?;
    for c in copies.iter().filter(|c| !c.read_only) {
        copy_back(docker, id, c).await?;
    }
    Ok(u8::try_from(code).unwrap_or(EXIT_SHIM))
}

/// Waits until container `id` is no longer running; returns its exit code.
async fn wait_exit(docker: &Docker, id: &str) -> Result<i64, ShimError> {
    let wait = WaitContainerOptionsBuilder::new()
        .condition("not-running")
        .build();
    match docker.wait_container(id, Some(wait)).next().await {
        Some(Ok(r)) => Ok(r.status_code),
        Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
        Some(Err(e)) => Err(ShimError::docker(format!("wait for container {id}"))(e)),
        None => Err(ShimError::Docker {
            what: format!("wait for container {id}"),
            source: BollardError::DockerStreamError {
                error: "no wait result".into(),
            },
        }),
    }
}

/// Copies the container's output to ours until the stream ends or `stop`
/// is cancelled (between two writes, never within one).
async fn pump_output(
    mut output: impl futures_util::Stream<Item = Result<LogOutput, BollardError>> + Unpin,
    stop: CancellationToken,
) {
    loop {
        let item = tokio::select! {
            _ = stop.cancelled() => return,
            item = output.next() => item,
        };
        let result = match item {
            None => return,
            Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&message).and_then(|_| out.flush())
            }
            Some(Ok(LogOutput::StdErr { message })) => std::io::stderr().lock().write_all(&message),
            Some(Ok(LogOutput::StdIn { .. })) => Ok(()),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "attach stream ended");
                return;
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "cannot write container output");
        }
    }
}

/// Holds the write half of the attach connection until `stop` is
/// cancelled, copying our stdin into it first when `interactive`.
async fn feed_input(
    mut input: impl tokio::io::AsyncWrite + Unpin,
    interactive: bool,
    stop: CancellationToken,
) {
    if interactive {
        let mut stdin = tokio::io::stdin();
        tokio::select! {
            _ = stop.cancelled() => return,
            copied = tokio::io::copy(&mut stdin, &mut input) => {
                if let Err(e) = copied {
                    tracing::debug!(error = %e, "stdin copy ended");
                }
                // Half-close: the daemon closes the container's stdin (StdinOnce).
                let _ = input.shutdown().await;
            }
        }
    }
    // Keep the write half until the end, like the read half: after the
    // half-close, so that the connection is not torn down.
    stop.cancelled().await;
}

/// Forwards the catchable signals to container `id` (and, with a `tty`,
/// window changes as resizes) on `tasks` until `stop` is cancelled.
fn forward_signals(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    docker: &Docker,
    id: &str,
    tty: bool,
) {
    use tokio::signal::unix::{signal, SignalKind};
    for &(num, name) in FORWARDED {
        let Ok(stream) = signal(SignalKind::from_raw(num)) else {
            tracing::warn!(signal = name, "cannot install signal handler");
            continue;
        };
        let (docker, id) = (docker.clone(), id.to_string());
        on_each_signal(tasks, stop, stream, move || {
            let (docker, id) = (docker.clone(), id.clone());
            async move {
                let opts = KillContainerOptionsBuilder::new().signal(name).build();
                if let Err(e) = docker.kill_container(&id, Some(opts)).await {
                    tracing::warn!(signal = name, id, error = %message(&e), "failed to forward signal");
                }
            }
        });
    }
    if tty {
        if let Ok(stream) = signal(SignalKind::window_change()) {
            let (docker, id) = (docker.clone(), id.to_string());
            on_each_signal(tasks, stop, stream, move || {
                let (docker, id) = (docker.clone(), id.clone());
                async move { resize(&docker, &id).await }
            });
        }
    }
}

/// Runs `on()` on `tasks` for each signal `stream` delivers, until `stop`
/// is cancelled.
fn on_each_signal<F, Fut>(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    mut stream: tokio::signal::unix::Signal,
    mut on: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = stop.clone();
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = stream.recv() => if got.is_none() { return },
            }
            on().await;
        }
    });
}

/// Sets the container's TTY size to our terminal's.
async fn resize(docker: &Docker, id: &str) {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize into the pointed-to struct.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_row > 0 {
        let opts = ResizeContainerTTYOptionsBuilder::new()
            .h(ws.ws_row.into())
            .w(ws.ws_col.into())
            .build();
        if let Err(e) = docker.resize_container_tty(id, opts).await {
            tracing::debug!(error = %message(&e), "resize failed");
        }
    }
}

/// Puts our terminal in raw mode for `-it`, restoring it on drop.
struct RawTerminal(nix::sys::termios::Termios);

impl RawTerminal {
    fn enable() -> Option<RawTerminal> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).ok()?;
        Some(RawTerminal(saved))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin().as_fd(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.0,
        );
    }
}

/// Returns a tar of `source` whose entries are rooted at `target` (relative
/// to `/`), for `PUT /containers/{id}/archive?path=/`. The daemon creates
/// missing parents of `target`.
pub fn tar_for(source: &Path, target: &str) -> Result<Vec<u8>, ShimError> {
    let rel = target.trim_start_matches('/');
    let err = |e| ShimError::Io {
        path: source.display().to_string(),
        source: e,
    };
    let changed = || {
        err(std::io::Error::other(
            "the folder changed (a component is now a symlink) since it was checked",
        ))
    };
    // The source was resolved to a link-free path; if a component was
    // swapped for a link since, copy nothing rather than what it points to.
    let unchanged = || super::resolve::resolve(source).ok().as_deref() == Some(source);
    if !unchanged() {
        return Err(changed());
    }
    let mut b = tar::Builder::new(Limited {
        out: Vec::new(),
        left: COPY_LIMIT,
    });
    b.follow_symlinks(false);
    let meta = std::fs::symlink_metadata(source).map_err(err)?;
    if meta.is_dir() {
        b.append_dir_all(rel, source).map_err(err)?;
    } else {
        b.append_path_with_name(source, rel).map_err(err)?;
    }
    let bytes = b.into_inner().map_err(err)?.out;
    // A swap during the walk would have walked the link's target.
    if !unchanged() {
        return Err(changed());
    }
    Ok(bytes)
}

/// The most a bind copied into a container may hold (the worker-path
/// probe's folder holds one small file).
const COPY_LIMIT: usize = 256 << 20;

/// A `Vec` writer that fails past a limit.
struct Limited {
    out: Vec<u8>,
    left: usize,
}

impl Write for Limited {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.left {
            return Err(std::io::Error::other(format!(
                "more than {} MiB to copy into the container (bind a whole mounted folder instead)",
                COPY_LIMIT >> 20
            )));
        }
        self.left -= buf.len();
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Unpacks a tar from `GET /containers/{id}/archive?path=<target>` (its
/// entries start with the target's base name) into `dest`, the bind source;
/// returns how many entries were unpacked.
///
/// The archive comes from a container the job controls, so it is hostile:
/// entries are re-rooted at `dest` and unpacked with tar's `unpack_in`,
/// which refuses `..` and any entry whose parent resolves outside `dest`
/// (a symlink planted by an earlier entry or already there), replaces an
/// existing file instead of writing through it, and drops setuid/setgid
/// bits and ownership. Only files, folders and symlinks are unpacked
/// (no hard links, devices or FIFOs); a refused entry is skipped with a
/// warning.
pub fn untar_into(bytes: &[u8], dest: &Path) -> Result<usize, ShimError> {
    let err = |e| ShimError::Io {
        path: dest.display().to_string(),
        source: e,
    };
    // Re-root: "<target base name>/rest" -> "rest".
    let mut rerooted = tar::Builder::new(Vec::new());
    for entry in tar::Archive::new(bytes).entries().map_err(err)? {
        let mut entry = entry.map_err(err)?;
        let path = entry.path().map_err(err)?.into_owned();
        let rest: PathBuf = path.components().skip(1).collect();
        if rest.as_os_str().is_empty() {
            continue;
        }
        if rest
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            tracing::warn!(entry = %path.display(), "copy back: skipped an entry with `..`");
            continue;
        }
        let mut header = entry.header().clone();
        let kind = header.entry_type();
        if kind.is_symlink() {
            let Some(target) = entry.link_name().map_err(err)?.map(|t| t.into_owned()) else {
                continue;
            };
            rerooted
                .append_link(&mut header, &rest, &target)
                .map_err(err)?;
        } else if kind.is_file() || kind.is_dir() {
            rerooted
                .append_data(&mut header, &rest, &mut entry)
                .map_err(err)?;
        } else {
            tracing::warn!(entry = %path.display(), kind = ?kind, "copy back: skipped an entry that is not a file, folder or symlink");
        }
    }
    let bytes = rerooted.into_inner().map_err(err)?;
    let mut archive = tar::Archive::new(&bytes[..]);
    archive.set_overwrite(true);
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    let mut n = 0;
    for entry in archive.entries().map_err(err)? {
        let mut entry = entry.map_err(err)?;
        let shown = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match entry.unpack_in(dest) {
            Ok(true) if !entry.header().entry_type().is_dir() => n += 1,
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(entry = shown, dest = %dest.display(), "copy back: skipped an entry outside the folder");
            }
            Err(e) => {
                tracing::warn!(entry = shown, dest = %dest.display(), error = %e, "copy back: skipped an entry that would leave the folder");
            }
        }
    }
    Ok(n)
}

async fn copy_in(docker: &Docker, id: &str, c: &BindCopy) -> Result<(), ShimError> {
    let bytes = tar_for(Path::new(&c.source), &c.target)?;
    let opts = UploadToContainerOptionsBuilder::new().path("/").build();
    docker
        .upload_to_container(id, Some(opts), bollard::body_full(bytes.into()))
        .await
        .map_err(ShimError::docker(format!(
            "copy {} into container {id} at {}",
            c.source, c.target
        )))
}

async fn copy_back(docker: &Docker, id: &str, c: &BindCopy) -> Result<(), ShimError> {
    let opts = DownloadFromContainerOptionsBuilder::new()
        .path(&c.target)
        .build();
    let mut stream = docker.download_from_container(id, Some(opts));
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(ShimError::docker(format!(
            "copy {} back from container {id}",
            c.target
        )))?;
        bytes.extend_from_slice(&chunk);
    }
    untar_into(&bytes, Path::new(&c.source))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_names_of_the_nodes_project_are_its_own() {
        for n in [
            "argus-head-1",
            "/argus-head-2",
            "argus_worker-1_1",
            "argus-x",
        ] {
            assert!(compose_would_adopt(n, "argus"), "{n}");
        }
        for n in [
            "argus",
            "argusx-1",
            "job-argus-1",
            "Argus-head-1",
            "other-head-1",
        ] {
            assert!(!compose_would_adopt(n, "argus"), "{n}");
        }
    }

    #[test]
    fn start_errors_map_like_the_docker_cli() {
        assert_eq!(
            start_error_code(
                "OCI runtime create failed: exec: \"nope\": executable file not found in $PATH"
            ),
            127
        );
        assert_eq!(
            start_error_code("exec: \"/x\": stat /x: no such file or directory"),
            127
        );
        assert_eq!(start_error_code("exec: \"/etc\": permission denied"), 126);
        assert_eq!(
            start_error_code("cannot join network of a non running container"),
            125
        );
    }

    #[test]
    fn image_refs_split_into_name_and_tag() {
        assert_eq!(split_ref("ubuntu"), ("ubuntu".into(), "latest".into()));
        assert_eq!(
            split_ref("r.io:5000/a/b:2.53"),
            ("r.io:5000/a/b".into(), "2.53".into())
        );
        assert_eq!(
            split_ref("r.io:5000/a/b"),
            ("r.io:5000/a/b".into(), "latest".into())
        );
        assert_eq!(
            split_ref("a@sha256:00"),
            ("a@sha256:00".into(), String::new())
        );
    }

    #[test]
    fn tar_round_trip_copies_back_into_the_source() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("in.txt"), "in").unwrap();
        let bytes = tar_for(src.path(), "/shared").unwrap();
        let mut names: Vec<String> = tar::Archive::new(&bytes[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, vec!["shared/", "shared/in.txt"]);
        // What the daemon sends back for path=/shared, plus an escape attempt.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        b.append_data(&mut h, "shared/worker_path.txt", &b"abc"[..])
            .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        b.append_data(&mut h, "shared/../../evil", &b"x"[..])
            .unwrap_or(());
        let back = b.into_inner().unwrap();
        assert_eq!(untar_into(&back, src.path()).unwrap(), 1);
        assert_eq!(
            std::fs::read_to_string(src.path().join("worker_path.txt")).unwrap(),
            "abc"
        );
    }

    #[test]
    fn copy_back_cannot_write_through_symlinks_or_leave_the_folder() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dest = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), "safe").unwrap();
        // A link already in the folder (planted by the job's container
        // through the probe folder), and links and `..` in the archive.
        symlink(outside.path().join("victim"), dest.path().join("f")).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let file = |b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32| {
            let mut h = tar::Header::new_gnu();
            h.set_size(4);
            h.set_mode(mode);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, &b"evil"[..]).unwrap();
        };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "shared/out", outside.path()).unwrap();
        file(&mut b, "shared/out/planted", 0o644);
        file(&mut b, "shared/f", 0o644);
        file(&mut b, "shared/suid", 0o4755);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        b.append_link(&mut h, "shared/hard", outside.path().join("victim"))
            .unwrap();
        // `..` cannot be written through the builder's path setters.
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        let name = b"shared/../../evil";
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, &b"evil"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        untar_into(&bytes, dest.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "safe"
        );
        assert!(!outside.path().join("planted").exists());
        assert!(!dest.path().join("hard").exists());
        // The link was replaced by the file, not written through.
        let f = dest.path().join("f");
        assert!(!std::fs::symlink_metadata(&f)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "evil");
        let mode = std::fs::metadata(dest.path().join("suid"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o6000, 0, "setuid bit kept: {mode:o}");
        assert!(!dest.path().parent().unwrap().join("evil").exists());
    }
}
