#!/usr/bin/env python3
"""The end of `scripts/test`: where the time went, every failed test with its
first failure line and the path of its full log, then the summary line.

CI keeps only the tail of the output, so the order is fixed: the timeline and
the slowest tests first, the failures next, the summary line last; the
failures and the summary fit in the last 40 lines whatever the logs above
them held (more than MAX_LISTED failures are listed in a file instead).

Inputs: nextest's JUnit report (every test of the workspace but doctests, with
the output of each failed one), the phase files of the scenarios
(tests/support/scenario.rs: a test that runs several checks on one cluster,
each a named phase counted here as a test of its own), the log of `cargo test --doc` (libtest's
`test result:` lines), the timeline marks of scripts/test (one per line,
"<seconds since start>\t<what>"), and optionally vmstat's log of the run.
Writes each failed test's whole output to <logs>/<binary>/<test>.log.

Exit status: 0 when every test passed and fmt and clippy were ok, 1 otherwise.
"""

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

MAX_LISTED = 12
# libtest: "thread 'name' (tid) panicked at tests/x.rs:12:5:" then the
# message (Rust 1.89 and later print the thread id; earlier ones do not).
PANIC = re.compile(r"^thread '.*'(?: \(\d+\))? panicked at (.+):$")
# Before Rust 1.73, the message on the same line.
PANIC_INLINE = re.compile(r"^thread '.*'(?: \(\d+\))? panicked at '(.*)', (\S+)$")


def first_failure_line(text, fallback):
    """Returns the assertion or error that failed a test: the first panic's
    message (its first line) and where it was raised; `fallback` (nextest's
    own reason: a timeout, a signal) when the output has no panic."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = PANIC.match(line)
        if m:
            msg = next((l.strip() for l in lines[i + 1:] if l.strip()), "")
            return f"{msg} ({m.group(1)})" if msg else f"panicked at {m.group(1)}"
        m = PANIC_INLINE.match(line)
        if m:
            return f"{m.group(1)} ({m.group(2)})"
    for line in lines:
        if re.match(r"^(error|Error)[:\[]", line.strip()):
            return line.strip()
    return fallback


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "test"


def read_phases(path):
    """The phases of the scenarios: {(binary, scenario): [(phase, result,
    first line)]}, one entry per planned phase in order; result is "pass",
    "fail" or None (planned, never run)."""
    scenarios = {}
    if not path or not os.path.isdir(path):
        return scenarios
    for entry in sorted(os.listdir(path)):
        if not entry.endswith(".tsv") or "." not in entry[:-4]:
            continue
        binary, _, scenario = entry[:-4].partition(".")
        phases, order = {}, []
        for line in open(os.path.join(path, entry), errors="replace"):
            f = line.rstrip("\n").split("\t")
            if f[0] == "plan" and len(f) >= 2:
                order.append(f[1])
                phases[f[1]] = (None, "")
            elif f[0] in ("pass", "fail") and len(f) >= 2:
                if f[1] not in phases:
                    order.append(f[1])
                phases[f[1]] = (f[0], f[3] if len(f) > 3 else "")
        scenarios[(binary, scenario)] = [(p, *phases[p]) for p in order]
    return scenarios


def read_junit(path, logs, scenarios=None):
    """Returns (passed, failed tests, timings): failed tests are
    (binary, test, first line, log path); timings (seconds, binary, test).
    A scenario's test counts as its phases (`scenarios`, read_phases): each
    passed phase a pass, each failed or never-run phase a failure named
    "<scenario>::<phase>"; the test itself fails on its own only when it
    failed with every phase passed."""
    scenarios = scenarios or {}
    passed, failed, timings = 0, [], []
    if not os.path.exists(path):
        return passed, failed, timings
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        binary = case.get("classname", "?")
        binary = binary.split("::", 1)[1] if "::" in binary else binary
        name = case.get("name", "?")
        timings.append((float(case.get("time") or 0), binary, name))
        fail = case.find("failure")
        if fail is None:
            fail = case.find("error")
        phases = scenarios.get((binary, name))
        if phases and case.find("skipped") is None:
            passed += sum(1 for _, result, _ in phases if result == "pass")
        if fail is None:
            if case.find("skipped") is None and not phases:
                passed += 1
            continue
        out = case.findtext("system-out") or ""
        err = case.findtext("system-err") or ""
        text = (fail.text or "") + "\n" + out + "\n" + err
        log = os.path.join(logs, safe(binary), safe(name) + ".log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            f.write(f"# {binary} {name}: {fail.get('message', '')}\n")
            f.write("# --- stdout\n" + out + "\n# --- stderr\n" + err + "\n")
            if fail.text:
                f.write("# --- nextest's failure description\n" + fail.text + "\n")
        reason = fail.get("message") or fail.get("type") or "failed"
        first = first_failure_line(out + "\n" + err, reason)
        bad = [(p, r, line) for p, r, line in (phases or []) if r != "pass"]
        if not bad:
            failed.append((binary, name, first, log))
        for phase, result, line in bad:
            if result is None:
                line = f"not run: the scenario ended before this phase ({first})"
            failed.append((binary, f"{name}::{phase}", line, log))
    return passed, failed, timings


def read_libtest(path, logs):
    """Counts of a libtest log (`cargo test --doc`): (passed, failed tests,
    ignored); a failed doctest's log is the whole doctest log."""
    passed = ignored = 0
    failed = []
    if not path or not os.path.exists(path):
        return passed, failed, ignored
    text = open(path, errors="replace").read()
    for m in re.finditer(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text, re.M):
        passed += int(m.group(1))
        ignored += int(m.group(3))
    for m in re.finditer(r"^test (.+) \.\.\. FAILED$", text, re.M):
        name = m.group(1)
        block = text.split(f"---- {name} stdout ----", 1)
        first = first_failure_line(block[1] if len(block) > 1 else "", "doctest failed")
        failed.append(("doctests", name, first, path))
    return passed, failed, ignored


def vmstat_summary(path):
    """One line on the CPU over the run: mean busy %, the share of samples
    with the CPU saturated (idle under 5 %), the mean run queue."""
    rows = []
    if not path or not os.path.exists(path):
        return None
    for line in open(path):
        f = line.split()
        if len(f) >= 17 and f[0].isdigit():
            rows.append((int(f[0]), int(f[12]) + int(f[13]), int(f[14]), int(f[15])))
    if len(rows) < 2:
        return None
    rows = rows[1:]  # the first row is the average since boot
    n = len(rows)
    busy = sum(r[1] for r in rows) / n
    sat = 100 * sum(1 for r in rows if r[2] < 5) / n
    runq = sum(r[0] for r in rows) / n
    wa = sum(r[3] for r in rows) / n
    return f"CPU over {n} vmstat samples: {busy:.0f} % busy (user+system), saturated in {sat:.0f} %, run queue {runq:.1f}, iowait {wa:.0f} %"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--junit", required=True)
    p.add_argument("--doctests", help="the log of cargo test --doc")
    p.add_argument("--nextest-log", help="nextest's output (its Summary line gives the skipped count)")
    p.add_argument("--phases", help="the scenarios' phase files (ARGUS_PHASE_DIR)")
    p.add_argument("--timeline")
    p.add_argument("--vmstat")
    p.add_argument("--logs", required=True, help="where each failed test's log is written")
    p.add_argument("--fmt", default="ok")
    p.add_argument("--clippy", default="ok")
    p.add_argument("--nextest-status", type=int, default=0)
    p.add_argument("--slowest", type=int, default=12)
    o = p.parse_args()

    passed, failed, timings = read_junit(o.junit, o.logs, read_phases(o.phases))
    dpassed, dfailed, dignored = read_libtest(o.doctests, o.logs)
    skipped = 0
    if o.nextest_log and os.path.exists(o.nextest_log):
        for m in re.finditer(r"(\d+) skipped", open(o.nextest_log, errors="replace").read()):
            skipped = int(m.group(1))  # the last Summary line wins
    passed += dpassed
    failed += dfailed
    ignored = skipped + dignored

    print("scripts/test: where the time went")
    if o.timeline and os.path.exists(o.timeline):
        for line in open(o.timeline):
            t, _, what = line.rstrip("\n").partition("\t")
            print(f"  {int(t):5d} s  {what}")
    v = vmstat_summary(o.vmstat)
    if v:
        print("  " + v)
    print(f"scripts/test: the {o.slowest} slowest tests")
    for t, binary, name in sorted(timings, reverse=True)[: o.slowest]:
        print(f"  {t:7.1f} s  {binary} {name}")

    broken_run = o.nextest_status != 0 and not failed
    if failed:
        print(f"scripts/test: FAILED tests ({len(failed)}): name, first failure line, full log")
        for binary, name, first, log in failed[:MAX_LISTED]:
            print(f"  FAILED {binary} {name}")
            print(f"    {first[:300]}")
            print(f"    log: {log}")
        if len(failed) > MAX_LISTED:
            listing = os.path.join(o.logs, "failed.txt")
            with open(listing, "w") as f:
                for binary, name, first, log in failed:
                    f.write(f"{binary} {name}\t{first}\t{log}\n")
            print(f"  ... and {len(failed) - MAX_LISTED} more: {listing}")
    if broken_run:
        print(f"scripts/test: the test run failed (nextest exit {o.nextest_status}) with no failed test in its report: "
              "a test binary did not build or could not be listed; see the output above")
    binaries = len({b for b, _, _, _ in failed})
    print(f"scripts/test: passed {passed}, failed {len(failed)}, ignored {ignored} "
          f"(test binaries failed: {binaries}{'+' if broken_run else ''}); fmt {o.fmt}, clippy {o.clippy}")
    ok = not failed and not broken_run and o.fmt == "ok" and o.clippy == "ok" and o.nextest_status == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
