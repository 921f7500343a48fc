#!/usr/bin/env python3
"""Benchmark of head failover (issue 8); prints figures, asserts nothing.

(a) Fake ray, default TTL 60 s / REFRESH 10 s / POLL 5 s, 3 workers: a head
    agent SIGKILLed together with its Ray (no withdraw), then
      - same address: the head is started again on the same IP and port;
      - other address: a standby head on another IP takes over;
    time from the kill to every worker's new `ray start`.
(b) Real Ray 2.53 (target/ray-venv), head + 1 worker on 127.0.0.2/3:
    SIGKILL of the head's gcs_server, time until both nodes are alive in the
    GCS again, and how many times the worker's Ray was restarted; without
    and with GCS fault tolerance (a real redis-server on loopback).

Usage: scripts/bench-failover.py [--runs N] [--skip-ray]
"""
import argparse, importlib.util, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("bench_node", os.path.join(ROOT, "scripts/bench-node.py"))
bn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bn)


def kill_hard(p, ray_log):
    """SIGKILL an agent and every process its fake ray logged."""
    p.kill(); p.wait()
    for ev in bn.starts(ray_log) + [json.loads(l) for l in open(ray_log) if '"children"' in l]:
        for pid in [ev.get("pid")] + ev.get("pids", []):
            try:
                os.kill(pid, signal.SIGKILL)
            except (TypeError, ProcessLookupError):
                pass


def wait(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def fake_failover(other_address, workers=3):
    tmp = tempfile.mkdtemp(prefix="argus-bench-fo-")
    defaults = dict(ARGUS_TTL_S="60", ARGUS_REFRESH_S="10", ARGUS_POLL_S="5")
    h = bn.base_env(tmp, "h", "head"); h.update(defaults)
    procs = []
    try:
        hp = bn.start(h, os.path.join(tmp, "h.log")); procs.append(hp)
        record = os.path.join(h["ARGUS_SHARED_ROOT"], "ray/discovery/argus-ray/head.json")
        wait(lambda: os.path.exists(record) and json.load(open(record))["state"] == "running", 30, "head")
        ws = []
        for i in range(workers):
            w = bn.base_env(tmp, f"w{i}", "worker"); w.update(defaults)
            w["ARGUS_NODE_IP"] = f"127.0.3.{i + 1}"
            procs.append(bn.start(w, os.path.join(tmp, f"w{i}.log"))); ws.append(w)
        wait(lambda: all(len(bn.starts(w["FAKE_RAY_LOG"])) == 1 for w in ws), 60, "workers joined")
        if other_address:
            s = bn.base_env(tmp, "s", "head"); s.update(defaults); s["ARGUS_NODE_IP"] = "127.0.0.2"
            procs.append(bn.start(s, os.path.join(tmp, "s.log")))
            wait(lambda: '"standby"' in open(os.path.join(s["ARGUS_STATE_DIR"], "status.json")).read()
                 if os.path.exists(os.path.join(s["ARGUS_STATE_DIR"], "status.json")) else False, 30, "standby")
        t0 = time.time()
        kill_hard(hp, h["FAKE_RAY_LOG"])
        if not other_address:
            h2 = dict(h); h2["ARGUS_STATE_DIR"] += "-2"; h2["FAKE_RAY_LOG"] += "-2"
            procs.append(bn.start(h2, os.path.join(tmp, "h2.log")))
        wait(lambda: all(len(bn.starts(w["FAKE_RAY_LOG"])) == 2 for w in ws), 120, "workers rejoined")
        return max(bn.starts(w["FAKE_RAY_LOG"])[-1]["t"] for w in ws) - t0
    finally:
        for p in procs:
            if p.poll() is None:
                bn.stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


def real_gcs_kill(gcs_ft):
    venv = bn.VENV
    ray = os.path.join(venv, "bin/ray")
    tmp = tempfile.mkdtemp(prefix="argus-bench-ft-")
    redis = None
    procs = []
    try:
        gcs = bn.free_port()
        common = dict(ARGUS_RAY_BIN=ray, PATH=f"{venv}/bin:" + os.environ["PATH"], ARGUS_RAY_PORT=str(gcs),
                      ARGUS_TTL_S="60", ARGUS_REFRESH_S="2", ARGUS_POLL_S="1", RAY_USAGE_STATS_ENABLED="0",
                      ARGUS_RESTART_BACKOFF_MIN_S="0.5", ARGUS_RESTART_BACKOFF_MAX_S="4")
        if gcs_ft:
            rport = bn.free_port()
            redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
            common["ARGUS_GCS_FT_REDIS"] = f"127.0.0.1:{rport}"
        h = bn.base_env(tmp, "h", "head"); h.update(common); h["ARGUS_NODE_IP"] = "127.0.0.2"
        h["ARGUS_RAY_EXTRA_ARGS"] = f"--num-cpus=1 --object-store-memory=80000000 --disable-usage-stats --temp-dir={tmp}/ray --node-manager-port=33000 --ray-client-server-port=33006 --min-worker-port=33010 --max-worker-port=33060"
        w = bn.base_env(tmp, "w", "worker"); w.update(common); w["ARGUS_NODE_IP"] = "127.0.0.3"
        w["ARGUS_RAY_PORT"] = str(bn.free_port())
        w["ARGUS_RAY_EXTRA_ARGS"] = "--num-cpus=1 --object-store-memory=80000000 --disable-usage-stats --node-manager-port=34000 --min-worker-port=34010 --max-worker-port=34060 --dashboard-agent-listen-port=34003 --metrics-export-port=34002 --runtime-env-agent-port=34005 --dashboard-agent-grpc-port=34004"
        hp = bn.start(h, os.path.join(tmp, "h.log")); procs.append(hp)
        status = lambda e: json.load(open(os.path.join(e["ARGUS_STATE_DIR"], "status.json")))
        wait(lambda: os.path.exists(os.path.join(h["ARGUS_STATE_DIR"], "status.json")) and status(h)["state"] == "running", 120, "head")
        wp = bn.start(w, os.path.join(tmp, "w.log")); procs.append(wp)
        wait(lambda: os.path.exists(os.path.join(w["ARGUS_STATE_DIR"], "status.json")) and status(w)["state"] == "running", 120, "worker")
        probe = os.path.join(tmp, "probe.py")
        open(probe, "w").write(f"""
import sys, time
from ray._raylet import GcsClient
from ray.core.generated import gcs_pb2
want = set(sys.argv[1:])
while True:
    try:
        info = GcsClient(address="127.0.0.2:{gcs}").get_all_node_info(timeout=2)
        alive = {{n.node_manager_address for n in info.values() if n.state == gcs_pb2.GcsNodeInfo.ALIVE}}
        if want <= alive:
            print(time.time()); break
    except Exception:
        pass
    time.sleep(0.1)
""")
        py = os.path.join(venv, "bin/python")
        subprocess.run([py, probe, "127.0.0.2", "127.0.0.3"], check=True, timeout=180, capture_output=True)
        restarts, ray_pid = status(w)["restarts"], status(w)["ray_pid"]
        gcs_pid = int(subprocess.check_output(["pgrep", "-f", f"gcs_server.*{gcs}"]).split()[0])
        # The GCS of the restarted head registers a new node for the head;
        # wait for a state newer than the kill.
        t0 = time.time()
        os.kill(gcs_pid, signal.SIGKILL)
        wait(lambda: status(h)["state"] != "running" or status(h).get("restarts", 0) > 0, 30, "head noticed")
        wait(lambda: status(h)["state"] == "running", 120, "head serving again")
        out = subprocess.run([py, probe, "127.0.0.2", "127.0.0.3"], check=True, timeout=180, capture_output=True, text=True)
        back = float(out.stdout.strip().splitlines()[-1]) - t0
        # A rejoin is a Ray restart too (on purpose, so not in `restarts`).
        wait(lambda: status(w)["state"] == "running", 120, "worker running")
        after = status(w)
        return back, after["restarts"] - restarts + (after["ray_pid"] != ray_pid)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                bn.stop(p, 20)
        if redis:
            redis.kill(); redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--skip-ray", action="store_true")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "argus-agent"], cwd=ROOT, check=True)
    bn.summary("fake ray, head killed, back at the same address -> 3 workers rejoined ",
            [fake_failover(False) for _ in range(a.runs)])
    bn.summary("fake ray, head killed, standby at another address -> 3 workers moved",
            [fake_failover(True) for _ in range(a.runs)])
    if a.skip_ray:
        return
    if not os.path.exists(os.path.join(bn.VENV, "bin/ray")):
        print("real ray: skipped, no target/ray-venv (scripts/setup-ray-venv.sh)")
        return
    for ft in (False, True):
        runs = [real_gcs_kill(ft) for _ in range(max(1, a.runs // 2))]
        bn.summary(f"real ray, head gcs_server SIGKILLed, GCS FT {'on ' if ft else 'off'} -> both nodes alive",
                [r[0] for r in runs])
        print(f"    worker Ray restarts (crash or rejoin) per fault: {[r[1] for r in runs]}", flush=True)


if __name__ == "__main__":
    main()
