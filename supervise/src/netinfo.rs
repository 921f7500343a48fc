//! Node IP detection (R-IP-1) without sending any packet: the override,
//! then the default-route interface's address, then hostname resolution,
//! then the first non-loopback interface address.

use std::net::{IpAddr, ToSocketAddrs};

use serde::Serialize;

/// How the node IP was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "strategy", rename_all = "snake_case")]
pub enum IpSource {
    /// ARGUS_NODE_IP.
    Override,
    /// The IPv4 address of the interface holding the default route.
    DefaultRoute { iface: String },
    /// The host name resolved to a non-loopback address.
    Hostname { name: String },
    /// The first non-loopback address of an interface that is up.
    FirstInterface { iface: String },
    /// ARGUS_NODE_IP names a network: this node's address in it.
    Network { net: String, iface: String },
}

impl std::fmt::Display for IpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IpSource::Override => write!(f, "ARGUS_NODE_IP"),
            IpSource::DefaultRoute { iface } => write!(f, "default route via {iface}"),
            IpSource::Hostname { name } => write!(f, "hostname {name}"),
            IpSource::FirstInterface { iface } => write!(f, "first interface {iface}"),
            IpSource::Network { net, iface } => write!(f, "ARGUS_NODE_IP network {net} on {iface}"),
        }
    }
}

/// No strategy found an address.
#[derive(Debug, thiserror::Error)]
#[error("cannot determine the node IP (tried: {tried}); set ARGUS_NODE_IP")]
pub struct NoNodeIp {
    pub tried: String,
}

/// Returns the name of the interface holding the IPv4 default route in the
/// text of `/proc/net/route`.
pub fn default_route_iface(proc_net_route: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    proc_net_route.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            return None;
        }
        let dest = u32::from_str_radix(f[1], 16).ok()?;
        let flags = u32::from_str_radix(f[3], 16).ok()?;
        let mask = u32::from_str_radix(f[7], 16).ok()?;
        (dest == 0 && mask == 0 && flags & RTF_UP != 0).then(|| f[0].to_string())
    })
}

fn usable(ip: &IpAddr) -> bool {
    !ip.is_loopback()
        && !ip.is_unspecified()
        && !ip.is_multicast()
        && !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// Interface addresses: (name, address, up).
fn interfaces() -> Vec<(String, IpAddr, bool)> {
    use nix::net::if_::InterfaceFlags;
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let sa = a.address?;
            let ip = if let Some(v4) = sa.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(sa.as_sockaddr_in6()?.ip())
            };
            let up = a.flags.contains(InterfaceFlags::IFF_UP);
            Some((a.interface_name, ip, up))
        })
        .collect()
}

/// Returns true if and only if `ip` is an address of this node: a loopback
/// address (all of 127.0.0.0/8 is local on Linux) or one an interface holds.
pub fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || interfaces().iter().any(|(_, a, _)| *a == ip)
}

/// A network, `address/prefix` (`ARGUS_NODE_IP=10.1.0.0/16`): the node's
/// address is the one of its interfaces in it, so one setting serves every
/// host of a cluster network (a platform's one command line) on hosts with
/// several interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Network {
    /// Parses `address/prefix`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, p) = s
            .trim()
            .split_once('/')
            .ok_or("a network is address/prefix, e.g. 10.1.0.0/16")?;
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|n| *n <= max)
            .ok_or(format!("prefix {p:?} is not 0-{max}"))?;
        Ok(Self { addr, prefix })
    }

    /// Returns true if and only if `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        fn bits(ip: IpAddr) -> (u128, u32) {
            match ip {
                IpAddr::V4(v) => (u32::from(v) as u128, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        }
        let ((a, width), (b, w2)) = (bits(self.addr), bits(ip));
        if width != w2 {
            return false;
        }
        let shift = width - self.prefix as u32;
        shift >= width || (a >> shift) == (b >> shift)
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Chooses the node IP in `net`: the address of an interface that is up
/// (the lowest, when several are in it).
pub fn detect_in(net: Network) -> Result<(IpAddr, IpSource), NoNodeIp> {
    let mut found: Vec<(String, IpAddr)> = interfaces()
        .into_iter()
        .filter(|(_, ip, up)| *up && net.contains(*ip))
        .map(|(n, ip, _)| (n, ip))
        .collect();
    found.sort_by_key(|(_, ip)| *ip);
    match found.into_iter().next() {
        Some((iface, ip)) => Ok((
            ip,
            IpSource::Network {
                net: net.to_string(),
                iface,
            },
        )),
        None => Err(NoNodeIp {
            tried: format!(
                "ARGUS_NODE_IP={net}: no interface of this host that is up has an address in it"
            ),
        }),
    }
}

/// Chooses the node IP and says how.
pub fn detect(override_ip: Option<IpAddr>) -> Result<(IpAddr, IpSource), NoNodeIp> {
    if let Some(ip) = override_ip {
        return Ok((ip, IpSource::Override));
    }
    let ifaces = interfaces();
    let mut tried = Vec::new();
    match std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| default_route_iface(&t))
    {
        Some(iface) => {
            let found = ifaces
                .iter()
                .find(|(n, ip, _)| n == &iface && ip.is_ipv4() && usable(ip));
            if let Some((_, ip, _)) = found {
                return Ok((*ip, IpSource::DefaultRoute { iface }));
            }
            tried.push(format!("default route via {iface} has no address"));
        }
        None => tried.push("no IPv4 default route".into()),
    }
    if let Ok(name) = hostname::get() {
        let name = name.to_string_lossy().into_owned();
        let resolved = (name.as_str(), 0)
            .to_socket_addrs()
            .map(|it| it.map(|sa| sa.ip()).filter(usable).collect::<Vec<_>>())
            .unwrap_or_default();
        if let Some(ip) = resolved.iter().find(|ip| ip.is_ipv4()).or(resolved.first()) {
            return Ok((*ip, IpSource::Hostname { name }));
        }
        tried.push(format!("hostname {name} resolves to no usable address"));
    }
    let first = ifaces
        .iter()
        .filter(|(_, ip, up)| *up && usable(ip))
        .min_by_key(|(_, ip, _)| !ip.is_ipv4());
    if let Some((iface, ip, _)) = first {
        return Ok((
            *ip,
            IpSource::FirstInterface {
                iface: iface.clone(),
            },
        ));
    }
    tried.push("no interface has a non-loopback address".into());
    Err(NoNodeIp {
        tried: tried.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route_is_found_in_proc_net_route() {
        let text =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
eth0\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_iface(text).as_deref(), Some("eth0"));
        let down = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
eth0\t00000000\t010011AC\t0002\t0\t0\t0\t00000000\n";
        assert_eq!(default_route_iface(down), None);
        assert_eq!(default_route_iface(""), None);
        assert_eq!(default_route_iface("garbage\nzz yy"), None);
    }

    #[test]
    fn a_network_picks_this_nodes_address_in_it() {
        let n = Network::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.200.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        assert!(Network::parse("0.0.0.0/0")
            .unwrap()
            .contains("192.0.2.1".parse().unwrap()));
        assert!(Network::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        for bad in ["10.1.0.0", "10.1.0.0/33", "x/8", "10.1.0.0/-1", "::/129"] {
            assert!(Network::parse(bad).is_err(), "{bad}");
        }
        let (ip, how) = detect_in(Network::parse("127.0.0.0/8").unwrap()).unwrap();
        assert_eq!(ip.to_string(), "127.0.0.1");
        assert!(how.to_string().contains("127.0.0.0/8 on lo"), "{how}");
        let e = detect_in(Network::parse("203.0.113.0/24").unwrap()).unwrap_err();
        assert!(e.to_string().contains("203.0.113.0/24"), "{e}");
    }

    #[test]
    fn override_wins() {
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        assert_eq!(detect(Some(ip)).unwrap(), (ip, IpSource::Override));
    }

    #[test]
    fn loopback_and_interface_addresses_are_local_others_not() {
        assert!(is_local("127.0.0.1".parse().unwrap()));
        assert!(is_local("127.0.5.9".parse().unwrap()));
        let (ip, _) = detect(None).expect("this machine has a network");
        assert!(is_local(ip), "{ip}");
        // TEST-NET-3 (RFC 5737): never assigned to a real interface.
        assert!(!is_local("203.0.113.77".parse().unwrap()));
    }

    #[test]
    fn detection_finds_a_usable_address_here() {
        let (ip, how) = detect(None).expect("this machine has a network");
        assert!(usable(&ip), "{ip} via {how}");
    }
}
