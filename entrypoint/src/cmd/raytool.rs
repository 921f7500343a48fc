//! `argus-agent ray-tool TOOL [ARGS]`: an operator's Ray command in a node
//! (the node list, `serve deploy`, `serve status`, `ray job submit`, a
//! driver script), run the way PID 1 runs `ray start` (R-SEC-7).
//!
//! An operator's `docker exec` is root beside whatever a job planted: the
//! Ray user owns its home, may own the image's Python, and a `python -`
//! run there imports what it finds first on its path. So the command runs
//! as ARGUS_RAY_USER with no groups, no capabilities and `no_new_privs`,
//! from `/` (root's), with Python isolated (`-I`: no current folder, no
//! user site, no `PYTHON*` variables). Whatever it runs can do no more than
//! the Ray user already can. A config comes on stdin and reaches Ray as a
//! sealed in-memory file (`/proc/self/fd/N`), never through a path the Ray
//! user could create first or rewrite. With token authentication on, the
//! node's copy of the token is what Ray's clients read.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use argus_config::Reader;

/// What `ray-tool` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Tool {
    /// This cluster's nodes as JSON (docker/tools/ray_nodes.py).
    Nodes,
    /// Ray's CLI (`ray job submit ...`, `ray status`).
    Ray,
    /// Serve's CLI (`serve status`; `serve deploy -` reads the config from
    /// stdin).
    Serve,
    /// A Python script from stdin (a driver); ARGS are its arguments.
    Python,
}

/// The node listing, built in (the same file as docker/tools/ray_nodes.py).
const RAY_NODES: &str = include_str!("../../../docker/tools/ray_nodes.py");

/// The largest config `serve deploy -` takes from stdin.
const MAX_CONFIG: u64 = 16 << 20;

/// The Python arguments that run `tool` with `args`; with `Some(fd)` a
/// `-` config argument of `serve deploy` is that descriptor's file.
pub fn python_args(tool: Tool, args: &[OsString], config_fd: Option<i32>) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["-I".into()];
    let cli = |module: &str, func: &str, prog: &str| {
        format!(
            "import sys; from {module} import {func}; sys.argv[0] = {prog:?}; sys.exit({func}())"
        )
    };
    match tool {
        Tool::Python => v.push("-".into()),
        Tool::Nodes => v.extend(["-c".into(), RAY_NODES.into()]),
        Tool::Ray => v.extend([
            "-c".into(),
            cli("ray.scripts.scripts", "main", "ray").into(),
        ]),
        Tool::Serve => v.extend(["-c".into(), cli("ray.serve.scripts", "cli", "serve").into()]),
    }
    let mut deploying = false;
    for a in args {
        if tool == Tool::Serve && a == "deploy" {
            deploying = true;
        }
        match config_fd {
            Some(fd) if deploying && a == "-" => v.push(format!("/proc/self/fd/{fd}").into()),
            _ => v.push(a.clone()),
        }
    }
    v
}

/// Returns true if and only if `serve deploy -` asks for a config on stdin.
pub fn wants_config_on_stdin(tool: Tool, args: &[OsString]) -> bool {
    tool == Tool::Serve
        && args.iter().any(|a| a == "deploy")
        && args.iter().skip_while(|a| *a != "deploy").any(|a| a == "-")
}

/// A sealed in-memory file holding `bytes`: no one, its owner included,
/// can change it once made. Inherited by the child (no close-on-exec).
fn sealed_file(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create("argus-ray-tool-config", MFdFlags::MFD_ALLOW_SEALING)?;
    let mut f = std::fs::File::from(fd);
    std::io::Write::write_all(&mut f, bytes)?;
    let fd = OwnedFd::from(f);
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SEAL
                | SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE,
        ),
    )?;
    Ok(fd)
}

/// Runs the tool; returns its exit code (128 + signal when killed).
pub fn run(tool: Tool, args: Vec<OsString>) -> u8 {
    match run_inner(tool, args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("argus-agent ray-tool: {e}");
            1
        }
    }
}

fn run_inner(tool: Tool, args: Vec<OsString>) -> Result<u8, String> {
    let env = std::collections::BTreeMap::new();
    let mut r = Reader::new(&env);
    let user = argus_config::read_ray_user(&mut r).map_err(|e| e.to_string())?;
    let state_dir = argus_config::read_state_dir(&mut r).map_err(|e| e.to_string())?;
    let config = if wants_config_on_stdin(tool, &args) {
        let mut buf = Vec::new();
        std::io::stdin()
            .take(MAX_CONFIG + 1)
            .read_to_end(&mut buf)
            .map_err(|e| format!("reading the config from stdin: {e}"))?;
        if buf.len() as u64 > MAX_CONFIG {
            return Err(format!(
                "the config on stdin is larger than {MAX_CONFIG} bytes"
            ));
        }
        Some(sealed_file(&buf).map_err(|e| format!("cannot hold the config in memory: {e}"))?)
    } else {
        None
    };
    let mut cmd = Command::new("python");
    cmd.args(python_args(
        tool,
        &args,
        config.as_ref().map(|f| f.as_raw_fd()),
    ));
    argus_supervise::privs::confine(&mut cmd, user.as_ref());
    // Root's folder, never the Ray user's home (confine's default for Ray).
    cmd.current_dir("/");
    for v in [
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONINSPECT",
    ] {
        cmd.env_remove(v);
    }
    let auth_off = std::env::var_os("RAY_AUTH_MODE").is_some_and(|m| m == OsStr::new("disabled"));
    let copy = state_dir.join(argus_node::auth::STATE_COPY);
    if !auth_off
        && std::env::var_os("RAY_AUTH_TOKEN").is_none_or(|t| t.is_empty())
        && copy.is_file()
    {
        cmd.env("RAY_AUTH_MODE", "token")
            .env("RAY_AUTH_TOKEN_PATH", &copy);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run python ({tool:?}): {e}"))?;
    drop(config);
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn every_tool_runs_python_isolated_and_only_deploys_dash_is_the_config() {
        for t in [Tool::Nodes, Tool::Ray, Tool::Serve, Tool::Python] {
            assert_eq!(python_args(t, &[], None)[0], "-I", "{t:?}");
        }
        let a = python_args(
            Tool::Serve,
            &os(&["deploy", "-a", "http://x:8265", "-"]),
            Some(7),
        );
        assert_eq!(a.last().unwrap(), "/proc/self/fd/7");
        assert!(a.iter().any(|x| x == "-a"), "{a:?}");
        assert!(wants_config_on_stdin(Tool::Serve, &os(&["deploy", "-"])));
        assert!(!wants_config_on_stdin(Tool::Serve, &os(&["status"])));
        assert!(!wants_config_on_stdin(
            Tool::Serve,
            &os(&["-", "deploy", "x.yaml"])
        ));
        assert!(!wants_config_on_stdin(Tool::Ray, &os(&["deploy", "-"])));
        let p = python_args(Tool::Python, &os(&["--flag", "-"]), None);
        assert_eq!(p, os(&["-I", "-", "--flag", "-"]));
    }

    #[test]
    fn a_sealed_config_cannot_be_changed_by_anyone() {
        let fd = sealed_file(b"applications: []\n").unwrap();
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "applications: []\n"
        );
        assert!(std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| { std::io::Write::write_all(&mut f, b"x") })
            .is_err());
        assert!(std::fs::metadata(&path).unwrap().is_file());
    }
}
