#!/usr/bin/env python3
"""Scale benchmark (issue 10): one head agent and N worker agents on one
shared folder, with a minimal stand-in `ray` so that the agents are what is
measured. See docs/scale.md for what the figures mean.

For each N, and each file-event mode (ARGUS_FILE_EVENTS on, then off):
  1. start a head agent (127.9.0.1) and N workers (127.9.x.y), each in its
     own PID namespace as in a container (the agent is PID 1 there, and its
     process-tree scans see its own node only);
  2. wait until every worker ran its stand-in `ray start` once;
  3. steady state over --steady seconds: CPU of all agents (schedstat),
     memory (Pss, Private_* from /proc/PID/smaps_rollup), and the opens and
     reads of head.json counted with an inotify watch (IN_OPEN, IN_ACCESS);
  4. a head change: the head is stopped, a new head instance starts at a new
     address (127.9.0.2); each worker's second `ray start` time minus the
     time the new record appeared gives the rejoin distribution;
  5. checks every worker started exactly twice (once, then one rejoin) and
     no agent died.

The agents' container janitor talks to the Docker socket every 30 s; by
default it is pointed at a missing socket (DOCKER_HOST) so that the shared
daemon is spared; --janitor keeps the real socket and also measures the
daemon's CPU.

fs.inotify.max_user_instances (128 by default, per uid, and all the agents
here run as one uid) is raised for the run when it is too low and we are
root, and restored afterwards; --no-raise keeps it, so that most workers
degrade to polling.

Usage: scripts/bench-scale.py [--n 100 300 1000] [--check] [--events on off]
                              [--steady 30] [--json FILE] [--bin PATH]
--check exits 1 unless every worker rejoined exactly once and no agent died.
"""
import argparse, ctypes, json, os, shutil, signal, socket, statistics, struct, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_RAY = os.path.join(ROOT, "tests/fixtures/fake-ray")
INOTIFY_LIMIT = "/proc/sys/fs/inotify/max_user_instances"

# The stand-in `ray`: the head is the test fixture (it opens the GCS port and
# the raylet socket the agent checks); a worker records the time of its
# start, starts a `raylet` (a copy of sleep) as a real `ray start --block`
# does, and blocks.
STANDIN = """#!/bin/sh
case " $* " in *" --head "*) exec python3 {fake} "$@";; esac
echo "$(date +%s.%N)" >> "$BENCH_STARTS"
"$FAKE_RAY_BINDIR/raylet" 1000000000 &
exec sleep 1000000000
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def worker_ip(i):
    return f"127.9.{1 + i // 250}.{1 + i % 250}"


class OpenCounter:
    """Counts IN_OPEN and IN_ACCESS events on one file name in a folder."""

    IN_ACCESS, IN_OPEN = 0x1, 0x20

    def __init__(self, folder, name):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(0)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self.fd, folder.encode(), self.IN_ACCESS | self.IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        self.name = name.encode()
        self.opens = self.reads = 0
        self.overflow = 0
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except OSError:
                return
            off = 0
            while off < len(buf):
                _, mask, _, ln = struct.unpack_from("iIII", buf, off)
                name = buf[off + 16: off + 16 + ln].rstrip(b"\0")
                off += 16 + ln
                if mask & 0x4000:  # IN_Q_OVERFLOW
                    self.overflow += 1
                if name == self.name:
                    self.opens += bool(mask & self.IN_OPEN)
                    self.reads += bool(mask & self.IN_ACCESS)

    def snapshot(self):
        return self.opens, self.reads


def agent_pid(wrapper_pid):
    """The agent inside `unshare --fork`: the wrapper's only child."""
    try:
        with open(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if kids else None
    except OSError:
        return None


def cpu_seconds(pid):
    """CPU time of all of `pid`'s threads, in seconds, from schedstat (the
    scheduler's nanosecond run time). Not utime + stime from /proc/PID/stat:
    those are charged per clock tick (10 ms) to whoever runs when the tick
    fires, and an agent that wakes on timers for some microseconds right
    after a tick is almost never charged (they read ~0 for a thousand idle
    agents)."""
    total = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
    except OSError:
        return 0.0
    return total / 1e9


def smaps(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return out


def threads(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Cluster:
    def __init__(self, args, n, events, tmp):
        self.args, self.n, self.events, self.tmp = args, n, events, tmp
        self.shared = os.path.join(tmp, "shared")
        # The agents' state folders (status.json, rewritten every 10 s) on
        # memory, as docker-compose.yaml mounts a tmpfs at /run/argus;
        # --state-on-disk keeps them beside the shared folder.
        self.state = (os.path.join(tmp, "state") if args.state_on_disk
                      else tempfile.mkdtemp(prefix="argus-scale-state-", dir="/dev/shm"))
        self.head_file = os.path.join(self.shared, "ray/discovery/argus-ray/head.json")
        os.makedirs(os.path.join(tmp, "bin"), exist_ok=True)
        os.makedirs(os.path.join(tmp, "starts"), exist_ok=True)
        for n_ in ("raylet", "gcs_server"):
            shutil.copy("/bin/sleep", os.path.join(tmp, "bin", n_))
        self.ray = os.path.join(tmp, "bin", "ray")
        with open(self.ray, "w") as f:
            f.write(STANDIN.format(fake=FAKE_RAY))
        os.chmod(self.ray, 0o755)
        self.procs = {}

    def env(self, name, role, ip):
        e = dict(
            PATH=os.environ["PATH"], HOME=self.tmp, ARGUS_ROLE=role, ARGUS_NODE_IP=ip,
            ARGUS_SHARED_ROOT=self.shared,
            ARGUS_STATE_DIR=os.path.join(self.state, name),
            ARGUS_LOG_DIR=os.path.join(self.shared, "common/logs", name),
            ARGUS_RAY_BIN=self.ray, RAY_TMPDIR=os.path.join(self.tmp, "raytmp", name),
            FAKE_RAY_BINDIR=os.path.join(self.tmp, "bin"),
            BENCH_STARTS=os.path.join(self.tmp, "starts", name),
            ARGUS_PREFLIGHT="skip", ARGUS_DISABLE_PRESTART="1",
            ARGUS_POLL_S=str(self.args.poll), ARGUS_FILE_EVENTS=self.events,
            ARGUS_RAY_PORT=str(self.head_port), ARGUS_DASHBOARD_PORT=str(self.dash_port),
        )
        if not self.args.janitor:
            e["DOCKER_HOST"] = "unix://" + os.path.join(self.tmp, "no-docker.sock")
        return e

    def spawn(self, name, role, ip):
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", self.args.bin, "run"]
        self.procs[name] = subprocess.Popen(
            cmd, env=self.env(name, role, ip), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def agents(self, names=None):
        out = {}
        for name, p in self.procs.items():
            if names is None or name in names:
                pid = agent_pid(p.pid)
                if pid:
                    out[name] = pid
        return out

    def starts(self, name):
        try:
            with open(os.path.join(self.tmp, "starts", name)) as f:
                return [float(x) for x in f.read().split()]
        except OSError:
            return []

    def record(self):
        try:
            with open(self.head_file, "rb") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    def stop(self, name, timeout=30):
        p = self.procs[name]
        pid = agent_pid(p.pid)
        if pid:
            os.kill(pid, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop_all(self):
        for name, p in self.procs.items():
            pid = agent_pid(p.pid)
            if pid and p.poll() is None:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.time() + 60
        for p in self.procs.values():
            try:
                p.wait(max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_until(what, cond, timeout, every=0.05):
    until = time.time() + timeout
    while time.time() < until:
        if cond():
            return True
        time.sleep(every)
    print(f"  timed out after {timeout:.0f}s waiting for {what}", file=sys.stderr)
    return False


def steady(c, names, seconds):
    counter = OpenCounter(os.path.dirname(c.head_file), "head.json")
    pids = c.agents(names)
    dockerd = [int(x) for x in subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()]
    t0 = time.time()
    cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
    d0 = sum(cpu_seconds(p) for p in dockerd)
    o0 = counter.snapshot()
    time.sleep(seconds)
    o1 = counter.snapshot()
    cpu1 = {n: cpu_seconds(p) for n, p in pids.items()}
    d1 = sum(cpu_seconds(p) for p in dockerd)
    dt = time.time() - t0
    os.close(counter.fd)
    workers = [n for n in pids if n != "head-a"]
    mem = {n: smaps(pids[n]) for n in workers}
    priv = [m.get("Private_Clean", 0) + m.get("Private_Dirty", 0) for m in mem.values()]
    cpu_w = sum(cpu1[n] - cpu0[n] for n in workers) / dt
    return dict(
        seconds=round(dt, 1),
        cpu_all_agents_pct_of_core=round(100 * sum(cpu1[n] - cpu0[n] for n in pids) / dt, 2),
        cpu_per_worker_pct_of_core=round(100 * cpu_w / max(1, len(workers)), 4),
        dockerd_cpu_pct_of_core=round(100 * (d1 - d0) / dt, 2) if dockerd else None,
        pss_total_mib=round(sum(m.get("Pss", 0) for m in mem.values()) / 1024, 1),
        pss_per_worker_kib=round(statistics.mean(m.get("Pss", 0) for m in mem.values())),
        private_per_worker_kib=dict(mean=round(statistics.mean(priv)), max=max(priv)),
        rss_per_worker_kib=round(statistics.mean(m.get("Rss", 0) for m in mem.values())),
        threads_per_worker=statistics.mean(threads(pids[n]) for n in workers),
        record_opens_per_s=round((o1[0] - o0[0]) / dt, 1),
        record_reads_per_s=round((o1[1] - o0[1]) / dt, 1),
        opens_per_worker_per_poll=round((o1[0] - o0[0]) / dt * c.args.poll / max(1, len(workers)), 3),
        inotify_overflows=counter.overflow,
    )


def run_one(args, n, events):
    tmp = tempfile.mkdtemp(prefix=f"argus-scale-{n}-{events}-", dir=args.tmp)
    c = Cluster(args, n, events, tmp)
    c.head_port, c.dash_port = free_port(), free_port()
    res = dict(n=n, file_events=events, ok=False, problems=[])
    try:
        c.spawn("head-a", "head", "127.9.0.1")
        if not wait_until("the first head's record", lambda: (c.record() or {}).get("head_ip") == "127.9.0.1", 60):
            res["problems"].append("head A never published")
            return res
        names = [f"w{i}" for i in range(n)]
        t = time.time()
        for i, name in enumerate(names):
            c.spawn(name, "worker", worker_ip(i))
        if not wait_until("every worker's first ray start", lambda: all(c.starts(x) for x in names), 120 + n * 0.2, 0.5):
            res["problems"].append(f"{sum(1 for x in names if not c.starts(x))} workers never started ray")
            return res
        res["startup_s"] = round(time.time() - t, 1)
        states = [json.load(open(os.path.join(c.state, x, "status.json"))).get("file_events", "?") for x in names]
        res["workers_file_events"] = {}
        for s in states:
            k = s.split(":")[0]
            res["workers_file_events"][k] = res["workers_file_events"].get(k, 0) + 1
        if args.steady > 0:
            res["steady"] = steady(c, ["head-a"] + names, args.steady)

        # The head change: a new instance at a new address.
        c.stop("head-a")
        c.spawn("head-b", "head", "127.9.0.2")
        seen = {}

        def new_record():
            r = c.record()
            if r and r.get("head_ip") == "127.9.0.2" and r.get("state") == "running":
                seen["t0"] = os.stat(c.head_file).st_mtime
                return True
            return False

        if not wait_until("the new head's record", new_record, 60):
            res["problems"].append("head B never published")
            return res
        t0 = seen["t0"]
        window = args.poll + args.poll / 2 + 30
        wait_until("every worker's rejoin", lambda: all(len(c.starts(x)) >= 2 for x in names), window, 0.5)
        # Once all rejoined, a quiet period of one poll plus the jitter
        # shows whether anyone starts a third time.
        time.sleep(args.poll * 1.5 + 1)
        counts = {x: len(c.starts(x)) for x in names}
        delays = sorted(c.starts(x)[1] - t0 for x in names if counts[x] >= 2)
        alive = c.agents()
        dead = [x for x in ["head-b"] + names if x not in alive or c.procs[x].poll() is not None]
        res["rejoin"] = dict(
            rejoined=len(delays), exactly_once=sum(1 for v in counts.values() if v == 2),
            more_than_once=sum(1 for v in counts.values() if v > 2),
            never=sum(1 for v in counts.values() if v < 2),
        )
        if delays:
            buckets = {}
            for d in delays:
                b = int(d * 10)
                buckets[b] = buckets.get(b, 0) + 1
            res["rejoin"].update(
                min_s=round(delays[0], 3), median_s=round(statistics.median(delays), 3),
                p99_s=round(pct(delays, 99), 3), max_s=round(delays[-1], 3),
                max_per_100ms=max(buckets.values()),
                max_per_100ms_pct=round(100 * max(buckets.values()) / n, 1),
                per_100ms={f"{b / 10:.1f}": buckets[b] for b in sorted(buckets)},
            )
        res["dead_agents"] = dead
        if res["rejoin"]["exactly_once"] != n:
            res["problems"].append(f"rejoins: {res['rejoin']}")
        if dead:
            res["problems"].append(f"agents died: {dead[:10]}")
        res["ok"] = not res["problems"]
        return res
    finally:
        c.stop_all()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(c.state, ignore_errors=True)


def table(results):
    for r in results:
        print(f"\nN = {r['n']}, file events {r['file_events']}: {'OK' if r['ok'] else 'FAILED: ' + '; '.join(r['problems'])}")
        if "workers_file_events" in r:
            print(f"  workers' file events:        {r['workers_file_events']}   (startup {r.get('startup_s')} s)")
        s = r.get("steady")
        if s:
            print(f"  CPU, all agents:             {s['cpu_all_agents_pct_of_core']} % of a core ({s['cpu_per_worker_pct_of_core']} % per worker) over {s['seconds']} s")
            if s["dockerd_cpu_pct_of_core"] is not None:
                print(f"  dockerd CPU meanwhile:       {s['dockerd_cpu_pct_of_core']} % of a core")
            print(f"  memory per worker:           private {s['private_per_worker_kib']['mean']} KiB (max {s['private_per_worker_kib']['max']}), PSS {s['pss_per_worker_kib']} KiB, RSS {s['rss_per_worker_kib']} KiB, {s['threads_per_worker']:.1f} threads")
            print(f"  PSS, all workers:            {s['pss_total_mib']} MiB")
            print(f"  head.json opens / reads:     {s['record_opens_per_s']} / {s['record_reads_per_s']} per s  ({s['opens_per_worker_per_poll']} opens per worker per poll period)")
        j = r.get("rejoin")
        if j:
            print(f"  rejoined exactly once:       {j['exactly_once']} of {r['n']} (more than once {j['more_than_once']}, never {j['never']})")
            if "min_s" in j:
                print(f"  ray start after the change:  min {j['min_s']} s, median {j['median_s']} s, p99 {j['p99_s']} s, max {j['max_s']} s")
                print(f"  busiest 100 ms bucket:       {j['max_per_100ms']} starts ({j['max_per_100ms_pct']} % of N)")
                print("  starts per 100 ms:           " + " ".join(f"{k}:{v}" for k, v in j["per_100ms"].items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--events", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--poll", type=float, default=5.0)
    ap.add_argument("--steady", type=float, default=30.0, help="seconds of steady-state measurement (0: skip)")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every worker rejoined exactly once and no agent died")
    ap.add_argument("--janitor", action="store_true", help="let the agents' container janitor reach the real Docker socket")
    ap.add_argument("--no-raise", action="store_true", help=f"do not raise {INOTIFY_LIMIT} for the run")
    ap.add_argument("--json", default=os.path.join(ROOT, "target/bench-scale.json"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/argus-agent"))
    ap.add_argument("--tmp", default=None, help="folder for the run's shared folder")
    ap.add_argument("--state-on-disk", action="store_true",
                    help="agents' state folders under --tmp instead of /dev/shm (the image mounts a tmpfs there)")
    ap.add_argument("--keep", action="store_true", help="keep the run's folders")
    args = ap.parse_args()
    for tool in ("unshare", "pgrep", "date", "sleep"):
        if not shutil.which(tool):
            sys.exit(f"bench-scale: `{tool}` is missing (util-linux, procps, coreutils)")
    if os.geteuid() != 0:
        sys.exit("bench-scale: needs root (each agent runs in its own PID namespace, like a container)")
    if not os.path.exists(args.bin):
        print("bench-scale: building the release binary", file=sys.stderr)
        subprocess.run(["cargo", "build", "--release", "-p", "argus-agent"], cwd=ROOT, check=True)
    old_limit = None
    need = max(args.n) + 256
    if "on" in args.events and not args.no_raise:
        cur = int(open(INOTIFY_LIMIT).read())
        if cur < need:
            old_limit = cur
            with open(INOTIFY_LIMIT, "w") as f:
                f.write(str(need))
            print(f"bench-scale: {INOTIFY_LIMIT} raised from {cur} to {need} for the run", file=sys.stderr)
    results = []
    try:
        for n in args.n:
            for ev in args.events:
                print(f"bench-scale: N = {n}, file events {ev} ...", file=sys.stderr, flush=True)
                results.append(run_one(args, n, ev))
    finally:
        if old_limit is not None:
            with open(INOTIFY_LIMIT, "w") as f:
                f.write(str(old_limit))
            print(f"bench-scale: {INOTIFY_LIMIT} restored to {old_limit}", file=sys.stderr)
    table(results)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(poll_s=args.poll, janitor=args.janitor, results=results), f, indent=1)
    print(f"\nraw figures: {args.json}")
    if args.check and not all(r["ok"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
