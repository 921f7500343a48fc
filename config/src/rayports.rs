//! Ray's own ports on a node (issue 18): every port `ray start` binds besides
//! the GCS (`ARGUS_RAY_PORT`) and the dashboard (`ARGUS_DASHBOARD_PORT`),
//! each settable by its own variable instead of by hand in
//! `ARGUS_RAY_EXTRA_ARGS`, checked like every variable (R-CFG-1), and checked
//! free on the node IP before Ray first starts ([`check_free`]).
//!
//! Why: with `docker run --network host` the node shares the host's ports.
//! A firewall between hosts wants fixed ports (Ray picks most of them at
//! random), and two nodes on one machine (a test, or a head and a worker on
//! one host) collide on Ray's fixed defaults (52365, 10001, the worker
//! range). Ray itself reports a taken port late and obscurely (a dashboard
//! agent that retries, a raylet that dies); the agent says which variable
//! and which address before Ray starts.

use std::net::{IpAddr, SocketAddr};

use crate::table::{ConfigError, Reader, Role};

/// One of Ray's ports the agent passes when its variable is set.
#[derive(Debug, PartialEq, Eq)]
pub struct RayPort {
    /// The variable (a row of `config::VARIABLES`).
    pub var: &'static str,
    /// The `ray start` flag.
    pub flag: &'static str,
    /// Only the head binds it (the Ray client server).
    pub head_only: bool,
    /// Ray's own fixed default, bound when the variable is unset; `None`
    /// when Ray picks a free port at random.
    pub ray_default: Option<u16>,
    /// Where Ray 2.53 binds it (seen with `ss -ltnp` on a head with host
    /// networking).
    pub bind: Bind,
}

/// The addresses a Ray port is bound on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// All addresses (`*` or 0.0.0.0): the GCS, the raylet's node and
    /// object manager, the dashboard, the metrics export.
    All,
    /// The node IP only: the runtime_env agent.
    NodeIp,
    /// The node IP and 127.0.0.1: the dashboard agent (gRPC and HTTP), the
    /// Ray client server.
    NodeIpAndLoopback,
}

/// Ray 2.53's ports besides the GCS, the dashboard and the worker range,
/// in `config::VARIABLES` order.
pub const PORTS: &[RayPort] = &[
    RayPort {
        var: "ARGUS_RAY_NODE_MANAGER_PORT",
        flag: "--node-manager-port",
        head_only: false,
        ray_default: None,
        bind: Bind::All,
    },
    RayPort {
        var: "ARGUS_RAY_OBJECT_MANAGER_PORT",
        flag: "--object-manager-port",
        head_only: false,
        ray_default: None,
        bind: Bind::All,
    },
    RayPort {
        var: "ARGUS_RAY_RUNTIME_ENV_AGENT_PORT",
        flag: "--runtime-env-agent-port",
        head_only: false,
        ray_default: None,
        bind: Bind::NodeIp,
    },
    RayPort {
        var: "ARGUS_RAY_DASHBOARD_AGENT_GRPC_PORT",
        flag: "--dashboard-agent-grpc-port",
        head_only: false,
        ray_default: None,
        bind: Bind::NodeIpAndLoopback,
    },
    RayPort {
        var: "ARGUS_RAY_DASHBOARD_AGENT_LISTEN_PORT",
        flag: "--dashboard-agent-listen-port",
        head_only: false,
        ray_default: Some(52365),
        bind: Bind::NodeIpAndLoopback,
    },
    RayPort {
        var: "ARGUS_RAY_METRICS_EXPORT_PORT",
        flag: "--metrics-export-port",
        head_only: false,
        ray_default: None,
        bind: Bind::All,
    },
    RayPort {
        var: "ARGUS_RAY_CLIENT_SERVER_PORT",
        flag: "--ray-client-server-port",
        head_only: true,
        ray_default: Some(10001),
        bind: Bind::NodeIpAndLoopback,
    },
];

/// The worker port range's variable.
pub const WORKER_PORTS_VAR: &str = "ARGUS_RAY_WORKER_PORTS";

/// The `ray start` flags the port variables set (a flag in
/// `ARGUS_RAY_EXTRA_ARGS` may not also come from a variable).
pub fn flags_of(var: &str) -> &'static [&'static str] {
    if var == WORKER_PORTS_VAR {
        return &[
            "--min-worker-port",
            "--max-worker-port",
            "--worker-port-list",
        ];
    }
    match PORTS.iter().find(|p| p.var == var) {
        Some(p) => std::slice::from_ref(&p.flag),
        None => &[],
    }
}

/// The port settings of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RayPorts {
    /// The ports of [`PORTS`] that are set, with their value.
    pub set: Vec<(&'static str, u16)>,
    /// `ARGUS_RAY_WORKER_PORTS`: Ray's workers' range, inclusive.
    pub worker_ports: Option<(u16, u16)>,
    /// The ports of [`PORTS`] whose flag `ARGUS_RAY_EXTRA_ARGS` gives: the
    /// user's, not checked here.
    pub in_extra_args: Vec<&'static str>,
}

fn parse_port(var: &'static str, v: &str) -> Result<u16, ConfigError> {
    match v.trim().parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
        Ok(_) => Err(ConfigError::new(var, v, "port out of range 1-65535")),
        Err(_) => Err(ConfigError::new(var, v, "not a port number")),
    }
}

/// Parses `MIN-MAX` (Ray wants 1024 <= MIN <= MAX <= 65535).
pub fn parse_range(var: &'static str, v: &str) -> Result<(u16, u16), ConfigError> {
    let Some((lo, hi)) = v.trim().split_once('-') else {
        return Err(ConfigError::new(
            var,
            v,
            "must be MIN-MAX, e.g. 10002-19999",
        ));
    };
    let (lo, hi) = (parse_port(var, lo)?, parse_port(var, hi)?);
    if lo < 1024 {
        return Err(ConfigError::new(
            var,
            v,
            "Ray's worker ports start at 1024 or above",
        ));
    }
    if hi < lo {
        return Err(ConfigError::new(var, v, "MAX is below MIN"));
    }
    Ok((lo, hi))
}

impl RayPorts {
    /// Reads the port variables and checks them against each other, the
    /// node's GCS and dashboard ports (head) and `ARGUS_RAY_EXTRA_ARGS`.
    pub fn read(
        r: &mut Reader,
        role: Role,
        gcs_port: u16,
        dashboard_port: u16,
        extra_args: &[String],
    ) -> Result<Self, ConfigError> {
        let mut out = RayPorts::default();
        for p in PORTS {
            if let Some(v) = r.text(p.var)? {
                out.set.push((p.var, parse_port(p.var, &v)?));
            }
        }
        if let Some(v) = r.text(WORKER_PORTS_VAR)? {
            out.worker_ports = Some(parse_range(WORKER_PORTS_VAR, &v)?);
        }
        // A flag may come from its variable or from the extra args, not both.
        let given: Vec<&'static str> = out
            .set
            .iter()
            .map(|(var, _)| *var)
            .chain(out.worker_ports.map(|_| WORKER_PORTS_VAR))
            .collect();
        for a in extra_args {
            let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
            if let Some(var) = given.iter().find(|v| flags_of(v).contains(&flag)) {
                return Err(ConfigError::new(
                    "ARGUS_RAY_EXTRA_ARGS",
                    a,
                    format!("{flag} is set by {var}: give it once"),
                ));
            }
        }
        for p in PORTS {
            let named = |a: &String| a == p.flag || a.starts_with(&format!("{}=", p.flag));
            if extra_args.iter().any(named) {
                out.in_extra_args.push(p.var);
            }
        }
        // Two of this node's ports on one number: Ray would fail to bind.
        let mut mine: Vec<(&'static str, u16)> = Vec::new();
        if role == Role::Head {
            mine.push(("ARGUS_RAY_PORT", gcs_port));
            mine.push(("ARGUS_DASHBOARD_PORT", dashboard_port));
        }
        for (var, port) in &out.set {
            let head_only = PORTS.iter().any(|p| p.var == *var && p.head_only);
            if role == Role::Head || !head_only {
                mine.push((var, *port));
            }
        }
        for (i, (var, port)) in mine.iter().enumerate() {
            if let Some((other, _)) = mine[..i].iter().find(|(_, p)| p == port) {
                return Err(ConfigError::new(
                    var,
                    &port.to_string(),
                    format!("the same port as {other}: each of Ray's ports needs its own"),
                ));
            }
            if let Some((lo, hi)) = out.worker_ports {
                if (lo..=hi).contains(port) {
                    return Err(ConfigError::new(
                        var,
                        &port.to_string(),
                        format!("inside {WORKER_PORTS_VAR} ({lo}-{hi}), Ray's workers' ports"),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Returns the `ray start` arguments of the ports that are set.
    pub fn args(&self, role: Role) -> Vec<String> {
        let mut args = Vec::new();
        for p in PORTS {
            if p.head_only && role != Role::Head {
                continue;
            }
            if let Some((_, port)) = self.set.iter().find(|(v, _)| *v == p.var) {
                args.push(format!("{}={port}", p.flag));
            }
        }
        if let Some((lo, hi)) = self.worker_ports {
            args.push(format!("--min-worker-port={lo}"));
            args.push(format!("--max-worker-port={hi}"));
        }
        args
    }

    /// Returns the fixed ports this node's Ray binds. Ports Ray picks at
    /// random and the worker range are not among them.
    pub fn fixed(&self, role: Role, gcs_port: u16, dashboard_port: u16) -> Vec<FixedPort> {
        let port = |var, port, ray_default, bind| FixedPort {
            var,
            port,
            ray_default,
            bind,
        };
        let mut out = Vec::new();
        if role == Role::Head {
            out.push(port("ARGUS_RAY_PORT", gcs_port, false, Bind::All));
            out.push(port(
                "ARGUS_DASHBOARD_PORT",
                dashboard_port,
                false,
                Bind::All,
            ));
        }
        for p in PORTS {
            if (p.head_only && role != Role::Head) || self.in_extra_args.contains(&p.var) {
                continue;
            }
            match (self.set.iter().find(|(v, _)| *v == p.var), p.ray_default) {
                (Some((_, n)), _) => out.push(port(p.var, *n, false, p.bind)),
                (None, Some(d)) => out.push(port(p.var, d, true, p.bind)),
                (None, None) => {}
            }
        }
        out
    }
}

/// Binds a TCP socket to `addr` with `SO_REUSEADDR` and closes it, without
/// listening: that fails (EADDRINUSE) only when a socket *listens* there
/// (or on all addresses), so two agents checking one port at the same
/// moment, a connection in TIME_WAIT or Ray binding it meanwhile do not
/// make it look taken.
fn bind_probe(addr: SocketAddr) -> std::io::Result<()> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage,
    };
    use std::os::fd::AsRawFd;
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(())
}

/// One fixed port of a node's Ray.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedPort {
    /// The variable that sets it.
    pub var: &'static str,
    pub port: u16,
    /// The variable is unset: this is Ray's own default.
    pub ray_default: bool,
    /// Where Ray binds it.
    pub bind: Bind,
}

/// Checks that each of `ports` can be bound now where Ray binds it: on all
/// addresses (any listener of the host on that port holds it), or on `ip`
/// (and 127.0.0.1), where a listener on that address or on all addresses
/// holds it. Run once, before Ray first starts: a port taken later is Ray's
/// to report. The error names the variable, the address and what to do;
/// the agent exits 78 with it.
pub fn check_free(ip: IpAddr, ports: &[FixedPort]) -> Result<(), ConfigError> {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let any = IpAddr::from([0, 0, 0, 0]);
    for p in ports {
        let addrs = match p.bind {
            Bind::All => vec![SocketAddr::new(any, p.port)],
            Bind::NodeIp => vec![SocketAddr::new(ip, p.port)],
            Bind::NodeIpAndLoopback if ip == loopback => vec![SocketAddr::new(ip, p.port)],
            Bind::NodeIpAndLoopback => vec![
                SocketAddr::new(ip, p.port),
                SocketAddr::new(loopback, p.port),
            ],
        };
        for addr in addrs {
            match bind_probe(addr) {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    let (value, what) = match p.ray_default {
                        true => (String::new(), format!("unset, so Ray's default {}", p.port)),
                        false => (p.port.to_string(), format!("port {}", p.port)),
                    };
                    let on = match addr.ip() == any {
                        true => format!("this host (Ray binds it on all addresses; node IP {ip})"),
                        false => addr.ip().to_string(),
                    };
                    return Err(ConfigError::new(
                        p.var,
                        &value,
                        format!(
                            "{what} is already in use on {on} by another process (another Ray node or service of this host; \
                             with --network host each node on a host needs its own ports): set a free port",
                        ),
                    ));
                }
                // Another failure (no such address here) is not a taken
                // port: Ray reports it itself.
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::VARIABLES;
    use crate::Config;
    use std::net::TcpListener;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn every_port_is_a_row_of_the_table() {
        for var in PORTS.iter().map(|p| p.var).chain([WORKER_PORTS_VAR]) {
            assert!(VARIABLES.iter().any(|v| v.name == var), "{var}");
        }
    }

    #[test]
    fn set_ports_become_ray_start_flags_for_their_role() {
        let env = [
            ("ARGUS_ROLE", "worker"),
            ("ARGUS_RAY_NODE_MANAGER_PORT", "41000"),
            ("ARGUS_RAY_DASHBOARD_AGENT_LISTEN_PORT", "41001"),
            ("ARGUS_RAY_CLIENT_SERVER_PORT", "41002"),
            ("ARGUS_RAY_WORKER_PORTS", "41100-41199"),
        ];
        let c = cfg(&env).unwrap();
        assert_eq!(
            c.ray_ports.args(Role::Worker),
            [
                "--node-manager-port=41000",
                "--dashboard-agent-listen-port=41001",
                "--min-worker-port=41100",
                "--max-worker-port=41199"
            ]
        );
        assert!(c
            .ray_ports
            .args(Role::Head)
            .contains(&"--ray-client-server-port=41002".to_string()));
        // Unset ports with a fixed Ray default are checked at that default.
        let fixed = c.ray_ports.fixed(Role::Head, 6379, 8265);
        let ports: Vec<u16> = fixed.iter().map(|p| p.port).collect();
        assert_eq!(ports, [6379, 8265, 41000, 41001, 41002]);
        let c = cfg(&[("ARGUS_ROLE", "worker")]).unwrap();
        assert!(c.ray_ports.args(Role::Worker).is_empty());
        let fixed = c.ray_ports.fixed(Role::Worker, 6379, 8265);
        assert_eq!(fixed.len(), 1);
        assert_eq!(
            fixed,
            [FixedPort {
                var: "ARGUS_RAY_DASHBOARD_AGENT_LISTEN_PORT",
                port: 52365,
                ray_default: true,
                bind: Bind::NodeIpAndLoopback
            }]
        );
    }

    #[test]
    fn bad_port_settings_name_their_variable() {
        // (settings, the variable the error names, what it says)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (
                &[("ARGUS_RAY_NODE_MANAGER_PORT", "x")],
                "ARGUS_RAY_NODE_MANAGER_PORT",
                "not a port",
            ),
            (
                &[("ARGUS_RAY_OBJECT_MANAGER_PORT", "70000")],
                "ARGUS_RAY_OBJECT_MANAGER_PORT",
                "range",
            ),
            (
                &[("ARGUS_RAY_WORKER_PORTS", "100-200")],
                "ARGUS_RAY_WORKER_PORTS",
                "1024",
            ),
            (
                &[("ARGUS_RAY_WORKER_PORTS", "20000-10000")],
                "ARGUS_RAY_WORKER_PORTS",
                "below",
            ),
            (
                &[("ARGUS_RAY_WORKER_PORTS", "20000")],
                "ARGUS_RAY_WORKER_PORTS",
                "MIN-MAX",
            ),
            (
                &[("ARGUS_RAY_NODE_MANAGER_PORT", "6379")],
                "ARGUS_RAY_NODE_MANAGER_PORT",
                "ARGUS_RAY_PORT",
            ),
            (
                &[
                    ("ARGUS_RAY_METRICS_EXPORT_PORT", "41000"),
                    ("ARGUS_RAY_NODE_MANAGER_PORT", "41000"),
                ],
                "ARGUS_RAY_METRICS_EXPORT_PORT",
                "ARGUS_RAY_NODE_MANAGER_PORT",
            ),
            (
                &[
                    ("ARGUS_RAY_NODE_MANAGER_PORT", "41050"),
                    ("ARGUS_RAY_WORKER_PORTS", "41000-41099"),
                ],
                "ARGUS_RAY_NODE_MANAGER_PORT",
                "ARGUS_RAY_WORKER_PORTS",
            ),
            (
                &[
                    ("ARGUS_RAY_NODE_MANAGER_PORT", "41000"),
                    ("ARGUS_RAY_EXTRA_ARGS", "--node-manager-port=1"),
                ],
                "ARGUS_RAY_EXTRA_ARGS",
                "set by ARGUS_RAY_NODE_MANAGER_PORT",
            ),
            (
                &[
                    ("ARGUS_RAY_WORKER_PORTS", "41000-41099"),
                    ("ARGUS_RAY_EXTRA_ARGS", "--max-worker-port 3"),
                ],
                "ARGUS_RAY_EXTRA_ARGS",
                "set by ARGUS_RAY_WORKER_PORTS",
            ),
        ];
        for (pairs, var, says) in cases {
            let mut env = vec![("ARGUS_ROLE", "head")];
            env.extend_from_slice(pairs);
            let e = cfg(&env).expect_err("a bad port setting");
            assert_eq!(e.var, *var, "{pairs:?}: {e}");
            assert!(e.to_string().contains(says), "{pairs:?}: {e}");
        }
        // A worker binds no GCS or dashboard, and no client server.
        let ok = cfg(&[
            ("ARGUS_ROLE", "worker"),
            ("ARGUS_RAY_NODE_MANAGER_PORT", "6379"),
            ("ARGUS_RAY_CLIENT_SERVER_PORT", "6379"),
        ]);
        assert!(ok.is_ok(), "{ok:?}");
        // Without the variable, the flag in the extra args is the user's.
        let ok = cfg(&[
            ("ARGUS_ROLE", "worker"),
            ("ARGUS_RAY_EXTRA_ARGS", "--node-manager-port=1234"),
        ]);
        assert!(ok.is_ok(), "{ok:?}");
        // ... and so is its port: not checked at Ray's default.
        let c = cfg(&[
            ("ARGUS_ROLE", "worker"),
            ("ARGUS_RAY_EXTRA_ARGS", "--dashboard-agent-listen-port 4321"),
        ])
        .unwrap();
        assert!(c.ray_ports.fixed(Role::Worker, 1, 2).is_empty());
    }

    fn fp(port: u16, bind: Bind) -> Vec<FixedPort> {
        vec![FixedPort {
            var: "ARGUS_RAY_NODE_MANAGER_PORT",
            port,
            ray_default: false,
            bind,
        }]
    }

    fn port_of(l: &TcpListener) -> u16 {
        l.local_addr().unwrap().port()
    }

    #[test]
    fn two_checks_of_one_port_at_once_both_pass() {
        let free = port_of(&TcpListener::bind("127.0.0.1:0").unwrap());
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..200).all(|_| check_free(ip, &fp(free, Bind::All)).is_ok())
                })
            })
            .collect();
        for t in threads {
            assert!(
                t.join().unwrap(),
                "a concurrent check saw port {free} taken"
            );
        }
    }

    #[test]
    fn a_port_held_where_ray_binds_it_is_taken() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.9".parse().unwrap();
        // Held on the node IP.
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = check_free(ip, &fp(port_of(&held), Bind::NodeIp)).unwrap_err();
        assert_eq!(e.var, "ARGUS_RAY_NODE_MANAGER_PORT");
        let want = format!("port {} is already in use on 127.0.0.1", port_of(&held));
        assert!(e.to_string().contains(&want), "{e}");
        // Held on all addresses: taken on every node IP.
        let any = TcpListener::bind("0.0.0.0:0").unwrap();
        assert!(check_free(other, &fp(port_of(&any), Bind::NodeIp)).is_err());
        // Held on another address: free for a port Ray binds on the node IP
        // only, taken for one it binds on all addresses, or on 127.0.0.1 too.
        assert!(check_free(other, &fp(port_of(&held), Bind::NodeIp)).is_ok());
        let e = check_free(other, &fp(port_of(&held), Bind::All)).unwrap_err();
        assert!(e.reason.contains("Ray binds it on all addresses"), "{e}");
        let e = check_free(other, &fp(port_of(&held), Bind::NodeIpAndLoopback)).unwrap_err();
        assert!(e.reason.contains("in use on 127.0.0.1"), "{e}");
        let port = port_of(&held);
        drop((held, any));
        for bind in [Bind::All, Bind::NodeIp, Bind::NodeIpAndLoopback] {
            assert!(check_free(other, &fp(port, bind)).is_ok(), "{bind:?}");
        }
    }
}
