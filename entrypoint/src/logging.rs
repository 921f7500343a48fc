//! Logging (R-OPS-2): human text by default or JSON, always to stderr and,
//! when the folder can be created, to a file in ARGUS_LOG_DIR.

use std::path::Path;

use argus::config::LogFormat;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

/// Installs the global subscriber. Returns a warning to log when the log
/// file cannot be opened (stderr logging goes on).
pub fn init(format: LogFormat, level: &str, log_dir: Option<(&Path, &str)>) -> Option<String> {
    let filter = || EnvFilter::new(level);
    let stderr = match format {
        LogFormat::Text => fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_target(false)
            .with_filter(filter())
            .boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter())
            .boxed(),
    };
    let mut warning = None;
    let file = log_dir.and_then(|(dir, name)| {
        if let Err(e) = std::fs::create_dir_all(dir) {
            warning = Some(format!(
                "cannot create log folder {}: {e}; logging to stderr only",
                dir.display()
            ));
            return None;
        }
        match tracing_appender::rolling::RollingFileAppender::builder()
            .filename_prefix(name)
            .build(dir)
        {
            Ok(appender) => Some(match format {
                LogFormat::Text => fmt::layer()
                    .with_writer(appender)
                    .with_ansi(false)
                    .with_target(false)
                    .with_filter(filter())
                    .boxed(),
                LogFormat::Json => fmt::layer()
                    .json()
                    .with_writer(appender)
                    .with_filter(filter())
                    .boxed(),
            }),
            Err(e) => {
                warning = Some(format!(
                    "cannot open log file in {}: {e}; logging to stderr only",
                    dir.display()
                ));
                None
            }
        }
    });
    tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .init();
    warning
}
