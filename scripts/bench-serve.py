#!/usr/bin/env python3
"""Benchmark of the Serve endpoint through faults (issue 16); prints figures.

Brings up its own compose project (docker-compose.yaml: head, two workers and
the `lb` HAProxy in front of the workers' Serve proxies; with GCS fault
tolerance docker-compose.gcs-ft.yaml on top), deploys the stand-in engine app
(`serve.vllm.app:app_builder` in the engine image, Ray's image_uri form, two
replicas on the workers, proxies on every node listening on 0.0.0.0:8000) with
`serve deploy` as the Ray user in the head, then drives a steady open-loop
rate of GET requests through the LB's published port from the host and
injects one fault per run window:

  head-kill       docker kill <head> + docker start <head>
  gcs-kill        docker exec <head> pkill -9 gcs_server
  head-recreate   docker rm -f <head> + compose up -d --no-deps head (a new
                  container, perhaps a new IP)
  worker-restart  docker restart <worker-1>

For each it prints requests sent, failed by kind (connection error, timeout,
HTTP status), p50/p99/max latency of the requests sent in the fault window,
the time from the fault until Ray sees 3 alive nodes again (without the
faulted node's old id; docker/tools/ray_nodes.py in the head) and until
`serve status` shows the app RUNNING with both replicas again, and the LB's
log lines of failed or retried requests. Without GCS FT a head fault loses
the app: the bench notes it and redeploys once the nodes are back (the
outage is in the figures). Each mode's cluster is torn down at the end
(`down -v --remove-orphans`, plus the engine containers its nodes' shims
started), also on errors and Ctrl-C.

--roll (issue 28, R-SERVE-4): instead of the faults, POST clients (the
engine's POST handler takes --post-delay 1.5 s, as an LLM answer does; 4
replicas) and GET clients in a closed loop with no retries, through these
phases: steady; docker stop + docker start of worker-1, of worker-2 (each
drains first) and of the head; a rolling replacement of all three nodes
(scripts/roll-cluster.sh, to the same image under a new tag); after. Per
phase: sent, failed by status, POST p50/p99; and each docker stop's
duration (the drain plus Ray's stop).

Usage: scripts/bench-serve.py [--modes ft,noft] [--faults a,b] [--rate 20]
         [--roll [--posts 8] [--gets 2] [--post-delay 1.5]]
         [--window 45] [--project argus-bench-serve] [--serve-port 18000]
         [--dashboard-port 18265] [--no-build]
Images: ARGUS_NODE_IMAGE / ARGUS_REDIS_IMAGE / ARGUS_LB_IMAGE (default
argus/argus-{ray-node,redis,lb}:$ARGUS_VERSION, ARGUS_VERSION=dev), built
unless --no-build (scripts/cluster-up.sh does that); the engine image
localhost/neutree/engine-vllm:stub-a-ray2.53.0 is built when missing.
"""
import argparse, http.client, json, os, re, signal, socket, statistics, subprocess, sys, threading, time
import urllib.error, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE_IMAGE = "localhost/neutree/engine-vllm:stub-a-ray2.53.0"
APP = "bench"
FAULTS = ["head-kill", "gcs-kill", "head-recreate", "worker-restart"]
SERVE_CONFIG = f"""\
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: 8000
applications:
  - name: {APP}
    route_prefix: /
    import_path: serve.vllm.app:app_builder
    runtime_env:
      image_uri: {ENGINE_IMAGE}
    args:
      model: stub
    deployments:
      - name: EngineStub
        num_replicas: 2
        ray_actor_options:
          num_cpus: 0.2
          resources:
            worker_node: 1
"""


# `docker compose` (v2) where it exists, else Debian's docker-compose (v1).
COMPOSE = (["docker", "compose"] if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
           else ["docker-compose"])



def default_network_ip(pairs):
    """The address on the network named *_default in `name=ip ...` (a GCS FT
    head is also on the Redis network of its own); else the first one."""
    all_ = [p.split("=", 1) for p in pairs.split() if "=" in p]
    for k, v in all_:
        if k.endswith("_default"):
            return v
    return all_[0][1] if all_ else ""

def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, timeout=120, check=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode:
        raise SystemExit(f"bench-serve: {' '.join(cmd)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-1500:]}")
    return p


def wait(cond, timeout, what, every=1.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"bench-serve: timed out after {timeout} s waiting for {what}")


class Cluster:
    def __init__(self, a, gcs_ft):
        self.a, self.gcs_ft = a, gcs_ft
        self.project = f"{a.project}-{'ft' if gcs_ft else 'noft'}"
        self.files = ["-f", "docker-compose.yaml"] + (["-f", "docker-compose.gcs-ft.yaml"] if gcs_ft else [])
        v = os.environ.get("ARGUS_VERSION", "dev")
        self.env = dict(os.environ, COMPOSE_PROJECT_NAME=self.project,
                        # the images cluster-up.sh uses, for this script's own compose calls
                        ARGUS_NODE_IMAGE=os.environ.get("ARGUS_NODE_IMAGE", f"argus/argus-ray-node:{v}"),
                        ARGUS_REDIS_IMAGE=os.environ.get("ARGUS_REDIS_IMAGE", f"argus/argus-redis:{v}"),
                        ARGUS_LB_IMAGE=os.environ.get("ARGUS_LB_IMAGE", f"argus/argus-lb:{v}"),
                        ARGUS_SERVE_HOST_PORT=str(a.serve_port),
                        ARGUS_DASHBOARD_HOST_PORT=str(a.dashboard_port),
                        ARGUS_CLUSTER_NAME=self.project)
        self.last_err = None
        self.node_ids = set()  # every node container of this project seen, for the engine sweep

    def compose(self, *args, timeout=300, check=True):
        return run([*COMPOSE, *self.files, *args], timeout=timeout, check=check, cwd=ROOT, env=self.env)

    def up(self, build):
        cmd = [os.path.join(ROOT, "scripts/cluster-up.sh"), "--gcs-ft" if self.gcs_ft else "--no-gcs-ft"]
        if not build:
            cmd.append("--no-build")
        log(f"{self.project}: {' '.join(cmd[1:])}")
        p = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=900)
        if p.returncode:
            raise SystemExit(f"bench-serve: cluster-up failed:\n{p.stderr[-3000:]}")
        self.remember()

    def cid(self, service):
        out = run(["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=com.docker.compose.project={self.project}",
                   "--filter", f"label=com.docker.compose.service={service}"]).stdout.split()
        return out[0] if out else None

    def remember(self):
        for s in ("head", "worker-1", "worker-2"):
            c = self.cid(s)
            if c:
                self.node_ids.add(c)

    def ip(self, service):
        c = self.cid(service)
        if not c:
            return None
        out = run(["docker", "inspect", "-f",
                   "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}", c],
                  check=False).stdout
        return default_network_ip(out) or None

    def head_exec(self, args, stdin=None, timeout=60, user="ray"):
        c = self.cid("head")
        if not c:
            return None
        try:
            return subprocess.run(["docker", "exec", "-u", user, "-i", c, *args], input=stdin, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def nodes(self):
        """Ray's view from the head: {"alive": n, "nodes": [...]} or None."""
        p = self.head_exec(["argus-agent", "ray-tool", "nodes"], timeout=30, user="root")
        if p is None or p.returncode:
            return None
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    def serve_status(self):
        """(app status or 'absent', running replicas) as `serve status` shows them, None if the
        dashboard does not answer. Read from the same REST endpoint `serve status` reads
        (GET /api/serve/applications/ of the head's dashboard, published on the host), which
        spares a Python start in the head per poll."""
        url = f"http://127.0.0.1:{self.a.dashboard_port}/api/serve/applications/"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                d = json.load(r)
        except urllib.error.HTTPError as e:
            self.last_err = f"dashboard HTTP {e.code}"
            return None
        except (OSError, ValueError, http.client.HTTPException) as e:
            self.last_err = f"dashboard {type(getattr(e, 'reason', e)).__name__}"
            return None
        app = (d.get("applications") or {}).get(APP)
        if not app:
            return ("absent", 0)
        running = sum(1 for dep in (app.get("deployments") or {}).values()
                      for rep in dep.get("replicas") or [] if rep.get("state") == "RUNNING")
        return (app.get("status", "?"), running)

    def replica_ips(self):
        """The node IPs of the app's RUNNING replicas (Serve's REST view)."""
        url = f"http://127.0.0.1:{self.a.dashboard_port}/api/serve/applications/"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                d = json.load(r)
        except (OSError, ValueError, http.client.HTTPException):
            return []
        app = (d.get("applications") or {}).get(APP) or {}
        return [rep.get("node_ip") for dep in (app.get("deployments") or {}).values()
                for rep in dep.get("replicas") or [] if rep.get("state") == "RUNNING"]

    def deploy(self, config=SERVE_CONFIG):
        """`serve deploy` in the head through `argus-agent ray-tool` (as the Ray user,
        confined), the config on stdin."""
        p = self.head_exec(["argus-agent", "ray-tool", "serve", "deploy", "-a", "http://127.0.0.1:8265", "-"],
                           stdin=config, timeout=120, user="root")
        if p is None or p.returncode:
            raise SystemExit(f"bench-serve: serve deploy failed: {p and (p.stderr or p.stdout)[-2000:]}")

    def lb_servers(self):
        """{server: status} of the LB's serve_workers backend (its stats CSV)."""
        c = self.cid("lb")
        if not c:
            return {}
        code = ("import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
                "'http://127.0.0.1:8404/stats;csv', timeout=3).read().decode())")
        p = run(["docker", "exec", c, "python3", "-c", code], check=False, timeout=20)
        out = {}
        for line in p.stdout.splitlines():
            f = line.split(",")
            if len(f) > 17 and f[0] == "serve_workers" and f[1] not in ("BACKEND", "FRONTEND"):
                out[f[1]] = f[17]
        return out

    def lb_log(self, since):
        c = self.cid("lb")
        if not c:
            return []
        p = run(["docker", "logs", "--since", str(int(since)), c], check=False, timeout=30)
        return (p.stdout + p.stderr).splitlines()

    def down(self):
        log(f"{self.project}: down -v --remove-orphans")
        self.remember()
        # -t past a worker's drain (130 s): a drain cut by a SIGKILL leaves engine containers.
        self.compose("down", "-v", "--remove-orphans", "-t", "150", check=False, timeout=600)
        # Engine containers the nodes' shims started and did not remove (a node
        # that was killed or removed does not sweep its own).
        for owner in self.node_ids:
            ids = run(["docker", "ps", "-aq", "--filter", f"label=io.argus.shim.owner={owner}"], check=False).stdout.split()
            if ids:
                log(f"removing {len(ids)} engine container(s) of node {owner[:12]}")
                run(["docker", "rm", "-f", *ids], check=False)


class Load:
    """Open-loop GETs at a fixed rate through the LB, one thread per request."""

    def __init__(self, url, rate, timeout):
        self.url, self.rate, self.timeout = url, rate, timeout
        self.results = []  # (t_sent, latency_s, kind) kind "ok" or the failure
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.threads = []

    def one(self, t_sent):
        kind = "ok"
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                body = r.read()
                if r.status != 200 or b"engine" not in body:
                    kind = f"http {r.status} (unexpected body)"
        except urllib.error.HTTPError as e:
            kind = f"http {e.code}"
        except (socket.timeout, TimeoutError):
            kind = "timeout"
        except urllib.error.URLError as e:
            kind = "timeout" if isinstance(e.reason, (socket.timeout, TimeoutError)) else \
                f"connection error ({type(e.reason).__name__})"
        except (http.client.HTTPException, ConnectionError, OSError) as e:
            kind = f"connection error ({type(e).__name__})"
        with self.lock:
            self.results.append((t_sent, time.time() - t_sent, kind))

    def loop(self):
        period, n, t0 = 1.0 / self.rate, 0, time.time()
        while not self.stop_ev.is_set():
            t = t0 + n * period
            d = t - time.time()
            if d > 0:
                time.sleep(d)
            th = threading.Thread(target=self.one, args=(time.time(),), daemon=True)
            th.start()
            self.threads.append(th)
            n += 1

    def start(self):
        self.main = threading.Thread(target=self.loop, daemon=True)
        self.main.start()

    def stop(self):
        self.stop_ev.set()
        self.main.join()
        for th in self.threads:
            th.join(self.timeout + 5)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def healthy(c):
    """3 alive nodes, the app RUNNING with 2 replicas, and every LB server whose node holds a
    replica UP (Serve runs a worker's proxy only while the node holds a replica: a node whose
    replica moved away has a draining, then no proxy, and is rightly DOWN in the LB)."""
    n = c.nodes()
    if not n or n["alive"] != 3:
        return False
    s = c.serve_status()
    if not s or s[0] != "RUNNING" or s[1] < 2:
        return False
    servers = c.lb_servers()
    ips = c.replica_ips()
    want = [w for w in ("worker-1", "worker-2") if c.ip(w) in ips]
    return bool(want) and all(servers.get(w) == "UP" for w in want)


def inject(c, fault):
    """Runs the fault; returns (t0, service whose Ray node id changes)."""
    if fault == "head-kill":
        h = c.cid("head")
        t0 = time.time()
        run(["docker", "kill", h])
        run(["docker", "start", h])
        return t0, "head"
    if fault == "gcs-kill":
        t0 = time.time()
        run(["docker", "exec", c.cid("head"), "pkill", "-9", "gcs_server"])
        return t0, "head"
    if fault == "head-recreate":
        t0 = time.time()
        run(["docker", "rm", "-f", c.cid("head")])
        p = c.compose("up", "-d", "--no-deps", "--no-build", "head", check=False)
        if p.returncode:  # say why, then once more
            log(f"{c.project}: compose up -d head failed: {(p.stderr or p.stdout).strip()[-800:]}")
            c.compose("up", "-d", "--no-deps", "--no-build", "head")
        c.remember()
        return t0, "head"
    if fault == "worker-restart":
        t0 = time.time()
        run(["docker", "restart", c.cid("worker-1")], timeout=60)
        return t0, "worker-1"
    raise ValueError(fault)


def node_id_of(c, nodes, service):
    ip = c.ip(service)
    for n in nodes["nodes"]:
        if n["alive"] and n["ip"] == ip:
            return n["id"]
    return None


def fault_run(c, fault, a):
    wait(lambda: healthy(c), 300, f"a healthy cluster before {fault}", every=2)
    log(f"{c.project}: before {fault}: LB servers {c.lb_servers()}, replicas on "
        f"{sorted(w for w in ('worker-1', 'worker-2') if c.ip(w) in c.replica_ips())}")
    before = c.nodes()
    victim = "head" if fault != "worker-restart" else "worker-1"
    old_id = node_id_of(c, before, victim)
    old_ip = c.ip(victim)
    load = Load(f"http://127.0.0.1:{a.serve_port}/", a.rate, a.timeout)
    load.start()
    time.sleep(a.lead)  # deliberate: steady load before the fault
    t0, _ = inject(c, fault)
    log(f"{c.project}: {fault} injected")
    t_nodes = t_serve = t_redeploy = None
    states = []
    deadline = t0 + a.recovery_timeout
    while time.time() < deadline:
        if t_nodes is None:
            n = c.nodes()
            if n and n["alive"] == 3 and old_id not in {x["id"] for x in n["nodes"] if x["alive"]}:
                t_nodes = time.time() - t0
                log(f"{c.project}: {fault}: 3 nodes alive after {t_nodes:.1f} s")
            time.sleep(0.5)
            continue
        s = c.serve_status()
        states.append(s[0] if s else f"unreachable: {c.last_err}")
        if s and s[0] == "absent" and t_redeploy is None:
            t_redeploy = time.time() - t0
            log(f"{c.project}: {fault}: the app is gone (no GCS FT): redeploying")
            c.deploy()
            continue
        if s and s[0] == "RUNNING" and s[1] >= 2:
            t_serve = time.time() - t0
            log(f"{c.project}: {fault}: app RUNNING after {t_serve:.1f} s")
            break
        time.sleep(0.5)
    # keep the load on for the window, and a few seconds past recovery
    end = max(t0 + a.window, time.time() + 5)
    time.sleep(max(0, end - time.time()))
    load.stop()
    new_ip = c.ip(victim)
    win = [r for r in load.results if r[0] >= t0]
    fails = [r for r in win if r[2] != "ok"]
    kinds = {}
    for r in fails:
        kinds[r[2]] = kinds.get(r[2], 0) + 1
    lat = [r[1] for r in win if r[2] == "ok"]
    lb = [l for l in c.lb_log(t0 - 1) if " serve serve_workers" in l or "serve/" in l]
    # httplog: ... status bytes - - termination_state actconn/feconn/beconn/srv_conn/retries queues ...
    lb_bad = [l for l in lb if not re.search(r" 200 \d+ - - ---- \d+/\d+/\d+/\d+/0 0/0 ", l)]
    res = dict(fault=fault, gcs_ft=c.gcs_ft, sent=len(win), failed=len(fails), kinds=kinds,
               p50=pct(lat, 50), p99=pct(lat, 99), max=max((r[1] for r in win), default=float("nan")),
               outage=(max(r[0] for r in fails) - min(r[0] for r in fails)) if fails else 0.0,
               nodes=t_nodes, serve=t_serve, redeployed=t_redeploy is not None,
               states=sorted(set(states)), ip_changed=(old_ip != new_ip), lb_bad=lb_bad, lb_lines=len(lb))
    print_run(res, c.project)
    return res


def fmt_t(x):
    return "-" if x is None else f"{x:.1f} s"


def print_run(r, project):
    mode = "GCS FT" if r["gcs_ft"] else "no GCS FT"
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(r["kinds"].items())) or "-"
    print(f"\n## {r['fault']} ({mode}, project {project})", flush=True)
    print(f"  requests sent {r['sent']}, failed {r['failed']} ({kinds})")
    if r["failed"]:
        print(f"  failures from first to last: {r['outage']:.1f} s")
    print(f"  latency of OK requests p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms; "
          f"max of all {r['max'] * 1000:.0f} ms")
    print(f"  3 Ray nodes alive after {fmt_t(r['nodes'])}; app RUNNING (2 replicas) after {fmt_t(r['serve'])}"
          f"{' (redeployed)' if r['redeployed'] else ''}; serve status seen: {', '.join(r['states']) or '-'}")
    if r["fault"] in ("head-recreate",):
        print(f"  head IP changed: {'yes' if r['ip_changed'] else 'no'}")
    print(f"  LB log lines not a clean 200 on the first try: {len(r['lb_bad'])} of {r['lb_lines']}")
    for l in r["lb_bad"][:12]:
        print(f"    {l}")
    sys.stdout.flush()


def table(results):
    print("\n| fault | GCS FT | sent | failed | failures by kind | p50 | p99 | max | 3 nodes alive | app RUNNING |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        kinds = "; ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items())) or "-"
        extra = " (redeployed)" if r["redeployed"] else ""
        print(f"| {r['fault']} | {'on' if r['gcs_ft'] else 'off'} | {r['sent']} | {r['failed']} | {kinds} | "
              f"{r['p50'] * 1000:.0f} ms | {r['p99'] * 1000:.0f} ms | {r['max'] * 1000:.0f} ms | "
              f"{fmt_t(r['nodes'])} | {fmt_t(r['serve'])}{extra} |")
    sys.stdout.flush()


def ensure_engine_image():
    if run(["docker", "image", "inspect", ENGINE_IMAGE], check=False).returncode == 0:
        return
    args = [os.path.join(ROOT, "scripts/build-images.sh"), "engine", "--no-vllm", "--engine-version", "stub-a"]
    if not os.environ.get("BASE_IMAGE") and not os.environ.get("ARGUS_BASE_IMAGE"):
        if run(["docker", "image", "inspect", "rayproject/ray:2.53.0-py311"], check=False).returncode:
            args.append("--local-base")
    env = dict(os.environ)
    if os.environ.get("ARGUS_BASE_IMAGE"):
        env.setdefault("BASE_IMAGE", os.environ["ARGUS_BASE_IMAGE"])
    log(f"building {ENGINE_IMAGE}")
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL, timeout=1800)


ROLL_CONFIG = SERVE_CONFIG.replace("        num_replicas: 2\n", "        num_replicas: 4\n        graceful_shutdown_timeout_s: 30\n")


class Clients:
    """Closed-loop clients, as LLM clients are: each sends, waits for the
    answer, sends the next; no retries. Records (phase, method, t, s, status)."""

    def __init__(self, url, posts, gets, timeout):
        self.url, self.timeout = url, timeout
        self.phase = "steady"
        self.records, self.lock = [], threading.Lock()
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self.loop, args=("POST",), daemon=True) for _ in range(posts)]
        self.threads += [threading.Thread(target=self.loop, args=("GET",), daemon=True) for _ in range(gets)]

    def loop(self, method):
        while not self.stop_ev.is_set():
            phase, t0, status = self.phase, time.time(), 0
            try:
                data = b'{"prompt": "hello"}' if method == "POST" else None
                req = urllib.request.Request(self.url, data=data, method=method,
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    r.read()
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            except (OSError, http.client.HTTPException):
                status = 0
            with self.lock:
                self.records.append((phase, method, t0, time.time() - t0, status))

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(self.timeout + 5)


def roll_run(c, a):
    """The --roll phases; prints the figures."""
    c.deploy(ROLL_CONFIG.replace("      model: stub\n", f"      model: stub\n      post_delay_s: {a.post_delay}\n"))
    wait(lambda: (c.serve_status() or ("", 0))[1] >= 4, 400, "4 replicas RUNNING", every=2)
    cl = Clients(f"http://127.0.0.1:{a.serve_port}/", a.posts, a.gets, 120)
    cl.start()
    time.sleep(a.lead * 4)  # deliberate: the steady baseline
    stops = {}

    def back():
        wait(lambda: (c.nodes() or {}).get("alive") == 3, 600, "3 Ray nodes alive", every=2)
        wait(lambda: (c.serve_status() or ("", 0))[1] >= 4, 600, "4 replicas RUNNING", every=2)

    for svc in ("worker-1", "worker-2", "head"):
        cl.phase = f"stop+start {svc}"
        cid = c.cid(svc)
        t0 = time.time()
        run(["docker", "stop", cid], timeout=300)
        stops[svc] = time.time() - t0
        log(f"{c.project}: docker stop {svc}: {stops[svc]:.1f} s")
        run(["docker", "start", cid])
        back()
        time.sleep(a.lead)  # deliberate: load on the whole cluster between phases
    cl.phase = "roll"
    v = c.env["ARGUS_NODE_IMAGE"]
    rolled = f"{v}-rolled" if ":" in v else f"{v}:rolled"
    run(["docker", "tag", v, rolled])
    t0 = time.time()
    p = run([os.path.join(ROOT, "scripts/roll-cluster.sh"), "--image", rolled, "--", "-p", c.project, *c.files],
            timeout=3600, cwd=ROOT, env=c.env)
    roll_s = time.time() - t0
    print(p.stdout, end="", flush=True)
    back()
    cl.phase = "after"
    time.sleep(a.lead * 4)  # deliberate: the baseline again
    cl.stop()
    print(f"\n## --roll ({'GCS FT' if c.gcs_ft else 'no GCS FT'}, project {c.project}): "
          f"{a.posts} POST clients ({a.post_delay} s handler), {a.gets} GET clients, no retries")
    print("| phase | sent | POST | failed (by method and status) | POST p50 | POST p99 |")
    print("|---|---|---|---|---|---|")
    order = ["steady"] + [f"stop+start {s}" for s in ("worker-1", "worker-2", "head")] + ["roll", "after"]
    for ph in order:
        rs = [r for r in cl.records if r[0] == ph]
        fails = {}
        for r in rs:
            if r[4] != 200:
                k = f"{r[1]} {r[4] or 'no answer'}"
                fails[k] = fails.get(k, 0) + 1
        lat = [r[3] for r in rs if r[1] == "POST" and r[4] == 200]
        print(f"| {ph} | {len(rs)} | {sum(1 for r in rs if r[1] == 'POST')} | "
              f"{', '.join(f'{k}: {n}' for k, n in sorted(fails.items())) or '0'} | "
              f"{pct(lat, 50):.2f} s | {pct(lat, 99):.2f} s |")
    print("docker stop (drain + Ray's stop): " + ", ".join(f"{k} {v:.1f} s" for k, v in stops.items())
          + f"; the whole roll {roll_s:.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="ft,noft", help="ft (GCS FT, the default of cluster-up) and/or noft")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"subset of {','.join(FAULTS)}")
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second")
    ap.add_argument("--window", type=float, default=45.0, help="seconds of load after each fault (at least)")
    ap.add_argument("--lead", type=float, default=5.0, help="seconds of load before each fault")
    ap.add_argument("--timeout", type=float, default=10.0, help="client timeout of one request")
    ap.add_argument("--recovery-timeout", type=float, default=240.0)
    ap.add_argument("--project", default="argus-bench-serve")
    ap.add_argument("--serve-port", type=int, default=18000)
    ap.add_argument("--dashboard-port", type=int, default=18265)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--roll", action="store_true", help="the drain phases instead of the faults (see above)")
    ap.add_argument("--posts", type=int, default=8, help="--roll: POST clients")
    ap.add_argument("--gets", type=int, default=2, help="--roll: GET clients")
    ap.add_argument("--post-delay", type=float, default=1.5, help="--roll: seconds the POST handler takes")
    a = ap.parse_args()
    faults = [f for f in a.faults.split(",") if f]
    for f in faults:
        if f not in FAULTS:
            ap.error(f"unknown fault {f}")
    modes = [m for m in a.modes.split(",") if m]
    if a.roll and a.modes == ap.get_default("modes"):
        modes = ["ft"]  # without GCS FT a head stop ends the app: nothing to roll through
    if set(modes) - {"ft", "noft"}:
        ap.error("--modes takes ft and/or noft")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not a.no_build:
        ensure_engine_image()
    results, build = [], not a.no_build
    for m in modes:
        c = Cluster(a, m == "ft")
        try:
            c.up(build)
            build = False
            if a.roll:
                roll_run(c, a)
                continue
            c.deploy()
            for f in faults:
                try:
                    results.append(fault_run(c, f, a))
                except SystemExit as e:  # the fault could not be run or the cluster did not come back
                    print(f"\n## {f} ({'GCS FT' if c.gcs_ft else 'no GCS FT'}): not run: {e}", flush=True)
        finally:
            c.down()
    if results:
        table(results)


if __name__ == "__main__":
    main()
