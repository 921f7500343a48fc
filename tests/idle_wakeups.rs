//! Issue 41: an idle agent wakes only for its configured periodic duties.
//!
//! An idle head and an idle worker (the fake `ray`, no Docker, on
//! 127.0.0.2 and 127.0.0.3 against a shared temp folder), settled; then
//! every thread's voluntary context switches
//! (`/proc/<pid>/task/<tid>/status`), summed by thread name (`comm`), are
//! counted over [`WINDOW`] and held to a budget derived from the configured
//! periods ([`budget`]). Counts, not times: a voluntary switch is a thread
//! that blocked and was woken; a loaded machine preempts threads
//! (involuntary switches), it does not wake them more often (a lock found
//! busy aside: [`PER_DUTY`]). A 1 Hz loop in any thread adds 60 in the
//! window, more than any budget's margin over what was measured.
//!
//! The shared folder and the state folders are on a tmpfs (`/dev/shm`), as
//! the node image keeps its state folder (`/run/argus`, docs/scale.md): on
//! a disk each fsync of the record and each replaced status file may also
//! block on the disk (a journal flush, a block discard), a count of the
//! disk, not of wake-ups.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{free_port, Agent, Sandbox};

/// How long the switches are counted.
const WINDOW: Duration = Duration::from_secs(60);
/// The periods the agents run with: the documented defaults of
/// `ARGUS_POLL_S`, `ARGUS_REFRESH_S` and `ARGUS_TTL_S`.
const POLL: Duration = Duration::from_secs(5);
const REFRESH: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);
/// The signal thread's safety-net `sigtimedwait` (supervise/src/reaper.rs
/// `SIGNAL_WAIT_S`).
const NET: Duration = Duration::from_secs(120);
/// The 30 s periods: the container janitor's sweep
/// (node/src/janitor.rs) and the proxy watch's longest gap
/// (node/src/drainer.rs `PROXY_SLOW`).
const SLOW: Duration = Duration::from_secs(30);
/// The proxy watch's checks before its gap reaches [`SLOW`]: after Ray
/// started it checks at 1 s and doubles the gap (1, 2, 4, 8, 16 s).
const PROXY_RAMP: u64 = 5;
/// Each duty is one wake-up, but on a loaded machine a lock or a hand-off
/// it shares with another thread may be busy (its holder preempted) and
/// block it once more: a budget is twice its duties. Seen: the head's
/// storage thread at 10 for its 7 publishes while the suite ran beside it.
const PER_DUTY: u64 = 2;
/// What every budget allows beyond that; a thread with no periodic duty
/// gets this alone.
const SLACK: u64 = 2;

/// The most times a thing of period `p` happens in [`WINDOW`].
fn ticks(p: Duration) -> u64 {
    (WINDOW.as_millis() / p.as_millis()) as u64 + 1
}

/// A thread's budget in [`WINDOW`], and its derivation.
fn budget(role: &str, thread: &str) -> (u64, String) {
    let (poll, refresh, slow) = (ticks(POLL), ticks(REFRESH), ticks(SLOW));
    let (n, why) = match (role, thread) {
        // A read on the poll timer, and one on each change of the record
        // (the head's refresh; a change restarts the poll timer).
        ("worker", "record-reader") => (
            poll + refresh,
            format!("poll {poll} + head refresh {refresh}"),
        ),
        // One event per read that brings news: a change (the head's
        // refresh; a poll between two refreshes finds the same bytes and
        // is not sent, node/src/reader.rs `Forward`); the status heartbeat
        // (10 s) rides on them.
        ("worker", "argus-agent") => (refresh, format!("a change's event: head refresh {refresh}")),
        ("worker", "proxy-watch") => (
            PROXY_RAMP + slow,
            format!("ramp {PROXY_RAMP} + 30 s {slow}"),
        ),
        // The refresh timer, then the wait for the storage thread's answer;
        // the status heartbeat rides on it.
        ("head", "argus-agent") => (2 * refresh, format!("2 per refresh {refresh}")),
        ("head", "storage") => (refresh, format!("refresh {refresh}")),
        (_, "signals") => (ticks(NET), format!("120 s net {}", ticks(NET))),
        (_, "janitor") => (slow, format!("30 s sweep {slow}")),
        _ => return (SLACK, format!("no periodic duty: {SLACK}")),
    };
    (
        PER_DUTY * n + SLACK,
        format!("{PER_DUTY} x ({why}) + {SLACK}"),
    )
}

/// Each thread of `pid`: its id, name and voluntary switches so far.
fn switches(pid: i32) -> BTreeMap<u32, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in rd.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let p = t.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let count = std::fs::read_to_string(p.join("status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok());
        if let Some(count) = count {
            out.insert(tid, (name.trim().to_string(), count));
        }
    }
    out
}

/// Wake-ups per thread name between two readings (a thread born in the
/// window counts from zero; one that ended in it is not seen).
fn wakeups(
    before: &BTreeMap<u32, (String, u64)>,
    after: &BTreeMap<u32, (String, u64)>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (tid, (name, n)) in after {
        let from = before.get(tid).map_or(0, |(_, b)| *b);
        *out.entry(name.clone()).or_insert(0) += n.saturating_sub(from);
    }
    out
}

fn thread_named(a: &Agent, name: &str) -> bool {
    switches(a.pid()).values().any(|(n, _)| n == name)
}

/// The head record's state, read from the shared folder under `mem`.
fn record_state(mem: &Path) -> Option<String> {
    let raw = std::fs::read(mem.join("shared/ray/discovery/argus-ray/head.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    v["state"].as_str().map(String::from)
}

fn env(sb: &Sandbox, mem: &Path, name: &str, role: &str, ip: &str) -> BTreeMap<String, String> {
    let mut e = sb.env(name, role);
    let secs = |d: Duration| d.as_secs().to_string();
    let on_mem = |p: &str| mem.join(p).display().to_string();
    e.insert("ARGUS_NODE_IP".into(), ip.into());
    e.insert("ARGUS_POLL_S".into(), secs(POLL));
    e.insert("ARGUS_REFRESH_S".into(), secs(REFRESH));
    e.insert("ARGUS_TTL_S".into(), secs(TTL));
    e.insert("ARGUS_SHARED_ROOT".into(), on_mem("shared"));
    e.insert("ARGUS_STATE_DIR".into(), on_mem(&format!("state-{name}")));
    // The default level: an idle agent logs nothing.
    e.insert("ARGUS_LOG_LEVEL".into(), "info".into());
    // No Docker: the janitor and the stop-timeout lookup find no daemon.
    e.insert(
        "DOCKER_HOST".into(),
        format!("unix://{}/no-docker.sock", sb.path().display()),
    );
    e
}

#[test]
fn an_idle_head_and_worker_wake_only_for_their_periodic_duties() {
    let sb = Sandbox::new();
    let shm = PathBuf::from("/dev/shm");
    assert!(shm.is_dir(), "this test needs a tmpfs at /dev/shm");
    let mem = tempfile::Builder::new()
        .prefix("argus-idle-")
        .tempdir_in(&shm)
        .unwrap();
    let mem = mem.path();
    std::fs::create_dir_all(mem.join("shared")).unwrap();
    let mut head = Agent::start(&sb, "h", &env(&sb, mem, "h", "head", "127.0.0.2"));
    let mut w_env = env(&sb, mem, "w", "worker", "127.0.0.3");
    // Nothing serves there: the proxy watch finds it `not_serving`.
    w_env.insert("ARGUS_SERVE_PORT".into(), free_port().to_string());
    w_env.insert("ARGUS_LB_AGENT_PORT".into(), free_port().to_string());
    let mut worker = Agent::start(&sb, "w", &w_env);

    // Settled: the head publishes and awaits its daemons by pidfd (no more
    // process scans); the worker runs Ray joined to it, watches the record
    // by inotify, its daemons by pidfd, and has checked its proxy.
    let wait = Duration::from_secs(60);
    head.wait_for(
        "the head serving, its daemons watched by pidfd",
        wait,
        |a| {
            a.state() == "running"
                && record_state(mem).as_deref() == Some("running")
                && thread_named(a, "exit-watch")
        },
    );
    worker.wait_for("the worker joined and settled", wait, |a| {
        a.status().is_some_and(|s| {
            s["state"] == "running"
                && s["head_address"]
                    .as_str()
                    .is_some_and(|h| h.starts_with("127.0.0.2:"))
                && s["file_events"] == "on"
                && s["serve_proxy"] == "not_serving"
        }) && thread_named(a, "exit-watch")
            && thread_named(a, "lb-agent")
    });
    let starts = (sb.ray_starts("h").len(), sb.ray_starts("w").len());

    let before = [switches(head.pid()), switches(worker.pid())];
    std::thread::sleep(WINDOW);
    let after = [switches(head.pid()), switches(worker.pid())];

    for a in [&head, &worker] {
        assert_eq!(a.state(), "running", "{} left running\n{}", a.name, a.log());
    }
    assert_eq!(
        starts,
        (sb.ray_starts("h").len(), sb.ray_starts("w").len()),
        "Ray restarted in the window: the agents were not idle"
    );

    let mut table = format!(
        "voluntary context switches in {} s (poll {} s, refresh {} s)\n{:<7} {:<16} {:>6} {:>6}  budget's derivation\n",
        WINDOW.as_secs(),
        POLL.as_secs(),
        REFRESH.as_secs(),
        "role",
        "thread",
        "count",
        "budget"
    );
    let mut over = Vec::new();
    for (role, i) in [("head", 0), ("worker", 1)] {
        for (thread, n) in wakeups(&before[i], &after[i]) {
            let (max, why) = budget(role, &thread);
            let mark = if n > max { "  OVER" } else { "" };
            table.push_str(&format!(
                "{role:<7} {thread:<16} {n:>6} {max:>6}  {why}{mark}\n"
            ));
            if n > max {
                over.push(format!("{role} {thread}: {n} > {max}"));
            }
        }
    }
    println!("{table}");
    assert!(
        over.is_empty(),
        "idle threads woke more often than their budget: {over:?}\n{table}"
    );
}
