//! `argus-agent config [--json] [FLAGS]`: the effective configuration, each
//! value with where it came from (flag, environment or default), checked
//! exactly as `run` checks it; exit 78 on a bad value.

use argus_config::{lookup_var, Setting};

use super::flags::Flags;
use super::Outcome;

#[derive(serde::Serialize)]
struct Report<'a> {
    variables: &'a [Setting],
    warnings: &'a [String],
}

/// Prints the effective configuration; 0 when it is valid.
pub fn run(flags: &Flags, json: bool) -> Outcome {
    let (cfg, warnings) = super::run::load(flags)?;
    if json {
        let report = Report {
            variables: &cfg.settings,
            warnings: &warnings,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let width = cfg.settings.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in &cfg.settings {
        let value = match s.value.as_deref() {
            Some("") => "\"\"".to_string(),
            Some(v) => v.to_string(),
            None => format!("unset {}", lookup_var(s.name).default),
        };
        println!("{:width$}  {value}  ({})", s.name, s.source);
    }
    for w in &warnings {
        eprintln!("argus-agent: warning: {w}");
    }
    Ok(0)
}
