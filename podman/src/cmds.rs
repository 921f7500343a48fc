//! The subcommands other than `run`, with podman's output shapes: JSON
//! arrays for inspect, `--format json`, simple `{{.Field}}` templates,
//! `Error: …` lines, exit 1 for "no such container/image" where podman
//! does. Containers are scoped to the shim's owner: a Ray job sees and
//! touches only the containers its node created (unless the policy is
//! relaxed).

use std::collections::HashMap;
use std::io::Write;

use bollard::container::LogOutput;
use bollard::query_parameters::{
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, ListImagesOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::docker::{self, is_not_found, message};
use super::runner;
use crate::call::Call;
use crate::error::{ShimError, EXIT_SHIM};
use argus_podman_core::args::{Command, ShowOpts, Source};
use argus_podman_core::labels::{LABEL_OWNER, LABEL_PREFIX};
use argus_podman_core::policy::{Policy, PolicyError, ResolvedImage};

/// The podman version the shim answers as.
pub const PODMAN_VERSION: &str = "4.9.3";

/// Renders a Go-template-like `format` against `v`: `{{.A.B}}` (field
/// names case-insensitive), `{{json .}}`, `{{json .A}}`; `table ` is dropped.
pub fn render(format: &str, v: &Value) -> String {
    let format = format.strip_prefix("table ").unwrap_or(format);
    let format = format.replace("\\t", "\t").replace("\\n", "\n");
    let mut out = String::new();
    let mut rest = format.as_str();
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find("}}") else {
            out.push_str(&rest[open..]);
            return out;
        };
        let expr = rest[open + 2..open + close].trim();
        let (json, path) = match expr.strip_prefix("json ") {
            Some(p) => (true, p.trim()),
            None => (false, expr),
        };
        let found = lookup(v, path);
        match (json, found) {
            (true, Some(x)) => out.push_str(&x.to_string()),
            (false, Some(Value::String(s))) => out.push_str(s),
            (false, Some(Value::Null)) | (_, None) => out.push_str("<no value>"),
            (false, Some(x)) => out.push_str(&x.to_string()),
        }
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    out
}

fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.strip_prefix('.')?;
    let mut cur = v;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let obj = cur.as_object()?;
        cur = obj.get(part).or_else(|| {
            obj.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(part))
                .map(|(_, v)| v)
        })?;
    }
    Some(cur)
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn strip_sha(s: &str) -> String {
    s.strip_prefix("sha256:").unwrap_or(s).to_string()
}

fn short(s: &str) -> String {
    strip_sha(s).chars().take(12).collect()
}

fn ago(unix: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(unix);
    let s = (now - unix).max(0);
    match s {
        0..=59 => format!("{s} seconds ago"),
        60..=3599 => format!("{} minutes ago", s / 60),
        3600..=86399 => format!("{} hours ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

fn human_size(n: i64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.3} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.3} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.3} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// Prints `items` as JSON, with a template, or through `table`.
fn show(format: Option<&str>, items: &[Value], table: impl FnOnce(&[Value])) {
    match format {
        Some("json") => print_json(&Value::Array(items.to_vec())),
        Some(f) => items.iter().for_each(|i| println!("{}", render(f, i))),
        None => table(items),
    }
}

/// What a command may see and touch: this node's containers (by owner)
/// and the images its policy allows.
struct Scope {
    owner: String,
    relaxed: bool,
    policy: Policy,
}

async fn scope(docker: &Docker, call: &Call) -> Result<Scope, ShimError> {
    let me = docker::whoami(docker).await?;
    let policy = call.policy()?;
    Ok(Scope {
        owner: super::owner::node_owner_in(me.as_ref(), call)?,
        relaxed: policy.relaxed,
        policy,
    })
}

/// Applies `op` to each container of `names` this shim owns, printing the
/// name of each one done, and returns podman's exit code: 0, 1 when a name
/// is not found (unless `ignore`), 125 when `op` failed (the highest wins).
/// A name the shim does not own refuses the whole command.
async fn for_each_owned<F, Fut>(
    docker: &Docker,
    call: &Call,
    names: &[String],
    ignore: bool,
    verb: &str,
    op: F,
) -> Result<u8, ShimError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), bollard::errors::Error>>,
{
    let s = scope(docker, call).await?;
    let mut found = Vec::new();
    let mut code = 0;
    for n in names {
        match owned(docker, &s, n).await? {
            Some(r) => found.push((n, r.id)),
            None if ignore => {}
            None => {
                eprintln!("Error: {}", ShimError::NoSuchContainer(n.clone()));
                code = 1;
            }
        }
    }
    for (n, id) in found {
        match op(id).await {
            Ok(()) => println!("{n}"),
            Err(e) if ignore && is_not_found(&e) => {}
            Err(e) => {
                eprintln!("Error: cannot {verb} container {n}: {}", message(&e));
                code = code.max(EXIT_SHIM);
            }
        }
    }
    Ok(code)
}

/// Resolves `name` once to a container of this node (R-SEC-3): its full
/// ID, the only thing later calls get, and its inspect. A container of
/// another owner is answered exactly like one that does not exist.
async fn owned(
    docker: &Docker,
    s: &Scope,
    name: &str,
) -> Result<Option<docker::Resolved>, ShimError> {
    Ok(docker::resolve_container(docker, name)
        .await?
        .filter(|r| s.relaxed || r.owner.as_deref() == Some(s.owner.as_str())))
}

/// Resolves image `name` once and returns its inspect when this node may
/// see it (issue 26, hole 12): an image it may run (by full ID, see
/// [`Policy::image_allowed`]) or the image of one of its containers.
/// Anything else is answered as an unknown image.
async fn visible_image(
    docker: &Docker,
    s: &Scope,
    name: &str,
) -> Result<Option<bollard::models::ImageInspect>, ShimError> {
    let i = match docker.inspect_image(name).await {
        Ok(i) => i,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(ShimError::docker(format!("inspect image {name}"))(e)),
    };
    let id = i.id.clone().unwrap_or_default();
    Ok(visible_image_ids(docker, s, Some(&i))
        .await?
        .contains(&id)
        .then_some(i))
}

/// Returns the full IDs of the images this node may see: those the
/// allow-list names (resolved on the daemon, or whose names match it;
/// `extra`, an image just inspected, is judged too), and those of this
/// node's containers.
async fn visible_image_ids(
    docker: &Docker,
    s: &Scope,
    extra: Option<&bollard::models::ImageInspect>,
) -> Result<std::collections::HashSet<String>, ShimError> {
    let mut policy = s.policy.clone();
    let mut ids = std::collections::HashSet::new();
    if let Some(i) = extra {
        let id = i.id.clone().unwrap_or_default();
        if policy.allowed_images.is_none() || s.relaxed {
            ids.insert(id.clone());
        } else {
            policy.listed_image_ids = runner::listed_image_ids(docker, &policy).await?;
            let mut names = i.repo_tags.clone().unwrap_or_default();
            names.extend(i.repo_digests.clone().unwrap_or_default());
            policy.images.push(ResolvedImage {
                id: id.clone(),
                names,
            });
            if policy.image_allowed(&id) {
                ids.insert(id);
            }
        }
    }
    if let Some(list) = &policy.allowed_images {
        ids.extend(runner::listed_image_ids(docker, &policy).await?);
        let all = docker
            .list_images(Some(ListImagesOptionsBuilder::new().build()))
            .await
            .map_err(ShimError::docker("list images"))?;
        for i in all {
            let mut names = i.repo_tags.clone();
            names.extend(i.repo_digests.clone());
            if names.iter().any(|n| {
                list.iter()
                    .any(|pat| argus_podman_core::policy::image_matches(pat, n))
            }) {
                ids.insert(i.id);
            }
        }
    }
    for c in own_containers(docker, s, true).await? {
        ids.extend(c.image_id);
    }
    Ok(ids)
}

/// Lists this node's containers (`all`: stopped ones too): those whose
/// owner label is this node's, set by the shim (an image that carries the
/// shim's labels makes its containers' labels worthless, see
/// [`docker::resolve_container`]).
async fn own_containers(
    docker: &Docker,
    s: &Scope,
    all: bool,
) -> Result<Vec<bollard::models::ContainerSummary>, ShimError> {
    let filters: HashMap<String, Vec<String>> = HashMap::from([(
        "label".to_string(),
        vec![format!("{LABEL_OWNER}={}", s.owner)],
    )]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(all)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(ShimError::docker("list containers"))?;
    let mut out = Vec::new();
    let mut inherited: HashMap<String, bool> = HashMap::new();
    for c in list {
        let image = c.image_id.clone().unwrap_or_default();
        if !inherited.contains_key(&image) {
            let shim_labels = match docker.inspect_image(&image).await {
                Ok(i) => i
                    .config
                    .and_then(|c| c.labels)
                    .is_some_and(|l| l.keys().any(|k| k.starts_with(LABEL_PREFIX))),
                Err(_) => true,
            };
            inherited.insert(image.clone(), shim_labels);
        }
        if !inherited[&image] {
            out.push(c);
        }
    }
    Ok(out)
}

/// Runs a subcommand other than `run`; returns the exit code.
pub async fn run(cmd: Command, call: &Call) -> Result<u8, ShimError> {
    match cmd {
        Command::ShortVersion => {
            println!("podman version {PODMAN_VERSION}");
            return Ok(0);
        }
        Command::Help => {
            println!("podman (argus-agent shim over the Docker Engine API)\n\nCommands: run, pull, images, image inspect|exists|ls|pull, inspect, container exists|inspect|ps|rm|kill|stop|logs, ps, rm, kill, stop, logs, version, info");
            return Ok(0);
        }
        _ => {}
    }
    let docker = docker::connect_to(&call.docker).await?;
    match cmd {
        Command::Run(_) | Command::ShortVersion | Command::Help => unreachable!("handled above"),
        Command::Version { format } => version(&docker, format).await,
        Command::Info { format } => info(&docker, call, format).await,
        Command::Pull {
            quiet,
            image,
            source,
        } => pull(&docker, call, quiet, image, source).await,
        Command::ImageExists(name) => {
            let s = scope(&docker, call).await?;
            Ok(if visible_image(&docker, &s, &name).await?.is_some() {
                0
            } else {
                1
            })
        }
        Command::ContainerExists(name) => {
            let s = scope(&docker, call).await?;
            match owned(&docker, &s, &name).await? {
                Some(_) => Ok(0),
                None => Ok(1),
            }
        }
        Command::ImageInspect { format, names } => {
            image_inspect(&docker, call, format, names).await
        }
        Command::Inspect {
            format,
            kind,
            names,
        } => inspect(&docker, call, format, kind, names).await,
        Command::Images(o) => images(&docker, call, o).await,
        Command::Ps(o) => ps(&docker, call, o).await,
        Command::Rm {
            force,
            ignore,
            volumes,
            names,
        } => rm(&docker, call, force, ignore, volumes, names).await,
        Command::Kill {
            signal,
            ignore,
            names,
        } => kill(&docker, call, signal, ignore, names).await,
        Command::Stop {
            timeout,
            ignore,
            names,
        } => stop(&docker, call, timeout, ignore, names).await,
        Command::Logs {
            follow,
            tail,
            timestamps,
            name,
        } => logs(&docker, call, follow, tail, timestamps, name).await,
    }
}

/// `podman version`: podman's client fields, the daemon's as the server.
async fn version(docker: &Docker, format: Option<String>) -> Result<u8, ShimError> {
    let v = docker
        .version()
        .await
        .map_err(ShimError::docker("read daemon version"))?;
    let value = json!({
        "Client": {
            "APIVersion": PODMAN_VERSION, "Version": PODMAN_VERSION, "GoVersion": v.go_version,
            "GitCommit": "", "BuiltTime": "", "Built": 0,
            "OsArch": format!("{}/{}", v.os.clone().unwrap_or_default(), v.arch.clone().unwrap_or_default()),
            "Os": v.os,
        },
        "Server": {
            "Engine": "Docker Engine (through argus-agent's podman shim)",
            "Version": v.version, "APIVersion": v.api_version,
        },
    });
    match format.as_deref() {
        Some("json") => print_json(&value),
        Some(f) => println!("{}", render(f, &value)),
        None => {
            let c = &value["Client"];
            println!("Client:       Podman Engine");
            println!("Version:      {PODMAN_VERSION}");
            println!("API Version:  {PODMAN_VERSION}");
            println!("Go Version:   {}", c["GoVersion"].as_str().unwrap_or(""));
            println!("OS/Arch:      {}", c["OsArch"].as_str().unwrap_or(""));
            println!();
            println!("Server:       Docker Engine");
            println!(
                "Version:      {}",
                value["Server"]["Version"].as_str().unwrap_or("")
            );
            println!(
                "API Version:  {}",
                value["Server"]["APIVersion"].as_str().unwrap_or("")
            );
        }
    }
    Ok(0)
}

/// `podman info`: the daemon's facts in podman's shape, its stores
/// counted as this node sees them (its own containers, the images it may
/// see), never the host's (issue 26, hole 12); the host name is this
/// node's, not the daemon's.
async fn info(docker: &Docker, call: &Call, format: Option<String>) -> Result<u8, ShimError> {
    let i = docker
        .info()
        .await
        .map_err(ShimError::docker("read daemon info"))?;
    let s = scope(docker, call).await?;
    let mine = own_containers(docker, &s, true).await?;
    let count = |state: &str| {
        mine.iter()
            .filter(|c| c.state.map(|x| x.to_string()).as_deref() == Some(state))
            .count()
    };
    let images = visible_image_ids(docker, &s, None).await?.len();
    let hostname = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let value = json!({
        "host": {
            "arch": i.architecture, "os": i.os_type, "kernel": i.kernel_version,
            "hostname": hostname, "cgroupManager": i.cgroup_driver,
            "cgroupVersion": i.cgroup_version.map(|v| format!("v{v}")),
            "ociRuntime": {"name": i.default_runtime},
            "security": {"rootless": false},
            "cpus": i.ncpu, "memTotal": i.mem_total,
        },
        "store": {
            "graphDriverName": i.driver,
            "imageStore": {"number": images},
            "containerStore": {
                "number": mine.len(), "running": count("running"),
                "paused": count("paused"), "stopped": count("exited") + count("created"),
            },
        },
        "registries": {},
        "version": {"Version": PODMAN_VERSION, "APIVersion": PODMAN_VERSION},
    });
    match format.as_deref() {
        Some(f) if f != "json" => println!("{}", render(f, &value)),
        _ => print_json(&value),
    }
    Ok(0)
}

/// `podman pull`: pulls an image of the allow-list and prints its id; of
/// `docker-daemon:IMAGE`, only finds IMAGE in the daemon.
async fn pull(
    docker: &Docker,
    call: &Call,
    quiet: bool,
    image: String,
    source: Source,
) -> Result<u8, ShimError> {
    // The allow-list holds for pulls too: a pulled image is one
    // `--pull=never` away from running, and pulls cost the host disk. The
    // name gates the pull; what was pulled (or found) is checked by full
    // ID, as `run` checks it.
    let mut policy = call.policy()?;
    let i = if source == Source::Daemon {
        match docker.inspect_image(&image).await {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Err(ShimError::NotInDaemon { image }),
            Err(e) => return Err(ShimError::docker(format!("inspect image {image}"))(e)),
        }
    } else {
        if !policy.image_name_allowed(&image) {
            return Err(PolicyError::Image { image }.into());
        }
        runner::pull(docker, &image, quiet).await?;
        docker
            .inspect_image(&image)
            .await
            .map_err(ShimError::docker(format!("inspect image {image}")))?
    };
    let id = i.id.clone().unwrap_or_default();
    if !runner::image_admitted(docker, &mut policy, i).await? {
        return Err(PolicyError::Image { image }.into());
    }
    println!("{}", strip_sha(&id));
    Ok(0)
}

/// `podman image inspect`: images in podman's shape; 125 at the first unknown.
async fn image_inspect(
    docker: &Docker,
    call: &Call,
    format: Option<String>,
    names: Vec<String>,
) -> Result<u8, ShimError> {
    let s = scope(docker, call).await?;
    let mut items = Vec::new();
    for n in &names {
        match visible_image(docker, &s, n).await? {
            Some(i) => items.push(image_value(serde_json::to_value(i).unwrap_or_default())),
            None => {
                print_items(format.as_deref(), &items);
                eprintln!("Error: {n}: image not known");
                return Ok(125);
            }
        }
    }
    print_items(format.as_deref(), &items);
    Ok(0)
}

/// `podman inspect`: this node's containers, else images; 125 at the first unknown.
async fn inspect(
    docker: &Docker,
    call: &Call,
    format: Option<String>,
    kind: Option<String>,
    names: Vec<String>,
) -> Result<u8, ShimError> {
    let s = scope(docker, call).await?;
    let mut items = Vec::new();
    for n in &names {
        if kind.as_deref() != Some("image") {
            if let Some(r) = owned(docker, &s, n).await? {
                items.push(serde_json::to_value(r.inspect).unwrap_or_default());
                continue;
            }
        }
        if kind.as_deref() != Some("container") {
            if let Some(i) = visible_image(docker, &s, n).await? {
                items.push(image_value(serde_json::to_value(i).unwrap_or_default()));
                continue;
            }
        }
        print_items(format.as_deref(), &items);
        eprintln!("Error: no such object: {n:?}");
        return Ok(125);
    }
    print_items(format.as_deref(), &items);
    Ok(0)
}

/// `podman rm`: removes this node's containers.
async fn rm(
    docker: &Docker,
    call: &Call,
    force: bool,
    ignore: bool,
    volumes: bool,
    names: Vec<String>,
) -> Result<u8, ShimError> {
    let opts = RemoveContainerOptionsBuilder::new()
        .force(force)
        .v(volumes)
        .build();
    for_each_owned(docker, call, &names, ignore, "remove", |id| {
        let (docker, opts) = (docker.clone(), opts.clone());
        async move {
            match docker.remove_container(&id, Some(opts)).await {
                Err(e) if docker::is_removal_in_progress(&e) => Ok(()),
                other => other,
            }
        }
    })
    .await
}

/// `podman kill`: signals this node's containers.
async fn kill(
    docker: &Docker,
    call: &Call,
    signal: String,
    ignore: bool,
    names: Vec<String>,
) -> Result<u8, ShimError> {
    let signal = if signal.chars().all(|c| c.is_ascii_digit()) || signal.starts_with("SIG") {
        signal
    } else {
        format!("SIG{}", signal.to_ascii_uppercase())
    };
    for_each_owned(docker, call, &names, ignore, "kill", |id| {
        let (docker, signal) = (docker.clone(), signal.clone());
        async move {
            let opts = KillContainerOptionsBuilder::new().signal(&signal).build();
            docker.kill_container(&id, Some(opts)).await
        }
    })
    .await
}

/// `podman stop`: stops this node's containers (already stopped is fine).
async fn stop(
    docker: &Docker,
    call: &Call,
    timeout: Option<i32>,
    ignore: bool,
    names: Vec<String>,
) -> Result<u8, ShimError> {
    // Docker answers a stop once the container has ended, up to `t`
    // seconds later: the client's 120 s would cut a longer one short.
    let docker = match timeout {
        Some(t) if t > 90 => docker
            .clone()
            .with_timeout(std::time::Duration::from_secs(t as u64 + 30)),
        _ => docker.clone(),
    };
    let docker = &docker;
    for_each_owned(docker, call, &names, ignore, "stop", |id| {
        let docker = docker.clone();
        async move {
            let mut b = StopContainerOptionsBuilder::new();
            if let Some(t) = timeout {
                b = b.t(t);
            }
            match docker.stop_container(&id, Some(b.build())).await {
                // 304: already stopped.
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 304, ..
                }) => Ok(()),
                other => other,
            }
        }
    })
    .await
}

/// `podman logs`: copies a container's output to ours.
async fn logs(
    docker: &Docker,
    call: &Call,
    follow: bool,
    tail: Option<String>,
    timestamps: bool,
    name: String,
) -> Result<u8, ShimError> {
    // Held while following: each follow holds one of the host's root
    // inotify instances in dockerd (R-SEC-5). Taken first, so a refused
    // follow costs the daemon nothing.
    let _following = if follow {
        crate::nodelock::follow(call.caller.job, call.policy()?.max_log_follows)?
    } else {
        None
    };
    let s = scope(docker, call).await?;
    let Some(id) = owned(docker, &s, &name).await?.map(|r| r.id) else {
        eprintln!("Error: {}", ShimError::NoSuchContainer(name));
        return Ok(125);
    };
    let opts = LogsOptionsBuilder::new()
        .follow(follow)
        .stdout(true)
        .stderr(true)
        .timestamps(timestamps)
        .tail(tail.as_deref().unwrap_or("all"))
        .build();
    let mut stream = docker.logs(&id, Some(opts));
    while let Some(item) = stream.next().await {
        match item.map_err(ShimError::docker(format!("read logs of {id}")))? {
            LogOutput::StdErr { message } => std::io::stderr().write_all(&message),
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                let mut o = std::io::stdout().lock();
                o.write_all(&message).and_then(|_| o.flush())
            }
            LogOutput::StdIn { .. } => Ok(()),
        }
        .map_err(|source| ShimError::Io {
            path: "stdout".into(),
            source,
        })?;
    }
    Ok(0)
}

fn print_items(format: Option<&str>, items: &[Value]) {
    match format {
        Some(f) if f != "json" => items.iter().for_each(|i| println!("{}", render(f, i))),
        _ => print_json(&Value::Array(items.to_vec())),
    }
}

/// Shapes a Docker image inspect like podman's: bare hex id, `Digest`.
fn image_value(mut v: Value) -> Value {
    if let Some(id) = v.get("Id").and_then(Value::as_str).map(strip_sha) {
        v["Id"] = Value::String(id);
    }
    let digest = v
        .get("RepoDigests")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .and_then(|d| d.split_once('@'))
        .map(|(_, d)| d.to_string());
    v["Digest"] = digest.map(Value::String).unwrap_or(Value::Null);
    v
}

/// `podman images`: the images this node may see (see
/// [`visible_image_ids`]), not the host's.
async fn images(docker: &Docker, call: &Call, o: ShowOpts) -> Result<u8, ShimError> {
    let s = scope(docker, call).await?;
    let visible = visible_image_ids(docker, &s, None).await?;
    let opts = ListImagesOptionsBuilder::new().all(o.all).build();
    let list = docker
        .list_images(Some(opts))
        .await
        .map_err(ShimError::docker("list images"))?;
    let items: Vec<Value> = list
        .iter()
        .filter(|i| visible.contains(&i.id))
        .map(|i| {
            json!({
                "Id": strip_sha(&i.id), "ParentId": strip_sha(&i.parent_id),
                "RepoTags": i.repo_tags, "RepoDigests": i.repo_digests, "Size": i.size,
                "SharedSize": i.shared_size, "VirtualSize": i.size, "Labels": i.labels,
                "Containers": i.containers, "Names": i.repo_tags, "Created": i.created,
                "CreatedAt": ago(i.created),
            })
        })
        .collect();
    if o.quiet {
        items
            .iter()
            .for_each(|i| println!("{}", short(i["Id"].as_str().unwrap_or(""))));
        return Ok(0);
    }
    show(o.format.as_deref(), &items, |items| {
        println!(
            "{:<40} {:<12} {:<14} {:<16} SIZE",
            "REPOSITORY", "TAG", "IMAGE ID", "CREATED"
        );
        for i in items {
            let tags: Vec<String> =
                serde_json::from_value(i["RepoTags"].clone()).unwrap_or_default();
            let tags = if tags.is_empty() {
                vec!["<none>:<none>".to_string()]
            } else {
                tags
            };
            for t in tags {
                let (repo, tag) = t.rsplit_once(':').unwrap_or((&t, "<none>"));
                println!(
                    "{:<40} {:<12} {:<14} {:<16} {}",
                    repo,
                    tag,
                    short(i["Id"].as_str().unwrap_or("")),
                    i["CreatedAt"].as_str().unwrap_or(""),
                    human_size(i["Size"].as_i64().unwrap_or(0))
                );
            }
        }
    });
    Ok(0)
}

async fn ps(docker: &Docker, call: &Call, o: ShowOpts) -> Result<u8, ShimError> {
    let s = scope(docker, call).await?;
    let mut filters: HashMap<String, Vec<String>> = HashMap::new();
    if !s.relaxed {
        filters.insert("label".into(), vec![format!("{LABEL_OWNER}={}", s.owner)]);
    }
    for f in &o.filters {
        if let Some((k, v)) = f.split_once('=') {
            filters
                .entry(k.to_string())
                .or_default()
                .push(v.to_string());
        }
    }
    let opts = ListContainersOptionsBuilder::new()
        .all(o.all)
        .filters(&filters)
        .build();
    let mut list = docker
        .list_containers(Some(opts))
        .await
        .map_err(ShimError::docker("list containers"))?;
    if !s.relaxed {
        // Labels inherited from an image prove nothing.
        let own: std::collections::HashSet<String> = own_containers(docker, &s, true)
            .await?
            .into_iter()
            .filter_map(|c| c.id)
            .collect();
        list.retain(|c| c.id.as_ref().is_some_and(|id| own.contains(id)));
    }
    let items: Vec<Value> = list
        .iter()
        .map(|c| {
            let state = c.state.map(|s| s.to_string()).unwrap_or_default();
            let status = c.status.clone().unwrap_or_default();
            let exit_code = status
                .strip_prefix("Exited (")
                .and_then(|r| r.split(')').next())
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(0);
            json!({
                "Id": c.id, "Image": c.image, "ImageID": c.image_id.as_deref().map(strip_sha),
                "Command": c.command.as_deref().map(|c| c.split(' ').map(str::to_string).collect::<Vec<_>>()),
                "Created": c.created, "CreatedAt": c.created.map(ago),
                "State": state, "Status": status, "Exited": state == "exited", "ExitCode": exit_code,
                "Names": c.names.as_ref().map(|n| n.iter().map(|x| x.trim_start_matches('/').to_string()).collect::<Vec<_>>()),
                "Labels": c.labels, "Mounts": c.mounts.as_ref().map(|m| m.iter().filter_map(|x| x.destination.clone()).collect::<Vec<_>>()),
                "Ports": c.ports, "AutoRemove": false,
            })
        })
        .collect();
    if o.quiet {
        items
            .iter()
            .for_each(|i| println!("{}", short(i["Id"].as_str().unwrap_or(""))));
        return Ok(0);
    }
    show(o.format.as_deref(), &items, |items| {
        println!(
            "{:<14} {:<30} {:<20} {:<16} {:<20} {:<10} NAMES",
            "CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS"
        );
        for i in items {
            let cmd: Vec<String> = serde_json::from_value(i["Command"].clone()).unwrap_or_default();
            let names: Vec<String> = serde_json::from_value(i["Names"].clone()).unwrap_or_default();
            println!(
                "{:<14} {:<30} {:<20} {:<16} {:<20} {:<10} {}",
                short(i["Id"].as_str().unwrap_or("")),
                i["Image"].as_str().unwrap_or(""),
                cmd.join(" ").chars().take(20).collect::<String>(),
                i["CreatedAt"].as_str().unwrap_or(""),
                i["Status"].as_str().unwrap_or(""),
                "",
                names.join(",")
            );
        }
    });
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_fields_nested_and_json() {
        let v = json!({"Id": "abc", "Config": {"Env": ["A=1"], "User": ""}, "Size": 12, "N": null});
        assert_eq!(render("{{.Id}}", &v), "abc");
        assert_eq!(render("{{ .id }} {{.Config.User}}|", &v), "abc |");
        assert_eq!(render("{{json .Config.Env}}", &v), "[\"A=1\"]");
        assert_eq!(
            render("{{.Size}}\\t{{.Missing}} {{.N}}", &v),
            "12\t<no value> <no value>"
        );
        assert_eq!(render("{{json .}}", &json!({"a": 1})), "{\"a\":1}");
        assert_eq!(render("x {{ unterminated", &v), "x {{ unterminated");
    }

    #[test]
    fn image_inspect_is_shaped_like_podman() {
        let v = image_value(json!({"Id": "sha256:0123", "RepoDigests": ["r/x@sha256:feed"]}));
        assert_eq!(v["Id"], "0123");
        assert_eq!(v["Digest"], "sha256:feed");
    }
}
