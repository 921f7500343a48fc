#!/usr/bin/env python3
"""Benchmarks of the node agent (issue 2); prints figures, asserts nothing.

1. RSS of the agent while it supervises a real Ray worker (needs
   target/ray-venv: scripts/setup-ray-venv.sh).
2. Time from a head address change to the worker's new `ray start` at
   ARGUS_POLL_S=5, with file events (inotify, local disk) and polling only.
3. Time from SIGTERM to exit with a Ray child that ignores SIGTERM
   (ARGUS_STOP_GRACE_S=8, the default).

Usage: scripts/bench-node.py [--runs N] [--skip-ray]
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time, uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/argus-agent")
FAKE_RAY = os.path.join(ROOT, "tests/fixtures/fake-ray")
VENV = os.path.join(ROOT, "target/ray-venv")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def base_env(tmp, name, role):
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
        FAKE_RAY_BINDIR=os.path.join(tmp, "bin"), ARGUS_NODE_IP="127.0.0.1", RAY_TMPDIR=os.path.join(tmp, f"raytmp-{name}"),
        ARGUS_PREFLIGHT="skip", ARGUS_DISABLE_PRESTART="1",
        ARGUS_RAY_PORT=str(free_port()), ARGUS_DASHBOARD_PORT=str(free_port()))


def start(env, log):
    return subprocess.Popen([BIN, "run"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def stop(p, timeout=20):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill(); p.wait()


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


def starts(path):
    try:
        return [json.loads(l) for l in open(path) if '"event": "start"' in l]
    except FileNotFoundError:
        return []


def publish(path, rec):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f); f.flush(); os.fsync(f.fileno())
    os.rename(tmp, path)


def record(ip, seq, instance):
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return dict(schema_version=1, cluster_name="argus-ray", head_ip=ip, gcs_port=4000,
                dashboard_port=8265, job_server_url=f"http://{ip}:8265", updated_at=now,
                expires_at=now, instance_id=instance, holder_id="bench", generation=1,
                seq=seq, state="running", ttl_s=60.0)


def bench_rejoin(runs, events):
    tmp = tempfile.mkdtemp(prefix="argus-bench-")
    env = base_env(tmp, "w", "worker")
    env.update(ARGUS_POLL_S="5", ARGUS_REFRESH_S="1", ARGUS_FILE_EVENTS="on" if events else "off")
    head = os.path.join(tmp, "shared/ray/discovery/argus-ray/head.json")
    seq = 0
    ip = "127.0.1.1"

    def refresh():
        nonlocal seq
        seq += 1
        publish(head, record(ip, seq, "i1"))

    refresh()
    p = start(env, os.path.join(tmp, "w.log"))
    try:
        deadline = time.time() + 30
        while not starts(env["FAKE_RAY_LOG"]) and time.time() < deadline:
            refresh(); time.sleep(1)
        took = []
        for i in range(runs):
            ip = f"127.0.1.{i + 2}"
            n = len(starts(env["FAKE_RAY_LOG"]))
            t0 = time.time()
            refresh()
            last = t0
            while len(starts(env["FAKE_RAY_LOG"])) <= n:
                time.sleep(0.01)
                if time.time() - last >= 1:
                    refresh()  # keep the record fresh like a live head
                    last = time.time()
                if time.time() - t0 > 30:
                    raise SystemExit("worker did not rejoin")
            took.append(starts(env["FAKE_RAY_LOG"])[-1]["t"] - t0)
            time.sleep(0.5)
        return took
    finally:
        stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


def bench_term(runs):
    took = []
    for _ in range(runs):
        tmp = tempfile.mkdtemp(prefix="argus-bench-")
        env = base_env(tmp, "h", "head")
        env["FAKE_RAY_IGNORE_TERM"] = "1"
        p = start(env, os.path.join(tmp, "h.log"))
        state = os.path.join(env["ARGUS_STATE_DIR"], "status.json")
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if json.load(open(state))["state"] == "running":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        took.append(time.time() - t0)
        shutil.rmtree(tmp, ignore_errors=True)
    return took


def bench_rss():
    ray = os.path.join(VENV, "bin/ray")
    if not os.path.exists(ray):
        print("rss: skipped, no target/ray-venv (run scripts/setup-ray-venv.sh)")
        return
    tmp = tempfile.mkdtemp(prefix="argus-bench-")
    gcs = free_port()
    common = dict(ARGUS_RAY_BIN=ray, PATH=f"{VENV}/bin:" + os.environ["PATH"], ARGUS_RAY_PORT=str(gcs),
                  ARGUS_TTL_S="20", ARGUS_REFRESH_S="2", ARGUS_POLL_S="1", RAY_USAGE_STATS_ENABLED="0")
    h = base_env(tmp, "h", "head"); h.update(common); h["ARGUS_NODE_IP"] = "127.0.0.2"
    h["ARGUS_RAY_EXTRA_ARGS"] = f"--num-cpus=1 --object-store-memory=80000000 --disable-usage-stats --temp-dir={tmp}/ray --node-manager-port=33000 --ray-client-server-port=33006 --min-worker-port=33010 --max-worker-port=33060"
    w = base_env(tmp, "w", "worker"); w.update(common); w["ARGUS_NODE_IP"] = "127.0.0.3"
    w["ARGUS_RAY_EXTRA_ARGS"] = "--num-cpus=1 --object-store-memory=80000000 --disable-usage-stats --node-manager-port=34000 --min-worker-port=34010 --max-worker-port=34060 --dashboard-agent-listen-port=34003 --metrics-export-port=34002 --runtime-env-agent-port=34005 --dashboard-agent-grpc-port=34004"
    hp = start(h, os.path.join(tmp, "h.log"))
    time.sleep(15)
    wp = start(w, os.path.join(tmp, "w.log"))
    try:
        samples = []
        for _ in range(20):
            time.sleep(1)
            samples.append(rss_kib(wp.pid))
        st = json.load(open(os.path.join(w["ARGUS_STATE_DIR"], "status.json")))
        print(f"rss: worker agent supervising real Ray ({st['state']}): VmRSS median {statistics.median(samples)/1024:.1f} MiB, max {max(samples)/1024:.1f} MiB; head agent {rss_kib(hp.pid)/1024:.1f} MiB")
    finally:
        stop(wp); stop(hp)
        shutil.rmtree(tmp, ignore_errors=True)


def summary(name, xs):
    xs = sorted(xs)
    print(f"{name}: n={len(xs)} median {statistics.median(xs):.2f}s min {xs[0]:.2f}s max {xs[-1]:.2f}s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--skip-ray", action="store_true")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "argus-agent"], cwd=ROOT, check=True)
    summary("rejoin after address change, POLL_S=5, file events on ", bench_rejoin(a.runs, True))
    summary("rejoin after address change, POLL_S=5, polling only   ", bench_rejoin(a.runs, False))
    summary("SIGTERM to exit, ray ignores TERM, grace 8s           ", bench_term(max(3, a.runs // 3)))
    if not a.skip_ray:
        bench_rss()


if __name__ == "__main__":
    main()
