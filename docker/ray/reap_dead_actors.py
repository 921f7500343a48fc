"""Kills this node's Ray workers whose actor the GCS already holds DEAD.

Why: Ray 2.53.0's GCS forgets, when it restarts (GCS fault tolerance: the
head container killed and started again), the raylet address of every actor
it restores as ALIVE (``local_raylet_address_`` is not persisted to Redis).
A later ``ray.kill`` of such an actor (Serve does one for every replica it
stops: scale down, deleted application, ``serve shutdown``) marks it DEAD but
sends nothing to its node; the GCS log says

    gcs_actor_manager.cc:1828: Not sending KillLocalActorRequest because
    Actor has not been assigned a lease actor_id=...

and the worker process (for an ``image_uri``/``container`` actor: its engine
container) keeps running and keeps its resources in the raylet for good.
Fixed upstream after 2.53 (ray-project/ray#63763, PR #63764).

The node image carries it as /opt/argus/reap_dead_actors.py, and a worker
agent whose Ray rode a head restart through runs it every 30 s as the Ray
user (node/src/actor_reaper.rs). By hand (no driver, no dashboard: one
gRPC call to the GCS)::

    docker exec -u ray -i <node> python -I - <gcs ip:port> < reap_dead_actors.py

For every actor the GCS lists as DEAD because of a ``ray.kill`` (death
cause RAY_KILL: the kill the GCS never delivered) whose worker ran on this
node, it SIGKILLs the worker if its process is still that worker: the
process at that pid holds that worker's own log open
(``python-core-worker-<worker id>_<pid>.log``; a pid alone, or the log file
alone, is no proof: see ``is_that_worker``). The raylet then sees its worker exit and frees
its resources; for an engine container the container exits with its
process and the podman shim removes it. Prints one JSON line: how many DEAD
actors it looked at and which pids it killed.

With ``--idle-engines <gcs> <pid>:<0|1>...`` it asks the engine
containers' workers the agent names whether they were ever given work, and
retires those that never were (``idle_engines``)::

    python -I reap_dead_actors.py --idle-engines <gcs ip:port> <pid>:1
"""

import json
import os
import re
import signal
import sys

import grpc
from ray.core.generated import common_pb2, gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

# Only actors DEAD by a ray.kill are reaped: that is the kill the restarted
# GCS did not deliver (#63763). An actor it holds DEAD for another reason
# (its node or owner presumed dead while the GCS was down) may still be
# serving requests on a live node, and killing it would fail them.
RAY_KILL = common_pb2.ActorDiedErrorContext.RAY_KILL

# A core worker's own log: its worker id (28 bytes, hex) and its pid.
WORKER_LOG = re.compile(r"python-core-worker-([0-9a-f]{56})_([1-9][0-9]*)\.log")


def gcs_channel(address):
    """A gRPC channel to the GCS that carries the cluster's token when Ray's
    token authentication is on (RAY_AUTH_MODE=token; the token from
    RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, which the agent sets): the
    interceptor Ray's own clients use. A plain channel is refused
    (UNAUTHENTICATED)."""
    channel = grpc.insecure_channel(address)
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        SyncAuthenticationMetadataClientInterceptor,
    )
    return grpc.intercept_channel(channel, SyncAuthenticationMetadataClientInterceptor())



def dead_actors(address):
    stub = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(gcs_channel(address))
    filters = gcs_service_pb2.GetAllActorInfoRequest.Filters(
        state=gcs_pb2.ActorTableData.DEAD
    )
    reply = stub.GetAllActorInfo(
        gcs_service_pb2.GetAllActorInfoRequest(filters=filters), timeout=30
    )
    return reply.actor_table_data


def is_that_worker(worker_id, pid):
    """True if and only if process ``pid`` on this node is Ray worker
    ``worker_id`` (hex) now: the process holds its own core-worker log open,
    ``python-core-worker-<worker id>_<pid>.log``. The worker id is 28
    random bytes, so only that worker holds that file. The file merely
    existing proves nothing: with GCS fault tolerance a node's Ray keeps its
    session folder (the GCS keeps the session name) across Ray restarts and
    container re-creations, so the logs of a previous Ray's workers are
    there, and their pids are reused by the new Ray's workers (a new PID
    namespace counts from 1 again): a live replica that serves requests can
    have a dead actor's pid. Unreadable (not ours, gone): False."""
    want = f"python-core-worker-{worker_id}_{pid}.log"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target) == want:
            return True
    return False


def kill_if_that_worker(worker_id, pid):
    """SIGKILLs ``pid`` if it is worker ``worker_id``; the process is
    pinned (a pidfd) before the check, so the signal reaches the process
    that was checked and never one that took its pid since."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not is_that_worker(worker_id, pid):
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


NIL_ACTOR = b"\xff" * 16


def is_used(stats):
    """True if the worker has been given work: an actor (its creation task
    starts it), a task run or under way, a queued one, or tasks of its own
    in flight. A worker the raylet started for a lease that was then
    cancelled, or granted to a GCS that restarted and forgot it, shows none
    of these for good."""
    return (
        (stats.actor_id and stats.actor_id != NIL_ACTOR)
        or stats.num_executed_tasks > 0
        or stats.num_running_tasks > 0
        or stats.task_queue_length > 0
        or stats.num_pending_tasks > 0
    )


def worker_of(pid):
    """The Ray worker id (hex) of process ``pid``: from the core-worker log
    it holds open, ``python-core-worker-<worker id>_<pid>.log`` (a log of
    another pid is a parent's, inherited); None if it holds none or cannot
    be read. Read as the Ray user: root in a node may not read the open
    files of another user's processes (no CAP_SYS_PTRACE)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            name = os.path.basename(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        m = WORKER_LOG.fullmatch(name)
        if m and m.group(2) == str(pid):
            return m.group(1)
    return None


def idle_engines(address, asks):
    """For each (pid, may_exit) the agent found titled idle in an engine
    container on this node: "used" once the worker was given any work (the
    agent does not ask about it again), "idle" when it never was, "exited"
    when it was idle, ``may_exit`` was set (it was idle a round before too)
    and it agreed to exit, "unknown" when the process is no Ray worker (any
    more), or the GCS or the worker did not answer.

    Why: Ray's raylet keeps idle workers while there are fewer than its
    free CPUs, whatever their runtime_env, and a worker started for a lease
    that no one uses any more (a Serve replica stopped while its engine
    container was starting; a lease granted to a GCS that then restarted)
    is such a worker: its engine container would stay until Ray stops
    (seen after a rolling replacement: an old version's engine container
    outlived the upgrade to a new one). The exit is the raylet's own way of
    retiring an idle worker (the Exit call, not forced: the worker refuses
    if it still owns objects); the raylet sees it leave and frees what it
    held, and the engine container ends with it."""
    from ray.core.generated import core_worker_pb2, core_worker_pb2_grpc

    stub = gcs_service_pb2_grpc.WorkerInfoGcsServiceStub(gcs_channel(address))
    out = []
    for pid, may_exit in asks:
        state = "unknown"
        worker_id = worker_of(pid)
        try:
            if worker_id is None:
                raise LookupError(pid)
            info = stub.GetWorkerInfo(
                gcs_service_pb2.GetWorkerInfoRequest(worker_id=bytes.fromhex(worker_id)),
                timeout=10,
            ).worker_table_data
            a = info.worker_address
            if info.is_alive and info.pid == pid and a.port and is_that_worker(worker_id, pid):
                worker = core_worker_pb2_grpc.CoreWorkerServiceStub(
                    gcs_channel(f"{a.ip_address}:{a.port}")
                )
                stats = worker.GetCoreWorkerStats(
                    core_worker_pb2.GetCoreWorkerStatsRequest(intended_worker_id=a.worker_id),
                    timeout=10,
                ).core_worker_stats
                if is_used(stats):
                    state = "used"
                elif not may_exit:
                    state = "idle"
                else:
                    reply = worker.Exit(core_worker_pb2.ExitRequest(force_exit=False), timeout=10)
                    state = "exited" if reply.success else "idle"
        except (grpc.RpcError, LookupError):
            pass
        out.append({"worker_id": worker_id, "pid": pid, "state": state})
    return out


def parse_asks(args):
    """``<pid>:<0|1>`` each (the agent's own arguments)."""
    asks = []
    for a in args:
        pid, may_exit = a.split(":")
        asks.append((int(pid), may_exit == "1"))
    return asks


def main():
    if sys.argv[1] == "--idle-engines":
        out = idle_engines(sys.argv[2], parse_asks(sys.argv[3:]))
        print(json.dumps({"workers": out}))
        return
    address = sys.argv[1]
    killed = []
    actors = dead_actors(address)
    for a in actors:
        if a.death_cause.actor_died_error_context.reason != RAY_KILL:
            continue
        worker_id = a.address.worker_id.hex()
        if not a.pid or not worker_id or not kill_if_that_worker(worker_id, a.pid):
            continue
        killed.append(
            {"pid": a.pid, "actor_id": a.actor_id.hex(), "name": a.name,
             "class": a.class_name, "worker_id": worker_id}
        )
    print(json.dumps({"dead_actors": len(actors), "killed": killed}))


if __name__ == "__main__":
    main()
