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
"""

import json
import os
import signal
import sys

import grpc
from ray.core.generated import common_pb2, gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

# Only actors DEAD by a ray.kill are reaped: that is the kill the restarted
# GCS did not deliver (#63763). An actor it holds DEAD for another reason
# (its node or owner presumed dead while the GCS was down) may still be
# serving requests on a live node, and killing it would fail them.
RAY_KILL = common_pb2.ActorDiedErrorContext.RAY_KILL


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


def main():
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
