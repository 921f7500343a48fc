//! Scenarios: several checks of the suite on one cluster, each a named phase
//! that passes or fails on its own (docs/testing.md, "Scenarios").
//!
//! A cluster costs minutes to bring up and tear down on the 2-core machine
//! CI runs on; checks that need the same shape of cluster share one. The
//! scenario brings its cluster up when its first phase needs it and runs the
//! phases in the order they were planned. Between two phases a health gate
//! (the caller's: e.g. three nodes alive, no application and no engine
//! container left) decides whether the next phase may have the cluster as it
//! is; a cluster that fails the gate, or whose phase failed and left it
//! unfit, is torn down and a new one brought up, so one failure does not
//! fail the phases after it.
//!
//! Each phase's result is logged, and when `ARGUS_PHASE_DIR` is set
//! (scripts/test sets it) written to `<dir>/<binary>.<scenario>.tsv`:
//! a `plan` line per phase first, then a `pass` or `fail` line per phase run
//! (tab-separated: result, phase, seconds, the failure's first line).
//! scripts/test-report.py counts each planned phase once, as a test, and
//! names a failed one (or one the scenario never reached) with its first
//! failure line. The scenario's own test fails when any phase failed.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, Once};
use std::time::Instant;

/// Where the last panic was raised ("file:line:col"), for the first line of
/// a failed phase.
static LAST_PANIC_AT: Mutex<Option<String>> = Mutex::new(None);

fn record_panic_locations() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(at) = info.location() {
                *LAST_PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(format!("{}:{}:{}", at.file(), at.line(), at.column()));
            }
            previous(info);
        }));
    });
}

/// The first line of a panic's message, and where it was raised.
fn failure_line(payload: &(dyn std::any::Any + Send)) -> String {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("panicked (no message)");
    let first = msg.lines().find(|l| !l.trim().is_empty()).unwrap_or(msg);
    let first: String = first.chars().take(400).collect();
    match LAST_PANIC_AT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        Some(at) => format!("{} ({at})", first.trim()),
        None => first.trim().to_string(),
    }
}

fn log(msg: &str) {
    eprintln!("[scenario] {msg}");
}

type Make<C> = Box<dyn Fn() -> C>;
type Gate<C> = Box<dyn Fn(&C) -> Result<(), String>>;

/// One cluster, many phases. `C` is the cluster (torn down on drop).
pub struct Scenario<C> {
    name: String,
    plan: Vec<String>,
    next: usize,
    make: Make<C>,
    gate: Gate<C>,
    cluster: Option<C>,
    /// A phase has run on `cluster` since it was brought up or last gated.
    used: bool,
    failed: Vec<String>,
    file: Option<PathBuf>,
}

impl<C> Scenario<C> {
    /// A scenario `name` (its test function's name) of the test binary
    /// `binary`, with its phases in order. `make` brings a cluster up (a
    /// panic in it fails the phase that needed it); `gate` says whether a
    /// used cluster may serve the next phase (it may wait, with a bound).
    pub fn new(
        binary: &str,
        name: &str,
        plan: &[&str],
        make: impl Fn() -> C + 'static,
        gate: impl Fn(&C) -> Result<(), String> + 'static,
    ) -> Scenario<C> {
        record_panic_locations();
        let file = std::env::var_os("ARGUS_PHASE_DIR").map(|d| {
            let d = PathBuf::from(d);
            std::fs::create_dir_all(&d).expect("ARGUS_PHASE_DIR cannot be created");
            d.join(format!("{binary}.{name}.tsv"))
        });
        let s = Scenario {
            name: name.to_string(),
            plan: plan.iter().map(|p| p.to_string()).collect(),
            next: 0,
            make: Box::new(make),
            gate: Box::new(gate),
            cluster: None,
            used: false,
            failed: Vec::new(),
            file,
        };
        if let Some(f) = &s.file {
            let lines: String = s.plan.iter().map(|p| format!("plan\t{p}\n")).collect();
            std::fs::write(f, lines).expect("the scenario's phase file");
        }
        log(&format!("{}: phases {}", s.name, s.plan.join(", ")));
        s
    }

    fn write(&self, line: &str) {
        if let Some(f) = &self.file {
            let mut out = std::fs::OpenOptions::new()
                .append(true)
                .open(f)
                .expect("the scenario's phase file");
            writeln!(out, "{line}").expect("the scenario's phase file");
        }
    }

    /// A cluster fit for the next phase: the one there if it passes the
    /// gate, else a new one.
    fn cluster(&mut self) -> Result<&C, String> {
        if self.used {
            let c = self.cluster.as_ref().expect("a used cluster");
            let t = Instant::now();
            match catch_unwind(AssertUnwindSafe(|| (self.gate)(c))) {
                Ok(Ok(())) => {
                    log(&format!(
                        "{}: health gate passed in {:.1} s",
                        self.name,
                        t.elapsed().as_secs_f64()
                    ));
                }
                Ok(Err(why)) => {
                    log(&format!(
                        "{}: health gate failed: {why}; a new cluster",
                        self.name
                    ));
                    self.cluster = None;
                }
                Err(p) => {
                    log(&format!(
                        "{}: health gate failed: {}; a new cluster",
                        self.name,
                        failure_line(&*p)
                    ));
                    self.cluster = None;
                }
            }
            self.used = false;
        }
        if self.cluster.is_none() {
            let t = Instant::now();
            let c = catch_unwind(AssertUnwindSafe(|| (self.make)()))
                .map_err(|p| format!("the cluster did not come up: {}", failure_line(&*p)))?;
            log(&format!(
                "{}: cluster up in {:.1} s",
                self.name,
                t.elapsed().as_secs_f64()
            ));
            self.cluster = Some(c);
        }
        Ok(self.cluster.as_ref().expect("a cluster"))
    }

    /// Runs the next planned phase, `name`, on the cluster; its failure
    /// (a panic) is recorded and the scenario goes on.
    pub fn phase(&mut self, name: &str, f: impl FnOnce(&C)) {
        assert_eq!(
            self.plan.get(self.next).map(String::as_str),
            Some(name),
            "scenario {}: phase {name} is not the next planned one",
            self.name
        );
        self.next += 1;
        log(&format!("{}: phase {name} begins", self.name));
        let t = Instant::now();
        let result = match self.cluster() {
            Err(e) => Err(e),
            Ok(c) => catch_unwind(AssertUnwindSafe(|| f(c))).map_err(|p| failure_line(&*p)),
        };
        self.used = self.cluster.is_some();
        let secs = t.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                log(&format!(
                    "{}: phase {name} PASSED in {secs:.1} s",
                    self.name
                ));
                self.write(&format!("pass\t{name}\t{secs:.1}"));
            }
            Err(line) => {
                log(&format!(
                    "{}: phase {name} FAILED in {secs:.1} s: {line}",
                    self.name
                ));
                let line = line.replace(['\t', '\n'], " ");
                self.write(&format!("fail\t{name}\t{secs:.1}\t{line}"));
                self.failed.push(format!("{name}: {line}"));
            }
        }
    }

    /// Ends the scenario: tears the cluster down, and fails the test when a
    /// phase failed (naming each) or a planned phase never ran.
    pub fn finish(mut self) {
        self.cluster = None;
        let missing: Vec<&String> = self.plan[self.next..].iter().collect();
        assert!(
            missing.is_empty(),
            "scenario {}: planned phases not run: {missing:?}",
            self.name
        );
        assert!(
            self.failed.is_empty(),
            "scenario {}: {} of {} phases failed: {}",
            self.name,
            self.failed.len(),
            self.plan.len(),
            self.failed.join(" | ")
        );
    }
}
