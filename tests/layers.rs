//! The workspace's one direction: every crate imports only crates of a
//! lower layer (docs/architecture.md). Cargo refuses a cycle between crates;
//! this test refuses an import that runs sideways or up, reading each
//! crate's Cargo.toml (dev-dependencies included: a test must not reach up
//! either), and keeps podman-core free of I/O.

use std::fs;
use std::path::{Path, PathBuf};

/// The layers, bottom first. A crate may depend on crates of lower layers.
const LAYERS: &[&[&str]] = &[
    &["argus-discovery", "argus-podman-core"],
    &["argus-supervise"],
    &["argus-config"],
    &["argus-telemetry"],
    &["argus-podman"],
    &["argus-node"],
    &["argus-agent"],
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&name))
}

/// Returns the workspace members' folders, from the root Cargo.toml.
fn members() -> Vec<String> {
    let text = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("members line");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Returns the package name and the workspace crates it depends on (in
/// `[dependencies]`, `[dev-dependencies]` and `[build-dependencies]`).
fn manifest(dir: &str) -> (String, Vec<String>) {
    let text = fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut name = None;
    let mut deps = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let key = line.split(['=', '.', ' ']).next().unwrap_or("");
        if section == "package" && key == "name" {
            name = line.split('"').nth(1).map(str::to_string);
        }
        if section.ends_with("dependencies") && key.starts_with("argus-") {
            deps.push(key.to_string());
        }
    }
    (name.expect("package name"), deps)
}

#[test]
fn every_crate_imports_only_lower_layers() {
    let members = members();
    assert!(members.len() >= 8, "{members:?}");
    let mut bad = Vec::new();
    for dir in &members {
        let (name, deps) = manifest(dir);
        let Some(mine) = layer_of(&name) else {
            panic!(
                "{dir}: crate {name} has no layer in tests/layers.rs (and docs/architecture.md)"
            );
        };
        for d in deps {
            match layer_of(&d) {
                Some(l) if l < mine => {}
                Some(_) => bad.push(format!("{name} -> {d} (same layer or above)")),
                None => bad.push(format!("{name} -> {d} (not a layered crate)")),
            }
        }
    }
    assert!(bad.is_empty(), "imports that do not run down: {bad:?}");
}

#[test]
fn every_layered_crate_is_a_member() {
    let names: Vec<String> = members().iter().map(|d| manifest(d).0).collect();
    for l in LAYERS.iter().flat_map(|l| l.iter()) {
        assert!(names.iter().any(|n| n == l), "{l} is no workspace member");
    }
}

/// Returns the Rust sources under `dir`, each without its `#[cfg(test)]`
/// module (tests may read fixtures).
fn sources_without_tests(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(sources_without_tests(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = fs::read_to_string(&p).unwrap();
            let code = match text.find("#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            out.push((p, code));
        }
    }
    out
}

#[test]
fn podman_core_does_no_io_and_keeps_no_state() {
    let dir = root().join("podman-core/src");
    let banned = [
        "std::fs",
        "std::env",
        "std::net",
        "std::process",
        "std::os::unix::net",
        "tokio",
        "nix::",
        "libc::",
        "static ",
        "OnceLock",
        "thread_local",
        "File::",
    ];
    let mut found = Vec::new();
    for (path, code) in sources_without_tests(&dir) {
        for (n, line) in code.lines().enumerate() {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            for b in banned {
                // `&'static str` is a lifetime, not a static.
                if l.replace("'static", "").contains(b) {
                    found.push(format!("{}:{}: {b}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "I/O or state in podman-core: {found:?}");
}
