#!/usr/bin/env python3
"""The idle cost of the agent's metrics; prints figures, asserts nothing.

Runs a head and a worker agent (fake `ray`, as tests/supervisor.rs does) for
--seconds each, in three ways: the binary given by --before (e.g. one built
without metrics), this checkout's release binary without ARGUS_METRICS_PORT,
and with it while being scraped every --scrape seconds. For each it prints
the agent's RSS (VmRSS) at the end and its wake-ups (voluntary plus
involuntary context switches of all its threads) per minute, plus the time
one scrape takes.

Usage: scripts/bench-metrics.py [--before BIN] [--seconds 60] [--scrape 15]
"""
import argparse, importlib.util, os, shutil, subprocess, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFTER = os.path.join(ROOT, "target/release/argus-agent")


def _bench_node():
    """scripts/bench-node.py, for its agent environment (fake ray)."""
    spec = importlib.util.spec_from_file_location("bench_node", os.path.join(ROOT, "scripts/bench-node.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench_node = _bench_node()


def switches(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])


def status(env):
    try:
        import json
        with open(os.path.join(env["ARGUS_STATE_DIR"], "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def run(binary, seconds, metrics, scrape_every):
    tmp = tempfile.mkdtemp(prefix="argus-bench-metrics-")
    procs, envs = {}, {}
    try:
        for name, role in (("head", "head"), ("worker", "worker")):
            env = bench_node.base_env(tmp, name, role)
            if metrics:
                env["ARGUS_METRICS_PORT"] = str(bench_node.free_port())
            envs[name] = env
            procs[name] = subprocess.Popen([binary, "run"], env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline and not all(status(e).get("state") == "running" for e in envs.values()):
            time.sleep(0.2)
        time.sleep(2)
        start = {n: switches(p.pid) for n, p in procs.items()}
        t0 = time.time()
        scrape_s = []
        next_scrape = t0
        while time.time() - t0 < seconds:
            if metrics and time.time() >= next_scrape:
                for e in envs.values():
                    s = time.perf_counter()
                    urllib.request.urlopen(f"http://127.0.0.1:{e['ARGUS_METRICS_PORT']}/metrics").read()
                    scrape_s.append(time.perf_counter() - s)
                next_scrape += scrape_every
            time.sleep(0.1)
        took = time.time() - t0
        out = {}
        for n, p in procs.items():
            out[n] = dict(rss_kib=rss_kib(p.pid),
                          wakeups_per_min=(switches(p.pid) - start[n]) * 60 / took)
        out["scrape_ms"] = sorted(scrape_s)[len(scrape_s) // 2] * 1000 if scrape_s else None
        return out
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="an agent binary without metrics, for comparison")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scrape", type=float, default=15)
    a = ap.parse_args()
    cases = []
    if a.before:
        cases.append(("before (" + a.before + ")", a.before, False))
    cases += [("metrics off", AFTER, False), (f"metrics on, scraped every {a.scrape:g} s", AFTER, True)]
    for b in {c[1] for c in cases}:
        print(f"{b}: {os.path.getsize(b):,} bytes")
    print(f"{'case':<40} {'head RSS KiB':>12} {'head wake/min':>14} {'worker RSS KiB':>15} {'worker wake/min':>16} {'scrape ms':>10}")
    for label, binary, metrics in cases:
        r = run(binary, a.seconds, metrics, a.scrape)
        sc = f"{r['scrape_ms']:.2f}" if r["scrape_ms"] is not None else "-"
        print(f"{label:<40} {r['head']['rss_kib']:>12,} {r['head']['wakeups_per_min']:>14.1f} "
              f"{r['worker']['rss_kib']:>15,} {r['worker']['wakeups_per_min']:>16.1f} {sc:>10}", flush=True)


if __name__ == "__main__":
    main()
