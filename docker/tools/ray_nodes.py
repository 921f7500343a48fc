"""Prints this Ray cluster's nodes as JSON, from inside the head container.

The node image carries it in `argus-agent ray-tool nodes`, which runs it as
the Ray user, confined as Ray is, with Python isolated (never run the
image's Python as root: it may be the Ray user's to change, and so is its
home):
    docker exec <head> argus-agent ray-tool nodes
Output: {"address": "ip:port", "alive": N, "nodes": [{"ip", "alive", "id",
"resources"}...]}. The GCS is this container's own (its IP, ARGUS_RAY_PORT);
the port is probed first so a missing GCS fails in seconds, not after Ray's
connection timeout. The IP is the one the agent chose (status.json), so the
script works on host networking too. Exit 1 with a one-line message on error.
"""

import json
import os
import socket
import sys


def node_ip():
    """The node IP the agent chose (its status file), else ARGUS_NODE_IP when
    it is an address, else the host name's address. With --network host the
    host name is the host's, which need not be the node IP."""
    state = os.environ.get("ARGUS_STATE_DIR", "/run/argus")
    try:
        with open(os.path.join(state, "status.json")) as f:
            return json.load(f)["node_ip"]
    except (OSError, ValueError, KeyError):
        pass
    ip = os.environ.get("ARGUS_NODE_IP", "auto")
    if ip != "auto" and "/" not in ip:
        return ip
    return socket.gethostbyname(socket.gethostname())


def gcs_address():
    ip = node_ip()
    port = int(os.environ.get("ARGUS_RAY_PORT", "6379"))
    socket.create_connection((ip, port), timeout=3).close()
    return f"{ip}:{port}"


def main():
    import ray

    address = gcs_address()
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    nodes = [
        {
            "ip": n["NodeManagerAddress"],
            "alive": n["Alive"],
            "id": n["NodeID"],
            "resources": n.get("Resources", {}),
        }
        for n in ray.nodes()
    ]
    ray.shutdown()
    print(
        json.dumps(
            {
                "address": address,
                "alive": sum(1 for n in nodes if n["alive"]),
                "nodes": nodes,
            }
        )
    )


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line for the callers' logs
        print(f"ray_nodes: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
