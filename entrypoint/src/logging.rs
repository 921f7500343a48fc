//! Logging (R-OPS-2): human text by default or JSON, always to stderr and,
//! when the folder can be created, to a file in ARGUS_LOG_DIR that rotates
//! daily (the last 7 days are kept).

use std::path::Path;

use argus::config::LogFormat;
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
/// `<name>.<YYYY-MM-DD>`; older ones are deleted at rotation), so that a
/// node's share of the shared folder stays bounded.
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

/// Installs the global subscriber. Returns a warning to log when the log
/// file cannot be opened (stderr logging goes on). Call [`flush`] before
/// exiting.
///
/// The log folder is usually on the shared storage: the file is written by
/// its own thread through a bounded, lossy queue, so a hung NFS mount drops
/// file lines instead of blocking every thread that logs (the event loop
/// included). Stderr stays synchronous.
pub fn init(format: LogFormat, level: &str, log_dir: Option<(&Path, &str)>) -> Option<String> {
    let mut warning = None;
    let file = log_dir.and_then(|(dir, name)| {
        let appender = std::fs::create_dir_all(dir).and_then(|_| {
            tracing_appender::rolling::RollingFileAppender::builder()
                .rotation(tracing_appender::rolling::Rotation::DAILY)
                .max_log_files(LOG_FILES_KEPT)
                .filename_prefix(name)
                .build(dir)
                .map_err(std::io::Error::other)
        });
        match appender {
            Ok(a) => {
                let (writer, g) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                    .lossy(true)
                    .buffered_lines_limit(LOG_QUEUE_LINES)
                    .thread_name("log-file")
                    .finish(a);
                *FILE_GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
                Some(layer(format, level, writer))
            }
            Err(e) => {
                warning = Some(format!(
                    "cannot open a log file in {}: {e}; logging to stderr only",
                    dir.display()
                ));
                None
            }
        }
    });
    let mut layers = vec![layer(format, level, std::io::stderr)];
    layers.extend(file);
    tracing_subscriber::registry().with(layers).init();
    warning
}

/// Installs the shim's subscriber: stderr only, no time (Ray's log lines
/// carry their own), at the filter in `ARGUS_SHIM_LOG` (default `warn`).
pub fn init_shim() {
    let filter = std::env::var(argus::shim::LOG_ENV).unwrap_or_else(|_| "warn".into());
    let _ = fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .try_init();
}
