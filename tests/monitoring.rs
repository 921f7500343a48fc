//! The compose cluster's Prometheus (Dockerfile.prometheus,
//! docker-compose.monitoring.yaml, docker/prometheus/): its configuration
//! and alert rules pass `promtool check`, the rules' unit tests pass
//! (`promtool test rules`) and test every alert both firing and silent,
//! the rules use only metrics the agent exports, the scrape targets match
//! the compose files, and docs/operations.md explains every alert.
//!
//! Needs `promtool` (Debian's `prometheus` package, which scripts/test
//! installs when missing); without it these tests fail, they never skip.
//! The live checks (Prometheus scraping a cluster through a head kill) are
//! in tests/compose_e2e.rs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("entrypoint/ has a parent")
        .to_path_buf()
}

fn prom_dir() -> PathBuf {
    root().join("docker/prometheus")
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Runs promtool with `args` in docker/prometheus and panics with its output
/// unless it exits 0; returns stdout and stderr together.
fn promtool(args: &[&str]) -> String {
    let t = Instant::now();
    let out: Output = Command::new("promtool")
        .args(args)
        .current_dir(prom_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Debian's `prometheus` package \
                 (scripts/test does when promtool is missing)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        out.status
    );
    eprintln!(
        "promtool {}: ok in {:.2}s",
        args.join(" "),
        t.elapsed().as_secs_f64()
    );
    text
}

/// The alert names of the rules file, in order.
fn alerts() -> Vec<String> {
    read("docker/prometheus/rules/argus.rules.yml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|a| a.trim().to_string())
        .collect()
}

#[test]
fn promtool_accepts_the_prometheus_config_and_its_rules() {
    let out = promtool(&["check", "config", "prometheus.yml"]);
    // The config loads the rules file (rule_files: rules/*.yml).
    assert!(
        out.contains("SUCCESS: 1 rule files found"),
        "prometheus.yml does not load the rules file:\n{out}"
    );
    let out = promtool(&["check", "rules", "rules/argus.rules.yml"]);
    let n = alerts().len();
    assert!(
        out.contains(&format!("SUCCESS: {n} rules found")),
        "expected {n} rules:\n{out}"
    );
}

/// Every alert has a unit test that expects it to fire and one that
/// expects it silent, and `promtool test rules` passes them.
#[test]
fn alert_rule_unit_tests_pass_and_test_every_alert_firing_and_silent() {
    let tests = read("docker/prometheus/tests/argus.rules.test.yml");
    let mut fired = BTreeSet::new();
    let mut silent = BTreeSet::new();
    let mut current = String::new();
    for l in tests.lines().map(str::trim) {
        if let Some(a) = l.strip_prefix("alertname:") {
            current = a.trim().to_string();
        } else if l == "exp_alerts: []" {
            silent.insert(current.clone());
        } else if l == "exp_alerts:" {
            fired.insert(current.clone());
        }
    }
    for a in alerts() {
        assert!(fired.contains(&a), "no unit test expects {a} to fire");
        assert!(
            silent.contains(&a),
            "no unit test expects {a} to stay silent"
        );
    }
    let out = promtool(&["test", "rules", "tests/argus.rules.test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The rules name only metrics the agent exports (`argus-agent metrics
/// --catalogue`), so a renamed metric cannot leave an alert that never
/// fires.
#[test]
fn the_rules_use_only_metrics_the_agent_exports() {
    let out = Command::new(env!("CARGO_BIN_EXE_argus-agent"))
        .args(["metrics", "--catalogue"])
        .output()
        .expect("argus-agent metrics --catalogue runs");
    assert!(out.status.success(), "{out:?}");
    let catalogue: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    let rules = read("docker/prometheus/rules/argus.rules.yml");
    let mut used = BTreeSet::new();
    // Identifiers in expressions; annotations name metrics too (they are
    // advice to the reader and must be right as well).
    for l in rules.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = l;
        while let Some(i) = rest.find("argus_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            used.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    assert!(
        used.len() >= 5,
        "too few metrics found in the rules: {used:?}"
    );
    let unknown: Vec<&String> = used.difference(&catalogue).collect();
    assert!(
        unknown.is_empty(),
        "the rules use metrics the agent does not export: {unknown:?}\nthe agent's: {catalogue:?}"
    );
    eprintln!("the rules use {} agent metrics: {used:?}", used.len());
}

/// The scrape targets are the compose cluster's: the agents at the node
/// services' names on ARGUS_METRICS_PORT's compose default, Ray's
/// service-discovery file where docker-compose.monitoring.yaml mounts the
/// head's /tmp/ray.
#[test]
fn the_scrape_targets_match_the_compose_files() {
    let prom = read("docker/prometheus/prometheus.yml");
    let base = read("docker-compose.yaml");
    let port = base
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("ARGUS_METRICS_PORT: ${ARGUS_METRICS_PORT:-")
                .and_then(|r| r.strip_suffix('}'))
        })
        .expect("docker-compose.yaml sets ARGUS_METRICS_PORT with a default");
    for s in ["head", "worker-1", "worker-2"] {
        assert!(
            base.contains(&format!("\n  {s}:\n")),
            "docker-compose.yaml has no service {s}"
        );
        assert!(
            prom.contains(&format!("\"{s}:{port}\"")),
            "prometheus.yml does not scrape {s}:{port}"
        );
    }
    let mon = read("docker-compose.monitoring.yaml");
    assert!(
        mon.contains("- ray-tmp-head:/ray-head:ro"),
        "docker-compose.monitoring.yaml does not mount the head's /tmp/ray at /ray-head"
    );
    assert!(
        base.contains("- ray-tmp-head:/tmp/ray"),
        "the head's /tmp/ray is not the volume ray-tmp-head"
    );
    // Ray 2.53: ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE in its temp dir.
    assert!(
        prom.contains("\"/ray-head/prom_metrics_service_discovery.json\""),
        "prometheus.yml does not read Ray's service-discovery file"
    );
}

/// docs/operations.md has a section for every alert (what it means, what
/// to do).
#[test]
fn operations_doc_explains_every_alert() {
    let doc = read("docs/operations.md");
    for a in alerts() {
        let heading = format!("### {a}");
        let at = doc
            .find(&heading)
            .unwrap_or_else(|| panic!("docs/operations.md has no section `{heading}`"));
        let body = &doc[at + heading.len()..];
        let body = &body[..body.find("\n#").unwrap_or(body.len())];
        for part in ["**Means**", "**Do**"] {
            assert!(
                body.contains(part),
                "docs/operations.md's {a} section lacks {part}"
            );
        }
    }
}
