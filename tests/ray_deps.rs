//! Ray's pinned dependency set (docker/ray/constraints-2.53.0.txt) and its
//! check (docker/ray/check_deps.py), which every image build and
//! scripts/setup-ray-venv.sh run: the test venv passes it, and a pin the
//! environment does not meet, or a bad constraints line, fails it with a line
//! naming the package.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

const RAY_VERSION: &str = "2.53.0";

fn python() -> PathBuf {
    let p = support::repo().join("target/ray-venv/bin/python");
    assert!(
        p.exists(),
        "needs target/ray-venv: run scripts/setup-ray-venv.sh (scripts/test does)"
    );
    p
}

fn constraints() -> PathBuf {
    support::repo().join(format!("docker/ray/constraints-{RAY_VERSION}.txt"))
}

fn check(constraints: &std::path::Path) -> Output {
    Command::new(python())
        .arg(support::repo().join("docker/ray/check_deps.py"))
        .args(["--ray", RAY_VERSION, "--python", "3.11", "--constraints"])
        .arg(constraints)
        .arg("--print-freeze")
        .output()
        .expect("cannot run check_deps.py")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_test_venv_carries_rays_pinned_set_and_serve_configs_round_trip() {
    let out = check(&constraints());
    assert!(out.status.success(), "{}", text(&out));
    let freeze = String::from_utf8_lossy(&out.stdout);
    // The pins that broke Serve when left to pip: protobuf 7 and friends.
    for pin in ["protobuf==4.25.8", "grpcio==1.74.0", "fastapi==0.121.0"] {
        assert!(freeze.lines().any(|l| l == pin), "{pin} missing:\n{freeze}");
    }
    assert!(text(&out).contains("serve config round trip ok"));
}

#[test]
fn a_pin_the_environment_does_not_meet_fails_naming_the_package() {
    let dir = tempfile::tempdir().unwrap();
    let moved = dir.path().join("constraints.txt");
    let pins = std::fs::read_to_string(constraints())
        .unwrap()
        .replace("protobuf==4.25.8", "protobuf==7.36.2");
    std::fs::write(&moved, pins).unwrap();
    let out = check(&moved);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let errors: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        errors,
        [format!(
            "check_deps: protobuf: installed 4.25.8, Ray {RAY_VERSION}'s pinned set says 7.36.2"
        )],
        "{}",
        text(&out)
    );
}

#[test]
fn a_constraints_line_that_is_no_pin_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("constraints.txt");
    std::fs::write(&bad, "protobuf>=4\n").unwrap();
    let out = check(&bad);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("not a name==version pin: 'protobuf>=4'"),
        "{}",
        text(&out)
    );
}
