#!/usr/bin/env python3
"""Chaos soak of the compose cluster (issue 9.3); scripts/soak.sh builds the
images and runs this.

Brings up docker-compose.yaml as its own project (head + two workers, the
`lb` Serve endpoint, and by default docker-compose.gcs-ft.yaml's Redis: GCS
fault tolerance, as scripts/cluster-up.sh does; --no-gcs-ft leaves it out),
deploys a Serve application in the stand-in engine image
(docker/serve/engine-image-uri.yaml), then injects N faults drawn at random
(seeded) from FAULTS. After each fault it waits, up to the fault kind's
bound, until the cluster has recovered (3 alive Ray nodes, one per
container, and a valid head record from `argus-agent head --json` in the
head), then checks the invariants:
  serve    the Serve endpoint answers through the lb service from inside the
           engine image (without GCS fault tolerance a head fault loses the
           application: it is deployed again first, and the row says so)
  task     a runtime_env container task succeeds (stand-in engine image)
  engines  no engine container (label io.argus.shim.owner) of this project
           whose owner node container is not running
  procs    no zombie and no orphan in any node container (PID 1's children
           are `ray start` and at most one podman-call handler per running
           podman client; nothing else re-parented to it)
  rss      agent (PID 1) RSS at the end not above its first value by more
           than --rss-growth-kib (per node; checked at the end)
Prints one row per fault and a summary; exit 1 when any invariant broke,
2 on bad arguments. The project is always torn down.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVICES = ["head", "worker-1", "worker-2"]
WORKERS = SERVICES[1:]
# Fault kind -> default recovery bound (seconds).
FAULTS = {
    "raylet_kill": 120,
    "gcs_kill": 150,
    "head_kill_start": 150,
    "worker_restart": 120,
    "shim_kill": 120,
    "worker_stop_start": 120,
    "record_garbage": 90,
    "shared_unwritable": 90,
}
RECORD = "/private/ray/discovery/argus-ray/head.json"
RECORD_DIR = os.path.dirname(RECORD)
SHIM_OWNER = "io.argus.shim.owner"



def default_network_ip(pairs):
    """The address on the network named *_default in `name=ip ...` (a GCS FT
    head is also on the Redis network of its own); else the first one."""
    all_ = [p.split("=", 1) for p in pairs.split() if "=" in p]
    for k, v in all_:
        if k.endswith("_default"):
            return v
    return all_[0][1] if all_ else ""

def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(args, timeout=120, check=False, stdin=None):
    """Runs a command (stdin: a text fed to it, or None); returns (exit
    code, stdout, stderr)."""
    try:
        p = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout,
            input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout}s: {' '.join(args)}"
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.returncode, p.stdout, p.stderr


def compose_tool():
    if sh(["docker", "compose", "version"])[0] == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    sys.exit("soak: neither `docker compose` nor `docker-compose` works")


class Cluster:
    def __init__(self, opts):
        self.project = opts.project
        self.tmp = tempfile.mkdtemp(prefix=f"{self.project}-")
        os.chmod(self.tmp, 0o755)
        self.cache = os.path.join(self.tmp, "models")
        os.makedirs(self.cache)
        os.chmod(self.cache, 0o755)
        self.compose = compose_tool()
        self.env = dict(os.environ)
        self.files = ["docker-compose.yaml"] + ([] if opts.no_gcs_ft else ["docker-compose.gcs-ft.yaml"])
        self.serve_port = opts.serve_port
        self.env.update(
            ARGUS_NODE_IMAGE=opts.node_image,
            ARGUS_LB_IMAGE=opts.lb_image,
            ARGUS_REDIS_IMAGE=opts.redis_image,
            ARGUS_SERVE_HOST_PORT=str(opts.serve_port),
            ARGUS_MODEL_CACHE=self.cache,
            ARGUS_DASHBOARD_HOST_PORT=str(opts.dashboard_port),
            ARGUS_TTL_S=str(opts.ttl_s),
            ARGUS_REFRESH_S=str(opts.refresh_s),
            ARGUS_POLL_S=str(opts.poll_s),
            ARGUS_SHM_SIZE="512m",
            ARGUS_RAY_EXTRA_ARGS="--object-store-memory=100000000",
        )
        self.ids = {}

    def run(self, *args, timeout=300, check=True):
        cmd = self.compose + ["-p", self.project]
        for f in self.files:
            cmd += ["-f", os.path.join(REPO, f)]
        p = subprocess.run(
            cmd + list(args), capture_output=True, text=True, env=self.env, cwd=REPO, timeout=timeout
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"compose {' '.join(args)} failed: {p.stderr.strip()}")
        return p.stdout

    def up(self):
        self.run("up", "-d", "--no-build")
        for s in SERVICES:
            self.ids[s] = self.run("ps", "-q", s).strip()

    def down(self):
        try:
            # -t past a worker's drain: a drain cut by SIGKILL leaves its engine containers.
            self.run("down", "-v", "--remove-orphans", "-t", "150", check=False)
        except Exception as e:  # teardown must go on
            log(f"compose down: {e}")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def exec(self, service, *cmd, user=None, timeout=120, stdin=None):
        args = ["docker", "exec"] + (["-u", user] if user else []) + (["-i"] if stdin else [])
        return sh(args + [self.ids[service]] + list(cmd), timeout=timeout, stdin=stdin)

    def ray_nodes(self):
        rc, out, err = self.exec("head", "timeout", "60", "argus-agent", "ray-tool", "nodes", timeout=90)
        if rc != 0:
            return None, (err.strip().splitlines() or [f"exit {rc}"])[-1]
        try:
            return json.loads(out), None
        except ValueError as e:
            # A Ray client cut short under load (its driver killed, the GCS
            # gone mid-call) can exit 0 with nothing printed: not recovered yet.
            last = (err.strip().splitlines() or ["nothing on stderr"])[-1][:200]
            return None, f"not JSON ({e}): {out.strip()[:80]!r}; {last}"

    def ips(self):
        fmt = "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}"
        return {s: default_network_ip(sh(["docker", "inspect", "-f", fmt, self.ids[s]])[1]) for s in SERVICES}

    def running(self, cid):
        rc, out, _ = sh(["docker", "inspect", "-f", "{{.State.Running}}", cid])
        return rc == 0 and out.strip() == "true"

    def record(self):
        rc, out, err = self.exec("head", "argus-agent", "head", "--json", timeout=30)
        if rc != 0:
            return None, (err.strip() or out.strip() or f"exit {rc}").splitlines()[-1]
        try:
            return json.loads(out), None
        except ValueError as e:
            return None, f"not JSON: {e}"

    def node_ids(self):
        """{service: Ray node id} of the alive nodes, or None."""
        v, _ = self.ray_nodes()
        if v is None:
            return None
        ips = self.ips()
        by_ip = {n["ip"]: n["id"] for n in v["nodes"] if n["alive"]}
        return {s: by_ip.get(ips[s]) for s in SERVICES}

    def recovered(self, renewed=(), before=None):
        """None when exactly the 3 containers' IPs are alive Ray nodes (the
        `renewed` services under a new node id: evidence that the fault took
        effect and Ray came back) and the record is valid and names the head;
        else why not."""
        if not all(self.running(self.ids[s]) for s in SERVICES):
            return "a node container is not running"
        v, err = self.ray_nodes()
        if v is None:
            return f"ray_nodes: {err}"
        alive = [n for n in v["nodes"] if n["alive"]]
        ips = self.ips()
        missing = [s for s in SERVICES if ips[s] not in {n["ip"] for n in alive}]
        if missing:
            return f"not alive in Ray: {', '.join(missing)}"
        if len(alive) != len(SERVICES):
            return f"{len(alive)} alive Ray nodes (a dead one not yet noticed?)"
        by_ip = {n["ip"]: n["id"] for n in alive}
        same = [s for s in renewed if before and by_ip.get(ips[s]) == before.get(s)]
        if same:
            return f"still the Ray node from before the fault: {', '.join(same)}"
        rec, err = self.record()
        if rec is None:
            return f"record: {err}"
        text = json.dumps(rec)
        if ips["head"] not in text:
            return f"record does not name the head {ips['head']}: {text[:200]}"
        return None

    def wait_recovered(self, bound, renewed=(), before=None):
        t0 = time.monotonic()
        why = "not checked"
        while time.monotonic() - t0 < bound:
            why = self.recovered(renewed, before)
            if why is None:
                return time.monotonic() - t0, None
            time.sleep(1)
        return time.monotonic() - t0, why

    def serve_deploy(self, image):
        """Deploys docker/serve/engine-image-uri.yaml with `image` as the Ray
        user in the head; returns None or why it failed."""
        with open(os.path.join(REPO, "docker/serve/engine-image-uri.yaml")) as f:
            config = f.read().replace("${ENGINE_IMAGE}", image)
        rc, out, err = self.exec(
            "head", "argus-agent", "ray-tool", "serve", "deploy", "-a", "http://127.0.0.1:8265", "-",
            stdin=config, timeout=180)
        return None if rc == 0 else f"serve deploy failed (rc {rc}): {(err.strip().splitlines() or [out.strip()])[-1][:200]}"

    def serve_get(self, timeout=10):
        """GET /uri through the lb service's published port: (JSON, None) or
        (None, why)."""
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.serve_port}/uri", timeout=timeout) as r:
                return json.loads(r.read()), None
        except Exception as e:  # any failure is the answer
            return None, f"{type(e).__name__}: {e}"

    def agent_rss_kib(self, service):
        rc, out, _ = self.exec(service, "cat", "/proc/1/status", timeout=30)
        for line in out.splitlines() if rc == 0 else []:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return None

    def procs(self, service):
        """[(pid, ppid, stat, args)] of the node container, this probe excluded."""
        rc, out, _ = self.exec(service, "ps", "-eo", "pid=,ppid=,stat=,args=", timeout=30)
        rows = []
        for line in out.splitlines() if rc == 0 else []:
            f = line.split(None, 3)
            if len(f) == 4 and f[1] != "0":  # ppid 0: PID 1 and `docker exec`s
                rows.append((int(f[0]), int(f[1]), f[2], f[3]))
        return [r for r in rows if not r[3].startswith("ps -eo")]


def job_script(image, cache, mode):
    """A driver run in the head: one task in an engine container. `probe`
    prints the answer, `sleep` sleeps for ten minutes."""
    return f"""
import json, os, socket, time
import ray
ip = socket.gethostbyname(socket.gethostname())
ray.init(address=f"{{ip}}:{{os.environ.get('ARGUS_RAY_PORT', '6379')}}", log_to_driver=False)
env = {{"container": {{"image": "{image}", "run_options": ["-v", "{cache}:/models:ro"]}}}}

@ray.remote(runtime_env=env, resources={{"worker_node": 1}}, max_retries=0)
def task(x, mode):
    if mode == "sleep":
        time.sleep(600)
    return {{"answer": x * 7, "model": open("/models/model.txt").read()}}

print(json.dumps(ray.get(task.remote(6, "{mode}"), timeout=600)))
"""


class Soak:
    def __init__(self, opts):
        self.o = opts
        self.c = Cluster(opts)
        self.rng = random.Random(opts.seed)
        self.rows = []
        self.rss_first = {}
        self.rss_last = {}
        self.serve_notes = []

    # --- faults -----------------------------------------------------------
    def fault(self, kind):
        """Injects one fault; returns a short description and the services
        whose Ray node must come back under a new id."""
        c = self.c
        w = self.rng.choice(WORKERS)
        # With GCS fault tolerance the workers ride a head fault through
        # (same Ray node ids); without it every node comes back as a new one.
        head_fault = ["head"] if not self.o.no_gcs_ft else SERVICES
        self.renewed = {"raylet_kill": [w], "worker_restart": [w], "worker_stop_start": [w],
                        "gcs_kill": head_fault, "head_kill_start": head_fault}.get(kind, [])
        if kind == "raylet_kill":
            rc, _, err = c.exec(w, "pkill", "-KILL", "-x", "raylet", user="0")
            return f"{w}: pkill -KILL raylet (rc {rc})"
        if kind == "gcs_kill":
            rc, _, _ = c.exec("head", "pkill", "-KILL", "-x", "gcs_server", user="0")
            return f"head: pkill -KILL gcs_server (rc {rc})"
        if kind == "head_kill_start":
            sh(["docker", "kill", c.ids["head"]], check=True)
            sh(["docker", "start", c.ids["head"]], check=True)
            return "head: docker kill + start"
        if kind == "worker_restart":
            # A worker drains before it stops (up to ARGUS_DRAIN_TIMEOUT_S, 120 s).
            sh(["docker", "restart", c.ids[w]], timeout=200, check=True)
            return f"{w}: docker restart"
        if kind == "worker_stop_start":
            sh(["docker", "stop", c.ids[w]], timeout=200, check=True)
            sh(["docker", "start", c.ids[w]], check=True)
            return f"{w}: docker stop + start"
        if kind == "record_garbage":
            c.exec("head", "sh", "-c", f"printf '{{\"schema_version\": 1, \"head_ip\": tru' > {RECORD}", user="0")
            time.sleep(self.o.fault_hold_s)
            return f"head record replaced by garbage ({self.o.fault_hold_s:g} s)"
        if kind == "shared_unwritable":
            _, mode, _ = c.exec("head", "stat", "-c", "%a", RECORD_DIR)
            mode = mode.strip() or "755"
            c.exec("head", "chmod", "0555", RECORD_DIR, user="0")
            time.sleep(self.o.fault_hold_s)
            c.exec("head", "chmod", mode, RECORD_DIR, user="0")
            return f"{RECORD_DIR} mode 0555 ({self.o.fault_hold_s:g} s)"
        if kind == "shim_kill":
            return self.shim_kill()
        raise ValueError(kind)

    def shim_kill(self):
        """Starts a sleeping engine task, SIGKILLs its shim (the `podman run`
        the raylet started) once the task runs, and waits for the owned
        engine containers to go."""
        c = self.c
        script = job_script(self.o.engine_image, c.cache, "sleep")
        driver = subprocess.Popen(
            ["docker", "exec", "-u", "ray", c.ids["head"], "python", "-c", script],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            t0 = time.monotonic()
            node = None
            while node is None and time.monotonic() - t0 < self.o.task_timeout_s:
                node = next((w for w in WORKERS if c.exec(w, "pgrep", "-f", "^ray::task")[0] == 0), None)
                time.sleep(1)
            if node is None:
                return "shim_kill: the sleeping task never started (FAILED)"
            kill = r"""targets=""
              for p in $(pgrep -f "^podman run"); do
                pp=$(ps -o ppid= -p "$p" | tr -d " ")
                case "$(tr "\0" " " </proc/"$pp"/cmdline 2>/dev/null)" in
                  "podman run"*) ;;
                  *) targets="$targets $p" ;;
                esac
              done
              [ -n "$targets" ] && kill -9 $targets && echo $targets"""
            _, killed, _ = c.exec(node, "sh", "-c", kill)
            return f"{node}: SIGKILL shim {killed.strip() or '(none found)'}"
        finally:
            driver.kill()
            driver.wait()

    # --- invariants -------------------------------------------------------
    def check_serve(self, kind=None):
        """The endpoint answers through lb from the engine image within
        --serve-bound-s. Without GCS fault tolerance a head fault loses the
        application (the GCS state is gone): it is deployed again first."""
        note = ""
        if kind in ("gcs_kill", "head_kill_start") and self.o.no_gcs_ft:
            why = self.c.serve_deploy(self.o.engine_image)
            if why:
                return why
            note = " (redeployed: no GCS fault tolerance)"
        want = self.o.engine_image.rsplit(":", 1)[-1].split("-ray")[0]
        t0 = time.monotonic()
        while True:
            r, why = self.c.serve_get()
            if r is not None and r.get("version") == want:
                self.serve_notes.append(f"{time.monotonic() - t0:.1f} s{note}")
                return None
            if r is not None:
                why = f"answered {r}"
            if time.monotonic() - t0 > self.o.serve_bound_s:
                return f"the Serve endpoint did not answer from {want} within {self.o.serve_bound_s} s{note}: {why}"
            time.sleep(1)

    def check_task(self):
        rc, out, err = self.c.exec(
            "head", "timeout", str(self.o.task_timeout_s), "python", "-c",
            job_script(self.o.engine_image, self.c.cache, "probe"),
            timeout=self.o.task_timeout_s + 30, user="ray",
        )
        try:
            r = json.loads(out.strip().splitlines()[-1])
            if r["answer"] == 42 and r["model"] == "weights-v1\n":
                return None
            return f"task answered {r}"
        except (ValueError, IndexError, KeyError):
            return f"task failed (rc {rc}): {(err.strip().splitlines() or ['?'])[-1][:200]}"

    def check_engines(self):
        """Engine containers of this project's nodes whose owner is not running
        (waits up to the janitor bound for them to go)."""
        ours = set(self.c.ids.values())
        t0 = time.monotonic()
        while True:
            _, out, _ = sh(["docker", "ps", "-a", "--filter", f"label={SHIM_OWNER}",
                            "--format", f'{{{{.ID}}}} {{{{.Label "{SHIM_OWNER}"}}}} {{{{.State}}}}'])
            bad = []
            for line in out.splitlines():
                cid, owner, state = (line.split() + ["", "", ""])[:3]
                node = next((n for n in ours if n.startswith(owner) or owner.startswith(n)), None)
                if node and (not self.c.running(node) or state != "running"):
                    bad.append(f"{cid}({state}, owner {owner[:12]})")
            if not bad:
                return None
            if time.monotonic() - t0 > self.o.janitor_bound_s:
                return "engine containers without a live owner: " + " ".join(bad)
            time.sleep(2)

    def check_procs(self):
        """No zombie, no orphan (PID 1 has exactly one child, `ray start`);
        given a few seconds, as the agent reaps and sweeps asynchronously."""
        t0 = time.monotonic()
        while True:
            bad = []
            for s in SERVICES:
                rows = self.c.procs(s)
                zombies = [f"{p}({a[:30]})" for p, pp, st, a in rows if st.startswith("Z")]
                # PID 1's own children: `ray start`, and one podman-call
                # handler (`argus-agent __shim-handle`) per podman client
                # that is still running (a Serve replica's engine lives as
                # long as its replica).
                handlers = [p for p, pp, st, a in rows if pp == 1 and "__shim-handle" in a]
                clients = [p for p, pp, st, a in rows if a.startswith("podman ")]
                orphans = [f"{p}({a[:40]})" for p, pp, st, a in rows
                           if pp == 1 and " start " not in f" {a} " and "__shim-handle" not in a]
                starts = [p for p, pp, st, a in rows if pp == 1 and " start " in f" {a} "]
                if len(handlers) > len(clients):
                    bad.append(f"{s}: {len(handlers)} podman handlers for {len(clients)} podman clients")
                if zombies:
                    bad.append(f"{s}: zombies {zombies}")
                if orphans:
                    bad.append(f"{s}: orphans {orphans}")
                if len(starts) != 1:
                    bad.append(f"{s}: {len(starts)} `ray start` children of PID 1")
            if not bad:
                return None
            if time.monotonic() - t0 > self.o.procs_bound_s:
                return "; ".join(bad)
            time.sleep(2)

    def sample_rss(self):
        for s in SERVICES:
            kib = self.c.agent_rss_kib(s)
            if kib is not None:
                self.rss_first.setdefault(s, kib)
                self.rss_last[s] = kib

    # --- run --------------------------------------------------------------
    def run(self):
        c = self.c
        log(f"project {c.project}, seed {self.o.seed}, {self.o.faults} faults, image {self.o.node_image}")
        with open(os.path.join(c.cache, "model.txt"), "w") as f:
            f.write("weights-v1\n")
        c.up()
        took, why = c.wait_recovered(self.o.up_timeout_s)
        if why:
            log(f"cluster did not come up in {self.o.up_timeout_s} s: {why}")
            self.dump()
            return 1
        log(f"cluster up in {took:.1f} s")
        why = self.check_task()
        if why:
            log(f"the first runtime_env task failed: {why}")
            self.dump()
            return 1
        why = c.serve_deploy(self.o.engine_image) or self.check_serve()
        if why:
            log(f"the Serve application did not come up: {why}")
            self.dump()
            return 1
        log(f"Serve endpoint answers through lb (port {c.serve_port}) after {self.serve_notes[-1]}")
        self.sample_rss()
        for i, kind in enumerate(fault_plan(self.rng, self.o.faults, self.o.each_kind), start=1):
            bound = self.o.bound.get(kind, FAULTS[kind])
            before = c.node_ids()
            t0 = time.monotonic()
            self.renewed = []
            try:
                what = self.fault(kind)
            except Exception as e:  # a fault that cannot be injected is a failure
                what = f"{kind}: injection failed: {e}"
            took, why = c.wait_recovered(bound, self.renewed, before)
            took = time.monotonic() - t0
            broken = []
            if why:
                broken.append(f"recovery > {bound} s: {why}")
            if "FAILED" in what or "injection failed" in what:
                broken.append(what)
            checks = (("serve", lambda: self.check_serve(kind)), ("task", self.check_task),
                      ("engines", self.check_engines), ("procs", self.check_procs))
            for name, check in checks:
                r = check()
                if r:
                    broken.append(f"{name}: {r}")
            self.sample_rss()
            serve = self.serve_notes[-1] if not any(b.startswith("serve:") for b in broken) else "-"
            row = dict(n=i, kind=kind, what=what, recovery_s=round(took, 1), bound_s=bound, broken=broken, serve=serve)
            self.rows.append(row)
            rss = " ".join(f"{k}={v}" for k, v in self.rss_last.items())
            log(f"fault {i}/{self.o.faults} {kind}: recovered in {took:.1f} s; "
                + ("ok" if not broken else "BROKEN: " + " | ".join(broken)) + f"; agent RSS KiB {rss}")
            if broken and self.o.stop_on_failure:
                break
        return self.report()

    def report(self):
        # The compose logs first and the table last, so that the tail of a
        # failed run's output (all a CI log may keep) holds the table.
        if any(r["broken"] for r in self.rows) or len(self.rows) != self.o.faults or self.rss_bad():
            self.dump()
        print(f"\n{'#':>3}  {'fault':<18} {'recovery s':>10} {'bound s':>7}  {'serve answers after':<20} invariants")
        for r in self.rows:
            inv = "ok" if not r["broken"] else "BROKEN: " + " | ".join(r["broken"])
            print(f"{r['n']:>3}  {r['kind']:<18} {r['recovery_s']:>10} {r['bound_s']:>7}  {r['serve']:<20} {inv}   ({r['what']})")
        survived = sum(1 for r in self.rows if not r["broken"])
        print(f"\nfaults survived: {survived}/{self.o.faults} (seed {self.o.seed})"
              + ("" if len(self.rows) == self.o.faults else f", interrupted after {len(self.rows)}"))
        for k in sorted({r["kind"] for r in self.rows}):
            rs = [r["recovery_s"] for r in self.rows if r["kind"] == k]
            print(f"  {k:<18} n={len(rs):<3} worst recovery {max(rs):6.1f} s (bound {self.o.bound.get(k, FAULTS[k])} s)")
        for s in SERVICES:
            print(f"  agent RSS {s:<9} first {self.rss_first.get(s)} KiB, last {self.rss_last.get(s)} KiB")
        rss_bad = self.rss_bad()
        if rss_bad:
            print(f"agent RSS grew by more than {self.o.rss_growth_kib} KiB (or unreadable) on: {', '.join(rss_bad)}")
        ok = survived == self.o.faults and not rss_bad
        print("soak: " + ("PASSED" if ok else "FAILED"), flush=True)
        return 0 if ok else 1

    def rss_bad(self):
        """The services whose agent RSS grew by more than --rss-growth-kib
        (or could not be read)."""
        bad = []
        for s in SERVICES:
            a, b = self.rss_first.get(s), self.rss_last.get(s)
            if a is None or b is None or b > a + self.o.rss_growth_kib:
                bad.append(s)
        return bad

    def dump(self):
        try:
            out = self.c.run("logs", "--no-color", "--tail", "40", check=False, timeout=60)
            print("--- compose logs (last lines)\n" + out, file=sys.stderr)
        except Exception as e:
            log(f"compose logs: {e}")


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=int, default=30, help="number of faults (30)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    p.add_argument("--node-image", default="argus/argus-ray-node:soak")
    p.add_argument("--engine-image", default="localhost/neutree/engine-vllm:stub-a-ray2.53.0")
    p.add_argument("--lb-image", default="argus/argus-lb:soak")
    p.add_argument("--redis-image", default="argus/argus-redis:soak")
    p.add_argument("--no-gcs-ft", action="store_true",
                   help="without docker-compose.gcs-ft.yaml (a head fault then loses the Serve app)")
    p.add_argument("--serve-bound-s", type=int, default=120,
                   help="time for the Serve endpoint to answer after recovery (120)")
    p.add_argument("--serve-port", type=int, default=0, help="host port of lb (default: a free one)")
    p.add_argument("--project", default=f"argus-soak-{os.getpid()}", help="compose project name")
    p.add_argument("--bound", action="append", default=[], metavar="KIND=S",
                   help="recovery bound of a fault kind, e.g. gcs_kill=200 (defaults: "
                   + ", ".join(f"{k}={v}" for k, v in sorted(FAULTS.items())) + ")")
    p.add_argument("--ttl-s", type=float, default=6, help="ARGUS_TTL_S of the nodes (6)")
    p.add_argument("--refresh-s", type=float, default=2, help="ARGUS_REFRESH_S (2)")
    p.add_argument("--poll-s", type=float, default=1, help="ARGUS_POLL_S (1)")
    p.add_argument("--fault-hold-s", type=float, default=4, help="how long garbage / an unwritable folder lasts (4)")
    p.add_argument("--up-timeout-s", type=int, default=300)
    p.add_argument("--task-timeout-s", type=int, default=300)
    # The janitor sweeps every 30 s: a container that exits just after a sweep
    # (the task check's own engine, when its driver ends) goes at the next
    # one, 30 s later plus the sweep's own Docker calls. A bound of one period
    # failed a CI run with the task's exited engine still there at 30 s.
    p.add_argument("--janitor-bound-s", type=int, default=75,
                   help="time for ownerless or exited engines to go (75: two janitor periods and a margin)")
    p.add_argument("--procs-bound-s", type=int, default=20, help="time for zombies/orphans to go (20)")
    p.add_argument("--rss-growth-kib", type=int, default=16384, help="allowed agent RSS growth per node (16384)")
    p.add_argument("--each-kind", action="store_true",
                   help="draw every fault kind at least once (needs --faults >= the number of kinds)")
    p.add_argument("--stop-on-failure", action="store_true")
    p.add_argument("--dashboard-port", type=int, default=0, help="host port (default: a free one)")
    o = p.parse_args()
    if o.faults < 1:
        p.error("--faults must be at least 1")
    if o.each_kind and o.faults < len(FAULTS):
        p.error(f"--each-kind needs --faults >= {len(FAULTS)} (one per kind: {', '.join(sorted(FAULTS))})")
    bounds = {}
    for b in o.bound:
        k, _, v = b.partition("=")
        if k not in FAULTS or not v.replace(".", "", 1).isdigit():
            p.error(f"--bound {b!r}: expected KIND=SECONDS with KIND one of {', '.join(sorted(FAULTS))}")
        bounds[k] = float(v)
    o.bound = bounds
    if o.seed is None:
        o.seed = random.SystemRandom().randrange(1 << 31)
    import socket
    for attr in ("dashboard_port", "serve_port"):
        if not getattr(o, attr):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            setattr(o, attr, s.getsockname()[1])
            s.close()
    return o


def fault_plan(rng, n, each_kind):
    """Yields the kinds of the n faults, drawn with rng. Without each_kind,
    one draw per fault as it comes (so a seed gives the same soak as before
    the option existed); with it, every kind of FAULTS comes up at least once
    (n >= len(FAULTS)), in a seeded order drawn up front."""
    kinds = sorted(FAULTS)
    if not each_kind:
        for _ in range(n):
            yield rng.choice(kinds)
        return
    plan = kinds + [rng.choice(kinds) for _ in range(n - len(kinds))]
    rng.shuffle(plan)
    yield from plan


def main():
    o = parse()
    soak = Soak(o)
    # Always tear down: normal exit, error, Ctrl-C or SIGTERM.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return soak.run()
    except (KeyboardInterrupt, SystemExit):
        # Interrupted (Ctrl-C, SIGTERM): the table of the faults done so far.
        if soak.rows:
            soak.report()
        return 1
    except Exception:  # a bug of this script: its trace, then the table so far
        import traceback
        traceback.print_exc()
        log("soak.py failed (above); the faults done so far:")
        soak.report()
        return 1
    finally:
        log(f"tearing down project {o.project}")
        soak.c.down()


if __name__ == "__main__":
    sys.exit(main())
