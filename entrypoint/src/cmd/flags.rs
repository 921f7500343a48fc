//! The flags of `run` and `config`: one per configuration variable, made
//! from `argus_config::VARIABLES` (so `--help` and the parser cannot drift
//! from the table). A flag wins over the variable of the environment.

use std::collections::BTreeMap;
use std::ffi::OsString;

use argus_config::VARIABLES;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};

/// The configuration given on the command line: variable name -> value.
#[derive(Debug, Clone, Default)]
pub struct Flags(pub BTreeMap<&'static str, OsString>);

impl FromArgMatches for Flags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut f = Self::default();
        f.update_from_arg_matches(m)?;
        Ok(f)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for v in VARIABLES {
            if let Some(value) = m.get_one::<OsString>(v.name) {
                self.0.insert(v.name, value.clone());
            }
        }
        Ok(())
    }
}

impl Args for Flags {
    fn augment_args(mut cmd: Command) -> Command {
        for v in VARIABLES {
            cmd = cmd.arg(
                Arg::new(v.name)
                    .long(v.flag())
                    .value_name(v.kind.value_name())
                    .value_parser(clap::value_parser!(OsString))
                    .help(v.help_line())
                    .help_heading(v.group.title()),
            );
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}
