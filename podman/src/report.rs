//! A handler's report of its call to the broker, for the agent's metrics
//! (`argus_telemetry::metrics`: `argus_shim_calls_total`, `_refusals_total`,
//! `_containers_created_total`, `_janitor_removed_total`).
//!
//! The broker creates a pipe per call and passes its write end to the
//! handler on [`REPORT_FD`]; the handler writes one JSON line ([`Report`])
//! when the call ends, or when its client vanishes and it is about to kill
//! itself. The broker reads it once the handler has exited, without
//! blocking and at most [`MAX_REPORT`] bytes ([`read`]), and takes from it
//! only values of fixed sets ([`Report::checked`]): a command of
//! `argus_telemetry::metrics::SHIM_COMMANDS` or `other`, a rule of
//! [`argus_podman_core::policy::REFUSAL_RULES`] or `other`, counts clamped to
//! [`MAX_COUNT`]. A handler that died without writing (killed by a signal)
//! counts as a call of command `other`.
//!
//! The handler runs as the caller (the Ray user), but is non-dumpable, so
//! that user cannot ptrace it nor open its descriptors; it can kill it (no
//! report) or choose its arguments (labels of fixed sets). The descriptor
//! is close-on-exec in the handler and its watchdog closes it, so nothing
//! else holds it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use argus_podman_core::args;
use argus_podman_core::policy::refusal_label;

/// The descriptor the broker passes the report pipe's write end on.
pub const REPORT_FD: i32 = 4;

/// The most the broker reads of a report (one line is far shorter, and at
/// most `PIPE_BUF` bytes are written at once).
pub const MAX_REPORT: usize = 4096;

/// The largest count a report may carry (a call creates one container; a
/// sweep removes what it finds).
pub const MAX_COUNT: u64 = 10_000;

/// What a handler tells the broker about its call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// The podman command, as `argus_telemetry::metrics::shim_command_label` maps it.
    pub command: String,
    /// The exit code sent to the client (137 when it vanished).
    pub code: u8,
    /// The rule that refused the call (a label of `REFUSAL_RULES`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Engine containers the call created.
    #[serde(default)]
    pub created: u64,
    /// Engine containers the call's janitor sweep removed.
    #[serde(default)]
    pub removed: u64,
    /// How long the call took in the handler, in milliseconds.
    #[serde(default)]
    pub took_ms: u64,
    /// Podman's global flags the call passed, which mean nothing on Docker
    /// and were ignored: PID 1 logs them (the job's stderr is a driver's
    /// console, where Ray copies every line of it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
}

/// A report reduced to the metrics' fixed sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    pub command: &'static str,
    pub code: Option<u8>,
    pub refusal: Option<&'static str>,
    pub created: u64,
    pub removed: u64,
    /// The ignored global flags, as bit `i` for the `i`-th of
    /// [`args::all_ignored_globals`].
    pub ignored: u32,
}

impl Checked {
    /// What a handler that wrote nothing (or garbage) counts as.
    pub const NONE: Checked = Checked {
        command: "other",
        code: None,
        refusal: None,
        created: 0,
        removed: 0,
        ignored: 0,
    };

    /// The ignored global flags of the call, by the table's spelling.
    pub fn ignored_flags(&self) -> impl Iterator<Item = &'static str> + '_ {
        args::all_ignored_globals()
            .enumerate()
            .filter(|(i, _)| *i < 32 && self.ignored & (1 << i) != 0)
            .map(|(_, f)| f)
    }
}

impl Report {
    /// Returns the report as one JSON line.
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    /// Parses a report as [`read`] returns it: one JSON line, at most
    /// [`MAX_REPORT`] bytes, nothing after the line. None for anything
    /// else.
    pub fn decode(bytes: &[u8]) -> Option<Report> {
        if bytes.len() > MAX_REPORT {
            return None;
        }
        let line = bytes.strip_suffix(b"\n")?;
        if line.contains(&b'\n') {
            return None;
        }
        serde_json::from_slice(line).ok()
    }

    /// Returns the report's values within the metrics' fixed sets.
    pub fn checked(&self) -> Checked {
        Checked {
            command: argus_telemetry::metrics::shim_command_label(&self.command),
            code: Some(self.code),
            refusal: self.refusal.as_deref().map(refusal_label),
            created: self.created.min(MAX_COUNT),
            removed: self.removed.min(MAX_COUNT),
            ignored: args::all_ignored_globals()
                .enumerate()
                .filter(|(i, g)| *i < 32 && self.ignored.iter().any(|n| n == g))
                .fold(0, |m, (i, _)| m | 1 << i),
        }
    }
}

/// Reads a handler's report from the read end of its pipe, without
/// blocking (the handler has exited, so what it wrote is there): at most
/// [`MAX_REPORT`] + 1 bytes, so an oversized report is seen as one.
/// Returns [`Checked::NONE`] when there is no valid report.
pub fn read(fd: BorrowedFd<'_>) -> Checked {
    read_with_ids(fd).0
}

/// The most container IDs a report may name as created.
pub const MAX_CREATED_IDS: usize = 8;

/// [`read`], and the full IDs of the containers the handler created: the
/// `C <full id>` lines it wrote, each at once after its create (so a
/// handler killed later still has its container recorded), before the
/// report's line.
pub fn read_with_ids(fd: BorrowedFd<'_>) -> (Checked, Vec<String>) {
    let mut buf = vec![0u8; MAX_REPORT + 1];
    let mut len = 0;
    while len < buf.len() {
        match nix::unistd::read(fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(nix::errno::Errno::EINTR) => continue,
            // EAGAIN: nothing more now (a writer outlives the handler).
            Err(_) => break,
        }
    }
    let mut rest = &buf[..len];
    let mut ids = Vec::new();
    while let Some(line) = rest.strip_prefix(b"C ") {
        let Some(end) = line.iter().position(|&b| b == b'\n') else {
            break;
        };
        let id = String::from_utf8_lossy(&line[..end]).into_owned();
        if super::docker::is_full_id(&id) && ids.len() < MAX_CREATED_IDS {
            ids.push(id);
        }
        rest = &line[end + 1..];
    }
    let checked = Report::decode(rest).map_or(Checked::NONE, |r| r.checked());
    (checked, ids)
}

// ---- the handler's side -----------------------------------------------------

/// The report pipe, once [`take_fd`] found it.
static PIPE: OnceLock<OwnedFd> = OnceLock::new();
static SENT: AtomicBool = AtomicBool::new(false);
static STARTED: OnceLock<Instant> = OnceLock::new();
static COMMAND: OnceLock<&'static str> = OnceLock::new();
static REFUSAL: OnceLock<&'static str> = OnceLock::new();
static CREATED: AtomicU64 = AtomicU64::new(0);
static IGNORED: OnceLock<Vec<&'static str>> = OnceLock::new();
static REMOVED: AtomicU64 = AtomicU64::new(0);

/// Takes [`REPORT_FD`] as this handler's report pipe when it is one (a
/// pipe: a handler started by hand has no report, and must not write into
/// whatever else gets that number), and makes it close-on-exec. Call first
/// thing in the handler, before anything opens a descriptor.
pub fn take_fd() {
    let _ = STARTED.set(Instant::now());
    // SAFETY: fstat of a descriptor number, which may be closed.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(REPORT_FD, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFIFO
    {
        return;
    }
    // SAFETY: the broker passed the pipe on this descriptor and nothing
    // else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(REPORT_FD) };
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let _ = PIPE.set(fd);
}

/// Notes the call's podman command (a label of `SHIM_COMMANDS` or `other`).
pub fn note_command(label: &'static str) {
    let _ = COMMAND.set(label);
}

/// Notes the rule that refused the call (a label of `REFUSAL_RULES`).
pub fn note_refusal(label: &'static str) {
    let _ = REFUSAL.set(label);
}

/// Notes the podman global flags the call passed, which mean nothing on
/// Docker: for PID 1's log, not the job's stderr (Ray copies a worker's
/// stderr to every driver's console). Ray's own ([`args::RAY_OWN_GLOBALS`])
/// are logged at debug only. A shim run by hand, with no agent to tell,
/// warns on its own stderr.
pub fn note_ignored(flags: Vec<&'static str>) {
    for flag in &flags {
        if args::RAY_OWN_GLOBALS.contains(flag) {
            tracing::debug!(flag, "Ray's podman flag has no meaning on Docker; ignored");
        } else if PIPE.get().is_none() {
            tracing::warn!("--{flag} has no meaning on Docker and is ignored");
        }
    }
    let _ = IGNORED.set(flags);
}

/// Notes an engine container this process created.
pub fn note_created() {
    CREATED.fetch_add(1, Ordering::Relaxed);
}

/// Tells the broker at once that this process created container `id` (a
/// full ID), so PID 1 records it as this node's (see
/// `super::janitor::record_in`): one `C <id>` line, whole or absent.
pub fn note_created_id(id: &str) {
    let Some(fd) = PIPE.get() else {
        return;
    };
    if super::docker::is_full_id(id) && !SENT.load(Ordering::SeqCst) {
        let _ = nix::unistd::write(fd.as_fd(), format!("C {id}\n").as_bytes());
    }
}

/// Notes an engine container this process's janitor removed.
pub fn note_removed() {
    REMOVED.fetch_add(1, Ordering::Relaxed);
}

/// Returns the report of this process's call so far, ending with `code`.
pub fn current(code: u8) -> Report {
    Report {
        command: COMMAND.get().copied().unwrap_or("other").to_string(),
        code,
        refusal: REFUSAL.get().map(|r| r.to_string()),
        created: CREATED.load(Ordering::Relaxed),
        removed: REMOVED.load(Ordering::Relaxed),
        took_ms: STARTED.get().map_or(0, |t| {
            t.elapsed().as_millis().try_into().unwrap_or(u64::MAX)
        }),
        ignored: IGNORED
            .get()
            .map(|v| v.iter().map(|f| f.to_string()).collect())
            .unwrap_or_default(),
    }
}

/// Writes the report ending with `code` to the broker, once (the first
/// call wins: the end of the call, or the client's vanishing). One write
/// of less than `PIPE_BUF` bytes: it is whole or absent.
pub fn send(code: u8) {
    let Some(fd) = PIPE.get() else {
        return;
    };
    if SENT.swap(true, Ordering::SeqCst) {
        return;
    }
    let line = current(code).encode();
    if line.len() <= MAX_REPORT {
        let _ = nix::unistd::write(fd.as_fd(), &line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Report {
        Report {
            command: "run".into(),
            code: 125,
            refusal: Some("no_privileged".into()),
            created: 1,
            removed: 2,
            took_ms: 31,
            ignored: vec!["cgroup-manager".into()],
        }
    }

    #[test]
    fn a_report_round_trips_as_one_short_line() {
        let r = full();
        let line = r.encode();
        assert!(line.len() < 200, "{}", String::from_utf8_lossy(&line));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(Report::decode(&line), Some(r.clone()));
        assert_eq!(
            r.checked(),
            Checked {
                command: "run",
                code: Some(125),
                refusal: Some("no_privileged"),
                created: 1,
                removed: 2,
                ignored: 1,
            }
        );
        assert_eq!(
            r.checked().ignored_flags().collect::<Vec<_>>(),
            vec!["cgroup-manager"]
        );
        let bare = Report {
            command: "version".into(),
            ..Report::default()
        };
        assert!(!String::from_utf8(bare.encode())
            .unwrap()
            .contains("refusal"));
        assert_eq!(Report::decode(&bare.encode()), Some(bare));
    }

    #[test]
    fn garbage_oversized_and_partial_reports_are_none() {
        let line = full().encode();
        for bad in [
            &b""[..],
            b"\n",
            b"garbage\n",
            &line[..line.len() - 1],
            &line[..line.len() / 2],
            b"{\"command\":\"run\",\"code\":0,\"extra\":1}\n",
            b"{\"command\":\"run\",\"code\":300}\n",
            b"{\"command\":\"run\",\"code\":0,\"created\":-1}\n",
        ] {
            assert_eq!(
                Report::decode(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Two lines: a report is one.
        let mut two = line.clone();
        two.extend_from_slice(&line);
        assert_eq!(Report::decode(&two), None);
        // Oversized, even if it is valid JSON.
        let big = Report {
            command: "x".repeat(MAX_REPORT),
            ..full()
        };
        assert_eq!(Report::decode(&big.encode()), None);
    }

    #[test]
    fn checked_values_are_from_fixed_sets() {
        let r = Report {
            command: "$(reboot)".into(),
            refusal: Some("a new rule\u{0}".into()),
            created: u64::MAX,
            removed: MAX_COUNT + 1,
            ..full()
        };
        let c = r.checked();
        assert_eq!(c.command, "other");
        assert_eq!(c.refusal, Some("other"));
        assert_eq!((c.created, c.removed), (MAX_COUNT, MAX_COUNT));
        // A command of the set, a rule as the messages spell it.
        let r = Report {
            command: "ps".into(),
            refusal: Some("no-docker-socket-bind".into()),
            ..full()
        };
        assert_eq!(r.checked().command, "ps");
        assert_eq!(r.checked().refusal, Some("no_docker_socket_bind"));
        // Flags only of the shim's table: a job's own text is never logged.
        let r = Report {
            ignored: vec![
                "syslog".into(),
                "\u{1b}[31m forged line".into(),
                "cgroup-manager".into(),
            ],
            ..full()
        };
        assert_eq!(
            r.checked().ignored_flags().collect::<Vec<_>>(),
            vec!["cgroup-manager", "syslog"]
        );
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        nix::fcntl::fcntl(
            &r,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        (r, w)
    }

    #[test]
    fn read_is_bounded_and_never_blocks() {
        // A report, then EOF.
        let (r, w) = pipe();
        nix::unistd::write(&w, &full().encode()).unwrap();
        drop(w);
        assert_eq!(read(r.as_fd()).command, "run");
        // Nothing written, the write end still open elsewhere: no wait.
        let (r, w) = pipe();
        let t = Instant::now();
        assert_eq!(read(r.as_fd()), Checked::NONE);
        assert!(t.elapsed() < std::time::Duration::from_millis(100));
        // A flood (the pipe holds 64 KiB): at most MAX_REPORT + 1 read,
        // and none of it counted.
        let flood = vec![b'{'; 60_000];
        nix::unistd::write(&w, &flood).unwrap();
        assert_eq!(read(r.as_fd()), Checked::NONE);
        let mut rest = vec![0u8; 70_000];
        let left = nix::unistd::read(r.as_fd(), &mut rest).unwrap();
        assert_eq!(left, 60_000 - (MAX_REPORT + 1));
    }

    #[test]
    fn created_ids_come_before_the_report_and_only_full_ids_count() {
        let (r, w) = pipe();
        let a = "a".repeat(64);
        let mut bytes = format!("C {a}\nC abc\nC {}\n", "B".repeat(64)).into_bytes();
        bytes.extend(full().encode());
        nix::unistd::write(&w, &bytes).unwrap();
        drop(w);
        let (checked, ids) = read_with_ids(r.as_fd());
        assert_eq!(checked.command, "run");
        assert_eq!(ids, vec![a]);
        // A killed handler: ids, no report.
        let (r, w) = pipe();
        nix::unistd::write(&w, format!("C {}\n", "c".repeat(64)).as_bytes()).unwrap();
        drop(w);
        let (checked, ids) = read_with_ids(r.as_fd());
        assert_eq!((checked, ids.len()), (Checked::NONE, 1));
    }

    #[test]
    fn the_command_word_is_the_parsers() {
        use argus_podman_core::args::command_word;
        let w = |a: &[&str]| {
            let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            command_word(&a).map(argus_telemetry::metrics::shim_command_label)
        };
        assert_eq!(w(&["run", "--rm", "i"]), Some("run"));
        assert_eq!(w(&["--log-level", "debug", "ps", "-a"]), Some("ps"));
        assert_eq!(w(&["--log-level", "run", "info"]), Some("info"));
        assert_eq!(w(&["--version"]), Some("version"));
        assert_eq!(w(&["container", "exists", "c"]), Some("container"));
        assert_eq!(w(&["$(reboot)", "run"]), Some("other"));
        assert_eq!(w(&["--no-such-global", "run"]), None);
        assert_eq!(w(&[]), None);
        assert_eq!(w(&["--help"]), None);
    }
}
