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
import argparse, os, shutil, socket, subprocess, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFTER = os.path.join(ROOT, "target/release/argus-agent")
FAKE_RAY = os.path.join(ROOT, "tests/fixtures/fake-ray")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def env_for(tmp, name, role, ray_port, dash_port):
    os.makedirs(os.path.join(tmp, "bin"), exist_ok=True)
    for n in ("raylet", "gcs_server"):
        dst = os.path.join(tmp, "bin", n)
        if not os.path.exists(dst):
            shutil.copy("/bin/sleep", dst)
    return dict(
        PATH=os.environ["PATH"], HOME=tmp, ARGUS_ROLE=role,
        ARGUS_SHARED_ROOT=os.path.join(tmp, "shared"),
        ARGUS_STATE_DIR=os.path.join(tmp, f"state-{name}"),
        ARGUS_LOG_DIR=os.path.join(tmp, f"logs-{name}"),
        ARGUS_RAY_BIN=FAKE_RAY, FAKE_RAY_LOG=os.path.join(tmp, f"ray-{name}.jsonl"),
        FAKE_RAY_BINDIR=os.path.join(tmp, "bin"), ARGUS_NODE_IP="127.0.0.1",
        RAY_TMPDIR=os.path.join(tmp, f"raytmp-{name}"),
        ARGUS_PREFLIGHT="skip", ARGUS_DISABLE_PRESTART="1",
        ARGUS_RAY_PORT=str(ray_port), ARGUS_DASHBOARD_PORT=str(dash_port))


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
    ray_port, dash_port = free_port(), free_port()
    procs, envs = {}, {}
    try:
        for name, role in (("head", "head"), ("worker", "worker")):
            env = env_for(tmp, name, role, ray_port, dash_port)
            if metrics:
                env["ARGUS_METRICS_PORT"] = str(free_port())
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
