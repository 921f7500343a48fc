//! scripts/test's report (scripts/test-report.py): a failure names itself in
//! the last 40 lines of the output, as CI keeps only the tail. A fixture
//! suite that fails on purpose (tests/fixtures/report-suite: each failure
//! after 300 lines of logs) runs under cargo-nextest with this project's
//! .config/nextest.toml, and its output goes through the same report.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_last_40_lines_name_each_failed_test_its_failure_line_and_its_log() {
    let root = root();
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite");
    std::fs::create_dir_all(suite.join("tests")).unwrap();
    std::fs::create_dir_all(suite.join(".config")).unwrap();
    let fixture = root.join("tests/fixtures/report-suite");
    std::fs::copy(fixture.join("Cargo.toml.in"), suite.join("Cargo.toml")).unwrap();
    std::fs::copy(
        fixture.join("tests/fixture.rs"),
        suite.join("tests/fixture.rs"),
    )
    .unwrap();
    // The project's settings of how a run reports (output, JUnit), without
    // its per-test overrides: their filters name this project's binaries.
    let config = std::fs::read_to_string(root.join(".config/nextest.toml")).unwrap();
    let general = config
        .split("\n[[profile.")
        .next()
        .expect("nextest.toml has settings before its overrides");
    assert!(general.contains("[profile.default.junit]"));
    std::fs::write(suite.join(".config/nextest.toml"), general).unwrap();
    // The scenarios' phases, through the same module the cluster tests use.
    std::fs::create_dir_all(suite.join("tests/support")).unwrap();
    std::fs::copy(
        root.join("tests/support/scenario.rs"),
        suite.join("tests/support/scenario.rs"),
    )
    .unwrap();
    let phases = dir.path().join("phases");

    // As scripts/test runs it: the whole run's output, then the report.
    let run = Command::new("cargo")
        .args(["nextest", "run", "--no-fail-fast", "--cargo-quiet"])
        .current_dir(&suite)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("NEXTEST_PROFILE")
        .env("ARGUS_PHASE_DIR", &phases)
        .output()
        .expect("cargo nextest");
    assert!(
        !run.status.success(),
        "the fixture suite fails on purpose, yet nextest passed it"
    );
    let logs = dir.path().join("logs");
    let timeline = dir.path().join("timeline.tsv");
    std::fs::write(&timeline, "0\tstart\n12\ttests done\n").unwrap();
    let report = Command::new("python3")
        .arg(root.join("scripts/test-report.py"))
        .arg("--junit")
        .arg(suite.join("target/nextest/default/junit.xml"))
        .arg("--timeline")
        .arg(&timeline)
        .arg("--logs")
        .arg(&logs)
        .arg("--phases")
        .arg(&phases)
        .args([
            "--nextest-status",
            &run.status.code().unwrap_or(1).to_string(),
        ])
        .output()
        .expect("python3 scripts/test-report.py");
    assert_eq!(
        report.status.code(),
        Some(1),
        "the report exits 1 when a test failed: {}",
        String::from_utf8_lossy(&report.stderr)
    );
    let all = format!(
        "{}{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&report.stdout)
    );
    let lines: Vec<&str> = all.lines().collect();
    assert!(
        lines.len() > 600,
        "the fixture's logs come first: {} lines",
        lines.len()
    );
    let tail = lines[lines.len() - 40..].join("\n");

    let summary = lines.last().unwrap();
    assert_eq!(
        *summary,
        "scripts/test: passed 4, failed 4, ignored 0 (test binaries failed: 1); fmt ok, clippy ok"
    );
    // Each failed test, and each failed or never-reached phase of a
    // scenario (counted as tests), is named with its own first line and
    // the log that holds its test's whole output.
    let whole = Some("a log line of a cluster that is not the failure (299)");
    for (name, first, log, holds) in [
        (
            "nodes_come_back_after_a_head_kill",
            "assertion `left == right` failed: all 3 nodes alive after the head's kill (tests/fixture.rs:",
            "nodes_come_back_after_a_head_kill",
            whole,
        ),
        (
            "soak_keeps_every_invariant",
            "6 worker_stop_start BROKEN: nodes: worker-1 not alive (tests/fixture.rs:",
            "soak_keeps_every_invariant",
            whole,
        ),
        (
            "cluster_scenario::heals_from_a_fault",
            "worker-1 did not rejoin within 240s (tests/fixture.rs:",
            "cluster_scenario",
            whole,
        ),
        (
            "cut_short_scenario::never_reached",
            "not run: the scenario ended before this phase (the scenario stopped before its last phase (tests/fixture.rs:",
            "cut_short_scenario",
            None,
        ),
    ] {
        assert!(
            tail.contains(&format!("FAILED fixture {name}\n")),
            "{name} is not named in the last 40 lines:\n{tail}"
        );
        assert!(
            tail.contains(first),
            "{name}'s failure line is not in the last 40 lines:\n{tail}"
        );
        let log = logs.join("fixture").join(format!("{log}.log"));
        assert!(
            tail.contains(&format!("log: {}", log.display())),
            "{name}'s log path is not in the last 40 lines:\n{tail}"
        );
        if let Some(line) = holds {
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(
                text.contains(line),
                "{log:?} does not hold the test's whole output"
            );
        }
    }
    assert!(!tail.contains("FAILED fixture this_one_passes"));
    for passed in [
        "cluster_scenario::comes_up",
        "cluster_scenario::stops_cleanly",
        "cut_short_scenario::first",
    ] {
        assert!(
            !tail.contains(&format!("FAILED fixture {passed}")),
            "the passed phase {passed} is listed as failed:\n{tail}"
        );
    }
    assert!(
        !tail.contains("FAILED fixture cluster_scenario\n"),
        "a scenario whose failures are its phases is not listed again:\n{tail}"
    );
}
