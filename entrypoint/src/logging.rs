//! Logging (R-OPS-2): human text by default or JSON, always to stderr and,
//! when the folder can be created, to a file in ARGUS_LOG_DIR that rotates
//! daily (the last 7 days are kept).
//!
//! R-SEC-2: the log folder is opened once, at start, through trusted
//! components ([`argus_discovery::trust`]); a folder on the way that
//! another user could change refuses the start (exit 78). The files are
//! then opened and removed relative to that folder's descriptor, never
//! through a link, at start and at each daily rotation. When the folder
//! belongs to the agent's writer identity (an opt-in copy on shared
//! storage), the writer thread writes as that identity, never as root.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use argus_discovery::trust;

use argus_config::LogFormat;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer, Registry};

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Returns a formatting layer writing to `writer` in `format`.
fn layer<W>(format: LogFormat, level: &str, writer: W) -> BoxedLayer
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let base = fmt::layer().with_writer(writer).with_ansi(false);
    // The level applies to the agent's own crates; libraries (bollard,
    // hyper, notify) only say warnings and errors.
    let filter = || {
        EnvFilter::new(format!(
            "warn,argus={level},argus_agent={level},argus_discovery={level}"
        ))
    };
    match format {
        LogFormat::Text => base.with_target(false).with_filter(filter()).boxed(),
        LogFormat::Json => base.json().with_filter(filter()).boxed(),
    }
}

/// Days of log files each node keeps in ARGUS_LOG_DIR (one file a day,
/// `<name>.<YYYY-MM-DD>`, UTC; older ones are deleted at rotation), so that
/// the folder stays bounded.
const LOG_FILES_KEPT: usize = 7;

/// Lines the log file's queue holds before dropping. The queue's slots are
/// allocated and touched up front: tracing-appender's default (128,000)
/// costs about 4 MB of private memory per agent, more than all the rest.
const LOG_QUEUE_LINES: usize = 1024;

/// The log file's writer thread, kept until [`flush`].
static FILE_GUARD: std::sync::Mutex<Option<tracing_appender::non_blocking::WorkerGuard>> =
    std::sync::Mutex::new(None);

/// Flushes the log file before exit: what is queued is written (bounded:
/// tracing-appender gives up after about a second on a hung mount).
pub fn flush() {
    let guard = FILE_GUARD.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(guard);
}

/// A log folder that breaks the trusted-path rule (exit 78).
#[derive(Debug, thiserror::Error)]
#[error("ARGUS_LOG_DIR: {0}")]
pub struct UntrustedLogDir(pub trust::TrustError);

/// A daily-rotating log file in a verified folder (see the module doc).
struct TrustedRolling {
    dir: OwnedFd,
    prefix: String,
    /// The identity the writer thread takes (the folder's owner).
    identity: Option<trust::Identity>,
    switched: bool,
    current: Option<(String, std::fs::File)>,
}

impl TrustedRolling {
    fn today() -> String {
        let s = argus_discovery::record::rfc3339(std::time::SystemTime::now());
        s.get(..10).unwrap_or("1970-01-01").to_string()
    }

    /// The open file for today, opening it (and pruning old days) when
    /// the day changed.
    fn file(&mut self) -> std::io::Result<&mut std::fs::File> {
        if !self.switched {
            if let Some(id) = self.identity {
                trust::become_identity(id)?;
            }
            self.switched = true;
        }
        let day = Self::today();
        if self.current.as_ref().map(|(d, _)| d) != Some(&day) {
            self.current = None;
            let name = OsString::from(format!("{}.{day}", self.prefix));
            let uid = self
                .identity
                .map_or_else(|| trust::Identity::current().uid, |i| i.uid);
            let f = trust::open_append(self.dir.as_raw_fd(), &name, uid)?;
            self.prune();
            self.current = Some((day, f));
        }
        Ok(&mut self.current.as_mut().expect("just set").1)
    }

    /// Keeps the newest [`LOG_FILES_KEPT`] files of this prefix.
    fn prune(&self) {
        let fd = self.dir.as_raw_fd();
        let Ok(names) = trust::list(fd) else { return };
        let start = format!("{}.", self.prefix);
        let mut ours: Vec<OsString> = names
            .into_iter()
            .filter(|n| n.to_string_lossy().starts_with(&start))
            .filter(|n| trust::is_regular_at(fd, n))
            .collect();
        ours.sort();
        let extra = ours.len().saturating_sub(LOG_FILES_KEPT);
        for n in &ours[..extra] {
            let _ = trust::unlink_at(fd, OsStr::new(n));
        }
    }
}

impl Write for TrustedRolling {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file()?.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.current {
            Some((_, f)) => f.flush(),
            None => Ok(()),
        }
    }
}

/// Installs the global subscriber. Returns a warning to log when the log
/// file cannot be opened (stderr logging goes on), or an error when the
/// log folder breaks the trusted-path rule (nothing is written then).
/// Call [`flush`] before exiting.
///
/// The file is written by its own thread through a bounded, lossy queue,
/// so a hung mount (an opt-in folder on shared storage) drops file lines
/// instead of blocking every thread that logs (the event loop included).
/// Stderr stays synchronous.
pub fn init(
    format: LogFormat,
    level: &str,
    log_dir: Option<(&Path, &str)>,
) -> Result<Option<String>, UntrustedLogDir> {
    let mut warning = None;
    let mut file = None;
    if let Some((dir, name)) = log_dir {
        match trust::open_dir(dir, true) {
            Ok(fd) => {
                let agent = trust::agent();
                let identity = match trust::owner(fd.as_raw_fd()) {
                    Ok(uid) if uid == agent.uid && uid != trust::Identity::current().uid => {
                        Some(agent)
                    }
                    _ => None,
                };
                let writer = TrustedRolling {
                    dir: fd,
                    prefix: name.to_string(),
                    identity,
                    switched: false,
                    current: None,
                };
                let (writer, g) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                    .lossy(true)
                    .buffered_lines_limit(LOG_QUEUE_LINES)
                    .thread_name("log-file")
                    .finish(writer);
                *FILE_GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
                file = Some(layer(format, level, writer));
            }
            Err(e) if e.is_breach() => return Err(UntrustedLogDir(e)),
            Err(e) => {
                warning = Some(format!(
                    "cannot open a log file in {}: {e}; logging to stderr only",
                    dir.display()
                ))
            }
        }
    }
    let mut layers = vec![layer(format, level, std::io::stderr)];
    layers.extend(file);
    tracing_subscriber::registry().with(layers).init();
    Ok(warning)
}

/// Installs the shim's subscriber: stderr only, no time (Ray's log lines
/// carry their own), at the node's filter in `ARGUS_SHIM_LOG` (default
/// `warn`; under an agent this process's environment holds the node's
/// settings, never the caller's). Libraries stay at warnings and errors
/// whatever the filter says: bollard logs each decoded Docker answer at
/// debug, and Docker's answers are never logged (R-SEC-8).
pub fn init_shim() {
    let filter = std::env::var(argus_podman::LOG_ENV).unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::registry()
        .with(shim_layer(&filter, std::io::stderr))
        .try_init();
}

/// The shim's formatting layer at `filter`, libraries capped at warn.
fn shim_layer<W>(filter: &str, writer: W) -> BoxedLayer
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::filter::FilterExt;
    fmt::layer()
        .with_writer(writer)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .with_filter(EnvFilter::new(filter).and(EnvFilter::new(OWN_CRATES_ONLY)))
        .boxed()
}

/// Every level for the project's own crates (their targets all start with
/// `argus`), warnings and errors for every other.
const OWN_CRATES_ONLY: &str = "warn,argus=trace";

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the shim's layer at `filter` writes of one debug event of
    /// bollard (a decoded Docker answer) and one of the shim.
    fn shim_logs_at(filter: &str) -> String {
        let buf = Buffer::default();
        let out = buf.clone();
        let subscriber =
            tracing_subscriber::registry().with(shim_layer(filter, move || out.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "bollard::docker", "Decoded type: ANSWER_SECRET");
            tracing::trace!(target: "hyper_util::client", "ANSWER_SECRET read");
            tracing::debug!(target: "argus_podman::docker", "found own container");
            tracing::warn!(target: "bollard::docker", "a library warning");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn the_shims_filter_never_lets_a_library_below_warn() {
        for filter in [
            "debug",
            "trace",
            "bollard=trace",
            "trace,bollard=trace,hyper_util=trace",
        ] {
            let text = shim_logs_at(filter);
            assert!(!text.contains("ANSWER_SECRET"), "{filter}: {text}");
            assert!(text.contains("a library warning"), "{filter}: {text}");
        }
        // Control: the filter does reach the shim's own crates.
        assert!(shim_logs_at("debug").contains("found own container"));
        assert!(!shim_logs_at("warn").contains("found own container"));
    }
}
