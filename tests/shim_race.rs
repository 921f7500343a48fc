//! The bind check-then-mount race, against the real daemon (Docker 20.10
//! here: no `Subpath` volume option). A job that can write a folder the Ray
//! container has mounted read-write (Ray's temp dir) keeps exchanging a
//! subfolder with a symlink to `/` (`renameat2(RENAME_EXCHANGE)`); a bind
//! of that subfolder by path then mounts the host's root whenever the daemon
//! resolves it mid-swap. The control shows the race is real on this daemon;
//! through the shim, 0 of the binds mount the host root: a subfolder of a
//! writable mount is never passed to the daemon as a path (refused when
//! detached, copied in and back for an attached `--rm`).

mod shim_support;

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use shim_support::*;

/// How many binds each side tries.
const TRIES: usize = 40;

/// Exchanges `a` and `b` in a loop until dropped; counts the exchanges.
struct Exchanger {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exchanger {
    fn start(a: &Path, b: &Path) -> Exchanger {
        let (a, b) = (cstr(a), cstr(b));
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let (s, c) = (stop.clone(), count.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                // SAFETY: both are valid NUL-terminated paths.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
                c.fetch_add(1, Ordering::Relaxed);
            }
        });
        Exchanger {
            stop,
            count,
            thread: Some(thread),
        }
    }
}

impl Drop for Exchanger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// Returns true if and only if a `tool ls` output is the host's root.
fn is_host_root(listing: &str) -> bool {
    let names: Vec<&str> = listing.lines().collect();
    ["proc", "sys", "etc", "var"]
        .iter()
        .all(|n| names.contains(n))
}

/// A folder `w` (Ray's temp dir in the tests) with `x/` (a marker inside)
/// and `y -> /`, being exchanged.
fn racing_folder() -> (tempfile::TempDir, PathBuf, Exchanger) {
    let w = tempfile::tempdir().unwrap();
    std::fs::create_dir(w.path().join("x")).unwrap();
    std::fs::write(w.path().join("x/marker"), "x").unwrap();
    std::os::unix::fs::symlink("/", w.path().join("y")).unwrap();
    let x = w.path().join("x");
    let ex = Exchanger::start(&x, &w.path().join("y"));
    (w, x, ex)
}

#[test]
fn binds_of_a_subfolder_being_swapped_never_mount_the_host_root() {
    let img = image();
    let label = unique("race");
    let (w, x, ex) = racing_folder();
    // Control: the daemon itself, given the path, loses the race.
    let spec = format!("{}:/h:ro", x.display());
    let t0 = Instant::now();
    let mut direct = 0;
    let mut tries = 0;
    while tries < TRIES || (direct == 0 && tries < 5 * TRIES) {
        tries += 1;
        let o = docker(&["run", "--rm", "-v", &spec, img, "/bin/tool", "ls", "/h"]);
        if is_host_root(&stdout(&o)) {
            direct += 1;
        }
    }
    eprintln!(
        "direct binds by path: {direct} of {tries} mounted the host root ({} exchanges, {:.1} s)",
        ex.count.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        direct > 0,
        "the control never lost the race in {tries} binds: this test could not fail"
    );
    // Through the shim, from a stand-in Ray container with `w` at /tmp/ray.
    let ray_tmp = format!("{}:/tmp/ray", w.path().display());
    let podman = format!("{BIN}:/usr/bin/podman:ro");
    let lbl = label.clone();
    let (mut refused, mut copied, mut host_root) = (0, 0, 0);
    let t0 = Instant::now();
    for i in 0..TRIES {
        // Half detached (a bind would be the only way), half attached --rm.
        let mode: &[&str] = if i % 2 == 0 { &["-d"] } else { &["--rm"] };
        let mut args = vec![
            "run",
            "--rm",
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
            "-v",
            &podman,
            "-v",
            &ray_tmp,
            img,
            "/usr/bin/podman",
            "run",
            "--label",
            &lbl,
        ];
        args.extend(mode);
        args.extend(["-v", "/tmp/ray/x:/h:ro", img, "/bin/tool", "ls", "/h"]);
        let o = docker(&args);
        let out = stdout(&o);
        if is_host_root(&out) {
            host_root += 1;
        }
        match o.status.code() {
            Some(125) => refused += 1,
            Some(0) if i % 2 == 1 => copied += 1,
            _ => {}
        }
        // A detached run that got through would print an id; list it.
        for id in containers_with(&label) {
            let logs = docker(&["logs", &id]);
            if is_host_root(&stdout(&logs)) {
                host_root += 1;
            }
            force_remove(&[id]);
        }
    }
    drop(ex);
    eprintln!(
        "through the shim: {host_root} of {TRIES} binds mounted the host root; {refused} refused (125), {copied} copied ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(host_root, 0, "the shim let the daemon mount the host root");
    assert!(
        refused >= TRIES / 2,
        "every detached bind of the subfolder must be refused: {refused}"
    );
    assert!(containers_with(&label).is_empty());
}

// ---- road 3 of issue 26: a container reference resolved twice ---------------

/// Returns the inspected field `format` of container `id` (empty when the
/// container does not exist).
fn inspect_field(id: &str, format: &str) -> String {
    stdout(&docker(&["inspect", "--format", format, id]))
        .trim()
        .to_string()
}

/// Returns the namespace link `kind` (`net`, `pid`, `ipc`) of running
/// container `id`'s first process, or None when it does not run.
fn ns_of(id: &str, kind: &str) -> Option<String> {
    let pid = inspect_field(id, "{{.State.Pid}}");
    let pid: u32 = pid.parse().ok().filter(|&p| p > 0)?;
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|l| l.display().to_string())
}

/// Returns true once some thread of process `pid` is blocked in a write to
/// its fd 2 (`/proc/<pid>/task/*/syscall`: number 1, first argument 0x2).
fn blocked_on_stderr(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(|t| t.ok()).any(|t| {
        std::fs::read_to_string(t.path().join("syscall"))
            .map(|s| s.starts_with("1 0x2 ") || s.starts_with("20 0x2 "))
            .unwrap_or(false)
    })
}

/// A pipe whose write end is full: a process given it as stderr blocks at
/// its first write until [`FullPipe::drain`].
struct FullPipe {
    read: std::os::fd::OwnedFd,
    write: Option<std::os::fd::OwnedFd>,
}

impl FullPipe {
    fn new() -> FullPipe {
        use std::os::fd::AsRawFd;
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: fcntl on descriptors this process owns.
        unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, 4096);
            libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
        }
        let chunk = [b'.'; 512];
        while nix::unistd::write(&write, &chunk).is_ok() {}
        // Blocking again for the child (the flag is the open file's).
        // SAFETY: as above.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, 0) };
        FullPipe {
            read,
            write: Some(write),
        }
    }

    fn stdio(&mut self) -> std::process::Stdio {
        std::process::Stdio::from(self.write.take().unwrap())
    }

    /// Reads everything until EOF (the child exited), on a thread.
    fn drain(self) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut f = std::fs::File::from(self.read);
            let mut out = Vec::new();
            let _ = std::io::Read::read_to_end(&mut f, &mut out);
            out
        })
    }
}

/// Starts `podman ARGS` with the environment `env` and a full stderr
/// pipe, waits until it blocks writing to stderr (after its ownership
/// checks: the warning that `--security-opt mask=…` is podman-only and
/// ignored, which the callers pass for that), runs `meanwhile`, then lets it
/// go on; returns its exit code and stderr.
fn paused_call(
    env: &[(&str, &str)],
    args: &[&str],
    meanwhile: impl FnOnce(),
) -> (Option<i32>, String) {
    let mut pipe = FullPipe::new();
    let mut c = podman(args);
    c.envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(pipe.stdio());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    let mut paused = false;
    while Instant::now() < deadline {
        if blocked_on_stderr(child.id()) {
            paused = true;
            break;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if paused {
        meanwhile();
    }
    drop(c);
    let out = pipe.drain();
    let status = child.wait().unwrap();
    let err = String::from_utf8_lossy(&out.join().unwrap())
        .trim_start_matches('.')
        .to_string();
    (status.code(), format!("paused: {paused}\n{err}"))
}

/// Road 3: the job owns container A whose NAME is the 12-hex prefix of a
/// foreign container F's ID; its podman call names `container:<A's name>`
/// (or `--replace --name <A's name>`) and blocks on a full stderr after the
/// ownership check; A is removed meanwhile. Whatever the call does then
/// must not touch F: no container in F's namespaces, F not removed. The
/// effect is checked on the daemon (namespaces of what was created, F's
/// presence), not on messages.
#[test]
fn a_reference_resolved_once_cannot_be_redirected_to_a_foreign_container() {
    let img = image();
    let label = unique("road3");
    let owner = unique("road3-owner");
    let lbl = label.clone();
    let own = format!("io.argus.shim.owner={owner}");
    let foreign = docker(&[
        "run",
        "-d",
        "--ipc",
        "shareable",
        "--label",
        &lbl,
        img,
        "/bin/tool",
        "trap",
    ]);
    assert!(foreign.status.success(), "{}", show(&foreign));
    let f = stdout(&foreign).trim().to_string();
    let prefix = f[..12].to_string();
    let f_net = ns_of(&f, "net").expect("F runs");
    let f_pid = ns_of(&f, "pid").expect("F runs");
    let f_ipc = ns_of(&f, "ipc").expect("F runs");
    let mut failures = Vec::new();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "--network/--pid container:<name>",
            vec![
                format!("--network=container:{prefix}"),
                format!("--pid=container:{prefix}"),
            ],
        ),
        (
            "--ipc container:<name>",
            vec![format!("--ipc=container:{prefix}")],
        ),
        (
            "--replace --name <name>",
            vec!["--replace".into(), "--name".into(), prefix.clone()],
        ),
    ];
    for (what, flags) in &cases {
        // A: this node's container (its owner label), named F's prefix,
        // as an older shim or another path may have made it.
        let a = docker(&[
            "run",
            "-d",
            "--name",
            &prefix,
            "--label",
            &own,
            "--label",
            &lbl,
            "--ipc",
            "shareable",
            img,
            "/bin/tool",
            "trap",
        ]);
        assert!(a.status.success(), "{}", show(&a));
        let a = stdout(&a).trim().to_string();
        let mut args: Vec<&str> = vec![
            "run",
            "--security-opt=mask=/proc/acpi",
            "-d",
            "--label",
            &lbl,
        ];
        args.extend(flags.iter().map(String::as_str));
        args.extend([img, "/bin/tool", "trap"]);
        let (code, err) = paused_call(&[("ARGUS_SHIM_OWNER", &owner)], &args, || {
            // Another remover (a sweep) may be at it too: A gone is enough.
            let _ = docker(&["rm", "-f", &a]);
            let gone_by = Instant::now() + std::time::Duration::from_secs(30);
            while inspect_field(&a, "{{.Id}}") == a {
                assert!(Instant::now() < gone_by, "A was not removed");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        eprintln!("{what}: exit {code:?}: {err}");
        // What did the call create, and in whose namespaces (compared only
        // while F exists: a freed namespace's inode number can be reused)?
        let f_there = inspect_field(&f, "{{.Id}}") == f;
        for id in containers_with(&label) {
            if id == f || id == a {
                continue;
            }
            let modes = inspect_field(
                &id,
                "{{.HostConfig.NetworkMode}} {{.HostConfig.PidMode}} {{.HostConfig.IpcMode}}",
            );
            let joined_f = modes.contains(&f)
                || (f_there
                    && (ns_of(&id, "net").as_ref() == Some(&f_net)
                        || ns_of(&id, "pid").as_ref() == Some(&f_pid)
                        || ns_of(&id, "ipc").as_ref() == Some(&f_ipc)));
            if joined_f {
                failures.push(format!("{what}: created {id} in F's namespaces ({modes})"));
            }
            force_remove(&[id]);
        }
        if inspect_field(&f, "{{.Id}}") != f {
            failures.push(format!("{what}: the foreign container F was removed"));
            break;
        }
    }
    force_remove(&containers_with(&label));
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 26, hole 6: the image is resolved once, to its full ID, and the
/// container is created from that ID. The call blocks on a full stderr
/// after its checks (the `--security-opt mask=…` warning) while the allowed tag
/// is moved to another image: the container is still made from the image
/// that was checked (its image ID on the daemon).
#[test]
fn a_retag_between_the_check_and_the_create_changes_nothing() {
    let label = unique("retag");
    let lbl = label.clone();
    let tag = format!("localhost/argus-race-allowed:{}", std::process::id());
    let other_tag = format!("localhost/argus-race-other:{}", std::process::id());
    let allowed = derived_image(&tag, "LABEL argus.test=allowed");
    let other = derived_image(&other_tag, "LABEL argus.test=other");
    let args = [
        "run",
        "--security-opt=mask=/proc/acpi",
        "-d",
        "--label",
        &lbl,
        &tag,
        "/bin/tool",
        "trap",
    ];
    let (code, err) = paused_call(&[("ARGUS_SHIM_ALLOWED_IMAGES", &tag)], &args, || {
        let o = docker(&["tag", &other_tag, &tag]);
        assert!(o.status.success(), "{}", show(&o));
    });
    eprintln!("exit {code:?}: {err}");
    let made = containers_with(&label);
    let images: Vec<String> = made
        .iter()
        .map(|c| inspect_field(c, "{{.Image}}"))
        .collect();
    force_remove(&made);
    let _ = docker(&["rmi", "-f", &tag, &other_tag, &allowed]);
    assert!(
        err.starts_with("paused: true"),
        "the call never paused: {err}"
    );
    assert_eq!(made.len(), 1, "exit {code:?}: {err}");
    assert_eq!(
        images,
        vec![allowed],
        "created from the retagged image ({other})"
    );
}
