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
    let lbl = format!("argus-race={label}");
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
