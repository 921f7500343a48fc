//! Where the Docker daemon listens (`DOCKER_HOST`), parsed in one place:
//! the agent's checks of the socket, the handler that opens it, the policy
//! that refuses binds of it and the connection all read it through
//! [`DockerHost`], so they cannot disagree on what the value means.

/// The daemon's address when `DOCKER_HOST` is unset or empty.
pub const DEFAULT: &str = "unix:///var/run/docker.sock";

/// The daemon's address, as `DOCKER_HOST` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerHost {
    address: String,
}

impl DockerHost {
    /// Parses the value of `DOCKER_HOST`: unset or empty is [`DEFAULT`].
    pub fn parse(value: Option<&str>) -> DockerHost {
        DockerHost {
            address: value
                .filter(|v| !v.is_empty())
                .unwrap_or(DEFAULT)
                .to_string(),
        }
    }

    /// Returns the address (`unix:///…`, `tcp://…`, …).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Returns the unix socket's path: `unix://PATH`, or an absolute path
    /// (as the Docker CLI takes it); None for another scheme.
    pub fn socket_path(&self) -> Option<&str> {
        self.address.strip_prefix("unix://").or_else(|| {
            self.address
                .starts_with('/')
                .then_some(self.address.as_str())
        })
    }
}

impl std::fmt::Display for DockerHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_is_the_default_socket_and_paths_are_unix_sockets() {
        for v in [None, Some("")] {
            let h = DockerHost::parse(v);
            assert_eq!(h.address(), DEFAULT);
            assert_eq!(h.socket_path(), Some("/var/run/docker.sock"));
        }
        let h = DockerHost::parse(Some("unix:///run/argus-docker/docker.sock"));
        assert_eq!(h.socket_path(), Some("/run/argus-docker/docker.sock"));
        assert_eq!(
            DockerHost::parse(Some("/d.sock")).socket_path(),
            Some("/d.sock")
        );
        for other in ["tcp://127.0.0.1:2375", "ssh://h", "d.sock", "unix:/x"] {
            assert_eq!(
                DockerHost::parse(Some(other)).socket_path(),
                None,
                "{other}"
            );
        }
    }
}
