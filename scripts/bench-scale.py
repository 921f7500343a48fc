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

Host limits that N agents reach (each worker holds an inotify instance and
a watch, ~14 tasks, a PID and a mount namespace, all as one uid):
fs.inotify.max_user_instances / max_user_watches, kernel.pid_max /
threads-max, user.max_pid_namespaces / max_mnt_namespaces, fs.file-max are
raised for the run from what is in use now plus what N needs, and restored
afterwards unless something else changed them meanwhile (e.g. a concurrent
run); what cannot be raised (a cgroup's pids.max, memory) stops the run
with one line. --no-raise keeps the inotify limits, so that workers beyond
them degrade to polling. The open counter's own inotify instance is taken
once, before any agent starts, so the agents cannot use it up.

Usage: scripts/bench-scale.py [--n 100 300 1000] [--check] [--events on off]
                              [--steady 30] [--json FILE] [--bin PATH]
--check exits 1 unless every worker rejoined exactly once and no agent died.
"""
import argparse, ctypes, json, os, resource, select, shutil, signal, socket, statistics, struct, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_RAY = os.path.join(ROOT, "tests/fixtures/fake-ray")
INOTIFY_LIMIT = "/proc/sys/fs/inotify/max_user_instances"
# Per worker, measured at N = 20 with a debug build on a 2-core box: 14
# tasks (unshare, the agent's threads, the stand-in's raylet and sleep),
# ~3 MiB of PSS for the lot (release: less). Rounded up: a rejoin briefly
# runs the old and the new stand-in side by side.
TASKS_PER_WORKER = 20
MIB_PER_WORKER = 4

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
    """Counts IN_OPEN and IN_ACCESS events on one file name in a folder.

    Its inotify instance is created once, in main(), before any agent
    starts: every worker agent holds an instance of its own for file events,
    all as the same uid, so an instance created once N agents run fails
    with EMFILE at fs.inotify.max_user_instances (or when a concurrent run
    put the limit back under this one). Each run only adds a watch on its
    folder (watch()) and removes it after the steady window (unwatch())."""

    IN_ACCESS, IN_OPEN, IN_Q_OVERFLOW = 0x1, 0x20, 0x4000

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.wd, self.name = -1, b""
        self.opens = self.reads = self.overflow = 0
        self.stop_r, self.stop_w = os.pipe()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def watch(self, folder, name):
        self.unwatch()
        wd = self.libc.inotify_add_watch(self.fd, folder.encode(), self.IN_ACCESS | self.IN_OPEN)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch {folder}: {os.strerror(e)} "
                             f"(fs.inotify.max_user_watches = {read_int('/proc/sys/fs/inotify/max_user_watches')})")
        self.name, self.wd = name.encode(), wd

    def unwatch(self):
        if self.wd >= 0:
            wd, self.wd = self.wd, -1
            self.libc.inotify_rm_watch(self.fd, wd)

    def run(self):
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        p.register(self.stop_r, select.POLLIN)
        while True:
            if any(fd == self.stop_r for fd, _ in p.poll()):
                return
            while True:
                try:
                    buf = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    break
                off = 0
                while off < len(buf):
                    wd, mask, _, ln = struct.unpack_from("iIII", buf, off)
                    name = buf[off + 16: off + 16 + ln].rstrip(b"\0")
                    off += 16 + ln
                    if mask & self.IN_Q_OVERFLOW:
                        self.overflow += 1
                    elif wd == self.wd and name == self.name:
                        self.opens += bool(mask & self.IN_OPEN)
                        self.reads += bool(mask & self.IN_ACCESS)

    def snapshot(self):
        return self.opens, self.reads, self.overflow

    def close(self):
        os.write(self.stop_w, b"x")
        self.thread.join(5)
        for fd in (self.fd, self.stop_r, self.stop_w):
            os.close(fd)


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def sysctl_name(path):
    return path[len("/proc/sys/"):].replace("/", ".")


def in_use(uid):
    """What this host holds now: tasks (all users), the file handles of
    fs.file-nr, distinct PID and mount namespaces, and `uid`'s inotify
    instances and watches (the limits are per uid; a descriptor shared
    after a fork counts twice, which only raises more)."""
    u = dict(tasks=0, instances=0, watches=0, files=0)
    pidns, mntns = set(), set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        base = f"/proc/{pid}"
        try:
            u["tasks"] += len(os.listdir(base + "/task"))
            pidns.add(os.readlink(base + "/ns/pid"))
            mntns.add(os.readlink(base + "/ns/mnt"))
            if os.stat(base).st_uid != uid:
                continue
            fds = os.listdir(base + "/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{base}/fd/{fd}") != "anon_inode:inotify":
                    continue
                with open(f"{base}/fdinfo/{fd}") as f:
                    u["watches"] += f.read().count("inotify wd:")
                u["instances"] += 1
            except OSError:
                pass
    u["pidns"], u["mntns"] = len(pidns), len(mntns)
    u["files"] = read_int("/proc/sys/fs/file-nr") or 0
    return u


class HostLimits:
    """Raises, for the run, the host limits that N agents would reach, and
    puts them back afterwards; what cannot be raised stops the run with one
    line (sys.exit), before any agent starts."""

    def __init__(self):
        self.changed = []  # (path, value before, value set)

    def raise_to(self, path, need, why, hint=""):
        cur = read_int(path)
        if cur is None or cur >= need:  # absent on this kernel, or enough
            return
        try:
            with open(path, "w") as f:
                f.write(str(need))
        except OSError as e:
            sys.exit(f"bench-scale: {why} needs {sysctl_name(path)} >= {need} (now {cur}) and it cannot be "
                     f"raised: {e.strerror}; run `sysctl -w {sysctl_name(path)}={need}` as root on the host{hint}")
        self.changed.append((path, cur, need))
        print(f"bench-scale: {sysctl_name(path)} raised from {cur} to {need} for the run ({why})", file=sys.stderr)

    def prepare(self, args):
        n, heads = max(args.n), 2
        u = in_use(os.geteuid())
        if "on" in args.events and not args.no_raise:
            why = f"{n} agents' file events (an inotify instance and a watch each, one uid)"
            hint = ", or pass --no-raise (workers beyond the limit then poll alone)"
            # user.* is this user namespace's own limit (on the host, the
            # same value as fs.inotify.*; in a child namespace both count).
            for path in ("/proc/sys/fs/inotify/max_user_instances", "/proc/sys/user/max_inotify_instances"):
                self.raise_to(path, u["instances"] + n + heads + 1 + 256, why, hint)
            for path in ("/proc/sys/fs/inotify/max_user_watches", "/proc/sys/user/max_inotify_watches"):
                self.raise_to(path, u["watches"] + n + heads + 1 + 1024, why, hint)
        tasks = u["tasks"] + n * TASKS_PER_WORKER + 1024
        why = f"{n} workers (~{TASKS_PER_WORKER} tasks each)"
        self.raise_to("/proc/sys/kernel/pid_max", tasks, why)
        self.raise_to("/proc/sys/kernel/threads-max", tasks, why)
        why = f"{n} agents (each in a PID and a mount namespace)"
        self.raise_to("/proc/sys/user/max_pid_namespaces", u["pidns"] + n + heads + 256, why)
        self.raise_to("/proc/sys/user/max_mnt_namespaces", u["mntns"] + n + heads + 256, why)
        self.raise_to("/proc/sys/fs/file-max", u["files"] + n * 64 + 4096, f"{n} agents' open files")
        # This process's own limits, inherited by the agents (no restore
        # needed). The script itself holds a handful of descriptors
        # whatever N is (no pipes to the agents).
        for lim, name, need in ((resource.RLIMIT_NPROC, "processes (ulimit -u)", tasks),
                                (resource.RLIMIT_NOFILE, "open files (ulimit -n)", 1024)):
            soft, hard = resource.getrlimit(lim)
            if soft != resource.RLIM_INFINITY and soft < need:
                new_hard = hard if hard == resource.RLIM_INFINITY or hard >= need else need
                try:
                    resource.setrlimit(lim, (need, new_hard))
                except (OSError, ValueError) as e:
                    sys.exit(f"bench-scale: N = {n} needs a limit of {need} {name}, it is {soft} (hard {hard}) and cannot be raised: {e}")
        check_cgroup_tasks(n * TASKS_PER_WORKER + 256)
        avail = next((int(l.split()[1]) // 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:")), None)
        need = n * MIB_PER_WORKER + 256
        if avail is not None and avail < need:
            sys.exit(f"bench-scale: N = {n} needs about {need} MiB of memory ({MIB_PER_WORKER} MiB per worker with its stand-in ray) and {avail} MiB are available")

    def restore(self):
        for path, before, value in reversed(self.changed):
            cur = read_int(path)
            if cur != value:
                print(f"bench-scale: {sysctl_name(path)} is {cur}, not the {value} this run set: something else changed it "
                      f"meanwhile, left as is (it was {before} before the run)", file=sys.stderr)
                continue
            try:
                with open(path, "w") as f:
                    f.write(str(before))
                print(f"bench-scale: {sysctl_name(path)} restored to {before}", file=sys.stderr)
            except OSError as e:
                print(f"bench-scale: cannot restore {sysctl_name(path)} to {before}: {e.strerror}", file=sys.stderr)
        self.changed = []


def check_cgroup_tasks(need):
    """A task limit of this process's cgroup or an ancestor (systemd's
    TasksMax, e.g. a login session's user slice) is not raised here: it
    belongs to whoever set it. One line if it is too low."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if ctrls == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            root = "/sys/fs/cgroup"
        elif "pids" in ctrls.split(","):
            root = "/sys/fs/cgroup/pids"
        else:
            continue
        while True:
            d = os.path.join(root, path.lstrip("/"))
            try:
                mx = open(os.path.join(d, "pids.max")).read().strip()
                cur = int(open(os.path.join(d, "pids.current")).read())
            except (OSError, ValueError):
                mx = "max"
            if mx != "max" and int(mx) - cur < need:
                sys.exit(f"bench-scale: cgroup {path} allows {mx} tasks, {cur} are in use, and the agents need ~{need} more: "
                         f"run it from a cgroup without that limit, e.g. `systemd-run --scope -p TasksMax=infinity {' '.join(sys.argv)}`")
            if path in ("", "/"):
                break
            path = os.path.dirname(path)


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


def by_thread_name(pid, read):
    """`read(task_folder)` of each of `pid`'s threads, summed by thread name
    (comm: tokio's workers, `proxy-watch`, `signals`, ...); a thread that
    ends meanwhile, or whose value cannot be read, is left out."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        task = f"/proc/{pid}/task/{t}"
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            v = read(task)
        except (OSError, ValueError, IndexError, StopIteration):
            continue
        out[name] = out.get(name, 0) + v
    return out


def _cpu_seconds(task):
    with open(f"{task}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _voluntary_switches(task):
    with open(f"{task}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches:"))


def cpu_by_thread(pid):
    """CPU seconds of each of `pid`'s threads by name, from schedstat."""
    return by_thread_name(pid, _cpu_seconds)


def wakeups_by_thread(pid):
    """Voluntary context switches of `pid`'s threads by name: how often each
    blocked and was woken (a count, unlike the CPU time, that a loaded or
    slower machine does not change)."""
    return by_thread_name(pid, _voluntary_switches)


def wakeups_per_minute(before, after, names, dt):
    """Wake-ups per agent per minute, by thread name, over `names`."""
    acc = {}
    for n in names:
        a, b = after.get(n, {}), before.get(n, {})
        for k, v in a.items():
            acc[k] = acc.get(k, 0) + v - b.get(k, 0)
    per = 60 / dt / max(1, len(names))
    return {k: round(v * per, 1) for k, v in sorted(acc.items(), key=lambda kv: -kv[1]) if v > 0}


def by_thread_delta(before, after, names, dt):
    """% of a core per thread name over `names`, from two cpu_by_thread maps
    per agent (threads that ended in between count from 0)."""
    acc = {}
    for n in names:
        a, b = after.get(n, {}), before.get(n, {})
        for k, v in a.items():
            acc[k] = acc.get(k, 0) + v - b.get(k, 0)
    return {k: round(100 * v / dt, 3) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}


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


def count_opens(c, seconds, counter):
    """Opens and reads of the record over `seconds`, and the overflows."""
    try:
        counter.watch(os.path.dirname(c.head_file), "head.json")
    except OSError as e:
        return None, f"open counter: {e.strerror}"
    o0 = counter.snapshot()
    t0 = time.time()
    time.sleep(seconds)
    o1 = counter.snapshot()
    dt = time.time() - t0
    counter.unwatch()
    return (o1[0] - o0[0], o1[1] - o0[1], o1[2] - o0[2], dt), None


def steady(c, names, seconds, counter, opens_apart=True):
    """The steady-state figures. The open counter's watch asks the kernel
    for an event at every open and read of the record; every worker's read
    then walks the folder's whole list of inotify marks (one a worker, N in
    all) in the reader's own system call, so its CPU grows with N for a
    cost no production node has (nobody watches the folder for opens).
    With `opens_apart` the CPU, wake-up and memory window runs without the
    watch and the opens are counted in a window of their own after it."""
    pids = c.agents(names)
    dockerd = [int(x) for x in subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()]
    if not opens_apart:
        try:
            counter.watch(os.path.dirname(c.head_file), "head.json")
        except OSError as e:
            return dict(problem=f"open counter: {e.strerror}")
    t0 = time.time()
    cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
    th0 = {n: cpu_by_thread(p) for n, p in pids.items()}
    wk0 = {n: wakeups_by_thread(p) for n, p in pids.items()}
    d0 = sum(cpu_seconds(p) for p in dockerd)
    o0 = counter.snapshot()
    time.sleep(seconds)
    o1 = counter.snapshot()
    cpu1 = {n: cpu_seconds(p) for n, p in pids.items()}
    th1 = {n: cpu_by_thread(p) for n, p in pids.items()}
    wk1 = {n: wakeups_by_thread(p) for n, p in pids.items()}
    d1 = sum(cpu_seconds(p) for p in dockerd)
    dt = time.time() - t0
    counter.unwatch()  # no counting (Python wake-ups) during the rejoin
    opens = (o1[0] - o0[0], o1[1] - o0[1], o1[2] - o0[2], dt)
    if opens_apart:
        opens, problem = count_opens(c, seconds, counter)
        if problem:
            return dict(problem=problem)
    workers = [n for n in pids if n != "head-a"]
    mem = {n: smaps(pids[n]) for n in workers}
    priv = [m.get("Private_Clean", 0) + m.get("Private_Dirty", 0) for m in mem.values()]
    cpu_w = sum(cpu1[n] - cpu0[n] for n in workers) / dt
    o_open, o_read, o_over, o_dt = opens
    return dict(
        seconds=round(dt, 1),
        opens_counted="apart" if opens_apart else "during",
        cpu_all_agents_pct_of_core=round(100 * sum(cpu1[n] - cpu0[n] for n in pids) / dt, 2),
        cpu_per_worker_pct_of_core=round(100 * cpu_w / max(1, len(workers)), 4),
        cpu_head_pct_of_core=round(100 * sum(cpu1[n] - cpu0[n] for n in pids if n not in workers) / dt, 3),
        cpu_by_thread_workers=by_thread_delta(th0, th1, workers, dt),
        cpu_by_thread_head=by_thread_delta(th0, th1, [n for n in pids if n not in workers], dt),
        wakeups_per_worker_minute=wakeups_per_minute(wk0, wk1, workers, dt),
        dockerd_cpu_pct_of_core=round(100 * (d1 - d0) / dt, 2) if dockerd else None,
        pss_total_mib=round(sum(m.get("Pss", 0) for m in mem.values()) / 1024, 1),
        pss_per_worker_kib=round(statistics.mean(m.get("Pss", 0) for m in mem.values())),
        private_per_worker_kib=dict(mean=round(statistics.mean(priv)), max=max(priv)),
        rss_per_worker_kib=round(statistics.mean(m.get("Rss", 0) for m in mem.values())),
        threads_per_worker=statistics.mean(threads(pids[n]) for n in workers),
        record_opens_per_s=round(o_open / o_dt, 1),
        record_reads_per_s=round(o_read / o_dt, 1),
        opens_per_worker_per_poll=round(o_open / o_dt * c.args.poll / max(1, len(workers)), 3),
        inotify_overflows=o_over,
    )


def run_one(args, n, events, counter):
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
            # Idle means nothing changed for a while: the checks that back
            # off after a change (the Serve-proxy watch: 1 s, doubling to
            # 30 s) have reached their slow pace.
            time.sleep(args.settle)
            res["settle_s"] = args.settle
            res["steady"] = steady(c, ["head-a"] + names, args.steady, counter,
                                   opens_apart=args.count_opens == "apart")
            if "problem" in res["steady"]:
                res["problems"].append(res["steady"]["problem"])
                return res

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
        counter.unwatch()
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
            print(f"  of which the head:           {s['cpu_head_pct_of_core']} % of a core")
            print("  workers by thread (% core):  " + ", ".join(f"{k} {v}" for k, v in s["cpu_by_thread_workers"].items()))
            print("  head by thread (% core):     " + ", ".join(f"{k} {v}" for k, v in s["cpu_by_thread_head"].items()))
            w = s["wakeups_per_worker_minute"]
            print(f"  wake-ups a worker a minute:  {round(sum(w.values()), 1)}: " + ", ".join(f"{k} {v}" for k, v in w.items()))
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
    ap.add_argument("--settle", type=float, default=0.0, help="seconds to wait after the last worker started before the steady-state window")
    ap.add_argument("--count-opens", choices=["apart", "during"], default="apart",
                    help="count the record's opens in a window of their own after the CPU window (apart), "
                         "or during it (the counter's inotify watch then adds its cost to every read: see steady())")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every worker rejoined exactly once and no agent died")
    ap.add_argument("--janitor", action="store_true", help="let the agents' container janitor reach the real Docker socket")
    ap.add_argument("--no-raise", action="store_true", help="do not raise fs.inotify.max_user_instances / max_user_watches for the run")
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
    # SIGTERM and SIGHUP unwind like ^C, so that the limits are restored.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    limits, counter, results = HostLimits(), None, []
    try:
        limits.prepare(args)
        try:
            counter = OpenCounter()
        except OSError as e:
            sys.exit(f"bench-scale: cannot create the open counter's inotify instance: {e.strerror} "
                     f"(fs.inotify.max_user_instances = {read_int(INOTIFY_LIMIT)}, "
                     f"{in_use(os.geteuid())['instances']} in use by this uid)")
        for n in args.n:
            for ev in args.events:
                print(f"bench-scale: N = {n}, file events {ev} ...", file=sys.stderr, flush=True)
                results.append(run_one(args, n, ev, counter))
    finally:
        if counter:
            counter.close()
        limits.restore()
    table(results)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(poll_s=args.poll, janitor=args.janitor, results=results), f, indent=1)
    print(f"\nraw figures: {args.json}")
    if args.check and not all(r["ok"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
