#!/usr/bin/env python
"""Drains this Ray node and reports what Ray Serve has left on it.

The node agent runs it as the Ray user when a worker is stopped on purpose
(SIGTERM: docker stop, compose down; node/src/drainer.rs), as

    /opt/argus/drain_node.py --gcs <gcs ip:port> --node-ip <this node's ip>
        --serve-port 8000 --deadline-s 120

1. asks the GCS to drain this node (reason PREEMPTION, with the deadline):
   the scheduler places nothing new here, and Serve (with the node image's
   patch, docker/ray/patch_serve_draining.py) starts a replacement of each
   replica of this node on another node, then stops the replica here once
   its requests are done; prints
   ``{"event": "drain", "accepted": true|false, "message": "..."}``;
2. then, every half second until it is killed, prints
   ``{"event": "status", "here": N, "elsewhere": true|false, ...}``: N is
   the number of Serve actors (replicas and the proxy) alive on this node,
   ``elsewhere`` whether another worker's Serve proxy answers its health
   check (``GET /-/healthz`` on the serve port: 200 only once it routes to a
   running replica); ``others`` how many other workers are alive and
   ``others_draining`` how many of those Ray drains too (``compose down``
   stops every worker at once: then no replica can move anywhere).
On a failure it prints ``{"event": "error", "message": "..."}`` and exits 1.
No driver and no dashboard: GCS calls only (the GCS client Ray's own
``ray drain-node`` uses, and one gRPC call for the actors).
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

POLL_S = 0.5


def emit(**kw):
    print(json.dumps(kw), flush=True)


def healthz(ip, port):
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/-/healthz", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


SERVE_NAMESPACE = "serve"
SERVE_CONTROLLER = "SERVE_CONTROLLER_ACTOR"


def serve_actors_by_node(stub, gcs_service_pb2, gcs_pb2):
    """Returns {node id hex: number of ALIVE Serve actors (replicas, proxies)}.

    Serve's actors are those of the job of the live actor named
    SERVE_CONTROLLER_ACTOR in the "serve" namespace (a name only one actor
    holds while the controller lives; the replicas and proxies it makes are
    of its job, also the ones a restarted controller recovers). A class
    name proves nothing: any task can make an actor class "ServeReplica:x"
    that would hold every drain to its deadline. With no live controller
    (restarting), the class names are all there is to go by."""
    filters = gcs_service_pb2.GetAllActorInfoRequest.Filters(state=gcs_pb2.ActorTableData.ALIVE)
    reply = stub.GetAllActorInfo(gcs_service_pb2.GetAllActorInfoRequest(filters=filters), timeout=10)
    actors = list(reply.actor_table_data)
    controllers = [a for a in actors
                   if a.name == SERVE_CONTROLLER and a.ray_namespace == SERVE_NAMESPACE]
    serve_job = controllers[0].job_id if len(controllers) == 1 else None
    out = {}
    for a in actors:
        if serve_job is not None and (a.job_id != serve_job or a.ray_namespace != SERVE_NAMESPACE):
            continue
        name = a.class_name
        if not (name == "ProxyActor" or name.startswith("ServeReplica:")):
            continue
        node = (a.node_id or a.address.node_id).hex()
        out[node] = out.get(node, 0) + 1
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gcs", required=True)
    p.add_argument("--node-ip", required=True)
    p.add_argument("--serve-port", type=int, default=8000)
    p.add_argument("--deadline-s", type=int, default=120)
    a = p.parse_args()
    try:
        import grpc
        import ray
        from ray.core.generated import autoscaler_pb2, gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

        from ray._private.state import GlobalState
        from ray._raylet import GcsClientOptions

        gcs = ray._raylet.GcsClient(address=a.gcs)
        nodes = gcs.get_all_node_info(timeout=10)
        # The GCS's draining nodes, as Serve's (patched) node cache reads them.
        state = GlobalState()
        state._initialize_global_state(GcsClientOptions.create(
            a.gcs, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
    except Exception as e:  # noqa: BLE001 - one line for the agent, whatever failed
        emit(event="error", message=f"cannot reach the GCS at {a.gcs}: {type(e).__name__}: {e}")
        return 1
    alive = {nid.hex(): n for nid, n in nodes.items() if n.state == gcs_pb2.GcsNodeInfo.ALIVE}
    mine = [nid for nid, n in alive.items() if n.node_manager_address == a.node_ip]
    if len(mine) != 1:
        emit(event="error", message=f"{len(mine)} alive Ray nodes have the address {a.node_ip}")
        return 1
    me = mine[0]
    if alive[me].is_head_node:
        emit(event="drain", accepted=False, message="this is the head node")
        return 0
    deadline_ms = int(time.time() * 1000) + a.deadline_s * 1000
    accepted, message = gcs.drain_node(
        me,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "argus-agent: the node container is being stopped",
        deadline_ms,
    )
    emit(event="drain", accepted=bool(accepted), message=message or "", node_id=me)
    if not accepted:
        return 0
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        SyncAuthenticationMetadataClientInterceptor,
    )

    # The cluster's token on every call (a plain channel is refused when
    # Ray's token authentication is on; the agent sets RAY_AUTH_TOKEN_PATH).
    channel = grpc.intercept_channel(
        grpc.insecure_channel(a.gcs), SyncAuthenticationMetadataClientInterceptor()
    )
    stub = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(channel)
    while True:
        try:
            nodes = gcs.get_all_node_info(timeout=10)
            others = {
                nid.hex(): n.node_manager_address
                for nid, n in nodes.items()
                if n.state == gcs_pb2.GcsNodeInfo.ALIVE and nid.hex() != me and not n.is_head_node
            }
            draining = set(state.get_draining_nodes())
            by_node = serve_actors_by_node(stub, gcs_service_pb2, gcs_pb2)
            elsewhere = [ip for ip in others.values() if healthz(ip, a.serve_port)]
            emit(event="status", here=by_node.get(me, 0), elsewhere=bool(elsewhere),
                 others=len(others), others_draining=len(draining & set(others)),
                 serving=elsewhere)
        except Exception as e:  # noqa: BLE001 - the GCS may be restarting; keep reporting
            print(f"drain_node: status failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
